/* SPDX-License-Identifier: MIT */
/*
 * bwd.c - the RMSNorm backward call that the host and the device entry
 * points share: the argument checks, the request, the session retry and the
 * timing.  Where a pointer lives is the mapper's business (rnc_mapper): a
 * shm buffer for rn_rmsnorm_bwd_host (buffer.c), an IPC-registered CUDA
 * allocation for rn_rmsnorm_bwd(_sync) (client_cuda.c).  Without CUDA the
 * device entry points are here and say they are not available, so the ABI
 * stays fixed.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "client_int.h"

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

/* The arguments every backward call shares (shape, dtypes, strides); the
 * pointers are checked where they are mapped. */
static int check_args(rn_client *c, const rn_bwd_args *a)
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

/* ---- whether a call may run twice ------------------------------------------------------ */

static size_t esize(rn_dtype dt)
{
    return dt == RN_DTYPE_F32 ? 4 : 2;
}

/* The bytes [*lo, *hi) from a tensor's first to its last element, gaps
 * between rows included (the protocol's conservative span).  false when
 * the span does not fit the address space. */
static bool span(const void *p, int64_t rows, int64_t stride, int64_t cols, size_t es, uintptr_t *lo,
                 uintptr_t *hi)
{
    uint64_t elems, bytes;
    if (rows <= 0) {
        *lo = *hi = (uintptr_t)p;
        return true;
    }
    if (__builtin_mul_overflow((uint64_t)(rows - 1), (uint64_t)stride, &elems) ||
        __builtin_add_overflow(elems, (uint64_t)cols, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)es, &bytes) ||
        __builtin_add_overflow((uintptr_t)p, (uintptr_t)bytes, hi))
        return false;
    *lo = (uintptr_t)p;
    return true;
}

/* Whether the output at out (its span [olo, ohi)) meets input tensor in;
 * an unrepresentable span meets everything. */
static bool meets(bool out_ok, uintptr_t olo, uintptr_t ohi, const void *in, int64_t rows,
                  int64_t stride, int64_t cols, size_t es)
{
    uintptr_t lo, hi;
    if (!out_ok || !span(in, rows, stride, cols, es, &lo, &hi))
        return true;
    return olo < ohi && lo < hi && olo < hi && lo < ohi;
}

/*
 * Whether running a twice gives what running it once does.  The daemon
 * writes only the outputs, dx and dw, and writes each of them whole, so a
 * second run over the same inputs writes the same bytes again, unless an
 * output overlaps an input: then the first run (perhaps cut short by a
 * crash) has changed the second one's inputs.  The protocol allows exactly
 * one such overlap, dx == dy (an in-place backward); the daemon refuses
 * every other one before it runs anything, but the check here is the
 * general one, on the same conservative spans, so that it stays right if
 * the protocol ever allows more.
 */
static bool idempotent(const rn_bwd_args *a)
{
    struct {
        const void *p;
        int64_t rows, stride, cols;
        rn_dtype dt;
        bool present;
    } in[] = {
        {a->x, a->m, a->x_stride, a->n, a->x_dtype, true},
        {a->dy, a->m, a->dy_stride, a->n, a->dy_dtype, true},
        {a->w, 1, a->n, a->n, a->w_dtype, a->w_dtype != RN_DTYPE_NONE},
        {a->rstd, 1, a->m, a->m, RN_DTYPE_F32, a->rstd != NULL},
        {a->dres, a->m, a->dres_stride, a->n, a->dres_dtype, a->dres_dtype != RN_DTYPE_NONE},
    };
    uintptr_t dxlo = 0, dxhi = 0, dwlo = 0, dwhi = 0;
    bool dx_ok, dw_ok = true, has_dw = a->dw_dtype != RN_DTYPE_NONE;

    if (a->m == 0) /* nothing is written */
        return true;
    dx_ok = span(a->dx, a->m, a->dx_stride, a->n, esize(a->dx_dtype), &dxlo, &dxhi);
    if (has_dw)
        dw_ok = span(a->dw, 1, a->n, a->n, esize(a->dw_dtype), &dwlo, &dwhi);
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        if (!in[i].present)
            continue;
        size_t es = esize(in[i].dt);
        if (meets(dx_ok, dxlo, dxhi, in[i].p, in[i].rows, in[i].stride, in[i].cols, es) ||
            (has_dw && meets(dw_ok, dwlo, dwhi, in[i].p, in[i].rows, in[i].stride, in[i].cols, es)))
            return false;
    }
    return true;
}

/* ---- the call --------------------------------------------------------------------------- */

/* One backward call on its way through the session retry loop. */
typedef struct bwd_call {
    const rn_bwd_args *a;
    int mode;
    bool async;      /* the fast path: publish and return */
    const rnc_mapper *m;
    void *ctx;
    bool idempotent; /* may run again after a lost session (idempotent()) */
    const rnc_ring_dev *dev; /* a stream-ordered call that may take the fast path */
    void *stream;
    bool classic;    /* ... but took the classic path (the daemon offers no other) */
} bwd_call;

static int map_one(rn_client *c, const bwd_call *k, const char *field, const void *p, rnp_tensor *t)
{
    if (p == NULL)
        return rnc_fail(c, RN_INVALID_ARGUMENT, "%s: pointer is NULL but its dtype is set", field);
    return k->m->map(c, k->ctx, field, p, t);
}

/* Map every tensor of k's arguments into b; absent ones stay absent. */
static int map_tensors(rn_client *c, const bwd_call *k, rnp_bwd_req *b)
{
    const rn_bwd_args *a = k->a;
    int rv;

    if ((rv = map_one(c, k, "x", a->x, &b->x)) != 0 ||
        (rv = map_one(c, k, "dy", a->dy, &b->dy)) != 0 ||
        (rv = map_one(c, k, "dx", a->dx, &b->dx)) != 0)
        return rv;
    b->x.stride = (uint64_t)a->x_stride;
    b->dy.stride = (uint64_t)a->dy_stride;
    b->dx.stride = (uint64_t)a->dx_stride;
    if ((b->has_w = a->w_dtype != RN_DTYPE_NONE) && (rv = map_one(c, k, "w", a->w, &b->w)) != 0)
        return rv;
    if ((b->has_rstd = a->rstd != NULL) && (rv = map_one(c, k, "rstd", a->rstd, &b->rstd)) != 0)
        return rv;
    if ((b->has_dres = a->dres_dtype != RN_DTYPE_NONE)) {
        if ((rv = map_one(c, k, "dres", a->dres, &b->dres)) != 0)
            return rv;
        b->dres.stride = (uint64_t)a->dres_stride;
    }
    if ((b->has_dw = a->dw_dtype != RN_DTYPE_NONE) &&
        (rv = map_one(c, k, "dw", a->dw, &b->dw)) != 0)
        return rv;
    return 0;
}

/* The fields that come from the shape, dtypes and scalars, with c's session
 * and the next seq. */
static void fill_bwd(rn_client *c, const rn_bwd_args *a, int mode, int32_t ready_slot,
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

/*
 * One attempt in the current session.  The request is built aside and
 * copied into c->req at the end: mapping a device pointer may register its
 * allocation, an exchange of its own.
 */
static int bwd_step(rn_client *c, void *arg)
{
    const bwd_call *k = arg;
    rnp_bwd_req b;
    int32_t slot = -1;
    int rv;

    /* The daemon closed the session channel (it exited or ended the
     * session): the session is gone, and a new one says at once whether a
     * daemon runs, where this request would wait out the timeout. */
    if (c->have_chan && rnc_chan_closed(c)) {
        c->have_session = false;
        return rnc_fail(c, RN_UNKNOWN_SESSION, "bwd: the daemon closed the session channel");
    }
    memset(&b, 0, sizeof b);
    if (k->m->prepare && (rv = k->m->prepare(c, k->ctx)) != 0)
        return rv;
    if ((rv = map_tensors(c, k, &b)) != 0)
        return rv;
    if (k->m->ready && (rv = k->m->ready(c, k->ctx, &slot)) != 0)
        return rv;
    fill_bwd(c, k->a, k->mode, slot, &b);
    rnc_request(c, RN_OP_BWD)->u.bwd = b;
    rv = rnc_transact(c, c->timeout_ms);
    /*
     * The daemon does not know the session.  Either it lost the session
     * before this request went out (a restart between calls, the idle
     * timeout): nothing ran, and the retry loop may run the call again in a
     * new session.  Or the socket reconnected while the call waited: then a
     * copy of the request may have reached the daemon that died, and it may
     * have written part of the outputs before it did; the copy the new
     * daemon refused is nanomsg's own re-send.  Running the call again is
     * right only when that cannot change the result.
     */
    if (rv == RN_UNKNOWN_SESSION && c->reconnected && !k->idempotent) {
        c->have_session = false;
        return rnc_fail(c, RN_RESTARTED,
                        "bwd: the daemon restarted during the call and its outputs overlap its "
                        "inputs (dx is dy), so it is not run again: dx, dw and dy may be partly "
                        "written; restore the inputs and call again");
    }
    return rv;
}

/* One attempt on the fast path: the slot goes into the ring; a
 * synchronous call waits for it. */
static int ring_step(rn_client *c, void *arg)
{
    bwd_call *k = arg;
    rnp_bwd_req b;
    uint64_t seq;
    int rv;

    memset(&b, 0, sizeof b);
    if (k->dev) {
        if (k->m->prepare && (rv = k->m->prepare(c, k->ctx)) != 0)
            return rv;
        /* Stream-ordered calls take the fast path only where it is
         * offered (HELLO of this session); else the classic one. */
        if (!(c->hello.paths & RNP_PATH_FAST) || !c->have_chan) {
            /* The classic path cannot be captured into a graph: its
             * kernel would run once, now, and its wait on the daemon's
             * done event (recorded outside the capture) breaks the
             * capture. */
            int cap = k->dev->captured ? k->dev->captured(c, k->stream) : 0;
            if (cap < 0)
                return -cap;
            if (cap)
                return rnc_fail(c, RN_UNSUPPORTED,
                                "graph: a call captured into a CUDA graph needs the fast path, "
                                "which the daemon does not offer (%s backend%s)",
                                c->hello.backend, c->have_chan ? "" : ", no session channel");
            k->classic = true;
            return bwd_step(c, k);
        }
        k->classic = false;
    }
    if ((rv = map_tensors(c, k, &b)) != 0)
        return rv;
    fill_bwd(c, k->a, RNP_MODE_SYNC, -1, &b);
    /* A ring about to open gets a done word in device memory where the
     * device side has one (registered like a tensor). */
    rnc_done_word dw, *done = NULL;
    void *p = NULL;
    if (k->dev && k->dev->done_word && rnc_ring_opening(c)) {
        /* Any trouble with it: the ring's own word, as without it. */
        if (k->dev->done_word(c, &p) == 0 && p &&
            k->m->map(c, k->ctx, "ring.done_word", p, &dw.t) == 0) {
            dw.addr = (uint64_t)(uintptr_t)p;
            done = &dw;
        }
        rnc_clear_thread_error();
    }
    if ((rv = rnc_ring_publish(c, &b, k->dev, k->stream, done, &seq)) != 0 || k->async)
        return rv;
    rv = rnc_ring_wait(c, seq);
    /* As in bwd_step: a call that overwrites its own inputs is not run
     * again after the daemon may have begun it. */
    if (rv == RN_UNKNOWN_SESSION && !k->idempotent) {
        c->have_session = false;
        return rnc_fail(c, RN_RESTARTED,
                        "bwd: the session ended during the call and its outputs overlap its "
                        "inputs (dx is dy), so it is not run again: dx, dw and dy may be partly "
                        "written; restore the inputs and call again");
    }
    return rv;
}

static int host_call(rn_client *c, const rn_bwd_args *a, bool async, rn_timing *t)
{
    bwd_call k = {.a = a, .mode = RNP_MODE_SYNC, .m = &rnc_host_mapper, .async = async};
    uint64_t t0 = rnc_now_ns();
    int rv;

    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    if (c->path != RN_PATH_FAST)
        return rnc_bwd(c, a, RNP_MODE_SYNC, &rnc_host_mapper, NULL, t);
    pthread_mutex_lock(&c->mu);
    if ((rv = check_args(c, a)) == 0) {
        k.idempotent = idempotent(a);
        rv = rnc_in_session(c, ring_step, &k);
    }
    pthread_mutex_unlock(&c->mu);
    if (rv == 0 && t) {
        /* The daemon's times stay in the daemon (STATS: fast.*). */
        rn_timing tm = {0, 0, rnc_now_ns() - t0};
        *t = tm;
    }
    return rv;
}

int rn_rmsnorm_bwd_host_async(rn_client *c, const rn_bwd_args *a)
{
    return host_call(c, a, true, NULL);
}

static int sync_or_check(rn_client *c, bool wait)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    rv = rnc_ring_sync(c, wait);
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_sync(rn_client *c)
{
    return sync_or_check(c, true);
}

int rn_check(rn_client *c)
{
    return sync_or_check(c, false);
}

int rn_client_path(const rn_client *c)
{
    return c ? c->path : RN_INVALID_ARGUMENT;
}

int rnc_bwd(rn_client *c, const rn_bwd_args *a, int mode, const rnc_mapper *m, void *ctx,
            rn_timing *t)
{
    bwd_call k = {.a = a, .mode = mode, .m = m, .ctx = ctx};
    uint64_t t0 = rnc_now_ns();
    int rv;

    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if ((rv = check_args(c, a)) != 0)
        goto out;
    k.idempotent = idempotent(a);
    if ((rv = rnc_in_session(c, bwd_step, &k)) != 0)
        goto out;
    if (m->accepted && (rv = m->accepted(c, ctx)) != 0)
        goto out;
    if (t) {
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

static __thread bool setup_failed_here;

bool rnc_ring_setup_failed_here(void)
{
    return setup_failed_here;
}

int rnc_bwd_ring_dev(rn_client *c, const rn_bwd_args *a, const rnc_mapper *m, void *ctx,
                     const rnc_ring_dev *dev, void *stream)
{
    bwd_call k = {.a = a, .mode = RNP_MODE_ASYNC, .m = m, .ctx = ctx, .async = true,
                  .dev = dev, .stream = stream};
    int rv;

    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if ((rv = check_args(c, a)) == 0) {
        k.idempotent = idempotent(a);
        rv = rnc_in_session(c, ring_step, &k);
    }
    /* The classic path's end: the stream waits for the daemon's done event. */
    if (rv == 0 && k.classic && m->accepted)
        rv = m->accepted(c, ctx);
    setup_failed_here = rv != 0 && c->ring_setup_failed;
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_rmsnorm_bwd_host(rn_client *c, const rn_bwd_args *a, rn_timing *t)
{
    return host_call(c, a, false, t);
}

#ifndef RN_HAVE_CUDA
/* The stream-ordered calls need the CUDA client (client/client_cuda.c), which is
 * built, with RN_HAVE_CUDA defined for every file, only where a CUDA Toolkit exists. */
static int no_cuda(rn_client *c, const char *fn)
{
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    return rnc_fail(c, RN_UNSUPPORTED,
                    "%s: this libclient has no CUDA support; use rn_rmsnorm_bwd_host with buffers "
                    "from rn_buffer_alloc",
                    fn);
}

int rn_rmsnorm_bwd(rn_client *c, const rn_bwd_args *a, void *cuda_stream)
{
    (void)a;
    (void)cuda_stream;
    return no_cuda(c, "rn_rmsnorm_bwd");
}

int rn_rmsnorm_bwd_sync(rn_client *c, const rn_bwd_args *a, void *cuda_stream, rn_timing *t)
{
    (void)a;
    (void)cuda_stream;
    (void)t;
    return no_cuda(c, "rn_rmsnorm_bwd_sync");
}
#endif
