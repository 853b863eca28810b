/* SPDX-License-Identifier: MIT */
/*
 * ring_take.c - how the loop takes a ring's slots (ring.c says when): the
 * producer word's bounds, the copy of a slot out of shared memory, the
 * slot prepared while its ready word has not come (--ring-ready=host), the
 * hand-off to the request path (rnd_rings.submit), and the turns the rings
 * take.
 */
#include "ring_int.h"

#include <string.h>

#include "ctx.h"
#include "log.h"
#include "rn_ring.h"

/* A slot the loop left this long before taking it is logged (debug). */
#define SLOW_TAKE_NS 5000000ull

/* Whether prod (g's producer word) publishes a slot after the last one
 * taken that may be taken.  A client may be at most a ring's worth of slots
 * ahead of the answers, so of the slots taken: a producer word further on
 * is garbage, and what it claims is never taken. */
bool rnd_ring_takeable(const rnd_ring *g, uint64_t prod)
{
    return !rnp_seq_reached(g->cons, prod) && prod - g->cons <= g->slots;
}

uint64_t rnd_ring_prod(const rnd_ring *g)
{
    if (g->closing || g->ending)
        return g->close_prod;
    return __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_PROD), __ATOMIC_ACQUIRE);
}

/* A slot stays in g for now (its ready word, a limit): since when. */
static void left(rnd_ring *g, const char *why)
{
    if (!g->left_ns) {
        g->left_ns = rnd_now_ns();
        g->left_why = why;
    }
}

/* Slot seq's descriptor copied out once and decoded (0), or its error. */
static int copy_slot(rnd_ring *g, uint64_t seq, rnp_bwd_req *b, rnp_error *err)
{
    uint8_t desc[RNP_RING_DESC];

    /* Once: everything after reads the private copy. */
    memcpy(desc, g->base + rnp_ring_slot_off(seq, g->slots), sizeof desc);
    return rnp_ring_decode(desc, seq, b, err);
}

/* A slot left for its ready word (--ring-ready=host) is prepared meanwhile
 * (copied, decoded, validated, pinned: 4-6 us of the loop's on the H200),
 * so that its submission alone follows ready.  Not while the daemon drains
 * or fails, nor in a session that ends: those slots are answered with an
 * error when taken. */
static void prepare(rnd_ring *g, uint64_t seq)
{
    rnd_rings *tab = g->tab;
    rnd_ctx *ctx = tab->ctx;
    rnp_error err = {0};
    rnp_bwd_req b;

    if (g->prep || !tab->discard || ctx->draining || ctx->failing || g->sess->ending)
        return;
    bool ok = copy_slot(g, seq, &b, &err) == 0;
    rnd_ring_slot at = { g->base, g->base + rnp_ring_slot_off(seq, g->slots), seq, false,
                         g->released, g, false, false, g->done_dev, NULL, 0, 0, &g->prep };
    (void)tab->submit(ctx, g->sess, ok ? &b : NULL, ok ? NULL : &err, &at, rnd_now_ns());
}

/* Take g's published slots, oldest first, until one cannot be taken now
 * or max were taken (0: no limit).  With force (the ring closes) each slot
 * is taken whatever the limits. */
static unsigned take_max(rnd_ring *g, bool force, unsigned max)
{
    rnd_rings *tab = g->tab;
    rnd_session *s = g->sess;
    unsigned n = 0;

    while (g->sess && !g->stopped && (max == 0 || n < max)) {
        uint64_t prod = rnd_ring_prod(g);
        uint64_t seq = g->cons + 1;
        rnp_error err = {0};
        rnp_bwd_req b;
        int rc;

        if (!rnd_ring_takeable(g, prod))
            return n;
        /* --ring-ready=armed: nothing while a revocation's jobs run (a slot
         * taken ungated behind one that skips would write done past it;
         * ring_arm.c's thaw takes the ring's slots again). */
        if (g->frozen) {
            left(g, "a revocation");
            return n;
        }
        /* --ring-ready=host (the cuda backend's default without MPS): the
         * slot waits in the ring until its ready word reaches it (the
         * doorbell thread watches the word and wakes the loop), so that no
         * stream of the daemon waits on a client.  A stream's wait is the
         * faster hop (5-8 us less GPU time a call), but while it waits the
         * driver holds up what shares its hardware queue (the daemon's
         * streams outnumber its 8: other rings' kernels, bench/RESULTS.md:
         * 8 clients, 8 000-17 000 calls a second against 33 000) and the
         * CUDA calls that wait for the device (a new ring's streams: 12
         * clients arriving during one client's 5 s stall waited it out). */
        /* --ring-ready=armed (ring_arm.c): such a slot is taken at once,
         * armed, while the policy lets it; else as in host mode.  (So is a
         * slot whose word came while an armed one before it runs.) */
        bool ready = false, armed = false;
        if (!force && tab->ready_mode != RND_RING_READY_GPU) {
            uint64_t rd = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_READY),
                                          __ATOMIC_ACQUIRE);
            bool came = rnp_seq_reached(rnp_ring_ready_seq(rd), seq);
            armed = g->arm && (!came || rnd_ring_arm_behind(g)) && seq != g->unarmable &&
                    rnd_ring_arm_take(g, seq);
            if (!armed && !came) {
                prepare(g, seq);
                left(g, "its ready word");
                if (__atomic_exchange_n(&g->wait_seq, seq, __ATOMIC_SEQ_CST) != seq) {
                    tab->ctx->stats.fast_ready_waits++;
                    /* (from a long sleep, or the kick word's, when the loop polls) */
                    rnd_rings_kick(tab);
                }
                return n;
            }
            ready = !armed;
            __atomic_store_n(&g->wait_seq, 0, __ATOMIC_SEQ_CST);
        }
        /* No other ring's armed wait may hold this call up. */
        if (tab->ready_mode == RND_RING_READY_ARMED && !tab->arm_free)
            rnd_rings_revoke_others(tab, s, "another client's call");
        uint8_t *slot = g->base + rnp_ring_slot_off(seq, g->slots);
        uint64_t t0 = rnd_now_ns(); /* (fast.take: the copy, checks, pins, submission) */
        rnd_ring_slot at = { g->base, slot, seq, force, g->released, g, false, ready,
                             g->done_dev, armed ? g->arm : NULL, armed ? seq : 0,
                             armed ? g->epoch : 0, NULL };
        rnd_ctx *ctx = tab->ctx;
        if (g->prep && (ctx->draining || ctx->failing || s->ending))
            rnd_ring_drop_prep(g); /* (taken afresh below: answered with the error) */
        if (g->prep) {
            at.prep = &g->prep;
            rc = tab->submit(ctx, s, NULL, NULL, &at, t0);
        } else {
            bool ok = copy_slot(g, seq, &b, &err) == 0;
            rc = tab->submit(ctx, s, ok ? &b : NULL, ok ? NULL : &err, &at, t0);
        }
        if (rc == RND_UNARMABLE) { /* (ring_arm.c) taken again unarmed: left for ready */
            rnd_ring_arm_refused(g, seq);
            g->unarmable = seq;
            continue;
        }
        if (rc != 0 && armed) /* (not taken: the ring's armed calls end before it) */
            rnd_ring_arm_refused(g, seq);
        if (rc == RN_BUSY) { /* taken again once a request frees a limit */
            left(g, "a limit");
            tab->deferred = true;
            return n;
        }
        if (rc != 0) {
            rnd_warn("Ring %u of '%s': slot %llu not taken (%s); the ring stops", g->id, s->name,
                     (unsigned long long)seq, rnp_err_name(rc));
            g->stopped = true;
            g->stop_status = rc;
            return n;
        }
        g->cons = seq;
        g->jobs++;
        n++;
        if (armed)
            tab->ctx->stats.fast_armed++;
        s->last_active_ns = rnd_now_ns();
        rnd_hist_add(&tab->ctx->stats.fast_take, s->last_active_ns - t0);
        if (g->left_ns && s->last_active_ns - g->left_ns > SLOW_TAKE_NS)
            rnd_debug("Ring %u of '%s': slot %llu taken %llu us after the loop first left it "
                      "for %s", g->id, s->name, (unsigned long long)seq,
                      (unsigned long long)(s->last_active_ns - g->left_ns) / 1000, g->left_why);
        g->left_ns = 0;
    }
    return n;
}

unsigned rnd_ring_take(rnd_ring *g, bool force)
{
    return take_max(g, force, 0);
}

/*
 * Every ring's published slots, one a ring in turn: rounds over the rings
 * that took one in the round before, until none takes any, each round
 * from the ring after the one the last call started at.  A ring whose
 * client ran ahead does not hold up the others' calls behind all of its
 * own (a submission is 10-20 us of the loop's), nor does the first ring of
 * the list come first every time (at a limit, one slot taken a call, it
 * took them all; with eight clients calling back to back the first client
 * done finished up to 40 % sooner than the last, bench/RESULTS.md).
 * Returns how many were taken.
 */
unsigned rnd_rings_take_all(rnd_rings *tab)
{
    rn_queue *h = &tab->list;
    rn_queue *start = tab->start && tab->start != h ? tab->start : h->next;
    unsigned n = 0, round;
    bool first = true;

    if (start == h)
        return 0;
    do {
        round = 0;
        rn_queue *q = start;
        do {
            if (q != h) {
                rnd_ring *g = RN_QUEUE_DATA(q, rnd_ring, link);
                if (first || g->more) {
                    unsigned k = take_max(g, false, 1);
                    g->more = k == 1;
                    round += k;
                }
            }
            q = q->next;
        } while (q != start);
        n += round;
        first = false;
    } while (round);
    tab->start = start->next;
    return n;
}
