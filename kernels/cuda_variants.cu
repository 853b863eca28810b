/* SPDX-License-Identifier: MIT */
/*
 * cuda_variants.cu - the benchmark's comparison points, built only with
 * -DRNK_BENCH_VARIANTS=1 so that production builds carry none of their
 * template instantiations:
 *   SEPARATE: the fused kernel's first phase writes the partials, then a
 *             second kernel adds them (the seed's two-kernel path);
 *   ATOMIC:   chunk partials added into an fp32 accumulator with atomics,
 *             converted by whichever block completes the last chunk (the
 *             seed's fused, non-deterministic path).
 * Both reuse the production kernels (bwd_s.cuh, bwd_kernel.cuh) so that the
 * comparison measures only the way dw is finished.
 */
#include "cuda_launch.h"
#include "rnk_test.h"

#include <stdio.h>

using namespace rnk;

extern "C" size_t rnk_cuda_variant_workspace_size(const rnk_device *dev, int64_t m, int64_t n)
{
    (void)dev;
    return ws_bytes(m, n) + (size_t)(n + 3) / 4 * 16; /* + ATOMIC's accumulator */
}

#ifdef RNK_BENCH_VARIANTS

/* The production kernel of the plan's path (bf16 rows: S under the
 * interleaved order, the ring under the contiguous one) in another MODE. */
template <int MODE>
static const void *variant_fn(const Plan &pl)
{
    const bool wf = pl.p.w_dt == RNK_F32;
    if (pl.path == PATH_S)
        return s_fn<__nv_bfloat16, MODE>(pl.p.n);
    if (pl.nv == 1)
        return wf ? (const void *)fast_kernel<__nv_bfloat16, float, 1, MODE>
                  : (const void *)fast_kernel<__nv_bfloat16, __nv_bfloat16, 1, MODE>;
    if (pl.nv == 2)
        return wf ? (const void *)fast_kernel<__nv_bfloat16, float, 2, MODE>
                  : (const void *)fast_kernel<__nv_bfloat16, __nv_bfloat16, 2, MODE>;
    return wf ? (const void *)fast_kernel<__nv_bfloat16, float, 4, MODE>
              : (const void *)fast_kernel<__nv_bfloat16, __nv_bfloat16, 4, MODE>;
}

extern "C" int rnk_cuda_bwd_variant(rnk_device *dev, const rnk_bwd_args *a, void *ws,
                                    size_t wsb, int variant, void *stream, char *msg,
                                    size_t msglen)
{
    if (variant == RNK_VARIANT_FUSED)
        return rnk_cuda_bwd(dev, a, ws, wsb, stream, msg, msglen);
    Plan pl;
    int rc = plan(dev, a, ws, wsb, &pl, msg, msglen);
    if (rc || a->m == 0)
        return rc;
    if (pl.path == PATH_GENERAL || a->x_dtype != RNK_BF16 || !pl.p.dw) {
        snprintf(msg, msglen, "variant: only bf16 fast-path shapes with dw");
        return RNK_EINVAL;
    }
    if (a->done[0]) {
        snprintf(msg, msglen, "variant: done words are the production kernel's only");
        return RNK_EINVAL;
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (variant == RNK_VARIANT_SEPARATE) {
        /* First kernel: no finish tile needed (ring: only w, the ring and the
         * stripe combine, which reuses the ring; S: nothing dynamic). */
        size_t comb = pl.p.G > 1 ? (size_t)pl.p.G * (size_t)a->n * 4 : 0;
        if (pl.path == PATH_RING)
            pl.smem = fast_smem(pl, comb);
        rc = launch(dev, variant_fn<MODE_PARTIALS_ONLY>(pl), pl, st, msg, msglen);
        if (rc)
            return rc;
        int grid = pl.p.nslices < 4 * rnk_cuda_sm_count(dev) ? pl.p.nslices
                                                              : 4 * rnk_cuda_sm_count(dev);
        void *args[] = {&pl.p};
        const size_t tile = pl.il ? 0
                                  : (size_t)(pl.p.nchunks < FIN_BATCH ? pl.p.nchunks : FIN_BATCH) *
                                        FIN_COLS * 4;
        CK(cudaLaunchKernel(pl.il ? (const void *)finish_kernel<true>
                                  : (const void *)finish_kernel<false>,
                            dim3(grid), dim3(256), args, tile, st));
        CK(cudaGetLastError());
        return RNK_OK;
    }
    if (variant == RNK_VARIANT_ATOMIC) {
        if (wsb < rnk_cuda_variant_workspace_size(dev, a->m, a->n)) {
            snprintf(msg, msglen, "variant: ws smaller than rnk_cuda_variant_workspace_size()");
            return RNK_EINVAL;
        }
        pl.p.acc = (float *)((char *)ws + ws_bytes(a->m, a->n));
        /* The ring's stripe combine runs through shared memory for every G here. */
        if (pl.path == PATH_RING)
            pl.smem = fast_smem(pl, (size_t)pl.p.G * (size_t)a->n * 4);
        return launch(dev, variant_fn<MODE_ATOMIC>(pl), pl, st, msg, msglen);
    }
    snprintf(msg, msglen, "variant: %d unknown", variant);
    return RNK_EINVAL;
}

/* ---- bench_kernel --floor's streaming kernels: dx = x + dy ------------------
 * The bytes the backward moves (less rstd, w and dw) and nothing else to do.
 * RNK_ADD_FLAT: one 256-thread block per 1024 16-byte vectors, a thread's
 * four of x and four of dy in flight at once, blocks retiring as they end.
 * The others take the production S plan's grid, block and threads a row
 * (one chunk a block: block b walks rows b, b + grid, ... as S's
 * interleaved chunks do), S's loads and stores, and rows through registers:
 * RNK_ADD_S the next row in flight while one is added (S's pipeline),
 * RNK_ADD_S_BAR and a block barrier a row (S's row exchange),
 * RNK_ADD_S_AHEAD2 two rows in flight, RNK_ADD_S_GRID2 twice the grid. */
static __device__ __forceinline__ uint4 add_bf16x8(uint4 a, uint4 b)
{
    uint4 o;
    const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
    __nv_bfloat162 *po = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
    for (int j = 0; j < 4; j++)
        po[j] = __hadd2(pa[j], pb[j]);
    return o;
}

enum { ADD_T = 256, ADD_U = 4 };
static __global__ void __launch_bounds__(ADD_T)
    add_flat(const uint4 *__restrict__ x, const uint4 *__restrict__ dy, uint4 *__restrict__ dx,
             int64_t nvec)
{
    const int64_t base = (int64_t)blockIdx.x * (ADD_T * ADD_U) + threadIdx.x;
    uint4 a[ADD_U], b[ADD_U];
#pragma unroll
    for (int k = 0; k < ADD_U; k++) {
        const int64_t i = base + k * ADD_T;
        a[k] = b[k] = make_uint4(0, 0, 0, 0);
        if (i < nvec) {
            a[k] = __ldg(x + i);
            b[k] = __ldg(dy + i);
        }
    }
#pragma unroll
    for (int k = 0; k < ADD_U; k++) {
        const int64_t i = base + k * ADD_T;
        if (i < nvec)
            dx[i] = add_bf16x8(a[k], b[k]);
    }
}

template <int NV, int A, bool BAR>
static __global__ void __launch_bounds__(NV == 1 ? 1024 : 512) /* (S's largest blocks) */
    add_s(const char *__restrict__ x, const char *__restrict__ dy, char *__restrict__ dx,
          int64_t m, int n, int tpr)
{
    const int R = (int)blockDim.x / tpr, grp = (int)threadIdx.x / tpr, lt = (int)threadIdx.x % tpr;
    const int col = lt * 8, cs = tpr * 8;
    const int64_t G = gridDim.x, b = blockIdx.x;
    const int64_t rows = (m - b + G - 1) / G, iters = (rows + R - 1) / R;
    uint4 bx[A + 1][NV], by[A + 1][NV];
    auto load = [&](int s, int64_t t) {
        const int64_t j = t * R + grp;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            bx[s][v] = by[s][v] = make_uint4(0, 0, 0, 0);
            if (t < iters && j < rows && col + v * cs < n) {
                const int64_t o = ((b + j * G) * n + col + v * cs) * 2;
                bx[s][v] = ldnc16(x + o);
                by[s][v] = ldnc16(dy + o);
            }
        }
    };
#pragma unroll
    for (int s = 0; s < A; s++)
        load(s, s);
    for (int64_t t0 = 0; t0 < iters; t0 += A + 1) {
#pragma unroll
        for (int s = 0; s <= A; s++) {
            const int64_t t = t0 + s, j = t * R + grp;
            if (t >= iters) /* (the same for the whole block) */
                break;
            load((s + A) % (A + 1), t + A);
            if (j < rows)
#pragma unroll
                for (int v = 0; v < NV; v++)
                    if (col + v * cs < n)
                        st16(dx + ((b + j * G) * n + col + v * cs) * 2,
                             add_bf16x8(bx[s][v], by[s][v]));
            if (BAR)
                __syncthreads();
        }
    }
}

template <int NV>
static const void *add_s_fn(int how)
{
    switch (how) {
    case RNK_ADD_S_BAR: return (const void *)add_s<NV, 1, true>;
    case RNK_ADD_S_AHEAD2: return (const void *)add_s<NV, 2, false>;
    default: return (const void *)add_s<NV, 1, false>;
    }
}

extern "C" int rnk_cuda_add_launch(rnk_device *dev, const rnk_bwd_args *a, int how, void *stream,
                                   char *msg, size_t msglen)
{
    const uintptr_t addr = (uintptr_t)a->x | (uintptr_t)a->dy | (uintptr_t)a->dx;
    if (a->x_dtype != RNK_BF16 || a->dy_dtype != RNK_BF16 || a->dx_dtype != RNK_BF16 ||
        a->m < 0 || a->n % 8 || a->x_stride != a->n || a->dy_stride != a->n ||
        a->dx_stride != a->n || addr % 16) {
        snprintf(msg, msglen,
                 "add: contiguous bf16 rows of a multiple of 8 columns, 16-byte aligned, only");
        return RNK_EINVAL;
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (how == RNK_ADD_FLAT) {
        const int64_t nvec = a->m * a->n / 8;
        if (nvec == 0)
            return RNK_OK;
        const int64_t grid = (nvec + ADD_T * ADD_U - 1) / (ADD_T * ADD_U);
        add_flat<<<(unsigned)grid, ADD_T, 0, st>>>((const uint4 *)a->x, (const uint4 *)a->dy,
                                                   (uint4 *)a->dx, nvec);
        CK(cudaGetLastError());
        return RNK_OK;
    }
    Plan pl;
    int grid;
    int rc = plan_grid(dev, a, &pl, &grid, msg, msglen);
    if (rc || a->m == 0)
        return rc;
    if (pl.path != PATH_S || how < RNK_ADD_S || how > RNK_ADD_S_GRID2) {
        snprintf(msg, msglen, "add: the S plan's shapes only (how = %d)", how);
        return RNK_EINVAL;
    }
    if (how == RNK_ADD_S_GRID2)
        grid *= 2;
    const int nv = s_nv(a->n), tpr = pl.p.tpr, n = (int)a->n;
    const void *fn = nv == 1 ? add_s_fn<1>(how) : add_s_fn<2>(how);
    const char *x = (const char *)a->x, *dy = (const char *)a->dy;
    char *dx = (char *)a->dx;
    int64_t m = a->m;
    void *args[] = {&x, &dy, &dx, &m, (void *)&n, (void *)&tpr};
    CK(cudaLaunchKernel(fn, dim3((unsigned)grid), dim3((unsigned)pl.threads), args, 0, st));
    CK(cudaGetLastError());
    return RNK_OK;
}

#else

extern "C" int rnk_cuda_add_launch(rnk_device *dev, const rnk_bwd_args *a, int how, void *stream,
                                   char *msg, size_t msglen)
{
    (void)dev, (void)a, (void)how, (void)stream;
    snprintf(msg, msglen, "add: not built (needs NVCCFLAGS=-DRNK_BENCH_VARIANTS=1)");
    return RNK_EINVAL;
}

extern "C" int rnk_cuda_bwd_variant(rnk_device *dev, const rnk_bwd_args *a, void *ws,
                                    size_t wsb, int variant, void *stream, char *msg,
                                    size_t msglen)
{
    (void)dev, (void)a, (void)ws, (void)wsb, (void)variant, (void)stream;
    snprintf(msg, msglen, "variant: not built (needs NVCCFLAGS=-DRNK_BENCH_VARIANTS=1)");
    return RNK_EINVAL;
}

#endif
