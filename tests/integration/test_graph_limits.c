/* SPDX-License-Identifier: MIT */
/*
 * test_graph_limits - graph slots (PROTOCOL.md 13.8) at the daemon's limits,
 * on the CPU backend, through a raw ring (rawring.h) whose graph slots the
 * test opens with GRAPH_OPEN and replays by hand (what the replay's kernel
 * does, then the wait for done):
 *
 *  - a replay that comes while classic calls fill --max-inflight-total is
 *    left waiting (fast.deferred), and runs once a classic call ends, with
 *    no ring activity at all to wake the rings (it used to wait for the
 *    next release of some ring's job);
 *  - --max-graphs bounds the graph slots open over all sessions: GRAPH_OPEN
 *    past it is answered RN_BUSY naming the setting and changes nothing
 *    (the open slots replay as before, a re-sent GRAPH_OPEN still gets its
 *    id), and GRAPH_CLOSE or a session's end gives places back.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/rawchan.h"
#include "integration/rawring.h"
#include "rmsnormctl_verify.h"
#include "rn_ring.h"

#define WAIT_MS 20000

/* A raw ring whose region also holds graph slots (after the ring), and a
 * second region for the tensors: a graph slot's tensors must not be in the
 * ring's region. */
typedef struct gring {
    rnr_ring g;
    int tfd;
    uint8_t *t;                    /* the tensors' memory */
    size_t tbytes;
    uint32_t tregion;
} gring;

static void gring_open(gring *r, const rnh_daemon *d, size_t tbytes)
{
    char msg[RNP_MAX_ERRMSG];

    memset(r, 0, sizeof *r);
    if (rnr_ring_open_sealed(&r->g, d->endpoint, 4, 16 * RNP_GRAPH_SLOT) != 0)
        fail_msg("rnr_ring_open failed");
    r->tbytes = tbytes;
    r->tfd = (int)syscall(SYS_memfd_create, "graph-tensors", 1u);
    assert_true(r->tfd >= 0);
    assert_int_equal(ftruncate(r->tfd, (off_t)tbytes), 0);
    r->t = mmap(NULL, tbytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->tfd, 0);
    assert_true(r->t != MAP_FAILED);
    if (rnr_chan_register(r->g.chan, r->tfd, tbytes, &r->tregion, msg, sizeof msg) != 0)
        fail_msg("REGISTER_FD of the tensors: %s", msg);
}

static void gring_close(gring *r)
{
    rnr_ring_close(&r->g);
    munmap(r->t, r->tbytes);
    close(r->tfd);
}

static void tensor(const gring *r, const void *p, rnp_tensor *t)
{
    t->region.id = r->tregion;
    t->offset = (uint64_t)((const uint8_t *)p - r->t);
}

/* a (pointers into r->t) as a graph slot's descriptor. */
static void graph_req(const gring *r, const rn_bwd_args *a, rnp_bwd_req *b)
{
    rnr_ring_req(&r->g, a, b);
    tensor(r, a->x, &b->x);
    tensor(r, a->dy, &b->dy);
    tensor(r, a->dx, &b->dx);
    if (b->has_w)
        tensor(r, a->w, &b->w);
    if (b->has_rstd)
        tensor(r, a->rstd, &b->rstd);
    if (b->has_dres)
        tensor(r, a->dres, &b->dres);
    if (b->has_dw)
        tensor(r, a->dw, &b->dw);
}

/* Graph slot i (after the ring, in the ring's region). */
static uint8_t *gslot(const gring *r, unsigned i)
{
    return r->g.data + (size_t)i * RNP_GRAPH_SLOT;
}

/* GRAPH_OPEN of slot i with b written into it first (b NULL: as it is).
 * The reply's status; *id the graph, msg its error. */
static int graph_open(gring *r, unsigned i, const rnp_bwd_req *b, uint32_t *id, char *msg,
                      size_t len)
{
    static rnp_request q;
    static rnp_reply rep;

    if (b) {
        memset(gslot(r, i), 0, RNP_GRAPH_SLOT);
        rnp_ring_encode(b, 0, gslot(r, i));
    }
    memset(&q, 0, sizeof q);
    q.op = RN_OP_GRAPH_OPEN;
    q.u.graph_open.session = r->g.session;
    q.u.graph_open.ring = r->g.ring;
    q.u.graph_open.offset = (uint64_t)(gslot(r, i) - r->g.mem);
    int st = rnr_ring_call(&r->g, &q, &rep);
    snprintf(msg, len, "%s", rep.error);
    *id = st == 0 ? rep.u.graph_open.graph : 0;
    return st;
}

static int graph_close(gring *r, uint32_t id)
{
    static rnp_request q;
    static rnp_reply rep;

    memset(&q, 0, sizeof q);
    q.op = RN_OP_GRAPH_CLOSE;
    q.u.graph_close.session = r->g.session;
    q.u.graph_close.ring = r->g.ring;
    q.u.graph_close.graph = id;
    return rnr_ring_call(&r->g, &q, &rep);
}

static uint64_t *w64(uint8_t *slot, unsigned off)
{
    return (uint64_t *)(void *)(slot + off);
}

/* A replay begins: what the captured kernel does (PROTOCOL.md 13.8). */
static void replay_start(uint8_t *slot)
{
    uint64_t *gen = w64(slot, RNP_GSLOT_O_GEN);

    __atomic_store_n(w64(slot, RNP_GSLOT_O_DONE), 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(gen, __atomic_load_n(gen, __ATOMIC_RELAXED) + 1, __ATOMIC_SEQ_CST);
}

/* The captured wait for done; 0, or -1 after timeout_ms. */
static int replay_wait(uint8_t *slot, int timeout_ms)
{
    int64_t t0 = rnh_now_ms();

    while (__atomic_load_n(w64(slot, RNP_GSLOT_O_DONE), __ATOMIC_ACQUIRE) != 1) {
        if (rnh_now_ms() - t0 > timeout_ms)
            return -1;
        usleep(200);
    }
    return 0;
}

/* One replay of slot i whose inputs lie at a: answered without a failure
 * and bitwise equal to the CPU twin. */
static void replay_checked(gring *r, unsigned i, const rn_bwd_args *a, uint64_t seed,
                           const rnv_case *k)
{
    char msg[400];
    rn_bwd_args a2;
    rnv_expect e;

    rnv_setup(k, r->t, seed, &a2);   /* new inputs at the same addresses */
    assert_memory_equal(a, &a2, sizeof a2);
    assert_int_equal(rnv_expect_init(&e, &a2, 0, msg, sizeof msg), 0);
    uint64_t fails = __atomic_load_n(w64(gslot(r, i), RNP_GSLOT_O_FAILS), __ATOMIC_ACQUIRE);
    replay_start(gslot(r, i));
    assert_int_equal(replay_wait(gslot(r, i), WAIT_MS), 0);
    if (__atomic_load_n(w64(gslot(r, i), RNP_GSLOT_O_FAILS), __ATOMIC_ACQUIRE) != fails) {
        rnp_ring_get_result(gslot(r, i), msg, sizeof msg);
        fail_msg("replay of slot %u failed: %s", i, msg);
    }
    if (rnv_compare(&a2, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("replay of slot %u: %s", i, msg);
    rnv_expect_fini(&e);
}

static void small_case(rnv_case *k)
{
    memset(k, 0, sizeof *k);
    k->m = 16;
    k->n = 64;
    k->x = k->dy = k->dx = RN_DTYPE_F32;
    k->w = k->dw = RN_DTYPE_F32;
    k->rstd = true;
    k->eps = 1e-6f;
}

/* ---- a replay refused while classic calls fill the in-flight limit ---------------------- */

typedef struct classic {
    const rnh_daemon *d;
    pthread_barrier_t *ready;      /* both laid out: call at once */
    rnv_case k;
    int rc;
    char err[RN_ERRMSG_LEN];
} classic;

/* One synchronous classic call, long enough on one worker thread that the
 * test sees it in flight; both threads lay their case out first (the
 * inputs take longer to write than the call to run), then call at once. */
static void *classic_call(void *arg)
{
    classic *c = arg;
    rn_client *cl = rnh_client_path(c->d, RN_PATH_CLASSIC);
    void *buf = NULL;
    rn_bwd_args a;

    c->rc = -1;
    if (cl && rn_buffer_alloc(cl, rnv_bytes(&c->k), &buf) == 0)
        rnv_setup(&c->k, buf, 5, &a);
    pthread_barrier_wait(c->ready);
    if (buf) {
        c->rc = rn_rmsnorm_bwd_host(cl, &a, NULL);
        if (c->rc != 0)
            snprintf(c->err, sizeof c->err, "%s", rn_last_error(cl));
        rn_buffer_free(cl, buf);
    } else if (cl) {
        snprintf(c->err, sizeof c->err, "rn_buffer_alloc: %s", rn_last_error(cl));
    }
    rn_close(cl);
    return NULL;
}

static void test_replay_after_classic(void **state)
{
    rnh_daemon *d = *state;
    classic c[2];
    pthread_t th[2];
    pthread_barrier_t ready;
    rnv_case k;
    rn_bwd_args a;
    rnp_bwd_req b;
    gring r;
    uint32_t id;
    char msg[RNP_MAX_ERRMSG];

    /* One worker: the two classic calls run one after the other, and the
     * limit stays full while the first runs. */
    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    rnh_arg(d, "--max-inflight-total");
    rnh_arg(d, "2");
    assert_int_equal(rnh_start(d), 0);
    small_case(&k);
    gring_open(&r, d, rnv_bytes(&k));
    rnv_setup(&k, r.t, 1, &a);
    graph_req(&r, &a, &b);
    if (graph_open(&r, 0, &b, &id, msg, sizeof msg) != 0)
        fail_msg("GRAPH_OPEN: %s", msg);
    replay_checked(&r, 0, &a, 2, &k);   /* a replay with room: runs at once */

    assert_int_equal(pthread_barrier_init(&ready, NULL, 2), 0);
    for (int i = 0; i < 2; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].d = d;
        c[i].ready = &ready;
        c[i].k.m = 4096;
        c[i].k.n = 8192;
        c[i].k.x = c[i].k.dy = c[i].k.dx = RN_DTYPE_BF16;
        c[i].k.w = c[i].k.dw = RN_DTYPE_F32;
        c[i].k.rstd = true;
        c[i].k.eps = 1e-6f;
        assert_int_equal(pthread_create(&th[i], NULL, classic_call, &c[i]), 0);
    }
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 2, WAIT_MS), 0);
    int64_t t0 = rnh_now_ms();
    rn_bwd_args a2;
    rnv_expect e;
    rnv_setup(&k, r.t, 3, &a2);
    assert_int_equal(rnv_expect_init(&e, &a2, 0, msg, sizeof msg), 0);
    replay_start(gslot(&r, 0));
    /* Refused at the limit: left in the slot, not answered. */
    if (rnh_wait_stat_ge(d, "fast.deferred", 1, WAIT_MS) != 0)
        fail_msg("the replay was not refused at the limit: the classic calls were too short "
                 "here (they ran %lld ms)", (long long)(rnh_now_ms() - t0));
    /* Only classic calls end from here on: one of them frees the place. */
    assert_int_equal(replay_wait(gslot(&r, 0), 60000), 0);
    int64_t took = rnh_now_ms() - t0;
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        if (c[i].rc != 0)
            fail_msg("classic call %d: %d %s", i, c[i].rc, c[i].err);
    }
    pthread_barrier_destroy(&ready);
    printf("the replay refused at the limit was answered %lld ms after it began (the classic "
           "calls all ended after %lld ms)\n", (long long)took,
           (long long)(rnh_now_ms() - t0));
    assert_int_equal(__atomic_load_n(w64(gslot(&r, 0), RNP_GSLOT_O_FAILS), __ATOMIC_ACQUIRE),
                     0);
    if (rnv_compare(&a2, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("the replay: %s", msg);
    rnv_expect_fini(&e);
    assert_int_equal(rnh_wait_stat(d, "fast.slots", 2, WAIT_MS), 0);
    assert_int_equal(graph_close(&r, id), 0);
    gring_close(&r);
    RNH_PASS(d);
}

/* ---- --max-graphs ------------------------------------------------------------------------- */

static void test_max_graphs(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k;
    rn_bwd_args a, a2;
    rnp_bwd_req b, b2;
    gring r, r2;
    uint32_t id[3], again, other;
    char msg[RNP_MAX_ERRMSG];

    rnh_arg(d, "--max-graphs");
    rnh_arg(d, "3");
    assert_int_equal(rnh_start(d), 0);
    small_case(&k);
    gring_open(&r, d, rnv_bytes(&k));
    rnv_setup(&k, r.t, 1, &a);
    graph_req(&r, &a, &b);
    for (unsigned i = 0; i < 3; i++)
        if (graph_open(&r, i, &b, &id[i], msg, sizeof msg) != 0)
            fail_msg("GRAPH_OPEN %u: %s", i, msg);
    assert_int_equal(rnh_stat(d, "fast.graphs"), 3);

    /* Past the limit: BUSY naming the setting, in this session ... */
    assert_int_equal(graph_open(&r, 3, &b, &again, msg, sizeof msg), RN_BUSY);
    printf("the fourth: %s\n", msg);
    assert_non_null(strstr(msg, "graph_open"));
    assert_non_null(strstr(msg, "--max-graphs"));
    /* ... and in another: the limit is the daemon's. */
    gring_open(&r2, d, rnv_bytes(&k));
    rnv_setup(&k, r2.t, 1, &a2);
    graph_req(&r2, &a2, &b2);
    assert_int_equal(graph_open(&r2, 0, &b2, &other, msg, sizeof msg), RN_BUSY);
    assert_non_null(strstr(msg, "--max-graphs"));
    assert_int_equal(rnh_stat(d, "fast.graphs"), 3);

    /* Nothing else changed: a re-sent GRAPH_OPEN gets its graph's id, and
     * the open slots replay. */
    assert_int_equal(graph_open(&r, 1, NULL, &again, msg, sizeof msg), 0);
    assert_int_equal(again, id[1]);
    for (unsigned i = 0; i < 3; i++)
        replay_checked(&r, i, &a, 10 + i, &k);

    /* GRAPH_CLOSE gives a place back, to any session. */
    assert_int_equal(graph_close(&r, id[0]), 0);
    assert_int_equal(rnh_stat(d, "fast.graphs"), 2);
    if (graph_open(&r2, 0, &b2, &other, msg, sizeof msg) != 0)
        fail_msg("GRAPH_OPEN after a GRAPH_CLOSE: %s", msg);
    replay_checked(&r2, 0, &a2, 20, &k);
    assert_int_equal(graph_open(&r, 0, &b, &again, msg, sizeof msg), RN_BUSY);

    /* So does the end of a session (its channel closes). */
    gring_close(&r);
    assert_int_equal(rnh_wait_stat(d, "fast.graphs", 1, WAIT_MS), 0);
    if (graph_open(&r2, 1, &b2, &other, msg, sizeof msg) != 0)
        fail_msg("GRAPH_OPEN after the other session ended: %s", msg);
    assert_int_equal(rnh_stat(d, "fast.graphs"), 2);
    gring_close(&r2);
    assert_int_equal(rnh_wait_stat(d, "fast.graphs", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

/* RING_CLOSE gives its ring's graph places back at once, although the
 * ring stays closing while a slot published before it waits for its
 * inputs.  (Before, they stayed counted until the ring closed.) */
static void test_ring_close_frees_graphs(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k;
    rn_bwd_args a, a2;
    rnp_bwd_req b, b2;
    gring r, r2;
    uint32_t id, other;
    char msg[RNP_MAX_ERRMSG];
    static rnp_request q;
    static rnp_reply rep;

    rnh_arg(d, "--max-graphs");
    rnh_arg(d, "1");
    RNH_NEED_READY_MODE(d, "host"); /* (the slot stays in the ring, unready) */
    assert_int_equal(rnh_start(d), 0);
    small_case(&k);
    gring_open(&r, d, rnv_bytes(&k));
    rnv_setup(&k, r.t, 1, &a);
    graph_req(&r, &a, &b);
    if (graph_open(&r, 0, &b, &id, msg, sizeof msg) != 0)
        fail_msg("GRAPH_OPEN: %s", msg);
    rnr_ring_publish(&r.g, &b, NULL, false);
    assert_int_equal(rnh_wait_stat(d, "fast.ready_waits", 1, WAIT_MS), 0);
    memset(&q, 0, sizeof q);
    q.op = RN_OP_RING_CLOSE;
    q.u.ring_close.session = r.g.session;
    q.u.ring_close.ring = r.g.ring;
    assert_int_equal(rnr_ring_call(&r.g, &q, &rep), 0);
    assert_int_equal(rnh_stat(d, "fast.graphs"), 0);
    assert_int_equal(rnh_stat(d, "fast.rings"), 1); /* (closing) */
    gring_open(&r2, d, rnv_bytes(&k));
    rnv_setup(&k, r2.t, 1, &a2);
    graph_req(&r2, &a2, &b2);
    if (graph_open(&r2, 0, &b2, &other, msg, sizeof msg) != 0)
        fail_msg("GRAPH_OPEN beside a closing ring: %s", msg);
    replay_checked(&r2, 0, &a2, 30, &k);
    gring_close(&r);
    gring_close(&r2);
    assert_int_equal(rnh_wait_stat(d, "fast.graphs", 0, WAIT_MS), 0);
    RNH_PASS(d);
}

/* --max-graphs 0: no graph slot at all, ring slots as ever. */
static void test_max_graphs_zero(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k;
    rn_bwd_args a;
    rnp_bwd_req b;
    gring r;
    uint32_t id;
    char msg[RNP_MAX_ERRMSG];

    rnh_arg(d, "--max-graphs");
    rnh_arg(d, "0");
    assert_int_equal(rnh_start(d), 0);
    small_case(&k);
    gring_open(&r, d, rnv_bytes(&k));
    rnv_setup(&k, r.t, 1, &a);
    graph_req(&r, &a, &b);
    assert_int_equal(graph_open(&r, 0, &b, &id, msg, sizeof msg), RN_BUSY);
    assert_non_null(strstr(msg, "--max-graphs"));
    uint64_t seq = rnr_ring_publish(&r.g, &b, NULL, true);
    assert_int_equal(rnr_ring_wait(&r.g, seq, WAIT_MS), 0);
    assert_int_equal(rnr_ring_status(&r.g, seq, msg, sizeof msg), 0);
    gring_close(&r);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replay_after_classic, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_max_graphs, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_close_frees_graphs, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_max_graphs_zero, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
