/* SPDX-License-Identifier: MIT */
/*
 * ctx.h - the state every part of the request path reads: configuration,
 * the backend and what it reported, the limits sent in HELLO, statistics,
 * the session table, the socket, and the daemon's condition (draining,
 * failing).  One instance, owned by server.c, lives on the loop thread; none
 * of it is locked.
 *
 * Who writes what: server.c the condition flags; transport.c the socket
 * (and counts replies); chan.c the session channel; session.c the session
 * table; request.c the request counters.  Everyone else only reads.
 */
#ifndef RND_CTX_H
#define RND_CTX_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "chan.h"
#include "config.h"
#include "ring.h"
#include "rn_proto.h"
#include "session.h"
#include "stats.h"
#include "transport.h"

typedef struct rnd_ctx {
    uv_loop_t *loop;
    rnd_config cfg;
    rnd_backend *be;
    rnd_device_info dev;
    rnp_limits limits;
    rnd_stats stats;
    rnd_sessions sessions;
    rnd_transport tx;
    rnd_chan chan;
    rnd_rings rings;

    uint32_t inflight_total;       /* BWD requests submitted and not yet answered
                                    * (the admission limit; an acknowledged one
                                    * runs on, bounded by the backend's queue) */
    uint32_t held_total;           /* BWD requests submitted and not yet released:
                                    * the drain ends at 0 */
    bool draining;                 /* new work is refused */
    bool failing;                  /* the backend failed; fail_msg says how */
    char fail_msg[RNP_REASON_LEN];
    char fallback[RNP_REASON_LEN]; /* why --backend auto is not on CUDA; "" if fine */
    uint64_t last_busy_ns;         /* the last BUSY at a daemon-wide limit (HEALTH's
                                    * degraded window); a session's own limits
                                    * say nothing of the daemon's health */
} rnd_ctx;

#endif
