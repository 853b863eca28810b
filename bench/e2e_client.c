/* SPDX-License-Identifier: MIT */
/*
 * e2e_client.c - bench_e2e_cuda's client processes (bench_e2e_cuda.c's top
 * says what they measure): "single" (1. to 3. and 5., one line per shape on
 * stdout) and "tput" (4., after "ready" and a "go" on stdin).
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_problem.h"
#include "e2e_client.h"
#include "gpu/e2e_cuda.h"
#include "rmsnorm_client.h"
#include "rnk.h"
#include "rnk_test.h"
#include "bench_util.h"

#define CK(call) RNE_CK(call)

/* Percentile of n samples (sorts them). */
static double pct(uint64_t *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i];
}

typedef struct work {
    rn_bwd_args a;
    rnk_bwd_args k;
    char *arena[BP_PARTS]; /* one allocation, or x / dy / dx / the rest (--split) */
    void *ws;
    size_t wsb;
} work;

static cudaStream_t st;
static rne_kernels kern;
static rnk_device *kdev;
static rn_client *cli;
static uint64_t *stamps;     /* device: [2 * iters] */
static uint64_t *hstamps;

static void setup_work(work *w, int64_t m, int64_t n)
{
    char msg[200];
    size_t bytes[BP_PARTS];
    const char *sp = getenv("RN_E2E_SPLIT");
    int split = sp && strcmp(sp, "1") == 0;
    memset(w, 0, sizeof *w);
    for (int i = 0, np = bp_parts(m, n, split, bytes); i < np; i++)
        CK(cudaMalloc((void **)&w->arena[i], bytes[i]));
    rnk_bwd_args *k = &w->k;
    bp_place(k, w->arena, m, n, split);
    if (bp_fill(k, 1, st, msg, sizeof msg)) {
        fprintf(stderr, "fill: %s\n", msg);
        exit(1);
    }
    rn_bwd_args *a = &w->a;
    a->m = m;
    a->n = n;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = RN_DTYPE_BF16;
    a->dw_dtype = RN_DTYPE_F32;
    a->eps = k->eps;
    a->x_stride = a->dy_stride = a->dx_stride = n;
    a->x = k->x;
    a->dy = k->dy;
    a->dx = k->dx;
    a->w = k->w;
    a->dw = k->dw;
    a->rstd = k->rstd;
    w->wsb = rnk_cuda_workspace_size(kdev, m, n);
    CK(cudaMalloc(&w->ws, w->wsb));
    if (rnk_cuda_workspace_init(w->ws, w->wsb, st, msg, sizeof msg)) {
        fprintf(stderr, "workspace: %s\n", msg);
        exit(1);
    }
    CK(cudaStreamSynchronize(st));
}

static void free_work(work *w)
{
    for (int i = 0; i < BP_PARTS; i++)
        if (w->arena[i])
            CK(cudaFree(w->arena[i]));
    CK(cudaFree(w->ws));
}

static long busy_waits; /* calls answered BUSY, then retried after a stream sync */

/* RN_E2E_INPROC_WORDS=dev|host (the in-process K rows): each in-process
 * call also has the stream memory operations a daemon call puts on the GPU,
 * in the client's own stream: write ready, wait for it, the kernel, write
 * done, wait for it (words in device memory, or in mapped pinned host
 * memory as the ring's ready word is).  Whether those operations, not the
 * second process, are what K clients through the daemon pay. */
typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
static pfn_value64 words_wait, words_write;
static CUdeviceptr words; /* [2]: ready, done */
static uint64_t words_seq;

static void words_init(void)
{
    const char *how = getenv("RN_E2E_INPROC_WORDS");
    void *p = NULL;
    if (!how || !*how)
        return;
    words_wait = (pfn_value64)rne_driver_entry("cuStreamWaitValue64");
    words_write = (pfn_value64)rne_driver_entry("cuStreamWriteValue64");
    if (strcmp(how, "host") == 0) {
        CK(cudaHostAlloc(&p, 16, cudaHostAllocMapped));
        memset(p, 0, 16);
        CK(cudaHostGetDevicePointer(&p, p, 0));
    } else if (strcmp(how, "dev") == 0) {
        CK(cudaMalloc(&p, 16));
        CK(cudaMemset(p, 0, 16));
    } else {
        fprintf(stderr, "RN_E2E_INPROC_WORDS: dev or host, not '%s'\n", how);
        exit(1);
    }
    words = (CUdeviceptr)(uintptr_t)p;
}

static void words_op(pfn_value64 fn, int i, unsigned flags)
{
    CUresult r = fn((CUstream)st, words + 8u * (unsigned)i, words_seq, flags);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "stream memory operation failed: %d\n", (int)r);
        exit(1);
    }
}

static void one_call(work *w, bool inproc, uint64_t *host_ns)
{
    if (inproc) {
        char msg[200];
        if (words) {
            words_seq++;
            words_op(words_write, 0, 0);
            words_op(words_wait, 0, CU_STREAM_WAIT_VALUE_GEQ);
        }
        if (rnk_cuda_bwd(kdev, &w->k, w->ws, w->wsb, st, msg, sizeof msg)) {
            fprintf(stderr, "rnk_cuda_bwd: %s\n", msg);
            exit(1);
        }
        if (words) {
            words_op(words_write, 1, 0);
            words_op(words_wait, 1, CU_STREAM_WAIT_VALUE_GEQ);
        }
        return;
    }
    uint64_t t0 = now_ns();
    int rc = rn_rmsnorm_bwd(cli, &w->a, st);
    /* The daemon's queue is full (many clients ahead of the GPU): back off
     * as a worker would, until this stream's own calls are done. */
    while (rc == RN_BUSY) {
        busy_waits++;
        CK(cudaStreamSynchronize(st));
        rc = rn_rmsnorm_bwd(cli, &w->a, st);
    }
    if (host_ns)
        *host_ns = now_ns() - t0;
    if (rc) {
        fprintf(stderr, "rn_rmsnorm_bwd: %s: %s\n", rn_err_name(rc), rn_last_error(cli));
        exit(1);
    }
}

/* The in-process kernel alone: mean us per launch over n launches, each
 * between two events (as the daemon times its fast-path kernels). */
static double kernel_alone(work *w, int n)
{
    cudaEvent_t e0, e1;
    double total = 0;

    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* Not counted: a shape's first launch (its workspace, the module) took
     * 50 us where a steady one takes 11 at 4096x256. */
    one_call(w, true, NULL);
    CK(cudaStreamSynchronize(st));
    for (int i = 0; i < n; i++) {
        float ms = 0;
        CK(cudaEventRecord(e0, st));
        one_call(w, true, NULL);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        total += ms;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return total * 1000.0 / n;
}

void e2e_daemon_hist(rn_client *c, const char *name, uint64_t *count, uint64_t *sum_ns)
{
    static rn_stats_info si;
    static rn_hist_buckets b[RN_MAX_HISTS];

    *count = *sum_ns = 0;
    for (unsigned i = 0; i < RN_MAX_HISTS; i++)
        b[i].struct_size = sizeof b[i];
    si.struct_size = sizeof si;
    if (rn_stats_hist_buckets(c, &si, b, RN_MAX_HISTS) != 0)
        return;
    for (unsigned i = 0; i < si.nhists && i < RN_MAX_HISTS; i++)
        if (strcmp(b[i].name, name) == 0 && b[i].present) {
            *count = b[i].count;
            *sum_ns = b[i].sum_ns;
        }
}

/* span[i] = iteration i's consumer stamp - its producer stamp (the stream
 * is synchronised). */
static void stamp_spans(int iters, uint64_t *span)
{
    CK(cudaMemcpy(hstamps, stamps, sizeof *stamps * 2 * (size_t)iters, cudaMemcpyDeviceToHost));
    for (int i = 0; i < iters; i++)
        span[i] = hstamps[2 * i + 1] - hstamps[2 * i];
}

/* RN_E2E_STAMPS=PATH: the hop loop's producer and consumer stamps through
 * the daemon, a line "m n producer consumer" per call, appended (beside a
 * daemon run with RMSNORMD_DEBUG_STAMPS; bench/e2e_stamps.py). */
static void dump_stamps(int64_t m, int64_t n, int iters)
{
    const char *path = getenv("RN_E2E_STAMPS");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    for (int i = 0; f && i < iters; i++)
        fprintf(f, "%lld %lld %llu %llu\n", (long long)m, (long long)n,
                (unsigned long long)hstamps[2 * i], (unsigned long long)hstamps[2 * i + 1]);
    if (f)
        fclose(f);
}

/*
 * iters iterations of [spin?] stamp -> bwd -> stamp.  Returns GPU time per
 * iteration (events), fills gaps[i] = consumer stamp - producer stamp, and
 * host[i] = host time of the call (daemon only).
 */
static double loop(work *w, bool inproc, int iters, uint64_t spin_ns, uint64_t *gaps,
                   uint64_t *host)
{
    cudaEvent_t e0, e1;
    float ms = 0;

    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 10; i++)   /* warm-up */
        one_call(w, inproc, NULL);
    CK(cudaStreamSynchronize(st));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; i++) {
        if (spin_ns)
            CK(rne_spin(&kern, spin_ns, st));
        CK(rne_stamp(&kern, stamps + 2 * i, st));
        one_call(w, inproc, host ? host + i : NULL);
        CK(rne_stamp(&kern, stamps + 2 * i + 1, st));
    }
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    stamp_spans(iters, gaps);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return (double)ms * 1000.0 / iters;
}

/* Spin until e has fired: cudaEventQuery, so no blocking-sync wake-up. */
static void spin_event(cudaEvent_t e)
{
    cudaError_t r;
    while ((r = cudaEventQuery(e)) == cudaErrorNotReady)
        ;
    CK(r);
}

/*
 * iters iterations of stamp -> bwd -> stamp (through the daemon, or
 * in-process with inproc), each one issued only once the GPU has finished
 * the previous one (an event recorded after the previous consumer), after 10
 * such warm-up iterations; host[i] = host time of the call itself (NULL: not
 * taken), idle[i] = consumer stamp - producer stamp: the latency of a call
 * into an idle GPU, host and daemon turn-around included (what a
 * synchronised caller waits, the "synced" regime of bench_torch.py).
 */
static void loop_paced(work *w, bool inproc, int iters, uint64_t *host, uint64_t *idle)
{
    cudaEvent_t done;

    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaStreamSynchronize(st));
    CK(cudaEventRecord(done, st));
    for (int i = -10; i < iters; i++) {
        uint64_t *sp = stamps + 2 * (i < 0 ? 0 : i);
        spin_event(done);
        CK(rne_stamp(&kern, sp, st));
        one_call(w, inproc, i < 0 || !host ? NULL : host + i);
        CK(rne_stamp(&kern, sp + 1, st));
        CK(cudaEventRecord(done, st));
    }
    spin_event(done);
    CK(cudaEventDestroy(done));
    stamp_spans(iters, idle);
}

/* iters back-to-back PINGs on cli after 20 warm-up ones; rtt[i] = host time
 * of one rn_ping (the whole call). */
static void loop_ping(int iters, uint64_t *rtt)
{
    for (int i = -20; i < iters; i++) {
        uint64_t t0 = now_ns();
        int rc = rn_ping(cli, NULL);
        uint64_t dt = now_ns() - t0;
        if (rc) {
            fprintf(stderr, "rn_ping: %s: %s\n", rn_err_name(rc), rn_last_error(cli));
            exit(1);
        }
        if (i >= 0)
            rtt[i] = dt;
    }
}

static void client_init(const char *endpoint, int iters)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 60000, .client_name = "bench"};
    char msg[200];

    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(rne_load(&kern));
    if (rnk_cuda_init(0, &kdev, msg, sizeof msg)) {
        fprintf(stderr, "rnk_cuda_init: %s\n", msg);
        exit(1);
    }
    CK(cudaMalloc((void **)&stamps, sizeof *stamps * 2 * (size_t)iters));
    hstamps = malloc(sizeof *hstamps * 2 * (size_t)iters);
    if (rn_connect(&o, &cli) != 0) {
        fprintf(stderr, "connect: %s\n", rn_last_error(NULL));
        exit(1);
    }
}

int client_single(const char *endpoint, int iters)
{
    static const int64_t shapes[][2] = {{4096, 256}, {16384, 1024}, {32768, 4096}};
    uint64_t *gaps = calloc((size_t)iters, sizeof *gaps), *host = calloc((size_t)iters, sizeof *host);
    uint64_t *gaps2 = calloc((size_t)iters, sizeof *gaps2);
    uint64_t *paced = calloc((size_t)iters, sizeof *paced), *rtt = calloc((size_t)iters, sizeof *rtt);
    struct rn_server_info si;

    client_init(endpoint, iters);
    if (rn_server_info(cli, &si) == 0)
        printf("info device=\"%s\" mps=%d sms=%u\n", si.device_name, si.mps, si.sm_count);
    for (size_t s = 0; s < 3; s++) {
        work w;
        double in_it[2], d_it[2];
        setup_work(&w, shapes[s][0], shapes[s][1]);
        /* The kernel itself, in this process and (fast path: its
         * fast.compute, over this shape's steady-state calls) in the daemon. */
        double k_in = kernel_alone(&w, 50);
        uint64_t c0, s0, c1, s1;
        e2e_daemon_hist(cli, "fast.compute", &c0, &s0);
        /* Steady state, alternating, twice each: the spread shows the noise. */
        for (int r = 0; r < 2; r++) {
            in_it[r] = loop(&w, true, iters, 0, gaps, NULL);
            d_it[r] = loop(&w, false, iters, 0, gaps2, host);
        }
        e2e_daemon_hist(cli, "fast.compute", &c1, &s1);
        double k_d = c1 > c0 ? (double)(s1 - s0) / (double)(c1 - c0) / 1e3 : 0;
        printf("kernel m=%lld n=%lld inproc_kernel_us=%.2f daemon_kernel_us=%.2f daemon_kernels=%llu\n",
               (long long)shapes[s][0], (long long)shapes[s][1], k_in, k_d,
               (unsigned long long)(c1 - c0));
        double hp50 = pct(host, iters, 0.5) / 1e3, hp99 = pct(host, iters, 0.99) / 1e3;
        /* The call's own cost: paced, the GPU idle at each call; then the
         * floor, a bare request/reply on the same connection. */
        loop_paced(&w, true, iters, NULL, gaps);
        loop_paced(&w, false, iters, paced, gaps2);
        double pp50 = pct(paced, iters, 0.5) / 1e3, pp99 = pct(paced, iters, 0.99) / 1e3;
        double idle_in = pct(gaps, iters, 0.5) / 1e3, idle_d = pct(gaps2, iters, 0.5) / 1e3;
        double idle_d99 = pct(gaps2, iters, 0.99) / 1e3;
        loop_ping(iters, rtt);
        double rp50 = pct(rtt, iters, 0.5) / 1e3, rp99 = pct(rtt, iters, 0.99) / 1e3;
        /* GPU-side gaps with the host ahead of the GPU: each producer comes
         * lead_ns after the previous call (RN_E2E_LEAD_US, --lead-us; 300 us
         * by default, within the daemon's spin for ready words). */
        const char *ls = getenv("RN_E2E_LEAD_US");
        uint64_t lead_ns = ls && *ls ? strtoull(ls, NULL, 10) * 1000u : 300000u;
        loop(&w, true, iters, lead_ns, gaps, NULL);
        uint64_t tk0, tks0, kc0, kcs0, tk1, tks1, kc1, kcs1;
        e2e_daemon_hist(cli, "fast.take", &tk0, &tks0);
        e2e_daemon_hist(cli, "fast.compute", &kc0, &kcs0);
        loop(&w, false, iters, lead_ns, gaps2, NULL);
        dump_stamps(shapes[s][0], shapes[s][1], iters);
        e2e_daemon_hist(cli, "fast.take", &tk1, &tks1);
        e2e_daemon_hist(cli, "fast.compute", &kc1, &kcs1);
        /* The daemon's own share of the hop loop's calls: its take (copy to
         * submission) and its kernel between events, means in us. */
        double gtake = tk1 > tk0 ? (double)(tks1 - tks0) / (double)(tk1 - tk0) / 1e3 : 0;
        double gkern = kc1 > kc0 ? (double)(kcs1 - kcs0) / (double)(kc1 - kc0) / 1e3 : 0;
        double gin = pct(gaps, iters, 0.5) / 1e3, gd = pct(gaps2, iters, 0.5) / 1e3;
        double gd99 = pct(gaps2, iters, 0.99) / 1e3;
        printf("shape m=%lld n=%lld inproc_us=%.2f,%.2f daemon_us=%.2f,%.2f ratio=%.3f "
               "host_p50_us=%.1f host_p99_us=%.1f paced_host_p50_us=%.1f paced_host_p99_us=%.1f "
               "ping_p50_us=%.1f ping_p99_us=%.1f span_inproc_p50_us=%.2f span_daemon_p50_us=%.2f "
               "span_daemon_p99_us=%.2f hop_p50_us=%.2f idle_inproc_p50_us=%.2f "
               "idle_daemon_p50_us=%.2f idle_daemon_p99_us=%.2f hop_take_us=%.2f "
               "hop_kernel_us=%.2f lead_us=%llu\n",
               (long long)shapes[s][0], (long long)shapes[s][1], in_it[0], in_it[1], d_it[0],
               d_it[1], (d_it[0] < d_it[1] ? d_it[0] : d_it[1]) /
                            (in_it[0] < in_it[1] ? in_it[0] : in_it[1]),
               hp50, hp99, pp50, pp99, rp50, rp99, gin, gd, gd99, (gd - gin) / 2, idle_in, idle_d,
               idle_d99, gtake, gkern, (unsigned long long)(lead_ns / 1000u));
        /* The daemon's side: receipt to the recorded done event. */
        rn_stats_info si2;
        if (rn_stats(cli, &si2) == 0) {
            uint64_t fast_ok = 0;
            for (unsigned k = 0; k < si2.nstats; k++)
                if (strcmp(si2.stats[k].name, "fast.ok") == 0)
                    fast_ok = si2.stats[k].value;
            printf("path=%s\n", fast_ok ? "fast" : "classic");
            for (unsigned h = 0; h < si2.nhists; h++)
                printf("daemon %s (cumulative) p50_us=%.1f p99_us=%.1f n=%llu\n",
                       si2.hists[h].name, si2.hists[h].p50 / 1e3, si2.hists[h].p99 / 1e3,
                       (unsigned long long)si2.hists[h].count);
        }
        fflush(stdout);
        free_work(&w);
    }
    rn_close(cli);
    return 0;
}

int client_tput(const char *endpoint, int iters)
{
    uint64_t *host = calloc((size_t)iters, sizeof *host);
    char line[32];
    work w;

    client_init(endpoint, iters);
    /* (RN_E2E_TPUT_SHAPE: bench_e2e_cuda --tput-shape, checked there) */
    int64_t m = 8192, n = 1024;
    const char *shape = getenv("RN_E2E_TPUT_SHAPE");
    if (shape && sscanf(shape, "%" SCNd64 ",%" SCNd64, &m, &n) != 2)
        return 1;
    setup_work(&w, m, n);
    /* (the stamp kernel too: its first launch loads its module, which
     * held every client's first timed call up by 10-20 ms) */
    for (int i = 0; i < 20; i++) {
        CK(rne_stamp(&kern, stamps, st));
        one_call(&w, false, NULL);
    }
    CK(cudaStreamSynchronize(st));
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    /* RN_E2E_TPUT_INPROC: the kernel linked in, no daemon (the ceiling). */
    bool inproc = getenv("RN_E2E_TPUT_INPROC") != NULL;
    if (inproc)
        words_init();
    uint64_t *issued = calloc((size_t)iters, sizeof *issued);
    if (!issued)
        return 1;
    struct timespec rt0;
    clock_gettime(CLOCK_REALTIME, &rt0);
    uint64_t t0 = now_ns();
    for (int i = 0; i < iters; i++) {
        issued[i] = now_ns() - t0;
        CK(rne_stamp(&kern, stamps + 2 * i, st));
        one_call(&w, inproc, host + i);
        CK(rne_stamp(&kern, stamps + 2 * i + 1, st));
    }
    uint64_t t_issued = now_ns() - t0, in_calls = 0;
    CK(cudaStreamSynchronize(st));
    uint64_t wall = now_ns() - t0;
    for (int i = 0; i < iters; i++)
        in_calls += host[i];
    /* Where a slow client's GPU time goes: span = a call's stamps (its
     * stream's write of ready, the daemon's take and kernel, done, the
     * stream's wait); gap = the stream's time from one call's end to the
     * next's start; the last 64 calls' span alone (a straggler's tail). */
    uint64_t *span = calloc((size_t)iters, sizeof *span);
    uint64_t *gap = calloc((size_t)iters, sizeof *gap);
    stamp_spans(iters, span);
    for (int i = 1; i < iters; i++)
        gap[i - 1] = hstamps[2 * i] - hstamps[2 * i - 1];
    int tail = iters > 64 ? 64 : iters;
    int worst = 0;
    for (int i = 1; i < iters; i++)
        if (span[i] > span[worst])
            worst = i;
    double tail_p50 = pct(span + iters - tail, tail, 0.5);
    /* (issue_us: the loop's host time; calls_us: of it, inside the calls) */
    printf("tput calls=%d wall_us=%.1f host_p50_us=%.1f busy=%ld issue_us=%.1f calls_us=%.1f "
           "host_max_us=%.1f span_p50_us=%.1f span_p99_us=%.1f span_max_us=%.1f "
           "tail_span_p50_us=%.1f gap_p50_us=%.1f gap_max_us=%.1f worst=%d worst_issued_ms=%.3f "
           "t0_utc=%lld.%06ld\n",
           iters, wall / 1e3, pct(host, iters, 0.5) / 1e3, busy_waits, t_issued / 1e3,
           in_calls / 1e3, pct(host, iters, 1.0) / 1e3, pct(span, iters, 0.5) / 1e3,
           pct(span, iters, 0.99) / 1e3, pct(span, iters, 1.0) / 1e3, tail_p50 / 1e3,
           pct(gap, iters - 1, 0.5) / 1e3, pct(gap, iters - 1, 1.0) / 1e3, worst,
           issued[worst] / 1e6, (long long)rt0.tv_sec, rt0.tv_nsec / 1000);
    free(span);
    free(gap);
    free(issued);
    fflush(stdout);
    free_work(&w);
    rn_close(cli);
    return 0;
}
