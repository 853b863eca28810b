/* SPDX-License-Identifier: MIT */
/*
 * rmsnormctl.h - what rmsnormctl's files share: the global options, the exit
 * codes, the helpers of common.c, one entry point per command (each in
 * its own file, cmd_<name>.c) and the statistics formatter (format.c).
 *
 * client/ctl/ is rmsnormctl.  It uses libclient through its public header
 * only, and kernels/ (through rmsnormctl_verify.c: the CPU twin and the fp64
 * reference) to check the daemon's results in selftest and bench.  Internal
 * names use the prefix rnctl_ (rnv_ for the verification code, which the
 * integration tests share).
 */
#ifndef RMSNORMCTL_H
#define RMSNORMCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rmsnorm_client.h"

#define RNCTL_PROG "rmsnormctl"

/* Exit codes: 0 success; 1 a check failed (health degraded, selftest or
 * bench mismatch); 2 daemon unreachable or failing; 64 usage error
 * (EX_USAGE of sysexits.h).  The usage text and rmsnormctl(1) list them. */
#define EXIT_CHECK       1
#define EXIT_UNREACHABLE 2
#define EXIT_USAGE       64

/* The options before the command, which every command uses. */
typedef struct rnctl_globals {
    const char *endpoint; /* NULL: the default endpoint */
    int timeout_ms;       /* 0: the library's default */
} rnctl_globals;

/* ---- helpers (common.c) ------------------------------------------------------------- */

/* "rmsnormctl CMD: WHAT" and a hint to CMD --help on stderr; returns
 * EXIT_USAGE.  cmd NULL: the global options. */
int rnctl_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Connect as "rmsnormctl"; on failure say why on stderr. */
int rnctl_connect(const rnctl_globals *g, rn_client **c);

/* "rmsnormctl: WHAT failed: <last error> (<NAME>)" on stderr. */
void rnctl_call_failed(rn_client *c, const char *what, int rv);

/* Exit status for a failure to talk to the daemon. */
int rnctl_failure_status(int rv);

/* arg is -h or --help. */
bool rnctl_is_help(const char *arg);

/* Some argument after the command is -h or --help. */
bool rnctl_wants_help(int argc, char **argv);

/* "rmsnormctl CMD: unknown option OPT" on stderr; returns EXIT_USAGE. */
int rnctl_unknown_option(const char *cmd, const char *opt);

/* s as an integer in lo..hi; else a message naming `what` and -1. */
int rnctl_parse_u64(const char *s, const char *what, uint64_t lo, uint64_t hi, uint64_t *out);

/* Sort v ascending. */
void rnctl_sort_u64(uint64_t *v, size_t n);

/* Nearest-rank percentile of a sorted array. */
uint64_t rnctl_pct(const uint64_t *v, size_t n, double p);

/* Monotonic clock, seconds. */
double rnctl_now_s(void);

/* ---- the statistics formatter (format.c) ---------------------------------------------- */

typedef enum rnctl_format { RNCTL_TABLE, RNCTL_JSON, RNCTL_PROMETHEUS } rnctl_format;

/* Which daemon the statistics are of: the labels that keep the series of
 * several daemons apart. */
typedef struct rnctl_instance {
    char endpoint[256];
    char gpu_uuid[48]; /* "GPU-xxxxxxxx-...", "" without a GPU or when unknown */
} rnctl_instance;

/* Fill in the endpoint c is connected to and the daemon's GPU UUID (through
 * rn_server_info; left empty when that fails, e.g. at the session limit). */
void rnctl_instance_of(rn_client *c, const rnctl_globals *g, rnctl_instance *in);
/* The same from the options alone, no daemon asked: the endpoint given or the
 * default, no UUID. */
void rnctl_instance_local(const rnctl_globals *g, rnctl_instance *in);

/* s as a table, one JSON object, or the Prometheus text exposition format.
 * b: the buckets of s's histograms (b[i] beside s->hists[i]), or NULL; the
 * JSON and Prometheus formats use them where the daemon sent them. */
void rnctl_print_stats(FILE *f, rnctl_format fmt, const rn_stats_info *s,
                       const rn_hist_buckets *b, const rnctl_instance *in);
/* The Prometheus file of a daemon whose statistics could not be read:
 * rmsnormd_up 0 alone (its other series go, not left at their last values). */
void rnctl_print_down(FILE *f, const rnctl_instance *in);

/* ---- the commands (cmd_*.c): argv[0] is the command's name ------------------------------ */

int rnctl_health(const rnctl_globals *g, int argc, char **argv);
int rnctl_stats(const rnctl_globals *g, int argc, char **argv);
int rnctl_info(const rnctl_globals *g, int argc, char **argv);
int rnctl_ping(const rnctl_globals *g, int argc, char **argv);
int rnctl_selftest(const rnctl_globals *g, int argc, char **argv);
int rnctl_bench(const rnctl_globals *g, int argc, char **argv);
int rnctl_version(const rnctl_globals *g, int argc, char **argv);

#endif
