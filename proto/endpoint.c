/* SPDX-License-Identifier: MIT */
/*
 * endpoint.c - the daemon's endpoint: the default when none is configured
 * and the check of a configured one.  The daemon and libclient both use
 * these, so that a client looks for the daemon where the daemon listens (two
 * copies of this logic had drifted apart before).
 *
 * Unlike the rest of proto/ this file reads the environment and the uid,
 * but it still does no I/O and keeps no state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_proto.h"

int rnp_default_endpoint(char *out, size_t outlen, rnp_error *err)
{
    char uid[24];
    const char *pre = "ipc://", *post = "/rmsnormd.sock", *dir;
    size_t dirlen = 0;

    /* systemd lists one directory per RuntimeDirectory= entry, separated by
     * ':'; the first is the unit's own.  An empty first entry names no
     * directory, so it counts as unset rather than as "/". */
    if ((dir = getenv("RUNTIME_DIRECTORY")) != NULL && (dirlen = strcspn(dir, ":")) > 0) {
        /* RUNTIME_DIRECTORY's first entry */
    } else if ((dir = getenv("XDG_RUNTIME_DIR")) != NULL && (dirlen = strlen(dir)) > 0) {
        /* the user's runtime directory */
    } else {
        snprintf(uid, sizeof uid, "%u", (unsigned)getuid());
        pre = "ipc:///tmp/rmsnormd-", dir = uid, dirlen = strlen(uid), post = ".sock";
    }
    size_t npre = strlen(pre), npost = strlen(post), need = npre + dirlen + npost;
    /* Outputs are written only on success: nothing truncated reaches out. */
    if (!out || need >= outlen)
        return rnp_fail(err, RN_ENDPOINT,
                        "endpoint: the default endpoint is %zu bytes, more than the %zu that fit "
                        "(directory '%.*s')",
                        need, out && outlen ? outlen - 1 : 0, (int)(dirlen < 100 ? dirlen : 100),
                        dir);
    memcpy(out, pre, npre);
    memcpy(out + npre, dir, dirlen);
    memcpy(out + npre + dirlen, post, npost + 1);
    return 0;
}

int rnp_check_endpoint(const char *ep, const char **path, rnp_error *err)
{
    const char *p;
    if (!ep)
        return rnp_fail(err, RN_ENDPOINT, "endpoint: none given");
    if (strncmp(ep, "ipc://", 6) != 0)
        return rnp_fail(err, RN_ENDPOINT,
                        "endpoint '%s': only ipc:// endpoints are supported%s", ep,
                        ep[0] == '/' ? " (a socket's path is written ipc:///path)" : "");
    p = ep + 6;
    if (*p == '\0')
        return rnp_fail(err, RN_ENDPOINT, "endpoint '%s': the socket path is empty", ep);
    /* nanomsg accepts some paths that do not fit sun_path and then aborts
     * inside its ipc transport; they are refused here with a message. */
    /* The message names the size before the (long) endpoint, so that a
     * message cut at RNP_MAX_ERRMSG still says what is wrong. */
    if (strlen(p) >= RNP_SUN_PATH_MAX)
        return rnp_fail(err, RN_ENDPOINT,
                        "endpoint: the socket path is %zu bytes; a Unix socket path must be "
                        "shorter than %d ('%.80s...')",
                        strlen(p), RNP_SUN_PATH_MAX, ep);
    if (path)
        *path = p;
    return 0;
}
