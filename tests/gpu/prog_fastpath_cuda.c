/* SPDX-License-Identifier: MIT */
/*
 * prog_fastpath_cuda.c - a client process of the CUDA fast-path tests
 * (test_fastpath_cuda): rn_rmsnorm_bwd on RN_PATH_FAST against a daemon
 * started with --cuda-fast-path.
 *
 *   prog_fastpath_cuda ENDPOINT cmp          shapes x dtypes: the fast path
 *                                            against the fp64 reference and
 *                                            bitwise against the classic path
 *   prog_fastpath_cuda ENDPOINT stall MS     a producer that spins MS ms before
 *                                            the call ("stalling" once the call
 *                                            returned), then the result checked
 *   prog_fastpath_cuda ENDPOINT quick N      N checked calls, "ok quick N in T ms"
 *   prog_fastpath_cuda ENDPOINT steady MS    checked calls for MS ms ("steady"
 *                                            after the first), "ok steady N calls"
 *   prog_fastpath_cuda ENDPOINT bad          bad calls: each error at rn_check,
 *                                            the stream never hangs, a good call
 *                                            after them is right
 *   prog_fastpath_cuda ENDPOINT memops MS [K] no daemon call: a spin of MS ms, then
 *                                            K (default 8) writes and waits on
 *                                            a word in host memory registered
 *                                            with CUDA (what a fast-path call
 *                                            leaves on the stream), "pending",
 *                                            and sleep until killed
 *   prog_fastpath_cuda ENDPOINT hold MS      a producer spinning MS ms, then 8
 *                                            calls behind it, "pending", and
 *                                            sleep until killed
 *   prog_fastpath_cuda ENDPOINT busy US      calls kept in flight (4 deep), each
 *                                            behind a producer spinning US us,
 *                                            so that the daemon's stream nearly
 *                                            always waits on this client; "busy"
 *                                            after the first, until a line on
 *                                            stdin; then "ok busy N calls"
 *   prog_fastpath_cuda ENDPOINT churn R K    R sessions one after another, each
 *                                            with K allocations of its own (a
 *                                            checked call on each) and then
 *                                            closed: R * K mappings and R rings
 *                                            released; "ok churn ..." with the
 *                                            slowest round's time
 *
 * Prints "ok ..." / "FAIL ..." lines and exits 0 when all passed.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"
#include "rnk.h"
#include "rnk_test.h"
#include "gpu/e2e_prog.h"

static const char *endpoint;
static cudaStream_t st;
static rn_client *fast, *classic;
static rne_kernels kern;
static int failures;

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static rn_client *connect_path(int path, const char *name)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    o.endpoint = endpoint;
    o.timeout_ms = 30000;
    o.client_name = name;
    o.path = path;
    if (rn_connect(&o, &c) != 0) {
        printf("FAIL connect: %s\n", rn_last_error(NULL));
        exit(1);
    }
    return c;
}

/* The stream waits (cudaStreamQuery) at most ms; false if it did not
 * finish: a stream left waiting for done is a hang. */
static bool drain(int ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess)
            return true;
        if (e != cudaErrorNotReady) {
            printf("FAIL stream: %s\n", cudaGetErrorString(e));
            exit(1);
        }
        if (ms_since(&t0) > ms)
            return false;
        usleep(1000);
    }
}

static void fill(const rn_bwd_args *a, uint64_t seed)
{
    char msg[200];
    int rc = rnk_cuda_fill((rnk_dtype)a->x_dtype, (void *)a->x, a->m, a->n, a->x_stride, seed, 1.0f,
                           0.1f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->dy_dtype, (void *)a->dy, a->m, a->n, a->dy_stride,
                           seed + 1, 1.0f, 0.0f, st, msg, sizeof msg);
    if (!rc && a->w_dtype)
        rc = rnk_cuda_fill((rnk_dtype)a->w_dtype, (void *)a->w, 1, a->n, a->n, seed + 2, 0.5f,
                           1.0f, st, msg, sizeof msg);
    if (rc) {
        printf("FAIL fill: %s\n", msg);
        exit(1);
    }
    rne_poison_outputs(a, st);
}

static bool verify(const rn_bwd_args *a, const char *what)
{
    if (rne_verify(a, st, what))
        return true;
    failures++;
    return false;
}

static void bf16_args(rn_bwd_args *a, int64_t m, int64_t n)
{
    memset(a, 0, sizeof *a);
    a->m = m;
    a->n = n;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = RN_DTYPE_BF16;
    a->dw_dtype = RN_DTYPE_F32;
    a->eps = 1e-6f;
    a->x_stride = a->dy_stride = a->dx_stride = n;
}

static int call_fast(const rn_bwd_args *a, const char *what)
{
    int rc = rn_rmsnorm_bwd(fast, a, st);
    if (rc != 0) {
        printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(fast));
        failures++;
    }
    return rc;
}

/* ---- cmp: fp64 and bitwise against the classic path ------------------------------------ */

static int run_cmp(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {7, 100}, {128, 1024}, {1000, 4096}, {64, 16384}};
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    int cases = 0;

    classic = connect_path(RN_PATH_CLASSIC, "fast-cmp-classic");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t d = 0; d < 3; d++) {
            rn_bwd_args a, b;
            char *ar, *br, what[96];
            memset(&a, 0, sizeof a);
            a.m = shapes[s][0];
            a.n = shapes[s][1];
            a.x_dtype = a.dy_dtype = a.dx_dtype = a.w_dtype = dts[d];
            a.dw_dtype = RN_DTYPE_F32;
            a.eps = 1e-6f;
            a.x_stride = a.dy_stride = a.dx_stride = a.n;
            b = a;
            size_t bytes = layout(&a, NULL, false);
            CK(cudaMalloc((void **)&ar, bytes));
            CK(cudaMalloc((void **)&br, bytes));
            layout(&a, ar, false);
            layout(&b, br, false);
            fill(&a, 1000 + s * 3 + d);
            fill(&b, 1000 + s * 3 + d);
            snprintf(what, sizeof what, "cmp %lldx%lld dtype %d", (long long)a.m,
                     (long long)a.n, (int)dts[d]);
            if (call_fast(&a, what) == 0 && rn_rmsnorm_bwd(classic, &b, st) == 0) {
                CK(cudaStreamSynchronize(st));
                if (rn_check(fast) != 0) {
                    printf("FAIL %s: rn_check: %s\n", what, rn_last_error(fast));
                    failures++;
                } else if (verify(&a, what)) {
                    char *ha = malloc(bytes), *hb = malloc(bytes);
                    CK(cudaMemcpy(ha, ar, bytes, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hb, br, bytes, cudaMemcpyDeviceToHost));
                    if (memcmp(ha, hb, bytes) != 0) {
                        printf("FAIL %s: the fast path's outputs differ from the classic path's\n",
                               what);
                        failures++;
                    } else {
                        cases++;
                    }
                    free(ha);
                    free(hb);
                }
            }
            CK(cudaFree(ar));
            CK(cudaFree(br));
        }
    }
    if (rn_client_path(fast) != RN_PATH_FAST) {
        printf("FAIL cmp: the client is not on the fast path\n");
        failures++;
    }
    rn_close(classic);
    printf("ok cmp: %d cases bitwise equal to the classic path\n", cases);
    return failures ? 1 : 0;
}

/* ---- stall and quick -------------------------------------------------------------------- */

static int run_stall(unsigned ms)
{
    rn_bwd_args a;
    char *ar;
    struct timespec t0;

    bf16_args(&a, 512, 2048);
    CK(cudaMalloc((void **)&ar, layout(&a, NULL, false)));
    layout(&a, ar, false);
    fill(&a, 77);
    CK(cudaStreamSynchronize(st));
    /* The producer is late: the inputs are written after MS ms on the GPU. */
    CK(rne_spin(&kern, (uint64_t)ms * 1000000u, st));
    fill(&a, 78);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (call_fast(&a, "stall") != 0)
        return 1;
    printf("stalling (the call returned after %.3f ms)\n", ms_since(&t0));
    if (!drain((int)ms + 60000)) {
        printf("FAIL stall: the stream did not finish\n");
        return 1;
    }
    if (rn_check(fast) != 0) {
        printf("FAIL stall: %s\n", rn_last_error(fast));
        return 1;
    }
    bool ok = verify(&a, "stall");
    CK(cudaFree(ar));
    printf("ok stall: done after %.0f ms\n", ms_since(&t0));
    return ok ? 0 : 1;
}

static int run_quick(int n)
{
    rn_bwd_args a;
    char *ar;
    struct timespec t0;

    bf16_args(&a, 256, 1024);
    CK(cudaMalloc((void **)&ar, layout(&a, NULL, false)));
    layout(&a, ar, false);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "quick %d", i);
        fill(&a, 500 + (uint64_t)i);
        if (call_fast(&a, what) != 0)
            return 1;
        if (!verify(&a, what))
            return 1;
    }
    if (rn_sync(fast) != 0) {
        printf("FAIL quick: %s\n", rn_last_error(fast));
        return 1;
    }
    CK(cudaFree(ar));
    printf("ok quick %d in %.0f ms\n", n, ms_since(&t0));
    return 0;
}

/* Checked calls for ms milliseconds: a client that is already there while
 * another one dies must see nothing of it. */
static int run_steady(unsigned ms)
{
    rn_bwd_args a;
    char *ar;
    struct timespec t0;
    int n = 0;

    bf16_args(&a, 256, 1024);
    CK(cudaMalloc((void **)&ar, layout(&a, NULL, false)));
    layout(&a, ar, false);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        char what[32];
        snprintf(what, sizeof what, "steady %d", n);
        fill(&a, 900 + (uint64_t)n);
        if (call_fast(&a, what) != 0 || !verify(&a, what))
            return 1;
        if (n++ == 0)
            printf("steady\n");
    } while (ms_since(&t0) < ms);
    if (rn_sync(fast) != 0) {
        printf("FAIL steady: %s\n", rn_last_error(fast));
        return 1;
    }
    CK(cudaFree(ar));
    printf("ok steady %d calls\n", n);
    return 0;
}

/* ---- bad calls -------------------------------------------------------------------------- */

static void expect_later(const char *what, const rn_bwd_args *a, int want)
{
    int rc = rn_rmsnorm_bwd(fast, a, st);
    if (rc != 0) {   /* an argument libclient itself refuses is fine too */
        printf("ok %s: refused at the call: %s\n", what, rn_err_name(rc));
        return;
    }
    if (!drain(20000)) {
        printf("FAIL %s: the stream hangs on the bad call\n", what);
        failures++;
        return;
    }
    rc = rn_check(fast);
    if (rc != want) {
        printf("FAIL %s: rn_check gave %s, want %s (%s)\n", what, rn_err_name(rc),
               rn_err_name(want), rn_last_error(fast));
        failures++;
        return;
    }
    printf("ok %s: %s at rn_check (%s)\n", what, rn_err_name(rc), rn_last_error(fast));
}

static int run_bad(void)
{
    rn_bwd_args a, b;
    char *ar;

    bf16_args(&a, 64, 512);
    size_t bytes = layout(&a, NULL, false);
    CK(cudaMalloc((void **)&ar, bytes));
    layout(&a, ar, false);
    fill(&a, 9);
    CK(cudaStreamSynchronize(st));
    b = a;
    b.m = 100000;   /* past the end of the allocation: only the daemon knows */
    expect_later("out of bounds", &b, RN_OUT_OF_BOUNDS);
    b = a;
    b.x = (const char *)a.x + 1;   /* not aligned to its element */
    expect_later("misaligned", &b, RN_MISALIGNED);
    b = a;
    b.dx = (void *)(uintptr_t)a.x;   /* dx over x */
    expect_later("aliased", &b, RN_ALIASING);
    b = a;
    b.eps = -1.0f;
    expect_later("negative eps", &b, RN_INVALID_ARGUMENT);
    /* The ring still serves. */
    fill(&a, 10);
    if (call_fast(&a, "after the bad calls") == 0) {
        CK(cudaStreamSynchronize(st));
        if (rn_check(fast) != 0) {
            printf("FAIL after the bad calls: %s\n", rn_last_error(fast));
            failures++;
        } else {
            verify(&a, "after the bad calls");
        }
    }
    CK(cudaFree(ar));
    if (!failures)
        printf("ok bad\n");
    return failures ? 1 : 0;
}

/* ---- hold: calls pending behind a slow producer, until killed ---------------------------- */

static int run_hold(unsigned ms)
{
    rn_bwd_args a;
    char *ar;

    bf16_args(&a, 256, 1024);
    CK(cudaMalloc((void **)&ar, layout(&a, NULL, false)));
    layout(&a, ar, false);
    fill(&a, 5);
    CK(rne_spin(&kern, (uint64_t)ms * 1000000u, st));
    for (int i = 0; i < 8; i++)
        if (call_fast(&a, "hold") != 0)
            return 1;
    printf("pending\n");
    for (;;)
        pause();
}

/* ---- busy and churn: releases while another client keeps calls in flight ------------------ */

static bool stdin_has_line(void)
{
    struct pollfd p = {.fd = 0, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

static int run_busy(unsigned spin_us)
{
    enum { DEPTH = 4 };
    cudaEvent_t ev[DEPTH];
    struct timespec t0;
    rn_bwd_args a;
    char *ar;
    int n = 0;

    bf16_args(&a, 256, 1024);
    CK(cudaMalloc((void **)&ar, layout(&a, NULL, false)));
    layout(&a, ar, false);
    fill(&a, 4321);
    for (int i = 0; i < DEPTH; i++)
        CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* The same inputs every call, so the last call's outputs are checked
     * like any one's.  At most DEPTH calls ahead of the GPU: the daemon's
     * stream always has the next call waiting for this producer. */
    do {
        if (n >= DEPTH)
            CK(cudaEventSynchronize(ev[n % DEPTH]));
        CK(rne_spin(&kern, (uint64_t)spin_us * 1000u, st));
        if (call_fast(&a, "busy") != 0)
            return 1;
        CK(cudaEventRecord(ev[n % DEPTH], st));
        if (n++ == 0)
            printf("busy\n");
    } while (!stdin_has_line() && ms_since(&t0) < 600000);
    if (rn_sync(fast) != 0) {
        printf("FAIL busy: %s\n", rn_last_error(fast));
        return 1;
    }
    if (!verify(&a, "busy"))
        return 1;
    for (int i = 0; i < DEPTH; i++)
        CK(cudaEventDestroy(ev[i]));
    CK(cudaFree(ar));
    printf("ok busy %d calls in %.0f ms\n", n, ms_since(&t0));
    return 0;
}

static int run_churn(int rounds, int k)
{
    enum { KMAX = 16 };
    rn_bwd_args a[KMAX];
    char *ar[KMAX];
    struct timespec t0, tr;
    double slowest = 0;

    if (k < 1 || k > KMAX)
        k = KMAX;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < rounds; r++) {
        clock_gettime(CLOCK_MONOTONIC, &tr);
        rn_client *c = connect_path(RN_PATH_FAST, "churn");
        for (int i = 0; i < k; i++) {
            /* Sizes that differ per round, so the allocations are new ones
             * (the client registers each: a mapping per allocation). */
            bf16_args(&a[i], 64 + 8 * (r % 4), 512 + 64 * i);
            CK(cudaMalloc((void **)&ar[i], layout(&a[i], NULL, false)));
            layout(&a[i], ar[i], false);
            fill(&a[i], 7000 + (uint64_t)(r * KMAX + i));
        }
        for (int i = 0; i < k; i++) {
            int rc = rn_rmsnorm_bwd(c, &a[i], st);
            if (rc != 0) {
                printf("FAIL churn %d/%d: %s: %s\n", r, i, rn_err_name(rc), rn_last_error(c));
                return 1;
            }
        }
        CK(cudaStreamSynchronize(st));
        if (rn_check(c) != 0) {
            printf("FAIL churn %d: %s\n", r, rn_last_error(c));
            return 1;
        }
        for (int i = 0; i < k; i++)
            if (!verify(&a[i], "churn"))
                return 1;
        if (rn_client_path(c) != RN_PATH_FAST) {
            printf("FAIL churn: the client is not on the fast path\n");
            return 1;
        }
        rn_close(c); /* the session ends: its mappings and its ring are released */
        for (int i = 0; i < k; i++)
            CK(cudaFree(ar[i]));
        double ms = ms_since(&tr);
        if (ms > slowest)
            slowest = ms;
    }
    printf("ok churn %d rounds of %d allocations in %.0f ms, the slowest round %.1f ms\n",
           rounds, k, ms_since(&t0), slowest);
    return 0;
}

/* What a fast-path call leaves on a client's stream, without the daemon:
 * does killing a process with such work pending disturb other MPS clients? */
typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
static int run_memops(unsigned ms, int k)
{
    pfn_value64 wait64 = NULL, write64 = NULL;
    enum cudaDriverEntryPointQueryResult q;
    uint64_t *words = NULL;
    void *dwords = NULL;

    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", (void **)&wait64, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", (void **)&write64, 12000,
                                        cudaEnableDefault, &q));
    if (posix_memalign((void **)&words, 4096, 4096) != 0)
        return 1;
    memset(words, 0, 4096);
    CK(cudaHostRegister(words, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
    CK(cudaHostGetDevicePointer(&dwords, words, 0));
    CK(rne_spin(&kern, (uint64_t)ms * 1000000u, st));
    for (uint64_t i = 1; i <= (uint64_t)k; i++) {
        if (write64((CUstream)st, (CUdeviceptr)(uintptr_t)dwords, i, 0) != CUDA_SUCCESS ||
            wait64((CUstream)st, (CUdeviceptr)(uintptr_t)dwords + 64, i, CU_STREAM_WAIT_VALUE_GEQ) !=
                CUDA_SUCCESS) {
            printf("FAIL memops: a stream memory operation was refused\n");
            return 1;
        }
    }
    printf("pending\n");
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    int rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENDPOINT cmp|stall MS|quick N|steady MS|bad|memops MS|hold MS|busy US|churn R K\n", argv[0]);
        return 2;
    }
    endpoint = argv[1];
    /* Under MPS a new client is refused while the server cleans up after a
     * client that was killed (cudaErrorMpsServerNotReady): a worker retries,
     * as this one does for up to 30 s. */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cudaError_t e;
    int refused = 0;
    while ((e = cudaSetDevice(0)) == cudaErrorMpsServerNotReady && ms_since(&t0) < 30000) {
        (void)cudaGetLastError();
        refused++;
        usleep(100000);
    }
    if (e != cudaSuccess && e != cudaErrorMpsServerNotReady)
        CK(e);
    CK(cudaSetDevice(0));
    if (refused)
        printf("cudaSetDevice: the MPS server was not ready for %.0f ms\n", ms_since(&t0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(rne_load(&kern));
    fast = connect_path(RN_PATH_FAST, "fast");
    if (strcmp(argv[2], "cmp") == 0)
        rc = run_cmp();
    else if (strcmp(argv[2], "stall") == 0 && argc >= 4)
        rc = run_stall((unsigned)atoi(argv[3]));
    else if (strcmp(argv[2], "quick") == 0 && argc >= 4)
        rc = run_quick(atoi(argv[3]));
    else if (strcmp(argv[2], "steady") == 0 && argc >= 4)
        rc = run_steady((unsigned)atoi(argv[3]));
    else if (strcmp(argv[2], "bad") == 0)
        rc = run_bad();
    else if (strcmp(argv[2], "memops") == 0 && argc >= 4)
        rc = run_memops((unsigned)atoi(argv[3]), argc >= 5 ? atoi(argv[4]) : 8);
    else if (strcmp(argv[2], "hold") == 0 && argc >= 4)
        rc = run_hold((unsigned)atoi(argv[3]));
    else if (strcmp(argv[2], "busy") == 0 && argc >= 4)
        rc = run_busy((unsigned)atoi(argv[3]));
    else if (strcmp(argv[2], "churn") == 0 && argc >= 5)
        rc = run_churn(atoi(argv[3]), atoi(argv[4]));
    else {
        fprintf(stderr, "unknown mode %s\n", argv[2]);
        rc = 2;
    }
    rn_close(fast);
    printf("%s\n", rc == 0 ? "PASS" : "FAILED");
    return rc;
}
