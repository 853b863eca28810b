/* SPDX-License-Identifier: MIT */
/*
 * fuzz_chan.c - libFuzzer harness for the session channel's messages
 * (proto/chan.c, PROTOCOL.md section 12).
 *
 * An input is a control byte and a datagram: bit 7 of the control byte says
 * the receiver saw the datagram cut (MSG_TRUNC), bits 0-4 how many
 * descriptors came with it (0-31: past RNP_CHAN_MAX_FDS too).  An empty
 * input is an empty datagram.  The seeds are tests/fuzz/corpus/chan-*.bin
 * (test_proto_chan --write-corpus); the other harnesses' seeds are fed too.
 *
 * A failure must carry its code in err with a printable one-line message
 * naming a field, leave the body zero, and give the type exactly when the
 * header was valid.  A success must be a known type of its exact length
 * with its descriptors, and encode to the input's bytes but for what the
 * parser does not keep (the reserved fields of REGION_OK, VMM_CHUNK, VMM_MAP
 * and VMM_CHUNK_OK; an ERROR's bytes after
 * its text), which re-parses to the same message and encodes to the same
 * bytes again.  A violation abort()s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_chan: violated: %s\n", what);
        abort();
    }
}

static bool all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void check_failure(int rc, const rnp_error *err, const rnp_chan_msg *msg,
                          const uint8_t *m, size_t len)
{
    size_t n = strnlen(err->msg, sizeof err->msg);
    bool header = rc == RN_TOO_BIG || rc == RN_BAD_VERSION ||
                  (rc == RN_MALFORMED && strncmp(err->msg, "message", 7) == 0);

    check(err->code == rc, "the code in err");
    check(rc == RN_TOO_BIG || rc == RN_MALFORMED || rc == RN_BAD_VERSION ||
          rc == RN_UNKNOWN_OP || rc == RN_INVALID_ARGUMENT, "a parser's code");
    check(n > 0 && n < sizeof err->msg, "a terminated, non-empty message");
    for (size_t i = 0; i < n; i++)
        check(err->msg[i] >= 0x20 && err->msg[i] < 0x7f, "a printable one-line message");
    check(strstr(err->msg, ": ") != NULL, "the message names a field");
    check(all_zero(&msg->u, sizeof msg->u), "no body kept from a failed message");
    if (header) {
        check(msg->type == RNP_CHAN_NONE, "no type before the header is valid");
        return;
    }
    check(len >= RNP_CHAN_HDR && msg->type == rnp_le16_get(m + 6), "the type of a valid header");
    if (rc == RN_UNKNOWN_OP)
        check(rnp_chan_len(msg->type) == 0, "RN_UNKNOWN_OP only for an unknown type");
    else
        check(rnp_chan_len(msg->type) != 0, "a known type fails on its own fields");
}

/* The bytes that m (len bytes, parsed as msg) must encode to: itself, with
 * what the parser does not keep as the encoder writes it. */
static void canonical(const rnp_chan_msg *msg, const uint8_t *m, size_t len, uint8_t *out)
{
    memcpy(out, m, len);
    if (msg->type == RNP_CHAN_REGION_OK || msg->type == RNP_CHAN_VMM_CHUNK_OK)
        memset(out + RNP_CHAN_HDR + 4, 0, 4);
    if (msg->type == RNP_CHAN_VMM_CHUNK)
        memset(out + RNP_CHAN_HDR + 20, 0, 4);
    if (msg->type == RNP_CHAN_VMM_MAP)
        memset(out + RNP_CHAN_HDR + 12, 0, 4);
    if (msg->type == RNP_CHAN_ERROR) {
        size_t n = strnlen((const char *)m + RNP_CHAN_HDR + 4, RNP_CHAN_ERROR_MSG - 1);
        memset(out + RNP_CHAN_HDR + 4 + n, 0, RNP_CHAN_ERROR_MSG - n);
    }
}

static void check_success(const rnp_chan_msg *msg, const uint8_t *m, size_t len, bool cut,
                          unsigned nfds)
{
    uint8_t want[RNP_CHAN_MAX], enc[RNP_CHAN_MAX], again[RNP_CHAN_MAX];
    rnp_chan_msg back;
    rnp_error err = {0};
    size_t n;

    check(!cut && nfds <= RNP_CHAN_MAX_FDS, "a cut message never parses");
    check(rnp_chan_len(msg->type) == len, "a known type of its exact length");
    check(nfds == (msg->type == RNP_CHAN_REGISTER_FD || msg->type == RNP_CHAN_VMM_CHUNK ? 1u : 0u),
          "the type's descriptors");
    if (msg->type == RNP_CHAN_ERROR) {
        n = strnlen(msg->u.error.msg, sizeof msg->u.error.msg);
        check(n < sizeof msg->u.error.msg, "an ERROR's text is terminated");
        check(all_zero(msg->u.error.msg + n, sizeof msg->u.error.msg - n),
              "an ERROR's text is zero-filled");
    }
    canonical(msg, m, len, want);
    check(rnp_chan_encode(msg, enc) == len, "a parsed message encodes to its length");
    check(memcmp(enc, want, len) == 0, "a parsed message encodes to its bytes");
    check(rnp_chan_parse(enc, len, false, nfds, &back, &err) == 0, "an encoding parses");
    check(back.type == msg->type && memcmp(&back.u, &msg->u, sizeof back.u) == 0,
          "an encoding parses to the same message");
    check(rnp_chan_encode(&back, again) == len && memcmp(again, enc, len) == 0,
          "a second encoding is the same bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bool cut = size > 0 && (data[0] & 0x80);
    unsigned nfds = size > 0 ? data[0] & 0x1f : 0;
    const uint8_t *m = size > 0 ? data + 1 : NULL;
    size_t len = size > 0 ? size - 1 : 0;
    rnp_chan_msg msg;
    rnp_error err = {0};
    int rc;

    rc = rnp_chan_parse(m, len, cut, nfds, &msg, &err);
    if (rc != 0)
        check_failure(rc, &err, &msg, m, len);
    else
        check_success(&msg, m, len, cut, nfds);
    /* Without err, the same answer. */
    check(rnp_chan_parse(m, len, cut, nfds, &msg, NULL) == rc, "the same answer without err");
    return 0;
}
