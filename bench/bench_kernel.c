/* SPDX-License-Identifier: MIT */
/*
 * bench_kernel.c - the kernel benchmark of issue 3, in one run on one GPU.
 *
 * For M in {4096 .. 65536} x N in {256 .. 8192}, bf16 x/dy/dx, rstd given,
 * with an fp32 weight (fp32 dw) and a bf16 weight (bf16 dw), it times:
 *   fused     the production kernel (deterministic, one launch);
 *   separate  the same kernel with dw finished by a second kernel;
 *   atomic    the same kernel with dw finished by fp32 atomics;
 * as the median of many launches, each bracketed by CUDA events, queued
 * behind a short spin kernel so that the host's enqueue rate never shows,
 * and rotating over enough input sets that L2 (60 MB on the H200) cannot
 * serve them.  Effective bandwidth counts 6MN + 4M + weight + dw bytes.  The
 * device-to-device copy bandwidth is measured in the same run (bytes read +
 * written) and is the limit.  PyTorch's numbers (eager F.rms_norm backward
 * and torch.compile of the formula, default and with deterministic
 * algorithms) and Quack's rmsnorm_bwd come from bench/kernel_torch.py through
 * --torch FILE.csv.
 *
 * Usage: bench_kernel [--quick] [--out DIR] [--torch FILE.csv] [--reps N]
 *                     [--shape M,N[,w][+M,N[,w]...]] [--cancel host|device] [--reverse]
 *                     [--launches] [--floor]
 * --shape: only these shapes, in this order (any M and N; w defaults to f32),
 * without the copy-bandwidth runs unless --floor (4.24 TB/s is assumed for %copy).
 * --launches: also write every timed launch's microseconds, in the order
 * they ran, to DIR/launches.csv (m,n,w,variant,i,us).
 * --floor (a -DRNK_BENCH_VARIANTS=1 build): also time, the same way, an
 * empty kernel launched as each shape's production launch and one of one
 * warp (the launch's and the events' own cost), and streaming kernels dx =
 * x + dy over the same input sets (rnk_cuda_add_launch: a plain one, and
 * ones shaped as the S plan): what moving the same bytes with nothing else
 * to do reaches (DIR/floor.csv; kernel_floor.c); the copy bandwidth too.
 * --reverse: time the variants last to first at each shape (does a number
 * follow the variant or its place in the run?).  --cancel: every launch
 * carries a clear cancel word (rnk_bwd_args.cancel) in pinned mapped host
 * memory (as the daemon's fast path gives it) or device memory.
 * Writes DIR/kernel.csv and DIR/kernel.json (DIR is made if missing; its
 * parent must exist); prints a table and the targets (kernel_report.c).
 * bench_kernel --trace [M,N[,w][+M,N[,w]...]] (repeatable; a build with
 * -DRNK_TRACE=1 only) instead prints per-block timelines of the production
 * launch (kernel_trace.c), CSVs in --out DIR when given.
 * bench_kernel --accuracy DIR instead measures dx's accuracy on the inputs
 * kernel_torch.py --accuracy DIR wrote (kernel_accuracy.c).
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gpu/e2e_cuda.h"
#include "kernel_accuracy.h"
#include "kernel_floor.h"
#include "kernel_report.h"
#include "kernel_trace.h"
#include "rnk_test.h"

#define CU(call) RNE_CK(call)

enum { NV = KR_NV };
static const char *vname[NV] = {"fused", "separate", "atomic"};
static bool g_reverse; /* --reverse: the variants timed last to first */
static FILE *g_launches; /* --launches: every timed launch */
static bool g_floor;     /* --floor: empty kernels too */

typedef kr_row row;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static rnk_device *dev;
static cudaStream_t st;
static const unsigned *cancel_word; /* --cancel: every launch reads it (clear) */
static int *hog_flags_d;

/* Hold the stream for ~ms so the launches behind it queue up. */
static void delay(unsigned ms)
{
    char msg[256];
    if (rnk_cuda_hog(1, hog_flags_d, hog_flags_d + 1, ms, st, msg, sizeof msg) != 0) {
        fprintf(stderr, "delay: %s\n", msg);
        exit(1);
    }
}

static double copy_bandwidth(void)
{
    size_t b = (size_t)4 << 30;
    void *s, *d;
    CU(cudaMalloc(&s, b));
    CU(cudaMalloc(&d, b));
    CU(cudaMemset(s, 1, b));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double t[12];
    for (int i = 0; i < 12; i++) {
        CU(cudaEventRecord(e0, st));
        CU(cudaMemcpyAsync(d, s, b, cudaMemcpyDeviceToDevice, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        t[i] = ms;
    }
    double med = median(t + 2, 10);
    CU(cudaFree(s));
    CU(cudaFree(d));
    return 2.0 * (double)b / (med * 1e-3);
}

/* The input sets a shape's launches rotate over: bf16 x, dy and dx, a weight
 * (fp32 or bf16, with dw of its dtype) and rstd given, enough sets that L2
 * (60 MB on the H200) cannot serve them. */
typedef struct sets {
    int n;
    rnk_bwd_args *a;
    void *w, *dw;
    float *rstd;
} sets;

static void make_sets(sets *S, int64_t m, int64_t n, bool wf)
{
    rnk_dtype wt = wf ? RNK_F32 : RNK_BF16;
    size_t rowsb = (size_t)(m * n) * 2;
    double setb = 3.0 * (double)rowsb;
    int nsets = (int)ceil(240e6 / setb);
    if (nsets < 2)
        nsets = 2;
    if (nsets > 64)
        nsets = 64;
    char msg[256];
    S->n = nsets;
    S->a = calloc((size_t)nsets, sizeof *S->a);
    CU(cudaMalloc(&S->w, (size_t)n * 4));
    CU(cudaMalloc(&S->dw, (size_t)n * 4));
    CU(cudaMalloc((void **)&S->rstd, (size_t)m * 4 * nsets));
    rnk_cuda_fill(wt, S->w, 1, n, n, 7, 0.3f, 1.0f, st, msg, sizeof msg);
    for (int s = 0; s < nsets; s++) {
        rnk_bwd_args *a = &S->a[s];
        void *x, *dy, *dx;
        CU(cudaMalloc(&x, rowsb));
        CU(cudaMalloc(&dy, rowsb));
        CU(cudaMalloc(&dx, rowsb));
        rnk_cuda_fill(RNK_BF16, x, m, n, n, 100 + s, 1.0f, 0.1f, st, msg, sizeof msg);
        rnk_cuda_fill(RNK_BF16, dy, m, n, n, 200 + s, 1.0f, 0.0f, st, msg, sizeof msg);
        rnk_cuda_rstd(RNK_BF16, x, m, n, n, 1e-5f, S->rstd + (size_t)s * m, st, msg, sizeof msg);
        memset(a, 0, sizeof *a);
        a->m = m;
        a->n = n;
        a->x_dtype = a->dy_dtype = a->dx_dtype = RNK_BF16;
        a->w_dtype = wt;
        a->dw_dtype = wt;
        a->x = x;
        a->dy = dy;
        a->dx = dx;
        a->x_stride = a->dy_stride = a->dx_stride = n;
        a->w = S->w;
        a->dw = S->dw;
        a->rstd = S->rstd + (size_t)s * m;
        a->eps = 1e-5f;
    }
    CU(cudaStreamSynchronize(st));
    /* Freeing the previous shape's sets (up to 3 GB) leaves the GPU busy
     * for a few milliseconds after the free returns: the first variant timed
     * next ran up to 12 % slower for its first ~3 ms (bench/RESULTS.md,
     * 65536 x 256 after 32768 x 8192).  Let that pass before timing. */
    struct timespec settle = {0, 20 * 1000 * 1000};
    nanosleep(&settle, NULL);
}

static void free_sets(sets *S)
{
    for (int s = 0; s < S->n; s++) {
        cudaFree((void *)S->a[s].x);
        cudaFree((void *)S->a[s].dy);
        cudaFree(S->a[s].dx);
    }
    cudaFree(S->w);
    cudaFree(S->dw);
    cudaFree(S->rstd);
    free(S->a);
}

/* One launch of what a run times: launch i of the warm-up (warm) or of the
 * timed batch; 0, or non-zero with the error in msg. */
typedef int (*launch_fn)(void *ctx, int i, bool warm, char *msg, size_t msglen);

/*
 * Three warm-up launches (module load, occupancy cache, clocks), then reps
 * launches queued behind a delay (expected time per launch ~ bytes / 3 TB/s:
 * the queue is held long enough for the host to enqueue the whole batch),
 * each between two events: each launch's microseconds in t[0 .. reps-1],
 * their median returned.  A launch that fails ends the program, with what.
 */
static double time_launches(launch_fn go, void *ctx, const char *what, int reps,
                            cudaEvent_t *ev, double *t)
{
    char msg[256];
    for (int i = 0; i < 3 + reps; i++) {
        const bool warm = i < 3;
        if (i == 3) {
            delay(2 + (unsigned)(reps * 0.01));
            CU(cudaEventRecord(ev[0], st));
        }
        if (go(ctx, warm ? i : i - 3, warm, msg, sizeof msg)) {
            fprintf(stderr, "%s: %s\n", what, msg);
            exit(1);
        }
        if (!warm)
            CU(cudaEventRecord(ev[i - 2], st));
    }
    CU(cudaStreamSynchronize(st));
    for (int i = 0; i < reps; i++) {
        float ms;
        CU(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
        t[i] = ms * 1e3;
    }
    return median(t, reps);
}

/* A variant's launch (v: RNK_VARIANT_*; --floor's RNK_ADD_*), input sets in rotation. */
typedef struct variant_ctx {
    const sets *S;
    void *ws;
    size_t wsb;
    int v;
} variant_ctx;

static int launch_variant(void *ctx, int i, bool warm, char *msg, size_t msglen)
{
    const variant_ctx *c = ctx;
    (void)warm;
    return rnk_cuda_bwd_variant(dev, &c->S->a[i % c->S->n], c->ws, c->wsb, c->v, st, msg, msglen);
}

/* --floor: an empty kernel launched as ctx's call's (one warp when NULL). */
static int launch_empty(void *ctx, int i, bool warm, char *msg, size_t msglen)
{
    (void)i;
    (void)warm;
    return rnk_cuda_empty_launch(dev, ctx, st, msg, msglen);
}

/* --floor: a streaming kernel (v: RNK_ADD_*) over the input sets, in rotation. */
static int launch_add(void *ctx, int i, bool warm, char *msg, size_t msglen)
{
    const variant_ctx *c = ctx;
    (void)warm;
    return rnk_cuda_add_launch(dev, &c->S->a[i % c->S->n], c->v, st, msg, msglen);
}

static void bench_shape(row *r, int reps, void *ws, size_t wsb)
{
    int64_t m = r->m, n = r->n;
    bool wf = strcmp(r->w, "f32") == 0;
    char what[64];
    sets S;
    make_sets(&S, m, n, wf);
    int nsets = S.n;
    for (int i = 0; i < nsets; i++)
        S.a[i].cancel = cancel_word;
    rnk_cuda_describe(dev, &S.a[0], r->plan, sizeof r->plan);
    r->bytes = 6.0 * (double)m * (double)n + 4.0 * (double)m + 2.0 * (double)n * (wf ? 4 : 2);

    cudaEvent_t *ev = malloc(sizeof(cudaEvent_t) * (size_t)(reps + 1));
    for (int i = 0; i <= reps; i++)
        CU(cudaEventCreate(&ev[i]));
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int k = 0; k < NV; k++) {
        const int v = g_reverse ? NV - 1 - k : k;
        variant_ctx c = {&S, ws, wsb, v};
        snprintf(what, sizeof what, "%s %lldx%lld", vname[v], (long long)m, (long long)n);
        r->us[v] = time_launches(launch_variant, &c, what, reps, ev, t);
        if (g_launches)
            for (int i = 0; i < reps; i++)
                fprintf(g_launches, "%lld,%lld,%s,%s,%d,%.3f\n", (long long)m, (long long)n, r->w,
                        vname[v], i, t[i]);
    }
    if (g_floor) {
        kf_row *f = &r->fl;
        *f = (kf_row){m, n, r->w, r->us[0], {0}, {0}};
        f->empty_us[0] = time_launches(launch_empty, &S.a[0], "empty kernel", reps, ev, t);
        f->empty_us[1] = time_launches(launch_empty, NULL, "empty kernel", reps, ev, t);
        for (int h = 0; h < RNK_ADD_HOWS; h++) {
            variant_ctx c = {&S, NULL, 0, h};
            char msg[256];
            CU(cudaMemsetAsync(S.a[0].dx, 0xff, (size_t)(m * n) * 2, st));
            /* (0 where it does not run: S-shaped, the S plan's shapes only) */
            if (h != RNK_ADD_FLAT && launch_add(&c, 0, true, msg, sizeof msg))
                continue;
            f->add_us[h] = time_launches(launch_add, &c, "add kernel", reps, ev, t);
            kf_check_add(&S.a[0], h);
        }
    }
    for (int i = 0; i <= reps; i++)
        CU(cudaEventDestroy(ev[i]));
    free(ev);
    free(t);
    free_sets(&S);
}

#if defined(RNK_TRACE) && RNK_TRACE
/*
 * --trace: the production launch of one shape exactly as the timed runs make
 * it (warm-up, the same rotation over input sets, queued behind a delay,
 * each launch between two events), each of the reps launches recording its
 * per-block timeline into a buffer of its own (rnk_cuda_set_trace);
 * kernel_trace.c prints them.
 */
/* The production launch over the sets, launch i of the timed batch
 * recording into its own part of the trace buffer (warm-ups into none). */
typedef struct trace_ctx {
    const sets *S;
    void *ws;
    size_t wsb;
    unsigned char *tbuf;
    size_t tb;
} trace_ctx;

static int launch_traced(void *ctx, int i, bool warm, char *msg, size_t msglen)
{
    const trace_ctx *c = ctx;
    if (warm)
        rnk_cuda_set_trace(NULL, 0);
    else
        rnk_cuda_set_trace(c->tbuf + c->tb * (size_t)i, c->tb);
    return rnk_cuda_bwd(dev, &c->S->a[i % c->S->n], c->ws, c->wsb, st, msg, msglen);
}

static void trace_shape(int64_t m, int64_t n, const char *w, int reps, void *ws, size_t wsb,
                        const char *out)
{
    char what[64], plan[160];
    sets S;
    make_sets(&S, m, n, strcmp(w, "f32") == 0);
    rnk_cuda_describe(dev, &S.a[0], plan, sizeof plan);
    size_t tb = (rnk_cuda_trace_bytes(dev, &S.a[0]) + 255) / 256 * 256;
    unsigned char *tbuf, *host = malloc(tb * (size_t)reps);
    CU(cudaMalloc((void **)&tbuf, tb * (size_t)reps));
    CU(cudaMemset(tbuf, 0, tb * (size_t)reps));
    cudaEvent_t *ev = malloc(sizeof(cudaEvent_t) * (size_t)(reps + 1));
    for (int i = 0; i <= reps; i++)
        CU(cudaEventCreate(&ev[i]));
    double *t = malloc(sizeof(double) * (size_t)reps);
    trace_ctx c = {&S, ws, wsb, tbuf, tb};
    snprintf(what, sizeof what, "trace %lldx%lld", (long long)m, (long long)n);
    time_launches(launch_traced, &c, what, reps, ev, t);
    rnk_cuda_set_trace(NULL, 0);
    CU(cudaMemcpy(host, tbuf, tb * (size_t)reps, cudaMemcpyDeviceToHost));
    kt_launch *l = calloc((size_t)reps, sizeof *l);
    for (int i = 0; i < reps; i++) {
        l[i].buf = host + tb * (size_t)i;
        l[i].bytes = tb;
        l[i].event_us = t[i];
    }
    kt_report(m, n, w, plan, rnk_cuda_sm_count(dev), l, reps, out);
    for (int i = 0; i <= reps; i++)
        CU(cudaEventDestroy(ev[i]));
    free(ev);
    free(t);
    free(l);
    free(host);
    cudaFree(tbuf);
    free_sets(&S);
}
#endif

int main(int argc, char **argv)
{
    const char *out = getenv("OUT") ? getenv("OUT") : ".";
    const char *torch = NULL, *acc_dir = NULL;
    bool quick = false, out_set = false;
    int reps = 60;
    kt_shape only[KT_MAX_SHAPES];
    int nonly = 0;
    bool launches = false;
    kt_shape tr[KT_MAX_SHAPES];
    int ntr = 0;
    bool trace = false;
    const char *cancel_at = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
            out_set = true;
        }
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            torch = argv[++i];
        else if (!strcmp(argv[i], "--accuracy") && i + 1 < argc)
            acc_dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cancel") && i + 1 < argc)
            cancel_at = argv[++i];
        else if (!strcmp(argv[i], "--reverse"))
            g_reverse = true;
        else if (!strcmp(argv[i], "--launches"))
            launches = true;
        else if (!strcmp(argv[i], "--floor"))
            g_floor = true;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            /* only these shapes, in this order: --shape 65536,4096,bf16+4096,256 */
            if (kt_parse(argv[++i], only, &nonly))
                return 2;
        } else if (!strcmp(argv[i], "--trace")) {
            /* --trace [M,N[,w][+M,N[,w]...]]: per-block timelines (RNK_TRACE=1) */
            trace = true;
            if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9' &&
                kt_parse(argv[++i], tr, &ntr))
                return 2;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--out DIR] [--torch FILE.csv] [--reps N] "
                            "[--shape M,N[,w][+...]] [--cancel host|device] [--reverse] [--launches] "
                            "[--floor] [--accuracy DIR] [--trace [M,N[,w][+...]]]\n",
                    argv[0]);
            return 2;
        }
    }
#if !(defined(RNK_TRACE) && RNK_TRACE)
    (void)out_set;
    if (trace) {
        fprintf(stderr, "--trace needs a build with -DRNK_TRACE=1 "
                        "(bench/build_variants.sh DEST T='-DRNK_TRACE=1')\n");
        return 2;
    }
#endif
    if (trace && ntr == 0)
        kt_parse(KT_DEFAULT_SHAPES, tr, &ntr);
    /* The output folder first (one level made), not after minutes of runs. */
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_kernel: --out %s: %s\n", out, strerror(errno));
        return 2;
    }
    char msg[256];
    int *flags;
    CU(cudaSetDeviceFlags(cudaDeviceMapHost));
    if (rnk_cuda_init(0, &dev, msg, sizeof msg)) {
        fprintf(stderr, "%s\n", msg);
        return 1;
    }
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaHostAlloc((void **)&flags, 2 * sizeof(int), cudaHostAllocMapped));
    flags[0] = flags[1] = 0;
    CU(cudaHostGetDevicePointer((void **)&hog_flags_d, flags, 0));
    if (cancel_at && !strcmp(cancel_at, "host")) {
        unsigned *w;
        CU(cudaHostAlloc((void **)&w, sizeof *w, cudaHostAllocMapped));
        *w = 0;
        CU(cudaHostGetDevicePointer((void **)&cancel_word, w, 0));
    } else if (cancel_at && !strcmp(cancel_at, "device")) {
        unsigned *w;
        CU(cudaMalloc((void **)&w, sizeof *w));
        CU(cudaMemset(w, 0, sizeof *w));
        cancel_word = w;
    } else if (cancel_at) {
        fprintf(stderr, "--cancel: host or device, not \"%s\"\n", cancel_at);
        return 2;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    if (acc_dir) {
        ka_measure(dev, st, acc_dir);
        return 0;
    }
#if defined(RNK_TRACE) && RNK_TRACE
    if (trace) {
        size_t twsb = 0;
        for (int i = 0; i < ntr; i++) {
            size_t b = rnk_cuda_workspace_size(dev, tr[i].m, tr[i].n);
            twsb = b > twsb ? b : twsb;
        }
        void *tws;
        CU(cudaMalloc(&tws, twsb));
        if (rnk_cuda_workspace_init(tws, twsb, st, msg, sizeof msg)) {
            fprintf(stderr, "%s\n", msg);
            return 1;
        }
        printf("GPU: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
        for (int i = 0; i < ntr; i++)
            trace_shape(tr[i].m, tr[i].n, tr[i].w, reps, tws, twsb, out_set ? out : NULL);
        cudaFree(tws);
        rnk_cuda_fini(dev);
        return 0;
    }
#endif

    static const int64_t ms[] = {4096, 8192, 16384, 32768, 65536};
    static const int64_t ns[] = {256, 512, 1024, 2048, 4096, 8192};
    static const char *ws_[] = {"f32", "bf16"};
    row rows[60 > KT_MAX_SHAPES ? 60 : KT_MAX_SHAPES];
    int nrows = 0;
    for (int k = 0; k < nonly; k++) {
        memset(&rows[nrows], 0, sizeof rows[nrows]);
        rows[nrows].m = only[k].m;
        rows[nrows].n = only[k].n;
        rows[nrows].w = strcmp(only[k].w, "f32") ? ws_[1] : ws_[0];
        nrows++;
    }
    for (int wi = 0; wi < 2 && !nonly; wi++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 6; j++) {
                if (quick && (i % 2 || j == 1))
                    continue;
                memset(&rows[nrows], 0, sizeof rows[nrows]);
                rows[nrows].m = ms[i];
                rows[nrows].n = ns[j];
                rows[nrows].w = ws_[wi];
                nrows++;
            }
    size_t wsb = rnk_cuda_variant_workspace_size(dev, 65536, 8192);
    for (int i = 0; i < nrows; i++) {
        size_t b = rnk_cuda_variant_workspace_size(dev, rows[i].m, rows[i].n);
        if (b > wsb)
            wsb = b;
    }
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    if (rnk_cuda_workspace_init(ws, wsb, st, msg, sizeof msg)) {
        fprintf(stderr, "%s\n", msg);
        return 1;
    }
    char path[4096];
    if (launches) {
        snprintf(path, sizeof path, "%s/launches.csv", out);
        if (!(g_launches = fopen(path, "w"))) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        fprintf(g_launches, "m,n,w,variant,i,us\n");
    }
    const bool copy = !nonly || g_floor;
    double copy_bw = copy ? copy_bandwidth() : 4.24e12;
    for (int i = 0; i < nrows; i++)
        bench_shape(&rows[i], reps, ws, wsb);
    double copy_bw2 = copy ? copy_bandwidth() : copy_bw; /* again at the end: drift shows */
    if (g_launches)
        fclose(g_launches);
    if (torch)
        kr_load_torch(rows, nrows, torch);

    int rc = kr_report(out, prop.name, prop.multiProcessorCount, copy_bw, copy_bw2, copy, g_floor,
                       rows, nrows);
    if (rc)
        return rc;
    cudaFree(ws);
    rnk_cuda_fini(dev);
    return 0;
}
