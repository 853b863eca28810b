/* SPDX-License-Identifier: MIT */
/*
 * fuzz_decode.c - libFuzzer harness for the protocol decoder (proto/).
 *
 * tests/fuzz/ holds one harness per parser (fuzz_*.c: this one for the
 * decoder's contract, fuzz_roundtrip.c for the encoder against the decoder,
 * fuzz_validate.c for the BWD validator), replay_main.c (a main() that
 * replays files through a harness, for `make test`), the seed corpus that
 * every harness starts from (one valid encoding of every request and reply,
 * written by tests/unit/test_proto --write-corpus) and regressions/
 * (minimised inputs that once failed a harness; every harness replays them).
 * It depends on proto/ only.
 *
 * Every input is decoded as a request and as a reply, with and without
 * output arguments.  A failure must carry a decoder's code and a one-line
 * printable message naming the field, and leave the output untouched but
 * for op and id; a success must keep the documented shape (absent tensors
 * zero, strings terminated, counts within their limits).  A violation
 * abort()s.
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
        fprintf(stderr, "fuzz_decode: violated: %s\n", what);
        abort();
    }
}

static bool decoder_code(int rc)
{
    return RN_STATUS_GROUP(rc) == 2 || rc == RN_INVALID_ARGUMENT || rc == RN_UNSUPPORTED;
}

/* The error of a failed decode: its code, one printable line "field: why". */
static void check_error(int rc, const rnp_error *err)
{
    check(decoder_code(rc) && err->code == rc, "a decoder's code in err");
    size_t n = strnlen(err->msg, sizeof err->msg);
    check(n > 0 && n < sizeof err->msg, "a terminated, non-empty message");
    for (size_t i = 0; i < n; i++)
        check(err->msg[i] >= 0x20 && err->msg[i] < 0x7f, "a printable one-line message");
    check(strstr(err->msg, ": ") != NULL, "the message names a field");
}

static bool terminated(const char *s, size_t cap)
{
    return memchr(s, 0, cap) != NULL;
}

static bool zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void check_request(const rnp_request *q)
{
    check(q->version == RNP_VERSION && q->op >= 1 && q->op <= RN_OP_MAX, "a known version and op");
    if (q->op == RN_OP_HELLO)
        check(terminated(q->u.hello.client_name, RNP_MAX_NAME), "client name terminated");
    if (q->op == RN_OP_REGISTER)
        check(terminated(q->u.reg.shm_name, sizeof q->u.reg.shm_name), "shm name terminated");
    if (q->op == RN_OP_EVENTS)
        check(q->u.events.n >= 1 && q->u.events.n <= RNP_MAX_EVENTS, "events count");
    if (q->op != RN_OP_BWD)
        return;
    const rnp_bwd_req *b = &q->u.bwd;
    check(b->ready_slot >= -1 && b->ready_slot < RNP_MAX_EVENTS, "ready slot range");
    check(b->x_dtype <= RN_DTYPE_BF16 && b->dy_dtype <= RN_DTYPE_BF16 &&
              b->dx_dtype <= RN_DTYPE_BF16,
          "dtype range");
    check(b->has_w || (b->w_dtype == 0 && zero(&b->w, sizeof b->w)), "absent w is zero");
    check(b->has_rstd || zero(&b->rstd, sizeof b->rstd), "absent rstd is zero");
    check(b->has_dres || (b->dres_dtype == 0 && zero(&b->dres, sizeof b->dres)),
          "absent dres is zero");
    check(b->has_dw || (b->dw_dtype == 0 && zero(&b->dw, sizeof b->dw)), "absent dw is zero");
}

static void check_reply(const rnp_reply *p)
{
    check(terminated(p->error, RNP_MAX_ERRMSG), "error terminated");
    if (p->status != 0)
        return;
    if (p->op == RN_OP_HEALTH)
        check(p->u.health.nreasons <= RNP_MAX_REASONS && p->u.health.state <= RNP_HEALTH_FAILING,
              "health counts");
    if (p->op == RN_OP_STATS)
        check(p->u.stats.nstats <= RNP_MAX_STATS && p->u.stats.nhists <= RNP_MAX_HISTS,
              "stats counts");
    if (p->op == RN_OP_EVENTS)
        check(p->u.events.n >= 1 && p->u.events.n <= RNP_MAX_EVENTS, "events count");
}

/* On failure only op and id of the output may change. */
#define CHECK_UNTOUCHED(out, pattern)                                                       \
    do {                                                                                    \
        (pattern).op = (out).op, (pattern).id = (out).id;                                   \
        check(memcmp(&(out), &(pattern), sizeof(out)) == 0, "output untouched on failure"); \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static rnp_request q, qpat;
    static rnp_reply p, ppat;
    rnp_error err;

    memset(&q, 0xa5, sizeof q), memset(&qpat, 0xa5, sizeof qpat);
    int rc = rnp_decode_request(data, size, &q, &err);
    check(rnp_decode_request(data, size, NULL, NULL) == rc, "the same answer without outputs");
    if (rc != 0) {
        check_error(rc, &err);
        CHECK_UNTOUCHED(q, qpat);
    } else {
        check_request(&q);
    }

    memset(&p, 0xa5, sizeof p), memset(&ppat, 0xa5, sizeof ppat);
    rc = rnp_decode_reply(data, size, &p, &err);
    check(rnp_decode_reply(data, size, NULL, NULL) == rc, "the same answer without outputs");
    if (rc != 0) {
        check_error(rc, &err);
        CHECK_UNTOUCHED(p, ppat);
    } else {
        check_reply(&p);
    }
    return 0;
}
