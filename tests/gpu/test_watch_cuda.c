/* SPDX-License-Identifier: MIT */
/*
 * test_watch_cuda.c - libclient's daemon watcher (client/watch.c) on a real
 * GPU: the daemon (--backend cuda, the fast path) is killed with kill -9
 * while a client's stream waits on it, and the stream must finish within
 * 2 s with no libclient call after the kill (prog_watch_cuda, which polls
 * the stream so that a hang fails instead of hanging):
 *
 *  - a ring call whose inputs a GPU spin of 5 s holds back (the daemon took
 *    it and its stream waits for ready): killed during the spin;
 *  - a replay of a captured call after a 5 s spin: its start runs after the
 *    daemon died (it must find its slot closed, or be let go);
 *  - a replay that began while the daemon was stopped (SIGSTOP: it cannot
 *    take it), then killed: the replay already waits for done.
 *
 * Then a new daemon at the endpoint: the client's next call reports the
 * loss (RN_RESTARTED) and the call after it runs, checked.
 *
 * Not under MPS: killing a process with work of its own on the GPU makes
 * the MPS server fault every client (bench/RESULTS.md, the kill tests of
 * test_fastpath_cuda).  Without a usable GPU every test reports "skipped:
 * no GPU".
 */
#include "rn_test.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "integration/harness.h"
#include "integration/raw.h"

#define STEP_MS 120000

static bool have_gpu(void)
{
    static int known = -1;
    char cmd[PATH_MAX + 32];

    if (known < 0) {
        snprintf(cmd, sizeof cmd, "%s/tests/gpu/prog_probe >/dev/null 2>&1", rnh_build_dir());
        known = system(cmd) == 0;
    }
    return known;
}

static bool log_has(const rnh_daemon *d, const char *needle)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -qF -- '%s' '%s'", needle, d->log_path);
    return system(cmd) == 0;
}

/* Whether the daemon is an MPS client (its HEALTH says so when it is not). */
static bool daemon_on_mps(const rnh_daemon *d)
{
    rn_health_info h;
    bool mps = true;

    assert_int_equal(rnh_health(d, &h), 0);
    for (unsigned i = 0; i < h.nreasons; i++)
        if (strstr(h.reasons[i], "not an MPS client"))
            mps = false;
    return mps;
}

static void start_fast(rnh_daemon *d)
{
    if (!have_gpu())
        RN_SKIP("skipped: no GPU");
    rnh_arg(d, "--backend");
    rnh_arg(d, "cuda");
    assert_int_equal(rnh_start(d), 0);
    if (rnr_hello_paths(d->endpoint) != 3) {
        if (log_has(d, "the fast path stays off"))
            RN_SKIP("skipped: the device has no 64-bit stream memory operations");
        fail_msg("HELLO does not offer the fast path");
    }
    if (daemon_on_mps(d))
        RN_SKIP("skipped under MPS: the MPS server faults every client when one is killed with "
                "work on the GPU (bench/RESULTS.md); run it without MPS");
}

static void say(rnh_proc *p, const char *line)
{
    size_t n = strlen(line);
    assert_int_equal(write(p->in_fd, line, n), (ssize_t)n);
}

/* prog_watch_cuda MODE SPIN_MS [ctx]; with stop, the daemon is stopped
 * (SIGSTOP) before the work goes on the stream, so that it takes nothing of
 * it. */
static void killed_while_waiting(rnh_daemon *d, const char *mode, const char *spin, bool stop,
                                 const char *ctx)
{
    const char *args[] = {mode, spin, ctx, NULL};
    rnh_proc p;
    int64_t t0;

    start_fast(d);
    assert_int_equal(rnh_spawn_for(d, "gpu/prog_watch_cuda", args, &p), 0);
    assert_int_equal(rnh_await_line(&p, mode, "ready", NULL, 0, STEP_MS), 0);
    if (stop)
        assert_int_equal(rnh_sigstop(d), 0);
    say(&p, "go\n");
    assert_int_equal(rnh_await_line(&p, mode, "pending", NULL, 0, STEP_MS), 0);
    t0 = rnh_now_ms();
    assert_int_equal(kill(d->pid, SIGKILL), 0);
    assert_int_equal(rnh_wait_exit(d, 30000), 128 + SIGKILL);
    printf("the daemon was dead %lld ms after the kill\n", (long long)(rnh_now_ms() - t0));
    say(&p, "killed\n");
    if (rnh_await_line(&p, mode, "ok released", NULL, 0, 30000) != 0) {
        kill(p.pid, SIGKILL);
        rnh_wait(&p, 10000);
        rnh_proc_close(&p);
        fail_msg("%s: the stream was not released", mode);
    }
    assert_int_equal(rnh_start(d), 0);
    say(&p, "restarted\n");
    assert_int_equal(rnh_finish_echo(&p, mode, STEP_MS), 0);
    RNH_PASS(d);
}

static void test_ring_call_daemon_killed(void **state)
{
    killed_while_waiting(*state, "ring", "5000", false, NULL);
}

static void test_replay_after_daemon_killed(void **state)
{
    killed_while_waiting(*state, "graph", "5000", false, NULL);
}

static void test_replay_waiting_daemon_killed(void **state)
{
    killed_while_waiting(*state, "graph", "0", true, NULL);
}

/* The same in a context of the client's own (cuCtxCreate): the watcher
 * raised the done word from the device's primary context, where the
 * client's stream and words are not, and the stream waited for good. */
static void test_ring_call_own_context(void **state)
{
    killed_while_waiting(*state, "ring", "5000", false, "ctx");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ring_call_daemon_killed, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_replay_after_daemon_killed, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_replay_waiting_daemon_killed, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_ring_call_own_context, rnh_setup, rnh_teardown),
    };
    if (getenv("RN_TESTS"))
        cmocka_set_test_filter(getenv("RN_TESTS"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
