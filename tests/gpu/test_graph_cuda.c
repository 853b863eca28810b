/* SPDX-License-Identifier: MIT */
/*
 * test_graph_cuda.c - calls captured into a CUDA graph on the fast path
 * (PROTOCOL.md 13.8) on a real GPU: prog_graph_cuda captures two calls (the
 * second on the first's output) with their input and output copies,
 * replays the graph 1000 times with fresh inputs and random GPU-side delays
 * before each replay, and compares every replay bitwise with the same
 * work done eagerly; then replays back to back, destroys the graph and
 * calls once more (its slots are given back).  Two such clients run at
 * once.  And GRAPH_OPEN is refused on a ring that has no stream of its own
 * for replays (more rings than the daemon's own streams serve).  Without a
 * usable GPU every test reports "skipped: no GPU".
 */
#include "rn_test.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integration/harness.h"
#include "integration/raw.h"
#include "integration/rawring.h"
#include "rn_ring.h"

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

/* The daemon's streams of their own serve 128 rings (two each, 256 in all:
 * daemon/cuda/cuda_int.h's RND_CUDA_OWN_STREAMS); a later ring's slots use
 * the pool, and its graph slots are refused, since a replay on a pool
 * stream could queue behind a job that waits on another client. */
#define RINGS 132

static void test_no_own_stream(void **state)
{
    rnh_daemon *d = *state;
    rnr_ring *g;
    static rnp_request q;
    static rnp_reply rep;
    int with = 0, refused = 0, last = 0;

    if (!have_gpu())
        RN_SKIP("skipped: no GPU");
    rnh_arg(d, "--backend");
    rnh_arg(d, "cuda");
    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "400");
    rnh_arg(d, "--max-sessions-per-uid");
    rnh_arg(d, "400");
    assert_int_equal(rnh_start(d), 0);
    if (rnr_hello_paths(d->endpoint) != 3)
        RN_SKIP("skipped: the daemon does not offer the fast path on this device");
    assert_non_null(g = calloc(RINGS, sizeof *g));
    for (int i = 0; i < RINGS; i++) {
        /* One graph slot after the ring, its descriptor left zero: a ring
         * with its streams answers the descriptor's error (the stream is
         * checked first), one without them the missing stream. */
        assert_int_equal(rnr_ring_open_sealed(&g[i], d->endpoint, 1, RNP_GRAPH_SLOT), 0);
        memset(&q, 0, sizeof q);
        q.op = RN_OP_GRAPH_OPEN;
        q.u.graph_open.session = g[i].session;
        q.u.graph_open.ring = g[i].ring;
        q.u.graph_open.offset = (uint64_t)(g[i].data - g[i].mem);
        int st = rnr_ring_call(&g[i], &q, &rep);
        assert_int_not_equal(st, 0);
        assert_int_not_equal(st, -1);
        if (st == RN_UNSUPPORTED && strstr(rep.error, "no stream of its own")) {
            assert_non_null(strstr(rep.error, "graph_open.ring"));
            if (!refused++)
                printf("ring %d of %d: %s\n", i + 1, RINGS, rep.error);
            last = i;
        } else {
            with++;
        }
    }
    printf("%d rings with streams of their own, %d refused graph slots\n", with, refused);
    assert_true(with <= 128);
    assert_int_equal(last, RINGS - 1);
    for (int i = 0; i < RINGS; i++)
        rnr_ring_close(&g[i]);
    free(g);
    assert_int_equal(rnh_wait_stat(d, "fast.rings", 0, 60000), 0);
    rn_health_info h;
    assert_int_equal(rnh_health(d, &h), 0);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replays, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_no_own_stream, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
