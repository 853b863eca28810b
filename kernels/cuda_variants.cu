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

#else

extern "C" int rnk_cuda_bwd_variant(rnk_device *dev, const rnk_bwd_args *a, void *ws,
                                    size_t wsb, int variant, void *stream, char *msg,
                                    size_t msglen)
{
    (void)dev, (void)a, (void)ws, (void)wsb, (void)variant, (void)stream;
    snprintf(msg, msglen, "variant: not built (needs NVCCFLAGS=-DRNK_BENCH_VARIANTS=1)");
    return RNK_EINVAL;
}

#endif
