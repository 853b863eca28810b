/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_closeq.c - the closer thread's queue (daemon/closeq.c) with
 * fake items in place of CUDA mappings: an item's fence is a flag, its
 * close may block until the test lets it go.  What the cuda backend relies
 * on: a close that blocks holds up the loop nowhere (push returns at once;
 * the items behind it wait for the one thread); an item not ready holds up
 * nobody; the
 * thread holds at most cap items and the rest wait in the backlog; stop
 * drains what the thread holds; halt closes nothing more; the counters.
 * The gate (the cuda backend's: no close while a stream waits on a late
 * client): a shut gate closes nothing, however many items are ready, and
 * holds up no push; each close runs between an enter that said yes and its
 * leave; a time shut counts once; -1 stops the closes.
 */
#include "rn_test.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../daemon/closeq.c"
#include "../../daemon/stats.c"

typedef struct fake {
    rnd_closeq_item it;
    atomic_int ready;              /* what ready answers */
    atomic_bool block;             /* close waits until it is cleared */
    atomic_bool closed;
    atomic_bool in_close;
    int id;
} fake;

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static int order[64], norder;

static int f_ready(void *ctx, rnd_closeq_item *it)
{
    (void)ctx;
    return atomic_load(&RN_QUEUE_DATA(it, fake, it)->ready);
}

static void f_close(void *ctx, rnd_closeq_item *it)
{
    fake *f = RN_QUEUE_DATA(it, fake, it);

    (void)ctx;
    atomic_store(&f->in_close, true);
    while (atomic_load(&f->block))
        usleep(200);
    pthread_mutex_lock(&order_mu);
    if (norder < 64)
        order[norder++] = f->id;
    pthread_mutex_unlock(&order_mu);
    atomic_store(&f->closed, true);
}

static const rnd_closeq_ops ops = {.ready = f_ready, .close = f_close};

/* The gate's fake: what enter answers, and what the test checks. */
static atomic_int gate_state;          /* 1 open, 0 shut, -1 never */
static atomic_int gate_looks;          /* enter calls */
static atomic_bool gate_inside;        /* between an enter that said yes and its leave */
static atomic_int gate_outside_closes; /* closes outside of it (must stay 0) */
static atomic_int gate_opened_calls;
static atomic_uint_fast64_t gate_held_ns;

static int g_enter(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&gate_looks, 1);
    int g = atomic_load(&gate_state);
    if (g > 0)
        atomic_store(&gate_inside, true);
    return g;
}

static void g_leave(void *ctx)
{
    (void)ctx;
    atomic_store(&gate_inside, false);
}

static void g_opened(void *ctx, uint64_t held_ns, uint64_t pending)
{
    (void)ctx, (void)pending;
    atomic_fetch_add(&gate_opened_calls, 1);
    atomic_store(&gate_held_ns, held_ns);
}

static void g_close(void *ctx, rnd_closeq_item *it)
{
    if (!atomic_load(&gate_inside))
        atomic_fetch_add(&gate_outside_closes, 1);
    f_close(ctx, it);
}

static const rnd_closeq_ops gate_ops = {.ready = f_ready,
                                        .close = g_close,
                                        .gate_enter = g_enter,
                                        .gate_leave = g_leave,
                                        .gate_opened = g_opened};

static void gate_reset(int state)
{
    atomic_store(&gate_state, state);
    atomic_store(&gate_looks, 0);
    atomic_store(&gate_inside, false);
    atomic_store(&gate_outside_closes, 0);
    atomic_store(&gate_opened_calls, 0);
    atomic_store(&gate_held_ns, 0);
}

static void fakes(fake *f, int n, int ready)
{
    memset(f, 0, (size_t)n * sizeof *f);
    for (int i = 0; i < n; i++) {
        f[i].id = i;
        atomic_store(&f[i].ready, ready);
    }
    norder = 0;
}

static int64_t now_ms(void)
{
    return (int64_t)(rnd_now_ns() / 1000000u);
}

/* Polls until *flag is set or 5 s passed: the thread's progress is the
 * event waited for. */
static bool await_flag(atomic_bool *flag)
{
    int64_t end = now_ms() + 5000;
    while (!atomic_load(flag)) {
        if (now_ms() > end)
            return false;
        usleep(200);
    }
    return true;
}

static uint64_t closed_count(rnd_closeq *q)
{
    rnd_closeq_stats st;
    rnd_closeq_get_stats(q, &st);
    return st.closed;
}

/* Flushes (as the loop's check phase does) until want were closed. */
static bool await_closed(rnd_closeq *q, uint64_t want)
{
    int64_t end = now_ms() + 5000;
    while (closed_count(q) < want) {
        if (now_ms() > end)
            return false;
        rnd_closeq_flush(q);
        usleep(200);
    }
    return true;
}

static void test_all_closed_in_order(void **state)
{
    static rnd_closeq q;
    fake f[8];
    rnd_closeq_stats st;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 8, 1);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 0), 0);
    for (int i = 0; i < 8; i++)
        rnd_closeq_push(&q, &f[i].it);
    assert_true(await_closed(&q, 8));
    for (int i = 0; i < 8; i++)
        assert_int_equal(order[i], i);
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.closed, 8);
    assert_true(st.pending_max >= 1 && st.pending_max <= 8);
    assert_true(rnd_closeq_stop(&q, 5000));
    rnd_closeq_destroy(&q);
}

/* An item whose fence is far off: the ones behind it close meanwhile. */
static void test_unready_holds_up_nobody(void **state)
{
    static rnd_closeq q;
    fake f[4];

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 4, 1);
    atomic_store(&f[0].ready, 0);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 0), 0);
    for (int i = 0; i < 4; i++)
        rnd_closeq_push(&q, &f[i].it);
    assert_true(await_closed(&q, 3));
    assert_false(atomic_load(&f[0].closed));
    rnd_closeq_stats st;
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, 1);
    /* The fence completes: the next look closes it. */
    atomic_store(&f[0].ready, 1);
    assert_true(await_closed(&q, 4));
    assert_int_equal(order[3], 0);
    assert_true(rnd_closeq_stop(&q, 5000));
    rnd_closeq_destroy(&q);
}

/* A close that blocks (the device is busy): the loop's pushes return at
 * once, the thread holds at most cap, the rest waits in the backlog, and
 * everything closes once the close returns. */
static void test_blocked_close_bounded(void **state)
{
    static rnd_closeq q;
    fake f[10];
    rnd_closeq_stats st;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 10, 1);
    atomic_store(&f[0].block, true);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 4), 0);
    rnd_closeq_push(&q, &f[0].it);
    assert_true(await_flag(&f[0].in_close));
    int64_t t0 = now_ms();
    for (int i = 1; i < 10; i++)
        rnd_closeq_push(&q, &f[i].it);
    for (int i = 0; i < 20; i++)
        rnd_closeq_flush(&q);
    assert_true(now_ms() - t0 < 1000);
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, 10);
    assert_int_equal(st.closed, 0);
    assert_int_equal(st.pending_max, 10);
    pthread_mutex_lock(&q.mu);
    assert_true(q.held <= 4);
    assert_int_equal(q.nbacklog + q.held, 10);
    assert_true(q.busy);
    pthread_mutex_unlock(&q.mu);
    atomic_store(&f[0].block, false);
    assert_true(await_closed(&q, 10));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, 0);
    assert_true(st.wait_max_ns > 0);
    assert_true(rnd_closeq_stop(&q, 5000));
    rnd_closeq_destroy(&q);
}

/* Completes the fences of the three fakes of arg, 50 ms from now: the
 * device finishing the work queued before them. */
static void *complete_later(void *arg)
{
    fake *f = arg;
    usleep(50000);
    for (int i = 0; i < 3; i++)
        atomic_store(&f[i].ready, 1);
    return NULL;
}

/* stop waits until what the thread holds is closed: fences that complete
 * only after the stop was asked for. */
static void test_stop_drains(void **state)
{
    static rnd_closeq q;
    fake f[3];
    pthread_t t;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 3, 0);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 0), 0);
    for (int i = 0; i < 3; i++)
        rnd_closeq_push(&q, &f[i].it);
    assert_int_equal(pthread_create(&t, NULL, complete_later, f), 0);
    assert_true(rnd_closeq_stop(&q, 5000));
    for (int i = 0; i < 3; i++)
        assert_true(atomic_load(&f[i].closed));
    assert_int_equal(closed_count(&q), 3);
    pthread_join(t, NULL);
    rnd_closeq_destroy(&q);
}

/* A device that failed: ready says never, or the loop halts the queue;
 * nothing more is closed and stop returns at once. */
static void test_halt(void **state)
{
    static rnd_closeq q, r;
    fake f[3], g[2];

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 3, 0);
    atomic_store(&f[1].ready, -1);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 0), 0);
    for (int i = 0; i < 3; i++)
        rnd_closeq_push(&q, &f[i].it);
    atomic_store(&f[2].ready, 1);
    assert_true(rnd_closeq_stop(&q, 5000));
    assert_false(atomic_load(&f[1].closed));
    assert_false(atomic_load(&f[2].closed)); /* behind the failed one */
    rnd_closeq_destroy(&q);

    memset(&r, 0, sizeof r);
    fakes(g, 2, 0);
    assert_int_equal(rnd_closeq_start(&r, &ops, NULL, 0), 0);
    rnd_closeq_push(&r, &g[0].it);
    rnd_closeq_halt(&r);
    rnd_closeq_push(&r, &g[1].it); /* stays in the backlog */
    atomic_store(&g[0].ready, 1);
    atomic_store(&g[1].ready, 1);
    assert_true(rnd_closeq_stop(&r, 5000));
    assert_false(atomic_load(&g[0].closed));
    assert_false(atomic_load(&g[1].closed));
    rnd_closeq_stats st;
    rnd_closeq_get_stats(&r, &st);
    assert_int_equal(st.closed, 0);
    rnd_closeq_destroy(&r);
}

/* A close that never returns: stop gives up after its timeout and leaves
 * the thread (which still uses q) detached. */
static void test_stop_timeout(void **state)
{
    static rnd_closeq q;
    static fake f[1];

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 1, 1);
    atomic_store(&f[0].block, true);
    assert_int_equal(rnd_closeq_start(&q, &ops, NULL, 0), 0);
    rnd_closeq_push(&q, &f[0].it);
    assert_true(await_flag(&f[0].in_close));
    int64_t t0 = now_ms();
    assert_false(rnd_closeq_stop(&q, 100));
    assert_true(now_ms() - t0 < 2000);
    /* Let the detached thread end before the process does. */
    atomic_store(&f[0].block, false);
    assert_true(await_flag(&f[0].closed));
}

/* Without a thread (RMSNORMD_DEBUG_CLOSER=0): items wait in the backlog
 * and close on the caller's thread, the ready ones only. */
static void test_inline(void **state)
{
    static rnd_closeq q;
    fake f[3];

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 3, 1);
    atomic_store(&f[1].ready, 0);
    rnd_closeq_init_inline(&q, &ops, NULL);
    for (int i = 0; i < 3; i++)
        rnd_closeq_push(&q, &f[i].it);
    assert_int_equal(closed_count(&q), 0); /* push alone closes nothing */
    rnd_closeq_close_here(&q);
    assert_int_equal(closed_count(&q), 2);
    assert_false(atomic_load(&f[1].closed));
    atomic_store(&f[1].ready, 1);
    rnd_closeq_close_here(&q);
    assert_int_equal(closed_count(&q), 3);
    assert_true(rnd_closeq_stop(&q, 0));
    rnd_closeq_destroy(&q);
}

/* Waits (flushing, as the loop does) until the gate was asked n more
 * times: the thread's looks are the event waited for. */
static bool await_looks(rnd_closeq *q, int n)
{
    int want = atomic_load(&gate_looks) + n;
    int64_t end = now_ms() + 5000;
    while (atomic_load(&gate_looks) < want) {
        if (now_ms() > end)
            return false;
        rnd_closeq_flush(q);
        usleep(200);
    }
    return true;
}

/* A shut gate: ready items stay, look after look, and the time shut counts
 * once; open, they all close, each inside enter/leave. */
static void test_gate_holds_closes(void **state)
{
    static rnd_closeq q;
    fake f[6];
    rnd_closeq_stats st;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 6, 1);
    gate_reset(0);
    q.poll_max_us = 1000; /* looks often: many looks while shut */
    assert_int_equal(rnd_closeq_start(&q, &gate_ops, NULL, 0), 0);
    for (int i = 0; i < 6; i++)
        rnd_closeq_push(&q, &f[i].it);
    assert_true(await_looks(&q, 10));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.closed, 0);
    assert_int_equal(st.pending, 6);
    assert_int_equal(st.gated, 1);
    assert_true(st.gate_shut);
    uint64_t held0 = st.gated_max_ns;
    assert_true(held0 > 0);
    /* More releases while shut: queued, not closed; the hold grows. */
    fake more[2];
    fakes(more, 2, 1);
    more[0].id = 10, more[1].id = 11;
    rnd_closeq_push(&q, &more[0].it);
    rnd_closeq_push(&q, &more[1].it);
    assert_true(await_looks(&q, 5));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.closed, 0);
    assert_int_equal(st.gated, 1);
    assert_true(st.gated_max_ns > held0);
    assert_int_equal(atomic_load(&gate_opened_calls), 0);
    atomic_store(&gate_state, 1);
    assert_true(await_closed(&q, 8));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.gated, 1);
    assert_false(st.gate_shut);
    assert_int_equal(atomic_load(&gate_outside_closes), 0);
    assert_int_equal(atomic_load(&gate_opened_calls), 1);
    assert_true(atomic_load(&gate_held_ns) >= held0);
    assert_true(st.gated_max_ns >= atomic_load(&gate_held_ns));
    /* Shut again: a second time counted. */
    atomic_store(&gate_state, 0);
    fake late[1];
    fakes(late, 1, 1);
    rnd_closeq_push(&q, &late[0].it);
    assert_true(await_looks(&q, 3));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.gated, 2);
    assert_false(atomic_load(&late[0].closed));
    atomic_store(&gate_state, 1);
    assert_true(await_closed(&q, 9));
    assert_true(rnd_closeq_stop(&q, 5000));
    rnd_closeq_destroy(&q);
}

/* The gate shut while releases keep coming, far beyond the cap: each push
 * returns at once (the loop is never held), the thread holds cap, the
 * backlog the rest; everything closes once the gate opens. */
static void test_gate_beyond_cap(void **state)
{
    enum { N = 300, CAP = 4 };
    static rnd_closeq q;
    static fake f[N];
    rnd_closeq_stats st;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, N, 1);
    gate_reset(0);
    assert_int_equal(rnd_closeq_start(&q, &gate_ops, NULL, CAP), 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < N; i++) {
        rnd_closeq_push(&q, &f[i].it);
        rnd_closeq_flush(&q);
    }
    assert_true(now_ms() - t0 < 1000);
    assert_true(await_looks(&q, 3));
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.pending, N);
    assert_int_equal(st.pending_max, N);
    assert_int_equal(st.closed, 0);
    pthread_mutex_lock(&q.mu);
    assert_int_equal(q.held, CAP);
    assert_int_equal(q.nbacklog, N - CAP);
    pthread_mutex_unlock(&q.mu);
    atomic_store(&gate_state, 1);
    assert_true(await_closed(&q, N));
    assert_int_equal(atomic_load(&gate_outside_closes), 0);
    assert_true(rnd_closeq_stop(&q, 5000));
    rnd_closeq_destroy(&q);
}

/* The gate says never (the device failed): nothing is closed, stop returns
 * at once. */
static void test_gate_never(void **state)
{
    static rnd_closeq q;
    fake f[2];

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 2, 1);
    gate_reset(-1);
    assert_int_equal(rnd_closeq_start(&q, &gate_ops, NULL, 0), 0);
    rnd_closeq_push(&q, &f[0].it);
    rnd_closeq_push(&q, &f[1].it);
    assert_true(await_looks(&q, 1));
    assert_true(rnd_closeq_stop(&q, 5000));
    assert_false(atomic_load(&f[0].closed));
    assert_false(atomic_load(&f[1].closed));
    assert_int_equal(closed_count(&q), 0);
    rnd_closeq_destroy(&q);
}

/* Without a thread: close_here asks the gate too. */
static void test_gate_inline(void **state)
{
    static rnd_closeq q;
    fake f[3];
    rnd_closeq_stats st;

    (void)state;
    memset(&q, 0, sizeof q);
    fakes(f, 3, 1);
    gate_reset(0);
    rnd_closeq_init_inline(&q, &gate_ops, NULL);
    for (int i = 0; i < 3; i++)
        rnd_closeq_push(&q, &f[i].it);
    rnd_closeq_close_here(&q);
    rnd_closeq_close_here(&q);
    rnd_closeq_get_stats(&q, &st);
    assert_int_equal(st.closed, 0);
    assert_int_equal(st.gated, 1);
    atomic_store(&gate_state, 1);
    rnd_closeq_close_here(&q);
    assert_int_equal(closed_count(&q), 3);
    assert_int_equal(atomic_load(&gate_outside_closes), 0);
    assert_int_equal(atomic_load(&gate_opened_calls), 1);
    assert_true(rnd_closeq_stop(&q, 0));
    rnd_closeq_destroy(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_closed_in_order),
        cmocka_unit_test(test_unready_holds_up_nobody),
        cmocka_unit_test(test_blocked_close_bounded),
        cmocka_unit_test(test_stop_drains),
        cmocka_unit_test(test_halt),
        cmocka_unit_test(test_stop_timeout),
        cmocka_unit_test(test_inline),
        cmocka_unit_test(test_gate_holds_closes),
        cmocka_unit_test(test_gate_beyond_cap),
        cmocka_unit_test(test_gate_never),
        cmocka_unit_test(test_gate_inline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
