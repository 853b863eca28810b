/* SPDX-License-Identifier: MIT */
/*
 * test_ctl - rmsnormctl against a real daemon: exit codes, the stats
 * formats (table, JSON, Prometheus text exposition), ping, selftest, bench,
 * version and --help everywhere; bench stopping when its daemon goes.
 */
#include <ctype.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"

static char out[1 << 16];

/* rmsnormctl with args; its stdout in out. */
static int ctl(const char *const *args)
{
    return rnh_run_ctl(args, out, sizeof out, 120000);
}

/* Each line of a text exposition is a comment (# HELP / # TYPE) or a sample
 * "name{labels} value"; every sample's family has a TYPE line before it. */
static void check_prometheus(const char *text)
{
    char typed[64][96];
    int ntyped = 0, samples = 0;
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        char l[512], name[128];
        size_t len = end ? (size_t)(end - line) : strlen(line);
        assert_true(len < sizeof l);
        memcpy(l, line, len);
        l[len] = '\0';
        line += len + (end ? 1 : 0);
        if (len == 0)
            continue;
        if (strncmp(l, "# HELP ", 7) == 0)
            continue;
        if (strncmp(l, "# TYPE ", 7) == 0) {
            char type[32];
            assert_int_equal(sscanf(l + 7, "%95s %31s", typed[ntyped], type), 2);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "summary") == 0 || strcmp(type, "histogram") == 0);
            ntyped++;
            assert_true(ntyped < 64);
            continue;
        }
        assert_true(l[0] != '#');
        /* name */
        size_t i = 0;
        assert_true(isalpha((unsigned char)l[0]) || l[0] == '_');
        while (isalnum((unsigned char)l[i]) || l[i] == '_' || l[i] == ':')
            i++;
        memcpy(name, l, i);
        name[i] = '\0';
        if (l[i] == '{') {
            const char *close = strchr(l + i, '}');
            assert_non_null(close);
            i = (size_t)(close - l) + 1;
        }
        assert_true(l[i] == ' ');
        {
            char *e;
            strtod(l + i + 1, &e);
            assert_true(*e == '\0');
        }
        {
            int found = 0;
            for (int t = 0; t < ntyped; t++) {
                size_t tl = strlen(typed[t]);
                if (strcmp(name, typed[t]) == 0 ||
                    (strncmp(name, typed[t], tl) == 0 &&
                     (strcmp(name + tl, "_count") == 0 || strcmp(name + tl, "_sum") == 0 ||
                      strcmp(name + tl, "_bucket") == 0)))
                    found = 1;
            }
            if (!found)
                fail_msg("sample %s has no TYPE line before it", name);
        }
        samples++;
    }
    assert_true(samples > 10);
}

static void test_ctl(void **state)
{
    rnh_daemon *d = *state;
    char file[300], tmp[320];
    FILE *f;

    assert_int_equal(rnh_start(d), 0);
    const char *ep = d->endpoint;

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "health", NULL}), 0);
    assert_non_null(strstr(out, "ok"));
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "health", "-q", NULL}), 0);
    assert_string_equal(out, "");

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "ping", "-c", "50", NULL}), 0);
    assert_non_null(strstr(out, "50 pings"));
    assert_non_null(strstr(out, "p99"));

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "selftest", NULL}), 0);
    assert_non_null(strstr(out, "24 of 24 cases match"));

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "bench", "-k", "2", "-r", "50", "--m",
                                          "16", "--n", "128", "--dtype", "f16", "-q", NULL}),
                     0);
    assert_non_null(strstr(out, "verified: 100 ok, 0 failed"));
    assert_non_null(strstr(out, "throughput"));

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "stats", NULL}), 0);
    assert_non_null(strstr(out, "requests.bwd"));
    assert_non_null(strstr(out, "latency"));
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "stats", "--json", NULL}), 0);
    assert_true(out[0] == '{');
    assert_non_null(strstr(out, "\"counters\":{"));
    assert_non_null(strstr(out, "\"requests.bwd\":"));
    assert_non_null(strstr(out, "\"histograms\":{"));
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "stats", "--prometheus", NULL}), 0);
    check_prometheus(out);
    /* Every series carries the endpoint first (rmsnormctl's instance label). */
    assert_non_null(strstr(out, "rmsnormd_requests_total{endpoint=\""));
    assert_non_null(strstr(out, ",op=\"bwd\"} "));
    assert_non_null(strstr(out, ",stage=\"total\",le=\"+Inf\"} "));

    snprintf(file, sizeof file, "%s/rmsnormd.prom", d->dir);
    assert_int_equal(
        ctl((const char *[]){"--endpoint", ep, "stats", "--prometheus", "-o", file, NULL}), 0);
    f = fopen(file, "r");
    assert_non_null(f);
    {
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
    }
    fclose(f);
    check_prometheus(out);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    assert_int_not_equal(access(tmp, F_OK), 0);
    unlink(file);

    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "info", NULL}), 0);
    assert_non_null(strstr(out, "backend             cpu"));
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "version", NULL}), 0);
    assert_non_null(strstr(out, "rmsnormd "));

    /* --help everywhere, usage errors, unknown commands. */
    static const char *cmds[] = {"health", "stats", "info", "ping", "selftest", "bench", "version"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        assert_int_equal(ctl((const char *[]){cmds[i], "--help", NULL}), 0);
        assert_non_null(strstr(out, "Usage:"));
    }
    assert_int_equal(ctl((const char *[]){"--help", NULL}), 0);
    assert_non_null(strstr(out, "Commands:"));
    assert_int_equal(ctl((const char *[]){"frobnicate", NULL}), 64);
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "ping", "-c", "zero", NULL}), 64);
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "bench", "--dtype", "f64", NULL}), 64);

    /* Unreachable: health says 2 at once. */
    {
        char gone[300];
        int64_t t0 = rnh_now_ms();
        snprintf(gone, sizeof gone, "ipc://%s/nobody.sock", d->dir);
        assert_int_equal(ctl((const char *[]){"--endpoint", gone, "health", NULL}), 2);
        assert_int_equal(ctl((const char *[]){"--endpoint", gone, "stats", NULL}), 2);
        assert_true(rnh_now_ms() - t0 < 5000);
    }
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    /* And after the daemon stopped, on its own endpoint too. */
    assert_int_equal(ctl((const char *[]){"--endpoint", ep, "health", NULL}), 2);
    RNH_PASS(d);
}

/*
 * bench while its daemon goes (sig: SIGKILL, it dies; SIGTERM, it drains
 * and exits): bench stops at the first call that finds it gone, says so in
 * one line and exits 2, within about the client's timeout (2 s here), and
 * prints no report of a run cut short.  Before, it went on through every
 * remaining call, counted each as a failed check and exited 1 (after up to
 * a million calls a worker here).
 */
static void bench_outlived(rnh_daemon *d, int sig)
{
    char ctl_path[512], line[1024], all[4096] = "";
    int lines = 0, rc, st;
    rnh_proc p;

    assert_int_equal(rnh_start(d), 0);
    snprintf(ctl_path, sizeof ctl_path, "%s/rmsnormctl", rnh_build_dir());
    /* Its standard error on the pipe too: the stop line is there. */
    const char *argv[] = {"sh", "-c", "exec \"$0\" \"$@\" 2>&1", ctl_path, "--endpoint",
                          d->endpoint, "--timeout", "2000", "bench", "-k", "2", "-r", "1000000",
                          "--m", "16", "--n", "128", "-q", NULL};
    assert_int_equal(rnh_spawn("/bin/sh", argv, false, &p), 0);
    close(p.in_fd);
    p.in_fd = -1;
    /* Under way: both workers' calls reach the daemon. */
    assert_int_equal(rnh_wait_stat_ge(d, "requests.bwd", 200, 30000), 0);
    kill(d->pid, sig);
    st = rnh_wait_exit(d, RNH_STOP_TIMEOUT_MS);
    assert_int_equal(st, sig == SIGKILL ? 128 + SIGKILL : 0);
    int64_t t0 = rnh_now_ms();
    while (rnh_read_line(&p, line, sizeof line, 30000) >= 0) {
        printf("  [bench] %s\n", line);
        lines++;
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s\n", line);
    }
    rc = rnh_wait(&p, 30000);
    int64_t took = rnh_now_ms() - t0;
    rnh_proc_close(&p);
    printf("bench ended %lld ms after the daemon, exit status %d\n", (long long)took, rc);
    assert_int_equal(rc, 2);
    /* One line (-q: no progress line), naming what happened. */
    assert_int_equal(lines, 1);
    assert_non_null(strstr(all, "rmsnormctl: bench stopped after "));
    /* Draining: DRAINING replies (a worker whose next call came only once
     * the daemon had exited finds it gone instead, and the line names the
     * code that says the most); killed: no reply, or none listening. */
    assert_true(strstr(all, "the daemon is shutting down (worker ") ||
                strstr(all, "the daemon stopped answering (worker ") ||
                strstr(all, "the daemon went away (worker "));
    if (sig == SIGKILL)
        assert_null(strstr(all, "shutting down"));
    assert_true(strstr(all, "(TIMEOUT))") || strstr(all, "(UNREACHABLE))") ||
                strstr(all, "(DRAINING))"));
    assert_null(strstr(all, "verified:"));
    /* The timeout (2 s) and the workers' exit; generous for a loaded host. */
    assert_true(took < 15000);
    RNH_PASS(d);
}

static void test_bench_stops_when_the_daemon_dies(void **state)
{
    bench_outlived(*state, SIGKILL);
}

static void test_bench_stops_when_the_daemon_drains(void **state)
{
    bench_outlived(*state, SIGTERM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ctl, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bench_stops_when_the_daemon_dies, rnh_setup,
                                        rnh_teardown),
        cmocka_unit_test_setup_teardown(test_bench_stops_when_the_daemon_drains, rnh_setup,
                                        rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
