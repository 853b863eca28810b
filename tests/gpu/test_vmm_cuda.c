/* SPDX-License-Identifier: MIT */
/*
 * test_vmm_cuda.c - tensors in CUDA virtual memory (cuMemCreate + cuMemMap,
 * as PyTorch's expandable segments allocate them) end to end on a real GPU:
 * a real daemon (--backend cuda) and client processes (prog_vmm_cuda) whose
 * memory has no CUDA IPC handle and is shared by descriptor, one per
 * physical allocation, on the session channel (PROTOCOL.md section 12).
 *
 *  - results against the fp64 reference over shapes and dtypes, with every
 *    tensor set crossing the boundary between two physical allocations;
 *  - the range growing (more chunks mapped) between calls, a chunk unmapped
 *    and another allocation mapped at its address (the client must see the
 *    change and register the new memory), and a shrink;
 *  - a client killed (SIGKILL) with work in flight: the daemon releases its
 *    VMM mappings once the kernels end, and serves the next client;
 *  - memory not created exportable as a POSIX descriptor: RN_NOT_SHARED
 *    with a message that says so, and nothing registered;
 *  - the opt-out (RMSNORMD_VMM=0 in the client): RN_NOT_SHARED naming the
 *    variable, and nothing registered;
 *  - the cost of a first call on new chunks and of a cached call (printed).
 *
 * The clients run with libclient's default (VMM sharing on).  Run on an
 * NVIDIA H200 with and without MPS (bench/RESULTS.md, "Expandable
 * segments").  Without a GPU it prints "skipped: no GPU" and passes.
 */
#include "rn_test.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "integration/harness.h"
#include "rmsnorm_client.h"

#define CLIENT_TIMEOUT_MS 240000

static int start_cuda(rnh_daemon *d)
{
    rnh_arg(d, "--backend");
    rnh_arg(d, "cuda");
    return rnh_start(d);
}

static int spawn_client(const rnh_daemon *d, const char *mode, rnh_proc *p)
{
    const char *args[] = {mode, NULL};
    return rnh_spawn_for(d, "gpu/prog_vmm_cuda", args, p);
}

/* Echo a client's output until it ends; its exit status. */
static int run_client(const rnh_daemon *d, const char *mode)
{
    rnh_proc p;

    if (spawn_client(d, mode, &p) != 0)
        return -1;
    return rnh_finish_echo(&p, mode, CLIENT_TIMEOUT_MS);
}

/* The client in mode passes, and its session ended with it: every VMM
 * mapping is closed. */
static void client_passes(void **state, const char *mode)
{
    rnh_daemon *d = *state;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(run_client(d, mode), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 20000), 0);
    RNH_PASS(d);
}

static void test_results(void **state) { client_passes(state, "results"); }
static void test_grow_remap(void **state) { client_passes(state, "grow"); }
/* Calls captured into graphs keep their ranges registered while the
 * graphs live: after a remap under one, and past the cache's 256. */
static void test_graph_holds(void **state) { client_passes(state, "graph"); }

static void test_kill_midflight(void **state)
{
    rnh_daemon *d = *state;
    char line[256];
    rnh_proc p;
    rn_health_info h;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(spawn_client(d, "flood", &p), 0);
    assert_true(rnh_read_line(&p, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "running");
    assert_true(rnh_stat(d, "regions.active") >= 1);
    kill(p.pid, SIGKILL);
    assert_int_equal(rnh_wait(&p, 10000), 128 + SIGKILL);
    rnh_proc_close(&p);
    /* The pid watch ends the session; its VMM mappings close once the
     * kernels that were in flight have ended. */
    assert_int_equal(rnh_wait_stat(d, "clients.died", 1, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 20000), 0);
    /* The daemon still serves, and is not failing. */
    assert_int_equal(run_client(d, "results"), 0);
    assert_int_equal(rnh_health(d, &h), 0);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    RNH_PASS(d);
}

/* The cost of the first call on new chunks and of a cached one, printed
 * for bench/RESULTS.md (no threshold). */
static void test_cost(void **state)
{
    rnh_daemon *d = *state;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(run_client(d, "cost"), 0);
    RNH_PASS(d);
}

/* A client mode whose call must be refused, with nothing registered. */
static void refused(void **state, const char *mode)
{
    rnh_daemon *d = *state;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(run_client(d, mode), 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 0);
    RNH_PASS(d);
}
static void test_not_exportable(void **state) { refused(state, "noexport"); }
static void test_opt_out(void **state) { refused(state, "optout"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_not_exportable, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_opt_out, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_results, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_grow_remap, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_graph_holds, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kill_midflight, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_cost, rnh_setup, rnh_teardown),
    };
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        printf("test_vmm_cuda: skipped: no GPU\n");
        return 0;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
