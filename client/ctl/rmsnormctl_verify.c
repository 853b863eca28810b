/* SPDX-License-Identifier: MIT */
/*
 * rmsnormctl_verify.c - test cases for RMSNorm backward and the checks of
 * the daemon's results (see rmsnormctl_verify.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnormctl_verify.h"
#include "rnk.h"

#define ALIGN 64

_Static_assert((int)RNK_F32 == (int)RN_DTYPE_F32 && (int)RNK_F16 == (int)RN_DTYPE_F16 &&
                   (int)RNK_BF16 == (int)RN_DTYPE_BF16 && (int)RNK_NONE == (int)RN_DTYPE_NONE,
               "kernel and wire dtypes share their values");

static size_t esize(rn_dtype dt)
{
    return rnk_dtype_size((rnk_dtype)dt);
}

static size_t up(size_t v)
{
    return (v + ALIGN - 1) / ALIGN * ALIGN;
}

static size_t mat_bytes(const rnv_case *k, rn_dtype dt)
{
    /* Rows of stride n + pad, the last one only n long. */
    if (k->m == 0)
        return esize(dt) * (size_t)k->n;
    return esize(dt) * ((size_t)(k->m - 1) * (size_t)(k->n + k->pad) + (size_t)k->n);
}

/* Offsets of every tensor in the buffer, in one place so that rnv_bytes and
 * rnv_setup agree. */
typedef struct layout {
    size_t x, dy, dx, w, rstd, dres, dw, end;
} layout;

static layout lay_out(const rnv_case *k)
{
    layout L;
    size_t o = 0;
    L.x = o;
    o = up(o + mat_bytes(k, k->x));
    L.dy = o;
    o = up(o + mat_bytes(k, k->dy));
    L.dx = o;
    if (!k->inplace)
        o = up(o + mat_bytes(k, k->dx));
    else
        L.dx = L.dy;
    L.w = o;
    if (k->w != RN_DTYPE_NONE)
        o = up(o + esize(k->w) * (size_t)k->n);
    L.rstd = o;
    if (k->rstd)
        o = up(o + 4 * (size_t)(k->m > 0 ? k->m : 1));
    L.dres = o;
    if (k->dres != RN_DTYPE_NONE)
        o = up(o + mat_bytes(k, k->dres));
    L.dw = o;
    if (k->dw != RN_DTYPE_NONE)
        o = up(o + esize(k->dw) * (size_t)k->n);
    L.end = o ? o : ALIGN;
    return L;
}

size_t rnv_bytes(const rnv_case *k)
{
    return lay_out(k).end;
}

/* xorshift64*: reproducible inputs without libc's global state. */
static double rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

static void fill_mat(rn_dtype dt, void *base, int64_t m, int64_t n, int64_t stride, double lo,
                     double hi, uint64_t *s)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            rnk_store((rnk_dtype)dt, base, i * stride + j, (float)(lo + (hi - lo) * rnd(s)));
}

rnk_bwd_args rnv_to_rnk(const rn_bwd_args *a)
{
    rnk_bwd_args k;
    memset(&k, 0, sizeof k);
    k.m = a->m;
    k.n = a->n;
    k.x_dtype = (rnk_dtype)a->x_dtype;
    k.dy_dtype = (rnk_dtype)a->dy_dtype;
    k.dx_dtype = (rnk_dtype)a->dx_dtype;
    k.w_dtype = (rnk_dtype)a->w_dtype;
    k.dres_dtype = (rnk_dtype)a->dres_dtype;
    k.dw_dtype = (rnk_dtype)a->dw_dtype;
    k.x = a->x;
    k.x_stride = a->x_stride;
    k.dy = a->dy;
    k.dy_stride = a->dy_stride;
    k.dx = a->dx;
    k.dx_stride = a->dx_stride;
    k.w = a->w_dtype != RN_DTYPE_NONE ? a->w : NULL;
    k.rstd = a->rstd;
    k.dres = a->dres_dtype != RN_DTYPE_NONE ? a->dres : NULL;
    k.dres_stride = a->dres_stride;
    k.dw = a->dw_dtype != RN_DTYPE_NONE ? a->dw : NULL;
    k.eps = a->eps;
    k.weight_offset = a->weight_offset;
    return k;
}

void rnv_poison(const rn_bwd_args *a)
{
    for (int64_t i = 0; i < a->m; i++)
        memset((char *)a->dx + (size_t)(i * a->dx_stride) * esize(a->dx_dtype), 0xA5,
               (size_t)a->n * esize(a->dx_dtype));
    if (a->dw_dtype != RN_DTYPE_NONE)
        memset(a->dw, 0xA5, (size_t)a->n * esize(a->dw_dtype));
}

void rnv_setup(const rnv_case *k, void *base, uint64_t seed, rn_bwd_args *a)
{
    layout L = lay_out(k);
    char *b = base;
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    int64_t stride = k->n + k->pad;
    rn_bwd_args r;

    if (s == 0)
        s = 1;
    memset(&r, 0, sizeof r);
    r.m = k->m;
    r.n = k->n;
    r.x_dtype = k->x;
    r.dy_dtype = k->dy;
    r.dx_dtype = k->inplace ? k->dy : k->dx;
    r.w_dtype = k->w;
    r.dres_dtype = k->dres;
    r.dw_dtype = k->dw;
    r.x = b + L.x;
    r.dy = b + L.dy;
    r.dx = b + L.dx;
    r.x_stride = r.dy_stride = r.dx_stride = stride;
    r.eps = k->eps;
    r.weight_offset = k->weight_offset;
    fill_mat(k->x, b + L.x, k->m, k->n, stride, -2.0, 2.0, &s);
    fill_mat(k->dy, b + L.dy, k->m, k->n, stride, -1.0, 1.0, &s);
    if (k->w != RN_DTYPE_NONE) {
        r.w = b + L.w;
        fill_mat(k->w, b + L.w, 1, k->n, k->n, 0.5, 1.5, &s);
    }
    if (k->dres != RN_DTYPE_NONE) {
        r.dres = b + L.dres;
        r.dres_stride = stride;
        fill_mat(k->dres, b + L.dres, k->m, k->n, stride, -0.5, 0.5, &s);
    }
    if (k->dw != RN_DTYPE_NONE)
        r.dw = b + L.dw;
    if (k->rstd) {
        float *rs = (float *)(b + L.rstd);
        r.rstd = rs;
        for (int64_t i = 0; i < k->m; i++) {
            double ss = 0;
            for (int64_t j = 0; j < k->n; j++) {
                double v = rnk_load((rnk_dtype)k->x, r.x, i * stride + j);
                ss += v * v;
            }
            rs[i] = (float)(1.0 / sqrt(ss / (double)k->n + (double)k->eps));
        }
    }
    if (!k->inplace)
        rnv_poison(&r);
    else if (r.dw_dtype != RN_DTYPE_NONE)
        memset(r.dw, 0xA5, (size_t)k->n * esize(r.dw_dtype));
    *a = r;
}

/*
 * The size of the terms the results are made of: dx = rstd * (g - xhat * c)
 * cancels when g ~ xhat * c, so its fp32 error scales with max |rstd * g|,
 * not with |dx|; dw is a long sum whose error scales with sum |dy * xhat|.
 */
static void term_scales(const rn_bwd_args *a, double *dxs, double *dws)
{
    double sdx = 0, sdw = 0;
    double *acc = calloc((size_t)a->n, sizeof *acc);
    for (int64_t i = 0; i < a->m; i++) {
        double rs, ss = 0;
        for (int64_t j = 0; j < a->n; j++) {
            double v = rnk_load((rnk_dtype)a->x_dtype, a->x, i * a->x_stride + j);
            ss += v * v;
        }
        rs = a->rstd ? a->rstd[i] : 1.0 / sqrt(ss / (double)a->n + (double)a->eps);
        for (int64_t j = 0; j < a->n; j++) {
            double dy = rnk_load((rnk_dtype)a->dy_dtype, a->dy, i * a->dy_stride + j);
            double x = rnk_load((rnk_dtype)a->x_dtype, a->x, i * a->x_stride + j);
            double g = dy;
            if (a->w_dtype != RN_DTYPE_NONE)
                g *= rnk_load((rnk_dtype)a->w_dtype, a->w, j) + (double)a->weight_offset;
            if (fabs(rs * g) > sdx)
                sdx = fabs(rs * g);
            if (acc)
                acc[j] += fabs(dy * x * rs);
        }
    }
    for (int64_t j = 0; acc && j < a->n; j++)
        if (acc[j] > sdw)
            sdw = acc[j];
    free(acc);
    *dxs = sdx;
    *dws = sdw;
}

void rnv_expect_fini(rnv_expect *e)
{
    if (e == NULL)
        return;
    free(e->dx_twin);
    free(e->dw_twin);
    free(e->dx_ref);
    free(e->dw_ref);
    memset(e, 0, sizeof *e);
}

int rnv_expect_init(rnv_expect *e, const rn_bwd_args *a, int nthreads, char *msg, size_t len)
{
    rnv_expect x = {0};
    rnk_bwd_args k = rnv_to_rnk(a);
    size_t mn = (size_t)a->m * (size_t)a->n;
    int rv;

    x.dx_bytes = mn * esize(a->dx_dtype);
    /* m == 0 is a no-op for the kernel: dw is left as it was. */
    x.dw_bytes = a->dw_dtype != RN_DTYPE_NONE && a->m > 0 ? (size_t)a->n * esize(a->dw_dtype) : 0;
    x.dx_twin = malloc(x.dx_bytes ? x.dx_bytes : 1);
    x.dw_twin = malloc(x.dw_bytes ? x.dw_bytes : 1);
    x.dx_ref = malloc((mn ? mn : 1) * sizeof(double));
    x.dw_ref = malloc((size_t)a->n * sizeof(double));
    if (!x.dx_twin || !x.dw_twin || !x.dx_ref || !x.dw_ref) {
        snprintf(msg, len, "out of memory for the expected results");
        goto fail;
    }
    /* The twin writes packed copies, never the shared outputs (dx may be dy). */
    k.dx = x.dx_twin;
    k.dx_stride = a->n;
    k.dw = a->dw_dtype != RN_DTYPE_NONE ? x.dw_twin : NULL;
    if ((rv = rnk_cpu_bwd(&k, nthreads, msg, len)) != 0)
        goto fail;
    k = rnv_to_rnk(a);
    if ((rv = rnk_ref64_bwd(&k, x.dx_ref, a->dw_dtype != RN_DTYPE_NONE ? x.dw_ref : NULL)) != 0) {
        snprintf(msg, len, "fp64 reference failed (%d)", rv);
        goto fail;
    }
    term_scales(a, &x.dx_scale, &x.dw_scale);
    *e = x;
    return 0;
fail:
    rnv_expect_fini(&x);
    return -1;
}

bool rnv_equal_twin(const rn_bwd_args *a, const rnv_expect *e)
{
    size_t row = (size_t)a->n * esize(a->dx_dtype);
    for (int64_t i = 0; i < a->m; i++)
        if (memcmp((const char *)a->dx + (size_t)(i * a->dx_stride) * esize(a->dx_dtype),
                   (const char *)e->dx_twin + (size_t)i * row, row) != 0)
            return false;
    if (e->dw_bytes && memcmp(a->dw, e->dw_twin, e->dw_bytes) != 0)
        return false;
    return true;
}

/* Tolerance against fp64 for an output dtype: a few units of its rounding,
 * plus an absolute part (relative to the tensor's largest value) for the
 * cancellation in g - xhat * c and in long fp32 sums. */
static double rtol_of(rn_dtype dt)
{
    switch (dt) {
    case RN_DTYPE_BF16:
        return 1.0 / 128;
    case RN_DTYPE_F16:
        return 1.0 / 512;
    default:
        return 1e-4;
    }
}

static int compare_one(const char *what, rn_dtype dt, const void *got, int64_t rows, int64_t n,
                       int64_t stride, const double *ref, double scale, double growth,
                       double *max_rel, char *msg, size_t len)
{
    double maxabs = 0, rtol = rtol_of(dt), atol, worst = 0;
    for (int64_t i = 0; i < rows * n; i++)
        if (fabs(ref[i]) > maxabs)
            maxabs = fabs(ref[i]);
    /* fp32 rounding of the terms, growing like the square root of the
     * number of terms summed, plus a sliver of the output's own scale. */
    atol = 2e-6 * (growth > 16 ? growth / 4 : 4) * scale + 1e-4 * maxabs + 1e-30;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < n; j++) {
            double g = rnk_load((rnk_dtype)dt, got, i * stride + j), r = ref[i * n + j];
            double err = fabs(g - r);
            if (!(err <= rtol * fabs(r) + atol)) {
                snprintf(msg, len, "%s[%lld,%lld]: got %.9g, fp64 reference %.9g (tolerance %.3g)",
                         what, (long long)i, (long long)j, g, r, rtol * fabs(r) + atol);
                return -1;
            }
            if (maxabs > 0 && err / maxabs > worst)
                worst = err / maxabs;
        }
    }
    if (worst > *max_rel)
        *max_rel = worst;
    return 0;
}

int rnv_compare(const rn_bwd_args *a, const rnv_expect *e, bool bitwise, double *max_rel, char *msg,
                size_t len)
{
    double worst = 0;
    if (bitwise) {
        size_t es = esize(a->dx_dtype), row = (size_t)a->n * es;
        for (int64_t i = 0; i < a->m; i++) {
            const char *g = (const char *)a->dx + (size_t)(i * a->dx_stride) * es;
            const char *t = (const char *)e->dx_twin + (size_t)i * row;
            if (memcmp(g, t, row) != 0) {
                for (int64_t j = 0; j < a->n; j++)
                    if (memcmp(g + (size_t)j * es, t + (size_t)j * es, es) != 0) {
                        snprintf(msg, len, "dx[%lld,%lld]: got %.9g, CPU twin %.9g (bitwise)",
                                 (long long)i, (long long)j, rnk_load((rnk_dtype)a->dx_dtype, g, j),
                                 rnk_load((rnk_dtype)a->dx_dtype, t, j));
                        return -1;
                    }
            }
        }
        if (e->dw_bytes && memcmp(a->dw, e->dw_twin, e->dw_bytes) != 0) {
            for (int64_t j = 0; j < a->n; j++)
                if (rnk_load((rnk_dtype)a->dw_dtype, a->dw, j) !=
                    rnk_load((rnk_dtype)a->dw_dtype, e->dw_twin, j)) {
                    snprintf(msg, len, "dw[%lld]: got %.9g, CPU twin %.9g (bitwise)", (long long)j,
                             rnk_load((rnk_dtype)a->dw_dtype, a->dw, j),
                             rnk_load((rnk_dtype)a->dw_dtype, e->dw_twin, j));
                    return -1;
                }
            snprintf(msg, len, "dw: bytes differ from the CPU twin");
            return -1;
        }
    }
    if (compare_one("dx", a->dx_dtype, a->dx, a->m, a->n, a->dx_stride, e->dx_ref, e->dx_scale,
                    sqrt((double)a->n), &worst, msg, len) != 0)
        return -1;
    if (e->dw_bytes && compare_one("dw", a->dw_dtype, a->dw, 1, a->n, a->n, e->dw_ref, e->dw_scale,
                                   sqrt((double)a->m), &worst, msg, len) != 0)
        return -1;
    if (max_rel)
        *max_rel = worst;
    return 0;
}

const char *rnv_dtype_name(rn_dtype dt)
{
    switch (dt) {
    case RN_DTYPE_NONE:
        return "none";
    case RN_DTYPE_F32:
        return "f32";
    case RN_DTYPE_F16:
        return "f16";
    case RN_DTYPE_BF16:
        return "bf16";
    }
    return "invalid";
}

int rnv_parse_dtype(const char *s)
{
    if (strcmp(s, "f32") == 0 || strcmp(s, "fp32") == 0 || strcmp(s, "float32") == 0)
        return RN_DTYPE_F32;
    if (strcmp(s, "f16") == 0 || strcmp(s, "fp16") == 0 || strcmp(s, "float16") == 0)
        return RN_DTYPE_F16;
    if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0)
        return RN_DTYPE_BF16;
    if (strcmp(s, "none") == 0)
        return RN_DTYPE_NONE;
    return -1;
}

void rnv_describe(const rnv_case *k, char *buf, size_t len)
{
    snprintf(buf, len, "m=%lld n=%lld%s x=%s dy=%s dx=%s%s w=%s dres=%s dw=%s rstd=%s",
             (long long)k->m, (long long)k->n, k->pad ? " padded" : "", rnv_dtype_name(k->x),
             rnv_dtype_name(k->dy), rnv_dtype_name(k->inplace ? k->dy : k->dx),
             k->inplace ? "(in place)" : "", rnv_dtype_name(k->w), rnv_dtype_name(k->dres),
             rnv_dtype_name(k->dw), k->rstd ? "given" : "recomputed");
}
