/* SPDX-License-Identifier: MIT */
/*
 * ring_arm.c - --ring-ready=armed (issue 14): a ring slot whose ready word
 * has not come is queued at once, its kernel behind a stream wait on the
 * ready word (as in gpu mode) that the daemon can end itself, instead of
 * waiting in the ring (host mode).
 *
 * The daemon ends such waits with its own bit of the ready word,
 * RNP_RING_READY_RAISED (bit 62, PROTOCOL.md 13.3): set, the word is past
 * every seq as a stream wait compares, while the client's progress, the
 * word without the bit, is kept (the client's writes replace the whole
 * word, the daemon only sets and clears its bit, with atomic OR and AND).
 * Only rings whose client's stream writes go after ready (RING_OPEN's go)
 * are armed: such a client orders its calls on several streams by go,
 * which the daemon never writes, not by ready, whose bit a stream wait
 * cannot leave out.  An armed job's kernel runs only if its gate is open
 * (backend.h: the client's ready reached its key and no earlier job of
 * its epoch found its gate shut, a latch in the backend's word arm[0]);
 * else it does nothing at all, not even its done words.
 *
 * A revocation (rnd_ring_revoke, the loop) ends the ring's armed waits
 * whose ready had not come: the ring is frozen (nothing is taken, nothing
 * armed), its armed requests after `from` (ready as the client left it)
 * are marked revoked, then the daemon sets its bit, and keeps it set while
 * the ring is frozen (the client's stream may write ready again, clearing
 * it: the doorbell thread sets it back, rnd_ring_arm_poll).  Each revoked
 * job then ran (its client's ready had come by the time its gate looked:
 * answered as any other) or skipped, and once one skipped every later one
 * of the epoch does, so those that ran are the first ones.  When the last
 * revoked job was released the ring thaws: the bit is cleared, the ring
 * goes back to its done word (what ran), takes the skipped slots again
 * (in host mode, or armed in the next epoch) and arms again.  Nothing of
 * the ring is taken while it is frozen: a slot taken ungated behind a
 * skipped one would write done past it.
 *
 * Why revoke: a stream that waits holds up what shares its hardware queue
 * (take_max's comment, ring_take.c).  So a ring is armed only while every
 * request in flight in the daemon is its session's, and is revoked when
 * another ring takes a slot, a classic BWD or a graph replay is submitted,
 * a ring opens, a region is being mapped (server.c's before_map), the cuda
 * gate would hold a close for it (rnd_backend_opts.revoke), the daemon
 * drains, RING_CLOSE comes or its own session ends (a closing ring arms
 * nothing).
 *
 * RMSNORMD_DEBUG_ARM_POLICY=free (being measured): a ring arms whatever
 * else is in flight and other rings' calls take nothing back (the other
 * triggers stay): gpu mode's waits, but ones the daemon can end.
 *
 * What keeps it exact: done is one word ("every slot up to done ended"),
 * so no slot may run after one that skipped, which the latch ensures
 * within an epoch; the epoch changes only at a revocation, after which
 * nothing is taken until every revoked job ended, and the daemon's bit is
 * cleared before anything is armed again.  A slot whose ready word has come
 * is taken ungated, unless an armed slot before it has not ended: then it
 * is armed too (gated behind the same latch), so that a revocation after
 * the client's ready went back (which PROTOCOL.md 13.3 forbids) finds every
 * slot after its `from` armed, and none runs, or writes done, past one that
 * skipped (the latch says which skipped, rnd_ring_gate_was_shut).  One that
 * cannot be gated (invalid, m = 0: its done is a stream write) is refused
 * armed by the backend (RND_UNARMABLE) and waits for its ready word in the
 * ring, as in host mode.  A client whose ready word goes back below an
 * armed call (PROTOCOL.md 13.3 forbids it) only gets its own calls refused
 * (RN_INVALID_ARGUMENT) and its ring no longer armed.
 */
#include "ring_int.h"

#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "log.h"
#include "rn_ring.h"

int rnd_ring_env_us(const char *name, unsigned long max, uint64_t *ns, rnp_error *err)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    unsigned long us = strtoul(v, &end, 10);
    if (*end || us > max)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "%s: not a number of microseconds up to %lu: '%s'", name, max, v);
    *ns = (uint64_t)us * 1000u;
    return 0;
}

int rnd_rings_arm_init(rnd_rings *tab, rnp_error *err)
{
    /* RMSNORMD_DEBUG_ARM_POLICY=free: being measured against the default,
     * alone (above). */
    const char *ap = getenv("RMSNORMD_DEBUG_ARM_POLICY");
    if (!ap || !*ap)
        return 0;
    if (strcmp(ap, "free") != 0 && strcmp(ap, "alone") != 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "RMSNORMD_DEBUG_ARM_POLICY: expected alone or free, got '%s'", ap);
    tab->arm_free = strcmp(ap, "free") == 0;
    if (tab->arm_free && tab->ready_mode == RND_RING_READY_ARMED)
        rnd_warn("RMSNORMD_DEBUG_ARM_POLICY=free: rings arm whatever else is in flight, and "
                 "other rings' calls take nothing back");
    return 0;
}

void rnd_ring_arm_open(rnd_ring *g)
{
    rnd_ctx *ctx = g->tab->ctx;

    if (g->tab->ready_mode == RND_RING_READY_ARMED && g->go && ctx->be->ops->arm_open)
        g->arm = ctx->be->ops->arm_open(ctx->be);
    g->epoch = 1; /* (the latch starts at 0) */
}

void rnd_ring_arm_free(rnd_ring *g)
{
    rnd_ctx *ctx = g->tab->ctx;

    if (g->arm)
        ctx->be->ops->arm_close(ctx->be, g->arm);
    g->arm = NULL;
}

static uint64_t *ready_word(const rnd_ring *g)
{
    return rnp_ring_u64(g->base, RNP_RING_O_READY);
}

/* The client's progress: its ready word without the daemon's bit. */
static uint64_t client_ready(const rnd_ring *g)
{
    return rnp_ring_ready_seq(__atomic_load_n(ready_word(g), __ATOMIC_ACQUIRE));
}

/* The word's top bit: never a client's (seqs stay below 2^62, PROTOCOL.md
 * 13.3), and with it set no armed wait ends, the daemon's bit or not: a
 * client could hold a revocation, and the drain, for good (found in
 * review). */
#define READY_TOP (1ull << 63)

/* The daemon's bit on, the top bit off. */
static void raise_ready(rnd_ring *g)
{
    uint64_t *w = ready_word(g), v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(w, &v, (v & ~READY_TOP) | RNP_RING_READY_RAISED, false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
        ;
}

/* Under mu (the doorbell thread): while g is frozen, the daemon's bit stays
 * set (a write of the client's stream clears it). */
bool rnd_ring_arm_poll(rnd_ring *g)
{
    if (!g->arm || !g->frozen)
        return false;
    uint64_t v = __atomic_load_n(ready_word(g), __ATOMIC_ACQUIRE);
    if (g->raised && (!(v & RNP_RING_READY_RAISED) || (v & READY_TOP)))
        raise_ready(g);
    return true;
}

/* Whether every request in flight in the daemon is g's session's (or the
 * policy is free: RMSNORMD_DEBUG_ARM_POLICY). */
static bool alone(const rnd_ring *g)
{
    const rnd_ctx *ctx = g->tab->ctx;
    return g->tab->arm_free || ctx->inflight_total == g->sess->inflight;
}

bool rnd_ring_arm_behind(const rnd_ring *g)
{
    uint64_t done = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
    return g->armed_upto && !rnp_seq_reached(done, g->armed_upto);
}

bool rnd_ring_arm_take(rnd_ring *g, uint64_t seq)
{
    rnd_rings *tab = g->tab;

    pthread_mutex_lock(&tab->mu);
    /* (behind an armed call not yet ended, a slot whose ready came is
     * gated too: taken ungated, it would run, and write done, even if that
     * call skipped, were the client's ready to go back and a revocation to
     * come; its slot would then be taken again at the thaw) */
    bool armed = g->go && !g->arm_broken && !g->frozen && !g->closing && !g->ending &&
                 !g->sess->ending &&
                 !(__atomic_load_n(ready_word(g), __ATOMIC_ACQUIRE) & READY_TOP) &&
                 (!rnp_seq_reached(client_ready(g), seq) || rnd_ring_arm_behind(g)) &&
                 !rnp_seq_reached(g->revoked_upto, seq) && alone(g);
    if (armed)
        g->armed_upto = seq;
    pthread_mutex_unlock(&tab->mu);
    return armed;
}

void rnd_ring_arm_refused(rnd_ring *g, uint64_t seq)
{
    pthread_mutex_lock(&g->tab->mu);
    if (g->armed_upto == seq)
        g->armed_upto = seq - 1;
    pthread_mutex_unlock(&g->tab->mu);
}

void rnd_ring_arm_misuse(void *owner)
{
    rnd_ring *g = owner;

    pthread_mutex_lock(&g->tab->mu);
    bool first = !g->arm_broken;
    g->arm_broken = true;
    pthread_mutex_unlock(&g->tab->mu);
    if (first) /* (the ring may be closed, its session gone) */
        rnd_warn("Ring %u: its ready word was below an armed call after the call's wait "
                 "ended (PROTOCOL.md 13.3); the ring is no longer armed", g->id);
}

/* The last revoked job of g was released: back to what ran (the ring's done
 * word, between from and the last armed seq), and take the rest again.
 * rewind false: nothing was taken back (none in flight), and no slot is
 * taken again (the slots after the armed ones, taken ungated, had run: a
 * client whose ready went back had them run twice, found in review). */
static void thaw(rnd_ring *g, bool rewind)
{
    uint64_t done = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
    uint64_t back = !rnp_seq_reached(done, g->revoke_from) ? g->revoke_from
                    : rnp_seq_reached(done, g->armed_upto) ? g->armed_upto
                                                           : done;

    pthread_mutex_lock(&g->tab->mu);
    /* The bit off before anything is armed again: an armed wait must end
     * only once its own ready comes. */
    __atomic_fetch_and(ready_word(g), ~RNP_RING_READY_RAISED, __ATOMIC_SEQ_CST);
    g->raised = false;
    g->frozen = false;
    g->armed_upto = back;
    pthread_mutex_unlock(&g->tab->mu);
    /* Their slots are taken again from the first that did not run; a ring
     * that stopped at a slot after them takes them before it stops again. */
    if (rewind && rnp_seq_reached(g->cons, back) && g->cons != back) {
        g->cons = back;
        g->stopped = false;
    }
    __atomic_store_n(&g->wait_seq, 0, __ATOMIC_SEQ_CST);
    rnd_ring_drop_prep(g);
    rnd_debug("Ring %u of '%s': armed calls up to %llu ran, the rest taken again", g->id,
              g->sess ? g->sess->name : "?", (unsigned long long)back);
    if (g->end_pending)
        g->tab->end_thawed(g); /* (before the revoked request's session may go) */
    else
        uv_async_send(&g->tab->async);
}

/* A revoked job was released (it ran or skipped); then the ring's own
 * release. */
static void revoked_released(void *owner)
{
    rnd_ring *g = owner;

    g->tab->revoked_held--;
    if (--g->revoked == 0)
        thaw(g, true);
    g->released(g);
}

unsigned rnd_ring_revoke(rnd_ring *g, const char *why)
{
    rnd_rings *tab = g->tab;
    rnd_ctx *ctx = tab->ctx;

    if (!g->arm || !g->sess || !tab->revoke)
        return 0;
    pthread_mutex_lock(&tab->mu);
    /* From ready as the client left it: an armed call up to there has its
     * inputs ready, and its wait passes or has passed. */
    uint64_t from = client_ready(g);
    if (g->frozen || rnp_seq_reached(from, g->armed_upto)) {
        pthread_mutex_unlock(&tab->mu);
        return 0; /* (every armed wait ended: none left) */
    }
    /* Nothing is taken or armed from now until the revoked jobs ended, and
     * arming goes on in the next epoch. */
    g->frozen = true;
    g->epoch++;
    g->revoke_from = from;
    uint64_t upto = g->armed_upto;
    pthread_mutex_unlock(&tab->mu);

    /* Marked before the bit is set: a job that then finds its gate shut
     * was taken back, not refused (backend.h). */
    unsigned n = tab->revoke(g->sess, g, from, revoked_released);
    g->revoked += n;
    tab->revoked_held += n;
    pthread_mutex_lock(&tab->mu);
    g->raised = true;
    g->revoked_upto = upto;
    raise_ready(g);
    pthread_mutex_unlock(&tab->mu);
    rnd_rings_kick(tab); /* (the doorbell thread keeps the bit set) */
    __atomic_store_n(&g->wait_seq, 0, __ATOMIC_SEQ_CST);
    rnd_ring_drop_prep(g);
    ctx->stats.fast_revokes++;
    rnd_debug("Ring %u of '%s': armed slots %llu..%llu revoked (%s)", g->id, g->sess->name,
              (unsigned long long)from + 1, (unsigned long long)upto, why);
    if (n == 0)
        thaw(g, false); /* (none in flight: the backend answered them, failing) */
    return n;
}

void rnd_rings_revoke_others(rnd_rings *tab, const rnd_session *except, const char *why)
{
    rn_queue *q;

    if (tab->ready_mode != RND_RING_READY_ARMED || !tab->started)
        return;
    RN_QUEUE_FOREACH(q, &tab->list) {
        rnd_ring *g = RN_QUEUE_DATA(q, rnd_ring, link);
        if (g->sess != except && g->arm)
            rnd_ring_revoke(g, why);
    }
}
