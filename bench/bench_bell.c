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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_host.h"
#include "bench_util.h"
#include "rmsnorm_client.h"

enum { M = BENCH_TINY_M, N = BENCH_TINY_N, MAX_ARGS = 16 };

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
    bench_daemon_stop(daemon_pid);
    exit(1);
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
    if (rn_buffer_alloc(s->c, sizeof(float) * BENCH_TINY_FLOATS, (void **)&s->buf) != 0)
        die("rn_buffer_alloc", rn_last_error(s->c));
    bench_tiny_call(s->buf, &s->a);
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
    pid_t pid = daemon_pid = bench_daemon_start(daemon, endpoint, extra, nextra);
    if (pid < 0)
        return 1;

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
        p50[k] = pct_us(s[k].lat, s[k].nlat, 0.5);
        printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f |\n", s[k].name, s[k].nlat,
               pct_us(s[k].lat, s[k].nlat, 0.1), p50[k], pct_us(s[k].lat, s[k].nlat, 0.9),
               pct_us(s[k].lat, s[k].nlat, 0.99));
        if (f)
            fprintf(f, "%s,%llu,%zu,%.2f,%.2f,%.2f,%.2f\n", s[k].name, (unsigned long long)gap,
                    s[k].nlat, pct_us(s[k].lat, s[k].nlat, 0.1), p50[k],
                    pct_us(s[k].lat, s[k].nlat, 0.9), pct_us(s[k].lat, s[k].nlat, 0.99));
    }
    printf("\np50 bell / doorbell: %.2fx\n", p50[1] > 0 ? p50[0] / p50[1] : 0.0);
    if (f)
        fclose(f);
    for (int k = 0; k < 2; k++) {
        rn_close(s[k].c);
        free(s[k].lat);
    }
    bench_daemon_stop(pid);
    daemon_pid = 0;
    char sock[160];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/d.sock.chan", dir);
    unlink(sock);
    rmdir(dir);
    return 0;
}
