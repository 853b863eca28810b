/* SPDX-License-Identifier: MIT */
/*
 * test_graph_cuda.c - calls captured into a CUDA graph on the fast path
 * (PROTOCOL.md 13.8) on a real GPU: prog_graph_cuda captures two calls (the
 * second on the first's output) with their input and output copies,
 * replays the graph 1000 times with fresh inputs and random GPU-side delays
 * before each replay, and compares every replay bitwise with the same
 * work done eagerly; then replays back to back, destroys the graph and
 * calls once more (its slots are given back).  Two such clients run at
 * once.  Without a usable GPU every test reports "skipped: no GPU".
 */
#include "rn_test.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "integration/harness.h"

#define CLIENT_TIMEOUT_MS 240000

static bool have_gpu(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "%s/tests/gpu/prog_probe >/dev/null 2>&1", rnh_build_dir());
    return system(cmd) == 0;
}

static void test_replays(void **state)
{
    rnh_daemon *d = *state;
    const char *args[] = {"replay", "1000", NULL};
    rnh_proc p, q;

    if (!have_gpu())
        RN_SKIP("skipped: no GPU");
    rnh_arg(d, "--backend");
    rnh_arg(d, "cuda");
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(rnh_spawn_for(d, "gpu/prog_graph_cuda", args, &p), 0);
    assert_int_equal(rnh_spawn_for(d, "gpu/prog_graph_cuda", args, &q), 0);
    assert_int_equal(rnh_finish_echo(&p, "graph-a", CLIENT_TIMEOUT_MS), 0);
    assert_int_equal(rnh_finish_echo(&q, "graph-b", CLIENT_TIMEOUT_MS), 0);
    rn_health_info h;
    assert_int_equal(rnh_health(d, &h), 0);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replays, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
