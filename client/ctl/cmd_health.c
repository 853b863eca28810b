/* SPDX-License-Identifier: MIT */
/*
 * cmd_health.c - rmsnormctl health: the daemon's health state and why it is
 * not ok; the exit status says the same for scripts and probes.
 */
#include <string.h>

#include "rmsnormctl.h"

int rnctl_health(const rnctl_globals *g, int argc, char **argv)
{
    rn_client *c = NULL;
    rn_health_info h;
    static const char *names[] = {"ok", "degraded", "failing"};
    int rv, quiet = 0;

    for (int i = 1; i < argc; i++) {
        if (rnctl_is_help(argv[i])) {
            printf("Usage: %s health [-q]\n\nPrint the daemon's health and why it is not ok.\n"
                   "  -q, --quiet   print nothing, only set the exit status\n"
                   "Exit status: 0 ok, 1 degraded, 2 unreachable or failing.\n",
                   RNCTL_PROG);
            return 0;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else {
            return rnctl_unknown_option("health", argv[i]);
        }
    }
    if (rnctl_connect(g, &c) != 0)
        return EXIT_UNREACHABLE;
    rv = rn_health(c, &h);
    if (rv != 0) {
        rnctl_call_failed(c, "health", rv);
        rn_close(c);
        return EXIT_UNREACHABLE;
    }
    if (!quiet) {
        printf("%s (backend %s%s)\n", h.state >= 0 && h.state <= 2 ? names[h.state] : "unknown",
               h.backend, h.mps ? ", MPS client" : "");
        for (unsigned i = 0; i < h.nreasons; i++)
            printf("  %s\n", h.reasons[i]);
    }
    rn_close(c);
    return h.state == RN_HEALTH_OK         ? 0
           : h.state == RN_HEALTH_DEGRADED ? EXIT_CHECK
                                           : EXIT_UNREACHABLE;
}
