/* SPDX-License-Identifier: MIT */
/*
 * prog_e2e_cuda.c - a client process of the end-to-end GPU tests: it talks
 * to a running rmsnormd (cuda backend) through libclient's stream-ordered
 * calls and checks the results on the GPU against the fp64 reference
 * (rnk_cuda_verify).  A CUDA IPC handle cannot be opened in the process that
 * exported it, so the daemon and this program are always two processes.
 *
 *   prog_e2e_cuda ENDPOINT grid              shapes x dtypes x options
 *   prog_e2e_cuda ENDPOINT order ITERS SEED  producer -> call -> consumer with
 *                                            random delays, no host sync
 *   prog_e2e_cuda ENDPOINT flood             calls until killed ("running"
 *                                            after the first ones)
 *   prog_e2e_cuda ENDPOINT realloc           free + allocate at the same address
 *   prog_e2e_cuda ENDPOINT errors            each bad argument gets its error
 *   prog_e2e_cuda ENDPOINT stall MS [sync|async [EXPECT]]
 *   prog_e2e_cuda ENDPOINT wait MODE ...   (print "waiting", read "go" first; for
 *                                            stall, after its warm-up call)
 *                                            inputs that become ready only
 *                                            after MS ms: still a correct result
 *                                            ("stalling" just before the call,
 *                                            "stall: NAME after T ms" after it);
 *                                            EXPECT: the outcomes allowed, error
 *                                            names joined by ',' (default OK)
 *   prog_e2e_cuda ENDPOINT small             every tensor in a small cudaMalloc of
 *                                            its own (the driver packs such
 *                                            allocations into shared blocks),
 *                                            three rounds of freeing some and
 *                                            allocating them again
 *   prog_e2e_cuda ENDPOINT large             a 1024 x 1024 call whose tensors lie
 *                                            at the end of one 640 MiB cudaMalloc
 *                                            (the daemon counts it in
 *                                            regions.ipc_large), then one in an
 *                                            allocation of its own
 *   prog_e2e_cuda ENDPOINT slow M N          one sync call of M x N bf16 that
 *                                            must be answered DEVICE_FAILING
 *                                            (a daemon with a short kernel
 *                                            deadline and a forced grid)
 *   prog_e2e_cuda ENDPOINT wait MODE ...     set up (CUDA, connection), print
 *                                            "waiting", read a line from stdin,
 *                                            then run MODE
 *
 * Prints "ok ..." / "FAIL ..." lines on stdout and exits 0 when all passed.
 */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "integration/raw.h"
#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"
#include "rnk.h"
#include "rnk_test.h"
#include "gpu/e2e_prog.h"

static const char *endpoint;
static cudaStream_t st;
static rn_client *cli;
static rne_kernels kern;
static int failures;

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill_inputs(const rn_bwd_args *a, uint64_t seed)
{
    char msg[200];
    int rc = rnk_cuda_fill((rnk_dtype)a->x_dtype, (void *)a->x, a->m, a->n, a->x_stride, seed, 1.0f,
                           0.1f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->dy_dtype, (void *)a->dy, a->m, a->n, a->dy_stride, seed + 1,
                           1.0f, 0.0f, st, msg, sizeof msg);
    if (!rc && a->w_dtype)
        rc = rnk_cuda_fill((rnk_dtype)a->w_dtype, (void *)a->w, 1, a->n, a->n, seed + 2, 0.5f, 1.0f,
                           st, msg, sizeof msg);
    if (!rc && a->dres_dtype)
        rc = rnk_cuda_fill((rnk_dtype)a->dres_dtype, (void *)a->dres, a->m, a->n, a->dres_stride,
                           seed + 3, 1.0f, 0.0f, st, msg, sizeof msg);
    if (!rc && a->rstd)
        rc = rnk_cuda_rstd((rnk_dtype)a->x_dtype, a->x, a->m, a->n, a->x_stride, a->eps,
                           (float *)a->rstd, st, msg, sizeof msg);
    if (rc) {
        printf("FAIL fill: %s\n", msg);
        exit(1);
    }
}

static void poison_outputs(const rn_bwd_args *a)
{
    rne_poison_outputs(a, st);
}

/* Judge a's outputs on the GPU against the fp64 reference. */
static bool verify(const rn_bwd_args *a, const char *what)
{
    if (rne_verify(a, st, what))
        return true;
    failures++;
    return false;
}

static void connect_or_die(void)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 30000, .client_name = "e2e"};
    if (rn_connect(&o, &cli) != 0) {
        printf("FAIL connect: %s\n", rn_last_error(NULL));
        exit(1);
    }
}

/* ---- grid ----------------------------------------------------------------------------- */

static int run_grid(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {7, 100}, {128, 1024}, {1000, 4096},
                                        {4096, 768}, {64, 16384}, {3, 65536}, {0, 512}};
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    size_t cap = 0;
    char *arena;
    int cases = 0;

    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        rn_bwd_args a = {.m = shapes[s][0], .n = shapes[s][1], .x_dtype = RN_DTYPE_F32,
                         .dy_dtype = RN_DTYPE_F32, .dx_dtype = RN_DTYPE_F32,
                         .w_dtype = RN_DTYPE_F32, .dw_dtype = RN_DTYPE_F32,
                         .dres_dtype = RN_DTYPE_F32};
        size_t need = layout(&a, NULL, true);
        cap = need > cap ? need : cap;
    }
    CK(cudaMalloc((void **)&arena, cap));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t d = 0; d < 3; d++) {
            for (int opt = 0; opt < 4; opt++) {
                rn_bwd_args a;
                rn_timing t;
                char what[160];
                int rc;
                memset(&a, 0, sizeof a);
                a.m = shapes[s][0];
                a.n = shapes[s][1];
                a.x_dtype = a.dy_dtype = a.dx_dtype = dts[d];
                /* opt 0: weight + dw fp32 + rstd given; 1: no weight, rstd
                 * recomputed; 2: weight + dw in w's dtype + dresidual_out +
                 * weight_offset; 3: like 0, in sync mode. */
                a.w_dtype = opt == 1 ? RN_DTYPE_NONE : dts[d];
                a.dw_dtype = opt == 1 ? RN_DTYPE_NONE : opt == 2 ? dts[d] : RN_DTYPE_F32;
                a.dres_dtype = opt == 2 ? dts[d] : RN_DTYPE_NONE;
                a.weight_offset = opt == 2 ? 1.0f : 0.0f;
                a.eps = 1e-6f;
                a.x_stride = a.dy_stride = a.dx_stride = a.dres_stride = a.n;
                layout(&a, arena, opt != 1);
                snprintf(what, sizeof what, "grid %lldx%lld %s opt %d", (long long)a.m,
                         (long long)a.n, dts[d] == RN_DTYPE_BF16 ? "bf16" : dts[d] == RN_DTYPE_F16 ? "f16" : "f32",
                         opt);
                fill_inputs(&a, rnd());
                poison_outputs(&a);
                rc = opt == 3 ? rn_rmsnorm_bwd_sync(cli, &a, st, &t) : rn_rmsnorm_bwd(cli, &a, st);
                if (rc != 0) {
                    printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
                    failures++;
                    continue;
                }
                if (opt == 3 && a.m > 0 && t.compute_ns == 0) {
                    printf("FAIL %s: sync mode reported no kernel time\n", what);
                    failures++;
                }
                if (a.m == 0) {
                    CK(cudaStreamSynchronize(st));
                    cases++;
                    continue;
                }
                if (verify(&a, what))
                    cases++;
            }
        }
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(arena));
    printf("ok grid: %d cases\n", cases);
    return failures ? 1 : 0;
}

/* ---- stream ordering under random delays --------------------------------------------------- */

static int run_order(int iters, uint64_t seed)
{
    rn_bwd_args a;
    char *arena, *slots;
    size_t dxb;
    int bad = 0;

    rng_state ^= seed * 0x9E3779B97F4A7C15ull;
    memset(&a, 0, sizeof a);
    a.m = 256;
    a.n = 1024;
    a.x_dtype = a.dy_dtype = a.dx_dtype = a.w_dtype = RN_DTYPE_BF16;
    a.dw_dtype = RN_DTYPE_F32;
    a.eps = 1e-6f;
    a.x_stride = a.dy_stride = a.dx_stride = a.n;
    CK(cudaMalloc((void **)&arena, layout(&a, NULL, false)));
    layout(&a, arena, false);
    dxb = (size_t)(a.m * a.n) * 2;
    CK(cudaMalloc((void **)&slots, dxb * (size_t)iters));
    CK(cudaMemset(slots, 0xff, dxb * (size_t)iters));
    fill_inputs(&a, seed);   /* w */
    CK(cudaStreamSynchronize(st));

    for (int i = 0; i < iters; i++) {
        uint64_t r = rnd();
        /* Delays from 0 to ~400 us, often none, before the producer (so a
         * daemon that did not wait on the ready event would read the last
         * iteration's inputs) and before the consumer (so one that waits
         * too little is caught the other way round). */
        uint64_t d1 = (r & 3) ? (r >> 8) % 400000 : 0;
        uint64_t d2 = ((r >> 4) & 7) == 0 ? (r >> 24) % 200000 : 0;
        char msg[200];
        poison_outputs(&a);
        if (d1)
            CK(rne_spin(&kern, d1, st));
        /* The producer: this iteration's inputs, written just before the call. */
        if (rnk_cuda_fill((rnk_dtype)a.x_dtype, (void *)a.x, a.m, a.n, a.n, seed + 2 * (uint64_t)i + 100,
                          1.0f, 0.1f, st, msg, sizeof msg) ||
            rnk_cuda_fill((rnk_dtype)a.dy_dtype, (void *)a.dy, a.m, a.n, a.n,
                          seed + 2 * (uint64_t)i + 101, 1.0f, 0.0f, st, msg, sizeof msg)) {
            printf("FAIL order: fill: %s\n", msg);
            return 1;
        }
        int rc = rn_rmsnorm_bwd(cli, &a, st);
        if (rc != 0) {
            printf("FAIL order iteration %d: %s: %s\n", i, rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        if (d2)
            CK(rne_spin(&kern, d2, st));
        /* The consumer: copy dx away right after the call. */
        CK(cudaMemcpyAsync(slots + dxb * (size_t)i, a.dx, dxb, cudaMemcpyDeviceToDevice, st));
    }
    CK(cudaStreamSynchronize(st));
    /* Judge every iteration's dx against its own inputs. */
    for (int i = 0; i < iters; i++) {
        rn_bwd_args v = a;
        char msg[200], what[64];
        v.dx = slots + dxb * (size_t)i;
        v.dw_dtype = RN_DTYPE_NONE;
        v.dw = NULL;
        if (rnk_cuda_fill((rnk_dtype)a.x_dtype, (void *)a.x, a.m, a.n, a.n, seed + 2 * (uint64_t)i + 100,
                          1.0f, 0.1f, st, msg, sizeof msg) ||
            rnk_cuda_fill((rnk_dtype)a.dy_dtype, (void *)a.dy, a.m, a.n, a.n,
                          seed + 2 * (uint64_t)i + 101, 1.0f, 0.0f, st, msg, sizeof msg)) {
            printf("FAIL order: fill: %s\n", msg);
            return 1;
        }
        snprintf(what, sizeof what, "order iteration %d", i);
        if (!verify(&v, what) && ++bad >= 5)
            break;
    }
    CK(cudaFree(slots));
    CK(cudaFree(arena));
    if (bad)
        return 1;
    printf("ok order: %d iterations\n", iters);
    return 0;
}

/* ---- flood: calls until killed ------------------------------------------------------------------ */

/* m x n contiguous rows, bf16 x/dy/dx/w, fp32 dw; pointers from layout(). */
static void bf16_args(rn_bwd_args *a, int64_t m, int64_t n)
{
    memset(a, 0, sizeof *a);
    a->m = m;
    a->n = n;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = RN_DTYPE_BF16;
    a->dw_dtype = RN_DTYPE_F32;
    a->eps = 1e-6f;
    a->x_stride = a->dy_stride = a->dx_stride = a->n;
}

static int run_flood(void)
{
    rn_bwd_args a;
    char *arena;

    bf16_args(&a, 8192, 4096);
    CK(cudaMalloc((void **)&arena, layout(&a, NULL, true)));
    layout(&a, arena, true);
    fill_inputs(&a, 7);
    for (long i = 0;; i++) {
        int rc = rn_rmsnorm_bwd(cli, &a, st);
        if (rc != 0) {
            printf("FAIL flood: %s: %s\n", rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        /* Keep a few kernels queued on the GPU, but not without bound. */
        CK(rne_spin(&kern, 20000, st));
        if (i % 16 == 15)
            CK(cudaStreamSynchronize(st));
        if (i == 32) {
            printf("running\n");
            fflush(stdout);
        }
    }
}

/* ---- realloc: a new allocation at an old address ------------------------------------------------ */

static int64_t stat_of(const char *name)
{
    rn_stats_info s;
    if (rn_stats(cli, &s) != 0)
        return -1;
    return (int64_t)rn_stats_get(&s, name, (uint64_t)-1);
}

/* ---- one client, two streams -------------------------------------------------------------- */

/* x and dy of a for call i (seeds as run_order's), on stream s. */
static int fill_call(const rn_bwd_args *a, uint64_t seed, int i, cudaStream_t s)
{
    char msg[200];
    if (rnk_cuda_fill((rnk_dtype)a->x_dtype, (void *)a->x, a->m, a->n, a->n,
                      seed + 2 * (uint64_t)i + 100, 1.0f, 0.1f, s, msg, sizeof msg) ||
        rnk_cuda_fill((rnk_dtype)a->dy_dtype, (void *)a->dy, a->m, a->n, a->n,
                      seed + 2 * (uint64_t)i + 101, 1.0f, 0.0f, s, msg, sizeof msg)) {
        printf("FAIL streams2: fill: %s\n", msg);
        return -1;
    }
    return 0;
}

/* Calls of one client on two streams, alternating, each call's producer on
 * its own stream and often late: the ring has one ready word, so a call
 * must not run before its own stream's producer is done however the other
 * stream runs ahead (libclient orders the two streams' writes of it).
 * With reuse, every call gets a stream of its own, created before it and
 * destroyed after it while its producer may still run: the next stream
 * often gets the same handle, and is still another stream (libclient tells
 * them apart by their ids).  Every call's dx is judged against its own
 * inputs. */
static int run_streams2(int iters, uint64_t seed, bool reuse)
{
    const char *name = reuse ? "streams-reused" : "streams2";
    rn_bwd_args a[2];
    char *arena[2], *slots;
    cudaStream_t s2[2], prev = NULL;
    cudaEvent_t used[2]; /* (reuse: the end of the last call on each arena) */
    size_t dxb = (size_t)256 * 1024 * 2;
    int bad = 0, same = 0;

    rng_state ^= seed * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 2; k++) {
        if (!reuse)
            CK(cudaStreamCreateWithFlags(&s2[k], cudaStreamNonBlocking));
        else
            CK(cudaEventCreateWithFlags(&used[k], cudaEventDisableTiming));
        bf16_args(&a[k], 256, 1024);
        CK(cudaMalloc((void **)&arena[k], layout(&a[k], NULL, false)));
        layout(&a[k], arena[k], false);
        fill_inputs(&a[k], seed + 7 * (uint64_t)k); /* (w; x and dy per call below) */
    }
    CK(cudaMalloc((void **)&slots, dxb * (size_t)iters));
    CK(cudaMemset(slots, 0xff, dxb * (size_t)iters));
    CK(cudaStreamSynchronize(st));
    for (int i = 0; i < iters; i++) {
        const int k = i & 1;
        if (reuse) {
            CK(cudaStreamCreateWithFlags(&s2[k], cudaStreamNonBlocking));
            same += s2[k] == prev;
            if (i >= 2) /* (after the last call on this arena, on a stream gone by now) */
                CK(cudaStreamWaitEvent(s2[k], used[k], 0));
        }
        const cudaStream_t s = s2[k];
        uint64_t r = rnd(), d1 = (r & 1) ? (r >> 8) % 300000 : 0;
        rne_poison_outputs(&a[k], s);
        if (d1)
            CK(rne_spin(&kern, d1, s));
        if (fill_call(&a[k], seed, i, s) != 0)
            return 1;
        int rc = rn_rmsnorm_bwd(cli, &a[k], s);
        if (rc != 0) {
            printf("FAIL %s call %d: %s: %s\n", name, i, rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        CK(cudaMemcpyAsync(slots + dxb * (size_t)i, a[k].dx, dxb, cudaMemcpyDeviceToDevice, s));
        if (reuse) {
            CK(cudaEventRecord(used[k], s));
            prev = s;
            CK(cudaStreamDestroy(s));
        }
    }
    if (reuse)
        CK(cudaDeviceSynchronize());
    else
        for (int k = 0; k < 2; k++)
            CK(cudaStreamSynchronize(s2[k]));
    for (int i = 0; i < iters; i++) {
        rn_bwd_args v = a[i & 1];
        char what[64];
        if (fill_call(&v, seed, i, st) != 0)
            return 1;
        v.dx = slots + dxb * (size_t)i;
        v.dw_dtype = RN_DTYPE_NONE;
        v.dw = NULL;
        snprintf(what, sizeof what, "%s call %d (arena %d)", name, i, i & 1);
        if (!verify(&v, what) && ++bad >= 5)
            break;
    }
    CK(cudaFree(slots));
    for (int k = 0; k < 2; k++) {
        CK(cudaFree(arena[k]));
        if (!reuse)
            CK(cudaStreamDestroy(s2[k]));
        else
            CK(cudaEventDestroy(used[k]));
    }
    if (bad)
        return 1;
    if (reuse)
        printf("ok %s: %d calls, %d on the previous call's handle\n", name, iters, same);
    else
        printf("ok %s: %d calls\n", name, iters);
    return 0;
}

static int run_realloc(void)
{
    rn_bwd_args a;
    char *arena = NULL, *prev = NULL;
    size_t bytes;
    int same = 0;
    int64_t regions0 = -1;

    memset(&a, 0, sizeof a);
    a.m = 512;
    a.n = 2048;
    a.x_dtype = a.dy_dtype = a.dx_dtype = a.w_dtype = RN_DTYPE_BF16;
    a.dw_dtype = RN_DTYPE_F32;
    a.eps = 1e-6f;
    a.x_stride = a.dy_stride = a.dx_stride = a.n;
    bytes = layout(&a, NULL, true);
    for (int round = 0; round < 6; round++) {
        char what[64];
        CK(cudaMalloc((void **)&arena, bytes));
        if (prev && arena == prev)
            same++;
        layout(&a, arena, true);
        fill_inputs(&a, 1000 + (uint64_t)round);
        poison_outputs(&a);
        int rc = rn_rmsnorm_bwd(cli, &a, st);
        if (rc != 0) {
            printf("FAIL realloc round %d: %s: %s\n", round, rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        snprintf(what, sizeof what, "realloc round %d (%s address)", round,
                 prev && arena == prev ? "same" : "new");
        verify(&a, what);
        if (round == 0)
            regions0 = stat_of("regions.active");
        CK(cudaStreamSynchronize(st));
        CK(cudaFree(arena));
        prev = arena;
    }
    /* The old allocations were unregistered: the daemon holds one region,
     * not one per round. */
    int64_t regions1 = stat_of("regions.active");
    if (regions1 > regions0 + 1) {
        printf("FAIL realloc: regions.active grew from %lld to %lld\n", (long long)regions0,
               (long long)regions1);
        failures++;
    }
    printf("ok realloc: %d of 5 reallocations at the same address\n", same);
    return failures ? 1 : 0;
}

/* ---- errors ------------------------------------------------------------------------------------- */

static void expect(const char *what, int rc, int want, const char *needle)
{
    const char *msg = rc ? rn_last_error(cli) : "";
    if (rc != want || (needle && !strstr(msg, needle))) {
        printf("FAIL %s: got %s (%s), want %s%s%s\n", what, rn_err_name(rc), msg, rn_err_name(want),
               needle ? " naming " : "", needle ? needle : "");
        failures++;
    } else {
        printf("ok %s: %s: %s\n", what, rn_err_name(rc), msg);
    }
}

static int run_errors(void)
{
    rn_bwd_args a, b;
    char *arena, *host, *managed, *pool = NULL;
    size_t bytes;

    memset(&a, 0, sizeof a);
    a.m = 64;
    a.n = 1024;
    a.x_dtype = a.dy_dtype = a.dx_dtype = a.w_dtype = RN_DTYPE_BF16;
    a.dw_dtype = RN_DTYPE_F32;
    a.eps = 1e-6f;
    a.x_stride = a.dy_stride = a.dx_stride = a.n;
    /* A whole number of 2 MiB pages, so that the allocation ends exactly
     * where we think it does. */
    bytes = (layout(&a, NULL, false) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    CK(cudaMalloc((void **)&arena, bytes));
    layout(&a, arena, false);
    fill_inputs(&a, 5);

    b = a;
    b.x = arena + 1;
    expect("misaligned offset", rn_rmsnorm_bwd(cli, &b, st), RN_MISALIGNED, "x");
    b = a;
    b.x = arena + bytes - 64;
    expect("out-of-bounds offset", rn_rmsnorm_bwd(cli, &b, st), RN_OUT_OF_BOUNDS, "x");
    host = malloc(1 << 20);
    b = a;
    b.dy = host;
    expect("host memory", rn_rmsnorm_bwd(cli, &b, st), RN_NOT_SHARED, "dy: host memory");
    CK(cudaMallocManaged((void **)&managed, 1 << 20, cudaMemAttachGlobal));
    b = a;
    b.dx = managed;
    expect("managed memory", rn_rmsnorm_bwd(cli, &b, st), RN_NOT_SHARED, "dx: managed");
    if (cudaMallocAsync((void **)&pool, 1 << 20, st) == cudaSuccess) {
        CK(cudaStreamSynchronize(st));
        b = a;
        b.x = pool;
        expect("memory-pool memory", rn_rmsnorm_bwd(cli, &b, st), RN_NOT_SHARED, "cuMemCreate");
        CK(cudaFreeAsync(pool, st));
    } else {
        (void)cudaGetLastError();
        printf("ok memory-pool memory: skipped (no cudaMallocAsync here)\n");
    }

    /* A handle "from another device": a real handle with a forged UUID, and
     * events likewise; also a region kind the cuda backend does not map. */
    {
        int sock = rnr_open(endpoint);
        rnp_session sess;
        rnp_request req;
        rnp_reply rep;
        cudaIpcMemHandle_t h;
        cudaIpcEventHandle_t eh;
        cudaEvent_t ev;
        uint32_t region = 0;
        if (sock < 0 || rnr_hello(sock, &sess) != 0) {
            printf("FAIL raw connection\n");
            return 1;
        }
        CK(cudaIpcGetMemHandle(&h, arena));
        memset(&req, 0, sizeof req);
        req.version = RNP_VERSION;
        req.op = RN_OP_REGISTER;
        req.id = 1;
        req.u.reg.session = sess;
        req.u.reg.kind = RNP_REGION_CUDA_IPC;
        req.u.reg.size = bytes;
        memcpy(req.u.reg.ipc_handle, &h, sizeof h);
        memset(req.u.reg.device_uuid, 0xab, sizeof req.u.reg.device_uuid);
        if (rnr_call(sock, &req, &rep) != 0)
            return 1;
        if (rep.status != RN_WRONG_DEVICE || !strstr(rep.error, "register.device_uuid")) {
            printf("FAIL forged device UUID: got %s (%s)\n", rn_err_name(rep.status), rep.error);
            failures++;
        } else {
            printf("ok forged device UUID: %s: %s\n", rn_err_name(rep.status), rep.error);
        }
        /* The same handle with a claimed size beyond the allocation. */
        struct cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, 0));
        memcpy(req.u.reg.device_uuid, p.uuid.bytes, 16);
        req.id = 2;
        req.u.reg.size = (uint64_t)1 << 40;
        if (rnr_call(sock, &req, &rep) != 0)
            return 1;
        if (rep.status != RN_INVALID_ARGUMENT || !strstr(rep.error, "register.size")) {
            printf("FAIL oversized claim: got %s (%s)\n", rn_err_name(rep.status), rep.error);
            failures++;
        } else {
            printf("ok oversized claim: %s: %s\n", rn_err_name(rep.status), rep.error);
        }
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
        CK(cudaIpcGetEventHandle(&eh, ev));
        memset(&req, 0, sizeof req);
        req.version = RNP_VERSION;
        req.op = RN_OP_EVENTS;
        req.id = 3;
        req.u.events.session = sess;
        req.u.events.n = 1;
        memcpy(req.u.events.ready[0], &eh, sizeof eh);
        memset(req.u.events.device_uuid, 0xcd, 16);
        if (rnr_call(sock, &req, &rep) != 0)
            return 1;
        if (rep.status != RN_WRONG_DEVICE || !strstr(rep.error, "events.device_uuid")) {
            printf("FAIL forged event UUID: got %s (%s)\n", rn_err_name(rep.status), rep.error);
            failures++;
        } else {
            printf("ok forged event UUID: %s: %s\n", rn_err_name(rep.status), rep.error);
        }
        int st_shm = rnr_register(sock, &sess, "/rmsnormd-e2e-none", 4096, &region);
        if (st_shm != RN_UNSUPPORTED) {
            printf("FAIL shm region on the cuda backend: got %s\n", rn_err_name(st_shm));
            failures++;
        } else {
            printf("ok shm region on the cuda backend: UNSUPPORTED\n");
        }
        cudaEventDestroy(ev);
        rnr_close(sock);
    }

    /* Nothing else changed: a good call still works. */
    poison_outputs(&a);
    expect("good call after the errors", rn_rmsnorm_bwd(cli, &a, st), RN_OK, NULL);
    verify(&a, "good call after the errors");
    CK(cudaStreamSynchronize(st));
    free(host);
    CK(cudaFree(managed));
    CK(cudaFree(arena));
    return failures ? 1 : 0;
}

/* ---- stall: the ready event comes late ---------------------------------------------------------- */

static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Whether name is one of the ','-separated names of list. */
static bool name_in(const char *name, const char *list)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len + (end ? 1 : 0);
    }
    return false;
}

/* "wait": print "waiting" and read a line ("go") from stdin. */
static bool wait_for_go;

static bool await_go(void)
{
    char go[64];
    printf("waiting\n");
    fflush(stdout);
    if (!fgets(go, sizeof go, stdin)) {
        printf("FAIL wait: stdin closed\n");
        return false;
    }
    return true;
}

static int run_stall(unsigned ms, bool async, const char *expect)
{
    rn_bwd_args a;
    char *arena;
    rn_timing t;
    struct timespec t0;

    memset(&a, 0, sizeof a);
    a.m = 64;
    a.n = 256;
    a.x_dtype = a.dy_dtype = a.dx_dtype = RN_DTYPE_F32;
    a.eps = 1e-6f;
    a.x_stride = a.dy_stride = a.dx_stride = a.n;
    CK(cudaMalloc((void **)&arena, layout(&a, NULL, false)));
    layout(&a, arena, false);
    fill_inputs(&a, 9);
    /* A first call exchanges events and registers the memory, so that the
     * stalled call below is nothing but the wait. */
    poison_outputs(&a);
    int rc = rn_rmsnorm_bwd_sync(cli, &a, st, &t);
    if (rc != 0) {
        printf("FAIL stall warm-up: %s: %s\n", rn_err_name(rc), rn_last_error(cli));
        return 1;
    }
    if (!verify(&a, "stall warm-up"))
        return 1;
    /* With "wait", the test starts the stalled calls of several clients
     * only once every warm-up is done: under MPS a stream that waits on a
     * late input can hold up another client's warm-up kernel. */
    if (wait_for_go && !await_go())
        return 1;
    /* The producer of the stalled call's inputs runs only after MS ms of
     * spinning: a daemon that did not wait for it would compute on the
     * warm-up's inputs, and the check below would fail. */
    poison_outputs(&a);
    CK(rne_spin(&kern, (uint64_t)ms * 1000000u, st));
    fill_inputs(&a, 10);
    printf("stalling\n");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = async ? rn_rmsnorm_bwd(cli, &a, st) : rn_rmsnorm_bwd_sync(cli, &a, st, &t);
    printf("stall: %s after %.1f ms%s%s\n", rn_err_name(rc), ms_since(&t0), rc ? ": " : "",
           rc ? rn_last_error(cli) : "");
    if (!name_in(rn_err_name(rc), expect)) {
        printf("FAIL stall: got %s, want %s\n", rn_err_name(rc), expect);
        return 1;
    }
    if (rc != 0) {
        /* An error that was allowed (the daemon failed): the daemon's
         * kernel may still read the memory, so it goes with this process,
         * and the spin need not end first. */
        printf("ok stall: %s, as allowed\n", rn_err_name(rc));
        return 0;
    }
    if (!verify(&a, "stall"))
        return 1;
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(arena));
    printf("ok stall: a correct result after inputs that were %u ms late\n", ms);
    return 0;
}

/* ---- slow: one kernel far past a short deadline ------------------------------------------------- */

static int run_slow(int64_t m, int64_t n)
{
    rn_bwd_args a;
    char *arena;
    rn_timing t;
    struct timespec t0;

    bf16_args(&a, m, n);
    CK(cudaMalloc((void **)&arena, layout(&a, NULL, false)));
    layout(&a, arena, false);
    fill_inputs(&a, 11);
    /* Inputs ready before the call: the daemon's deadline is the kernel's. */
    CK(cudaStreamSynchronize(st));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = rn_rmsnorm_bwd_sync(cli, &a, st, &t);
    printf("slow %lldx%lld: %s after %.1f ms%s%s\n", (long long)m, (long long)n, rn_err_name(rc),
           ms_since(&t0), rc ? ": " : "", rc ? rn_last_error(cli) : "");
    if (rc != RN_DEVICE_FAILING) {
        printf("FAIL slow: got %s, want DEVICE_FAILING\n", rn_err_name(rc));
        return 1;
    }
    /* The daemon's kernel may still read the memory: the daemon exits, and
     * the allocation goes with this process. */
    printf("ok slow: DEVICE_FAILING\n");
    return 0;
}

/* Each tensor in a cudaMalloc of its own, small enough that the driver packs
 * several into one block: round 0 allocates them all; round 1 frees w, dw
 * and rstd and allocates them again after a 4 KiB allocation (so at other
 * addresses of the blocks the daemon has mapped); round 2 frees everything
 * and allocates in the reverse order. */
static int run_small(void)
{
    rn_bwd_args a;
    void **slot[6];
    size_t bytes[6];
    void *pad = NULL;

    bf16_args(&a, 256, 512);
    slot[0] = (void **)&a.x, slot[1] = (void **)&a.dy, slot[2] = &a.dx;
    slot[3] = (void **)&a.w, slot[4] = &a.dw, slot[5] = (void **)&a.rstd;
    bytes[0] = bytes[1] = bytes[2] = (size_t)(a.m * a.n) * 2;
    bytes[3] = (size_t)a.n * 2, bytes[4] = (size_t)a.n * 4, bytes[5] = (size_t)a.m * 4;
    for (int round = 0; round < 3; round++) {
        char what[64];
        if (round == 1) {
            for (int i = 3; i < 6; i++)
                CK(cudaFree(*slot[i]));
            CK(cudaMalloc(&pad, 4096));
            for (int i = 3; i < 6; i++)
                CK(cudaMalloc(slot[i], bytes[i]));
        } else {
            for (int i = 0; round == 2 && i < 6; i++)
                CK(cudaFree(*slot[i]));
            for (int j = 0; j < 6; j++) {
                int i = round == 2 ? 5 - j : j;
                CK(cudaMalloc(slot[i], bytes[i]));
            }
        }
        fill_inputs(&a, 500 + (uint64_t)round);
        poison_outputs(&a);
        snprintf(what, sizeof what, "small allocations, round %d", round);
        int rc = rn_rmsnorm_bwd(cli, &a, st);
        if (rc != 0) {
            printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
            return 1;
        }
        if (verify(&a, what))
            printf("ok %s\n", what);
        CK(cudaStreamSynchronize(st));
    }
    for (int i = 0; i < 6; i++)
        CK(cudaFree(*slot[i]));
    CK(cudaFree(pad));
    return failures ? 1 : 0;
}

/* One checked call on tensors at byte `at` of arena. */
static bool large_call(char *arena, size_t at, const char *what)
{
    rn_bwd_args a;

    bf16_args(&a, 1024, 1024);
    layout(&a, arena + at, true);
    fill_inputs(&a, 31);
    poison_outputs(&a);
    int rc = rn_rmsnorm_bwd(cli, &a, st);
    if (rc) {
        printf("FAIL %s: %s: %s\n", what, rn_err_name(rc), rn_last_error(cli));
        return false;
    }
    if (!verify(&a, what))
        return false;
    printf("ok %s\n", what);
    return true;
}

static int run_large(void)
{
    rn_bwd_args a;
    char *big, *small;
    size_t big_bytes = (size_t)640 << 20;

    bf16_args(&a, 1024, 1024);
    size_t need = layout(&a, NULL, true);
    CK(cudaMalloc((void **)&big, big_bytes));
    CK(cudaMalloc((void **)&small, need));
    bool ok = large_call(big, (big_bytes - need) / 256 * 256,
                         "large: tensors in a 640 MiB allocation");
    ok = large_call(small, 0, "large: tensors in an allocation of their own") && ok;
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(big));
    CK(cudaFree(small));
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENDPOINT [wait] grid|order N SEED|flood|realloc|errors|"
                "stall MS [sync|async [EXPECT]]|small|large|slow M N|"
                "streams2|streams-reused N SEED\n", argv[0]);
        return 2;
    }
    endpoint = argv[1];
    rng_state ^= (uint64_t)getpid() << 20;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(rne_load(&kern));
    connect_or_die();
    if (strcmp(argv[2], "wait") == 0 && argc >= 4) {
        argv++;
        argc--;
        /* stall waits after its warm-up (run_stall); the rest before the
         * work: the context and the connection exist already. */
        wait_for_go = true;
        if (strcmp(argv[2], "stall") != 0 && !await_go()) {
            rn_close(cli);
            return 1;
        }
    }
    if (strcmp(argv[2], "grid") == 0)
        rc = run_grid();
    else if (strcmp(argv[2], "order") == 0 && argc >= 5)
        rc = run_order(atoi(argv[3]), strtoull(argv[4], NULL, 0));
    else if (strcmp(argv[2], "flood") == 0)
        rc = run_flood();
    else if (strcmp(argv[2], "streams2") == 0 && argc >= 5)
        rc = run_streams2(atoi(argv[3]), strtoull(argv[4], NULL, 0), false);
    else if (strcmp(argv[2], "streams-reused") == 0 && argc >= 5)
        rc = run_streams2(atoi(argv[3]), strtoull(argv[4], NULL, 0), true);
    else if (strcmp(argv[2], "realloc") == 0)
        rc = run_realloc();
    else if (strcmp(argv[2], "errors") == 0)
        rc = run_errors();
    else if (strcmp(argv[2], "stall") == 0 && argc >= 4)
        rc = run_stall((unsigned)atoi(argv[3]), argc >= 5 && strcmp(argv[4], "async") == 0,
                       argc >= 6 ? argv[5] : "OK");
    else if (strcmp(argv[2], "small") == 0)
        rc = run_small();
    else if (strcmp(argv[2], "large") == 0)
        rc = run_large();
    else if (strcmp(argv[2], "slow") == 0 && argc >= 5)
        rc = run_slow(strtoll(argv[3], NULL, 10), strtoll(argv[4], NULL, 10));
    else {
        fprintf(stderr, "unknown mode %s\n", argv[2]);
        rc = 2;
    }
    rn_close(cli);
    printf("%s\n", rc == 0 ? "PASS" : "FAILED");
    return rc;
}
