/* SPDX-License-Identifier: MIT */
/*
 * prog_worker - a client process for the integration tests: connects
 * through libclient, allocates a shared buffer, and sends a stream of
 * RMSNorm backward requests, checking every result bitwise against the CPU
 * twin.
 *
 *   prog_worker --endpoint URL [-r R] [--m M] [--n N] [--dtype D] [--seed S]
 *               [--wait-go] [--timeout MS] [--forever] [--until-eof] [--stop-on-error]
 *               [--no-close] [--fork-child]
 *
 * stdout: "ready" once set up (then, with --wait-go, it waits for a byte or
 * EOF on stdin; with --until-eof it then runs until its stdin reaches EOF,
 * with --forever until it is killed), "first" after the first verified reply, and at the end
 * "done ok=N failed=N last=CODE".  Exit status: 0 every request verified;
 * --no-close: exit without rn_buffer_free/rn_close (the library's exit
 * handler must still remove the shm names); --fork-child: before "ready",
 * fork a child that exits at once through exit() (it must not remove its
 * parent's names).
 * 1 a result was wrong; 2 the daemon was unreachable or timed out; 3 another
 * error (its code and message on stderr).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"

static int status_of(int rv)
{
    if (rv == 0)
        return 0;
    if (rv == RN_UNREACHABLE || rv == RN_TIMEOUT)
        return 2;
    return 3;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'}, {"requests", required_argument, NULL, 'r'},
        {"m", required_argument, NULL, 'm'},        {"n", required_argument, NULL, 'n'},
        {"dtype", required_argument, NULL, 'd'},    {"seed", required_argument, NULL, 's'},
        {"wait-go", no_argument, NULL, 'g'},        {"timeout", required_argument, NULL, 't'},
        {"forever", no_argument, NULL, 'f'},        {"stop-on-error", no_argument, NULL, 'x'},
        {"until-eof", no_argument, NULL, 'u'},      {"no-close", no_argument, NULL, 'N'},
        {"fork-child", no_argument, NULL, 'F'},     {NULL, 0, NULL, 0},
    };
    rn_connect_opts o = {0};
    rnv_case k = {.m = 64,
                  .n = 256,
                  .x = RN_DTYPE_BF16,
                  .dy = RN_DTYPE_BF16,
                  .dx = RN_DTYPE_BF16,
                  .w = RN_DTYPE_BF16,
                  .dw = RN_DTYPE_F32,
                  .rstd = true,
                  .eps = 1e-6f};
    uint64_t requests = 100, seed = 1, ok = 0, failed = 0;
    int wait_go = 0, forever = 0, until_eof = 0, no_close = 0, fork_child = 0, stop_on_error = 0,
        ch, rv, status = 0, last = 0;
    rn_client *c = NULL;
    rn_bwd_args a;
    rnv_expect e = {0};
    void *buf = NULL;
    char msg[300], name[64];

    while ((ch = getopt_long(argc, argv, "e:r:", opts, NULL)) != -1) {
        switch (ch) {
        case 'e':
            o.endpoint = optarg;
            break;
        case 'r':
            requests = strtoull(optarg, NULL, 10);
            break;
        case 'm':
            k.m = strtoll(optarg, NULL, 10);
            break;
        case 'n':
            k.n = strtoll(optarg, NULL, 10);
            break;
        case 'd':
            k.x = k.dy = k.dx = k.w = (rn_dtype)rnv_parse_dtype(optarg);
            break;
        case 's':
            seed = strtoull(optarg, NULL, 10);
            break;
        case 'g':
            wait_go = 1;
            break;
        case 't':
            o.timeout_ms = atoi(optarg);
            break;
        case 'f':
            forever = 1;
            break;
        case 'x':
            stop_on_error = 1;
            break;
        case 'u':
            until_eof = forever = 1;
            break;
        case 'N':
            no_close = 1;
            break;
        case 'F':
            fork_child = 1;
            break;
        default:
            return 64;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(name, sizeof name, "prog_worker %d", (int)getpid());
    o.client_name = name;
    if ((rv = rn_connect(&o, &c)) != 0) {
        fprintf(stderr, "prog_worker: connect: %s (%s)\n", rn_last_error(NULL), rn_err_name(rv));
        return status_of(rv);
    }
    if ((rv = rn_buffer_alloc(c, rnv_bytes(&k), &buf)) != 0) {
        fprintf(stderr, "prog_worker: buffer: %s (%s)\n", rn_last_error(c), rn_err_name(rv));
        rn_close(c);
        return status_of(rv);
    }
    rnv_setup(&k, buf, seed, &a);
    if (rnv_expect_init(&e, &a, 1, msg, sizeof msg) != 0) {
        fprintf(stderr, "prog_worker: expected result: %s\n", msg);
        rn_close(c);
        return 3;
    }
    if (fork_child) {
        pid_t p = fork();
        if (p == 0)
            exit(0); /* runs the library's exit handler in the child */
        if (p < 0 || waitpid(p, NULL, 0) != p) {
            fprintf(stderr, "prog_worker: fork failed\n");
            return 3;
        }
    }
    printf("ready\n");
    if (wait_go) {
        char b;
        ssize_t r;
        do
            r = read(0, &b, 1);
        while (r < 0 && errno == EINTR);
    }
    for (uint64_t i = 0; forever || i < requests; i++) {
        if (until_eof) {
            struct pollfd pf = {.fd = 0, .events = POLLIN};
            if (poll(&pf, 1, 0) != 0)
                break;
        }
        rnv_poison(&a);
        rv = rn_rmsnorm_bwd_host(c, &a, NULL);
        /* The first result is checked in full (bitwise against the twin
         * and against fp64); the rest bitwise, which implies the same. */
        if (rv == 0 &&
            (ok == 0 ? rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0
                     : (!rnv_equal_twin(&a, &e) &&
                        (snprintf(msg, sizeof msg, "result differs from the CPU twin"), 1)))) {
            fprintf(stderr, "prog_worker: request %" PRIu64 ": %s\n", i, msg);
            failed++;
            status = 1;
            if (stop_on_error)
                break;
            continue;
        }
        if (rv != 0) {
            fprintf(stderr, "prog_worker: request %" PRIu64 ": %s (%s)\n", i, rn_last_error(c),
                    rn_err_name(rv));
            failed++;
            last = rv;
            if (status == 0)
                status = status_of(rv);
            if (stop_on_error)
                break;
            continue;
        }
        if (ok++ == 0)
            printf("first\n");
    }
    printf("done ok=%" PRIu64 " failed=%" PRIu64 " last=%s\n", ok, failed, rn_err_name(last));
    rnv_expect_fini(&e);
    if (no_close)
        exit(status);
    rn_buffer_free(c, buf);
    rn_close(c);
    return status;
}
