/* SPDX-License-Identifier: MIT */
/*
 * test_load - many client processes at once: 8 x 1000 requests with every
 * reply checked and the daemon's counts equal to what was sent; and kill -9
 * of clients with requests in flight, 20 times, while others carry on.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"

static void check_no_errors(const rn_stats_info *s)
{
    for (unsigned i = 0; i < s->nstats; i++)
        if (strncmp(s->stats[i].name, "errors.", 7) == 0 && s->stats[i].value != 0)
            fail_msg("counter %s is %llu", s->stats[i].name, (unsigned long long)s->stats[i].value);
}

static uint64_t hist_count(const rn_stats_info *s, const char *name)
{
    for (unsigned i = 0; i < s->nhists; i++)
        if (strcmp(s->hists[i].name, name) == 0)
            return s->hists[i].count;
    return UINT64_MAX;
}

static void test_many_clients(void **state)
{
    rnh_daemon *d = *state;
    enum { K = 8, R = 1000 };
    rnh_proc w[K];
    rn_stats_info *s = calloc(1, sizeof *s);
    rn_client *c;
    char line[200], expect[64];

    assert_int_equal(rnh_start(d), 0);
    for (int i = 0; i < K; i++) {
        char seed[16], reqs[16];
        snprintf(seed, sizeof seed, "%d", 100 + i);
        snprintf(reqs, sizeof reqs, "%d", R);
        /* Different shapes and dtypes per worker: results cannot be swapped
         * between clients unnoticed. */
        const char *argv[] = {"prog_worker",
                              "--endpoint",
                              d->endpoint,
                              "-r",
                              reqs,
                              "--m",
                              i % 2 ? "24" : "16",
                              "--n",
                              i % 3 ? "256" : "200",
                              "--dtype",
                              i % 3 == 0   ? "bf16"
                              : i % 3 == 1 ? "f16"
                                           : "f32",
                              "--seed",
                              seed,
                              "--wait-go",
                              NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &w[i]), 0);
    }
    for (int i = 0; i < K; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ready");
    }
    /* All at once. */
    for (int i = 0; i < K; i++) {
        assert_int_equal(write(w[i].in_fd, "g", 1), 1);
        close(w[i].in_fd);
        w[i].in_fd = -1;
    }
    snprintf(expect, sizeof expect, "done ok=%d failed=0 last=OK", R);
    for (int i = 0; i < K; i++) {
        assert_true(rnh_read_line(&w[i], line, sizeof line, 120000) >= 0);
        assert_string_equal(line, "first");
        assert_true(rnh_read_line(&w[i], line, sizeof line, 120000) >= 0);
        assert_string_equal(line, expect);
        assert_int_equal(rnh_wait(&w[i], 30000), 0);
        rnh_proc_close(&w[i]);
    }

    /* The daemon counted exactly what was sent: nothing lost, nothing
     * doubled, no errors. */
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_stats(c, s), 0);
    assert_int_equal(rn_stats_get(s, "requests.bwd", 0), K * R);
    assert_int_equal(hist_count(s, "compute"), K * R);
    /* One HELLO per worker; the client asking for STATS needs no session.
     * Buffers are registered by descriptor on the session channel. */
    assert_int_equal(rn_stats_get(s, "requests.hello", 0), K);
    assert_int_equal(rn_stats_get(s, "requests.auth", 0), K);
    assert_int_equal(rn_stats_get(s, "requests.register", 0), 0);
    assert_int_equal(rn_stats_get(s, "requests.register_fd", 0), K);
    assert_int_equal(rn_stats_get(s, "requests.unregister", 0), K);
    assert_int_equal(rn_stats_get(s, "requests.bye", 0), K);
    assert_int_equal(rn_stats_get(s, "dup.answered", 0), 0);
    assert_int_equal(rn_stats_get(s, "busy.rejected", 0), 0);
    assert_int_equal(rn_stats_get(s, "regions.active", 99), 0);
    assert_int_equal(rn_stats_get(s, "inflight.current", 99), 0);
    assert_true(rn_stats_get(s, "inflight.max", 0) >= 2);
    check_no_errors(s);
    rn_close(c);
    free(s);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

static void test_kill9(void **state)
{
    rnh_daemon *d = *state;
    enum { STEADY = 2, VICTIMS = 20 };
    rnh_proc steady[STEADY];
    pid_t victims[VICTIMS];
    rn_health_info h;
    rn_client *c;
    char line[200], needle[64];
    int left;

    assert_int_equal(rnh_start(d), 0);
    for (int i = 0; i < STEADY; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 7 + i);
        const char *argv[] = {"prog_worker", "--endpoint", d->endpoint,   "--m",
                              "32",          "--n",        "512",         "--seed",
                              seed,          "--wait-go",  "--until-eof", NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &steady[i]), 0);
        assert_true(rnh_read_line(&steady[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ready");
        assert_int_equal(write(steady[i].in_fd, "g", 1), 1);
        assert_true(rnh_read_line(&steady[i], line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "first");
    }

    for (int v = 0; v < VICTIMS; v++) {
        rnh_proc p;
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 50 + v);
        /* Requests big enough that one is almost always in flight. */
        const char *argv[] = {"prog_worker", "--endpoint", d->endpoint, "--m",       "256", "--n",
                              "2048",        "--seed",     seed,        "--forever", NULL};
        assert_int_equal(rnh_spawn("prog_worker", argv, false, &p), 0);
        assert_true(rnh_read_line(&p, line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ready");
        assert_true(rnh_read_line(&p, line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "first");
        /* Right after a reply the next request is on its way. */
        kill(p.pid, SIGKILL);
        assert_int_equal(rnh_wait(&p, 10000), 128 + SIGKILL);
        rnh_proc_close(&p);
        victims[v] = p.pid;
    }

    /* SIGKILL leaves no shm name behind: a buffer's name goes as soon as
     * the daemon has its descriptor. */
    snprintf(needle, sizeof needle, "rmsnormd.%d.", (int)victims[VICTIMS - 1]);
    left = rnh_shm_count(needle);
    assert_int_equal(left, 0);

    /* The daemon notices every death and releases the dead clients'
     * sessions, regions and mappings once their work is done. */
    assert_int_equal(rnh_wait_stat(d, "clients.died", VICTIMS, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "regions.active", STEADY, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", STEADY, 20000), 0);
    for (int v = 0; v < VICTIMS; v++) {
        snprintf(needle, sizeof needle, "/dev/shm/rmsnormd.%d.", (int)victims[v]);
        assert_int_equal(rnh_maps_count(d->pid, needle), 0);
    }
    assert_int_equal(rnh_maps_count(d->pid, "/dev/shm/rmsnormd."), STEADY);

    /* The others carried on without an error. */
    for (int i = 0; i < STEADY; i++) {
        close(steady[i].in_fd);
        steady[i].in_fd = -1;
        assert_true(rnh_read_line(&steady[i], line, sizeof line, 60000) >= 0);
        assert_non_null(strstr(line, "failed=0 last=OK"));
        assert_int_equal(rnh_wait(&steady[i], 30000), 0);
        rnh_proc_close(&steady[i]);
    }

    /* By now clients have connected again, and removed every name the
     * killed ones left. */
    c = rnh_client(d);
    assert_non_null(c);
    for (int v = 0; v < VICTIMS; v++) {
        snprintf(needle, sizeof needle, "rmsnormd.%d.", (int)victims[v]);
        assert_int_equal(rnh_shm_count(needle), 0);
    }
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_OK);
    rn_close(c);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_many_clients, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_kill9, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
