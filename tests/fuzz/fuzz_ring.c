/* SPDX-License-Identifier: MIT */
/*
 * fuzz_ring.c - libFuzzer harness for the fast path's slot parser
 * (proto/ring.c): the bytes a hostile client can put into a ring.
 *
 * The input's first RNP_RING_DESC bytes (zero-padded) are a slot's
 * descriptor, expected to be the slot of the seq it names, and also the
 * header line RING_OPEN checks.  Contracts checked:
 *  - decode either fails with a code of its own set and a message naming a
 *    "bwd." field, or succeeds with a request that is canonical: encoding it
 *    gives bytes that decode to the same request (digest and presence), and
 *    encoding that gives the very same bytes again;
 *  - a decoded request goes through rnp_validate_bwd (against region sizes
 *    taken from the input) without crashing, with a known code;
 *  - a slot of another seq is refused;
 *  - the header check returns one of its codes; a result read back from any
 *    bytes is printable and terminated.
 * Any violation abort()s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_ring: violated: %s\n", what);
        abort();
    }
}

static bool same(const rnp_bwd_req *a, const rnp_bwd_req *b)
{
    return rnp_bwd_digest(a) == rnp_bwd_digest(b) && a->has_w == b->has_w &&
           a->has_rstd == b->has_rstd && a->has_dres == b->has_dres && a->has_dw == b->has_dw &&
           a->w_dtype == b->w_dtype && a->dres_dtype == b->dres_dtype && a->dw_dtype == b->dw_dtype;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t d[RNP_RING_DESC], e1[RNP_RING_DESC], e2[RNP_RING_DESC];
    uint8_t slot[RNP_RING_SLOT];
    rnp_bwd_req q, q2;
    rnp_error err = { 0 };
    char m[RNP_MAX_ERRMSG];

    memset(d, 0, sizeof d);
    memcpy(d, data, size < sizeof d ? size : sizeof d);
    uint64_t seq = rnp_le64_get(d + RNP_SLOT_O_SEQ);

    int rc = rnp_ring_decode(d, seq, &q, &err);
    if (rc != 0) {
        check(rc == RN_INVALID_ARGUMENT || rc == RN_UNKNOWN_FIELD, "decode's codes");
        check(err.code == rc, "err.code is the result");
        check(strncmp(err.msg, "bwd.", 4) == 0, "the message names a bwd field");
    } else {
        check(q.seq == seq && q.ready_slot == -1 && q.mode == 0 && q.ordering == 0,
              "the fields a slot has not");
        rnp_ring_encode(&q, seq, e1);
        check(rnp_ring_decode(e1, seq, &q2, NULL) == 0, "an encoded request decodes");
        check(same(&q, &q2), "decode(encode(q)) == q");
        rnp_ring_encode(&q2, seq, e2);
        check(memcmp(e1, e2, sizeof e1) == 0, "encoding is canonical");
        uint64_t sz[RNP_T_COUNT];
        for (int t = 0; t < RNP_T_COUNT; t++) {
            uint8_t b = size > sizeof d + (size_t)t ? data[sizeof d + (size_t)t] : (uint8_t)t;
            sz[t] = b == 0 ? RNP_NO_REGION : (uint64_t)b << (b % 40);
        }
        rnp_bwd_plan plan;
        rnp_limits lim = { .max_m = 1u << 20, .max_n = 65536 };
        int v = rnp_validate_bwd(&q, &lim, sz, &plan, &err);
        check(v == 0 || v == RN_INVALID_ARGUMENT || v == RN_TOO_LARGE || v == RN_UNKNOWN_REGION ||
              v == RN_MISALIGNED || v == RN_OUT_OF_BOUNDS || v == RN_ALIASING,
              "validation's codes");
        check(rnp_ring_decode(d, seq + 1, NULL, NULL) == RN_INVALID_ARGUMENT,
              "another seq's slot is refused");
    }

    uint32_t slots = rnp_le32_get(d + RNP_RING_O_SLOTS);
    rc = rnp_ring_check_header(d, slots, &err);
    check(rc == 0 || rc == RN_INVALID_ARGUMENT || rc == RN_BAD_VERSION || rc == RN_TOO_LARGE,
          "the header check's codes");
    if (rc == 0)
        check(slots && (slots & (slots - 1)) == 0 && slots <= RNP_RING_MAX_SLOTS,
              "an accepted ring has a power-of-two slot count within the limit");

    memset(slot, 0, sizeof slot);
    memcpy(slot + RNP_RING_RESULT, data,
           size < sizeof slot - RNP_RING_RESULT ? size : sizeof slot - RNP_RING_RESULT);
    rnp_ring_get_result(slot, m, sizeof m);
    for (size_t i = 0; m[i]; i++)
        check(m[i] >= 0x20 && m[i] < 0x7f && i < sizeof m - 1, "a result's message is printable");
    return 0;
}
