/* SPDX-License-Identifier: MIT */
/*
 * test_isolation - one client's misbehaviour stays that client's problem.
 *
 * A client that shrinks its own registered shared memory object makes the
 * daemon fault (SIGBUS) when a request touches the missing pages; only that
 * request fails and only the region that holds the page is dropped, while
 * another session's requests, running at the same time on other worker
 * threads, keep succeeding with correct results.  And one session cannot
 * map more than --max-mapped-gib of regions, which leaves address space for
 * everyone else.
 *
 * Both tests talk to the daemon on plain NN_REQ sockets (raw.h) so that
 * each side controls exactly what it registers and sends.  raw.h's request
 * helpers keep their messages in static storage, so the two threads of the
 * first test encode into their own buffers instead.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/raw.h"
#include "rnk.h"

/* ---- requests from any thread -------------------------------------------------------- */

/* A caller's own request, reply and encode buffer (too large for a stack). */
typedef struct wire {
    int sock;
    rnp_session session;
    rnp_request q;
    rnp_reply r;
    uint8_t buf[RNP_MAX_MSG];
} wire;

static wire *wire_open(const rnh_daemon *d)
{
    wire *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->sock = rnr_open(d->endpoint);
    if (w->sock < 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void wire_close(wire *w)
{
    if (!w)
        return;
    rnr_close(w->sock);
    free(w);
}

/* Exchange w->q for w->r.  Returns 0 when a reply came, -1 otherwise. */
static int wire_call(wire *w)
{
    size_t len = 0;
    rnp_error err = {0};
    if (rnp_encode_request(&w->q, w->buf, sizeof w->buf, &len, &err) != 0) {
        printf("encode: %s\n", err.msg);
        return -1;
    }
    return rnr_send_bytes(w->sock, w->buf, len, &w->r);
}

static void wire_req(wire *w, uint32_t op)
{
    static atomic_uint_fast64_t next_id = 1;
    memset(&w->q, 0, sizeof w->q);
    w->q.version = RNP_VERSION;
    w->q.op = op;
    w->q.id = atomic_fetch_add(&next_id, 1);
}

/* HELLO: w->session.  Returns 0 or -1. */
static int wire_hello(wire *w, const char *name)
{
    wire_req(w, RN_OP_HELLO);
    snprintf(w->q.u.hello.client_name, sizeof w->q.u.hello.client_name, "%s", name);
    w->q.u.hello.pid = (uint32_t)getpid();
    if (wire_call(w) != 0 || w->r.status != 0) {
        printf("HELLO failed: %d %s\n", w->r.status, w->r.error);
        return -1;
    }
    w->session = w->r.u.hello.session;
    return 0;
}

/* REGISTER an shm object; *region on success.  Returns the reply's status
 * (w->r.error has the message) or -1 when no reply came. */
static int wire_register(wire *w, const char *name, uint64_t size, uint32_t *region)
{
    wire_req(w, RN_OP_REGISTER);
    w->q.u.reg.session = w->session;
    w->q.u.reg.kind = RNP_REGION_SHM;
    w->q.u.reg.size = size;
    snprintf(w->q.u.reg.shm_name, sizeof w->q.u.reg.shm_name, "%s", name);
    if (wire_call(w) != 0)
        return -1;
    if (w->r.status == 0)
        *region = w->r.u.reg.region.id;
    return w->r.status;
}

static int wire_unregister(wire *w, uint32_t region)
{
    wire_req(w, RN_OP_UNREGISTER);
    w->q.u.unreg.session = w->session;
    w->q.u.unreg.region.id = region;
    if (wire_call(w) != 0)
        return -1;
    return w->r.status;
}

/* ---- one BWD layout shared by both sides -------------------------------------------- */

/*
 * f32 x, dy, dx of [M, N] back to back, then w and dw of [N].  Large enough
 * that a request runs for milliseconds and touches hundreds of pages, small
 * enough to stay quick under the sanitizers.
 */
#define M 256
#define N 2048
#define T ((uint64_t)M * N * sizeof(float))
#define OFF_W (3 * T)
#define OFF_DW (3 * T + N * sizeof(float))
#define REGION_BYTES (3 * T + 2 * N * sizeof(float))

/* Send a sync BWD over the layout in `region`.  Returns the reply status or
 * -1 when no reply came. */
static int wire_bwd(wire *w, uint32_t region, uint64_t seq)
{
    rnp_bwd_req *b = &w->q.u.bwd;
    wire_req(w, RN_OP_BWD);
    b->session = w->session;
    b->seq = seq;
    b->m = M;
    b->n = N;
    b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F32;
    b->x = (rnp_tensor){{region}, 0, N};
    b->dy = (rnp_tensor){{region}, T, N};
    b->dx = (rnp_tensor){{region}, 2 * T, N};
    b->has_w = true;
    b->w_dtype = RN_DTYPE_F32;
    b->w = (rnp_tensor){{region}, OFF_W, 0};
    b->has_dw = true;
    b->dw_dtype = RN_DTYPE_F32;
    b->dw = (rnp_tensor){{region}, OFF_DW, 0};
    b->eps = 1e-6f;
    b->ready_slot = -1;
    b->mode = RNP_MODE_SYNC;
    if (wire_call(w) != 0)
        return -1;
    return w->r.status;
}

/* Create (replacing any leftover) an shm object of `size` bytes; its fd. */
static int shm_make(const char *name, uint64_t size)
{
    int fd;
    shm_unlink(name);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        shm_unlink(name);
        return -1;
    }
    return fd;
}

/* ---- SIGBUS: a client shrinking its own memory hurts only itself --------------------- */

#define ATTACK_ROUNDS 25

typedef struct attacker {
    const rnh_daemon *d;
    char name[64];
    atomic_int done;
    int rounds;       /* rounds that got both expected answers */
    char bad[300];    /* the first unexpected answer, or "" */
} attacker;

/*
 * Each round: grow the object to the layout's size, register it, shrink it
 * to nothing, then ask for a BWD over it.  The daemon must answer
 * OUT_OF_BOUNDS (the request read missing pages) and must have dropped the
 * region, so that a second BWD on it is UNKNOWN_REGION.
 */
static void *attack(void *arg)
{
    attacker *a = arg;
    wire *w = wire_open(a->d);
    uint64_t seq = 1;
    uint32_t region = 0;
    int fd = -1, st;

    if (!w || wire_hello(w, "attacker") != 0) {
        snprintf(a->bad, sizeof a->bad, "attacker: no session");
        goto out;
    }
    fd = shm_make(a->name, 0);
    if (fd < 0) {
        snprintf(a->bad, sizeof a->bad, "attacker: shm_open: %m");
        goto out;
    }
    for (int i = 0; i < ATTACK_ROUNDS; i++) {
        if (ftruncate(fd, (off_t)REGION_BYTES) != 0) {
            snprintf(a->bad, sizeof a->bad, "attacker: ftruncate: %m");
            goto out;
        }
        if ((st = wire_register(w, a->name, REGION_BYTES, &region)) != 0) {
            snprintf(a->bad, sizeof a->bad, "attacker round %d: REGISTER got %d %s (%s)", i, st,
                     st < 0 ? "no reply" : rn_err_name(st), w->r.error);
            goto out;
        }
        if (ftruncate(fd, 0) != 0) {
            snprintf(a->bad, sizeof a->bad, "attacker: ftruncate: %m");
            goto out;
        }
        if ((st = wire_bwd(w, region, seq++)) != RN_OUT_OF_BOUNDS) {
            snprintf(a->bad, sizeof a->bad,
                     "attacker round %d: BWD on the shrunk region got %d %s (%s), expected "
                     "OUT_OF_BOUNDS",
                     i, st, st < 0 ? "no reply" : rn_err_name(st), w->r.error);
            goto out;
        }
        if ((st = wire_bwd(w, region, seq++)) != RN_UNKNOWN_REGION) {
            snprintf(a->bad, sizeof a->bad,
                     "attacker round %d: BWD after the fault got %d %s (%s), expected "
                     "UNKNOWN_REGION",
                     i, st, st < 0 ? "no reply" : rn_err_name(st), w->r.error);
            goto out;
        }
        a->rounds++;
    }
out:
    if (fd >= 0)
        close(fd);
    shm_unlink(a->name);
    wire_close(w);
    atomic_store(&a->done, 1);
    return NULL;
}

/* A pseudo-random float in [-1, 1). */
static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static void test_sigbus_isolation(void **state)
{
    rnh_daemon *d = *state;
    char vname[64], msg[300];
    wire *v;
    attacker a;
    pthread_t th;
    int fd, st, calls = 0;
    uint32_t region = 0;
    uint64_t seq = 1, s = 42;
    float *base, *exp_dx, *exp_dw;
    rnk_bwd_args k;
    rn_client *c;
    rn_health_info h;
    int64_t t0;

    /* Four workers on two cores: the attacker's faulting requests run
     * while the victim's are on other threads. */
    /* The tests of this file register shared memory by name on a plain
     * socket, as a client from before the session channel does. */
    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    rnh_arg(d, "--threads");
    rnh_arg(d, "4");
    assert_int_equal(rnh_start(d), 0);

    /* The victim: a region it never shrinks, filled with a case. */
    snprintf(vname, sizeof vname, "/rn-it.%d.victim", (int)getpid());
    fd = shm_make(vname, REGION_BYTES);
    assert_true(fd >= 0);
    base = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(base != MAP_FAILED);
    for (uint64_t i = 0; i < 2 * (uint64_t)M * N; i++)
        base[i] = rnd(&s); /* x, dy */
    for (int j = 0; j < N; j++)
        ((float *)((char *)base + OFF_W))[j] = 1.0f + 0.5f * rnd(&s);

    /* The expected results, from the same CPU twin the daemon runs (its
     * results do not depend on the thread count). */
    exp_dx = malloc(T);
    exp_dw = malloc(N * sizeof(float));
    assert_non_null(exp_dx);
    assert_non_null(exp_dw);
    k = (rnk_bwd_args){.m = M,
                       .n = N,
                       .x_dtype = RNK_F32,
                       .dy_dtype = RNK_F32,
                       .dx_dtype = RNK_F32,
                       .w_dtype = RNK_F32,
                       .dw_dtype = RNK_F32,
                       .x = base,
                       .x_stride = N,
                       .dy = (char *)base + T,
                       .dy_stride = N,
                       .dx = exp_dx,
                       .dx_stride = N,
                       .w = (char *)base + OFF_W,
                       .dw = exp_dw,
                       .eps = 1e-6f};
    assert_int_equal(rnk_cpu_bwd(&k, 1, msg, sizeof msg), RNK_OK);

    v = wire_open(d);
    assert_non_null(v);
    assert_int_equal(wire_hello(v, "victim"), 0);
    /* Registered before any attacker region exists, so no address the
     * daemon has seen fault can lie inside it. */
    assert_int_equal(wire_register(v, vname, REGION_BYTES, &region), 0);
    /* Both mappings outlive the name; a failing test leaves nothing behind. */
    shm_unlink(vname);

    /* One verified call, poisoned outputs first so that a request that
     * wrote nothing cannot pass. */
#define VICTIM_CALL(what)                                                                       \
    do {                                                                                        \
        memset((char *)base + 2 * T, 0xff, T);                                                  \
        memset((char *)base + OFF_DW, 0xff, N * sizeof(float));                                 \
        st = wire_bwd(v, region, seq++);                                                        \
        if (st != 0)                                                                            \
            fail_msg("%s: victim BWD %d got %d %s (%s)", what, calls, st,                       \
                     st < 0 ? "no reply" : rn_err_name(st), v->r.error);                        \
        if (memcmp((char *)base + 2 * T, exp_dx, T) != 0)                                       \
            fail_msg("%s: victim BWD %d: dx differs from the CPU twin's", what, calls);         \
        if (memcmp((char *)base + OFF_DW, exp_dw, N * sizeof(float)) != 0)                      \
            fail_msg("%s: victim BWD %d: dw differs from the CPU twin's", what, calls);         \
        calls++;                                                                                \
    } while (0)

    VICTIM_CALL("before the attack");

    /* The attack runs in a thread on its own socket and session while the
     * victim keeps a request in the daemon the whole time.  The victim stops
     * once the attacker has finished all its rounds, whatever the timing. */
    memset(&a, 0, sizeof a);
    a.d = d;
    snprintf(a.name, sizeof a.name, "/rn-it.%d.attacker", (int)getpid());
    t0 = rnh_now_ms();
    assert_int_equal(pthread_create(&th, NULL, attack, &a), 0);
    while (!atomic_load(&a.done)) {
        /* fail_msg would leave the thread running on this stack's `a`: join
         * it first, then report. */
        memset((char *)base + 2 * T, 0xff, T);
        memset((char *)base + OFF_DW, 0xff, N * sizeof(float));
        st = wire_bwd(v, region, seq++);
        if (st != 0 || memcmp((char *)base + 2 * T, exp_dx, T) != 0 ||
            memcmp((char *)base + OFF_DW, exp_dw, N * sizeof(float)) != 0) {
            pthread_join(th, NULL);
            if (st != 0)
                fail_msg("during the attack: victim BWD %d got %d %s (%s)", calls, st,
                         st < 0 ? "no reply" : rn_err_name(st), v->r.error);
            fail_msg("during the attack: victim BWD %d: results differ from the CPU twin's",
                     calls);
        }
        calls++;
    }
    pthread_join(th, NULL);
    printf("%d attacker rounds and %d verified victim requests in %lld ms\n", a.rounds, calls,
           (long long)(rnh_now_ms() - t0));
    if (a.bad[0])
        fail_msg("%s", a.bad);
    assert_int_equal(a.rounds, ATTACK_ROUNDS);

    /* The victim's region survived: it still computes correctly, and it is
     * the only region left (every attacker region was dropped). */
    VICTIM_CALL("after the attack");
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    /* Exactly the attacker's requests failed for out-of-bounds memory. */
    assert_int_equal(rnh_stat(d, "errors.OUT_OF_BOUNDS"), ATTACK_ROUNDS);

    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    assert_int_equal(rn_ping(c, NULL), 0);
    rn_close(c);

    wire_close(v);
    munmap(base, REGION_BYTES);
    free(exp_dx);
    free(exp_dw);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
#undef VICTIM_CALL
}

/* ---- --max-mapped-gib: a per-session budget of mapped bytes -------------------------- */

#define GIB (1ull << 30)

static void expect_busy(wire *w, const char *name, uint64_t size, const char *what)
{
    uint32_t r = 0;
    int st = wire_register(w, name, size, &r);
    if (st != RN_BUSY)
        fail_msg("%s: REGISTER of %llu bytes got %d %s (%s), expected BUSY", what,
                 (unsigned long long)size, st, st < 0 ? "no reply" : rn_err_name(st),
                 w->r.error);
    if (!strstr(w->r.error, "register.size"))
        fail_msg("%s: the BUSY message does not name register.size: \"%s\"", what, w->r.error);
}

static void expect_register(wire *w, const char *name, uint64_t size, uint32_t *region,
                            const char *what)
{
    int st = wire_register(w, name, size, region);
    if (st != 0)
        fail_msg("%s: REGISTER of %llu bytes got %d %s (%s)", what, (unsigned long long)size, st,
                 st < 0 ? "no reply" : rn_err_name(st), w->r.error);
}

static void test_mapped_budget(void **state)
{
    rnh_daemon *d = *state;
    char name[64];
    wire *a, *b;
    uint32_t a1 = 0, a2 = 0, a3 = 0, b1 = 0;
    int fd, st;
    rn_client *c;
    rn_health_info h;

    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    rnh_arg(d, "--max-mapped-gib");
    rnh_arg(d, "2");
    assert_int_equal(rnh_start(d), 0);

    /* One sparse 1 GiB object, never touched here, registered as often as
     * the test needs: each REGISTER maps it once more in the daemon. */
    snprintf(name, sizeof name, "/rn-it.%d.sparse", (int)getpid());
    fd = shm_make(name, GIB);
    assert_true(fd >= 0);
    close(fd);

    a = wire_open(d);
    b = wire_open(d);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(wire_hello(a, "budget-a"), 0);
    assert_int_equal(wire_hello(b, "budget-b"), 0);

    /* Up to the budget... */
    expect_register(a, name, GIB, &a1, "first GiB");
    expect_register(a, name, GIB, &a2, "second GiB");
    /* ... and not a byte past it. */
    expect_busy(a, name, GIB, "third GiB");
    expect_busy(a, name, 4096, "a page past the budget");
    assert_int_equal(rnh_stat(d, "regions.active"), 2);

    /* The refusal changed nothing: the session's regions still work. */
    wire_req(a, RN_OP_BWD);
    {
        rnp_bwd_req *q = &a->q.u.bwd;
        q->session = a->session;
        q->seq = 1;
        q->m = 4;
        q->n = 64;
        q->x_dtype = q->dy_dtype = q->dx_dtype = RN_DTYPE_F32;
        q->x = (rnp_tensor){{a2}, 0, 64};
        q->dy = (rnp_tensor){{a2}, 1024, 64};
        q->dx = (rnp_tensor){{a2}, 2048, 64};
        q->eps = 1e-6f;
        q->ready_slot = -1;
        q->mode = RNP_MODE_SYNC;
    }
    assert_int_equal(wire_call(a), 0);
    if (a->r.status != 0)
        fail_msg("BWD on a region after BUSY: %d %s (%s)", a->r.status,
                 rn_err_name(a->r.status), a->r.error);

    /* The budget is per session: another one still registers. */
    expect_register(b, name, GIB, &b1, "another session's GiB");

    /* Unregistering gives the budget back. */
    st = wire_unregister(a, a1);
    if (st != 0)
        fail_msg("UNREGISTER: %d (%s)", st, a->r.error);
    expect_register(a, name, GIB, &a3, "a GiB after UNREGISTER");
    expect_busy(a, name, GIB, "past the budget again");
    assert_int_equal(rnh_stat(d, "regions.active"), 3);

    /* More than the whole budget can never fit: not BUSY ("retry later"). */
    st = wire_register(a, name, 3 * GIB, &a1);
    if (st != RN_TOO_LARGE || !strstr(a->r.error, "register.size"))
        fail_msg("REGISTER of 3 GiB with a 2 GiB budget: %d %s (%s), expected TOO_LARGE", st,
                 st < 0 ? "no reply" : rn_err_name(st), a->r.error);

    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    /* One session at its own limit says nothing of the daemon's health. */
    for (unsigned i = 0; i < h.nreasons; i++)
        printf("health: unexpected reason \"%s\"\n", h.reasons[i]);
    assert_int_equal(h.state, RN_HEALTH_OK);
    rn_close(c);

    wire_close(a);
    wire_close(b);
    shm_unlink(name);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

/* A process that only has to exist, so that HELLO can name its pid. */
static pid_t idle_child(void)
{
    pid_t p = fork();
    if (p == 0) {
        for (;;)
            pause();
    }
    assert_true(p > 0);
    return p;
}

static int wire_hello_pid(wire *w, const char *name, pid_t pid)
{
    wire_req(w, RN_OP_HELLO);
    snprintf(w->q.u.hello.client_name, sizeof w->q.u.hello.client_name, "%s", name);
    w->q.u.hello.pid = (uint32_t)pid;
    if (wire_call(w) != 0 || w->r.status != 0) {
        printf("HELLO failed: %d %s\n", w->r.status, w->r.error);
        return -1;
    }
    w->session = w->r.u.hello.session;
    return 0;
}

/*
 * Every region is one of the daemon's memory mappings, which the kernel
 * limits (vm.max_map_count): a budget in all (here --max-mappings 8), of
 * which one client process holds a quarter at most over all its sessions,
 * so that no client can take every mapping and lock the others out.
 */
static void test_mapping_budget(void **state)
{
    rnh_daemon *d = *state;
    enum { K = 5 };
    wire *w[K + 1];
    pid_t kids[K];
    uint32_t r[K + 1][3];
    char name[64];
    int fd, st;
    rn_client *c;
    rn_health_info h;

    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    rnh_arg(d, "--max-mappings");
    rnh_arg(d, "8");
    assert_int_equal(rnh_start(d), 0);
    snprintf(name, sizeof name, "/rn-it.%d.maps", (int)getpid());
    fd = shm_make(name, 4096);
    assert_true(fd >= 0);
    close(fd);
    for (int i = 0; i < K; i++)
        kids[i] = idle_child();

    /* One client process, two sessions: two regions between them, its share. */
    w[K] = wire_open(d);
    w[0] = wire_open(d);
    assert_int_equal(wire_hello_pid(w[0], "maps-0", kids[0]), 0);
    assert_int_equal(wire_hello_pid(w[K], "maps-0b", kids[0]), 0);
    expect_register(w[0], name, 4096, &r[0][0], "client 0, first");
    expect_register(w[K], name, 4096, &r[K][0], "client 0, second session");
    st = wire_register(w[0], name, 4096, &r[0][1]);
    if (st != RN_BUSY || !strstr(w[0]->r.error, "share"))
        fail_msg("client 0, third region: %d %s, expected BUSY naming its share", st,
                 w[0]->r.error);

    /* Three more clients fill the budget of 8... */
    for (int i = 1; i < 4; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "maps-%d", i);
        w[i] = wire_open(d);
        assert_int_equal(wire_hello_pid(w[i], nm, kids[i]), 0);
        expect_register(w[i], name, 4096, &r[i][0], "a client's first");
        expect_register(w[i], name, 4096, &r[i][1], "a client's second");
    }
    assert_int_equal(rnh_stat(d, "regions.active"), 8);
    /* ... and the next one, well within its own share, finds none left. */
    w[4] = wire_open(d);
    assert_int_equal(wire_hello_pid(w[4], "maps-4", kids[4]), 0);
    st = wire_register(w[4], name, 4096, &r[4][0]);
    if (st != RN_BUSY || !strstr(w[4]->r.error, "max-mappings"))
        fail_msg("client 4 at the budget: %d %s, expected BUSY naming --max-mappings", st,
                 w[4]->r.error);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_DEGRADED);
    bool named = false;
    for (unsigned i = 0; i < h.nreasons; i++)
        named |= strncmp(h.reasons[i], "mappings:", 9) == 0;
    assert_true(named);

    /* A region given back makes room. */
    assert_int_equal(wire_unregister(w[1], r[1][0]), 0);
    expect_register(w[4], name, 4096, &r[4][0], "client 4 after an UNREGISTER");

    rn_close(c);
    for (int i = 0; i <= K; i++)
        wire_close(w[i]);
    for (int i = 0; i < K; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    shm_unlink(name);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

/*
 * A pid claimed in HELLO is not a verified one: sessions that only claim a
 * client's pid (no AUTH) must not use up that client's share.  Here one
 * unauthenticated session claims this process's pid and maps the share (4
 * of --max-mappings 16); this process's own client, authenticated on the
 * session channel, still maps its buffer (before, the claims counted
 * against it: RN_BUSY naming its share).  The claimer is still held to its
 * claimed pid's share.
 */
static void test_claimed_pid_not_charged(void **state)
{
    rnh_daemon *d = *state;
    uint32_t r[5];
    char name[64];
    wire *w;
    void *p = NULL;
    int fd, st;

    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    rnh_arg(d, "--max-mappings");
    rnh_arg(d, "16");
    assert_int_equal(rnh_start(d), 0);
    snprintf(name, sizeof name, "/rn-it.%d.claim", (int)getpid());
    fd = shm_make(name, 4096);
    assert_true(fd >= 0);
    close(fd);
    w = wire_open(d);
    assert_int_equal(wire_hello_pid(w, "claimer", getpid()), 0);
    for (int i = 0; i < 4; i++)
        expect_register(w, name, 4096, &r[i], "the claimer, within its share");
    st = wire_register(w, name, 4096, &r[4]);
    if (st != RN_BUSY || !strstr(w->r.error, "share"))
        fail_msg("the claimer, fifth region: %d %s, expected BUSY naming its share", st,
                 w->r.error);
    rn_client *c = rnh_client(d);
    assert_non_null(c);
    if (rn_buffer_alloc(c, 4096, &p) != 0)
        fail_msg("the verified client's buffer: %s", rn_last_error(c));
    assert_int_equal(rnh_stat(d, "regions.active"), 5);
    assert_int_equal(rn_buffer_free(c, p), 0);
    rn_close(c);
    wire_close(w);
    shm_unlink(name);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sigbus_isolation, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_mapped_budget, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_mapping_budget, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_claimed_pid_not_charged, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
