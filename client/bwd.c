/*
 * bwd.c - the RMSNorm backward calls: the blocking host-buffer call of the
 * CPU backend, and the stream-ordered device-pointer calls (until the CUDA
 * client lands, they say they are not available, so the ABI stays fixed).
 */
#include <stdio.h>
#include <string.h>

#include "client_int.h"

/* Find the buffer holding [p, p + bytes); the daemon re-checks bounds, this
 * only turns a pointer into (region, offset) and names the field when the
 * pointer is not in shared memory at all. */
static int map_ptr(rn_client *c, const char *field, const void *p, rnp_tensor *t)
{
    const char *cp = p;
    if (p == NULL)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: pointer is NULL but its dtype is set", field);
    for (size_t i = 0; i < c->nbufs; i++) {
        const char *b = c->bufs[i].base;
        if (cp >= b && cp < b + c->bufs[i].size) {
            t->region.id = c->bufs[i].region;
            t->offset = (uint64_t)(cp - b);
            return 0;
        }
    }
    return rnc_fail(c, RN_NOT_SHARED,
                    "%s: pointer %p is not inside a buffer from rn_buffer_alloc of this client",
                    field, p);
}

static int check_dtype(rn_client *c, const char *field, rn_dtype dt, int none_ok)
{
    if ((dt == RN_DTYPE_NONE && none_ok) || dt == RN_DTYPE_F32 || dt == RN_DTYPE_F16 ||
        dt == RN_DTYPE_BF16)
        return 0;
    return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: invalid dtype %d", field, (int)dt);
}

static int check_stride(rn_client *c, const char *field, int64_t s)
{
    if (s < 0)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: stride %lld is negative", field, (long long)s);
    return 0;
}

void rnc_fill_bwd(rn_client *c, const rn_bwd_args *a, int mode, int32_t ready_slot,
                  rnp_bwd_req *b)
{
    b->session = c->session;
    b->seq = ++c->next_seq;
    b->m = (uint64_t)a->m;
    b->n = (uint32_t)a->n;
    b->x_dtype = (uint8_t)a->x_dtype;
    b->dy_dtype = (uint8_t)a->dy_dtype;
    b->dx_dtype = (uint8_t)a->dx_dtype;
    b->w_dtype = (uint8_t)a->w_dtype;
    b->dres_dtype = (uint8_t)a->dres_dtype;
    b->dw_dtype = (uint8_t)a->dw_dtype;
    b->eps = a->eps;
    b->weight_offset = a->weight_offset;
    b->ready_slot = ready_slot;
    b->mode = (uint32_t)mode;
    b->ordering = RNP_ORDER_EVENTS;
}

/* Build the BWD request from a in c->req (session and region ids as of now). */
static int build_bwd(rn_client *c, const rn_bwd_args *a, int mode)
{
    rnp_bwd_req *b;
    int rv;

    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_BWD;
    b = &c->req.u.bwd;
    rnc_fill_bwd(c, a, mode, -1, b);

    if ((rv = map_ptr(c, "x", a->x, &b->x)) != 0 || (rv = map_ptr(c, "dy", a->dy, &b->dy)) != 0 ||
        (rv = map_ptr(c, "dx", a->dx, &b->dx)) != 0)
        return rv;
    b->x.stride = (uint64_t)a->x_stride;
    b->dy.stride = (uint64_t)a->dy_stride;
    b->dx.stride = (uint64_t)a->dx_stride;
    if (a->w_dtype != RN_DTYPE_NONE) {
        b->has_w = true;
        if ((rv = map_ptr(c, "w", a->w, &b->w)) != 0)
            return rv;
    }
    if (a->rstd != NULL) {
        b->has_rstd = true;
        if ((rv = map_ptr(c, "rstd", a->rstd, &b->rstd)) != 0)
            return rv;
    }
    if (a->dres_dtype != RN_DTYPE_NONE) {
        b->has_dres = true;
        if ((rv = map_ptr(c, "dres", a->dres, &b->dres)) != 0)
            return rv;
        b->dres.stride = (uint64_t)a->dres_stride;
    }
    if (a->dw_dtype != RN_DTYPE_NONE) {
        b->has_dw = true;
        if ((rv = map_ptr(c, "dw", a->dw, &b->dw)) != 0)
            return rv;
    }
    return 0;
}

int rnc_check_bwd_args(rn_client *c, const rn_bwd_args *a)
{
    int rv;
    if (a == NULL)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "args: must not be NULL");
    if (a->m < 0)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "m: %lld is negative", (long long)a->m);
    if (a->n < 1 || a->n > UINT32_MAX)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "n: %lld is outside 1..%u", (long long)a->n,
                        UINT32_MAX);
    if ((rv = check_dtype(c, "x_dtype", a->x_dtype, 0)) != 0 ||
        (rv = check_dtype(c, "dy_dtype", a->dy_dtype, 0)) != 0 ||
        (rv = check_dtype(c, "dx_dtype", a->dx_dtype, 0)) != 0 ||
        (rv = check_dtype(c, "w_dtype", a->w_dtype, 1)) != 0 ||
        (rv = check_dtype(c, "dres_dtype", a->dres_dtype, 1)) != 0 ||
        (rv = check_dtype(c, "dw_dtype", a->dw_dtype, 1)) != 0)
        return rv;
    if ((rv = check_stride(c, "x_stride", a->x_stride)) != 0 ||
        (rv = check_stride(c, "dy_stride", a->dy_stride)) != 0 ||
        (rv = check_stride(c, "dx_stride", a->dx_stride)) != 0 ||
        (a->dres_dtype != RN_DTYPE_NONE &&
         (rv = check_stride(c, "dres_stride", a->dres_stride)) != 0))
        return rv;
    return 0;
}

int rn_rmsnorm_bwd_host(rn_client *c, const rn_bwd_args *a, rn_timing *t)
{
    uint64_t t0 = rnc_now_ns();
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if ((rv = rnc_check_bwd_args(c, a)) != 0)
        goto out;
    /* A lost session (daemon restart) shows as UNKNOWN_SESSION: open a new
     * one, register the buffers again and retry once. */
    for (int attempt = 0;; attempt++) {
        if ((rv = rnc_ensure_session(c)) != 0)
            break;
        if ((rv = build_bwd(c, a, RNP_MODE_SYNC)) != 0)
            break;
        rv = rnc_transact(c, c->timeout_ms);
        if (rv == RN_UNKNOWN_SESSION && attempt == 0) {
            c->have_session = false;
            continue;
        }
        break;
    }
    if (rv == 0 && t) {
        rn_timing tm;
        tm.queue_ns = c->rep.u.bwd.queue_ns;
        tm.compute_ns = c->rep.u.bwd.compute_ns;
        tm.total_ns = rnc_now_ns() - t0;
        *t = tm;
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rv;
}

#ifndef RN_HAVE_CUDA
/* The stream-ordered calls need the CUDA client (client/client_cuda.c), which is
 * built, with RN_HAVE_CUDA defined for every file, only where a CUDA Toolkit exists. */
int rn_rmsnorm_bwd(rn_client *c, const rn_bwd_args *a, void *cuda_stream)
{
    (void)a;
    (void)cuda_stream;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    return rnc_fail(c, RN_UNSUPPORTED,
                    "rn_rmsnorm_bwd: this libclient has no CUDA support; use rn_rmsnorm_bwd_host "
                    "with buffers from rn_buffer_alloc");
}

int rn_rmsnorm_bwd_sync(rn_client *c, const rn_bwd_args *a, void *cuda_stream, rn_timing *t)
{
    (void)a;
    (void)cuda_stream;
    (void)t;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    return rnc_fail(c, RN_UNSUPPORTED,
                    "rn_rmsnorm_bwd_sync: this libclient has no CUDA support; use "
                    "rn_rmsnorm_bwd_host with buffers from rn_buffer_alloc");
}
#endif
