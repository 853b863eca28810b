/* SPDX-License-Identifier: MIT */
/*
 * test_late_open - libclient when the daemon answers RING_OPEN or
 * GRAPH_OPEN too late (after the client's timeout), against a real daemon
 * on the CPU backend: the daemon is stopped (SIGSTOP) for exactly that
 * request, which this program catches by wrapping libclient's rnc_transact
 * at link time (the Makefile links it with -Wl,--wrap=rnc_transact).  The
 * daemon may have opened the ring or graph slot all the same; the client
 * must not be stuck with it.  Before (found in review): every later call of
 * that session was refused ("the session has a ring open"), each one
 * registering the ring's memory again, and every later capture reused the
 * graph slot the daemon held ("overlaps graph 1").
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"
#include "integration/fakedev.h"
#include "integration/harness.h"
#include "rmsnormctl_verify.h"

#define WAIT_MS 20000
#define TIMEOUT_MS 500

/* The daemon to stop, and the request it is stopped for (0: none). */
static const rnh_daemon *stall_d;
static uint32_t stall_op;

int __real_rnc_transact(rn_client *c, int timeout_ms);

/* The request op stall_op, once: the daemon stopped while the client
 * waits its timeout, then let go on. */
int __wrap_rnc_transact(rn_client *c, int timeout_ms);
int __wrap_rnc_transact(rn_client *c, int timeout_ms)
{
    if (!stall_op || c->req.op != stall_op)
        return __real_rnc_transact(c, timeout_ms);
    stall_op = 0;
    if (kill(stall_d->pid, SIGSTOP) != 0)
        return __real_rnc_transact(c, timeout_ms);
    int rv = __real_rnc_transact(c, timeout_ms);
    kill(stall_d->pid, SIGCONT);
    return rv;
}

static rn_client *fast_client(const rnh_daemon *d)
{
    rn_connect_opts o = {.struct_size = sizeof o, .endpoint = d->endpoint,
                         .timeout_ms = TIMEOUT_MS, .client_name = "late_open",
                         .path = RN_PATH_FAST};
    rn_client *c = NULL;
    if (rn_connect(&o, &c) != 0)
        fail_msg("rn_connect: %s", rn_last_error(NULL));
    return c;
}

typedef struct laid {
    void *buf;
    rn_bwd_args a;
    rnv_expect e;
} laid;

static void lay(rn_client *c, uint64_t seed, laid *l)
{
    rnv_case k = {0};
    char msg[300];

    k.m = 9, k.n = 200;
    k.x = k.dy = k.dx = RN_DTYPE_BF16;
    k.w = k.dw = RN_DTYPE_F32;
    k.rstd = true;
    k.eps = 1e-6f;
    memset(l, 0, sizeof *l);
    if (rn_buffer_alloc(c, rnv_bytes(&k), &l->buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    rnv_setup(&k, l->buf, seed, &l->a);
    if (rnv_expect_init(&l->e, &l->a, 0, msg, sizeof msg) != 0)
        fail_msg("expectation: %s", msg);
}

static void check_free(rn_client *c, laid *l, const char *what)
{
    char msg[400];
    if (rnv_compare(&l->a, &l->e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s: %s", what, msg);
    rnv_expect_fini(&l->e);
    assert_int_equal(rn_buffer_free(c, l->buf), 0);
}

static int call(rn_client *c, const rn_bwd_args *a, rnt_fake *s)
{
    return rnc_bwd_ring_dev(c, a, &rnc_host_mapper, NULL, &rnt_fake_dev, s);
}

/* The first call's RING_OPEN goes unanswered: that call times out, the
 * session ends, and the next calls run in a new one, with one ring (no
 * registration left behind per call). */
static void test_ring_open_unanswered(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 31, &l);
    stall_d = d;
    stall_op = RN_OP_RING_OPEN;
    assert_int_equal(call(c, &l.a, &s), RN_TIMEOUT);
    assert_int_equal(stall_op, 0); /* (it was RING_OPEN that timed out) */
    for (int i = 0; i < 3; i++) {
        int rv = call(c, &l.a, &s);
        if (rv != 0)
            fail_msg("call %d after the unanswered RING_OPEN: %s", i, rn_last_error(c));
        assert_int_equal(rn_sync(c), 0);
    }
    assert_int_equal(rnh_stat(d, "sessions.active"), 1);
    /* the buffer and the ring */
    assert_int_equal(rnh_stat(d, "regions.active"), 2);
    check_free(c, &l, "after the unanswered RING_OPEN");
    rn_close(c);
    RNH_PASS(d);
}

/* A capture's GRAPH_OPEN goes unanswered: that call times out, and later
 * captures take other graph slots (the daemon may hold that one), each
 * registered and replayed. */
static void test_graph_open_unanswered(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l, l2;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay(c, 32, &l);
    lay(c, 33, &l2);
    assert_int_equal(call(c, &l.a, &s), 0); /* (the ring opens) */
    assert_int_equal(rn_sync(c), 0);
    s.capturing = true;
    stall_d = d;
    stall_op = RN_OP_GRAPH_OPEN;
    assert_int_equal(call(c, &l.a, &s), RN_TIMEOUT);
    assert_int_equal(stall_op, 0);
    /* The daemon opened the slot once it ran again. */
    assert_int_equal(rnh_wait_stat(d, "fast.graphs", 1, WAIT_MS), 0);
    /* (other calls: the same call again would be taken for GRAPH_OPEN's
     * retry, which the daemon answers with the graph it opened) */
    for (int i = 0; i < 3; i++) {
        int rv = call(c, &l2.a, &s);
        if (rv != 0)
            fail_msg("capture %d after the unanswered GRAPH_OPEN: %s", i, rn_last_error(c));
        s.gone(s.arg); /* the graph destroyed, as CUDA calls it (its slot back next call) */
    }
    assert_int_equal(s.graphs, 3);
    s.capturing = false;
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    check_free(c, &l, "after the unanswered GRAPH_OPEN");
    rnv_expect_fini(&l2.e); /* (captured, never replayed) */
    assert_int_equal(rnh_stat(d, "fast.graphs"), 1); /* (the one the daemon holds) */
    assert_int_equal(rn_buffer_free(c, l2.buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ring_open_unanswered, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_open_unanswered, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
