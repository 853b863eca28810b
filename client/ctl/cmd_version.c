/* SPDX-License-Identifier: MIT */
/*
 * cmd_version.c - rmsnormctl version: the versions of rmsnormctl and
 * libclient, and the daemon's when it answers within two seconds.
 */
#include "rmsnormctl.h"

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

int rnctl_version(const rnctl_globals *g, int argc, char **argv)
{
    rn_client *c = NULL;
    rn_connect_opts o = {0};
    struct rn_server_info si;
    if (rnctl_wants_help(argc, argv)) {
        printf("Usage: %s version\n\nPrint the versions of rmsnormctl and libclient, and of the\n"
               "daemon when it is reachable.\n",
               RNCTL_PROG);
        return 0;
    }
    printf("rmsnormctl %s\nlibclient %s\n", RN_VERSION, rn_version());
    o.endpoint = g->endpoint;
    o.timeout_ms = g->timeout_ms ? g->timeout_ms : 2000;
    o.client_name = "rmsnormctl";
    if (rn_connect(&o, &c) == 0 && rn_server_info(c, &si) == 0)
        printf("rmsnormd %s (protocol %u, backend %s)\n", si.daemon_version, si.protocol_version,
               si.backend);
    else
        printf("rmsnormd unreachable: %s\n", c ? rn_last_error(c) : rn_last_error(NULL));
    rn_close(c);
    return 0;
}
