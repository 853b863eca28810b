/* SPDX-License-Identifier: MIT */
/*
 * test_client_failure - libclient when the daemon fails or cannot be
 * trusted: a daemon killed during in-place calls, a stopped daemon, a daemon
 * at its session limit, a socket that a stranger planted, and the
 * permissions of buffers shared with a daemon of another user.
 *
 * The ownership tests chown sockets to other uids, so they need root; as
 * another user they are skipped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "integration/harness.h"
#include "rn_test.h"

#define STRANGER 65534 /* nobody */
#define GROUP    12345 /* a group no one is in */

static char out[8192];

/* rmsnormctl with args; its stdout in out. */
static int ctl(const char *const *args)
{
    return rnh_run_ctl(args, out, sizeof out, 30000);
}

static const char *sock_path(const rnh_daemon *d)
{
    return d->endpoint + strlen("ipc://");
}

/* ---- 1: a daemon killed during in-place calls ------------------------------------------ */

/*
 * The daemon (one worker thread, so a call takes long and writes its rows
 * in order) is killed while it is writing dx over dy: the test watches the
 * worker's buffer and kills once the first row of dy has changed but the
 * last has not.  The call that was cut must come back RN_RESTARTED, never
 * 0 (the old library re-ran it in a new session on the half-written dy and
 * returned 0 with wrong dx and dw); every call that returns 0 is checked
 * bitwise by the worker.
 */
static void test_inplace_kill_restart(void **state)
{
    enum { CYCLES = 3, PROBE = 64 };
    rnh_daemon *d = *state;
    rnh_proc w;
    char line[600], name[300];
    size_t off, rowb;
    long long m;
    unsigned char first[PROBE], last[PROBE];

    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    const char *argv[] = {"prog_inplace", "--endpoint", d->endpoint, NULL};
    assert_int_equal(rnh_spawn("prog_inplace", argv, false, &w), 0);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_int_equal(sscanf(line, "ready %299s %zu %zu %lld", name, &off, &rowb, &m), 4);

    int fd = open(name, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    const unsigned char *buf = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(buf != MAP_FAILED);
    close(fd);
    const unsigned char *row0 = buf + off, *rowm = buf + off + (size_t)(m - 1) * rowb;
    /* The worker printed "ready" with its inputs in place. */
    memcpy(first, row0, PROBE);
    memcpy(last, rowm, PROBE);

    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "ok");
    for (int cycle = 0; cycle < CYCLES; cycle++) {
        int64_t deadline = rnh_now_ms() + 60000;
        /* Wait for a call to be half-way through writing dy. */
        while (!(memcmp(row0, first, PROBE) != 0 && memcmp(rowm, last, PROBE) == 0)) {
            assert_true(rnh_now_ms() < deadline);
            sched_yield();
        }
        kill(d->pid, SIGKILL);
        assert_int_equal(rnh_wait_exit(d, 10000), 128 + SIGKILL);
        assert_int_equal(rnh_start(d), 0);
        assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "cut");
        /* The next call runs in a new session on the new daemon. */
        assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
        assert_string_equal(line, "ok");
    }
    close(w.in_fd);
    w.in_fd = -1;
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_non_null(strstr(line, "cut=3 wrong=0 errors=0"));
    assert_int_equal(rnh_wait(&w, 30000), 0);
    rnh_proc_close(&w);
    munmap((void *)buf, (size_t)st.st_size);
    RNH_PASS(d);
}

/* ---- 4: a stopped daemon ---------------------------------------------------------------- */

enum { STOPPED_CALLS = 24, STOPPED_TIMEOUT_MS = 300 };

typedef struct stopped_run {
    const char *endpoint;
    int rv[STOPPED_CALLS];
    int64_t ms[STOPPED_CALLS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} stopped_run;

static void *connect_many(void *arg)
{
    stopped_run *r = arg;
    for (int i = 0; i < STOPPED_CALLS; i++) {
        rn_connect_opts o = {.endpoint = r->endpoint, .timeout_ms = STOPPED_TIMEOUT_MS};
        rn_client *c = NULL;
        int64_t t0 = rnh_now_ms();
        r->rv[i] = rn_connect(&o, &c);
        r->ms[i] = rnh_now_ms() - t0;
        rn_close(c);
    }
    pthread_mutex_lock(&r->mu);
    r->done = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/*
 * A stopped daemon accepts no connections; once its listen backlog is full,
 * a connect() waits for it.  Every rn_connect must still come back within
 * about its timeout (the old library blocked forever from the 5th call on),
 * and the daemon serves again once continued.  The calls run in a thread so
 * that a call that blocks fails the test instead of hanging it.
 */
static void test_stopped_daemon(void **state)
{
    rnh_daemon *d = *state;
    stopped_run r = {.endpoint = d->endpoint};
    pthread_t t;
    struct timespec until;
    uint64_t rtt;
    bool done;

    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    assert_int_equal(rnh_start(d), 0);
    assert_int_equal(rnh_sigstop(d), 0);
    assert_int_equal(pthread_create(&t, NULL, connect_many, &r), 0);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += STOPPED_CALLS * (3 * STOPPED_TIMEOUT_MS + 2000) / 1000 + 5;
    pthread_mutex_lock(&r.mu);
    while (!r.done && pthread_cond_timedwait(&r.cv, &r.mu, &until) == 0)
        ;
    done = r.done;
    pthread_mutex_unlock(&r.mu);
    kill(d->pid, SIGCONT);
    if (!done)
        fail_msg("rn_connect to a stopped daemon did not return");
    pthread_join(t, NULL);
    for (int i = 0; i < STOPPED_CALLS; i++) {
        if (r.rv[i] != RN_TIMEOUT && r.rv[i] != RN_UNREACHABLE)
            fail_msg("call %d: %s", i, rn_err_name(r.rv[i]));
        /* "About" the timeout: three times it and two seconds of slack for
         * a loaded machine (a call that waits for good never returns). */
        if (r.ms[i] > 3 * STOPPED_TIMEOUT_MS + 2000)
            fail_msg("call %d took %lld ms with a timeout of %d ms", i, (long long)r.ms[i],
                     STOPPED_TIMEOUT_MS);
    }
    /* Continued, the daemon answers again. */
    rn_client *c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_ping(c, &rtt), 0);
    rn_close(c);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    RNH_PASS(d);
}

/* ---- 15: observation at the session limit ------------------------------------------------- */

/*
 * HEALTH, STATS and PING need no session: at the daemon's session limit
 * rmsnormctl health reports the health (degraded: the limit is reached)
 * instead of "cannot reach", and a second client can ask while one holds
 * the only session.  Calls that need a session are refused with RN_BUSY.
 */
static void test_observe_at_session_limit(void **state)
{
    rnh_daemon *d = *state;
    rn_client *holder, *c;
    struct rn_server_info si;
    rn_health_info h;
    rn_stats_info *s = calloc(1, sizeof *s);
    uint64_t rtt;
    void *p;

    assert_non_null(s);
    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    holder = rnh_client(d);
    assert_non_null(holder);
    assert_int_equal(rn_server_info(holder, &si), 0); /* opens the one session */
    assert_int_equal(si.max_sessions, 1);

    assert_int_equal(ctl((const char *[]){"--endpoint", d->endpoint, "health", NULL}), 1);
    assert_non_null(strstr(out, "degraded"));
    assert_non_null(strstr(out, "sessions"));
    assert_int_equal(ctl((const char *[]){"--endpoint", d->endpoint, "stats", NULL}), 0);
    assert_int_equal(ctl((const char *[]){"--endpoint", d->endpoint, "ping", "-c", "3", NULL}), 0);

    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_DEGRADED);
    assert_int_equal(rn_ping(c, &rtt), 0);
    assert_int_equal(rn_stats(c, s), 0);
    assert_int_equal(rn_stats_get(s, "sessions.active", 99), 1);
    assert_int_equal(rn_server_info(c, &si), RN_BUSY);
    assert_int_equal(rn_buffer_alloc(c, 4096, &p), RN_BUSY);
    /* Once the session is free, the same client opens one when it needs it. */
    rn_close(holder);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, 10000), 0);
    assert_int_equal(rn_buffer_alloc(c, 4096, &p), 0);
    assert_int_equal(rn_buffer_free(c, p), 0);
    rn_close(c);
    free(s);
    RNH_PASS(d);
}

/* ---- 9: whose socket, whose buffers ---------------------------------------------------- */

static int connect_to(const char *endpoint, rn_client **c)
{
    rn_connect_opts o = {.endpoint = endpoint, .timeout_ms = 2000};
    *c = NULL;
    return rn_connect(&o, c);
}

/*
 * In a directory anyone may write to (/tmp, where the fallback endpoint
 * lies) a socket counts only when it is the caller's or root's: anyone could
 * have created it before the daemon.  The harness's directory is made
 * world-writable (sticky, as /tmp is, and then not) to stand for /tmp.
 */
static void test_endpoint_owner(void **state)
{
    rnh_daemon *d = *state;
    char file[300], planted[300];
    rn_client *c;

    if (geteuid() != 0)
        RN_SKIP("chowning sockets to another uid needs root");
    assert_int_equal(rnh_start(d), 0);
    const char *path = sock_path(d);

    /* A sticky world-writable directory, the socket root's: fine. */
    assert_int_equal(chmod(d->dir, 01777), 0);
    assert_int_equal(connect_to(d->endpoint, &c), 0);
    rn_close(c);

    /* The socket of a stranger there: refused, naming path and owner. */
    assert_int_equal(chown(path, STRANGER, STRANGER), 0);
    assert_int_equal(connect_to(d->endpoint, &c), RN_ENDPOINT);
    assert_null(c);
    assert_non_null(strstr(rn_last_error(NULL), path));
    assert_non_null(strstr(rn_last_error(NULL), "uid 65534"));
    assert_int_equal(chown(path, 0, 0), 0);

    /* A world-writable directory that is not sticky: anyone can replace
     * even the caller's own socket. */
    assert_int_equal(chmod(d->dir, 0777), 0);
    assert_int_equal(connect_to(d->endpoint, &c), RN_ENDPOINT);
    assert_non_null(strstr(rn_last_error(NULL), "not sticky"));
    assert_int_equal(chmod(d->dir, 01777), 0);

    /* Not a socket at all. */
    snprintf(planted, sizeof planted, "ipc://%s/planted.sock", d->dir);
    snprintf(file, sizeof file, "%s/planted.sock", d->dir);
    int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(connect_to(planted, &c), RN_ENDPOINT);
    assert_non_null(strstr(rn_last_error(NULL), "not a socket"));
    unlink(file);

    /* Outside a world-writable directory the directory's own permissions
     * decide who could have made the socket: another owner is fine there
     * (a system service's socket belongs to the service). */
    assert_int_equal(chmod(d->dir, 0700), 0);
    assert_int_equal(chown(path, STRANGER, STRANGER), 0);
    assert_int_equal(connect_to(d->endpoint, &c), 0);
    rn_close(c);
    RNH_PASS(d);
}

/* Mode and group of the one shm buffer of process pid; -1 if none. */
static int shm_of(pid_t pid, struct stat *st)
{
    char prefix[64], p[320];
    struct dirent *de;
    DIR *dd = opendir("/dev/shm");
    int rv = -1;

    snprintf(prefix, sizeof prefix, "rmsnormd.%d.", (int)pid);
    assert_non_null(dd);
    while ((de = readdir(dd)) != NULL)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(p, sizeof p, "/dev/shm/%s", de->d_name);
            rv = stat(p, st);
        }
    closedir(dd);
    return rv;
}

/*
 * A buffer is never widened to a group: it stays 0600 and reaches the daemon
 * as a descriptor on the session channel, and its name is gone once the
 * daemon has it.  So a stranger's socket (here: root's daemon with its
 * socket chowned to nobody and a group of nobody's) learns no group to read
 * it with, and a worker of another user (nobody, in the socket's group)
 * connecting to root's socket shares its buffer with the daemon alone.
 */
static void test_buffer_mode(void **state)
{
    rnh_daemon *d = *state;
    rn_client *c;
    struct stat st;
    char line[200], gid[32];
    rnh_proc w;
    void *p;

    if (geteuid() != 0)
        RN_SKIP("chowning sockets to another uid needs root");
    assert_int_equal(rnh_start(d), 0);
    const char *path = sock_path(d);

    assert_int_equal(chown(path, STRANGER, GROUP), 0);
    assert_int_equal(connect_to(d->endpoint, &c), 0);
    assert_int_equal(rn_buffer_alloc(c, 4096, &p), 0);
    assert_int_equal(shm_of(getpid(), &st), -1);
    assert_int_equal(rn_buffer_free(c, p), 0);
    rn_close(c);

    /* root's socket, group GROUP, reachable by a worker running as nobody
     * with GROUP as a supplementary group. */
    assert_int_equal(chown(path, 0, GROUP), 0);
    {
        char chan[300];
        snprintf(chan, sizeof chan, "%s.chan", path);
        assert_int_equal(chown(chan, 0, GROUP), 0);
    }
    assert_int_equal(chmod(d->dir, 0755), 0);
    snprintf(gid, sizeof gid, "%d", GROUP);
    const char *argv[] = {"setpriv",   "--reuid=65534", "--regid=65534", "--groups", gid,
                          "--",        NULL,            "--endpoint",    d->endpoint, "-r",
                          "1",         "--wait-go",     NULL};
    char worker[512];
    snprintf(worker, sizeof worker, "%s/tests/integration/prog_worker", rnh_build_dir());
    argv[6] = worker;
    if (access("/usr/bin/setpriv", X_OK) != 0)
        RN_SKIP("no /usr/bin/setpriv to run a worker as another user");
    assert_int_equal(rnh_spawn("/usr/bin/setpriv", argv, false, &w), 0);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "ready");
    assert_int_equal(shm_of(w.pid, &st), -1);
    assert_int_equal(write(w.in_fd, "g", 1), 1);
    assert_true(rnh_read_line(&w, line, sizeof line, 60000) >= 0);
    assert_string_equal(line, "first");
    assert_int_equal(rnh_wait(&w, 30000), 0);
    rnh_proc_close(&w);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_inplace_kill_restart, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_stopped_daemon, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_observe_at_session_limit, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_owner, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_buffer_mode, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
