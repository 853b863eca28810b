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
 *
 * P = rnk_chunk_count(m, n) chunks, chunk c holding rows c, c + P, c + 2P, ...
 * (interleaved: every chunk sees the same mix of the tensor, and a GPU block
 * on chunk c walks the rows with one stride).  P is 132 times a multiplier of
 * n (16 up to n = 256, 8 up to 1024, 4 up to 2048, 2 beyond): one chunk per
 * resident block of the fast path's block shapes on a 132-SM H200, where it
 * was measured (bench/RESULTS.md), and a constant everywhere else; it never
 * depends on the device.  Capped so that a chunk has at least
 * RNK_MIN_CHUNK_ROWS rows when m allows (fewer partials for the finish) and
 * the workspace (P * G * n * 4 bytes) stays within 256 MiB.
 *
 * G = rnk_chunk_stripes(n): the rows a fast-path block works on at once, one
 * stripe of a warp each at n <= 256 (G = 4) or two warps at n <= 512
 * (G = 2); one row of up to 1024 threads beyond.
 */
#ifndef RNK_MIN_CHUNK_ROWS
#define RNK_MIN_CHUNK_ROWS 16
#endif

int64_t rnk_chunk_count(int64_t m, int64_t n)
{
    if (m <= 0 || n <= 0)
        return 1;
    int64_t p = n <= 256 ? 16 * 132 : n <= 1024 ? 8 * 132 : n <= 2048 ? 4 * 132 : 2 * 132;
    int64_t cap = m / RNK_MIN_CHUNK_ROWS;
    if (p > cap)
        p = cap;
    cap = ((int64_t)1 << 26) / (n * rnk_chunk_stripes(n));
    if (p > cap)
        p = cap;
    return p < 1 ? 1 : p;
}

int rnk_chunk_stripes(int64_t n)
{
    return n <= 256 ? 4 : n <= 512 ? 2 : 1;
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
