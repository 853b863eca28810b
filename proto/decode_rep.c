/* SPDX-License-Identifier: MIT */
/*
 * decode_rep.c - msgpack bytes to rnp_reply.  Pure: no I/O, no logging, no
 * allocation.
 *
 * Replies skip unknown keys, so that a daemon can add reply fields without
 * breaking older clients.  Each body is a map of known fields read by
 * rnp_dec_map with one field function per message; PROTOCOL.md is the
 * specification of every message read here.
 */
#include <stdio.h>
#include <string.h>

#include "rnp_dec.h"

static int limits_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_limits *l = obj;
    uint32_t *u32[] = { &l->max_sessions, &l->max_regions, &l->max_inflight,
                        &l->max_inflight_total, NULL, &l->max_n, &l->max_msg, &l->event_slots,
                        &l->seq_window };
    return u32[idx] ? rnp_dec_u32(d, path, u32[idx]) : rnp_dec_u64(d, path, &l->max_m);
}

enum { H_SESSION, H_VER, H_BACKEND, H_DEV, H_UUID, H_SM, H_CCMA, H_CCMI, H_MPS, H_LIMITS, H_CHANNEL,
       H_PATHS };

static int hello_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    static const char *const limits[] = { "max_sessions", "max_regions", "max_inflight",
                                          "max_inflight_total", "max_m", "max_n", "max_msg",
                                          "event_slots", "seq_window" };
    rnp_hello_rep *h = obj;
    switch (idx) {
    case H_SESSION: return rnp_dec_session(d, path, &h->session);
    case H_VER: return rnp_dec_str(d, path, h->daemon_version, RNP_MAX_NAME, false);
    case H_BACKEND: return rnp_dec_str(d, path, h->backend, RNP_MAX_NAME, false);
    case H_DEV: return rnp_dec_str(d, path, h->device_name, RNP_MAX_NAME, false);
    case H_UUID: return rnp_dec_bin(d, path, h->device_uuid, RNP_UUID_BYTES);
    case H_SM: return rnp_dec_u32(d, path, &h->sm_count);
    case H_CCMA: return rnp_dec_u32(d, path, &h->cc_major);
    case H_CCMI: return rnp_dec_u32(d, path, &h->cc_minor);
    case H_MPS: return rnp_dec_bool(d, path, &h->mps);
    /* channel is optional: a daemon without the session channel does not
     * send it (false). */
    case H_CHANNEL: return rnp_dec_bool(d, path, &h->channel);
    /* paths is optional: a daemon without the fast path does not send it
     * (0: classic only). */
    case H_PATHS: return rnp_dec_u32(d, path, &h->paths);
    /* seq_window is optional: a 0.1.0 daemon does not send it (0). */
    default: return rnp_dec_map(d, path, limits, 9, 0xffu, limits_field, &h->limits, NULL);
    }
}

static int register_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    (void)idx;
    return rnp_dec_u32(d, path, &((rnp_register_rep *)obj)->region.id);
}

static int events_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_events_rep *e = obj;
    (void)idx;
    return rnp_dec_handles(d, path, &e->n, e->done);
}

static int bwd_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_bwd_rep *b = obj;
    int rc;
    switch (idx) {
    case 0: return rnp_dec_u64(d, path, &b->seq);
    case 1:
        if ((rc = rnp_dec_i32(d, path, &b->done_slot)) == 0 &&
            (b->done_slot < -1 || b->done_slot >= RNP_MAX_EVENTS))
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "%d is not -1 or a slot 0..%d",
                              b->done_slot, RNP_MAX_EVENTS - 1);
        return rc;
    case 2: return rnp_dec_u64(d, path, &b->queue_ns);
    default: return rnp_dec_u64(d, path, &b->compute_ns);
    }
}

static int health_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_health_rep *h = obj;
    char sub[RNP_PATH_MAX];
    uint32_t cnt;
    int rc = 0;
    switch (idx) {
    case 0:
        if ((rc = rnp_dec_u32(d, path, &h->state)) == 0 && h->state > RNP_HEALTH_FAILING)
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "%u is not a state (0..2)", h->state);
        return rc;
    case 1: return rnp_dec_bool(d, path, &h->mps);
    case 2: return rnp_dec_str(d, path, h->backend, RNP_MAX_NAME, false);
    }
    if (!rnp_mp_read_array(&d->r, &cnt))
        return rnp_dec_wrong_type(d, path, "array");
    if (cnt > RNP_MAX_REASONS)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "%u reasons, limit %d", cnt, RNP_MAX_REASONS);
    for (uint32_t i = 0; i < cnt && rc == 0; i++) {
        snprintf(sub, sizeof sub, "%s[%u]", path, i);
        rc = rnp_dec_str(d, sub, h->reasons[i], RNP_REASON_LEN, false);
    }
    h->nreasons = cnt;
    return rc;
}

/* A histogram's buckets: a bin of whole 16-byte records (upper bound, count;
 * u64 little-endian), at most RNP_MAX_BUCKETS, upper bounds strictly
 * ascending.  That the counts add up to the histogram's count is checked
 * once the whole histogram has been read (keys come in any order). */
static int dec_buckets(rnp_dctx *d, const char *path, rnp_hist *h)
{
    const uint8_t *b;
    uint32_t len, n;
    if (!rnp_mp_read_bin(&d->r, &b, &len))
        return rnp_dec_wrong_type(d, path, "binary");
    if (len % RNP_BUCKET_BYTES != 0)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path,
                            "binary of %u bytes is not whole %d-byte buckets", len,
                            RNP_BUCKET_BYTES);
    n = len / RNP_BUCKET_BYTES;
    if (n > RNP_MAX_BUCKETS)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "%u buckets, limit %d", n, RNP_MAX_BUCKETS);
    for (uint32_t k = 0; k < n; k++) {
        h->buckets[k].upper = rnp_le64_get(b + k * RNP_BUCKET_BYTES);
        h->buckets[k].count = rnp_le64_get(b + k * RNP_BUCKET_BYTES + 8);
        if (k > 0 && h->buckets[k].upper <= h->buckets[k - 1].upper)
            return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path,
                                "bucket %u: upper bound %llu not above the previous %llu", k,
                                (unsigned long long)h->buckets[k].upper,
                                (unsigned long long)h->buckets[k - 1].upper);
    }
    h->nbuckets = n;
    h->has_buckets = true;
    return 0;
}

enum { HI_COUNT, HI_P50, HI_P90, HI_P99, HI_MAX, HI_SUM, HI_BUCKETS };

static int hist_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_hist *h = obj;
    uint64_t *dst[] = { &h->count, &h->p50, &h->p90, &h->p99, &h->max, &h->sum };
    if (idx == HI_BUCKETS)
        return dec_buckets(d, path, h);
    return rnp_dec_u64(d, path, dst[idx]);
}

/* sum and buckets are optional (a daemon before 0.2 sends neither), but come
 * together; the bucket counts add up to count exactly. */
static int hist_check(rnp_dctx *d, const char *path, const char *const *names, uint32_t seen,
                      const rnp_hist *h)
{
    uint64_t total = 0;
    int rc;
    if ((seen & (RNP_BIT(HI_SUM) | RNP_BIT(HI_BUCKETS))) &&
        (rc = rnp_dec_require(d, path, names, seen, RNP_BIT(HI_SUM) | RNP_BIT(HI_BUCKETS))) != 0)
        return rc;
    if (!h->has_buckets)
        return 0;
    for (uint32_t k = 0; k < h->nbuckets; k++) {
        if (h->buckets[k].count > UINT64_MAX - total)
            return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "bucket counts overflow");
        total += h->buckets[k].count;
    }
    if (total != h->count)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path,
                            "bucket counts add up to %llu, count is %llu",
                            (unsigned long long)total, (unsigned long long)h->count);
    return 0;
}

/* A name -> value map (counters) or name -> histogram map (hists); names are
 * unique, 1..RNP_STAT_NAME-1 bytes. */
static int dec_named(rnp_dctx *d, const char *path, bool hists, rnp_stats_rep *s)
{
    static const char *const hnames[] = { "count", "p50", "p90", "p99", "max", "sum",
                                          "buckets" };
    uint32_t seen;
    uint32_t cnt, limit = hists ? RNP_MAX_HISTS : RNP_MAX_STATS;
    char sub[RNP_PATH_MAX], name[RNP_STAT_NAME], shown[RNP_STAT_NAME + 4];
    int rc;
    if (!rnp_mp_read_map(&d->r, &cnt))
        return rnp_dec_wrong_type(d, path, "map");
    if (cnt > limit)
        return rnp_dec_fail(d, RN_TOO_BIG, path, "%u entries, limit %u", cnt, limit);
    for (uint32_t i = 0; i < cnt; i++) {
        snprintf(sub, sizeof sub, "%s[%u]", path, i);
        /* Zeroed so that the copy below carries no stack bytes after the NUL. */
        memset(name, 0, sizeof name);
        if ((rc = rnp_dec_str(d, sub, name, sizeof name, true)) != 0)
            return rc;
        /* The name is the client's: it enters a message only printable. */
        rnp_dec_printable(shown, sizeof shown, (const uint8_t *)name, (uint32_t)strlen(name));
        rnp_dec_join(sub, path, shown);
        for (uint32_t j = 0; j < i; j++) {
            const char *prev = hists ? s->hists[j].name : s->stats[j].name;
            if (strcmp(prev, name) == 0)
                return rnp_dec_fail(d, RN_DUPLICATE_FIELD, sub, "appears twice");
        }
        if (hists) {
            memcpy(s->hists[i].name, name, sizeof name);
            rc = rnp_dec_map(d, sub, hnames, 7, 0x1fu, hist_field, &s->hists[i], &seen);
            if (rc == 0)
                rc = hist_check(d, sub, hnames, seen, &s->hists[i]);
        } else {
            memcpy(s->stats[i].name, name, sizeof name);
            rc = rnp_dec_u64(d, sub, &s->stats[i].value);
        }
        if (rc)
            return rc;
    }
    if (hists)
        s->nhists = cnt;
    else
        s->nstats = cnt;
    return 0;
}

static int stats_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_stats_rep *s = obj;
    switch (idx) {
    case 0: return rnp_dec_str(d, path, s->backend, RNP_MAX_NAME, false);
    case 1: return rnp_dec_str(d, path, s->device, RNP_MAX_NAME, false);
    default: return dec_named(d, path, idx == 3, s);
    }
}

static int ping_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    (void)idx;
    return rnp_dec_u64(d, path, &((rnp_ping_rep *)obj)->daemon_time_ns);
}

static int ring_open_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    (void)idx;
    return rnp_dec_u32(d, path, &((rnp_ring_open_rep *)obj)->ring);
}

static int graph_open_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    (void)idx;
    return rnp_dec_u32(d, path, &((rnp_graph_open_rep *)obj)->graph);
}

static int dec_body(rnp_dctx *d, void *msg)
{
    rnp_reply *p = msg;
    static const char *const hello[] = { "session", "daemon_version", "backend", "device_name",
                                         "device_uuid", "sm_count", "cc_major", "cc_minor", "mps",
                                         "limits", "channel", "paths" };
    static const char *const reg[] = { "region" }, *const events[] = { "done" };
    static const char *const bwd[] = { "seq", "done", "queue_ns", "compute_ns" };
    static const char *const health[] = { "state", "mps", "backend", "reasons" };
    static const char *const stats[] = { "backend", "device", "counters", "hists" };
    static const char *const ping[] = { "time_ns" };
    static const char *const ring[] = { "ring" }, *const graph[] = { "graph" };
    switch (p->op) {
    case RN_OP_HELLO:
        return rnp_dec_map(d, "hello", hello, 12, 0x3ffu, hello_field, &p->u.hello, NULL);
    case RN_OP_REGISTER:
        return rnp_dec_map(d, "register", reg, 1, 0x1, register_field, &p->u.reg, NULL);
    case RN_OP_EVENTS:
        return rnp_dec_map(d, "events", events, 1, 0x1, events_field, &p->u.events, NULL);
    case RN_OP_BWD: return rnp_dec_map(d, "bwd", bwd, 4, 0xfu, bwd_field, &p->u.bwd, NULL);
    case RN_OP_HEALTH:
        return rnp_dec_map(d, "health", health, 4, 0xfu, health_field, &p->u.health, NULL);
    case RN_OP_STATS:
        return rnp_dec_map(d, "stats", stats, 4, 0xfu, stats_field, &p->u.stats, NULL);
    case RN_OP_PING: return rnp_dec_map(d, "ping", ping, 1, 0x1, ping_field, &p->u.ping, NULL);
    case RN_OP_RING_OPEN:
        return rnp_dec_map(d, "ring_open", ring, 1, 0x1, ring_open_field, &p->u.ring_open, NULL);
    case RN_OP_GRAPH_OPEN:
        return rnp_dec_map(d, "graph_open", graph, 1, 0x1, graph_open_field, &p->u.graph_open,
                           NULL);
    default: return rnp_dec_empty(d, rnp_op_name(p->op));
    }
}

static int decode_reply(const void *buf, size_t len, rnp_reply *p, rnp_error *err)
{
    enum { F_V, F_OP, F_ID, F_STATUS, F_ERROR, F_BODY };
    static const char *const names[] = { "v", "op", "id", "status", "error", "body" };
    rnp_dctx d;
    rnp_mapit it;
    int rc, idx;
    rnp_mp body = { 0 };

    if ((rc = rnp_dec_begin(&d, buf, len, false, err)) != 0 ||
        (rc = rnp_dec_map_open(&d, &it, "message", names, 6)) != 0)
        return rc;
    while ((rc = rnp_dec_map_next(&d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_V: rc = rnp_dec_u32(&d, "v", &p->version); break;
        case F_OP: rc = rnp_dec_u32(&d, "op", &p->op); break;
        case F_ID: rc = rnp_dec_u64(&d, "id", &p->id); break;
        case F_STATUS: rc = rnp_dec_i32(&d, "status", &p->status); break;
        case F_ERROR: rc = rnp_dec_str(&d, "error", p->error, RNP_MAX_ERRMSG, false); break;
        case F_BODY: rc = rnp_dec_capture(&d, "body", &body); break;
        }
        if (rc)
            return rc;
    }
    if (rc || (rc = rnp_dec_require(&d, "message", names, it.seen,
                                    RNP_BIT(F_V) | RNP_BIT(F_OP) | RNP_BIT(F_ID) |
                                        RNP_BIT(F_STATUS))) != 0)
        return rc;
    if (p->status != 0) {
        /* An error reply has no body; its version and op are whatever the
         * daemon could make of the request, so they are not checked. */
        return rnp_dec_require(&d, "message", names, it.seen, RNP_BIT(F_ERROR));
    }
    if (p->version != RNP_VERSION)
        return rnp_dec_fail(&d, RN_BAD_VERSION, "v", "version %u is not supported (supported: %u)",
                            p->version, RNP_VERSION);
    if (p->op < 1 || p->op > RN_OP_MAX)
        return rnp_dec_fail(&d, RN_UNKNOWN_OP, "op", "%u is not an operation", p->op);
    if (it.seen & RNP_BIT(F_ERROR))
        return rnp_dec_fail(&d, RN_MALFORMED, "error", "present in a reply with status 0");
    return rnp_dec_body(&d, it.seen & RNP_BIT(F_BODY) ? &body : NULL, p->op, false, dec_body, p);
}

int rnp_decode_reply(const void *buf, size_t len, rnp_reply *out, rnp_error *err)
{
    rnp_reply p;
    memset(&p, 0, sizeof p);
    int rc = decode_reply(buf, len, &p, err);
    if (out && rc == 0)
        *out = p;
    else if (out)
        rnp_dec_peek_header(buf, len, &out->op, &out->id);
    return rc;
}
