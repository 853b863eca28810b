/* SPDX-License-Identifier: MIT */
/*
 * bench_bell - what a fast-path call costs when it reaches a daemon that
 * sleeps, with the session's bell (AUTH_OK's socket: the client's send
 * wakes the daemon's loop itself) against the doorbell (a futex wake of the
 * daemon's ring thread, which then wakes the loop through uv_async: two
 * wake-ups).  Calls come --gap us apart (default 2000, past the ring
 * thread's 50 us spin and the loop's 1 ms poll), as a synced PyTorch
 * backward's do; the shape is tiny (4 x 256, fp32, host path), so the time
 * is the trip.
 *
 * It starts the daemon itself (--daemon PATH, the CPU backend unless
 * --daemon-arg says otherwise) and runs two clients of one process, one with
 * RMSNORMD_BELL=0 at its rn_connect; rounds alternate bell, doorbell,
 * doorbell, bell.  Prints p10/p50/p90/p99 of each client's call time
 * (rn_rmsnorm_bwd_host, wall clock) and the ratio of the p50s; --out FILE
 * gets the same as CSV.
 *
 * Usage: bench_bell --daemon PATH [--daemon-arg ARG]... [--gap US] [--n N]
 *                   [--rounds R] [--out FILE]
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "rmsnorm_client.h"

enum { M = 4, N = 256, MAX_ARGS = 16 };

typedef struct side {
    const char *name;
    rn_client *c;
    float *buf;
    rn_bwd_args a;
    uint64_t *lat;
    size_t nlat;
} side;

static pid_t daemon_pid; /* (the daemon it started: stopped on the way out) */

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_bell: %s: %s\n", what, why);
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
    }
    exit(1);
}

static void sleep_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void open_side(side *s, const char *endpoint, bool bell, size_t cap)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 10000, .client_name = s->name,
                         .path = RN_PATH_FAST, .struct_size = sizeof o};
    uint64_t rtt;

    if (!bell)
        setenv("RMSNORMD_BELL", "0", 1);
    int rc = rn_connect(&o, &s->c);
    unsetenv("RMSNORMD_BELL");
    if (rc != 0)
        die("rn_connect", rn_last_error(NULL));
    if (rn_ping(s->c, &rtt) != 0)
        die("ping", rn_last_error(s->c));
    if (rn_buffer_alloc(s->c, sizeof(float) * (3 * M * N + 2 * N), (void **)&s->buf) != 0)
        die("rn_buffer_alloc", rn_last_error(s->c));
    float *x = s->buf, *dy = x + M * N, *dx = dy + M * N, *w = dx + M * N, *dw = w + N;
    for (int i = 0; i < M * N; i++) {
        x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
        dy[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
    }
    for (int j = 0; j < N; j++)
        w[j] = 1.0f + (float)j / N;
    rn_bwd_args a = RN_BWD_ARGS_INIT;
    a.m = M, a.n = N;
    a.x_dtype = a.dy_dtype = a.dx_dtype = a.w_dtype = a.dw_dtype = RN_DTYPE_F32;
    a.dres_dtype = RN_DTYPE_NONE;
    a.x = x, a.x_stride = N;
    a.dy = dy, a.dy_stride = N;
    a.dx = dx, a.dx_stride = N;
    a.w = w, a.dw = dw;
    a.eps = 1e-6f;
    s->a = a;
    s->lat = calloc(cap, sizeof *s->lat);
    if (!s->lat)
        die("calloc", "out of memory");
}

static void calls(side *s, int n, uint64_t gap_us)
{
    for (int i = 0; i < n; i++) {
        sleep_us(gap_us);
        uint64_t t0 = now_ns();
        if (rn_rmsnorm_bwd_host(s->c, &s->a, NULL) != 0)
            die("rn_rmsnorm_bwd_host", rn_last_error(s->c));
        s->lat[s->nlat++] = now_ns() - t0;
    }
}

static double pct(const uint64_t *v, size_t n, double p)
{
    return n ? (double)v[(size_t)(p * (double)(n - 1))] / 1000.0 : 0.0;
}

static pid_t start_daemon(const char *path, const char *endpoint, char **extra, int nextra)
{
    char *argv[8 + MAX_ARGS];
    int k = 0;

    argv[k++] = (char *)path;
    argv[k++] = "--endpoint";
    argv[k++] = (char *)endpoint;
    argv[k++] = "--config";
    argv[k++] = "/dev/null";
    bool backend = false;
    for (int i = 0; i < nextra; i++)
        backend |= strcmp(extra[i], "--backend") == 0;
    if (!backend) {
        argv[k++] = "--backend";
        argv[k++] = "cpu";
    }
    for (int i = 0; i < nextra; i++)
        argv[k++] = extra[i];
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(127);
        execv(path, argv);
        _exit(127);
    }
    if (pid < 0)
        die("fork", strerror(errno));
    /* Up once it answers. */
    for (int i = 0; i < 200; i++) {
        rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 200};
        rn_client *c = NULL;
        uint64_t rtt;
        if (rn_connect(&o, &c) == 0 && rn_ping(c, &rtt) == 0) {
            rn_close(c);
            return pid;
        }
        rn_close(c);
        sleep_us(50000);
    }
    kill(pid, SIGKILL);
    die("daemon", "did not answer within 10 s");
    return -1;
}

int main(int argc, char **argv)
{
    const char *daemon = NULL, *out = NULL;
    char *extra[MAX_ARGS];
    int nextra = 0, n = 300, rounds = 4;
    uint64_t gap = 2000;
    char dir[] = "/tmp/bench-bell.XXXXXX", endpoint[128];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--daemon") && i + 1 < argc)
            daemon = argv[++i];
        else if (!strcmp(argv[i], "--daemon-arg") && i + 1 < argc && nextra < MAX_ARGS)
            extra[nextra++] = argv[++i];
        else if (!strcmp(argv[i], "--gap") && i + 1 < argc)
            gap = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: bench_bell --daemon PATH [--daemon-arg ARG]... [--gap US] "
                            "[--n N] [--rounds R] [--out FILE]\n");
            return 2;
        }
    }
    if (!daemon || n < 1 || rounds < 1)
        die("arguments", "--daemon PATH is needed, --n and --rounds at least 1");
    if (!mkdtemp(dir))
        die("mkdtemp", strerror(errno));
    snprintf(endpoint, sizeof endpoint, "ipc://%s/d.sock", dir);
    pid_t pid = daemon_pid = start_daemon(daemon, endpoint, extra, nextra);

    side s[2] = {{.name = "bell"}, {.name = "doorbell"}};
    size_t cap = (size_t)n * (size_t)rounds * 2;
    open_side(&s[0], endpoint, true, cap);
    open_side(&s[1], endpoint, false, cap);
    calls(&s[0], 20, gap); /* (warm-up, not counted) */
    calls(&s[1], 20, gap);
    s[0].nlat = s[1].nlat = 0;
    for (int r = 0; r < rounds; r++) {
        calls(&s[r & 1], n, gap);
        calls(&s[!(r & 1)], n, gap);
    }
    rn_stats_info st;
    uint64_t bells = 0;
    if (rn_stats(s[0].c, &st) == 0)
        bells = rn_stats_get(&st, "fast.bells", 0);

    FILE *f = out ? fopen(out, "w") : NULL;
    if (out && !f)
        die(out, strerror(errno));
    if (f)
        fprintf(f, "client,gap_us,calls,p10_us,p50_us,p90_us,p99_us\n");
    printf("bench_bell: %dx%d fp32 host-path calls every %llu us, %d rounds of %d a client; "
           "fast.bells %llu (for %zu bell calls)\n\n",
           M, N, (unsigned long long)gap, rounds, n, (unsigned long long)bells, s[0].nlat + 20);
    printf("| client | calls | p10 us | p50 us | p90 us | p99 us |\n|---|---|---|---|---|---|\n");
    double p50[2];
    for (int k = 0; k < 2; k++) {
        qsort(s[k].lat, s[k].nlat, sizeof *s[k].lat, cmp_u64);
        p50[k] = pct(s[k].lat, s[k].nlat, 0.5);
        printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f |\n", s[k].name, s[k].nlat,
               pct(s[k].lat, s[k].nlat, 0.1), p50[k], pct(s[k].lat, s[k].nlat, 0.9),
               pct(s[k].lat, s[k].nlat, 0.99));
        if (f)
            fprintf(f, "%s,%llu,%zu,%.2f,%.2f,%.2f,%.2f\n", s[k].name, (unsigned long long)gap,
                    s[k].nlat, pct(s[k].lat, s[k].nlat, 0.1), p50[k],
                    pct(s[k].lat, s[k].nlat, 0.9), pct(s[k].lat, s[k].nlat, 0.99));
    }
    printf("\np50 bell / doorbell: %.2fx\n", p50[1] > 0 ? p50[0] / p50[1] : 0.0);
    if (f)
        fclose(f);
    for (int k = 0; k < 2; k++) {
        rn_close(s[k].c);
        free(s[k].lat);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    daemon_pid = 0;
    char sock[160];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/d.sock.chan", dir);
    unlink(sock);
    rmdir(dir);
    return 0;
}
