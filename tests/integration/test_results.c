/* SPDX-License-Identifier: MIT */
/*
 * test_results - results through a real daemon for a grid of shapes and
 * dtypes against the fp64 reference (and bitwise against the CPU twin), the
 * library's own argument errors, and the observation calls.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "rmsnormctl_verify.h"

static void run_case(rn_client *c, const rnv_case *k, uint64_t seed)
{
    void *buf = NULL;
    rn_bwd_args a;
    rnv_expect e = {0};
    rn_timing t = {0};
    char desc[256], msg[400];
    int rv;

    rnv_describe(k, desc, sizeof desc);
    rv = rn_buffer_alloc(c, rnv_bytes(k), &buf);
    if (rv != 0)
        fail_msg("%s: rn_buffer_alloc: %s", desc, rn_last_error(c));
    rnv_setup(k, buf, seed, &a);
    if (rnv_expect_init(&e, &a, 0, msg, sizeof msg) != 0)
        fail_msg("%s: expectation: %s", desc, msg);
    rv = rn_rmsnorm_bwd_host(c, &a, &t);
    if (rv != 0)
        fail_msg("%s: rn_rmsnorm_bwd_host: %s (%s)", desc, rn_last_error(c), rn_err_name(rv));
    if (rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s: %s", desc, msg);
    assert_true(t.total_ns > 0);
    assert_true(t.total_ns >= t.compute_ns);
    rnv_expect_fini(&e);
    assert_int_equal(rn_buffer_free(c, buf), 0);
}

static void test_grid(void **state)
{
    rnh_daemon *d = *state;
    static const int64_t shapes[][2] = {{1, 1},    {1, 8},     {2, 3},     {5, 31},    {16, 64},
                                        {7, 1000}, {128, 512}, {33, 4097}, {1024, 96}, {3, 16384}};
    static const rn_dtype dts[] = {RN_DTYPE_BF16, RN_DTYPE_F16, RN_DTYPE_F32};
    rn_client *c;
    int cases = 0;

    assert_int_equal(rnh_start(d), 0);
    c = rnh_client(d);
    assert_non_null(c);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t i = 0; i < 3; i++) {
            for (int variant = 0; variant < 4; variant++) {
                rnv_case k = {0};
                k.m = shapes[s][0];
                k.n = shapes[s][1];
                k.x = dts[i];
                k.dy = dts[(i + variant) % 3];
                k.dx = dts[(i + 2 * variant) % 3];
                k.eps = 1e-6f;
                switch (variant) {
                case 0: /* weight, given rstd, fp32 dw */
                    k.w = dts[i];
                    k.dw = RN_DTYPE_F32;
                    k.rstd = true;
                    break;
                case 1: /* no weight, recomputed rstd, residual */
                    k.dres = dts[(i + 1) % 3];
                    break;
                case 2: /* dw in the weight's dtype, weight offset, padded rows */
                    k.w = dts[(i + 1) % 3];
                    k.dw = k.w;
                    k.weight_offset = 1.0f;
                    k.pad = 5;
                    k.rstd = true;
                    break;
                case 3: /* in place: dx over dy */
                    k.w = RN_DTYPE_F32;
                    k.dw = RN_DTYPE_F32;
                    k.inplace = true;
                    break;
                }
                run_case(c, &k, (uint64_t)(s * 100 + i * 10 + (size_t)variant));
                cases++;
            }
        }
    }
    rn_close(c);
    assert_int_equal(rnh_wait_stat(d, "requests.bwd", cases, 5000), 0);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

/* m = 0 is a no-op: accepted, outputs untouched. */
static void test_empty(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = {.m = 0,
                  .n = 16,
                  .x = RN_DTYPE_F32,
                  .dy = RN_DTYPE_F32,
                  .dx = RN_DTYPE_F32,
                  .w = RN_DTYPE_F32,
                  .dw = RN_DTYPE_F32};
    rn_bwd_args a;
    void *buf;
    rn_client *c;
    unsigned char before[64];

    assert_int_equal(rnh_start(d), 0);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), &buf), 0);
    rnv_setup(&k, buf, 1, &a);
    memcpy(before, a.dw, sizeof before);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &a, NULL), 0);
    assert_memory_equal(before, a.dw, sizeof before);
    rn_close(c);
    RNH_PASS(d);
}

/* Errors the library or the daemon must report, each with its code and a
 * message naming the field; none of them may break the session. */
static void test_errors(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = {.m = 8,
                  .n = 32,
                  .x = RN_DTYPE_BF16,
                  .dy = RN_DTYPE_BF16,
                  .dx = RN_DTYPE_BF16,
                  .w = RN_DTYPE_BF16,
                  .dw = RN_DTYPE_F32,
                  .rstd = true,
                  .eps = 1e-6f};
    rn_bwd_args a, b;
    void *buf, *other;
    float local[64];
    rn_client *c;

    assert_int_equal(rnh_start(d), 0);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), &buf), 0);
    rnv_setup(&k, buf, 3, &a);

    /* A pointer outside any shared buffer. */
    b = a;
    b.x = local;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_NOT_SHARED);
    assert_non_null(strstr(rn_last_error(c), "x:"));

    /* More rows than the buffer holds: the daemon's bounds check. */
    b = a;
    b.m = 1000;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_OUT_OF_BOUNDS);
    assert_true(strlen(rn_last_error(c)) > 0);

    /* A dtype that does not exist. */
    b = a;
    b.dx_dtype = (rn_dtype)9;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(rn_last_error(c), "dx_dtype"));

    /* A stride below n. */
    b = a;
    b.x_stride = 3;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(rn_last_error(c), "stride"));

    /* A misaligned f32 tensor. */
    b = a;
    b.rstd = (const float *)((const char *)a.rstd + 2);
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_MISALIGNED);

    /* dx overlapping x. */
    b = a;
    b.dx = (void *)a.x;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), RN_ALIASING);

    /* Two buffers: tensors may live in different regions. */
    assert_int_equal(rn_buffer_alloc(c, 4096, &other), 0);
    b = a;
    b.dw = other;
    assert_int_equal(rn_rmsnorm_bwd_host(c, &b, NULL), 0);

    /* Freeing what was not allocated. */
    assert_int_equal(rn_buffer_free(c, local), RN_INVALID_ARGUMENT);
    assert_int_equal(rn_buffer_free(c, NULL), 0);
    assert_int_equal(rn_buffer_free(c, other), 0);

    /* Host buffers are not device pointers: the stream-ordered call says
     * so (no CUDA support, no CUDA driver, or not device memory). */
    /* The daemon is asked again whether it has CUDA (a new session) once,
     * not at every such call (each ended the session, and any ring calls
     * out with it). */
    int64_t sessions = rnh_stat(d, "sessions.total");
    for (int i = 0; i < 4; i++) {
        int rv = rn_rmsnorm_bwd(c, &a, NULL);
        if (rv != RN_UNSUPPORTED && rv != RN_NO_CUDA && rv != RN_NOT_SHARED)
            fail_msg("rn_rmsnorm_bwd on host buffers: %d %s (%s)", rv, rn_err_name(rv),
                     rn_last_error(c));
        assert_true(strlen(rn_last_error(c)) > 0);
    }
    assert_true(rnh_stat(d, "sessions.total") <= sessions + 1);

    /* After all that the session still works. */
    assert_int_equal(rn_rmsnorm_bwd_host(c, &a, NULL), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    rn_close(c);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 5000), 0);
    RNH_PASS(d);
}

static void test_observe(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    rn_health_info h;
    rn_stats_info *s = calloc(1, sizeof *s);
    struct rn_server_info si;
    uint64_t rtt = 0;
    char ep[300];

    assert_int_equal(rnh_start(d), 0);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_ping(c, &rtt), 0);
    assert_true(rtt > 0);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_OK);
    assert_string_equal(h.backend, "cpu");
    assert_int_equal(rn_server_info(c, &si), 0);
    assert_string_equal(si.backend, "cpu");
    assert_string_equal(si.endpoint, d->endpoint);
    assert_true(si.max_n >= 65536);
    assert_int_equal(rn_stats(c, s), 0);
    assert_string_equal(s->backend, "cpu");
    assert_true(s->nstats > 0);
    /* rn_connect's PING (it checks that the daemon answers) and rn_ping's. */
    assert_int_equal(rn_stats_get(s, "requests.ping", 99), 2);
    assert_int_equal(rn_stats_get(s, "requests.hello", 99), 1);
    assert_int_equal(rn_stats_get(s, "sessions.active", 99), 1);
    assert_int_equal(rn_stats_get(s, "no.such.counter", 99), 99);
    rn_close(c);

    /* The endpoint comes from RMSNORMD_ENDPOINT when none is given. */
    setenv("RMSNORMD_ENDPOINT", d->endpoint, 1);
    assert_string_equal(rn_default_endpoint(ep, sizeof ep), d->endpoint);
    assert_null(rn_default_endpoint(ep, 4));
    assert_int_equal(rn_connect(NULL, &c), 0);
    assert_int_equal(rn_ping(c, NULL), 0);
    rn_close(c);
    unsetenv("RMSNORMD_ENDPOINT");
    free(s);
    RNH_PASS(d);
}

/* Connection errors come at once and say what is wrong. */
static void test_connect_errors(void **state)
{
    rnh_daemon *d = *state;
    rn_connect_opts o = {0};
    rn_client *c = NULL;
    char longpath[200];
    int64_t t0;

    o.endpoint = "ipc:///nonexistent/dir/d.sock";
    t0 = rnh_now_ms();
    assert_int_equal(rn_connect(&o, &c), RN_UNREACHABLE);
    assert_true(rnh_now_ms() - t0 < 2000);
    assert_non_null(strstr(rn_last_error(NULL), "/nonexistent/dir/d.sock"));
    assert_null(c);

    o.endpoint = "tcp://127.0.0.1:5555";
    assert_int_equal(rn_connect(&o, &c), RN_ENDPOINT);
    memset(longpath, 'a', sizeof longpath);
    memcpy(longpath, "ipc:///", 7);
    longpath[sizeof longpath - 1] = '\0';
    o.endpoint = longpath;
    assert_int_equal(rn_connect(&o, &c), RN_ENDPOINT);
    assert_non_null(strstr(rn_last_error(NULL), "socket path"));
    o.endpoint = NULL;
    o.timeout_ms = -5;
    assert_int_equal(rn_connect(&o, &c), RN_INVALID_ARGUMENT);
    assert_null(c);

    assert_string_equal(rn_err_name(RN_OUT_OF_BOUNDS), "OUT_OF_BOUNDS");
    assert_string_equal(rn_err_name(12345), "UNKNOWN");
    assert_non_null(rn_strerror(RN_BUSY));
    rn_close(NULL);
    RNH_PASS(d);
}

static volatile sig_atomic_t ticks;
static void on_alarm(int sig)
{
    (void)sig;
    ticks++;
}

/* A process with a frequent signal handler (a profiler, Python's signal
 * machinery) interrupts the library's waits; calls must still succeed. */
static void test_signals(void **state)
{
    rnh_daemon *d = *state;
    rnv_case k = {.m = 64,
                  .n = 2048,
                  .x = RN_DTYPE_F32,
                  .dy = RN_DTYPE_F32,
                  .dx = RN_DTYPE_F32,
                  .rstd = true,
                  .eps = 1e-6f};
    struct sigaction sa = {0}, old;
    struct itimerval it = {{0, 500}, {0, 500}}, off = {{0, 0}, {0, 0}};
    rn_bwd_args a;
    rnv_expect e = {0};
    void *buf;
    rn_client *c;
    char msg[300];

    assert_int_equal(rnh_start(d), 0);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_buffer_alloc(c, rnv_bytes(&k), &buf), 0);
    rnv_setup(&k, buf, 11, &a);
    assert_int_equal(rnv_expect_init(&e, &a, 1, msg, sizeof msg), 0);
    sa.sa_handler = on_alarm; /* no SA_RESTART: waits see EINTR */
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    for (int i = 0; i < 200; i++) {
        int rv = rn_rmsnorm_bwd_host(c, &a, NULL);
        if (rv != 0)
            fail_msg("call %d with signals: %s (%s)", i, rn_last_error(c), rn_err_name(rv));
        assert_int_equal(rn_ping(c, NULL), 0);
    }
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    printf("%d signals during the calls\n", (int)ticks);
    assert_true(ticks > 10);
    if (rnv_compare(&a, &e, true, NULL, msg, sizeof msg) != 0)
        fail_msg("%s", msg);
    rnv_expect_fini(&e);
    rn_close(c);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_grid, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_empty, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_errors, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_observe, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_connect_errors, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_signals, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
