/* SPDX-License-Identifier: MIT */
/*
 * bench_problem.h - the end-to-end benchmarks' problem (bench_e2e_cuda's
 * clients, bench_ipcmem): bf16 x, dy, dx and w, fp32 dw, rstd given, rows
 * contiguous; its allocations, where each tensor lies in them, and its
 * random inputs.  Each tensor starts on a 256-byte boundary.  In one
 * allocation (split 0) or, split, x, dy and dx each at the start of an
 * allocation of its own and w, dw and rstd in a fourth (as PyTorch's
 * caching allocator gives large tensors their own segments).
 * Header-only (static inline).
 */
#ifndef BENCH_PROBLEM_H
#define BENCH_PROBLEM_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rnk.h"
#include "rnk_test.h"

#define BP_PARTS 4

static inline size_t bp_round(size_t b)
{
    return (b + 255) / 256 * 256;
}

/* The sizes of the allocations (bytes[0 .. returned count)). */
static inline int bp_parts(int64_t m, int64_t n, int split, size_t bytes[BP_PARTS])
{
    size_t big = bp_round((size_t)(m * n) * 2);
    size_t rest = bp_round((size_t)n * 2) + bp_round((size_t)n * 4) + bp_round((size_t)m * 4);
    if (!split) {
        bytes[0] = 3 * big + rest;
        return 1;
    }
    bytes[0] = bytes[1] = bytes[2] = big;
    bytes[3] = rest;
    return BP_PARTS;
}

/* k for m x n with its tensors in the allocations at base (bp_parts' count
 * of them). */
static inline void bp_place(rnk_bwd_args *k, char *const base[BP_PARTS], int64_t m, int64_t n,
                            int split)
{
    size_t big = bp_round((size_t)(m * n) * 2);
    char *rest = split ? base[3] : base[0] + 3 * big;

    memset(k, 0, sizeof *k);
    k->m = m;
    k->n = n;
    k->x_dtype = k->dy_dtype = k->dx_dtype = k->w_dtype = RNK_BF16;
    k->dw_dtype = RNK_F32;
    k->x_stride = k->dy_stride = k->dx_stride = n;
    k->eps = 1e-6f;
    k->x = base[0];
    k->dy = split ? base[1] : base[0] + big;
    k->dx = split ? base[2] : base[0] + 2 * big;
    k->w = rest;
    k->dw = rest + bp_round((size_t)n * 2);
    k->rstd = (const float *)(rest + bp_round((size_t)n * 2) + bp_round((size_t)n * 4));
}

/* Random x (seed), dy (seed + 1), w (seed + 2) and x's rstd, on st.  Returns
 * 0 or non-zero with msg. */
static inline int bp_fill(const rnk_bwd_args *k, uint64_t seed, cudaStream_t st, char *msg,
                          size_t len)
{
    int64_t m = k->m, n = k->n;
    return rnk_cuda_fill(RNK_BF16, (void *)k->x, m, n, n, seed, 1.0f, 0.1f, st, msg, len) ||
           rnk_cuda_fill(RNK_BF16, (void *)k->dy, m, n, n, seed + 1, 1.0f, 0.0f, st, msg, len) ||
           rnk_cuda_fill(RNK_BF16, (void *)k->w, 1, n, n, seed + 2, 0.5f, 1.0f, st, msg, len) ||
           rnk_cuda_rstd(RNK_BF16, k->x, m, n, n, k->eps, (float *)k->rstd, st, msg, len);
}

#endif
