/* SPDX-License-Identifier: MIT */
/*
 * conn.c - libclient's connection to the daemon: the endpoint check (is it
 * a socket the caller may trust, and whom may buffers be shared with), the
 * REQ socket, one request/reply exchange with its timeout, and where a
 * failure's message is kept.  Nothing here knows about sessions.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "client_int.h"
#include "rn_check.h"

/* rn_connect fails before there is a client to hold its message. */
static __thread char thread_error[RN_ERRMSG_LEN];

int rnc_fail(rn_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c ? c->last_error : thread_error, RN_ERRMSG_LEN, fmt, ap);
    va_end(ap);
    return code;
}

void rnc_clear_thread_error(void)
{
    thread_error[0] = '\0';
}

const char *rn_last_error(const rn_client *c)
{
    return c ? c->last_error : thread_error;
}

uint64_t rnc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- socket -------------------------------------------------------------------------- */

/*
 * nanomsg connects to a missing daemon silently (its REQ socket would wait
 * for the timeout); a plain connect() tells at once whether anybody listens.
 * The connect is bounded by timeout_ms: a daemon that is stopped (SIGSTOP,
 * ^Z) or hung accepts nothing, its listen backlog fills up, and a blocking
 * connect() to a Unix socket with a full backlog waits until the daemon
 * accepts.  Linux bounds that wait by the socket's send timeout and then
 * fails with EAGAIN, which says "no answer", not "nobody there".
 */
static int probe(rn_client *c, const char *path, int timeout_ms)
{
    struct sockaddr_un sa;
    rn_fault f;
    int fd = -1;

    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    RN_SYS_GOTO(fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), &f, fail);
    if (timeout_ms >= 0) {
        /* 0 would mean "forever" to the kernel: the shortest wait is 1 ms. */
        int ms = timeout_ms > 0 ? timeout_ms : 1;
        struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
        RN_SYS_GOTO(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), &f, fail);
        RN_SYS_GOTO(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), &f, fail);
    }
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            break;
        /* A signal in the caller's process interrupts the wait; a Unix
         * socket's connect can simply be tried again (it is not in
         * progress, unlike a TCP one). */
        if (errno != EINTR) {
            f.err = errno;
            goto fail;
        }
    }
    /* nanomsg's side speaks first (its 8-byte header); a daemon at its
     * connection limit writes RNP_CONN_REFUSED instead and closes. */
    {
        char hdr[RNP_CONN_REFUSED_LEN];
        struct pollfd pf = {fd, POLLIN, 0};
        ssize_t n = 0;
        int r;
        do
            r = poll(&pf, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r == 0) {
            f.err = EAGAIN;
            goto fail;
        }
        if (r > 0)
            n = recv(fd, hdr, sizeof hdr, MSG_WAITALL);
        close(fd);
        /* Closed before a byte: a daemon on its way out (its front is
         * killed with it), where a live one always speaks first. */
        if (r > 0 && n <= 0)
            return rnc_fail(c, RN_UNREACHABLE,
                            "endpoint %s: the connection closed at once (is rmsnormd exiting?)",
                            c->endpoint);
        if (n == (ssize_t)sizeof hdr && memcmp(hdr, RNP_CONN_REFUSED, sizeof hdr) == 0)
            return rnc_fail(c, RN_BUSY,
                            "endpoint %s: the daemon refuses new connections: it has as many as "
                            "it allows (--max-connections); retry later",
                            c->endpoint);
    }
    return 0;
fail:
    if (fd < 0)
        return rnc_fail(c, RN_SYSTEM, "socket(AF_UNIX): %s", strerror(f.err));
    close(fd);
    if (f.err == EAGAIN || f.err == EWOULDBLOCK)
        return rnc_fail(c, RN_TIMEOUT,
                        "endpoint %s: the daemon accepts no connections within %d ms (stopped or "
                        "hung?)",
                        c->endpoint, timeout_ms);
    return rnc_fail(c, RN_UNREACHABLE, "endpoint %s: %s (is rmsnormd running?)", c->endpoint,
                    strerror(f.err));
}

static int set_timeouts(rn_client *c, int ms)
{
    int v = ms;
    if (nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &v, sizeof v) != 0 ||
        nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &v, sizeof v) != 0)
        return rnc_fail(c, RN_SYSTEM, "setting socket timeouts: %s", nn_strerror(nn_errno()));
    return 0;
}

/*
 * nanomsg in a fork child.  nanomsg runs its sockets on a worker thread that
 * it starts with the first socket and stops with the last; a child forked
 * while a socket of the parent was open inherits state that says the thread
 * runs, without the thread: a socket opened there waits for it for good,
 * and so does its close.  So libclient counts its open sockets, and a child
 * forked while any was open opens none (rn_connect fails at once).
 */
static unsigned open_socks;     /* (atomic) */
static volatile int nn_orphaned; /* set in such a child */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void forked_child(void)
{
    if (__atomic_load_n(&open_socks, __ATOMIC_RELAXED))
        nn_orphaned = 1;
}

static void watch_forks(void)
{
    (void)pthread_atfork(NULL, NULL, forked_child);
}

/* Open c's REQ socket with its options and connect it (c->sock < 0 before).
 * On failure the socket is closed again. */
static int open_socket(rn_client *c)
{
    int v = RNP_MAX_MSG, rv;

    pthread_once(&fork_once, watch_forks);
    if (nn_orphaned)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "connect: this process was forked from one with an rmsnormd client "
                        "open, where nanomsg cannot run (its thread is the parent's); fork "
                        "before opening clients, or start children with spawn or forkserver");
    if ((c->sock = nn_socket(AF_SP, NN_REQ)) < 0)
        return rnc_fail(c, RN_SYSTEM, "nn_socket: %s", nn_strerror(nn_errno()));
    __atomic_add_fetch(&open_socks, 1, __ATOMIC_RELAXED);
    if (nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &v, sizeof v) != 0)
        rv = rnc_fail(c, RN_SYSTEM, "NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
    else if ((rv = set_timeouts(c, c->timeout_ms)) == 0 && nn_connect(c->sock, c->endpoint) < 0)
        rv = rnc_fail(c, RN_ENDPOINT, "endpoint %s: %s", c->endpoint, nn_strerror(nn_errno()));
    if (rv != 0)
        rnc_conn_close(c);
    return rv;
}

/* ---- whom the endpoint belongs to ------------------------------------------------------ */

/* The user rmsnormd runs as when it is a system service (User= in
 * systemd/rmsnormd@.service); a packager who changes it sets this too. */
#ifndef RN_DAEMON_USER
#define RN_DAEMON_USER "rmsnormd"
#endif

static bool uid_is(uid_t u, uid_t a, uid_t b)
{
    return u == 0 || u == a || u == b;
}

static void owner_name(uid_t u, char *buf, size_t len)
{
    struct passwd pw, *pp = NULL;
    char tmp[1024];
    if (getpwuid_r(u, &pw, tmp, sizeof tmp, &pp) == 0 && pp)
        snprintf(buf, len, "uid %u (%s)", (unsigned)u, pp->pw_name);
    else
        snprintf(buf, len, "uid %u", (unsigned)u);
}

/* The directory part of the socket path path, resolved (no symlinks). */
static bool socket_dir(const char *path, char out[PATH_MAX])
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir)
        return false;
    memcpy(dir, slash == NULL ? "." : path, n);
    dir[n] = '\0';
    return realpath(dir, out) != NULL;
}

/*
 * Whether nobody but root and uids a, b can replace what lies under dir:
 * dir and every directory above it belong to one of them, and each one that
 * others may write to is sticky (then others can add names, but not remove
 * or rename the names of its owners).  why says which directory is not.
 */
static bool dirs_safe(const char *dir, uid_t a, uid_t b, char *why, size_t len)
{
    char p[PATH_MAX];
    struct stat st;

    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        if (stat(p, &st) != 0) {
            snprintf(why, len, "%s: %s", p, strerror(errno));
            return false;
        }
        if (!uid_is(st.st_uid, a, b)) {
            char who[80];
            owner_name(st.st_uid, who, sizeof who);
            snprintf(why, len, "directory %s belongs to %s", p, who);
            return false;
        }
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
            snprintf(why, len, "directory %s is writable by others and not sticky", p);
            return false;
        }
        char *slash = strrchr(p, '/');
        if (slash == NULL || strcmp(p, "/") == 0)
            return true;
        slash[slash == p ? 1 : 0] = '\0';
    }
}

/*
 * A socket in a directory anyone may write to (the fallback endpoint
 * /tmp/rmsnormd-$UID.sock) can be created by anyone before the daemon
 * starts; a client that connected there would hand its requests, and the
 * names of its buffers, to whoever created it.  There the socket must be a
 * socket of the caller's own (or root's), in a sticky directory of the
 * caller's or root's, else the endpoint is refused.  Elsewhere the
 * directory's permissions decide who may create the socket, as they do for
 * the daemon's own directory.
 */
static int check_owner(rn_client *c, const char *path)
{
    char dir[PATH_MAX], who[80], why[PATH_MAX + 160];
    struct stat st, ds;
    uid_t me = geteuid();

    if (!socket_dir(path, dir) || stat(dir, &ds) != 0 || !(ds.st_mode & S_IWOTH))
        return 0;
    if (lstat(path, &st) != 0)
        return 0;
    if (!S_ISSOCK(st.st_mode))
        return rnc_fail(c, RN_ENDPOINT,
                        "endpoint %s: not a socket, in %s where anyone can create files: refusing "
                        "it",
                        c->endpoint, dir);
    if (!uid_is(st.st_uid, me, me)) {
        owner_name(st.st_uid, who, sizeof who);
        return rnc_fail(c, RN_ENDPOINT,
                        "endpoint %s: the socket belongs to %s, not to you or root, and lies in %s "
                        "where anyone can create it: refusing it (set RMSNORMD_ENDPOINT to the "
                        "daemon's socket)",
                        c->endpoint, who, dir);
    }
    if (!dirs_safe(dir, me, me, why, sizeof why))
        return rnc_fail(c, RN_ENDPOINT, "endpoint %s: %s: refusing it", c->endpoint, why);
    return 0;
}

int rnc_conn_open(rn_client *c, int timeout_ms)
{
    rnp_error err = {0};
    const char *path;
    int rv;

    /* nanomsg aborts on socket paths of 108-121 characters: check first. */
    if (rnp_check_endpoint(c->endpoint, &path, &err) != 0)
        return rnc_fail(c, RN_ENDPOINT, "%s", err.msg);
    /* The owner is checked after the probe: a socket planted between a
     * check and the connect would otherwise pass unseen.  nanomsg
     * reconnects by path on its own later (after a daemon restart); the
     * session channel (chan.c) checks its peer on each connection, and
     * buffers go only there. */
    if ((rv = probe(c, path, timeout_ms)) != 0) {
        /* A planted file that is no socket refuses connections: say that. */
        int why = rv == RN_UNREACHABLE ? check_owner(c, path) : 0;
        return why != 0 ? why : rv;
    }
    if ((rv = check_owner(c, path)) != 0)
        return rv;
    return open_socket(c);
}

int rnc_conn_probe(rn_client *c, int timeout_ms)
{
    rnp_error err = {0};
    const char *path;

    if (rnp_check_endpoint(c->endpoint, &path, &err) != 0)
        return rnc_fail(c, RN_ENDPOINT, "%s", err.msg);
    return probe(c, path, timeout_ms);
}

void rnc_conn_close(rn_client *c)
{
    if (c->sock >= 0) {
        nn_close(c->sock);
        __atomic_sub_fetch(&open_socks, 1, __ATOMIC_RELAXED);
    }
    c->sock = -1;
}

/* ---- exchange ----------------------------------------------------------------------- */

rnp_request *rnc_request(rn_client *c, uint32_t op)
{
    memset(&c->req, 0, sizeof c->req);
    c->req.op = op;
    return &c->req;
}

/* A failed send or receive: a timeout, or what nanomsg says. */
static int io_fail(rn_client *c, uint32_t op, bool sending, int timeout_ms)
{
    int e = nn_errno();
    if (e == ETIMEDOUT || e == EAGAIN)
        return rnc_fail(c, RN_TIMEOUT, "%s: %s %s within %d ms", rnp_op_name((int)op),
                        sending ? "could not send to" : "no reply from", c->endpoint, timeout_ms);
    return rnc_fail(c, RN_SYSTEM, "%s: %s: %s", rnp_op_name((int)op), sending ? "send" : "receive",
                    nn_strerror(e));
}

/*
 * Wait for the reply.  A signal handler in the caller's process (a
 * profiler, Python's SIGINT) interrupts the wait; that is not a failure of
 * the call, so wait again for what is left of the timeout, no longer
 * (signals that come often must not stretch it forever).  Sets *retimed
 * when it shortened the socket's receive timeout.
 */
static int receive(rn_client *c, int timeout_ms, void **msg, bool *retimed)
{
    uint64_t deadline = rnc_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000u;
    int n;

    for (;;) {
        n = nn_recv(c->sock, msg, NN_MSG, 0);
        if (n >= 0 || nn_errno() != EINTR)
            return n;
        if (timeout_ms >= 0) {
            uint64_t now = rnc_now_ns();
            int left = now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
            if (left == 0) {
                errno = ETIMEDOUT;
                return -1;
            }
            nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &left, sizeof left);
            *retimed = true;
        }
    }
}

/* Check that c->rep answers request (op, id) and succeeded. */
static int check_reply(rn_client *c, uint32_t op, uint64_t id)
{
    if (c->rep.op != op || c->rep.id != id) {
        /* A daemon that could not read our request answers op 0 / id 0
         * with its reason: pass that on, it says more than a mismatch. */
        if (c->rep.status != 0)
            return rnc_fail(c, c->rep.status, "%s", c->rep.error);
        return rnc_fail(c, RN_BAD_REPLY, "reply is for op %u id %llu, expected %s id %llu",
                        c->rep.op, (unsigned long long)c->rep.id, rnp_op_name((int)op),
                        (unsigned long long)id);
    }
    if (c->rep.status != 0)
        return rnc_fail(c, c->rep.status, "%s",
                        c->rep.error[0] ? c->rep.error : rnp_strerror(c->rep.status));
    return 0;
}

/*
 * Connections nanomsg has made on c's socket, and whether one is up now.
 * nanomsg reports no connection state otherwise; its counters are enough to
 * tell whether a request may have reached an earlier daemon (rnc_transact).
 */
static uint64_t established(const rn_client *c)
{
    return nn_get_statistic(c->sock, NN_STAT_ESTABLISHED_CONNECTIONS);
}

int rnc_transact(rn_client *c, int timeout_ms)
{
    rnp_error err = {0};
    size_t len = 0;
    void *msg = NULL;
    int n, rv;
    bool retimed = false;
    uint32_t op = c->req.op;
    uint64_t id = ++c->next_id;

    /* The last timeout's fresh socket could not be opened: try again. */
    if (c->sock < 0 && (rv = open_socket(c)) != 0)
        return rv;
    c->req.version = RNP_VERSION;
    c->req.id = id;
    rv = rnp_encode_request(&c->req, c->tx, sizeof c->tx, &len, &err);
    if (rv != 0)
        return rnc_fail(c, rv, "%s", err.msg);

    if (timeout_ms != c->timeout_ms && (rv = set_timeouts(c, timeout_ms)) != 0)
        return rv;

    /*
     * The REQ socket sends the request again by itself on every new
     * connection (after a daemon restart, say) while no reply has come.  If
     * a connection was up when the request went out and another one was
     * made before the reply, the first copy may have reached a daemon that
     * then died, possibly after it began to write the outputs.  One new
     * connection is expected when none was up: the request waited for it.
     */
    uint64_t est0 = established(c);
    bool was_up = nn_get_statistic(c->sock, NN_STAT_CURRENT_CONNECTIONS) > 0;
    c->reconnected = false;
    c->replied = false;

    /* An interrupted send sent nothing: send again. */
    while ((n = nn_send(c->sock, c->tx, len, 0)) < 0 && nn_errno() == EINTR)
        ;
    if (n < 0) {
        rv = io_fail(c, op, true, timeout_ms);
        goto out;
    }
    n = receive(c, timeout_ms, &msg, &retimed);
    c->reconnected = established(c) - est0 > (was_up ? 0u : 1u);
    if (n < 0) {
        rv = io_fail(c, op, false, timeout_ms);
        if (rv == RN_TIMEOUT) {
            /*
             * The REQ socket still holds the request and would send it
             * again after NN_REQ_RESEND_IVL (60 s), long after this call
             * gave up: a HELLO or REGISTER sent that way would open a
             * session or pin memory that no one knows of.  A fresh socket
             * drops it; if none can be opened, the next call tries again.
             */
            char keep[RN_ERRMSG_LEN];
            snprintf(keep, sizeof keep, "%s", c->last_error);
            rnc_conn_close(c);
            (void)open_socket(c); /* (its failure is not this call's error) */
            snprintf(c->last_error, sizeof c->last_error, "%s", keep);
            retimed = false; /* the new socket has c's own timeouts */
        }
        goto out;
    }
    c->replied = true;
    if (rnp_decode_reply(msg, (size_t)n, &c->rep, &err) != 0)
        rv = rnc_fail(c, RN_BAD_REPLY, "%s reply: %s", rnp_op_name((int)op), err.msg);
    else
        rv = check_reply(c, op, id);
out:
    if (msg)
        nn_freemsg(msg);
    if (c->sock >= 0 && (timeout_ms != c->timeout_ms || retimed))
        set_timeouts(c, c->timeout_ms);
    return rv;
}
