/*
 * server.c - the loop: a nanomsg raw REP socket whose NN_RCVFD is polled by
 * libuv, requests decoded and dispatched, replies sent with each request's
 * own control header (so many requests can be in flight and replies can go
 * out in any order), health, backpressure, timers, signals and the drain.
 *
 * Every received message gets exactly one reply: a malformed one gets an
 * error reply addressed with whatever op and id could be read (0 and 0 when
 * none), an accepted BWD gets its reply when its job completes, and a
 * duplicate of a running BWD gets its own reply when the first copy ends.
 */
#include "server.h"

#include <errno.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

/* The wire's dtypes and the kernel's are the same numbers. */
_Static_assert((int)RNK_NONE == (int)RN_DTYPE_NONE, "dtype NONE");
_Static_assert((int)RNK_F32 == (int)RN_DTYPE_F32, "dtype F32");
_Static_assert((int)RNK_F16 == (int)RN_DTYPE_F16, "dtype F16");
_Static_assert((int)RNK_BF16 == (int)RN_DTYPE_BF16, "dtype BF16");

/* A duplicate of a running request waits for it; more copies than this of
 * one seq are refused with BUSY rather than queued without bound. */
#define MAX_DUPS 8
/* HEALTH reports degraded for this long after a BUSY reply. */
#define BUSY_WINDOW_NS (10ull * 1000000000ull)

static void finish_drain(rnd_server *srv);

/* ---- replies ------------------------------------------------------------ */

static void reply_header(rnp_reply *rep, uint32_t op, uint64_t id)
{
    memset(rep, 0, offsetof(rnp_reply, u));
    rep->version = RNP_VERSION;
    rep->op = op;
    rep->id = id;
}

/*
 * Send rep with the request's control header.  nanomsg takes the header on
 * success; on failure (the peer vanished, the socket closed) we free it.
 * Counts the reply in the statistics.
 */
static void send_reply(rnd_server *srv, void *control, rnp_reply *rep)
{
    rnp_error err = {0};
    struct nn_msghdr hdr;
    struct nn_iovec iov;
    size_t len = 0;
    int rc;

    rc = rnp_encode_reply(rep, srv->buf, sizeof srv->buf, &len, &err);
    if (rc != 0) {
        rnd_err("Failed to encode the reply to %s id %llu: %s", rnp_op_name((int)rep->op),
                (unsigned long long)rep->id, err.msg);
        uint32_t op = rep->op;
        uint64_t id = rep->id;
        reply_header(rep, op, id);
        rep->status = RN_INTERNAL;
        snprintf(rep->error, sizeof rep->error, "reply could not be encoded: %.150s", err.msg);
        if (rnp_encode_reply(rep, srv->buf, sizeof srv->buf, &len, &err) != 0) {
            if (control)
                nn_freemsg(control);
            return;
        }
    }
    rnd_stats_reply(&srv->stats, rep->status);
    if (rep->status == RN_BUSY)
        srv->last_busy_ns = rnd_now_ns();
    if (rep->status != 0)
        rnd_debug("Reply %s id %llu: %s: %s", rnp_op_name((int)rep->op),
                  (unsigned long long)rep->id, rnp_err_name(rep->status), rep->error);
    if (srv->sock < 0 || !control) {
        if (control)
            nn_freemsg(control);
        return;
    }
    memset(&hdr, 0, sizeof hdr);
    iov.iov_base = srv->buf;
    iov.iov_len = len;
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = &control;
    hdr.msg_controllen = NN_MSG;
    if (nn_sendmsg(srv->sock, &hdr, NN_DONTWAIT) < 0) {
        /* Not nn_freemsg(control): once nn_sendmsg has taken the header into
         * its message it frees it on failure itself.  A raw REP socket drops
         * replies to vanished peers silently, so this happens only while the
         * socket closes, where a leaked header does no harm. */
        rnd_debug("Failed to send the reply to %s id %llu: %s", rnp_op_name((int)rep->op),
                  (unsigned long long)rep->id, nn_strerror(nn_errno()));
    }
}

static void send_error(rnd_server *srv, void *control, uint32_t op, uint64_t id, int code,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void send_error(rnd_server *srv, void *control, uint32_t op, uint64_t id, int code,
                       const char *fmt, ...)
{
    rnp_reply rep;
    va_list ap;

    reply_header(&rep, op, id);
    rep.status = code;
    va_start(ap, fmt);
    vsnprintf(rep.error, sizeof rep.error, fmt, ap);
    va_end(ap);
    send_reply(srv, control, &rep);
}

static void send_rnp_error(rnd_server *srv, void *control, uint32_t op, uint64_t id,
                           const rnp_error *err)
{
    send_error(srv, control, op, id, err->code ? err->code : RN_INTERNAL, "%s",
               err->msg[0] ? err->msg : rnp_strerror(err->code));
}

/* ---- health ------------------------------------------------------------- */

static bool any_stuck(rnd_server *srv, uint64_t now, uint64_t *oldest_ns)
{
    uint64_t oldest = 0;
    for (rnd_session *s = srv->sessions; s; s = s->next)
        for (rnd_pending *p = s->running; p; p = p->next)
            if (now - p->recv_ns > oldest)
                oldest = now - p->recv_ns;
    if (oldest_ns)
        *oldest_ns = oldest;
    return oldest > RND_STUCK_NS;
}

#define REASON(...)                                                                     \
    do {                                                                                \
        if (out->nreasons < RNP_MAX_REASONS)                                            \
            snprintf(out->reasons[out->nreasons++], RNP_REASON_LEN, __VA_ARGS__);      \
    } while (0)
#define WORSE(st) (out->state = out->state > (uint32_t)(st) ? out->state : (uint32_t)(st))

/*
 * ok: serving within limits.  degraded: serving, but a client may see BUSY
 * or DRAINING (at a limit, refused a request at a limit in the last 10 s,
 * draining) or the backend reports a slow configuration (CUDA without MPS).
 * failing: the backend hit a fatal error or a request has been pending past
 * the deadline.  Running the CPU backend because --backend auto found no
 * usable CUDA device is ok: the host serves all it can, and HELLO, HEALTH and
 * STATS name the backend.  Running it because a CUDA device exists but the
 * cuda backend failed to start is degraded: the host could do better.
 */
static void fill_health(rnd_server *srv, rnp_health_rep *out)
{
    uint64_t now = rnd_now_ns(), oldest;
    uint32_t n = 0;
    int st;

    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "%s", srv->dev.backend);
    out->mps = srv->dev.mps;
    if (srv->failing) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("backend: %.100s", srv->fail_msg);
    }
    if (any_stuck(srv, now, &oldest)) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("stuck: a request has been pending for %llu s (deadline %llu s)",
               (unsigned long long)(oldest / 1000000000u),
               (unsigned long long)(RND_STUCK_NS / 1000000000u));
    }
    st = srv->be->ops->health(srv->be, out->reasons + out->nreasons,
                              RNP_MAX_REASONS - out->nreasons, &n);
    out->nreasons += n;
    WORSE(st);
    if (srv->fallback[0]) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("backend: %.100s", srv->fallback);
    }
    if (srv->draining) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("draining: shutting down, new work is refused");
    }
    if (srv->nsessions >= srv->cfg.max_sessions) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("sessions: %u in use, the limit (--max-sessions)", srv->nsessions);
    }
    if (srv->inflight_total >= srv->cfg.max_inflight_total) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("inflight: %u requests in flight, the limit (--max-inflight-total)",
               srv->inflight_total);
    }
    if (srv->last_busy_ns && now - srv->last_busy_ns < BUSY_WINDOW_NS) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("busy: requests were refused at a limit in the last %llu s",
               (unsigned long long)(BUSY_WINDOW_NS / 1000000000u));
    }
}

/* ---- operations --------------------------------------------------------- */

static void touch(rnd_session *s) { s->last_active_ns = rnd_now_ns(); }

static void fill_limits(rnd_server *srv)
{
    rnp_limits *l = &srv->limits;
    l->max_sessions = srv->cfg.max_sessions;
    l->max_regions = srv->cfg.max_regions;
    l->max_inflight = srv->cfg.max_inflight;
    l->max_inflight_total = srv->cfg.max_inflight_total;
    l->max_m = srv->cfg.max_m;
    l->max_n = srv->cfg.max_n;
    l->max_msg = RNP_MAX_MSG;
    l->event_slots = srv->dev.event_slots;
}

static void op_hello(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_error err = {0};
    rnd_session *s;
    rnp_reply rep;

    if (srv->draining)
        return send_error(srv, control, req->op, req->id, RN_DRAINING,
                          "hello: the daemon is shutting down");
    if (srv->failing)
        return send_error(srv, control, req->op, req->id, RN_DEVICE_FAILING, "hello: %s",
                          srv->fail_msg);
    if (srv->nsessions >= srv->cfg.max_sessions)
        return send_error(srv, control, req->op, req->id, RN_BUSY,
                          "hello: %u sessions open, the limit (--max-sessions)", srv->nsessions);
    if (rnd_session_create(srv, &req->u.hello, &s, &err) != 0)
        return send_rnp_error(srv, control, req->op, req->id, &err);
    reply_header(&rep, req->op, req->id);
    rnp_hello_rep *h = &rep.u.hello;
    memset(h, 0, sizeof *h);
    h->session = s->cap;
    snprintf(h->daemon_version, sizeof h->daemon_version, "%s", RN_VERSION);
    snprintf(h->backend, sizeof h->backend, "%s", srv->dev.backend);
    snprintf(h->device_name, sizeof h->device_name, "%s", srv->dev.device_name);
    memcpy(h->device_uuid, srv->dev.uuid, sizeof h->device_uuid);
    h->sm_count = srv->dev.sm_count;
    h->cc_major = srv->dev.cc_major;
    h->cc_minor = srv->dev.cc_minor;
    h->mps = srv->dev.mps;
    h->limits = srv->limits;
    send_reply(srv, control, &rep);
}

static rnd_session *need_session(rnd_server *srv, void *control, const rnp_request *req,
                                 const rnp_session *cap)
{
    rnd_session *s = rnd_session_find(srv, cap);
    if (!s) {
        send_error(srv, control, req->op, req->id, RN_UNKNOWN_SESSION,
                   "%s.session: unknown or expired session", rnp_op_name((int)req->op));
        return NULL;
    }
    touch(s);
    return s;
}

static void op_register(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_error err = {0};
    rnd_session *s;
    rnp_reply rep;
    uint32_t id;

    if (!(s = need_session(srv, control, req, &req->u.reg.session)))
        return;
    if (srv->draining)
        return send_error(srv, control, req->op, req->id, RN_DRAINING,
                          "register: the daemon is shutting down");
    if (rnd_region_add(s, &req->u.reg, &id, &err) != 0)
        return send_rnp_error(srv, control, req->op, req->id, &err);
    reply_header(&rep, req->op, req->id);
    rep.u.reg.region.id = id;
    send_reply(srv, control, &rep);
}

static void op_unregister(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_error err = {0};
    rnd_session *s;
    rnp_reply rep;

    if (!(s = need_session(srv, control, req, &req->u.unreg.session)))
        return;
    if (rnd_region_remove(s, req->u.unreg.region.id, &err) != 0)
        return send_rnp_error(srv, control, req->op, req->id, &err);
    reply_header(&rep, req->op, req->id);
    send_reply(srv, control, &rep);
}

static void op_events(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_error err = {0};
    rnd_session *s;
    rnp_reply rep;

    if (!(s = need_session(srv, control, req, &req->u.events.session)))
        return;
    if (srv->draining)
        return send_error(srv, control, req->op, req->id, RN_DRAINING,
                          "events: the daemon is shutting down");
    reply_header(&rep, req->op, req->id);
    memset(&rep.u.events, 0, sizeof rep.u.events);
    if (srv->be->ops->events(srv->be, s->bsess, &req->u.events, &rep.u.events, &err) != 0)
        return send_rnp_error(srv, control, req->op, req->id, &err);
    send_reply(srv, control, &rep);
}

static void op_bye(rnd_server *srv, void *control, const rnp_request *req)
{
    rnd_session *s;
    rnp_reply rep;

    if (!(s = need_session(srv, control, req, &req->u.bye)))
        return;
    reply_header(&rep, req->op, req->id);
    send_reply(srv, control, &rep);
    rnd_session_end(s, "BYE");
}

static void op_ping(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_reply rep;
    reply_header(&rep, req->op, req->id);
    rep.u.ping.daemon_time_ns = rnd_now_ns();
    send_reply(srv, control, &rep);
}

static void op_health(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_reply rep;
    reply_header(&rep, req->op, req->id);
    fill_health(srv, &rep.u.health);
    send_reply(srv, control, &rep);
}

static void op_stats(rnd_server *srv, void *control, const rnp_request *req)
{
    rnp_reply rep;
    rnd_gauges g;

    reply_header(&rep, req->op, req->id);
    memset(&rep.u.stats, 0, sizeof rep.u.stats);
    snprintf(rep.u.stats.backend, sizeof rep.u.stats.backend, "%s", srv->dev.backend);
    snprintf(rep.u.stats.device, sizeof rep.u.stats.device, "%s", srv->dev.device_name);
    g.sessions_active = srv->nsessions;
    g.regions_active = srv->regions_active;
    g.inflight_current = srv->inflight_total;
    g.now_ns = rnd_now_ns();
    /* The request is already counted (on receipt); its reply is not, since
     * replies are counted as they are sent. */
    rnd_stats_fill(&srv->stats, &g, &rep.u.stats);
    send_reply(srv, control, &rep);
}

/* ---- BWD ------------------------------------------------------------------ */

static bool region_size(void *ctx, uint32_t region, uint64_t *size)
{
    rnd_region *r = rnd_region_find(ctx, region);
    if (!r)
        return false;
    *size = r->map.size;
    return true;
}

static void bwd_reply_from(rnp_reply *rep, uint64_t id, const rnd_result *r)
{
    reply_header(rep, RN_OP_BWD, id);
    rep->status = r->status;
    if (r->status != 0)
        snprintf(rep->error, sizeof rep->error, "%s", r->error);
    else
        rep->u.bwd = r->rep;
}

static void pending_free(rnd_pending *p)
{
    rnd_dup *d, *next;
    if (!p)
        return;
    for (d = p->dups; d; d = next) {
        next = d->next;
        if (d->control)
            nn_freemsg(d->control);
        free(d);
    }
    if (p->control)
        nn_freemsg(p->control);
    free(p);
}

/* Reply to the request and every copy of it waiting, and remember the
 * result for later copies. */
static void answer(rnd_pending *p, const rnd_result *res)
{
    rnd_server *srv = p->srv;
    uint64_t now = rnd_now_ns();
    rnp_reply rep;

    if (res->status == 0) {
        rnd_hist_add(&srv->stats.queue, res->rep.queue_ns);
        rnd_hist_add(&srv->stats.compute, res->rep.compute_ns);
        rnd_hist_add(&srv->stats.total, now - p->recv_ns);
    }
    bwd_reply_from(&rep, p->id, res);
    send_reply(srv, p->control, &rep);
    p->control = NULL;
    for (rnd_dup *d = p->dups; d; d = d->next) {
        bwd_reply_from(&rep, d->id, res);
        send_reply(srv, d->control, &rep);
        d->control = NULL;
        srv->stats.dup_answered++;
    }
    /* The job ran, so a later copy of this seq is answered, not run again. */
    rnd_dedupe_put(&p->sess->dedupe, res);
    p->answered = true;
}

static void result_of(const rnd_pending *p, const rnd_job *job, rnd_result *res)
{
    memset(res, 0, sizeof *res);
    res->seq = p->seq;
    res->status = job->status;
    if (job->status == 0) {
        uint64_t start = job->start_ns > p->recv_ns ? job->start_ns : p->recv_ns;
        res->rep.seq = p->seq;
        res->rep.done_slot = job->done_slot;
        res->rep.queue_ns = start - p->recv_ns;
        res->rep.compute_ns = !job->acked && job->end_ns > start ? job->end_ns - start : 0;
    } else {
        snprintf(res->error, sizeof res->error, "%s",
                 job->msg[0] ? job->msg : rnp_strerror(job->status));
    }
}

static void on_job_done(rnd_job *job)
{
    rnd_pending *p = (rnd_pending *)job;
    rnd_server *srv = p->srv;
    rnd_session *s = p->sess;
    rnd_result res;

    if (!p->answered) {
        result_of(p, job, &res);
        answer(p, &res);
    } else if (job->status != 0) {
        /* Acknowledged already; the backend reports the failure itself
         * (a failing device), the client learns it on its next request. */
        rnd_warn("Request seq %llu of '%s' failed after its acknowledgement: %s",
                 (unsigned long long)p->seq, s->name, job->msg);
    }
    if (job->status == 0)
        srv->stats.bytes_processed += p->bytes;

    if (job->region_fault) {
        /* The mapping now holds private zero pages where the client's memory
         * was: unregister the region that faulted so that no later request
         * computes on it.  The request's other regions are intact. */
        for (int t = 0; t < RNP_T_COUNT; t++) {
            rnd_region *r = p->regs[t];
            if (r && !r->unlinked && job->fault_addr >= (uintptr_t)r->map.base &&
                job->fault_addr - (uintptr_t)r->map.base < r->map.size) {
                rnd_warn("Region %u of a session of '%s' shrank below its registered size: "
                         "unregistered", p->regs[t]->id, s->name);
                rnd_region_remove(s, p->regs[t]->id, NULL);
            }
        }
    }
    for (int t = 0; t < RNP_T_COUNT; t++)
        if (p->regs[t])
            rnd_region_unref(p->regs[t]);
    if (p->prev)
        p->prev->next = p->next;
    else
        s->running = p->next;
    if (p->next)
        p->next->prev = p->prev;
    s->inflight--;
    srv->inflight_total--;
    touch(s);
    pending_free(p);
    rnd_session_maybe_free(s);
    if (srv->draining && srv->inflight_total == 0)
        finish_drain(srv);
}

static const void *tensor_ptr(rnd_pending *p, int t, const rnp_tensor *tn)
{
    if (!p->regs[t])
        return NULL;
    return (const char *)p->regs[t]->map.base + tn->offset;
}

static void op_bwd(rnd_server *srv, void **controlp, const rnp_request *req, uint64_t recv_ns)
{
    const rnp_bwd_req *b = &req->u.bwd;
    void *control = *controlp;
    rnp_error err = {0};
    const rnd_result *done;
    rnd_pending *p = NULL;
    rnp_bwd_plan plan;
    rnd_session *s;
    rnp_reply rep;
    int rc;

    if (!(s = need_session(srv, control, req, &b->session)))
        goto answered;

    /* A copy of a request that is still running waits for it. */
    for (rnd_pending *q = s->running; q; q = q->next) {
        /* An acknowledged one is in the dedupe window already. */
        if (q->seq != b->seq || q->answered)
            continue;
        if (q->ndups >= MAX_DUPS) {
            send_error(srv, control, req->op, req->id, RN_BUSY,
                       "bwd.seq: %llu already has %u copies waiting",
                       (unsigned long long)b->seq, q->ndups);
            goto answered;
        }
        rnd_dup *d = calloc(1, sizeof *d);
        if (!d) {
            send_error(srv, control, req->op, req->id, RN_NOMEM, "bwd: out of memory");
            goto answered;
        }
        d->control = control;
        d->id = req->id;
        d->next = q->dups;
        q->dups = d;
        q->ndups++;
        *controlp = NULL;
        return;
    }
    switch (rnd_dedupe_lookup(&s->dedupe, b->seq, &done)) {
    case RND_SEQ_DONE:
        bwd_reply_from(&rep, req->id, done);
        srv->stats.dup_answered++;
        send_reply(srv, control, &rep);
        goto answered;
    case RND_SEQ_TOO_OLD:
        send_error(srv, control, req->op, req->id, RN_INVALID_ARGUMENT,
                   "bwd.seq: %llu is older than this session's duplicate window; "
                   "seqs must increase", (unsigned long long)b->seq);
        goto answered;
    default:
        break;
    }
    if (srv->draining) {
        send_error(srv, control, req->op, req->id, RN_DRAINING, "bwd: the daemon is shutting down");
        goto answered;
    }
    if (srv->failing) {
        send_error(srv, control, req->op, req->id, RN_DEVICE_FAILING, "bwd: %s", srv->fail_msg);
        goto answered;
    }
    if (s->inflight >= srv->cfg.max_inflight) {
        send_error(srv, control, req->op, req->id, RN_BUSY,
                   "bwd: the session has %u requests in flight, the limit (--max-inflight)",
                   s->inflight);
        goto answered;
    }
    if (srv->inflight_total >= srv->cfg.max_inflight_total) {
        send_error(srv, control, req->op, req->id, RN_BUSY,
                   "bwd: %u requests in flight, the limit (--max-inflight-total)",
                   srv->inflight_total);
        goto answered;
    }
    if ((rc = rnp_validate_bwd(b, &srv->limits, region_size, s, &plan, &err)) != 0) {
        send_rnp_error(srv, control, req->op, req->id, &err);
        goto answered;
    }

    p = calloc(1, sizeof *p);
    if (!p) {
        send_error(srv, control, req->op, req->id, RN_NOMEM, "bwd: out of memory");
        goto answered;
    }
    p->srv = srv;
    p->sess = s;
    p->id = req->id;
    p->seq = b->seq;
    p->recv_ns = recv_ns;
    p->bytes = plan.bytes;
    for (int t = 0; t < RNP_T_COUNT; t++) {
        if (!plan.present[t])
            continue;
        p->regs[t] = rnd_region_find(s, plan.span[t].region);
        if (!p->regs[t]) {
            /* validate_bwd found it a moment ago: our bug, not the client's. */
            send_error(srv, control, req->op, req->id, RN_INTERNAL,
                       "bwd: region %u vanished after validation", plan.span[t].region);
            free(p);
            goto answered;
        }
    }

    rnk_bwd_args *a = &p->job.args;
    a->m = (int64_t)b->m;
    a->n = (int64_t)b->n;
    a->x_dtype = (rnk_dtype)b->x_dtype;
    a->dy_dtype = (rnk_dtype)b->dy_dtype;
    a->dx_dtype = (rnk_dtype)b->dx_dtype;
    a->w_dtype = plan.present[RNP_T_W] ? (rnk_dtype)b->w_dtype : RNK_NONE;
    a->dres_dtype = plan.present[RNP_T_DRES] ? (rnk_dtype)b->dres_dtype : RNK_NONE;
    a->dw_dtype = plan.present[RNP_T_DW] ? (rnk_dtype)b->dw_dtype : RNK_NONE;
    a->x = tensor_ptr(p, RNP_T_X, &b->x);
    a->x_stride = (int64_t)b->x.stride;
    a->dy = tensor_ptr(p, RNP_T_DY, &b->dy);
    a->dy_stride = (int64_t)b->dy.stride;
    a->dx = (void *)tensor_ptr(p, RNP_T_DX, &b->dx);
    a->dx_stride = (int64_t)b->dx.stride;
    a->w = tensor_ptr(p, RNP_T_W, &b->w);
    a->rstd = tensor_ptr(p, RNP_T_RSTD, &b->rstd);
    a->dres = tensor_ptr(p, RNP_T_DRES, &b->dres);
    a->dres_stride = (int64_t)b->dres.stride;
    a->dw = (void *)tensor_ptr(p, RNP_T_DW, &b->dw);
    a->eps = b->eps;
    a->weight_offset = b->weight_offset;
    p->job.bsess = s->bsess;
    p->job.ready_slot = b->ready_slot;
    p->job.mode = b->mode;
    p->job.done = on_job_done;
    p->job.done_slot = -1;

    if ((rc = srv->be->ops->submit(srv->be, &p->job, &err)) != 0) {
        free(p);
        send_rnp_error(srv, control, req->op, req->id, &err);
        goto answered;
    }
    /* Accepted: from here on_job_done answers it. */
    p->control = control;
    *controlp = NULL;
    for (int t = 0; t < RNP_T_COUNT; t++)
        if (p->regs[t])
            p->regs[t]->refs++;
    p->next = s->running;
    if (s->running)
        s->running->prev = p;
    s->running = p;
    s->inflight++;
    srv->inflight_total++;
    if (srv->inflight_total > srv->stats.inflight_max)
        srv->stats.inflight_max = srv->inflight_total;
    if (p->job.acked) {
        /* Async: the done event is recorded; answer now, release later. */
        rnd_result res;
        result_of(p, &p->job, &res);
        answer(p, &res);
    }
    return;

answered:
    /* send_reply took or freed the header. */
    *controlp = NULL;
}

/* ---- receive ------------------------------------------------------------ */

static void handle_message(rnd_server *srv, void **controlp, const void *body, size_t len,
                           uint64_t recv_ns)
{
    static rnp_request req;   /* large; the loop is single-threaded */
    rnp_error err = {0};
    void *control = *controlp;
    int rc;

    memset(&req, 0, sizeof req);
    rc = rnp_decode_request(body, len, &req, &err);
    rnd_stats_request(&srv->stats, rc == 0 ? req.op : 0);
    if (rc != 0) {
        *controlp = NULL;
        send_error(srv, control, req.op, req.id, err.code ? err.code : rc, "%s",
                   err.msg[0] ? err.msg : rnp_strerror(rc));
        return;
    }
    switch (req.op) {
    case RN_OP_HELLO: op_hello(srv, control, &req); break;
    case RN_OP_REGISTER: op_register(srv, control, &req); break;
    case RN_OP_UNREGISTER: op_unregister(srv, control, &req); break;
    case RN_OP_EVENTS: op_events(srv, control, &req); break;
    case RN_OP_BWD: op_bwd(srv, controlp, &req, recv_ns); return;
    case RN_OP_PING: op_ping(srv, control, &req); break;
    case RN_OP_HEALTH: op_health(srv, control, &req); break;
    case RN_OP_STATS: op_stats(srv, control, &req); break;
    case RN_OP_BYE: op_bye(srv, control, &req); break;
    default:
        send_error(srv, control, req.op, req.id, RN_UNKNOWN_OP, "op: unknown operation %u",
                   (unsigned)req.op);
        break;
    }
    *controlp = NULL;
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    rnd_server *srv = h->data;

    /* NN_RCVFD is level-triggered: drain until EAGAIN. */
    while (srv->sock >= 0) {
        void *body = NULL, *control = NULL;
        struct nn_msghdr hdr;
        struct nn_iovec iov;
        int n;

        memset(&hdr, 0, sizeof hdr);
        iov.iov_base = &body;
        iov.iov_len = NN_MSG;
        hdr.msg_iov = &iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = &control;
        hdr.msg_controllen = NN_MSG;
        n = nn_recvmsg(srv->sock, &hdr, NN_DONTWAIT);
        if (n < 0) {
            int e = nn_errno();
            if (e == EAGAIN)
                break;
            if (e == EINTR)
                continue;
            rnd_err("Failed to receive: %s", nn_strerror(e));
            break;
        }
        if (!control) {
            /* A raw socket always delivers the routing header; without it
             * there is nobody to reply to. */
            rnd_warn("Dropping a message without a routing header");
            nn_freemsg(body);
            continue;
        }
        handle_message(srv, &control, body, (size_t)n, rnd_now_ns());
        if (control)
            nn_freemsg(control);
        nn_freemsg(body);
    }
}

/* ---- timers, signals, drain ---------------------------------------------- */

static void update_status(rnd_server *srv, bool force)
{
    char status[128];
    snprintf(status, sizeof status, "%s%s backend; %u sessions, %u requests in flight",
             srv->draining ? "draining; " : "", srv->dev.backend, srv->nsessions,
             srv->inflight_total);
    if (!force && strcmp(status, srv->last_status) == 0)
        return;
    snprintf(srv->last_status, sizeof srv->last_status, "%s", status);
    rnd_notify_status(status);
}

static void on_idle_timer(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    rnd_sessions_expire(srv, rnd_now_ns());
}

/* Once a second: the pid check of clients without a pidfd, STATUS= when it
 * changed (so a busy daemon sends at most one a second), and the
 * stuck-request check. */
static void on_tick(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    uint64_t oldest;

    rnd_sessions_check_pids(srv);
    update_status(srv, false);
    if (any_stuck(srv, rnd_now_ns(), &oldest)) {
        if (!srv->stuck_logged)
            rnd_err("A request has been pending for %llu s: reporting failing",
                    (unsigned long long)(oldest / 1000000000u));
        srv->stuck_logged = true;
    } else {
        srv->stuck_logged = false;
    }
}

/* Ping the watchdog only while work moves: a wedged backend stops the pings
 * and systemd restarts the daemon. */
static void on_watchdog(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    if (!srv->failing && !any_stuck(srv, rnd_now_ns(), NULL))
        rnd_notify_watchdog();
}

static void close_handle(uv_handle_t *h)
{
    if (h->loop && !uv_is_closing(h))
        uv_close(h, NULL);
}

/* All in-flight work has been answered: release everything and let the loop
 * end. */
static void finish_drain(rnd_server *srv)
{
    rnd_session *s, *next;

    if (srv->closing)
        return;
    srv->closing = true;
    for (s = srv->sessions; s; s = next) {
        next = s->next;
        rnd_session_end(s, "daemon shutting down");
    }
    if (srv->rcv_poll_init)
        close_handle((uv_handle_t *)&srv->rcv_poll);
    if (srv->sock >= 0) {
        nn_close(srv->sock);
        srv->sock = -1;
        /* nanomsg leaves the socket file behind; a later daemon would clean
         * it up, but an orderly exit should not leave litter. */
        unlink(srv->sock_path);
    }
    if (srv->handles_init) {
        close_handle((uv_handle_t *)&srv->idle_timer);
        close_handle((uv_handle_t *)&srv->tick_timer);
        close_handle((uv_handle_t *)&srv->wd_timer);
        close_handle((uv_handle_t *)&srv->sig_term);
        close_handle((uv_handle_t *)&srv->sig_int);
        close_handle((uv_handle_t *)&srv->sig_hup);
    }
    if (srv->be) {
        srv->be->ops->fini(srv->be);
        srv->be = NULL;
    }
    rnd_info("Drained: %llu requests answered, exiting with status %d",
             (unsigned long long)(srv->stats.replies_ok), srv->exit_code);
}

void rnd_server_set_fallback(rnd_server *srv, const char *why)
{
    snprintf(srv->fallback, sizeof srv->fallback, "%s", why);
}

void rnd_server_drain(rnd_server *srv, const char *why)
{
    if (srv->draining) {
        rnd_notice("Already draining (%u requests in flight)", srv->inflight_total);
        return;
    }
    srv->draining = true;
    rnd_notice("Draining (%s): %u requests in flight, new work is refused", why,
               srv->inflight_total);
    rnd_notify_stopping();
    if (srv->inflight_total == 0)
        finish_drain(srv);
}

void rnd_server_fatal(void *arg, const char *msg)
{
    rnd_server *srv = arg;

    rnd_err("Backend failed: %s", msg);
    if (!srv->failing) {
        srv->failing = true;
        snprintf(srv->fail_msg, sizeof srv->fail_msg, "%s", msg);
    }
    srv->exit_code = 2;
    rnd_server_drain(srv, "backend failure");
}

static void on_signal(uv_signal_t *h, int signum)
{
    rnd_server *srv = h->data;

    if (signum == SIGHUP) {
        char err[RND_CFG_ERR];
        int level = rnd_log_get_level();
        if (srv->cfg.log_level_from_flag) {
            rnd_notice("SIGHUP: log level stays %s (set by --log-level)", rnd_log_level_name(level));
            return;
        }
        if (!srv->cfg.config_path[0]) {
            rnd_notice("SIGHUP: no configuration file was read; log level stays %s",
                       rnd_log_level_name(level));
            return;
        }
        if (rnd_config_reread_log_level(srv->cfg.config_path, &level, err, sizeof err) != 0) {
            rnd_err("SIGHUP: %s; log level stays %s", err, rnd_log_level_name(rnd_log_get_level()));
            return;
        }
        rnd_log_set_level(level);
        rnd_notice("SIGHUP: log level is %s", rnd_log_level_name(level));
        return;
    }
    rnd_server_drain(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- start ---------------------------------------------------------------- */

static int start_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int start_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int open_socket(rnd_server *srv, char *err, size_t errlen)
{
    const char *path = rnd_config_ipc_path(&srv->cfg);
    int maxsize = (int)RNP_MAX_MSG, fd, rc;
    size_t fdlen = sizeof fd;
    mode_t old_umask;
    gid_t gid = (gid_t)-1;

    snprintf(srv->sock_path, sizeof srv->sock_path, "%s", path);
    if (srv->cfg.socket_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        if (getgrnam_r(srv->cfg.socket_group, &gr, buf, sizeof buf, &res) != 0 || !res)
            return start_fail(err, errlen, "socket-group: no group '%s'", srv->cfg.socket_group);
        gid = res->gr_gid;
    }
    srv->sock = nn_socket(AF_SP_RAW, NN_REP);
    if (srv->sock < 0)
        return start_fail(err, errlen, "Failed to create the nanomsg socket: %s", nn_strerror(nn_errno()));
    if (nn_setsockopt(srv->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsize, sizeof maxsize) < 0) {
        rc = start_fail(err, errlen, "Failed to set NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
        goto fail;
    }
    /* The socket file appears with no access for others until its mode and
     * group are set, so there is no window in which it is too open. */
    old_umask = umask(0177);
    rc = nn_bind(srv->sock, srv->cfg.endpoint);
    umask(old_umask);
    if (rc < 0) {
        int e = nn_errno();
        rc = start_fail(err, errlen, "Failed to bind %s: %s%s", srv->cfg.endpoint, nn_strerror(e),
                  e == EADDRINUSE ? " (another rmsnormd is serving it?)" : "");
        goto fail;
    }
    if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) != 0) {
        rc = start_fail(err, errlen, "Failed to set the group of %s to %s: %s", path,
                  srv->cfg.socket_group, strerror(errno));
        goto fail_unlink;
    }
    if (chmod(path, srv->cfg.socket_mode) != 0) {
        rc = start_fail(err, errlen, "Failed to set the mode of %s to %04o: %s", path,
                  (unsigned)srv->cfg.socket_mode, strerror(errno));
        goto fail_unlink;
    }
    if (nn_getsockopt(srv->sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &fdlen) < 0) {
        rc = start_fail(err, errlen, "Failed to get NN_RCVFD: %s", nn_strerror(nn_errno()));
        goto fail_unlink;
    }
    if ((rc = uv_poll_init(srv->loop, &srv->rcv_poll, fd)) != 0) {
        rc = start_fail(err, errlen, "Failed to poll the socket: %s", uv_strerror(rc));
        goto fail_unlink;
    }
    srv->rcv_poll_init = true;
    srv->rcv_poll.data = srv;
    if ((rc = uv_poll_start(&srv->rcv_poll, UV_READABLE, on_readable)) != 0) {
        rc = start_fail(err, errlen, "Failed to poll the socket: %s", uv_strerror(rc));
        goto fail_unlink;
    }
    return 0;

fail_unlink:
    unlink(path);
fail:
    nn_close(srv->sock);
    srv->sock = -1;
    return rc;
}

int rnd_server_start(rnd_server *srv, uv_loop_t *loop, const rnd_config *cfg, rnd_backend *be,
                     char *err, size_t errlen)
{
    uint64_t idle_ms;

    memset(srv, 0, offsetof(rnd_server, buf));
    srv->loop = loop;
    srv->cfg = *cfg;
    srv->be = be;
    srv->sock = -1;
    rnd_stats_init(&srv->stats, rnd_now_ns());
    be->ops->info(be, &srv->dev);
    fill_limits(srv);

    if (open_socket(srv, err, errlen) != 0)
        return -1;

    uv_timer_init(loop, &srv->idle_timer);
    uv_timer_init(loop, &srv->tick_timer);
    uv_timer_init(loop, &srv->wd_timer);
    uv_signal_init(loop, &srv->sig_term);
    uv_signal_init(loop, &srv->sig_int);
    uv_signal_init(loop, &srv->sig_hup);
    srv->handles_init = true;
    srv->idle_timer.data = srv->tick_timer.data = srv->wd_timer.data = srv;
    srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
    uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
    uv_signal_start(&srv->sig_int, on_signal, SIGINT);
    uv_signal_start(&srv->sig_hup, on_signal, SIGHUP);
    if (cfg->idle_timeout) {
        /* Check four times per timeout: a session ends within 1.25x its
         * idle timeout. */
        idle_ms = (uint64_t)cfg->idle_timeout * 1000 / 4;
        idle_ms = idle_ms < 100 ? 100 : idle_ms > 30000 ? 30000 : idle_ms;
        uv_timer_start(&srv->idle_timer, on_idle_timer, idle_ms, idle_ms);
    }
    uv_timer_start(&srv->tick_timer, on_tick, 1000, 1000);
    srv->wd_usec = rnd_notify_watchdog_usec();
    if (srv->wd_usec) {
        uint64_t ms = srv->wd_usec / 2000;
        if (ms == 0)
            ms = 1;
        uv_timer_start(&srv->wd_timer, on_watchdog, 0, ms);
    }
    return 0;
}

void rnd_server_fini(rnd_server *srv)
{
    /* finish_drain released everything; this covers a loop that stopped
     * some other way. */
    if (srv->sock >= 0) {
        nn_close(srv->sock);
        srv->sock = -1;
    }
}

void rnd_server_announce(rnd_server *srv)
{
    char status[128];
    snprintf(status, sizeof status, "%s backend; 0 sessions, 0 requests in flight",
             srv->dev.backend);
    snprintf(srv->last_status, sizeof srv->last_status, "%s", status);
    rnd_notify_ready(status);
}
