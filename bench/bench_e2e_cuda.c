/* SPDX-License-Identifier: MIT */
/*
 * bench_e2e_cuda.c - rmsnormd end to end on the GPU: starts a daemon
 * (--backend cuda) and client processes, and measures in one run
 *
 *  1. steady state: per iteration of producer -> RMSNorm backward ->
 *     consumer on one stream (producer and consumer are one-thread kernels
 *     that write %globaltimer), for 4096x256, 16384x1024 and 32768x4096
 *     (bf16 x, dy, dx, w; fp32 dw; rstd given), through the daemon and with
 *     the kernel linked into the client process (rnk_cuda_bwd on the same
 *     stream), in the same process, alternating;
 *  2. host time per stream-ordered call (rn_rmsnorm_bwd, CLOCK_MONOTONIC
 *     around the call only), p50 and p99, twice:
 *     - free-running (host_p50_us, host_p99_us): in the steady-state loop of
 *       1, the host issuing as fast as it can.  Where the GPU is the
 *       bottleneck the client gets ahead, the daemon's queue and event
 *       rings fill, and the call waits for the GPU (back-pressure): this
 *       number then tracks the GPU time per iteration, not the call's cost;
 *     - paced (paced_host_p50_us, paced_host_p99_us): the same iteration,
 *       but before each call the host spins (cudaEventQuery, so no
 *       blocking-sync wake-up is added) until an event recorded after the
 *       previous consumer has fired, so the GPU is idle and nothing of
 *       this client is queued in the daemon when the call starts (the
 *       daemon's completion thread may still be handing over the previous
 *       request): the call's own cost (record the ready event, request, the
 *       daemon's submit, reply, stream wait) when the GPU is not the
 *       bottleneck;
 *     and, as the floor of one request/reply over nanomsg, the round trip
 *     of a bare PING (rn_ping) on the same connection, back to back with
 *     the GPU idle (ping_p50_us, ping_p99_us);
 *     the paced loop's stamps also give the latency of one call into an
 *     idle GPU (idle_inproc_p50_us, idle_daemon_p50_us / p99: consumer
 *     stamp minus producer stamp, the same paced loop in-process beside it):
 *     what a caller that synchronises every call waits, the daemon's wake-up
 *     and submit included;
 *  3. the GPU-side gap per hop: the consumer's stamp minus the producer's
 *     stamp, through the daemon minus in-process, halved (two hops: producer
 *     -> daemon kernel, daemon kernel -> consumer).  A 300 us spin before each
 *     producer keeps the host ahead of the GPU, so the stamps measure GPU
 *     waits, not the host's round trip.  The daemon's kernel is not stamped
 *     itself: its time is taken to be the in-process kernel's;
 *  4. throughput with K = 1, 2, 4, 8 client processes at once;
 *  5. the kernel itself per shape (the "kernel" line): in this process,
 *     between two events, and in the daemon, the mean of its fast.compute
 *     histogram (the same events around its kernel) over the shape's
 *     steady-state calls (0 on the classic path, whose kernels the daemon
 *     does not time), so that a gap per hop larger than the words' cost can
 *     be told from a slower kernel in the daemon.
 *
 * The paced loop and the pings (--iters of each per shape, after 10 and 20
 * warm-up ones) cost about iters x (GPU iteration + call) + iters x PING:
 * roughly 0.5 s for the three shapes at 1000 iterations with MPS, 2-3 s
 * without (each hop a context switch); a third of that at 300.
 *
 * Run it twice for "with and without MPS": once plainly, once with
 * CUDA_MPS_PIPE_DIRECTORY naming a running MPS server (--label says which).
 *
 * --fast: 1. to 4. run a second time with clients on the fast path
 * (RMSNORMD_PATH=fast; the classic rows set RMSNORMD_PATH=classic, as the
 * daemon offers both), their rows labelled "TEXT fast" beside the
 * classic ones: host time per call (the call publishes a slot and enqueues
 * two stream memory operations, no round trip) and the GPU time added (the
 * span and hop columns).  A client that finds the fast path not offered
 * (HELLO: the device has no 64-bit stream memory operations) says
 * "path=classic" and its rows are the classic path's again.
 *
 *   bench_e2e_cuda [--daemon PATH] [--label TEXT] [--iters N] [--out FILE] [--fast]
 *                  [--daemon-arg ARG]...   (ARG added to the daemon's command line)
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/e2e_cuda.h"
#include "rmsnorm_client.h"
#include "rnk.h"
#include "rnk_test.h"

#define CK(call) RNE_CK(call)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Percentile of n samples (sorts them). */
static double pct(uint64_t *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i];
}

/* ---- client side -------------------------------------------------------------------------- */

typedef struct work {
    rn_bwd_args a;
    rnk_bwd_args k;
    char *arena;
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
    size_t mn = (size_t)(m * n), off = 0;
    char msg[200];
    memset(w, 0, sizeof *w);
    size_t bytes = 3 * mn * 2 + (size_t)n * 2 + (size_t)n * 4 + (size_t)m * 4 + 6 * 256;
    CK(cudaMalloc((void **)&w->arena, bytes));
#define TAKE(b) (off += ((b) + 255) / 256 * 256, (void *)(w->arena + off - ((b) + 255) / 256 * 256))
    rn_bwd_args *a = &w->a;
    a->m = m;
    a->n = n;
    a->x_dtype = a->dy_dtype = a->dx_dtype = a->w_dtype = RN_DTYPE_BF16;
    a->dw_dtype = RN_DTYPE_F32;
    a->eps = 1e-6f;
    a->x_stride = a->dy_stride = a->dx_stride = n;
    a->x = TAKE(mn * 2);
    a->dy = TAKE(mn * 2);
    a->dx = TAKE(mn * 2);
    a->w = TAKE((size_t)n * 2);
    a->dw = TAKE((size_t)n * 4);
    a->rstd = TAKE((size_t)m * 4);
#undef TAKE
    if (rnk_cuda_fill(RNK_BF16, (void *)a->x, m, n, n, 1, 1.0f, 0.1f, st, msg, sizeof msg) ||
        rnk_cuda_fill(RNK_BF16, (void *)a->dy, m, n, n, 2, 1.0f, 0.0f, st, msg, sizeof msg) ||
        rnk_cuda_fill(RNK_BF16, (void *)a->w, 1, n, n, 3, 0.5f, 1.0f, st, msg, sizeof msg) ||
        rnk_cuda_rstd(RNK_BF16, a->x, m, n, n, a->eps, (float *)a->rstd, st, msg, sizeof msg)) {
        fprintf(stderr, "fill: %s\n", msg);
        exit(1);
    }
    rnk_bwd_args *k = &w->k;
    k->m = m;
    k->n = n;
    k->x_dtype = k->dy_dtype = k->dx_dtype = k->w_dtype = RNK_BF16;
    k->dw_dtype = RNK_F32;
    k->x = a->x;
    k->dy = a->dy;
    k->dx = a->dx;
    k->w = a->w;
    k->dw = a->dw;
    k->rstd = a->rstd;
    k->x_stride = k->dy_stride = k->dx_stride = n;
    k->eps = a->eps;
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
    CK(cudaFree(w->arena));
    CK(cudaFree(w->ws));
}

static void one_call(work *w, bool inproc, uint64_t *host_ns)
{
    if (inproc) {
        char msg[200];
        if (rnk_cuda_bwd(kdev, &w->k, w->ws, w->wsb, st, msg, sizeof msg)) {
            fprintf(stderr, "rnk_cuda_bwd: %s\n", msg);
            exit(1);
        }
        return;
    }
    uint64_t t0 = now_ns();
    int rc = rn_rmsnorm_bwd(cli, &w->a, st);
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

/* The daemon's fast.compute histogram (its fast-path kernels, timed with
 * events around each): count and sum so far; zeros on the classic path. */
static void daemon_compute(uint64_t *count, uint64_t *sum_ns)
{
    static rn_stats_info si;
    static rn_hist_buckets b[RN_MAX_HISTS];

    *count = *sum_ns = 0;
    for (unsigned i = 0; i < RN_MAX_HISTS; i++)
        b[i].struct_size = sizeof b[i];
    si.struct_size = sizeof si;
    if (rn_stats_hist_buckets(cli, &si, b, RN_MAX_HISTS) != 0)
        return;
    for (unsigned i = 0; i < si.nhists; i++)
        if (strcmp(b[i].name, "fast.compute") == 0 && b[i].present) {
            *count = b[i].count;
            *sum_ns = b[i].sum_ns;
        }
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
    CK(cudaMemcpy(hstamps, stamps, sizeof *stamps * 2 * (size_t)iters, cudaMemcpyDeviceToHost));
    for (int i = 0; i < iters; i++)
        gaps[i] = hstamps[2 * i + 1] - hstamps[2 * i];
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
    CK(cudaMemcpy(hstamps, stamps, sizeof *stamps * 2 * (size_t)iters, cudaMemcpyDeviceToHost));
    for (int i = 0; i < iters; i++)
        idle[i] = hstamps[2 * i + 1] - hstamps[2 * i];
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

static int client_single(const char *endpoint, int iters)
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
        daemon_compute(&c0, &s0);
        /* Steady state, alternating, twice each: the spread shows the noise. */
        for (int r = 0; r < 2; r++) {
            in_it[r] = loop(&w, true, iters, 0, gaps, NULL);
            d_it[r] = loop(&w, false, iters, 0, gaps2, host);
        }
        daemon_compute(&c1, &s1);
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
        /* GPU-side gaps with the host ahead of the GPU. */
        loop(&w, true, iters, 300000, gaps, NULL);
        loop(&w, false, iters, 300000, gaps2, NULL);
        double gin = pct(gaps, iters, 0.5) / 1e3, gd = pct(gaps2, iters, 0.5) / 1e3;
        double gd99 = pct(gaps2, iters, 0.99) / 1e3;
        printf("shape m=%lld n=%lld inproc_us=%.2f,%.2f daemon_us=%.2f,%.2f ratio=%.3f "
               "host_p50_us=%.1f host_p99_us=%.1f paced_host_p50_us=%.1f paced_host_p99_us=%.1f "
               "ping_p50_us=%.1f ping_p99_us=%.1f span_inproc_p50_us=%.2f span_daemon_p50_us=%.2f "
               "span_daemon_p99_us=%.2f hop_p50_us=%.2f idle_inproc_p50_us=%.2f "
               "idle_daemon_p50_us=%.2f idle_daemon_p99_us=%.2f\n",
               (long long)shapes[s][0], (long long)shapes[s][1], in_it[0], in_it[1], d_it[0],
               d_it[1], (d_it[0] < d_it[1] ? d_it[0] : d_it[1]) /
                            (in_it[0] < in_it[1] ? in_it[0] : in_it[1]),
               hp50, hp99, pp50, pp99, rp50, rp99, gin, gd, gd99, (gd - gin) / 2, idle_in, idle_d,
               idle_d99);
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

static int client_tput(const char *endpoint, int iters)
{
    uint64_t *host = calloc((size_t)iters, sizeof *host);
    char line[32];
    work w;

    client_init(endpoint, iters);
    setup_work(&w, 8192, 1024);
    for (int i = 0; i < 20; i++)
        one_call(&w, false, NULL);
    CK(cudaStreamSynchronize(st));
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    uint64_t t0 = now_ns();
    for (int i = 0; i < iters; i++) {
        CK(rne_stamp(&kern, stamps + 2 * i, st));
        one_call(&w, false, host + i);
        CK(rne_stamp(&kern, stamps + 2 * i + 1, st));
    }
    CK(cudaStreamSynchronize(st));
    uint64_t wall = now_ns() - t0;
    printf("tput calls=%d wall_us=%.1f host_p50_us=%.1f\n", iters, wall / 1e3,
           pct(host, iters, 0.5) / 1e3);
    fflush(stdout);
    free_work(&w);
    rn_close(cli);
    return 0;
}

/* ---- driver side --------------------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    FILE *in, *out;
} child;

static char self[4096];

static int spawn(child *c, const char *mode, const char *endpoint, int iters)
{
    int in[2], out[2];
    char it[16];
    snprintf(it, sizeof it, "%d", iters);
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return -1;
    c->pid = fork();
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(self, self, "--client", mode, endpoint, it, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->in = fdopen(in[1], "w");
    c->out = fdopen(out[0], "r");
    return c->pid > 0 ? 0 : -1;
}

static int finish(child *c)
{
    int status = 0;
    fclose(c->in);
    fclose(c->out);
    waitpid(c->pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static pid_t daemon_pid;
#define MAX_DARGS 8
static const char *dargs[MAX_DARGS]; /* --daemon-arg */
static int ndargs;

/* Start rmsnormd and wait for its READY=1 on our own notify socket. */
static int start_daemon(const char *daemon, const char *dir, char *endpoint, size_t eplen,
                        bool fast)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char notify[200], logp[200], buf[512];
    int ns;

    snprintf(notify, sizeof notify, "%s/notify", dir);
    snprintf(logp, sizeof logp, "%s/daemon.log", dir);
    snprintf(endpoint, eplen, "ipc://%s/d.sock", dir);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", notify);
    ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (ns < 0 || bind(ns, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("notify socket");
        return -1;
    }
    daemon_pid = fork();
    if (daemon_pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("NOTIFY_SOCKET", notify, 1);
        const char *av[16 + MAX_DARGS] = {daemon, "--backend", "cuda", "--endpoint", endpoint,
                                          "--config", "/dev/null", "--max-inflight", "64"};
        int ac = 9;
        if (fast)
            av[ac++] = "--cuda-fast-path";
        for (int i = 0; i < ndargs; i++)
            av[ac++] = dargs[i];
        av[ac] = NULL;
        execv(daemon, (char *const *)av);
        _exit(127);
    }
    for (;;) {
        struct pollfd p = {.fd = ns, .events = POLLIN};
        int r = poll(&p, 1, 60000);
        if (r <= 0) {
            fprintf(stderr, "rmsnormd did not report READY=1 within 60 s (log: %s)\n", logp);
            return -1;
        }
        ssize_t n = recv(ns, buf, sizeof buf - 1, 0);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        if (strstr(buf, "READY=1"))
            break;
    }
    close(ns);
    return 0;
}

/* Value of key=... in line as a double (first of a comma list). */
static double field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, " %s=", key);
    const char *p = strstr(line, k);
    return p ? atof(p + strlen(k)) : -1;
}

/* 1. to 3. in one client process, then 4. with K of them; rows labelled
 * label.  Clients take the path RMSNORMD_PATH says (the caller sets it). */
static void run_all(const char *label, const char *endpoint, int iters, FILE *out)
{
    char line[1024];

    printf("== %s: steady state, host time per call (free-running, paced), PING round trip, "
           "GPU gaps (%d iterations) ==\n", label, iters);
    if (out)
        fprintf(out, "<!-- %s: columns: label | shape | in-process us/iter | daemon us/iter | ratio "
                     "| host p50 us | host p99 us | paced host p50 us | paced host p99 us "
                     "| ping p50 us | ping p99 us | extra span p50 us | gap per hop p50 us "
                     "| idle-GPU call in-process p50 us | idle-GPU call daemon p50 / p99 us -->\n",
                label);
    {
        child c;
        spawn(&c, "single", endpoint, iters);
        while (fgets(line, sizeof line, c.out)) {
            fputs(line, stdout);
            if (out && strncmp(line, "shape", 5) == 0)
                fprintf(out, "| %s | %.0fx%.0f | %.1f | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f "
                             "| %.1f | %.1f | %.2f | %.2f | %.1f | %.1f / %.1f |\n",
                        label, field(line, "m"), field(line, "n"), field(line, "inproc_us"),
                        field(line, "daemon_us"), field(line, "ratio"), field(line, "host_p50_us"),
                        field(line, "host_p99_us"), field(line, "paced_host_p50_us"),
                        field(line, "paced_host_p99_us"), field(line, "ping_p50_us"),
                        field(line, "ping_p99_us"),
                        field(line, "span_daemon_p50_us") - field(line, "span_inproc_p50_us"),
                        field(line, "hop_p50_us"), field(line, "idle_inproc_p50_us"),
                        field(line, "idle_daemon_p50_us"), field(line, "idle_daemon_p99_us"));
            else if (out && (strncmp(line, "info", 4) == 0 || strncmp(line, "path=", 5) == 0 ||
                             strncmp(line, "kernel ", 7) == 0))
                fprintf(out, "<!-- %s: %s -->\n", label, line);
        }
        if (finish(&c) != 0)
            fprintf(stderr, "single client failed\n");
    }
    printf("== %s: throughput, 8192x1024 bf16, %d calls per client ==\n", label, iters);
    for (int k = 1; k <= 8; k *= 2) {
        child cs[8];
        double calls = 0, wall = 0, hp = 0;
        for (int i = 0; i < k; i++)
            spawn(&cs[i], "tput", endpoint, iters);
        for (int i = 0; i < k; i++)
            if (!fgets(line, sizeof line, cs[i].out) || strncmp(line, "ready", 5) != 0)
                fprintf(stderr, "client %d did not get ready\n", i);
        for (int i = 0; i < k; i++) {
            fputs("go\n", cs[i].in);
            fflush(cs[i].in);
        }
        for (int i = 0; i < k; i++) {
            if (fgets(line, sizeof line, cs[i].out)) {
                calls += field(line, "calls");
                double w = field(line, "wall_us");
                wall = w > wall ? w : wall;
                hp += field(line, "host_p50_us") / k;
            }
            finish(&cs[i]);
        }
        printf("K=%d calls=%.0f wall_ms=%.1f calls_per_s=%.0f host_p50_us=%.1f\n", k, calls,
               wall / 1e3, calls / (wall / 1e6), hp);
        if (out)
            fprintf(out, "| %s | K=%d | %.0f calls/s | host p50 %.1f us |\n", label, k,
                    calls / (wall / 1e6), hp);
    }
}

int main(int argc, char **argv)
{
    const char *daemon = NULL, *label = "", *outp = NULL;
    char dir[] = "/tmp/rn-bench.XXXXXX", endpoint[256], dpath[4096];
    int iters = 1000;
    bool fast = false;
    FILE *out = NULL;

    if (argc >= 5 && strcmp(argv[1], "--client") == 0) {
        if (strcmp(argv[2], "single") == 0)
            return client_single(argv[3], atoi(argv[4]));
        return client_tput(argv[3], atoi(argv[4]));
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fast") == 0) {
            fast = true;
            continue;
        }
        if (i + 1 >= argc)
            break;
        if (strcmp(argv[i], "--daemon") == 0)
            daemon = argv[i + 1];
        else if (strcmp(argv[i], "--daemon-arg") == 0 && ndargs < MAX_DARGS)
            dargs[ndargs++] = argv[i + 1];
        else if (strcmp(argv[i], "--label") == 0)
            label = argv[i + 1];
        else if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--out") == 0)
            outp = argv[i + 1];
        i++;
    }
    /* A client that dies must not take the driver with it. */
    signal(SIGPIPE, SIG_IGN);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    if (!daemon) {
        /* <build>/bench/bench_e2e_cuda -> <build>/rmsnormd */
        snprintf(dpath, sizeof dpath, "%s", self);
        char *s = strrchr(dpath, '/');
        if (s) {
            *s = '\0';
            s = strrchr(dpath, '/');
            if (s)
                snprintf(s, sizeof dpath - (size_t)(s - dpath), "/rmsnormd");
        }
        daemon = dpath;
    }
    if (!mkdtemp(dir) || start_daemon(daemon, dir, endpoint, sizeof endpoint, fast) != 0)
        return 1;
    if (outp && !(out = fopen(outp, "a")))
        perror(outp);
    /* The classic rows on the classic path (the daemon offers both). */
    setenv("RMSNORMD_PATH", "classic", 1);
    run_all(label, endpoint, iters, out);
    if (fast) {
        char flabel[256];
        snprintf(flabel, sizeof flabel, "%s fast", label);
        setenv("RMSNORMD_PATH", "fast", 1);
        run_all(flabel, endpoint, iters, out);
    }
    if (out)
        fclose(out);
    kill(daemon_pid, SIGTERM);
    int status = 0;
    waitpid(daemon_pid, &status, 0);
    printf("rmsnormd exit status %d (log %s/daemon.log)\n",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, dir);
    return 0;
}
