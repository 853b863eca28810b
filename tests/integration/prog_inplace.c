/* SPDX-License-Identifier: MIT */
/*
 * prog_inplace - a client process for test_client_failure: runs in-place
 * backward calls (dx written over dy) over and over and checks that no call
 * that returns 0 has a wrong result, whatever happens to the daemon.
 *
 *   prog_inplace --endpoint URL [--m M] [--n N] [--dtype D]
 *
 * Before each call the whole buffer is restored from a copy of the inputs
 * (an in-place call consumes dy), so every call computes the same thing and
 * is checked bitwise against the CPU twin.  stdout, one line each:
 *   "ready SHM DY_OFFSET ROW_BYTES M"  set up: a path that opens the buffer
 *                                      (/proc/PID/fd/N: buffers have no name
 *                                      once the daemon has their descriptor),
 *                                      where dy (= dx) starts in it, the
 *                                      bytes of one row and the rows
 *   "ok"      the first verified call, and the first after each "cut"
 *   "cut"     a call returned RN_RESTARTED
 *   "wrong"   a call returned 0 with a result that differs from the twin
 *   "error NAME"  a call failed otherwise
 *   "done ok=N cut=N wrong=N errors=N"  when stdin reaches EOF
 * Exit status: 0 no wrong result, 1 a wrong result, 3 set-up failed.
 */
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"

/* A path that opens this process's one buffer: the library keeps the
 * buffer's descriptor, whose link names the (removed) shm object. */
static int shm_name(char *out, size_t len)
{
    char prefix[64], link[300], target[300];
    struct dirent *de;
    DIR *d = opendir("/proc/self/fd");
    int found = -1;

    snprintf(prefix, sizeof prefix, "/dev/shm/rmsnormd.%d.", (int)getpid());
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        ssize_t n;
        snprintf(link, sizeof link, "/proc/self/fd/%s", de->d_name);
        if ((n = readlink(link, target, sizeof target - 1)) <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, prefix, strlen(prefix)) == 0) {
            snprintf(out, len, "/proc/%d/fd/%s", (int)getpid(), de->d_name);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"m", required_argument, NULL, 'm'},
        {"n", required_argument, NULL, 'n'},
        {"dtype", required_argument, NULL, 'd'},
        {NULL, 0, NULL, 0},
    };
    rn_connect_opts o = {.timeout_ms = 60000, .client_name = "prog_inplace"};
    rnv_case k = {.m = 2048,
                  .n = 4096,
                  .x = RN_DTYPE_F32,
                  .dy = RN_DTYPE_F32,
                  .dx = RN_DTYPE_F32,
                  .w = RN_DTYPE_F32,
                  .dw = RN_DTYPE_F32,
                  .rstd = true,
                  .inplace = true,
                  .eps = 1e-6f};
    uint64_t ok = 0, cut = 0, wrong = 0, errors = 0;
    int ch, rv, say_ok = 1;
    rn_client *c = NULL;
    rn_bwd_args a;
    rnv_expect e = {0};
    void *buf = NULL, *inputs;
    size_t bytes;
    char msg[300], name[300];

    while ((ch = getopt_long(argc, argv, "e:", opts, NULL)) != -1) {
        switch (ch) {
        case 'e':
            o.endpoint = optarg;
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
        default:
            return 64;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    bytes = rnv_bytes(&k);
    if ((rv = rn_connect(&o, &c)) != 0 || (rv = rn_buffer_alloc(c, bytes, &buf)) != 0) {
        fprintf(stderr, "prog_inplace: %s (%s)\n", rn_last_error(c), rn_err_name(rv));
        return 3;
    }
    rnv_setup(&k, buf, 1, &a);
    if (rnv_expect_init(&e, &a, 1, msg, sizeof msg) != 0 || (inputs = malloc(bytes)) == NULL ||
        shm_name(name, sizeof name) != 0) {
        fprintf(stderr, "prog_inplace: set-up failed\n");
        return 3;
    }
    memcpy(inputs, buf, bytes);
    printf("ready %s %zu %zu %lld\n", name, (size_t)((const char *)a.dy - (const char *)buf),
           (size_t)a.dy_stride * (a.dy_dtype == RN_DTYPE_F32 ? 4 : 2), (long long)a.m);
    for (;;) {
        struct pollfd pf = {.fd = 0, .events = POLLIN};
        if (poll(&pf, 1, 0) != 0)
            break;
        memcpy(buf, inputs, bytes);
        rv = rn_rmsnorm_bwd_host(c, &a, NULL);
        if (rv == 0 && !rnv_equal_twin(&a, &e)) {
            wrong++;
            printf("wrong\n");
        } else if (rv == 0) {
            ok++;
            if (say_ok)
                printf("ok\n");
            say_ok = 0;
        } else if (rv == RN_RESTARTED) {
            cut++;
            say_ok = 1;
            printf("cut\n");
        } else {
            errors++;
            fprintf(stderr, "prog_inplace: %s (%s)\n", rn_last_error(c), rn_err_name(rv));
            printf("error %s\n", rn_err_name(rv));
        }
    }
    printf("done ok=%" PRIu64 " cut=%" PRIu64 " wrong=%" PRIu64 " errors=%" PRIu64 "\n", ok, cut,
           wrong, errors);
    rnv_expect_fini(&e);
    free(inputs);
    rn_buffer_free(c, buf);
    rn_close(c);
    return wrong ? 1 : 0;
}
