/* SPDX-License-Identifier: MIT */
/*
 * bench_host.h - what the benchmarks of the daemon's host side share
 * (bench_bell, bench_late): their daemon, started as a child on an ipc://
 * endpoint with no configuration file and the CPU backend unless the extra
 * arguments name one, and their call, a tiny fp32 problem whose time is the
 * trip.
 */
#ifndef RN_BENCH_HOST_H
#define RN_BENCH_HOST_H

#include <sys/types.h>

#include "rmsnorm_client.h"

/* The call's shape: BENCH_TINY_M x BENCH_TINY_N fp32 rows with a weight. */
enum { BENCH_TINY_M = 4, BENCH_TINY_N = 256 };
/* Floats the call's tensors take: x, dy, dx, w, dw. */
#define BENCH_TINY_FLOATS (3 * BENCH_TINY_M * BENCH_TINY_N + 2 * BENCH_TINY_N)

/* Start path --endpoint endpoint --config /dev/null [--backend cpu] extra...
 * (its stderr to /dev/null) and wait until it answers a PING, at most 10 s.
 * Returns its pid, or -1 with the reason on stderr (a daemon that did not
 * answer is killed). */
pid_t bench_daemon_start(const char *path, const char *endpoint, char **extra, int nextra);

/* SIGTERM, then wait for it (nothing for pid <= 0). */
void bench_daemon_stop(pid_t pid);

/* The call's inputs (fixed values, none zero) in buf, BENCH_TINY_FLOATS
 * floats: x, dy, dx, w, dw in that order; *a: the call on them. */
void bench_tiny_call(float *buf, rn_bwd_args *a);

#endif
