/* SPDX-License-Identifier: MIT */
/*
 * test_daemon_config.c - rmsnormd's settings: defaults, the configuration
 * file, flags winning over it, error messages that name the setting, the
 * default endpoint from the environment and the Unix socket path limit.
 * The daemon's sources are compiled in directly (the unit suite does not
 * link the daemon's objects).
 */
#include "rn_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../daemon/config.c"
#include "../../daemon/log.c"

static char tmpdir[64];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/rnd-config-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("XDG_RUNTIME_DIR");
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static const char *write_file(const char *name, const char *text)
{
    static char path[128];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Run rnd_config_load on a NULL-terminated list of arguments. */
static int load(rnd_config *cfg, int *action, char *err, const char *default_file, ...)
{
    char *argv[32] = {"rmsnormd"};
    int argc = 1;
    va_list ap;
    va_start(ap, default_file);
    for (const char *a; (a = va_arg(ap, const char *)) && argc < 31;)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    rnp_error e = {0};
    int rc = rnd_config_load(cfg, argc, argv, default_file, action, &e);
    snprintf(err, RNP_MAX_ERRMSG, "%s", e.msg);
    return rc == 0 ? 0 : -1;
}

static void test_defaults(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG] = "";
    int action = -1;
    char missing[128];

    /* The default file is skipped silently when it does not exist. */
    snprintf(missing, sizeof missing, "%s/absent.conf", tmpdir);
    assert_int_equal(load(&c, &action, err, missing, NULL), 0);
    assert_int_equal(action, RND_RUN);
    assert_int_equal(c.backend, RND_BACKEND_AUTO);
    assert_string_equal(c.device, "0");
    assert_int_equal(c.socket_mode, 0660);
    assert_string_equal(c.socket_group, "");
    assert_int_equal(c.max_sessions, 64);
    assert_int_equal(c.max_regions, 4096);
    assert_int_equal(c.max_inflight, 64);
    assert_int_equal(c.max_inflight_total, 1024);
    assert_int_equal(c.max_graphs, 4096);
    assert_int_equal(c.max_m, 16777216);
    assert_int_equal(c.max_n, 262144);
    assert_int_equal(c.idle_timeout, 600);
    assert_int_equal(c.threads, 0);
    assert_int_equal(c.log_level, RND_LOG_INFO);
    assert_string_equal(c.config_path, "");
    assert_false(c.log_level_from_flag);
    assert_true(c.cuda_fast_path);   /* offered where the device can */
}

/* --cuda-fast-path: a switch on the command line, yes or no in the file,
 * on by default. */
static void test_cuda_fast_path(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG] = "";
    int action;
    char on[128], off[128], bad[128];   /* write_file's path is one static buffer */

    snprintf(on, sizeof on, "%s", write_file("on.conf", "cuda-fast-path = yes\n"));
    snprintf(off, sizeof off, "%s", write_file("off.conf", "cuda_fast_path = no\n"));
    snprintf(bad, sizeof bad, "%s", write_file("bad.conf", "cuda-fast-path = maybe\n"));

    (void)state;
    assert_int_equal(load(&c, &action, err, NULL, "--cuda-fast-path=no", NULL), 0);
    assert_false(c.cuda_fast_path);
    assert_int_equal(load(&c, &action, err, NULL, "--cuda-fast-path", NULL), 0);
    assert_true(c.cuda_fast_path);
    assert_int_equal(load(&c, &action, err, NULL, "--config", on, NULL), 0);
    assert_true(c.cuda_fast_path);
    assert_int_equal(load(&c, &action, err, NULL, "--config", off, NULL), 0);
    assert_false(c.cuda_fast_path);
    assert_int_equal(load(&c, &action, err, NULL, "--config", off, "--cuda-fast-path", NULL), 0);
    assert_true(c.cuda_fast_path);   /* the flag wins */
    assert_int_equal(load(&c, &action, err, NULL, "--config", bad, NULL), -1);
    assert_non_null(strstr(err, "cuda-fast-path"));
}

/* --ring-ready: auto by default (the backend picks), gpu, host or armed;
 * anything else is refused with the setting named and the choices. */
static void test_ring_ready(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG] = "";
    int action;
    char host[128];

    snprintf(host, sizeof host, "%s", write_file("host.conf", "ring_ready = host\n"));
    (void)state;
    assert_int_equal(load(&c, &action, err, NULL, NULL), 0);
    assert_int_equal(c.ring_ready, RND_RING_READY_AUTO);
    assert_int_equal(load(&c, &action, err, NULL, "--ring-ready=gpu", NULL), 0);
    assert_int_equal(c.ring_ready, RND_RING_READY_GPU);
    assert_int_equal(load(&c, &action, err, NULL, "--ring-ready", "host", NULL), 0);
    assert_int_equal(c.ring_ready, RND_RING_READY_HOST);
    assert_int_equal(load(&c, &action, err, NULL, "--config", host, NULL), 0);
    assert_int_equal(c.ring_ready, RND_RING_READY_HOST);
    assert_int_equal(load(&c, &action, err, NULL, "--config", host, "--ring-ready=auto", NULL),
                     0);
    assert_int_equal(c.ring_ready, RND_RING_READY_AUTO);   /* the flag wins */
    assert_int_equal(load(&c, &action, err, NULL, "--ring-ready=armed", NULL), 0);
    assert_int_equal(c.ring_ready, RND_RING_READY_ARMED);
    assert_int_equal(load(&c, &action, err, NULL, "--ring-ready=device", NULL), -1);
    assert_non_null(strstr(err, "ring-ready"));
    assert_non_null(strstr(err, "device"));
    assert_non_null(strstr(err, "host or armed"));
}

static void test_file_then_flags(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG] = "";
    int action;
    const char *path = write_file("a.conf",
                                  "# rmsnormd settings\n"
                                  "\n"
                                  "max-sessions = 10   # trailing comment\n"
                                  "max_inflight=5\n"
                                  "maxregions = 9\n"
                                  "  threads = 3\n"
                                  "backend = cpu\n"
                                  "log-level = debug\n"
                                  "socket-mode = 0640\n"
                                  "idle-timeout = 0\n");

    assert_int_equal(load(&c, &action, err, NULL, "--config", path, "--max-sessions", "20",
                          "--threads=7", NULL), 0);
    assert_int_equal(c.max_sessions, 20);  /* the flag wins */
    assert_int_equal(c.threads, 7);        /* --key=value form */
    assert_int_equal(c.max_inflight, 5);   /* from the file, '_' for '-' */
    assert_int_equal(c.max_regions, 9);    /* dashes left out */
    assert_int_equal(c.backend, RND_BACKEND_CPU);
    assert_int_equal(c.log_level, RND_LOG_DEBUG);
    assert_false(c.log_level_from_flag);
    assert_int_equal(c.socket_mode, 0640);
    assert_int_equal(c.idle_timeout, 0);
    assert_string_equal(c.config_path, path);

    /* The default file is read when present and no --config is given. */
    assert_int_equal(load(&c, &action, err, path, "--log-level", "error", NULL), 0);
    assert_int_equal(c.max_sessions, 10);
    assert_int_equal(c.log_level, RND_LOG_ERROR);
    assert_true(c.log_level_from_flag);
}

static void test_errors_name_the_setting(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG];
    int action;
    char missing[128];
    const char *path;

    rnd_config_defaults(&c);
    c.max_sessions = 42;
    assert_int_equal(load(&c, &action, err, NULL, "--max-sessions", "abc", NULL), -1);
    assert_non_null(strstr(err, "max-sessions"));
    assert_non_null(strstr(err, "abc"));
    assert_int_equal(c.max_sessions, 42);  /* nothing changed on failure */

    assert_int_equal(load(&c, &action, err, NULL, "--max-sessions", "0", NULL), -1);
    assert_non_null(strstr(err, "max-sessions"));
    assert_int_equal(load(&c, &action, err, NULL, "--max-sessions", "-5", NULL), -1);
    assert_int_equal(load(&c, &action, err, NULL, "--max-m", "99999999999999999999999", NULL), -1);
    assert_non_null(strstr(err, "max-m"));
    assert_int_equal(load(&c, &action, err, NULL, "--backend", "gpu", NULL), -1);
    assert_non_null(strstr(err, "backend"));
    assert_int_equal(load(&c, &action, err, NULL, "--max-graphs", "2000000", NULL), -1);
    assert_non_null(strstr(err, "max-graphs"));
    assert_int_equal(load(&c, &action, err, NULL, "--max-graphs", "0", NULL), 0);
    assert_int_equal(c.max_graphs, 0);   /* 0: no graph slots at all */
    assert_int_equal(load(&c, &action, err, NULL, "--log-level", "loud", NULL), -1);
    assert_non_null(strstr(err, "log-level"));
    assert_int_equal(load(&c, &action, err, NULL, "--socket-mode", "999", NULL), -1);
    assert_non_null(strstr(err, "socket-mode"));
    assert_int_equal(load(&c, &action, err, NULL, "--frobnicate", NULL), -1);
    assert_non_null(strstr(err, "--frobnicate"));
    assert_int_equal(load(&c, &action, err, NULL, "--max", "3", NULL), -1);
    assert_int_equal(load(&c, &action, err, NULL, "---", NULL), -1);
    assert_int_equal(load(&c, &action, err, NULL, "--max-sessionsx", "3", NULL), -1);
    assert_non_null(strstr(err, "--max-sessionsx"));
    assert_int_equal(load(&c, &action, err, NULL, "--threads", NULL), -1);
    assert_non_null(strstr(err, "threads"));
    assert_int_equal(load(&c, &action, err, NULL, "stray", NULL), -1);
    assert_non_null(strstr(err, "stray"));
    assert_int_equal(load(&c, &action, err, NULL, "--version=1", NULL), -1);

    /* --config names a file that must exist. */
    snprintf(missing, sizeof missing, "%s/absent.conf", tmpdir);
    assert_int_equal(load(&c, &action, err, NULL, "--config", missing, NULL), -1);
    assert_non_null(strstr(err, missing));

    /* File errors carry the file and the line. */
    path = write_file("bad1.conf", "threads = 2\nmax-regions = lots\n");
    assert_int_equal(load(&c, &action, err, NULL, "--config", path, NULL), -1);
    assert_non_null(strstr(err, ":2:"));
    assert_non_null(strstr(err, "max-regions"));
    path = write_file("bad2.conf", "threads 2\n");
    assert_int_equal(load(&c, &action, err, NULL, "--config", path, NULL), -1);
    assert_non_null(strstr(err, ":1:"));
    path = write_file("bad3.conf", "colour = blue\n");
    assert_int_equal(load(&c, &action, err, NULL, "--config", path, NULL), -1);
    assert_non_null(strstr(err, "colour"));
    path = write_file("bad4.conf", "config = /etc/other.conf\n");
    assert_int_equal(load(&c, &action, err, NULL, "--config", path, NULL), -1);
    assert_non_null(strstr(err, "config"));
}

static void test_help_and_version(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG];
    int action;

    assert_int_equal(load(&c, &action, err, NULL, "--max-sessions", "3", "--help", NULL), 0);
    assert_int_equal(action, RND_SHOW_HELP);
    assert_int_equal(load(&c, &action, err, NULL, "--version", NULL), 0);
    assert_int_equal(action, RND_SHOW_VERSION);
}

static void test_endpoint_defaults(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG];
    char want[128];
    int action;

    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    setenv("RUNTIME_DIRECTORY", "/run/rmsnormd:/run/other", 1);
    assert_int_equal(load(&c, &action, err, NULL, NULL), 0);
    assert_string_equal(c.endpoint, "ipc:///run/rmsnormd/rmsnormd.sock");

    unsetenv("RUNTIME_DIRECTORY");
    assert_int_equal(load(&c, &action, err, NULL, NULL), 0);
    assert_string_equal(c.endpoint, "ipc:///run/user/1234/rmsnormd.sock");

    setenv("XDG_RUNTIME_DIR", "", 1);  /* empty counts as unset */
    assert_int_equal(load(&c, &action, err, NULL, NULL), 0);
    snprintf(want, sizeof want, "ipc:///tmp/rmsnormd-%u.sock", (unsigned)getuid());
    assert_string_equal(c.endpoint, want);
    assert_string_equal(rnd_config_ipc_path(&c), want + 6);

    /* An explicit endpoint wins over the environment. */
    setenv("RUNTIME_DIRECTORY", "/run/rmsnormd", 1);
    assert_int_equal(load(&c, &action, err, NULL, "--endpoint", "ipc:///tmp/x.sock", NULL), 0);
    assert_string_equal(c.endpoint, "ipc:///tmp/x.sock");
    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("XDG_RUNTIME_DIR");
}

static void test_endpoint_checks(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG];
    char ep[RND_ENDPOINT_MAX];
    int action;

    /* 102 path bytes, ".chan" and the NUL fill sun_path exactly: accepted
     * (the session channel's socket sits beside the nanomsg socket). */
    snprintf(ep, sizeof ep, "ipc:///%0101d", 0);
    assert_int_equal(strlen(ep + 6), 102);
    assert_int_equal(load(&c, &action, err, NULL, "--endpoint", ep, NULL), 0);

    /* 103 to 107: the nanomsg socket would fit, its channel would not. */
    for (int len = 103; len <= 107; len++) {
        snprintf(ep, sizeof ep, "ipc:///%0*d", len - 1, 0);
        assert_int_equal(strlen(ep + 6), (size_t)len);
        assert_int_equal(load(&c, &action, err, NULL, "--endpoint", ep, NULL), -1);
        assert_non_null(strstr(err, "socket path"));
        assert_non_null(strstr(err, ".chan"));
        assert_non_null(strstr(err, "103"));
    }

    /* 108 and the 108-121 range nanomsg would abort on: refused, clearly. */
    for (int len = 108; len <= 125; len++) {
        snprintf(ep, sizeof ep, "ipc:///%0*d", len - 1, 0);
        assert_int_equal(strlen(ep + 6), (size_t)len);
        assert_int_equal(load(&c, &action, err, NULL, "--endpoint", ep, NULL), -1);
        assert_non_null(strstr(err, "socket path"));
        assert_non_null(strstr(err, "108"));
    }

    assert_int_equal(load(&c, &action, err, NULL, "--endpoint", "tcp://127.0.0.1:5555", NULL), -1);
    assert_non_null(strstr(err, "ipc://"));
    assert_int_equal(load(&c, &action, err, NULL, "--endpoint", "ipc://", NULL), -1);
    assert_non_null(strstr(err, "empty"));

    /* The same check applies to a default built from a long directory. */
    char dir[160];
    snprintf(dir, sizeof dir, "/%0120d", 0);
    setenv("RUNTIME_DIRECTORY", dir, 1);
    assert_int_equal(load(&c, &action, err, NULL, NULL), -1);
    assert_non_null(strstr(err, "socket path"));
    unsetenv("RUNTIME_DIRECTORY");
}

static void test_reread_log_level(void **state)
{
    rnp_error err = {0};
    int level = RND_LOG_INFO;
    const char *path;

    path = write_file("hup.conf", "threads = 2\nlog-level = warning\n");
    assert_int_equal(rnd_config_reread_log_level(path, &level, &err), 0);
    assert_int_equal(level, RND_LOG_WARNING);

    path = write_file("hup2.conf", "threads = 2\n");
    assert_int_equal(rnd_config_reread_log_level(path, &level, &err), 0);
    assert_int_equal(level, RND_LOG_WARNING);  /* not set: unchanged */

    path = write_file("hup3.conf", "log-level = shouting\n");
    assert_int_equal(rnd_config_reread_log_level(path, &level, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(level, RND_LOG_WARNING);
    assert_non_null(strstr(err.msg, "log-level"));
}

static void test_limits_consistent(void **state)
{
    rnd_config c;
    char err[RNP_MAX_ERRMSG];
    int action;

    /* A per-session limit above the total is capped to it. */
    assert_int_equal(load(&c, &action, err, NULL, "--max-inflight", "500", "--max-inflight-total",
                          "100", NULL), 0);
    assert_int_equal(c.max_inflight, 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_then_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_fast_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ring_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_name_the_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_and_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reread_log_level, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_consistent, setup, teardown),
    };
    return cmocka_run_group_tests_name("daemon config", tests, NULL, NULL);
}
