/* SPDX-License-Identifier: MIT */
/*
 * harness.c - start and stop real daemons and client processes for the
 * integration tests (see harness.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rn_test.h"
#include "integration/harness.h"

extern char **environ;

int64_t rnh_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int rnh_asan(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 1;
#else
    return 0;
#endif
#else
    return 0;
#endif
}

const char *rnh_valgrind(void)
{
    static const char *paths[] = {"/usr/bin/valgrind", "/usr/local/bin/valgrind"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

const char *rnh_build_dir(void)
{
    static char dir[PATH_MAX];
    const char *env = getenv("RN_BUILD");
    if (env && *env)
        return env;
    if (dir[0] == '\0') {
        /* <build>/tests/integration/test_x */
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (n <= 0)
            return "build";
        dir[n] = '\0';
        for (int up = 0; up < 3; up++) {
            char *s = strrchr(dir, '/');
            if (s)
                *s = '\0';
        }
    }
    return dir;
}

static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Wait for pid's exit (status decoded) within timeout_ms. */
int rnh_wait_pid(pid_t pid, int timeout_ms)
{
    int st, fd = pidfd_open_(pid);
    pid_t r;
    if (fd >= 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc;
        do
            rc = poll(&pf, 1, timeout_ms);
        while (rc < 0 && errno == EINTR);
        close(fd);
        if (rc == 0)
            return -1;
    }
    do
        r = waitpid(pid, &st, fd >= 0 ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r != pid)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

void rnh_arg(rnh_daemon *d, const char *a)
{
    if (d->nextra < (int)(sizeof d->extra / sizeof d->extra[0]))
        snprintf(d->extra[d->nextra++], sizeof d->extra[0], "%s", a);
}

/* The notify reader: drains every datagram (the kernel queues only a few,
 * and a full queue would block the daemon's sd_notify) and records what it
 * says. */
static void *notify_reader(void *arg)
{
    rnh_daemon *d = arg;
    char buf[4096];
    for (;;) {
        ssize_t n = recv(d->notify_fd, buf, sizeof buf - 1, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        buf[n] = '\0';
        if (n == 0 || strcmp(buf, "rnh-quit") == 0)
            break;
        pthread_mutex_lock(&d->mu);
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
            if (strcmp(line, "READY=1") == 0)
                d->ready = true;
            else if (strcmp(line, "STOPPING=1") == 0)
                d->stopping = true;
            else if (strcmp(line, "WATCHDOG=1") == 0)
                d->watchdogs++;
            else if (strncmp(line, "STATUS=", 7) == 0)
                d->statuses++;
            size_t used = strlen(d->notify_log);
            if (used + strlen(line) + 2 < sizeof d->notify_log)
                snprintf(d->notify_log + used, sizeof d->notify_log - used, "%s\n", line);
        }
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
    return NULL;
}

static int open_notify(rnh_daemon *d)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int buf = 1 << 20;
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (d->notify_fd < 0)
        return -1;
    unlink(d->notify_path);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", d->notify_path);
    if (bind(d->notify_fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        printf("harness: bind %s: %s\n", d->notify_path, strerror(errno));
        close(d->notify_fd);
        d->notify_fd = -1;
        return -1;
    }
    setsockopt(d->notify_fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    d->ready = d->stopping = false;
    d->watchdogs = d->statuses = 0;
    d->notify_log[0] = '\0';
    if (pthread_create(&d->reader, NULL, notify_reader, d) != 0) {
        close(d->notify_fd);
        d->notify_fd = -1;
        return -1;
    }
    d->reader_running = true;
    return 0;
}

static void close_notify(rnh_daemon *d)
{
    if (d->reader_running) {
        /* Wake the reader with a datagram of our own. */
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", d->notify_path);
        if (s >= 0) {
            sendto(s, "rnh-quit", 8, 0, (struct sockaddr *)&sa, sizeof sa);
            close(s);
        }
        pthread_join(d->reader, NULL);
        d->reader_running = false;
    }
    if (d->notify_fd >= 0)
        close(d->notify_fd);
    d->notify_fd = -1;
    unlink(d->notify_path);
}

void rnh_dump_log(const rnh_daemon *d)
{
    FILE *f = fopen(d->log_path, "r");
    char line[1024];
    printf("---- daemon log %s ----\n", d->log_path);
    if (f) {
        while (fgets(line, sizeof line, f))
            fputs(line, stdout);
        fclose(f);
    }
    printf("---- notify messages ----\n%s---- end ----\n", d->notify_log);
    fflush(stdout);
}

/* The environment of a child plus NOTIFY_SOCKET (and, under ASan, a small
 * quarantine so that memory measurements see real growth only). */
static char **child_env(const char *notify)
{
    size_t n = 0, k = 0;
    char **env;
    static char notify_var[300], asan_var[200];
    while (environ[n])
        n++;
    env = calloc(n + 3, sizeof *env);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0 &&
            strncmp(environ[i], "ASAN_OPTIONS=", 13) != 0)
            env[k++] = environ[i];
    if (notify) {
        snprintf(notify_var, sizeof notify_var, "NOTIFY_SOCKET=%s", notify);
        env[k++] = notify_var;
    }
    if (rnh_asan()) {
        const char *old = getenv("ASAN_OPTIONS");
        snprintf(asan_var, sizeof asan_var, "ASAN_OPTIONS=%s%squarantine_size_mb=1", old ? old : "",
                 old && *old ? ":" : "");
        env[k++] = asan_var;
    }
    env[k] = NULL;
    return env;
}

/* RN_DAEMON_ARGS split at blanks into buf (which the returned pointers
 * point into), at most max of them; returns how many. */
static int env_daemon_args(char *buf, size_t len, const char **out, int max)
{
    const char *env = getenv("RN_DAEMON_ARGS");
    int n = 0;

    snprintf(buf, len, "%s", env ? env : "");
    for (char *save = NULL, *a = strtok_r(buf, " \t", &save); a && n < max;
         a = strtok_r(NULL, " \t", &save))
        out[n++] = a;
    return n;
}

int rnh_start(rnh_daemon *d)
{
    const char *argv[48];
    char daemon_path[PATH_MAX], vg_log[300];
    char **env;
    int n = 0, logfd, rv = -1;
    int64_t deadline;

    if (d->dir[0] == '\0') {
        char tmpl[] = "/tmp/rn-it.XXXXXX";
        if (mkdtemp(tmpl) == NULL) {
            printf("harness: mkdtemp: %s\n", strerror(errno));
            return -1;
        }
        snprintf(d->dir, sizeof d->dir, "%s", tmpl);
        snprintf(d->endpoint, sizeof d->endpoint, "ipc://%s/d.sock", d->dir);
        snprintf(d->log_path, sizeof d->log_path, "%s/daemon.log", d->dir);
        snprintf(d->notify_path, sizeof d->notify_path, "%s/notify.sock", d->dir);
        pthread_mutex_init(&d->mu, NULL);
        pthread_cond_init(&d->cv, NULL);
        d->notify_fd = -1;
        d->pidfd = -1;
    }
    if (open_notify(d) != 0) {
        printf("harness: cannot open the notify socket\n");
        return -1;
    }
    snprintf(daemon_path, sizeof daemon_path, "%s/rmsnormd", rnh_build_dir());
    snprintf(vg_log, sizeof vg_log, "--log-file=%s/valgrind.%d.log", d->dir, d->starts);
    if (d->valgrind) {
        argv[n++] = rnh_valgrind();
        argv[n++] = "--leak-check=full";
        argv[n++] = "--show-leak-kinds=definite,indirect,possible";
        argv[n++] = "--errors-for-leak-kinds=definite,indirect,possible";
        argv[n++] = "--error-exitcode=97";
        argv[n++] = "--track-fds=no";
        argv[n++] = vg_log;
    }
    argv[n++] = daemon_path;
    argv[n++] = "--backend";
    argv[n++] = "cpu";
    argv[n++] = "--endpoint";
    argv[n++] = d->endpoint;
    argv[n++] = "--config";
    argv[n++] = "/dev/null";
    argv[n++] = "--log-level";
    argv[n++] = "debug";
    for (int i = 0; i < d->nextra; i++)
        argv[n++] = d->extra[i];
    /* RN_DAEMON_ARGS: flags for every daemon a test starts, to run a suite
     * under another setting (e.g. --ring-ready=gpu). */
    static char more[256];
    n += env_daemon_args(more, sizeof more, argv + n, 47 - n);
    argv[n] = NULL;

    logfd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    env = child_env(d->notify_path);
    if (logfd < 0 || env == NULL) {
        printf("harness: cannot open %s\n", d->log_path);
        goto out;
    }
    if (d->starts > 0) {
        char mark[64];
        int m = snprintf(mark, sizeof mark, "==== harness: start #%d ====\n", d->starts + 1);
        if (write(logfd, mark, (size_t)m) < 0)
            goto out;
    }
    d->starts++;
    fflush(NULL);
    d->pid = fork();
    if (d->pid < 0) {
        d->pid = 0;
        printf("harness: fork: %s\n", strerror(errno));
        goto out;
    }
    if (d->pid == 0) {
        int nullfd = open("/dev/null", O_RDONLY);
        dup2(nullfd, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        execve(argv[0], (char *const *)argv, env);
        _exit(127);
    }
    d->pidfd = pidfd_open_(d->pid);

    /* Wait for READY=1, or the daemon's death, under a hard deadline. */
    deadline = rnh_now_ms() + (d->valgrind ? 6 : 1) * RNH_READY_TIMEOUT_MS;
    pthread_mutex_lock(&d->mu);
    while (!d->ready) {
        struct timespec ts;
        struct pollfd pf = {.fd = d->pidfd, .events = POLLIN};
        int64_t left = deadline - rnh_now_ms();
        if (left <= 0)
            break;
        if (d->pidfd >= 0 && poll(&pf, 1, 0) == 1)
            break; /* exited */
        clock_gettime(CLOCK_REALTIME, &ts);
        /* Wake at least every 50 ms to notice an early exit. */
        ts.tv_nsec += (left < 50 ? left : 50) * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    if (!d->ready) {
        int st = rnh_wait_pid(d->pid, 0);
        printf("harness: rmsnormd (pid %d) did not report READY=1 %s\n", (int)d->pid,
               st >= 0 ? "and exited" : "in time");
        if (st < 0) {
            kill(d->pid, SIGKILL);
            rnh_wait_pid(d->pid, 5000);
        } else {
            printf("harness: exit status %d\n", st);
        }
        d->pid = 0;
        rnh_dump_log(d);
        goto out;
    }
    rv = 0;
out:
    if (logfd >= 0)
        close(logfd);
    free(env);
    return rv;
}

int rnh_wait_exit(rnh_daemon *d, int timeout_ms)
{
    int st;
    if (d->pid <= 0)
        return -1;
    st = rnh_wait_pid(d->pid, d->valgrind ? 4 * timeout_ms : timeout_ms);
    if (st < 0) {
        printf("harness: rmsnormd (pid %d) did not exit within %d ms: killed\n", (int)d->pid,
               timeout_ms);
        kill(d->pid, SIGKILL);
        rnh_wait_pid(d->pid, 5000);
    }
    if (d->pidfd >= 0)
        close(d->pidfd);
    d->pidfd = -1;
    d->pid = 0;
    close_notify(d);
    return st;
}

int rnh_stop(rnh_daemon *d, int timeout_ms)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, SIGTERM);
    return rnh_wait_exit(d, timeout_ms);
}

int rnh_wait_stopping(rnh_daemon *d, int timeout_ms)
{
    struct timespec ts;
    int rv = 0;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&d->mu);
    while (!d->stopping && rv == 0)
        rv = pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    rv = d->stopping ? 0 : -1;
    pthread_mutex_unlock(&d->mu);
    return rv;
}

/* Line-buffered output from the start, when it goes to a file (tests/run.sh's
 * logs): a test that hangs and is killed leaves what it printed, not a
 * block still in the buffer. */
__attribute__((constructor)) static void line_buffered(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
}

int rnh_setup(void **state)
{
    rnh_daemon *d = calloc(1, sizeof *d);
    if (d == NULL)
        return -1;
    d->notify_fd = -1;
    d->pidfd = -1;
    *state = d;
    return 0;
}

static void rm_rf(const char *dir)
{
    DIR *dd = opendir(dir);
    struct dirent *de;
    char p[PATH_MAX];
    if (dd == NULL)
        return;
    while ((de = readdir(dd)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(dd);
    rmdir(dir);
}

int rnh_teardown(void **state)
{
    rnh_daemon *d = *state;
    if (d == NULL)
        return 0;
    if (!d->passed && d->dir[0]) {
        printf("harness: the test did not pass (failed or skipped); the daemon's log follows\n");
        rnh_dump_log(d);
    }
    if (d->pid > 0)
        rnh_stop(d, 5000);
    close_notify(d);
    if (d->dir[0]) {
        if (d->passed)
            rm_rf(d->dir);
        else
            printf("harness: kept %s\n", d->dir);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    free(d);
    *state = NULL;
    return 0;
}

/* ---- client processes ------------------------------------------------------------------ */

int rnh_spawn(const char *prog, const char *const *argv, bool valgrind, rnh_proc *p)
{
    char path[PATH_MAX];
    const char *av[64];
    int in[2], out[2], n = 0;
    char **env;
    if (prog[0] == '/')
        snprintf(path, sizeof path, "%s", prog);
    else
        snprintf(path, sizeof path, "%s/tests/integration/%s", rnh_build_dir(), prog);
    if (valgrind) {
        av[n++] = rnh_valgrind();
        av[n++] = "--leak-check=full";
        av[n++] = "--errors-for-leak-kinds=definite,indirect,possible";
        av[n++] = "--error-exitcode=97";
        av[n++] = "-q";
    }
    av[n++] = path;
    for (int i = 1; argv[i] && n < 63; i++)
        av[n++] = argv[i];
    av[n] = NULL;
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    env = child_env(NULL);
    fflush(NULL);
    p->pid = fork();
    if (p->pid < 0) {
        free(env);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execve(av[0], (char *const *)av, env);
        _exit(127);
    }
    free(env);
    close(in[0]);
    close(out[1]);
    p->in_fd = in[1];
    p->out_fd = out[0];
    return 0;
}

int rnh_spawn_for(const rnh_daemon *d, const char *prog, const char *const *args, rnh_proc *p)
{
    char path[PATH_MAX];
    const char *argv[16];
    int n = 0;

    snprintf(path, sizeof path, "%s/tests/%s", rnh_build_dir(), prog);
    argv[n++] = path;
    argv[n++] = d->endpoint;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return rnh_spawn(path, argv, false, p);
}

int rnh_finish_echo(rnh_proc *p, const char *name, int line_timeout_ms)
{
    char line[512];
    int rc;

    while (rnh_read_line(p, line, sizeof line, line_timeout_ms) >= 0)
        printf("  [%s %d] %s\n", name, (int)p->pid, line);
    rc = rnh_wait(p, 10000);
    rnh_proc_close(p);
    if (rc != 0)
        printf("  [%s %d] exit status %d\n", name, (int)p->pid, rc);
    return rc;
}

int rnh_await_line(rnh_proc *p, const char *name, const char *want, char *out, size_t outlen,
                   int timeout_ms)
{
    int64_t end = rnh_now_ms() + timeout_ms;
    char line[512];

    while (rnh_now_ms() < end) {
        if (rnh_read_line(p, line, sizeof line, (int)(end - rnh_now_ms())) < 0)
            break;
        printf("  [%s %d] %s\n", name, (int)p->pid, line);
        if (strncmp(line, want, strlen(want)) == 0) {
            if (out)
                snprintf(out, outlen, "%s", line);
            return 0;
        }
    }
    printf("  [%s %d] no '%s' line\n", name, (int)p->pid, want);
    return -1;
}

int rnh_read_line(rnh_proc *p, char *buf, size_t len, int timeout_ms)
{
    size_t n = 0;
    int64_t deadline = rnh_now_ms() + timeout_ms;
    while (n + 1 < len) {
        struct pollfd pf = {.fd = p->out_fd, .events = POLLIN};
        int64_t left = deadline - rnh_now_ms();
        char ch;
        ssize_t r;
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            return -1;
        r = read(p->out_fd, &ch, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (ch == '\n')
            break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return (int)n;
}

int rnh_wait(rnh_proc *p, int timeout_ms)
{
    int st = rnh_wait_pid(p->pid, timeout_ms);
    if (st < 0) {
        printf("harness: pid %d did not exit within %d ms: killed\n", (int)p->pid, timeout_ms);
        kill(p->pid, SIGKILL);
        rnh_wait_pid(p->pid, 5000);
    }
    return st;
}

void rnh_proc_close(rnh_proc *p)
{
    if (p->in_fd >= 0)
        close(p->in_fd);
    if (p->out_fd >= 0)
        close(p->out_fd);
    p->in_fd = p->out_fd = -1;
}

/* ---- observation -------------------------------------------------------------------------- */

rn_client *rnh_client(const rnh_daemon *d)
{
    return rnh_client_path(d, RN_PATH_DEFAULT);
}

rn_client *rnh_client_path(const rnh_daemon *d, int path)
{
    return rnh_client_with(d, path, 10000);
}

rn_client *rnh_client_with(const rnh_daemon *d, int path, int timeout_ms)
{
    /* (struct_size: without it rn_connect takes the 0.1 layout, which ends
     * before path, and every client was RN_PATH_AUTO) */
    rn_connect_opts o = {.struct_size = sizeof o, .endpoint = d->endpoint,
                         .timeout_ms = timeout_ms, .client_name = "harness"};
    rn_client *c = NULL;
    o.path = path;
    int rv = rn_connect(&o, &c);
    if (rv != 0) {
        printf("harness: connect to %s: %s (%s)\n", d->endpoint, rn_last_error(NULL),
               rn_err_name(rv));
        return NULL;
    }
    return c;
}

int rnh_health(const rnh_daemon *d, rn_health_info *h)
{
    rn_client *c = rnh_client(d);
    int rv = c && rn_health(c, h) == 0 ? 0 : -1;

    for (unsigned i = 0; rv == 0 && i < h->nreasons; i++)
        printf("health reason: %s\n", h->reasons[i]);
    rn_close(c);
    return rv;
}

int64_t rnh_stat(const rnh_daemon *d, const char *name)
{
    rn_client *c = rnh_client(d);
    rn_stats_info *s = calloc(1, sizeof *s);
    int64_t v = -1;
    if (c && s && rn_stats(c, s) == 0)
        v = (int64_t)rn_stats_get(s, name, 0);
    free(s);
    rn_close(c);
    return v;
}

static int wait_stat(const rnh_daemon *d, const char *name, int64_t want, bool at_least,
                     int timeout_ms)
{
    int64_t deadline = rnh_now_ms() + timeout_ms, v = -1;
    rn_client *c = rnh_client(d);
    rn_stats_info *s = calloc(1, sizeof *s);
    int rv = -1;
    if (c == NULL || s == NULL)
        goto out;
    for (;;) {
        if (rn_stats(c, s) == 0) {
            v = (int64_t)rn_stats_get(s, name, 0);
            if (v == want || (at_least && v > want)) {
                rv = 0;
                break;
            }
        }
        if (rnh_now_ms() >= deadline)
            break;
        poll(NULL, 0, 10);
    }
    if (rv != 0)
        printf("harness: counter %s is %lld, wanted %s%lld within %d ms\n", name, (long long)v,
               at_least ? ">= " : "", (long long)want, timeout_ms);
out:
    free(s);
    rn_close(c);
    return rv;
}

int rnh_wait_stat(const rnh_daemon *d, const char *name, int64_t want, int timeout_ms)
{
    return wait_stat(d, name, want, false, timeout_ms);
}

int rnh_wait_stat_ge(const rnh_daemon *d, const char *name, int64_t min, int timeout_ms)
{
    return wait_stat(d, name, min, true, timeout_ms);
}

/* Whether the daemon's flags ask for --ring-ready=host ("--ring-ready=host"
 * or "--ring-ready host"; the last one given wins). */
static bool flags_ready_host(const char *const *argv, int argc, bool host)
{
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (strncmp(argv[i], "--ring-ready=", 13) == 0)
            v = argv[i] + 13;
        else if (strcmp(argv[i], "--ring-ready") == 0 && i + 1 < argc)
            v = argv[++i];
        if (v)
            host = strcmp(v, "host") == 0;
    }
    return host;
}

int rnh_wait_slot_pending(const rnh_daemon *d, int64_t taken, int64_t waits, int timeout_ms)
{
    const char *extra[16], *more[16];
    char buf[256];

    for (int i = 0; i < d->nextra && i < 16; i++)
        extra[i] = d->extra[i];
    bool host = flags_ready_host(extra, d->nextra < 16 ? d->nextra : 16, false);
    /* RN_DAEMON_ARGS comes after the test's own flags (rnh_start). */
    host = flags_ready_host(more, env_daemon_args(buf, sizeof buf, more, 16), host);
    if (!host)
        return rnh_wait_stat(d, "inflight.current", taken, timeout_ms);
    if (rnh_wait_stat(d, "fast.ready_waits", waits, timeout_ms) != 0)
        return -1;
    return rnh_stat(d, "inflight.current") == 0 ? 0 : -1;
}

long rnh_vmrss_kb(pid_t pid)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

int rnh_maps_count(pid_t pid, const char *needle)
{
    char path[64], line[1024];
    int n = 0;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle))
            n++;
    fclose(f);
    return n;
}

int rnh_sigstop(const rnh_daemon *d)
{
    if (d->pid <= 0 || kill(d->pid, SIGSTOP) != 0)
        return -1;
    /* kill returns once the signal is sent; the stop is reported to the
     * parent (here) once every thread of the daemon has stopped.  The
     * report is taken (WSTOPPED alone: an exit stays for rnh_wait_exit). */
    for (int64_t t0 = rnh_now_ms(); rnh_now_ms() - t0 < 10000;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)d->pid, &si, WSTOPPED | WNOHANG) != 0 && errno != EINTR)
            return -1;
        if (si.si_pid == d->pid && si.si_code == CLD_STOPPED)
            return 0;
        if (kill(d->pid, 0) != 0)
            return -1;
        usleep(200);
    }
    printf("harness: rmsnormd (pid %d) did not stop within 10 s of SIGSTOP\n", (int)d->pid);
    return -1;
}

long rnh_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    /* After the command: state, then fields 4..13, then utime and stime
     * (proc(5)). */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

int rnh_log_count(const rnh_daemon *d, const char *needle)
{
    char line[2048];
    int n = 0;
    FILE *f = fopen(d->log_path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

int rnh_fd_count(pid_t pid)
{
    char path[64];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dd = opendir(path);
    if (dd == NULL)
        return -1;
    for (struct dirent *de; (de = readdir(dd)) != NULL;)
        n += de->d_name[0] != '.';
    closedir(dd);
    return n;
}

int rnh_shm_count(const char *prefix)
{
    DIR *dd = opendir("/dev/shm");
    struct dirent *de;
    int n = 0;
    if (dd == NULL)
        return -1;
    while ((de = readdir(dd)) != NULL)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(dd);
    return n;
}

int rnh_run_ctl(const char *const *args, char *out, size_t outlen, int timeout_ms)
{
    const char *argv[32] = {"rmsnormctl"};
    char path[512];
    rnh_proc p;
    size_t n = 0;
    int i = 1;

    for (; args[i - 1] && i < 31; i++)
        argv[i] = args[i - 1];
    argv[i] = NULL;
    snprintf(path, sizeof path, "%s/rmsnormctl", rnh_build_dir());
    if (rnh_spawn(path, argv, false, &p) != 0)
        return -1;
    close(p.in_fd);
    p.in_fd = -1;
    for (;;) {
        struct pollfd pf = {.fd = p.out_fd, .events = POLLIN};
        ssize_t r;
        if (n + 1 >= outlen || poll(&pf, 1, timeout_ms) <= 0)
            break;
        r = read(p.out_fd, out + n, outlen - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    out[n] = '\0';
    i = rnh_wait(&p, timeout_ms);
    rnh_proc_close(&p);
    return i;
}
