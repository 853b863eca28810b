/*
 * rmsnormctl - ask rmsnormd for its health and statistics, measure it, and
 * check that it computes the right thing.
 *
 *   rmsnormctl [--endpoint URL] [--timeout MS] COMMAND [OPTIONS]
 *
 * This file holds main (the global options and the command table) and the
 * helpers the commands share; each command lives in cmd_<name>.c.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmsnormctl.h"

static void usage_main(FILE *f)
{
    fprintf(f,
            "Usage: %s [--endpoint URL] [--timeout MS] COMMAND [OPTIONS]\n"
            "\n"
            "Talk to rmsnormd, the RMSNorm backward daemon.\n"
            "\n"
            "Options:\n"
            "  -e, --endpoint URL   daemon endpoint (default: $RMSNORMD_ENDPOINT, else\n"
            "                       ipc://$RUNTIME_DIRECTORY/rmsnormd.sock, else\n"
            "                       ipc://$XDG_RUNTIME_DIR/rmsnormd.sock, else\n"
            "                       ipc:///tmp/rmsnormd-$UID.sock)\n"
            "  -t, --timeout MS     per-request timeout (default %d)\n"
            "  -h, --help           this text; COMMAND --help for a command's options\n"
            "\n"
            "Commands:\n"
            "  health     daemon health; exit 0 ok, 1 degraded, 2 unreachable or failing\n"
            "  stats      counters and latency histograms (table, --json, --prometheus)\n"
            "  info       what the daemon said at HELLO: backend, device, limits\n"
            "  ping       round-trip times (-c N)\n"
            "  selftest   run a grid of shapes and dtypes and check every result\n"
            "  bench      K processes x R requests, verified, with throughput and latency\n"
            "  version    versions of rmsnormctl, libclient and (if reachable) the daemon\n",
            RNCTL_PROG, RN_DEFAULT_TIMEOUT_MS);
}

/* ---- helpers ------------------------------------------------------------------------ */

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
    return RN_STATUS_GROUP(rv) == 4 || rv == RN_DEVICE_FAILING ? EXIT_UNREACHABLE : EXIT_CHECK;
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

int rnctl_unknown_option(const char *cmd, const char *opt)
{
    fprintf(stderr, "%s %s: unknown option %s\n", RNCTL_PROG, cmd, opt);
    return EXIT_USAGE;
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

/* ---- main ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const struct {
        const char *name;
        int (*fn)(const rnctl_globals *, int, char **);
    } cmds[] = {
        {"health", rnctl_health},   {"stats", rnctl_stats},       {"info", rnctl_info},
        {"ping", rnctl_ping},       {"selftest", rnctl_selftest}, {"bench", rnctl_bench},
        {"version", rnctl_version},
    };
    rnctl_globals g = {0};
    int ch;
    uint64_t t;

    /* '+': stop at the command, whose options are its own. */
    while ((ch = getopt_long(argc, argv, "+e:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'e':
            g.endpoint = optarg;
            break;
        case 't':
            if (rnctl_parse_u64(optarg, "--timeout", 1, 86400000, &t) != 0)
                return EXIT_USAGE;
            g.timeout_ms = (int)t;
            break;
        case 'h':
            usage_main(stdout);
            return 0;
        default:
            usage_main(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[optind], cmds[i].name) == 0)
            return cmds[i].fn(&g, argc - optind, argv + optind);
    if (strcmp(argv[optind], "help") == 0) {
        usage_main(stdout);
        return 0;
    }
    fprintf(stderr, "%s: unknown command \"%s\" (see %s --help)\n", RNCTL_PROG, argv[optind],
            RNCTL_PROG);
    return EXIT_USAGE;
}
