/* SPDX-License-Identifier: MIT */
/*
 * decode_req.c - msgpack bytes to rnp_request.  Pure: no I/O, no logging, no
 * allocation.
 *
 * Requests are strict: an unknown key is an error, so that a misspelt
 * optional tensor cannot silently change the result.  Each body is a map of
 * known fields read by rnp_dec_map with one field function per message;
 * PROTOCOL.md is the specification of every message read here.
 */
#include <string.h>

#include "rnp_dec.h"

enum { HELLO_CLIENT, HELLO_PID };

static int hello_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_hello_req *h = obj;
    int rc;
    if (idx == HELLO_CLIENT)
        return rnp_dec_str(d, path, h->client_name, RNP_MAX_NAME, true);
    if ((rc = rnp_dec_u32(d, path, &h->pid)) == 0 && h->pid == 0)
        rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "must be a process id (>= 1)");
    return rc;
}

static int dec_hello_req(rnp_dctx *d, rnp_hello_req *h)
{
    static const char *const names[] = { "client", "pid" };
    return rnp_dec_map(d, "hello", names, 2, RNP_BIT(HELLO_CLIENT) | RNP_BIT(HELLO_PID),
                       hello_field, h, NULL);
}

enum { REG_SESSION, REG_KIND, REG_SIZE, REG_SHM, REG_HANDLE, REG_UUID };
static const char *const reg_names[] = { "session", "kind", "size", "shm_name", "ipc_handle",
                                         "device_uuid" };

static int register_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_register_req *g = obj;
    switch (idx) {
    case REG_SESSION: return rnp_dec_session(d, path, &g->session);
    case REG_KIND: return rnp_dec_u32(d, path, &g->kind);
    case REG_SIZE: return rnp_dec_u64(d, path, &g->size);
    case REG_SHM: return rnp_dec_str(d, path, g->shm_name, sizeof g->shm_name, true);
    case REG_HANDLE: return rnp_dec_bin(d, path, g->ipc_handle, RNP_IPC_HANDLE_BYTES);
    default: return rnp_dec_bin(d, path, g->device_uuid, RNP_UUID_BYTES);
    }
}

static int dec_register_req(rnp_dctx *d, rnp_register_req *g)
{
    uint32_t seen = 0;
    int rc = rnp_dec_map(d, "register", reg_names, 6,
                         RNP_BIT(REG_SESSION) | RNP_BIT(REG_KIND) | RNP_BIT(REG_SIZE),
                         register_field, g, &seen);
    if (rc)
        return rc;
    if (g->size == 0)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, "register.size", "must be at least 1");
    if (g->kind == RNP_REGION_SHM) {
        if (seen & (RNP_BIT(REG_HANDLE) | RNP_BIT(REG_UUID)))
            return rnp_dec_fail(d, RN_INVALID_ARGUMENT,
                                seen & RNP_BIT(REG_HANDLE) ? "register.ipc_handle"
                                                           : "register.device_uuid",
                                "not allowed with kind 1 (shm)");
        if ((rc = rnp_dec_require(d, "register", reg_names, seen, RNP_BIT(REG_SHM))) != 0)
            return rc;
        /* POSIX leaves names with other slashes implementation-defined. */
        if (g->shm_name[0] != '/' || g->shm_name[1] == '\0' || strchr(g->shm_name + 1, '/'))
            return rnp_dec_fail(d, RN_INVALID_ARGUMENT, "register.shm_name",
                                "must be '/' followed by 1 or more characters other than '/'");
    } else if (g->kind == RNP_REGION_CUDA_IPC) {
        if (seen & RNP_BIT(REG_SHM))
            return rnp_dec_fail(d, RN_INVALID_ARGUMENT, "register.shm_name",
                                "not allowed with kind 2 (cuda_ipc)");
        return rnp_dec_require(d, "register", reg_names, seen,
                               RNP_BIT(REG_HANDLE) | RNP_BIT(REG_UUID));
    } else {
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, "register.kind",
                            "%u is not a region kind (1 shm, 2 cuda_ipc)", g->kind);
    }
    return 0;
}

static int unregister_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_unregister_req *u = obj;
    return idx == 0 ? rnp_dec_session(d, path, &u->session) : rnp_dec_u32(d, path, &u->region.id);
}

static int events_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_events_req *e = obj;
    switch (idx) {
    case 0: return rnp_dec_session(d, path, &e->session);
    case 1: return rnp_dec_handles(d, path, &e->n, e->ready);
    default: return rnp_dec_bin(d, path, e->device_uuid, RNP_UUID_BYTES);
    }
}

/* A tensor map: region, offset, then dtype (typed tensors) and stride (2-D
 * tensors).  Every tensor that has a stride also has a dtype. */
typedef struct tensor_out {
    rnp_tensor *t;
    uint8_t *dtype;
} tensor_out;

static int tensor_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    tensor_out *o = obj;
    uint64_t v;
    int rc;
    switch (idx) {
    case 0: return rnp_dec_u32(d, path, &o->t->region.id);
    case 1: return rnp_dec_u64(d, path, &o->t->offset);
    case 3: return rnp_dec_u64(d, path, &o->t->stride);
    }
    if ((rc = rnp_dec_uint(d, path, UINT32_MAX, &v)) != 0)
        return rc;
    if (v > RN_DTYPE_BF16)
        return rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "%llu is not a dtype (0..3)",
                            (unsigned long long)v);
    *o->dtype = (uint8_t)v;
    return 0;
}

static int get_tensor(rnp_dctx *d, const char *path, bool two_d, bool typed, rnp_tensor *t,
                      uint8_t *dtype)
{
    static const char *const names[] = { "region", "offset", "dtype", "stride" };
    int nnames = two_d ? 4 : typed ? 3 : 2;
    tensor_out o = { t, dtype };
    return rnp_dec_map(d, path, names, nnames, RNP_BIT(nnames) - 1, tensor_field, &o, NULL);
}

enum { B_SESSION, B_SEQ, B_M, B_N, B_X, B_DY, B_DX, B_W, B_RSTD, B_DRES, B_DW, B_EPS, B_WOFF,
       B_READY, B_MODE, B_ORDERING };

static int bwd_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_bwd_req *b = obj;
    int rc;
    switch (idx) {
    case B_SESSION: return rnp_dec_session(d, path, &b->session);
    case B_SEQ: return rnp_dec_u64(d, path, &b->seq);
    case B_M: return rnp_dec_u64(d, path, &b->m);
    case B_N: return rnp_dec_u32(d, path, &b->n);
    case B_X: return get_tensor(d, path, true, true, &b->x, &b->x_dtype);
    case B_DY: return get_tensor(d, path, true, true, &b->dy, &b->dy_dtype);
    case B_DX: return get_tensor(d, path, true, true, &b->dx, &b->dx_dtype);
    case B_W: b->has_w = true; return get_tensor(d, path, false, true, &b->w, &b->w_dtype);
    case B_RSTD: b->has_rstd = true; return get_tensor(d, path, false, false, &b->rstd, NULL);
    case B_DRES:
        b->has_dres = true;
        return get_tensor(d, path, true, true, &b->dres, &b->dres_dtype);
    case B_DW: b->has_dw = true; return get_tensor(d, path, false, true, &b->dw, &b->dw_dtype);
    case B_EPS:
        if ((rc = rnp_dec_f32(d, path, &b->eps)) == 0 && b->eps < 0)
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "must not be negative");
        return rc;
    case B_WOFF: return rnp_dec_f32(d, path, &b->weight_offset);
    case B_READY:
        if ((rc = rnp_dec_i32(d, path, &b->ready_slot)) == 0 &&
            (b->ready_slot < -1 || b->ready_slot >= RNP_MAX_EVENTS))
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "%d is not -1 or a slot 0..%d",
                              b->ready_slot, RNP_MAX_EVENTS - 1);
        return rc;
    case B_MODE:
        if ((rc = rnp_dec_u32(d, path, &b->mode)) == 0 && b->mode > RNP_MODE_SYNC)
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "%u is not a mode (0 async, 1 sync)",
                              b->mode);
        return rc;
    default: /* B_ORDERING */
        if ((rc = rnp_dec_u32(d, path, &b->ordering)) == 0 && b->ordering != RNP_ORDER_EVENTS)
            rc = rnp_dec_fail(d, RN_UNSUPPORTED, path, "ordering %u is not supported (0 events)",
                              b->ordering);
        return rc;
    }
}

static int dec_bwd_req(rnp_dctx *d, rnp_bwd_req *b)
{
    static const char *const names[] = { "session", "seq", "m", "n", "x", "dy", "dx", "w",
                                         "rstd", "dres", "dw", "eps", "weight_offset", "ready",
                                         "mode", "ordering" };
    b->ready_slot = -1; /* the default of the optional scalars that is not 0 */
    return rnp_dec_map(d, "bwd", names, 16,
                       RNP_BIT(B_SESSION) | RNP_BIT(B_SEQ) | RNP_BIT(B_M) | RNP_BIT(B_N) |
                           RNP_BIT(B_X) | RNP_BIT(B_DY) | RNP_BIT(B_DX) | RNP_BIT(B_EPS),
                       bwd_field, b, NULL);
}

static int ring_open_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_ring_open_req *o = obj;
    switch (idx) {
    case 0: return rnp_dec_session(d, path, &o->session);
    case 1: return rnp_dec_u32(d, path, &o->region.id);
    case 2: return rnp_dec_u64(d, path, &o->offset);
    case 3: return rnp_dec_u32(d, path, &o->slots);
    case 4: {
        int rc = rnp_dec_u32(d, path, &o->done_region.id);
        if (rc == 0 && o->done_region.id == 0)
            rc = rnp_dec_fail(d, RN_INVALID_ARGUMENT, path, "0 names no region (ids start at 1)");
        return rc;
    }
    case 5: return rnp_dec_u64(d, path, &o->done_offset);
    default: return rnp_dec_bool(d, path, &o->go);
    }
}

static int ring_close_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_ring_close_req *o = obj;
    return idx == 0 ? rnp_dec_session(d, path, &o->session) : rnp_dec_u32(d, path, &o->ring);
}

static int graph_open_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_graph_open_req *o = obj;
    switch (idx) {
    case 0: return rnp_dec_session(d, path, &o->session);
    case 1: return rnp_dec_u32(d, path, &o->ring);
    default: return rnp_dec_u64(d, path, &o->offset);
    }
}

static int graph_close_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    rnp_graph_close_req *o = obj;
    switch (idx) {
    case 0: return rnp_dec_session(d, path, &o->session);
    case 1: return rnp_dec_u32(d, path, &o->ring);
    default: return rnp_dec_u32(d, path, &o->graph);
    }
}

static int session_field(rnp_dctx *d, void *obj, int idx, const char *path)
{
    (void)idx;
    return rnp_dec_session(d, path, obj);
}

static int dec_body(rnp_dctx *d, void *msg)
{
    rnp_request *q = msg;
    static const char *const session[] = { "session" };
    static const char *const unreg[] = { "session", "region" };
    static const char *const events[] = { "session", "ready", "device_uuid" };
    static const char *const ring_open[] = { "session", "region", "offset", "slots",
                                             "done_region", "done_offset", "go" };
    static const char *const ring_close[] = { "session", "ring" };
    static const char *const graph_open[] = { "session", "ring", "offset" };
    static const char *const graph_close[] = { "session", "ring", "graph" };
    switch (q->op) {
    case RN_OP_HELLO: return dec_hello_req(d, &q->u.hello);
    case RN_OP_REGISTER: return dec_register_req(d, &q->u.reg);
    case RN_OP_UNREGISTER:
        return rnp_dec_map(d, "unregister", unreg, 2, 0x3, unregister_field, &q->u.unreg, NULL);
    case RN_OP_EVENTS:
        return rnp_dec_map(d, "events", events, 3, 0x7, events_field, &q->u.events, NULL);
    case RN_OP_BWD: return dec_bwd_req(d, &q->u.bwd);
    case RN_OP_BYE: return rnp_dec_map(d, "bye", session, 1, 0x1, session_field, &q->u.bye, NULL);
    case RN_OP_RING_OPEN:
        return rnp_dec_map(d, "ring_open", ring_open, 7, 0xfu, ring_open_field, &q->u.ring_open,
                           NULL);
    case RN_OP_RING_CLOSE:
        return rnp_dec_map(d, "ring_close", ring_close, 2, 0x3u, ring_close_field,
                           &q->u.ring_close, NULL);
    case RN_OP_GRAPH_OPEN:
        return rnp_dec_map(d, "graph_open", graph_open, 3, 0x7u, graph_open_field,
                           &q->u.graph_open, NULL);
    case RN_OP_GRAPH_CLOSE:
        return rnp_dec_map(d, "graph_close", graph_close, 3, 0x7u, graph_close_field,
                           &q->u.graph_close, NULL);
    default: return rnp_dec_empty(d, rnp_op_name(q->op));
    }
}

/* The envelope's "v" and nothing else: every other key is skipped unread,
 * so that a message of another version is answered RN_BAD_VERSION whatever
 * its other envelope keys hold (another version may give them other types
 * or add new ones).  Keys must be strings, and "v" may appear once. */
static int read_version(rnp_dctx *d, uint32_t *version)
{
    uint32_t n;
    bool seen = false;
    if (!rnp_mp_read_map(&d->r, &n))
        return rnp_dec_wrong_type(d, "message", "map");
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *k;
        uint32_t klen;
        int rc;
        if (!rnp_mp_read_str(&d->r, &k, &klen))
            return rnp_dec_fail(d, RN_BAD_TYPE, "message", "map key must be a string, got %s",
                                rnp_mp_kind_name(rnp_mp_peek(&d->r)));
        if (klen == 1 && k[0] == 'v') {
            if (seen)
                return rnp_dec_fail(d, RN_DUPLICATE_FIELD, "v", "appears twice");
            if ((rc = rnp_dec_u32(d, "v", version)) != 0)
                return rc;
            seen = true;
        } else if (!rnp_mp_skip(&d->r)) { /* cannot fail after a scan */
            return rnp_dec_fail(d, RN_MALFORMED, "message", "truncated value");
        }
    }
    if (!seen)
        return rnp_dec_fail(d, RN_MISSING_FIELD, "v", "required field is missing");
    if (*version != RNP_VERSION)
        return rnp_dec_fail(d, RN_BAD_VERSION, "v", "version %u is not supported (supported: %u)",
                            *version, RNP_VERSION);
    return 0;
}

/*
 * The order of the envelope's checks is PROTOCOL.md's (section 3): the
 * structure, the version, the envelope's keys (duplicates, unknown keys),
 * op and id present, their types, op known, then the body.  Values of op,
 * id and body are captured by the key pass and read after it, so that an
 * unknown key is found before a value of the wrong type.
 */
static int decode_request(const void *buf, size_t len, rnp_request *q, rnp_error *err)
{
    enum { F_V, F_OP, F_ID, F_BODY };
    static const char *const names[] = { "v", "op", "id", "body" };
    rnp_dctx d;
    rnp_mapit it;
    int rc, idx;
    uint64_t op = 0;
    rnp_mp at[4];

    if ((rc = rnp_dec_begin(&d, buf, len, true, err)) != 0 ||
        (rc = read_version(&d, &q->version)) != 0)
        return rc;
    rnp_mp_init(&d.r, buf, len);
    if ((rc = rnp_dec_map_open(&d, &it, "message", names, 4)) != 0)
        return rc;
    while ((rc = rnp_dec_map_next(&d, &it, &idx)) == 0 && idx >= 0)
        if ((rc = rnp_dec_capture(&d, names[idx], &at[idx])) != 0)
            return rc;
    if (rc || (rc = rnp_dec_require(&d, "message", names, it.seen,
                                    RNP_BIT(F_OP) | RNP_BIT(F_ID))) != 0)
        return rc;
    d.r = at[F_OP];
    if ((rc = rnp_dec_uint(&d, "op", UINT32_MAX, &op)) != 0)
        return rc;
    d.r = at[F_ID];
    if ((rc = rnp_dec_u64(&d, "id", &q->id)) != 0)
        return rc;
    if (op < 1 || op > RN_OP_MAX)
        return rnp_dec_fail(&d, RN_UNKNOWN_OP, "op", "%llu is not an operation",
                            (unsigned long long)op);
    q->op = (uint32_t)op;
    return rnp_dec_body(&d, it.seen & RNP_BIT(F_BODY) ? &at[F_BODY] : NULL, q->op, true, dec_body,
                        q);
}

int rnp_decode_request(const void *buf, size_t len, rnp_request *out, rnp_error *err)
{
    rnp_request q;
    memset(&q, 0, sizeof q);
    int rc = decode_request(buf, len, &q, err);
    if (out && rc == 0)
        *out = q;
    else if (out)
        rnp_dec_peek_header(buf, len, &out->op, &out->id);
    return rc;
}
