/* SPDX-License-Identifier: MIT */
/*
 * common.c - what rmsnormctl's commands share: connecting, reporting a
 * failed call, option parsing helpers, percentiles and the clock.  Below the
 * commands (cmd_*.c), which main (rmsnormctl.c) dispatches to.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmsnormctl.h"

int rnctl_connect(const rnctl_globals *g, rn_client **c)
{
    rn_connect_opts o = {0};
    char ep[256];
    int rv;
    o.endpoint = g->endpoint;
    o.timeout_ms = g->timeout_ms;
    o.client_name = "rmsnormctl";
    rv = rn_connect(&o, c);
    if (rv != 0) {
        if (!g->endpoint && rn_default_endpoint(ep, sizeof ep))
            fprintf(stderr, "%s: cannot reach rmsnormd at %s: %s (%s)\n", RNCTL_PROG, ep,
                    rn_last_error(NULL), rn_err_name(rv));
        else
            fprintf(stderr, "%s: cannot reach rmsnormd: %s (%s)\n", RNCTL_PROG, rn_last_error(NULL),
                    rn_err_name(rv));
    }
    return rv;
}

void rnctl_call_failed(rn_client *c, const char *what, int rv)
{
    fprintf(stderr, "%s: %s failed: %s (%s)\n", RNCTL_PROG, what, rn_last_error(c),
            rn_err_name(rv));
}

int rnctl_failure_status(int rv)
{
    /* The daemon out of reach, gone, going or failing: 2.  A local error (no
     * memory, a system call here) is not the daemon's state: 1, as a check
     * that failed (it was 2 for every 4xx code). */
    switch (rv) {
    case RN_UNREACHABLE:
    case RN_TIMEOUT:
    case RN_ENDPOINT:
    case RN_PEER_DIED:
    case RN_RESTARTED:
    case RN_DRAINING:
    case RN_DEVICE_FAILING:
        return EXIT_UNREACHABLE;
    default:
        return EXIT_CHECK;
    }
}

bool rnctl_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

bool rnctl_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (rnctl_is_help(argv[i]))
            return true;
    return false;
}

int rnctl_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s%s%s: ", RNCTL_PROG, cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s%s%s --help' for more information.\n", RNCTL_PROG, cmd ? " " : "",
            cmd ? cmd : "");
    return EXIT_USAGE;
}

int rnctl_unknown_option(const char *cmd, const char *opt)
{
    return rnctl_usage_error(cmd, "unknown option %s", opt);
}

void rnctl_instance_local(const rnctl_globals *g, rnctl_instance *in)
{
    memset(in, 0, sizeof *in);
    if (g->endpoint)
        snprintf(in->endpoint, sizeof in->endpoint, "%s", g->endpoint);
    else if (!rn_default_endpoint(in->endpoint, sizeof in->endpoint))
        in->endpoint[0] = '\0';
}

void rnctl_instance_of(rn_client *c, const rnctl_globals *g, rnctl_instance *in)
{
    struct rn_server_info si = {0};
    bool any = false;
    rnctl_instance_local(g, in);
    /* HELLO opens a session; a daemon at its session limit answers BUSY,
     * and the statistics go out without the UUID rather than not at all. */
    if (rn_server_info(c, &si) != 0)
        return;
    snprintf(in->endpoint, sizeof in->endpoint, "%s", si.endpoint);
    for (int i = 0; i < RN_UUID_LEN; i++)
        any |= si.device_uuid[i] != 0;
    if (!any)
        return;
    char *p = in->gpu_uuid;
    p += sprintf(p, "GPU-");
    for (int i = 0; i < RN_UUID_LEN; i++)
        p += sprintf(p, "%02x%s", si.device_uuid[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
}

int rnctl_parse_u64(const char *s, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    unsigned long long v;
    errno = 0;
    if (*s == '-' || *s == '\0')
        goto bad;
    v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "%s: %s: \"%s\" is not an integer in %" PRIu64 "..%" PRIu64 "\n", RNCTL_PROG,
            what, s, lo, hi);
    return -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void rnctl_sort_u64(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
}

uint64_t rnctl_pct(const uint64_t *v, size_t n, double p)
{
    size_t k;
    if (n == 0)
        return 0;
    k = (size_t)ceil(p / 100.0 * (double)n);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

double rnctl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
