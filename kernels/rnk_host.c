/* SPDX-License-Identifier: MIT */
/*
 * rnk_host.c - the host-side pieces both backends share: dtype sizes, argument
 * checks, the chunk geometry that fixes dw's summation order, bf16/fp16
 * conversions and the fp64 reference.  Pure C, no CUDA, no logging.
 */
#include "rnk.h"
#include "rnk_conv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t rnk_dtype_size(rnk_dtype dt)
{
    switch (dt) {
    case RNK_F32: return 4;
    case RNK_F16: return 2;
    case RNK_BF16: return 2;
    default: return 0;
    }
}

static int fail(char *msg, size_t msglen, const char *fmt, ...)
{
    if (msg && msglen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return RNK_EINVAL;
}

static int is_float_dtype(rnk_dtype dt)
{
    return dt == RNK_F32 || dt == RNK_F16 || dt == RNK_BF16;
}

int rnk_check_args(const rnk_bwd_args *a, char *msg, size_t msglen)
{
    if (!a)
        return fail(msg, msglen, "args: NULL");
    if (a->m < 0)
        return fail(msg, msglen, "m: %lld is negative", (long long)a->m);
    if (a->n < 1)
        return fail(msg, msglen, "n: %lld must be >= 1", (long long)a->n);
    if (!is_float_dtype(a->x_dtype))
        return fail(msg, msglen, "x_dtype: %d is not f32, f16 or bf16", (int)a->x_dtype);
    if (!is_float_dtype(a->dy_dtype))
        return fail(msg, msglen, "dy_dtype: %d is not f32, f16 or bf16", (int)a->dy_dtype);
    if (!is_float_dtype(a->dx_dtype))
        return fail(msg, msglen, "dx_dtype: %d is not f32, f16 or bf16", (int)a->dx_dtype);
    if (a->w_dtype != RNK_NONE && !is_float_dtype(a->w_dtype))
        return fail(msg, msglen, "w_dtype: %d is not none, f32, f16 or bf16", (int)a->w_dtype);
    if (a->dres_dtype != RNK_NONE && !is_float_dtype(a->dres_dtype))
        return fail(msg, msglen, "dres_dtype: %d is not none, f32, f16 or bf16",
                    (int)a->dres_dtype);
    /* dw is accumulated in fp32 and rounded once: to fp32, or to the weight's
     * own type.  Without a weight only fp32 makes sense. */
    if (a->dw_dtype != RNK_NONE && a->dw_dtype != RNK_F32 && a->dw_dtype != a->w_dtype)
        return fail(msg, msglen, "dw_dtype: %d must be none, f32 or w_dtype (%d)",
                    (int)a->dw_dtype, (int)a->w_dtype);
    if (a->x_stride < a->n)
        return fail(msg, msglen, "x_stride: %lld is less than n", (long long)a->x_stride);
    if (a->dy_stride < a->n)
        return fail(msg, msglen, "dy_stride: %lld is less than n", (long long)a->dy_stride);
    if (a->dx_stride < a->n)
        return fail(msg, msglen, "dx_stride: %lld is less than n", (long long)a->dx_stride);
    if (a->dres_dtype != RNK_NONE && a->dres_stride < a->n)
        return fail(msg, msglen, "dres_stride: %lld is less than n", (long long)a->dres_stride);
    /* Element offsets are computed as row * stride + col in int64_t. */
    if (a->m > 0) {
        int64_t maxs = a->x_stride;
        if (a->dy_stride > maxs) maxs = a->dy_stride;
        if (a->dx_stride > maxs) maxs = a->dx_stride;
        if (a->dres_dtype != RNK_NONE && a->dres_stride > maxs) maxs = a->dres_stride;
        if (a->m > INT64_MAX / 8 / maxs)
            return fail(msg, msglen, "m: %lld rows of stride %lld overflow", (long long)a->m,
                        (long long)maxs);
    }
    if (!a->rstd && !(isfinite(a->eps) && a->eps >= 0.0f))
        return fail(msg, msglen, "eps: must be finite and >= 0 when rstd is recomputed");
    if (!isfinite(a->weight_offset))
        return fail(msg, msglen, "weight_offset: must be finite");
    if (a->dw_dtype != RNK_NONE && !a->dw)
        return fail(msg, msglen, "dw: NULL but dw_dtype is set");
    if (a->done[1] && !a->done[0])
        return fail(msg, msglen, "done: done[1] is set but done[0] is NULL");
    if ((uintptr_t)a->done[0] % 8 || (uintptr_t)a->done[1] % 8)
        return fail(msg, msglen, "done: a word is not 8-byte aligned");
    if ((uintptr_t)a->gate % 8)
        return fail(msg, msglen, "gate: not 8-byte aligned");
    if (a->latch && (!a->gate || !a->latch_epoch))
        return fail(msg, msglen, "latch: set without a gate, or with epoch 0");
    if ((uintptr_t)a->latch % 8)
        return fail(msg, msglen, "latch: not 8-byte aligned");
    if (a->m == 0)
        return RNK_OK; /* a no-op: the row tensors may be absent */
    if (!a->x)
        return fail(msg, msglen, "x: NULL");
    if (!a->dy)
        return fail(msg, msglen, "dy: NULL");
    if (!a->dx)
        return fail(msg, msglen, "dx: NULL");
    if (a->w_dtype != RNK_NONE && !a->w)
        return fail(msg, msglen, "w: NULL but w_dtype is set");
    if (a->dres_dtype != RNK_NONE && !a->dres)
        return fail(msg, msglen, "dres: NULL but dres_dtype is set");
    /* In place means exactly in place: each row is read whole before it is
     * written.  Any other overlap is the caller's bug (the daemon checks
     * extents before it gets here); these are the cheap exact cases. */
    if (a->dx == a->dy && (a->dx_dtype != a->dy_dtype || a->dx_stride != a->dy_stride))
        return fail(msg, msglen, "dx: aliases dy with a different dtype or stride");
    if (a->dx == a->x)
        return fail(msg, msglen, "dx: aliases x");
    if (a->dres && a->dx == a->dres)
        return fail(msg, msglen, "dx: aliases dres");
    if (a->dw && (a->dw == a->x || a->dw == a->dy || a->dw == a->dx || a->dw == a->w))
        return fail(msg, msglen, "dw: aliases another tensor");
    return RNK_OK;
}

/*
 * Chunk geometry; both backends follow it, so dw is the same on both.
 * Which order a call takes: rnk_chunking (the end of this block).
 *
 * The contiguous order.  At most RNK_MAX_CHUNKS = 256 chunks: enough to give
 * every multiprocessor of a 132-SM H200 about two on small M, while the partial rows (written and
 * read once, 8 bytes per column per chunk, mostly in L2) stay a small
 * fraction of the 6 bytes per element of the main pass: 4/(3C), 0.5 % at
 * C = 256.  (Measured on the H200: 512 chunks were 10-25 % slower at M <=
 * 16384 and N <= 256 and no faster at N = 4096; only 65536 x 1024 gained,
 * and a wider block gains that too.)  C above RNK_MAX_STRIPES is a multiple
 * of it, so the stripes of a chunk stay equally long.  The workspace
 * (nchunks * G * n * 4 bytes) is capped at 256 MiB.
 *
 * A GPU block covers G rows of one chunk at once, one stripe each: the
 * largest power of two G <= RNK_MAX_STRIPES = 8 with G * n <= RNK_STRIPE_COLS
 * = 8192 (8 rows up to n = 1024, 4 at 2048), and a whole row alone from
 * RNK_WIDE_ROW = 4096 columns.  The stripes run independently (one warp each
 * up to 1024 bf16 columns, so no barrier per row there), and the wide block
 * keeps more bytes in flight per SM while the grid stays at one block per
 * chunk.  Measured on the H200 (bench/RESULTS.md, issue 15): 16 stripes of
 * one warp (registers capped for two such blocks a SM) were 2-9 % slower at
 * n = 256 than 8; two rows of 4096 columns made a ring too large for two
 * blocks a SM (12 % slower).
 */
#ifndef RNK_MAX_CHUNKS
#define RNK_MAX_CHUNKS 256
#endif
#ifndef RNK_STRIPE_COLS
#define RNK_STRIPE_COLS 8192
#endif
#ifndef RNK_MAX_STRIPES
#define RNK_MAX_STRIPES 8
#endif
#ifndef RNK_WIDE_ROW
#define RNK_WIDE_ROW 4096
#endif
/* Fewest rows a chunk takes when m allows (fewer, longer chunks for small m:
 * fewer partials for the finish to add).  32 with this kernel: the M = 4096
 * shapes 4-7 % faster, nothing else changed (bench/RESULTS.md). */
#ifndef RNK_MIN_CHUNK_ROWS
#define RNK_MIN_CHUNK_ROWS 32
#endif

int64_t rnk_chunk_rows(int64_t m, int64_t n)
{
    if (m <= 0 || n <= 0)
        return 1;
    int64_t maxchunks = RNK_MAX_CHUNKS;
    int64_t cap = ((int64_t)1 << 26) / (n * rnk_chunk_stripes(n));
    if (cap < maxchunks)
        maxchunks = cap < 1 ? 1 : cap;
    int64_t c = (m + maxchunks - 1) / maxchunks;
    if (c < RNK_MIN_CHUNK_ROWS)
        c = m < RNK_MIN_CHUNK_ROWS ? m : RNK_MIN_CHUNK_ROWS;
    if (c > RNK_MAX_STRIPES)
        c = (c + RNK_MAX_STRIPES - 1) / RNK_MAX_STRIPES * RNK_MAX_STRIPES;
    return c;
}

/* Stripes per GPU block: the largest power of two g <= RNK_MAX_STRIPES with
 * g * n <= RNK_STRIPE_COLS, or 1 (see above). */
int rnk_chunk_stripes(int64_t n)
{
    int g = 1;
    while (g < RNK_MAX_STRIPES && n < RNK_WIDE_ROW && n * g * 2 <= RNK_STRIPE_COLS)
        g *= 2;
    return g;
}

/*
 * The interleaved order (bwd_s.cuh's, issue 15's twelfth attempt, measured on
 * the H200: bench/RESULTS.md): P = 132 * k(n) chunks (k = 8 up to n = 1024,
 * 4 up to 2048, 2 up to 4096: one chunk per resident S block of a 132-SM
 * H200, a constant everywhere else; 1 beyond, where S's blocks of 1024
 * threads take one chunk each instead of two, half the partials: 1.2-3.5 %
 * faster at 8192 to 65536 x 8192 on an H100), at most m / 16, or m / 8
 * where that is no more (4096 x 2048, 8192 x 512 and 8192 x 1024: 512, 1024
 * and 1024 chunks of 8 rows, 0.4-6 % faster on an H100 than 256, 512 and 512
 * chunks of 16; m / 8 everywhere was 2-4 % slower at 16384 x 512 and 1024,
 * 1056 chunks against 1024, and 0-0.5 % at 4096 x 4096, 264 against 256);
 * chunk c holds rows c, c + P, ... (every chunk sees the same mix of the
 * tensor, and a block walks its rows with one stride); G = 4 at n <= 256, 2
 * at n <= 512, else 1.  Up to 1024 columns, S's blocks are since twice as
 * wide (rnk.h's RNK_S_RX): twice those G, half those P and half the cap (m
 * / 32, or m / 16), 2-5 % faster at 8192-65536 x 512 and 8192 x 1024 on an
 * H100 (fewer partials, one round of the finish's group loads); wider at
 * 2048 columns too was 1 % slower there.
 *
 * It applies to bf16 or fp16 rows (x, dy, dx of one of those), m >= n (m >=
 * n / 2 beyond 4096 columns), and 1024 < n <= 8192 with m * n >= 2^23:
 * where S was faster than the ring kernel under the contiguous order (4-12
 * % from 16384 rows and n >= 1024, 2-3 % at 4096 x 4096, 11 % at 8192 x
 * 1024; equal at 4096 x 2048; 4096 x 8192 with one chunk a block 7-8 %).
 * Up to 1024 columns the thresholds were set from S's measurements, and
 * set again once its blocks there were twice as wide: 512 < n <= 1024
 * from 2^22 and 256 < n <= 512 from 2^21 (4096 x 1024 5-7 %, 4096 x 512
 * 2-3 % faster than the ring kernel on an H100; with S's narrower blocks
 * they were 6-15 % and 10 % slower), 128 < n <= 256 from 2^20 (4096 x 256
 * 1 %, 8192 x 256 3-5 %, 16384 and 32768 x 256 5-6 % faster; with the
 * narrower blocks 4096 x 256 was 9 % slower and 32768 x 256 0.99-1.00,
 * while 65536 x 256 gained 2-4 %, where the ring kernel's 256 chunks on 132
 * SMs end 13 us apart).
 */
#ifndef RNK_IL_MIN_ROWS
#define RNK_IL_MIN_ROWS 16
#endif

/* log2 of the fewest elements m * n for each width class: n <= 256, <= 512,
 * <= 1024 and beyond (knobs for measuring the rule; production: 20, 21, 22,
 * 23) */
#ifndef RNK_IL_LOG2_256
#define RNK_IL_LOG2_256 20
#endif
#ifndef RNK_IL_LOG2_512
#define RNK_IL_LOG2_512 21
#endif
#ifndef RNK_IL_LOG2_1024
#define RNK_IL_LOG2_1024 22
#endif
#ifndef RNK_IL_LOG2_WIDE
#define RNK_IL_LOG2_WIDE 23
#endif

int rnk_chunk_interleaved(int64_t m, int64_t n, rnk_dtype x, rnk_dtype dy, rnk_dtype dx)
{
    if (!((x == RNK_BF16 || x == RNK_F16) && dy == x && dx == x &&
          (m >= n || (n > 4096 && 2 * m >= n)) && n > 128 && n <= 8192))
        return 0;
    return m * n >= ((int64_t)1 << (n <= 256    ? RNK_IL_LOG2_256
                                    : n <= 512  ? RNK_IL_LOG2_512
                                    : n <= 1024 ? RNK_IL_LOG2_1024
                                                : RNK_IL_LOG2_WIDE));
}

void rnk_chunking_of(int64_t m, int64_t n, rnk_dtype x, rnk_dtype dy, rnk_dtype dx,
                     rnk_chunking *c)
{
    if (m > 0 && rnk_chunk_interleaved(m, n, x, dy, dx)) {
        const int rx = n <= RNK_S_RX_MAXN ? RNK_S_RX : 1;
        int64_t p = 132 * (n <= 1024 ? 8 : n <= 2048 ? 4 : n <= 4096 ? 2 : 1) / rx;
        const int64_t cap = m / (RNK_IL_MIN_ROWS * rx); /* (m >= 2048 here) */
        if (p > cap)
            p = p >= 2 * cap ? 2 * cap : cap;
        c->interleaved = 1;
        c->stripes = (n <= 256 ? 4 : n <= 512 ? 2 : 1) * rx;
        c->nchunks = p;
        c->rows = 0;
        return;
    }
    c->interleaved = 0;
    c->stripes = rnk_chunk_stripes(n);
    c->rows = rnk_chunk_rows(m, n);
    c->nchunks = m > 0 ? (m + c->rows - 1) / c->rows : 1;
}

float rnk_load(rnk_dtype dt, const void *base, int64_t i)
{
    switch (dt) {
    case RNK_F32: return ((const float *)base)[i];
    case RNK_F16: return rnk_f16_to_f32(((const uint16_t *)base)[i]);
    case RNK_BF16: return rnk_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return 0.0f;
    }
}

void rnk_store(rnk_dtype dt, void *base, int64_t i, float v)
{
    switch (dt) {
    case RNK_F32: ((float *)base)[i] = v; break;
    case RNK_F16: ((uint16_t *)base)[i] = rnk_f32_to_f16(v); break;
    case RNK_BF16: ((uint16_t *)base)[i] = rnk_f32_to_bf16(v); break;
    default: break;
    }
}

/* ---- fp64 reference ------------------------------------------------------- */

int rnk_ref64_bwd(const rnk_bwd_args *a, double *dx_ref, double *dw_ref)
{
    int rc = rnk_check_args(a, NULL, 0);
    if (rc)
        return rc;
    int64_t m = a->m, n = a->n;
    if (dw_ref)
        for (int64_t j = 0; j < n; j++)
            dw_ref[j] = 0.0;
    for (int64_t i = 0; i < m; i++) {
        const int64_t xo = i * a->x_stride, yo = i * a->dy_stride;
        double rstd;
        if (a->rstd) {
            rstd = a->rstd[i];
        } else {
            double ss = 0.0;
            for (int64_t j = 0; j < n; j++) {
                double v = rnk_load(a->x_dtype, a->x, xo + j);
                ss += v * v;
            }
            rstd = 1.0 / sqrt(ss / (double)n + (double)a->eps);
        }
        double c = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double xh = rnk_load(a->x_dtype, a->x, xo + j) * rstd;
            double g = rnk_load(a->dy_dtype, a->dy, yo + j);
            if (a->w_dtype != RNK_NONE)
                g *= (double)rnk_load(a->w_dtype, a->w, j) + (double)a->weight_offset;
            c += xh * g;
        }
        c /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xh = rnk_load(a->x_dtype, a->x, xo + j) * rstd;
            double dy = rnk_load(a->dy_dtype, a->dy, yo + j);
            double g = dy;
            if (a->w_dtype != RNK_NONE)
                g *= (double)rnk_load(a->w_dtype, a->w, j) + (double)a->weight_offset;
            double d = rstd * (g - xh * c);
            if (a->dres_dtype != RNK_NONE)
                d += rnk_load(a->dres_dtype, a->dres, i * a->dres_stride + j);
            if (dx_ref)
                dx_ref[i * n + j] = d;
            if (dw_ref)
                dw_ref[j] += dy * xh;
        }
    }
    return RNK_OK;
}
