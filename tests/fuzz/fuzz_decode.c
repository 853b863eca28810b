/*
 * fuzz_decode.c - libFuzzer harness for the protocol decoder (proto/).
 *
 * tests/fuzz/ holds this harness, replay_main.c (a main() that replays files
 * through it, for `make test`), the seed corpus (one valid encoding of every
 * request and reply, written by tests/unit/test_proto --write-corpus) and
 * regressions/ (minimised inputs that once failed).  It depends on proto/
 * only.
 *
 * Every input is decoded as a request and as a reply.  Whatever decodes is
 * encoded again and decoded again, and must come back identical: the decoder
 * fills its output deterministically and the encoder writes everything the
 * decoder reads.  A decoded BWD request is also run through the validator
 * against a small fake region table.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rn_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t enc_buf[RNP_MAX_MSG];

/* A small fake region table: ids 1..8, growing sizes; others unknown. */
static uint64_t fake_region(uint32_t region)
{
    if (region == 0 || region > 8)
        return RNP_NO_REGION;
    return region == 8 ? UINT64_MAX - 1 : (uint64_t)1 << (region * 4);
}

static void check(bool ok)
{
    if (!ok)
        abort();
}

static void requests(const uint8_t *data, size_t size)
{
    static rnp_request q, q2;
    rnp_error err;
    size_t len;
    if (rnp_decode_request(data, size, &q, &err) != 0) {
        check(err.code != 0 && memchr(err.msg, 0, sizeof err.msg) != NULL);
        return;
    }
    check(rnp_encode_request(&q, enc_buf, sizeof enc_buf, &len, &err) == 0);
    memset(&q2, 0, sizeof q2);
    check(rnp_decode_request(enc_buf, len, &q2, &err) == 0);
    check(memcmp(&q, &q2, sizeof q) == 0);
    if (q.op == RN_OP_BWD) {
        rnp_limits lim = { .max_m = 1u << 20, .max_n = 65536 };
        rnp_bwd_plan plan;
        uint64_t sizes[RNP_T_COUNT];
        for (int t = 0; t < RNP_T_COUNT; t++) {
            const rnp_tensor *x = rnp_bwd_tensor(&q.u.bwd, t);
            sizes[t] = x ? fake_region(x->region.id) : RNP_NO_REGION;
        }
        if (rnp_validate_bwd(&q.u.bwd, &lim, sizes, &plan, &err) == 0) {
            for (int i = 0; i < RNP_T_COUNT; i++)
                check(!plan.present[i] || plan.span[i].begin <= plan.span[i].end);
        }
    }
}

static void replies(const uint8_t *data, size_t size)
{
    static rnp_reply p, p2;
    rnp_error err;
    size_t len;
    if (rnp_decode_reply(data, size, &p, &err) != 0) {
        check(err.code != 0 && memchr(err.msg, 0, sizeof err.msg) != NULL);
        return;
    }
    check(rnp_encode_reply(&p, enc_buf, sizeof enc_buf, &len, &err) == 0);
    memset(&p2, 0, sizeof p2);
    check(rnp_decode_reply(enc_buf, len, &p2, &err) == 0);
    check(memcmp(&p, &p2, sizeof p) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    requests(data, size);
    replies(data, size);
    return 0;
}
