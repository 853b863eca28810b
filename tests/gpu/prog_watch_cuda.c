/* SPDX-License-Identifier: MIT */
/*
 * prog_watch_cuda.c - a client process of test_watch_cuda: the daemon is
 * killed (kill -9) while this client's stream waits on the fast path, and
 * the stream must go on within 2 s with no libclient call after the kill
 * (libclient's daemon watcher, client/watch.c).
 *
 *   prog_watch_cuda ENDPOINT ring SPIN_MS    a call whose inputs a GPU spin of
 *                                            SPIN_MS holds back
 *   prog_watch_cuda ENDPOINT graph SPIN_MS   a replay of a captured call after a
 *                                            GPU spin of SPIN_MS (0: the replay's
 *                                            start has run when "pending" is said)
 *   ... ctx                                  all of it in a context of the client's
 *                                            own (cuCtxCreate), not the device's
 *                                            primary context
 *
 * The dialogue on stdin/stdout, each step under a time limit (a hang fails):
 *   "ready"      set up: an eager call checked, (graph) the call captured and
 *                replayed once, checked; then waits for "go"
 *   "pending"    the spin and the call (or the replay) are on the stream; waits
 *                for "killed" (the test killed the daemon and saw it exit)
 *   "ok released ..." the stream finished (cudaStreamQuery polled, then
 *                cudaStreamSynchronize) within 2 s of the later of the kill and
 *                the spin's end; (graph) a second replay finishes within 2 s too
 *   then waits for "restarted" (a new daemon at the endpoint): the next call
 *   must return RN_RESTARTED (the loss, reported once), and a call after it
 *   runs in a new session and is checked against the fp64 reference.
 * Prints "FAIL ..." and exits 1 at the first failure, "PASS" at the end.
 */
#include <cuda_runtime_api.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "gpu/e2e_prog.h"
#include "rmsnorm_client.h"

#define RELEASE_MS 2000
#define STEP_MS    120000

static cudaStream_t st;
static rne_kernels kern;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A failure with the stream perhaps still waiting: leave at once (no exit
 * handlers, which might wait for the device). */
#define DIE(...)                                                                                   \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
        _exit(1);                                                                                  \
    } while (0)

/* Wait for the line want on stdin (STEP_MS at most). */
static void expect_line(const char *want)
{
    static char buf[256];
    static size_t have;
    double t0 = now_ms();

    for (;;) {
        char *nl = memchr(buf, '\n', have);
        if (nl) {
            *nl = '\0';
            bool ok = strcmp(buf, want) == 0;
            size_t used = (size_t)(nl - buf) + 1;
            memmove(buf, nl + 1, have - used);
            have -= used;
            if (!ok)
                DIE("expected '%s' on stdin", want);
            return;
        }
        struct pollfd p = {0, POLLIN, 0};
        int left = (int)(STEP_MS - (now_ms() - t0));
        if (left <= 0 || poll(&p, 1, left) <= 0)
            DIE("no '%s' on stdin within %d ms", want, STEP_MS);
        ssize_t n = read(0, buf + have, sizeof buf - 1 - have);
        if (n <= 0)
            DIE("stdin closed before '%s'", want);
        have += (size_t)n;
    }
}

/* The stream finished by deadline (ms, now_ms's clock), polled; then
 * cudaStreamSynchronize, which returns at once, must succeed.  Returns
 * the time it finished. */
static double stream_done_by(double deadline, const char *what)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            DIE("%s: the stream failed: %s", what, cudaGetErrorString(e));
        if (now_ms() > deadline)
            DIE("%s: the stream still waits %.0f ms past its deadline (the daemon is dead: "
                "nothing let its wait go)",
                what, now_ms() - deadline + RELEASE_MS);
        usleep(1000);
    }
    double t = now_ms();
    CK(cudaStreamSynchronize(st));
    return t;
}

static void args_of(rn_bwd_args *a, char *arena)
{
    memset(a, 0, sizeof *a);
    a->m = 256;
    a->n = 1024;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = RN_DTYPE_BF16;
    a->dw_dtype = RN_DTYPE_F32;
    a->eps = 1e-6f;
    a->x_stride = a->dy_stride = a->dx_stride = a->n;
    layout(a, arena, false);
}

static void fill(const rn_bwd_args *a, uint64_t seed)
{
    char msg[200];
    int rc = rnk_cuda_fill((rnk_dtype)a->x_dtype, (void *)a->x, a->m, a->n, a->x_stride, seed, 1.0f,
                           0.1f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->dy_dtype, (void *)a->dy, a->m, a->n, a->dy_stride,
                           seed + 1, 1.0f, 0.0f, st, msg, sizeof msg);
    if (!rc)
        rc = rnk_cuda_fill((rnk_dtype)a->w_dtype, (void *)a->w, 1, a->n, a->n, seed + 2, 0.5f, 1.0f,
                           st, msg, sizeof msg);
    if (rc)
        DIE("fill: %s", msg);
    rne_poison_outputs(a, st);
}

/* One call on the live daemon, synchronised and checked. */
static void checked_call(rn_client *c, const rn_bwd_args *a, uint64_t seed, const char *what)
{
    fill(a, seed);
    int rc = rn_rmsnorm_bwd(c, a, st);
    if (rc != 0)
        DIE("%s: %s: %s", what, rn_err_name(rc), rn_last_error(c));
    CK(cudaStreamSynchronize(st));
    if ((rc = rn_check(c)) != 0)
        DIE("%s: rn_check: %s: %s", what, rn_err_name(rc), rn_last_error(c));
    if (!rne_verify(a, st, what))
        DIE("%s: wrong results", what);
}

int main(int argc, char **argv)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t before;
    rn_bwd_args a;
    char *arena;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4 || (strcmp(argv[2], "ring") != 0 && strcmp(argv[2], "graph") != 0) ||
        (argc > 4 && strcmp(argv[4], "ctx") != 0)) {
        fprintf(stderr, "usage: %s ENDPOINT ring|graph SPIN_MS [ctx]\n", argv[0]);
        return 2;
    }
    bool graph = strcmp(argv[2], "graph") == 0;
    double spin_ms = atof(argv[3]);
    if (argc > 4) {
        /* cuCtxCreate in its (context, flags, device) form, which the
         * entry point of version 11000 is (12000's takes affinity
         * parameters): the new context is current, and every runtime call
         * below works in it. */
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        int (*create)(void **ctx, unsigned flags, int dev) = NULL;
        if (cudaGetDriverEntryPointByVersion("cuCtxCreate", (void **)&create, 11000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !create)
            DIE("the driver has no cuCtxCreate");
        void *ctx = NULL;
        int r = create(&ctx, 0, 0);
        if (r != 0)
            DIE("cuCtxCreate: driver error %d", r);
    } else {
        CK(cudaSetDevice(0));
    }
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
    CK(rne_load(&kern));
    o.endpoint = argv[1];
    o.path = RN_PATH_FAST;
    o.timeout_ms = 10000;
    o.client_name = "watch";
    if (rn_connect(&o, &c) != 0)
        DIE("rn_connect: %s", rn_last_error(NULL));
    args_of(&a, NULL);
    CK(cudaMalloc((void **)&arena, layout(&a, NULL, false)));
    args_of(&a, arena);

    /* The ring is set up outside any capture. */
    checked_call(c, &a, 11, "eager");
    if (graph) {
        fill(&a, 12);
        CK(cudaStreamSynchronize(st));
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        int rc = rn_rmsnorm_bwd(c, &a, st);
        CK(cudaStreamEndCapture(st, &g));
        if (rc != 0)
            DIE("capture: %s: %s", rn_err_name(rc), rn_last_error(c));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        if ((rc = rn_check(c)) != 0)
            DIE("replay: rn_check: %s: %s", rn_err_name(rc), rn_last_error(c));
        if (!rne_verify(&a, st, "replay"))
            DIE("replay: wrong results");
    }
    printf("ready\n");
    expect_line("go");

    /* The work the daemon will not see through: a spin, then the call or the
     * replay (its start runs after the spin). */
    fill(&a, 13);
    CK(rne_spin(&kern, (uint64_t)(spin_ms * 1e6), st));
    double spin_end = now_ms() + spin_ms;
    CK(cudaEventRecord(before, st));
    if (graph) {
        CK(cudaGraphLaunch(ge, st));
        if (spin_ms == 0) {
            /* The stream reached the replay: its start runs now. */
            while (cudaEventQuery(before) == cudaErrorNotReady)
                usleep(100);
        }
    } else {
        int rc = rn_rmsnorm_bwd(c, &a, st);
        if (rc != 0)
            DIE("the call: %s: %s", rn_err_name(rc), rn_last_error(c));
    }
    printf("pending\n");
    expect_line("killed");
    double t_kill = now_ms();
    double from = t_kill > spin_end ? t_kill : spin_end;
    double t = stream_done_by(from + RELEASE_MS, graph ? "the replay" : "the call");
    printf("ok released: the stream finished %.0f ms after the daemon's death was known "
           "(%.0f ms after the spin's end)\n",
           t - t_kill, t - spin_end);
    if (graph) {
        /* A replay after the end waits for nothing (its slot is closed). */
        double t0 = now_ms();
        CK(cudaGraphLaunch(ge, st));
        stream_done_by(t0 + RELEASE_MS, "a replay after the end");
        printf("ok a replay after the end finished in %.0f ms\n", now_ms() - t0);
    }

    expect_line("restarted");
    /* The next call reports the loss, once. */
    fill(&a, 14);
    int rc = rn_rmsnorm_bwd(c, &a, st);
    if (rc != RN_RESTARTED)
        DIE("the next call returned %s, not RESTARTED (%s)%s", rn_err_name(rc), rn_last_error(c),
            rc == 0 ? ": did the daemon answer before it died? (a spin too short?)" : "");
    if (!strstr(rn_last_error(c), graph ? "graph" : "calls"))
        DIE("the loss's message names no %s: %s", graph ? "graph" : "call", rn_last_error(c));
    printf("ok the next call reports the loss: %s\n", rn_last_error(c));
    if (graph) {
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    checked_call(c, &a, 15, "after the restart");
    if ((rc = rn_sync(c)) != 0)
        DIE("rn_sync: %s: %s", rn_err_name(rc), rn_last_error(c));
    printf("ok after the restart\n");
    rn_close(c);
    CK(cudaFree(arena));
    printf("PASS\n");
    return 0;
}
