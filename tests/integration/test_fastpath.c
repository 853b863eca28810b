/* SPDX-License-Identifier: MIT */
/*
 * test_fastpath - the fast path (PROTOCOL.md section 13) against a real
 * daemon on the CPU backend: results against the fp64 reference and bitwise
 * equal to the classic path; calls pipelined without waiting; a "GPU side"
 * that sets ready late (the daemon waits, it does not read early); bad slots
 * of every kind, each answered with its status and done in order; RING_OPEN's
 * checks; kill -9 of a client with slots pending; SIGTERM with a ring open;
 * two clients at once.
 */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/raw.h"
#include "integration/rawchan.h"
#include "integration/rawring.h"
#include "rmsnormctl_verify.h"

#define WAIT_MS 20000

/* A client of d on path, with timeout_ms (0: the default) and, unless
 * slots is NULL, RMSNORMD_RING_SLOTS=slots at rn_connect. */
static rn_client *client_with(const rnh_daemon *d, int path, int timeout_ms, const char *slots)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    o.endpoint = d->endpoint;
    o.path = path;
    o.timeout_ms = timeout_ms;
    if (slots)
        setenv("RMSNORMD_RING_SLOTS", slots, 1);
    int rv = rn_connect(&o, &c);
    if (slots)
        unsetenv("RMSNORMD_RING_SLOTS");
    if (rv != 0)
        fail_msg("rn_connect: %s", rn_last_error(NULL));
    return c;
}

static rn_client *client_on(const rnh_daemon *d, int path)
{
    return client_with(d, path, 0, NULL);
}

/* A case laid out in a fresh buffer of c, with its expectation. */
typedef struct laid {
    void *buf;
    rn_bwd_args a;
    rnv_expect e;
} laid;

static void lay(rn_client *c, const rnv_case *k, uint64_t seed, laid *l)
{
    char msg[300];
    memset(l, 0, sizeof *l);
    if (rn_buffer_alloc(c, rnv_bytes(k), &l->buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    rnv_setup(k, l->buf, seed, &l->a);
    if (rnv_expect_init(&l->e, &l->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
}

static void check(const laid *l, const char *what)
{
    char msg[400];
    if (rnv_compare(&l->a, &l->e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s: %s", what, msg);
}

static void unlay(rn_client *c, laid *l)
{
    rnv_expect_fini(&l->e);
    assert_int_equal(rn_buffer_free(c, l->buf), 0);
}

static rnv_case mixed_case(int i)
{
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    static const int64_t shapes[][2] = {{1, 1}, {5, 31}, {16, 64}, {7, 1000}, {64, 512}, {3, 4097}};
    rnv_case k = {0};
    k.m = shapes[i % 6][0];
    k.n = shapes[i % 6][1];
    k.x = dts[i % 3];
    k.dy = dts[(i / 3) % 3];
    k.dx = dts[(i / 2) % 3];
    k.eps = 1e-6f;
    if (i % 2) {
        k.w = dts[(i + 1) % 3];
        k.dw = i % 4 == 1 ? RN_DTYPE_F32 : k.w;
        k.rstd = true;
        k.weight_offset = i % 3 ? 0.0f : 1.0f;
    } else {
        k.dres = dts[(i + 2) % 3];
        k.pad = i % 5;
    }
    return k;
}

/* RN_PATH_AUTO (the default): host calls take the classic path, also the
 * "async" one (a plain synchronous call), and no ring is opened; the
 * results are right. */
static void test_auto_host_calls_classic(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_AUTO);
    assert_int_equal(rn_client_path(c), RN_PATH_AUTO);
    for (int i = 0; i < 4; i++) {
        rnv_case k = mixed_case(i);
        laid l;
        lay(c, &k, 0x51ed270b27c1a3ull * (uint64_t)(i + 1) ^ (uint64_t)getpid(), &l);
        int rc = i % 2 ? rn_rmsnorm_bwd_host_async(c, &l.a) : rn_rmsnorm_bwd_host(c, &l.a, NULL);
        if (rc != 0)
            fail_msg("case %d: %s", i, rn_last_error(c));
        /* Synchronous on the classic path: the outputs are there. */
        check(&l, "auto");
        unlay(c, &l);
    }
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rn_check(c), 0);
    assert_int_equal(rnh_stat(d, "requests.bwd"), 4);
    assert_int_equal(rnh_stat(d, "fast.slots"), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* Fresh random inputs on both paths: within the fp64 tolerance, bitwise the
 * CPU twin, and bitwise the classic path's outputs. */
static void test_results(void **state)
{
    rnh_daemon *d = *state;
    rn_client *fast, *classic;
    char msg[400];

    assert_int_equal(rnh_start(d), 0);
    fast = client_on(d, RN_PATH_FAST);
    classic = client_on(d, RN_PATH_CLASSIC);
    assert_int_equal(rn_client_path(fast), RN_PATH_FAST);
    assert_int_equal(rn_client_path(classic), RN_PATH_CLASSIC);
    for (int i = 0; i < 24; i++) {
        rnv_case k = mixed_case(i);
        uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ (uint64_t)getpid();
        laid f, c;
        lay(fast, &k, seed, &f);
        lay(classic, &k, seed, &c);
        rn_timing t = {0};
        if (rn_rmsnorm_bwd_host(fast, &f.a, &t) != 0)
            fail_msg("case %d fast: %s", i, rn_last_error(fast));
        assert_true(t.total_ns > 0);
        if (rn_rmsnorm_bwd_host(classic, &c.a, NULL) != 0)
            fail_msg("case %d classic: %s", i, rn_last_error(classic));
        check(&f, "fast");
        check(&c, "classic");
        /* Same inputs at the same offsets: every byte of the buffers. */
        assert_memory_equal(f.buf, c.buf, rnv_bytes(&k));
        unlay(fast, &f);
        unlay(classic, &c);
    }
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 24, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.errors"), 0);
    assert_int_equal(rnh_stat(d, "requests.bwd"), 24);   /* the classic client's only */
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    assert_int_equal(rnh_stat(d, "requests.ring_open"), 1);
    /* rmsnormctl shows the fast path's counters and latencies. */
    static char out[1 << 16];
    const char *args[] = {"--endpoint", d->endpoint, "stats", NULL};
    assert_int_equal(rnh_run_ctl(args, out, sizeof out, WAIT_MS), 0);
    assert_non_null(strstr(out, "fast.ok"));
    assert_non_null(strstr(out, "fast.total"));
    assert_non_null(strstr(out, "fast.take"));
    (void)msg;
    rn_close(fast);
    rn_close(classic);
    assert_int_equal(rnh_wait_stat(d, "fast.rings", 0, WAIT_MS), 0);
    RNH_PASS(d);
}


/* Many calls without waiting (more than the ring has slots: 64 here, so
 * the client also waits for a full ring), one rn_sync, every result
 * checked; two such clients at once, as separate processes. */
static void test_pipelined_two_clients(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc p[2];
    char line[256];

    assert_int_equal(rnh_start(d), 0);
    setenv("RMSNORMD_RING_SLOTS", "64", 1); /* (the clients' environment) */
    for (int i = 0; i < 2; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "%d", 1000 * (i + 1) + (int)getpid());
        const char *argv[] = {"prog_fastring", "verify", d->endpoint, "150", seed, NULL};
        assert_int_equal(rnh_spawn("prog_fastring", argv, false, &p[i]), 0);
    }
    unsetenv("RMSNORMD_RING_SLOTS");
    for (int i = 0; i < 2; i++) {
        int n = rnh_read_line(&p[i], line, sizeof line, 120000);
        if (n < 0 || strcmp(line, "ok 150") != 0)
            fail_msg("client %d: %s", i, n < 0 ? "no answer" : line);
        assert_int_equal(rnh_wait(&p[i], WAIT_MS), 0);
        rnh_proc_close(&p[i]);
    }
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 300, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.errors"), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 0);
    RNH_PASS(d);
}

/* The daemon's errors surface later: at rn_sync, at rn_check, at the next
 * call; each once, naming the failed call. */
static void test_errors_surface(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(1);

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 11, &l);
    rn_bwd_args bad = l.a;
    bad.m = l.a.m + 100;   /* past the end of the buffer: only the daemon knows */
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &l.a), 0);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), 0);
    /* Call 2's error comes back once: from the next call if call 2 has
     * finished by then (and that call is not run), else from rn_sync. */
    int third = rn_rmsnorm_bwd_host_async(c, &l.a);
    int synced = rn_sync(c);
    assert_int_equal(third ? third : synced, RN_OUT_OF_BOUNDS);
    assert_int_equal(third ? synced : third, 0);
    assert_non_null(strstr(rn_last_error(c), "call 2: bwd."));
    assert_int_equal(rn_check(c), 0);      /* reported once */
    assert_int_equal(rn_sync(c), 0);
    check(&l, "after an error");
    /* A synchronous call returns the error of an earlier call among those
     * up to its own, and the call after a finished failed one is not run. */
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), 0);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), RN_OUT_OF_BOUNDS);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), 0);
    assert_int_equal(rn_sync(c), RN_OUT_OF_BOUNDS);
    /* (the statistics of a call are counted on the daemon's loop after its
     * done word: once none is in flight, they are all in) */
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    int64_t ok = rnh_stat(d, "fast.ok");
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.errors", 4, WAIT_MS), 0);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &l.a), RN_OUT_OF_BOUNDS);   /* not run */
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.ok"), ok);
    assert_int_equal(rnh_stat(d, "errors.OUT_OF_BOUNDS"), 4);
    /* The library's own checks come back at once. */
    bad = l.a;
    bad.n = 0;
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), RN_INVALID_ARGUMENT);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* Several failed calls come back as one error: the first one's code and
 * message, with how many failed after it and the last (before, the later
 * ones were dropped). */
static void test_errors_accumulate(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(1);

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 12, &l);
    rn_bwd_args bad = l.a;
    bad.m = l.a.m + 100;
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)   /* (the ring opens) */
        fail_msg("the first call: %s", rn_last_error(c));
    /* All three published before the first is answered (a call after a
     * failed one that finished is not run). */
    assert_int_equal(rnh_sigstop(d), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rn_rmsnorm_bwd_host_async(c, &bad), 0);
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.errors", 3, WAIT_MS), 0);
    assert_int_equal(rn_sync(c), RN_OUT_OF_BOUNDS);
    const char *e = rn_last_error(c);
    if (!strstr(e, "call 2: bwd.") || !strstr(e, "and 2 errors after it; the last: call 4: bwd."))
        fail_msg("three failed calls: %s", e);
    assert_int_equal(rn_check(c), 0);      /* reported once */
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("a call after them: %s", rn_last_error(c));
    check(&l, "after three errors");
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* The first call of c (the ring opens), then n more published with d
 * stopped (SIGSTOP; SIGCONT if one fails): d is left stopped. */
static void publish_stopped(rnh_daemon *d, rn_client *c, const rn_bwd_args *a, int n,
                            const char *what)
{
    if (rn_rmsnorm_bwd_host(c, a, NULL) != 0)
        fail_msg("the first call, %s: %s", what, rn_last_error(c));
    assert_int_equal(rnh_sigstop(d), 0);
    for (int i = 0; i < n; i++)
        if (rn_rmsnorm_bwd_host_async(c, a) != 0) {
            kill(d->pid, SIGCONT);
            fail_msg("call %d of %d with the daemon stopped, %s: %s", i, n, what,
                     rn_last_error(c));
        }
}

/* RMSNORMD_RING_SLOTS: how far a client may run ahead.  With 1024 slots,
 * 300 calls are all published while the daemon is stopped (64, the
 * default before 1024, made the 65th wait for the oldest); with 4, the fifth
 * waits, and 40 calls go round the ring ten times; every result is right.
 * A value that is not a power of two up to 1024 fails rn_connect, naming
 * the variable.  (Read at rn_connect: unset after it, the client keeps its
 * depth.) */
static void test_ring_slots_env(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = mixed_case(3);
    laid l;

    assert_int_equal(rnh_start(d), 0);
    static const char *bad[] = {"100", "0", "2048", "64k", "-4", " 64", "+64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rn_connect_opts o = RN_CONNECT_OPTS_INIT;
        rn_client *bc = NULL;
        o.endpoint = d->endpoint;
        o.path = RN_PATH_FAST;
        setenv("RMSNORMD_RING_SLOTS", bad[i], 1);
        assert_int_equal(rn_connect(&o, &bc), RN_INVALID_ARGUMENT);
        assert_null(bc);
        if (!strstr(rn_last_error(NULL), "RMSNORMD_RING_SLOTS"))
            fail_msg("'%s': %s", bad[i], rn_last_error(NULL));
    }

    rn_client *c = client_with(d, RN_PATH_FAST, 0, "1024");
    lay(c, &k, 0x9d3b1e55u ^ (uint64_t)getpid(), &l);
    publish_stopped(d, c, &l.a, 300, "1024 slots");
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    assert_int_equal(rn_sync(c), 0);
    check(&l, "1024 slots");
    /* (the count goes up just after done) */
    assert_int_equal(rnh_wait_stat(d, "fast.slots", 301, WAIT_MS), 0);
    unlay(c, &l);
    rn_close(c);

    /* 4 slots: with the daemon stopped the fifth call waits for the first,
     * and gives up after the client's timeout, publishing nothing. */
    c = client_with(d, RN_PATH_FAST, 300, "4");
    lay(c, &k, 0x1b873593u ^ (uint64_t)getpid(), &l);
    publish_stopped(d, c, &l.a, 4, "4 slots");
    int rv = rn_rmsnorm_bwd_host_async(c, &l.a);
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    if (rv == 0 || !strstr(rn_last_error(c), "did not finish within"))
        fail_msg("a fifth call into a full ring of 4: %s: %s", rn_err_name(rv),
                 rn_last_error(c));
    assert_int_equal(rn_sync(c), 0);
    check(&l, "4 slots, full");
    unlay(c, &l);
    for (int i = 0; i < 40; i++) {
        rnv_case ki = mixed_case(i);
        laid li;
        lay(c, &ki, 0x61c8864680b583ebull * (uint64_t)(i + 1) ^ (uint64_t)getpid(), &li);
        if (rn_rmsnorm_bwd_host(c, &li.a, NULL) != 0)
            fail_msg("call %d, 4 slots: %s", i, rn_last_error(c));
        check(&li, "4 slots");
        unlay(c, &li);
    }
    assert_int_equal(rnh_wait_stat(d, "fast.slots", 346, WAIT_MS), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* A deep ring's calls when the daemon dies: 300 calls of a ring of 1024
 * slots published while the daemon is stopped, then the daemon killed:
 * rn_sync reports them lost at once (RN_RESTARTED, "calls 2..301"), and a
 * call once a daemon is back runs in a new session.  (The watcher's writes
 * into the slots, which streams wait on, are test_watch's, at the default
 * depth.) */
static void test_ring_slots_daemon_dies(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = mixed_case(3);
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = client_with(d, RN_PATH_FAST, 1000, "1024");
    lay(c, &k, 0x7f4a7c15u ^ (uint64_t)getpid(), &l);
    publish_stopped(d, c, &l.a, 300, "before the kill");
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    int64_t t0 = rnh_now_ms();
    int rv = rn_sync(c);
    int64_t ms = rnh_now_ms() - t0;
    /* (calls 2..301; 3..301 if the daemon answered call 2 before SIGSTOP
     * took hold) */
    if (rv != RN_RESTARTED || ms > 3000 || !strstr(rn_last_error(c), "..301:"))
        fail_msg("rn_sync after the daemon died: %s after %lld ms: %s", rn_err_name(rv),
                 (long long)ms, rn_last_error(c));
    assert_int_equal(rnh_start(d), 0);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("a call once a daemon is back: %s", rn_last_error(c));
    check(&l, "after the daemon came back");
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* Classic clients calling back to back do not starve ring calls on the
 * CPU backend: its unordered queue and the rings' streams take turns.
 * Before, the queue came first, and with one worker a ring call waited for
 * as long as two classic clients went on (10-12 s in a review). */
static void test_not_starved(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc w[2];
    char line[256];
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(5);

    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "--until-eof",
                          "--stop-on-error", "--m", "512", "--n", "2048", NULL};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &w[i]), 0);
        assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        assert_string_equal(line, "ready");
        assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        assert_string_equal(line, "first");
    }
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 31, &l);
    for (int i = 0; i < 5; i++) {
        int64_t t0 = rnh_now_ms();
        if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
            fail_msg("a ring call beside two classic clients: %s", rn_last_error(c));
        int64_t ms = rnh_now_ms() - t0;
        if (ms > 3000)
            fail_msg("a ring call took %lld ms beside two classic clients", (long long)ms);
    }
    check(&l, "beside classic clients");
    for (int i = 0; i < 2; i++) {
        close(w[i].in_fd);
        w[i].in_fd = -1;
        assert_int_equal(rnh_wait(&w[i], 30000), 0);
        rnh_proc_close(&w[i]);
    }
    assert_true(rnh_stat(d, "requests.bwd") > 0); /* (the workers' calls were classic) */
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* Calls after the daemon stopped (SIGTERM, its socket removed) or died
 * (kill -9, its socket left): the first waits the client's timeout for a
 * daemon to come back, probing, then fails with RN_UNREACHABLE; the ones
 * after it fail at once, on both paths and for asynchronous calls too.
 * Before, nanomsg's socket queued each request for its own reconnection,
 * and every call waited out the whole timeout to say "no reply" (a batch
 * of 16 asynchronous calls: 16 timeouts). */
static void stopped_fails_fast(rnh_daemon *d, int path, bool kill9)
{
    laid l;
    rnv_case k = mixed_case(6);

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = client_with(d, path, 1000, NULL);
    lay(c, &k, 33, &l);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("a call: %s", rn_last_error(c));
    if (kill9) {
        assert_int_equal(kill(d->pid, SIGKILL), 0);
        assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    } else {
        assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    }
    int rv = 0;
    for (int i = 0; i < 4; i++) {
        int64_t t0 = rnh_now_ms();
        rv = i % 2 ? rn_rmsnorm_bwd_host_async(c, &l.a) : rn_rmsnorm_bwd_host(c, &l.a, NULL);
        int64_t ms = rnh_now_ms() - t0;
        /* (at once: far below the client's 1000 ms timeout, with room for
         * a loaded host) */
        if (rv != RN_UNREACHABLE || ms > (i == 0 ? 3000 : 900))
            fail_msg("call %d after the daemon %s: %s after %lld ms: %s", i,
                     kill9 ? "died" : "stopped", rn_err_name(rv), (long long)ms,
                     rn_last_error(c));
    }
    /* Once a daemon listens again, the next call runs in a new session. */
    assert_int_equal(rnh_start(d), 0);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("a call once a daemon is back: %s", rn_last_error(c));
    rnv_expect_fini(&l.e);
    rn_close(c);
    RNH_PASS(d);
}

static void test_stopped_fails_fast(void **state)
{
    stopped_fails_fast(*state, RN_PATH_FAST, false);
}

static void test_died_fails_fast(void **state)
{
    stopped_fails_fast(*state, RN_PATH_FAST, true);
}

static void test_stopped_fails_fast_classic(void **state)
{
    stopped_fails_fast(*state, RN_PATH_CLASSIC, false);
}

static void test_died_fails_fast_classic(void **state)
{
    stopped_fails_fast(*state, RN_PATH_CLASSIC, true);
}

/* One user's calls whose inputs never come hold at most
 * --max-inflight-per-uid of the daemon's in-flight budget (half of
 * --max-inflight-total by default; root and the daemon's own user are not
 * counted), so other users' calls still run.  Before, 16 sessions of one
 * unprivileged user with 64 slots each held all 1024, and every other
 * client waited (ring calls) or got RN_BUSY (classic calls) as long as it
 * lived. */
static void test_uid_inflight_limit(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc w;
    char line[256], prog[512];
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(7);

    if (access("/usr/bin/setpriv", X_OK) != 0 || geteuid() != 0)
        RN_SKIP("no /usr/bin/setpriv, or not root: no client of another user");
    rnh_arg(d, "--max-inflight-total");
    rnh_arg(d, "8");
    rnh_arg(d, "--socket-mode");
    rnh_arg(d, "0666");
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(chmod(d->dir, 0755), 0);
    snprintf(prog, sizeof prog, "%s/tests/integration/prog_fastring", rnh_build_dir());
    const char *argv[] = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                          prog,      "stall",         d->endpoint,     "8",              NULL};
    assert_int_equal(rnh_spawn("/usr/bin/setpriv", argv, false, &w), 0);
    assert_true(rnh_read_line(&w, line, sizeof line, WAIT_MS) > 0);
    assert_string_equal(line, "published");
    /* Four of its slots (8 / 2) are taken and wait for their ready words;
     * the rest stay in its ring. */
    assert_int_equal(rnh_wait_slot_pending(d, 4, 1, WAIT_MS), 0);
    usleep(200000);
    assert_true(rnh_stat(d, "inflight.current") <= 4);
    for (int path = 0; path < 2; path++) {
        c = client_on(d, path ? RN_PATH_CLASSIC : RN_PATH_FAST);
        lay(c, &k, 35 + (uint64_t)path, &l);
        if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
            fail_msg("root's call beside a user's stalled ones: %s", rn_last_error(c));
        check(&l, "beside a user's stalled calls");
        unlay(c, &l);
        rn_close(c);
    }
    kill(w.pid, SIGKILL);
    assert_int_equal(rnh_wait(&w, WAIT_MS), 128 + SIGKILL);
    rnh_proc_close(&w);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

/* A ring with room for data after it, and one case laid out there. */
typedef struct raw_case {
    rnr_ring g;
    rnv_case k;
    rn_bwd_args a;
    rnp_bwd_req b;
    rnv_expect e;
} raw_case;

static void raw_open_go(rnh_daemon *d, raw_case *r, uint32_t slots, uint64_t seed, bool go)
{
    char msg[300];
    memset(r, 0, sizeof *r);
    r->k = mixed_case(3);
    r->k.m = 48, r->k.n = 300;
    size_t bytes = rnv_bytes(&r->k) + 4096;
    assert_int_equal(go ? rnr_ring_open(&r->g, d->endpoint, slots, bytes)
                        : rnr_ring_open_nogo(&r->g, d->endpoint, slots, bytes), 0);
    rnv_setup(&r->k, r->g.data, seed, &r->a);
    rnr_ring_req(&r->g, &r->a, &r->b);
    if (rnv_expect_init(&r->e, &r->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
}

static void raw_open(rnh_daemon *d, raw_case *r, uint32_t slots, uint64_t seed)
{
    raw_open_go(d, r, slots, seed, true);
}

/* Set by the --ring-ready=host variants: a slot left for its ready word is
 * prepared meanwhile (fast.prepared), not taken. */
static bool host_ready;

/* The "GPU side" writes ready late: the daemon takes the slot, waits, and
 * reads the inputs only after ready.  The inputs are garbage until then. */
static void test_ready_late(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    size_t n;

    if (!host_ready)
        RNH_NEED_GPU_WAITS(d);
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 77);
    n = rnv_bytes(&r.k);
    uint8_t *saved = malloc(n);
    memcpy(saved, r.g.data, n);
    memset(r.g.data, 0x7f, n);                     /* NaNs in every dtype */
    uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    assert_int_equal(rnh_stat(d, "fast.slots"), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.prepared", host_ready ? 1 : 0, WAIT_MS), 0);
    memcpy(r.g.data, saved, n);
    rnr_ring_ready(&r.g, seq);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, seq, NULL, 0), 0);
    char msg[400];
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("late ready: %s", msg);
    /* Ready set before the slot: no wait. */
    seq = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, seq, NULL, 0), 0);
    free(saved);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Two rings with every slot published before its inputs are ready, and
 * room for one request in flight (--max-inflight-total 1): once the inputs
 * are ready the loop takes the rings' slots in turn, so the second ring's
 * first call is answered long before the first ring's last (the rings
 * take turns; taking each ring's slots all at once answered the first
 * ring's N calls first).
 *
 * Ready is written for a's first three slots and b's first one only: a
 * loop that took a's fourth before b's first would hold the one place in
 * flight with a slot whose inputs never come, and b's first call would
 * never be answered.  So the test fails or passes by the order alone,
 * however the threads are scheduled (it once compared done words read
 * while the calls ran, and a pause of the test's thread on a loaded host
 * failed it). */
static void test_rings_take_turns(void **state)
{
    rnh_daemon *d = *state;
    enum { N = 6 };
    raw_case a, b;
    uint64_t sa[N], sb[N];

    rnh_arg(d, "--max-inflight-total");
    rnh_arg(d, "1");
    RNH_NEED_GPU_WAITS(d); /* (a's first slot in flight before its ready) */
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &a, 8, 5);
    raw_open(d, &b, 8, 6);
    for (int i = 0; i < N; i++)
        sa[i] = rnr_ring_publish(&a.g, &a.b, NULL, false);
    for (int i = 0; i < N; i++)
        sb[i] = rnr_ring_publish(&b.g, &b.b, NULL, false);
    /* a's first slot is in flight (its worker waits for ready), the rest
     * wait at the limit. */
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 1, WAIT_MS), 0);
    rnr_ring_ready(&a.g, sa[2]);
    rnr_ring_ready(&b.g, sb[0]);
    if (rnr_ring_wait(&b.g, sb[0], WAIT_MS) != 0)
        fail_msg("ring b's first call was not answered within %d ms: ring a's slots were taken "
                 "past its three ready ones (ring a answered up to %llu of %llu..%llu)",
                 WAIT_MS, (unsigned long long)rnr_ring_done(&a.g), (unsigned long long)sa[0],
                 (unsigned long long)sa[N - 1]);
    rnr_ring_ready(&a.g, sa[N - 1]);
    rnr_ring_ready(&b.g, sb[N - 1]);
    assert_int_equal(rnr_ring_wait(&a.g, sa[N - 1], WAIT_MS), 0);
    assert_int_equal(rnr_ring_wait(&b.g, sb[N - 1], WAIT_MS), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rnr_ring_status(&a.g, sa[i], NULL, 0), 0);
        assert_int_equal(rnr_ring_status(&b.g, sb[i], NULL, 0), 0);
    }
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 2 * N, WAIT_MS), 0);
    rnv_expect_fini(&a.e);
    rnv_expect_fini(&b.e);
    rnr_ring_close(&a.g);
    rnr_ring_close(&b.g);
    RNH_PASS(d);
}

/* The ring's sleeping flag once it reads want, or at timeout_ms. */
static uint32_t sleeping(const rnr_ring *g, uint32_t want, int timeout_ms)
{
    uint32_t v;
    for (int waited = 0;; waited++) {
        v = __atomic_load_n(rnp_ring_u32(g->mem, RNP_RING_O_SLEEPING), __ATOMIC_SEQ_CST);
        if (v == want || waited >= timeout_ms)
            return v;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

/* --ring-spin-us: after a slot the loop polls the rings itself, so that a
 * slot published soon after is taken with no doorbell rung at all; the
 * doorbell thread, asleep by then, would see it only at its 100 ms
 * timeout, which it logs.  So no slot published while the loop polls (the
 * ring's sleeping flag 0: clients are told not to ring) is left to that
 * sleep.  (The loop may take such a slot at a turn of its own, woken by the
 * last job's release, rather than by the poll: fast.polled counts only the
 * latter, and is not asked to count them all.  A slot published after a
 * pause of the test's thread past the spin, the flag back at 1, gets its
 * doorbell as any client's would, and is not counted.) */
static void test_loop_polls(void **state)
{
    rnh_daemon *d = *state;
    static const char slept[] = "Doorbell thread: a slot was found only when a";
    raw_case r;
    int quiet = 0;

    rnh_arg(d, "--ring-spin-us");
    rnh_arg(d, "100000"); /* 100 ms: room for a slow machine's turns */
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 79);
    uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    int slept0 = rnh_log_count(d, slept);
    for (int i = 0; i < 5; i++) {
        struct timespec gap = {0, 2000000}; /* 2 ms: past the doorbell thread's spin */
        nanosleep(&gap, NULL);
        r.g.no_bell = sleeping(&r.g, 0, 0) == 0;
        quiet += r.g.no_bell;
        seq = rnr_ring_publish(&r.g, &r.b, NULL, true);
        assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
        assert_int_equal(rnr_ring_status(&r.g, seq, NULL, 0), 0);
    }
    /* While the loop polls, clients are told not to ring (the sleeping
     * flag stays 0); once it stops, the doorbell thread sleeps again. */
    uint32_t polling = sleeping(&r.g, 0, 0);
    int64_t polled = rnh_stat(d, "fast.polled");
    int slept1 = rnh_log_count(d, slept);
    printf("%d of 5 slots published without a doorbell; fast.polled %lld; %d left to the "
           "doorbell thread's sleep\n", quiet, (long long)polled, slept1 - slept0);
    assert_true(quiet >= 1);
    assert_int_equal(slept1 - slept0, 0);
    assert_true(polled >= 1);
    assert_int_equal(polling, 0);
    assert_int_equal(sleeping(&r.g, 1, 2000), 1);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_loop_polls_off(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    rnh_arg(d, "--ring-spin-us");
    rnh_arg(d, "0");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 80);
    for (int i = 0; i < 3; i++) {
        uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, true);
        assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    }
    assert_int_equal(rnh_stat(d, "fast.polled"), 0);
    assert_int_equal(sleeping(&r.g, 1, 2000), 1);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Bad slots of every kind, published together between good ones: each gets
 * its status and message, done advances over all of them in order, and
 * the good ones compute. */
typedef void slot_patch(uint8_t *desc, const raw_case *r);
#define TOFF(t, f) (RNP_SLOT_O_TENSORS + (t) * RNP_SLOT_TENSOR + (f))
static void sp_seq(uint8_t *d, const raw_case *r) { rnp_le64_put(d, 999); }
static void sp_flags(uint8_t *d, const raw_case *r) { d[RNP_SLOT_O_FLAGS + 1] = 1; }
static void sp_dtype(uint8_t *d, const raw_case *r) { rnp_le32_put(d + TOFF(0, RNP_SLOT_T_DTYPE), 9); }
static void sp_region(uint8_t *d, const raw_case *r) { rnp_le32_put(d + TOFF(1, RNP_SLOT_T_REGION), 99); }
static void sp_misaligned(uint8_t *d, const raw_case *r)
{
    rnp_le64_put(d + TOFF(1, RNP_SLOT_T_OFFSET), r->b.dy.offset + 1);
}
static void sp_bounds(uint8_t *d, const raw_case *r)
{
    rnp_le64_put(d + TOFF(2, RNP_SLOT_T_OFFSET), r->g.size - 64);
}
static void sp_stride(uint8_t *d, const raw_case *r) { rnp_le64_put(d + TOFF(0, RNP_SLOT_T_STRIDE), 1); }
static void sp_n0(uint8_t *d, const raw_case *r) { rnp_le32_put(d + RNP_SLOT_O_N, 0); }
static void sp_large(uint8_t *d, const raw_case *r) { rnp_le32_put(d + RNP_SLOT_O_N, 1u << 30); }
static void sp_alias(uint8_t *d, const raw_case *r)
{
    /* dx over x */
    memcpy(d + TOFF(2, 0), d + TOFF(0, 0), RNP_SLOT_TENSOR);
}
static void sp_eps(uint8_t *d, const raw_case *r) { rnp_le32_put(d + RNP_SLOT_O_EPS, 0xffc00000u); }
static void sp_reserved(uint8_t *d, const raw_case *r) { d[RNP_SLOT_O_RESERVED + 3] = 1; }

static void test_bad_slots(void **state)
{
    rnh_daemon *d = *state;
    static const struct {
        slot_patch *p;
        int code;
        const char *field;
    } bad[] = {
        {sp_seq, RN_INVALID_ARGUMENT, "bwd.seq"},      {sp_flags, RN_INVALID_ARGUMENT, "bwd.flags"},
        {sp_dtype, RN_INVALID_ARGUMENT, "bwd.x.dtype"}, {sp_region, RN_UNKNOWN_REGION, "bwd.dy"},
        {sp_misaligned, RN_MISALIGNED, "bwd.dy"},       {sp_bounds, RN_OUT_OF_BOUNDS, "bwd.dx"},
        {sp_stride, RN_INVALID_ARGUMENT, "bwd.x"},      {sp_n0, RN_INVALID_ARGUMENT, "bwd.n"},
        {sp_large, RN_TOO_LARGE, "bwd.n"},              {sp_alias, RN_ALIASING, "bwd.dx"},
        {sp_eps, RN_INVALID_ARGUMENT, "bwd.eps"},      {sp_reserved, RN_INVALID_ARGUMENT, "bwd.reserved"},
    };
    const int nbad = (int)(sizeof bad / sizeof bad[0]);
    raw_case r;
    char msg[RNP_MAX_ERRMSG];

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 16, 5);
    uint64_t first = rnr_ring_publish(&r.g, &r.b, NULL, true);
    for (int i = 0; i < nbad; i++) {
        uint8_t desc[RNP_RING_DESC];
        rnp_ring_encode(&r.b, r.g.seq + 1, desc);
        bad[i].p(desc, &r);
        rnr_ring_publish(&r.g, NULL, desc, true);
    }
    rnv_poison(&r.a);
    uint64_t last = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, last, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, first, msg, sizeof msg), 0);
    for (int i = 0; i < nbad; i++) {
        int st = rnr_ring_status(&r.g, first + 1 + (uint64_t)i, msg, sizeof msg);
        if (st != bad[i].code || !strstr(msg, bad[i].field))
            fail_msg("bad slot %d: %s \"%s\", expected %s naming %s", i, rn_err_name(st), msg,
                     rn_err_name(bad[i].code), bad[i].field);
    }
    assert_int_equal(rnr_ring_status(&r.g, last, msg, sizeof msg), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("the good slot after the bad ones: %s", msg);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.errors"), nbad);
    assert_int_equal(rnh_stat(d, "fast.ok"), 2);
    assert_int_equal(rnh_stat(d, "errors.ALIASING"), 1);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* RING_OPEN's and RING_CLOSE's checks, the ring's region held, HELLO's paths.
 * With a done word (done_region nonzero) when dregion is. */
static int ring_open_dw(rnr_ring *g, uint32_t region, uint64_t offset, uint32_t slots,
                        uint32_t dregion, uint64_t doffset, char *err)
{
    static rnp_request q;
    static rnp_reply rep;
    memset(&q, 0, sizeof q);
    q.op = RN_OP_RING_OPEN;
    q.u.ring_open.session = g->session;
    q.u.ring_open.region.id = region;
    q.u.ring_open.offset = offset;
    q.u.ring_open.slots = slots;
    q.u.ring_open.done_region.id = dregion;
    q.u.ring_open.done_offset = doffset;
    int st = rnr_ring_call(g, &q, &rep);
    snprintf(err, 200, "%s", rep.error);
    if (st == 0)
        g->ring = rep.u.ring_open.ring;
    return st;
}

static int ring_open(rnr_ring *g, uint32_t region, uint64_t offset, uint32_t slots, char *err)
{
    return ring_open_dw(g, region, offset, slots, 0, 0, err);
}

static int simple(rnr_ring *g, uint32_t op, uint32_t arg)
{
    static rnp_request q;
    static rnp_reply rep;
    memset(&q, 0, sizeof q);
    q.op = op;
    if (op == RN_OP_RING_CLOSE)
        q.u.ring_close.session = g->session, q.u.ring_close.ring = arg;
    else if (op == RN_OP_BYE)
        q.u.bye = g->session;
    else
        q.u.unreg.session = g->session, q.u.unreg.region.id = arg;
    return rnr_ring_call(g, &q, &rep);
}

/* The ring's state word says closed (the daemon let go of it), within
 * WAIT_MS: 0, else -1. */
static int wait_state_closed(const rnr_ring *g)
{
    int64_t t0 = rnh_now_ms();
    while (rnr_ring_state(g) != RNP_RING_CLOSED) {
        if (rnh_now_ms() - t0 > WAIT_MS)
            return -1;
        usleep(1000);
    }
    return 0;
}

/* RING_OPEN in memory where a closed ring still answers its slots is
 * refused until that ring wrote state = 1.  Before, it was taken, and the
 * closed ring's late answers wrote done and state into the new ring: its
 * done went 5 -> 1, and it read as closed with nothing published. */
static void test_ring_reopen_waits(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char err[200];

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 16, 9);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_slot_pending(d, 2, 1, WAIT_MS), 0);
    const char *more = getenv("RN_DAEMON_ARGS");
    if (rnh_stat(d, "inflight.current") == 0 || (more && strstr(more, "=armed"))) {
        /* --ring-ready=host: slots without ready stay in the ring, which
         * stays closing after RING_CLOSE (test_ring_close_waits_within_limits);
         * armed: RING_CLOSE takes the armed slots back into the ring */
        rnv_expect_fini(&r.e);
        rnr_ring_close(&r.g);
        skip();
    }
    assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), 0);
    rnp_ring_init(r.g.mem, 16);
    assert_int_equal(ring_open(&r.g, r.g.region, 0, 16, err), RN_INVALID_ARGUMENT);
    if (!strstr(err, "ring_open.region") || !strstr(err, "still answers"))
        fail_msg("RING_OPEN over a ring that still answers: %s", err);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_OPEN); /* (the header as init left it) */
    rnr_ring_ready(&r.g, s2);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(wait_state_closed(&r.g), 0);
    rnp_ring_init(r.g.mem, 16);
    assert_int_equal(ring_open(&r.g, r.g.region, 0, 16, err), 0);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_OPEN);
    r.g.seq = 0;
    rnv_poison(&r.a);
    uint64_t s = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(s, 1);
    assert_int_equal(rnr_ring_wait(&r.g, s, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s, NULL, 0), 0);
    assert_int_equal(rnr_ring_done(&r.g), 1);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_ring_open_close(void **state)
{
    rnh_daemon *d = *state;
    rnr_ring g;
    char err[200];
    rn_client *c;

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    struct rn_server_info info = {0};
    assert_int_equal(rn_server_info(c, &info), 0);
    rn_close(c);
    assert_int_equal(rnr_ring_open(&g, d->endpoint, 8, 8192), 0);
    assert_int_equal(ring_open(&g, g.region, 0, 8, err), RN_INVALID_ARGUMENT);   /* one open */
    assert_non_null(strstr(err, "ring_open"));
    assert_int_equal(simple(&g, RN_OP_UNREGISTER, g.region), RN_INVALID_ARGUMENT);
    assert_int_equal(simple(&g, RN_OP_RING_CLOSE, g.ring + 1), RN_INVALID_ARGUMENT);
    assert_int_equal(simple(&g, RN_OP_RING_CLOSE, g.ring), 0);
    assert_int_equal(rnr_ring_state(&g), RNP_RING_CLOSED);
    assert_int_equal(rnh_stat(d, "fast.rings"), 0);
    /* Each check of RING_OPEN, on a header that is right but for it. */
    rnp_ring_init(g.mem, 8);
    assert_int_equal(ring_open(&g, 77, 0, 8, err), RN_UNKNOWN_REGION);
    assert_non_null(strstr(err, "ring_open.region"));
    assert_int_equal(ring_open(&g, g.region, 8, 8, err), RN_MISALIGNED);
    assert_int_equal(ring_open(&g, g.region, 0, 6, err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "ring_open.slots"));
    assert_int_equal(ring_open(&g, g.region, 0, 4096, err), RN_TOO_LARGE);
    assert_int_equal(ring_open(&g, g.region, g.size - 512, 8, err), RN_OUT_OF_BOUNDS);
    assert_int_equal(ring_open(&g, g.region, 0, 16, err), RN_INVALID_ARGUMENT);  /* header says 8 */
    g.mem[0] ^= 0xff;
    assert_int_equal(ring_open(&g, g.region, 0, 8, err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "ring_open.magic"));
    /* done_offset without done_region: a decoding matter, found first */
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, 0, 8, err), RN_MISSING_FIELD);
    rnp_ring_init(g.mem, 8);
    rnp_le32_put(g.mem + RNP_RING_O_VERSION, 9);
    assert_int_equal(ring_open(&g, g.region, 0, 8, err), RN_BAD_VERSION);
    rnp_ring_init(g.mem, 8);
    rnp_le64_put(g.mem + RNP_RING_O_PROD, 3);
    assert_int_equal(ring_open(&g, g.region, 0, 8, err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "ring_open.prod"));
    /* The done word: its region, alignment and bounds, never a ring's
     * memory; the cpu backend takes any other region of the session. */
    rnp_ring_init(g.mem, 8);
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, 0, 8, err), RN_MISSING_FIELD);
    assert_non_null(strstr(err, "ring_open.done_region"));
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, 77, 0, err), RN_UNKNOWN_REGION);
    assert_non_null(strstr(err, "ring_open.done_region"));
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, g.region, 4, err), RN_MISALIGNED);
    assert_non_null(strstr(err, "ring_open.done_offset"));
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, g.region, g.size, err), RN_OUT_OF_BOUNDS);
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, g.region, 8, err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "ring_open.done_region"));
    int fd2 = (int)syscall(SYS_memfd_create, "done", 1u);
    uint32_t region2 = 0;
    char msg[200];
    assert_true(fd2 >= 0 && ftruncate(fd2, 4096) == 0);
    assert_int_equal(rnr_chan_register(g.chan, fd2, 4096, &region2, msg, sizeof msg), 0);
    uint8_t *word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    assert_true(word != MAP_FAILED);
    assert_int_equal(ring_open_dw(&g, g.region, 0, 8, region2, 8, err), 0);
    /* Answered (a slot of junk: its error), the word says so too, and its
     * region stays mapped while the ring is open. */
    assert_int_equal(simple(&g, RN_OP_UNREGISTER, region2), 0);
    static const uint8_t junk[RNP_RING_DESC];
    uint64_t s1 = rnr_ring_publish(&g, NULL, junk, true);
    assert_int_equal(rnr_ring_wait(&g, s1, WAIT_MS), 0);
    assert_int_not_equal(rnr_ring_status(&g, s1, NULL, 0), 0);
    assert_int_equal(__atomic_load_n((uint64_t *)(word + 8), __ATOMIC_ACQUIRE), s1);
    assert_int_equal(simple(&g, RN_OP_RING_CLOSE, g.ring), 0);
    munmap(word, 4096);
    close(fd2);
    assert_int_equal(rnh_wait_stat(d, "fast.rings", 0, WAIT_MS), 0);
    assert_int_equal(wait_state_closed(&g), 0); /* (its last job let go) */
    /* A ring at an offset into the region works like one at 0. */
    rnp_ring_init(g.mem + 64, 4);
    assert_int_equal(ring_open(&g, g.region, 64, 4, err), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    assert_int_equal(simple(&g, RN_OP_RING_CLOSE, g.ring), 0);
    assert_int_equal(simple(&g, RN_OP_UNREGISTER, g.region), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, WAIT_MS), 0);
    rnr_ring_close(&g);
    RNH_PASS(d);
}

/* A producer word far ahead of anything the client could have published
 * (it may run at most a ring's worth of slots ahead of done): nothing of it
 * is taken, not even when the ring closes, and the daemon stays well. */
static void test_prod_garbage(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 13);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_PROD), s1 + 5, __ATOMIC_RELEASE);
    __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), s1 + 5, __ATOMIC_RELEASE);
    assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), 0);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_CLOSED);
    assert_int_equal(rnr_ring_done(&r.g), s1);
    assert_int_equal(rnh_stat(d, "fast.slots"), 1);
    assert_int_equal(rnh_stat(d, "fast.rings"), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

/* BYE with a slot taken that still waits for ready: it is answered
 * UNKNOWN_SESSION without running, done reaches it, the ring closes, and the
 * session is freed although its client lives on. */
static void test_bye_pending(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[RNP_MAX_ERRMSG];
    static rnp_request q;
    static rnp_reply rep;

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 15);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    memset(&q, 0, sizeof q);
    q.op = RN_OP_BYE;
    q.u.bye = r.g.session;
    assert_int_equal(rnr_ring_call(&r.g, &q, &rep), 0);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, msg, sizeof msg), RN_UNKNOWN_SESSION);
    assert_non_null(strstr(msg, "not run"));
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, WAIT_MS), 0);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_CLOSED);
    assert_int_equal(rnh_stat(d, "regions.active"), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* A ring that closes while the daemon is at its in-flight limit and the
 * backend's queue is full (--max-inflight-total 1, held by another
 * session's slot whose ready word has not come): its published slot is
 * still taken, past both limits (at most a ring's worth of slots), and
 * answered: run after RING_CLOSE, UNKNOWN_SESSION after BYE.  Before, the
 * forced take met the backend's queue limit: after RING_CLOSE the slot was
 * never answered, and after BYE the refused request freed the session
 * under its own end (a use after free). */
static void close_at_queue_limit(void **state, bool bye)
{
    rnh_daemon *d = *state;
    raw_case a, b;
    char msg[RNP_MAX_ERRMSG];
    static rnp_request q;
    static rnp_reply rep;

    rnh_arg(d, "--max-inflight-total");
    rnh_arg(d, "1");
    RNH_NEED_GPU_WAITS(d); /* (taken at once: the slot holds the limit) */
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &a, 4, 31);
    raw_open(d, &b, 4, 32);
    uint64_t s1 = rnr_ring_publish(&a.g, &a.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 1, WAIT_MS), 0);
    uint64_t t1 = rnr_ring_publish(&b.g, &b.b, NULL, true);
    assert_int_equal(rnh_wait_stat(d, "fast.deferred", 1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_done(&b.g), 0);
    if (bye) {
        memset(&q, 0, sizeof q);
        q.op = RN_OP_BYE;
        q.u.bye = b.g.session;
        assert_int_equal(rnr_ring_call(&b.g, &q, &rep), 0);
    } else {
        assert_int_equal(simple(&b.g, RN_OP_RING_CLOSE, b.g.ring), 0);
    }
    /* The other session's slot runs once its inputs are ready; the closed
     * ring's slot is answered whether or not it waited for that. */
    rnr_ring_ready(&a.g, s1);
    assert_int_equal(rnr_ring_wait(&a.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&a.g, s1, NULL, 0), 0);
    assert_int_equal(rnr_ring_wait(&b.g, t1, WAIT_MS), 0);
    if (bye) {
        assert_int_equal(rnr_ring_status(&b.g, t1, msg, sizeof msg), RN_UNKNOWN_SESSION);
        assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, WAIT_MS), 0);
    } else {
        assert_int_equal(rnr_ring_status(&b.g, t1, msg, sizeof msg), 0);
        if (rnv_compare(&b.a, &b.e, true, NULL, msg, sizeof msg) != 0)
            fail_msg("the closed ring's slot: %s", msg);
    }
    /* (state = 1 once the slot's job was released, just after done) */
    assert_int_equal(wait_state_closed(&b.g), 0);
    /* The daemon goes on: the first session's next call runs. */
    uint64_t s2 = rnr_ring_publish(&a.g, &a.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&a.g, s2, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&a.g, s2, NULL, 0), 0);
    rnv_expect_fini(&a.e);
    rnv_expect_fini(&b.e);
    rnr_ring_close(&a.g);
    rnr_ring_close(&b.g);
    RNH_PASS(d);
}

/* RING_CLOSE while the slots' inputs have not come: they are taken within
 * the limits as before (not all put in flight at once past them, as a
 * client repeating RING_CLOSE and RING_OPEN could use to take the whole
 * daemon), the session opens no other ring meanwhile, a slot published
 * after RING_CLOSE is never taken; once the ready words come every slot
 * before it runs, then the ring closes and a new one opens. */
static void test_ring_close_waits_within_limits(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char err[300];
    uint64_t s[6];

    rnh_arg(d, "--max-inflight");
    rnh_arg(d, "2");
    RNH_NEED_GPU_WAITS(d); /* (taken at once, up to the limit) */
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 41);
    for (int i = 0; i < 6; i++)
        s[i] = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 2, WAIT_MS), 0);
    assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), 0);
    assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), RN_INVALID_ARGUMENT);
    usleep(200000);
    assert_int_equal(rnh_stat(d, "inflight.current"), 2);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_OPEN);
    assert_int_equal(ring_open(&r.g, r.g.region, 0, 8, err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "closing"));
    uint64_t late = rnr_ring_publish(&r.g, &r.b, NULL, true);
    rnr_ring_ready(&r.g, s[5]);
    assert_int_equal(rnr_ring_wait(&r.g, s[5], WAIT_MS), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(rnr_ring_status(&r.g, s[i], NULL, 0), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.rings", 0, WAIT_MS), 0);
    /* (written once the last job was released) */
    assert_int_equal(wait_state_closed(&r.g), 0);
    assert_true(rnr_ring_done(&r.g) < late);
    char msg[400];
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("after RING_CLOSE: %s", msg);
    /* A new ring on the same memory. */
    rnp_ring_init(r.g.mem, 8);
    assert_int_equal(ring_open(&r.g, r.g.region, 0, 8, err), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_ring_close_at_queue_limit(void **state)
{
    close_at_queue_limit(state, false);
}

static void test_bye_at_queue_limit(void **state)
{
    close_at_queue_limit(state, true);
}

/* The backend fails (--debug-fail-after, as a broken GPU would): the slot
 * that failed it is answered DEVICE_FAILING in order, the ring takes no more,
 * closes, and the daemon exits 2. */
static void test_backend_fails(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    rnh_arg(d, "--debug-fail-after");
    rnh_arg(d, "3");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 17);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    uint64_t s3 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 2);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(rnr_ring_status(&r.g, s2, NULL, 0), 0);
    assert_int_equal(rnr_ring_status(&r.g, s3, NULL, 0), RN_DEVICE_FAILING);
    assert_int_equal(rnr_ring_done(&r.g), s3);
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_CLOSED);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* The backend fails while a slot waits in the ring for its ready word
 * (--ring-ready=host): the drain ends the session, whose ring's last take
 * is refused (DEVICE_FAILING) with nothing of the session running.  The
 * daemon still exits 2 in order; before, that refusal freed the session
 * under its own end (the sanitizer build caught the use after free). */
static void test_backend_fails_waiting(void **state)
{
    rnh_daemon *d = *state;
    raw_case r, o;

    rnh_arg(d, "--debug-fail-after");
    rnh_arg(d, "2");
    RNH_NEED_READY_MODE(d, "host");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 19);
    raw_open(d, &o, 8, 20);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    rnr_ring_publish(&r.g, &r.b, NULL, false); /* its ready word never comes */
    assert_int_equal(rnh_wait_stat(d, "fast.ready_waits", 1, WAIT_MS), 0);
    /* The other session's call is the backend's second job: it fails it. */
    uint64_t t1 = rnr_ring_publish(&o.g, &o.b, NULL, true);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 2);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(rnr_ring_status(&o.g, t1, NULL, 0), RN_DEVICE_FAILING);
    rnv_expect_fini(&r.e);
    rnv_expect_fini(&o.e);
    rnr_ring_close(&r.g);
    rnr_ring_close(&o.g);
    RNH_PASS(d);
}

/* A client shrinks its ring's memory to nothing under the daemon: the
 * daemon's reads of the ring find zero pages, not a crash; the session ends
 * cleanly and other clients are served. */
static void test_ring_shrunk(void **state)
{
    rnh_daemon *d = *state;
    rnr_ring g;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(5);

    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(rnr_ring_open(&g, d->endpoint, 4, 4096), 0);
    assert_int_equal(ftruncate(g.fd, 0), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 4, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    check(&l, "beside a shrunk ring");
    assert_int_equal(simple(&g, RN_OP_RING_CLOSE, g.ring), 0);
    rnr_ring_close(&g);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, WAIT_MS), 0);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* The surviving client after kills: n checked calls, then its close frees
 * every region; the test passes. */
static void serve_then_close(rnh_daemon *d, rn_client *c, laid *l, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        rnv_poison(&l->a);
        assert_int_equal(rn_rmsnorm_bwd_host(c, &l->a, NULL), 0);
        check(l, what);
    }
    unlay(c, l);
    rn_close(c);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

/* kill -9 of clients with slots pending: one whose slots wait for a ready
 * word that never comes, one busy in a loop.  The daemon cancels and
 * releases everything of theirs; another client goes on undisturbed. */
static void test_kill9(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc stall, busy;
    char line[256];
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(4);

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 3, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    const char *sargv[] = {"prog_fastring", "stall", d->endpoint, "5", NULL};
    const char *bargv[] = {"prog_fastring", "loop", d->endpoint, NULL};
    assert_int_equal(rnh_spawn("prog_fastring", sargv, false, &stall), 0);
    assert_int_equal(rnh_spawn("prog_fastring", bargv, false, &busy), 0);
    assert_true(rnh_read_line(&stall, line, sizeof line, WAIT_MS) > 0);
    assert_string_equal(line, "published");
    assert_true(rnh_read_line(&busy, line, sizeof line, WAIT_MS) > 0);
    assert_string_equal(line, "running");
    /* The stalled client's five slots are taken and wait for ready. */
    assert_int_equal(rnh_wait_stat_ge(d, "inflight.current", 5, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 3);
    kill(stall.pid, SIGKILL);
    kill(busy.pid, SIGKILL);
    assert_int_equal(rnh_wait(&stall, WAIT_MS), 128 + SIGKILL);
    assert_int_equal(rnh_wait(&busy, WAIT_MS), 128 + SIGKILL);
    rnh_proc_close(&stall);
    rnh_proc_close(&busy);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    assert_int_equal(rnh_stat(d, "clients.died"), 2);
    assert_int_equal(rnh_stat(d, "regions.active"), 2);   /* this client's buffer and ring */
    serve_then_close(d, c, &l, 20, "after the kills");
}

/* A session whose channel closed with its client alive (a client that
 * only closed the connection, or one the daemon ended for not reading its
 * replies) ends as a dead client's: its slots are cancelled.  Once nothing
 * of the ring runs any more the daemon writes state = 1, so that such a
 * client, watching the state word, knows when its streams may go on without
 * a kernel of the daemon's still writing its memory (before, the word
 * stayed open and the client could only wait out its watcher's 10 s). */
static void test_channel_closed_state(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    int64_t t0;

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 11);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    (void)rnr_ring_publish(&r.g, &r.b, NULL, false); /* its ready never comes */
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    close(r.g.chan);
    r.g.chan = -1;
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, WAIT_MS), 0);
    for (t0 = rnh_now_ms(); rnr_ring_state(&r.g) != RNP_RING_CLOSED;)
        if (rnh_now_ms() - t0 > WAIT_MS)
            fail_msg("the ring's state stayed open after the session ended");
        else
            usleep(1000);
    assert_int_equal(rnh_stat(d, "clients.died"), 1);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, WAIT_MS), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* A client that lives through daemon crashes: ring memory a daemon may
 * still hold is not reused for the next session, but memory whose daemon
 * exited (its pidfd) or closed the ring (state = 1) is, or is freed; so the
 * client keeps one or two ring memfds, not one per crash (before: one
 * more each time, until rn_close). */
static void test_ring_memory_reclaimed(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = mixed_case(4);
    rn_client *c;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 5, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kill(d->pid, SIGKILL), 0);
        assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
        assert_int_equal(rnh_start(d), 0);
        int rv = -1;
        for (int t = 0; t < 3 && rv != 0; t++) {
            rnv_poison(&l.a);
            rv = rn_rmsnorm_bwd_host(c, &l.a, NULL); /* (the first may say: lost) */
        }
        if (rv != 0)
            fail_msg("after crash %d: %s", i, rn_last_error(c));
        check(&l, "after a crash");
    }
    int maps = rnh_maps_count(getpid(), "rmsnormd-ring");
    if (maps > 2)
        fail_msg("%d ring memfds mapped after 5 crashes", maps);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* SIGTERM with a ring open: the slot that ran keeps its result, the slot
 * still waiting for ready is answered DRAINING, done reaches it, the ring is
 * closed, and the daemon exits 0. */
static void test_sigterm(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[RNP_MAX_ERRMSG];

    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 9);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    assert_true(rnp_seq_reached(rnr_ring_done(&r.g), s2));
    assert_int_equal(rnr_ring_status(&r.g, s1, msg, sizeof msg), 0);
    assert_int_equal(rnr_ring_status(&r.g, s2, msg, sizeof msg), RN_DRAINING);
    /* (host: the slot left for its ready word was taken by the drain's end
     * of the session; the ring still closed before the daemon exited) */
    assert_int_equal(rnr_ring_state(&r.g), RNP_RING_CLOSED);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* The same three with --ring-ready=host: the slot stays in the ring until
 * its ready word comes, and the end of the session or the daemon still
 * answers it. */
/* A call left in its ring for its inputs keeps its session, as a request
 * on the GPU does: not ended for being idle (--idle-timeout 1, waited 2.5
 * s), and answered once ready comes. */
static void test_waiting_slot_keeps_session(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[400];

    rnh_arg(d, "--ring-ready=host");
    rnh_arg(d, "--idle-timeout");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 31);
    uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    usleep(2500000);
    assert_int_equal(rnh_stat(d, "sessions.expired"), 0);
    assert_int_equal(rnh_stat(d, "sessions.active"), 1);
    rnr_ring_ready(&r.g, seq);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, seq, NULL, 0), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("after the wait: %s", msg);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_ready_late_host(void **state)
{
    RNH_NEED_READY_MODE((rnh_daemon *)*state, "host");
    host_ready = true;
    test_ready_late(state);
    host_ready = false;
}

/* The daemon started with flag (mode), a client c of ours with one call
 * made, and prog_fastring's "stall": five slots published whose ready
 * never comes.  look(d) looks at the daemon while they wait; then the
 * stalled client is killed (-9) and its session and regions are gone.
 * Returns c (laid out in l) for the test to go on with. */
static rn_client *stall_then_kill(rnh_daemon *d, laid *l, void (*look)(rnh_daemon *d))
{
    rnh_proc stall;
    char line[256];
    rnv_case k = mixed_case(4);

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 3, l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l->a, NULL), 0);
    const char *sargv[] = {"prog_fastring", "stall", d->endpoint, "5", NULL};
    assert_int_equal(rnh_spawn("prog_fastring", sargv, false, &stall), 0);
    assert_true(rnh_read_line(&stall, line, sizeof line, WAIT_MS) > 0);
    assert_string_equal(line, "published");
    look(d);
    kill(stall.pid, SIGKILL);
    assert_int_equal(rnh_wait(&stall, WAIT_MS), 128 + SIGKILL);
    rnh_proc_close(&stall);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 2, WAIT_MS), 0);
    return c;
}

static void prepared_not_in_flight(rnh_daemon *d)
{
    assert_int_equal(rnh_wait_stat(d, "fast.prepared", 1, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "inflight.current"), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 3); /* ours: buffer, ring; its: one */
}

/* kill -9 of a client whose slot was prepared while it waited for ready
 * (its regions pinned, nothing counted in flight): the daemon drops the
 * prepared slot with the ring, releases the client's regions, and serves
 * another client undisturbed. */
static void test_kill9_prepared(void **state)
{
    rnh_daemon *d = *state;
    laid l;

    RNH_NEED_READY_MODE(d, "host");
    rn_client *c = stall_then_kill(d, &l, prepared_not_in_flight);
    assert_int_equal(rnh_stat(d, "fast.slots"), 1);
    serve_then_close(d, c, &l, 5, "after the kill");
}

static void test_bye_pending_host(void **state)
{
    rnh_arg(*state, "--ring-ready=host");
    test_bye_pending(state);
}

static void test_sigterm_host(void **state)
{
    rnh_arg(*state, "--ring-ready=host");
    test_sigterm(state);
}

static void test_channel_closed_state_host(void **state)
{
    rnh_arg(*state, "--ring-ready=host");
    test_channel_closed_state(state);
}

/* ---- --ring-ready=armed (daemon/ring_arm.c) -------------------------------------------- */

/* A slot published without its ready word is taken at once, armed (in
 * flight, fast.armed), and computes only after ready, on the inputs as
 * they are then: garbage until just before. */
static void test_armed_late(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[400];

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 81);
    size_t n = rnv_bytes(&r.k);
    uint8_t *saved = malloc(n);
    memcpy(saved, r.g.data, n);
    memset(r.g.data, 0x7f, n); /* NaNs in every dtype */
    uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "inflight.current"), 1);
    usleep(50000);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    memcpy(r.g.data, saved, n);
    free(saved);
    rnr_ring_ready(&r.g, seq);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, seq, NULL, 0), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("armed: %s", msg);
    assert_int_equal(rnh_stat(d, "fast.revoked"), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Seq of r, published unarmed and left for its ready word: ready comes, it
 * runs once with the expected results, and fast.armed is still `armed`. */
static void runs_once_ready(rnh_daemon *d, raw_case *r, uint64_t seq, int64_t armed,
                            const char *what)
{
    char msg[400];

    rnr_ring_ready(&r->g, seq);
    assert_int_equal(rnr_ring_wait(&r->g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r->g, seq, NULL, 0), 0);
    if (rnv_compare(&r->a, &r->e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s: %s", what, msg);
    assert_int_equal(rnh_stat(d, "fast.armed"), armed);
}

/* A ring opened without go (RING_OPEN's go unset: its client writes no go
 * word) is never armed: its slot waits for ready in the ring, as in host
 * mode, and runs once ready comes. */
static void test_armed_needs_go(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open_go(d, &r, 4, 84, false);
    uint64_t seq = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat_ge(d, "fast.ready_waits", 1, WAIT_MS), 0);
    usleep(20000);
    assert_int_equal(rnh_stat(d, "fast.armed"), 0);
    assert_int_equal(rnh_stat(d, "inflight.current"), 0);
    runs_once_ready(d, &r, seq, 0, "not armed");
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* A client that writes the daemon's bit of its ready word (PROTOCOL.md 13.3:
 * bit 62 is the daemon's): its armed call's wait passes, its gate finds the
 * client's ready below it, and no revocation took it back: it does not run
 * and is answered RN_INVALID_ARGUMENT naming the ready word, done moves
 * past it, and the ring is not armed again (its next call waits for ready
 * in the ring and runs). */
static void test_armed_ready_bit(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[400];

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 4, 85);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    rnv_poison(&r.a);
    __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), RNP_RING_READY_RAISED,
                     __ATOMIC_RELEASE);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "ready word"));
    assert_int_equal(((const uint8_t *)r.a.dx)[0], 0xA5); /* (rnv_poison's) */
    assert_int_equal(rnh_wait_stat(d, "fast.errors", 1, WAIT_MS), 0);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat_ge(d, "fast.ready_waits", 1, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.armed"), 1);
    runs_once_ready(d, &r, s2, 1, "after the bit");
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Another client's call takes the armed slot back (revoked): that call is
 * answered at once, the armed one only once its ready word comes, on the
 * inputs as they are then, and exactly once; the ring arms again once the
 * revoked job is gone and it is alone. */
static void test_armed_revoked(void **state)
{
    rnh_daemon *d = *state;
    raw_case r, o;
    char msg[400];

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 82);
    raw_open(d, &o, 8, 83);
    size_t n = rnv_bytes(&r.k);
    uint8_t *saved = malloc(n);
    memcpy(saved, r.g.data, n);
    memset(r.g.data, 0x7f, n);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    rnv_poison(&o.a);
    uint64_t t1 = rnr_ring_publish(&o.g, &o.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&o.g, t1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&o.g, t1, NULL, 0), 0);
    if (rnv_compare(&o.a, &o.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("the other client's call: %s", msg);
    assert_int_equal(rnh_wait_stat(d, "fast.revoked", 1, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.revokes"), 1);
    /* Back in the ring, left for its ready word (the skip released). */
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat_ge(d, "fast.ready_waits", 1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    /* (the daemon's bit of ready cleared at the thaw: the client's 0 again) */
    assert_int_equal(__atomic_load_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), __ATOMIC_ACQUIRE), 0);
    memcpy(r.g.data, saved, n);
    rnr_ring_ready(&r.g, s1);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("the revoked call: %s", msg);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 2, WAIT_MS), 0);
    /* Alone again: the next slot is armed. */
    rnv_poison(&r.a);
    memset(r.g.data, 0x7f, n);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 2, WAIT_MS), 0);
    memcpy(r.g.data, saved, n);
    rnr_ring_ready(&r.g, s2);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("armed again: %s", msg);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 3, WAIT_MS), 0);
    free(saved);
    rnv_expect_fini(&r.e);
    rnv_expect_fini(&o.e);
    rnr_ring_close(&r.g);
    rnr_ring_close(&o.g);
    RNH_PASS(d);
}

/* A revoked call still queued (the one worker is held by a large classic
 * call meanwhile, and the policy is free: the ring arms beside it), the
 * ring taking nothing until the revoked job ended:
 *   - its ready and go come while it is queued: it runs once, as the
 *     revoked job (its gate open by then) or taken again after it;
 *   - lower: the client's stream writes ready again (a late write of an
 *     earlier call's), which clears the daemon's bit: the doorbell thread
 *     sets it back while the ring is frozen, so the revoked job still ends
 *     (skipped, taken back) once the worker is free, and the call runs once
 *     after its ready.
 * The call works in place (dx over dy): a second run would read its own dx
 * as dy. */
typedef struct big_call {
    rn_client *c;
    laid l;
    int rc;
    int64_t end_ms;
} big_call;

static void *big_call_main(void *arg)
{
    big_call *bc = arg;
    bc->rc = rn_rmsnorm_bwd_host(bc->c, &bc->l.a, NULL);
    bc->end_ms = rnh_now_ms();
    return NULL;
}

/* The daemon armed with one worker and the policy free, r's ring of 8
 * slots for a small mixed call (seed; in place: dx over dy, so that a
 * second run would read its own dx as dy), and bc's large classic call of
 * another client holding the worker, in flight when this returns. */
static void held_worker(rnh_daemon *d, raw_case *r, big_call *bc, pthread_t *th, uint64_t seed,
                        bool inplace)
{
    char msg[400];
    rnv_case k = {.m = 4096, .n = 4096, .x = RN_DTYPE_F32, .dy = RN_DTYPE_F32,
                  .dx = RN_DTYPE_F32, .eps = 1e-6f};

    RNH_NEED_READY_MODE(d, "armed");
    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    setenv("RMSNORMD_DEBUG_ARM_POLICY", "free", 1);
    int started = rnh_start(d);
    unsetenv("RMSNORMD_DEBUG_ARM_POLICY");
    assert_int_equal(started, 0);
    memset(r, 0, sizeof *r);
    r->k = mixed_case(3);
    r->k.m = 48, r->k.n = 300;
    if (inplace)
        r->k.dres = RN_DTYPE_NONE, r->k.inplace = true;
    assert_int_equal(rnr_ring_open(&r->g, d->endpoint, 8, rnv_bytes(&r->k) + 4096), 0);
    rnv_setup(&r->k, r->g.data, seed, &r->a);
    rnr_ring_req(&r->g, &r->a, &r->b);
    if (rnv_expect_init(&r->e, &r->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
    bc->c = client_on(d, RN_PATH_CLASSIC);
    lay(bc->c, &k, 5, &bc->l);
    assert_int_equal(pthread_create(th, NULL, big_call_main, bc), 0);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 1, WAIT_MS), 0);
}

/* Another session maps memory: the armed calls are taken back (their
 * skips queued behind the large call).  Its client, and *buf to free. */
static rn_client *map_elsewhere(rnh_daemon *d, void **buf)
{
    rn_client *m = client_on(d, RN_PATH_CLASSIC);
    *buf = NULL;
    if (rn_buffer_alloc(m, 1 << 16, buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(m));
    assert_int_equal(rnh_wait_stat(d, "fast.revokes", 1, WAIT_MS), 0);
    return m;
}

/* The end of a held_worker test: nothing in flight, ok calls answered on the
 * fast path, and everything closed. */
static void held_end(rnh_daemon *d, raw_case *r, big_call *bc, rn_client *m, void *buf,
                     int64_t ok)
{
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.ok"), ok);
    assert_int_equal(rn_buffer_free(m, buf), 0);
    rn_close(m);
    unlay(bc->c, &bc->l);
    rn_close(bc->c);
    rnv_expect_fini(&r->e);
    rnr_ring_close(&r->g);
    RNH_PASS(d);
}

static void armed_frozen(void **state, bool lower)
{
    rnh_daemon *d = *state;
    raw_case r;
    big_call bc = {0};
    pthread_t th;
    char msg[400];

    held_worker(d, &r, &bc, &th, 88, true);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    void *buf;
    rn_client *m = map_elsewhere(d, &buf); /* (s1 taken back) */
    if (lower) {
        __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), 0, __ATOMIC_RELEASE);
        pthread_join(th, NULL);
        assert_int_equal(rnh_wait_stat(d, "fast.revoked", 1, WAIT_MS), 0);
        assert_int_equal(rnh_wait_stat_ge(d, "fast.ready_waits", 1, WAIT_MS), 0);
        assert_int_equal(rnr_ring_done(&r.g), 0);
    }
    int64_t ready_ms = rnh_now_ms();
    rnr_ring_ready(&r.g, s1);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    if (!lower)
        pthread_join(th, NULL);
    assert_int_equal(bc.rc, 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("the call taken back, then run: %s", msg);
    check(&bc.l, "the large call");
    if (!lower)
        printf("armed frozen: the large call ended %lld ms after ready was written%s; "
               "fast.revoked %lld\n", (long long)(bc.end_ms - ready_ms),
               bc.end_ms > ready_ms ? "" : " (too soon: this run shows nothing)",
               (long long)rnh_stat(d, "fast.revoked"));
    held_end(d, &r, &bc, m, buf, 1);
}

static void test_armed_frozen(void **state)
{
    armed_frozen(state, false);
}

static void test_armed_bit_cleared(void **state)
{
    armed_frozen(state, true);
}

/* A client whose ready goes back (PROTOCOL.md 13.3 forbids it) after a
 * slot whose ready had come was taken behind an armed one (the one worker
 * held by a large classic call, the policy free): that slot is armed too,
 * so a revocation then takes both back, neither runs nor moves done, and
 * each runs once when ready comes.  (Taken ungated, the second ran past the
 * first's skip, done went to 2, and the thaw took it again: three runs.) */
static void test_armed_ready_back(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    big_call bc = {0};
    pthread_t th;
    char msg[400];

    held_worker(d, &r, &bc, &th, 89, false);
    rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 3, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.armed"), 2);
    __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), 0, __ATOMIC_RELEASE);
    void *buf;
    rn_client *m = map_elsewhere(d, &buf);
    pthread_join(th, NULL);
    assert_int_equal(bc.rc, 0);
    assert_int_equal(rnh_wait_stat(d, "fast.revoked", 2, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    assert_int_equal(rnh_stat(d, "fast.ok"), 0);
    rnv_poison(&r.a);
    rnr_ring_ready(&r.g, s2);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    for (uint64_t q = 1; q <= s2; q++)
        assert_int_equal(rnr_ring_status(&r.g, q, NULL, 0), 0);
    if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("after ready came again: %s", msg);
    held_end(d, &r, &bc, m, buf, 2);
}

/* RING_CLOSE takes an armed call back into the ring (a closed ring leaves
 * the doorbell thread's list, past any revocation): the ring stays until
 * the revoked job ended, takes the slot again, answers it once its ready
 * word comes, and closes. */
static void test_armed_ring_close(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 87);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.revoked", 1, WAIT_MS), 0);
    usleep(20000);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    rnr_ring_ready(&r.g, s1);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(wait_state_closed(&r.g), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* An armed ring's session ends (BYE) while its armed call waits in the
 * backend's queue behind a long call of the same ring: the revocation
 * freezes the ring, and when the revoked job is released the thaw takes the
 * slot again, which the backend refuses (the revoked job was its second,
 * --debug-fail-after 2: it failed).  That refusal's release came inside the
 * revoked job's own release, which had just emptied the session's running
 * queue: it freed the session, and the outer release used it and freed it
 * again (a double free, found in review: the daemon aborted).  Now the
 * daemon drains and exits 2 in order, the long call answered first.
 *
 * The long call takes 50-500 ms of the worker (more under ASan): a round
 * where it ended before the BYE was answered (the test's thread paused on
 * a loaded host) did not set the case up, and runs again with a fresh
 * daemon, up to ROUNDS times (it once failed so in CI-like load). */
static void test_armed_thaw_refused(void **state)
{
    rnh_daemon *d = *state;
    enum { ROUNDS = 4 };
    rnr_ring g;
    rnp_bwd_req big, small;
    const uint64_t m = 8192;
    const uint32_t n = 4096;
    const size_t t = (size_t)m * n * 2;

    RNH_NEED_READY_MODE(d, "armed");
    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    rnh_arg(d, "--debug-fail-after");
    rnh_arg(d, "2");
    for (int round = 1;; round++) {
        assert_int_equal(rnh_start(d), 0);
        assert_int_equal(rnr_ring_open(&g, d->endpoint, 4, 3 * t + 4096), 0);
        /* bf16 x and dy all ones (no zeros, no NaNs) */
        for (size_t i = 0; i < 2 * (size_t)m * n; i++)
            ((uint16_t *)g.data)[i] = 0x3f80;
        memset(&big, 0, sizeof big);
        big.m = m, big.n = n, big.eps = 1e-6f, big.ready_slot = -1;
        big.x_dtype = big.dy_dtype = big.dx_dtype = RN_DTYPE_BF16;
        big.x.region.id = big.dy.region.id = big.dx.region.id = g.region;
        big.x.offset = (uint64_t)(g.data - g.mem);
        big.dy.offset = big.x.offset + t;
        big.dx.offset = big.x.offset + 2 * t;
        big.x.stride = big.dy.stride = big.dx.stride = n;
        small = big;
        small.m = 64, small.n = 64, small.x.stride = small.dy.stride = small.dx.stride = 64;
        uint64_t s1 = rnr_ring_publish(&g, &big, NULL, true);
        usleep(20000); /* on the worker */
        rnr_ring_publish(&g, &small, NULL, false); /* armed, queued behind it */
        assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
        assert_int_equal(simple(&g, RN_OP_BYE, 0), 0);
        if (rnr_ring_done(&g) == 0) {
            assert_int_equal(rnh_wait_exit(d, 4 * WAIT_MS), 2);
            assert_int_equal(rnr_ring_status(&g, s1, NULL, 0), 0);
            assert_int_equal(rnr_ring_done(&g), s1);
            rnr_ring_close(&g);
            break;
        }
        printf("round %d: the long call ended before the session did: the case was not set "
               "up\n", round);
        if (round == ROUNDS)
            fail_msg("the long call ended before the session did in all %d rounds", ROUNDS);
        rnh_stop(d, RNH_STOP_TIMEOUT_MS); /* (whatever its status: not this case) */
        rnr_ring_close(&g);
    }
    RNH_PASS(d);
}

/* A client's ready word with its top bit set (no seq has it: PROTOCOL.md
 * 13.3) when a call would be armed: no armed wait ended then, the daemon's
 * bit or not, so a revocation held the ring frozen for good: SIGTERM never
 * drained, a BYE never closed the ring (found in review).  Now such a
 * call is not armed, and a revocation clears the bit. */
static void ready_top_bit(rnh_daemon *d, bool bye, bool late)
{
    uint64_t *ready;
    raw_case r;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 92);
    ready = rnp_ring_u64(r.g.mem, RNP_RING_O_READY);
    if (!late) /* (set before the slot: it is not armed) */
        __atomic_store_n(ready, (1ull << 63) | 1, __ATOMIC_RELEASE);
    rnr_ring_publish(&r.g, &r.b, NULL, false);
    if (late) { /* (set once the call is armed: the revocation clears it) */
        assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
        __atomic_store_n(ready, (1ull << 63) | 1, __ATOMIC_RELEASE);
    }
    /* (taken armed, as it was, or left in the ring for its ready) */
    for (int64_t t0 = rnh_now_ms();
         rnh_stat(d, "fast.armed") + rnh_stat(d, "fast.ready_waits") < 1; usleep(1000))
        if (rnh_now_ms() - t0 > WAIT_MS)
            fail_msg("the slot was neither armed nor left for its ready");
    printf("armed %lld, left for its ready %lld\n", (long long)rnh_stat(d, "fast.armed"),
           (long long)rnh_stat(d, "fast.ready_waits"));
    if (bye) {
        assert_int_equal(simple(&r.g, RN_OP_BYE, 0), 0);
        assert_int_equal(wait_state_closed(&r.g), 0);
    }
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_armed_ready_top_bit_term(void **state)
{
    ready_top_bit(*state, false, false);
}

static void test_armed_ready_top_bit_bye(void **state)
{
    ready_top_bit(*state, true, false);
}

static void test_armed_ready_top_bit_late_term(void **state)
{
    ready_top_bit(*state, false, true);
}

static void test_armed_ready_top_bit_late_bye(void **state)
{
    ready_top_bit(*state, true, true);
}

/* An armed call ended, the next taken ungated ran, then the client's ready
 * went back (PROTOCOL.md 13.3 forbids it) and a revocation came with
 * nothing in flight to take back: the thaw took the second slot again, and
 * it ran twice (RING_CLOSE) or got a second answer (BYE) (found in
 * review).  Each slot has one answer. */
static void thaw_nothing_back(rnh_daemon *d, bool bye)
{
    raw_case r;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 91);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    rnr_ring_ready(&r.g, s1);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 2, WAIT_MS), 0);
    __atomic_store_n(rnp_ring_u64(r.g.mem, RNP_RING_O_READY), 0, __ATOMIC_RELEASE);
    if (bye) {
        assert_int_equal(simple(&r.g, RN_OP_BYE, 0), 0);
        assert_int_equal(wait_state_closed(&r.g), 0);
    } else {
        assert_int_equal(simple(&r.g, RN_OP_RING_CLOSE, r.g.ring), 0);
        rnr_ring_ready(&r.g, s2);
        assert_int_equal(wait_state_closed(&r.g), 0);
    }
    assert_int_equal(rnr_ring_status(&r.g, s2, NULL, 0), 0);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.ok"), 2);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

static void test_armed_thaw_nothing_back_close(void **state)
{
    thaw_nothing_back(*state, false);
}

static void test_armed_thaw_nothing_back_bye(void **state)
{
    thaw_nothing_back(*state, true);
}

/* A slot armed and then refused at a limit (--max-inflight 1, behind an
 * armed call) is not counted as armed: once ready has come for both, it is
 * taken ungated (the ring's armed mark stayed on it, so it was taken armed
 * and gated with nothing armed before it, and a revocation meanwhile would
 * have frozen the ring for nothing; found in review). */
static void test_armed_refused_at_limit(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;

    RNH_NEED_READY_MODE(d, "armed");
    rnh_arg(d, "--max-inflight");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 94);
    rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat_ge(d, "fast.deferred", 1, WAIT_MS), 0);
    rnr_ring_ready(&r.g, s2);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s2, NULL, 0), 0);
    assert_int_equal(rnh_stat(d, "fast.armed"), 1);
    assert_int_equal(rnh_stat(d, "fast.revokes"), 0);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Another client mapping memory (REGISTER: the backend's mapping calls may
 * wait for the device) takes the armed call back first; the call then runs
 * once its ready word comes. */
static void test_armed_revoked_by_map(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    void *buf = NULL;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 86);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    rn_client *c = client_on(d, RN_PATH_CLASSIC);
    assert_int_equal(rnh_stat(d, "fast.revoked"), 0); /* (a session alone maps nothing) */
    if (rn_buffer_alloc(c, 1 << 16, &buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    assert_int_equal(rnh_wait_stat(d, "fast.revoked", 1, WAIT_MS), 0);
    rnr_ring_ready(&r.g, s1);
    assert_int_equal(rnr_ring_wait(&r.g, s1, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(rn_buffer_free(c, buf), 0);
    rn_close(c);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Armed calls count in flight while their inputs have not come: a classic
 * call that finds the daemon's limit full of them takes them back first
 * (they wait in the ring again, out of the limits), so it runs at once;
 * before, it was refused (RN_BUSY) for as long as the armed client's
 * inputs stayed away, then once while the taken-back calls' skips ran. */
static void test_armed_classic_limit(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    laid l;
    rnv_case k = mixed_case(4);

    RNH_NEED_READY_MODE(d, "armed");
    rnh_arg(d, "--max-inflight-total");
    rnh_arg(d, "2");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 85);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    uint64_t s2 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 2, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "inflight.current"), 2);
    rn_client *c = client_on(d, RN_PATH_CLASSIC);
    lay(c, &k, 4, &l);
    rnv_poison(&l.a);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("the classic call: %s", rn_last_error(c));
    check(&l, "the classic call");
    assert_true(rnh_stat(d, "fast.revoked") >= 1);
    rnr_ring_ready(&r.g, s2);
    assert_int_equal(rnr_ring_wait(&r.g, s2, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(rnr_ring_status(&r.g, s2, NULL, 0), 0);
    unlay(c, &l);
    rn_close(c);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* An invalid slot after an armed one cannot be gated (its answer is no
 * kernel's): it waits for its ready word in the ring, so that done never
 * passes the armed slot early.  One ready for all three: each gets its own
 * answer, in order. */
static void test_armed_invalid_after(void **state)
{
    rnh_daemon *d = *state;
    raw_case r;
    char msg[RNP_MAX_ERRMSG];
    uint8_t desc[RNP_RING_DESC];

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 84);
    rnv_poison(&r.a);
    uint64_t s1 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    rnp_ring_encode(&r.b, r.g.seq + 1, desc);
    rnp_le32_put(desc + RNP_SLOT_O_N, 0);
    uint64_t s2 = rnr_ring_publish(&r.g, NULL, desc, false);
    uint64_t s3 = rnr_ring_publish(&r.g, &r.b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.armed", 1, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat_ge(d, "fast.ready_waits", 1, WAIT_MS), 0);
    usleep(50000);
    assert_int_equal(rnh_stat(d, "inflight.current"), 1);
    assert_int_equal(rnr_ring_done(&r.g), 0);
    rnr_ring_ready(&r.g, s3);
    assert_int_equal(rnr_ring_wait(&r.g, s3, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, s1, NULL, 0), 0);
    assert_int_equal(rnr_ring_status(&r.g, s2, msg, sizeof msg), RN_INVALID_ARGUMENT);
    if (!strstr(msg, "bwd.n"))
        fail_msg("slot 2's message: %s", msg);
    assert_int_equal(rnr_ring_status(&r.g, s3, NULL, 0), 0);
    char cmp[400];
    if (rnv_compare(&r.a, &r.e, true, NULL, cmp, sizeof cmp) != 0)
        fail_msg("after the three: %s", cmp);
    assert_int_equal(rnh_stat(d, "fast.ok"), 2);
    rnv_expect_fini(&r.e);
    rnr_ring_close(&r.g);
    RNH_PASS(d);
}

/* Another client calling all along while this one's inputs come late, at
 * random (0-1.5 ms after the slot, one or two slots at a time): its calls
 * and this one's armed calls take each other's turns, arming and revoking.
 * Every call answered once, in order, with results computed on the inputs
 * of ready's time (garbage before), none lost.  Counts in the log. */
typedef struct armed_peer {
    raw_case *o;
    int calls, bad;
    volatile bool stop;
    char why[400];
} armed_peer;

static void *armed_peer_main(void *arg)
{
    armed_peer *p = arg;
    char msg[300];

    while (!p->stop) {
        rnv_poison(&p->o->a);
        uint64_t t = rnr_ring_publish(&p->o->g, &p->o->b, NULL, true);
        if (rnr_ring_wait(&p->o->g, t, WAIT_MS) != 0 || rnr_ring_status(&p->o->g, t, NULL, 0) != 0 ||
            rnv_compare(&p->o->a, &p->o->e, true, NULL, msg, sizeof msg) != 0) {
            snprintf(p->why, sizeof p->why, "peer call %llu: %s", (unsigned long long)t, msg);
            p->bad++;
            break;
        }
        p->calls++;
        usleep(150);
    }
    return NULL;
}

static void test_armed_stress(void **state)
{
    rnh_daemon *d = *state;
    raw_case r, o;
    armed_peer p = {0};
    pthread_t th;
    char msg[400];
    unsigned rs = 12345;

    RNH_NEED_READY_MODE(d, "armed");
    assert_int_equal(rnh_start(d), 0);
    raw_open(d, &r, 8, 91);
    raw_open(d, &o, 8, 92);
    size_t n = rnv_bytes(&r.k);
    uint8_t *saved = malloc(n);
    memcpy(saved, r.g.data, n);
    p.o = &o;
    assert_int_equal(pthread_create(&th, NULL, armed_peer_main, &p), 0);
    int calls = 0;
    for (int i = 0; i < 300 && !p.bad; i++) {
        memset(r.g.data, 0x7f, n); /* garbage in, poison out, until ready */
        uint64_t s = rnr_ring_publish(&r.g, &r.b, NULL, false);
        if (i % 3 == 0)
            s = rnr_ring_publish(&r.g, &r.b, NULL, false);
        usleep(rand_r(&rs) % 1500);
        if (rnr_ring_done(&r.g) != s - (i % 3 == 0 ? 2 : 1))
            fail_msg("call %d: done %llu before its ready", i, (unsigned long long)rnr_ring_done(&r.g));
        memcpy(r.g.data, saved, n);
        rnr_ring_ready(&r.g, s);
        assert_int_equal(rnr_ring_wait(&r.g, s, WAIT_MS), 0);
        assert_int_equal(rnr_ring_status(&r.g, s, NULL, 0), 0);
        if (i % 3 == 0)
            assert_int_equal(rnr_ring_status(&r.g, s - 1, NULL, 0), 0);
        if (rnv_compare(&r.a, &r.e, true, NULL, msg, sizeof msg) != 0)
            fail_msg("call %d (slot %llu): %s", i, (unsigned long long)s, msg);
        calls += i % 3 == 0 ? 2 : 1;
    }
    p.stop = true;
    pthread_join(th, NULL);
    if (p.bad)
        fail_msg("%s", p.why);
    int64_t armed = rnh_stat(d, "fast.armed"), revoked = rnh_stat(d, "fast.revoked");
    printf("armed stress: %d + %d calls; fast.armed %lld, fast.revoked %lld, fast.revokes %lld\n",
           calls, p.calls, (long long)armed, (long long)revoked,
           (long long)rnh_stat(d, "fast.revokes"));
    assert_int_equal(rnh_wait_stat(d, "fast.ok", calls + p.calls, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "fast.errors"), 0);
    assert_true(armed >= 1);
    free(saved);
    rnv_expect_fini(&r.e);
    rnv_expect_fini(&o.e);
    rnr_ring_close(&r.g);
    rnr_ring_close(&o.g);
    RNH_PASS(d);
}

/* kill -9 of a client whose slots are armed: their waits are ended (a
 * revocation) and they skip, cancelled, nothing of them is answered, its
 * regions go, and another client is served undisturbed. */
static void armed_in_flight(rnh_daemon *d)
{
    assert_int_equal(rnh_wait_stat_ge(d, "fast.armed", 1, WAIT_MS), 0);
    assert_true(rnh_stat(d, "inflight.current") >= 1);
}

static void test_armed_kill9(void **state)
{
    rnh_daemon *d = *state;
    laid l;

    RNH_NEED_READY_MODE(d, "armed");
    rn_client *c = stall_then_kill(d, &l, armed_in_flight);
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 0, WAIT_MS), 0);
    assert_true(rnh_stat(d, "fast.revokes") >= 1);
    serve_then_close(d, c, &l, 10, "after the kill");
}

/* The daemon ends an idle session, ring and all: the next call opens a new
 * session and a new ring, and runs there. */
static void test_session_expired(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(2);

    rnh_arg(d, "--idle-timeout");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 21, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.expired", 1, WAIT_MS), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.rings", 0, WAIT_MS), 0);
    rnv_poison(&l.a);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("after the session expired: %s", rn_last_error(c));
    check(&l, "after the session expired");
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    /* Counted when the daemon's worker has finished with the slot, which
     * can be just after the client saw done. */
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 2, WAIT_MS), 0);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* rn_close in a fork child, of its parent's client (a child does not use
 * it; closing the copy frees it): the child returns at once, and the
 * parent's session, ring and buffers live on.  Before, the child sent BYE,
 * which ended the parent's session, and then hung in nanomsg. */
static void test_close_in_fork_child(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(3);
    int status = 0;

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 23, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0); /* (its ring is open) */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        rn_close(c);
        _exit(0);
    }
    pid_t got = 0;
    for (int i = 0; i < 1000 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++)
        usleep(10000);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("rn_close in the fork child did not return within 10 s");
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(rnh_stat(d, "sessions.active"), 1);
    rnv_poison(&l.a);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("the parent's call after the child's rn_close: %s", rn_last_error(c));
    check(&l, "after the child's rn_close");
    assert_int_equal(rnh_stat(d, "fast.rings"), 1);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* Calls that finished before the daemon restarted are not reported lost:
 * the client reads their answers before it opens its ring in the new
 * session.  Before, the next call failed with RESTARTED "calls 1..2 ...
 * outputs are undefined" and did not run. */
static void test_finished_not_lost(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    laid l;
    rnv_case k = mixed_case(2);

    assert_int_equal(rnh_start(d), 0);
    c = client_on(d, RN_PATH_FAST);
    lay(c, &k, 29, &l);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &l.a), 0);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &l.a), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 2, WAIT_MS), 0);
    usleep(100000); /* (done written before fast.ok counts) */
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    assert_int_equal(rnh_start(d), 0);
    /* A call that opens the new session before the ring's next call. */
    void *other;
    assert_int_equal(rn_buffer_alloc(c, 4096, &other), 0);
    rnv_poison(&l.a);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("the call after a restart: %s", rn_last_error(c));
    check(&l, "after the restart");
    assert_int_equal(rn_check(c), 0);
    assert_int_equal(rn_buffer_free(c, other), 0);
    unlay(c, &l);
    rn_close(c);
    RNH_PASS(d);
}

/* Which path a client takes: the option, else RMSNORMD_PATH, else auto;
 * HELLO says the CPU backend offers both. */
static void test_path_choice(void **state)
{
    rnh_daemon *d = *state;
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c = NULL;
    static rnp_request q;
    static rnp_reply rep;

    assert_int_equal(rnh_start(d), 0);
    o.endpoint = d->endpoint;
    unsetenv("RMSNORMD_PATH");
    assert_int_equal(rn_connect(&o, &c), 0);
    assert_int_equal(rn_client_path(c), RN_PATH_AUTO);
    rn_close(c);
    setenv("RMSNORMD_PATH", "classic", 1);
    assert_int_equal(rn_connect(&o, &c), 0);
    assert_int_equal(rn_client_path(c), RN_PATH_CLASSIC);
    rn_close(c);
    setenv("RMSNORMD_PATH", "fast", 1);
    assert_int_equal(rn_connect(&o, &c), 0);
    assert_int_equal(rn_client_path(c), RN_PATH_FAST);
    rn_close(c);
    /* A caller built against 0.1's header (no path field) gets the
     * environment's choice. */
    rn_connect_opts old = o;
    old.struct_size = offsetof(rn_connect_opts, path);
    old.path = 12345;   /* beyond its struct: never read */
    assert_int_equal(rn_connect(&old, &c), 0);
    assert_int_equal(rn_client_path(c), RN_PATH_FAST);
    rn_close(c);
    o.path = RN_PATH_CLASSIC;   /* the option wins */
    assert_int_equal(rn_connect(&o, &c), 0);
    assert_int_equal(rn_client_path(c), RN_PATH_CLASSIC);
    rn_close(c);
    o.path = RN_PATH_DEFAULT;
    setenv("RMSNORMD_PATH", "quick", 1);
    assert_int_equal(rn_connect(&o, &c), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(rn_last_error(NULL), "RMSNORMD_PATH"));
    unsetenv("RMSNORMD_PATH");
    o.path = 7;
    assert_int_equal(rn_connect(&o, &c), RN_INVALID_ARGUMENT);
    o.path = RN_PATH_DEFAULT;
    /* Where a CUDA stream waits for done: device (the default) or host. */
    setenv("RMSNORMD_DONE_WORD", "host", 1);
    assert_int_equal(rn_connect(&o, &c), 0);
    rn_close(c);
    setenv("RMSNORMD_DONE_WORD", "gpu", 1);
    assert_int_equal(rn_connect(&o, &c), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(rn_last_error(NULL), "RMSNORMD_DONE_WORD: 'gpu'"));
    unsetenv("RMSNORMD_DONE_WORD");

    int s = rnr_open(d->endpoint);
    assert_true(s >= 0);
    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION, q.op = RN_OP_HELLO, q.id = 1;
    snprintf(q.u.hello.client_name, sizeof q.u.hello.client_name, "paths");
    q.u.hello.pid = (uint32_t)getpid();
    assert_int_equal(rnr_call(s, &q, &rep), 0);
    assert_int_equal(rep.status, 0);
    assert_int_equal(rep.u.hello.paths, RNP_PATH_CLASSIC | RNP_PATH_FAST);
    rnr_close(s);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_results, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_auto_host_calls_classic, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_two_clients, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_errors_surface, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ready_late, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_rings_take_turns, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_loop_polls, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_loop_polls_off, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bad_slots, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_open_close, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_prod_garbage, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bye_pending, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_backend_fails, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_close_at_queue_limit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_close_waits_within_limits, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bye_at_queue_limit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_backend_fails_waiting, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_thaw_refused, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_top_bit_term, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_top_bit_bye, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_top_bit_late_term, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_top_bit_late_bye, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_thaw_nothing_back_close, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_thaw_nothing_back_bye, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_shrunk, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kill9, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_sigterm, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_channel_closed_state, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_memory_reclaimed, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_waiting_slot_keeps_session, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ready_late_host, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kill9_prepared, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_late, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_needs_go, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_bit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_revoked, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_invalid_after, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ring_close, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_refused_at_limit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_frozen, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_bit_cleared, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_ready_back, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_revoked_by_map, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_classic_limit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_kill9, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_armed_stress, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bye_pending_host, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_host, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_channel_closed_state_host, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_session_expired, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_path_choice, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_in_fork_child, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_finished_not_lost, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_errors_accumulate, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_slots_env, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_slots_daemon_dies, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_not_starved, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_reopen_waits, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stopped_fails_fast, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_died_fails_fast, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stopped_fails_fast_classic, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_died_fails_fast_classic, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_uid_inflight_limit, rnh_setup, rnh_teardown),
    };
    /* RN_TESTS=pattern runs only those (cmocka's wildcards), as in the GPU
     * suites, e.g. 'test_armed_*'. */
    if (getenv("RN_TESTS"))
        cmocka_set_test_filter(getenv("RN_TESTS"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
