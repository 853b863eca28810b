/* SPDX-License-Identifier: MIT */
/*
 * encode.c - rnp_request / rnp_reply to msgpack bytes with msgpack-c's packer,
 * writing into the caller's fixed buffer.  Pure: no I/O, no logging, no
 * allocation.
 *
 * The encoder checks only what the wire format needs (a known op, strings
 * NUL-terminated within their arrays, counts within the limits); the meaning
 * of values (dtypes, shapes, slots) is the decoder's and the validator's
 * business, so tests can build requests that a daemon must reject.
 */
#include <string.h>

#include <msgpack.h>

#include "rn_proto.h"

typedef struct ebuf {
    uint8_t *buf;
    size_t cap, len;
    bool overflow;
} ebuf;

/* msgpack-c's write callback: append, or remember that the buffer is full.
 * It answers in msgpack-c's convention (0 or -1); finish() turns a full
 * buffer into RN_TOO_BIG with a message, as everywhere else in proto/. */
static int ebuf_write(void *data, const char *p, size_t n)
{
    ebuf *e = data;
    if (e->overflow || n > e->cap - e->len) {
        e->overflow = true;
        return -1;
    }
    memcpy(e->buf + e->len, p, n);
    e->len += n;
    return 0;
}

typedef struct enc {
    msgpack_packer pk;
    ebuf eb;
    rnp_error *err;
    int rc;           /* first error; later writes are skipped */
} enc;

static void key(enc *e, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, k, n);
}

static void kv_uint(enc *e, const char *k, uint64_t v)
{
    key(e, k);
    msgpack_pack_uint64(&e->pk, v);
}

static void kv_int(enc *e, const char *k, int64_t v)
{
    key(e, k);
    msgpack_pack_int64(&e->pk, v);
}

static void kv_float(enc *e, const char *k, float v)
{
    key(e, k);
    msgpack_pack_float(&e->pk, v);
}

static void kv_bool(enc *e, const char *k, bool v)
{
    key(e, k);
    if (v)
        msgpack_pack_true(&e->pk);
    else
        msgpack_pack_false(&e->pk);
}

static void kv_bin(enc *e, const char *k, const uint8_t *b, size_t n)
{
    key(e, k);
    msgpack_pack_bin(&e->pk, n);
    msgpack_pack_bin_body(&e->pk, b, n);
}

/* A map of n unsigned fields. */
static void map_uints(enc *e, const char *const *names, const uint64_t *v, uint32_t n)
{
    msgpack_pack_map(&e->pk, n);
    for (uint32_t i = 0; i < n; i++)
        kv_uint(e, names[i], v[i]);
}

/* A C string stored in a char[cap]; it must be terminated inside the array. */
static void str_val(enc *e, const char *path, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap) {
        if (!e->rc)
            e->rc = rnp_fail(e->err, RN_INVALID_ARGUMENT, "%s: not NUL-terminated within %zu bytes",
                             path, cap);
        return;
    }
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

static void kv_str(enc *e, const char *k, const char *path, const char *s, size_t cap)
{
    key(e, k);
    str_val(e, path, s, cap);
}

static void too_many(enc *e, const char *path, uint32_t n, uint32_t limit)
{
    if (!e->rc)
        e->rc = rnp_fail(e->err, RN_INVALID_ARGUMENT, "%s: %u entries, limit %u", path, n, limit);
}

/* ---- requests ---------------------------------------------------------------- */

static void tensor(enc *e, const char *k, const rnp_tensor *t, int dtype, bool two_d)
{
    key(e, k);
    msgpack_pack_map(&e->pk, 2 + (dtype >= 0) + two_d);
    kv_uint(e, "region", t->region.id);
    kv_uint(e, "offset", t->offset);
    if (dtype >= 0)
        kv_uint(e, "dtype", (uint64_t)dtype);
    if (two_d)
        kv_uint(e, "stride", t->stride);
}

static bool float_is_zero_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b == 0;
}

static void enc_bwd_req(enc *e, const rnp_bwd_req *b)
{
    /* Optional scalars at their defaults are left out, so that what the
     * decoder fills in for an absent key round-trips bit for bit. */
    bool woff = !float_is_zero_bits(b->weight_offset);
    bool ready = b->ready_slot != -1, mode = b->mode != 0, ord = b->ordering != 0;
    uint32_t n = 8 + b->has_w + b->has_rstd + b->has_dres + b->has_dw + woff + ready + mode + ord;
    msgpack_pack_map(&e->pk, n);
    kv_bin(e, "session", b->session.b, RNP_SESSION_BYTES);
    kv_uint(e, "seq", b->seq);
    kv_uint(e, "m", b->m);
    kv_uint(e, "n", b->n);
    tensor(e, "x", &b->x, b->x_dtype, true);
    tensor(e, "dy", &b->dy, b->dy_dtype, true);
    tensor(e, "dx", &b->dx, b->dx_dtype, true);
    if (b->has_w)
        tensor(e, "w", &b->w, b->w_dtype, false);
    if (b->has_rstd)
        tensor(e, "rstd", &b->rstd, -1, false);
    if (b->has_dres)
        tensor(e, "dres", &b->dres, b->dres_dtype, true);
    if (b->has_dw)
        tensor(e, "dw", &b->dw, b->dw_dtype, false);
    kv_float(e, "eps", b->eps);
    if (woff)
        kv_float(e, "weight_offset", b->weight_offset);
    if (ready)
        kv_int(e, "ready", b->ready_slot);
    if (mode)
        kv_uint(e, "mode", b->mode);
    if (ord)
        kv_uint(e, "ordering", b->ordering);
}

static void enc_register_req(enc *e, const rnp_register_req *g)
{
    bool shm = g->kind == RNP_REGION_SHM, ipc = g->kind == RNP_REGION_CUDA_IPC;
    /* Another kind is sent without kind-specific fields (for tests). */
    msgpack_pack_map(&e->pk, 3 + shm + 2 * ipc);
    kv_bin(e, "session", g->session.b, RNP_SESSION_BYTES);
    kv_uint(e, "kind", g->kind);
    kv_uint(e, "size", g->size);
    if (shm)
        kv_str(e, "shm_name", "register.shm_name", g->shm_name, sizeof g->shm_name);
    if (ipc) {
        kv_bin(e, "ipc_handle", g->ipc_handle, RNP_IPC_HANDLE_BYTES);
        kv_bin(e, "device_uuid", g->device_uuid, RNP_UUID_BYTES);
    }
}

static void handles(enc *e, const char *k, const char *path, uint32_t n,
                    const uint8_t (*h)[RNP_IPC_HANDLE_BYTES])
{
    if (n > RNP_MAX_EVENTS) {
        too_many(e, path, n, RNP_MAX_EVENTS);
        return;
    }
    key(e, k);
    msgpack_pack_array(&e->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        msgpack_pack_bin(&e->pk, RNP_IPC_HANDLE_BYTES);
        msgpack_pack_bin_body(&e->pk, h[i], RNP_IPC_HANDLE_BYTES);
    }
}

static void enc_request_body(enc *e, const rnp_request *q)
{
    switch (q->op) {
    case RN_OP_HELLO:
        msgpack_pack_map(&e->pk, 2);
        kv_str(e, "client", "hello.client", q->u.hello.client_name, RNP_MAX_NAME);
        kv_uint(e, "pid", q->u.hello.pid);
        break;
    case RN_OP_REGISTER: enc_register_req(e, &q->u.reg); break;
    case RN_OP_UNREGISTER:
        msgpack_pack_map(&e->pk, 2);
        kv_bin(e, "session", q->u.unreg.session.b, RNP_SESSION_BYTES);
        kv_uint(e, "region", q->u.unreg.region.id);
        break;
    case RN_OP_EVENTS:
        msgpack_pack_map(&e->pk, 3);
        kv_bin(e, "session", q->u.events.session.b, RNP_SESSION_BYTES);
        handles(e, "ready", "events.ready", q->u.events.n, q->u.events.ready);
        kv_bin(e, "device_uuid", q->u.events.device_uuid, RNP_UUID_BYTES);
        break;
    case RN_OP_BWD: enc_bwd_req(e, &q->u.bwd); break;
    case RN_OP_BYE:
        msgpack_pack_map(&e->pk, 1);
        kv_bin(e, "session", q->u.bye.b, RNP_SESSION_BYTES);
        break;
    case RN_OP_RING_OPEN: {
        /* (the done word's fields and go only where set: an older daemon
         * knows none of them) */
        bool dr = q->u.ring_open.done_region.id != 0, doff = q->u.ring_open.done_offset != 0;
        bool go = q->u.ring_open.go;
        msgpack_pack_map(&e->pk, 4 + dr + doff + go);
        kv_bin(e, "session", q->u.ring_open.session.b, RNP_SESSION_BYTES);
        kv_uint(e, "region", q->u.ring_open.region.id);
        kv_uint(e, "offset", q->u.ring_open.offset);
        kv_uint(e, "slots", q->u.ring_open.slots);
        if (dr)
            kv_uint(e, "done_region", q->u.ring_open.done_region.id);
        if (doff)
            kv_uint(e, "done_offset", q->u.ring_open.done_offset);
        if (go)
            kv_bool(e, "go", true);
        break;
    }
    case RN_OP_RING_CLOSE:
        msgpack_pack_map(&e->pk, 2);
        kv_bin(e, "session", q->u.ring_close.session.b, RNP_SESSION_BYTES);
        kv_uint(e, "ring", q->u.ring_close.ring);
        break;
    case RN_OP_GRAPH_OPEN:
        msgpack_pack_map(&e->pk, 3);
        kv_bin(e, "session", q->u.graph_open.session.b, RNP_SESSION_BYTES);
        kv_uint(e, "ring", q->u.graph_open.ring);
        kv_uint(e, "offset", q->u.graph_open.offset);
        break;
    case RN_OP_GRAPH_CLOSE:
        msgpack_pack_map(&e->pk, 3);
        kv_bin(e, "session", q->u.graph_close.session.b, RNP_SESSION_BYTES);
        kv_uint(e, "ring", q->u.graph_close.ring);
        kv_uint(e, "graph", q->u.graph_close.graph);
        break;
    }
}

static int finish(enc *e, size_t *len)
{
    if (e->rc)
        return e->rc;
    if (e->eb.overflow)
        return rnp_fail(e->err, RN_TOO_BIG, "message: does not fit in %zu bytes", e->eb.cap);
    *len = e->eb.len;
    return 0;
}

static void enc_init(enc *e, void *buf, size_t cap, rnp_error *err)
{
    memset(e, 0, sizeof *e);
    e->eb.buf = buf, e->eb.cap = buf ? cap : 0;
    e->err = err;
    msgpack_packer_init(&e->pk, &e->eb, ebuf_write);
}

int rnp_encode_request(const rnp_request *q, void *buf, size_t cap, size_t *len, rnp_error *err)
{
    enc e;
    if (!q || !len)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "request: NULL argument");
    if (q->op < 1 || q->op > RN_OP_MAX)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "op: %u is not an operation", q->op);
    enc_init(&e, buf, cap, err);
    bool body = rnp_op_has_body(q->op, true);
    msgpack_pack_map(&e.pk, 3 + body);
    kv_uint(&e, "v", q->version);
    kv_uint(&e, "op", q->op);
    kv_uint(&e, "id", q->id);
    if (body) {
        key(&e, "body");
        enc_request_body(&e, q);
    }
    return finish(&e, len);
}

/* ---- replies ------------------------------------------------------------------ */

static void enc_hello_rep(enc *e, const rnp_hello_rep *h)
{
    const rnp_limits *l = &h->limits;
    msgpack_pack_map(&e->pk, h->paths ? 12 : 11);
    kv_bin(e, "session", h->session.b, RNP_SESSION_BYTES);
    kv_str(e, "daemon_version", "hello.daemon_version", h->daemon_version, RNP_MAX_NAME);
    kv_str(e, "backend", "hello.backend", h->backend, RNP_MAX_NAME);
    kv_str(e, "device_name", "hello.device_name", h->device_name, RNP_MAX_NAME);
    kv_bin(e, "device_uuid", h->device_uuid, RNP_UUID_BYTES);
    kv_uint(e, "sm_count", h->sm_count);
    kv_uint(e, "cc_major", h->cc_major);
    kv_uint(e, "cc_minor", h->cc_minor);
    kv_bool(e, "mps", h->mps);
    kv_bool(e, "channel", h->channel);
    /* Optional (PROTOCOL.md 4.1): left out when 0, as a daemon without the
     * fast path sends it. */
    if (h->paths)
        kv_uint(e, "paths", h->paths);
    key(e, "limits");
    static const char *const names[] = { "max_sessions", "max_regions", "max_inflight",
                                         "max_inflight_total", "max_m", "max_n", "max_msg",
                                         "event_slots", "seq_window" };
    const uint64_t v[] = { l->max_sessions, l->max_regions, l->max_inflight, l->max_inflight_total,
                           l->max_m, l->max_n, l->max_msg, l->event_slots, l->seq_window };
    map_uints(e, names, v, 9);
}

static void enc_health_rep(enc *e, const rnp_health_rep *h)
{
    if (h->nreasons > RNP_MAX_REASONS) {
        too_many(e, "health.reasons", h->nreasons, RNP_MAX_REASONS);
        return;
    }
    msgpack_pack_map(&e->pk, 4);
    kv_uint(e, "state", h->state);
    kv_bool(e, "mps", h->mps);
    kv_str(e, "backend", "health.backend", h->backend, RNP_MAX_NAME);
    key(e, "reasons");
    msgpack_pack_array(&e->pk, h->nreasons);
    for (uint32_t i = 0; i < h->nreasons; i++)
        str_val(e, "health.reasons[]", h->reasons[i], RNP_REASON_LEN);
}

/*
 * A histogram's sum and buckets.  The buckets are one bin of 16-byte records
 * (upper bound, count; u64 little-endian each), not an array of pairs: the
 * histogram map is already at depth 4, and an array inside it would make an
 * older client refuse the whole reply with RN_TOO_DEEP (the depth limit
 * applies to the values of unknown keys too).
 */
static void enc_buckets(enc *e, const rnp_hist *h)
{
    uint8_t b[RNP_MAX_BUCKETS * RNP_BUCKET_BYTES];
    for (uint32_t k = 0; k < h->nbuckets; k++) {
        rnp_le64_put(b + k * RNP_BUCKET_BYTES, h->buckets[k].upper);
        rnp_le64_put(b + k * RNP_BUCKET_BYTES + 8, h->buckets[k].count);
    }
    kv_uint(e, "sum", h->sum);
    kv_bin(e, "buckets", b, (size_t)h->nbuckets * RNP_BUCKET_BYTES);
}

static void enc_stats_rep(enc *e, const rnp_stats_rep *s)
{
    if (s->nstats > RNP_MAX_STATS) {
        too_many(e, "stats.counters", s->nstats, RNP_MAX_STATS);
        return;
    }
    if (s->nhists > RNP_MAX_HISTS) {
        too_many(e, "stats.hists", s->nhists, RNP_MAX_HISTS);
        return;
    }
    msgpack_pack_map(&e->pk, 4);
    kv_str(e, "backend", "stats.backend", s->backend, RNP_MAX_NAME);
    kv_str(e, "device", "stats.device", s->device, RNP_MAX_NAME);
    key(e, "counters");
    msgpack_pack_map(&e->pk, s->nstats);
    for (uint32_t i = 0; i < s->nstats; i++) {
        str_val(e, "stats.counters[]", s->stats[i].name, RNP_STAT_NAME);
        msgpack_pack_uint64(&e->pk, s->stats[i].value);
    }
    for (uint32_t i = 0; i < s->nhists; i++) {
        if (s->hists[i].has_buckets && s->hists[i].nbuckets > RNP_MAX_BUCKETS) {
            too_many(e, "stats.hists[].buckets", s->hists[i].nbuckets, RNP_MAX_BUCKETS);
            return;
        }
    }
    key(e, "hists");
    msgpack_pack_map(&e->pk, s->nhists);
    for (uint32_t i = 0; i < s->nhists; i++) {
        const rnp_hist *h = &s->hists[i];
        static const char *const names[] = { "count", "p50", "p90", "p99", "max" };
        const uint64_t v[] = { h->count, h->p50, h->p90, h->p99, h->max };
        str_val(e, "stats.hists[]", h->name, RNP_STAT_NAME);
        msgpack_pack_map(&e->pk, 5 + 2 * h->has_buckets);
        for (uint32_t k = 0; k < 5; k++)
            kv_uint(e, names[k], v[k]);
        if (h->has_buckets)
            enc_buckets(e, h);
    }
}

static void enc_reply_body(enc *e, const rnp_reply *p)
{
    switch (p->op) {
    case RN_OP_HELLO: enc_hello_rep(e, &p->u.hello); break;
    case RN_OP_REGISTER:
        msgpack_pack_map(&e->pk, 1);
        kv_uint(e, "region", p->u.reg.region.id);
        break;
    case RN_OP_EVENTS:
        msgpack_pack_map(&e->pk, 1);
        handles(e, "done", "events.done", p->u.events.n, p->u.events.done);
        break;
    case RN_OP_BWD:
        msgpack_pack_map(&e->pk, 4);
        kv_uint(e, "seq", p->u.bwd.seq);
        kv_int(e, "done", p->u.bwd.done_slot);
        kv_uint(e, "queue_ns", p->u.bwd.queue_ns);
        kv_uint(e, "compute_ns", p->u.bwd.compute_ns);
        break;
    case RN_OP_HEALTH: enc_health_rep(e, &p->u.health); break;
    case RN_OP_STATS: enc_stats_rep(e, &p->u.stats); break;
    case RN_OP_PING:
        msgpack_pack_map(&e->pk, 1);
        kv_uint(e, "time_ns", p->u.ping.daemon_time_ns);
        break;
    case RN_OP_RING_OPEN:
        msgpack_pack_map(&e->pk, 1);
        kv_uint(e, "ring", p->u.ring_open.ring);
        break;
    case RN_OP_GRAPH_OPEN:
        msgpack_pack_map(&e->pk, 1);
        kv_uint(e, "graph", p->u.graph_open.graph);
        break;
    }
}

int rnp_encode_reply(const rnp_reply *p, void *buf, size_t cap, size_t *len, rnp_error *err)
{
    enc e;
    if (!p || !len)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "reply: NULL argument");
    /* An error reply may echo any op (the request's op could be unknown); a
     * success reply must be for a known op. */
    if (p->status == 0 && (p->op < 1 || p->op > RN_OP_MAX))
        return rnp_fail(err, RN_INVALID_ARGUMENT, "op: %u is not an operation", p->op);
    enc_init(&e, buf, cap, err);
    bool body = p->status == 0 && rnp_op_has_body(p->op, false);
    msgpack_pack_map(&e.pk, 4 + (p->status != 0) + body);
    kv_uint(&e, "v", p->version);
    kv_uint(&e, "op", p->op);
    kv_uint(&e, "id", p->id);
    kv_int(&e, "status", p->status);
    if (p->status != 0)
        kv_str(&e, "error", "error", p->error, RNP_MAX_ERRMSG);
    if (body) {
        key(&e, "body");
        enc_reply_body(&e, p);
    }
    return finish(&e, len);
}
