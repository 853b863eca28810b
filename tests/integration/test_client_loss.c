/* SPDX-License-Identifier: MIT */
/*
 * test_client_loss.c - libclient when its daemon goes in ways the watcher
 * thread does not cover (it is off, RMSNORMD_WATCH=0, or could not be
 * armed): the calls still out on the ring are lost, never left for a stream
 * to wait on for good, and the next calls start a session of their own.
 * Each case was found in a review of client/ (stream calls through the fake
 * device of fakedev.c, whose "stream" runs on the host):
 *   - rn_close after a daemon restart: the new daemon refuses the BYE of a
 *     session it never had, and the ring's done stayed where it was;
 *   - rn_close after a classic call found the daemon gone (the HELLO that
 *     followed disarmed the watcher and failed): the same;
 *   - a host call whose ready waits behind stream calls the dead daemon
 *     never answers: it waited its whole timeout, and the loss was never
 *     seen;
 *   - a reply owed on the session channel when the daemon died: the next
 *     call found the channel closed but kept the session, and every call on
 *     the fast path failed RN_UNSUPPORTED ("no session channel");
 *   - a watcher that fired, then could not be armed for the next session
 *     (its dup of the channel failed): the old firing was taken for the new
 *     ring's, and every call failed RN_UNKNOWN_SESSION against a live
 *     daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"
#include "ring_int.h"
#include "rn_ring.h"
#include "integration/fakedev.h"
#include "integration/harness.h"
#include "rmsnormctl_verify.h"

#define WAIT_MS 20000

/* fcntl, wrapped in this link (the Makefile): F_DUPFD_CLOEXEC fails with
 * EMFILE while fail_dup is set (the watcher's duplicate of the channel). */
static volatile int fail_dup;
int __real_fcntl(int fd, int cmd, ...);
int __wrap_fcntl(int fd, int cmd, ...);
int __wrap_fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    if (fail_dup && cmd == F_DUPFD_CLOEXEC) {
        errno = EMFILE;
        return -1;
    }
    return __real_fcntl(fd, cmd, arg);
}

/* One small case in a buffer of c's, with its expectation. */
typedef struct laid {
    void *buf;
    rn_bwd_args a;
    rnv_expect e;
} laid;

static void lay(rn_client *c, laid *l)
{
    rnv_case k = {0};
    char msg[300];
    k.m = 5, k.n = 31;
    k.x = k.dy = k.dx = k.w = k.dw = RN_DTYPE_F32;
    k.rstd = true;
    k.eps = 1e-6f;
    memset(l, 0, sizeof *l);
    if (rn_buffer_alloc(c, rnv_bytes(&k), &l->buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    rnv_setup(&k, l->buf, 0x51ed, &l->a);
    if (rnv_expect_init(&l->e, &l->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
}

static uint64_t ring_word(const uint8_t *base, uint32_t off)
{
    return __atomic_load_n(rnp_ring_u64((uint8_t *)base, off), __ATOMIC_ACQUIRE);
}

/* A client of path on d, with the watcher off. */
static rn_client *unwatched(rnh_daemon *d, int path)
{
    setenv("RMSNORMD_WATCH", "0", 1);
    rn_client *c = rnh_client_path(d, path);
    unsetenv("RMSNORMD_WATCH");
    assert_non_null(c);
    return c;
}

static void kill9(rnh_daemon *d)
{
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
}

/* rn_close after the daemon restarted, a stream call out whose producer
 * still runs: the new daemon refuses the BYE; the call is lost, done
 * raised past it. */
static void test_close_after_restart(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = unwatched(d, RN_PATH_FAST);
    lay(c, &l);
    s.defer = true; /* the producer runs on: the daemon cannot answer */
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    uint8_t *base = c->ring->base;
    kill9(d);
    assert_int_equal(rnh_start(d), 0);
    rn_close(c);
    /* (The ring's memory stays mapped: a stream may still wait there.) */
    assert_int_equal(ring_word(base, RNP_RING_O_DONE), 1);
    rnv_expect_fini(&l.e);
    RNH_PASS(d);
}

/* rn_close after a classic call (RN_PATH_AUTO) found the daemon gone, a
 * stream call out: the same.  (classic false: rn_close alone, which
 * already worked.) */
static void close_after(rnh_daemon *d, bool classic_call)
{
    rnt_fake s = {0};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = unwatched(d, RN_PATH_AUTO);
    lay(c, &l);
    s.defer = true;
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    uint8_t *base = c->ring->base;
    kill9(d);
    c->timeout_ms = 500;
    if (classic_call) {
        int rv = rn_rmsnorm_bwd_host(c, &l.a, NULL);
        printf("the host call after the daemon's death: %s (%s)\n", rn_err_name(rv),
               rn_last_error(c));
        assert_int_not_equal(rv, 0);
    }
    rn_close(c);
    assert_int_equal(ring_word(base, RNP_RING_O_DONE), 1);
    rnv_expect_fini(&l.e);
    RNH_PASS(d);
}

static void test_close_after_classic(void **state)
{
    close_after(*state, true);
}

static void test_close_after_death(void **state)
{
    close_after(*state, false);
}

/* A host call after stream calls, the second's ready queued behind the
 * first's done, the daemon dead: the host call sees the session over, the
 * calls lost (done raised, streams go on), and does not wait its timeout
 * out for a ready that never comes. */
static void test_host_after_stream_dead(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = unwatched(d, RN_PATH_FAST);
    lay(c, &l);
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    s.defer = true; /* the stream: [wait done >= 1][ready = 2]; ready never comes */
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    uint8_t *base = c->ring->base;
    kill9(d); /* (stopped: SIGKILL ends it all the same) */
    c->timeout_ms = 5000;
    int rv = rn_rmsnorm_bwd_host(c, &l.a, NULL);
    printf("the host call: %s (%s)\n", rn_err_name(rv), rn_last_error(c));
    assert_int_not_equal(rv, 0);
    assert_int_not_equal(rv, RN_TIMEOUT);
    assert_true(ring_word(base, RNP_RING_O_DONE) >= 2);
    rnv_expect_fini(&l.e);
    rn_close(c);
    RNH_PASS(d);
}

/* A channel reply owed (a REGISTER_FD that timed out while the daemon was
 * stopped), the daemon killed and started again: the next calls find the
 * channel closed, start a new session and run. */
static void test_owed_then_restart(void **state)
{
    rnh_daemon *d = *state;
    laid l;
    void *p = NULL;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = rnh_client_path(d, RN_PATH_FAST);
    assert_non_null(c);
    lay(c, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0); /* (the ring open) */
    assert_int_equal(rnh_sigstop(d), 0);
    c->timeout_ms = 300;
    assert_int_equal(rn_buffer_alloc(c, 1 << 16, &p), RN_TIMEOUT);
    assert_int_equal(c->chan_nowed, 1);
    kill9(d); /* (stopped: SIGKILL ends it all the same) */
    assert_int_equal(rnh_start(d), 0);
    c->timeout_ms = 10000;
    for (int i = 0; i < 3; i++) {
        int rv = rn_rmsnorm_bwd_host(c, &l.a, NULL);
        if (rv != 0)
            fail_msg("host call %d after the restart: %s (%s)", i, rn_err_name(rv),
                     rn_last_error(c));
    }
    rnv_expect_fini(&l.e);
    rn_close(c);
    RNH_PASS(d);
}

/* The watcher fired (the daemon was killed), and cannot be armed for the
 * next session (its duplicate of the channel fails): the client goes on as
 * one without a watcher, its calls run. */
static void test_arm_fails_after_fire(void **state)
{
    rnh_daemon *d = *state;
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = rnh_client_path(d, RN_PATH_FAST);
    assert_non_null(c);
    lay(c, &l);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l.a, NULL), 0);
    kill9(d);
    for (int i = 0; i < WAIT_MS && !rnc_watch_fired(c); i++)
        usleep(1000);
    assert_int_not_equal(rnc_watch_fired(c), 0);
    assert_int_equal(rnh_start(d), 0);
    fail_dup = 1;
    for (int i = 0; i < 3; i++) {
        int rv = rn_rmsnorm_bwd_host(c, &l.a, NULL);
        if (rv != 0) {
            fail_dup = 0;
            fail_msg("call %d with no watcher: %s (%s)", i, rn_err_name(rv), rn_last_error(c));
        }
    }
    fail_dup = 0;
    assert_int_equal(rnh_stat(d, "sessions.total"), 1);
    rnv_expect_fini(&l.e);
    rn_close(c);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_close_after_restart, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_after_classic, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_after_death, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_host_after_stream_dead, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_owed_then_restart, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_arm_fails_after_fire, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
