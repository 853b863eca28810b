/* SPDX-License-Identifier: MIT */
/*
 * bench_submit.c - what each CUDA call of a fast-path ring job costs the
 * daemon's loop (host time), in the order the loop issues them
 * (daemon/cuda/submit.c, ring_submit), and in a leaner order with fewer
 * calls: the stream operations of one job are the loop's own time, and in
 * --ring-ready=host the ones before the kernel's launch lie between a
 * call's inputs being ready and its kernel starting.
 *
 *   production  record start (no timing), record t0 (timing), the kernel
 *               (rnk_cuda_bwd), record t1 (timing), write done (ring),
 *               write done (device word), record completion (blocking sync)
 *   lean        record start (timing: also the kernel's t0), the kernel,
 *               both done words in one cuStreamBatchMemOp, record
 *               completion (blocking sync, timing: the kernel's t1)
 *
 * and, to split the launch's cost, a bare launch of a one-thread kernel
 * (cudaLaunchKernel alone) against the production kernel's rnk_cuda_bwd
 * (its plan, grid and launch).
 *
 * Each job goes to an idle stream (the previous one synchronised), as a
 * host-mode job does; bench_e2e_cuda's problem at 4096x256 (bench_problem.h:
 * bf16 rows and weight, fp32 dw, random inputs).  Prints the
 * mean and p50 of each call in us, and the total per job; run with and
 * without MPS.
 *
 * --threads T1,T2,...: whether the daemon's submissions would scale spread
 * over threads, one stream each (they do, 1.3-2x one thread's rate; the
 * daemon's K clients with a submitter thread a ring did not, bench/RESULTS.md
 * 2026-12-06).  For each T, T threads, each
 * on a stream and problem of its own, issue an armed ring job's calls back
 * to back (record start, wait on a ready word already there, the kernel,
 * record completion with blocking sync), at most --depth jobs a stream
 * queued (a thread waits for its oldest when it has that many), --iters
 * jobs each; prints the jobs a second of all threads together and each
 * thread's mean host time a job, and the same with the bare launches alone.
 *
 *   bench_submit [--iters N] [--out FILE] [--threads T1,T2,... [--depth D]]
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/e2e_cuda.h"
#include "bench_problem.h"
#include "bench_util.h"
#include "rnk.h"

#define CK(call) RNE_CK(call)

typedef CUresult (*pfn_write64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*pfn_wait64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*pfn_batch)(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,
                              unsigned flags);
static pfn_write64 write64;
static pfn_batch batch;
static pfn_wait64 wait64;

enum { MAXOPS = 8 };

typedef struct run {
    const char *name;
    int nops;
    const char *op[MAXOPS];
    uint64_t *t[MAXOPS]; /* [iters] ns */
} run;

static void report(run *r, int iters, FILE *out)
{
    double total = 0;
    printf("== %s\n", r->name);
    for (int o = 0; o < r->nops; o++) {
        double sum = 0;
        for (int i = 0; i < iters; i++)
            sum += (double)r->t[o][i];
        qsort(r->t[o], (size_t)iters, sizeof(uint64_t), cmp_u64);
        double mean = sum / iters / 1e3, p50 = (double)r->t[o][iters / 2] / 1e3;
        total += mean;
        printf("  %-34s mean_us=%.2f p50_us=%.2f\n", r->op[o], mean, p50);
        if (out)
            fprintf(out, "| %s | %s | %.2f | %.2f |\n", r->name, r->op[o], mean, p50);
    }
    printf("  %-34s mean_us=%.2f\n", "total", total);
    if (out)
        fprintf(out, "| %s | total | %.2f | |\n", r->name, total);
}

/* ---- --threads: the same job's calls from T threads at once ---- */

enum { MAXTHR = 16, MAXDEPTH = 64 };

typedef struct thr {
    pthread_t id;
    rnk_device *dev;
    int iters, depth, bare;
    pthread_barrier_t *go;
    rnk_bwd_args a;
    void *ws;
    size_t wsb;
    uint64_t *ready; /* a word the stream's waits find there already */
    cudaStream_t st;
    cudaEvent_t start, fin[MAXDEPTH];
    rne_kernels rk;
    uint64_t *stamp;
    uint64_t t0, t1, busy; /* ns: first job's start, last job's end, in the calls */
    int failed;
} thr;

static void thr_setup(thr *t, rnk_device *dev, int64_t m, int64_t n, unsigned seed)
{
    size_t bytes[BP_PARTS];
    char *base[BP_PARTS] = {NULL};
    char msg[256];

    t->dev = dev;
    bp_parts(m, n, 0, bytes);
    CK(cudaMalloc((void **)&base[0], bytes[0]));
    bp_place(&t->a, base, m, n, 0);
    if (bp_fill(&t->a, seed, NULL, msg, sizeof msg) != 0) {
        fprintf(stderr, "inputs: %s\n", msg);
        exit(1);
    }
    t->wsb = rnk_cuda_workspace_size(dev, m, n);
    CK(cudaMalloc(&t->ws, t->wsb));
    CK(cudaMemset(t->ws, 0, t->wsb));
    CK(cudaMalloc((void **)&t->ready, sizeof *t->ready));
    CK(cudaMemset(t->ready, 0, sizeof *t->ready));
    CK(cudaStreamCreateWithFlags(&t->st, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&t->start, cudaEventDisableTiming));
    for (int d = 0; d < MAXDEPTH; d++)
        CK(cudaEventCreateWithFlags(&t->fin[d], cudaEventDisableTiming | cudaEventBlockingSync));
    CK(rne_load(&t->rk));
    CK(cudaMalloc((void **)&t->stamp, sizeof *t->stamp));
    CK(cudaDeviceSynchronize());
}

static void *thr_run(void *arg)
{
    thr *t = arg;
    char msg[256];
    CUdeviceptr ready = (CUdeviceptr)(uintptr_t)t->ready;

    if (cudaSetDevice(0) != cudaSuccess) {
        t->failed = 1;
        return NULL;
    }
    pthread_barrier_wait(t->go);
    t->busy = 0;
    t->t0 = now_ns();
    for (int i = 0; i < t->iters && !t->failed; i++) {
        cudaEvent_t fin = t->fin[i % t->depth];
        if (i >= t->depth && cudaEventSynchronize(fin) != cudaSuccess)
            t->failed = 1;
        uint64_t c0 = now_ns();
        if (t->bare) {
            if (rne_stamp(&t->rk, t->stamp, t->st) != cudaSuccess)
                t->failed = 1;
        } else {
            if (cudaEventRecord(t->start, t->st) != cudaSuccess ||
                wait64(t->st, ready, 0, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS ||
                rnk_cuda_bwd(t->dev, &t->a, t->ws, t->wsb, t->st, msg, sizeof msg) != 0)
                t->failed = 1;
        }
        if (cudaEventRecord(fin, t->st) != cudaSuccess)
            t->failed = 1;
        t->busy += now_ns() - c0;
    }
    if (cudaStreamSynchronize(t->st) != cudaSuccess)
        t->failed = 1;
    t->t1 = now_ns();
    return NULL;
}

/* One row: T threads at once, each iters jobs; the jobs a second of all of
 * them (first start to last end) and the mean host time a job. */
static void thr_row(thr *ts, int nt, int bare, FILE *out)
{
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)nt);
    for (int i = 0; i < nt; i++) {
        ts[i].bare = bare;
        ts[i].go = &go;
        if (pthread_create(&ts[i].id, NULL, thr_run, &ts[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    uint64_t t0 = UINT64_MAX, t1 = 0, busy = 0, jobs = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(ts[i].id, NULL);
        if (ts[i].failed) {
            fprintf(stderr, "thread %d: a CUDA call failed\n", i);
            exit(1);
        }
        t0 = ts[i].t0 < t0 ? ts[i].t0 : t0;
        t1 = ts[i].t1 > t1 ? ts[i].t1 : t1;
        busy += ts[i].busy;
        jobs += (uint64_t)ts[i].iters;
    }
    pthread_barrier_destroy(&go);
    double rate = (double)jobs / ((double)(t1 - t0) / 1e9);
    double per = (double)busy / (double)jobs / 1e3;
    printf("  threads=%d %-6s jobs_per_s=%.0f host_us_per_job=%.2f\n", nt, bare ? "bare" : "job",
           rate, per);
    if (out)
        fprintf(out, "| %d | %s | %.0f | %.2f |\n", nt, bare ? "bare launch" : "armed job's calls",
                rate, per);
}

static int threads_main(const char *list, int iters, int depth, const char *outp)
{
    int nts[MAXTHR], nn = 0, most = 0;
    for (const char *c = list; *c && nn < MAXTHR;) {
        int v = atoi(c);
        if (v < 1 || v > MAXTHR) {
            fprintf(stderr, "--threads: %d is not 1..%d\n", v, MAXTHR);
            return 2;
        }
        nts[nn++] = v;
        most = v > most ? v : most;
        c = strchr(c, ',');
        if (!c)
            break;
        c++;
    }
    if (depth < 1 || depth > MAXDEPTH) {
        fprintf(stderr, "--depth: %d is not 1..%d\n", depth, MAXDEPTH);
        return 2;
    }
    rnk_device *dev = NULL;
    char msg[256];
    if (rnk_cuda_init(0, &dev, msg, sizeof msg) != 0) {
        fprintf(stderr, "rnk_cuda_init: %s\n", msg);
        return 1;
    }
    static thr ts[MAXTHR];
    for (int i = 0; i < most; i++) {
        thr_setup(&ts[i], dev, 4096, 256, 7u + (unsigned)i);
        ts[i].iters = iters;
        ts[i].depth = depth;
    }
    FILE *out = outp ? fopen(outp, "a") : NULL;
    if (out)
        fprintf(out, "| threads | calls | jobs/s, all threads | host us a job, each thread |\n"
                     "|---|---|---|---|\n");
    printf("== threads (4096x256, depth %d, %d jobs a thread)\n", depth, iters);
    thr_row(ts, 1, 0, NULL); /* warm-up */
    for (int r = 0; r < 2; r++) /* twice, in turn */
        for (int k = 0; k < nn; k++) {
            thr_row(ts, nts[k], 0, out);
            thr_row(ts, nts[k], 1, out);
        }
    if (out)
        fclose(out);
    return 0;
}

int main(int argc, char **argv)
{
    int iters = 2000;
    const char *outp = NULL, *threads = NULL;
    int depth = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--out") == 0)
            outp = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = argv[i + 1];
        else if (strcmp(argv[i], "--depth") == 0)
            depth = atoi(argv[i + 1]);
    }
    if (iters < 10)
        iters = 10;
    CK(cudaSetDevice(0));
    write64 = (pfn_write64)rne_driver_entry("cuStreamWriteValue64");
    batch = (pfn_batch)rne_driver_entry("cuStreamBatchMemOp");
    wait64 = (pfn_wait64)rne_driver_entry("cuStreamWaitValue64");
    if (threads)
        return threads_main(threads, iters, depth, outp);

    rnk_device *dev = NULL;
    char msg[256];
    if (rnk_cuda_init(0, &dev, msg, sizeof msg) != 0) {
        fprintf(stderr, "rnk_cuda_init: %s\n", msg);
        return 1;
    }
    const int64_t m = 4096, n = 256;
    size_t bytes[BP_PARTS];
    char *base[BP_PARTS] = {NULL};
    void *ws;
    uint64_t *words;
    size_t wsb = rnk_cuda_workspace_size(dev, m, n);
    bp_parts(m, n, 0, bytes); /* (one allocation: bytes[0]) */
    CK(cudaMalloc((void **)&base[0], bytes[0]));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemset(ws, 0, wsb));
    CK(cudaMalloc((void **)&words, 2 * sizeof *words));
    rnk_bwd_args a;
    bp_place(&a, base, m, n, 0);
    if (bp_fill(&a, 7, NULL, msg, sizeof msg) != 0) {
        fprintf(stderr, "inputs: %s\n", msg);
        return 1;
    }
    CK(cudaDeviceSynchronize()); /* (filled on the default stream; ours does not wait on it) */

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e_plain, e_tim0, e_tim1, e_fin, e_fin_tim;
    CK(cudaEventCreateWithFlags(&e_plain, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&e_tim0, cudaEventDefault));
    CK(cudaEventCreateWithFlags(&e_tim1, cudaEventDefault));
    CK(cudaEventCreateWithFlags(&e_fin, cudaEventDisableTiming | cudaEventBlockingSync));
    CK(cudaEventCreateWithFlags(&e_fin_tim, cudaEventBlockingSync));

    run prod = {"production", 7, {"record start (no timing)", "record t0 (timing)",
                                  "launch (rnk_cuda_bwd)", "record t1 (timing)",
                                  "write done (ring)", "write done (device)",
                                  "record completion (blocking)"}, {0}};
    run lean = {"lean", 4, {"record start (timing)", "launch (rnk_cuda_bwd)",
                            "both done words (one batch)", "record completion (blocking, timing)"},
                {0}};
    run bare = {"launches", 2, {"bare launch (one-thread kernel)", "launch (rnk_cuda_bwd)"}, {0}};
    for (int o = 0; o < MAXOPS; o++) {
        prod.t[o] = calloc((size_t)iters, sizeof(uint64_t));
        lean.t[o] = calloc((size_t)iters, sizeof(uint64_t));
        bare.t[o] = calloc((size_t)iters, sizeof(uint64_t));
    }
    rne_kernels rk;
    uint64_t *stamp;
    CK(rne_load(&rk));
    CK(cudaMalloc((void **)&stamp, sizeof *stamp));
    CUdeviceptr w0 = (CUdeviceptr)(uintptr_t)&words[0], w1 = (CUdeviceptr)(uintptr_t)&words[1];
    for (int pass = 0; pass < 2; pass++) /* the first pass warms up */
        for (int i = 0; i < iters; i++) {
            for (int v = 0; v < 2; v++) { /* alternating, so drift hits both */
                run *r = v ? &lean : &prod;
                uint64_t t[MAXOPS + 1];
                int k = 0;
                CK(cudaStreamSynchronize(st));
                t[k++] = now_ns();
                if (!v) {
                    CK(cudaEventRecord(e_plain, st));
                    t[k++] = now_ns();
                    CK(cudaEventRecord(e_tim0, st));
                    t[k++] = now_ns();
                } else {
                    CK(cudaEventRecord(e_tim0, st));
                    t[k++] = now_ns();
                }
                if (rnk_cuda_bwd(dev, &a, ws, wsb, st, msg, sizeof msg) != 0) {
                    fprintf(stderr, "rnk_cuda_bwd: %s\n", msg);
                    return 1;
                }
                t[k++] = now_ns();
                uint64_t val = (uint64_t)(pass * iters + i + 1);
                if (!v) {
                    CK(cudaEventRecord(e_tim1, st));
                    t[k++] = now_ns();
                    CK(cudaGetLastError());
                    if (write64(st, w0, val, 0) != CUDA_SUCCESS ||
                        (t[k++] = now_ns(), write64(st, w1, val, 0) != CUDA_SUCCESS)) {
                        fprintf(stderr, "cuStreamWriteValue64 failed\n");
                        return 1;
                    }
                    t[k++] = now_ns();
                    CK(cudaEventRecord(e_fin, st));
                    t[k++] = now_ns();
                } else {
                    CUstreamBatchMemOpParams ops[2];
                    memset(ops, 0, sizeof ops);
                    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                    ops[0].writeValue.address = w0;
                    ops[0].writeValue.value64 = val;
                    ops[1] = ops[0];
                    ops[1].writeValue.address = w1;
                    if (batch(st, 2, ops, 0) != CUDA_SUCCESS) {
                        fprintf(stderr, "cuStreamBatchMemOp failed\n");
                        return 1;
                    }
                    t[k++] = now_ns();
                    CK(cudaEventRecord(e_fin_tim, st));
                    t[k++] = now_ns();
                }
                if (pass)
                    for (int o = 0; o + 1 < k; o++)
                        r->t[o][i] = t[o + 1] - t[o];
            }
            /* Each on an idle stream too. */
            CK(cudaStreamSynchronize(st));
            uint64_t a0 = now_ns();
            CK(rne_stamp(&rk, stamp, st));
            uint64_t a1 = now_ns();
            CK(cudaStreamSynchronize(st));
            uint64_t b0 = now_ns();
            if (rnk_cuda_bwd(dev, &a, ws, wsb, st, msg, sizeof msg) != 0) {
                fprintf(stderr, "rnk_cuda_bwd: %s\n", msg);
                return 1;
            }
            uint64_t b1 = now_ns();
            if (pass) {
                bare.t[0][i] = a1 - a0;
                bare.t[1][i] = b1 - b0;
            }
        }
    CK(cudaStreamSynchronize(st));
    uint64_t hw[2];
    CK(cudaMemcpy(hw, words, sizeof hw, cudaMemcpyDeviceToHost));
    if (hw[0] != (uint64_t)(2 * iters) || hw[1] != hw[0]) {
        fprintf(stderr, "the done words read %llu, %llu, not %d\n", (unsigned long long)hw[0],
                (unsigned long long)hw[1], 2 * iters);
        return 1;
    }
    FILE *out = outp ? fopen(outp, "a") : NULL;
    if (out)
        fprintf(out, "| order | call | mean us | p50 us |\n|---|---|---|---|\n");
    report(&prod, iters, out);
    report(&lean, iters, out);
    report(&bare, iters, out);
    if (out)
        fclose(out);
    return 0;
}
