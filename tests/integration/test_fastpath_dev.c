/* SPDX-License-Identifier: MIT */
/*
 * test_fastpath_dev - libclient's stream-ordered fast path (rnc_bwd_ring_dev,
 * the host logic behind rn_rmsnorm_bwd on RN_PATH_FAST) against a real
 * daemon on the CPU backend, with a fake device side in place of CUDA: its
 * "stream" writes ready when the test says so and records the waits.  It
 * checks what the CUDA side (client/ring_cuda.c) relies on without a GPU:
 * the ring is registered once; ready = seq is enqueued before the slot is
 * published and the wait for done >= seq after, at the ring's words; the
 * daemon waits for a late ready; results match the fp64 reference; a bad
 * call's error comes back at rn_check with done past it (a stream waiting
 * on done would go on); a lost session raises done over the calls left and
 * the next session gets fresh ring memory; a RING_OPEN or GRAPH_OPEN the
 * daemon answers too late (it is stopped for that request alone) leaves the
 * client able to go on.  And --cuda-fast-path, a cuda backend option,
 * changes nothing on the CPU backend (HELLO's paths stay 3).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"
#include "ring_int.h"
#include "integration/fakedev.h"
#include "integration/harness.h"
#include "integration/raw.h"
#include "rmsnormctl_verify.h"
#include "rn_ring.h"

#define WAIT_MS 20000
#define MAX_OPS 256

/* The fake stream: device addresses are host addresses here. */
typedef struct fake_stream {
    bool defer;                    /* hold ready writes until flush() */
    uint64_t pending[MAX_OPS];     /* deferred ready and go values, in order */
    uint64_t *pending_at[MAX_OPS]; /* ... and their words */
    int npending;
    int attaches, detaches, writes, waits; /* (writes: of ready) */
    int go_writes;                 /* of go, each right after the same call's ready */
    uint64_t base;                 /* the ring's address at attach */
    uint64_t last_wait_addr, last_wait_seq;
    bool order_ok;                 /* ready before prod, wait after prod */
    uint64_t done_word;            /* the done word handed out (f_done_word), 0: none */
    uint64_t raised;               /* the last raise of the done word (f_raise) */
    uint64_t done_at_detach;       /* the ring's done word when it was detached */
    int ready_waits;               /* waits for another stream's ready (a second stream) */
    bool blocked;                  /* such a wait not satisfied yet: later writes held */
    uint64_t block_seq;
    unsigned block_off;            /* ... on this word (go, or ready) */
    uint64_t id;                   /* its stream id (f_stream_id), 0: none known */
    uint64_t last_ready;           /* the last ready value written */
    bool fail_go;                  /* go's write is refused (RN_CUDA) */
    bool defer_go;                 /* go's writes alone held until flush() */
} fake_stream;

static fake_stream *cur;

static int f_attach(rn_client *c, void *base, size_t size, uint64_t *dev)
{
    (void)c, (void)size;
    cur->attaches++;
    cur->base = (uint64_t)(uintptr_t)base;
    *dev = cur->base;
    return 0;
}

static uint64_t word(uint64_t base, unsigned off);

static void f_detach(void *base)
{
    if (cur) {
        cur->detaches++;
        cur->done_at_detach = word((uint64_t)(uintptr_t)base, RNP_RING_O_DONE);
    }
}

static uint64_t word(uint64_t base, unsigned off)
{
    return __atomic_load_n((uint64_t *)(uintptr_t)(base + off), __ATOMIC_ACQUIRE);
}

static int f_write(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    fake_stream *s = stream;
    (void)c;
    if (addr == s->base + RNP_RING_O_GO) {
        if (s->fail_go)
            return rnc_fail(c, RN_CUDA, "fake stream: go's write refused");
        /* (13.3: go after the same call's ready) */
        s->go_writes++;
        if (s->go_writes != s->writes || s->last_ready != seq)
            s->order_ok = false;
    } else {
        s->writes++;
        s->last_ready = seq;
        if (addr != s->base + RNP_RING_O_READY)
            s->order_ok = false;
    }
    if (word(s->base, RNP_RING_O_PROD) >= seq)
        s->order_ok = false;
    if (s->defer || s->blocked || (s->defer_go && addr == s->base + RNP_RING_O_GO)) {
        s->pending_at[s->npending] = (uint64_t *)(uintptr_t)addr;
        s->pending[s->npending++] = seq;
    } else {
        __atomic_store_n((uint64_t *)(uintptr_t)addr, seq, __ATOMIC_RELEASE);
    }
    return 0;
}

static int f_wait(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    fake_stream *s = stream;
    (void)c;
    if (addr == s->base + RNP_RING_O_READY || addr == s->base + RNP_RING_O_GO) {
        /* (the wait of a call on another stream than the last call's: on
         * go, written after ready, where the ring has it) */
        s->ready_waits++;
        s->block_off = (unsigned)(addr - s->base);
        if (!rnp_seq_reached(word(s->base, s->block_off), seq)) {
            s->blocked = true;
            s->block_seq = seq;
        }
        return 0;
    }
    s->waits++;
    s->last_wait_addr = addr;
    s->last_wait_seq = seq;
    uint64_t at = s->done_word ? s->done_word : s->base + RNP_RING_O_DONE;
    if (addr != at || word(s->base, RNP_RING_O_PROD) != seq)
        s->order_ok = false;
    return 0;
}

/* RING_OPEN's done word (libclient's default on the CUDA side):
 * words of a buffer the test allocated (a region of the session), raised
 * like the ring's word. */
static uint8_t *dw_buf;
static uint32_t dw_next;

static void f_raise(rn_client *c, uint64_t addr, uint64_t seq)
{
    (void)c;
    if (cur)
        cur->raised = seq;
    rnc_watch_raise((uint64_t *)(uintptr_t)addr, seq);
}

static int f_read(rn_client *c, uint64_t addr, uint64_t *v)
{
    (void)c;
    *v = __atomic_load_n((uint64_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE);
    return 0;
}

static int f_done_word(rn_client *c, void **p)
{
    *p = dw_buf + 8u * dw_next++;
    cur->done_word = (uint64_t)(uintptr_t)*p;
    c->done_raise = f_raise;
    c->done_read = f_read;
    return 0;
}

static void flush(fake_stream *s)
{
    for (int i = 0; i < s->npending; i++)
        __atomic_store_n(s->pending_at[i], s->pending[i], __ATOMIC_RELEASE);
    s->npending = 0;
}

/* A blocked stream whose wait is satisfied now goes on: its held writes. */
static void resume(fake_stream *s)
{
    if (s->blocked && rnp_seq_reached(word(s->base, s->block_off), s->block_seq)) {
        s->blocked = false;
        flush(s);
    }
}

static uint64_t f_stream_id(void *stream)
{
    return ((fake_stream *)stream)->id;
}

static const rnc_ring_dev fake_dev = {f_attach, f_detach, f_write, f_wait,  NULL,
                                      NULL,     NULL,     f_stream_id, NULL};
static const rnc_ring_dev fake_dev_dw = {f_attach, f_detach, f_write,     f_wait,
                                         NULL,     NULL,     f_done_word, f_stream_id, NULL};

static rn_client *fast_client(const rnh_daemon *d)
{
    rn_client *c = rnh_client_path(d, RN_PATH_FAST);
    if (!c)
        fail_msg("rn_connect on the fast path failed");
    return c;
}

/* The daemon started, s the fake stream, a client on the fast path. */
static rn_client *start_fast(rnh_daemon *d, fake_stream *s)
{
    cur = s;
    assert_int_equal(rnh_start(d), 0);
    return fast_client(d);
}

typedef struct laid {
    void *buf;
    rn_bwd_args a;
    rnv_expect e;
} laid;

static void lay(rn_client *c, int i, laid *l)
{
    static const int64_t shapes[][2] = {{1, 1}, {5, 31}, {16, 64}, {7, 1000}};
    rnv_case k = {0};
    char msg[300];

    k.m = shapes[i % 4][0];
    k.n = shapes[i % 4][1];
    k.x = k.dy = k.dx = i % 2 ? RN_DTYPE_BF16 : RN_DTYPE_F32;
    k.w = k.dw = RN_DTYPE_F32;
    k.rstd = true;
    k.eps = 1e-6f;
    memset(l, 0, sizeof *l);
    if (rn_buffer_alloc(c, rnv_bytes(&k), &l->buf) != 0)
        fail_msg("rn_buffer_alloc: %s", rn_last_error(c));
    rnv_setup(&k, l->buf, 0x51ed + (uint64_t)i, &l->a);
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

static int call(rn_client *c, const rn_bwd_args *a, fake_stream *s)
{
    return rnc_bwd_ring_dev(c, a, &rnc_host_mapper, NULL, &fake_dev, s);
}

/* Results, the order of the stream's operations, one registration. */
static void test_stream_results(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l[8];
    rn_client *c;

    c = start_fast(d, &s);
    for (int i = 0; i < 8; i++) {
        lay(c, i, &l[i]);
        if (call(c, &l[i].a, &s) != 0)
            fail_msg("call %d: %s", i, rn_last_error(c));
        assert_int_equal(s.last_wait_seq, (uint64_t)i + 1);
    }
    assert_int_equal(rn_sync(c), 0);
    assert_true(s.order_ok);
    assert_int_equal(s.attaches, 1);
    assert_int_equal(s.writes, 8);
    assert_int_equal(s.waits, 8);
    assert_true(word(s.base, RNP_RING_O_DONE) >= 8);
    for (int i = 0; i < 8; i++)
        check_free(c, &l[i], "stream-ordered fast call");
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 8, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "requests.bwd"), 0);
    rn_close(c);
    assert_int_equal(s.detaches, 1);
    cur = NULL;
    RNH_PASS(d);
}

/* The producer is late: the daemon waits for ready, then computes. */
static void test_stream_ready_late(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer = true};
    laid l;
    rn_client *c;

    c = start_fast(d, &s);
    lay(c, 3, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);   /* with the daemon */
    usleep(200000);
    assert_int_equal(word(s.base, RNP_RING_O_DONE), 0);   /* not run before ready */
    assert_int_equal(rn_check(c), 0);
    flush(&s);
    assert_int_equal(rn_sync(c), 0);
    assert_true(word(s.base, RNP_RING_O_DONE) >= 1);
    assert_true(s.order_ok);
    check_free(c, &l, "late ready");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* Calls of one client on two streams: the ready word means every slot up to
 * it is ready, so a call on the second stream first waits there for the
 * first call's ready, which the first stream writes once its producer is
 * done.  Without that the second stream's write ran ahead of the first
 * producer (the daemon computed on unready inputs) or, landing first, was
 * lowered again by it (a later slot waited for good).  A call on the same
 * stream as the last needs no such wait. */
static void test_two_streams(void **state)
{
    rnh_daemon *d = *state;
    fake_stream a = {.order_ok = true, .defer = true}, b = {.order_ok = true};
    laid l[3];
    rn_client *c;

    c = start_fast(d, &a);
    for (int i = 0; i < 3; i++)
        lay(c, i, &l[i]);
    assert_int_equal(call(c, &l[0].a, &a), 0); /* its producer runs on */
    b.base = a.base;
    assert_int_equal(call(c, &l[1].a, &b), 0);
    assert_int_equal(b.ready_waits, 1);
    assert_int_equal(b.block_off, RNP_RING_O_GO); /* (go comes last, and must not go back) */
    assert_true(b.blocked);
    usleep(200000);
    assert_int_equal(word(a.base, RNP_RING_O_READY), 0);
    assert_int_equal(word(a.base, RNP_RING_O_DONE), 0); /* nothing ran early */
    flush(&a);  /* the first producer ends: ready = 1 */
    resume(&b); /* the second stream goes on: ready = 2 */
    assert_false(b.blocked);
    assert_int_equal(call(c, &l[2].a, &b), 0);
    assert_int_equal(b.ready_waits, 1); /* the same stream again: no wait */
    assert_int_equal(rn_sync(c), 0);
    assert_true(word(a.base, RNP_RING_O_DONE) >= 3);
    assert_true(a.order_ok && b.order_ok);
    for (int i = 0; i < 3; i++)
        check_free(c, &l[i], "two streams");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* A stream handle names a stream only while it lives: a new stream may get
 * a destroyed one's handle (and the per-thread default stream has one
 * handle in every thread).  Calls on the same handle with another stream id
 * are on another stream: the second waits for the first's ready as for any
 * other stream's (before, the handle alone decided, and its ready write ran
 * ahead of the first producer). */
static void test_stream_handle_reused(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer = true, .id = 41};
    laid l[3];
    rn_client *c;

    c = start_fast(d, &s);
    for (int i = 0; i < 3; i++)
        lay(c, i, &l[i]);
    assert_int_equal(call(c, &l[0].a, &s), 0); /* its producer runs on */
    s.id = 42;                                 /* "destroyed", then a new one */
    assert_int_equal(call(c, &l[1].a, &s), 0);
    assert_int_equal(s.ready_waits, 1);
    assert_true(s.last_wait_seq == 2);
    assert_int_equal(call(c, &l[2].a, &s), 0); /* the same stream: no wait */
    assert_int_equal(s.ready_waits, 1);
    usleep(100000);
    assert_int_equal(word(s.base, RNP_RING_O_DONE), 0); /* nothing ran early */
    flush(&s);
    assert_int_equal(rn_sync(c), 0);
    assert_true(word(s.base, RNP_RING_O_DONE) >= 3);
    for (int i = 0; i < 3; i++)
        check_free(c, &l[i], "a reused stream handle");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* Errors of several calls come back together, once: the first one's code
 * and message, then how many came after it and the last.  Here a failed
 * call, then one lost with its daemon: before, the failure hid the loss
 * (only the first error was recorded). */
/* start_fast, without the watcher thread unless watched (RMSNORMD_WATCH=0). */
static rn_client *start_fast_watched(rnh_daemon *d, fake_stream *s, bool watched)
{
    if (!watched)
        setenv("RMSNORMD_WATCH", "0", 1);
    rn_client *c = start_fast(d, s);
    unsetenv("RMSNORMD_WATCH");
    return c;
}

static void failure_then_loss(rnh_daemon *d, bool watched)
{
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    c = start_fast_watched(d, &s, watched);
    lay(c, 2, &l);
    rn_bwd_args bad = l.a;
    bad.m = l.a.m + 100;   /* past the end of the buffer: only the daemon knows */
    assert_int_equal(call(c, &l.a, &s), 0);   /* (the ring opens) */
    assert_int_equal(rn_sync(c), 0);
    /* Both published before call 2 is answered (a call after a failed
     * one that finished is not run). */
    assert_int_equal(rnh_sigstop(d), 0);
    assert_int_equal(call(c, &bad, &s), 0);
    s.defer = true;                            /* call 2's producer runs on */
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    int64_t t0 = rnh_now_ms();
    while (word(s.base, RNP_RING_O_DONE) < 2 && rnh_now_ms() - t0 < WAIT_MS)
        usleep(1000);
    assert_true(word(s.base, RNP_RING_O_DONE) >= 2);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    /* The sync says the session is gone; the calls' errors come after. */
    int rv = rn_sync(c);
    if (rv == RN_UNKNOWN_SESSION || rv == RN_RESTARTED)
        rv = rn_check(c);
    assert_int_equal(rv, RN_OUT_OF_BOUNDS);
    const char *e = rn_last_error(c);
    if (!strstr(e, "call 2: bwd.") || !strstr(e, "and 1 error after it") ||
        !strstr(e, "calls 3..3:") || !strstr(e, "before they finished"))
        fail_msg("the errors of a failed call and a lost one: %s", e);
    assert_int_equal(rn_check(c), 0);
    s.npending = 0;
    s.defer = false;
    rnv_expect_fini(&l.e); /* (call 3's outputs are undefined: not compared) */
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

static void test_failure_then_loss(void **state)
{
    failure_then_loss(*state, true);
}

/* The same without the watcher thread (RMSNORMD_WATCH=0): rn_sync finds the
 * channel closed itself.  It read call 2's answer before it called the rest
 * lost (it reported both calls lost, call 2's error gone, found in review). */
static void test_failure_then_loss_unwatched(void **state)
{
    failure_then_loss(*state, false);
}

/* Calls published in a session whose daemon was killed, then a new daemon
 * and a new session opened by another call (rn_buffer_alloc) before the
 * loss was seen: rn_sync reports the old ring's calls lost at once (it
 * judged the old ring by the new session: without the watcher it waited
 * for them until its timeout) and the new session stays (it was dropped,
 * and the next call opened a third, registering every buffer again). */
static void old_ring_new_session(rnh_daemon *d, bool watched)
{
    fake_stream s = {.order_ok = true};
    laid l, l2;
    rn_client *c;

    c = start_fast_watched(d, &s, watched);
    lay(c, 2, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    assert_int_equal(call(c, &l.a, &s), 0); /* published, never answered */
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    assert_int_equal(rnh_start(d), 0);
    lay(c, 3, &l2); /* a new session */
    assert_int_equal(rnh_stat(d, "sessions.total"), 1);
    int64_t t0 = rnh_now_ms();
    assert_int_equal(rn_sync(c), RN_RESTARTED);
    if (!strstr(rn_last_error(c), "calls 2..2:"))
        fail_msg("the old ring's lost call: %s", rn_last_error(c));
    assert_true(rnh_now_ms() - t0 < 5000);
    assert_int_equal(rn_check(c), 0);
    int rv = call(c, &l2.a, &s);
    if (rv != 0)
        fail_msg("a call in the new session: %s", rn_last_error(c));
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rnh_stat(d, "sessions.total"), 1);
    check_free(c, &l2, "in the new session");
    rnv_expect_fini(&l.e);
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

static void test_old_ring_new_session(void **state)
{
    old_ring_new_session(*state, true);
}

static void test_old_ring_new_session_unwatched(void **state)
{
    old_ring_new_session(*state, false);
}

/* ---- RING_OPEN and GRAPH_OPEN answered too late ---------------------------------------- */

/* The daemon is stopped (SIGSTOP) for exactly one request, caught by
 * wrapping libclient's rnc_transact at link time (the Makefile links this
 * program with -Wl,--wrap=rnc_transact; every other request passes). */
static const rnh_daemon *stall_d;
static uint32_t stall_op;

int __real_rnc_transact(rn_client *c, int timeout_ms);
int __wrap_rnc_transact(rn_client *c, int timeout_ms);
int __wrap_rnc_transact(rn_client *c, int timeout_ms)
{
    if (!stall_op || c->req.op != stall_op)
        return __real_rnc_transact(c, timeout_ms);
    stall_op = 0;
    if (rnh_sigstop(stall_d) != 0)
        return __real_rnc_transact(c, timeout_ms);
    int rv = __real_rnc_transact(c, timeout_ms);
    kill(stall_d->pid, SIGCONT);
    return rv;
}

#define LATE_TIMEOUT_MS 500

/* The first call's RING_OPEN goes unanswered within the client's timeout:
 * that call times out, the session ends, and the next calls run in a new
 * one with one ring.  Before (found in review): every later call of the
 * session was refused ("the session has a ring open"), each registering
 * the ring's memory again. */
static void test_ring_open_unanswered(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;

    cur = &s;
    assert_int_equal(rnh_start(d), 0);
    rn_client *c = rnh_client_with(d, RN_PATH_FAST, LATE_TIMEOUT_MS);
    assert_non_null(c);
    lay(c, 2, &l);
    stall_d = d;
    stall_op = RN_OP_RING_OPEN;
    assert_int_equal(call(c, &l.a, &s), RN_TIMEOUT);
    assert_int_equal(stall_op, 0); /* (it was RING_OPEN that timed out) */
    for (int i = 0; i < 3; i++) {
        if (call(c, &l.a, &s) != 0)
            fail_msg("call %d after the unanswered RING_OPEN: %s", i, rn_last_error(c));
        assert_int_equal(rn_sync(c), 0);
    }
    assert_int_equal(rnh_stat(d, "sessions.active"), 1);
    assert_int_equal(rnh_stat(d, "regions.active"), 2); /* the buffer and the ring */
    check_free(c, &l, "after the unanswered RING_OPEN");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* A capture's GRAPH_OPEN goes unanswered: that call times out, the daemon
 * opens the slot once it runs again, and later captures of other calls take
 * other graph slots.  Before: every later capture took that slot again and
 * was refused ("overlaps graph 1"). */
static void test_graph_open_unanswered(void **state)
{
    rnh_daemon *d = *state;
    rnt_fake s = {0};
    laid l, l2;

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = rnh_client_with(d, RN_PATH_FAST, LATE_TIMEOUT_MS);
    assert_non_null(c);
    lay(c, 2, &l);
    lay(c, 3, &l2);
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    s.capturing = true;
    stall_d = d;
    stall_op = RN_OP_GRAPH_OPEN;
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s),
                     RN_TIMEOUT);
    assert_int_equal(stall_op, 0);
    assert_int_equal(rnh_wait_stat(d, "fast.graphs", 1, WAIT_MS), 0);
    /* (another call: the same one again would be taken for GRAPH_OPEN's
     * retry, which the daemon answers with the graph it opened) */
    for (int i = 0; i < 3; i++) {
        if (rnc_bwd_ring_dev(c, &l2.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s) != 0)
            fail_msg("capture %d after the unanswered GRAPH_OPEN: %s", i, rn_last_error(c));
        s.gone(s.arg); /* the graph destroyed, as CUDA calls it (its slot back next call) */
    }
    assert_int_equal(s.graphs, 3);
    s.capturing = false;
    assert_int_equal(rnc_bwd_ring_dev(c, &l.a, &rnc_host_mapper, NULL, &rnt_fake_dev, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    check_free(c, &l, "after the unanswered GRAPH_OPEN");
    assert_int_equal(rnh_stat(d, "fast.graphs"), 1); /* (the one the daemon holds) */
    rnv_expect_fini(&l2.e); /* (captured, never replayed) */
    assert_int_equal(rn_buffer_free(c, l2.buf), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* A host-path call after a stream's call whose producer has not finished
 * waits for that call's ready at most the client's timeout, then fails
 * with RN_TIMEOUT and publishes nothing; once the producer is done it runs.
 * (Before the timeout it waited for good, holding the client.) */
static void test_host_after_stream(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer = true};
    laid l[2];
    rn_client *c;

    c = start_fast(d, &s);
    lay(c, 0, &l[0]);
    lay(c, 1, &l[1]);
    assert_int_equal(call(c, &l[0].a, &s), 0); /* its producer runs on */
    c->timeout_ms = 300;
    uint64_t t0 = rnc_now_ns();
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l[1].a, NULL), RN_TIMEOUT);
    assert_true(rnc_now_ns() - t0 < 5000000000ull);
    assert_non_null(strstr(rn_last_error(c), "ready"));
    assert_int_equal(word(s.base, RNP_RING_O_PROD), 1); /* nothing published */
    flush(&s);
    c->timeout_ms = 10000;
    if (rn_rmsnorm_bwd_host(c, &l[1].a, NULL) != 0)
        fail_msg("the host call once the stream's producer was done: %s", rn_last_error(c));
    assert_int_equal(rn_sync(c), 0);
    for (int i = 0; i < 2; i++)
        check_free(c, &l[i], "host after stream");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* A call whose go could not be queued (a driver without batched stream
 * writes, its second write refused) is published, reported failed.  A call
 * on another stream, or of the host path, is then refused, nothing
 * published: it would wait for that go for good (before, it did).  The
 * next call on the first stream writes go, and the other stream goes on. */
static void test_go_write_failed(void **state)
{
    rnh_daemon *d = *state;
    fake_stream a = {.order_ok = true, .fail_go = true}, b = {.order_ok = true};
    laid l[4];
    rn_client *c;

    c = start_fast(d, &a);
    for (int i = 0; i < 4; i++)
        lay(c, i, &l[i]);
    assert_int_equal(call(c, &l[0].a, &a), RN_CUDA);
    assert_int_equal(word(a.base, RNP_RING_O_PROD), 1); /* published all the same */
    b.base = a.base;
    assert_int_equal(call(c, &l[1].a, &b), RN_CUDA);
    assert_non_null(strstr(rn_last_error(c), "go could not be queued"));
    assert_int_equal(b.writes + b.ready_waits, 0);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &l[1].a, NULL), RN_CUDA);
    assert_int_equal(word(a.base, RNP_RING_O_PROD), 1); /* nothing published */
    a.fail_go = false;
    assert_int_equal(call(c, &l[2].a, &a), 0);
    assert_int_equal(word(a.base, RNP_RING_O_GO), 2);
    assert_int_equal(call(c, &l[3].a, &b), 0);
    assert_int_equal(b.ready_waits, 1);
    assert_false(b.blocked);
    assert_int_equal(rn_sync(c), 0);
    assert_true(b.order_ok); /* (a's go counts are one short) */
    for (int i = 0; i < 4; i++)
        if (i != 1)
            check_free(c, &l[i], "after a failed go");
    rnv_expect_fini(&l[1].e);
    assert_int_equal(rn_buffer_free(c, l[1].buf), 0);
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* A call the daemon refuses: done still passes it (a stream waiting on
 * done goes on) and the error comes back once, at rn_check. */
static void test_stream_bad_call(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    c = start_fast(d, &s);
    lay(c, 2, &l);
    rn_bwd_args bad = l.a;
    bad.m = l.a.m + 100;   /* past the end of the buffer: only the daemon knows */
    assert_int_equal(call(c, &bad, &s), 0);
    int64_t t0 = rnh_now_ms();
    while (word(s.base, RNP_RING_O_DONE) < 1 && rnh_now_ms() - t0 < WAIT_MS)
        usleep(1000);
    assert_true(word(s.base, RNP_RING_O_DONE) >= 1);
    assert_int_equal(rn_check(c), RN_OUT_OF_BOUNDS);
    assert_non_null(strstr(rn_last_error(c), "call 1: bwd."));
    assert_int_equal(rn_check(c), 0);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    check_free(c, &l, "after a bad call");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* The daemon dies with a call waiting for its producer: at the next call
 * the client raises done over it (a stream waiting on done would go on),
 * reports the loss, and the new session's ring is fresh memory (registered
 * again). */
static void test_stream_session_lost(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer = true};
    laid l;
    rn_client *c;

    c = start_fast(d, &s);
    lay(c, 1, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    uint64_t old = s.base;
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    assert_int_equal(rn_sync(c) != 0, 1);
    assert_true(word(old, RNP_RING_O_DONE) >= 1);   /* the stream's wait is released */
    /* A restart at the same endpoint: the next call runs in a new session,
     * on new ring memory (the old one keeps its raised done). */
    assert_int_equal(rnh_start(d), 0);
    s.defer = false;
    int rv = call(c, &l.a, &s);
    if (rv == RN_RESTARTED || rv == RN_UNKNOWN_SESSION)
        rv = call(c, &l.a, &s);   /* the loss is reported once, then the call runs */
    if (rv != 0)
        fail_msg("call after the restart: %s", rn_last_error(c));
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(s.attaches, 2);
    assert_true(s.base != old);
    assert_true(word(old, RNP_RING_O_DONE) >= 1);
    check_free(c, &l, "after a restart");
    rn_close(c);
    /* The old memory, whose stream never wrote its ready, stays mapped and
     * registered: the stream's write, when it comes, lands there. */
    assert_int_equal(s.detaches, 1);
    flush(&s);
    assert_int_equal(word(old, RNP_RING_O_READY), 1);
    cur = NULL;
    RNH_PASS(d);
}

/* start_fast, a buffer for the done words (the first one handed out next),
 * and a call's tensors in *l. */
static rn_client *start_dw(rnh_daemon *d, fake_stream *s, laid *l)
{
    rn_client *c = start_fast(d, s);
    assert_int_equal(rn_buffer_alloc(c, 4096, (void **)&dw_buf), 0);
    memset(dw_buf, 0, 4096);
    dw_next = 0;
    lay(c, 2, l);
    return c;
}

/* start_dw's end: the client closed, the done words' buffer forgotten. */
static void end_dw(rnh_daemon *d, rn_client *c)
{
    rn_close(c);
    dw_buf = NULL;
    cur = NULL;
    RNH_PASS(d);
}

static int call_dw(rn_client *c, laid *l, fake_stream *s)
{
    return rnc_bwd_ring_dev(c, &l->a, &rnc_host_mapper, NULL, &fake_dev_dw, s);
}

/* The done word: the stream waits on it, the daemon writes it after the
 * ring's, and when the daemon dies with a call left the client raises it
 * (a stream waiting there would go on); the next session gets a fresh one. */
static void test_stream_done_word(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    c = start_dw(d, &s, &l);
    assert_int_equal(call_dw(c, &l, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    uint64_t first = s.done_word;
    assert_true(first != 0);
    assert_int_equal(s.last_wait_addr, first);
    assert_int_equal(word(first, 0), 1);
    assert_true(s.order_ok);
    /* A call left waiting for its producer, and the daemon killed. */
    s.defer = true;
    assert_int_equal(call_dw(c, &l, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    assert_int_equal(rn_sync(c) != 0, 1);
    assert_true(word(first, 0) >= 2);   /* the stream's wait on it is released */
    s.npending = 0;
    s.defer = false;
    assert_int_equal(rnh_start(d), 0);
    int rv = call_dw(c, &l, &s);
    if (rv == RN_RESTARTED || rv == RN_UNKNOWN_SESSION)
        rv = call_dw(c, &l, &s);
    if (rv != 0)
        fail_msg("call after the restart: %s", rn_last_error(c));
    assert_int_equal(rn_sync(c), 0);
    assert_true(s.done_word != first);
    assert_int_equal(word(s.done_word, 0), 1);
    check_free(c, &l, "with a done word");
    end_dw(d, c);
}

/* A daemon that dies between its kernel's two stores (the done word the
 * stream waits on first, then the ring's): the call ran and the stream went
 * on, so the watcher counts it answered, not lost (it reported it
 * RN_RESTARTED before). */
static void test_stream_done_word_first(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    c = start_dw(d, &s, &l);
    assert_int_equal(call_dw(c, &l, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    assert_int_equal(call_dw(c, &l, &s), 0); /* published, never taken */
    /* The kernel's first store, as if it had run. */
    __atomic_store_n((uint64_t *)(uintptr_t)s.done_word, 2, __ATOMIC_RELEASE);
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    int rv = rn_sync(c);
    if (rv != 0)
        fail_msg("a call whose done word the daemon wrote: %s: %s", rn_err_name(rv),
                 rn_last_error(c));
    assert_int_equal(word(s.base, RNP_RING_O_DONE), 2);
    assert_int_equal(rn_check(c), 0);
    rnv_expect_fini(&l.e);
    end_dw(d, c);
}

/* rn_close while the daemon does not answer (stopped here; or gone where
 * no pidfd tells the watcher): the BYE goes unanswered, and the call in
 * flight is lost first, so that a stream waiting on either done word goes
 * on before their memory is freed. */
static void test_close_unanswered(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    c = start_dw(d, &s, &l);
    s.defer = true;
    assert_int_equal(call_dw(c, &l, &s), 0);
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    rn_close(c); /* (its BYE waits 2 s) */
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    assert_int_equal(s.raised, 1);
    assert_int_equal(word(s.base, RNP_RING_O_DONE), 1);
    /* Its stream has not written ready yet (no sync before rn_close): the
     * ring's memory stays, and the write lands there when it comes. */
    assert_int_equal(s.detaches, 0);
    flush(&s);
    assert_int_equal(word(s.base, RNP_RING_O_READY), 1);
    rnv_expect_fini(&l.e); /* (the call's outputs are undefined: not compared) */
    dw_buf = NULL;
    cur = NULL;
    RNH_PASS(d);
}

/* The same with ready landed and the call answered, but its go (written
 * after ready, on the same stream) not yet: the memory stays too.  Before,
 * rn_close looked at ready and done alone and unmapped it under the
 * stream's write of go (on a GPU, a fault that ends the context). */
static void test_close_go_pending(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer_go = true};
    laid l;
    rn_client *c;

    c = start_fast(d, &s);
    lay(c, 0, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    assert_int_equal(word(s.base, RNP_RING_O_DONE), 1);
    assert_int_equal(word(s.base, RNP_RING_O_GO), 0);
    check_free(c, &l, "go pending");
    rn_close(c);
    assert_int_equal(s.detaches, 0);
    flush(&s);
    assert_int_equal(word(s.base, RNP_RING_O_GO), 1);
    cur = NULL;
    RNH_PASS(d);
}

/* A request on the session channel that the daemon does not answer within
 * the client's timeout (stopped here) fails with RN_TIMEOUT and leaves the
 * session as it was.  Before, the client closed the channel, which ended
 * the session (the CUDA backend then cancels the ring calls in flight, and
 * a stream waiting on their done waited for good).  Now the call in flight
 * is answered once the daemon goes on, in the same session, the late reply
 * is read before the next request (its region unregistered again), and the
 * next registration works. */
static void test_chan_timeout_keeps_session(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true, .defer = true};
    laid l;
    rn_client *c;
    void *p = NULL;

    c = start_fast(d, &s);
    lay(c, 2, &l);
    assert_int_equal(call(c, &l.a, &s), 0); /* its producer runs on */
    assert_int_equal(rnh_wait_slot_pending(d, 1, 1, WAIT_MS), 0);
    int64_t regions = rnh_stat(d, "regions.active");
    rnp_session sess = c->session;
    assert_int_equal(rnh_sigstop(d), 0);
    c->timeout_ms = 300;
    assert_int_equal(rn_buffer_alloc(c, 1 << 16, &p), RN_TIMEOUT);
    assert_non_null(strstr(rn_last_error(c), "no reply within"));
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    c->timeout_ms = 10000;
    flush(&s);
    if (rn_sync(c) != 0)
        fail_msg("the call across the timeout: %s", rn_last_error(c));
    assert_true(word(s.base, RNP_RING_O_DONE) >= 1);
    check_free(c, &l, "a call across a channel timeout");
    if (rn_buffer_alloc(c, 1 << 16, &p) != 0)
        fail_msg("rn_buffer_alloc after the timeout: %s", rn_last_error(c));
    /* l's buffer went (once the call let go of it), the late region went,
     * this one came. */
    assert_int_equal(rnh_wait_stat(d, "regions.active", regions, WAIT_MS), 0);
    assert_int_equal(rnh_stat(d, "clients.died"), 0);
    assert_true(c->have_session && c->have_chan);
    assert_memory_equal(&c->session, &sess, sizeof sess);
    assert_int_equal(rn_buffer_free(c, p), 0);
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

/* Until c's ring says the daemon sleeps (its flag up). */
static void wait_asleep(rn_client *c)
{
    const uint32_t *f = rnp_ring_u32(c->ring->base, RNP_RING_O_SLEEPING);
    for (int64_t t0 = rnh_now_ms(); __atomic_load_n(f, __ATOMIC_SEQ_CST) != 1; usleep(1000))
        if (rnh_now_ms() - t0 > WAIT_MS)
            fail_msg("the daemon did not go to sleep");
}

/* The session's bell (AUTH_OK's socket, PROTOCOL.md 12): a host-path
 * call published while the daemon sleeps writes it, and the loop wakes and
 * takes the slot itself (fast.bells), one wake-up instead of the doorbell
 * thread's and then the loop's; with RMSNORMD_BELL=0 the client rings the
 * doorbell's futex as before.  Each call's outputs are poisoned first and
 * compared after. */
static void bell_run(rnh_daemon *d, bool off)
{
    char msg[400];
    laid l;
    rn_client *c;

    if (off)
        setenv("RMSNORMD_BELL", "0", 1);
    assert_int_equal(rnh_start(d), 0);
    c = fast_client(d);
    unsetenv("RMSNORMD_BELL");
    lay(c, 2, &l); /* (the session opens here, and AUTH brings the bell) */
    assert_int_equal(c->have_bell, !off);
    int slow = 0;
    for (int i = 0; i < 5; i++) {
        if (i > 0) /* (from the second call on: the daemon asleep, its flag up) */
            wait_asleep(c);
        rnv_poison(&l.a);
        int64_t t0 = rnh_now_ms();
        if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
            fail_msg("call %d: %s", i, rn_last_error(c));
        /* (a lost wake-up would leave the slot to the ring thread's 100 ms
         * sleep: every such call that slow) */
        slow += rnh_now_ms() - t0 >= 80;
        if (rnv_compare(&l.a, &l.e, true, NULL, msg, sizeof msg) != 0)
            fail_msg("call %d: %s", i, msg);
    }
    /* (a lost wake-up makes every call slow; a loaded host, one or two) */
    assert_true(slow <= 2);
    /* (the ring thread's flag is down for a moment when its sleep times out:
     * a call then may need no bell, so not every call counts) */
    if (off)
        assert_int_equal(rnh_stat(d, "fast.bells"), 0);
    else
        assert_true(rnh_stat(d, "fast.bells") >= 1);
    assert_int_equal(rnh_wait_stat(d, "fast.ok", 5, WAIT_MS), 0);
    check_free(c, &l, "after the bell");
    rn_close(c);
    RNH_PASS(d);
}

static void test_bell(void **state)
{
    bell_run(*state, false);
}

static void test_bell_off(void **state)
{
    bell_run(*state, true);
}

/* A daemon killed while its flag says it sleeps: the next call rings a
 * bell whose other end is gone.  That must be an error of the call, not a
 * SIGPIPE that kills the client (the bell was a pipe for a while).  The
 * watcher is off so that the call itself meets the dead daemon; SIGPIPE
 * has its default action. */
static void test_bell_daemon_gone(void **state)
{
    rnh_daemon *d = *state;
    laid l;
    rn_client *c;

    signal(SIGPIPE, SIG_DFL);
    setenv("RMSNORMD_WATCH", "0", 1);
    assert_int_equal(rnh_start(d), 0);
    c = fast_client(d);
    unsetenv("RMSNORMD_WATCH");
    lay(c, 1, &l);
    if (rn_rmsnorm_bwd_host(c, &l.a, NULL) != 0)
        fail_msg("first call: %s", rn_last_error(c));
    assert_true(c->have_bell);
    wait_asleep(c);
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, WAIT_MS), 128 + SIGKILL);
    c->timeout_ms = 2000;
    int rv = rn_rmsnorm_bwd_host(c, &l.a, NULL);
    assert_int_not_equal(rv, 0); /* (and the process lives) */
    rnv_expect_fini(&l.e);
    rn_close(c);
    RNH_PASS(d);
}

static void test_cpu_option_inert(void **state)
{
    rnh_daemon *d = *state;
    fake_stream s = {.order_ok = true};
    laid l;
    rn_client *c;

    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(rnr_hello_paths(d->endpoint), 3);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    rnh_arg(d, "--cuda-fast-path");
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(rnr_hello_paths(d->endpoint), 3);
    cur = &s;
    c = fast_client(d);
    lay(c, 0, &l);
    assert_int_equal(call(c, &l.a, &s), 0);
    assert_int_equal(rn_sync(c), 0);
    check_free(c, &l, "with --cuda-fast-path on the cpu backend");
    rn_close(c);
    cur = NULL;
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_results, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_ready_late, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_two_streams, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_handle_reused, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_host_after_stream, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_bad_call, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_go_write_failed, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_failure_then_loss, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_failure_then_loss_unwatched, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_old_ring_new_session, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_old_ring_new_session_unwatched, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_open_unanswered, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_open_unanswered, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_session_lost, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_done_word, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_done_word_first, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_unanswered, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_close_go_pending, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_chan_timeout_keeps_session, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bell, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bell_off, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bell_daemon_gone, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_cpu_option_inert, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
