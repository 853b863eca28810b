/* SPDX-License-Identifier: MIT */
/*
 * health.c - ok: serving within limits.  degraded: serving, but a client may
 * see BUSY or DRAINING (at a limit, refused a request at a limit in the last
 * 10 s, draining) or the backend reports a slow configuration (CUDA without
 * MPS).  failing: the backend hit a fatal error or a request has been pending
 * past the deadline.  Running the CPU backend because --backend auto found no
 * usable CUDA device is ok: the host serves all it can, and HELLO, HEALTH and
 * STATS name the backend.  Running it because a CUDA device exists but the
 * cuda backend failed to start is degraded: the host could do better.
 */
#include "health.h"

#include <stdio.h>
#include <string.h>

bool rnd_health_stuck(const rnd_ctx *ctx, uint64_t now_ns, uint64_t *age_ns)
{
    uint64_t oldest = rnd_sessions_oldest(&ctx->sessions);
    uint64_t age = oldest && now_ns > oldest ? now_ns - oldest : 0;

    if (age_ns)
        *age_ns = age;
    return age > RND_STUCK_NS;
}

#define REASON(...)                                                                     \
    do {                                                                                \
        if (out->nreasons < RNP_MAX_REASONS)                                            \
            snprintf(out->reasons[out->nreasons++], RNP_REASON_LEN, __VA_ARGS__);      \
    } while (0)
#define WORSE(st) (out->state = out->state > (uint32_t)(st) ? out->state : (uint32_t)(st))

void rnd_health_fill(const rnd_ctx *ctx, rnp_health_rep *out)
{
    uint64_t now = rnd_now_ns(), oldest;
    uint32_t n = 0;
    int st;

    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "%s", ctx->dev.backend);
    out->mps = ctx->dev.mps;
    if (ctx->failing) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("backend: %.100s", ctx->fail_msg);
    }
    if (rnd_health_stuck(ctx, now, &oldest)) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("stuck: a request has been pending for %llu s (deadline %llu s)",
               (unsigned long long)(oldest / 1000000000u),
               (unsigned long long)(RND_STUCK_NS / 1000000000u));
    }
    if (ctx->be) {
        st = ctx->be->ops->health(ctx->be, out->reasons + out->nreasons,
                                  RNP_MAX_REASONS - out->nreasons, &n);
        out->nreasons += n;
        WORSE(st);
    }
    if (rnd_transport_flapping(ctx)) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("front: the socket's front process died %u times within a minute; "
               "restarting it once a second", RND_FRONT_RESTARTS);
    } else if (ctx->tx.probe_failed) {
        WORSE(RNP_HEALTH_FAILING);
        REASON("front: a new connection to the socket went unanswered; restarting the front");
    } else if (!ctx->tx.front_running && !ctx->tx.closing) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("front: the socket's front process is restarting");
    }
    if (ctx->fallback[0]) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("backend: %.100s", ctx->fallback);
    }
    if (ctx->draining) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("draining: shutting down, new work is refused");
    }
    if (ctx->sessions.n >= ctx->cfg.max_sessions) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("sessions: %u in use, the limit (--max-sessions); %u not authenticated",
               ctx->sessions.n, rnd_sessions_unauthenticated(&ctx->sessions));
    }
    const rnd_sessions *t = &ctx->sessions;
    if (t->map_budget != UINT64_MAX && t->regions_active * 10 >= t->map_budget * 9) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("mappings: %llu regions mapped of %llu the daemon allows (--max-mappings)",
               (unsigned long long)t->regions_active, (unsigned long long)t->map_budget);
    }
    if (ctx->inflight_total >= ctx->cfg.max_inflight_total) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("inflight: %u requests in flight, the limit (--max-inflight-total)",
               ctx->inflight_total);
    }
    if (ctx->tx.refused_last_ns && now - ctx->tx.refused_last_ns < RND_BUSY_WINDOW_NS) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("connections: refused at the limit of %u (--max-connections) in the last %llu s",
               ctx->cfg.max_connections, (unsigned long long)(RND_BUSY_WINDOW_NS / 1000000000u));
    }
    if (ctx->last_busy_ns && now - ctx->last_busy_ns < RND_BUSY_WINDOW_NS) {
        WORSE(RNP_HEALTH_DEGRADED);
        REASON("busy: requests were refused at a limit in the last %llu s",
               (unsigned long long)(RND_BUSY_WINDOW_NS / 1000000000u));
    }
}
