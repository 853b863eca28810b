/* SPDX-License-Identifier: MIT */
/*
 * test_proto_bounds.c - the limits of every field of the protocol: each value
 * at its limit decodes, one past it gives its exact code and a message
 * naming the field; and the nesting depth limit.
 *
 * A sample message is unpacked into a msgpack-c tree, one or two fields are
 * set (or added), and the tree is packed again and decoded.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto_samples.h"

static uint8_t g_buf[RNP_MAX_MSG + 64];
static char g_lasterr[RNP_MAX_ERRMSG];

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
        tp_make_reply(sample, &g_p);
        len = tp_enc_rep(&g_p, g_buf, sizeof g_buf);
    } else {
        tp_make_request(sample, &g_q);
        len = tp_enc_req(&g_q, g_buf, sizeof g_buf);
    }
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)g_buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    *find(&u.data, path) = val;
    if (path2)
        *find(&u.data, path2) = val2;
    static uint8_t buf[2 * RNP_MAX_MSG];
    size_t n = tp_pack_obj(&u.data, buf, sizeof buf);
    msgpack_unpacked_destroy(&u);
    rnp_error err = { 0 };
    int rc = tp_dec(reply, buf, n, reply ? (void *)&g_p : (void *)&g_q, &err);
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
        tp_make_reply(P_STATS, &g_p);
        size_t len = tp_enc_rep(&g_p, g_buf, sizeof g_buf);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_requests),
        cmocka_unit_test(test_bounds_replies),
        cmocka_unit_test(test_depth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
