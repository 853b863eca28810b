/*
 * test_proto.c - the wire protocol's encoder and decoder (proto/): round trips
 * of every message, and the decoder's answer to every kind of bad input:
 * truncation at every byte, wrong types, missing, duplicate and unknown
 * fields, huge counts, trailing bytes, limits of every field, depth.
 *
 * The mutation tests unpack a valid message into a msgpack-c object tree
 * (trusted bytes, so msgpack_unpack is fine here), change one thing, pack it
 * again and check the decoder's exact error code.
 *
 * Run with --write-corpus DIR to write every sample message to DIR (the
 * fuzzer's seed corpus, tests/fuzz/corpus); test_corpus_fresh checks that the
 * checked-in corpus matches what the encoder produces now.
 */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "rn_proto.h"
#include "rn_test.h"

/* ---- sample messages ----------------------------------------------------------- */

#define NREQ 13
#define NREP 16

static void fill(uint8_t *b, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed + 7 * i);
}

static rnp_tensor T(uint32_t region, uint64_t offset, uint64_t stride)
{
    rnp_tensor t = { { region }, offset, stride };
    return t;
}

/* Sample request i (0 <= i < NREQ); every optional field of BWD appears in
 * one sample and is absent in another. */
static const char *make_request(int i, rnp_request *q)
{
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION;
    q->id = 1000 + i;
    rnp_bwd_req *b = &q->u.bwd;
    switch (i) {
    case 0:
        q->op = RN_OP_HELLO;
        snprintf(q->u.hello.client_name, RNP_MAX_NAME, "trainer-0");
        q->u.hello.pid = 4242;
        return "hello";
    case 1:
        q->op = RN_OP_REGISTER;
        fill(q->u.reg.session.b, RNP_SESSION_BYTES, 1);
        q->u.reg.kind = RNP_REGION_SHM;
        q->u.reg.size = 1 << 20;
        snprintf(q->u.reg.shm_name, sizeof q->u.reg.shm_name, "/rn-4242-0");
        return "register-shm";
    case 2:
        q->op = RN_OP_REGISTER;
        fill(q->u.reg.session.b, RNP_SESSION_BYTES, 1);
        q->u.reg.kind = RNP_REGION_CUDA_IPC;
        q->u.reg.size = 1ull << 30;
        fill(q->u.reg.ipc_handle, RNP_IPC_HANDLE_BYTES, 3);
        fill(q->u.reg.device_uuid, RNP_UUID_BYTES, 9);
        return "register-ipc";
    case 3:
        q->op = RN_OP_UNREGISTER;
        fill(q->u.unreg.session.b, RNP_SESSION_BYTES, 1);
        q->u.unreg.region.id = 7;
        return "unregister";
    case 4:
        q->op = RN_OP_EVENTS;
        fill(q->u.events.session.b, RNP_SESSION_BYTES, 1);
        q->u.events.n = 4;
        for (int k = 0; k < 4; k++)
            fill(q->u.events.ready[k], RNP_IPC_HANDLE_BYTES, (uint8_t)(40 + k));
        fill(q->u.events.device_uuid, RNP_UUID_BYTES, 9);
        return "events";
    case 5: /* only the required fields */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 1, b->m = 1024, b->n = 4096;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_BF16;
        b->x = T(1, 0, 4096), b->dy = T(2, 0, 4096), b->dx = T(3, 0, 4096);
        b->eps = 1e-6f;
        b->ready_slot = -1;
        return "bwd-min";
    case 6: /* every optional field */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 0xfffffffffull, b->m = 32768, b->n = 4096;
        b->x_dtype = RN_DTYPE_BF16, b->dy_dtype = RN_DTYPE_F16, b->dx_dtype = RN_DTYPE_F32;
        b->x = T(1, 64, 4160), b->dy = T(2, 128, 4096), b->dx = T(3, 0, 4096);
        b->has_w = b->has_rstd = b->has_dres = b->has_dw = true;
        b->w_dtype = RN_DTYPE_BF16, b->w = T(4, 0, 0);
        b->rstd = T(4, 8192, 0);
        b->dres_dtype = RN_DTYPE_BF16, b->dres = T(5, 0, 4096);
        b->dw_dtype = RN_DTYPE_F32, b->dw = T(6, 256, 0);
        b->eps = 1e-5f, b->weight_offset = 1.0f;
        b->ready_slot = 15, b->mode = RNP_MODE_SYNC;
        return "bwd-full";
    case 7: /* in place, weight without dw, ready slot 0 */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 1);
        b->seq = 2, b->m = 0, b->n = 1;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F32;
        b->x = T(1, 0, 1), b->dy = T(2, 4, 3), b->dx = T(2, 4, 3);
        b->has_w = true, b->w_dtype = RN_DTYPE_F32, b->w = T(1, 4096, 0);
        b->eps = 0.0f, b->weight_offset = -0.0f;
        b->ready_slot = 0;
        return "bwd-inplace";
    case 8: q->op = RN_OP_PING; q->id = 0; return "ping";
    case 9: q->op = RN_OP_HEALTH; q->id = UINT64_MAX; return "health";
    case 10: q->op = RN_OP_STATS; return "stats";
    case 11:
        q->op = RN_OP_BYE;
        fill(q->u.bye.b, RNP_SESSION_BYTES, 1);
        return "bye";
    case 12: /* the optional scalars without the optional tensors */
        q->op = RN_OP_BWD;
        fill(b->session.b, RNP_SESSION_BYTES, 2);
        b->seq = 3, b->m = 7, b->n = 33;
        b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F16;
        b->x = T(1, 0, 40), b->dy = T(1, 1024, 33), b->dx = T(1, 4096, 64);
        b->eps = 1e-6f, b->weight_offset = 0.5f;
        b->ready_slot = 7, b->mode = RNP_MODE_ASYNC;
        return "bwd-scalars";
    }
    return NULL;
}

static const char *make_reply(int i, rnp_reply *p)
{
    memset(p, 0, sizeof *p);
    p->version = RNP_VERSION;
    p->id = 2000 + i;
    rnp_hello_rep *h = &p->u.hello;
    switch (i) {
    case 0:
    case 1:
        p->op = RN_OP_HELLO;
        fill(h->session.b, RNP_SESSION_BYTES, 77);
        snprintf(h->daemon_version, RNP_MAX_NAME, "0.1.0");
        if (i == 0) {
            snprintf(h->backend, RNP_MAX_NAME, "cpu");
            snprintf(h->device_name, RNP_MAX_NAME, "cpu (2 threads)");
            h->sm_count = 2;
        } else {
            snprintf(h->backend, RNP_MAX_NAME, "cuda");
            snprintf(h->device_name, RNP_MAX_NAME, "NVIDIA H200");
            fill(h->device_uuid, RNP_UUID_BYTES, 9);
            h->sm_count = 132, h->cc_major = 9, h->cc_minor = 0, h->mps = true;
        }
        h->limits = (rnp_limits){ .max_sessions = 64, .max_regions = 256, .max_inflight = 8,
                                  .max_inflight_total = 256, .max_m = 1ull << 24,
                                  .max_n = 65536, .max_msg = RNP_MAX_MSG, .event_slots = 16 };
        return i == 0 ? "hello-cpu" : "hello-cuda";
    case 2: p->op = RN_OP_REGISTER; p->u.reg.region.id = 7; return "register";
    case 3: p->op = RN_OP_UNREGISTER; return "unregister";
    case 4:
        p->op = RN_OP_EVENTS;
        p->u.events.n = 4;
        for (int k = 0; k < 4; k++)
            fill(p->u.events.done[k], RNP_IPC_HANDLE_BYTES, (uint8_t)(90 + k));
        return "events";
    case 5:
        p->op = RN_OP_BWD;
        p->u.bwd = (rnp_bwd_rep){ .seq = 12, .done_slot = 3, .queue_ns = 1500, .compute_ns = 0 };
        return "bwd-async";
    case 6:
        p->op = RN_OP_BWD;
        p->u.bwd = (rnp_bwd_rep){ .seq = 13, .done_slot = -1, .queue_ns = 900, .compute_ns = 191000 };
        return "bwd-sync";
    case 7: p->op = RN_OP_PING; p->u.ping.daemon_time_ns = 1764696000123456789ull; return "ping";
    case 8:
        p->op = RN_OP_HEALTH;
        snprintf(p->u.health.backend, RNP_MAX_NAME, "cuda");
        p->u.health.mps = true;
        return "health-ok";
    case 9:
        p->op = RN_OP_HEALTH;
        p->u.health.state = RNP_HEALTH_DEGRADED;
        snprintf(p->u.health.backend, RNP_MAX_NAME, "cuda");
        p->u.health.nreasons = 2;
        snprintf(p->u.health.reasons[0], RNP_REASON_LEN, "MPS is not active");
        p->u.health.reasons[1][0] = '\0'; /* an empty reason is valid */
        return "health-degraded";
    case 10: {
        rnp_stats_rep *s = &p->u.stats;
        p->op = RN_OP_STATS;
        snprintf(s->backend, RNP_MAX_NAME, "cpu");
        snprintf(s->device, RNP_MAX_NAME, "cpu");
        const char *names[] = { "requests.bwd", "requests.hello", "errors.OUT_OF_BOUNDS", "bytes" };
        for (int k = 0; k < 4; k++) {
            snprintf(s->stats[k].name, RNP_STAT_NAME, "%s", names[k]);
            s->stats[k].value = (uint64_t)k * 1000003u;
        }
        s->nstats = 4;
        const char *hn[] = { "queue", "compute", "total" };
        for (int k = 0; k < 3; k++) {
            snprintf(s->hists[k].name, RNP_STAT_NAME, "%s", hn[k]);
            s->hists[k] = (rnp_hist){ .count = 10, .p50 = 100, .p90 = 900, .p99 = 9900, .max = 1ull << 40 };
            snprintf(s->hists[k].name, RNP_STAT_NAME, "%s", hn[k]);
        }
        s->nhists = 3;
        return "stats";
    }
    case 11:
        p->op = RN_OP_STATS;
        snprintf(p->u.stats.backend, RNP_MAX_NAME, "cpu");
        return "stats-empty";
    case 12: p->op = RN_OP_BYE; return "bye";
    case 13:
        p->op = RN_OP_BWD;
        p->status = RN_OUT_OF_BOUNDS;
        snprintf(p->error, RNP_MAX_ERRMSG, "bwd.dx: bytes [0, 8388608) exceed region 3 of 4096 bytes");
        return "error-bounds";
    case 14:
        p->op = 77, p->id = 0;
        p->status = RN_UNKNOWN_OP;
        snprintf(p->error, RNP_MAX_ERRMSG, "op: 77 is not an operation");
        return "error-unknown-op";
    case 15:
        p->op = RN_OP_HELLO, p->version = 9;
        p->status = RN_BAD_VERSION;
        snprintf(p->error, RNP_MAX_ERRMSG, "v: version 9 is not supported (supported: 1)");
        return "error-version";
    }
    return NULL;
}

/* ---- helpers --------------------------------------------------------------------- */

static uint8_t g_buf[RNP_MAX_MSG + 64];

static size_t enc_req(const rnp_request *q, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    rnp_error err = { 0 };
    int rc = rnp_encode_request(q, buf, cap, &len, &err);
    if (rc)
        fail_msg("encode request: %s", err.msg);
    return len;
}

static size_t enc_rep(const rnp_reply *p, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    rnp_error err = { 0 };
    int rc = rnp_encode_reply(p, buf, cap, &len, &err);
    if (rc)
        fail_msg("encode reply: %s", err.msg);
    return len;
}

/* Decodes as a request (reply == false) or a reply; returns the code and
 * checks that a failure comes with a message naming something ("x: ..."). */
static int dec(bool reply, const void *buf, size_t len, void *out, rnp_error *err)
{
    int rc = reply ? rnp_decode_reply(buf, len, out, err) : rnp_decode_request(buf, len, out, err);
    if (rc != 0) {
        assert_int_equal(err->code, rc);
        assert_non_null(strstr(err->msg, ": "));
        assert_true(strlen(err->msg) > 3);
    }
    return rc;
}

static void expect_code(bool reply, const void *buf, size_t len, int want, const char *what)
{
    static rnp_reply out; /* big enough for either */
    rnp_error err = { 0 };
    int rc = dec(reply, buf, len, &out, &err);
    if (rc != want)
        fail_msg("%s: expected %s, got %s (%s)", what, rnp_err_name(want), rnp_err_name(rc),
                 rc ? err.msg : "success");
}

/* ---- round trips -------------------------------------------------------------------- */

static void test_round_trip_requests(void **state)
{
    (void)state;
    for (int i = 0; i < NREQ; i++) {
        rnp_request q, back;
        rnp_error err = { 0 };
        const char *name = make_request(i, &q);
        size_t len = enc_req(&q, g_buf, sizeof g_buf);
        memset(&back, 0xa5, sizeof back);
        int rc = rnp_decode_request(g_buf, len, &back, &err);
        if (rc)
            fail_msg("%s: %s", name, err.msg);
        if (memcmp(&q, &back, sizeof q) != 0)
            fail_msg("%s: decoded request differs", name);
        /* A second encoding is byte-identical. */
        static uint8_t again[RNP_MAX_MSG];
        size_t len2 = enc_req(&back, again, sizeof again);
        assert_int_equal(len, len2);
        assert_memory_equal(g_buf, again, len);
    }
}

static void test_round_trip_replies(void **state)
{
    (void)state;
    for (int i = 0; i < NREP; i++) {
        static rnp_reply p, back;
        rnp_error err = { 0 };
        const char *name = make_reply(i, &p);
        size_t len = enc_rep(&p, g_buf, sizeof g_buf);
        memset(&back, 0xa5, sizeof back);
        int rc = rnp_decode_reply(g_buf, len, &back, &err);
        if (rc)
            fail_msg("%s: %s", name, err.msg);
        if (memcmp(&p, &back, sizeof p) != 0)
            fail_msg("%s: decoded reply differs", name);
    }
}

/* The absent optional fields of BWD decode to their documented defaults. */
static void test_bwd_defaults(void **state)
{
    (void)state;
    rnp_request q, back;
    rnp_error err;
    make_request(5, &q);
    size_t len = enc_req(&q, g_buf, sizeof g_buf);
    assert_int_equal(rnp_decode_request(g_buf, len, &back, &err), 0);
    assert_int_equal(back.u.bwd.ready_slot, -1);
    assert_int_equal(back.u.bwd.mode, RNP_MODE_ASYNC);
    assert_int_equal(back.u.bwd.ordering, RNP_ORDER_EVENTS);
    assert_true(back.u.bwd.weight_offset == 0.0f);
    assert_false(back.u.bwd.has_w || back.u.bwd.has_rstd || back.u.bwd.has_dres || back.u.bwd.has_dw);
    assert_int_equal(back.u.bwd.w_dtype, RN_DTYPE_NONE);
}

/* ---- truncation, trailing bytes, sizes ------------------------------------------------ */

static void truncate_all(bool reply, const uint8_t *msg, size_t len, const char *name)
{
    for (size_t k = 0; k < len; k++) {
        /* A fresh heap copy of exactly k bytes, so ASAN sees any read past it. */
        uint8_t *cut = malloc(k ? k : 1);
        assert_non_null(cut);
        memcpy(cut, msg, k);
        static rnp_reply out;
        rnp_error err = { 0 };
        int rc = dec(reply, cut, k, &out, &err);
        if (rc == 0)
            fail_msg("%s truncated to %zu of %zu bytes decoded", name, k, len);
        free(cut);
    }
}

static void test_truncated_everywhere(void **state)
{
    (void)state;
    for (int i = 0; i < NREQ; i++) {
        rnp_request q;
        const char *name = make_request(i, &q);
        size_t len = enc_req(&q, g_buf, sizeof g_buf);
        truncate_all(false, g_buf, len, name);
    }
    for (int i = 0; i < NREP; i++) {
        static rnp_reply p;
        const char *name = make_reply(i, &p);
        size_t len = enc_rep(&p, g_buf, sizeof g_buf);
        truncate_all(true, g_buf, len, name);
    }
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    rnp_request q;
    make_request(0, &q);
    size_t len = enc_req(&q, g_buf, sizeof g_buf);
    g_buf[len] = 0xc0; /* nil */
    expect_code(false, g_buf, len + 1, RN_TRAILING_BYTES, "one nil after hello");
    memcpy(g_buf + len, g_buf, len); /* the same message twice */
    expect_code(false, g_buf, 2 * len, RN_TRAILING_BYTES, "hello twice");
    static rnp_reply p;
    make_reply(7, &p);
    len = enc_rep(&p, g_buf, sizeof g_buf);
    g_buf[len] = 0;
    expect_code(true, g_buf, len + 1, RN_TRAILING_BYTES, "ping reply + 0");
    expect_code(false, g_buf, 0, RN_MALFORMED, "empty message");
    expect_code(true, g_buf, 0, RN_MALFORMED, "empty reply");
}

/* Headers that claim far more elements or bytes than follow: msgpack-c
 * itself would try to allocate for them.  Under ASAN any such allocation
 * would fail loudly; here it must simply be rejected. */
static void test_huge_counts(void **state)
{
    (void)state;
    static const struct { uint8_t b[8]; size_t n; const char *what; } raw[] = {
        { { 0xdd, 0xff, 0xff, 0xff, 0xff }, 5, "array32 of 2^32-1" },
        { { 0xdf, 0xff, 0xff, 0xff, 0xff }, 5, "map32 of 2^32-1" },
        { { 0xdc, 0xff, 0xff }, 3, "array16 of 65535" },
        { { 0xde, 0xff, 0xff }, 3, "map16 of 65535" },
        { { 0xdb, 0xff, 0xff, 0xff, 0xff }, 5, "str32 of 4 GiB" },
        { { 0xc6, 0xff, 0xff, 0xff, 0xff }, 5, "bin32 of 4 GiB" },
        { { 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01 }, 6, "ext32 of 4 GiB" },
        { { 0x81, 0xdd, 0x7f, 0xff, 0xff, 0xff }, 6, "map with an array32 key" },
        { { 0x8f }, 1, "fixmap of 15 with nothing after" },
        { { 0xc1 }, 1, "reserved byte" },
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        expect_code(false, raw[i].b, raw[i].n, RN_MALFORMED, raw[i].what);
        expect_code(true, raw[i].b, raw[i].n, RN_MALFORMED, raw[i].what);
    }
    /* A valid envelope whose body is an array32 claiming 2^32-1 elements. */
    static const uint8_t env[] = { 0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x05, 0xa2, 'i', 'd', 0x2a,
                                   0xa4, 'b', 'o', 'd', 'y', 0xdd, 0xff, 0xff, 0xff, 0xff };
    expect_code(false, env, sizeof env, RN_MALFORMED, "body array32 of 2^32-1");
    rnp_request out = { 0 };
    rnp_error err;
    assert_int_equal(rnp_decode_request(env, sizeof env, &out, &err), RN_MALFORMED);
    assert_int_equal(out.op, 5); /* the header is still readable for the error reply */
    assert_int_equal(out.id, 42);
}

/* Decoding and encoding allocate nothing, whatever a header claims: the
 * heap's in-use bytes are the same before and after.  (Under ASAN, whose
 * allocator glibc's counters do not see, the huge-count test above is the
 * check that matters.) */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void test_no_allocation(void **state)
{
    (void)state;
    static const uint8_t huge[] = { 0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x05, 0xa2, 'i', 'd', 0x2a,
                                    0xa4, 'b', 'o', 'd', 'y', 0xdf, 0xff, 0xff, 0xff, 0xff };
    static rnp_reply p;
    rnp_request q;
    rnp_error err;
    size_t len, n;
    for (int i = 0; i < NREQ + NREP; i++) {
        if (i < NREQ) {
            make_request(i, &q);
            len = enc_req(&q, g_buf, sizeof g_buf);
        } else {
            make_reply(i - NREQ, &p);
            len = enc_rep(&p, g_buf, sizeof g_buf);
        }
        size_t before = heap_in_use();
        if (i < NREQ) {
            assert_int_equal(rnp_decode_request(g_buf, len, &q, &err), 0);
            assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &n, &err), 0);
        } else {
            assert_int_equal(rnp_decode_reply(g_buf, len, &p, &err), 0);
            assert_int_equal(rnp_encode_reply(&p, g_buf, sizeof g_buf, &n, &err), 0);
        }
        assert_int_equal(rnp_decode_request(huge, sizeof huge, &q, &err), RN_MALFORMED);
        assert_int_equal(rnp_decode_reply(huge, sizeof huge, &p, &err), RN_MALFORMED);
        assert_int_equal(heap_in_use(), before);
    }
}

static void test_message_size_limit(void **state)
{
    (void)state;
    /* A ping reply padded with an unknown key (replies skip unknown keys)
     * to exactly RNP_MAX_MSG bytes decodes; one byte more does not. */
    static rnp_reply p;
    make_reply(7, &p);
    size_t len = enc_rep(&p, g_buf, sizeof g_buf);
    /* Rebuild: fixmap count + 1, then "pad": bin32 of k bytes. */
    size_t pad_hdr = 4 + 5; /* "pad" key (fixstr 3) + bin32 header */
    size_t k = RNP_MAX_MSG - len - pad_hdr;
    memmove(g_buf + 1 + pad_hdr + k, g_buf + 1, len - 1);
    g_buf[0]++;
    uint8_t *o = g_buf + 1;
    *o++ = 0xa3, *o++ = 'p', *o++ = 'a', *o++ = 'd';
    *o++ = 0xc6, *o++ = (uint8_t)(k >> 24), *o++ = (uint8_t)(k >> 16), *o++ = (uint8_t)(k >> 8),
    *o++ = (uint8_t)k;
    memset(o, 0x55, k);
    expect_code(true, g_buf, RNP_MAX_MSG, 0, "reply of exactly RNP_MAX_MSG bytes");
    expect_code(true, g_buf, RNP_MAX_MSG + 1, RN_TOO_BIG, "reply of RNP_MAX_MSG + 1 bytes");
    expect_code(false, g_buf, RNP_MAX_MSG + 1, RN_TOO_BIG, "request of RNP_MAX_MSG + 1 bytes");
}

static void test_encode_buffer_too_small(void **state)
{
    (void)state;
    rnp_request q;
    rnp_error err;
    size_t len = 0, full;
    make_request(6, &q);
    full = enc_req(&q, g_buf, sizeof g_buf);
    for (size_t cap = 0; cap < full; cap++) {
        len = 12345;
        assert_int_equal(rnp_encode_request(&q, g_buf, cap, &len, &err), RN_TOO_BIG);
        assert_int_equal(len, 12345); /* untouched on failure */
    }
    assert_int_equal(rnp_encode_request(&q, g_buf, full, &len, &err), 0);
    assert_int_equal(len, full);
    /* Unknown op, string not terminated, too many handles. */
    q.op = 0;
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
    make_request(0, &q);
    memset(q.u.hello.client_name, 'a', RNP_MAX_NAME);
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "hello.client"));
    make_request(4, &q);
    q.u.events.n = RNP_MAX_EVENTS + 1;
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
}

/* ---- envelope ------------------------------------------------------------------------- */

/* Small hand-made messages through msgpack-c's packer. */
typedef struct mb {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mb;

static void mb_init(mb *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mb_key(mb *m, const char *k)
{
    msgpack_pack_str(&m->pk, strlen(k));
    msgpack_pack_str_body(&m->pk, k, strlen(k));
}

static void test_envelope_errors(void **state)
{
    (void)state;
    struct { int v, op, id, body; int want; const char *what; } cases[] = {
        { 1, 6, 9, 0, 0, "ping" },
        { 2, 6, 9, 0, RN_BAD_VERSION, "version 2" },
        { 0, 6, 9, 0, RN_BAD_VERSION, "version 0" },
        { -1, 6, 9, 0, RN_MISSING_FIELD, "no version" },
        { 1, 0, 9, 0, RN_UNKNOWN_OP, "op 0" },
        { 1, RN_OP_MAX + 1, 9, 0, RN_UNKNOWN_OP, "op past the last" },
        { 1, -1, 9, 0, RN_MISSING_FIELD, "no op" },
        { 1, 6, -1, 0, RN_MISSING_FIELD, "no id" },
        { 1, 1, 9, 0, RN_MISSING_FIELD, "hello without body" },
        { 1, 6, 9, 1, 0, "ping with an empty body" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mb m;
        mb_init(&m);
        msgpack_pack_map(&m.pk, (cases[i].v >= 0) + (cases[i].op >= 0) + (cases[i].id >= 0) +
                                    cases[i].body);
        if (cases[i].v >= 0)
            mb_key(&m, "v"), msgpack_pack_int(&m.pk, cases[i].v);
        if (cases[i].op >= 0)
            mb_key(&m, "op"), msgpack_pack_int(&m.pk, cases[i].op);
        if (cases[i].id >= 0)
            mb_key(&m, "id"), msgpack_pack_int(&m.pk, cases[i].id);
        if (cases[i].body)
            mb_key(&m, "body"), msgpack_pack_map(&m.pk, 0);
        expect_code(false, m.sb.data, m.sb.size, cases[i].want, cases[i].what);
        rnp_request out;
        rnp_error err;
        memset(&out, 0xee, sizeof out);
        int rc = rnp_decode_request(m.sb.data, m.sb.size, &out, &err);
        /* op and id of a failed decode: as read, or 0. */
        if (rc) {
            assert_int_equal(out.op, cases[i].op >= 0 ? (uint32_t)cases[i].op : 0);
            assert_int_equal(out.id, cases[i].id >= 0 ? (uint64_t)cases[i].id : 0);
        }
        msgpack_sbuffer_destroy(&m.sb);
    }
    /* The top level must be a map; op too large for 32 bits. */
    static const uint8_t arr[] = { 0x90 };
    expect_code(false, arr, 1, RN_BAD_TYPE, "top-level array");
    static const uint8_t big_op[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xcf, 0, 0, 0, 1, 0, 0, 0, 5,
                                      0xa2, 'i', 'd', 0x01 };
    expect_code(false, big_op, sizeof big_op, RN_BAD_TYPE, "op of 2^32 + 5");
    /* A version check comes before anything else: a v2 message with an
     * unknown envelope key is BAD_VERSION, not UNKNOWN_FIELD. */
    static const uint8_t v2[] = { 0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd', 0x01,
                                  0xa3, 'n', 'e', 'w', 0xc0 };
    expect_code(false, v2, sizeof v2, RN_BAD_VERSION, "v2 with a new key");
}

/* Any msgpack format of the right family is accepted: signed formats for
 * non-negative values, wide formats for small values, str 8/16 keys, map 16,
 * float 64 (as other msgpack libraries write them). */
static void test_alternative_encodings(void **state)
{
    (void)state;
    static const uint8_t ping[] = {
        0xde, 0x00, 0x04,                         /* map 16 of 4 */
        0xd9, 0x01, 'v', 0xd0, 0x01,              /* str 8 "v" -> int 8 1 */
        0xda, 0x00, 0x02, 'o', 'p', 0xd1, 0x00, 0x06,  /* str 16 "op" -> int 16 6 */
        0xa2, 'i', 'd', 0xcf, 0, 0, 0, 0, 0, 0, 0, 9,  /* "id" -> uint 64 9 */
        0xa4, 'b', 'o', 'd', 'y', 0xdf, 0, 0, 0, 0,    /* "body" -> map 32 of 0 */
    };
    rnp_request q;
    rnp_error err;
    assert_int_equal(rnp_decode_request(ping, sizeof ping, &q, &err), 0);
    assert_int_equal(q.op, RN_OP_PING);
    assert_int_equal(q.id, 9);
    /* hello with client as str 8 and pid as int 32; body keys reordered. */
    static const uint8_t hello[] = {
        0x84, 0xa4, 'b', 'o', 'd', 'y',
        0x82, 0xa3, 'p', 'i', 'd', 0xd2, 0x00, 0x00, 0x10, 0x92,
              0xa6, 'c', 'l', 'i', 'e', 'n', 't', 0xd9, 0x02, 'p', 'y',
        0xa2, 'i', 'd', 0x00, 0xa2, 'o', 'p', 0x01, 0xa1, 'v', 0x01,
    };
    assert_int_equal(rnp_decode_request(hello, sizeof hello, &q, &err), 0);
    assert_int_equal(q.u.hello.pid, 0x1092);
    assert_string_equal(q.u.hello.client_name, "py");
    /* A negative number in a signed format where an unsigned one is due. */
    static const uint8_t neg_id[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd',
                                      0xd0, 0xff };
    expect_code(false, neg_id, sizeof neg_id, RN_BAD_TYPE, "id of -1");
    /* Extensions are never valid values. */
    static const uint8_t ext_id[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd',
                                      0xd4, 0x01, 0x05 };
    expect_code(false, ext_id, sizeof ext_id, RN_BAD_TYPE, "id as fixext 1");
}

/* ---- mutations of every field ------------------------------------------------------------- */

typedef struct mctx {
    bool reply;
    uint32_t op;
    msgpack_object *root;
    const void *orig;        /* decoded original (for replies that must still decode) */
    int checked;
} mctx;

static size_t pack_obj(const msgpack_object *o, uint8_t *out, size_t cap)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *o);
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t n = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static int family(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return 1;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return 2;
    default: return 10 + o->type;
    }
}

static char g_lasterr[RNP_MAX_ERRMSG];

static int check_mut(mctx *c)
{
    static uint8_t buf[RNP_MAX_MSG * 2];
    static rnp_reply out;
    rnp_error err = { 0 };
    size_t n = pack_obj(c->root, buf, sizeof buf);
    c->checked++;
    int rc = dec(c->reply, buf, n, &out, &err);
    snprintf(g_lasterr, sizeof g_lasterr, "%s", rc ? err.msg : "success");
    return rc;
}

static bool is_optional(bool reply, uint32_t op, const char *parent, const char *key)
{
    static const char *const opt[] = { "w", "rstd", "dres", "dw", "weight_offset", "ready", "mode",
                                       "ordering" };
    if (reply)
        return strcmp(parent, "body.counters") == 0 || strcmp(parent, "body.hists") == 0;
    if (op != RN_OP_BWD || strcmp(parent, "body") != 0)
        return false;
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (strcmp(opt[i], key) == 0)
            return true;
    return false;
}

static msgpack_object mk_str(const char *s)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_STR };
    o.via.str.ptr = s, o.via.str.size = (uint32_t)strlen(s);
    return o;
}

/* Every mutation of one map entry or array element, with its expected
 * code; depth is the nesting depth the child would have as a container. */
static void mutate_child(mctx *c, msgpack_object *parent, uint32_t i, const char *ppath,
                         const char *path, int depth)
{
    msgpack_object *slot = parent->type == MSGPACK_OBJECT_MAP ? &parent->via.map.ptr[i].val
                                                              : &parent->via.array.ptr[i];
    static const uint8_t binb[1] = { 1 };
    msgpack_object repl[9];
    memset(repl, 0, sizeof repl);
    repl[0].type = MSGPACK_OBJECT_NIL;
    repl[1].type = MSGPACK_OBJECT_BOOLEAN, repl[1].via.boolean = true;
    repl[2].type = MSGPACK_OBJECT_NEGATIVE_INTEGER, repl[2].via.i64 = -5;
    repl[3].type = MSGPACK_OBJECT_FLOAT64, repl[3].via.f64 = 1.5;
    repl[4] = mk_str("s");
    repl[5].type = MSGPACK_OBJECT_BIN, repl[5].via.bin.ptr = (const char *)binb, repl[5].via.bin.size = 1;
    repl[6].type = MSGPACK_OBJECT_ARRAY;
    repl[7].type = MSGPACK_OBJECT_MAP;
    repl[8].type = MSGPACK_OBJECT_POSITIVE_INTEGER, repl[8].via.u64 = 1;

    /* 1. a value of every other type */
    msgpack_object save = *slot;
    for (int k = 0; k < 9; k++) {
        if (family(&repl[k]) == family(&save))
            continue;
        /* The negative integer is a valid value of the signed slot fields. */
        if (repl[k].type == MSGPACK_OBJECT_NEGATIVE_INTEGER && family(&save) == 1)
            continue;
        *slot = repl[k];
        int rc = check_mut(c);
        bool container = repl[k].type == MSGPACK_OBJECT_ARRAY || repl[k].type == MSGPACK_OBJECT_MAP;
        int want = (container && depth > RNP_MAX_DEPTH) ? RN_TOO_DEEP : RN_BAD_TYPE;
        if (rc != want)
            fail_msg("%s replaced by type %d: expected %s, got %s (%s)", path, repl[k].type,
                     rnp_err_name(want), rnp_err_name(rc), g_lasterr);
        *slot = save;
    }
    if (parent->type != MSGPACK_OBJECT_MAP)
        return;

    msgpack_object_map *m = &parent->via.map;
    msgpack_object_kv *orig = m->ptr;
    uint32_t size = m->size;
    msgpack_object_kv *tmp = calloc(size + 1, sizeof *tmp);
    assert_non_null(tmp);
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)orig[i].key.via.str.size, orig[i].key.via.str.ptr);

    /* 2. the entry left out */
    memcpy(tmp, orig, i * sizeof *tmp);
    memcpy(tmp + i, orig + i + 1, (size - i - 1) * sizeof *tmp);
    m->ptr = tmp, m->size = size - 1;
    int rc = check_mut(c);
    int want = is_optional(c->reply, c->op, ppath, key) ? 0 : RN_MISSING_FIELD;
    if (rc != want)
        fail_msg("%s left out: expected %s, got %s (%s)", path, rnp_err_name(want), rnp_err_name(rc),
                 g_lasterr);

    /* 3. the entry twice */
    memcpy(tmp, orig, size * sizeof *tmp);
    tmp[size] = orig[i];
    m->ptr = tmp, m->size = size + 1;
    rc = check_mut(c);
    if (rc != RN_DUPLICATE_FIELD)
        fail_msg("%s twice: expected DUPLICATE_FIELD, got %s (%s)", path, rnp_err_name(rc), g_lasterr);

    /* 4. its key not a string */
    memcpy(tmp, orig, size * sizeof *tmp);
    tmp[i].key = repl[8];
    m->ptr = tmp, m->size = size;
    rc = check_mut(c);
    if (rc != RN_BAD_TYPE)
        fail_msg("%s with an integer key: expected BAD_TYPE, got %s (%s)", path, rnp_err_name(rc), g_lasterr);

    m->ptr = orig, m->size = size;
    free(tmp);
}

/* An unknown key added to a map: an error in a request, ignored in a reply. */
static void add_unknown(mctx *c, msgpack_object *map, const char *path)
{
    if (c->reply && (strcmp(path, "body.counters") == 0 || strcmp(path, "body.hists") == 0))
        return; /* every key there is a name */
    msgpack_object_map *m = &map->via.map;
    msgpack_object_kv *orig = m->ptr;
    msgpack_object_kv *tmp = calloc(m->size + 1, sizeof *tmp);
    assert_non_null(tmp);
    memcpy(tmp, orig, m->size * sizeof *tmp);
    tmp[m->size].key = mk_str("zz_unknown");
    tmp[m->size].val.type = MSGPACK_OBJECT_NIL;
    m->ptr = tmp, m->size++;
    int rc = check_mut(c);
    int want = c->reply ? 0 : RN_UNKNOWN_FIELD;
    if (rc != want)
        fail_msg("unknown key in %s: expected %s, got %s (%s)", *path ? path : "(top)",
                 rnp_err_name(want), rnp_err_name(rc), g_lasterr);
    m->ptr = orig, m->size--;
    free(tmp);
}

static void walk(mctx *c, msgpack_object *o, const char *path, int depth)
{
    char sub[160];
    if (o->type == MSGPACK_OBJECT_MAP) {
        add_unknown(c, o, path);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            msgpack_object_kv *kv = &o->via.map.ptr[i];
            snprintf(sub, sizeof sub, "%s%s%.*s", path, *path ? "." : "", (int)kv->key.via.str.size,
                     kv->key.via.str.ptr);
            mutate_child(c, o, i, path, sub, depth + 1);
            walk(c, &kv->val, sub, depth + 1);
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            snprintf(sub, sizeof sub, "%s[%u]", path, i);
            mutate_child(c, o, i, path, sub, depth + 1);
            walk(c, &o->via.array.ptr[i], sub, depth + 1);
        }
    }
}

static void mutate_message(bool reply, uint32_t op, const uint8_t *buf, size_t len, const char *name)
{
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    mctx c = { .reply = reply, .op = op, .root = &u.data };
    /* The tree packs back to the same bytes: the mutations start from the
     * real encoding. */
    static uint8_t again[RNP_MAX_MSG];
    size_t n = pack_obj(&u.data, again, sizeof again);
    assert_int_equal(n, len);
    assert_memory_equal(again, buf, len);
    walk(&c, &u.data, "", 1);
    assert_true(c.checked > 0);
    (void)name;
    msgpack_unpacked_destroy(&u);
}

static void test_mutations_requests(void **state)
{
    (void)state;
    for (int i = 0; i < NREQ; i++) {
        rnp_request q;
        const char *name = make_request(i, &q);
        size_t len = enc_req(&q, g_buf, sizeof g_buf);
        mutate_message(false, q.op, g_buf, len, name);
    }
}

static void test_mutations_replies(void **state)
{
    (void)state;
    for (int i = 0; i < NREP; i++) {
        static rnp_reply p;
        const char *name = make_reply(i, &p);
        size_t len = enc_rep(&p, g_buf, sizeof g_buf);
        mutate_message(true, p.op, g_buf, len, name);
    }
}

/* ---- bounds of every field ------------------------------------------------------------ */

/* Values for the edits below live in this arena, reset by each test. */
static uint8_t g_arena[1 << 20];
static size_t g_used;

static void *arena(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    assert_true(g_used + n <= sizeof g_arena);
    void *p = g_arena + g_used;
    memset(p, 0, n);
    g_used += n;
    return p;
}

static msgpack_object o_uint(uint64_t v)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_POSITIVE_INTEGER };
    o.via.u64 = v;
    return o;
}

static msgpack_object o_int(int64_t v)
{
    if (v >= 0)
        return o_uint((uint64_t)v);
    msgpack_object o = { .type = MSGPACK_OBJECT_NEGATIVE_INTEGER };
    o.via.i64 = v;
    return o;
}

static msgpack_object o_f64(double v)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_FLOAT64 };
    o.via.f64 = v;
    return o;
}

/* A string of n bytes: prefix, then 'a's. */
static msgpack_object o_str(const char *prefix, size_t n)
{
    char *s = arena(n + 1);
    memset(s, 'a', n);
    memcpy(s, prefix, strlen(prefix) < n ? strlen(prefix) : n);
    msgpack_object o = { .type = MSGPACK_OBJECT_STR };
    o.via.str.ptr = s, o.via.str.size = (uint32_t)n;
    return o;
}

static msgpack_object o_bin(size_t n)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_BIN };
    o.via.bin.ptr = arena(n + 1), o.via.bin.size = (uint32_t)n;
    return o;
}

/* An array of n copies of v. */
static msgpack_object o_arr(msgpack_object v, size_t n)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_ARRAY };
    o.via.array.ptr = arena((n + 1) * sizeof(msgpack_object));
    o.via.array.size = (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        o.via.array.ptr[i] = v;
    return o;
}

/* A map of n distinct names (of namelen bytes, at least 3) to v. */
static msgpack_object o_named(msgpack_object v, size_t n, size_t namelen)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_MAP };
    o.via.map.ptr = arena((n + 1) * sizeof(msgpack_object_kv));
    o.via.map.size = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        char pre[24];
        snprintf(pre, sizeof pre, "%03zu", i);
        o.via.map.ptr[i].key = o_str(pre, namelen);
        o.via.map.ptr[i].val = v;
    }
    return o;
}

/* The slot of path ("body.x.offset") in a map tree; a missing last key is
 * added (so an edit can add an optional field). */
static msgpack_object *find(msgpack_object *o, const char *path)
{
    char seg[64];
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    snprintf(seg, sizeof seg, "%.*s", (int)n, path);
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    msgpack_object_map *m = &o->via.map;
    for (uint32_t i = 0; i < m->size; i++) {
        msgpack_object *k = &m->ptr[i].key;
        if (k->via.str.size == n && memcmp(k->via.str.ptr, seg, n) == 0)
            return dot ? find(&m->ptr[i].val, dot + 1) : &m->ptr[i].val;
    }
    assert_null(dot); /* only the last key may be new */
    msgpack_object_kv *grown = arena((m->size + 1) * sizeof *grown);
    memcpy(grown, m->ptr, m->size * sizeof *grown);
    grown[m->size].key = o_str(seg, n);
    m->ptr = grown;
    return &m->ptr[m->size++].val;
}

static rnp_request g_q;
static rnp_reply g_p;

/* Sample `sample` with up to two fields set; returns the decoder's code
 * (the decoded message is in g_q / g_p). */
static int edit2(bool reply, int sample, const char *path, msgpack_object val, const char *path2,
                 msgpack_object val2)
{
    size_t len;
    if (reply) {
        make_reply(sample, &g_p);
        len = enc_rep(&g_p, g_buf, sizeof g_buf);
    } else {
        make_request(sample, &g_q);
        len = enc_req(&g_q, g_buf, sizeof g_buf);
    }
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)g_buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    *find(&u.data, path) = val;
    if (path2)
        *find(&u.data, path2) = val2;
    static uint8_t buf[2 * RNP_MAX_MSG];
    size_t n = pack_obj(&u.data, buf, sizeof buf);
    msgpack_unpacked_destroy(&u);
    rnp_error err = { 0 };
    int rc = dec(reply, buf, n, reply ? (void *)&g_p : (void *)&g_q, &err);
    snprintf(g_lasterr, sizeof g_lasterr, "%s", rc ? err.msg : "success");
    return rc;
}

static void edit_expect(bool reply, int sample, const char *path, msgpack_object val, int want, int line)
{
    int rc = edit2(reply, sample, path, val, NULL, val);
    if (rc != want)
        fail_msg("line %d: %s: expected %s, got %s (%s)", line, path, rnp_err_name(want),
                 rnp_err_name(rc), g_lasterr);
    if (rc != 0 && !strstr(g_lasterr, path + (strncmp(path, "body.", 5) == 0 ? 5 : 0)) &&
        !strstr(g_lasterr, "message"))
        fail_msg("line %d: \"%s\" does not name %s", line, g_lasterr, path);
}
#define REQ(sample, path, val, want) edit_expect(false, sample, path, val, want, __LINE__)
#define REP(sample, path, val, want) edit_expect(true, sample, path, val, want, __LINE__)

enum { S_HELLO = 0, S_REG_SHM = 1, S_REG_IPC = 2, S_UNREG = 3, S_EVENTS = 4, S_BWD = 6 };
enum { P_HELLO = 0, P_REG = 2, P_EVENTS = 4, P_BWD = 5, P_PING = 7, P_HEALTH = 9, P_STATS = 10,
       P_ERROR = 13 };

static void test_bounds_requests(void **state)
{
    (void)state;
    g_used = 0;
    /* hello */
    REQ(S_HELLO, "body.client", o_str("c", RNP_MAX_NAME - 1), 0);
    REQ(S_HELLO, "body.client", o_str("c", RNP_MAX_NAME), RN_TOO_BIG);
    REQ(S_HELLO, "body.client", o_str("", 0), RN_INVALID_ARGUMENT);
    {
        msgpack_object nul = o_str("abc", 3);
        ((char *)nul.via.str.ptr)[1] = '\0';
        REQ(S_HELLO, "body.client", nul, RN_INVALID_ARGUMENT);
    }
    REQ(S_HELLO, "body.pid", o_uint(0), RN_INVALID_ARGUMENT);
    REQ(S_HELLO, "body.pid", o_uint(UINT32_MAX), 0);
    REQ(S_HELLO, "body.pid", o_uint(1ull << 32), RN_BAD_TYPE);
    /* register */
    REQ(S_REG_SHM, "body.shm_name", o_str("/", RNP_MAX_SHM_NAME), 0);
    assert_int_equal(strlen(g_q.u.reg.shm_name), RNP_MAX_SHM_NAME);
    REQ(S_REG_SHM, "body.shm_name", o_str("/", RNP_MAX_SHM_NAME + 1), RN_TOO_BIG);
    REQ(S_REG_SHM, "body.shm_name", o_str("/", 2), 0);
    REQ(S_REG_SHM, "body.shm_name", o_str("/", 1), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.shm_name", o_str("noslash", 7), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.shm_name", o_str("/a/b", 4), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.kind", o_uint(0), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.kind", o_uint(3), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.size", o_uint(0), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.size", o_uint(UINT64_MAX), 0);
    REQ(S_REG_SHM, "body.ipc_handle", o_bin(RNP_IPC_HANDLE_BYTES), RN_INVALID_ARGUMENT);
    REQ(S_REG_SHM, "body.device_uuid", o_bin(RNP_UUID_BYTES), RN_INVALID_ARGUMENT);
    REQ(S_REG_IPC, "body.shm_name", o_str("/x", 2), RN_INVALID_ARGUMENT);
    REQ(S_REG_IPC, "body.ipc_handle", o_bin(RNP_IPC_HANDLE_BYTES - 1), RN_BAD_TYPE);
    REQ(S_REG_IPC, "body.ipc_handle", o_bin(RNP_IPC_HANDLE_BYTES + 1), RN_TOO_BIG);
    REQ(S_REG_IPC, "body.ipc_handle", o_bin(1u << 16), RN_TOO_BIG);
    REQ(S_REG_IPC, "body.device_uuid", o_bin(RNP_UUID_BYTES + 1), RN_TOO_BIG);
    REQ(S_REG_IPC, "body.session", o_bin(RNP_SESSION_BYTES - 1), RN_BAD_TYPE);
    REQ(S_REG_IPC, "body.session", o_bin(RNP_SESSION_BYTES + 1), RN_TOO_BIG);
    REQ(S_REG_IPC, "body.session", o_bin(0), RN_BAD_TYPE);
    /* unregister */
    REQ(S_UNREG, "body.region", o_uint(UINT32_MAX), 0);
    REQ(S_UNREG, "body.region", o_uint(1ull << 32), RN_BAD_TYPE);
    /* events */
    REQ(S_EVENTS, "body.ready", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), RNP_MAX_EVENTS), 0);
    assert_int_equal(g_q.u.events.n, RNP_MAX_EVENTS);
    REQ(S_EVENTS, "body.ready", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), RNP_MAX_EVENTS + 1), RN_TOO_BIG);
    REQ(S_EVENTS, "body.ready", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), 1), 0);
    REQ(S_EVENTS, "body.ready", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), 0), RN_INVALID_ARGUMENT);
    REQ(S_EVENTS, "body.ready", o_arr(o_bin(RNP_IPC_HANDLE_BYTES + 1), 2), RN_TOO_BIG);
    REQ(S_EVENTS, "body.ready", o_arr(o_uint(1), 2), RN_BAD_TYPE);
    /* bwd: scalars */
    REQ(S_BWD, "body.n", o_uint(UINT32_MAX), 0);
    REQ(S_BWD, "body.n", o_uint(1ull << 32), RN_BAD_TYPE);
    REQ(S_BWD, "body.m", o_uint(UINT64_MAX), 0);
    REQ(S_BWD, "body.seq", o_uint(UINT64_MAX), 0);
    REQ(S_BWD, "body.ready", o_int(-1), 0);
    assert_int_equal(g_q.u.bwd.ready_slot, -1);
    REQ(S_BWD, "body.ready", o_int(RNP_MAX_EVENTS - 1), 0);
    REQ(S_BWD, "body.ready", o_int(RNP_MAX_EVENTS), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.ready", o_int(-2), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.ready", o_int(INT64_MIN), RN_BAD_TYPE);
    REQ(S_BWD, "body.ready", o_uint(UINT64_MAX), RN_BAD_TYPE);
    REQ(S_BWD, "body.mode", o_uint(RNP_MODE_SYNC), 0);
    REQ(S_BWD, "body.mode", o_uint(2), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.ordering", o_uint(0), 0);
    REQ(S_BWD, "body.ordering", o_uint(1), RN_UNSUPPORTED);
    REQ(S_BWD, "body.eps", o_f64(1e-6), 0);
    assert_true(g_q.u.bwd.eps == 1e-6f);
    REQ(S_BWD, "body.eps", o_f64(0.0), 0);
    REQ(S_BWD, "body.eps", o_f64(-1e-6), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.eps", o_f64(1e300), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.eps", o_f64(NAN), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.eps", o_f64(INFINITY), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.eps", o_uint(0), RN_BAD_TYPE);
    REQ(S_BWD, "body.weight_offset", o_f64(-1.0), 0);
    assert_true(g_q.u.bwd.weight_offset == -1.0f);
    REQ(S_BWD, "body.weight_offset", o_f64(-INFINITY), RN_INVALID_ARGUMENT);
    /* bwd: tensors */
    REQ(S_BWD, "body.x.dtype", o_uint(RN_DTYPE_BF16), 0);
    REQ(S_BWD, "body.x.dtype", o_uint(4), RN_INVALID_ARGUMENT);
    REQ(S_BWD, "body.x.dtype", o_uint(1ull << 40), RN_BAD_TYPE);
    REQ(S_BWD, "body.w.dtype", o_uint(RN_DTYPE_NONE), 0); /* the validator's business */
    REQ(S_BWD, "body.x.region", o_uint(UINT32_MAX), 0);
    REQ(S_BWD, "body.x.region", o_uint(1ull << 32), RN_BAD_TYPE);
    REQ(S_BWD, "body.x.offset", o_uint(UINT64_MAX), 0);
    REQ(S_BWD, "body.x.stride", o_uint(UINT64_MAX), 0);
    REQ(S_BWD, "body.w.stride", o_uint(8), RN_UNKNOWN_FIELD);
    REQ(S_BWD, "body.dw.stride", o_uint(8), RN_UNKNOWN_FIELD);
    REQ(S_BWD, "body.rstd.stride", o_uint(8), RN_UNKNOWN_FIELD);
    REQ(S_BWD, "body.rstd.dtype", o_uint(RN_DTYPE_F32), RN_UNKNOWN_FIELD);
    /* Absent optional fields are left out, never nil. */
    REQ(S_BWD, "body.w", (msgpack_object){ .type = MSGPACK_OBJECT_NIL }, RN_BAD_TYPE);
    REQ(S_BWD, "body.ready", (msgpack_object){ .type = MSGPACK_OBJECT_NIL }, RN_BAD_TYPE);
    /* envelope */
    REQ(S_HELLO, "id", o_uint(UINT64_MAX), 0);
    assert_true(g_q.id == UINT64_MAX);
    REQ(S_HELLO, "v", o_uint(1ull << 32), RN_BAD_TYPE);
}

static void test_bounds_replies(void **state)
{
    (void)state;
    g_used = 0;
    REP(P_ERROR, "error", o_str("e", RNP_MAX_ERRMSG - 1), 0);
    REP(P_ERROR, "error", o_str("e", RNP_MAX_ERRMSG), RN_TOO_BIG);
    REP(P_ERROR, "status", o_int(INT32_MAX), 0);
    REP(P_ERROR, "status", o_int(INT32_MIN), 0);
    REP(P_ERROR, "status", o_int((int64_t)INT32_MAX + 1), RN_BAD_TYPE);
    REP(P_ERROR, "status", o_int((int64_t)INT32_MIN - 1), RN_BAD_TYPE);
    REP(P_ERROR, "v", o_uint(7), 0);              /* not checked in an error reply */
    REP(P_ERROR, "op", o_uint(UINT32_MAX), 0);
    REP(P_ERROR, "op", o_uint(1ull << 32), RN_BAD_TYPE);
    REP(P_PING, "v", o_uint(2), RN_BAD_VERSION);  /* checked in a success reply */
    REP(P_PING, "op", o_uint(0), RN_UNKNOWN_OP);
    REP(P_PING, "op", o_uint(RN_OP_MAX + 1), RN_UNKNOWN_OP);
    REP(P_PING, "error", o_str("x", 1), RN_MALFORMED);
    REP(P_PING, "status", o_int(RN_TIMEOUT), RN_MISSING_FIELD); /* error missing */
    REP(P_HELLO, "body.device_name", o_str("d", RNP_MAX_NAME - 1), 0);
    REP(P_HELLO, "body.device_name", o_str("d", RNP_MAX_NAME), RN_TOO_BIG);
    REP(P_HELLO, "body.daemon_version", o_str("d", RNP_MAX_NAME), RN_TOO_BIG);
    REP(P_HELLO, "body.backend", o_str("b", RNP_MAX_NAME), RN_TOO_BIG);
    REP(P_HELLO, "body.limits.max_m", o_uint(UINT64_MAX), 0);
    REP(P_HELLO, "body.limits.max_n", o_uint(1ull << 32), RN_BAD_TYPE);
    REP(P_HELLO, "body.device_uuid", o_bin(RNP_UUID_BYTES + 1), RN_TOO_BIG);
    REP(P_REG, "body.region", o_uint(UINT32_MAX), 0);
    REP(P_EVENTS, "body.done", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), RNP_MAX_EVENTS), 0);
    REP(P_EVENTS, "body.done", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), RNP_MAX_EVENTS + 1), RN_TOO_BIG);
    REP(P_EVENTS, "body.done", o_arr(o_bin(RNP_IPC_HANDLE_BYTES), 0), RN_INVALID_ARGUMENT);
    REP(P_BWD, "body.done", o_int(-1), 0);
    REP(P_BWD, "body.done", o_int(RNP_MAX_EVENTS - 1), 0);
    REP(P_BWD, "body.done", o_int(RNP_MAX_EVENTS), RN_INVALID_ARGUMENT);
    REP(P_BWD, "body.done", o_int(-2), RN_INVALID_ARGUMENT);
    REP(P_HEALTH, "body.state", o_uint(RNP_HEALTH_FAILING), 0);
    REP(P_HEALTH, "body.state", o_uint(3), RN_INVALID_ARGUMENT);
    REP(P_HEALTH, "body.reasons", o_arr(o_str("r", RNP_REASON_LEN - 1), RNP_MAX_REASONS), 0);
    assert_int_equal(g_p.u.health.nreasons, RNP_MAX_REASONS);
    REP(P_HEALTH, "body.reasons", o_arr(o_str("r", RNP_REASON_LEN), 1), RN_TOO_BIG);
    REP(P_HEALTH, "body.reasons", o_arr(o_str("r", 5), RNP_MAX_REASONS + 1), RN_TOO_BIG);
    REP(P_HEALTH, "body.reasons", o_arr(o_str("r", 0), 0), 0);
    REP(P_STATS, "body.counters", o_named(o_uint(UINT64_MAX), RNP_MAX_STATS, RNP_STAT_NAME - 1), 0);
    assert_int_equal(g_p.u.stats.nstats, RNP_MAX_STATS);
    assert_true(g_p.u.stats.stats[RNP_MAX_STATS - 1].value == UINT64_MAX);
    REP(P_STATS, "body.counters", o_named(o_uint(1), RNP_MAX_STATS + 1, 8), RN_TOO_BIG);
    REP(P_STATS, "body.counters", o_named(o_uint(1), 1, RNP_STAT_NAME), RN_TOO_BIG);
    REP(P_STATS, "body.counters", o_named(o_int(-1), 1, 8), RN_BAD_TYPE);
    {
        msgpack_object h = o_named(o_uint(5), 5, 3); /* wrong names inside a histogram */
        REP(P_STATS, "body.hists", o_named(h, 1, 8), RN_MISSING_FIELD);
    }
    {
        make_reply(P_STATS, &g_p);
        size_t len = enc_rep(&g_p, g_buf, sizeof g_buf);
        msgpack_unpacked u;
        size_t off = 0;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, (const char *)g_buf, len, &off), MSGPACK_UNPACK_SUCCESS);
        msgpack_object hist = *find(&u.data, "body.hists.queue");
        REP(P_STATS, "body.hists", o_named(hist, RNP_MAX_HISTS, RNP_STAT_NAME - 1), 0);
        assert_int_equal(g_p.u.stats.nhists, RNP_MAX_HISTS);
        REP(P_STATS, "body.hists", o_named(hist, RNP_MAX_HISTS + 1, 8), RN_TOO_BIG);
        msgpack_unpacked_destroy(&u);
    }
}

/* Nesting: RNP_MAX_DEPTH levels decode (replies skip an unknown key of any
 * shape), one more is TOO_DEEP wherever it is. */
static void test_depth(void **state)
{
    (void)state;
    g_used = 0;
    msgpack_object v = o_uint(1);
    for (int d = 2; d <= RNP_MAX_DEPTH + 3; d++) {
        v = o_arr(v, 1); /* v is now d - 1 levels deep; under the top map: d */
        int want = d <= RNP_MAX_DEPTH ? 0 : RN_TOO_DEEP;
        REP(P_PING, "extra", v, want);
        REQ(S_HELLO, "extra", v, d <= RNP_MAX_DEPTH ? RN_UNKNOWN_FIELD : RN_TOO_DEEP);
    }
}

/* ---- the fuzzer's seed corpus -------------------------------------------------------- */

/* Encoding of sample k: requests first, then replies.  Returns its length
 * and sets *name to the corpus file name, or returns 0 past the last. */
static size_t sample_bytes(int k, uint8_t *buf, size_t cap, char *name, size_t namecap)
{
    if (k < NREQ) {
        rnp_request q;
        snprintf(name, namecap, "req-%s.msgpack", make_request(k, &q));
        return enc_req(&q, buf, cap);
    }
    if (k < NREQ + NREP) {
        static rnp_reply p;
        snprintf(name, namecap, "rep-%s.msgpack", make_reply(k - NREQ, &p));
        return enc_rep(&p, buf, cap);
    }
    return 0;
}

static int write_corpus(const char *dir)
{
    char name[128], path[4096];
    size_t len;
    for (int k = 0; (len = sample_bytes(k, g_buf, sizeof g_buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(g_buf, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        printf("%s\n", path);
    }
    return 0;
}

/* The checked-in seed corpus is what the encoder produces now (regenerate
 * it with --write-corpus tests/fuzz/corpus after a protocol change). */
static void test_corpus_fresh(void **state)
{
    (void)state;
    const char *src = getenv("RN_SRC");
    char name[128], path[4096];
    static uint8_t file[RNP_MAX_MSG + 1];
    size_t len;
    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    for (int k = 0; (len = sample_bytes(k, g_buf, sizeof g_buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/tests/fuzz/corpus/%s", src, name);
        FILE *f = fopen(path, "rb");
        if (!f)
            fail_msg("%s is missing: run test_proto --write-corpus tests/fuzz/corpus", path);
        size_t n = fread(file, 1, sizeof file, f);
        fclose(f);
        if (n != len || memcmp(file, g_buf, len) != 0)
            fail_msg("%s is stale: run test_proto --write-corpus tests/fuzz/corpus", path);
    }
}

/* The worked example of PROTOCOL.md section 10: its three hex dumps are
 * what the encoder produces for these structs. */
static void doc_example(rnp_request *q, rnp_reply *ok, rnp_reply *bad)
{
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION, q->op = RN_OP_BWD, q->id = 42;
    rnp_bwd_req *b = &q->u.bwd;
    for (int i = 0; i < RNP_SESSION_BYTES; i++)
        b->session.b[i] = (uint8_t)(0xa0 + i);
    b->seq = 7, b->m = 2, b->n = 4;
    b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_BF16;
    b->x = T(1, 0, 4), b->dy = T(1, 16, 4), b->dx = T(2, 0, 4);
    b->has_w = true, b->w_dtype = RN_DTYPE_BF16, b->w = T(2, 64, 0);
    b->eps = 1e-6f, b->ready_slot = -1, b->mode = RNP_MODE_SYNC;
    memset(ok, 0, sizeof *ok);
    ok->version = RNP_VERSION, ok->op = RN_OP_BWD, ok->id = 42;
    ok->u.bwd = (rnp_bwd_rep){ .seq = 7, .done_slot = -1, .queue_ns = 1200, .compute_ns = 35000 };
    rnp_reply_error(bad, q, RN_OUT_OF_BOUNDS, "bwd.dx: bytes [0, 16) exceed region 2 of 8 bytes");
}

static void test_protocol_md_example(void **state)
{
    (void)state;
    const char *src = getenv("RN_SRC");
    char path[4096], line[512];
    static uint8_t dumps[3][512];
    size_t lens[3] = { 0 };
    int nd = -1;
    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    snprintf(path, sizeof path, "%s/proto/PROTOCOL.md", src);
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    /* Hex dump lines: "0000  84 a1 ..."; a dump starts at offset 0000. */
    while (fgets(line, sizeof line, f)) {
        unsigned off;
        int used;
        bool hex4 = true;
        for (int k = 0; k < 4; k++)
            hex4 = hex4 && strchr("0123456789abcdef", line[k]) && line[k];
        if (!hex4 || line[4] != ' ' || line[5] != ' ' || sscanf(line, "%4x  %n", &off, &used) != 1)
            continue;
        if (off == 0 && ++nd >= 3)
            break;
        if (nd < 0 || lens[nd] != off)
            fail_msg("PROTOCOL.md: dump %d: unexpected offset %04x", nd, off);
        const char *p = line + used;
        unsigned byte;
        int n;
        while (sscanf(p, "%2x%n", &byte, &n) == 1 && lens[nd] < sizeof dumps[0]) {
            dumps[nd][lens[nd]++] = (uint8_t)byte;
            p += n;
        }
    }
    fclose(f);
    assert_int_equal(nd, 2);
    rnp_request q;
    static rnp_reply ok, bad;
    doc_example(&q, &ok, &bad);
    size_t len = enc_req(&q, g_buf, sizeof g_buf);
    assert_int_equal(lens[0], len);
    assert_memory_equal(dumps[0], g_buf, len);
    len = enc_rep(&ok, g_buf, sizeof g_buf);
    assert_int_equal(lens[1], len);
    assert_memory_equal(dumps[1], g_buf, len);
    len = enc_rep(&bad, g_buf, sizeof g_buf);
    assert_int_equal(lens[2], len);
    assert_memory_equal(dumps[2], g_buf, len);
    /* And they decode to the structs. */
    rnp_request back;
    rnp_error err;
    assert_int_equal(rnp_decode_request(dumps[0], lens[0], &back, &err), 0);
    assert_memory_equal(&back, &q, sizeof q);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_requests),
        cmocka_unit_test(test_round_trip_replies),
        cmocka_unit_test(test_bwd_defaults),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_no_allocation),
        cmocka_unit_test(test_message_size_limit),
        cmocka_unit_test(test_encode_buffer_too_small),
        cmocka_unit_test(test_envelope_errors),
        cmocka_unit_test(test_alternative_encodings),
        cmocka_unit_test(test_mutations_requests),
        cmocka_unit_test(test_mutations_replies),
        cmocka_unit_test(test_bounds_requests),
        cmocka_unit_test(test_bounds_replies),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_corpus_fresh),
        cmocka_unit_test(test_protocol_md_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
