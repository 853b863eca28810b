/* SPDX-License-Identifier: MIT */
/*
 * test_kernel_gpu.c - the fused deterministic CUDA kernel on a real GPU:
 * accuracy over issue 3's M x N grid (fp64 reference on the GPU, itself
 * cross-checked against the CPU's), every dtype combination, strides,
 * dresidual_out, weight_offset, no weight, recomputed rstd, in place, bitwise
 * repeatability, grid-size invariance, CUDA graph replay, back-to-back
 * launches, agreement with the CPU twin (dw bit for bit when rstd is given),
 * and no deadlock while other work holds most SMs (another stream, another
 * process).
 *
 * Inputs are fresh random values every run (seed printed; RN_SEED=...
 * repeats), outputs are poisoned with NaN before every launch.
 * RNK_GPU_QUICK=1 runs a small subset (for compute-sanitizer and MPS runs).
 */
#include "rn_test.h"
#include "rnk_test.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rn_check.h" /* (after the CUDA headers: rn_cuda_entry) */

extern char **environ;

static uint64_t seed, seq;
static bool quick;
static const char *self_path;
static rnk_device *dev;
static cudaStream_t st;
static void *ws;
static size_t wsb;

#define FAILF(...)                                                   \
    do {                                                             \
        print_error("seed %llu: ", (unsigned long long)seed);        \
        fail_msg(__VA_ARGS__);                                       \
    } while (0)

#define CU(call)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess)                                                       \
            FAILF("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- a problem on the device ------------------------------------------------ */

typedef struct gspec {
    int64_t m, n, pad;
    rnk_dtype xt, dyt, dxt, wt, drt, dwt;
    bool rstd_given, inplace;
    float offset;
} gspec;

typedef struct gprob {
    gspec s;
    rnk_bwd_args a;        /* device pointers */
    void *x, *dy, *dx, *dres, *w, *dw, *dy_copy;
    float *rstd;
    size_t xb, dyb, dxb, drb, wb, dwb;
} gprob;

static gspec gs(int64_t m, int64_t n, rnk_dtype t, rnk_dtype wt, rnk_dtype dwt)
{
    gspec s = {.m = m, .n = n, .xt = t, .dyt = t, .dxt = t, .wt = wt, .drt = RNK_NONE,
               .dwt = dwt, .rstd_given = true};
    return s;
}

static void *dalloc(size_t b)
{
    void *p = NULL;
    CU(cudaMalloc(&p, b ? b : 16));
    return p;
}

static void gp_free(gprob *p)
{
    cudaFree(p->x);
    cudaFree(p->dy);
    if (p->dx != p->dy)
        cudaFree(p->dx);
    cudaFree(p->dres);
    cudaFree(p->w);
    cudaFree(p->dw);
    cudaFree(p->dy_copy);
    cudaFree(p->rstd);
    memset(p, 0, sizeof *p);
}

static void fill(rnk_dtype dt, void *ptr, int64_t rows, int64_t cols, int64_t stride, float scale,
                 float bias)
{
    char msg[256];
    if (rnk_cuda_fill(dt, ptr, rows, cols, stride, seed ^ (++seq * 0x9e3779b97f4a7c15ull), scale,
                      bias, st, msg, sizeof msg) != 0)
        FAILF("fill: %s", msg);
}

/* Poison dx and dw with NaN (all-ones bytes are NaN in every dtype). */
static void poison(gprob *p)
{
    if (p->dx != p->dy)
        CU(cudaMemsetAsync(p->dx, 0xff, p->dxb, st));
    if (p->dw)
        CU(cudaMemsetAsync(p->dw, 0xff, p->dwb, st));
}

static void gp_init(gprob *p, const gspec *s)
{
    memset(p, 0, sizeof *p);
    p->s = *s;
    rnk_bwd_args *a = &p->a;
    int64_t m = s->m, n = s->n, stv = n + s->pad, rows = m > 0 ? m : 1;
    a->m = m;
    a->n = n;
    a->x_dtype = s->xt;
    a->dy_dtype = s->dyt;
    a->dx_dtype = s->inplace ? s->dyt : s->dxt;
    a->w_dtype = s->wt;
    a->dres_dtype = s->drt;
    a->dw_dtype = s->dwt;
    a->x_stride = a->dy_stride = a->dx_stride = a->dres_stride = stv;
    a->eps = 1e-5f;
    a->weight_offset = s->offset;
    p->xb = (size_t)(rows * stv) * rnk_dtype_size(s->xt);
    p->dyb = (size_t)(rows * stv) * rnk_dtype_size(s->dyt);
    p->dxb = (size_t)(rows * stv) * rnk_dtype_size(a->dx_dtype);
    p->x = dalloc(p->xb);
    p->dy = dalloc(p->dyb);
    CU(cudaMemsetAsync(p->x, 0xa5, p->xb, st));
    CU(cudaMemsetAsync(p->dy, 0xa5, p->dyb, st));
    fill(s->xt, p->x, m, n, stv, 1.0f, 0.1f);
    fill(s->dyt, p->dy, m, n, stv, 1.0f, 0.0f);
    if (s->inplace) {
        p->dy_copy = dalloc(p->dyb);
        CU(cudaMemcpyAsync(p->dy_copy, p->dy, p->dyb, cudaMemcpyDeviceToDevice, st));
        p->dx = p->dy;
    } else {
        p->dx = dalloc(p->dxb);
    }
    if (s->wt != RNK_NONE) {
        p->wb = (size_t)n * rnk_dtype_size(s->wt);
        p->w = dalloc(p->wb);
        fill(s->wt, p->w, 1, n, n, 0.3f, s->offset != 0.0f ? 0.0f : 1.0f);
    }
    if (s->drt != RNK_NONE) {
        p->drb = (size_t)(rows * stv) * rnk_dtype_size(s->drt);
        p->dres = dalloc(p->drb);
        fill(s->drt, p->dres, m, n, stv, 0.5f, 0.0f);
    }
    if (s->dwt != RNK_NONE) {
        p->dwb = (size_t)n * rnk_dtype_size(s->dwt);
        p->dw = dalloc(p->dwb);
    }
    if (s->rstd_given && m > 0) {
        char msg[256];
        p->rstd = dalloc((size_t)m * sizeof(float));
        if (rnk_cuda_rstd(s->xt, p->x, m, n, stv, 1e-5f, p->rstd, st, msg, sizeof msg) != 0)
            FAILF("rstd: %s", msg);
    }
    a->x = p->x;
    a->dy = p->dy;
    a->dx = p->dx;
    a->w = p->w;
    a->dres = p->dres;
    a->dw = p->dw;
    a->rstd = p->rstd;
    poison(p);
    CU(cudaStreamSynchronize(st));
}

/* Grow the shared workspace when a shape needs more. */
static void need_ws(int64_t m, int64_t n)
{
    size_t b = rnk_cuda_workspace_size(dev, m, n);
    if (b <= wsb)
        return;
    char msg[256];
    CU(cudaStreamSynchronize(st));
    cudaFree(ws);
    ws = dalloc(b);
    wsb = b;
    if (rnk_cuda_workspace_init(ws, wsb, st, msg, sizeof msg) != 0)
        FAILF("workspace_init: %s", msg);
}

static void launch(gprob *p)
{
    char msg[256];
    need_ws(p->a.m, p->a.n);
    int rc = rnk_cuda_bwd(dev, &p->a, ws, wsb, st, msg, sizeof msg);
    if (rc != 0)
        FAILF("rnk_cuda_bwd: %d: %s", rc, msg);
}

static void run(gprob *p)
{
    poison(p);
    launch(p);
    CU(cudaStreamSynchronize(st));
}

/* Input args as they were before the run (in place: the saved dy). */
static rnk_bwd_args inputs(const gprob *p)
{
    rnk_bwd_args a = p->a;
    if (p->dy_copy)
        a.dy = p->dy_copy;
    return a;
}

static void verify_gpu(gprob *p, const char *what)
{
    char msg[256];
    rnk_verdict v;
    rnk_bwd_args a = inputs(p);
    if (rnk_cuda_verify(&a, st, &v, msg, sizeof msg) != 0)
        FAILF("%s: rnk_cuda_verify: %s", what, msg);
    if (!v.ok)
        FAILF("%s (m=%lld n=%lld pad=%lld x%d dy%d dx%d w%d dres%d dw%d rstd%d inplace%d): %s",
              what, (long long)p->s.m, (long long)p->s.n, (long long)p->s.pad, p->a.x_dtype,
              p->a.dy_dtype, p->a.dx_dtype, p->a.w_dtype, p->a.dres_dtype, p->a.dw_dtype,
              p->s.rstd_given, p->s.inplace, v.why);
}

/* ---- host copies: CPU reference, CPU twin, padding ------------------------- */

typedef struct hcopy {
    rnk_bwd_args a;        /* host pointers: inputs and the GPU's outputs */
    void *x, *dy, *dx, *dres, *w, *dw;
    float *rstd;
} hcopy;

static void *h2(const void *d, size_t b)
{
    if (!d)
        return NULL;
    void *h = malloc(b ? b : 16);
    assert_non_null(h);
    CU(cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost));
    return h;
}

static void hc_init(hcopy *h, const gprob *p)
{
    memset(h, 0, sizeof *h);
    h->a = p->a;
    h->x = h2(p->x, p->xb);
    h->dy = h2(p->dy_copy ? p->dy_copy : p->dy, p->dyb);
    h->dx = h2(p->dx, p->dxb);
    h->dres = h2(p->dres, p->drb);
    h->w = h2(p->w, p->wb);
    h->dw = h2(p->dw, p->dwb);
    h->rstd = h2(p->rstd, p->rstd ? (size_t)p->a.m * sizeof(float) : 0);
    h->a.x = h->x;
    h->a.dy = h->dy;
    h->a.dx = h->dx;
    h->a.dres = h->dres;
    h->a.w = h->w;
    h->a.dw = h->dw;
    h->a.rstd = h->rstd;
}

static void hc_free(hcopy *h)
{
    free(h->x);
    free(h->dy);
    free(h->dx);
    free(h->dres);
    free(h->w);
    free(h->dw);
    free(h->rstd);
}

/*
 * The host-side checks of a finished run: the CPU's fp64 reference and
 * verdict (which must agree with the GPU verdict's counts), the padding of
 * dx untouched, and the CPU twin: within tolerance too, and dw bit for bit
 * when rstd is given.
 */
static void verify_host(gprob *p, const char *what)
{
    hcopy h;
    hc_init(&h, p);
    rnk_bwd_args *a = &h.a;
    int64_t m = a->m, n = a->n;
    double *dxr = malloc((size_t)(m * n) * sizeof(double)), *dwr = malloc((size_t)n * sizeof(double));
    assert_non_null(dxr);
    assert_non_null(dwr);
    assert_int_equal(rnk_ref64_bwd(a, dxr, dwr), 0);
    rnk_verdict vh, vg;
    assert_int_equal(rnk_verify(a, dxr, a->dw_dtype != RNK_NONE ? dwr : NULL, &vh), 0);
    if (!vh.ok)
        FAILF("%s (m=%lld n=%lld x%d dy%d dx%d w%d dres%d dw%d): CPU reference: %s", what,
              (long long)m, (long long)n, a->x_dtype, a->dy_dtype, a->dx_dtype, a->w_dtype,
              a->dres_dtype, a->dw_dtype, vh.why);
    char msg[256];
    rnk_bwd_args ad = inputs(p);
    if (rnk_cuda_verify(&ad, st, &vg, msg, sizeof msg) != 0)
        FAILF("%s: rnk_cuda_verify: %s", what, msg);
    if (vg.dx_over1 != vh.dx_over1 || vg.dx_over2 != vh.dx_over2 ||
        vg.dx_nonfinite != vh.dx_nonfinite || vg.ok != vh.ok)
        FAILF("%s: GPU and CPU references disagree: over1 %lld/%lld over2 %lld/%lld", what,
              (long long)vg.dx_over1, (long long)vh.dx_over1, (long long)vg.dx_over2,
              (long long)vh.dx_over2);
    /* padding between rows: still poison */
    if (!p->s.inplace && a->dx_stride > n) {
        size_t es = rnk_dtype_size(a->dx_dtype);
        for (int64_t i = 0; i < m; i++)
            for (size_t b = (size_t)n * es; b < (size_t)a->dx_stride * es; b++)
                if (((uint8_t *)h.dx)[(size_t)i * (size_t)a->dx_stride * es + b] != 0xff)
                    FAILF("%s: dx padding written in row %lld", what, (long long)i);
    }
    /* the CPU twin on the same inputs */
    void *cdx = malloc(p->dxb), *cdw = p->dwb ? malloc(p->dwb) : NULL;
    assert_non_null(cdx);
    rnk_bwd_args c = *a;
    c.dx = cdx;
    c.dw = cdw;
    if (rnk_cpu_bwd(&c, 0, msg, sizeof msg) != 0)
        FAILF("%s: rnk_cpu_bwd: %s", what, msg);
    if (cdw && a->rstd && memcmp(cdw, h.dw, p->dwb) != 0) {
        for (int64_t j = 0; j < n; j++)
            if (rnk_load(a->dw_dtype, cdw, j) != rnk_load(a->dw_dtype, h.dw, j))
                FAILF("%s (m=%lld n=%lld): dw[%lld] GPU %a CPU twin %a (must be bitwise equal)",
                      what, (long long)m, (long long)n, (long long)j,
                      (double)rnk_load(a->dw_dtype, h.dw, j), (double)rnk_load(a->dw_dtype, cdw, j));
    }
    free(cdx);
    free(cdw);
    free(dxr);
    free(dwr);
    hc_free(&h);
}

static void check_spec(const gspec *s, const char *what, bool host)
{
    gprob p;
    gp_init(&p, s);
    run(&p);
    if (host)
        verify_host(&p, what);
    else
        verify_gpu(&p, what);
    gp_free(&p);
}

/* ---- tests ------------------------------------------------------------------ */

/* The GPU fp64 reference against the CPU's, element by element. */
static void test_ref64_cross_check(void **state)
{
    (void)state;
    gspec specs[] = {gs(7, 33, RNK_BF16, RNK_F32, RNK_F32), gs(199, 760, RNK_F16, RNK_F16, RNK_F16),
                     gs(64, 4096, RNK_F32, RNK_NONE, RNK_F32)};
    specs[1].drt = RNK_F32;
    specs[1].offset = 1.0f;
    specs[2].rstd_given = false;
    for (size_t k = 0; k < 3; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        int64_t m = p.a.m, n = p.a.n;
        double *ddx = dalloc((size_t)(m * n) * 8), *ddw = dalloc((size_t)n * 8);
        char msg[256];
        if (rnk_cuda_ref64(&p.a, ddx, ddw, st, msg, sizeof msg) != 0)
            FAILF("rnk_cuda_ref64: %s", msg);
        double *gdx = h2(ddx, (size_t)(m * n) * 8), *gdw = h2(ddw, (size_t)n * 8);
        hcopy h;
        hc_init(&h, &p);
        double *cdx = malloc((size_t)(m * n) * 8), *cdw = malloc((size_t)n * 8);
        assert_int_equal(rnk_ref64_bwd(&h.a, cdx, cdw), 0);
        for (int64_t e = 0; e < m * n; e++)
            if (fabs(gdx[e] - cdx[e]) > 1e-12 * (fabs(cdx[e]) + 1e-3))
                FAILF("ref dx[%lld]: GPU %.17g CPU %.17g", (long long)e, gdx[e], cdx[e]);
        for (int64_t j = 0; j < n; j++)
            if (fabs(gdw[j] - cdw[j]) > 1e-10 * (fabs(cdw[j]) + 1.0))
                FAILF("ref dw[%lld]: GPU %.17g CPU %.17g", (long long)j, gdw[j], cdw[j]);
        free(gdx);
        free(gdw);
        free(cdx);
        free(cdw);
        hc_free(&h);
        cudaFree(ddx);
        cudaFree(ddw);
        gp_free(&p);
    }
}

/* Issue 3's grid: bf16 rows, fp32 or bf16 weight and dw. */
static void test_grid(void **state)
{
    (void)state;
    static const int64_t ms[] = {1, 7, 199, 4096, 8192, 65537};
    /* (3000 and 6000: rows of two vectors a thread on S whose second
     * vector is past n for some threads) */
    static const int64_t ns[] = {1,    33,   192,  256,  512,   760,   1024,  1128,
                                 2048, 3000, 4096, 6000, 8192, 16384, 32768, 65536};
    int k = 0;
    double t0 = now_s();
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++, k++) {
            if (quick && ms[i] * ns[j] > (1 << 20))
                continue;
            rnk_dtype wt = (k & 1) ? RNK_BF16 : RNK_F32;
            gspec s = gs(ms[i], ns[j], RNK_BF16, wt, wt);
            s.rstd_given = (k % 3) != 2;
            char what[64];
            snprintf(what, sizeof what, "grid %lldx%lld", (long long)ms[i], (long long)ns[j]);
            check_spec(&s, what, ms[i] * ns[j] <= (1 << 21));
        }
    printf("grid: %d shapes in %.1f s\n", k, now_s() - t0);
}

static const rnk_dtype FT[3] = {RNK_F32, RNK_F16, RNK_BF16};
static const rnk_dtype WT[4] = {RNK_NONE, RNK_F32, RNK_F16, RNK_BF16};

/* Every combination of x, dy, dx, w (and dres, dw) on a subset of shapes. */
static void test_dtype_combos(void **state)
{
    (void)state;
    static const int64_t shp[][2] = {{199, 760}, {37, 33}, {64, 4096}};
    int k = 0;
    for (int si = 0; si < (quick ? 2 : 3); si++)
        for (int xi = 0; xi < 3; xi++)
            for (int yi = 0; yi < 3; yi++)
                for (int di = 0; di < 3; di++)
                    for (int wi = 0; wi < 4; wi++, k++) {
                        gspec s = {.m = shp[si][0], .n = shp[si][1], .xt = FT[xi], .dyt = FT[yi],
                                   .dxt = FT[di], .wt = WT[wi],
                                   .drt = (k % 4 == 0) ? RNK_NONE : FT[k % 3],
                                   .rstd_given = (k % 2) == 0,
                                   .offset = (k % 3 == 1) ? 1.0f : 0.0f};
                        s.dwt = (wi == 0 || k % 3 == 0) ? RNK_F32
                                                        : (k % 3 == 1 ? WT[wi] : RNK_NONE);
                        check_spec(&s, "dtype combo", true);
                    }
    /* The fast path's own dtype set, each with dres of the rows' type. */
    for (int t = 0; t < 3; t++)
        for (int wi = 0; wi < 4; wi++) {
            gspec s = gs(300, 1024, FT[t], WT[wi], wi == 0 ? RNK_F32 : WT[wi]);
            s.drt = FT[t];
            s.rstd_given = wi != 2;
            check_spec(&s, "fast dtypes", true);
        }
}

static void test_strides_dres_offset_inplace(void **state)
{
    (void)state;
    static const int64_t shp[][2] = {{199, 256}, {57, 130}, {33, 2048}, {9, 8192}};
    for (int si = 0; si < 4; si++)
        for (int v = 0; v < 16; v++) {
            gspec s = gs(shp[si][0], shp[si][1], FT[v % 3], WT[v % 4], RNK_F32);
            s.pad = (v & 1) ? (v & 4 ? 8 : 3) : 0; /* 8 keeps 16-byte rows for bf16 */
            s.drt = (v & 2) ? FT[(v / 2) % 3] : RNK_NONE;
            s.offset = (v & 4) ? 1.0f : 0.0f;
            s.inplace = (v & 8) != 0;
            s.rstd_given = (v % 3) != 0;
            if (s.wt != RNK_NONE && (v & 1))
                s.dwt = s.wt;
            check_spec(&s, "strides/dres/offset/inplace", true);
        }
}

static void test_no_weight_recomputed_rstd(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        gspec s = gs(1000, 1024, FT[t], RNK_NONE, RNK_F32);
        s.rstd_given = false;
        check_spec(&s, "no weight, recomputed rstd", true);
        s.dwt = RNK_NONE;
        check_spec(&s, "no weight, no dw", true);
    }
}

static void test_m_zero(void **state)
{
    (void)state;
    gspec s = gs(0, 256, RNK_BF16, RNK_BF16, RNK_BF16);
    gprob p;
    gp_init(&p, &s);
    run(&p);
    uint16_t *dw = h2(p.dw, p.dwb);
    for (int j = 0; j < 256; j++)
        assert_int_equal(dw[j], 0xffff); /* untouched */
    free(dw);
    gp_free(&p);
}

/* Copy dx and dw to the host. */
static void snap(const gprob *p, void **dx, void **dw)
{
    *dx = h2(p->dx, p->dxb);
    *dw = p->dw ? h2(p->dw, p->dwb) : NULL;
}

static void expect_same(const gprob *p, const void *dx0, const void *dw0, const char *what)
{
    void *dx, *dw;
    snap(p, &dx, &dw);
    if (memcmp(dx, dx0, p->dxb) != 0)
        FAILF("%s: dx bits differ", what);
    if (dw0 && memcmp(dw, dw0, p->dwb) != 0)
        FAILF("%s: dw bits differ", what);
    free(dx);
    free(dw);
}

static void test_repeat_bitwise(void **state)
{
    (void)state;
    gspec specs[] = {gs(4096, 4096, RNK_BF16, RNK_F32, RNK_F32), gs(199, 760, RNK_F16, RNK_F16, RNK_F32),
                     gs(1000, 33, RNK_F32, RNK_BF16, RNK_F32)};
    specs[1].rstd_given = false;
    for (size_t k = 0; k < 3; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        run(&p);
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        int reps = quick ? 5 : 100;
        for (int r = 0; r < reps; r++) {
            run(&p);
            expect_same(&p, dx0, dw0, "repeat");
        }
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
}

/*
 * The cancel word (rnk_bwd_args.cancel): set before the launch, the kernel
 * touches no tensor (the poisoned outputs stay poison, bit for bit) and
 * leaves the workspace clean (the next launch is right); clear, the results
 * are those of a launch without one, bitwise; and a word in pinned host
 * memory (as the daemon keeps them) works the same way.  Fast path, general
 * path, several grids.
 */
static void test_cancel_word(void **state)
{
    (void)state;
    gspec specs[] = {gs(4096, 4096, RNK_BF16, RNK_F32, RNK_F32), gs(3000, 1024, RNK_BF16, RNK_F32, RNK_F32),
                     gs(199, 33, RNK_F16, RNK_F32, RNK_F32)};
    static const int grids[] = {0, 1, 7, 500};
    unsigned *dword = dalloc(sizeof(unsigned)), *hword = NULL, *hdev = NULL;
    CU(cudaHostAlloc((void **)&hword, sizeof(unsigned), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&hdev, hword, 0));
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        run(&p);
        verify_gpu(&p, "cancel: no word");
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++) {
            rnk_cuda_force_grid(dev, grids[gi]);
            for (int where = 0; where < 2; where++) {
                unsigned *word = where ? hdev : dword;
                p.a.cancel = word;
                /* Set: nothing written. */
                if (where)
                    *(volatile unsigned *)hword = 1u;
                else
                    CU(cudaMemsetAsync(dword, 0xff, sizeof(unsigned), st));
                poison(&p);
                CU(cudaStreamSynchronize(st));
                void *px, *pw;
                snap(&p, &px, &pw);
                launch(&p);
                CU(cudaStreamSynchronize(st));
                expect_same(&p, px, pw, "cancelled: outputs untouched");
                free(px);
                free(pw);
                /* Clear: the same bits as without a word. */
                if (where)
                    *(volatile unsigned *)hword = 0u;
                else
                    CU(cudaMemsetAsync(dword, 0, sizeof(unsigned), st));
                run(&p);
                expect_same(&p, dx0, dw0, "cancel word clear");
                p.a.cancel = NULL;
            }
        }
        rnk_cuda_force_grid(dev, 0);
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
    CU(cudaFreeHost(hword));
    cudaFree(dword);
}

/* Bits of dx and dw read on another stream (no wait for st). */
static void snap_on(const gprob *p, cudaStream_t s2, void **dx, void **dw)
{
    *dx = malloc(p->dxb);
    *dw = p->dw ? malloc(p->dwb) : NULL;
    assert_non_null(*dx);
    CU(cudaMemcpyAsync(*dx, p->dx, p->dxb, cudaMemcpyDeviceToHost, s2));
    if (p->dw)
        CU(cudaMemcpyAsync(*dw, p->dw, p->dwb, cudaMemcpyDeviceToHost, s2));
    CU(cudaStreamSynchronize(s2));
}

/* rnk_bwd_args.done: the launch's last block writes the words, the second
 * after the first, both after every output: a host that sees the word in
 * mapped memory and reads the outputs on another stream, without waiting
 * for the launch's stream, finds them complete.  Cancelled launches write
 * them too, m = 0 does not, and every launch path counts its blocks out
 * again (CTR_END is reset): several launches in a row, grids of 1 to 500.
 * Paths: S, the ring, the general one in both orders (16384 x 1024 with
 * padded rows: interleaved), a launch without dw.  Quick (the sanitizers):
 * three of them, two grids. */
static void test_done_words(void **state)
{
    (void)state;
    gspec specs[] = {gs(199, 33, RNK_F16, RNK_F32, RNK_F32),
                     gs(4000, 256, RNK_BF16, RNK_BF16, RNK_BF16),
                     gs(3000, 1024, RNK_BF16, RNK_F32, RNK_NONE),
                     gs(4096, 4096, RNK_BF16, RNK_F32, RNK_F32),
                     gs(16384, 1024, RNK_BF16, RNK_F32, RNK_F32)};
    specs[4].pad = 3;
    static const int grids[] = {0, 7, 1, 500};
    const size_t nspecs = quick ? 3 : sizeof specs / sizeof specs[0];
    const size_t ngrids = quick ? 2 : sizeof grids / sizeof grids[0];
    uint64_t *dword = dalloc(sizeof(uint64_t)), *hword = NULL, *hdev = NULL, v = 0, got = 0;
    unsigned *cword = NULL, *cdev = NULL;
    cudaStream_t s2;
    CU(cudaHostAlloc((void **)&hword, sizeof(uint64_t), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&hdev, hword, 0));
    CU(cudaHostAlloc((void **)&cword, sizeof(unsigned), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&cdev, cword, 0));
    CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    for (size_t k = 0; k < nspecs; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        run(&p);
        verify_gpu(&p, "done words: none");
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        for (size_t gi = 0; gi < ngrids; gi++) {
            rnk_cuda_force_grid(dev, grids[gi]);
            for (int c = 0; c < 4; c++) {
                /* 0: no cancel word; 1: a clear one; 2: done[1] NULL; 3: cancelled */
                bool cancel = c == 3, one = c == 2;
                *(volatile unsigned *)cword = cancel ? 1u : 0u;
                p.a.cancel = c ? cdev : NULL;
                v = 0x8000000100000000ull + (seq++ << 8) + (uint64_t)c; /* both halves */
                *(volatile uint64_t *)hword = 0;
                CU(cudaMemsetAsync(dword, 0, sizeof(uint64_t), st));
                poison(&p);
                void *px = NULL, *pw = NULL;
                if (cancel) {
                    CU(cudaStreamSynchronize(st));
                    snap(&p, &px, &pw);
                }
                p.a.done[0] = hdev;
                p.a.done[1] = one ? NULL : dword;
                p.a.done_value = v;
                launch(&p);
                double t0 = now_s();
                while (*(volatile uint64_t *)hword != v)
                    if (now_s() - t0 > 20)
                        FAILF("grid %d: the done word never came (%llx)", grids[gi],
                              (unsigned long long)*(volatile uint64_t *)hword);
                void *dx, *dw;
                snap_on(&p, s2, &dx, &dw);
                const void *ex = cancel ? px : dx0, *ew = cancel ? pw : dw0;
                if (memcmp(dx, ex, p.dxb) != 0 || (ew && memcmp(dw, ew, p.dwb) != 0))
                    FAILF("m=%lld n=%lld grid %d case %d: outputs not complete at done",
                          (long long)p.s.m, (long long)p.s.n, grids[gi], c);
                free(dx);
                free(dw);
                free(px);
                free(pw);
                CU(cudaStreamSynchronize(st));
                CU(cudaMemcpy(&got, dword, sizeof got, cudaMemcpyDeviceToHost));
                if (got != (one ? 0 : v))
                    FAILF("grid %d case %d: device word %llx", grids[gi], c,
                          (unsigned long long)got);
                p.a.done[0] = p.a.done[1] = NULL;
                p.a.cancel = NULL;
            }
        }
        rnk_cuda_force_grid(dev, 0);
        /* Without words, the same bits as before. */
        run(&p);
        expect_same(&p, dx0, dw0, "after the done words");
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
    /* m = 0: no launch, no word. */
    gspec z = gs(0, 64, RNK_BF16, RNK_F32, RNK_F32);
    gprob p;
    gp_init(&p, &z);
    *(volatile uint64_t *)hword = 7;
    p.a.done[0] = hdev;
    p.a.done_value = 9;
    launch(&p);
    CU(cudaStreamSynchronize(st));
    assert_int_equal(*(volatile uint64_t *)hword, 7);
    gp_free(&p);
    CU(cudaStreamDestroy(s2));
    CU(cudaFreeHost(hword));
    CU(cudaFreeHost(cword));
    cudaFree(dword);
}

/* rnk_bwd_args.gate (the daemon's armed calls): a launch whose gate word is
 * below its key touches no tensor and writes no done word, and leaves the
 * workspace clean (the next launch, gated open, runs as usual); at or above
 * the key it runs; the cancel word wins over an open gate (done words
 * written, outputs untouched), a shut gate over the cancel word (nothing
 * written); a shut gate sets its latch to its epoch and key, and a latch
 * at the launch's epoch shuts an open gate (rnk_bwd_args.latch).  Grids of 1 to
 * 500 and every launch path, as test_done_words. */
static void test_gate_word(void **state)
{
    (void)state;
    gspec specs[] = {gs(199, 33, RNK_F16, RNK_F32, RNK_F32),
                     gs(4000, 256, RNK_BF16, RNK_BF16, RNK_BF16),
                     gs(4096, 4096, RNK_BF16, RNK_F32, RNK_F32),
                     gs(16384, 1024, RNK_BF16, RNK_F32, RNK_F32)};
    specs[3].pad = 3;
    static const int grids[] = {0, 1, 500};
    const size_t nspecs = quick ? 2 : sizeof specs / sizeof specs[0];
    const size_t ngrids = quick ? 2 : sizeof grids / sizeof grids[0];
    uint64_t *words = NULL, *wdev = NULL; /* [0] done, [1] gate, [2..3] latch */
    unsigned *cword = NULL, *cdev = NULL;
    CU(cudaHostAlloc((void **)&words, 4 * sizeof(uint64_t), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&wdev, words, 0));
    CU(cudaHostAlloc((void **)&cword, sizeof(unsigned), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&cdev, cword, 0));
    for (size_t k = 0; k < nspecs; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        run(&p);
        verify_gpu(&p, "gate: none");
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        for (size_t gi = 0; gi < ngrids; gi++) {
            rnk_cuda_force_grid(dev, grids[gi]);
            uint64_t latch_key = 0;
            /* 0: shut (gate = key - 1); 1: open (= key); 2: open (> key);
             * 3: shut, cancelled; 4: open, cancelled; with a latch: 5 shut
             * (it latches), 6 open but latched (the epoch of 5), 7 open in
             * the next epoch; 8 shut, the word at key - 1 with bit 62 set
             * (the daemon's bit of a ready word, left out of the compare) */
            for (int c = 0; c < 9; c++) {
                const uint64_t key = 0x0000000500000000ull + (seq++ << 4);
                const bool shut = c == 0 || c == 3 || c == 5 || c == 6 || c == 8,
                           cancel = c == 3 || c == 4;
                const uint64_t epoch = 0x1000u + (uint64_t)gi * 16u + (c == 7 ? 1u : 0u);
                if (c == 5) {
                    *(volatile uint64_t *)&words[2] = epoch - 1; /* (not this epoch's) */
                    *(volatile uint64_t *)&words[3] = 0;
                }
                *(volatile unsigned *)cword = cancel ? 1u : 0u;
                *(volatile uint64_t *)&words[0] = 0;
                *(volatile uint64_t *)&words[1] = c == 8 ? (1ull << 62) | (key - 1)
                                                  : c == 0 || c == 3 || c == 5 ? key - 1
                                                  : c == 2 ? key + 99
                                                           : key;
                poison(&p);
                CU(cudaStreamSynchronize(st));
                void *px = NULL, *pw = NULL;
                snap(&p, &px, &pw);
                p.a.cancel = cdev;
                p.a.gate = &wdev[1];
                p.a.gate_key = key;
                p.a.latch = c >= 5 && c <= 7 ? &wdev[2] : NULL;
                p.a.latch_epoch = epoch;
                p.a.done[0] = &wdev[0];
                p.a.done_value = key;
                launch(&p);
                CU(cudaStreamSynchronize(st));
                const bool ran = !shut && !cancel, done = !shut;
                if (*(volatile uint64_t *)&words[0] != (done ? key : 0))
                    FAILF("m=%lld grid %d case %d: done word %llx", (long long)p.s.m,
                          grids[gi], c, (unsigned long long)*(volatile uint64_t *)&words[0]);
                /* (5 latches with its key; 6 leaves it; 7, the next epoch, too) */
                if (c >= 5 && c <= 7 &&
                    (*(volatile uint64_t *)&words[2] != (c == 7 ? epoch - 1 : epoch) ||
                     *(volatile uint64_t *)&words[3] != (c == 5 ? key : latch_key)))
                    FAILF("m=%lld grid %d case %d: latch %llx / %llx, expected %llx / %llx",
                          (long long)p.s.m, grids[gi], c,
                          (unsigned long long)*(volatile uint64_t *)&words[2],
                          (unsigned long long)*(volatile uint64_t *)&words[3],
                          (unsigned long long)(c == 7 ? epoch - 1 : epoch),
                          (unsigned long long)(c == 5 ? key : latch_key));
                if (c == 5)
                    latch_key = key;
                expect_same(&p, ran ? dx0 : px, ran ? dw0 : pw,
                            ran ? "gate open: the usual bits" : "gated or cancelled: untouched");
                free(px);
                free(pw);
                p.a.cancel = NULL;
                p.a.gate = NULL;
                p.a.latch = NULL;
                p.a.done[0] = NULL;
            }
        }
        rnk_cuda_force_grid(dev, 0);
        run(&p);
        expect_same(&p, dx0, dw0, "after gated launches");
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
    CU(cudaFreeHost(words));
    CU(cudaFreeHost(cword));
}

/* The daemon's armed calls in the order it makes them (daemon/cuda/submit.c,
 * daemon/ring_arm.c): the stream waits for ready >= key (cyclic, as the
 * driver compares), the launch after it is gated on the client's ready
 * word, bit 62 left out, with the ring's latch, and then either the client
 * stores ready (the call runs), or the daemon sets bit 62 of ready with an
 * atomic OR (a revocation: the wait passes, the call must do nothing, and
 * the daemon arms the next calls in a new epoch), at a random moment
 * before or after the GPU reached the wait.  Every 8th round two calls are
 * queued and revoked together: the bit releases both, the first skips,
 * then the client's ready comes past the second, whose gate is open by
 * then: the latch must skip it too.  The words are pinned, mapped memory,
 * as the ring's and the daemon's are.  Run: done = key and the usual
 * bits; skipped: done as it was and nothing written. */
typedef CUresult (*wait64_fn)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
#define RAISED (1ull << 62) /* (RNP_RING_READY_RAISED: the daemon's bit of ready) */

static void test_gate_stream(void **state)
{
    (void)state;
    wait64_fn wait64 = (wait64_fn)rn_cuda_entry("cuStreamWaitValue64");
    if (!wait64)
        RN_SKIP("the driver has no cuStreamWaitValue64");
    /* the ring path, then S */
    gspec specs[] = {gs(4000, 256, RNK_BF16, RNK_BF16, RNK_BF16),
                     gs(8192, 1024, RNK_BF16, RNK_F32, RNK_F32)};
    const int iters = quick ? 40 : 400;
    uint64_t *words = NULL, *wdev = NULL; /* [0] done, [1] unused, [2] ready, [3..4] latch */
    unsigned *cword = NULL, *cdev = NULL;
    CU(cudaHostAlloc((void **)&words, 5 * sizeof(uint64_t), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&wdev, words, 0));
    CU(cudaHostAlloc((void **)&cword, sizeof(unsigned), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&cdev, cword, 0));
    cudaEvent_t ev;
    CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *(volatile unsigned *)cword = 0;
    uint64_t rs = seed ^ 0x5bd1e995u;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        run(&p);
        verify_gpu(&p, "gate stream: none");
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        uint8_t *ones = malloc(p.dxb > p.dwb ? p.dxb : p.dwb);
        assert_non_null(ones);
        memset(ones, 0xff, p.dxb > p.dwb ? p.dxb : p.dwb);
        const uint64_t base = 0x0000000700000000ull + ((uint64_t)k << 20);
        uint64_t epoch = 1;
        __atomic_store_n(&words[0], base, __ATOMIC_RELAXED);
        __atomic_store_n(&words[1], base, __ATOMIC_RELAXED);
        __atomic_store_n(&words[2], base, __ATOMIC_RELAXED);
        __atomic_store_n(&words[3], 0, __ATOMIC_RELEASE);
        int runs = 0, backs = 0, latched = 0;
        uint64_t key = base;
        for (int i = 1; i <= iters; i++) {
            const uint64_t done_before = words[0];
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            const bool pair = i % 8 == 0;                          /* two, both skipped */
            const bool open = !pair && (rs >> 60) % 4 != 0;        /* else 3 in 4 run */
            const uint64_t delay_ns = (rs >> 20) % 60000;          /* 0-60 us */
            const bool check = i % 10 == 0 || !open;
            if (check)
                poison(&p);
            char msg[256];
            need_ws(p.a.m, p.a.n);
            for (int j = 0; j < (pair ? 2 : 1); j++) {
                key++;
                if (wait64((CUstream)st, (CUdeviceptr)(uintptr_t)&wdev[2], key,
                           CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
                    FAILF("cuStreamWaitValue64 on pinned mapped memory failed");
                p.a.cancel = cdev;
                p.a.gate = &wdev[2];
                p.a.gate_key = key;
                p.a.latch = &wdev[3];
                p.a.latch_epoch = epoch;
                p.a.done[0] = &wdev[0];
                p.a.done_value = key;
                if (rnk_cuda_bwd(dev, &p.a, ws, wsb, st, msg, sizeof msg) != 0) {
                    __atomic_fetch_or(&words[2], RAISED, __ATOMIC_SEQ_CST); /* (the wait ends) */
                    FAILF("rnk_cuda_bwd: %s", msg);
                }
                if (pair && j == 0)
                    CU(cudaEventRecord(ev, st));
            }
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do
                clock_gettime(CLOCK_MONOTONIC, &t1);
            while ((uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t1.tv_nsec -
                       (uint64_t)t0.tv_nsec < delay_ns);
            if (pair) {
                /* the bit releases both, the first skips; then the
                 * client's ready past the second, whose gate is then open
                 * but latched */
                __atomic_fetch_or(&words[2], RAISED, __ATOMIC_SEQ_CST);
                CU(cudaEventSynchronize(ev));
                __atomic_store_n(&words[2], key, __ATOMIC_RELEASE);
            } else if (open) {
                __atomic_store_n(&words[2], key, __ATOMIC_RELEASE);
            } else {
                __atomic_fetch_or(&words[2], RAISED, __ATOMIC_SEQ_CST);
            }
            CU(cudaStreamSynchronize(st));
            const uint64_t d = __atomic_load_n(&words[0], __ATOMIC_ACQUIRE);
            if (d != (open ? key : done_before))
                FAILF("m=%lld n=%lld call %d (%s): done %llx, expected %llx", (long long)p.s.m,
                      (long long)p.s.n, i, open ? "run" : "taken back", (unsigned long long)d,
                      (unsigned long long)(open ? key : done_before));
            /* the latch: this epoch, and the first key that skipped */
            const uint64_t first = pair ? key - 1 : key;
            if (!open && (__atomic_load_n(&words[3], __ATOMIC_ACQUIRE) != epoch ||
                          __atomic_load_n(&words[4], __ATOMIC_ACQUIRE) != first))
                FAILF("m=%lld n=%lld call %d taken back: latch %llx / %llx, expected %llx / %llx",
                      (long long)p.s.m, (long long)p.s.n, i, (unsigned long long)words[3],
                      (unsigned long long)words[4], (unsigned long long)epoch,
                      (unsigned long long)first);
            if (check && open) {
                expect_same(&p, dx0, dw0, "gate stream: the call ran");
            } else if (check) {
                void *dx, *dw;
                snap(&p, &dx, &dw);
                if (memcmp(dx, ones, p.dxb) != 0 || (dw && memcmp(dw, ones, p.dwb) != 0))
                    FAILF("m=%lld n=%lld call %d taken back: its outputs were written",
                          (long long)p.s.m, (long long)p.s.n, i);
                free(dx);
                free(dw);
            }
            if (open) {
                runs++;
            } else {
                /* the daemon: what was taken back is taken again (here:
                 * its ready comes, which clears the bit; the next key) in
                 * a new epoch */
                backs += pair ? 2 : 1;
                latched += pair;
                epoch++;
                __atomic_store_n(&words[2], key, __ATOMIC_RELEASE);
            }
        }
        p.a.cancel = NULL;
        p.a.gate = NULL;
        p.a.latch = NULL;
        p.a.done[0] = NULL;
        run(&p);
        expect_same(&p, dx0, dw0, "after the gated calls");
        printf("gate stream m=%lld n=%lld: %d run, %d taken back (%d by the latch)\n",
               (long long)p.s.m, (long long)p.s.n, runs, backs, latched);
        free(ones);
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
    CU(cudaEventDestroy(ev));
    CU(cudaFreeHost(words));
    CU(cudaFreeHost(cword));
}

static void test_grid_invariance(void **state)
{
    (void)state;
    /* rnk.h's interleaved order: S (4096 x 4096: one row of 8 warps;
     * 4096 x 8192: one row of 16 warps, one chunk a block; 4096 x 3000
     * and 4096 x 6000: rows part of whose threads' second vector is past n;
     * 4096 x 1024: one row of four warps; 32768 x 512, 8192 x 512 and
     * 12288 x 384: two rows of two warps a block; 65536 x 256, 32768 x 256
     * and 98304 x 200: four rows of a warp; each of those twice in a block
     * up to 1024 columns) and the general path (unaligned rows, 16384 x
     * 1024, 32768 x 512, 4096 x 512 and 65536 x 256).  The contiguous
     * order: the ring path (bf16/fp16 rows at n <= 256 below 2^20 elements
     * and other small shapes, fp32 rows, rows wider than 8192) and the
     * general path (199 x 33). */
    gspec specs[] = {
        gs(4096, 4096, RNK_BF16, RNK_F32, RNK_F32),  gs(4000, 256, RNK_BF16, RNK_BF16, RNK_BF16),
        gs(199, 33, RNK_F16, RNK_F32, RNK_F32),      gs(3000, 1024, RNK_BF16, RNK_F32, RNK_F32),
        gs(2500, 2048, RNK_F16, RNK_F16, RNK_F16),   gs(777, 512, RNK_BF16, RNK_BF16, RNK_F32),
        gs(1000, 16384, RNK_BF16, RNK_F32, RNK_F32), gs(1500, 8192, RNK_BF16, RNK_F32, RNK_F32),
        gs(3000, 1024, RNK_F32, RNK_F32, RNK_F32),   gs(32768, 512, RNK_F16, RNK_F16, RNK_F16),
        gs(16384, 1024, RNK_BF16, RNK_F32, RNK_F32), gs(32768, 512, RNK_BF16, RNK_BF16, RNK_F32),
        gs(65536, 256, RNK_BF16, RNK_F32, RNK_F32),  gs(98304, 200, RNK_F16, RNK_F16, RNK_F16),
        gs(65536, 256, RNK_BF16, RNK_BF16, RNK_F32), gs(8192, 512, RNK_BF16, RNK_F32, RNK_F32),
        gs(12288, 384, RNK_F16, RNK_F16, RNK_F16),   gs(4096, 8192, RNK_BF16, RNK_BF16, RNK_F32),
        gs(4096, 3000, RNK_BF16, RNK_F32, RNK_F32),  gs(4096, 6000, RNK_F16, RNK_F16, RNK_F32),
        gs(4096, 1024, RNK_F16, RNK_F16, RNK_F32),   gs(4096, 512, RNK_BF16, RNK_F32, RNK_F32),
        gs(32768, 256, RNK_BF16, RNK_BF16, RNK_BF16)};
    specs[4].rstd_given = false;
    specs[16].rstd_given = false;
    specs[10].pad = 3;
    specs[11].pad = 3;
    specs[11].rstd_given = false;
    specs[13].rstd_given = false;
    specs[14].pad = 3;
    specs[19].rstd_given = false;
    specs[20].rstd_given = false;
    specs[21].pad = 3;
    static const int grids[] = {1, 2, 3, 7, 64, 132, 500, 2000};
    const size_t nspecs = sizeof specs / sizeof specs[0];
    for (size_t k = 0; k < (quick ? 3 : nspecs); k++) {
        gprob p;
        gp_init(&p, &specs[k]);
        rnk_cuda_force_grid(dev, 0);
        run(&p);
        void *dx0, *dw0;
        snap(&p, &dx0, &dw0);
        for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
            /* (the general path through 2^24 elements: seconds on fewer blocks) */
            if (specs[k].pad && specs[k].m * specs[k].n >= (1 << 24) && grids[g] < 7)
                continue;
            rnk_cuda_force_grid(dev, grids[g]);
            run(&p);
            char what[64];
            snprintf(what, sizeof what, "grid of %d blocks, shape %zu", grids[g], k);
            expect_same(&p, dx0, dw0, what);
        }
        rnk_cuda_force_grid(dev, 0);
        verify_gpu(&p, "grid invariance");
        free(dx0);
        free(dw0);
        gp_free(&p);
    }
}

static void test_graph_replay(void **state)
{
    (void)state;
    gspec s = quick ? gs(199, 760, RNK_BF16, RNK_F32, RNK_F32) : gs(2048, 1024, RNK_BF16, RNK_F32, RNK_F32);
    gprob p;
    gp_init(&p, &s);
    run(&p); /* warm: occupancy cached, nothing but the launch is captured */
    void *dx0, *dw0;
    snap(&p, &dx0, &dw0);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    launch(&p);
    CU(cudaStreamEndCapture(st, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < (quick ? 5 : 20); r++) {
        poison(&p);
        CU(cudaGraphLaunch(ge, st));
        if (r % 5 == 4) /* interleave ordinary launches with replays */
            launch(&p);
        CU(cudaStreamSynchronize(st));
        expect_same(&p, dx0, dw0, "graph replay");
    }
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    verify_gpu(&p, "graph replay");
    free(dx0);
    free(dw0);
    gp_free(&p);
}

/* Launches queued back to back on one stream and workspace, each into its
 * own poisoned outputs: every one must be complete. */
static void test_back_to_back(void **state)
{
    (void)state;
    enum { K = 12 };
    gspec s = gs(199, 760, RNK_BF16, RNK_F32, RNK_F32);
    gprob p[K];
    for (int k = 0; k < K; k++) {
        s.n = (k & 1) ? 760 : 4096; /* alternate paths' geometry too */
        s.m = (k & 2) ? 199 : 4096;
        gp_init(&p[k], &s);
        need_ws(s.m, s.n);
    }
    for (int k = 0; k < K; k++)
        poison(&p[k]);
    for (int k = 0; k < K; k++)
        launch(&p[k]);
    CU(cudaStreamSynchronize(st));
    for (int k = 0; k < K; k++) {
        verify_gpu(&p[k], "back to back");
        gp_free(&p[k]);
    }
}

/* Another stream holds all SMs but two; the kernel must still finish while it
 * does (with the automatic grid, a tiny one and a huge one). */
static void test_no_deadlock_stream(void **state)
{
    (void)state;
    int sms = rnk_cuda_sm_count(dev);
    int *flags = NULL, *flags_d = NULL;
    CU(cudaHostAlloc((void **)&flags, 2 * sizeof(int), cudaHostAllocMapped));
    CU(cudaHostGetDevicePointer((void **)&flags_d, flags, 0));
    cudaStream_t hs;
    CU(cudaStreamCreateWithFlags(&hs, cudaStreamNonBlocking));
    gspec s = gs(8192, 4096, RNK_BF16, RNK_F32, RNK_F32);
    gprob p;
    gp_init(&p, &s);
    need_ws(s.m, s.n);
    static const int grids[] = {0, 1, 3, 4000};
    for (size_t gi = 0; gi < 4; gi++) {
        char msg[256];
        flags[0] = flags[1] = 0;
        if (rnk_cuda_hog(sms - 2, flags_d, flags_d + 1, 30000, hs, msg, sizeof msg) != 0)
            FAILF("hog: %s", msg);
        double t0 = now_s();
        while (!*(volatile int *)&flags[1]) {
            if (now_s() - t0 > 10)
                FAILF("hog kernel did not start");
            struct timespec ps = {0, 100000};
            nanosleep(&ps, NULL);
        }
        rnk_cuda_force_grid(dev, grids[gi]);
        poison(&p);
        cudaEvent_t ev;
        CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        launch(&p);
        CU(cudaEventRecord(ev, st));
        t0 = now_s();
        cudaError_t q;
        while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
            if (now_s() - t0 > 20) {
                *(volatile int *)&flags[0] = 1;
                FAILF("kernel (grid %d) did not finish within 20 s beside the hog", grids[gi]);
            }
            struct timespec ps = {0, 200000};
            nanosleep(&ps, NULL);
        }
        CU(q);
        /* The hog must still be running: the kernel finished on 2 SMs. */
        cudaError_t hq = cudaStreamQuery(hs);
        *(volatile int *)&flags[0] = 1;
        CU(cudaStreamSynchronize(hs));
        if (hq != cudaErrorNotReady)
            FAILF("hog ended before the kernel: the test proved nothing (grid %d)", grids[gi]);
        printf("no deadlock beside a %d-SM hog: grid %d finished in %.3f s\n", sms - 2, grids[gi],
               now_s() - t0);
        CU(cudaEventDestroy(ev));
        verify_gpu(&p, "beside a hog");
    }
    rnk_cuda_force_grid(dev, 0);
    gp_free(&p);
    CU(cudaStreamDestroy(hs));
    CU(cudaFreeHost(flags));
}

/* Another process runs a long kernel on every SM. */
static void test_no_deadlock_process(void **state)
{
    (void)state;
    char hog[4096];
    const char *b = getenv("RN_BUILD");
    if (b)
        snprintf(hog, sizeof hog, "%s/tests/gpu/prog_hog", b);
    else {
        snprintf(hog, sizeof hog, "%s", self_path);
        char *sl = strrchr(hog, '/');
        snprintf(sl ? sl + 1 : hog, sizeof hog - (size_t)(sl ? sl + 1 - hog : 0), "prog_hog");
    }
    if (access(hog, X_OK) != 0)
        FAILF("%s: %s", hog, strerror(errno));
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char *argv[] = {hog, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, hog, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0)
        FAILF("spawn %s: %s", hog, strerror(rc));
    struct pollfd pf = {.fd = out[0], .events = POLLIN};
    char line[64] = "";
    if (poll(&pf, 1, 30000) != 1 || read(out[0], line, sizeof line - 1) <= 0 ||
        strncmp(line, "ready", 5) != 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        FAILF("prog_hog did not get ready: '%s'", line);
    }
    gspec s = gs(4096, 4096, RNK_BF16, RNK_BF16, RNK_BF16);
    gprob p;
    gp_init(&p, &s);
    static const int grids[] = {0, 1, 2000};
    for (int gi = 0; gi < 3; gi++) {
        rnk_cuda_force_grid(dev, grids[gi]);
        poison(&p);
        cudaEvent_t ev;
        CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        launch(&p);
        CU(cudaEventRecord(ev, st));
        double t0 = now_s();
        cudaError_t q;
        while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
            if (now_s() - t0 > 30) {
                kill(pid, SIGKILL);
                FAILF("kernel (grid %d) did not finish within 30 s beside another process",
                      grids[gi]);
            }
            struct timespec ps = {0, 200000};
            nanosleep(&ps, NULL);
        }
        CU(q);
        printf("no deadlock beside another process's kernel: grid %d in %.3f s\n", grids[gi],
               now_s() - t0);
        CU(cudaEventDestroy(ev));
        verify_gpu(&p, "beside another process");
    }
    rnk_cuda_force_grid(dev, 0);
    (void)!write(in[1], "stop\n", 5);
    close(in[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    close(out[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAILF("prog_hog exited with status %d", status);
    gp_free(&p);
}

static void test_bad_args(void **state)
{
    (void)state;
    gspec s = gs(64, 256, RNK_BF16, RNK_F32, RNK_F32);
    gprob p;
    gp_init(&p, &s);
    need_ws(64, 256);
    char msg[256];
    rnk_bwd_args a = p.a;
    a.n = 0;
    assert_int_equal(rnk_cuda_bwd(dev, &a, ws, wsb, st, msg, sizeof msg), RNK_EINVAL);
    assert_true(strncmp(msg, "n:", 2) == 0);
    a = p.a;
    assert_int_equal(rnk_cuda_bwd(dev, &a, ws, 64, st, msg, sizeof msg), RNK_EINVAL);
    assert_true(strncmp(msg, "ws:", 3) == 0);
    CU(cudaStreamSynchronize(st));
    uint16_t *dx = h2(p.dx, p.dxb);
    for (size_t i = 0; i < p.dxb / 2; i++)
        assert_int_equal(dx[i], 0xffff); /* nothing launched */
    free(dx);
    gp_free(&p);
}

static int setup(void **state)
{
    (void)state;
    char msg[256];
    if (cudaSetDeviceFlags(cudaDeviceMapHost) != cudaSuccess)
        (void)cudaGetLastError();
    if (rnk_cuda_init(0, &dev, msg, sizeof msg) != 0) {
        fprintf(stderr, "rnk_cuda_init: %s\n", msg);
        return -1;
    }
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cudaFree(ws);
    cudaStreamDestroy(st);
    rnk_cuda_fini(dev);
    return 0;
}

/* After each test: a forced grid left by a test that failed half-way must
 * not carry into the next ones. */
static int reset_grid(void **state)
{
    (void)state;
    if (dev)
        rnk_cuda_force_grid(dev, 0);
    return 0;
}

#define T(f) cmocka_unit_test_teardown(f, reset_grid)

int main(int argc, char **argv)
{
    (void)argc;
    self_path = argv[0];
    const char *e = getenv("RN_SEED");
    seed = e ? strtoull(e, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    quick = getenv("RNK_GPU_QUICK") && atoi(getenv("RNK_GPU_QUICK")) != 0;
    printf("test_kernel_gpu: seed %llu%s\n", (unsigned long long)seed, quick ? " (quick subset)" : "");
    const struct CMUnitTest all[] = {
        T(test_ref64_cross_check),
        T(test_bad_args),
        T(test_m_zero),
        T(test_dtype_combos),
        T(test_strides_dres_offset_inplace),
        T(test_no_weight_recomputed_rstd),
        T(test_repeat_bitwise),
        T(test_grid_invariance),
        T(test_graph_replay),
        T(test_back_to_back),
        T(test_cancel_word),
        T(test_done_words),
        T(test_gate_word),
        T(test_gate_stream),
        T(test_grid),
        T(test_no_deadlock_stream),
        T(test_no_deadlock_process),
    };
    /* RNK_GPU_TESTS=a,b,c runs only the tests whose names contain a, b or c. */
    const char *only = getenv("RNK_GPU_TESTS");
    struct CMUnitTest pick[sizeof all / sizeof all[0]];
    size_t np = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        bool take = only == NULL;
        for (const char *t = only; t && *t && !take;) {
            const char *c = strchr(t, ',');
            size_t len = c ? (size_t)(c - t) : strlen(t);
            char tok[64];
            snprintf(tok, sizeof tok, "%.*s", (int)len, t);
            take = len > 0 && strstr(all[i].name, tok) != NULL;
            t = c ? c + 1 : t + len;
        }
        if (take)
            pick[np++] = all[i];
    }
    return _cmocka_run_group_tests("test_kernel_gpu", pick, np, setup, teardown);
}
