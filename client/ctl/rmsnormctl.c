/* SPDX-License-Identifier: MIT */
/*
 * rmsnormctl - ask rmsnormd for its health and statistics, measure it, and
 * check that it computes the right thing.
 *
 *   rmsnormctl [--endpoint URL] [--timeout MS] COMMAND [OPTIONS]
 *
 * This file holds main (the global options and the command table); each
 * command lives in cmd_<name>.c, the helpers they share in common.c.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <unistd.h>
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
            "                       (a socket path such as /run/rmsnormd/0/rmsnormd.sock\n"
            "                       means ipc:// and that path)\n"
            "  -t, --timeout MS     per-request timeout (default %d)\n"
            "  -h, --help           this text; COMMAND --help for a command's options\n"
            "  -V, --version        rmsnormctl's version (the version command also asks\n"
            "                       the daemon)\n"
            "\n"
            "Commands:\n"
            "  health     daemon health; exit 0 ok, 1 degraded, 2 unreachable or failing\n"
            "  stats      counters and latency histograms (table, --json, --prometheus)\n"
            "  info       what the daemon said at HELLO: backend, device, limits\n"
            "  ping       round-trip times (-c N)\n"
            "  selftest   run a grid of shapes and dtypes and check every result\n"
            "  bench      K processes x R requests, verified, with throughput and latency\n"
            "  version    versions of rmsnormctl, libclient and (if reachable) the daemon\n"
            "\n"
            "Exit status: 0 success; 1 a check failed (health degraded, a selftest or\n"
            "bench mismatch); 2 the daemon is unreachable or failing; 64 usage error.\n",
            RNCTL_PROG, RN_DEFAULT_TIMEOUT_MS);
}

/*
 * An endpoint as libclient takes it: a socket path (absolute, or relative
 * to the working directory) becomes ipc://PATH, as the documentation's
 * paths are written; a URL stays as it is.
 */
static const char *endpoint_url(const char *arg, char *buf, size_t len)
{
    char cwd[PATH_MAX];
    if (strstr(arg, "://"))
        return arg;
    if (arg[0] == '/')
        snprintf(buf, len, "ipc://%s", arg);
    else if (getcwd(cwd, sizeof cwd))
        snprintf(buf, len, "ipc://%s/%s", cwd, arg);
    else
        return arg;
    return buf;
}

/* ---- main ----------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
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
    static char epbuf[4096 + 8];
    int ch;
    uint64_t t;

    /* '+': stop at the command, whose options are its own. */
    /* ':' first: a missing value is reported as such, by us, in one line. */
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+:e:t:hV", opts, NULL)) != -1) {
        switch (ch) {
        case 'e':
            g.endpoint = endpoint_url(optarg, epbuf, sizeof epbuf);
            break;
        case 't':
            if (rnctl_parse_u64(optarg, "--timeout", 1, 86400000, &t) != 0)
                return EXIT_USAGE;
            g.timeout_ms = (int)t;
            break;
        case 'h':
            usage_main(stdout);
            return 0;
        case 'V':
            printf("rmsnormctl %s (libclient %s)\n", RN_VERSION, rn_version());
            return 0;
        case ':':
            return rnctl_usage_error(NULL, "%s needs a value", argv[optind - 1]);
        default:
            return rnctl_usage_error(NULL, "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return rnctl_usage_error(NULL, "no command given");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[optind], cmds[i].name) == 0)
            return cmds[i].fn(&g, argc - optind, argv + optind);
    if (strcmp(argv[optind], "help") == 0) {
        usage_main(stdout);
        return 0;
    }
    return rnctl_usage_error(NULL, "unknown command \"%s\"", argv[optind]);
}
