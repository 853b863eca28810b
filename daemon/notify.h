/* SPDX-License-Identifier: MIT */
/*
 * notify.h - systemd's readiness protocol (sd_notify): READY=1 once serving,
 * STATUS= lines, STOPPING=1 when draining, WATCHDOG=1 pings.  Each call does
 * nothing when NOTIFY_SOCKET is unset (not started by systemd or a test).
 */
#ifndef RND_NOTIFY_H
#define RND_NOTIFY_H

#include <stdint.h>

void rnd_notify_ready(const char *status);
void rnd_notify_status(const char *status);
void rnd_notify_stopping(void);
void rnd_notify_watchdog(void);
/* WATCHDOG_USEC for this process, or 0 when the watchdog is off. */
uint64_t rnd_notify_watchdog_usec(void);

#endif
