/* SPDX-License-Identifier: MIT */
/*
 * prog_fastring - a fast-path client process for test_fastpath.
 *
 *   prog_fastring verify ENDPOINT CALLS SEED
 *       libclient on RN_PATH_FAST: CALLS calls of mixed shapes and dtypes
 *       published without waiting (rn_rmsnorm_bwd_host_async), one rn_sync,
 *       then every result checked against the fp64 reference and bitwise
 *       against the CPU twin.  Prints "ok N"; exit 0, or 1 with the reason.
 *   prog_fastring loop ENDPOINT
 *       libclient on RN_PATH_FAST, calls without end; prints "running" after
 *       the first verified result, then keeps the ring busy until killed.
 *   prog_fastring stall ENDPOINT N
 *       a raw ring (rawring.h): N valid slots published whose ready word is
 *       never written; prints "published" and waits to be killed.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "integration/rawring.h"
#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"

#define PER_BUF 16
#define ALIGN 256

static rnv_case case_of(uint64_t i)
{
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    rnv_case k = {0};
    k.m = 1 + (int64_t)(i * 7 % 40);
    k.n = 1 + (int64_t)(i * 131 % 700);
    k.x = dts[i % 3], k.dy = dts[(i / 3) % 3], k.dx = dts[(i / 9) % 3];
    k.eps = 1e-5f;
    if (i % 2)
        k.w = dts[(i + 1) % 3], k.dw = RN_DTYPE_F32, k.rstd = i % 4 == 1;
    else
        k.dres = dts[(i + 2) % 3];
    return k;
}

static size_t up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static rn_client *connect_fast(const char *ep)
{
    rn_connect_opts o = RN_CONNECT_OPTS_INIT;
    rn_client *c;
    o.endpoint = ep;
    o.path = RN_PATH_FAST;
    o.client_name = "prog_fastring";
    if (rn_connect(&o, &c) != 0) {
        printf("connect: %s\n", rn_last_error(NULL));
        exit(1);
    }
    return c;
}

static int verify(const char *ep, int calls, uint64_t seed)
{
    rn_client *c = connect_fast(ep);
    rn_bwd_args *a = calloc((size_t)calls, sizeof *a);
    rnv_expect *e = calloc((size_t)calls, sizeof *e);
    char msg[400];
    int rv;

    for (int b = 0; b * PER_BUF < calls; b++) {
        size_t bytes = 0;
        for (int i = b * PER_BUF; i < calls && i < (b + 1) * PER_BUF; i++) {
            rnv_case k = case_of(seed + (uint64_t)i);
            bytes += up(rnv_bytes(&k));
        }
        void *buf;
        if ((rv = rn_buffer_alloc(c, bytes, &buf)) != 0) {
            printf("alloc: %s\n", rn_last_error(c));
            return 1;
        }
        size_t off = 0;
        for (int i = b * PER_BUF; i < calls && i < (b + 1) * PER_BUF; i++) {
            rnv_case k = case_of(seed + (uint64_t)i);
            rnv_setup(&k, (char *)buf + off, seed * 1000003u + (uint64_t)i, &a[i]);
            if (rnv_expect_init(&e[i], &a[i], 1, msg, sizeof msg) != 0) {
                printf("expect: %s\n", msg);
                return 1;
            }
            off += up(rnv_bytes(&k));
        }
    }
    for (int i = 0; i < calls; i++) {
        if ((rv = rn_rmsnorm_bwd_host_async(c, &a[i])) != 0) {
            printf("call %d: %s (%s)\n", i, rn_last_error(c), rn_err_name(rv));
            return 1;
        }
    }
    if ((rv = rn_sync(c)) != 0) {
        printf("sync: %s (%s)\n", rn_last_error(c), rn_err_name(rv));
        return 1;
    }
    for (int i = 0; i < calls; i++) {
        if (rnv_compare(&a[i], &e[i], true, NULL, msg, sizeof msg) != 0) {
            printf("call %d: %s\n", i, msg);
            return 1;
        }
        rnv_expect_fini(&e[i]);
    }
    if ((rv = rn_check(c)) != 0) {
        printf("check: %s\n", rn_last_error(c));
        return 1;
    }
    rn_close(c);
    printf("ok %d\n", calls);
    free(a);
    free(e);
    return 0;
}

static int loop(const char *ep)
{
    rn_client *c = connect_fast(ep);
    rnv_case k = case_of(3);
    rn_bwd_args a;
    rnv_expect e;
    char msg[400];
    void *buf;

    k.m = 256, k.n = 1024;
    if (rn_buffer_alloc(c, rnv_bytes(&k), &buf) != 0)
        return 1;
    rnv_setup(&k, buf, 42, &a);
    if (rnv_expect_init(&e, &a, 1, msg, sizeof msg) != 0 || rn_rmsnorm_bwd_host(c, &a, NULL) != 0 ||
        rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0) {
        printf("first: %s %s\n", msg, rn_last_error(c));
        return 1;
    }
    printf("running\n");
    fflush(stdout);
    for (;;)
        if (rn_rmsnorm_bwd_host_async(c, &a) != 0)
            return 1;
}

static int stall(const char *ep, int n)
{
    rnr_ring g;
    rnv_case k = case_of(5);
    rn_bwd_args a;
    rnp_bwd_req b;

    if (rnr_ring_open(&g, ep, 8, up(rnv_bytes(&k))) != 0)
        return 1;
    rnv_setup(&k, g.data, 7, &a);
    rnr_ring_req(&g, &a, &b);
    for (int i = 0; i < n; i++)
        rnr_ring_publish(&g, &b, NULL, false);
    printf("published\n");
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    /* A test that fails before it kills this process must not leave it
     * behind (holding its output pipe open). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 5 && strcmp(argv[1], "verify") == 0)
        return verify(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
    if (argc == 3 && strcmp(argv[1], "loop") == 0)
        return loop(argv[2]);
    if (argc == 4 && strcmp(argv[1], "stall") == 0)
        return stall(argv[2], atoi(argv[3]));
    fprintf(stderr, "usage: prog_fastring verify EP CALLS SEED | loop EP | stall EP N\n");
    return 2;
}
