/* SPDX-License-Identifier: MIT */
/*
 * harness.h - the integration tests' harness: start a real rmsnormd on a
 * fresh socket path under a fresh temporary directory, wait for its READY=1
 * on a notify socket the test owns (never a sleep), capture its stderr and
 * print it when a test fails, stop it with SIGTERM and collect its exit
 * code (killing it if it overstays); and spawn real client processes.
 *
 * tests/integration/ holds tests that run the built programs
 * ($RN_BUILD/rmsnormd, prog_* helpers) as separate processes; they may use
 * libclient, proto/ and kernels/ (as the oracle).  Internal names: rnh_.
 */
#ifndef RN_HARNESS_H
#define RN_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rmsnorm_client.h"

/* Generous hard limits: ASan and valgrind runs are several times slower. */
#define RNH_READY_TIMEOUT_MS 20000
#define RNH_STOP_TIMEOUT_MS  20000

typedef struct rnh_daemon {
    /* Chosen by rnh_start; the directory survives rnh_stop so that a second
     * rnh_start binds the same endpoint (a restart). */
    char dir[64];
    char endpoint[256]; /* ipc://<dir>/d.sock */
    char log_path[256]; /* the daemon's stderr and stdout */
    char notify_path[100];
    char extra[16][64]; /* extra daemon flags */
    int nextra;
    bool valgrind; /* run under valgrind --leak-check=full */

    pid_t pid; /* 0 when not running */
    int pidfd;
    int notify_fd;
    pthread_t reader;
    bool reader_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* What the daemon told the notify socket, in order. */
    bool ready, stopping;
    unsigned watchdogs, statuses;
    char notify_log[2048];

    bool passed; /* set by RNH_PASS: the teardown keeps quiet */
    int starts;
} rnh_daemon;

/* Add a flag (and value) for the next rnh_start. */
void rnh_arg(rnh_daemon *d, const char *a);

/*
 * Start the daemon (--backend cpu --endpoint ... plus the extra flags) and
 * wait for READY=1.  Returns 0, or -1 after printing why (the log is shown).
 */
int rnh_start(rnh_daemon *d);

/*
 * SIGTERM and wait up to timeout_ms for the exit; kill -9 if it overstays.
 * Returns the exit status (0-255), 128 + signal for a signal death, or -1 if
 * it had to be killed.
 */
int rnh_stop(rnh_daemon *d, int timeout_ms);

/* Wait for the daemon's exit (without signalling it); same return values
 * as rnh_stop. */
int rnh_wait_exit(rnh_daemon *d, int timeout_ms);

/* Wait until the daemon has said STOPPING=1.  Returns 0 or -1. */
int rnh_wait_stopping(rnh_daemon *d, int timeout_ms);

/* Print the daemon's log (and what it told the notify socket) to stdout. */
void rnh_dump_log(const rnh_daemon *d);

/* cmocka fixtures: state is a fresh, not yet started rnh_daemon.  The
 * teardown prints the log unless the test reached RNH_PASS, stops the daemon
 * and removes the directory. */
int rnh_setup(void **state);
int rnh_teardown(void **state);
#define RNH_PASS(d) ((d)->passed = true)

/* For the tests whose premise is a slot taken at once, its wait for ready
 * on the GPU side (--ring-ready=gpu): sets it, or skips when RN_DAEMON_ARGS
 * sets another --ring-ready for the whole suite (after the test's own
 * flags, it would win).  Needs rn_test.h, string.h and stdlib.h. */
#define RNH_NEED_GPU_WAITS(d)                                                                 \
    do {                                                                                      \
        const char *more_ = getenv("RN_DAEMON_ARGS");                                         \
        if (more_ && strstr(more_, "--ring-ready"))                                           \
            RN_SKIP("skipped: RN_DAEMON_ARGS sets --ring-ready; this test needs gpu waits");  \
        rnh_arg((d), "--ring-ready=gpu");                                                     \
    } while (0)

/* For the tests of one ready mode's own behaviour (host: a slot left in the
 * ring; armed): sets --ring-ready=MODE, or skips when RN_DAEMON_ARGS sets
 * another one for the whole suite. */
#define RNH_NEED_READY_MODE(d, mode)                                                          \
    do {                                                                                      \
        const char *more_ = getenv("RN_DAEMON_ARGS");                                         \
        if (more_ && strstr(more_, "--ring-ready") &&                                         \
            !strstr(more_, "--ring-ready=" mode))                                             \
            RN_SKIP("skipped: RN_DAEMON_ARGS sets another --ring-ready than " mode);          \
        rnh_arg((d), "--ring-ready=" mode);                                                   \
    } while (0)

/* $RN_BUILD (or the build directory this test binary lives in). */
const char *rnh_build_dir(void);

/* A child process with its stdin and stdout connected to pipes. */
typedef struct rnh_proc {
    pid_t pid;
    int in_fd;  /* write end: the child's stdin (-1 if closed) */
    int out_fd; /* read end: the child's stdout */
} rnh_proc;

/* Spawn $RN_BUILD/tests/integration/<prog> with argv (NULL-terminated, argv[0]
 * included), or an absolute program path when prog starts with '/'.
 * valgrind: run it under valgrind.  Returns 0 or -1. */
int rnh_spawn(const char *prog, const char *const *argv, bool valgrind, rnh_proc *p);

/* Spawn $RN_BUILD/tests/<prog> (e.g. "gpu/prog_e2e_cuda") with d's endpoint
 * as its first argument and then args (NULL-terminated).  Returns 0 or -1. */
int rnh_spawn_for(const rnh_daemon *d, const char *prog, const char *const *args, rnh_proc *p);

/* Echo p's lines, "  [name pid] line", until its end (each line within
 * line_timeout_ms), then wait for it and close it; its exit status (as
 * rnh_wait), printed when not 0. */
int rnh_finish_echo(rnh_proc *p, const char *name, int line_timeout_ms);

/* Echo p's lines until one starts with want, and copy that line to out
 * (unless NULL); 0, or -1 at p's end or after timeout_ms. */
int rnh_await_line(rnh_proc *p, const char *name, const char *want, char *out, size_t outlen,
                   int timeout_ms);

/* Read one line from p's stdout (without the newline) within timeout_ms.
 * Returns its length, or -1 on EOF/timeout. */
int rnh_read_line(rnh_proc *p, char *buf, size_t len, int timeout_ms);

/* Wait for p to exit within timeout_ms (then kill it).  Returns the exit
 * status, 128 + signal, or -1 on timeout. */
int rnh_wait(rnh_proc *p, int timeout_ms);

/* Run $RN_BUILD/rmsnormctl with args (NULL-terminated, argv[0] excluded),
 * its stdout into out (NUL-terminated, cut at outlen - 1), within timeout_ms.
 * Returns its exit status (as rnh_wait), or -1 when it could not start. */
int rnh_run_ctl(const char *const *args, char *out, size_t outlen, int timeout_ms);

/* Close p's pipes (after rnh_wait). */
void rnh_proc_close(rnh_proc *p);

/* Wait for any pid to exit within timeout_ms; same return values. */
int rnh_wait_pid(pid_t pid, int timeout_ms);

/* A client of d's daemon (timeout 10 s), or NULL after printing why. */
rn_client *rnh_client(const rnh_daemon *d);
/* The same on a given path (RN_PATH_*). */
rn_client *rnh_client_path(const rnh_daemon *d, int path);
/* The same with the client's timeout (ms; rnh_client_path's: 10 000). */
rn_client *rnh_client_with(const rnh_daemon *d, int path, int timeout_ms);

/* HEALTH of d into *h, its reasons printed ("health reason: ...").
 * Returns 0, or -1 when it could not be asked. */
int rnh_health(const rnh_daemon *d, rn_health_info *h);

/* One counter of d's daemon's STATS (fresh client each call); -1 on error. */
int64_t rnh_stat(const rnh_daemon *d, const char *name);

/* Wait until counter `name` equals `want` (polled every 10 ms, at most
 * timeout_ms).  Returns 0, or -1 and prints the last value. */
int rnh_wait_stat(const rnh_daemon *d, const char *name, int64_t want, int timeout_ms);

/* The same, until the counter is at least `min`. */
int rnh_wait_stat_ge(const rnh_daemon *d, const char *name, int64_t min, int timeout_ms);

/* A ring slot published without its ready word is with the daemon: taken
 * (inflight.current reaches `taken`; a daemon that takes slots at once) or,
 * under --ring-ready=host (the test's flags or RN_DAEMON_ARGS), left in the
 * ring and counted in fast.ready_waits (`waits` of them) with nothing in
 * flight.  For the cpu backend's suites: it reads the flags, not the
 * backend's default (auto is armed on cuda under MPS, else host).
 * Returns 0, or -1 as rnh_wait_stat. */
int rnh_wait_slot_pending(const rnh_daemon *d, int64_t taken, int64_t waits, int timeout_ms);

/* VmRSS of pid in KiB, -1 on error. */
long rnh_vmrss_kb(pid_t pid);

/* Lines of /proc/<pid>/maps that contain needle; -1 on error. */
int rnh_maps_count(pid_t pid, const char *needle);

/* SIGSTOP to the daemon, returning once every thread of it has stopped
 * (kill alone returns before a thread on another CPU has: it could still
 * answer a call).  0, or -1. */
int rnh_sigstop(const rnh_daemon *d);

/* CPU time pid has used (user + system), in clock ticks; -1 on error. */
long rnh_cpu_ticks(pid_t pid);

/* Lines of d's log that contain needle; -1 on error. */
int rnh_log_count(const rnh_daemon *d, const char *needle);

/* Descriptors pid holds (its /proc/<pid>/fd); -1 on error. */
int rnh_fd_count(pid_t pid);

/* Files in /dev/shm whose names start with prefix. */
int rnh_shm_count(const char *prefix);

/* 1 when the test programs were built with AddressSanitizer. */
int rnh_asan(void);

/* Path of valgrind, or NULL. */
const char *rnh_valgrind(void);

/* Monotonic milliseconds. */
int64_t rnh_now_ms(void);

#endif
