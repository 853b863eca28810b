/* SPDX-License-Identifier: MIT */
/*
 * test_graph_dev - graph slots (PROTOCOL.md 13.8) without a GPU: libclient's
 * capture path (rnc_bwd_ring_dev on a stream that says it is being
 * captured) against a real daemon on the CPU backend, with a fake device
 * side whose "graph" the test replays by hand, doing what the replay's
 * kernel does (closed? done = 0, gen + 1, closed again?) and then waiting
 * for done as the captured wait would.  Checked: a captured call registers
 * a graph slot and queues no ready/wait of the ring; every replay, with
 * fresh inputs at the same addresses and random delays, is answered and
 * bitwise equal to the CPU twin (what an eager call computes); a bad call
 * fails at capture with the daemon's message; slots given back by the
 * graphs' destructors are reused (more captures than slots); a replay
 * after the session ended does not wait.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"
#include "integration/fakedev.h"
#include "integration/harness.h"
#include "ring_int.h"
#include "rmsnormctl_verify.h"
#include "rn_ring.h"

#define WAIT_MS 20000



/* One replay of the captured call: the kernel's steps, then the wait. */
static int replay(uint64_t slot)
{
    uint32_t *closed = (uint32_t *)(uintptr_t)(slot + RNP_GSLOT_O_CLOSED);
    uint64_t *done = rnt_w64(slot, RNP_GSLOT_O_DONE), *gen = rnt_w64(slot, RNP_GSLOT_O_GEN);

    if (__atomic_load_n(closed, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(done, 1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(done, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(gen, __atomic_load_n(gen, __ATOMIC_RELAXED) + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(closed, __ATOMIC_SEQ_CST))
            __atomic_store_n(done, 1, __ATOMIC_RELEASE);
    }
    int64_t t0 = rnh_now_ms();
    while (__atomic_load_n(done, __ATOMIC_ACQUIRE) != 1) {
        if (rnh_now_ms() - t0 > WAIT_MS)
            return -1;
        usleep(100);
    }
    return 0;
}

static rn_client *fast_client(const rnh_daemon *d)
{
    rn_client *c = rnh_client_path(d, RN_PATH_FAST);
    if (!c)
        fail_msg("rn_connect on the fast path failed");
    return c;
}

static void lay_case(rnv_case *k, int i)
{
    static const int64_t shapes[][2] = {{1, 1}, {5, 31}, {16, 64}, {7, 1000}};
    memset(k, 0, sizeof *k);
    k->m = shapes[i % 4][0];
    k->n = shapes[i % 4][1];
    k->x = k->dy = k->dx = i % 2 ? RN_DTYPE_BF16 : RN_DTYPE_F32;
    k->w = k->dw = RN_DTYPE_F32;
    k->rstd = true;
    k->eps = 1e-6f;
}

/* The daemon started, a client on the fast path, case i laid out in a
 * buffer of the session (*buf) as *a. */
static rn_client *start_laid(rnh_daemon *d, int i, rn_bwd_args *a, void **buf)
{
    rnv_case k;
    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay_case(&k, i);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), buf), 0);
    rnv_setup(&k, *buf, 1, a);
    return c;
}

static int call(rn_client *c, const rn_bwd_args *a, rnt_fake *s)
{
    return rnc_bwd_ring_dev(c, a, &rnc_host_mapper, NULL, &rnt_fake_dev, s);
}

/* Capture once, replay many times with fresh inputs: bitwise equal to the
 * twin each time. */
static void test_graph_replays(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    rnv_case k;
    rn_bwd_args a, a2;
    void *buf;
    char msg[400];

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay_case(&k, 3);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), &buf), 0);
    rnv_setup(&k, buf, 1, &a);
    s.capturing = true;
    if (call(c, &a, &s) != 0)
        fail_msg("capture: %s", rn_last_error(c));
    s.capturing = false;
    assert_int_equal(s.graphs, 1);
    assert_int_equal(s.writes, 0);
    assert_int_equal(s.waits, 0);
    srand(7);
    for (int r = 0; r < 60; r++) {
        rnv_expect e;
        rnv_setup(&k, buf, 100 + (uint64_t)r, &a2);   /* same addresses, new data */
        assert_memory_equal(&a, &a2, sizeof a);
        assert_int_equal(rnv_expect_init(&e, &a2, 0, msg, sizeof msg), 0);
        if (rand() % 3 == 0)
            usleep((useconds_t)(rand() % 3000));      /* a producer that is late */
        assert_int_equal(replay(s.slot), 0);
        if (rnv_compare(&a2, &e, true, NULL, msg, sizeof msg) != 0)
            fail_msg("replay %d: %s", r, msg);
        rnv_expect_fini(&e);
    }
    assert_int_equal(rn_check(c), 0);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 60, WAIT_MS), 0);
    /* An eager call after the replays, on the same stream: the ring. */
    assert_int_equal(call(c, &a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(s.writes, 1);
    s.gone(s.arg);
    assert_int_equal(rn_buffer_free(c, buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* A bad call fails at capture, naming the field; nothing is held. */
static void test_graph_bad_capture(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.capturing = true};
    rn_bwd_args a;
    void *buf;
    rn_client *c = start_laid(d, 2, &a, &buf);
    rn_bwd_args bad = a;
    bad.m = a.m + 100;   /* past the end of the buffer: only the daemon knows */
    assert_int_equal(call(c, &bad, &s), RN_OUT_OF_BOUNDS);
    assert_non_null(strstr(rn_last_error(c), "bwd."));
    assert_int_equal(s.graphs, 0);
    bad = a;
    bad.eps = -1.0f;
    assert_int_equal(call(c, &bad, &s), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(rn_last_error(c), "eps"));
    assert_int_equal(call(c, &a, &s), 0);
    assert_int_equal(s.graphs, 1);
    assert_int_equal(rn_check(c), 0);
    s.gone(s.arg);
    assert_int_equal(rn_buffer_free(c, buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* A capture that failed before anything went into the graph gives its
 * slot back once the daemon closed it: more such failures than slots, then
 * a capture works (before, each kept its slot until the session ended,
 * and then every capture was refused RN_TOO_LARGE).  One that failed after
 * something went in keeps its slot (a replay may reach it). */
static void test_graph_failed_capture(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.capturing = true, .graph_fail = 1};
    rn_bwd_args a;
    void *buf;
    rn_client *c = start_laid(d, 2, &a, &buf);
    for (unsigned i = 0; i < GRAPH_SLOTS + 20; i++)
        assert_int_equal(call(c, &a, &s), RN_CUDA);
    assert_non_null(strstr(rn_last_error(c), "fake: the graph's start failed"));
    s.graph_fail = 0;
    assert_int_equal(call(c, &a, &s), 0);
    assert_int_equal(s.graphs, 1);
    assert_int_equal(replay(s.slot), 0);
    assert_int_equal(rn_check(c), 0);
    s.gone(s.arg);
    s.graph_fail = 2;
    unsigned kept = 0;
    int rv;
    while ((rv = call(c, &a, &s)) == RN_CUDA && kept <= GRAPH_SLOTS)
        kept++;
    assert_int_equal(rv, RN_TOO_LARGE);
    assert_int_equal(kept, GRAPH_SLOTS);
    assert_int_equal(rn_buffer_free(c, buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* Slots come back when their graphs are destroyed: more captures than
 * slots, each replayed once; then a replay after the session ended does
 * not wait (its slot is closed). */
static void test_graph_gone_and_end(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {.capturing = true};
    rnv_case k;
    rn_bwd_args a;
    void *buf;
    char msg[400];

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = fast_client(d);
    lay_case(&k, 1);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), &buf), 0);
    rnv_setup(&k, buf, 1, &a);
    for (int i = 0; i < 300; i++) {
        if (call(c, &a, &s) != 0)
            fail_msg("capture %d: %s", i, rn_last_error(c));
        assert_int_equal(replay(s.slot), 0);
        if (i < 299)
            s.gone(s.arg);
    }
    rnv_expect e;
    assert_int_equal(rnv_expect_init(&e, &a, 0, msg, sizeof msg), 0);
    assert_int_equal(replay(s.slot), 0);
    if (rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("last replay: %s", msg);
    rnv_expect_fini(&e);
    assert_int_equal(rn_check(c), 0);
    /* The session ends with the graph alive: a replay then waits for
     * nothing (the memory stays mapped for it). */
    uint64_t slot = s.slot;
    assert_int_equal(rn_buffer_free(c, buf), 0);
    rn_close(c);
    int64_t t0 = rnh_now_ms();
    assert_int_equal(replay(slot), 0);
    assert_true(rnh_now_ms() - t0 < 1000);
    /* The graph is destroyed after its client closed: its destructor
     * finds no client and frees what it held (the ASan run checks). */
    s.gone(s.arg);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_graph_replays, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_bad_capture, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_failed_capture, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_gone_and_end, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
