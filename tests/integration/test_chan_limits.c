/* SPDX-License-Identifier: MIT */
/*
 * test_chan_limits.c - the session channel of a daemon out of descriptors
 * (its RLIMIT_NOFILE lowered from here, with prlimit, to just above the
 * descriptors it holds):
 *   - a connection it cannot accept stays in the backlog and its socket
 *     reads ready at every turn of the loop: the listener rests until the
 *     next tick instead of spinning (it used a whole CPU and wrote a million
 *     log lines in 3 s, found in review);
 *   - a message whose descriptors the kernel could not install in the
 *     daemon (MSG_CTRUNC with fewer than the buffer holds) is answered
 *     RN_BUSY naming the cause, not RN_TOO_BIG's "more than 16";
 *   - once descriptors are back, the connection that waited is served.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include "rn_test.h"
#include "integration/harness.h"
#include "integration/rawchan.h"

/* The k-th lowest descriptor number pid does not use (k from 1): the
 * kernel hands out the lowest free one, so a limit of that leaves pid k - 1
 * more; -1 on error. */
static int kth_free_fd(pid_t pid, int k)
{
    enum { MAXFD = 4096 };
    static unsigned char used[MAXFD];
    char path[64];
    DIR *dd;

    memset(used, 0, sizeof used);
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    if (!(dd = opendir(path)))
        return -1;
    for (struct dirent *de; (de = readdir(dd)) != NULL;)
        if (de->d_name[0] != '.' && atoi(de->d_name) < MAXFD)
            used[atoi(de->d_name)] = 1;
    closedir(dd);
    for (int fd = 0; fd < MAXFD; fd++)
        if (!used[fd] && --k == 0)
            return fd;
    return -1;
}

/* A one-byte datagram (shorter than the header): a connection the daemon
 * accepted answers RN_MALFORMED.  Returns 1 when answered within ms, 0 when
 * not (not accepted), -1 on another answer. */
static int answered(int c, int ms)
{
    struct pollfd p = {.fd = c, .events = POLLIN};
    char msg[RNP_CHAN_ERROR_MSG + 1];

    if (rnr_chan_send(c, "x", 1, NULL, 0) != 0)
        return -1;
    if (poll(&p, 1, ms) != 1)
        return 0;
    return rnr_chan_recv(c, NULL, NULL, msg, sizeof msg) == RN_MALFORMED ? 1 : -1;
}

static void test_out_of_descriptors(void **state)
{
    rnh_daemon *d = *state;
    enum { MAXC = 32 };
    char msg[RNP_CHAN_ERROR_MSG + 1];
    int conns[MAXC], nc = 0, late = -1, top;
    struct rlimit old, low;

    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, NULL, &old), 0);
    /* a: accepted while there is room. */
    int a = rnr_chan_connect(d->endpoint);
    assert_true(a >= 0);
    assert_int_equal(answered(a, 10000), 1);
    /* Room for two more descriptors. */
    assert_true((top = kth_free_fd(d->pid, 3)) > 0);
    low.rlim_cur = (rlim_t)top;
    low.rlim_max = old.rlim_max;
    assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &low, NULL), 0);
    /* Connections until one is not accepted: it waits in the backlog. */
    while (nc < MAXC) {
        int c = rnr_chan_connect(d->endpoint);
        assert_true(c >= 0);
        int r = answered(c, 1500);
        assert_true(r >= 0);
        if (r == 0) {
            late = c;
            break;
        }
        conns[nc++] = c;
    }
    if (late < 0)
        fail_msg("%d connections accepted under a limit of %d descriptors", nc, (int)low.rlim_cur);

    /* The listener rests: over a second the daemon uses a fraction of a
     * CPU (spinning, it used all of one), and logs a line a second at most. */
    long t0 = rnh_cpu_ticks(d->pid);
    int lines0 = rnh_log_count(d, "Failed to accept on the session channel");
    sleep(1);
    long t1 = rnh_cpu_ticks(d->pid);
    int lines1 = rnh_log_count(d, "Failed to accept on the session channel");
    long hz = sysconf(_SC_CLK_TCK);
    printf("out of descriptors: %ld of %ld ticks in a second, %d lines logged\n", t1 - t0, hz,
           lines1);
    assert_true(t0 >= 0 && t1 >= 0);
    if (t1 - t0 > hz / 5)
        fail_msg("the daemon used %ld of %ld CPU ticks in a second at the limit", t1 - t0, hz);
    assert_true(lines0 >= 1);
    assert_true(lines1 - lines0 <= 3);

    /* A descriptor for a daemon that cannot take it: RN_BUSY, saying why. */
    int mfd = memfd_create("rn-it-nofile", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(rnr_chan_send(a, "x", 1, &mfd, 1), 0);
    close(mfd);
    assert_int_equal(rnr_chan_recv(a, NULL, NULL, msg, sizeof msg), RN_BUSY);
    if (!strstr(msg, "out of descriptors"))
        fail_msg("the dropped descriptors' error: \"%s\"", msg);

    /* Descriptors back: the connection that waited is accepted at the next
     * tick and served. */
    assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &old, NULL), 0);
    char m2[RNP_CHAN_ERROR_MSG + 1];
    assert_int_equal(rnr_chan_recv(late, NULL, NULL, m2, sizeof m2), RN_MALFORMED);
    /* ... and a descriptor is taken again (answered for what the message is). */
    mfd = memfd_create("rn-it-nofile", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(rnr_chan_send(a, "x", 1, &mfd, 1), 0);
    close(mfd);
    assert_int_equal(rnr_chan_recv(a, NULL, NULL, msg, sizeof msg), RN_MALFORMED);

    close(late);
    close(a);
    for (int i = 0; i < nc; i++)
        close(conns[i]);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_out_of_descriptors, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
