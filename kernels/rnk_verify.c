/* SPDX-License-Identifier: MIT */
/*
 * rnk_verify.c - judging a backend's outputs against the fp64 reference with
 * issue 3's tolerances (see rnk_verify in rnk.h).  Shared by the CPU and GPU
 * tests and the CLI's selftest so that every one of them applies the same
 * rule.  Pure C, host only.
 */
#include "rnk_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t ord16(uint16_t h)
{
    int64_t mag = h & 0x7fff;
    return (h & 0x8000) ? -mag : mag;
}

static uint16_t from_ord16(int64_t o)
{
    return o < 0 ? (uint16_t)(0x8000 | (uint16_t)(-o)) : (uint16_t)o;
}

static double val16(rnk_dtype dt, uint16_t h)
{
    return (double)rnk_load(dt, &h, 0);
}

uint16_t rnk_round16(rnk_dtype dt, double v)
{
    uint16_t h;
    if (isnan(v)) {
        rnk_store(dt, &h, 0, NAN);
        return h;
    }
    /* (float)v is within half a float ulp of v, so the correctly rounded
     * 16-bit value is one of the few 16-bit neighbours of (float)v truncated;
     * pick the nearest by exact comparison in double, ties to even. */
    float f = (float)v;
    if (isinf(f)) {
        rnk_store(dt, &h, 0, f);
        return h;
    }
    uint16_t t;
    if (dt == RNK_BF16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        t = (uint16_t)(u >> 16);
    } else {
        rnk_store(dt, &t, 0, f); /* nearest; a neighbour search fixes ties */
    }
    int64_t o0 = ord16(t), best = o0;
    double bestd = INFINITY;
    for (int64_t d = -2; d <= 2; d++) {
        int64_t o = o0 + d;
        uint16_t c = from_ord16(o);
        double cv = val16(dt, c);
        if (!isfinite(cv))
            continue;
        double dist = fabs(v - cv);
        if (dist < bestd || (dist == bestd && (c & 1) == 0)) {
            bestd = dist;
            best = o;
        }
    }
    /* Beyond the largest finite value plus half an ulp: infinity. */
    uint16_t bh = from_ord16(best);
    if ((bh & 0x7fff) == 0 && signbit(v)) /* ordinals merge -0 and +0 */
        bh = 0x8000;
    double bv = val16(dt, bh);
    uint16_t nx = from_ord16(best < 0 ? best - 1 : best + 1);
    double nv = val16(dt, nx);
    if (isinf(nv)) {
        /* half the last finite ulp above the largest finite value */
        double prev = val16(dt, from_ord16(best < 0 ? best + 1 : best - 1));
        double half = fabs(bv - prev) / 2;
        if (fabs(v) >= fabs(bv) + half)
            return nx;
    }
    return bh;
}

int64_t rnk_ulp_dist16(rnk_dtype dt, uint16_t a, uint16_t b)
{
    (void)dt;
    int64_t d = ord16(a) - ord16(b);
    return d < 0 ? -d : d;
}

/*
 * An output that is not finite must match a reference that is not finite
 * (NaN for NaN, the same infinity), and the other way round.  Without this a
 * NaN reference would make every error comparison false, and any output
 * would pass.  Returns 1 for a mismatch, 0 for two equal non-finite values,
 * -1 when both are finite (compare them as numbers).
 */
static int nonfinite_cmp(double got, double ref)
{
    if (isfinite(got) && isfinite(ref))
        return -1;
    if (isnan(got) || isnan(ref))
        return isnan(got) != isnan(ref);
    return got != ref;
}

static double ld(rnk_dtype dt, const void *p, int64_t i)
{
    return (double)rnk_load(dt, p, i);
}

static void why(rnk_verdict *v, const char *fmt, double x, double y)
{
    if (v->why[0] == '\0')
        snprintf(v->why, sizeof v->why, fmt, x, y);
}

void rnk_judge(const rnk_bwd_args *a, rnk_verdict *v, const void *dw, const double *dw_ref,
               const double *dws)
{
    const int64_t m = a->m, n = a->n;
    const int dx16 = a->dx_dtype != RNK_F32;
    const double u24 = 0x1p-24;
    v->why[0] = '\0';
    v->ok = 1;
    if (v->dx_nonfinite) {
        v->ok = 0;
        why(v, "dx: %.0f non-finite elements (unwritten?) of %.0f", (double)v->dx_nonfinite,
            (double)v->dx_count);
    }
    if (dx16) {
        if (v->dx_over2) {
            v->ok = 0;
            why(v, "dx: %.0f elements beyond 2 ulp (max %.0f ulp)", (double)v->dx_over2,
                v->dx_max_ulp);
        }
        if ((double)v->dx_over1 > 1e-4 * (double)v->dx_count) {
            v->ok = 0;
            why(v, "dx: %.0f elements beyond 1 ulp, more than 0.01 %% of %.0f",
                (double)v->dx_over1, (double)v->dx_count);
        }
    } else if (!(v->dx_rel <= 1e-5)) {
        v->ok = 0;
        why(v, "dx: relative norm error %.3g > %g", v->dx_rel, 1e-5);
    }

    if (dw && dw_ref && dws) {
        rnk_chunking ch;
        rnk_chunking_of(m, n, a->x_dtype, a->dy_dtype, a->dx_dtype, &ch);
        const int64_t nch = ch.nchunks, C = ch.interleaved ? (m + nch - 1) / nch : ch.rows;
        const double chain = (double)(C + ch.stripes + nch + 8);
        double we2 = 0.0, wr2 = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double ref = dw_ref[j];
            double got = ld(a->dw_dtype, dw, j);
            int nf = nonfinite_cmp(got, ref);
            if (nf >= 0) {
                v->dw_nonfinite += nf;
                continue;
            }
            double wslack = chain * u24 * dws[j];
            double ex = fabs(got - ref) > wslack ? fabs(got - ref) - wslack : 0.0;
            we2 += ex * ex;
            wr2 += ref * ref;
            if (a->dw_dtype != RNK_F32) {
                uint16_t gh, rh = rnk_round16(a->dw_dtype, ref);
                memcpy(&gh, (const char *)dw + (size_t)j * 2, 2);
                int64_t u = rnk_ulp_dist16(a->dw_dtype, gh, rh);
                if (fabs(got - ref) > wslack) {
                    if (u > 1)
                        v->dw_over1++;
                    if (u > 2)
                        v->dw_over2++;
                }
            }
        }
        v->dw_rel = wr2 > 0 ? sqrt(we2 / wr2) : sqrt(we2);
        if (v->dw_nonfinite) {
            v->ok = 0;
            why(v, "dw: %.0f non-finite elements (unwritten?) of %.0f", (double)v->dw_nonfinite,
                (double)n);
        }
        if (a->dw_dtype == RNK_F32) {
            if (!(v->dw_rel <= 1e-5)) {
                v->ok = 0;
                why(v, "dw: relative norm error %.3g > %g", v->dw_rel, 1e-5);
            }
        } else {
            if (v->dw_over2) {
                v->ok = 0;
                why(v, "dw: %.0f elements beyond 2 ulp of %.0f", (double)v->dw_over2, (double)n);
            }
            if ((double)v->dw_over1 > 1e-4 * (double)n) {
                v->ok = 0;
                why(v, "dw: %.0f elements beyond 1 ulp of %.0f", (double)v->dw_over1, (double)n);
            }
        }
    }
}

int rnk_verify(const rnk_bwd_args *a, const double *dx_ref, const double *dw_ref,
               rnk_verdict *out)
{
    int rc = rnk_check_args(a, NULL, 0);
    if (rc)
        return rc;
    rnk_verdict v;
    memset(&v, 0, sizeof v);
    const int64_t m = a->m, n = a->n;
    const int want_dw = a->dw_dtype != RNK_NONE && dw_ref && m > 0;
    const int dx16 = a->dx_dtype != RNK_F32;
    double *dws = want_dw ? calloc((size_t)n, sizeof(double)) : NULL;
    if (want_dw && !dws)
        return RNK_ENOMEM;
    double e2 = 0.0, r2 = 0.0;
    const double u24 = 0x1p-24;
    for (int64_t i = 0; i < m; i++) {
        const int64_t xo = i * a->x_stride, yo = i * a->dy_stride;
        double rstd;
        if (a->rstd) {
            rstd = a->rstd[i];
        } else {
            double ss = 0.0;
            for (int64_t j = 0; j < n; j++)
                ss += ld(a->x_dtype, a->x, xo + j) * ld(a->x_dtype, a->x, xo + j);
            rstd = 1.0 / sqrt(ss / (double)n + (double)a->eps);
        }
        double c = 0.0, A = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double g = ld(a->dy_dtype, a->dy, yo + j);
            if (a->w_dtype != RNK_NONE)
                g *= ld(a->w_dtype, a->w, j) + (double)a->weight_offset;
            double p = ld(a->x_dtype, a->x, xo + j) * rstd * g;
            c += p;
            A += fabs(p);
        }
        c /= (double)n;
        A /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xh = ld(a->x_dtype, a->x, xo + j) * rstd;
            double dy = ld(a->dy_dtype, a->dy, yo + j);
            double g = dy;
            if (a->w_dtype != RNK_NONE)
                g *= ld(a->w_dtype, a->w, j) + (double)a->weight_offset;
            double scale = fabs(rstd) * (fabs(g) + fabs(xh) * (fabs(c) + A));
            if (a->dres_dtype != RNK_NONE)
                scale += fabs(ld(a->dres_dtype, a->dres, i * a->dres_stride + j));
            double slack = 64.0 * u24 * scale;
            double ref = dx_ref[i * n + j];
            double got = ld(a->dx_dtype, a->dx, i * a->dx_stride + j);
            v.dx_count++;
            if (dws)
                dws[j] += fabs(dy * xh);
            int nf = nonfinite_cmp(got, ref);
            if (nf >= 0) {
                v.dx_nonfinite += nf;
                continue;
            }
            double err = got - ref;
            /* Norms count only the error beyond the cancellation floor: a
             * row that cancels (n = 1, say) has no fp32-attainable bound. */
            double ex = fabs(err) > slack ? fabs(err) - slack : 0.0;
            e2 += ex * ex;
            r2 += ref * ref;
            if (dx16) {
                uint16_t gh, rh = rnk_round16(a->dx_dtype, ref);
                const char *base = (const char *)a->dx + (size_t)(i * a->dx_stride + j) * 2;
                memcpy(&gh, base, 2);
                int64_t u = rnk_ulp_dist16(a->dx_dtype, gh, rh);
                if ((double)u > v.dx_max_ulp)
                    v.dx_max_ulp = (double)u;
                if (fabs(err) > slack) {
                    if (u > 1)
                        v.dx_over1++;
                    if (u > 2)
                        v.dx_over2++;
                }
            }
        }
    }
    v.dx_rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    rnk_judge(a, &v, want_dw ? a->dw : NULL, dw_ref, dws);
    free(dws);
    *out = v;
    return RNK_OK;
}
