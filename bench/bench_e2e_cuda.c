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
 *     waits, not the host's round trip (--lead-us US sets the spin: a
 *     producer US late after the previous call, which the daemon's doorbell
 *     thread sees by its poll, not its spin, from 1 ms on).  The daemon's kernel is not stamped
 *     itself: its time is taken to be the in-process kernel's; beside it the
 *     daemon's own means over these calls (fast path: hop_take_us, its
 *     fast.take, the loop's copy of a slot to its submission; hop_kernel_us,
 *     its fast.compute, its kernel between events; the daemon times one
 *     kernel in 16, so these are means over that sample);
 *  4. throughput with K = 1, 2, 4, 8 client processes at once (and when the
 *     first client finished, against the last: whether they share evenly);
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
 * "path=classic" and its rows are the classic path's again.  --fast-only:
 * the fast path's rows only; --tput-only: 4. only (the K rows); --ks MASK:
 * only the K rows in MASK (1, 2, 4, 8 summed); --tput-shape M,N: the K
 * rows at M x N (8192x1024 by default: the GPU is busy from K = 1 there,
 * so a smaller shape shows how the path itself scales); --tput-inproc: the K rows
 * with the kernel linked into each client instead of the daemon (what the
 * GPU itself does with K processes; with RN_E2E_INPROC_WORDS=dev or host
 * in the environment each such call also writes and waits on two words on
 * its own stream, the stream memory operations a daemon call has:
 * e2e_client.c).
 *
 * --split: the clients put x, dy and dx each in an allocation of its own
 * (the small tensors in a fourth), as PyTorch's caching allocator gives
 * large tensors their own segments; without it one cudaMalloc holds a
 * shape's tensors, and the daemon's kernel runs 3 % slower on that one
 * allocation at 32768x4096 (768 MiB; bench_ipcmem).
 *
 * At the end it prints the daemon's fast-path counts (daemon_counts: fast.ok,
 * fast.armed, fast.revoked, ...), stops it (SIGKILL after 10 s) and exits 1
 * when it did not exit 0; a signal to the driver kills its daemon too.
 *
 *   bench_e2e_cuda [--daemon PATH] [--label TEXT] [--iters N] [--out FILE] [--fast]
 *                  [--split] [--lead-us US] [--tput-shape M,N] [--daemon-arg ARG]...
 *                  (ARG added to the daemon's command line)
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e_client.h"

/* The driver: it starts the daemon, runs the client processes (e2e_client.c)
 * and writes their lines as tables. */

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

/* Two of the daemon's histograms so far (count and sum of ns): fast.take,
 * its loop's own time taking a slot, and fast.compute, its kernels' GPU
 * time (events around each); zeros where it sends none.  Asked on a
 * connection of its own, opened and closed here (no connection is open while
 * the driver forks). */
typedef struct dsums {
    uint64_t take_n, take_ns, comp_n, comp_ns;
} dsums;

static void daemon_sums(const char *endpoint, dsums *d)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;

    memset(d, 0, sizeof *d);
    o.endpoint = endpoint;
    o.client_name = "bench stats";
    if (rn_connect(&o, &c) != 0)
        return;
    e2e_daemon_hist(c, "fast.take", &d->take_n, &d->take_ns);
    e2e_daemon_hist(c, "fast.compute", &d->comp_n, &d->comp_ns);
    rn_close(c);
}

/* The mean in us of what was added between a and b, 0 for nothing. */
static double mean_us(uint64_t n0, uint64_t s0, uint64_t n1, uint64_t s1)
{
    return n1 > n0 ? (double)(s1 - s0) / (double)(n1 - n0) / 1e3 : 0.0;
}

static pid_t daemon_pid;

/* Stop the daemon: SIGTERM, then SIGKILL if it has not exited within 10 s
 * (a drain that hangs).  Its exit status, or -1 when it had to be killed. */
static int stop_daemon(void)
{
    int status = 0;
    if (daemon_pid <= 0)
        return -1;
    kill(daemon_pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(daemon_pid, &status, WNOHANG) == daemon_pid) {
            daemon_pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "rmsnormd did not exit within 10 s of SIGTERM: killed\n");
    kill(daemon_pid, SIGKILL);
    waitpid(daemon_pid, NULL, 0);
    daemon_pid = 0;
    return -1;
}

/* A signal to the driver (a step's timeout) stops its daemon too, which
 * would otherwise live on as an orphan (an MPS client in the next runs). */
static void on_signal(int sig)
{
    if (daemon_pid > 0)
        kill(daemon_pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The daemon's fast-path counts at the end, on one line: what the run's
 * calls took (armed and revoked ones included, --ring-ready=armed). */
static void daemon_counts(const char *endpoint)
{
    static const char *const names[] = {"fast.ok", "fast.errors", "fast.armed", "fast.revoked",
                                        "fast.revokes", "fast.ready_waits", "fast.prepared"};
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    rn_stats_info si;

    o.endpoint = endpoint;
    o.client_name = "bench stats";
    if (rn_connect(&o, &c) != 0 || rn_stats(c, &si) != 0) {
        printf("daemon_counts unavailable: %s\n", rn_last_error(c));
        rn_close(c);
        return;
    }
    printf("daemon_counts");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        printf(" %s=%llu", names[i], (unsigned long long)rn_stats_get(&si, names[i], 0));
    printf("\n");
    rn_close(c);
}

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

/* The median of v[0..n) (sorted in place; n <= 8). */
static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
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
static int tput_ks = 15; /* --ks: the K rows to run, a mask of 1, 2, 4 and 8 */
static int tput_m = 8192, tput_n = 1024; /* --tput-shape (the clients: RN_E2E_TPUT_SHAPE) */

static void run_all(const char *label, const char *endpoint, int iters, bool tput_only,
                    FILE *out)
{
    char line[1024];

    if (tput_only)
        goto tput;
    printf("== %s: steady state, host time per call (free-running, paced), PING round trip, "
           "GPU gaps (%d iterations) ==\n", label, iters);
    if (out)
        fprintf(out, "<!-- %s: columns: label | shape | in-process us/iter | daemon us/iter | ratio "
                     "| host p50 us | host p99 us | paced host p50 us | paced host p99 us "
                     "| ping p50 us | ping p99 us | extra span p50 us | gap per hop p50 us "
                     "| idle-GPU call in-process p50 us | idle-GPU call daemon p50 / p99 us "
                     "| daemon take / kernel us in the hop loop (means) -->\n",
                label);
    {
        child c;
        spawn(&c, "single", endpoint, iters);
        while (fgets(line, sizeof line, c.out)) {
            fputs(line, stdout);
            if (out && strncmp(line, "shape", 5) == 0)
                fprintf(out, "| %s | %.0fx%.0f | %.1f | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f "
                             "| %.1f | %.1f | %.2f | %.2f | %.1f | %.1f / %.1f | %.2f / %.2f |\n",
                        label, field(line, "m"), field(line, "n"), field(line, "inproc_us"),
                        field(line, "daemon_us"), field(line, "ratio"), field(line, "host_p50_us"),
                        field(line, "host_p99_us"), field(line, "paced_host_p50_us"),
                        field(line, "paced_host_p99_us"), field(line, "ping_p50_us"),
                        field(line, "ping_p99_us"),
                        field(line, "span_daemon_p50_us") - field(line, "span_inproc_p50_us"),
                        field(line, "hop_p50_us"), field(line, "idle_inproc_p50_us"),
                        field(line, "idle_daemon_p50_us"), field(line, "idle_daemon_p99_us"),
                        field(line, "hop_take_us"), field(line, "hop_kernel_us"));
            else if (out && (strncmp(line, "info", 4) == 0 || strncmp(line, "path=", 5) == 0 ||
                             strncmp(line, "kernel ", 7) == 0))
                fprintf(out, "<!-- %s: %s -->\n", label, line);
        }
        if (finish(&c) != 0)
            fprintf(stderr, "single client failed\n");
    }
tput:
    printf("== %s: throughput, %dx%d bf16, %d calls per client ==\n", label, tput_m, tput_n,
           iters);
    for (int k = 1; k <= 8; k *= 2) {
        if (!(tput_ks & k))
            continue;
        child cs[8];
        double calls = 0, wall = 0, wall_min = 0, hp = 0, busy = 0, rate[8] = {0};
        dsums d0, d1;
        daemon_sums(endpoint, &d0);
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
                printf("  client %d: %s", i, line);
                calls += field(line, "calls");
                double w = field(line, "wall_us");
                rate[i] = w > 0 ? field(line, "calls") / (w / 1e6) : 0;
                wall = w > wall ? w : wall;
                wall_min = wall_min == 0 || w < wall_min ? w : wall_min;
                hp += field(line, "host_p50_us") / k;
                busy += field(line, "busy");
            }
            finish(&cs[i]);
        }
        /* The first client done against the last: whether the clients share
         * the GPU evenly or one of them waits for the others.  calls_per_s
         * counts until the last client is done; together_per_s is K times
         * the median client's own rate (the rate while they all run, which
         * one client held up at the end does not change), and stragglers
         * the clients that took over 1.5 times the median's wall time (the
         * per-client lines above say which call of theirs waited, and when:
         * worst, worst_issued_ms). */
        double ok[8];
        int nok = 0;
        for (int i = 0; i < k; i++) /* (a client that failed has no rate) */
            if (rate[i] > 0)
                ok[nok++] = rate[i];
        double med = median(ok, nok);
        int stragglers = 0;
        for (int i = 0; i < k; i++) /* (a client's wall > 1.5 x the median's: its rate below) */
            stragglers += rate[i] > 0 && rate[i] * 1.5 < med;
        /* The daemon's mean time to take a slot (its loop's share of a
         * call) and its kernels' mean GPU time over this row's calls (its
         * warm-up calls included): one loop for all clients, one GPU. */
        daemon_sums(endpoint, &d1);
        double take = mean_us(d0.take_n, d0.take_ns, d1.take_n, d1.take_ns);
        double kern = mean_us(d0.comp_n, d0.comp_ns, d1.comp_n, d1.comp_ns);
        printf("K=%d calls=%.0f wall_ms=%.1f first_done_ms=%.1f calls_per_s=%.0f "
               "together_per_s=%.0f stragglers=%d host_p50_us=%.1f busy=%.0f "
               "daemon_take_us=%.1f daemon_kernel_us=%.1f shape=%dx%d\n",
               k, calls, wall / 1e3, wall_min / 1e3, calls / (wall / 1e6), med * k, stragglers, hp,
               busy, take, kern, tput_m, tput_n);
        if (out)
            fprintf(out, "| %s | K=%d | %.0f calls/s | together %.0f calls/s | %d straggler%s "
                         "| host p50 %.1f us | %.0f BUSY waits | daemon take %.1f us, "
                         "kernel %.1f us | %dx%d |\n",
                    label, k, calls / (wall / 1e6), med * k, stragglers,
                    stragglers == 1 ? "" : "s", hp, busy, take, kern, tput_m, tput_n);
    }
}

int main(int argc, char **argv)
{
    const char *daemon = NULL, *label = "", *outp = NULL;
    char dir[] = "/tmp/rn-bench.XXXXXX", endpoint[256], dpath[4096];
    int iters = 1000;
    bool fast = false, fast_only = false, tput_only = false;
    FILE *out = NULL;

    if (argc >= 5 && strcmp(argv[1], "--client") == 0) {
        if (strcmp(argv[2], "single") == 0)
            return client_single(argv[3], atoi(argv[4]));
        return client_tput(argv[3], atoi(argv[4]));
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fast") == 0 || strcmp(argv[i], "--fast-only") == 0) {
            fast = true;
            fast_only = fast_only || strcmp(argv[i], "--fast-only") == 0;
            continue;
        }
        if (strcmp(argv[i], "--tput-only") == 0) {
            tput_only = true;
            continue;
        }
        if (strcmp(argv[i], "--tput-inproc") == 0) {
            /* The K rows with the kernel linked into each client: the GPU's
             * own calls per second with K processes (e2e_client.c). */
            setenv("RN_E2E_TPUT_INPROC", "1", 1);
            tput_only = true;
            continue;
        }
        if (strcmp(argv[i], "--split") == 0) {
            setenv("RN_E2E_SPLIT", "1", 1); /* read by the clients (e2e_client.c) */
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
        else if (strcmp(argv[i], "--ks") == 0) /* which K rows: a mask of 1, 2, 4, 8 */
            tput_ks = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--lead-us") == 0) /* read by the clients (e2e_client.c) */
            setenv("RN_E2E_LEAD_US", argv[i + 1], 1);
        else if (strcmp(argv[i], "--tput-shape") == 0) { /* read by the clients too */
            char end;
            if (sscanf(argv[i + 1], "%d,%d%c", &tput_m, &tput_n, &end) != 2 || tput_m < 1 ||
                tput_n < 1) {
                fprintf(stderr, "bench_e2e_cuda: --tput-shape takes M,N: '%s'\n", argv[i + 1]);
                return 2;
            }
            setenv("RN_E2E_TPUT_SHAPE", argv[i + 1], 1);
        }
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
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (!mkdtemp(dir) || start_daemon(daemon, dir, endpoint, sizeof endpoint, fast) != 0) {
        stop_daemon();
        return 1;
    }
    if (outp && !(out = fopen(outp, "a")))
        perror(outp);
    /* The classic rows on the classic path (the daemon offers both). */
    setenv("RMSNORMD_PATH", "classic", 1);
    if (!fast_only)
        run_all(label, endpoint, iters, tput_only, out);
    if (fast) {
        char flabel[256];
        snprintf(flabel, sizeof flabel, "%s fast", label);
        setenv("RMSNORMD_PATH", "fast", 1);
        run_all(flabel, endpoint, iters, tput_only, out);
    }
    if (out)
        fclose(out);
    daemon_counts(endpoint);
    int st = stop_daemon();
    printf("rmsnormd exit status %d (log %s/daemon.log)\n", st, dir);
    return st == 0 ? 0 : 1;
}
