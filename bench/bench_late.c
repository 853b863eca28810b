/* SPDX-License-Identifier: MIT */
/*
 * bench_late - how soon the daemon sees a fast-path call's ready word when
 * the producer is late: the hop from the "GPU side"'s ready write to the
 * call's done, for producers D = 0 .. 200 ms behind the slot's publish (a
 * training loop's host runs ahead of its GPU by that much).  The daemon's
 * doorbell thread polls ready words (--ring-ready=host, the cuda backend's
 * default) at a period that depends on how
 * long nothing came (daemon/ring.c); this measures each regime, and the
 * daemon's CPU time while it waits (user + system, from /proc).
 *
 * It starts the daemon itself (--daemon PATH, the CPU backend and
 * --ring-ready=host unless --daemon-arg says otherwise) and plays a client
 * below libclient (tests/integration/rawring.c): publish a 4 x 256 fp32 call
 * with ready unset, sleep D, write ready, spin until done.  Prints p10 / p50
 * / p90 / max of the hop per D and the daemon's CPU share during the D
 * block; --out FILE gets the same as CSV.
 *
 * Usage: bench_late --daemon PATH [--daemon-arg ARG]... [--delays US,US,...]
 *                   [--n N] [--label L] [--out FILE]
 */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_host.h"
#include "bench_util.h"
#include "integration/rawring.h"
#include "rmsnorm_client.h"

enum { MAX_ARGS = 16, MAX_DELAYS = 16 };

static pid_t daemon_pid;

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_late: %s: %s\n", what, why);
    bench_daemon_stop(daemon_pid);
    exit(1);
}

/* The daemon's CPU time so far (user + system), ns. */
static uint64_t daemon_cpu_ns(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        die("open /proc/PID/stat", strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Fields after the command's closing parenthesis: state is 3, utime 14,
     * stime 15. */
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &ut, &st) != 2)
        die("/proc/PID/stat", "cannot parse utime and stime");
    long hz = sysconf(_SC_CLK_TCK);
    return (ut + st) * (1000000000ull / (uint64_t)(hz > 0 ? hz : 100));
}

/* The call (bench_tiny_call) in g's data. */
static void request(rnr_ring *g, rnp_bwd_req *b)
{
    rn_bwd_args a;
    bench_tiny_call((float *)g->data, &a);
    rnr_ring_req(g, &a, b);
}

int main(int argc, char **argv)
{
    const char *daemon = NULL, *out = NULL, *label = "", *delays_arg = "0,500,5000,50000,200000";
    char *extra[MAX_ARGS];
    int nextra = 0, n = 0;
    char dir[] = "/tmp/bench-late.XXXXXX", endpoint[128];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--daemon") && i + 1 < argc)
            daemon = argv[++i];
        else if (!strcmp(argv[i], "--daemon-arg") && i + 1 < argc && nextra < MAX_ARGS)
            extra[nextra++] = argv[++i];
        else if (!strcmp(argv[i], "--delays") && i + 1 < argc)
            delays_arg = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: bench_late --daemon PATH [--daemon-arg ARG]... "
                            "[--delays US,US,...] [--n N] [--label L] [--out FILE]\n");
            return 2;
        }
    }
    uint64_t delays[MAX_DELAYS];
    int nd = 0;
    for (const char *p = delays_arg; *p && nd < MAX_DELAYS;) {
        char *end;
        delays[nd++] = strtoull(p, &end, 10);
        if (end == p || (*end && *end != ','))
            die("--delays", "a list of microseconds, e.g. 0,500,50000");
        p = *end ? end + 1 : end;
    }
    if (!daemon || nd == 0 || n < 0)
        die("arguments", "--daemon PATH is needed");
    if (!mkdtemp(dir))
        die("mkdtemp", strerror(errno));
    snprintf(endpoint, sizeof endpoint, "ipc://%s/d.sock", dir);
    /* --ring-ready=host unless the arguments say otherwise (first, so that
     * one of theirs wins). */
    char *args[MAX_ARGS + 1];
    int nargs = 0;
    bool ready = false;
    for (int i = 0; i < nextra; i++)
        ready |= strncmp(extra[i], "--ring-ready", 12) == 0;
    if (!ready)
        args[nargs++] = "--ring-ready=host";
    for (int i = 0; i < nextra; i++)
        args[nargs++] = extra[i];
    daemon_pid = bench_daemon_start(daemon, endpoint, args, nargs);
    if (daemon_pid < 0)
        return 1;

    rnr_ring g;
    rnp_bwd_req b;
    if (rnr_ring_open_sealed(&g, endpoint, 8, sizeof(float) * BENCH_TINY_FLOATS + 4096) != 0)
        die("ring", "could not open one");
    request(&g, &b);
    /* Warm-up: the first calls map the region. */
    for (int i = 0; i < 20; i++) {
        uint64_t s = rnr_ring_publish(&g, &b, NULL, true);
        if (rnr_ring_wait(&g, s, 10000) != 0 || rnr_ring_status(&g, s, NULL, 0) != 0)
            die("warm-up call", "no answer, or an error");
    }

    FILE *csv = out ? fopen(out, "w") : NULL;
    if (out && !csv)
        die(out, strerror(errno));
    if (csv)
        fprintf(csv, "label,delay_us,calls,p10_us,p50_us,p90_us,max_us,daemon_cpu_pct\n");
    printf("%s: hop from ready to done, us (the daemon's CPU share while it waited)\n",
           *label ? label : daemon);
    printf("%10s %6s %9s %9s %9s %9s %8s\n", "delay_us", "calls", "p10", "p50", "p90", "max",
           "cpu%");
    for (int k = 0; k < nd; k++) {
        uint64_t d = delays[k];
        /* About a second's worth of calls a delay, 10 to 200 (or --n). */
        int calls = n ? n : d ? (int)(1000000 / d) : 200;
        calls = calls < 10 ? 10 : calls > 200 ? 200 : calls;
        uint64_t *lat = calloc((size_t)calls, sizeof *lat);
        if (!lat)
            die("calloc", "out of memory");
        uint64_t c0 = daemon_cpu_ns(daemon_pid), w0 = now_ns();
        for (int i = 0; i < calls; i++) {
            uint64_t s = rnr_ring_publish(&g, &b, NULL, false);
            sleep_us(d);
            uint64_t t0 = now_ns();
            rnr_ring_ready(&g, s);
            uint64_t spins = 0;
            while (!rnp_seq_reached(rnr_ring_done(&g), s)) {
                if (++spins % 64 == 0)
                    sched_yield();
                if (now_ns() - t0 > 10000000000ull)
                    die("call", "no done within 10 s of its ready");
            }
            lat[i] = now_ns() - t0;
            if (rnr_ring_status(&g, s, NULL, 0) != 0)
                die("call", "answered with an error");
        }
        double cpu = 100.0 * (double)(daemon_cpu_ns(daemon_pid) - c0) / (double)(now_ns() - w0);
        qsort(lat, (size_t)calls, sizeof *lat, cmp_u64);
        printf("%10llu %6d %9.1f %9.1f %9.1f %9.1f %8.1f\n", (unsigned long long)d, calls,
               pct_us(lat, calls, 0.1), pct_us(lat, calls, 0.5), pct_us(lat, calls, 0.9),
               pct_us(lat, calls, 1.0), cpu);
        if (csv)
            fprintf(csv, "%s,%llu,%d,%.2f,%.2f,%.2f,%.2f,%.1f\n", label, (unsigned long long)d,
                    calls, pct_us(lat, calls, 0.1), pct_us(lat, calls, 0.5), pct_us(lat, calls, 0.9),
                    pct_us(lat, calls, 1.0), cpu);
        free(lat);
    }
    if (csv)
        fclose(csv);
    rnr_ring_close(&g);
    bench_daemon_stop(daemon_pid);
    return 0;
}
