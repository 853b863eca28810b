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
