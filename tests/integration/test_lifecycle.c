/* SPDX-License-Identifier: MIT */
/*
 * test_lifecycle - the daemon's life around its clients: a restart under a
 * running client, SIGTERM with requests in flight, a backend that fails with
 * requests in flight (exit 2, every request answered), and a duplicate
 * (session, seq) that must run once.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/raw.h"
#include "rmsnormctl_verify.h"

/* A client whose buffer holds one case, with its expectation. */
typedef struct live {
    rn_client *c;
    void *buf;
    rn_bwd_args a;
    rnv_expect e;
} live;

static void live_open(live *l, const rnh_daemon *d, int timeout_ms, uint64_t seed)
{
    rnv_case k = {.m = 37,
                  .n = 300,
                  .x = RN_DTYPE_BF16,
                  .dy = RN_DTYPE_BF16,
                  .dx = RN_DTYPE_BF16,
                  .w = RN_DTYPE_BF16,
                  .dw = RN_DTYPE_F32,
                  .rstd = true,
                  .eps = 1e-6f};
    rn_connect_opts o = {.endpoint = d->endpoint, .timeout_ms = timeout_ms, .client_name = "live"};
    char msg[300];
    memset(l, 0, sizeof *l);
    assert_int_equal(rn_connect(&o, &l->c), 0);
    assert_int_equal(rn_buffer_alloc(l->c, rnv_bytes(&k), &l->buf), 0);
    rnv_setup(&k, l->buf, seed, &l->a);
    assert_int_equal(rnv_expect_init(&l->e, &l->a, 1, msg, sizeof msg), 0);
}

/* One verified call; returns its status. */
static int live_call(live *l)
{
    char msg[300];
    int rv;
    rnv_poison(&l->a);
    rv = rn_rmsnorm_bwd_host(l->c, &l->a, NULL);
    if (rv == 0 && rnv_compare(&l->a, &l->e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("wrong result: %s", msg);
    if (rv != 0)
        printf("call: %s (%s)\n", rn_last_error(l->c), rn_err_name(rv));
    return rv;
}

static void live_close(live *l)
{
    rnv_expect_fini(&l->e);
    rn_close(l->c);
}

/* A daemon restart under a running client: the client's next call opens a
 * new session, registers its buffer again and succeeds. */
static void test_restart(void **state)
{
    rnh_daemon *d = *state;
    live l;
    int64_t t0;

    assert_int_equal(rnh_start(d), 0);
    live_open(&l, d, 1500, 7);
    assert_int_equal(live_call(&l), 0);

    /* Restart while the client is idle: the next call just works. */
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(live_call(&l), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    /* The old session's channel had closed with its daemon: the call
     * opened a new session before it sent anything (before, its first
     * attempt met the new daemon's UNKNOWN_SESSION, and the retry ran). */
    assert_int_equal(rnh_stat(d, "requests.bwd"), 1);
    assert_int_equal(rnh_stat(d, "errors.UNKNOWN_SESSION"), 0);
    assert_int_equal(rnh_stat(d, "sessions.total") >= 1, 1);

    /* While the daemon is down a call fails after the timeout, saying so
     * (RN_UNREACHABLE; before, RN_TIMEOUT: nanomsg queued the request),
     * and the next one at once. */
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    t0 = rnh_now_ms();
    assert_int_equal(live_call(&l), RN_UNREACHABLE);
    assert_true(rnh_now_ms() - t0 < 10000);
    assert_non_null(strstr(rn_last_error(l.c), d->endpoint));
    t0 = rnh_now_ms();
    assert_int_equal(live_call(&l), RN_UNREACHABLE);
    assert_true(rnh_now_ms() - t0 < 1000);
    assert_non_null(strstr(rn_last_error(l.c), d->endpoint));

    /* And once it is back, the next call succeeds again. */
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(live_call(&l), 0);
    assert_int_equal(live_call(&l), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 1);

    /* A buffer allocated now is registered in the new session too. */
    {
        void *more;
        assert_int_equal(rn_buffer_alloc(l.c, 1 << 16, &more), 0);
        assert_int_equal(rnh_stat(d, "regions.active"), 2);
        assert_int_equal(rn_buffer_free(l.c, more), 0);
        assert_int_equal(rnh_stat(d, "regions.active"), 1);
    }
    live_close(&l);
    /* No session is left: the client asking for the count needs none. */
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, 5000), 0);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

/* The daemon killed (-9) and restarted while a client sends a stream of
 * requests: the request in flight is re-sent by the REQ socket to the new
 * daemon, which does not know the session; the library opens a new one,
 * registers again and retries, so not one request fails. */
static void test_restart_kill9(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc w;
    char line[200];
    int64_t before;

    assert_int_equal(rnh_start(d), 0);
    const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "--m",         "64",
                          "--n",         "1024",       "--wait-go", "--until-eof", NULL};
    assert_int_equal(rnh_spawn("prog_worker", argv, false, &w), 0);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "ready");
    assert_int_equal(write(w.in_fd, "g", 1), 1);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "first");
    for (int round = 0; round < 3; round++) {
        kill(d->pid, SIGKILL);
        assert_int_equal(rnh_wait_exit(d, 10000), 128 + SIGKILL);
        assert_int_equal(rnh_start(d), 0);
        /* The worker is back in business on the new daemon. */
        assert_int_equal(rnh_wait_stat(d, "regions.active", 1, 20000), 0);
        before = rnh_stat(d, "requests.bwd");
        assert_int_equal(rnh_wait_stat_ge(d, "requests.bwd", before + 10, 20000), 0);
    }
    close(w.in_fd);
    w.in_fd = -1;
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_non_null(strstr(line, "failed=0 last=OK"));
    assert_int_equal(rnh_wait(&w, 30000), 0);
    rnh_proc_close(&w);
    RNH_PASS(d);
}

/* Names in /dev/shm: a buffer shared by descriptor on the session channel
 * has none from its registration on, so a client that exits without
 * rn_close, or a forked child's exit, leaves nothing behind. */
static void test_shm_names(void **state)
{
    rnh_daemon *d = *state;
    rnh_proc w;
    char line[200], prefix[64];

    assert_int_equal(rnh_start(d), 0);
    {
        const char *argv[] = {"prog_worker",  "--endpoint", d->endpoint,  "-r", "3",
                              "--fork-child", "--wait-go",  "--no-close", NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &w), 0);
    }
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "ready");
    snprintf(prefix, sizeof prefix, "rmsnormd.%d.", (int)w.pid);
    /* The child has exited; the parent's buffer is still there, by
     * descriptor only. */
    assert_int_equal(rnh_shm_count(prefix), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    assert_int_equal(write(w.in_fd, "g", 1), 1);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "first");
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "done ok=3 failed=0 last=OK");
    assert_int_equal(rnh_wait(&w, 30000), 0);
    rnh_proc_close(&w);
    /* Exited without rn_close: the name is gone all the same, and the
     * daemon let go of the region when it saw the process end. */
    assert_int_equal(rnh_shm_count(prefix), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "clients.died", 1, 20000), 0);
    RNH_PASS(d);
}

/* SIGTERM while requests are in flight: every one is answered (and right),
 * new ones are refused with DRAINING, and the daemon exits 0. */
/* k workers with one M x 4096 bf16 request each, started together: all are
 * ready before any sends. */
static void spawn_together(const rnh_daemon *d, rnh_proc *w, int k, const char *m)
{
    char line[200];
    for (int i = 0; i < k; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", i + 1);
        const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "-r",        "1",
                              "--m",         m,            "--n",       "4096",      "--dtype",
                              "bf16",        "--seed",     seed,        "--wait-go", NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &w[i]), 0);
    }
    for (int i = 0; i < k; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ready");
    }
    for (int i = 0; i < k; i++) {
        assert_int_equal(write(w[i].in_fd, "g", 1), 1);
        close(w[i].in_fd);
        w[i].in_fd = -1;
    }
}

static void test_sigterm_drain(void **state)
{
    rnh_daemon *d = *state;
    enum { K = 6 };
    rnh_proc w[K];
    live l;
    char line[200];
    int64_t inflight;

    /* One worker thread, so that the requests queue up in the daemon. */
    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    live_open(&l, d, 10000, 3);
    spawn_together(d, w, K, "1024");
    /* Every request has arrived; most are still queued or running. */
    assert_int_equal(rnh_wait_stat(d, "requests.bwd", K, 30000), 0);
    inflight = rnh_stat(d, "inflight.current");
    printf("in flight at SIGTERM: %lld\n", (long long)inflight);
    assert_true(inflight >= 1);

    kill(d->pid, SIGTERM);
    assert_int_equal(rnh_wait_stopping(d, 10000), 0);
    /* A new request while draining is refused, not queued. */
    assert_int_equal(live_call(&l), RN_DRAINING);
    assert_non_null(strstr(rn_last_error(l.c), ""));

    assert_int_equal(rnh_wait_exit(d, RNH_STOP_TIMEOUT_MS * 3), 0);
    for (int i = 0; i < K; i++) {
        int st;
        assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        if (strcmp(line, "first") == 0)
            assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        assert_string_equal(line, "done ok=1 failed=0 last=OK");
        st = rnh_wait(&w[i], 30000);
        assert_int_equal(st, 0);
        rnh_proc_close(&w[i]);
    }
    live_close(&l);
    RNH_PASS(d);
}

/* A process's state letter (proc(5)), '?' when it cannot be read. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    size_t n;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return '?';
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* Signals once the drain is done, while the core waits for its front to
 * exit: ignored, so the exit is as clean as without them (status 0, the
 * socket file removed).  libuv had given SIGTERM, SIGINT and SIGHUP their
 * default action back, and a second Ctrl-C killed the core there. */
static void test_signals_after_drain(void **state)
{
    rnh_daemon *d = *state;
    char sock[300];
    bool drained = false;

    assert_int_equal(rnh_start(d), 0);
    snprintf(sock, sizeof sock, "%s", d->endpoint + strlen("ipc://"));
    assert_int_equal(access(sock, F_OK), 0);
    kill(d->pid, SIGTERM);
    for (int64_t t0 = rnh_now_ms(); !drained && rnh_now_ms() - t0 < 20000;)
        if (!(drained = rnh_log_count(d, "Drained: ") > 0))
            usleep(500);
    assert_true(drained);
    char st = proc_state(d->pid);
    kill(d->pid, SIGTERM);
    kill(d->pid, SIGINT);
    kill(d->pid, SIGHUP);
    printf("the core's state when signalled: %c%s\n", st,
           st == 'Z' ? " (it had exited already: nothing was checked)" : "");
    assert_int_equal(rnh_wait_exit(d, RNH_STOP_TIMEOUT_MS), 0);
    assert_int_equal(access(sock, F_OK), -1);
    RNH_PASS(d);
}

/*
 * A backend that fails with requests queued (--debug-fail-after: the Kth
 * request fails it as a broken GPU would): every request gets exactly one
 * answer - OK if it finished before the failure, DEVICE_FAILING otherwise -
 * and the daemon drains and exits with status 2, not by a signal.
 */
static void test_backend_failure_answers_all(void **state)
{
    rnh_daemon *d = *state;
    enum { K = 6 };
    rnh_proc w[K];
    char line[200];
    int ok = 0, failing = 0;

    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    rnh_arg(d, "--debug-fail-after");
    rnh_arg(d, "6");
    assert_int_equal(rnh_start(d), 0);
    spawn_together(d, w, K, "2048");
    assert_int_equal(rnh_wait_exit(d, RNH_STOP_TIMEOUT_MS * 3), 2);
    for (int i = 0; i < K; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        if (strcmp(line, "first") == 0)
            assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        printf("worker %d: %s\n", i, line);
        if (strcmp(line, "done ok=1 failed=0 last=OK") == 0)
            ok++;
        else if (strcmp(line, "done ok=0 failed=1 last=DEVICE_FAILING") == 0)
            failing++;
        else
            fail_msg("worker %d: unexpected '%s'", i, line);
        rnh_wait(&w[i], 30000);
        rnh_proc_close(&w[i]);
    }
    /* The sixth request failed the backend, so it at least was pending. */
    assert_int_equal(ok + failing, K);
    assert_true(failing >= 1);
    RNH_PASS(d);
}

/*
 * SIGTERM while clients send back to back: a request that reaches the daemon
 * after the last one in flight finished, just before the socket closes, is
 * answered DRAINING (the drain's grace period and its last read of the
 * queue), not left to the client's timeout.
 */
static void test_drain_answers_late_requests(void **state)
{
    rnh_daemon *d = *state;
    enum { K = 4 };
    rnh_proc w[K];
    char line[200];

    assert_int_equal(rnh_start(d), 0);
    for (int i = 0; i < K; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", i + 1);
        const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "--forever",
                              "--stop-on-error", "--timeout", "5000", "--seed", seed, NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &w[i]), 0);
    }
    for (int i = 0; i < K; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ready");
        assert_true(rnh_read_line(&w[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "first");
    }
    assert_int_equal(rnh_wait_stat_ge(d, "requests.bwd", 200, 30000), 0);
    int64_t t0 = rnh_now_ms();
    kill(d->pid, SIGTERM);
    assert_int_equal(rnh_wait_exit(d, RNH_STOP_TIMEOUT_MS), 0);
    for (int i = 0; i < K; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 30000) >= 0);
        int64_t took = rnh_now_ms() - t0;
        printf("worker %d: %s after %lld ms\n", i, line, (long long)took);
        /* Its last request was refused, not lost: no TIMEOUT (5 s). */
        assert_non_null(strstr(line, "failed=1 last=DRAINING"));
        assert_true(took < 4000);
        rnh_wait(&w[i], 30000);
        rnh_proc_close(&w[i]);
    }
    RNH_PASS(d);
}

/* Build the BWD request of a case laid out in one shm region. */
static void bwd_from_args(rnp_request *q, const rnp_session *s, uint32_t region, const void *base,
                          const rn_bwd_args *a, uint64_t seq)
{
    rnp_bwd_req *b = &q->u.bwd;
    const char *bp = base;
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION;
    q->op = RN_OP_BWD;
    q->id = 1000 + seq;
    b->session = *s;
    b->seq = seq;
    b->m = (uint64_t)a->m;
    b->n = (uint32_t)a->n;
    b->x_dtype = (uint8_t)a->x_dtype;
    b->dy_dtype = (uint8_t)a->dy_dtype;
    b->dx_dtype = (uint8_t)a->dx_dtype;
    b->w_dtype = (uint8_t)a->w_dtype;
    b->dw_dtype = (uint8_t)a->dw_dtype;
    b->x = (rnp_tensor){{region}, (uint64_t)((const char *)a->x - bp), (uint64_t)a->x_stride};
    b->dy = (rnp_tensor){{region}, (uint64_t)((const char *)a->dy - bp), (uint64_t)a->dy_stride};
    b->dx = (rnp_tensor){{region}, (uint64_t)((const char *)a->dx - bp), (uint64_t)a->dx_stride};
    b->has_w = true;
    b->w = (rnp_tensor){{region}, (uint64_t)((const char *)a->w - bp), 0};
    b->has_rstd = true;
    b->rstd = (rnp_tensor){{region}, (uint64_t)((const char *)a->rstd - bp), 0};
    b->has_dw = true;
    b->dw = (rnp_tensor){{region}, (uint64_t)((const char *)a->dw - bp), 0};
    b->eps = a->eps;
    b->ready_slot = -1;
    b->mode = RNP_MODE_SYNC;
}

/* The same (session, seq) twice - what a REQ re-send produces - runs once
 * and is answered from the first result; the same seq with another body is
 * refused with SEQ_REUSED. */
static void test_duplicate_seq(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = {.m = 16,
                  .n = 128,
                  .x = RN_DTYPE_F32,
                  .dy = RN_DTYPE_F32,
                  .dx = RN_DTYPE_F32,
                  .w = RN_DTYPE_F32,
                  .dw = RN_DTYPE_F32,
                  .rstd = true,
                  .eps = 1e-6f};
    static rnp_request q;
    static rnp_reply r;
    rnp_session s;
    rn_bwd_args a;
    rnv_expect e = {0};
    char name[64], msg[300];
    size_t bytes = rnv_bytes(&k);
    uint32_t region = 0;
    void *base;
    int fd, sock;

    /* This test registers shared memory by name on a plain socket, as a
     * client from before the session channel does. */
    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    assert_int_equal(rnh_start(d), 0);
    snprintf(name, sizeof name, "/rn-it.%d.dup", (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(base != MAP_FAILED);
    rnv_setup(&k, base, 5, &a);
    assert_int_equal(rnv_expect_init(&e, &a, 1, msg, sizeof msg), 0);

    sock = rnr_open(d->endpoint);
    assert_true(sock >= 0);
    assert_int_equal(rnr_hello(sock, &s), 0);
    assert_int_equal(rnr_register(sock, &s, name, bytes, &region), 0);

    bwd_from_args(&q, &s, region, base, &a, 1);
    assert_int_equal(rnr_call(sock, &q, &r), 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.u.bwd.seq, 1);
    if (rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("first run: %s", msg);

    /* The duplicate: answered OK with the same seq, but nothing runs, so
     * the poisoned outputs stay poisoned. */
    rnv_poison(&a);
    assert_int_equal(rnr_call(sock, &q, &r), 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.op, RN_OP_BWD);
    assert_int_equal(r.u.bwd.seq, 1);
    assert_false(rnv_equal_twin(&a, &e));
    assert_int_equal(rnh_stat(d, "dup.answered"), 1);

    /* The same seq with another body is not a copy: refused, and nothing
     * runs (the outputs stay poisoned). */
    q.u.bwd.eps = 1e-5f;
    assert_int_equal(rnr_call(sock, &q, &r), 0);
    assert_int_equal(r.status, RN_SEQ_REUSED);
    assert_non_null(strstr(r.error, "bwd.seq"));
    assert_false(rnv_equal_twin(&a, &e));
    assert_int_equal(rnh_stat(d, "dup.answered"), 1);

    /* A new seq runs again. */
    bwd_from_args(&q, &s, region, base, &a, 2);
    assert_int_equal(rnr_call(sock, &q, &r), 0);
    assert_int_equal(r.status, 0);
    assert_true(rnv_equal_twin(&a, &e));
    assert_int_equal(rnh_stat(d, "requests.bwd"), 4);
    assert_int_equal(rnh_stat(d, "dup.answered"), 1);
    {
        rn_client *c = rnh_client(d);
        rn_stats_info *st = calloc(1, sizeof *st);
        assert_non_null(c);
        assert_int_equal(rn_stats(c, st), 0);
        for (unsigned i = 0; i < st->nhists; i++)
            if (strcmp(st->hists[i].name, "compute") == 0)
                assert_int_equal(st->hists[i].count, 2);
        free(st);
        rn_close(c);
    }
    rnr_close(sock);
    rnv_expect_fini(&e);
    munmap(base, bytes);
    shm_unlink(name);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restart, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_restart_kill9, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_shm_names, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_drain, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_signals_after_drain, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_backend_failure_answers_all, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_drain_answers_late_requests, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_seq, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
