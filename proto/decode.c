/*
 * decode.c - msgpack bytes to rnp_request / rnp_reply.  Pure: no I/O, no
 * logging, no allocation.
 *
 * Two passes.  rnp_mp_scan first checks the message's structure (one object,
 * counts against the bytes left, depth, no trailing bytes); then the typed
 * pass below reads the fields in place.  Requests are strict (an unknown key
 * is an error: a misspelt optional tensor must not silently change the
 * result); replies skip unknown keys so that a daemon can add reply fields
 * without breaking older clients.  PROTOCOL.md is the specification of every
 * message read here.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rn_proto.h"
#include "rnp_mp.h"

typedef struct dctx {
    rnp_mp r;
    rnp_error *err;
    bool strict;      /* unknown keys are errors (requests) or skipped (replies) */
} dctx;

/* Field paths in messages are short ("bwd.dres.offset"); keys from the wire
 * are quoted through this so that an error message stays one printable line. */
#define PATH_MAX_ 80

static void printable(char *dst, size_t cap, const uint8_t *s, uint32_t len)
{
    size_t o = 0;
    for (uint32_t k = 0; k < len && o + 4 < cap; k++)
        dst[o++] = (s[k] >= 0x20 && s[k] < 0x7f) ? (char)s[k] : '?';
    if (len > 0 && o + 4 >= cap && o < len)
        dst[o++] = '.', dst[o++] = '.', dst[o++] = '.';
    dst[o] = '\0';
}

static int ferr(dctx *d, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ferr(dctx *d, int code, const char *path, const char *fmt, ...)
{
    char tail[RNP_MAX_ERRMSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    return rnp_fail(d->err, code, "%s: %s", path, tail);
}

/* dst = path "." key, cut at PATH_MAX_ - 1 bytes. */
static void join(char *dst, const char *path, const char *key)
{
    size_t o = 0;
    for (const char *s = path; *s && o < PATH_MAX_ - 1; s++)
        dst[o++] = *s;
    if (*path && o < PATH_MAX_ - 1)
        dst[o++] = '.';
    for (const char *s = key; *s && o < PATH_MAX_ - 1; s++)
        dst[o++] = *s;
    dst[o] = '\0';
}

static int wrong_type(dctx *d, const char *path, const char *want)
{
    return ferr(d, RN_BAD_TYPE, path, "expected %s, got %s", want,
                rnp_mp_kind_name(rnp_mp_peek(&d->r)));
}

/* ---- typed values ----------------------------------------------------------- */

static int get_uint(dctx *d, const char *path, uint64_t max, uint64_t *v)
{
    uint64_t x;
    if (!rnp_mp_read_uint(&d->r, &x))
        return wrong_type(d, path, max == UINT64_MAX ? "unsigned integer" : "unsigned 32-bit integer");
    if (x > max)
        return ferr(d, RN_BAD_TYPE, path, "%llu does not fit in an unsigned %d-bit integer",
                    (unsigned long long)x, max == UINT32_MAX ? 32 : 64);
    *v = x;
    return 0;
}

static int get_u32(dctx *d, const char *path, uint32_t *v)
{
    uint64_t x = 0;
    int rc = get_uint(d, path, UINT32_MAX, &x);
    if (rc == 0)
        *v = (uint32_t)x;
    return rc;
}

static int get_u64(dctx *d, const char *path, uint64_t *v)
{
    return get_uint(d, path, UINT64_MAX, v);
}

static int get_i32(dctx *d, const char *path, int32_t *v)
{
    int64_t x;
    if (!rnp_mp_read_int(&d->r, &x))
        return wrong_type(d, path, "integer");
    if (x < INT32_MIN || x > INT32_MAX)
        return ferr(d, RN_BAD_TYPE, path, "%lld does not fit in a signed 32-bit integer", (long long)x);
    *v = (int32_t)x;
    return 0;
}

static int get_bool(dctx *d, const char *path, bool *v)
{
    if (!rnp_mp_read_bool(&d->r, v))
        return wrong_type(d, path, "boolean");
    return 0;
}

/* float 32 or float 64, finite once narrowed to float. */
static int get_f32(dctx *d, const char *path, float *v)
{
    double x;
    if (!rnp_mp_read_float(&d->r, &x))
        return wrong_type(d, path, "float");
    float f = (float)x;
    if (!isfinite(f))
        return ferr(d, RN_INVALID_ARGUMENT, path, "not a finite float32 value");
    *v = f;
    return 0;
}

/* A string of at most cap-1 bytes without NUL, copied NUL-terminated. */
static int get_str(dctx *d, const char *path, char *dst, size_t cap, bool nonempty)
{
    const uint8_t *s;
    uint32_t len;
    if (!rnp_mp_read_str(&d->r, &s, &len))
        return wrong_type(d, path, "string");
    if (len >= cap)
        return ferr(d, RN_TOO_BIG, path, "%u bytes, limit %zu", len, cap - 1);
    if (nonempty && len == 0)
        return ferr(d, RN_INVALID_ARGUMENT, path, "must not be empty");
    if (memchr(s, 0, len))
        return ferr(d, RN_INVALID_ARGUMENT, path, "contains a NUL byte");
    memcpy(dst, s, len);
    dst[len] = '\0';
    return 0;
}

/* A bin of exactly size bytes. */
static int get_bin(dctx *d, const char *path, uint8_t *dst, size_t size)
{
    const uint8_t *s;
    uint32_t len;
    if (!rnp_mp_read_bin(&d->r, &s, &len))
        return wrong_type(d, path, "binary");
    if (len > size)
        return ferr(d, RN_TOO_BIG, path, "binary of %u bytes, expected %zu", len, size);
    if (len < size)
        return ferr(d, RN_BAD_TYPE, path, "binary of %u bytes, expected %zu", len, size);
    memcpy(dst, s, size);
    return 0;
}

/* ---- maps ------------------------------------------------------------------ */

/*
 * Field table of one map kind.  map_next reads the next key and returns the
 * index of a known field (1-based bit in *seen), skipping unknown fields of a
 * lenient map; a map has at most 32 known fields.
 */
typedef struct mapit {
    const char *path;
    const char *const *names;
    int nnames;
    uint32_t left;
    uint32_t seen;
} mapit;

static int map_open(dctx *d, mapit *it, const char *path, const char *const *names, int nnames)
{
    it->path = path, it->names = names, it->nnames = nnames, it->seen = 0;
    if (!rnp_mp_read_map(&d->r, &it->left))
        return wrong_type(d, path, "map");
    return 0;
}

/* Sets *idx to the next known field, or -1 at the end of the map. */
static int map_next(dctx *d, mapit *it, int *idx)
{
    char sub[PATH_MAX_];
    while (it->left > 0) {
        const uint8_t *k;
        uint32_t klen;
        it->left--;
        if (!rnp_mp_read_str(&d->r, &k, &klen))
            return ferr(d, RN_BAD_TYPE, it->path, "map key must be a string, got %s",
                        rnp_mp_kind_name(rnp_mp_peek(&d->r)));
        for (int i = 0; i < it->nnames; i++) {
            if (strlen(it->names[i]) == klen && memcmp(it->names[i], k, klen) == 0) {
                if (it->seen & (1u << i)) {
                    join(sub, it->path, it->names[i]);
                    return ferr(d, RN_DUPLICATE_FIELD, sub, "appears twice");
                }
                it->seen |= 1u << i;
                *idx = i;
                return 0;
            }
        }
        char key[40];
        printable(key, sizeof key, k, klen);
        if (d->strict) {
            join(sub, it->path, key);
            return ferr(d, RN_UNKNOWN_FIELD, sub, "unknown field");
        }
        if (!rnp_mp_skip(&d->r)) /* cannot fail after a scan; kept for safety */
            return ferr(d, RN_MALFORMED, it->path, "truncated value");
    }
    *idx = -1;
    return 0;
}

/* Names the first required field (bit set in req) that was not seen. */
static int map_require(dctx *d, const mapit *it, uint32_t req)
{
    uint32_t missing = req & ~it->seen;
    if (!missing)
        return 0;
    char sub[PATH_MAX_];
    int i = __builtin_ctz(missing);
    join(sub, it->path, it->names[i]);
    return ferr(d, RN_MISSING_FIELD, sub, "required field is missing");
}

#define BIT(i) (1u << (i))

/* A map that must have no known fields (a body of an op without one). */
static int get_empty(dctx *d, const char *path)
{
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, path, NULL, 0)) != 0)
        return rc;
    if ((rc = map_next(d, &it, &idx)) != 0)
        return rc;
    return 0;
}

/* ---- requests ---------------------------------------------------------------- */

static int check_dtype(dctx *d, const char *path, uint64_t v)
{
    if (v > RN_DTYPE_BF16)
        return ferr(d, RN_INVALID_ARGUMENT, path, "%llu is not a dtype (0..3)", (unsigned long long)v);
    return 0;
}

/* A tensor map: region, offset, then dtype (typed tensors) and stride
 * (2-D tensors).  Every tensor that has a stride also has a dtype. */
static int get_tensor(dctx *d, const char *path, bool two_d, bool typed, rnp_tensor *t,
                      uint8_t *dtype)
{
    enum { F_REGION, F_OFFSET, F_DTYPE, F_STRIDE };
    static const char *const names[] = { "region", "offset", "dtype", "stride" };
    int nnames = two_d ? 4 : typed ? 3 : 2;
    mapit it;
    int rc, idx;
    char sub[PATH_MAX_];
    uint64_t v;
    if ((rc = map_open(d, &it, path, names, nnames)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        join(sub, path, names[idx]);
        switch (idx) {
        case F_REGION: rc = get_u32(d, sub, &t->region.id); break;
        case F_OFFSET: rc = get_u64(d, sub, &t->offset); break;
        case F_STRIDE: rc = get_u64(d, sub, &t->stride); break;
        case F_DTYPE:
            if ((rc = get_uint(d, sub, UINT32_MAX, &v)) == 0 && (rc = check_dtype(d, sub, v)) == 0)
                *dtype = (uint8_t)v;
            break;
        }
        if (rc)
            return rc;
    }
    if (rc)
        return rc;
    return map_require(d, &it, (1u << nnames) - 1);
}

static int get_session(dctx *d, const char *path, rnp_session *s)
{
    return get_bin(d, path, s->b, RNP_SESSION_BYTES);
}

static int dec_hello_req(dctx *d, rnp_hello_req *h)
{
    enum { F_CLIENT, F_PID };
    static const char *const names[] = { "client", "pid" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "hello", names, 2)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_CLIENT: rc = get_str(d, "hello.client", h->client_name, RNP_MAX_NAME, true); break;
        case F_PID:
            if ((rc = get_u32(d, "hello.pid", &h->pid)) == 0 && h->pid == 0)
                rc = ferr(d, RN_INVALID_ARGUMENT, "hello.pid", "must be a process id (>= 1)");
            break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, BIT(F_CLIENT) | BIT(F_PID));
}

static int dec_register_req(dctx *d, rnp_register_req *g)
{
    enum { F_SESSION, F_KIND, F_SIZE, F_SHM, F_HANDLE, F_UUID };
    static const char *const names[] = { "session", "kind", "size", "shm_name", "ipc_handle",
                                         "device_uuid" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "register", names, 6)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_SESSION: rc = get_session(d, "register.session", &g->session); break;
        case F_KIND: rc = get_u32(d, "register.kind", &g->kind); break;
        case F_SIZE: rc = get_u64(d, "register.size", &g->size); break;
        case F_SHM: rc = get_str(d, "register.shm_name", g->shm_name, sizeof g->shm_name, true); break;
        case F_HANDLE: rc = get_bin(d, "register.ipc_handle", g->ipc_handle, RNP_IPC_HANDLE_BYTES); break;
        case F_UUID: rc = get_bin(d, "register.device_uuid", g->device_uuid, RNP_UUID_BYTES); break;
        }
        if (rc)
            return rc;
    }
    if (rc || (rc = map_require(d, &it, BIT(F_SESSION) | BIT(F_KIND) | BIT(F_SIZE))) != 0)
        return rc;
    if (g->size == 0)
        return ferr(d, RN_INVALID_ARGUMENT, "register.size", "must be at least 1");
    if (g->kind == RNP_REGION_SHM) {
        if (it.seen & (BIT(F_HANDLE) | BIT(F_UUID)))
            return ferr(d, RN_INVALID_ARGUMENT, it.seen & BIT(F_HANDLE) ? "register.ipc_handle"
                                                                       : "register.device_uuid",
                        "not allowed with kind 1 (shm)");
        if ((rc = map_require(d, &it, BIT(F_SHM))) != 0)
            return rc;
        /* POSIX leaves names with other slashes implementation-defined. */
        if (g->shm_name[0] != '/' || g->shm_name[1] == '\0' || strchr(g->shm_name + 1, '/'))
            return ferr(d, RN_INVALID_ARGUMENT, "register.shm_name",
                        "must be '/' followed by 1 or more characters other than '/'");
    } else if (g->kind == RNP_REGION_CUDA_IPC) {
        if (it.seen & BIT(F_SHM))
            return ferr(d, RN_INVALID_ARGUMENT, "register.shm_name", "not allowed with kind 2 (cuda_ipc)");
        if ((rc = map_require(d, &it, BIT(F_HANDLE) | BIT(F_UUID))) != 0)
            return rc;
    } else {
        return ferr(d, RN_INVALID_ARGUMENT, "register.kind", "%u is not a region kind (1 shm, 2 cuda_ipc)",
                    g->kind);
    }
    return 0;
}

static int dec_unregister_req(dctx *d, rnp_unregister_req *u)
{
    enum { F_SESSION, F_REGION };
    static const char *const names[] = { "session", "region" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "unregister", names, 2)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_SESSION: rc = get_session(d, "unregister.session", &u->session); break;
        case F_REGION: rc = get_u32(d, "unregister.region", &u->region.id); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, BIT(F_SESSION) | BIT(F_REGION));
}

/* An array of 1..RNP_MAX_EVENTS IPC event handles. */
static int get_handles(dctx *d, const char *path, uint32_t *n,
                       uint8_t (*h)[RNP_IPC_HANDLE_BYTES])
{
    uint32_t cnt;
    char sub[PATH_MAX_];
    int rc;
    if (!rnp_mp_read_array(&d->r, &cnt))
        return wrong_type(d, path, "array");
    if (cnt > RNP_MAX_EVENTS)
        return ferr(d, RN_TOO_BIG, path, "%u handles, limit %d", cnt, RNP_MAX_EVENTS);
    if (cnt == 0)
        return ferr(d, RN_INVALID_ARGUMENT, path, "needs at least one handle");
    for (uint32_t i = 0; i < cnt; i++) {
        snprintf(sub, sizeof sub, "%s[%u]", path, i);
        if ((rc = get_bin(d, sub, h[i], RNP_IPC_HANDLE_BYTES)) != 0)
            return rc;
    }
    *n = cnt;
    return 0;
}

static int dec_events_req(dctx *d, rnp_events_req *e)
{
    enum { F_SESSION, F_READY, F_UUID };
    static const char *const names[] = { "session", "ready", "device_uuid" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "events", names, 3)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_SESSION: rc = get_session(d, "events.session", &e->session); break;
        case F_READY: rc = get_handles(d, "events.ready", &e->n, e->ready); break;
        case F_UUID: rc = get_bin(d, "events.device_uuid", e->device_uuid, RNP_UUID_BYTES); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, BIT(F_SESSION) | BIT(F_READY) | BIT(F_UUID));
}

static int dec_bwd_req(dctx *d, rnp_bwd_req *b)
{
    enum { F_SESSION, F_SEQ, F_M, F_N, F_X, F_DY, F_DX, F_W, F_RSTD, F_DRES, F_DW, F_EPS,
           F_WOFF, F_READY, F_MODE, F_ORDERING };
    static const char *const names[] = { "session", "seq", "m", "n", "x", "dy", "dx", "w",
                                         "rstd", "dres", "dw", "eps", "weight_offset", "ready",
                                         "mode", "ordering" };
    mapit it;
    int rc, idx;

    b->ready_slot = -1; /* defaults of the optional scalars */
    if ((rc = map_open(d, &it, "bwd", names, 16)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_SESSION: rc = get_session(d, "bwd.session", &b->session); break;
        case F_SEQ: rc = get_u64(d, "bwd.seq", &b->seq); break;
        case F_M: rc = get_u64(d, "bwd.m", &b->m); break;
        case F_N: rc = get_u32(d, "bwd.n", &b->n); break;
        case F_X: rc = get_tensor(d, "bwd.x", true, true, &b->x, &b->x_dtype); break;
        case F_DY: rc = get_tensor(d, "bwd.dy", true, true, &b->dy, &b->dy_dtype); break;
        case F_DX: rc = get_tensor(d, "bwd.dx", true, true, &b->dx, &b->dx_dtype); break;
        case F_W:
            b->has_w = true;
            rc = get_tensor(d, "bwd.w", false, true, &b->w, &b->w_dtype);
            break;
        case F_RSTD:
            b->has_rstd = true;
            rc = get_tensor(d, "bwd.rstd", false, false, &b->rstd, NULL);
            break;
        case F_DRES:
            b->has_dres = true;
            rc = get_tensor(d, "bwd.dres", true, true, &b->dres, &b->dres_dtype);
            break;
        case F_DW:
            b->has_dw = true;
            rc = get_tensor(d, "bwd.dw", false, true, &b->dw, &b->dw_dtype);
            break;
        case F_EPS:
            if ((rc = get_f32(d, "bwd.eps", &b->eps)) == 0 && b->eps < 0)
                rc = ferr(d, RN_INVALID_ARGUMENT, "bwd.eps", "must not be negative");
            break;
        case F_WOFF: rc = get_f32(d, "bwd.weight_offset", &b->weight_offset); break;
        case F_READY:
            if ((rc = get_i32(d, "bwd.ready", &b->ready_slot)) == 0 &&
                (b->ready_slot < -1 || b->ready_slot >= RNP_MAX_EVENTS))
                rc = ferr(d, RN_INVALID_ARGUMENT, "bwd.ready", "%d is not -1 or a slot 0..%d",
                          b->ready_slot, RNP_MAX_EVENTS - 1);
            break;
        case F_MODE:
            if ((rc = get_u32(d, "bwd.mode", &b->mode)) == 0 && b->mode > RNP_MODE_SYNC)
                rc = ferr(d, RN_INVALID_ARGUMENT, "bwd.mode", "%u is not a mode (0 async, 1 sync)",
                          b->mode);
            break;
        case F_ORDERING:
            if ((rc = get_u32(d, "bwd.ordering", &b->ordering)) == 0 &&
                b->ordering != RNP_ORDER_EVENTS)
                rc = ferr(d, RN_UNSUPPORTED, "bwd.ordering", "ordering %u is not supported (0 events)",
                          b->ordering);
            break;
        }
        if (rc)
            return rc;
    }
    if (rc)
        return rc;
    return map_require(d, &it, BIT(F_SESSION) | BIT(F_SEQ) | BIT(F_M) | BIT(F_N) | BIT(F_X) |
                                   BIT(F_DY) | BIT(F_DX) | BIT(F_EPS));
}

static int dec_bye_req(dctx *d, rnp_session *s)
{
    static const char *const names[] = { "session" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "bye", names, 1)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0)
        if ((rc = get_session(d, "bye.session", s)) != 0)
            return rc;
    return rc ? rc : map_require(d, &it, BIT(0));
}

static bool op_known(uint64_t op)
{
    return op >= 1 && op <= RN_OP_MAX;
}

/* Ops whose request (req) or reply (!req) has a body with required fields. */
static bool op_has_body(uint32_t op, bool req)
{
    switch (op) {
    case RN_OP_HELLO: case RN_OP_REGISTER: case RN_OP_EVENTS: case RN_OP_BWD: return true;
    case RN_OP_UNREGISTER: case RN_OP_BYE: return req;
    case RN_OP_PING: case RN_OP_HEALTH: case RN_OP_STATS: return !req;
    }
    return false;
}

/*
 * Lenient look at a message that failed to decode: the top-level "op" and
 * "id" if they can be read, so an error reply can be addressed.  Works on
 * unscanned bytes; every read is bounds-checked.
 */
static void peek_header(const void *buf, size_t len, uint32_t *op, uint64_t *id)
{
    rnp_mp r;
    uint32_t n;
    bool got_op = false, got_id = false;
    *op = 0, *id = 0;
    rnp_mp_init(&r, buf, len);
    if (!rnp_mp_read_map(&r, &n))
        return;
    for (uint32_t i = 0; i < n && !(got_op && got_id); i++) {
        const uint8_t *k;
        uint32_t klen;
        uint64_t v;
        if (!rnp_mp_read_str(&r, &k, &klen))
            return;
        if (klen == 2 && memcmp(k, "op", 2) == 0 && !got_op && rnp_mp_read_uint(&r, &v)) {
            got_op = true;
            if (v <= UINT32_MAX)
                *op = (uint32_t)v;
        } else if (klen == 2 && memcmp(k, "id", 2) == 0 && !got_id && rnp_mp_read_uint(&r, &v)) {
            got_id = true;
            *id = v;
        } else if (!rnp_mp_skip(&r)) {
            return;
        }
    }
}

static int decode_request(const void *buf, size_t len, rnp_request *q, rnp_error *err)
{
    enum { F_V, F_OP, F_ID, F_BODY };
    static const char *const names[] = { "v", "op", "id", "body" };
    dctx d = { .err = err, .strict = false };
    mapit it;
    int rc, idx;
    uint64_t op = 0;
    rnp_mp body = { 0 };

    if (len > RNP_MAX_MSG)
        return rnp_fail(err, RN_TOO_BIG, "message: %zu bytes, limit %u", len, RNP_MAX_MSG);
    if ((rc = rnp_mp_scan(buf, len, RNP_MAX_DEPTH, err)) != 0)
        return rc;
    rnp_mp_init(&d.r, buf, len);
    /* The envelope is read leniently so that the version can be checked
     * before anything else: a future version may add envelope keys. */
    if ((rc = map_open(&d, &it, "message", names, 4)) != 0)
        return rc;
    for (;;) {
        if ((rc = map_next(&d, &it, &idx)) != 0)
            return rc;
        if (idx < 0)
            break;
        switch (idx) {
        case F_V: rc = get_u32(&d, "v", &q->version); break;
        case F_OP: rc = get_uint(&d, "op", UINT32_MAX, &op); break;
        case F_ID: rc = get_u64(&d, "id", &q->id); break;
        case F_BODY:
            body = d.r;
            rc = rnp_mp_skip(&d.r) ? 0 : ferr(&d, RN_MALFORMED, "body", "truncated value");
            break;
        }
        if (rc)
            return rc;
    }
    if (!(it.seen & BIT(F_V)))
        return ferr(&d, RN_MISSING_FIELD, "v", "required field is missing");
    if (q->version != RNP_VERSION)
        return ferr(&d, RN_BAD_VERSION, "v", "version %u is not supported (supported: %u)",
                    q->version, RNP_VERSION);
    /* Now strictly: find the first unknown envelope key, if any. */
    {
        dctx s = { .err = err, .strict = true };
        mapit it2;
        rnp_mp_init(&s.r, buf, len);
        if ((rc = map_open(&s, &it2, "", names, 4)) != 0)
            return rc;
        while ((rc = map_next(&s, &it2, &idx)) == 0 && idx >= 0)
            if (!rnp_mp_skip(&s.r))
                return ferr(&s, RN_MALFORMED, "message", "truncated value");
        if (rc)
            return rc;
    }
    if ((rc = map_require(&d, &it, BIT(F_OP) | BIT(F_ID))) != 0)
        return rc;
    if (!op_known(op))
        return ferr(&d, RN_UNKNOWN_OP, "op", "%llu is not an operation", (unsigned long long)op);
    q->op = (uint32_t)op;

    d.strict = true;
    if (!(it.seen & BIT(F_BODY))) {
        if (op_has_body(q->op, true))
            return ferr(&d, RN_MISSING_FIELD, "body", "required for %s", rnp_op_name(q->op));
        return 0;
    }
    d.r = body;
    switch (q->op) {
    case RN_OP_HELLO: return dec_hello_req(&d, &q->u.hello);
    case RN_OP_REGISTER: return dec_register_req(&d, &q->u.reg);
    case RN_OP_UNREGISTER: return dec_unregister_req(&d, &q->u.unreg);
    case RN_OP_EVENTS: return dec_events_req(&d, &q->u.events);
    case RN_OP_BWD: return dec_bwd_req(&d, &q->u.bwd);
    case RN_OP_BYE: return dec_bye_req(&d, &q->u.bye);
    default: return get_empty(&d, rnp_op_name(q->op));
    }
}

int rnp_decode_request(const void *buf, size_t len, rnp_request *out, rnp_error *err)
{
    rnp_request q;
    memset(&q, 0, sizeof q);
    int rc = decode_request(buf, len, &q, err);
    if (rc != 0) {
        if (out)
            peek_header(buf, len, &out->op, &out->id);
        return rc;
    }
    if (out)
        *out = q;
    return 0;
}

/* ---- replies ------------------------------------------------------------------ */

static int dec_limits(dctx *d, rnp_limits *l)
{
    enum { F_SESS, F_REG, F_INF, F_INFT, F_M, F_N, F_MSG, F_SLOTS };
    static const char *const names[] = { "max_sessions", "max_regions", "max_inflight",
                                         "max_inflight_total", "max_m", "max_n", "max_msg",
                                         "event_slots" };
    mapit it;
    int rc, idx;
    char sub[PATH_MAX_];
    if ((rc = map_open(d, &it, "hello.limits", names, 8)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        join(sub, "hello.limits", names[idx]);
        switch (idx) {
        case F_SESS: rc = get_u32(d, sub, &l->max_sessions); break;
        case F_REG: rc = get_u32(d, sub, &l->max_regions); break;
        case F_INF: rc = get_u32(d, sub, &l->max_inflight); break;
        case F_INFT: rc = get_u32(d, sub, &l->max_inflight_total); break;
        case F_M: rc = get_u64(d, sub, &l->max_m); break;
        case F_N: rc = get_u32(d, sub, &l->max_n); break;
        case F_MSG: rc = get_u32(d, sub, &l->max_msg); break;
        case F_SLOTS: rc = get_u32(d, sub, &l->event_slots); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0xffu);
}

static int dec_hello_rep(dctx *d, rnp_hello_rep *h)
{
    enum { F_SESSION, F_VER, F_BACKEND, F_DEV, F_UUID, F_SM, F_CCMA, F_CCMI, F_MPS, F_LIMITS };
    static const char *const names[] = { "session", "daemon_version", "backend", "device_name",
                                         "device_uuid", "sm_count", "cc_major", "cc_minor", "mps",
                                         "limits" };
    mapit it;
    int rc, idx;
    char sub[PATH_MAX_];
    if ((rc = map_open(d, &it, "hello", names, 10)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        join(sub, "hello", names[idx]);
        switch (idx) {
        case F_SESSION: rc = get_session(d, sub, &h->session); break;
        case F_VER: rc = get_str(d, sub, h->daemon_version, RNP_MAX_NAME, false); break;
        case F_BACKEND: rc = get_str(d, sub, h->backend, RNP_MAX_NAME, false); break;
        case F_DEV: rc = get_str(d, sub, h->device_name, RNP_MAX_NAME, false); break;
        case F_UUID: rc = get_bin(d, sub, h->device_uuid, RNP_UUID_BYTES); break;
        case F_SM: rc = get_u32(d, sub, &h->sm_count); break;
        case F_CCMA: rc = get_u32(d, sub, &h->cc_major); break;
        case F_CCMI: rc = get_u32(d, sub, &h->cc_minor); break;
        case F_MPS: rc = get_bool(d, sub, &h->mps); break;
        case F_LIMITS: rc = dec_limits(d, &h->limits); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0x3ffu);
}

static int dec_register_rep(dctx *d, rnp_register_rep *g)
{
    static const char *const names[] = { "region" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "register", names, 1)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0)
        if ((rc = get_u32(d, "register.region", &g->region.id)) != 0)
            return rc;
    return rc ? rc : map_require(d, &it, BIT(0));
}

static int dec_events_rep(dctx *d, rnp_events_rep *e)
{
    static const char *const names[] = { "done" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "events", names, 1)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0)
        if ((rc = get_handles(d, "events.done", &e->n, e->done)) != 0)
            return rc;
    return rc ? rc : map_require(d, &it, BIT(0));
}

static int dec_bwd_rep(dctx *d, rnp_bwd_rep *b)
{
    enum { F_SEQ, F_DONE, F_QUEUE, F_COMPUTE };
    static const char *const names[] = { "seq", "done", "queue_ns", "compute_ns" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "bwd", names, 4)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_SEQ: rc = get_u64(d, "bwd.seq", &b->seq); break;
        case F_DONE:
            if ((rc = get_i32(d, "bwd.done", &b->done_slot)) == 0 &&
                (b->done_slot < -1 || b->done_slot >= RNP_MAX_EVENTS))
                rc = ferr(d, RN_INVALID_ARGUMENT, "bwd.done", "%d is not -1 or a slot 0..%d",
                          b->done_slot, RNP_MAX_EVENTS - 1);
            break;
        case F_QUEUE: rc = get_u64(d, "bwd.queue_ns", &b->queue_ns); break;
        case F_COMPUTE: rc = get_u64(d, "bwd.compute_ns", &b->compute_ns); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0xfu);
}

static int dec_health_rep(dctx *d, rnp_health_rep *h)
{
    enum { F_STATE, F_MPS, F_BACKEND, F_REASONS };
    static const char *const names[] = { "state", "mps", "backend", "reasons" };
    mapit it;
    int rc, idx;
    uint32_t cnt;
    char sub[PATH_MAX_];
    if ((rc = map_open(d, &it, "health", names, 4)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_STATE:
            if ((rc = get_u32(d, "health.state", &h->state)) == 0 && h->state > RNP_HEALTH_FAILING)
                rc = ferr(d, RN_INVALID_ARGUMENT, "health.state", "%u is not a state (0..2)", h->state);
            break;
        case F_MPS: rc = get_bool(d, "health.mps", &h->mps); break;
        case F_BACKEND: rc = get_str(d, "health.backend", h->backend, RNP_MAX_NAME, false); break;
        case F_REASONS:
            if (!rnp_mp_read_array(&d->r, &cnt))
                return wrong_type(d, "health.reasons", "array");
            if (cnt > RNP_MAX_REASONS)
                return ferr(d, RN_TOO_BIG, "health.reasons", "%u reasons, limit %d", cnt,
                            RNP_MAX_REASONS);
            for (uint32_t i = 0; i < cnt && rc == 0; i++) {
                snprintf(sub, sizeof sub, "health.reasons[%u]", i);
                rc = get_str(d, sub, h->reasons[i], RNP_REASON_LEN, false);
            }
            h->nreasons = cnt;
            break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0xfu);
}

static int dec_hist(dctx *d, const char *path, rnp_hist *h)
{
    static const char *const names[] = { "count", "p50", "p90", "p99", "max" };
    mapit it;
    int rc, idx;
    char sub[PATH_MAX_];
    uint64_t *dst[] = { &h->count, &h->p50, &h->p90, &h->p99, &h->max };
    if ((rc = map_open(d, &it, path, names, 5)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        join(sub, path, names[idx]);
        if ((rc = get_u64(d, sub, dst[idx])) != 0)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0x1fu);
}

/* A name -> value map (counters) or name -> histogram map (hists); names are
 * unique, 1..RNP_STAT_NAME-1 bytes. */
static int dec_named(dctx *d, const char *path, bool hists, rnp_stats_rep *s)
{
    uint32_t cnt, limit = hists ? RNP_MAX_HISTS : RNP_MAX_STATS;
    char sub[PATH_MAX_], name[RNP_STAT_NAME];
    int rc;
    if (!rnp_mp_read_map(&d->r, &cnt))
        return wrong_type(d, path, "map");
    if (cnt > limit)
        return ferr(d, RN_TOO_BIG, path, "%u entries, limit %u", cnt, limit);
    for (uint32_t i = 0; i < cnt; i++) {
        snprintf(sub, sizeof sub, "%s[%u]", path, i);
        /* Zeroed so that the copy below carries no stack bytes after the NUL. */
        memset(name, 0, sizeof name);
        if ((rc = get_str(d, sub, name, sizeof name, true)) != 0)
            return rc;
        for (uint32_t j = 0; j < i; j++) {
            const char *prev = hists ? s->hists[j].name : s->stats[j].name;
            if (strcmp(prev, name) == 0) {
                join(sub, path, name);
                return ferr(d, RN_DUPLICATE_FIELD, sub, "appears twice");
            }
        }
        join(sub, path, name);
        if (hists) {
            memcpy(s->hists[i].name, name, sizeof name);
            rc = dec_hist(d, sub, &s->hists[i]);
        } else {
            memcpy(s->stats[i].name, name, sizeof name);
            rc = get_u64(d, sub, &s->stats[i].value);
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

static int dec_stats_rep(dctx *d, rnp_stats_rep *s)
{
    enum { F_BACKEND, F_DEVICE, F_COUNTERS, F_HISTS };
    static const char *const names[] = { "backend", "device", "counters", "hists" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "stats", names, 4)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_BACKEND: rc = get_str(d, "stats.backend", s->backend, RNP_MAX_NAME, false); break;
        case F_DEVICE: rc = get_str(d, "stats.device", s->device, RNP_MAX_NAME, false); break;
        case F_COUNTERS: rc = dec_named(d, "stats.counters", false, s); break;
        case F_HISTS: rc = dec_named(d, "stats.hists", true, s); break;
        }
        if (rc)
            return rc;
    }
    return rc ? rc : map_require(d, &it, 0xfu);
}

static int dec_ping_rep(dctx *d, rnp_ping_rep *p)
{
    static const char *const names[] = { "time_ns" };
    mapit it;
    int rc, idx;
    if ((rc = map_open(d, &it, "ping", names, 1)) != 0)
        return rc;
    while ((rc = map_next(d, &it, &idx)) == 0 && idx >= 0)
        if ((rc = get_u64(d, "ping.time_ns", &p->daemon_time_ns)) != 0)
            return rc;
    return rc ? rc : map_require(d, &it, BIT(0));
}

static int decode_reply(const void *buf, size_t len, rnp_reply *p, rnp_error *err)
{
    enum { F_V, F_OP, F_ID, F_STATUS, F_ERROR, F_BODY };
    static const char *const names[] = { "v", "op", "id", "status", "error", "body" };
    dctx d = { .err = err, .strict = false };
    mapit it;
    int rc, idx;
    rnp_mp body = { 0 };

    if (len > RNP_MAX_MSG)
        return rnp_fail(err, RN_TOO_BIG, "message: %zu bytes, limit %u", len, RNP_MAX_MSG);
    if ((rc = rnp_mp_scan(buf, len, RNP_MAX_DEPTH, err)) != 0)
        return rc;
    rnp_mp_init(&d.r, buf, len);
    if ((rc = map_open(&d, &it, "message", names, 6)) != 0)
        return rc;
    while ((rc = map_next(&d, &it, &idx)) == 0 && idx >= 0) {
        switch (idx) {
        case F_V: rc = get_u32(&d, "v", &p->version); break;
        case F_OP: rc = get_u32(&d, "op", &p->op); break;
        case F_ID: rc = get_u64(&d, "id", &p->id); break;
        case F_STATUS: rc = get_i32(&d, "status", &p->status); break;
        case F_ERROR: rc = get_str(&d, "error", p->error, RNP_MAX_ERRMSG, false); break;
        case F_BODY:
            body = d.r;
            rc = rnp_mp_skip(&d.r) ? 0 : ferr(&d, RN_MALFORMED, "body", "truncated value");
            break;
        }
        if (rc)
            return rc;
    }
    if (rc || (rc = map_require(&d, &it, BIT(F_V) | BIT(F_OP) | BIT(F_ID) | BIT(F_STATUS))) != 0)
        return rc;
    if (p->status != 0) {
        /* An error reply has no body; its version and op are whatever the
         * daemon could make of the request, so they are not checked. */
        return map_require(&d, &it, BIT(F_ERROR));
    }
    if (p->version != RNP_VERSION)
        return ferr(&d, RN_BAD_VERSION, "v", "version %u is not supported (supported: %u)",
                    p->version, RNP_VERSION);
    if (!op_known(p->op))
        return ferr(&d, RN_UNKNOWN_OP, "op", "%u is not an operation", p->op);
    if (it.seen & BIT(F_ERROR))
        return ferr(&d, RN_MALFORMED, "error", "present in a reply with status 0");
    if (!(it.seen & BIT(F_BODY))) {
        if (op_has_body(p->op, false))
            return ferr(&d, RN_MISSING_FIELD, "body", "required for %s", rnp_op_name(p->op));
        return 0;
    }
    d.r = body;
    switch (p->op) {
    case RN_OP_HELLO: return dec_hello_rep(&d, &p->u.hello);
    case RN_OP_REGISTER: return dec_register_rep(&d, &p->u.reg);
    case RN_OP_EVENTS: return dec_events_rep(&d, &p->u.events);
    case RN_OP_BWD: return dec_bwd_rep(&d, &p->u.bwd);
    case RN_OP_HEALTH: return dec_health_rep(&d, &p->u.health);
    case RN_OP_STATS: return dec_stats_rep(&d, &p->u.stats);
    case RN_OP_PING: return dec_ping_rep(&d, &p->u.ping);
    default: return get_empty(&d, rnp_op_name(p->op));
    }
}

int rnp_decode_reply(const void *buf, size_t len, rnp_reply *out, rnp_error *err)
{
    rnp_reply p;
    memset(&p, 0, sizeof p);
    int rc = decode_reply(buf, len, &p, err);
    if (rc != 0) {
        if (out)
            peek_header(buf, len, &out->op, &out->id);
        return rc;
    }
    if (out)
        *out = p;
    return 0;
}
