/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the control operations: HELLO opens a session, REGISTER and
 * UNREGISTER map and unmap client memory, EVENTS exchanges the IPC event
 * rings, PING, HEALTH and STATS answer from the daemon's state, BYE ends a
 * session.  BWD is request.c's.
 */
#include "ops.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "health.h"

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

int rnd_op_hello(rnd_ctx *ctx, rnd_session *unused, const rnp_request *req, rnp_reply *rep,
                 rnp_error *err)
{
    rnp_hello_rep *h = &rep->u.hello;
    rnd_session *s;
    int rc;

    /* HELLOs that nobody authenticates must not keep clients out: the
     * oldest of them past its grace period makes room, for a HELLO that
     * is not refused for its pid (which rnd_session_create checks again:
     * this only keeps a refused HELLO from evicting anyone). */
    uint32_t pid = req->u.hello.pid;
    if (pid && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "hello.pid: no process %u", (unsigned)pid);
    if (ctx->sessions.n >= ctx->cfg.max_sessions)
        rnd_sessions_evict_unauthenticated(&ctx->sessions, rnd_now_ns());
    if (ctx->sessions.n >= ctx->cfg.max_sessions) {
        ctx->last_busy_ns = rnd_now_ns();
        return rnp_fail(err, RN_BUSY, "hello: %u sessions open, the limit (--max-sessions)",
                        ctx->sessions.n);
    }
    if ((rc = rnd_session_create(&ctx->sessions, &req->u.hello, &s, err)) != 0)
        return rc;
    memset(h, 0, sizeof *h);
    h->session = s->cap;
    snprintf(h->daemon_version, sizeof h->daemon_version, "%s", RN_VERSION);
    snprintf(h->backend, sizeof h->backend, "%s", ctx->dev.backend);
    snprintf(h->device_name, sizeof h->device_name, "%s", ctx->dev.device_name);
    memcpy(h->device_uuid, ctx->dev.uuid, sizeof h->device_uuid);
    h->sm_count = ctx->dev.sm_count;
    h->cc_major = ctx->dev.cc_major;
    h->cc_minor = ctx->dev.cc_minor;
    h->mps = ctx->dev.mps;
    h->limits = ctx->limits;
    h->channel = true;
    h->paths = RNP_PATH_CLASSIC | (ctx->rings.started ? RNP_PATH_FAST : 0);
    return 0;
}

int rnd_op_register(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                    rnp_error *err)
{
    uint32_t id;
    int rc;

    /* By name, the daemon would open the object with its own privileges,
     * which a client on the socket need not have: shared memory comes as a
     * descriptor on the session channel instead. */
    if (req->u.reg.kind == RNP_REGION_SHM && !ctx->cfg.allow_shm_names)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "register.kind: shared memory is registered by descriptor on the "
                        "session channel (%s%s); by name only with allow-shm-names = yes",
                        rnd_config_ipc_path(&ctx->cfg), RND_CHAN_SUFFIX);

    if ((rc = rnd_region_add(s, &req->u.reg, &id, err)) != 0)
        return rc;
    rep->u.reg.region.id = id;
    return 0;
}

int rnd_op_unregister(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                      rnp_error *err)
{
    const rnd_region *r = rnd_region_find(s, req->u.unreg.region.id);

    if (r && r->ring)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "unregister.region: region %u holds the session's open ring; "
                        "RING_CLOSE it first", (unsigned)r->id);
    return rnd_region_remove(s, req->u.unreg.region.id, err);
}

int rnd_op_events(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                  rnp_error *err)
{
    memset(&rep->u.events, 0, sizeof rep->u.events);
    return ctx->be->ops->events(ctx->be, s->bsess, &req->u.events, &rep->u.events, err);
}

int rnd_op_ping(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                rnp_error *err)
{
    rep->u.ping.daemon_time_ns = rnd_now_ns();
    return 0;
}

int rnd_op_health(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                  rnp_error *err)
{
    rnd_health_fill(ctx, &rep->u.health);
    return 0;
}

int rnd_op_stats(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                 rnp_error *err)
{
    rnd_gauges g;

    memset(&rep->u.stats, 0, sizeof rep->u.stats);
    snprintf(rep->u.stats.backend, sizeof rep->u.stats.backend, "%s", ctx->dev.backend);
    snprintf(rep->u.stats.device, sizeof rep->u.stats.device, "%s", ctx->dev.device_name);
    g.sessions_active = ctx->sessions.n;
    g.sessions_unauth = rnd_sessions_unauthenticated(&ctx->sessions);
    g.regions_active = ctx->sessions.regions_active;
    g.inflight_current = ctx->inflight_total;
    g.now_ns = rnd_now_ns();
    g.rings_open = ctx->rings.open;
    g.graphs_open = ctx->rings.graphs;
    /* The request is already counted (on receipt); its reply is not, since
     * replies are counted as they are sent. */
    rnd_stats_fill(&ctx->stats, &g, &rep->u.stats);
    if (ctx->be && ctx->be->ops->stats)
        ctx->be->ops->stats(ctx->be, &rep->u.stats);
    return 0;
}

int rnd_op_bye(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
               rnp_error *err)
{
    return 0;
}
