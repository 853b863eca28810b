/* SPDX-License-Identifier: MIT */
/*
 * test_kernel_cpu.c - the CPU twin of the RMSNorm backward kernel against the
 * fp64 reference (issue 3's tolerances, via rnk_verify), on fresh random
 * inputs with poisoned outputs; the bf16/fp16 conversions; argument checks;
 * thread-count invariance; and dw's documented summation order.
 *
 * The seed comes from the time and pid (RN_SEED=... repeats a run) and is
 * printed at the start and with every failure.
 */
#include "rn_test.h"
#include "rnk_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t seed, rng_state;

static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), never exactly zero often enough to matter. */
static float urand(void)
{
    return (float)((double)(rnd64() >> 11) * 0x1p-52 - 1.0);
}

/* Roughly normal: sum of four uniforms. */
static float nrand(void)
{
    return (urand() + urand() + urand() + urand()) * 0.8660254f;
}

#define FAILF(...)                                                   \
    do {                                                             \
        print_error("seed %llu: ", (unsigned long long)seed);        \
        fail_msg(__VA_ARGS__);                                       \
    } while (0)

/* ---- one problem: buffers, inputs, poisoned outputs ------------------------ */

typedef struct prob {
    rnk_bwd_args a;
    size_t xb, dyb, dxb, dresb, wb, dwb; /* bytes */
    void *x, *dy, *dx, *dres, *w, *dw;
    void *dy_copy;                       /* original dy (for in-place runs) */
    float *rstd;
} prob;

typedef struct pspec {
    int64_t m, n, pad;                   /* pad: extra elements per row */
    rnk_dtype xt, dyt, dxt, wt, drt, dwt;
    bool rstd_given, inplace;
    float offset;
} pspec;

static const uint8_t POISON_PAD = 0xa5;

static void fill(rnk_dtype dt, void *p, int64_t count, float scale, float bias)
{
    for (int64_t i = 0; i < count; i++)
        rnk_store(dt, p, i, bias + scale * nrand());
}

static void poison(rnk_dtype dt, void *p, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        rnk_store(dt, p, i, NAN);
}

static void prob_free(prob *p)
{
    if (!p)
        return;
    free(p->x);
    free(p->dy);
    if (p->dx != p->dy)
        free(p->dx);
    free(p->dres);
    free(p->w);
    free(p->dw);
    free(p->dy_copy);
    free(p->rstd);
    memset(p, 0, sizeof *p);
}

static void prob_init(prob *p, const pspec *s)
{
    memset(p, 0, sizeof *p);
    rnk_bwd_args *a = &p->a;
    int64_t m = s->m, n = s->n, st = n + s->pad;
    a->m = m;
    a->n = n;
    a->x_dtype = s->xt;
    a->dy_dtype = s->dyt;
    a->dx_dtype = s->inplace ? s->dyt : s->dxt;
    a->w_dtype = s->wt;
    a->dres_dtype = s->drt;
    a->dw_dtype = s->dwt;
    a->x_stride = a->dy_stride = a->dx_stride = a->dres_stride = st;
    a->eps = 1e-5f;
    a->weight_offset = s->offset;
    int64_t rows = m > 0 ? m : 1;
    p->xb = (size_t)(rows * st) * rnk_dtype_size(s->xt);
    p->dyb = (size_t)(rows * st) * rnk_dtype_size(s->dyt);
    p->dxb = (size_t)(rows * st) * rnk_dtype_size(a->dx_dtype);
    p->x = malloc(p->xb);
    p->dy = malloc(p->dyb);
    assert_non_null(p->x);
    assert_non_null(p->dy);
    memset(p->x, POISON_PAD, p->xb);
    memset(p->dy, POISON_PAD, p->dyb);
    for (int64_t i = 0; i < m; i++) {
        /* Rows of varying scale: rstd must matter. */
        float sc = 0.5f + 1.5f * fabsf(urand());
        fill(s->xt, (char *)p->x + (size_t)(i * st) * rnk_dtype_size(s->xt), n, sc, 0.1f);
        fill(s->dyt, (char *)p->dy + (size_t)(i * st) * rnk_dtype_size(s->dyt), n, 1.0f, 0.0f);
    }
    p->dy_copy = malloc(p->dyb);
    assert_non_null(p->dy_copy);
    memcpy(p->dy_copy, p->dy, p->dyb);
    if (s->inplace) {
        p->dx = p->dy;
    } else {
        p->dx = malloc(p->dxb);
        assert_non_null(p->dx);
        memset(p->dx, POISON_PAD, p->dxb);
        for (int64_t i = 0; i < m; i++)
            poison(a->dx_dtype, (char *)p->dx + (size_t)(i * st) * rnk_dtype_size(a->dx_dtype), n);
    }
    if (s->wt != RNK_NONE) {
        p->wb = (size_t)n * rnk_dtype_size(s->wt);
        p->w = malloc(p->wb);
        assert_non_null(p->w);
        fill(s->wt, p->w, n, 0.3f, s->offset != 0.0f ? 0.0f : 1.0f);
    }
    if (s->drt != RNK_NONE) {
        p->dresb = (size_t)(rows * st) * rnk_dtype_size(s->drt);
        p->dres = malloc(p->dresb);
        assert_non_null(p->dres);
        memset(p->dres, POISON_PAD, p->dresb);
        for (int64_t i = 0; i < m; i++)
            fill(s->drt, (char *)p->dres + (size_t)(i * st) * rnk_dtype_size(s->drt), n, 0.5f,
                 0.0f);
    }
    if (s->dwt != RNK_NONE) {
        p->dwb = (size_t)n * rnk_dtype_size(s->dwt);
        p->dw = malloc(p->dwb);
        assert_non_null(p->dw);
        poison(s->dwt, p->dw, n);
    }
    if (s->rstd_given && m > 0) {
        p->rstd = malloc((size_t)m * sizeof(float));
        assert_non_null(p->rstd);
        for (int64_t i = 0; i < m; i++) {
            double ss = 0;
            for (int64_t j = 0; j < n; j++) {
                double v = rnk_load(s->xt, p->x, i * st + j);
                ss += v * v;
            }
            p->rstd[i] = (float)(1.0 / sqrt(ss / (double)n + 1e-5));
        }
    }
    a->x = p->x;
    a->dy = p->dy;
    a->dx = p->dx;
    a->w = p->w;
    a->dres = p->dres;
    a->dw = p->dw;
    a->rstd = p->rstd;
}

/* The padding between rows of dx must be untouched. */
static void check_pad(const prob *p, const char *what)
{
    const rnk_bwd_args *a = &p->a;
    if (a->dx == a->dy)
        return;
    size_t es = rnk_dtype_size(a->dx_dtype);
    for (int64_t i = 0; i < a->m; i++)
        for (int64_t j = a->n; j < a->dx_stride; j++) {
            const uint8_t *b = (const uint8_t *)p->dx + (size_t)(i * a->dx_stride + j) * es;
            for (size_t k = 0; k < es; k++)
                if (b[k] != POISON_PAD)
                    FAILF("%s: dx padding written at row %lld col %lld", what, (long long)i,
                          (long long)j);
        }
}

/* Run the twin and judge it against fp64. */
static void run_and_verify(prob *p, int nthreads, const char *what)
{
    char msg[256] = "";
    int rc = rnk_cpu_bwd(&p->a, nthreads, msg, sizeof msg);
    if (rc != 0)
        FAILF("%s: rnk_cpu_bwd returned %d: %s", what, rc, msg);
    if (p->a.m == 0)
        return;
    rnk_bwd_args in = p->a;
    in.dy = p->dy_copy; /* inputs as they were before an in-place run */
    double *dxr = malloc((size_t)(p->a.m * p->a.n) * sizeof(double));
    double *dwr = malloc((size_t)p->a.n * sizeof(double));
    assert_non_null(dxr);
    assert_non_null(dwr);
    assert_int_equal(rnk_ref64_bwd(&in, dxr, dwr), 0);
    rnk_verdict v;
    assert_int_equal(rnk_verify(&in, dxr, p->a.dw_dtype != RNK_NONE ? dwr : NULL, &v), 0);
    free(dxr);
    free(dwr);
    if (!v.ok)
        FAILF("%s (m=%lld n=%lld x%d dy%d dx%d w%d dres%d dw%d): %s", what, (long long)p->a.m,
              (long long)p->a.n, p->a.x_dtype, p->a.dy_dtype, p->a.dx_dtype, p->a.w_dtype,
              p->a.dres_dtype, p->a.dw_dtype, v.why);
    check_pad(p, what);
}

static pspec spec(int64_t m, int64_t n, rnk_dtype t, rnk_dtype wt, rnk_dtype dwt)
{
    pspec s = {.m = m, .n = n, .xt = t, .dyt = t, .dxt = t, .wt = wt, .drt = RNK_NONE,
               .dwt = dwt, .rstd_given = true};
    return s;
}

static void run_spec(const pspec *s, int nthreads, const char *what)
{
    prob p;
    prob_init(&p, s);
    run_and_verify(&p, nthreads, what);
    prob_free(&p);
}

/* ---- conversions ------------------------------------------------------------ */

static void test_convert_roundtrip(void **state)
{
    (void)state;
    rnk_dtype dts[2] = {RNK_BF16, RNK_F16};
    for (int d = 0; d < 2; d++) {
        for (uint32_t h = 0; h < 65536; h++) {
            uint16_t in = (uint16_t)h, out;
            float f = rnk_load(dts[d], &in, 0);
            rnk_store(dts[d], &out, 0, f);
            if (isnan(f)) {
                if (!isnan(rnk_load(dts[d], &out, 0)))
                    FAILF("dtype %d: NaN 0x%04x did not stay NaN", dts[d], h);
            } else if (out != in) {
                FAILF("dtype %d: 0x%04x -> %g -> 0x%04x", dts[d], h, (double)f, out);
            }
        }
    }
    /* Known values, ties to even, overflow, subnormals. */
    uint16_t h;
    rnk_store(RNK_BF16, &h, 0, 1.0f);
    assert_int_equal(h, 0x3f80);
    rnk_store(RNK_BF16, &h, 0, 1.0f + 0x1p-8f); /* tie between 1 and 1+2^-7: even */
    assert_int_equal(h, 0x3f80);
    rnk_store(RNK_BF16, &h, 0, 1.0f + 3 * 0x1p-8f); /* tie: up to even */
    assert_int_equal(h, 0x3f82);
    rnk_store(RNK_BF16, &h, 0, INFINITY);
    assert_int_equal(h, 0x7f80);
    rnk_store(RNK_BF16, &h, 0, -INFINITY);
    assert_int_equal(h, 0xff80);
    rnk_store(RNK_BF16, &h, 0, 3.4e38f); /* rounds up past the largest bf16 */
    assert_int_equal(h, 0x7f80);
    rnk_store(RNK_F16, &h, 0, 65504.0f);
    assert_int_equal(h, 0x7bff);
    rnk_store(RNK_F16, &h, 0, 65520.0f); /* tie at the top: to even = inf */
    assert_int_equal(h, 0x7c00);
    rnk_store(RNK_F16, &h, 0, 65519.0f);
    assert_int_equal(h, 0x7bff);
    rnk_store(RNK_F16, &h, 0, 0x1p-24f); /* smallest subnormal */
    assert_int_equal(h, 0x0001);
    rnk_store(RNK_F16, &h, 0, 0x1p-25f); /* tie with zero: even */
    assert_int_equal(h, 0x0000);
    rnk_store(RNK_F16, &h, 0, 0x1.8p-24f); /* tie between 1 and 2: even */
    assert_int_equal(h, 0x0002);
    rnk_store(RNK_F16, &h, 0, -0.0f);
    assert_int_equal(h, 0x8000);
    rnk_store(RNK_F16, &h, 0, NAN);
    assert_true(isnan(rnk_load(RNK_F16, &h, 0)));
    rnk_store(RNK_BF16, &h, 0, NAN);
    assert_true(isnan(rnk_load(RNK_BF16, &h, 0)));
    assert_true(rnk_load(RNK_F16, &(uint16_t){0x7c00}, 0) == INFINITY);
}

/* Random floats, ties included, against an independent correct rounding. */
static void test_convert_random(void **state)
{
    (void)state;
    rnk_dtype dts[2] = {RNK_BF16, RNK_F16};
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < 400000; i++) {
            uint32_t u = (uint32_t)rnd64();
            if (i & 1) /* force a tie pattern below the kept bits */
                u = dts[d] == RNK_BF16 ? (u & 0xffff0000u) | 0x8000u : (u & 0xffffe000u) | 0x1000u;
            if (dts[d] == RNK_F16) /* keep most inputs in fp16's range */
                u = (u & 0x81ffffffu) | ((uint32_t)(100 + (rnd64() % 46)) << 23);
            float f;
            memcpy(&f, &u, 4);
            if (!isfinite(f))
                continue;
            uint16_t got;
            rnk_store(dts[d], &got, 0, f);
            uint16_t want = rnk_round16(dts[d], (double)f);
            if (got != want)
                FAILF("dtype %d: %a stored as 0x%04x, correctly rounded 0x%04x", dts[d],
                      (double)f, got, want);
        }
    }
}

/* ---- argument checks ------------------------------------------------------- */

static void expect_einval(rnk_bwd_args a, const char *field)
{
    char msg[256] = "";
    int rc = rnk_cpu_bwd(&a, 1, msg, sizeof msg);
    if (rc != RNK_EINVAL)
        FAILF("expected EINVAL naming %s, got %d", field, rc);
    if (strncmp(msg, field, strlen(field)) != 0)
        FAILF("message '%s' does not name %s", msg, field);
}

static void test_check_args(void **state)
{
    (void)state;
    prob p;
    pspec s = spec(4, 16, RNK_BF16, RNK_F32, RNK_F32);
    prob_init(&p, &s);
    rnk_bwd_args a = p.a, b;
    char msg[128];
    assert_int_equal(rnk_check_args(&a, msg, sizeof msg), 0);
    b = a; b.m = -1; expect_einval(b, "m");
    b = a; b.n = 0; expect_einval(b, "n");
    b = a; b.x_dtype = RNK_NONE; expect_einval(b, "x_dtype");
    b = a; b.dy_dtype = 9; expect_einval(b, "dy_dtype");
    b = a; b.dx_dtype = RNK_NONE; expect_einval(b, "dx_dtype");
    b = a; b.w_dtype = 7; expect_einval(b, "w_dtype");
    b = a; b.dres_dtype = 5; expect_einval(b, "dres_dtype");
    b = a; b.dw_dtype = RNK_F16; expect_einval(b, "dw_dtype");
    b = a; b.x_stride = 15; expect_einval(b, "x_stride");
    b = a; b.dy_stride = 3; expect_einval(b, "dy_stride");
    b = a; b.dx_stride = 0; expect_einval(b, "dx_stride");
    b = a; b.x = NULL; expect_einval(b, "x");
    b = a; b.dy = NULL; expect_einval(b, "dy");
    b = a; b.dx = NULL; expect_einval(b, "dx");
    b = a; b.w = NULL; expect_einval(b, "w");
    b = a; b.dw = NULL; expect_einval(b, "dw");
    b = a; b.dres_dtype = RNK_F32; expect_einval(b, "dres");
    b = a; b.rstd = NULL; b.eps = NAN; expect_einval(b, "eps");
    b = a; b.rstd = NULL; b.eps = -1.0f; expect_einval(b, "eps");
    b = a; b.weight_offset = INFINITY; expect_einval(b, "weight_offset");
    b = a; b.dx = (void *)b.x; expect_einval(b, "dx");
    b = a; b.dx = (void *)b.dy; b.dx_dtype = RNK_F32; expect_einval(b, "dx");
    b = a; b.m = INT64_MAX / 4; expect_einval(b, "m");
    uint64_t words[2];
    b = a; b.done[1] = &words[1]; expect_einval(b, "done");
    b = a; b.done[0] = (uint64_t *)((char *)words + 4); expect_einval(b, "done");
    b = a; b.done[0] = &words[0]; b.done[1] = (uint64_t *)((char *)words + 12);
    expect_einval(b, "done");
    b = a; b.done[0] = &words[0]; b.done[1] = &words[1];
    assert_int_equal(rnk_check_args(&b, msg, sizeof msg), 0);
    /* A rejected call writes nothing. */
    for (int64_t i = 0; i < a.m * a.n; i++)
        assert_true(isnan(rnk_load(a.dx_dtype, a.dx, i)));
    assert_true(isnan(rnk_load(a.dw_dtype, a.dw, 0)));
    prob_free(&p);
}

static void test_chunk_geometry(void **state)
{
    (void)state;
    /* The contiguous order (main's): rnk_chunk_rows, rnk_chunk_stripes. */
    int64_t ms[] = {1, 7, 199, 255, 256, 257, 4096, 8192, 65536, 65537, 1 << 22};
    int64_t ns[] = {1, 256, 257, 512, 1024, 2048, 4096, 8192, 8193, 65536, 1 << 20};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
            int64_t c = rnk_chunk_rows(ms[i], ns[j]);
            int64_t nch = (ms[i] + c - 1) / c;
            assert_true(c >= 1);
            assert_true(nch <= 256);
            assert_true((uint64_t)nch * (uint64_t)ns[j] * rnk_chunk_stripes(ns[j]) * 4 <=
                            (256u << 20) ||
                        nch == 1);
            assert_int_equal(c, rnk_chunk_rows(ms[i], ns[j]));
            /* Which order: fp32 and mixed rows always contiguous; 16-bit rows
             * interleaved from 1025 to 8192 columns with m * n >= 2^23, from
             * 513 to 1024 with m * n >= 2^22, from 257 to 512 with m * n >=
             * 2^21, from 129 to 256 with m * n >= 2^20, m >= n (m >= n / 2
             * from 4097 columns). */
            const int64_t m = ms[i], n = ns[j];
            const int il = n > 128 && n <= 8192 && (m >= n || (n > 4096 && 2 * m >= n)) &&
                           m * n >= ((int64_t)1 << (n <= 256    ? 20
                                                    : n <= 512  ? 21
                                                    : n <= 1024 ? 22
                                                                : 23));
            rnk_chunking ch;
            rnk_chunking_of(m, n, RNK_F32, RNK_F32, RNK_F32, &ch);
            assert_int_equal(ch.interleaved, 0);
            assert_int_equal(ch.rows, c);
            assert_int_equal(ch.nchunks, nch);
            assert_int_equal(ch.stripes, rnk_chunk_stripes(n));
            rnk_chunking_of(m, n, RNK_BF16, RNK_BF16, RNK_F32, &ch);
            assert_int_equal(ch.interleaved, 0);
            rnk_chunking_of(m, n, RNK_BF16, RNK_F16, RNK_BF16, &ch);
            assert_int_equal(ch.interleaved, 0);
            for (int t = 0; t < 2; t++) {
                const rnk_dtype dt = t ? RNK_F16 : RNK_BF16;
                assert_int_equal(rnk_chunk_interleaved(m, n, dt, dt, dt), il);
                rnk_chunking_of(m, n, dt, dt, dt, &ch);
                assert_int_equal(ch.interleaved, il);
                if (!il) {
                    assert_int_equal(ch.rows, c);
                    assert_int_equal(ch.nchunks, nch);
                    assert_int_equal(ch.stripes, rnk_chunk_stripes(n));
                    continue;
                }
                assert_int_equal(ch.rows, 0);
                assert_true(ch.nchunks >= 1 && ch.nchunks <= 1056);
                assert_true(m / ch.nchunks >= 8); /* at least 8 rows a chunk */
                assert_int_equal(ch.stripes, n <= 256 ? 8 : n <= 512 ? 4 : n <= 1024 ? 2 : 1);
            }
        }
    assert_int_equal(rnk_chunk_rows(4096, 4096), 32);   /* RNK_MIN_CHUNK_ROWS */
    assert_int_equal(rnk_chunk_rows(7, 4096), 7);        /* all of a small m */
    assert_int_equal(rnk_chunk_rows(65536, 4096), 256);
    assert_int_equal(rnk_chunk_rows(100000, 1024), 392); /* rnk.h's example */
    assert_int_equal(rnk_chunk_stripes(256), 8);
    assert_int_equal(rnk_chunk_stripes(1), 8);
    assert_int_equal(rnk_chunk_stripes(1024), 8);
    assert_int_equal(rnk_chunk_stripes(2048), 4);
    assert_int_equal(rnk_chunk_stripes(4096), 1);
    /* The interleaved order's P: 132 * 4 / 4 / 2 / 1, at most m / 32 (to 1024
     * columns) or m / 16, or twice that where that is no more. */
    static const int64_t ilp[][3] = {{65536, 1024, 528}, {65536, 2048, 528}, {65536, 4096, 264},
                                     {65536, 8192, 132}, {16384, 1024, 512}, {4096, 4096, 256},
                                     {32768, 512, 528},  {100000, 1024, 528}, {8192, 1024, 512},
                                     {65536, 256, 528},  {8192, 512, 512},    {4096, 8192, 132},
                                     {8192, 6144, 132},  {4096, 2048, 512},   {8192, 2048, 512},
                                     {16384, 512, 512},  {10000, 1024, 312},  {12288, 1024, 384},
                                     {8448, 1024, 528},  {8480, 1024, 265},
                                     {4096, 1024, 256},  {4096, 512, 256},    {32768, 256, 528},
                                     {4096, 256, 256},   {8192, 256, 512}};
    for (size_t i = 0; i < sizeof ilp / sizeof ilp[0]; i++) {
        rnk_chunking ch;
        rnk_chunking_of(ilp[i][0], ilp[i][1], RNK_BF16, RNK_BF16, RNK_BF16, &ch);
        assert_int_equal(ch.interleaved, 1);
        assert_int_equal(ch.nchunks, ilp[i][2]);
    }
    /* The rule's edges: n = 128, 8193, m < n, m * n < 2^23 (2^22 at 512 < n
     * <= 1024, 2^21 at 256 < n <= 512, 2^20 at n <= 256) stay contiguous:
     * {m, n, the rows' dtype, interleaved}. */
    static const struct {
        int64_t m, n;
        rnk_dtype dt;
        int il;
    } edge[] = {
        {65536, 256, RNK_BF16, 1}, {32768, 256, RNK_BF16, 1}, {4096, 256, RNK_BF16, 1},
        {4095, 256, RNK_BF16, 0}, {8192, 129, RNK_F16, 1}, {8128, 129, RNK_F16, 0},
        {131072, 129, RNK_F16, 1}, {1 << 20, 128, RNK_BF16, 0}, {32768, 257, RNK_BF16, 1},
        {65536, 8193, RNK_BF16, 0}, {4096, 8192, RNK_BF16, 1}, {4095, 8192, RNK_BF16, 0},
        {3072, 6144, RNK_F16, 1}, {2048, 4096, RNK_BF16, 0}, {4096, 1024, RNK_F16, 1},
        {4095, 1024, RNK_F16, 0}, {8192, 512, RNK_F16, 1}, {8191, 512, RNK_F16, 1},
        {4096, 512, RNK_BF16, 1}, {4095, 512, RNK_BF16, 0}, {16384, 257, RNK_BF16, 1},
        {8160, 257, RNK_BF16, 0}, {4096, 513, RNK_BF16, 0}, {8192, 513, RNK_BF16, 1},
        {2048, 2048, RNK_BF16, 0}, {16384, 513, RNK_BF16, 1}, {8192, 1024, RNK_F16, 1},
        {4096, 2048, RNK_BF16, 1}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        assert_int_equal(rnk_chunk_interleaved(edge[i].m, edge[i].n, edge[i].dt, edge[i].dt,
                                               edge[i].dt),
                         edge[i].il);
}

/* ---- accuracy ---------------------------------------------------------------- */

static const rnk_dtype FT[3] = {RNK_F32, RNK_F16, RNK_BF16};
static const rnk_dtype WT[4] = {RNK_NONE, RNK_F32, RNK_F16, RNK_BF16};

static void test_all_dtype_combos(void **state)
{
    (void)state;
    int k = 0;
    for (int xi = 0; xi < 3; xi++)
        for (int yi = 0; yi < 3; yi++)
            for (int di = 0; di < 3; di++)
                for (int wi = 0; wi < 4; wi++, k++) {
                    pspec s = {.m = 23 + k % 5, .n = 72 + k % 9, .pad = k % 3, .xt = FT[xi],
                               .dyt = FT[yi], .dxt = FT[di], .wt = WT[wi],
                               .drt = (k % 4 == 0) ? RNK_NONE : FT[k % 3],
                               .rstd_given = (k % 2) == 0, .offset = (k % 3 == 1) ? 1.0f : 0.0f};
                    /* dw: fp32, or the weight's own type, or none */
                    s.dwt = (wi == 0 || k % 3 == 0) ? RNK_F32 : (k % 3 == 1 ? WT[wi] : RNK_NONE);
                    run_spec(&s, 2, "dtype combo");
                }
}

static void test_shapes(void **state)
{
    (void)state;
    struct { int64_t m, n; } sh[] = {
        {1, 1}, {7, 1}, {199, 1}, {1, 33}, {7, 33}, {199, 192}, {64, 256}, {33, 760},
        {9, 1024}, {17, 1128}, {5, 4096}, {3, 8192}, {2, 65536}, {2, 70001}, {600, 40},
        {1500, 1024}, /* 1.5M elements: the 99.99 % rule has room to bite */
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        for (int t = 0; t < 3; t++) {
            pspec s = spec(sh[i].m, sh[i].n, FT[t], t == 2 ? RNK_F32 : FT[t], RNK_F32);
            s.rstd_given = (i % 2) == 0;
            run_spec(&s, 2, "shape");
        }
    }
}

static void test_strides_dres_offset_inplace(void **state)
{
    (void)state;
    for (int v = 0; v < 16; v++) {
        pspec s = spec(57, 130, FT[v % 3], WT[v % 4], RNK_F32);
        s.pad = (v & 1) ? 7 : 0;
        s.drt = (v & 2) ? FT[(v / 2) % 3] : RNK_NONE;
        s.offset = (v & 4) ? 1.0f : 0.0f;
        s.inplace = (v & 8) != 0;
        s.rstd_given = (v % 3) != 0;
        if (s.wt != RNK_NONE && (v & 1))
            s.dwt = s.wt;
        run_spec(&s, 3, "strides/dres/offset/inplace");
    }
}

static void test_no_weight_and_recomputed_rstd(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        pspec s = spec(101, 300, FT[t], RNK_NONE, RNK_F32);
        s.rstd_given = false;
        run_spec(&s, 2, "no weight, recomputed rstd");
        s.dwt = RNK_NONE;
        run_spec(&s, 2, "no weight, no dw");
    }
}

static void test_m_zero(void **state)
{
    (void)state;
    prob p;
    pspec s = spec(0, 64, RNK_BF16, RNK_BF16, RNK_BF16);
    prob_init(&p, &s);
    assert_int_equal(rnk_cpu_bwd(&p.a, 2, NULL, 0), 0);
    for (int64_t j = 0; j < 64; j++)
        assert_true(isnan(rnk_load(RNK_BF16, p.dw, j))); /* untouched */
    rnk_bwd_args a = p.a;
    a.x = a.dy = NULL;
    a.dx = NULL;
    assert_int_equal(rnk_cpu_bwd(&a, 2, NULL, 0), 0);
    prob_free(&p);
}

/* A poisoned element that the backend failed to write must fail the check:
 * proves that the verifier looks at every element. */
static void test_verifier_catches_unwritten(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        prob p;
        pspec s = spec(19, 77, FT[t], RNK_F32, RNK_F32);
        prob_init(&p, &s);
        assert_int_equal(rnk_cpu_bwd(&p.a, 2, NULL, 0), 0);
        double *dxr = malloc(19 * 77 * sizeof(double)), dwr[77];
        assert_int_equal(rnk_ref64_bwd(&p.a, dxr, dwr), 0);
        rnk_verdict v;
        assert_int_equal(rnk_verify(&p.a, dxr, dwr, &v), 0);
        assert_true(v.ok);
        int64_t e = (int64_t)(rnd64() % (19 * 77));
        rnk_store(p.a.dx_dtype, p.dx, (e / 77) * p.a.dx_stride + e % 77, NAN);
        assert_int_equal(rnk_verify(&p.a, dxr, dwr, &v), 0);
        assert_false(v.ok);
        /* A 3-ulp error in one 16-bit element fails too. */
        if (FT[t] != RNK_F32) {
            assert_int_equal(rnk_cpu_bwd(&p.a, 2, NULL, 0), 0);
            uint16_t *h = (uint16_t *)p.dx + e;
            *h = (uint16_t)(*h + 3);
            assert_int_equal(rnk_verify(&p.a, dxr, dwr, &v), 0);
            assert_false(v.ok);
        }
        free(dxr);
        prob_free(&p);
    }
}

/* ---- determinism --------------------------------------------------------------- */

static void test_thread_invariance(void **state)
{
    (void)state;
    int threads[3] = {1, 2, 7};
    for (int t = 0; t < 3; t++) {
        pspec s = spec(1000, 264 + 8 * t, FT[t], RNK_F32, RNK_F32);
        s.rstd_given = (t != 1);
        s.drt = FT[(t + 1) % 3];
        prob p;
        prob_init(&p, &s);
        void *dx0 = malloc(p.dxb), *dw0 = malloc(p.dwb);
        assert_non_null(dx0);
        assert_non_null(dw0);
        for (int k = 0; k < 3; k++) {
            poison(p.a.dx_dtype, p.dx, (int64_t)(p.dxb / rnk_dtype_size(p.a.dx_dtype)));
            poison(p.a.dw_dtype, p.dw, p.a.n);
            assert_int_equal(rnk_cpu_bwd(&p.a, threads[k], NULL, 0), 0);
            if (k == 0) {
                memcpy(dx0, p.dx, p.dxb);
                memcpy(dw0, p.dw, p.dwb);
            } else {
                if (memcmp(dx0, p.dx, p.dxb) != 0)
                    FAILF("dx differs between 1 and %d threads", threads[k]);
                if (memcmp(dw0, p.dw, p.dwb) != 0)
                    FAILF("dw differs between 1 and %d threads", threads[k]);
            }
        }
        free(dx0);
        free(dw0);
        prob_free(&p);
    }
}

/* dw must follow rnk.h's documented order exactly: the GPU comparison in
 * tests/gpu relies on it bit for bit. */
static void test_dw_documented_order(void **state)
{
    (void)state;
    /* Contiguous: 1000 x 256: 250 chunks, so 15 full groups of RNK_DW_GROUP
     * and one of 10; 3000 x 1024 bf16 (too small to interleave), fp32 rows.
     * Interleaved: 4096 x 4096 bf16 (P = 256, G = 1), 32768 x 512 fp16
     * (P = 528, G = 4: 62 or 63 rows a chunk). */
    static const struct {
        int64_t m, n;
        rnk_dtype t;
        int il;
    } shapes[] = {{1000, 256, RNK_BF16, 0},  {3000, 1024, RNK_BF16, 0}, {77, 3000, RNK_BF16, 0},
                  {9, 5, RNK_BF16, 0},       {5000, 4096, RNK_F32, 0},  {4096, 4096, RNK_BF16, 1},
                  {32768, 512, RNK_F16, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t m = shapes[si].m, n = shapes[si].n;
        const rnk_dtype t = shapes[si].t;
        pspec s = spec(m, n, t, RNK_F32, RNK_F32);
        prob p;
        prob_init(&p, &s);
        assert_int_equal(rnk_cpu_bwd(&p.a, 3, NULL, 0), 0);
        rnk_chunking ch;
        rnk_chunking_of(m, n, t, t, t, &ch);
        assert_int_equal(ch.interleaved, shapes[si].il);
        /* chunk k: rows r0, r0 + rs, ... below r1 (rnk.h) */
        const int64_t nch = ch.nchunks, G = ch.stripes, C = ch.rows;
        const int64_t rs = ch.interleaved ? nch : 1;
        for (int64_t j = 0; j < n; j++) {
            float d = 0.0f, grp = 0.0f;
            for (int64_t k = 0; k < nch; k++) {
                const int64_t r0 = ch.interleaved ? k : k * C;
                const int64_t r1 = ch.interleaved || (k + 1) * C > m ? m : (k + 1) * C;
                float part = 0.0f;
                for (int64_t g = 0; g < G; g++) {
                    float acc = 0.0f;
                    for (int64_t r = r0 + g * rs; r < r1; r += G * rs) {
                        float xh = rnk_load(t, p.x, r * n + j) * p.rstd[r];
                        float prod = rnk_load(t, p.dy, r * n + j) * xh;
                        acc = acc + prod;
                    }
                    part = part + acc;
                }
                grp = grp + part;
                if ((k + 1) % RNK_DW_GROUP == 0 || k + 1 == nch) {
                    d = d + grp;
                    grp = 0.0f;
                }
            }
            float got = ((float *)p.dw)[j];
            if (memcmp(&got, &d, 4) != 0)
                FAILF("m=%lld n=%lld: dw[%lld] = %a, documented order gives %a", (long long)m,
                      (long long)n, (long long)j, (double)got, (double)d);
        }
        prob_free(&p);
    }
}

int main(void)
{
    const char *e = getenv("RN_SEED");
    seed = e ? strtoull(e, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    rng_state = seed;
    printf("test_kernel_cpu: seed %llu (RN_SEED=%llu repeats this run)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_roundtrip),
        cmocka_unit_test(test_convert_random),
        cmocka_unit_test(test_check_args),
        cmocka_unit_test(test_chunk_geometry),
        cmocka_unit_test(test_all_dtype_combos),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_strides_dres_offset_inplace),
        cmocka_unit_test(test_no_weight_and_recomputed_rstd),
        cmocka_unit_test(test_m_zero),
        cmocka_unit_test(test_verifier_catches_unwritten),
        cmocka_unit_test(test_thread_invariance),
        cmocka_unit_test(test_dw_documented_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
