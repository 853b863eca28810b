/* SPDX-License-Identifier: MIT */
/*
 * prog_chan - a client of the session channel tests, run as its own process
 * so that the daemon sees its own pid and, with --drop, another user.
 *
 *   prog_chan [--drop] ENDPOINT attack NAME   try to reach shm object NAME
 *   prog_chan [--drop] ENDPOINT sessions N    open N libclient sessions
 *   prog_chan [--drop] ENDPOINT claim1        HELLO claiming pid 1, then AUTH; exits
 *                                             while a child holds the channel
 *   prog_chan [--drop] ENDPOINT flood N       N channel connections that never
 *                                             authenticate ("flooded N")
 *
 * --drop: become nobody (group nogroup) first, keeping stdin and stdout.
 * Each mode prints one line per step (see test_channel.c) and, for sessions
 * and flood, then waits for stdin to close before it exits.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "integration/raw.h"
#include "integration/rawchan.h"
#include "rmsnorm_client.h"

static int drop(void)
{
    struct passwd *pw = getpwnam("nobody");
    struct group *gr = getgrnam("nogroup");
    gid_t g;

    if (!pw || !gr)
        return -1;
    g = gr->gr_gid;
    if (setgroups(1, &g) != 0 || setgid(g) != 0 || setuid(pw->pw_uid) != 0)
        return -1;
    return 0;
}

static void wait_stdin(void)
{
    char b[64];
    while (read(0, b, sizeof b) > 0) {
    }
}

/* A small backward call through libclient's buffers: the usual path. */
static int libclient_call(const char *endpoint)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 10000, .client_name = "prog_chan"};
    rn_client *c = NULL;
    float *buf = NULL;
    int rv;

    if ((rv = rn_connect(&o, &c)) != 0) {
        fprintf(stderr, "prog_chan: rn_connect: %s\n", rn_last_error(NULL));
        return rv;
    }
    if ((rv = rn_buffer_alloc(c, 4 * 3 * sizeof(float) + sizeof(float), (void **)&buf)) == 0) {
        rn_bwd_args a = {0};
        for (int i = 0; i < 8; i++)
            buf[i] = 1.0f + (float)i;
        buf[12] = 0.5f;
        a.m = 1, a.n = 4;
        a.x_dtype = a.dy_dtype = a.dx_dtype = RN_DTYPE_F32;
        a.x = buf, a.dy = buf + 4, a.dx = buf + 8, a.rstd = buf + 12;
        a.x_stride = a.dy_stride = a.dx_stride = 4;
        rv = rn_rmsnorm_bwd_host(c, &a, NULL);
    }
    if (rv != 0)
        fprintf(stderr, "prog_chan: %s\n", rn_last_error(c));
    rn_close(c);
    return rv;
}

static int attack(const char *endpoint, const char *name)
{
    rnp_session s;
    uint32_t region = 0, pid = 0, uid = 0;
    char msg[200];
    int fd, sock, ch, rc;

    fd = shm_open(name, O_RDWR, 0);
    printf("open %s\n", fd >= 0 ? "ok" : errno == EACCES ? "EACCES" : strerror(errno));
    if (fd >= 0)
        close(fd);
    if ((sock = rnr_open(endpoint)) < 0 || rnr_hello(sock, &s) != 0)
        return 1;
    rc = rnr_register(sock, &s, name, 4096, &region);
    printf("register_name %d\n", rc);
    if ((ch = rnr_chan_connect(endpoint)) < 0) {
        printf("chan_connect %s\n", strerror(errno));
        return 1;
    }
    rc = rnr_chan_auth(ch, &s, &pid, &uid, msg, sizeof msg);
    printf("auth %d pid=%u uid=%u\n", rc, (unsigned)pid, (unsigned)uid);
    printf("libclient %d\n", libclient_call(endpoint));
    fflush(stdout);
    close(ch);
    rnr_close(sock);
    return 0;
}

static int sessions(const char *endpoint, int n)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 10000, .client_name = "prog_chan"};
    rn_client **c = calloc((size_t)n, sizeof *c);
    int k, rv = 0;

    /* A client opens its session when it first needs one: for a buffer. */
    for (k = 0; k < n; k++) {
        void *p;
        if ((rv = rn_connect(&o, &c[k])) != 0)
            break;
        if ((rv = rn_buffer_alloc(c[k], 4096, &p)) != 0) {
            printf("opened %d rc=%d %s\n", k, rv, rn_last_error(c[k]));
            rn_close(c[k]);
            goto wait;
        }
    }
    printf("opened %d rc=%d %s\n", k, rv, rv ? rn_last_error(NULL) : "");
wait:
    fflush(stdout);
    wait_stdin();
    for (int i = 0; i < k; i++)
        rn_close(c[i]);
    free(c);
    return 0;
}

static int claim1(const char *endpoint)
{
    static rnp_request q;
    static rnp_reply r;
    uint32_t pid = 0, uid = 0;
    char msg[200];
    int sock, ch, rc;

    if ((sock = rnr_open(endpoint)) < 0)
        return 1;
    q.version = RNP_VERSION;
    q.op = RN_OP_HELLO;
    q.id = 1;
    snprintf(q.u.hello.client_name, sizeof q.u.hello.client_name, "claims pid 1");
    q.u.hello.pid = 1;
    if (rnr_call(sock, &q, &r) != 0 || r.status != 0)
        return 1;
    if ((ch = rnr_chan_connect(endpoint)) < 0)
        return 1;
    rc = rnr_chan_auth(ch, &r.u.hello.session, &pid, &uid, msg, sizeof msg);
    printf("auth %d pid=%u\n", rc, (unsigned)pid);
    fflush(stdout);
    /* A child keeps the channel open until stdin closes, and this process
     * exits: only the watch on the verified pid can see the client go. */
    if (fork() == 0) {
        wait_stdin();
        _exit(0);
    }
    return 0;
}

static int flood(const char *endpoint, int n)
{
    int k = 0;

    for (; k < n; k++)
        if (rnr_chan_connect(endpoint) < 0)
            break;
    printf("flooded %d\n", k);
    fflush(stdout);
    wait_stdin();
    return 0;
}

int main(int argc, char **argv)
{
    int i = 1;

    if (argc > 1 && strcmp(argv[1], "--drop") == 0) {
        if (drop() != 0) {
            printf("drop failed: %s\n", strerror(errno));
            return 2;
        }
        i++;
    }
    if (argc - i == 3 && strcmp(argv[i + 1], "attack") == 0)
        return attack(argv[i], argv[i + 2]);
    if (argc - i == 3 && strcmp(argv[i + 1], "sessions") == 0)
        return sessions(argv[i], atoi(argv[i + 2]));
    if (argc - i == 2 && strcmp(argv[i + 1], "claim1") == 0)
        return claim1(argv[i]);
    if (argc - i == 3 && strcmp(argv[i + 1], "flood") == 0)
        return flood(argv[i], atoi(argv[i + 2]));
    fprintf(stderr, "usage: prog_chan [--drop] ENDPOINT attack NAME|sessions N|claim1|flood N\n");
    return 2;
}
