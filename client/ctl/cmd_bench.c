/* SPDX-License-Identifier: MIT */
/*
 * cmd_bench.c - rmsnormctl bench: K forked client processes send R verified
 * requests each; the parent reports throughput and latency percentiles.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rmsnormctl.h"
#include "rmsnormctl_verify.h"

/* What the workers share with the parent (one anonymous shared mapping,
 * created before fork). */
typedef struct bench_worker {
    uint64_t done, failed;
    double t_start, t_end;
    int status; /* 0 ok, else exit status */
    int cuda;   /* the daemon runs the CUDA backend: device memory, checked against fp64 */
    char error[600];
    /* The daemon gone, going or failing (a code rnctl_failure_status maps
     * to 2) ended this worker's run: the code, and what the call said. */
    int stop_rv;
    char stopped[600];
} bench_worker;

/* The head of the shared mapping: set by the first worker whose call found
 * the daemon gone, so that the others stop too instead of going on with
 * calls that can only fail the same way. */
typedef struct bench_shared {
    uint64_t stop;
} bench_shared;

typedef struct bench_cfg {
    uint64_t k, r, m, n;
    int dtype;
} bench_cfg;

/* The codes that stop a run (rnctl_failure_status: 2): how much each says
 * of the daemon, for choosing the one the stop line names (what the daemon
 * said itself most, a socket gone next, a silence least); whether the
 * daemon is gone or silent, so that the worker leaves without the
 * UNREGISTERs and the BYE it would wait out; and the stop line's words. */
static const struct stop_code {
    int rv, rank;
    bool silent;
    const char *state;
} stop_codes[] = {
    {RN_DRAINING, 3, false, "the daemon is shutting down"},
    {RN_DEVICE_FAILING, 3, false, "the daemon's device is failing"},
    {RN_RESTARTED, 3, false, "the daemon restarted during a call"},
    {RN_UNREACHABLE, 2, true, "the daemon went away"},
    {RN_PEER_DIED, 2, true, "the daemon went away"},
    {RN_ENDPOINT, 2, true, "the daemon's endpoint is no longer usable"},
    {RN_TIMEOUT, 1, true, "the daemon stopped answering"},
};

static const struct stop_code *stop_code(int rv)
{
    for (size_t i = 0; i < sizeof stop_codes / sizeof stop_codes[0]; i++)
        if (stop_codes[i].rv == rv)
            return &stop_codes[i];
    return stop_code(RN_UNREACHABLE); /* (no other code maps to 2) */
}

static void bench_worker_main(const rnctl_globals *g, const bench_cfg *cfg, int id,
                              bench_shared *sh, bench_worker *me, uint64_t *lat, uint64_t *qlat,
                              uint64_t *clat, int ready_fd, int go_fd)
{
    rn_client *c = NULL;
    rn_connect_opts o = {0};
    rnv_case k = {0};
    rn_bwd_args a;
    rnv_expect e = {0};
    rnv_mem mem = {0};
    struct rn_server_info si;
    char name[64], msg[200], byte = 1;
    bool cuda = false;
    int rv;

    snprintf(name, sizeof name, "rmsnormctl bench %d", id);
    o.endpoint = g->endpoint;
    o.timeout_ms = g->timeout_ms;
    o.client_name = name;
    if ((rv = rn_connect(&o, &c)) != 0) {
        snprintf(me->error, sizeof me->error, "connect: %s (%s)", rn_last_error(NULL),
                 rn_err_name(rv));
        me->status = EXIT_UNREACHABLE;
        goto report;
    }
    k.m = (int64_t)cfg->m;
    k.n = (int64_t)cfg->n;
    k.x = k.dy = k.dx = k.w = (rn_dtype)cfg->dtype;
    k.dw = RN_DTYPE_F32;
    k.rstd = true;
    k.eps = 1e-6f;
    /* A daemon on the CUDA backend computes on device memory. */
    if ((rv = rn_server_info(c, &si)) != 0) {
        snprintf(me->error, sizeof me->error, "info: %s (%s)", rn_last_error(c), rn_err_name(rv));
        me->status = rnctl_failure_status(rv);
        goto report;
    }
    cuda = strcmp(si.backend, "cuda") == 0;
    me->cuda = cuda;
    if ((rv = rnv_mem_alloc(c, cuda, rnv_bytes(&k), &mem, msg, sizeof msg)) != 0) {
        snprintf(me->error, sizeof me->error, "%s", msg);
        me->status = rnctl_failure_status(rv);
        goto report;
    }
    rnv_setup(&k, mem.host, (uint64_t)id + 1, &a);
    if (rnv_expect_init(&e, &a, 1, msg, sizeof msg) != 0) {
        snprintf(me->error, sizeof me->error, "expected result: %s", msg);
        me->status = EXIT_CHECK;
        goto report;
    }
report:
    /* Tell the parent we are ready (or failed), then wait for the start. */
    if (write(ready_fd, &byte, 1) != 1)
        _exit(EXIT_CHECK);
    close(ready_fd);
    if (me->status == 0) {
        ssize_t rd;
        do
            rd = read(go_fd, &byte, 1);
        while (rd < 0 && errno == EINTR);
        me->t_start = rnctl_now_s();
        for (uint64_t i = 0; i < cfg->r && !__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE); i++) {
            rn_timing t;
            rnv_poison(&a);
            rv = rnv_mem_run(c, &mem, &a, &t, msg, sizeof msg);
            if (rv != 0 && rnctl_failure_status(rv) == EXIT_UNREACHABLE) {
                /* Not a failed check: the daemon went away (unreachable,
                 * restarted, timed out), drains or its device fails.
                 * Every call after this one would wait and fail the same
                 * way (libclient waits for a restart up to the timeout):
                 * stop, and tell the others. */
                me->stop_rv = rv;
                snprintf(me->stopped, sizeof me->stopped, "request %" PRIu64 ": %s", i, msg);
                __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
                break;
            }
            if (rv != 0) {
                if (me->failed == 0)
                    snprintf(me->error, sizeof me->error, "request %" PRIu64 ": %s", i, msg);
                __atomic_add_fetch(&me->failed, 1, __ATOMIC_RELAXED);
            } else if (cuda ? rnv_compare(&a, &e, false, NULL, msg, sizeof msg) != 0
                            : !rnv_equal_twin(&a, &e)) {
                /* The GPU's dx rounds its row sums in another order than
                 * the twin: there the check is against fp64, within the
                 * kernel's tolerance. */
                if (me->failed == 0)
                    snprintf(me->error, sizeof me->error, "request %" PRIu64 ": %s", i,
                             cuda ? msg : "result differs from the CPU twin");
                __atomic_add_fetch(&me->failed, 1, __ATOMIC_RELAXED);
            } else {
                lat[i] = t.total_ns;
                qlat[i] = t.queue_ns;
                clat[i] = t.compute_ns;
            }
            __atomic_add_fetch(&me->done, 1, __ATOMIC_RELAXED);
        }
        me->t_end = rnctl_now_s();
        if (me->stop_rv)
            me->status = EXIT_UNREACHABLE;
        else if (me->failed)
            me->status = EXIT_CHECK;
    }
    /* A daemon that is gone or does not answer would not answer the
     * UNREGISTERs and the BYE either, each waited out to the timeout: leave
     * without them.  The buffers' names went when the daemon took them, the
     * memory goes with this process, and a daemon still there ends a dead
     * client's session itself. */
    if (me->stop_rv && stop_code(me->stop_rv)->silent)
        _exit(me->status);
    rnv_expect_fini(&e);
    rnv_mem_free(c, &mem);
    rn_close(c);
    _exit(me->status);
}

/* One latency line: sorts v (n > 0 samples, nanoseconds) and prints its
 * percentiles in microseconds after the label. */
static void print_latency(const char *label, uint64_t *v, size_t n)
{
    rnctl_sort_u64(v, n);
    printf("latency (us), %s p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", label,
           (double)rnctl_pct(v, n, 50) / 1e3, (double)rnctl_pct(v, n, 90) / 1e3,
           (double)rnctl_pct(v, n, 99) / 1e3, (double)v[n - 1] / 1e3);
}

int rnctl_bench(const rnctl_globals *g, int argc, char **argv)
{
    bench_cfg cfg = {.k = 4, .r = 1000, .m = 256, .n = 1024, .dtype = RN_DTYPE_BF16};
    size_t shared_bytes;
    char *shm;
    bench_shared *sh;
    bench_worker *w;
    uint64_t *lat, *qlat, *clat, total_ok = 0, total_failed = 0;
    pid_t *pids;
    int ready[2], go[2], rc = 0, quiet = 0;
    double t0, t1;

    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (rnctl_is_help(o)) {
            printf("Usage: %s bench [-k|--clients K] [-r|--requests R] [--m M] [--n N]\n"
                   "       [--dtype bf16|f16|f32] [-q|--quiet]\n\n"
                   "Fork K client processes (default 4) that each send R requests (default\n"
                   "1000) of an M x N backward pass (default 256 x 1024, bf16, fp32 dw) and\n"
                   "verify every result: bitwise against the CPU twin on the CPU backend; on\n"
                   "the CUDA backend, in device memory (copied to the GPU and back around each\n"
                   "call, which the timings include) against fp64 within the kernel's tolerance.\n"
                   "Prints throughput and latency percentiles; a progress line goes to stderr\n"
                   "(-q: none).\n"
                   "When the daemon goes away during the run (unreachable, restarted, no\n"
                   "answer within the timeout), drains or its device fails, bench stops\n"
                   "there and says so in one line, without a report.\n"
                   "Exit status: 0 all verified, 1 a mismatch or error, 2 the daemon\n"
                   "unreachable, gone, draining or failing.\n",
                   RNCTL_PROG);
            return 0;
        }
        if (i + 1 < argc && (strcmp(o, "-k") == 0 || strcmp(o, "--clients") == 0)) {
            if (rnctl_parse_u64(argv[++i], "bench -k", 1, 256, &cfg.k))
                return EXIT_USAGE;
        } else if (i + 1 < argc && (strcmp(o, "-r") == 0 || strcmp(o, "--requests") == 0)) {
            if (rnctl_parse_u64(argv[++i], "bench -r", 1, 10000000, &cfg.r))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--m") == 0) {
            if (rnctl_parse_u64(argv[++i], "bench --m", 1, 1u << 24, &cfg.m))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--n") == 0) {
            if (rnctl_parse_u64(argv[++i], "bench --n", 1, 1u << 20, &cfg.n))
                return EXIT_USAGE;
        } else if (i + 1 < argc && strcmp(o, "--dtype") == 0) {
            cfg.dtype = rnv_parse_dtype(argv[++i]);
            if (cfg.dtype <= 0) {
                fprintf(stderr, "%s bench: --dtype: \"%s\" is not bf16, f16 or f32\n", RNCTL_PROG,
                        argv[i]);
                return EXIT_USAGE;
            }
        } else if (strcmp(o, "-q") == 0 || strcmp(o, "--quiet") == 0) {
            quiet = 1;
        } else {
            return rnctl_usage_error("bench", "unknown option or missing value: %s", o);
        }
    }

    /* Everything the workers report lives in one shared mapping made before
     * any fork; the parent opens no nanomsg socket at all (nanomsg is not
     * fork-safe once used). */
    shared_bytes = sizeof *sh + cfg.k * sizeof *w + 3 * cfg.k * cfg.r * sizeof(uint64_t);
    shm = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pids = calloc(cfg.k, sizeof *pids);
    if (shm == MAP_FAILED || pids == NULL) {
        fprintf(stderr, "%s: out of memory for %" PRIu64 " x %" PRIu64 " samples\n", RNCTL_PROG,
                cfg.k, cfg.r);
        free(pids);
        return EXIT_CHECK;
    }
    sh = (bench_shared *)shm;
    w = (bench_worker *)(shm + sizeof *sh);
    lat = (uint64_t *)(shm + sizeof *sh + cfg.k * sizeof *w);
    qlat = lat + cfg.k * cfg.r;
    clat = qlat + cfg.k * cfg.r;
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", RNCTL_PROG, strerror(errno));
        return EXIT_CHECK;
    }
    fflush(NULL);
    for (uint64_t i = 0; i < cfg.k; i++) {
        pid_t p = fork();
        if (p < 0) {
            fprintf(stderr, "%s: fork: %s\n", RNCTL_PROG, strerror(errno));
            for (uint64_t j = 0; j < i; j++)
                kill(pids[j], SIGKILL);
            cfg.k = i;
            rc = EXIT_CHECK;
            break;
        }
        if (p == 0) {
            close(ready[0]);
            close(go[1]);
            bench_worker_main(g, &cfg, (int)i, sh, &w[i], lat + i * cfg.r, qlat + i * cfg.r,
                              clat + i * cfg.r, ready[1], go[0]);
        }
        pids[i] = p;
    }
    close(ready[1]);
    close(go[0]);
    /* Start line: every worker connected and computed its expectation. */
    for (uint64_t i = 0; i < cfg.k; i++) {
        char b;
        ssize_t rd;
        do
            rd = read(ready[0], &b, 1);
        while (rd < 0 && errno == EINTR);
        if (rd != 1)
            break;
    }
    close(ready[0]);
    close(go[1]); /* everyone's read() returns: go */
    t0 = rnctl_now_s();

    {
        uint64_t total = cfg.k * cfg.r;
        size_t alive = cfg.k;
        struct pollfd none;
        while (alive > 0) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p > 0) {
                alive--;
                for (uint64_t i = 0; i < cfg.k; i++)
                    if (pids[i] == p && (!WIFEXITED(st) || WEXITSTATUS(st) != 0) &&
                        w[i].status == 0)
                        w[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                continue;
            }
            if (p < 0 && errno != EINTR)
                break;
            if (!quiet && isatty(2)) {
                uint64_t d = 0;
                for (uint64_t i = 0; i < cfg.k; i++)
                    d += __atomic_load_n(&w[i].done, __ATOMIC_RELAXED);
                fprintf(stderr, "\rbench: %" PRIu64 "/%" PRIu64 " requests, %.0f/s   ", d, total,
                        (double)d / (rnctl_now_s() - t0 + 1e-9));
            }
            /* Refresh the progress line a few times a second. */
            poll(&none, 0, 200);
        }
        if (!quiet) {
            uint64_t d = 0;
            for (uint64_t i = 0; i < cfg.k; i++)
                d += w[i].done;
            /* Nothing done, or the daemon gone: the workers' errors and
             * the stop line below say why. */
            if (d > 0 && !sh->stop)
                fprintf(stderr, "\rbench: %" PRIu64 "/%" PRIu64 " requests done%20s\n", d, total, "");
        }
    }
    t1 = rnctl_now_s();

    {
        double first = 1e300, last = 0;
        uint64_t *all = malloc(cfg.k * cfg.r * sizeof *all);
        uint64_t *qa = malloc(cfg.k * cfg.r * sizeof *qa);
        uint64_t *ca = malloc(cfg.k * cfg.r * sizeof *ca);
        size_t n = 0;
        int64_t stopper = -1;
        for (uint64_t i = 0; i < cfg.k; i++) {
            if (w[i].stop_rv) {
                /* The stop line below says it once for every worker, with
                 * the code that says the most (stop_codes' rank). */
                if (stopper < 0 ||
                    stop_code(w[i].stop_rv)->rank > stop_code(w[stopper].stop_rv)->rank)
                    stopper = (int64_t)i;
                rc = EXIT_UNREACHABLE;
                if (w[i].failed)
                    fprintf(stderr, "%s: worker %" PRIu64 ": %s\n", RNCTL_PROG, i, w[i].error);
            } else if (w[i].status != 0) {
                char how[48];
                if (w[i].status >= 128)
                    snprintf(how, sizeof how, "killed by signal %d", w[i].status - 128);
                else
                    snprintf(how, sizeof how, "exited with status %d", w[i].status);
                fprintf(stderr, "%s: worker %" PRIu64 ": %s\n", RNCTL_PROG, i,
                        w[i].error[0] ? w[i].error : how);
                /* The daemon's state wins over a failed check, whichever
                 * worker comes first (a later one killed by a signal, 137,
                 * turned a 2 into 1). */
                if (w[i].status == EXIT_UNREACHABLE)
                    rc = EXIT_UNREACHABLE;
                else if (rc != EXIT_UNREACHABLE)
                    rc = EXIT_CHECK;
            }
            total_failed += w[i].failed;
            total_ok += w[i].done - w[i].failed;
            if (w[i].t_start > 0 && w[i].t_start < first)
                first = w[i].t_start;
            if (w[i].t_end > last)
                last = w[i].t_end;
            for (uint64_t j = 0; all && qa && ca && j < cfg.r; j++)
                if (lat[i * cfg.r + j]) {
                    all[n] = lat[i * cfg.r + j];
                    qa[n] = qlat[i * cfg.r + j];
                    ca[n] = clat[i * cfg.r + j];
                    n++;
                }
        }
        if (last <= first) {
            first = t0;
            last = t1;
        }
        if (stopper >= 0)
            fprintf(stderr,
                    "%s: bench stopped after %" PRIu64 " of %" PRIu64
                    " requests: %s (worker %" PRIu64 ", %s)\n",
                    RNCTL_PROG, total_ok + total_failed, cfg.k * cfg.r,
                    stop_code(w[stopper].stop_rv)->state, (uint64_t)stopper, w[stopper].stopped);
        /* No worker got as far as a request (a dead daemon, a refused
         * connection), or the daemon went away during the run (its
         * numbers would time a run cut short, and its last calls' wait):
         * the errors above are the whole report. */
        if ((total_ok + total_failed == 0 && rc != 0) || stopper >= 0) {
            free(all);
            free(qa);
            free(ca);
            munmap(shm, shared_bytes);
            free(pids);
            return rc;
        }
        printf("bench: %" PRIu64 " clients x %" PRIu64 " requests, m=%" PRIu64 " n=%" PRIu64
               " %s (w %s, dw f32, rstd given)\n",
               cfg.k, cfg.r, cfg.m, cfg.n, rnv_dtype_name((rn_dtype)cfg.dtype),
               rnv_dtype_name((rn_dtype)cfg.dtype));
        printf("verified: %" PRIu64 " ok, %" PRIu64 " failed (%s)\n", total_ok, total_failed,
               w[0].cuda ? "device memory, against fp64" : "bitwise against the CPU twin");
        if (n > 0) {
            double secs = last - first;
            double bytes =
                3.0 * (double)cfg.m * (double)cfg.n * (cfg.dtype == RN_DTYPE_F32 ? 4.0 : 2.0);
            printf("throughput: %.0f requests/s over %.2f s (%.2f GB/s of x, dy, dx)\n",
                   (double)n / secs, secs, bytes * (double)n / secs / 1e9);
            print_latency("client round trip:", all, n);
            uint64_t reported = 0;
            for (uint64_t j = 0; j < n; j++)
                reported |= qa[j] | ca[j];
            if (reported || n == 0) {
                print_latency("daemon queue:      ", qa, n);
                print_latency("daemon compute:    ", ca, n);
            } else {
                /* The fast path (RMSNORMD_PATH=fast) has no reply to carry them. */
                printf("daemon queue, compute: not reported per call on the fast path "
                       "(rmsnormctl stats: fast.queue, fast.compute)\n");
            }
        }
        free(all);
        free(qa);
        free(ca);
    }
    if (total_failed && rc == 0)
        rc = EXIT_CHECK;
    munmap(shm, shared_bytes);
    free(pids);
    return rc;
}
