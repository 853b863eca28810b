/* SPDX-License-Identifier: MIT */
/*
 * fuzz_roundtrip.c - libFuzzer harness for the encoder against the decoder.
 *
 * Every input is decoded as a request and as a reply.  Whatever decodes must
 * encode (the encoder accepts everything the decoder produces), and that
 * encoding must decode to a struct equal to the first field by field, and
 * encode again to the very same bytes.  Fields are compared one by one
 * (counted arrays only up to their count, tensors only when present), so a
 * mismatch names the field; padding is not compared.  A mismatch abort()s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_roundtrip: %s\n", what);
    abort();
}

static void same(const void *x, const void *y, size_t n, const char *field)
{
    if (memcmp(x, y, n) != 0) {
        fprintf(stderr, "fuzz_roundtrip: field %s differs after a round trip\n", field);
        abort();
    }
}

/* a->f and b->f hold the same bytes (strings are zero-filled after their
 * NUL by the decoder, so whole arrays compare). */
#define SAME(f) same(&a->f, &b->f, sizeof a->f, #f)

static void same_tensor(const rnp_tensor *a, const rnp_tensor *b)
{
    SAME(region.id);
    SAME(offset);
    SAME(stride);
}

static void same_bwd(const rnp_bwd_req *a, const rnp_bwd_req *b)
{
    SAME(session), SAME(seq), SAME(m), SAME(n);
    SAME(x_dtype), SAME(dy_dtype), SAME(dx_dtype), SAME(w_dtype), SAME(dres_dtype), SAME(dw_dtype);
    SAME(has_w), SAME(has_rstd), SAME(has_dres), SAME(has_dw);
    same_tensor(&a->x, &b->x);
    same_tensor(&a->dy, &b->dy);
    same_tensor(&a->dx, &b->dx);
    for (int t = RNP_T_W; t < RNP_T_COUNT; t++)
        if (rnp_bwd_tensor(a, t))
            same_tensor(rnp_bwd_tensor(a, t), rnp_bwd_tensor(b, t));
    SAME(eps), SAME(weight_offset), SAME(ready_slot), SAME(mode), SAME(ordering);
}

static void same_request(const rnp_request *a, const rnp_request *b)
{
    SAME(version), SAME(op), SAME(id);
    switch (a->op) {
    case RN_OP_HELLO: SAME(u.hello.client_name), SAME(u.hello.pid); break;
    case RN_OP_REGISTER:
        SAME(u.reg.session), SAME(u.reg.kind), SAME(u.reg.size), SAME(u.reg.shm_name);
        SAME(u.reg.ipc_handle), SAME(u.reg.device_uuid);
        break;
    case RN_OP_UNREGISTER: SAME(u.unreg.session), SAME(u.unreg.region.id); break;
    case RN_OP_EVENTS:
        SAME(u.events.session), SAME(u.events.n), SAME(u.events.device_uuid);
        for (uint32_t i = 0; i < a->u.events.n; i++)
            SAME(u.events.ready[i]);
        break;
    case RN_OP_BWD:
        same_bwd(&a->u.bwd, &b->u.bwd);
        /* A re-encoded request is the same request to the duplicate window. */
        if (rnp_bwd_digest(&a->u.bwd) != rnp_bwd_digest(&b->u.bwd))
            fail("the BWD digest differs after a round trip");
        break;
    case RN_OP_BYE: SAME(u.bye); break;
    }
}

static void same_reply(const rnp_reply *a, const rnp_reply *b)
{
    SAME(version), SAME(op), SAME(id), SAME(status);
    if (a->status != 0) {
        SAME(error);
        return;
    }
    switch (a->op) {
    case RN_OP_HELLO:
        SAME(u.hello.session), SAME(u.hello.daemon_version), SAME(u.hello.backend);
        SAME(u.hello.device_name), SAME(u.hello.device_uuid), SAME(u.hello.sm_count);
        SAME(u.hello.cc_major), SAME(u.hello.cc_minor), SAME(u.hello.mps);
        SAME(u.hello.limits.max_sessions), SAME(u.hello.limits.max_regions);
        SAME(u.hello.limits.max_inflight), SAME(u.hello.limits.max_inflight_total);
        SAME(u.hello.limits.max_m), SAME(u.hello.limits.max_n), SAME(u.hello.limits.max_msg);
        SAME(u.hello.limits.event_slots), SAME(u.hello.limits.seq_window);
        break;
    case RN_OP_REGISTER: SAME(u.reg.region.id); break;
    case RN_OP_EVENTS:
        SAME(u.events.n);
        for (uint32_t i = 0; i < a->u.events.n; i++)
            SAME(u.events.done[i]);
        break;
    case RN_OP_BWD:
        SAME(u.bwd.seq), SAME(u.bwd.done_slot), SAME(u.bwd.queue_ns), SAME(u.bwd.compute_ns);
        break;
    case RN_OP_HEALTH:
        SAME(u.health.state), SAME(u.health.mps), SAME(u.health.backend), SAME(u.health.nreasons);
        for (uint32_t i = 0; i < a->u.health.nreasons; i++)
            SAME(u.health.reasons[i]);
        break;
    case RN_OP_STATS:
        SAME(u.stats.backend), SAME(u.stats.device), SAME(u.stats.nstats), SAME(u.stats.nhists);
        for (uint32_t i = 0; i < a->u.stats.nstats; i++) {
            SAME(u.stats.stats[i].name);
            SAME(u.stats.stats[i].value);
        }
        for (uint32_t i = 0; i < a->u.stats.nhists; i++) {
            SAME(u.stats.hists[i].name), SAME(u.stats.hists[i].count), SAME(u.stats.hists[i].p50);
            SAME(u.stats.hists[i].p90), SAME(u.stats.hists[i].p99), SAME(u.stats.hists[i].max);
            SAME(u.stats.hists[i].has_buckets), SAME(u.stats.hists[i].sum);
            SAME(u.stats.hists[i].nbuckets);
            for (uint32_t k = 0; k < a->u.stats.hists[i].nbuckets; k++)
                SAME(u.stats.hists[i].buckets[k]);
        }
        break;
    case RN_OP_PING: SAME(u.ping.daemon_time_ns); break;
    }
}

static uint8_t enc1[RNP_MAX_MSG], enc2[RNP_MAX_MSG];

/* The encodings of the first and the second decode are the same bytes. */
static void same_bytes(size_t len1, size_t len2)
{
    if (len1 != len2 || memcmp(enc1, enc2, len1) != 0)
        fail("a second encoding differs from the first");
}

static void requests(const uint8_t *data, size_t size)
{
    static rnp_request a, b;
    rnp_error err;
    size_t len1, len2;
    if (rnp_decode_request(data, size, &a, &err) != 0)
        return;
    if (rnp_encode_request(&a, enc1, sizeof enc1, &len1, &err) != 0)
        fail("a decoded request does not encode");
    if (rnp_decode_request(enc1, len1, &b, &err) != 0)
        fail("an encoded request does not decode");
    same_request(&a, &b);
    if (rnp_encode_request(&b, enc2, sizeof enc2, &len2, &err) != 0)
        fail("a request decoded twice does not encode");
    same_bytes(len1, len2);
}

static void replies(const uint8_t *data, size_t size)
{
    static rnp_reply a, b;
    rnp_error err;
    size_t len1, len2;
    if (rnp_decode_reply(data, size, &a, &err) != 0)
        return;
    if (rnp_encode_reply(&a, enc1, sizeof enc1, &len1, &err) != 0)
        fail("a decoded reply does not encode");
    if (rnp_decode_reply(enc1, len1, &b, &err) != 0)
        fail("an encoded reply does not decode");
    same_reply(&a, &b);
    if (rnp_encode_reply(&b, enc2, sizeof enc2, &len2, &err) != 0)
        fail("a reply decoded twice does not encode");
    same_bytes(len1, len2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    requests(data, size);
    replies(data, size);
    return 0;
}
