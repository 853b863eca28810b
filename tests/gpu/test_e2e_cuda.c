/*
 * test_e2e_cuda.c - rmsnormd's cuda backend end to end on a real GPU: a real
 * daemon (--backend cuda) and real client processes (prog_e2e_cuda) that use
 * libclient's stream-ordered calls on device memory.
 *
 *  - two clients at once, every result against the fp64 reference over a
 *    grid of shapes, dtypes and options, async and sync;
 *  - stream ordering: a producer writes the inputs just before each call and
 *    a consumer copies dx just after, with random GPU-side delays and no
 *    host synchronisation in between, in two clients at once;
 *  - a client killed (SIGKILL) with work in flight: the daemon releases its
 *    session and mappings and stays healthy;
 *  - an allocation freed and made again at the same address;
 *  - bad arguments (misaligned, out of bounds, host/managed/pool memory, a
 *    forged device UUID, a claimed size beyond the allocation) each get
 *    their error, and nothing else changes;
 *  - HELLO and HEALTH say whether the daemon is an MPS client (RN_EXPECT_MPS
 *    =0/1 makes the test insist), and without MPS the log warns;
 *  - the kernel deadline (RMSNORMD_KERNEL_DEADLINE_MS) counts from the moment
 *    a request's inputs are ready: inputs that become ready only after the
 *    deadline give a warning in the log (once) and a correct result, the
 *    daemon stays healthy, and another client is served meanwhile;
 *  - a client killed while its inputs are not ready: the daemon either goes
 *    on (mappings closed, healthy) or, if the dead client's ready event never
 *    comes, restarts itself (exit 2); it never keeps the stream blocked;
 *  - a kernel running past the deadline (a 5 ms deadline, and a large shape
 *    slowed down to one CTA with RMSNORMD_DEBUG_FORCE_GRID=1) marks the
 *    daemon failing: the request is answered DEVICE_FAILING, exit status 2.
 *
 * Run it once plainly and once with an MPS server up, so that the same tests
 * cover daemon and clients as MPS clients:
 *   export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
 *   mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
 *   RN_EXPECT_MPS=1 build/tests/gpu/test_e2e_cuda
 *   echo quit | nvidia-cuda-mps-control
 */
#include "rn_test.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* A daemon with RMSNORMD_KERNEL_DEADLINE_MS=ms and, unless grid is NULL,
 * RMSNORMD_DEBUG_FORCE_GRID=grid (the test's environment is left as it was). */
static int start_cuda_deadline(rnh_daemon *d, const char *ms, const char *grid)
{
    int rc;

    setenv("RMSNORMD_KERNEL_DEADLINE_MS", ms, 1);
    if (grid)
        setenv("RMSNORMD_DEBUG_FORCE_GRID", grid, 1);
    rc = start_cuda(d);
    unsetenv("RMSNORMD_KERNEL_DEADLINE_MS");
    unsetenv("RMSNORMD_DEBUG_FORCE_GRID");
    return rc;
}

static int spawn_client(const rnh_daemon *d, const char *const *args, rnh_proc *p)
{
    static char prog[PATH_MAX];
    const char *argv[16];
    int n = 0;

    snprintf(prog, sizeof prog, "%s/tests/gpu/prog_e2e_cuda", rnh_build_dir());
    argv[n++] = prog;
    argv[n++] = d->endpoint;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return rnh_spawn(prog, argv, false, p);
}

/* Echo a client's output into the test log until it ends; its exit status. */
static int finish_client(rnh_proc *p, const char *name)
{
    char line[512];
    int rc;

    while (rnh_read_line(p, line, sizeof line, CLIENT_TIMEOUT_MS) >= 0)
        printf("  [%s %d] %s\n", name, (int)p->pid, line);
    rc = rnh_wait(p, 10000);
    rnh_proc_close(p);
    if (rc != 0)
        printf("  [%s %d] exit status %d\n", name, (int)p->pid, rc);
    return rc;
}

static int run_client(const rnh_daemon *d, const char *const *args)
{
    rnh_proc p;
    if (spawn_client(d, args, &p) != 0)
        return -1;
    return finish_client(&p, args[0]);
}

/* Echo a client's lines until one equals want; 0, or -1 at its end or after
 * timeout_ms. */
static int await_line(rnh_proc *p, const char *name, const char *want, int timeout_ms)
{
    int64_t end = rnh_now_ms() + timeout_ms;
    char line[512];

    while (rnh_now_ms() < end) {
        if (rnh_read_line(p, line, sizeof line, (int)(end - rnh_now_ms())) < 0)
            break;
        printf("  [%s %d] %s\n", name, (int)p->pid, line);
        if (strcmp(line, want) == 0)
            return 0;
    }
    printf("  [%s %d] no '%s' line\n", name, (int)p->pid, want);
    return -1;
}

/* Times needle occurs in the daemon's log so far; -1 if unreadable. */
static int log_count(const rnh_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "r");
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    int count = 0;

    if (!f)
        return -1;
    do {
        if (cap - len < 65536) {
            char *nb = realloc(buf, cap + 65536 + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nb;
            cap += 65536;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n > 0);
    fclose(f);
    buf[len] = '\0';
    for (const char *p = buf; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        count++;
    free(buf);
    return count;
}

/* Wait until needle is in the daemon's log; its count there, or 0 after
 * timeout_ms. */
static int await_log(const rnh_daemon *d, const char *needle, int timeout_ms)
{
    int64_t end = rnh_now_ms() + timeout_ms;
    int n;

    while ((n = log_count(d, needle)) <= 0 && rnh_now_ms() < end) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    return n > 0 ? n : 0;
}

/* HEALTH is ok, or degraded only because the daemon is not an MPS client:
 * in any case not failing. */
static void assert_healthy(const rnh_daemon *d, const char *when)
{
    rn_health_info h;
    rn_client *c;

    assert_non_null(c = rnh_client(d));
    assert_int_equal(rn_health(c, &h), 0);
    printf("health %s: state %d, mps %d\n", when, h.state, h.mps);
    for (unsigned i = 0; i < h.nreasons; i++)
        printf("  reason: %s\n", h.reasons[i]);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    assert_true(h.state == RN_HEALTH_OK || (h.state == RN_HEALTH_DEGRADED && !h.mps));
    rn_close(c);
}

static void test_grid_two_clients(void **state)
{
    rnh_daemon *d = *state;
    const char *args[] = {"grid", NULL};
    rnh_proc a, b;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(spawn_client(d, args, &a), 0);
    assert_int_equal(spawn_client(d, args, &b), 0);
    assert_int_equal(finish_client(&a, "grid"), 0);
    assert_int_equal(finish_client(&b, "grid"), 0);
    assert_true(rnh_stat(d, "replies.ok") > 0);
    /* The harness's own connection is a session too. */
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, 10000), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 10000), 0);
    /* A clean drain after GPU work exits 0. */
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

static void test_stream_order(void **state)
{
    rnh_daemon *d = *state;
    char seed_a[32], seed_b[32];
    rnh_proc a, b;

    snprintf(seed_a, sizeof seed_a, "%ld", (long)time(NULL));
    snprintf(seed_b, sizeof seed_b, "%ld", (long)time(NULL) + 77777);
    printf("seeds %s %s\n", seed_a, seed_b);
    const char *args_a[] = {"order", "200", seed_a, NULL};
    const char *args_b[] = {"order", "200", seed_b, NULL};
    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(spawn_client(d, args_a, &a), 0);
    assert_int_equal(spawn_client(d, args_b, &b), 0);
    assert_int_equal(finish_client(&a, "order"), 0);
    assert_int_equal(finish_client(&b, "order"), 0);
    RNH_PASS(d);
}

static void test_kill_midflight(void **state)
{
    rnh_daemon *d = *state;
    const char *flood[] = {"flood", NULL};
    const char *after[] = {"order", "20", "4242", NULL};
    char line[256];
    rnh_proc p;
    rn_health_info h;
    rn_client *c;

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(spawn_client(d, flood, &p), 0);
    assert_true(rnh_read_line(&p, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "running");
    assert_true(rnh_stat(d, "regions.active") >= 1);
    kill(p.pid, SIGKILL);
    assert_int_equal(rnh_wait(&p, 10000), 128 + SIGKILL);
    rnh_proc_close(&p);
    /* The pid watch ends the session; its mappings close once the kernels
     * that were in flight have ended. */
    assert_int_equal(rnh_wait_stat(d, "clients.died", 1, 20000), 0);
    /* The harness's own connection is a session too. */
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 1, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 20000), 0);
    /* The daemon still serves, and is not failing. */
    assert_int_equal(run_client(d, after), 0);
    assert_non_null(c = rnh_client(d));
    assert_int_equal(rn_health(c, &h), 0);
    for (unsigned i = 0; i < h.nreasons; i++)
        printf("health reason: %s\n", h.reasons[i]);
    assert_int_not_equal(h.state, RN_HEALTH_FAILING);
    rn_close(c);
    RNH_PASS(d);
}

static void test_realloc_same_address(void **state)
{
    rnh_daemon *d = *state;
    const char *args[] = {"realloc", NULL};

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(run_client(d, args), 0);
    RNH_PASS(d);
}

static void test_errors(void **state)
{
    rnh_daemon *d = *state;
    const char *args[] = {"errors", NULL};

    assert_int_equal(start_cuda(d), 0);
    assert_int_equal(run_client(d, args), 0);
    RNH_PASS(d);
}

static void test_mps_flag(void **state)
{
    rnh_daemon *d = *state;
    const char *want = getenv("RN_EXPECT_MPS");
    struct rn_server_info si;
    rn_health_info h;
    rn_client *c;
    char buf[8192];
    FILE *f;
    size_t n;

    assert_int_equal(start_cuda(d), 0);
    assert_non_null(c = rnh_client(d));
    assert_int_equal(rn_server_info(c, &si), 0);
    assert_int_equal(rn_health(c, &h), 0);
    printf("daemon: backend %s, device %s, sm %u, cc %u.%u, mps %d; health %d\n", si.backend,
           si.device_name, si.sm_count, si.cc_major, si.cc_minor, si.mps, h.state);
    assert_string_equal(si.backend, "cuda");
    assert_int_equal(si.mps, h.mps);
    if (want && *want)
        assert_int_equal(si.mps, atoi(want));
    f = fopen(d->log_path, "r");
    assert_non_null(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    if (!si.mps) {
        /* Without MPS: the start-up warning, and HEALTH says why it is
         * degraded. */
        assert_non_null(strstr(buf, "not an MPS client"));
        assert_int_equal(h.state, RN_HEALTH_DEGRADED);
    } else {
        assert_null(strstr(buf, "not an MPS client"));
        assert_int_equal(h.state, RN_HEALTH_OK);
    }
    rn_close(c);
    RNH_PASS(d);
}

static void test_unready_inputs_warn(void **state)
{
    rnh_daemon *d = *state;
    const char *stall[] = {"stall", "3000", NULL};
    const char *other[] = {"wait", "order", "20", "4242", NULL};
    const char *warning = "inputs not ready after";
    rnh_proc a, b;
    int64_t t0;

    /* The stalled client's inputs become ready only 3 s after its call,
     * past a 1 s kernel deadline: the deadline is the kernel's, so the
     * daemon warns once, keeps waiting, stays healthy and answers with the
     * right result. */
    assert_int_equal(start_cuda_deadline(d, "1000", NULL), 0);
    /* The other client sets up its context and connection first, so that
     * its work fits well inside the stall. */
    assert_int_equal(spawn_client(d, other, &b), 0);
    assert_int_equal(await_line(&b, "other", "waiting", 60000), 0);
    assert_int_equal(spawn_client(d, stall, &a), 0);
    assert_int_equal(await_line(&a, "stall", "stalling", 60000), 0);
    t0 = rnh_now_ms();
    assert_int_equal(rnh_wait_stat_ge(d, "inflight.current", 1, 10000), 0);
    /* While the stalled request waits on its stream, the other client's
     * requests run on theirs. */
    assert_int_equal(write(b.in_fd, "go\n", 3), 3);
    assert_int_equal(finish_client(&b, "other"), 0);
    int64_t inflight = rnh_stat(d, "inflight.current");
    printf("the other client was served %lld ms into the stall; %lld request(s) in flight\n",
           (long long)(rnh_now_ms() - t0), (long long)inflight);
    /* Past the deadline: one warning, and the daemon is healthy. */
    int warned = await_log(d, warning, 10000);
    if (warned == 1)
        assert_healthy(d, "during the stall");
    assert_int_equal(finish_client(&a, "stall"), 0);
    printf("the stalled call ended %lld ms after it was made\n", (long long)(rnh_now_ms() - t0));
    assert_int_equal(inflight, 1);
    assert_int_equal(warned, 1);
    assert_healthy(d, "after the stall");
    /* One warning for the request, not one per look at it, and a note
     * when it completed. */
    assert_int_equal(log_count(d, warning), 1);
    assert_int_equal(log_count(d, "whose inputs were late completed"), 1);
    assert_int_equal(log_count(d, "Backend failed"), 0);
    /* A clean drain: exit status 0. */
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

static void test_kill_stalled_client(void **state)
{
    rnh_daemon *d = *state;
    const char *stall[] = {"stall", "20000", NULL};
    const char *after[] = {"order", "20", "4242", NULL};
    rnh_proc a;

    /* A client killed while the daemon's stream waits on its unready
     * inputs.  Either the driver lets the stream go on (the mappings close,
     * the daemon stays healthy and serves), or the ready event never comes
     * and, the session being gone, the daemon restarts itself (exit 2)
     * rather than keep a stream blocked for later sessions.  Hanging on is
     * the one wrong outcome. */
    assert_int_equal(start_cuda_deadline(d, "1000", NULL), 0);
    assert_int_equal(spawn_client(d, stall, &a), 0);
    assert_int_equal(await_line(&a, "stall", "stalling", 60000), 0);
    assert_int_equal(rnh_wait_stat_ge(d, "inflight.current", 1, 10000), 0);
    kill(a.pid, SIGKILL);
    assert_int_equal(rnh_wait(&a, 10000), 128 + SIGKILL);
    rnh_proc_close(&a);
    /* (Under MPS the daemon may already be gone: see below.) */
    if (rnh_wait_stat(d, "regions.active", 0, 6000) == 0) {
        printf("the stream went on after the client's death: mappings closed\n");
        assert_int_equal(rnh_stat(d, "clients.died"), 1);
        assert_int_equal(run_client(d, after), 0);
        assert_healthy(d, "after the stalled client died");
        assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    } else {
        /* Without MPS the dead client's ready event never comes; under MPS
         * the server may also fault the daemon's context when it tears the
         * killed client down (a sticky error).  Either way: exit 2. */
        assert_int_equal(rnh_wait_exit(d, 30000), 2);
        if (log_count(d, "its client is gone") >= 1)
            printf("the dead client's ready event never came: the daemon restarted\n");
        else if (log_count(d, "Backend failed") >= 1)
            printf("the daemon's context failed with the killed client (MPS): restarted\n");
        else
            fail_msg("exit 2 without a reason in the log");
    }
    RNH_PASS(d);
}

static void test_kernel_deadline_fails_daemon(void **state)
{
    rnh_daemon *d = *state;
    const char *args[] = {"slow", "65536", "16384", NULL};

    /* One CTA for 65536 x 16384 bf16 (6 GiB of traffic through one SM)
     * takes far longer than a 5 ms deadline: the daemon must report
     * failing, answer the request with DEVICE_FAILING and exit 2 for
     * systemd to restart it. */
    assert_int_equal(start_cuda_deadline(d, "5", "1"), 0);
    assert_int_equal(log_count(d, "RMSNORMD_DEBUG_FORCE_GRID is on"), 1);
    assert_int_equal(run_client(d, args), 0);
    assert_int_equal(rnh_wait_exit(d, 30000), 2);
    assert_true(log_count(d, "kernel deadline: a kernel") >= 1);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mps_flag, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_errors, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_grid_two_clients, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stream_order, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_realloc_same_address, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kill_midflight, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_unready_inputs_warn, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kernel_deadline_fails_daemon, rnh_setup,
                                        rnh_teardown),
        /* Last: under MPS, killing a client with a kernel running can leave
         * the MPS server refusing new clients for a while. */
        cmocka_unit_test_setup_teardown(test_kill_stalled_client, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
