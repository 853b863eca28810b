/* SPDX-License-Identifier: MIT */
/*
 * server.h - the daemon's life: start (socket, timers, signals), serving,
 * the drain and the exit status.  The request path itself is request.c's;
 * the state it shares is ctx.h's.
 *
 * The drain (SIGTERM, SIGINT, a fatal backend failure) refuses new work,
 * lets every request in flight finish and be answered, keeps answering
 * (DRAINING, or PING/HEALTH/STATS as usual) for a short grace period so that
 * requests already on their way get a reply rather than a closed socket,
 * answers what is queued once more, then ends every session, closes the
 * socket and the backend, and lets the loop end.  Its last steps run from the
 * server's own handles, never from inside a backend's or the transport's
 * callback.
 */
#ifndef RND_SERVER_H
#define RND_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ctx.h"

/* How long a drained daemon keeps answering before it closes its socket. */
#define RND_DRAIN_GRACE_MS 200

typedef struct rnd_server {
    rnd_ctx ctx;                   /* first */
    uv_timer_t idle_timer, tick_timer, wd_timer;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_check_t drain_check;        /* ends the drain once nothing is in flight */
    uv_idle_t drain_idle;          /* brings the loop to the check phase at once */
    uv_timer_t grace_timer;        /* the drain's grace period */
    bool grace;                    /* the grace period has begun */
    bool sessions_ended;           /* the drain ended every session (finish_drain) */
    bool handles_init;
    bool stuck_logged;
    uint64_t wd_usec;
    int exit_code;
    char last_status[128];
} rnd_server;

/*
 * Start serving: bind the socket (mode, group), install signals and timers.
 * cfg is copied; be is borrowed (the server calls its fini at shutdown).
 * Returns 0, or an rn_status with a one-line message in err.
 */
int rnd_server_start(rnd_server *srv, uv_loop_t *loop, const rnd_config *cfg, rnd_backend *be,
                     rnp_error *err);
/* Under --backend auto, CUDA was present but its backend did not start: HEALTH
 * reports degraded with this reason.  (No CUDA device at all is not degraded.) */
void rnd_server_set_fallback(rnd_server *srv, const char *why);
/* Tell systemd (READY=1) that the daemon serves. */
void rnd_server_announce(rnd_server *srv);
/* Begin the drain (what SIGTERM does). */
void rnd_server_drain(rnd_server *srv, const char *why);
/* After uv_run returned: free what is left. */
void rnd_server_fini(rnd_server *srv);
/* The fatal-error hook handed to the backend (ctx: the server). */
void rnd_server_fatal(void *srv, const char *msg);
/* rnd_backend_opts.revoke: every ring's armed calls taken back. */
void rnd_server_revoke(void *srv);

#endif
