/* SPDX-License-Identifier: MIT */
/*
 * cmd_ping.c - rmsnormctl ping: N round trips one after another, and their
 * percentiles.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnormctl.h"

int rnctl_ping(const rnctl_globals *g, int argc, char **argv)
{
    uint64_t count = 10, *rtt;
    rn_client *c = NULL;
    int rv = 0;
    size_t done = 0;
    double sum = 0;

    for (int i = 1; i < argc; i++) {
        if (rnctl_is_help(argv[i])) {
            printf(
                "Usage: %s ping [-c|--count N]\n\nSend N pings (default 10) one after another and print\n"
                "the round-trip percentiles.\n",
                RNCTL_PROG);
            return 0;
        } else if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--count") == 0) &&
                   i + 1 < argc) {
            if (rnctl_parse_u64(argv[++i], "ping -c", 1, 100000000, &count) != 0)
                return EXIT_USAGE;
        } else {
            return rnctl_unknown_option("ping", argv[i]);
        }
    }
    rtt = calloc(count, sizeof *rtt);
    if (rtt == NULL) {
        fprintf(stderr, "%s: out of memory for %" PRIu64 " samples\n", RNCTL_PROG, count);
        return EXIT_CHECK;
    }
    if (rnctl_connect(g, &c) != 0) {
        free(rtt);
        return EXIT_UNREACHABLE;
    }
    for (; done < count; done++) {
        if ((rv = rn_ping(c, &rtt[done])) != 0) {
            rnctl_call_failed(c, "ping", rv);
            break;
        }
        sum += (double)rtt[done];
    }
    rn_close(c);
    if (done > 0) {
        rnctl_sort_u64(rtt, done);
        printf("%zu pings to %s\n", done, g->endpoint ? g->endpoint : "the default endpoint");
        printf("round trip (us): min %.1f  p50 %.1f  p90 %.1f  p99 %.1f  max %.1f  mean %.1f\n",
               (double)rtt[0] / 1e3, (double)rnctl_pct(rtt, done, 50) / 1e3,
               (double)rnctl_pct(rtt, done, 90) / 1e3, (double)rnctl_pct(rtt, done, 99) / 1e3,
               (double)rtt[done - 1] / 1e3, sum / (double)done / 1e3);
    }
    free(rtt);
    return rv == 0 ? 0 : rnctl_failure_status(rv);
}
