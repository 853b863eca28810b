/* SPDX-License-Identifier: MIT */
/*
 * request.c - the request path: decode, the op table and its admission, and
 * the BWD request object from receipt to release (request.h has the states).
 *
 * Every received message gets exactly one reply: a malformed one an error
 * addressed with whatever op and id could be read (0 and 0 when none); a
 * control op its reply at once; an accepted BWD its reply when the backend
 * acknowledges it or it is done; a copy of a running BWD its own reply when
 * the first copy is answered.
 */
#include "request_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ops.h"
#include "ring.h"

/* The wire's dtypes and the kernel's are the same numbers. */
_Static_assert((int)RNK_NONE == (int)RN_DTYPE_NONE, "dtype NONE");
_Static_assert((int)RNK_F32 == (int)RN_DTYPE_F32, "dtype F32");
_Static_assert((int)RNK_F16 == (int)RN_DTYPE_F16, "dtype F16");
_Static_assert((int)RNK_BF16 == (int)RN_DTYPE_BF16, "dtype BF16");

/* A copy of a running request waits for it; more copies than this of one
 * seq are refused with BUSY rather than queued without bound. */
#define MAX_DUPS 8

/* A client that arrives while the first copy of its (session, seq) runs. */
typedef struct copy {
    void *control;                 /* the sender of the copy */
    uint64_t id;
    rn_queue link;
} copy;

/* ---- the end of a BWD request: answer, release ------------------------------------- */

/* The in-flight limits count requests until they are answered: an
 * acknowledged one runs on (its regions held until done), bounded by the
 * backend's own queue, so that a client may queue GPU work ahead as far as
 * its event ring lets it. */
void rnd_req_count(req *r)
{
    r->counted = true;
    r->sess->inflight++;
    r->ctx->inflight_total++;
    if ((r->uid_load = r->sess->uid_load) != NULL)
        r->uid_load->inflight++;
}

bool rnd_req_uncount(req *r)
{
    if (!r->counted)
        return false;
    r->counted = false;
    r->sess->inflight--;
    r->ctx->inflight_total--;
    if (r->uid_load)
        r->uid_load->inflight--;
    r->uid_load = NULL;
    return true;
}

static void reply_from(rnp_reply *rep, uint64_t id, const rnd_result *r)
{
    rnd_reply_init(rep, RN_OP_BWD, id);
    rep->status = r->status;
    if (r->status != 0)
        snprintf(rep->error, sizeof rep->error, "%s", r->error);
    else
        rep->u.bwd = r->rep;
}

static void result_of(const req *r, rnd_result *res)
{
    const rnd_job *job = &r->job;

    memset(res, 0, sizeof *res);
    res->seq = r->seq;
    res->digest = r->digest;
    res->status = job->status;
    if (job->status == 0) {
        uint64_t start = job->start_ns > r->run.recv_ns ? job->start_ns : r->run.recv_ns;
        res->rep.seq = r->seq;
        res->rep.done_slot = job->done_slot;
        res->rep.queue_ns = start - r->run.recv_ns;
        /* PROTOCOL.md: the time of the work in sync mode and on a backend
         * without events (which always answers at the end); 0 in async mode
         * on the GPU, whose reply does not wait for the kernel - also when
         * the kernel happened to end before the acknowledgement went out. */
        bool timed = job->mode == RNP_MODE_SYNC || r->ctx->dev.event_slots == 0;
        res->rep.compute_ns = timed && job->end_ns > start ? job->end_ns - start : 0;
    } else {
        snprintf(res->error, sizeof res->error, "%s",
                 job->msg[0] ? job->msg : rnp_strerror(job->status));
    }
}

/* A ring slot's request ended: the backend wrote its answer into the ring;
 * here only the statistics. */
static void answer_ring(req *r)
{
    rnd_stats *st = &r->ctx->stats;
    const rnd_job *job = &r->job;

    if (rnd_ring_taken_back(&r->rj)) {
        st->fast_revoked++; /* (its slot's next request answers it) */
        return;
    }
    if (r->rj.arm_key && atomic_load(&r->rj.skipped))
        rnd_ring_arm_misuse(r->at.owner); /* (answered with its error: backend.h) */
    if (job->status != 0) {
        st->fast_errors++;
        if (job->status > 0 && job->status < RND_MAX_CODE)
            st->errors[job->status]++;
        return;
    }
    uint64_t start = job->start_ns > r->run.recv_ns ? job->start_ns : r->run.recv_ns;
    st->fast_ok++;
    if (job->end_ns) { /* (the CUDA backend times a sample: cuda_int.h) */
        rnd_hist_add(&st->fast_queue, start - r->run.recv_ns);
        rnd_hist_add(&st->fast_compute, job->end_ns > start ? job->end_ns - start : 0);
    }
    rnd_hist_add(&st->fast_total, rnd_now_ns() - r->run.recv_ns);
}

/* Reply to the request and every copy of it waiting.  A submitted job ran
 * (or runs), so its result is remembered and a later copy of this seq is
 * answered from it, never run again; a request refused before that is not
 * remembered, and a copy of it is judged afresh. */
static void answer(req *r)
{
    rnd_ctx *ctx = r->ctx;
    rnd_result res;
    rnp_reply rep;
    rn_queue *q, *n;

    if (r->answered)
        return;
    r->answered = true;
    /* A ring's slot or replay may wait for this place (ring.h). */
    if (rnd_req_uncount(r))
        rnd_rings_limit_freed(&ctx->rings);
    if (r->at.owner) {
        answer_ring(r);
        return;
    }
    result_of(r, &res);
    if (res.status == 0) {
        rnd_hist_add(&ctx->stats.queue, res.rep.queue_ns);
        rnd_hist_add(&ctx->stats.compute, res.rep.compute_ns);
        rnd_hist_add(&ctx->stats.total, rnd_now_ns() - r->run.recv_ns);
    }
    reply_from(&rep, r->id, &res);
    rnd_reply(ctx, r->control, &rep);
    r->control = NULL;
    RN_QUEUE_FOREACH_SAFE(q, n, &r->dups) {
        copy *d = RN_QUEUE_DATA(q, copy, link);
        reply_from(&rep, d->id, &res);
        rnd_reply(ctx, d->control, &rep);
        ctx->stats.dup_answered++;
        rn_queue_remove(q);
        free(d);
    }
    if (r->state >= REQ_SUBMITTED)
        rnd_dedupe_put(&r->sess->dedupe, &res);
}

/* A backend may find that the memory behind a mapping is gone (a client
 * shrank its shared memory object): no later request may compute on it, so
 * its region is unregistered.  The request's other regions are intact. */
static void drop_lost_regions(req *r)
{
    for (int t = 0; t < RNP_T_COUNT; t++) {
        rnd_region *g = r->regs[t];
        if (g && g->map.lost && !g->unlinked) {
            rnd_warn("Region %u of a session of '%s' shrank below its registered size: "
                     "unregistered", g->id, r->sess->name);
            rnd_region_remove(r->sess, g->id, NULL);
        }
    }
}

void rnd_req_release(req *r)
{
    rnd_ctx *ctx = r->ctx;
    rnd_session *s = r->sess;

    if (r->state >= REQ_PINNED) {
        drop_lost_regions(r);
        for (int t = 0; t < RNP_T_COUNT; t++)
            if (r->regs[t])
                rnd_region_unref(r->regs[t]);
    }
    if (r->state >= REQ_SUBMITTED) {
        if (r->job.status == 0 && !rnd_ring_taken_back(&r->rj))
            ctx->stats.bytes_processed += r->bytes;
        rnd_req_uncount(r);
        rn_queue_remove(&r->run.link);
        ctx->held_total--;
        s->last_active_ns = rnd_now_ns();
    }
    bool taken = r->state >= REQ_SUBMITTED;
    bool ring_taken = r->at.owner && taken;
    rnd_ring_slot at = r->at;
    r->state = REQ_DONE;
    free(r);
    /* Before the session may go: the ring's region is the session's. */
    if (ring_taken)
        at.released(at.owner);
    /* The backend's queue has room again (its own limit, ring.h). */
    if (taken)
        rnd_rings_limit_freed(&ctx->rings);
    /* Only a request that was running can have been what kept its session:
     * one refused before may be released inside a release that emptied
     * the session's running queue (at.released above: an armed ring's thaw
     * at its session's end takes the rest of its slots, and the backend
     * refuses one), and that outer release frees the session after it
     * returns. */
    if (taken)
        rnd_session_maybe_free(s);
}

/* Before SUBMITTED: answer with err and release at once. */
static void fail(req *r, const rnp_error *err)
{
    r->job.status = err->code ? err->code : RN_INTERNAL;
    snprintf(r->job.msg, sizeof r->job.msg, "%s", err->msg[0] ? err->msg : rnp_strerror(err->code));
    answer(r);
    rnd_req_release(r);
}

void rnd_req_on_acked(rnd_job *job)
{
    req *r = REQ_OF_JOB(job);

    r->state = REQ_ACKED;
    answer(r);
}

void rnd_req_on_done(rnd_job *job)
{
    req *r = REQ_OF_JOB(job);

    if (r->answered && job->status != 0)
        /* Acknowledged already: the backend reports the failure itself (a
         * failing device), the client learns it on its next request. */
        rnd_warn("Request seq %llu of '%s' failed after its acknowledgement: %s",
                 (unsigned long long)r->seq, r->sess->name, job->msg);
    answer(r);
    rnd_req_release(r);
}

void rnd_request_cancel_session(rnd_session *s)
{
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &s->running)
        atomic_store(&REQ_OF_RUN(q)->job.cancelled, true);
}

/* ---- a BWD request's way in -------------------------------------------------------- */

/*
 * A copy of a seq this session sent already: while the first runs, the copy
 * waits for its answer; once answered, the copy gets the same answer from
 * the duplicate window.  Returns true when the copy was dealt with (*controlp
 * taken).
 */
static void reply_reused(rnd_ctx *ctx, void *control, const rnp_request *q)
{
    rnd_reply_error(ctx, control, q->op, q->id, RN_SEQ_REUSED,
                    "bwd.seq: %llu was used for another request in this session (the bodies "
                    "differ); a new request needs a new seq", (unsigned long long)q->u.bwd.seq);
}

static bool replay(rnd_ctx *ctx, rnd_session *s, void **controlp, const rnp_request *q,
                   uint64_t digest)
{
    uint64_t seq = q->u.bwd.seq;
    const rnd_result *done;
    rnp_reply rep;
    rn_queue *it;

    RN_QUEUE_FOREACH(it, &s->running) {
        req *r = REQ_OF_RUN(it);
        /* An answered one is in the duplicate window already; a ring
         * slot's seq counts the ring's slots, not BWD requests. */
        if (r->at.owner || r->seq != seq || r->answered)
            continue;
        if (r->digest != digest) {
            reply_reused(ctx, *controlp, q);
        } else if (r->ndups >= MAX_DUPS) {
            rnd_reply_error(ctx, *controlp, q->op, q->id, RN_BUSY,
                            "bwd.seq: %llu already has %u copies waiting",
                            (unsigned long long)seq, r->ndups);
        } else {
            copy *d = calloc(1, sizeof *d);
            if (!d) {
                rnd_reply_error(ctx, *controlp, q->op, q->id, RN_NOMEM, "bwd: out of memory");
            } else {
                d->control = *controlp;
                d->id = q->id;
                rn_queue_push_back(&r->dups, &d->link);
                r->ndups++;
            }
        }
        *controlp = NULL;
        return true;
    }
    switch (rnd_dedupe_lookup(&s->dedupe, seq, &done)) {
    case RND_SEQ_DONE:
        if (done->digest != digest) {
            reply_reused(ctx, *controlp, q);
            break;
        }
        reply_from(&rep, q->id, done);
        ctx->stats.dup_answered++;
        rnd_reply(ctx, *controlp, &rep);
        break;
    case RND_SEQ_TOO_OLD:
        rnd_reply_error(ctx, *controlp, q->op, q->id, RN_INVALID_ARGUMENT,
                        "bwd.seq: %llu is older than this session's duplicate window; "
                        "seqs must increase", (unsigned long long)seq);
        break;
    default:
        return false;
    }
    *controlp = NULL;
    return true;
}

/* Look each tensor's region up once, validate, and hold the regions. */
int rnd_req_pin(req *r, const rnp_bwd_req *b, rnp_bwd_plan *plan, rnp_error *err)
{
    uint64_t size[RNP_T_COUNT];
    rnd_region *found[RNP_T_COUNT] = {NULL};
    int rc;

    for (int t = 0; t < RNP_T_COUNT; t++) {
        const rnp_tensor *tn = rnp_bwd_tensor(b, t);
        found[t] = tn && tn->region.id ? rnd_region_find(r->sess, tn->region.id) : NULL;
        size[t] = found[t] ? found[t]->map.size : RNP_NO_REGION;
    }
    if ((rc = rnp_validate_bwd(b, &r->ctx->limits, size, plan, err)) != 0)
        return rc;
    for (int t = 0; t < RNP_T_COUNT; t++) {
        if (!plan->present[t])
            continue;
        r->regs[t] = found[t];
        found[t]->refs++;
        r->job.maps[t] = &found[t]->map;
    }
    r->bytes = plan->bytes;
    r->state = REQ_PINNED;
    return 0;
}

static const void *tensor_ptr(const req *r, int t, const rnp_tensor *tn)
{
    if (!r->regs[t])
        return NULL;
    return (const char *)r->regs[t]->map.base + tn->offset;
}

/* The wire request in the kernel's terms, pointers inside the mappings. */
void rnd_req_translate(req *r, const rnp_bwd_req *b)
{
    rnk_bwd_args *a = &r->job.args;

    a->m = (int64_t)b->m;
    a->n = (int64_t)b->n;
    a->x_dtype = (rnk_dtype)b->x_dtype;
    a->dy_dtype = (rnk_dtype)b->dy_dtype;
    a->dx_dtype = (rnk_dtype)b->dx_dtype;
    a->w_dtype = r->regs[RNP_T_W] ? (rnk_dtype)b->w_dtype : RNK_NONE;
    a->dres_dtype = r->regs[RNP_T_DRES] ? (rnk_dtype)b->dres_dtype : RNK_NONE;
    a->dw_dtype = r->regs[RNP_T_DW] ? (rnk_dtype)b->dw_dtype : RNK_NONE;
    a->x = tensor_ptr(r, RNP_T_X, &b->x);
    a->x_stride = (int64_t)b->x.stride;
    a->dy = tensor_ptr(r, RNP_T_DY, &b->dy);
    a->dy_stride = (int64_t)b->dy.stride;
    a->dx = (void *)tensor_ptr(r, RNP_T_DX, &b->dx);
    a->dx_stride = (int64_t)b->dx.stride;
    a->w = tensor_ptr(r, RNP_T_W, &b->w);
    a->rstd = tensor_ptr(r, RNP_T_RSTD, &b->rstd);
    a->dres = tensor_ptr(r, RNP_T_DRES, &b->dres);
    a->dres_stride = (int64_t)b->dres.stride;
    a->dw = (void *)tensor_ptr(r, RNP_T_DW, &b->dw);
    a->eps = b->eps;
    a->weight_offset = b->weight_offset;
    r->job.bsess = r->sess->bsess;
    r->job.ready_slot = b->ready_slot;
    r->job.mode = b->mode;
    r->job.acked = rnd_req_on_acked;
    r->job.done = rnd_req_on_done;
    r->job.done_slot = -1;
}

int rnd_req_at_limit(const rnd_ctx *ctx, const rnd_session *s)
{
    if (s->inflight >= ctx->cfg.max_inflight)
        return REQ_LIMIT_SESSION;
    if (ctx->inflight_total >= ctx->cfg.max_inflight_total)
        return REQ_LIMIT_TOTAL;
    if (s->uid_load && s->uid_load->inflight >= ctx->cfg.max_inflight_per_uid)
        return REQ_LIMIT_UID;
    return 0;
}

/* The session's and the daemon's in-flight limits, for a BWD: refused. */
static int admit_load(rnd_ctx *ctx, rnd_session *s, rnp_error *err)
{
    switch (rnd_req_at_limit(ctx, s)) {
    case REQ_LIMIT_SESSION:
        return rnp_fail(err, RN_BUSY,
                        "bwd: the session has %u requests in flight, the limit (--max-inflight)",
                        s->inflight);
    case REQ_LIMIT_TOTAL:
        ctx->last_busy_ns = rnd_now_ns();
        return rnp_fail(err, RN_BUSY,
                        "bwd: %u requests in flight, the limit (--max-inflight-total)",
                        ctx->inflight_total);
    case REQ_LIMIT_UID:
        return rnp_fail(err, RN_BUSY,
                        "bwd: the sessions of uid %u have %u requests in flight, the limit "
                        "(--max-inflight-per-uid)", (unsigned)s->uid, s->uid_load->inflight);
    }
    return 0;
}

static void bwd(rnd_ctx *ctx, rnd_session *s, void **controlp, const rnp_request *q,
                uint64_t digest, uint64_t recv_ns)
{
    const rnp_bwd_req *b = &q->u.bwd;
    rnp_error err = {0};
    rnp_bwd_plan plan;
    req *r;

    /* (--ring-ready=armed, ring_arm.c: armed calls count in flight while
     * they wait for their inputs; taken back first, they are not in the
     * way of this one's limits, nor their waits in its GPU's way) */
    rnd_rings_revoke_others(&ctx->rings, NULL, "a classic BWD");
    if (admit_load(ctx, s, &err) != 0) {
        rnd_reply_rnp_error(ctx, *controlp, q->op, q->id, &err);
        *controlp = NULL;
        return;
    }
    if (!(r = calloc(1, sizeof *r))) {
        rnd_reply_error(ctx, *controlp, q->op, q->id, RN_NOMEM, "bwd: out of memory");
        *controlp = NULL;
        return;
    }
    r->state = REQ_RECEIVED;
    r->ctx = ctx;
    r->sess = s;
    r->control = *controlp;
    *controlp = NULL;
    r->id = q->id;
    r->seq = b->seq;
    r->digest = digest;
    r->run.recv_ns = recv_ns;
    rn_queue_init(&r->dups);
    rn_queue_init(&r->run.link);

    if (rnd_req_pin(r, b, &plan, &err) != 0) {
        fail(r, &err);
        return;
    }
    rnd_req_translate(r, b);
    if (rnd_req_submit(r, &err) != 0) {
        if (err.code == RN_BUSY)   /* the backend's queue: daemon-wide */
            ctx->last_busy_ns = rnd_now_ns();
        fail(r, &err);
    }
}

int rnd_req_submit(req *r, rnp_error *err)
{
    rnd_ctx *ctx = r->ctx;
    req_state before = r->state;

    /* On the running queue before submit: a backend's events never run
     * inside submit, and a copy arriving from now on waits for this one. */
    rn_queue_push_back(&r->sess->running, &r->run.link);
    rnd_req_count(r);
    ctx->held_total++;
    r->state = REQ_SUBMITTED;
    if (ctx->be->ops->submit(ctx->be, &r->job, err) != 0) {
        /* Never reached the backend: back to the state before, so that
         * release undoes exactly what was done. */
        rn_queue_remove(&r->run.link);
        rnd_req_uncount(r);
        ctx->held_total--;
        r->state = before;
        return -1;
    }
    if (ctx->inflight_total > ctx->stats.inflight_max)
        ctx->stats.inflight_max = ctx->inflight_total;
    return 0;
}

/* ---- receipt and the op table --------------------------------------------------------- */

enum {
    OPF_SESSION = 1 << 0,          /* names a session, which must exist (touched) */
    OPF_NOT_DRAINING = 1 << 1,     /* refused with DRAINING while draining */
    OPF_NOT_FAILING = 1 << 2,      /* refused with DEVICE_FAILING once the backend failed */
    OPF_ENDS_SESSION = 1 << 3,     /* the session ends after the reply */
};

typedef struct op_entry {
    unsigned flags;
    rnd_op_fn *run;                /* NULL: BWD, which replies on its own */
} op_entry;

static const op_entry op_table[RN_OP_MAX + 1] = {
    [RN_OP_HELLO] = {OPF_NOT_DRAINING | OPF_NOT_FAILING, rnd_op_hello},
    [RN_OP_REGISTER] = {OPF_SESSION | OPF_NOT_DRAINING, rnd_op_register},
    [RN_OP_UNREGISTER] = {OPF_SESSION, rnd_op_unregister},
    [RN_OP_EVENTS] = {OPF_SESSION | OPF_NOT_DRAINING, rnd_op_events},
    [RN_OP_BWD] = {OPF_SESSION | OPF_NOT_DRAINING | OPF_NOT_FAILING, NULL},
    [RN_OP_PING] = {0, rnd_op_ping},
    [RN_OP_HEALTH] = {0, rnd_op_health},
    [RN_OP_STATS] = {0, rnd_op_stats},
    [RN_OP_BYE] = {OPF_SESSION | OPF_ENDS_SESSION, rnd_op_bye},
    [RN_OP_RING_OPEN] = {OPF_SESSION | OPF_NOT_DRAINING | OPF_NOT_FAILING, rnd_op_ring_open},
    [RN_OP_RING_CLOSE] = {OPF_SESSION, rnd_op_ring_close},
    [RN_OP_GRAPH_OPEN] = {OPF_SESSION | OPF_NOT_DRAINING | OPF_NOT_FAILING, rnd_op_graph_open},
    [RN_OP_GRAPH_CLOSE] = {OPF_SESSION, rnd_op_graph_close},
};

/* Where a request names its session. */
static const rnp_session *session_of(const rnp_request *q)
{
    switch (q->op) {
    case RN_OP_REGISTER: return &q->u.reg.session;
    case RN_OP_UNREGISTER: return &q->u.unreg.session;
    case RN_OP_EVENTS: return &q->u.events.session;
    case RN_OP_BWD: return &q->u.bwd.session;
    case RN_OP_BYE: return &q->u.bye;
    case RN_OP_RING_OPEN: return &q->u.ring_open.session;
    case RN_OP_RING_CLOSE: return &q->u.ring_close.session;
    case RN_OP_GRAPH_OPEN: return &q->u.graph_open.session;
    case RN_OP_GRAPH_CLOSE: return &q->u.graph_close.session;
    }
    return NULL;
}

/*
 * Admission, in this order for every op: the session it names; for BWD a copy
 * of a seq already seen (answered even while draining: it is not new work);
 * draining; failing.  Returns 0, or an error in err, or -1 when the request
 * was answered here (a replayed copy).
 */
static int admit(rnd_ctx *ctx, const op_entry *e, void **controlp, const rnp_request *q,
                 uint64_t digest, rnd_session **sp, rnp_error *err)
{
    const char *name = rnp_op_name((int)q->op);

    *sp = NULL;
    if (e->flags & OPF_SESSION) {
        if (!(*sp = rnd_session_find(&ctx->sessions, session_of(q))))
            return rnp_fail(err, RN_UNKNOWN_SESSION, "%s.session: unknown or expired session",
                            name);
        if (q->op == RN_OP_BWD && replay(ctx, *sp, controlp, q, digest))
            return -1;
    }
    if ((e->flags & OPF_NOT_DRAINING) && ctx->draining)
        return rnp_fail(err, RN_DRAINING, "%s: the daemon is shutting down", name);
    if ((e->flags & OPF_NOT_FAILING) && ctx->failing)
        return rnp_fail(err, RN_DEVICE_FAILING, "%s: %s", name, ctx->fail_msg);
    return 0;
}

void rnd_request_receive(rnd_ctx *ctx, void **controlp, const void *body, size_t len,
                         uint64_t recv_ns)
{
    static rnp_request q;   /* large; the loop is single-threaded */
    rnp_error err = {0};
    const op_entry *e;
    rnd_session *s;
    rnp_reply rep;
    int rc;

    memset(&q, 0, sizeof q);
    rc = rnp_decode_request(body, len, &q, &err);
    /* (a request that does not decode counts under the op it names, if
     * any: a BWD refused for its eps is a BWD) */
    rnd_stats_request(&ctx->stats, q.op);
    if (rc != 0) {
        if (!err.code)
            err.code = rc;
        rnd_reply_rnp_error(ctx, *controlp, q.op, q.id, &err);
        *controlp = NULL;
        return;
    }
    e = q.op <= RN_OP_MAX ? &op_table[q.op] : NULL;
    if (!e || (!e->run && q.op != RN_OP_BWD)) {
        rnd_reply_error(ctx, *controlp, q.op, q.id, RN_UNKNOWN_OP, "op: unknown operation %u",
                        (unsigned)q.op);
        *controlp = NULL;
        return;
    }
    /* A BWD's digest tells a re-sent copy of a seq from another request
     * reusing it (PROTOCOL.md's duplicate rules). */
    uint64_t digest = q.op == RN_OP_BWD ? rnp_bwd_digest(&q.u.bwd) : 0;
    if ((rc = admit(ctx, e, controlp, &q, digest, &s, &err)) != 0) {
        if (rc > 0)
            rnd_reply_rnp_error(ctx, *controlp, q.op, q.id, &err);
        *controlp = NULL;
        return;
    }
    if (!e->run) {
        bwd(ctx, s, controlp, &q, digest, recv_ns);
        return;
    }
    rnd_reply_init(&rep, q.op, q.id);
    if ((rc = e->run(ctx, s, &q, &rep, &err)) != 0)
        rnd_reply_rnp_error(ctx, *controlp, q.op, q.id, &err);
    else
        rnd_reply(ctx, *controlp, &rep);
    *controlp = NULL;
    if (rc == 0 && (e->flags & OPF_ENDS_SESSION))
        rnd_session_end(s, "BYE");
}
