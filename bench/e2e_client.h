/* SPDX-License-Identifier: MIT */
/*
 * e2e_client.h - the client processes of bench_e2e_cuda (e2e_client.c),
 * which runs itself as `bench_e2e_cuda --client single|tput ENDPOINT ITERS`.
 */
#ifndef E2E_CLIENT_H
#define E2E_CLIENT_H

#include <stdint.h>

#include "rmsnorm_client.h"

/* 1. to 3. and 5. of bench_e2e_cuda.c's top: one "kernel" and one "shape"
 * line per shape on stdout.  Returns the exit status. */
int client_single(const char *endpoint, int iters);
/* 4.: "ready", then after a line on stdin, iters calls; one line of results. */
int client_tput(const char *endpoint, int iters);
/* The daemon's histogram name so far (c's STATS): its count and sum of ns;
 * zeros where the daemon sends none (fast.compute: none on the classic
 * path). */
void e2e_daemon_hist(rn_client *c, const char *name, uint64_t *count, uint64_t *sum_ns);

#endif
