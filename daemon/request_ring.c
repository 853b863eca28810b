/* SPDX-License-Identifier: MIT */
/*
 * request_ring.c - a ring slot (the fast path, ring.h) as a BWD request: the
 * same object, admission, validation, pinning and statistics as request.c's
 * BWD; the backend answers it in the ring.  A slot whose ready word has not
 * come (--ring-ready=host) may be prepared ahead and submitted later
 * (rnd_ring_slot.prep).
 */
#include "request_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_ring.h"

void rnd_request_abandon_ring(rnd_session *s, int status)
{
    rn_queue *j;
    RN_QUEUE_FOREACH(j, &s->running) {
        req *r = REQ_OF_RUN(j);
        if (r->at.owner)
            atomic_store(&r->rj.abandon, status);
    }
}

unsigned rnd_request_revoke_ring(rnd_session *s, void *owner, uint64_t upto,
                                 void (*released)(void *owner))
{
    unsigned n = 0;
    rn_queue *j;

    RN_QUEUE_FOREACH(j, &s->running) {
        req *r = REQ_OF_RUN(j);
        if (r->at.owner == owner && !r->at.graph && r->at.arm_key &&
            rnp_seq_reached(r->at.seq, upto + 1) &&
            !atomic_load(&r->rj.revoked)) {
            atomic_store(&r->rj.revoked, true);
            r->at.released = released;
            /* Out of the limits now: a skip that ends soon is no call in
             * flight (the slot's next request counts again). */
            rnd_req_uncount(r);
            n++;
        }
    }
    return n;
}

void rnd_request_drain_rings(rnd_ctx *ctx)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &ctx->sessions.list)
        rnd_request_abandon_ring(RN_QUEUE_DATA(q, rnd_session, link), RN_DRAINING);
    /* Armed calls are taken back instead (abandon does not reach them). */
    rnd_rings_revoke_others(&ctx->rings, NULL, "the drain");
}

/* ---- a ring slot's way in (ring.h's rnd_ring_submit_fn) ------------------------------ */

/* An armed slot must run a kernel, which its gate can skip (backend.h): not
 * one answered with an error, nor m = 0. */
static bool armable(const req *r)
{
    return r->rj.status == 0 && r->job.args.m > 0;
}

int rnd_request_ring(rnd_ctx *ctx, rnd_session *s, const rnp_bwd_req *b, const rnp_error *bad,
                     const rnd_ring_slot *at, uint64_t recv_ns)
{
    rnp_error err = {0};
    rnp_bwd_plan plan;
    req *r = at->prep ? *at->prep : NULL;  /* a slot prepared ahead (ring.h) */
    bool preparing = at->prep && !r;

    /* At a limit the slot waits in the ring: the client's stream waits,
     * nothing is refused. */
    if (!preparing && !at->force && rnd_req_at_limit(ctx, s)) {
        ctx->stats.fast_deferred++;
        return RN_BUSY;
    }
    if (r) {
        if (at->arm_key && !armable(r))
            return RND_UNARMABLE; /* (kept prepared, for host mode) */
        r->at.force = r->rj.force = at->force;
        r->at.ready = r->rj.ready_seen = at->ready;
        r->at.arm = r->rj.arm = at->arm;
        r->at.arm_key = r->rj.arm_key = at->arm_key;
        r->at.arm_epoch = r->rj.arm_epoch = at->arm_epoch;
        r->run.recv_ns = recv_ns;
        goto submit;
    }
    if (!(r = calloc(1, sizeof *r)))
        return RN_BUSY;
    r->state = REQ_RECEIVED;
    r->ctx = ctx;
    r->sess = s;
    r->seq = at->seq;
    r->run.recv_ns = recv_ns;
    r->run.ring = true;
    r->at = *at;
    r->rj = (rnd_ring_job){.ring = at->ring, .slot = at->slot, .seq = at->seq, .graph = at->graph,
                           .ready_seen = at->ready, .done_dev = at->done_dev,
                           .force = at->force, .arm = at->arm, .arm_key = at->arm_key,
                           .arm_epoch = at->arm_epoch};
    rn_queue_init(&r->dups);
    rn_queue_init(&r->run.link);

    /* Admission and validation as for a BWD; a slot that fails them is
     * still submitted, to be answered in its turn with the error. */
    if (bad)
        err = *bad;
    else if (ctx->draining)
        rnp_fail(&err, RN_DRAINING, "bwd: the daemon is shutting down; the call was not run");
    else if (ctx->failing)
        rnp_fail(&err, RN_DEVICE_FAILING, "bwd: %s", ctx->fail_msg);
    else if (s->ending)
        rnp_fail(&err, RN_UNKNOWN_SESSION, "bwd: the session ended; the call was not run");
    else
        rnd_req_pin(r, b, &plan, &err);
    if (err.code) {
        r->rj.status = err.code;
        snprintf(r->rj.msg, sizeof r->rj.msg, "%s", err.msg[0] ? err.msg : rnp_strerror(err.code));
        r->job.bsess = s->bsess;
        r->job.ready_slot = -1;
        r->job.acked = rnd_req_on_acked;
        r->job.done = rnd_req_on_done;
        r->job.done_slot = -1;
    } else {
        rnd_req_translate(r, b);
    }
    r->job.ring = &r->rj;
    if (preparing) {
        *at->prep = r;
        ctx->stats.fast_prepared++;
        return 0;
    }
    if (at->arm_key && !armable(r)) {
        r->answered = true;
        rnd_req_release(r);
        return RND_UNARMABLE;
    }
submit:
    if (rnd_req_submit(r, &err) != 0) {
        /* Not taken: the slot stays in the ring, to be taken again (a
         * prepared one as it is, at a limit). */
        if (err.code == RN_BUSY)
            ctx->stats.fast_deferred++;
        if (!(at->prep && err.code == RN_BUSY)) {
            if (at->prep)
                *at->prep = NULL;
            r->answered = true;
            rnd_req_release(r);
        }
        return err.code == RN_BUSY ? RN_BUSY : err.code ? err.code : RN_INTERNAL;
    }
    if (at->prep)
        *at->prep = NULL;
    return 0;
}

/* Only its pins were taken: nothing was counted, queued or answered. */
void rnd_request_ring_discard(void *prep)
{
    req *r = prep;

    for (int t = 0; t < RNP_T_COUNT && r->state >= REQ_PINNED; t++)
        if (r->regs[t])
            rnd_region_unref(r->regs[t]);
    free(r);
}

