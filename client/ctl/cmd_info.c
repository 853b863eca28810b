/* SPDX-License-Identifier: MIT */
/*
 * cmd_info.c - rmsnormctl info: what the daemon said at HELLO (backend,
 * device, limits).
 */
#include <inttypes.h>
#include <string.h>

#include "rmsnormctl.h"

int rnctl_info(const rnctl_globals *g, int argc, char **argv)
{
    rn_client *c = NULL;
    struct rn_server_info si;
    int rv;
    if (rnctl_wants_help(argc, argv)) {
        printf("Usage: %s info\n\nPrint what the daemon reports about itself: backend, device,\n"
               "limits.\n",
               RNCTL_PROG);
        return 0;
    }
    if (argc > 1)
        return rnctl_unknown_option("info", argv[1]);
    if (rnctl_connect(g, &c) != 0)
        return EXIT_UNREACHABLE;
    rv = rn_server_info(c, &si);
    if (rv != 0) {
        rnctl_call_failed(c, "info", rv);
        rn_close(c);
        return rnctl_failure_status(rv);
    }
    printf("endpoint            %s\n", si.endpoint);
    printf("daemon version      %s (protocol %u)\n", si.daemon_version, si.protocol_version);
    printf("backend             %s%s\n", si.backend, si.mps ? " (MPS client)" : "");
    printf("device              %s\n", si.device_name);
    printf("device uuid         ");
    for (int i = 0; i < RN_UUID_LEN; i++)
        printf("%02x%s", si.device_uuid[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    printf("\n");
    if (strcmp(si.backend, "cpu") == 0)
        printf("worker threads      %u\n", si.sm_count);
    else
        printf("SMs                 %u (compute capability %u.%u)\n", si.sm_count, si.cc_major,
               si.cc_minor);
    printf("max sessions        %u\n", si.max_sessions);
    printf("max regions         %u per session\n", si.max_regions);
    printf("max in flight       %u per session, %u in total\n", si.max_inflight,
           si.max_inflight_total);
    printf("max shape           m <= %" PRIu64 ", n <= %u\n", si.max_m, si.max_n);
    printf("max message         %u bytes\n", si.max_msg);
    /* CUDA events a session may register (its ready and done events); the
     * CPU backend answers without events, so it offers none. */
    if (si.event_slots == 0)
        printf("event slots         0 (CUDA events per session: none on this backend)\n");
    else
        printf("event slots         %u CUDA events per session\n", si.event_slots);
    rn_close(c);
    return 0;
}
