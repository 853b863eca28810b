/* SPDX-License-Identifier: MIT */
/*
 * ring_arm.c - --ring-ready=armed (issue 14): a ring slot whose ready word
 * has not come is queued at once, its kernel behind the ring's go word,
 * instead of waiting in the ring (host mode) or behind the ready word
 * itself (gpu mode).
 *
 * Only rings whose client's stream writes go after ready (RING_OPEN's go;
 * PROTOCOL.md 13.3) are armed: the client's own stream releases the wait,
 * as in gpu mode (the fast hop, however late the producer), and the daemon
 * can release it too, which it cannot in gpu mode.  An armed job's kernel
 * runs only if its gate is open (backend.h: the ready word reached its key
 * and no earlier job of its epoch found its gate shut, a latch in the
 * backend's word arm[0]); else it does nothing at all, not even its done
 * words.
 *
 * A revocation (rnd_ring_revoke, the loop) ends the ring's armed waits
 * whose go had not come: the ring is frozen (nothing is taken, nothing
 * armed), its armed requests after `from` (go as the client left it) are
 * marked revoked, then the daemon writes go itself, up to the last armed
 * seq, and keeps it there while the ring is frozen (the client's stream may lower it again: the doorbell thread
 * raises it back, rnd_ring_arm_poll).  Each revoked job then ran (its
 * client's ready had come by the time its gate looked: answered as any
 * other) or skipped, and once one skipped every later one of the epoch
 * does, so those that ran are the first ones.  When the last revoked job
 * was released the ring thaws: it goes back to the ring's done word (what
 * ran), takes the skipped slots again (in host mode, or armed in the next
 * epoch once past the raised go) and arms again.  Nothing of the ring is
 * taken while it is frozen: a slot taken ungated behind a skipped one
 * would write done past it.
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
 * nothing is taken until every revoked job ended.  A slot whose ready word
 * has come is taken ungated: the armed slots before it will find their
 * gates open (ready only grows; a client that breaks that, or writes go
 * before ready, only gets its own calls wrong: the latch says which
 * skipped, rnd_ring_gate_was_shut).  One that cannot be gated (invalid, m = 0:
 * its done is a stream write) is refused armed by the backend
 * (RND_UNARMABLE) and waits for its ready word in the ring, as in host
 * mode.  A slot at or below go (the client's or the daemon's last raise)
 * is never armed: its wait would pass before its ready came.  A client
 * that writes go before ready only gets its own calls refused
 * (RN_INVALID_ARGUMENT) and its ring no longer armed.
 */
#include "ring_int.h"

#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "log.h"
#include "rn_ring.h"

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

static uint64_t go_word(const rnd_ring *g)
{
    return __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_GO), __ATOMIC_ACQUIRE);
}

/* Under mu (the doorbell thread): while g is frozen, go stays raised. */
bool rnd_ring_arm_poll(rnd_ring *g)
{
    if (!g->arm || !g->frozen)
        return false;
    if (g->raise_to && !rnp_seq_reached(go_word(g), g->raise_to))
        __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_GO), g->raise_to, __ATOMIC_SEQ_CST);
    return true;
}

/* Whether every request in flight in the daemon is g's session's (or the
 * policy is free: RMSNORMD_DEBUG_ARM_POLICY). */
static bool alone(const rnd_ring *g)
{
    const rnd_ctx *ctx = g->tab->ctx;
    return g->tab->arm_free || ctx->inflight_total == g->sess->inflight;
}

bool rnd_ring_arm_take(rnd_ring *g, uint64_t seq)
{
    rnd_rings *tab = g->tab;

    pthread_mutex_lock(&tab->mu);
    bool armed = g->go && !g->arm_broken && !g->frozen && !g->closing && !g->ending &&
                 !g->sess->ending && !rnp_seq_reached(go_word(g), seq) &&
                 !rnp_seq_reached(g->raise_to, seq) && alone(g);
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
        rnd_warn("Ring %u: its go word reached a call before its ready word did "
                 "(PROTOCOL.md 13.3); the ring is no longer armed", g->id);
}

/* The last revoked job of g was released: back to what ran (the ring's done
 * word, between from and the last armed seq), and take the rest again. */
static void thaw(rnd_ring *g)
{
    uint64_t done = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
    uint64_t back = !rnp_seq_reached(done, g->revoke_from) ? g->revoke_from
                    : rnp_seq_reached(done, g->armed_upto) ? g->armed_upto
                                                           : done;

    pthread_mutex_lock(&g->tab->mu);
    g->frozen = false;
    g->armed_upto = back;
    pthread_mutex_unlock(&g->tab->mu);
    /* Their slots are taken again from the first that did not run; a ring
     * that stopped at a slot after them takes them before it stops again. */
    if (rnp_seq_reached(g->cons, back) && g->cons != back) {
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
        thaw(g);
    g->released(g);
}

unsigned rnd_ring_revoke(rnd_ring *g, const char *why)
{
    rnd_rings *tab = g->tab;
    rnd_ctx *ctx = tab->ctx;

    if (!g->arm || !g->sess || !tab->revoke)
        return 0;
    pthread_mutex_lock(&tab->mu);
    /* From go as the client left it: an armed call up to the last one
     * taken ungated has its ready already and runs once go is raised (its
     * client's go may never come: it died between the two writes). */
    uint64_t from = go_word(g);
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

    /* Marked before go moves: a job that then finds its gate shut was
     * taken back, not refused (backend.h). */
    unsigned n = tab->revoke(g->sess, g, from, revoked_released);
    g->revoked += n;
    tab->revoked_held += n;
    pthread_mutex_lock(&tab->mu);
    g->raise_to = upto;
    if (!rnp_seq_reached(go_word(g), upto))
        __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_GO), upto, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&tab->mu);
    rnd_rings_kick(tab); /* (the doorbell thread keeps go raised) */
    __atomic_store_n(&g->wait_seq, 0, __ATOMIC_SEQ_CST);
    rnd_ring_drop_prep(g);
    ctx->stats.fast_revokes++;
    rnd_debug("Ring %u of '%s': armed slots %llu..%llu revoked (%s)", g->id, g->sess->name,
              (unsigned long long)from + 1, (unsigned long long)upto, why);
    if (n == 0)
        thaw(g); /* (none in flight: the backend answered them, failing) */
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
