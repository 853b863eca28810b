/* SPDX-License-Identifier: MIT */
/*
 * health.h - the daemon's health as HEALTH reports it, and the stuck-request
 * check that the watchdog and the once-a-second tick share.
 */
#ifndef RND_HEALTH_H
#define RND_HEALTH_H

#include <stdbool.h>
#include <stdint.h>

#include "ctx.h"

/* A request older than this (receipt to now) marks the daemon failing and
 * stops the watchdog pings, so systemd restarts a wedged daemon. */
#define RND_STUCK_NS (120ull * 1000000000ull)
/* HEALTH reports degraded for this long after a BUSY reply. */
#define RND_BUSY_WINDOW_NS (10ull * 1000000000ull)

/* Whether a request has been pending past RND_STUCK_NS; *age_ns (may be
 * NULL) gets the age of the oldest one. */
bool rnd_health_stuck(const rnd_ctx *ctx, uint64_t now_ns, uint64_t *age_ns);
void rnd_health_fill(const rnd_ctx *ctx, rnp_health_rep *out);

#endif
