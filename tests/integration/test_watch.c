/* SPDX-License-Identifier: MIT */
/*
 * test_watch - libclient's daemon watcher (client/watch.c) against a real
 * daemon on the CPU backend, killed with kill -9.  The waits that only the
 * watcher can end are played by threads of the test, as a GPU would: one
 * waits for the ring's done word (cuStreamWaitValue64 of a stream-ordered
 * call, whose ready the fake stream holds back, so the daemon took the call
 * and waits), one runs a graph replay (the kick's steps, then the wait for
 * the graph slot's done) while the daemon is stopped.  No libclient call is
 * made between the kill and the end of the wait, which must come within
 * 2 s.  Then the loss is reported once (rn_check, or the next call after a
 * restart), rn_close joins the thread (its "rn-watch" thread is gone), and
 * the ASan run sees no leak.  Also: a drain's answer is kept, not replaced
 * by the watcher's; a live daemon's idle end is seen and reported as
 * nothing lost; a host rn_sync blocked in another thread ends; rn_close
 * after the death sends no BYE; and RMSNORMD_WATCH=0 starts no thread (the
 * next call releases, as before).
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"
#include "integration/fakedev.h"
#include "integration/harness.h"
#include "rmsnormctl_verify.h"
#include "rn_ring.h"

#define WAIT_MS 20000
/* A wait released by the watcher ends within this after the kill. */
#define RELEASE_MS 2000

/* ---- the fake device side (fakedev.h): ready held back on request, graphs by hand ---- */

static int call(rn_client *c, const rn_bwd_args *a, rnt_fake *s)
{
    return rnc_bwd_ring_dev(c, a, &rnc_host_mapper, NULL, &rnt_fake_dev, s);
}

/* ---- waits played by threads --------------------------------------------------------------- */

typedef struct waiter {
    pthread_t th;
    uint64_t at;   /* a ring (its done word) or a graph slot (a replay) */
    uint64_t want; /* ring: done >= want */
    bool replay;   /* the kick's steps first (test_graph_dev's replay) */
    bool kicked;   /* the replay's gen moved */
    bool released; /* the wait ended (else it gave up after WAIT_MS) */
    int64_t end_ms;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    uint64_t *done = rnt_w64(w->at, w->replay ? RNP_GSLOT_O_DONE : RNP_RING_O_DONE);

    if (w->replay) {
        uint32_t *closed = (uint32_t *)(uintptr_t)(w->at + RNP_GSLOT_O_CLOSED);
        uint64_t *gen = rnt_w64(w->at, RNP_GSLOT_O_GEN);
        if (__atomic_load_n(closed, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(done, 1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(done, 0, __ATOMIC_SEQ_CST);
            __atomic_store_n(gen, __atomic_load_n(gen, __ATOMIC_RELAXED) + 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(closed, __ATOMIC_SEQ_CST))
                __atomic_store_n(done, 1, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&w->kicked, true, __ATOMIC_SEQ_CST);
    }
    int64_t t0 = rnh_now_ms();
    while (!rnp_seq_reached(__atomic_load_n(done, __ATOMIC_ACQUIRE), w->want)) {
        if (rnh_now_ms() - t0 > WAIT_MS)
            return NULL;
        usleep(200);
    }
    w->end_ms = rnh_now_ms();
    __atomic_store_n(&w->released, true, __ATOMIC_SEQ_CST);
    return NULL;
}

static void wait_start(waiter *w, uint64_t at, uint64_t want, bool replay)
{
    memset(w, 0, sizeof *w);
    w->at = at;
    w->want = want;
    w->replay = replay;
    assert_int_equal(pthread_create(&w->th, NULL, wait_main, w), 0);
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* Threads of this process named "rn-watch". */
static int watchers(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        char p[300], comm[32] = "";
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f) && strncmp(comm, "rn-watch", 8) == 0)
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* Watchers left after rn_close joined its thread. pthread_join returns once
 * the kernel clears the thread's tid, a moment before the thread leaves
 * /proc/self/task, so a joined watcher may still be listed briefly: wait up
 * to RELEASE_MS for the list to empty. */
static int watchers_after_close(void)
{
    int64_t t0 = rnh_now_ms();
    int n;

    while ((n = watchers()) != 0 && rnh_now_ms() - t0 < RELEASE_MS)
        usleep(1000);
    return n;
}

static rn_client *fast_client(const rnh_daemon *d)
{
    rn_client *c = rnh_client_with(d, RN_PATH_FAST, 3000);
    if (!c)
        fail_msg("rn_connect: %s", rn_last_error(NULL));
    return c;
}

typedef struct laid {
    void *buf;
    rn_bwd_args a;
    rnv_case k;
} laid;

static void lay(rn_client *c, int i, laid *l)
{
    memset(l, 0, sizeof *l);
    l->k.m = 7;
    l->k.n = 100 + i;
    l->k.x = l->k.dy = l->k.dx = RN_DTYPE_F32;
    l->k.w = l->k.dw = RN_DTYPE_F32;
    l->k.rstd = true;
    l->k.eps = 1e-6f;
    if (rn_buffer_alloc(c, rnv_bytes(&l->k), &l->buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    rnv_setup(&l->k, l->buf, 0x7a7c + (uint64_t)i, &l->a);
}

/* Run a and check it against the reference (the client and daemon live). */
static void run_checked(rn_client *c, laid *l, rnt_fake *s, const char *what)
{
    rnv_expect e;
    char msg[400];

    rnv_setup(&l->k, l->buf, 0x1234, &l->a);
    if (rnv_expect_init(&e, &l->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
    int rv = call(c, &l->a, s);
    if (rv == RN_RESTARTED || rv == RN_UNKNOWN_SESSION) /* a loss reported once */
        rv = call(c, &l->a, s);
    if (rv != 0 || (rv = rn_sync(c)) != 0)
        fail_msg("%s: %s: %s", what, rn_err_name(rv), rn_last_error(c));
    if (rnv_compare(&l->a, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s: %s", what, msg);
    rnv_expect_fini(&e);
}

static void kill9(rnh_daemon *d)
{
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
}

/* The wait ended, within RELEASE_MS of t_kill. */
static void assert_released(waiter *w, int64_t t_kill, const char *what)
{
    assert_int_equal(pthread_join(w->th, NULL), 0);
    if (!w->released)
        fail_msg("%s: still waiting %d ms after the daemon's death", what, WAIT_MS);
    printf("%s: released %lld ms after the signal\n", what, (long long)(w->end_ms - t_kill));
    assert_true(w->end_ms - t_kill < RELEASE_MS);
}

/* ---- the tests ------------------------------------------------------------------------------ */

/* A stream's wait for a call the daemon took (its ready held back): the
 * daemon dies, the watcher lets done go with no call of ours; the slot
 * says why; rn_check reports the loss once; after a restart the next call
 * runs in a new session on fresh ring memory; rn_close joins the thread. */
static void test_stream_wait_released(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.defer = true};
    waiter w;
    laid l;
    char msg[RNP_MAX_ERRMSG];

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 0, &l);
    assert_int_equal(watchers(), 0);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(watchers(), 1);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0); /* with the daemon */
    uint64_t ring = s.base;
    wait_start(&w, ring, 1, false);
    int64_t t_kill = rnh_now_ms();
    kill9(d);
    assert_released(&w, t_kill, "the stream's wait");
    /* The watcher's answer: status, then done (call 1's slot is slot 1 at
     * any depth). */
    uint8_t *slot1 = (uint8_t *)(uintptr_t)ring + rnp_ring_slot_off(1, 1024);
    assert_int_equal(rnp_ring_get_result(slot1, msg, sizeof msg), RN_RESTARTED);
    assert_non_null(strstr(msg, "the daemon exited"));
    assert_int_equal(rn_check(c), RN_RESTARTED);
    printf("rn_check: %s\n", rn_last_error(c));
    assert_non_null(strstr(rn_last_error(c), "calls 1..1"));
    assert_non_null(strstr(rn_last_error(c), "the daemon exited"));
    assert_int_equal(rn_check(c), 0); /* once */
    assert_int_equal(rnh_start(d), 0);
    s.defer = false;
    run_checked(c, &l, &s, "after the restart");
    assert_true(s.base != ring); /* streams may still wait on the old memory */
    assert_int_equal(watchers(), 1);
    assert_int_equal(rn_buffer_free(c, l.buf), 0);
    rn_close(c);
    assert_int_equal(watchers_after_close(), 0);
    RNH_PASS(d);
}

/* The next call after a restart reports the loss (nothing else did). */
static void test_next_call_reports(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.defer = true};
    waiter w;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 1, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    wait_start(&w, s.base, 1, false);
    int64_t t_kill = rnh_now_ms();
    kill9(d);
    assert_released(&w, t_kill, "the stream's wait");
    assert_int_equal(rnh_start(d), 0);
    s.defer = false;
    int rv = call(c, &l.a, &s);
    printf("the next call: %s: %s\n", rn_err_name(rv), rn_last_error(c));
    assert_int_equal(rv, RN_RESTARTED);
    assert_non_null(strstr(rn_last_error(c), "the daemon exited"));
    assert_int_equal(call(c, &l.a, &s), 0); /* reported once; this one runs */
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rn_buffer_free(c, l.buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* A graph replay begun while the daemon is stopped (it cannot take it),
 * then the daemon killed: the replay's wait ends; a later replay waits for
 * nothing; rn_check says the graphs must be captured again. */
static void test_replay_wait_released(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    waiter w;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 2, &l);
    run_checked(c, &l, &s, "eager"); /* the ring is set up outside the capture */
    s.capturing = true;
    if (call(c, &l.a, &s) != 0)
        fail_msg("capture: %s", rn_last_error(c));
    s.capturing = false;
    wait_start(&w, s.slot, 1, true); /* a replay with the daemon alive */
    assert_int_equal(pthread_join(w.th, NULL), 0);
    assert_true(w.released);
    assert_int_equal(rn_check(c), 0);

    assert_int_equal(rnh_sigstop(d), 0);
    wait_start(&w, s.slot, 1, true);
    int64_t t0 = rnh_now_ms();
    while (!__atomic_load_n(&w.kicked, __ATOMIC_SEQ_CST) && rnh_now_ms() - t0 < WAIT_MS)
        usleep(1000);
    assert_true(w.kicked);
    assert_false(__atomic_load_n(&w.released, __ATOMIC_SEQ_CST));
    int64_t t_kill = rnh_now_ms();
    kill9(d);
    assert_released(&w, t_kill, "the replay's wait");
    wait_start(&w, s.slot, 1, true); /* after the end: closed, waits for nothing */
    assert_released(&w, rnh_now_ms(), "a replay after the end");
    assert_int_equal(rn_check(c), RN_RESTARTED);
    printf("rn_check: %s\n", rn_last_error(c));
    assert_non_null(strstr(rn_last_error(c), "graph"));
    assert_int_equal(rn_check(c), 0);
    s.gone(s.arg);
    assert_int_equal(rn_buffer_free(c, l.buf), 0);
    rn_close(c);
    assert_int_equal(watchers_after_close(), 0);
    RNH_PASS(d);
}

/* SIGTERM with a call waiting for its producer: the daemon answers it
 * RN_DRAINING and exits; that answer is what the client reports, not the
 * watcher's. */
static void test_drain_answer_kept(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.defer = true};
    waiter w;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 3, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    wait_start(&w, s.base, 1, false);
    int64_t t0 = rnh_now_ms();
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    assert_released(&w, t0, "the stream's wait in the drain");
    int64_t t1 = rnh_now_ms();
    while (rnc_watch_fired(c) == RNC_WATCH_QUIET && rnh_now_ms() - t1 < WAIT_MS)
        usleep(1000);
    assert_int_not_equal(rnc_watch_fired(c), RNC_WATCH_QUIET);
    assert_int_equal(rn_check(c), RN_DRAINING);
    printf("rn_check: %s\n", rn_last_error(c));
    assert_int_equal(rn_check(c), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* The daemon ends an idle session: the watcher sees it (the ring closed),
 * nothing was lost, and the next call runs in a new session without an
 * error. */
static void test_idle_end_quiet(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l;

    rnh_arg(d, "--idle-timeout");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 4, &l);
    run_checked(c, &l, &s, "before the idle end");
    assert_int_equal(rnh_wait_stat(d, "sessions.expired", 1, WAIT_MS), 0);
    int64_t t0 = rnh_now_ms();
    while (rnc_watch_fired(c) == RNC_WATCH_QUIET && rnh_now_ms() - t0 < WAIT_MS)
        usleep(1000);
    assert_int_equal(rnc_watch_fired(c), RNC_WATCH_ENDED);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rnc_watch_fired(c), RNC_WATCH_QUIET); /* armed anew */
    assert_int_equal(rn_buffer_free(c, l.buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

typedef struct syncer {
    rn_client *c;
    int rv;
    int64_t end_ms;
} syncer;

static void *sync_main(void *arg)
{
    syncer *y = arg;
    y->rv = rn_sync(y->c);
    y->end_ms = rnh_now_ms();
    return NULL;
}

/* A host call in flight with the daemon stopped, rn_sync in another
 * thread (blocked in it, or entering it after the kill: either way it must
 * end); kill -9: rn_sync ends with the loss. */
static void test_host_sync_released(void **state)
{
    rnh_daemon *d = *state;
    syncer y = {0};
    pthread_t th;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 5, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    assert_int_equal(rn_rmsnorm_bwd_host_async(c, &l.a), 0);
    y.c = c;
    assert_int_equal(pthread_create(&th, NULL, sync_main, &y), 0);
    int64_t t_kill = rnh_now_ms();
    kill9(d);
    assert_int_equal(pthread_join(th, NULL), 0);
    printf("rn_sync: %s after %lld ms: %s\n", rn_err_name(y.rv), (long long)(y.end_ms - t_kill),
           rn_last_error(c));
    assert_int_equal(y.rv, RN_RESTARTED);
    assert_true(y.end_ms - t_kill < RELEASE_MS);
    assert_int_equal(rn_check(c), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* RMSNORMD_WATCH=0: no thread; done stays until the next call releases it. */
static void test_watch_off(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.defer = true};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    setenv("RMSNORMD_WATCH", "0", 1);
    rn_client *c = fast_client(d);
    unsetenv("RMSNORMD_WATCH");
    lay(c, 6, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(watchers(), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    kill9(d);
    assert_int_equal(__atomic_load_n(rnt_w64(s.base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE), 0);
    assert_int_equal(rn_sync(c), RN_RESTARTED);
    assert_true(__atomic_load_n(rnt_w64(s.base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE) >= 1);
    rn_close(c);
    RNH_PASS(d);
}

/* The daemon dies and the client closes without another call: rn_close
 * sends no BYE to the dead daemon (it would wait for it) and joins the
 * thread. */
static void test_close_after_death(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.defer = true};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 10, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    kill9(d);
    int64_t t0 = rnh_now_ms();
    while (rnc_watch_fired(c) == RNC_WATCH_QUIET && rnh_now_ms() - t0 < WAIT_MS)
        usleep(1000);
    /* EXITED where the daemon's pidfd could be had (SILENT otherwise). */
    printf("the watcher: %s\n", rnc_watch_why(rnc_watch_fired(c)));
    assert_int_not_equal(rnc_watch_fired(c), RNC_WATCH_QUIET);
    t0 = rnh_now_ms();
    rn_close(c);
    printf("rn_close took %lld ms\n", (long long)(rnh_now_ms() - t0));
    assert_true(rnh_now_ms() - t0 < 1000);
    assert_int_equal(watchers_after_close(), 0);
    RNH_PASS(d);
}

/* Clients come and go: each watcher starts with its ring and is joined at
 * rn_close (ASan: nothing leaks). */
static void test_close_joins(void **state)
{
    rnh_daemon *d = *state;

    assert_int_equal(rnh_start(d), 0);
    for (int i = 0; i < 20; i++) {
        rnt_fake s = {0};
        laid l;
        rn_client *c = fast_client(d);
        lay(c, 7 + i % 3, &l);
        run_checked(c, &l, &s, "churn");
        assert_int_equal(watchers(), 1);
        assert_int_equal(rn_buffer_free(c, l.buf), 0);
        rn_close(c);
        assert_int_equal(watchers_after_close(), 0);
    }
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_wait_released, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_next_call_reports, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_replay_wait_released, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_drain_answer_kept, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_idle_end_quiet, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_host_sync_released, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_watch_off, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_after_death, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_joins, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
