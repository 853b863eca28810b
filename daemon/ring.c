/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the fast path's rings: RING_OPEN and RING_CLOSE, the doorbell
 * thread, and when the loop takes new slots (ring.h says who does what;
 * ring_take.c how).
 * Graph slots (PROTOCOL.md 13.8) are ring_graph.c's: this file calls it to
 * poll their generation words and take their replays.
 */
#include "ring_int.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ctx.h"
#include "log.h"
#include "rn_ring.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX_32
#define FUTEX_32 2
#endif

/* The doorbell thread spins this long after the last new slot ... */
#define SPIN_NS 50000ull
/* ... then sleeps on the doorbells at most this long: slots published
 * without a wake-up (by a GPU, later) are seen within it. */
#define SLEEP_NS 100000000ull
/* futex_waitv takes at most this many words; beyond them (or without it)
 * the thread polls at POLL_NS. */
#define WAITV_MAX 128
#define POLL_NS 1000000ull
/* While graph slots are open the thread sleeps at most this long: a replay
 * writes its generation word from the GPU, which rings no doorbell (a host
 * node could, but holds the stream tens of microseconds a replay). */
#define GRAPH_POLL_NS 20000ull
/* --ring-ready=host and armed: while a slot waits for its ready word the
 * thread spins this long after anything came, then polls at a
 * READY_LAG_SHARE-th of the time since, within GRAPH_POLL_NS .. POLL_NS (a
 * producer late by D is seen within about D / 250, and a long wait costs
 * few wake-ups). */
#define READY_SPIN_NS 1000000ull
#define READY_LAG_SHARE 250u

struct waitv {
    uint64_t val, uaddr;
    uint32_t flags, reserved;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Under mu: whether a ring has slots the loop has not been told of, or
 * (--ring-ready=host) a slot the loop left became ready; *waiting says
 * whether a ring still has one left for its ready word, or is frozen by a
 * revocation (--ring-ready=armed: this thread keeps the daemon's bit of
 * its ready word set, ring_arm.c). */
static bool scan(rnd_rings *tab, bool *waiting)
{
    bool any = false;
    rn_queue *q;
    *waiting = false;
    RN_QUEUE_FOREACH(q, &tab->list) {
        rnd_ring *g = RN_QUEUE_DATA(q, rnd_ring, link);
        if (g->arm && rnd_ring_arm_poll(g))
            *waiting = true;
        uint64_t prod = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_PROD), __ATOMIC_ACQUIRE);
        if (prod != g->seen) {
            g->seen = prod;
            any = true;
        }
        uint64_t w = __atomic_load_n(&g->wait_seq, __ATOMIC_SEQ_CST);
        if (w) {
            uint64_t ready = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_READY),
                                             __ATOMIC_ACQUIRE);
            if (rnp_seq_reached(rnp_ring_ready_seq(ready), w) &&
                __atomic_compare_exchange_n(&g->wait_seq, &w, 0, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST))
                any = true;
            else
                *waiting = true;
        }
        if (rnd_graphs_poll(g))
            any = true;
    }
    return any;
}

/* Under mu: say whether the thread sleeps (PROTOCOL.md: the client reads
 * this after it published a slot, and rings the doorbell only when set). */
static void set_sleeping(rnd_rings *tab, uint32_t v)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &tab->list)
        __atomic_store_n(rnp_ring_u32(RN_QUEUE_DATA(q, rnd_ring, link)->base, RNP_RING_O_SLEEPING),
                         v, __ATOMIC_SEQ_CST);
}

/* Sleep on the kick word and every ring's doorbell until one changes or
 * the timeout; short is the timeout when a GPU may write a word that is
 * polled (a graph slot's generation, a ready word), else 0.  The words'
 * values are read under mu before the sleeping flags are set, so a
 * doorbell rung after that ends the sleep at once.  Returns false when the
 * kernel has no futex_waitv. */
static bool doze(struct waitv *w, uint32_t n, bool poll_only, uint64_t short_ns)
{
    struct timespec ts;
    uint64_t t = now_ns() + (short_ns ? short_ns : poll_only ? POLL_NS : SLEEP_NS);
    ts.tv_sec = (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
    if (!poll_only && (syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC) >= 0 ||
                       errno != ENOSYS))
        return true;
    struct timespec d = { 0, (long)(short_ns ? short_ns : POLL_NS) };
    nanosleep(&d, NULL);
    return poll_only;
}

/* The doorbell thread's longest sleep while words a GPU writes are polled
 * (0: none are): graph slots' generation words every GRAPH_POLL_NS; the
 * ready words slots wait for, idle_ns after anything last came, every
 * idle_ns / READY_LAG_SHARE within GRAPH_POLL_NS .. POLL_NS. */
static uint64_t short_sleep_ns(const rnd_rings *tab, bool waiting, uint64_t idle_ns)
{
    uint64_t lag = idle_ns / READY_LAG_SHARE;
    if (tab->graphs || (waiting && lag < GRAPH_POLL_NS))
        return GRAPH_POLL_NS;
    return !waiting ? 0 : lag < POLL_NS ? lag : POLL_NS;
}

static void *doorbell_thread(void *arg)
{
    rnd_rings *tab = arg;
    static struct waitv w[WAITV_MAX];
    uint64_t active = now_ns();
    bool have_waitv = true, waiting;

    /* Short sleeps (GRAPH_POLL_NS) should be short: the default slack of
     * 50 us would more than triple them. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

    pthread_mutex_lock(&tab->mu);
    while (!tab->stop) {
        bool found = scan(tab, &waiting);
        uint64_t now = now_ns(), short_ns = short_sleep_ns(tab, waiting, now - active);
        if (!found && __atomic_load_n(&tab->loop_polls, __ATOMIC_SEQ_CST)) {
            /* The loop polls the rings itself (ring.c's on_poll): no spin
             * here, and the sleeping flags stay 0, so clients ring no
             * doorbell; graph slots are still polled.  The loop kicks when
             * it stops, and the thread then goes to sleep as usual (a slot
             * published meanwhile is in the scan before the flags are set,
             * or rings). */
            uint32_t k = __atomic_load_n(&tab->kick, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&tab->loop_polls, __ATOMIC_SEQ_CST)) {
                struct timespec ts = {0, (long)(short_ns ? short_ns : SLEEP_NS)};
                pthread_mutex_unlock(&tab->mu);
                syscall(SYS_futex, &tab->kick, FUTEX_WAIT_PRIVATE, k, &ts, NULL, 0);
                pthread_mutex_lock(&tab->mu);
            }
            continue;
        }
        if (!found && now - active < (waiting ? tab->ready_spin_ns : SPIN_NS)) {
            pthread_mutex_unlock(&tab->mu);
            sched_yield();
            pthread_mutex_lock(&tab->mu);
            continue;
        }
        if (!found) {
            uint32_t n = 0;
            rn_queue *q;
            w[n++] = (struct waitv){ __atomic_load_n(&tab->kick, __ATOMIC_SEQ_CST),
                                     (uintptr_t)&tab->kick, FUTEX_32 | FUTEX_PRIVATE_FLAG, 0 };
            RN_QUEUE_FOREACH(q, &tab->list) {
                uint32_t *bell = rnp_ring_u32(RN_QUEUE_DATA(q, rnd_ring, link)->base,
                                              RNP_RING_O_DOORBELL);
                if (n < WAITV_MAX)
                    w[n++] = (struct waitv){ __atomic_load_n(bell, __ATOMIC_SEQ_CST),
                                             (uintptr_t)bell, FUTEX_32, 0 };
            }
            bool poll_only = !have_waitv || n < 1 + tab->open;
            set_sleeping(tab, 1);
            atomic_thread_fence(memory_order_seq_cst);
            /* A slot published before the flag was visible: its client
             * did not ring. */
            found = scan(tab, &waiting);
            if (!found && !tab->stop) {
                /* From this scan: a slot the loop left since the first one
                 * came with a kick that w[0] may have counted already, so
                 * only this scan's view of the waits bounds the sleep. */
                short_ns = short_sleep_ns(tab, waiting, now_ns() - active);
                uint64_t t_doze = now_ns();
                pthread_mutex_unlock(&tab->mu);
                if (!doze(w, n, poll_only, short_ns))
                    have_waitv = false;
                pthread_mutex_lock(&tab->mu);
                found = scan(tab, &waiting);
                if (found && !short_ns && !poll_only && now_ns() - t_doze >= SLEEP_NS - 1000000)
                    /* Nothing woke it: a client that published without
                     * ringing (a GPU's write, or a lost wake-up). */
                    rnd_debug("Doorbell thread: a slot was found only when a %llu ms sleep "
                              "ended", (unsigned long long)(now_ns() - t_doze) / 1000000);
            }
            set_sleeping(tab, 0);
        }
        if (found) {
            pthread_mutex_unlock(&tab->mu);
            uv_async_send(&tab->async);
            active = now_ns();
            pthread_mutex_lock(&tab->mu);
        }
    }
    pthread_mutex_unlock(&tab->mu);
    return NULL;
}

/* ---- the loop: taking slots ------------------------------------------------------------- */

static void ring_free(rnd_ring *g)
{
    rnd_graphs_free(g);
    rnd_ring_arm_free(g); /* (every job of it ended: nothing reads the words) */
    g->region->rings--; /* (before state: a client that sees it may open a ring there) */
    /* Every slot taken was answered (a live client's) or let go (a dead
     * one's, cancelled): nothing of the ring runs any more, and the client
     * may stop waiting.  A client taken for dead may live on (it only
     * closed its channel): its streams go on once it sees this. */
    __atomic_store_n(rnp_ring_u32(g->base, RNP_RING_O_STATE), RNP_RING_CLOSED, __ATOMIC_RELEASE);
    rnd_region_unref(g->region);
    if (g->done_region)
        rnd_region_unref(g->done_region);
    free(g);
}

static void on_released(void *owner)
{
    rnd_ring *g = owner;

    g->jobs--;
    if (g->closed && g->jobs == 0) {
        ring_free(g);
        return;
    }
    /* A limit may have cleared for any ring. */
    uv_async_send(&g->tab->async);
}

/*
 * The loop's own poll (--ring-spin-us): after it took a slot the loop
 * stays awake for that long, looking at the rings' producer words at every
 * turn, so that a call coming soon after is taken with no wake-up of the
 * doorbell thread and then of the loop, which together cost 30-55 us p50
 * on the H200 host at one call every 0.3-1 ms (bench_wake,
 * bench/RESULTS.md).  An idle handle keeps libuv's poll from sleeping; it
 * stops once nothing came for the whole span.  Graph slots are left to the
 * doorbell thread, and so are slots while one waits at a limit (the
 * request that frees it wakes the rings).
 */
static void close_finished(rnd_rings *tab);

static void on_poll(uv_idle_t *h)
{
    rnd_rings *tab = h->data;
    uint64_t now = rnd_now_ns();
    unsigned n = 0;

    if (!tab->deferred)
        n = rnd_rings_take_all(tab);
    close_finished(tab); /* (a ring may also have stopped taking nothing) */
    if (n) {
        tab->ctx->stats.fast_polled += n;
        tab->poll_until = now + (uint64_t)tab->ctx->cfg.ring_spin_us * 1000u;
    } else if (now >= tab->poll_until) {
        uv_idle_stop(&tab->poll);
        /* The doorbell thread takes over again (and sets the sleeping
         * flags before it sleeps). */
        __atomic_store_n(&tab->loop_polls, 0, __ATOMIC_SEQ_CST);
        rnd_rings_kick(tab);
    }
}

static void poll_arm(rnd_rings *tab)
{
    if (tab->ctx->cfg.ring_spin_us <= 0 || tab->stop)
        return;
    tab->poll_until = rnd_now_ns() + (uint64_t)tab->ctx->cfg.ring_spin_us * 1000u;
    if (__atomic_load_n(&tab->loop_polls, __ATOMIC_SEQ_CST))
        return;
    __atomic_store_n(&tab->loop_polls, 1, __ATOMIC_SEQ_CST);
    uv_idle_start(&tab->poll, on_poll);
    /* A doorbell thread that went to sleep meanwhile wakes, clears the
     * sleeping flags and leaves the slots to the loop. */
    rnd_rings_kick(tab);
}

static void take_turn(rnd_rings *tab);

static void on_async(uv_async_t *h)
{
    take_turn(h->data);
}

void rnd_rings_bell(rnd_rings *tab, rnd_session *s)
{
    rnd_ring *g = s ? s->ring : NULL;

    if (!g || g->closed || g->stopped)
        return;
    uint64_t prod = rnd_ring_prod(g);
    if (!rnd_ring_takeable(g, prod))
        return; /* (nothing new: taken already, or a bell rung for nothing) */
    tab->ctx->stats.fast_bells++;
    /* The doorbell thread need not report what the loop takes now. */
    pthread_mutex_lock(&tab->mu);
    g->seen = prod;
    pthread_mutex_unlock(&tab->mu);
    take_turn(tab);
}

/* The loop's turn at the rings: new slots, graph replays, closing rings;
 * after it took a slot it polls on for a while (--ring-spin-us). */
static void take_turn(rnd_rings *tab)
{
    rn_queue *q;

    tab->deferred = false; /* set again by what stays at a limit */
    unsigned n = rnd_rings_take_all(tab);
    RN_QUEUE_FOREACH(q, &tab->list)
        rnd_graphs_take(RN_QUEUE_DATA(q, rnd_ring, link));
    close_finished(tab);
    if (n)
        poll_arm(tab);
}

/* No more slots: off the thread's list, closed; freed now or after its
 * last job. */
static void ring_close(rnd_ring *g)
{
    rnd_rings *tab = g->tab;

    rnd_ring_drop_prep(g);
    pthread_mutex_lock(&tab->mu);
    if (tab->start == &g->link)
        tab->start = g->link.next;
    rn_queue_remove(&g->link);
    tab->open--;
    tab->graphs -= g->ngraphs;
    pthread_mutex_unlock(&tab->mu);
    if (g->closing)
        tab->closing--;
    if (g->sess)
        g->sess->ring = NULL;
    g->sess = NULL;
    g->closed = true;
    g->region->ring = false;
    if (g->jobs == 0)
        ring_free(g);
}

bool rnd_ring_pending(const rnd_session *s)
{
    const rnd_ring *g = s->ring;

    if (!g || g->closed || g->stopped)
        return false;
    return rnd_ring_takeable(g, rnd_ring_prod(g));
}

/* A closing ring has taken every slot published before its RING_CLOSE
 * (or stopped taking): it closes now. */
static bool close_due(const rnd_ring *g) /* (not while frozen: ring_arm.c) */
{
    return g->closing && !g->frozen && (g->stopped || !rnd_ring_takeable(g, g->close_prod));
}

/* The loop, after takes (also on every turn of its poll: nothing to do
 * unless a ring is closing). */
static void close_finished(rnd_rings *tab)
{
    rn_queue *q, *next;

    if (!tab->closing)
        return;
    RN_QUEUE_FOREACH_SAFE(q, next, &tab->list) {
        rnd_ring *g = RN_QUEUE_DATA(q, rnd_ring, link);
        if (close_due(g))
            ring_close(g);
    }
}

/* A ring at its session's end: a live client's rest of published slots
 * taken past the limits, then closed; also rnd_rings.end_thawed (ring_arm.c's
 * thaw of a ring whose session ended meanwhile). */
static void end_live(void *ring)
{
    rnd_ring *g = ring;
    g->end_pending = false;
    if (!g->gone) {
        rnd_ring_take(g, true);
        if (!g->closing) /* (RING_CLOSE ended them) */
            rnd_graphs_end(g, RN_UNKNOWN_SESSION);
    }
    ring_close(g);
}

void rnd_ring_session_end(rnd_session *s)
{
    rnd_ring *g = s->ring;

    if (!g)
        return;
    g->gone = s->gone;
    rnd_ring_revoke(g, "its session ends"); /* (a live client's skips: taken below) */
    /* A client that lives on gets an answer for every slot it published
     * before its session ended (a ring's worth at most: the producer word
     * as it is now; before, it was read again after each take, and a
     * client publishing on kept the loop taking); one that died gets none,
     * and its queued jobs are cancelled. */
    if (!g->gone) {
        if (!g->closing) {
            g->close_prod = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_PROD),
                                            __ATOMIC_ACQUIRE);
            if (!rnd_ring_takeable(g, g->close_prod))
                g->close_prod = g->cons; /* (nothing, or garbage: none of it is taken) */
            g->ending = true;
        }
    }
    if (g->frozen) /* (the session stays while revoked requests run) */
        g->end_pending = true; /* (its bit of ready set till the thaw: a client gone may live on) */
    else
        end_live(g);
}

/* ---- RING_OPEN, RING_CLOSE ---------------------------------------------------------------- */

/* RING_OPEN's done word (PROTOCOL.md 13.2): a u64 in another region of the
 * session (device memory on the cuda backend), which the backend writes
 * done to as well. */
static int done_word(rnd_ctx *ctx, rnd_session *s, const rnp_ring_open_req *o, rnd_region **dr,
                     void **out, rnp_error *err)
{
    rnd_region *r = rnd_region_find(s, o->done_region.id);

    if (!r)
        return rnp_fail(err, RN_UNKNOWN_REGION,
                        "ring_open.done_region: no region %u in this session",
                        (unsigned)o->done_region.id);
    if (o->done_offset % 8)
        return rnp_fail(err, RN_MISALIGNED,
                        "ring_open.done_offset: %llu is not a multiple of 8",
                        (unsigned long long)o->done_offset);
    if (o->done_offset > r->map.size || r->map.size - o->done_offset < 8)
        return rnp_fail(err, RN_OUT_OF_BOUNDS,
                        "ring_open.done_offset: %llu is past the end of region %u (%llu bytes)",
                        (unsigned long long)o->done_offset, (unsigned)r->id,
                        (unsigned long long)r->map.size);
    if (r->ring || r->rings || r->id == o->region.id)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.done_region: region %u holds a ring, not device memory",
                        (unsigned)r->id);
    if (!ctx->dev.done_words || !ctx->be->ops->device_word)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "ring_open.done_region: the %s backend writes done to the ring only",
                        ctx->dev.backend);
    int rc = ctx->be->ops->device_word(ctx->be, &r->map, o->done_offset, out, err);
    if (rc == 0)
        *dr = r;
    return rc;
}

int rnd_op_ring_open(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                     rnp_error *err)
{
    const rnp_ring_open_req *o = &req->u.ring_open;
    rnd_rings *tab = &ctx->rings;
    uint8_t line[RNP_RING_LINE];
    uint64_t end;
    rnd_region *r;
    rnd_ring *g;
    int rc;

    /* (a decoding matter: before every other check, as section 2 orders) */
    if (!o->done_region.id && o->done_offset)
        return rnp_fail(err, RN_MISSING_FIELD,
                        "ring_open.done_region: done_offset is given without it");
    if (!ctx->dev.rings || !tab->started)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "ring_open: the %s backend does not offer the fast path yet; use BWD",
                        ctx->dev.backend);
    if (s->ring && ((rnd_ring *)s->ring)->closing)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open: ring %u of the session is closing (slots published before "
                        "its RING_CLOSE are not all taken yet)",
                        (unsigned)((rnd_ring *)s->ring)->id);
    if (s->ring)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "ring_open: the session has a ring open");
    if (!(r = o->region.id ? rnd_region_find(s, o->region.id) : NULL))
        return rnp_fail(err, RN_UNKNOWN_REGION, "ring_open.region: no region %u in this session",
                        (unsigned)o->region.id);
    /* A ring closed there may still answer its slots, writing done and
     * state into the same memory: not before it wrote state = 1. */
    if (r->rings)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.region: a ring closed in region %u still answers its slots "
                        "(its state word becomes 1 when it is done)", (unsigned)r->id);
    if (o->offset % RNP_RING_ALIGN)
        return rnp_fail(err, RN_MISALIGNED, "ring_open.offset: %llu is not a multiple of %u",
                        (unsigned long long)o->offset, RNP_RING_ALIGN);
    if (o->slots == 0 || o->slots > RNP_RING_MAX_SLOTS || (o->slots & (o->slots - 1)))
        return rnp_ring_check_header(NULL, o->slots, err);
    if (__builtin_add_overflow(o->offset, rnp_ring_bytes(o->slots), &end) || end > r->map.size)
        return rnp_fail(err, RN_OUT_OF_BOUNDS,
                        "ring_open.offset: a ring of %u slots at %llu exceeds region %u of %llu "
                        "bytes", o->slots, (unsigned long long)o->offset, (unsigned)r->id,
                        (unsigned long long)r->map.size);
    uint8_t *base = (uint8_t *)r->map.base + o->offset;
    memcpy(line, base, sizeof line);
    if ((rc = rnp_ring_check_header(line, o->slots, err)) != 0)
        return rc;
    if (__atomic_load_n(rnp_ring_u64(base, RNP_RING_O_PROD), __ATOMIC_ACQUIRE) != 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.prod: a new ring has published nothing (the word is 0)");
    rnd_region *dr = NULL;
    void *done_dev = NULL;
    if (o->done_region.id && (rc = done_word(ctx, s, o, &dr, &done_dev, err)) != 0)
        return rc;
    if (!(g = calloc(1, sizeof *g)))
        return rnp_fail(err, RN_NOMEM, "ring_open: out of memory");
    g->id = ++tab->next_id ? tab->next_id : ++tab->next_id;
    g->tab = tab;
    g->sess = s;
    g->region = r;
    g->base = base;
    g->slots = o->slots;
    g->region_off = o->offset;
    g->released = on_released;
    g->done_region = dr;
    g->done_dev = done_dev;
    g->go = o->go;
    /* A new ring's streams may be made (CUDA calls that can wait for the
     * device): no armed wait of another ring's may hold them up. */
    rnd_rings_revoke_others(tab, s, "a new ring");
    rnd_ring_arm_open(g);
    if (dr)
        dr->refs++;
    rn_queue_init(&g->graphs);
    r->refs++;
    r->rings++;
    r->ring = true;
    s->ring = g;
    __atomic_store_n(rnp_ring_u64(base, RNP_RING_O_DONE), 0, __ATOMIC_RELAXED);
    __atomic_store_n(rnp_ring_u64(base, RNP_RING_O_GO), 0, __ATOMIC_RELAXED);
    __atomic_store_n(rnp_ring_u32(base, RNP_RING_O_STATE), RNP_RING_OPEN, __ATOMIC_RELAXED);
    __atomic_store_n(rnp_ring_u32(base, RNP_RING_O_CLOSE_STATUS), 0, __ATOMIC_RELAXED);
    pthread_mutex_lock(&tab->mu);
    rn_queue_push_back(&tab->list, &g->link);
    tab->open++;
    pthread_mutex_unlock(&tab->mu);
    rnd_rings_kick(tab);
    rnd_debug("Ring %u of '%s' open: region %u at %llu, %u slots", g->id, s->name,
              (unsigned)r->id, (unsigned long long)o->offset, g->slots);
    rep->u.ring_open.ring = g->id;
    return 0;
}

int rnd_op_ring_close(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                      rnp_error *err)
{
    rnd_ring *g = s->ring;

    if (!g || g->id != req->u.ring_close.ring)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_close.ring: no ring %u open in this session",
                        (unsigned)req->u.ring_close.ring);
    if (g->closing)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "ring_close.ring: ring %u is closing already",
                        (unsigned)g->id);
    /* Slots published before RING_CLOSE are taken and answered as usual,
     * within the limits (a client whose inputs never come keeps its slots
     * in the ring, not in flight); slots published later are not taken.
     * The ring closes once they are all taken (close_finished); until then
     * the session opens no other ring, but its region may go. */
    g->closing = true;
    ctx->rings.closing++;
    g->close_prod = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_PROD), __ATOMIC_ACQUIRE);
    if (!rnd_ring_takeable(g, g->close_prod))
        g->close_prod = g->cons; /* (nothing, or garbage: none of it is taken) */
    g->region->ring = false;
    rnd_graphs_end(g, RN_UNKNOWN_SESSION);
    rnd_graphs_drop(g);
    /* Armed waits end (no revocation reaches a ring off the list); the
     * ring stays until it took the skipped slots again (close_due). */
    rnd_ring_revoke(g, "RING_CLOSE");
    rnd_ring_take(g, false);
    if (close_due(g))
        ring_close(g);
    return 0;
}

void rnd_rings_limit_freed(rnd_rings *tab)
{
    if (!tab->deferred || !tab->started)
        return;
    tab->deferred = false;
    uv_async_send(&tab->async);
}

/* ---- start, stop ---------------------------------------------------------------------------- */

int rnd_rings_init(rnd_ctx *ctx, rnd_rings *tab, rnd_ring_submit_fn *submit, rnp_error *err)
{
    int rc;

    memset(tab, 0, sizeof *tab);
    tab->ctx = ctx;
    tab->submit = submit;
    tab->end_thawed = end_live;
    /* auto: cuda, armed under MPS (what gpu adds, late producers too; host
     * adds 80-260 us then: bench/RESULTS.md), else host (a stream's wait on
     * a client is a context switch); cpu: gpu (its workers wait for ready). */
    tab->ready_mode = ctx->cfg.ring_ready;
    if (tab->ready_mode == RND_RING_READY_AUTO)
        tab->ready_mode = strcmp(ctx->dev.backend, "cuda") != 0 ? RND_RING_READY_GPU
                          : ctx->dev.mps ? RND_RING_READY_ARMED : RND_RING_READY_HOST;
    if (tab->ready_mode == RND_RING_READY_ARMED && !ctx->be->ops->arm_open)
        tab->ready_mode = RND_RING_READY_HOST;
    /* RMSNORMD_DEBUG_READY_SPIN_US=N (being measured: what the spin costs a
     * host whose cores the clients need): the spin for ready words. */
    tab->ready_spin_ns = READY_SPIN_NS;
    if ((rc = rnd_ring_env_us("RMSNORMD_DEBUG_READY_SPIN_US", 1000000, &tab->ready_spin_ns,
                              err)) != 0)
        return rc;
    if (tab->ready_spin_ns != READY_SPIN_NS)
        rnd_warn("RMSNORMD_DEBUG_READY_SPIN_US=%llu: the doorbell thread spins that many us "
                 "for ready words", (unsigned long long)(tab->ready_spin_ns / 1000));
    if ((rc = rnd_rings_arm_init(tab, err)) != 0)
        return rc;
    rn_queue_init(&tab->list);
    if (!ctx->dev.rings)
        return 0;
    if ((rc = pthread_mutex_init(&tab->mu, NULL)) != 0)
        return rnp_fail(err, RN_SYSTEM, "rings: mutex: %s", strerror(rc));
    if ((rc = uv_async_init(ctx->loop, &tab->async, on_async)) != 0) {
        pthread_mutex_destroy(&tab->mu);
        return rnp_fail(err, RN_SYSTEM, "rings: uv_async_init: %s", uv_strerror(rc));
    }
    tab->async.data = tab;
    uv_idle_init(ctx->loop, &tab->poll); /* (cannot fail) */
    tab->poll.data = tab;
    if ((rc = pthread_create(&tab->thread, NULL, doorbell_thread, tab)) != 0) {
        uv_close((uv_handle_t *)&tab->poll, NULL);
        uv_close((uv_handle_t *)&tab->async, NULL);
        pthread_mutex_destroy(&tab->mu);
        return rnp_fail(err, RN_SYSTEM, "rings: starting the doorbell thread: %s", strerror(rc));
    }
    tab->started = true;
    rnd_info("Fast path: %s (--ring-ready)",
             tab->ready_mode == RND_RING_READY_HOST
                 ? "a slot is taken once its inputs are ready; no stream waits on a client"
             : tab->ready_mode == RND_RING_READY_ARMED
                 ? "armed: a slot of a ring whose client writes go is queued at once, its "
                   "wait on ready guarded by a bit the daemon sets to take it back"
                 : strcmp(ctx->dev.backend, "cpu") == 0
                 ? "a slot is taken at once; its job waits for its ready word"
                 : "a slot is taken at once; its stream waits for its inputs on the GPU");
    return 0;
}

void rnd_rings_fini(rnd_rings *tab)
{
    if (!tab->started)
        return;
    pthread_mutex_lock(&tab->mu);
    tab->stop = true;
    pthread_mutex_unlock(&tab->mu);
    rnd_rings_kick(tab);
    pthread_join(tab->thread, NULL);
    tab->started = false;
    __atomic_store_n(&tab->loop_polls, 0, __ATOMIC_SEQ_CST);
    uv_idle_stop(&tab->poll);
    uv_close((uv_handle_t *)&tab->poll, NULL);
    uv_close((uv_handle_t *)&tab->async, NULL);
    pthread_mutex_destroy(&tab->mu);
}
