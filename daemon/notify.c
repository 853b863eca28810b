/* SPDX-License-Identifier: MIT */
/*
 * notify.c - thin wrappers over libsystemd's sd_notify.
 */
#include "notify.h"

#include <stdio.h>
#include <systemd/sd-daemon.h>

#include "log.h"

static void notify(const char *what)
{
    int rc = sd_notify(0, what);
    if (rc < 0)
        rnd_debug("sd_notify(%s) failed: %d", what, rc);
}

void rnd_notify_ready(const char *status)
{
    char buf[256];
    snprintf(buf, sizeof buf, "READY=1\nSTATUS=%s", status);
    notify(buf);
}

void rnd_notify_status(const char *status)
{
    char buf[256];
    snprintf(buf, sizeof buf, "STATUS=%s", status);
    notify(buf);
}

void rnd_notify_stopping(void) { notify("STOPPING=1\nSTATUS=draining"); }

void rnd_notify_watchdog(void) { notify("WATCHDOG=1"); }

uint64_t rnd_notify_watchdog_usec(void)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0)
        return 0;
    return usec;
}
