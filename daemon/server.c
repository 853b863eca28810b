/* SPDX-License-Identifier: MIT */
/*
 * server.c - start-up, the periodic work (idle sessions, dead clients,
 * systemd status and watchdog, the stuck-request check), signals, and the
 * drain with the exit status: 0 after a clean drain, 2 after a fatal
 * backend failure.
 */
#include "server.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "health.h"
#include "log.h"
#include "notify.h"
#include "request.h"

/* The session table's ring hook: the ring closes; a client that lives on
 * gets an answer for its slots still waiting for their input (a dead one's
 * were cancelled). */
static void ring_end(rnd_session *s)
{
    rnd_ring_session_end(s);
    if (!s->gone)
        rnd_request_abandon_ring(s, RN_UNKNOWN_SESSION);
}

/* A mapping (cudaIpcOpenMemHandle, cudaHostRegister, the VMM maps) may wait
 * for the device: no armed call may hold it up (ring_arm.c), the mapping
 * session's own included (its ready may wait for this reply). */
static void before_map(rnd_session *s)
{
    rnd_ctx *ctx = (rnd_ctx *)(void *)((char *)s->tab - offsetof(rnd_ctx, sessions));
    rnd_rings_revoke_others(&ctx->rings, NULL, "a region being mapped");
}

static void update_status(rnd_server *srv, bool force)
{
    rnd_ctx *ctx = &srv->ctx;
    char status[128];

    snprintf(status, sizeof status, "%s%s backend; %u sessions, %u requests in flight",
             ctx->draining ? "draining; " : "", ctx->dev.backend, ctx->sessions.n,
             ctx->inflight_total);
    if (!force && strcmp(status, srv->last_status) == 0)
        return;
    snprintf(srv->last_status, sizeof srv->last_status, "%s", status);
    rnd_notify_status(status);
}

static void on_idle_timer(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    rnd_sessions_expire(&srv->ctx.sessions, rnd_now_ns());
}

/* Once a second: the pid check of clients without a pidfd, STATUS= when it
 * changed (so a busy daemon sends at most one a second), and the
 * stuck-request check. */
static void on_tick(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    uint64_t oldest;

    rnd_sessions_check_pids(&srv->ctx.sessions);
    rnd_sessions_expire_unauthenticated(&srv->ctx.sessions, rnd_now_ns());
    rnd_chan_expire(&srv->ctx, rnd_now_ns());
    update_status(srv, false);
    if (rnd_health_stuck(&srv->ctx, rnd_now_ns(), &oldest)) {
        if (!srv->stuck_logged)
            rnd_err("A request has been pending for %llu s: reporting failing",
                    (unsigned long long)(oldest / 1000000000u));
        srv->stuck_logged = true;
    } else {
        srv->stuck_logged = false;
    }
}

/* Ping the watchdog only while the daemon serves: a wedged backend, or a
 * front process that cannot stay up, stops the pings and systemd restarts
 * the daemon. */
static void on_watchdog(uv_timer_t *t)
{
    rnd_server *srv = t->data;
    if (!srv->ctx.failing && rnd_transport_serving(&srv->ctx) &&
        !rnd_health_stuck(&srv->ctx, rnd_now_ns(), NULL))
        rnd_notify_watchdog();
}

static void close_handle(uv_handle_t *h)
{
    if (h->loop && !uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_drain_idle(uv_idle_t *h);

/* The grace period is over: answer what is queued, release everything and
 * let the loop end. */
static void finish_drain(rnd_server *srv)
{
    rnd_ctx *ctx = &srv->ctx;

    if (!srv->sessions_ended) {
        rnd_transport_receive_all(ctx);
        rnd_sessions_end_all(&ctx->sessions, "daemon shutting down");
        srv->sessions_ended = true;
        /* The rings' last takes (slots left for their ready words) went to
         * the backend, to be answered without running; their releases come
         * back on the loop, and only then do the rings close (state 1,
         * PROTOCOL.md 13.6).  The drain ends once they have: another pass
         * of on_drain_check and the grace period. */
        if (ctx->held_total > 0) {
            srv->grace = false;
            uv_idle_start(&srv->drain_idle, on_drain_idle);
            return;
        }
    }
    rnd_rings_fini(&ctx->rings);
    rnd_chan_close(ctx);
    rnd_transport_close(ctx);
    if (srv->handles_init) {
        close_handle((uv_handle_t *)&srv->idle_timer);
        close_handle((uv_handle_t *)&srv->tick_timer);
        close_handle((uv_handle_t *)&srv->wd_timer);
        close_handle((uv_handle_t *)&srv->sig_term);
        close_handle((uv_handle_t *)&srv->sig_int);
        close_handle((uv_handle_t *)&srv->sig_hup);
        /* libuv gives a signal its default action back as its last handle
         * closes, and the core lives on till the front has exited (up to 2
         * s): a second SIGTERM or SIGINT (Ctrl-C twice) or a SIGHUP (a log
         * rotation) would then kill it mid-way, the front's refusals unsent,
         * the socket file left, the status 143 (found in review).  The
         * drain is done: they are ignored. */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        close_handle((uv_handle_t *)&srv->drain_check);
        close_handle((uv_handle_t *)&srv->drain_idle);
        close_handle((uv_handle_t *)&srv->grace_timer);
    }
    if (ctx->be) {
        ctx->be->ops->fini(ctx->be);
        ctx->be = NULL;
    }
    rnd_info("Drained: %llu requests answered, exiting with status %d",
             (unsigned long long)(ctx->stats.replies_ok), srv->exit_code);
}

/* After every loop iteration's callbacks: the one point where the drain
 * ends, so that no backend or transport callback ever sees the backend
 * finished under it. */
static void on_grace_over(uv_timer_t *t)
{
    finish_drain(t->data);
}

static void on_drain_check(uv_check_t *h)
{
    rnd_server *srv = h->data;

    uv_idle_stop(&srv->drain_idle);
    /* Draining refuses new BWD work, so once nothing is in flight nothing
     * will be: the grace period only answers. */
    if (srv->ctx.draining && !srv->grace && srv->ctx.held_total == 0) {
        srv->grace = true;
        uv_timer_start(&srv->grace_timer, on_grace_over, RND_DRAIN_GRACE_MS, 0);
    }
}

static void on_drain_idle(uv_idle_t *h)
{
    /* Nothing: an active idle handle only makes the next poll return at
     * once, so that the check phase comes without waiting for an event. */
}

void rnd_server_set_fallback(rnd_server *srv, const char *why)
{
    snprintf(srv->ctx.fallback, sizeof srv->ctx.fallback, "%s", why);
}

void rnd_server_drain(rnd_server *srv, const char *why)
{
    rnd_ctx *ctx = &srv->ctx;

    /* The drain ends in the check phase (on_drain_check); the idle handle
     * gets the loop there promptly even when the drain began in a timer's
     * callback, where the next poll would otherwise wait for the next
     * timer. */
    if (!srv->grace)
        uv_idle_start(&srv->drain_idle, on_drain_idle);
    if (ctx->draining) {
        rnd_notice("Already draining (%u requests in flight)", ctx->held_total);
        return;
    }
    ctx->draining = true;
    rnd_request_drain_rings(ctx);
    rnd_notice("Draining (%s): %u requests in flight, new work is refused", why,
               ctx->held_total);
    rnd_notify_stopping();
}

void rnd_server_fatal(void *arg, const char *msg)
{
    rnd_server *srv = arg;
    rnd_ctx *ctx = &srv->ctx;

    rnd_err("Backend failed: %s", msg);
    if (!ctx->failing) {
        ctx->failing = true;
        snprintf(ctx->fail_msg, sizeof ctx->fail_msg, "%s", msg);
    }
    srv->exit_code = 2;
    rnd_server_drain(srv, "backend failure");
}

void rnd_server_revoke(void *arg)
{
    rnd_server *srv = arg;

    rnd_rings_revoke_others(&srv->ctx.rings, NULL, "a close would wait for it");
}

static void on_signal(uv_signal_t *h, int signum)
{
    rnd_server *srv = h->data;

    if (signum == SIGHUP) {
        rnp_error err = {0};
        int level = rnd_log_get_level();
        const rnd_config *cfg = &srv->ctx.cfg;
        if (cfg->log_level_from_flag) {
            rnd_notice("SIGHUP: log level stays %s (set by --log-level)", rnd_log_level_name(level));
            return;
        }
        if (!cfg->config_path[0]) {
            rnd_notice("SIGHUP: no configuration file was read; log level stays %s",
                       rnd_log_level_name(level));
            return;
        }
        if (rnd_config_reread_log_level(cfg->config_path, &level, &err) != 0) {
            rnd_err("SIGHUP: %s; log level stays %s", err.msg,
                    rnd_log_level_name(rnd_log_get_level()));
            return;
        }
        rnd_log_set_level(level);
        rnd_notice("SIGHUP: log level is %s", rnd_log_level_name(level));
        return;
    }
    rnd_server_drain(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void fill_limits(rnd_ctx *ctx)
{
    rnp_limits *l = &ctx->limits;
    l->max_sessions = ctx->cfg.max_sessions;
    l->max_regions = ctx->cfg.max_regions;
    l->max_inflight = ctx->cfg.max_inflight;
    l->max_inflight_total = ctx->cfg.max_inflight_total;
    l->max_m = ctx->cfg.max_m;
    l->max_n = ctx->cfg.max_n;
    l->max_msg = RNP_MAX_MSG;
    l->event_slots = ctx->dev.event_slots;
    l->seq_window = rnd_seq_window(&ctx->cfg);
}

int rnd_server_start(rnd_server *srv, uv_loop_t *loop, const rnd_config *cfg, rnd_backend *be,
                     rnp_error *err)
{
    rnd_ctx *ctx = &srv->ctx;
    uint64_t idle_ms;
    int rc;

    memset(srv, 0, sizeof *srv);
    ctx->loop = loop;
    ctx->cfg = *cfg;
    ctx->be = be;
    ctx->tx.fd = -1;
    rnd_stats_init(&ctx->stats, rnd_now_ns());
    be->ops->info(be, &ctx->dev);
    fill_limits(ctx);
    rnd_sessions_init(&ctx->sessions, loop, be, &ctx->cfg, &ctx->stats,
                      rnd_request_cancel_session);
    ctx->sessions.ring_end = ring_end;
    ctx->sessions.ring_pending = rnd_ring_pending;
    ctx->sessions.before_map = before_map;
    if ((rc = rnd_rings_init(ctx, &ctx->rings, rnd_request_ring, err)) != 0)
        return rc;
    ctx->rings.discard = rnd_request_ring_discard; /* (slots prepared ahead: ring.c) */
    ctx->rings.revoke = rnd_request_revoke_ring;   /* (armed slots: ring_arm.c) */

    /* The channel first: its bind finds another daemon on the endpoint
     * without starting a front, and a failure leaves nothing to stop. */
    if ((rc = rnd_chan_open(ctx, err)) != 0) {
        rnd_rings_fini(&ctx->rings);
        return rc;
    }
    if ((rc = rnd_transport_open(ctx, rnd_request_receive, err)) != 0) {
        rnd_chan_close(ctx);
        rnd_rings_fini(&ctx->rings);
        return rc;
    }
    if ((rc = rnd_chan_start(ctx, err)) != 0) {
        rnd_chan_close(ctx);
        rnd_transport_close(ctx);
        rnd_rings_fini(&ctx->rings);
        return rc;
    }

    uv_timer_init(loop, &srv->idle_timer);
    uv_timer_init(loop, &srv->tick_timer);
    uv_timer_init(loop, &srv->wd_timer);
    uv_signal_init(loop, &srv->sig_term);
    uv_signal_init(loop, &srv->sig_int);
    uv_signal_init(loop, &srv->sig_hup);
    uv_check_init(loop, &srv->drain_check);
    uv_idle_init(loop, &srv->drain_idle);
    uv_timer_init(loop, &srv->grace_timer);
    srv->handles_init = true;
    srv->idle_timer.data = srv->tick_timer.data = srv->wd_timer.data = srv;
    srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
    srv->drain_check.data = srv->drain_idle.data = srv->grace_timer.data = srv;
    uv_check_start(&srv->drain_check, on_drain_check);
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
    rnd_rings_fini(&srv->ctx.rings);
    rnd_chan_close(&srv->ctx);
    rnd_transport_close(&srv->ctx);
}

void rnd_server_announce(rnd_server *srv)
{
    char status[128];
    snprintf(status, sizeof status, "%s backend; 0 sessions, 0 requests in flight",
             srv->ctx.dev.backend);
    snprintf(srv->last_status, sizeof srv->last_status, "%s", status);
    rnd_notify_ready(status);
}
