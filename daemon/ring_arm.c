/* SPDX-License-Identifier: MIT */
/*
 * ring_arm.c - --ring-ready=armed (being measured, issue 14): a ring slot
 * whose ready word has not come is queued at once, behind a word of the
 * daemon's own, instead of waiting in the ring (host mode) or behind the
 * client's ready word (gpu mode).
 *
 * Each ring has two words from the backend (arm_open: pinned host memory
 * mapped for the device on cuda), go and okay.  An armed job's stream
 * waits until go >= its key (the seq), and its kernel then runs only if
 * okay >= the key; else it does nothing at all, not even its done words
 * (backend.h, rnk_bwd_args.gate).  Who writes them:
 *   - the doorbell thread (rnd_ring_arm_mirror, under the rings' mutex)
 *     follows the client's ready word: okay, then go, up to the last armed
 *     slot.  So the call's hop from ready to the kernel is the stream's wait
 *     on a word in host memory, with no launch after ready;
 *   - a revocation (rnd_ring_revoke, the loop, under the mutex): the
 *     mirror stops (frozen), go is raised past every armed key, and okay
 *     stays where it is.  The armed jobs after okay then pass their waits
 *     and skip; the loop marks their requests revoked (their done events
 *     answer nothing) and rewinds the ring to okay, so their slots, intact
 *     (no done reached them), are taken again in host mode.  The mirror
 *     resumes once every revoked job was released: until then a skip still
 *     queued could read an okay written later and run as well.
 * Why revoke: a stream that waits holds up what shares its hardware queue
 * (take_max's comment, ring_take.c).  Unlike gpu mode's waits, the daemon
 * can end these itself, so a ring is armed only while every request in
 * flight in the daemon is its session's, and is revoked when another
 * ring takes a slot, a classic BWD or a graph replay is submitted, a ring
 * opens, a region is being mapped (server.c's before_map), the cuda gate
 * would hold a close for it (rnd_backend_opts.revoke), the daemon drains,
 * RING_CLOSE comes or its own session ends (a closing ring arms nothing:
 * once closed it leaves the doorbell thread's list, and with it the
 * mirror).
 *
 * RMSNORMD_DEBUG_ARM_POLICY=free (being measured): a ring arms whatever
 * else is in flight and other rings' calls take nothing back (the other
 * triggers stay): gpu mode's waits, but ones the daemon can end.
 *
 * What keeps it exact: done is one word ("every slot up to done ended"),
 * so while a ring has an armed slot, no later slot of it may run or be
 * answered ungated.  A slot whose ready word has come is taken ungated only
 * after the mirror step made every armed slot before it okay
 * (rnd_ring_arm_take); one that cannot be gated (invalid, m = 0: its done
 * is a stream write) is refused armed by the backend (RND_UNARMABLE) and
 * waits for its ready word in the ring, as in host mode.
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

    if (g->tab->ready_mode == RND_RING_READY_ARMED && ctx->be->ops->arm_open)
        g->arm = ctx->be->ops->arm_open(ctx->be);
}

void rnd_ring_arm_free(rnd_ring *g)
{
    rnd_ctx *ctx = g->tab->ctx;

    if (g->arm)
        ctx->be->ops->arm_close(ctx->be, g->arm);
    g->arm = NULL;
}

/* Under mu: okay and go up to ready, at most cap. */
static void mirror_to(rnd_ring *g, uint64_t rd, uint64_t cap)
{
    uint64_t okay = __atomic_load_n(&g->arm[1], __ATOMIC_RELAXED);
    uint64_t v = rnp_seq_reached(rd, cap) ? cap : rd;

    if (g->frozen || v <= okay || !rnp_seq_reached(rd, okay + 1))
        return;
    /* okay first: a kernel reads it after its stream saw go. */
    __atomic_store_n(&g->arm[1], v, __ATOMIC_RELEASE);
    if (__atomic_load_n(&g->arm[0], __ATOMIC_RELAXED) < v)
        __atomic_store_n(&g->arm[0], v, __ATOMIC_SEQ_CST);
}

bool rnd_ring_arm_mirror(rnd_ring *g)
{
    if (!g->arm || g->frozen || g->armed_upto <= __atomic_load_n(&g->arm[1], __ATOMIC_RELAXED))
        return false;
    mirror_to(g, __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_READY), __ATOMIC_ACQUIRE),
              g->armed_upto);
    return g->armed_upto > __atomic_load_n(&g->arm[1], __ATOMIC_RELAXED);
}

/* Whether every request in flight in the daemon is g's session's (or the
 * policy is free: RMSNORMD_DEBUG_ARM_POLICY). */
static bool alone(const rnd_ring *g)
{
    const rnd_ctx *ctx = g->tab->ctx;
    return g->tab->arm_free || ctx->inflight_total == g->sess->inflight;
}

int rnd_ring_arm_take(rnd_ring *g, uint64_t seq, uint64_t rd, bool may_arm)
{
    rnd_rings *tab = g->tab;
    int how = RND_ARM_NO;

    pthread_mutex_lock(&tab->mu);
    if (rnp_seq_reached(rd, seq)) {
        /* Taken ungated: every armed slot before it okay first (not while
         * frozen, when none is left to cover). */
        mirror_to(g, rd, seq);
        g->ungated = seq;
        how = RND_ARM_READY;
    } else if (may_arm && !g->frozen && seq > __atomic_load_n(&g->arm[0], __ATOMIC_RELAXED) &&
               !g->closing && !g->ending && !g->sess->ending && alone(g)) {
        /* (seq > go: a go raised by an earlier revocation would let its
         * wait pass before okay could come) */
        g->armed_upto = seq;
        tab->armed_ns = rnd_now_ns();
        how = RND_ARM_ARMED;
    }
    pthread_mutex_unlock(&tab->mu);
    if (how == RND_ARM_ARMED)
        rnd_rings_kick(tab); /* (the doorbell thread mirrors from now on) */
    return how;
}

void rnd_ring_arm_refused(rnd_ring *g, uint64_t seq)
{
    pthread_mutex_lock(&g->tab->mu);
    if (g->armed_upto == seq)
        g->armed_upto = seq - 1;
    pthread_mutex_unlock(&g->tab->mu);
}

/* No revoked job of g is left: the mirror may write okay again. */
static void thaw(rnd_ring *g)
{
    pthread_mutex_lock(&g->tab->mu);
    g->frozen = false;
    pthread_mutex_unlock(&g->tab->mu);
}

/* A revoked job was released (its skip ended); then the ring's own release. */
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
    uint64_t okay = __atomic_load_n(&g->arm[1], __ATOMIC_RELAXED);
    if (g->frozen || g->armed_upto <= okay) {
        pthread_mutex_unlock(&tab->mu);
        return 0;
    }
    /* go past every armed key, okay where it is: the armed jobs after it
     * pass their waits and skip. */
    g->frozen = true;
    if (__atomic_load_n(&g->arm[0], __ATOMIC_RELAXED) < g->armed_upto)
        __atomic_store_n(&g->arm[0], g->armed_upto, __ATOMIC_SEQ_CST);
    uint64_t upto = g->armed_upto;
    uint64_t back = okay > g->ungated ? okay : g->ungated;
    g->armed_upto = back;
    pthread_mutex_unlock(&tab->mu);

    unsigned n = tab->revoke(g->sess, g, back, revoked_released);
    g->revoked += n;
    tab->revoked_held += n;
    if (n == 0)
        thaw(g); /* (none in flight: the backend answered them, failing) */
    /* Their slots are taken again, in host mode, from the first; a ring
     * that stopped at a slot after them takes them before it stops again. */
    if (rnp_seq_reached(g->cons, back) && g->cons != back) {
        g->cons = back;
        g->stopped = false;
    }
    __atomic_store_n(&g->wait_seq, 0, __ATOMIC_SEQ_CST);
    rnd_ring_drop_prep(g);
    ctx->stats.fast_revokes++;
    ctx->stats.fast_revoked += n;
    rnd_debug("Ring %u of '%s': slots %llu..%llu taken back (%s)", g->id, g->sess->name,
              (unsigned long long)back + 1, (unsigned long long)upto, why);
    uv_async_send(&tab->async);
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
