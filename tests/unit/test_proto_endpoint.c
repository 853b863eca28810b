/* SPDX-License-Identifier: MIT */
/*
 * test_proto_endpoint.c - rnp_default_endpoint under every environment the
 * daemon and libclient meet (systemd's RUNTIME_DIRECTORY with one or several
 * entries, XDG_RUNTIME_DIR, neither), and rnp_check_endpoint's answers with
 * their exact messages (the daemon's tests and users read them).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn_proto.h"
#include "rn_test.h"

/* Every test starts from an environment without the variables read here
 * (and with libclient's override set, which must make no difference). */
static int clean_env(void **state)
{
    (void)state;
    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("XDG_RUNTIME_DIR");
    setenv("RMSNORMD_ENDPOINT", "ipc:///must/not/be/used.sock", 1);
    return 0;
}

/* The default endpoint in a 256-byte buffer; fails the test on an error. */
static const char *default_ep(void)
{
    static char buf[256];
    rnp_error err = { 0 };
    if (rnp_default_endpoint(buf, sizeof buf, &err) != 0)
        fail_msg("rnp_default_endpoint: %s", err.msg);
    return buf;
}

static void test_runtime_directory(void **state)
{
    (void)state;
    setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
    setenv("RUNTIME_DIRECTORY", "/run/rmsnormd", 1);
    assert_string_equal(default_ep(), "ipc:///run/rmsnormd/rmsnormd.sock");
    /* Several RuntimeDirectory= entries: the first is the unit's own. */
    setenv("RUNTIME_DIRECTORY", "/run/rmsnormd/0:/run/rmsnormd-extra", 1);
    assert_string_equal(default_ep(), "ipc:///run/rmsnormd/0/rmsnormd.sock");
    setenv("RUNTIME_DIRECTORY", "/run/a:", 1);
    assert_string_equal(default_ep(), "ipc:///run/a/rmsnormd.sock");
}

static void test_xdg_runtime_dir(void **state)
{
    (void)state;
    setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
    assert_string_equal(default_ep(), "ipc:///run/user/1000/rmsnormd.sock");
    /* An empty RUNTIME_DIRECTORY, or one whose first entry is empty, names
     * no directory. */
    setenv("RUNTIME_DIRECTORY", "", 1);
    assert_string_equal(default_ep(), "ipc:///run/user/1000/rmsnormd.sock");
    setenv("RUNTIME_DIRECTORY", ":/run/b", 1);
    assert_string_equal(default_ep(), "ipc:///run/user/1000/rmsnormd.sock");
    /* XDG_RUNTIME_DIR is taken whole: ':' has no meaning there. */
    unsetenv("RUNTIME_DIRECTORY");
    setenv("XDG_RUNTIME_DIR", "/run/a:b", 1);
    assert_string_equal(default_ep(), "ipc:///run/a:b/rmsnormd.sock");
}

static void test_tmp_fallback(void **state)
{
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "ipc:///tmp/rmsnormd-%u.sock", (unsigned)getuid());
    assert_string_equal(default_ep(), want);
    setenv("XDG_RUNTIME_DIR", "", 1);
    setenv("RUNTIME_DIRECTORY", ":", 1);
    assert_string_equal(default_ep(), want);
}

/* A buffer of exactly the length plus NUL fits; one byte less is
 * RN_ENDPOINT and leaves the buffer as it was. */
static void test_buffer_size(void **state)
{
    (void)state;
    static const char want[] = "ipc:///run/rmsnormd/rmsnormd.sock";
    char buf[sizeof want];
    rnp_error err = { 0 };
    setenv("RUNTIME_DIRECTORY", "/run/rmsnormd", 1);
    assert_int_equal(rnp_default_endpoint(buf, sizeof want, &err), 0);
    assert_string_equal(buf, want);
    memset(buf, 'z', sizeof buf);
    assert_int_equal(rnp_default_endpoint(buf, sizeof want - 1, &err), RN_ENDPOINT);
    assert_int_equal(err.code, RN_ENDPOINT);
    assert_non_null(strstr(err.msg, "endpoint: "));
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], 'z');
    assert_int_equal(rnp_default_endpoint(buf, 0, &err), RN_ENDPOINT);
    assert_int_equal(rnp_default_endpoint(NULL, 64, &err), RN_ENDPOINT);
    assert_int_equal(rnp_default_endpoint(buf, 1, NULL), RN_ENDPOINT);
}

static void expect_bad(const char *ep, const char *msg)
{
    rnp_error err = { 0 };
    const char *path = (const char *)&err; /* must stay untouched */
    assert_int_equal(rnp_check_endpoint(ep, &path, &err), RN_ENDPOINT);
    assert_int_equal(err.code, RN_ENDPOINT);
    assert_string_equal(err.msg, msg);
    assert_ptr_equal(path, (const char *)&err);
}

static void test_check_endpoint(void **state)
{
    (void)state;
    rnp_error err = { 0 };
    const char *path = NULL;
    static const char ok[] = "ipc:///run/rmsnormd/rmsnormd.sock";
    assert_int_equal(rnp_check_endpoint(ok, &path, &err), 0);
    assert_ptr_equal(path, ok + 6);
    assert_int_equal(rnp_check_endpoint(ok, NULL, &err), 0);
    expect_bad("tcp://127.0.0.1:5555",
               "endpoint 'tcp://127.0.0.1:5555': only ipc:// endpoints are supported");
    expect_bad("/run/rmsnormd.sock",
               "endpoint '/run/rmsnormd.sock': only ipc:// endpoints are supported (a socket's "
               "path is written ipc:///path)");
    expect_bad("", "endpoint '': only ipc:// endpoints are supported");
    expect_bad("ipc://", "endpoint 'ipc://': the socket path is empty");
    assert_int_equal(rnp_check_endpoint(NULL, &path, &err), RN_ENDPOINT);
    assert_int_equal(rnp_check_endpoint(NULL, NULL, NULL), RN_ENDPOINT);
}

/* The longest socket path is RNP_SUN_PATH_MAX - 1 bytes; one more is refused
 * with the length in the message, ahead of the endpoint so that it
 * survives the cut at RNP_MAX_ERRMSG. */
static void test_path_length(void **state)
{
    (void)state;
    char ep[6 + RNP_SUN_PATH_MAX + 1], msg[2 * RNP_MAX_ERRMSG];
    rnp_error err = { 0 };
    const char *path = NULL;
    memcpy(ep, "ipc://", 6);
    memset(ep + 6, 'a', RNP_SUN_PATH_MAX);
    ep[6] = '/';
    ep[6 + RNP_SUN_PATH_MAX - 1] = '\0';
    assert_int_equal(rnp_check_endpoint(ep, &path, &err), 0);
    assert_int_equal(strlen(path), RNP_SUN_PATH_MAX - 1);
    ep[6 + RNP_SUN_PATH_MAX - 1] = 'a';
    ep[6 + RNP_SUN_PATH_MAX] = '\0';
    snprintf(msg, sizeof msg,
             "endpoint: the socket path is 108 bytes; a Unix socket path must be shorter than "
             "108 ('%.80s...')",
             ep);
    expect_bad(ep, msg);
}

/* A default endpoint can be too long for a socket: the check, not the
 * default, says so. */
static void test_default_then_check(void **state)
{
    (void)state;
    char dir[RNP_SUN_PATH_MAX + 1];
    rnp_error err = { 0 };
    memset(dir, 'd', sizeof dir - 1);
    dir[0] = '/';
    dir[sizeof dir - 1] = '\0';
    setenv("XDG_RUNTIME_DIR", dir, 1);
    const char *ep = default_ep();
    assert_int_equal(strlen(ep), 6 + RNP_SUN_PATH_MAX + strlen("/rmsnormd.sock"));
    assert_int_equal(rnp_check_endpoint(ep, NULL, &err), RN_ENDPOINT);
    assert_non_null(strstr(err.msg, "the socket path is 122 bytes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_runtime_directory, clean_env),
        cmocka_unit_test_setup(test_xdg_runtime_dir, clean_env),
        cmocka_unit_test_setup(test_tmp_fallback, clean_env),
        cmocka_unit_test_setup(test_buffer_size, clean_env),
        cmocka_unit_test_setup(test_check_endpoint, clean_env),
        cmocka_unit_test_setup(test_path_length, clean_env),
        cmocka_unit_test_setup(test_default_then_check, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
