/* SPDX-License-Identifier: MIT */
/*
 * rnk_test.h - helpers of kernels/ for the tests and the benchmarks, not for
 * the daemon: issue 3's accuracy verdict (rnk_verify.c), the GPU's fp64
 * reference, random fill and SM hog (ref64.cu), a launch's description and
 * the benchmark-only variants (cuda_variants.cu), whose state lives in a
 * workspace of their own size.  Includes rnk.h.
 */
#ifndef RNK_TEST_H
#define RNK_TEST_H

#include "rnk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- accuracy verdict (rnk_verify.c) ------------------------------------ */

/*
 * Judge a's outputs (dx, and dw when requested) against the fp64 reference
 * with issue 3's tolerances:
 *   dx bf16/fp16: within 1 ulp of the correctly rounded reference for
 *                 >= 99.99 % of the elements, within 2 ulp for all;
 *   dx fp32:      ||dx - ref|| / ||ref|| <= 1e-5;
 *   dw fp32:      relative norm error <= 1e-5; dw bf16/fp16: as dx bf16/fp16.
 * A non-finite output where the reference is finite (an unwritten, poisoned
 * element) always fails.  The ulp bounds are relaxed only for elements whose
 * value cancels below fp32's own forward error: no fp32 implementation can
 * hold 2 ulp there, so an element also passes when its error is within
 * 64 * 2^-24 * rstd * (|g| + |xhat| * (|c| + mean|xhat*g|)) + |dres|'s share
 * (dw: a chain-length multiple of 2^-24 * sum|dy * xhat|); the relative norm
 * errors likewise count only the error beyond that floor.  dx_ref is [m*n],
 * row stride n; dw_ref may be NULL when dw is not wanted.  The inputs are
 * read through a: after an in-place run (dx == dy) pass args whose dy points
 * at a copy of the original dy.
 */
typedef struct rnk_verdict {
    int ok;                /* 1: every tolerance holds */
    int64_t dx_count;      /* elements compared */
    int64_t dx_nonfinite;  /* finite where the reference is not, or the other way,
                            * or a different NaN/infinity class */
    int64_t dx_over1;      /* 16-bit dx beyond 1 ulp (and the cancellation floor) */
    int64_t dx_over2;      /* ... beyond 2 ulp */
    double dx_max_ulp;     /* largest ulp distance seen (16-bit dx) */
    double dx_rel;         /* relative norm error of dx */
    int64_t dw_nonfinite, dw_over1, dw_over2;
    double dw_rel;         /* relative norm error of dw */
    char why[200];         /* first failed tolerance, or "" */
} rnk_verdict;

int rnk_verify(const rnk_bwd_args *a, const double *dx_ref, const double *dw_ref,
               rnk_verdict *v);

/*
 * The verdict step on its own, for callers that count dx's errors elsewhere
 * (rnk_cuda_verify counts them on the GPU): v's dx fields are filled in;
 * this sets v->ok and v->why from them and judges dw (host copy dw, fp64
 * reference dw_ref and sum |dy * xhat| per column dw_abs; dw NULL: no dw).
 */
void rnk_judge(const rnk_bwd_args *a, rnk_verdict *v, const void *dw, const double *dw_ref,
               const double *dw_abs);

/* Round v correctly (to nearest, ties to even) to a 16-bit dtype and return
 * the bits; and the ulp distance between two 16-bit values of dtype dt. */
uint16_t rnk_round16(rnk_dtype dt, double v);
int64_t rnk_ulp_dist16(rnk_dtype dt, uint16_t a, uint16_t b);

/* ---- GPU test helpers (kernels/ref64.cu): an fp64 reference written
 * separately from the production kernel, for shapes the CPU is too slow for.
 * All pointers in a, dx_ref and dw_ref are device pointers. */

/* dx_ref [m*n] and dw_ref [n] (either may be NULL), synchronously. */
int rnk_cuda_ref64(const rnk_bwd_args *a, double *dx_ref, double *dw_ref, void *stream,
                   char *msg, size_t msglen);
/* Judge a's device outputs exactly as rnk_verify does, synchronously. */
int rnk_cuda_verify(const rnk_bwd_args *a, void *stream, rnk_verdict *v, char *msg,
                    size_t msglen);

/* Fill rows x cols (row stride in elements) with hashed pseudo-random values
 * around bias (never all zeros), asynchronously on stream. */
int rnk_cuda_fill(rnk_dtype dt, void *p, int64_t rows, int64_t cols, int64_t stride,
                  uint64_t seed, float scale, float bias, void *stream, char *msg, size_t msglen);
/* rstd of each row of x, from an fp64 sum, rounded to fp32, asynchronously. */
int rnk_cuda_rstd(rnk_dtype dt, const void *x, int64_t m, int64_t n, int64_t stride, float eps,
                  float *out_rstd, void *stream, char *msg, size_t msglen);
/* Occupy `blocks` SMs (one block each, holding all of an SM's shared memory)
 * until *stop (host-mapped memory) becomes non-zero or timeout_ms passes;
 * *started (host-mapped) becomes 1 once the first block runs. */
int rnk_cuda_hog(int blocks, const int *stop, int *started, unsigned timeout_ms, void *stream,
                 char *msg, size_t msglen);

/* ---- launch details ------------------------------------------------------ */

int rnk_cuda_sm_count(const rnk_device *dev);

/*
 * One line describing the launch rnk_cuda_bwd would make for a: path (fast
 * with its vector count, or general), block size, grid, chunk geometry.
 */
int rnk_cuda_describe(rnk_device *dev, const rnk_bwd_args *a, char *buf, size_t len);
/* An empty kernel launched with the grid, block, dynamic shared memory and
 * parameter size rnk_cuda_bwd would launch a's with (one warp, nothing else,
 * when a is NULL): the launch's own cost, for bench_kernel --floor. */
int rnk_cuda_empty_launch(rnk_device *dev, const rnk_bwd_args *a, void *stream, char *msg,
                          size_t msglen);
/* dx = x + dy over a's rows (contiguous bf16, n a multiple of 8, 16-byte
 * aligned; else RNK_EINVAL): streaming kernels moving the bytes the backward
 * moves, for bench_kernel --floor (kernels/cuda_variants.cu, a build with
 * -DRNK_BENCH_VARIANTS=1 only).  how: RNK_ADD_FLAT, a plain one; the others
 * (shapes of the S plan only, else RNK_EINVAL) with the S plan's grid, block
 * and rows through registers: the next row in flight (RNK_ADD_S), and a
 * block barrier a row (_BAR), two rows in flight (_AHEAD2), twice the grid
 * (_GRID2). */
enum { RNK_ADD_FLAT, RNK_ADD_S, RNK_ADD_S_BAR, RNK_ADD_S_AHEAD2, RNK_ADD_S_GRID2, RNK_ADD_HOWS };
int rnk_cuda_add_launch(rnk_device *dev, const rnk_bwd_args *a, int how, void *stream, char *msg,
                        size_t msglen);

/* ---- benchmark-only variants (kernels/cuda_variants.cu) ------------------
 * Compiled only with NVCCFLAGS=-DRNK_BENCH_VARIANTS=1 (bench/run_kernel.sh
 * does this); otherwise rnk_cuda_bwd_variant returns RNK_EINVAL.  Fast path
 * shapes with bf16 rows only.
 *   SEPARATE: the same kernel writes partials, a second kernel finishes dw;
 *   ATOMIC:   dw finished with fp32 atomics (non-deterministic).
 */
enum { RNK_VARIANT_FUSED = 0, RNK_VARIANT_SEPARATE = 1, RNK_VARIANT_ATOMIC = 2 };
/* The variants' workspace: the production one, then ATOMIC's fp32
 * accumulator [n] (zeroed by rnk_cuda_workspace_init, zero again after each
 * ATOMIC launch). */
size_t rnk_cuda_variant_workspace_size(const rnk_device *dev, int64_t m, int64_t n);
int rnk_cuda_bwd_variant(rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                         int variant, void *stream, char *msg, size_t msglen);

/* ---- per-block timelines (benchmark only: -DRNK_TRACE=1) ----------------
 * With -DRNK_TRACE=1 (bwd_kernel.cuh's knob list; build bench_kernel with
 * bench/build_variants.sh DEST T='-DRNK_TRACE=1') the fused kernel's thread
 * 0 of each block stores %globaltimer (ns) at its phase boundaries into a
 * buffer set with rnk_cuda_set_trace, which every later launch through
 * rnk_cuda_bwd (or a variant) uses until it is set again (NULL: off).  Not
 * thread safe: for one benchmark thread.  Layout: a rnk_trace_head, then
 * head.blocks_cap rnk_trace_block (block b at index b), then
 * head.chunks_cap rnk_trace_chunk (chunk k at index k); a launch whose grid
 * or chunk count exceeds what the buffer holds records the first ones only.
 * Nothing is cleared: zero the buffer before the launch, so that 0 reads as
 * "not reached" (a cancelled launch's blocks never reach T1 and T2).
 *   T0 entry; T1 setup done (cancel check, w staged, first claim known);
 *   T2 claim loop done (its last chunk published); T3 every chunk done (the
 *   wait on CTR_DONE; = T4 when the block has no fused finish slice, and
 *   then it does not wait); T4 its finish slices done; T5 after its exit
 *   count (and the last block's reset). */
#define RNK_TRACE_MAGIC 0x524e4b54u /* "RNKT" */
typedef struct rnk_trace_head {
    uint32_t magic;   /* RNK_TRACE_MAGIC once block 0 has started */
    uint32_t grid, threads, nchunks, nslices, G, tpr;
    uint32_t kind;    /* 1 fast path, 2 general; | nv << 4 | mode << 8 (0 fused) */
    uint32_t blocks_cap, chunks_cap;
    uint32_t pad[6];
} rnk_trace_head;
typedef struct rnk_trace_block {
    uint64_t t[6];    /* %globaltimer at T0 .. T5; 0: not reached */
    uint32_t chunks;  /* chunks the block processed (written at T2) */
    uint32_t smid;    /* %smid (written at T0) */
    uint64_t tg;      /* %globaltimer when its finish's group sums were in shared
                       * memory (its last slice's; 0: it finished none): T3 .. tg
                       * the groups' loads and sums, tg .. T4 the column sums */
} rnk_trace_block;
typedef struct rnk_trace_chunk {
    uint64_t t;       /* %globaltimer just after the chunk's publish (or its end) */
    uint32_t block;   /* the block that processed it */
    uint32_t pad;
} rnk_trace_chunk;

#if defined(RNK_TRACE) && RNK_TRACE
/* Bytes of a buffer that holds a whole launch of rnk_cuda_bwd(dev, a). */
size_t rnk_cuda_trace_bytes(rnk_device *dev, const rnk_bwd_args *a);
/* The buffer (device memory, 16-byte aligned) the next launches record
 * into; NULL or too small for the head: no tracing. */
void rnk_cuda_set_trace(void *buf, size_t bytes);
#endif

#ifdef __cplusplus
}
#endif

#endif /* RNK_TEST_H */
