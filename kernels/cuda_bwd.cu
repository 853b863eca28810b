/* SPDX-License-Identifier: MIT */
/*
 * cuda_bwd.cu - the CUDA side of rnk.h: per-device init, workspace sizing,
 * and the one-launch fused deterministic backward (device code in
 * bwd_kernel.cuh).  Every CUDA call is checked; a failure returns RNK_ECUDA
 * with "file:line: call: error" in msg and clears the sticky error state.
 */
#include "bwd_kernel.cuh"
#include "cuda_launch.h"
#include "rnk_test.h"

#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace rnk;

struct occ_entry {
    const void *fn;
    int threads;
    size_t smem;
    int blocks;
};

struct rnk_device {
    int device;
    int sms;
    int smem_per_block;  /* dynamic shared memory a block may opt in to */
    int forced_grid;
    std::mutex mu;
    occ_entry occ[128];
    int nocc;
};

int rnk::ck(cudaError_t e, const char *file, int line, const char *what, char *msg, size_t msglen)
{
    if (e == cudaSuccess)
        return RNK_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    const char *base = strrchr(file, '/');
    if (msg && msglen)
        snprintf(msg, msglen, "%s:%d: %s: %s", base ? base + 1 : file, line, what,
                 cudaGetErrorString(e));
    return RNK_ECUDA;
}

static int einval(char *msg, size_t msglen, const char *fmt, ...)
{
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return RNK_EINVAL;
}

extern "C" int rnk_cuda_init(int device, rnk_device **out, char *msg, size_t msglen)
{
    int sms = 0, smem = 0;
    CK(cudaSetDevice(device));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    rnk_device *d = new (std::nothrow) rnk_device();
    if (!d) {
        if (msg && msglen)
            snprintf(msg, msglen, "cuda: out of host memory");
        return RNK_ENOMEM;
    }
    d->device = device;
    d->sms = sms;
    d->smem_per_block = smem;
    d->forced_grid = 0;
    d->nocc = 0;
    *out = d;
    return RNK_OK;
}

extern "C" void rnk_cuda_fini(rnk_device *dev)
{
    delete dev;
}

extern "C" int rnk_cuda_sm_count(const rnk_device *dev)
{
    return dev ? dev->sms : 0;
}

extern "C" void rnk_cuda_force_grid(rnk_device *dev, int ctas)
{
    if (dev)
        dev->forced_grid = ctas > 0 ? ctas : 0;
}

size_t rnk::ws_bytes(int64_t m, int64_t n)
{
    if (m <= 0 || n <= 0)
        return WS_HEADER;
    /* The larger of the two orders' partials (the order depends on the
     * dtypes, which the caller need not know yet) */
    const size_t pst = (size_t)(n + 3) / 4 * 4;
    rnk_chunking c, ci;
    rnk_chunking_of(m, n, RNK_F32, RNK_F32, RNK_F32, &c);      /* contiguous */
    rnk_chunking_of(m, n, RNK_BF16, RNK_BF16, RNK_BF16, &ci);  /* interleaved if (m, n) allow */
    size_t b = (size_t)c.nchunks * (size_t)c.stripes * pst * 4;
    size_t bi = (size_t)ci.nchunks * (size_t)ci.stripes * pst * 4;
    return WS_HEADER + (b > bi ? b : bi);
}

extern "C" size_t rnk_cuda_workspace_size(const rnk_device *dev, int64_t m, int64_t n)
{
    (void)dev;
    return ws_bytes(m, n);
}

extern "C" int rnk_cuda_workspace_init(void *ws, size_t bytes, void *stream, char *msg,
                                       size_t msglen)
{
    if (!ws || bytes < WS_HEADER)
        return einval(msg, msglen, "ws: NULL or smaller than %zu bytes", (size_t)WS_HEADER);
    CK(cudaMemsetAsync(ws, 0, bytes, (cudaStream_t)stream));
    return RNK_OK;
}

/* rnk_cuda_stamp's kernel: one thread stores the GPU's %globaltimer. */
static __global__ void stamp_kernel(unsigned long long *dst)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *dst = t;
}

extern "C" int rnk_cuda_stamp(void *dst, void *stream, char *msg, size_t msglen)
{
    if (!dst)
        return einval(msg, msglen, "stamp: dst is NULL");
    stamp_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((unsigned long long *)dst);
    CK(cudaGetLastError());
    return RNK_OK;
}

/* RNK_RACECHECK=1 (tests/gpu/device_run.sh's racecheck step): launches
 * keep compute-sanitizer racecheck's barrier count even (bwd_kernel.cuh). */
static bool racecheck_run(void)
{
    static const bool on = [] {
        const char *e = getenv("RNK_RACECHECK");
        return e && strcmp(e, "1") == 0;
    }();
    return on;
}

static bool aligned16(const void *p, int64_t stride, size_t es)
{
    return ((uintptr_t)p % 16) == 0 && ((size_t)stride * es) % 16 == 0;
}

int rnk::plan(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t wsb, Plan *pl,
              char *msg, size_t msglen)
{
    int rc = rnk_check_args(a, msg, msglen);
    if (rc)
        return rc;
    memset(pl, 0, sizeof *pl);
    if (a->m == 0)
        return RNK_OK;
    if (!dev)
        return einval(msg, msglen, "dev: NULL");
    size_t need = ws_bytes(a->m, a->n);
    if (!ws || wsb < need)
        return einval(msg, msglen, "ws: %zu bytes given, %zu needed for %lld x %lld", wsb, need,
                      (long long)a->m, (long long)a->n);
    if ((uintptr_t)ws % 16)
        return einval(msg, msglen, "ws: not 16-byte aligned");
    Params &p = pl->p;
    p.x = a->x;
    p.dy = a->dy;
    p.dx = a->dx;
    p.w = a->w_dtype != RNK_NONE ? a->w : nullptr;
    p.dres = a->dres_dtype != RNK_NONE ? a->dres : nullptr;
    p.dw = a->dw_dtype != RNK_NONE ? a->dw : nullptr;
    p.rstd = a->rstd;
    p.m = a->m;
    p.n = a->n;
    p.xs = a->x_stride;
    p.dys = a->dy_stride;
    p.dxs = a->dx_stride;
    p.drs = a->dres_stride;
    p.x_dt = a->x_dtype;
    p.dy_dt = a->dy_dtype;
    p.dx_dt = a->dx_dtype;
    p.w_dt = a->w_dtype;
    p.dr_dt = a->dres_dtype;
    p.dw_dt = a->dw_dtype;
    p.eps = a->eps;
    p.offset = a->weight_offset;
    rnk_chunking ch; /* rnk.h: the order and its geometry */
    rnk_chunking_of(a->m, a->n, a->x_dtype, a->dy_dtype, a->dx_dtype, &ch);
    pl->il = ch.interleaved != 0;
    p.C = pl->il ? 0 : ch.rows;
    p.nchunks = (int)ch.nchunks;
    p.G = ch.stripes;
    p.pst = (a->n + 3) / 4 * 4;
    p.cs = p.G * p.pst;
    const int fcols = pl->il ? FIN_COLS_IL : FIN_COLS;
    p.nslices = (int)((a->n + fcols - 1) / fcols);
    p.ctr = (unsigned *)ws;
    p.part = (float *)((char *)ws + WS_HEADER);
    p.acc = nullptr; /* the ATOMIC benchmark variant's, set there */
    p.cancel = a->cancel;
    p.gate = (const unsigned long long *)a->gate;
    p.gate_key = p.gate ? a->gate_key : 0ull;
    p.latch = p.gate ? (unsigned long long *)a->latch : nullptr;
    p.latch_epoch = p.latch ? a->latch_epoch : 0ull;
    p.done0 = (unsigned long long *)a->done[0];
    p.done1 = p.done0 ? (unsigned long long *)a->done[1] : nullptr;
    p.done_v = a->done_value;
    p.even_bars = racecheck_run() ? 1 : 0;
    {
        /* Steps between a stripe's rows (the ring path's): G rows, or G * P
         * under the interleaved order. */
        const int64_t es = (int64_t)rnk_dtype_size(a->x_dtype);
        const int64_t gp = (int64_t)p.G * (pl->il ? p.nchunks : 1);
        p.xstep = gp * p.xs * es;
        p.ystep = gp * p.dys * es;
        p.dstep = gp * p.dxs * es;
        p.drstep = p.dres ? gp * p.drs * es : 0; /* (the stride means nothing without dres) */
        p.inv_n = 1.0f / (float)a->n;
    }

    /* The fast paths: x, dy, dx (and dres) of one dtype, 16-byte aligned rows,
     * n a multiple of the vector width: S under the interleaved order (its R
     * rows at once are rnk.h's G stripes), the ring under the contiguous one
     * for rows that fit in shared memory. */
    const rnk_dtype t = a->x_dtype;
    const size_t es = rnk_dtype_size(t);
    const int vec = (int)(16 / es);
    bool fast = a->dy_dtype == t && a->dx_dtype == t &&
                (a->dres_dtype == RNK_NONE || a->dres_dtype == t) &&
                (a->w_dtype == RNK_NONE || a->w_dtype == RNK_F32 || a->w_dtype == t) &&
                a->n % vec == 0 && aligned16(a->x, a->x_stride, es) &&
                aligned16(a->dy, a->dy_stride, es) && aligned16(a->dx, a->dx_stride, es) &&
                (a->dres_dtype == RNK_NONE || aligned16(a->dres, a->dres_stride, es));
    pl->path = PATH_GENERAL;
    if (pl->il) { /* (16-bit rows of 129 .. S_MAX_N columns: rnk.h) */
        if (fast) {
            const int tpr = s_tpr(a->n);
            pl->path = PATH_S;
            p.tpr = tpr;
            pl->threads = (tpr < 128 ? 128 : tpr) * s_rx(tpr * s_nv(a->n));
#if RNK_S_FEW
            pl->few = s_nv(a->n) == 1 &&
                      (p.nchunks > p.nslices ? p.nchunks : p.nslices) <= dev->sms * RNK_S_FEW;
#endif
        } else {
            int64_t tp = (a->n + 31) / 32 * 32;
            p.tpr = (int)(tp > 1024 / p.G ? 1024 / p.G : tp);
            pl->threads = p.tpr * p.G;
        }
        pl->smem = 0; /* (neither stages anything in dynamic shared memory) */
        if (a->n > S_MAX_N || pl->threads / p.tpr != p.G)
            return einval(msg, msglen, "n: %lld: block of %d rows, rnk.h's G = %d",
                          (long long)a->n, pl->threads / p.tpr, p.G);
        return RNK_OK;
    }
    if (fast) {
        /* About RNK_NV_TARGET vectors of 16 bytes per thread: the stripe is
         * the fewest warps that hold the row that way (one warp up to 512
         * bf16 columns at NV = 2, 1024 at NV = 4), so small rows reduce with
         * shuffles alone and larger ones across a few warps; NV 3 runs as 4
         * with its last vector masked. */
        const int64_t nvec = a->n / vec;
        int target = nvec >= 512 ? RNK_NV_WIDE : RNK_NV_TARGET;
        int64_t tp;
        int nv;
        for (;;) {
            tp = (nvec + target - 1) / target;
            tp = (tp + 31) / 32 * 32;
            nv = (int)((nvec + tp - 1) / tp);
            if (tp * p.G <= RNK_FAST_MAXT || target >= 4)
                break;
            target = 4; /* a block too large: four vectors a thread */
        }
        if (nv == 3)
            nv = 4;
        /* Stripes of several warps need a named barrier each (15 at most). */
        if (tp * p.G <= RNK_FAST_MAXT && (tp == 32 || p.G <= 15)) {
            pl->path = PATH_RING;
            pl->nv = nv;
            p.tpr = (int)tp;
            p.wsp = fast_w_regs(nv) ? 0 : tp * w_lane_floats(nv, vec);
        }
    }
    for (;;) {
        if (pl->path == PATH_GENERAL) {
            int64_t tp = (a->n + 31) / 32 * 32;
            if (tp > 1024 / p.G)
                tp = 1024 / p.G;
            p.tpr = (int)tp;
        }
        pl->threads = p.tpr * p.G;
        size_t comb = p.G > 1 ? (size_t)p.G * (size_t)a->n * 4 : 0;
        size_t tile = p.dw ? (size_t)(p.nchunks < FIN_BATCH ? p.nchunks : FIN_BATCH) * FIN_COLS * 4
                           : 0;
        pl->smem = comb > tile ? comb : tile;
        if (pl->path == PATH_RING) /* the row ring (bwd_kernel.cuh), which comb and tile reuse, w */
            pl->smem = fast_smem(*pl, pl->smem);
        /* 4 KiB: the static arrays (2.5 KiB with fp64 row sums).  A ring
         * too large for one block: the general path, which stages nothing. */
        if (pl->smem + 4096 <= (size_t)dev->smem_per_block)
            break;
        if (pl->path == PATH_GENERAL)
            return einval(msg, msglen, "n: %lld needs %zu bytes of shared memory",
                          (long long)a->n, pl->smem);
        pl->path = PATH_GENERAL;
        p.wsp = 0;
    }
    return RNK_OK;
}

int rnk::grid_for(rnk_device *dev, const void *fn, const Plan &pl, char *msg, size_t msglen,
                  int *grid)
{
    int blocks = 0;
    {
        std::lock_guard<std::mutex> lock(dev->mu);
        for (int i = 0; i < dev->nocc; i++)
            if (dev->occ[i].fn == fn && dev->occ[i].threads == pl.threads &&
                dev->occ[i].smem == pl.smem)
                blocks = dev->occ[i].blocks;
    }
    if (!blocks) {
        /* Past 48 KiB a kernel must opt in; opting in to the device's limit
         * once covers every later size. */
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, fn));
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                dev->smem_per_block - (int)fa.sharedSizeBytes));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, pl.threads, pl.smem));
        if (blocks < 1)
            blocks = 1;
        std::lock_guard<std::mutex> lock(dev->mu);
        if (dev->nocc < (int)(sizeof dev->occ / sizeof dev->occ[0]))
            dev->occ[dev->nocc++] = occ_entry{fn, pl.threads, pl.smem, blocks};
    }
    /* Enough blocks to cover every resident slot, never more than there is
     * work for: chunks first, then the finish's slices. */
    int64_t g = (int64_t)dev->sms * blocks;
    int64_t work = pl.p.nchunks > pl.p.nslices || !pl.p.dw ? pl.p.nchunks : pl.p.nslices;
    if (g > work)
        g = work;
    if (dev->forced_grid > 0)
        g = dev->forced_grid;
    *grid = (int)g;
    return RNK_OK;
}

/* Ring path kernels (main's): every row dtype at NV 1, 2, 4. */
template <class T, class TW>
static const void *ring_fn(int nv)
{
    return nv == 1   ? (const void *)fast_kernel<T, TW, 1, MODE_FUSED>
           : nv == 2 ? (const void *)fast_kernel<T, TW, 2, MODE_FUSED>
                     : (const void *)fast_kernel<T, TW, 4, MODE_FUSED>;
}

/* S: one kernel for every weight dtype; the ring: the weight of fp32 or of
 * the rows' type (or none). */
template <class T>
static const void *path_fn(const Plan &pl)
{
    if constexpr (sizeof(T) == 2) /* (fp32 rows never take S) */
        if (pl.path == PATH_S)
            return s_fn<T, MODE_FUSED>(pl.p.n, pl.few);
    return pl.p.w_dt == RNK_F32 ? ring_fn<T, float>(pl.nv) : ring_fn<T, T>(pl.nv);
}

const void *rnk::production_fn(const Plan &pl)
{
    if (pl.path == PATH_GENERAL)
        return pl.il ? (const void *)general_kernel<true> : (const void *)general_kernel<false>;
    switch (pl.p.x_dt) {
    case RNK_BF16: return path_fn<__nv_bfloat16>(pl);
    case RNK_F16: return path_fn<__half>(pl);
    default: return path_fn<float>(pl);
    }
}

/* (the stand-in workspace: only its size and alignment count) */
int rnk::plan_grid(rnk_device *dev, const rnk_bwd_args *a, Plan *pl, int *grid, char *msg,
                   size_t msglen)
{
    *grid = 0;
    int rc = plan(dev, a, (void *)(uintptr_t)256, ws_bytes(a->m, a->n), pl, msg, msglen);
    if (rc || a->m == 0)
        return rc;
    return grid_for(dev, production_fn(*pl), *pl, msg, msglen, grid);
}

#if RNK_TRACE
/* rnk_test.h's timelines: the buffer the next launches record into. */
static void *g_trace;
static size_t g_trace_bytes;

static size_t trace_bytes(int64_t grid, int64_t nchunks)
{
    return sizeof(rnk_trace_head) + (size_t)grid * sizeof(rnk_trace_block) +
           (size_t)nchunks * sizeof(rnk_trace_chunk);
}

extern "C" void rnk_cuda_set_trace(void *buf, size_t bytes)
{
    g_trace = bytes >= sizeof(rnk_trace_head) ? buf : nullptr;
    g_trace_bytes = g_trace ? bytes : 0;
}

extern "C" size_t rnk_cuda_trace_bytes(rnk_device *dev, const rnk_bwd_args *a)
{
    char msg[160];
    Plan pl;
    int grid;
    if (plan_grid(dev, a, &pl, &grid, msg, sizeof msg) || a->m == 0)
        return sizeof(rnk_trace_head);
    return trace_bytes(grid, pl.p.nchunks);
}

/* As many blocks' records as the buffer holds, then as many chunks'. */
static void trace_attach(Params &p, int grid)
{
    static_assert(sizeof(rnk_trace_head) == 64 && sizeof(rnk_trace_block) == 64 &&
                      sizeof(rnk_trace_chunk) == 16,
                  "rnk_test.h's trace records");
    p.tr_head = (rnk_trace_head *)g_trace;
    p.tr_blk = nullptr;
    p.tr_chk = nullptr;
    p.tr_nblk = p.tr_nchk = 0;
    if (!g_trace)
        return;
    size_t room = (g_trace_bytes - sizeof(rnk_trace_head)) / sizeof(rnk_trace_block);
    p.tr_nblk = (int)(room < (size_t)grid ? room : (size_t)grid);
    p.tr_blk = (rnk_trace_block *)(p.tr_head + 1);
    room = (g_trace_bytes - trace_bytes(p.tr_nblk, 0)) / sizeof(rnk_trace_chunk);
    p.tr_nchk = (int)(room < (size_t)p.nchunks ? room : (size_t)p.nchunks);
    p.tr_chk = (rnk_trace_chunk *)(p.tr_blk + p.tr_nblk);
}
#endif

int rnk::launch(rnk_device *dev, const void *fn, Plan &pl, cudaStream_t st, char *msg,
                size_t msglen)
{
    int grid = 0;
    int rc = grid_for(dev, fn, pl, msg, msglen, &grid);
    if (rc)
        return rc;
#if RNK_TRACE
    trace_attach(pl.p, grid);
#endif
    void *args[] = {&pl.p};
    /* An error left by an earlier unchecked call must not be taken for
     * this launch's: the kernel would be queued (and write its done words)
     * while the caller is told it failed. */
    (void)cudaGetLastError();
    CK(cudaLaunchKernel(fn, dim3(grid), dim3(pl.threads), args, pl.smem, st));
    CK(cudaGetLastError());
    return RNK_OK;
}

extern "C" int rnk_cuda_bwd(const rnk_device *dev, const rnk_bwd_args *a, void *ws,
                            size_t ws_bytes_given, void *stream, char *msg, size_t msglen)
{
    Plan pl;
    int rc = plan(dev, a, ws, ws_bytes_given, &pl, msg, msglen);
    if (rc || a->m == 0)
        return rc;
    /* grid_for caches occupancy in dev; the cache is internal state, so the
     * const in the public signature holds for everything a caller sees. */
    return launch(const_cast<rnk_device *>(dev), production_fn(pl), pl, (cudaStream_t)stream, msg,
                  msglen);
}

extern "C" int rnk_cuda_check(const rnk_device *dev, const rnk_bwd_args *a, void *ws,
                              size_t ws_bytes_given, char *msg, size_t msglen)
{
    Plan pl;
    int rc = plan(dev, a, ws, ws_bytes_given, &pl, msg, msglen);
    if (rc || a->m == 0)
        return rc;
    /* (the grid as the launch will find it: grid_for's cache is internal) */
    int grid = 0;
    return grid_for(const_cast<rnk_device *>(dev), production_fn(pl), pl, msg, msglen, &grid);
}

/* bench_kernel --floor's empty kernel: a parameter as large as Params. */
struct EmptyArg {
    unsigned char b[sizeof(Params)];
};
static __global__ void empty_kernel(EmptyArg) {}

extern "C" int rnk_cuda_empty_launch(rnk_device *dev, const rnk_bwd_args *a, void *stream,
                                     char *msg, size_t msglen)
{
    int grid = 1, threads = 32;
    size_t smem = 0;
    if (a) {
        Plan pl;
        int rc = plan_grid(dev, a, &pl, &grid, msg, msglen);
        if (rc || a->m == 0)
            return rc;
        threads = pl.threads;
        smem = pl.smem;
    }
    if (smem > 48 * 1024)
        CK(cudaFuncSetAttribute((const void *)empty_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, dev->smem_per_block));
    EmptyArg arg;
    memset(&arg, 0, sizeof arg);
    empty_kernel<<<grid, threads, smem, (cudaStream_t)stream>>>(arg);
    CK(cudaGetLastError());
    return RNK_OK;
}

extern "C" int rnk_cuda_describe(rnk_device *dev, const rnk_bwd_args *a, char *buf, size_t len)
{
    char msg[160];
    Plan pl;
    int grid;
    int rc = plan_grid(dev, a, &pl, &grid, msg, sizeof msg);
    if (rc) {
        snprintf(buf, len, "%s", msg);
        return rc;
    }
    if (a->m == 0) {
        snprintf(buf, len, "m = 0: no launch");
        return RNK_OK;
    }
    static const char *const names[] = {"general", "ring", "s"};
    snprintf(buf, len, "%s nv=%d block=%d (G=%d x %d) grid=%d %s chunk=%lld nchunks=%d smem=%zu",
             names[pl.path], pl.path == PATH_GENERAL ? 0 : pl.path == PATH_S ? s_nv(pl.p.n) : pl.nv,
             pl.threads, pl.p.G, pl.p.tpr, grid, pl.il ? "il" : "contig", (long long)pl.p.C,
             pl.p.nchunks, pl.smem);
    return RNK_OK;
}
