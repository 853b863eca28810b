/* SPDX-License-Identifier: MIT */
/*
 * test_fork - libclient in a fork child, in a program of its own: whether
 * nanomsg can run in a child depends on every nanomsg socket the parent had
 * open at the fork, libclient's and any other (a test suite's raw protocol
 * sockets, left open by a test that failed before its cleanup, made the
 * child's connect wait for good where only libclient's count said none).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"

/* A child forked while its parent had a client open cannot run nanomsg (its
 * worker thread is the parent's): rn_connect there fails at once with
 * RN_UNSUPPORTED and says why (it waited for that thread for good, and so
 * did the close after the timeout); a child forked once the parent's
 * clients are closed connects and is served. */
static int fork_connect(const rnh_daemon *d, char *why, size_t len)
{
    int fds[2], status = 0;
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        alarm(20); /* (a hang ends here) */
        rn_client *k = rnh_client_path(d, RN_PATH_FAST);
        int rv = k ? 0 : 1;
        const char *m = k ? "" : rn_last_error(NULL);
        if (k && rn_ping(k, NULL) != 0)
            rv = 2, m = rn_last_error(k);
        (void)!write(fds[1], m, strlen(m) + 1);
        if (k)
            rn_close(k);
        _exit(rv);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], why, len - 1);
    why[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status))
        fail_msg("the fork child did not exit (signal %d): it hung", WTERMSIG(status));
    return WEXITSTATUS(status);
}

static void test_connect_in_fork_child(void **state)
{
    rnh_daemon *d = *state;
    char why[512];

    assert_int_equal(rnh_start(d), 0);
    rn_client *c = rnh_client_path(d, RN_PATH_FAST);
    assert_non_null(c);
    assert_int_equal(rn_ping(c, NULL), 0);
    int64_t t0 = rnh_now_ms();
    assert_int_equal(fork_connect(d, why, sizeof why), 1);
    assert_true(rnh_now_ms() - t0 < 5000);
    if (!strstr(why, "forked from one with an rmsnormd client open"))
        fail_msg("the child's connect: %s", why);
    assert_int_equal(rn_ping(c, NULL), 0); /* (the parent's goes on) */
    rn_close(c);
    assert_int_equal(fork_connect(d, why, sizeof why), 0);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connect_in_fork_child, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
