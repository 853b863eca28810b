/*
 * client.c - libclient's connection: endpoint, connect/close, the
 * request/reply exchange, session recovery after a daemon restart, and the
 * observation calls (ping, health, stats, server info).
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "client_int.h"

/* The public structs mirror proto's limits; a change there must show here. */
_Static_assert(RN_NAME_LEN == RNP_MAX_NAME, "name length");
_Static_assert(RN_UUID_LEN == RNP_UUID_BYTES, "uuid length");
_Static_assert(RN_MAX_REASONS == RNP_MAX_REASONS, "reasons");
_Static_assert(RN_REASON_LEN == RNP_REASON_LEN, "reason length");
_Static_assert(RN_MAX_STATS == RNP_MAX_STATS, "stats");
_Static_assert(RN_MAX_HISTS == RNP_MAX_HISTS, "hists");
_Static_assert(RN_STAT_NAME_LEN == RNP_STAT_NAME, "stat name");
_Static_assert(RN_ERRMSG_LEN >= RNP_MAX_ERRMSG, "error message");

#ifndef RN_VERSION
#define RN_VERSION "0.0.0"
#endif

/* rn_connect fails before there is a client to hold its message. */
static __thread char connect_error[RN_ERRMSG_LEN];

/* BYE in rn_close waits at most this long: a dead daemon must not hold up
 * the caller's shutdown, and the daemon notices the exit by itself. */
#define BYE_TIMEOUT_MS 2000

uint64_t rnc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int vfail(char *buf, int code, const char *fmt, va_list ap)
{
    vsnprintf(buf, RN_ERRMSG_LEN, fmt, ap);
    return code;
}

int rnc_fail(rn_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c->last_error, code, fmt, ap);
    va_end(ap);
    return code;
}

static int connect_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int connect_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(connect_error, code, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- error table and version ---------------------------------------------------- */

const char *rn_strerror(int code)
{
    switch (code) {
#define RN_STR_(num, name, msg)                                                                    \
    case num:                                                                                      \
        return msg;
        RN_ERRORS(RN_STR_)
#undef RN_STR_
    }
    return "unknown error code";
}

const char *rn_err_name(int code)
{
    switch (code) {
#define RN_NAME_(num, name, msg)                                                                   \
    case num:                                                                                      \
        return #name;
        RN_ERRORS(RN_NAME_)
#undef RN_NAME_
    }
    return "UNKNOWN";
}

const char *rn_last_error(const rn_client *c)
{
    return c ? c->last_error : connect_error;
}

const char *rn_version(void)
{
    return RN_VERSION;
}

/* ---- endpoint --------------------------------------------------------------------- */

const char *rn_default_endpoint(char *buf, size_t len)
{
    const char *env = getenv("RMSNORMD_ENDPOINT");
    int w;
    if (buf == NULL || len == 0)
        return NULL;
    if (env && *env)
        w = snprintf(buf, len, "%s", env);
    else if ((env = getenv("RUNTIME_DIRECTORY")) && *env)
        w = snprintf(buf, len, "ipc://%s/rmsnormd.sock", env);
    else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
        w = snprintf(buf, len, "ipc://%s/rmsnormd.sock", env);
    else
        w = snprintf(buf, len, "ipc:///tmp/rmsnormd-%u.sock", (unsigned)getuid());
    if (w < 0 || (size_t)w >= len)
        return NULL;
    return buf;
}

/*
 * Check an ipc:// endpoint before nanomsg sees it: nanomsg aborts on socket
 * paths of 108-121 characters, and connects to a missing daemon silently
 * (its REQ socket would wait for the timeout).  A plain connect() tells at
 * once whether anybody listens.
 */
static int check_endpoint(const char *ep)
{
    struct sockaddr_un sa;
    const char *path;
    int fd, rv;

    if (strncmp(ep, "ipc://", 6) != 0)
        return connect_fail(RN_ENDPOINT, "endpoint \"%s\": only ipc:// endpoints are supported",
                            ep);
    path = ep + 6;
    if (*path == '\0')
        return connect_fail(RN_ENDPOINT, "endpoint \"%s\": empty socket path", ep);
    if (strlen(path) >= sizeof sa.sun_path)
        return connect_fail(RN_ENDPOINT,
                            "endpoint: socket path is %zu bytes, a Unix socket allows at most %zu",
                            strlen(path), sizeof sa.sun_path - 1);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return connect_fail(RN_SYSTEM, "socket(AF_UNIX): %s", strerror(errno));
    rv = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rv != 0) {
        int e = errno;
        close(fd);
        return connect_fail(RN_UNREACHABLE, "endpoint %s: %s (is rmsnormd running?)", ep,
                            strerror(e));
    }
    close(fd);
    return 0;
}

/* ---- exchange ---------------------------------------------------------------------- */

static int open_socket(rn_client *c);
static void reopen_socket(rn_client *c);

static int set_timeouts(rn_client *c, int ms)
{
    int v = ms;
    if (nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &v, sizeof v) != 0 ||
        nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &v, sizeof v) != 0)
        return rnc_fail(c, RN_SYSTEM, "setting socket timeouts: %s", nn_strerror(nn_errno()));
    return 0;
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

    if (c->sock < 0) {
        /* The last timeout's fresh socket could not be opened: try again. */
        if ((rv = open_socket(c)) != 0) {
            if (c->sock >= 0)
                nn_close(c->sock);
            c->sock = -1;
            return rv;
        }
    }
    c->req.version = RNP_VERSION;
    c->req.id = id;
    rv = rnp_encode_request(&c->req, c->tx, sizeof c->tx, &len, &err);
    if (rv != 0)
        return rnc_fail(c, rv, "%s", err.msg);

    if (timeout_ms != c->timeout_ms && (rv = set_timeouts(c, timeout_ms)) != 0)
        return rv;

    /* A signal handler in the caller's process (a profiler, Python's
     * SIGINT) interrupts the wait; that is not a failure of the call.  An
     * interrupted send sent nothing. */
    while ((n = nn_send(c->sock, c->tx, len, 0)) < 0 && nn_errno() == EINTR)
        ;
    if (n < 0) {
        int e = nn_errno();
        rv = e == ETIMEDOUT || e == EAGAIN
                 ? rnc_fail(c, RN_TIMEOUT, "%s: could not send to %s within %d ms",
                            rnp_op_name((int)op), c->endpoint, timeout_ms)
                 : rnc_fail(c, RN_SYSTEM, "%s: send: %s", rnp_op_name((int)op), nn_strerror(e));
        goto out;
    }
    for (uint64_t deadline = rnc_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000u;
         ;) {
        n = nn_recv(c->sock, &msg, NN_MSG, 0);
        if (n >= 0 || nn_errno() != EINTR)
            break;
        /* Interrupted: wait for what is left of the timeout, no longer
         * (signals that come often must not stretch it forever). */
        if (timeout_ms >= 0) {
            uint64_t now = rnc_now_ns();
            int left = now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
            if (left == 0) {
                errno = ETIMEDOUT;
                break;
            }
            nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &left, sizeof left);
            retimed = true;
        }
    }
    if (n < 0) {
        int e = nn_errno();
        rv = e == ETIMEDOUT || e == EAGAIN
                 ? rnc_fail(c, RN_TIMEOUT, "%s: no reply from %s within %d ms",
                            rnp_op_name((int)op), c->endpoint, timeout_ms)
                 : rnc_fail(c, RN_SYSTEM, "%s: receive: %s", rnp_op_name((int)op), nn_strerror(e));
        if (rv == RN_TIMEOUT) {
            reopen_socket(c);
            retimed = false;   /* the new socket has c's own timeouts */
        }
        goto out;
    }
    rv = rnp_decode_reply(msg, (size_t)n, &c->rep, &err);
    if (rv != 0) {
        rv = rnc_fail(c, RN_BAD_REPLY, "%s reply: %s", rnp_op_name((int)op), err.msg);
        goto out;
    }
    if (c->rep.op != op || c->rep.id != id) {
        /* A daemon that could not read our request answers op 0 / id 0
         * with its reason: pass that on, it says more than a mismatch. */
        if (c->rep.status != 0)
            rv = rnc_fail(c, c->rep.status, "%s", c->rep.error);
        else
            rv = rnc_fail(c, RN_BAD_REPLY, "reply is for op %u id %llu, expected %s id %llu",
                          c->rep.op, (unsigned long long)c->rep.id, rnp_op_name((int)op),
                          (unsigned long long)id);
        goto out;
    }
    if (c->rep.status != 0) {
        rv = rnc_fail(c, c->rep.status, "%s",
                      c->rep.error[0] ? c->rep.error : rn_strerror(c->rep.status));
        goto out;
    }
    rv = 0;
out:
    if (msg)
        nn_freemsg(msg);
    if (c->sock >= 0 && (timeout_ms != c->timeout_ms || retimed))
        set_timeouts(c, c->timeout_ms);
    return rv;
}

/* ---- sessions ------------------------------------------------------------------------ */

static int hello(rn_client *c)
{
    int rv;
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_HELLO;
    snprintf(c->req.u.hello.client_name, sizeof c->req.u.hello.client_name, "%s", c->name);
    c->req.u.hello.pid = (uint32_t)getpid();
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        return rv;
    c->session = c->rep.u.hello.session;
    c->hello = c->rep.u.hello;
    c->have_session = true;
    return 0;
}

void rnc_end_session(rn_client *c)
{
    char keep[RN_ERRMSG_LEN];
    int t = c->timeout_ms < 0 || c->timeout_ms > BYE_TIMEOUT_MS ? BYE_TIMEOUT_MS : c->timeout_ms;

    snprintf(keep, sizeof keep, "%s", c->last_error);
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_BYE;
    c->req.u.bye = c->session;
    (void)rnc_transact(c, t);
    c->have_session = false;
    snprintf(c->last_error, sizeof c->last_error, "%s", keep);
}

int rnc_ensure_session(rn_client *c)
{
    int rv;
    if (c->have_session)
        return 0;
    if ((rv = hello(c)) != 0)
        return rv;
    for (size_t i = 0; i < c->nbufs; i++) {
        c->bufs[i].region = 0;
        if ((rv = rnc_register(c, &c->bufs[i])) != 0) {
            char why[RN_ERRMSG_LEN];
            snprintf(why, sizeof why, "%s", c->last_error);
            /* End the half-built session now: the process lives on, so the
             * daemon's pid watch would not, and each retry would hold
             * another session until the idle timeout.  The next call
             * starts over with a fresh HELLO. */
            rnc_end_session(c);
            return rnc_fail(c, rv, "re-registering buffer %s after a new session: %s",
                            c->bufs[i].name, why);
        }
    }
    return 0;
}

/* Open c's REQ socket with its options and connect it (c->sock < 0 before). */
static int open_socket(rn_client *c)
{
    int v = RNP_MAX_MSG, sock = nn_socket(AF_SP, NN_REQ);

    if (sock < 0)
        return rnc_fail(c, RN_SYSTEM, "nn_socket: %s", nn_strerror(nn_errno()));
    c->sock = sock;
    if (nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &v, sizeof v) != 0)
        return rnc_fail(c, RN_SYSTEM, "NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
    if (set_timeouts(c, c->timeout_ms) != 0)
        return RN_SYSTEM;
    if (nn_connect(sock, c->endpoint) < 0)
        return rnc_fail(c, RN_ENDPOINT, "endpoint %s: %s", c->endpoint, nn_strerror(nn_errno()));
    return 0;
}

/*
 * After a timeout the REQ socket still holds the request and would send it
 * again after NN_REQ_RESEND_IVL (60 s), long after this call gave up: a
 * HELLO or REGISTER sent that way would open a session or pin memory that
 * no one knows of.  A fresh socket drops it.  Failing to open one leaves
 * c->sock < 0, and the next call reports it.
 */
static void reopen_socket(rn_client *c)
{
    if (c->sock >= 0)
        nn_close(c->sock);
    c->sock = -1;
    if (open_socket(c) != 0 && c->sock >= 0) {
        nn_close(c->sock);
        c->sock = -1;
    }
}

int rn_connect(const rn_connect_opts *opts, rn_client **out)
{
    rn_connect_opts o = {0};
    char epbuf[256];
    rn_client *c = NULL;
    int rv;

    connect_error[0] = '\0';
    if (out == NULL)
        return connect_fail(RN_INVALID_ARGUMENT, "out: must not be NULL");
    if (opts)
        o = *opts;
    if (o.timeout_ms < -1)
        return connect_fail(RN_INVALID_ARGUMENT, "timeout_ms: %d is negative (-1 means forever)",
                            o.timeout_ms);
    if (o.endpoint == NULL) {
        if (rn_default_endpoint(epbuf, sizeof epbuf) == NULL)
            return connect_fail(RN_ENDPOINT, "endpoint: the default endpoint is too long");
        o.endpoint = epbuf;
    }
    if (strlen(o.endpoint) >= sizeof c->endpoint)
        return connect_fail(RN_ENDPOINT, "endpoint: longer than %zu bytes", sizeof c->endpoint - 1);
    if ((rv = check_endpoint(o.endpoint)) != 0)
        return rv;

    c = calloc(1, sizeof *c);
    if (c == NULL)
        return connect_fail(RN_NOMEM, "out of memory for the client");
    c->sock = -1;
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", o.endpoint);
    c->timeout_ms = o.timeout_ms == 0 ? RN_DEFAULT_TIMEOUT_MS : o.timeout_ms;
    if (o.client_name && *o.client_name)
        snprintf(c->name, sizeof c->name, "%s", o.client_name);
    else
        snprintf(c->name, sizeof c->name, "pid %ld", (long)getpid());

    if ((rv = open_socket(c)) != 0) {
        connect_fail(rv, "%s", c->last_error);
        goto fail;
    }
    rnc_sweep_stale();
    if ((rv = hello(c)) != 0) {
        connect_fail(rv == RN_TIMEOUT ? RN_UNREACHABLE : rv, "%s", c->last_error);
        rv = rv == RN_TIMEOUT ? RN_UNREACHABLE : rv;
        goto fail;
    }
    *out = c;
    return 0;
fail:
    if (c->sock >= 0)
        nn_close(c->sock);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return rv;
}

#ifdef RN_HAVE_CUDA
/* client_cuda.c: frees the client's CUDA state (events, allocation cache). */
void rnc_cuda_release(rn_client *c);
#endif

void rn_close(rn_client *c)
{
    if (c == NULL)
        return;
#ifdef RN_HAVE_CUDA
    rnc_cuda_release(c);
#endif
    pthread_mutex_lock(&c->mu);
    if (c->have_session)
        rnc_end_session(c);
    for (size_t i = 0; i < c->nbufs; i++)
        rnc_buf_release(&c->bufs[i]);
    free(c->bufs);
    if (c->sock >= 0)
        nn_close(c->sock);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- observation ----------------------------------------------------------------------- */

int rn_ping(rn_client *c, uint64_t *rtt_ns)
{
    int rv;
    uint64_t t0;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_PING;
    t0 = rnc_now_ns();
    rv = rnc_transact(c, c->timeout_ms);
    if (rv == 0 && rtt_ns)
        *rtt_ns = rnc_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_health(rn_client *c, rn_health_info *h)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if (h == NULL) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "h: must not be NULL");
        pthread_mutex_unlock(&c->mu);
        return rv;
    }
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_HEALTH;
    rv = rnc_transact(c, c->timeout_ms);
    if (rv == 0) {
        const rnp_health_rep *r = &c->rep.u.health;
        rn_health_info hi;
        memset(&hi, 0, sizeof hi);
        hi.state = (int)r->state;
        hi.mps = r->mps;
        snprintf(hi.backend, sizeof hi.backend, "%s", r->backend);
        hi.nreasons = r->nreasons <= RN_MAX_REASONS ? r->nreasons : RN_MAX_REASONS;
        for (unsigned i = 0; i < hi.nreasons; i++)
            snprintf(hi.reasons[i], sizeof hi.reasons[i], "%s", r->reasons[i]);
        *h = hi;
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int rn_stats(rn_client *c, rn_stats_info *s)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if (s == NULL) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "s: must not be NULL");
        pthread_mutex_unlock(&c->mu);
        return rv;
    }
    memset(&c->req, 0, sizeof c->req);
    c->req.op = RN_OP_STATS;
    rv = rnc_transact(c, c->timeout_ms);
    if (rv == 0) {
        const rnp_stats_rep *r = &c->rep.u.stats;
        memset(s, 0, sizeof *s);
        snprintf(s->backend, sizeof s->backend, "%s", r->backend);
        snprintf(s->device, sizeof s->device, "%s", r->device);
        s->nstats = r->nstats <= RN_MAX_STATS ? r->nstats : RN_MAX_STATS;
        for (unsigned i = 0; i < s->nstats; i++) {
            snprintf(s->stats[i].name, sizeof s->stats[i].name, "%s", r->stats[i].name);
            s->stats[i].value = r->stats[i].value;
        }
        s->nhists = r->nhists <= RN_MAX_HISTS ? r->nhists : RN_MAX_HISTS;
        for (unsigned i = 0; i < s->nhists; i++) {
            const rnp_hist *hp = &r->hists[i];
            snprintf(s->hists[i].name, sizeof s->hists[i].name, "%s", hp->name);
            s->hists[i].count = hp->count;
            s->hists[i].p50 = hp->p50;
            s->hists[i].p90 = hp->p90;
            s->hists[i].p99 = hp->p99;
            s->hists[i].max = hp->max;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}

uint64_t rn_stats_get(const rn_stats_info *s, const char *name, uint64_t dflt)
{
    if (s == NULL || name == NULL)
        return dflt;
    for (unsigned i = 0; i < s->nstats && i < RN_MAX_STATS; i++)
        if (strcmp(s->stats[i].name, name) == 0)
            return s->stats[i].value;
    return dflt;
}

int rn_server_info(rn_client *c, struct rn_server_info *i)
{
    int rv;
    if (c == NULL)
        return RN_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if (i == NULL) {
        rv = rnc_fail(c, RN_INVALID_ARGUMENT, "i: must not be NULL");
        pthread_mutex_unlock(&c->mu);
        return rv;
    }
    /* After a daemon restart, describe the daemon that runs now. */
    rv = rnc_ensure_session(c);
    if (rv == 0) {
        const rnp_hello_rep *h = &c->hello;
        struct rn_server_info si;
        memset(&si, 0, sizeof si);
        snprintf(si.endpoint, sizeof si.endpoint, "%s", c->endpoint);
        snprintf(si.daemon_version, sizeof si.daemon_version, "%s", h->daemon_version);
        snprintf(si.backend, sizeof si.backend, "%s", h->backend);
        snprintf(si.device_name, sizeof si.device_name, "%s", h->device_name);
        memcpy(si.device_uuid, h->device_uuid, sizeof si.device_uuid);
        si.sm_count = h->sm_count;
        si.cc_major = h->cc_major;
        si.cc_minor = h->cc_minor;
        si.mps = h->mps;
        si.protocol_version = RNP_VERSION;
        si.max_sessions = h->limits.max_sessions;
        si.max_regions = h->limits.max_regions;
        si.max_inflight = h->limits.max_inflight;
        si.max_inflight_total = h->limits.max_inflight_total;
        si.max_m = h->limits.max_m;
        si.max_n = h->limits.max_n;
        si.max_msg = h->limits.max_msg;
        si.event_slots = h->limits.event_slots;
        *i = si;
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}
