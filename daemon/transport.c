/* SPDX-License-Identifier: MIT */
/*
 * transport.c - the core's link to the front process (front.h): start it,
 * restart it when it dies, turn its datagrams into received messages, and
 * send replies back under the token each request came with.  Knows nothing
 * of what a message means: the receive callback decides.
 */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctx.h"
#include "front.h"
#include "log.h"

/* A reply waiting for room on the link. */
typedef struct pending {
    rn_queue link;
    size_t len;
    uint8_t bytes[];
} pending;

/* How long start-up waits for the first front to bind. */
#define FRONT_READY_MS 10000
#define RBUF_BYTES (sizeof(rnd_link_hdr) + RND_RCV_MAX)

static void *handle_of(uint32_t gen, uint32_t token)
{
    return (void *)(uintptr_t)(((uint64_t)gen << 32) | token);
}

static void start_front(rnd_ctx *ctx);
static void on_link(uv_poll_t *h, int status, int events);

/* ---- sending on the link -------------------------------------------------------------- */

static void want_writable(rnd_ctx *ctx, bool on)
{
    rnd_transport *t = &ctx->tx;
    if (!t->poll_init || t->poll_writable == on)
        return;
    t->poll_writable = on;
    uv_poll_start(&t->poll, UV_READABLE | (on ? UV_WRITABLE : 0), on_link);
}

/* Send one datagram, or queue it when the link is full.  A front that is
 * gone (or was replaced: control's generation) gets nothing. */
static void link_send(rnd_ctx *ctx, void *control, uint32_t kind, const void *body, size_t len)
{
    rnd_transport *t = &ctx->tx;
    uint64_t h64 = (uint64_t)(uintptr_t)control;
    rnd_link_hdr h = {kind, (uint32_t)h64, 0};
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, len}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    pending *p;
    ssize_t n;

    if ((uint32_t)(h64 >> 32) != t->gen || t->fd < 0) {
        t->replies_dropped++;
        return;
    }
    if (rn_queue_empty(&t->out)) {
        do
            n = sendmsg(t->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n >= 0)
            return;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            /* The front is going away (its exit restarts it), or the reply
             * does not fit a datagram (EMSGSIZE): dropped, counted. */
            t->replies_dropped++;
            return;
        }
    }
    if (!(p = malloc(sizeof *p + sizeof h + len))) {
        rnd_err("Out of memory queueing a reply: dropped");
        t->replies_dropped++;
        return;
    }
    p->len = sizeof h + len;
    memcpy(p->bytes, &h, sizeof h);
    memcpy(p->bytes + sizeof h, body, len);
    rn_queue_push_back(&t->out, &p->link);
    want_writable(ctx, true);
}

static void flush_out(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;
    rn_queue *q;

    while ((q = rn_queue_head(&t->out))) {
        pending *p = RN_QUEUE_DATA(q, pending, link);
        ssize_t n = send(t->fd, p->bytes, p->len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        rn_queue_remove(q);
        free(p);
    }
    want_writable(ctx, false);
}

static void drop_out(rnd_transport *t)
{
    rn_queue *q;
    while ((q = rn_queue_head(&t->out))) {
        rn_queue_remove(q);
        free(RN_QUEUE_DATA(q, pending, link));
        t->replies_dropped++;
    }
}

/* ---- replies ---------------------------------------------------------------------------- */

void rnd_reply_init(rnp_reply *rep, uint32_t op, uint64_t id)
{
    memset(rep, 0, offsetof(rnp_reply, u));
    rep->version = RNP_VERSION;
    rep->op = op;
    rep->id = id;
}

void rnd_reply(rnd_ctx *ctx, void *control, rnp_reply *rep)
{
    rnd_transport *t = &ctx->tx;
    rnp_error err = {0};
    size_t len = 0;

    if (rnp_encode_reply(rep, t->buf, sizeof t->buf, &len, &err) != 0) {
        rnd_err("Failed to encode the reply to %s id %llu: %s", rnp_op_name((int)rep->op),
                (unsigned long long)rep->id, err.msg);
        rnd_reply_init(rep, rep->op, rep->id);
        rep->status = RN_INTERNAL;
        snprintf(rep->error, sizeof rep->error, "reply could not be encoded: %.150s", err.msg);
        if (rnp_encode_reply(rep, t->buf, sizeof t->buf, &len, &err) != 0) {
            link_send(ctx, control, RND_LINK_FORGET, NULL, 0);
            return;
        }
    }
    rnd_stats_reply(&ctx->stats, rep->status);
    if (rep->status != 0)
        rnd_debug("Reply %s id %llu: %s: %s", rnp_op_name((int)rep->op),
                  (unsigned long long)rep->id, rnp_err_name(rep->status), rep->error);
    if (control)
        link_send(ctx, control, RND_LINK_REP, t->buf, len);
}

void rnd_reply_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id, int code,
                     const char *fmt, ...)
{
    rnp_reply rep;
    va_list ap;

    rnd_reply_init(&rep, op, id);
    rep.status = code;
    va_start(ap, fmt);
    vsnprintf(rep.error, sizeof rep.error, fmt, ap);
    va_end(ap);
    rnd_reply(ctx, control, &rep);
}

void rnd_reply_rnp_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id,
                         const rnp_error *err)
{
    rnd_reply_error(ctx, control, op, id, err->code ? err->code : RN_INTERNAL, "%s",
                    err->msg[0] ? err->msg : rnp_strerror(err->code));
}

/* ---- receiving -------------------------------------------------------------------------- */

static void on_spin(uv_idle_t *idle)
{
    rnd_transport *t = &((rnd_ctx *)idle->data)->tx;
    if (rnd_now_ns() >= t->spin_until)
        uv_idle_stop(idle);
}

/* Keep the loop awake for a while (an active idle handle makes its poll
 * return at once): the next request then finds it running. */
static void spin(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;
    if (!t->timer_init || t->closing || ctx->cfg.spin_us <= 0)
        return;
    t->spin_until = rnd_now_ns() + (uint64_t)ctx->cfg.spin_us * 1000;
    uv_idle_start(&t->spin, on_spin);
}

void rnd_transport_receive_all(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;

    while (t->fd >= 0) {
        ssize_t n = recv(t->fd, t->rbuf, RBUF_BYTES, MSG_DONTWAIT);
        rnd_link_hdr h;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;   /* empty, or the front closed its end: its exit follows */
        if ((size_t)n < sizeof h)
            continue;
        memcpy(&h, t->rbuf, sizeof h);
        if (h.kind == RND_LINK_REQ && h.token != 0) {
            void *control = handle_of(t->gen, h.token);
            t->last_req = h.token;
            spin(ctx);
            t->rx(ctx, &control, t->rbuf + sizeof h, (size_t)n - sizeof h, h.recv_ns);
            if (control)
                link_send(ctx, control, RND_LINK_FORGET, NULL, 0);
        } else if (h.kind == RND_LINK_READY) {
            rnd_notice("Front process %d serving %s again (%llu ms after its restart)",
                       t->front.pid, ctx->cfg.endpoint,
                       (unsigned long long)((rnd_now_ns() - t->last_restart_ns) / 1000000));
        } else if (h.kind == RND_LINK_PROBE_OK && h.token == t->probe_token && t->probe_sent_ns) {
            if (t->probe_failed)
                rnd_notice("The front process answers its probe again");
            rnd_debug("Front probe answered in %llu us",
                      (unsigned long long)((rnd_now_ns() - t->probe_sent_ns) / 1000));
            t->probe_sent_ns = 0;
            t->probe_failed = false;
        } else if (h.kind == RND_LINK_REFUSED) {
            /* The front's count since it started; a new front starts at 0. */
            uint64_t now = rnd_now_ns();
            t->refused_last_ns = now;
            if (h.recv_ns > t->refused_front) {
                t->refused += h.recv_ns - t->refused_front;
                t->refused_front = h.recv_ns;
            }
            if (!t->refused_logged_ns || now - t->refused_logged_ns > 10000000000ull) {
                rnd_warn("Refusing new connections: %u are open, the limit (--max-connections); "
                         "%llu refused by this front",
                         ctx->cfg.max_connections, (unsigned long long)h.recv_ns);
                t->refused_logged_ns = now;
            }
        } else if (h.kind == RND_LINK_FAIL) {
            rnd_err("Front process: %.*s", (int)((size_t)n - sizeof h),
                    (const char *)t->rbuf + sizeof h);
        }
    }
}

static void on_link(uv_poll_t *h, int status, int events)
{
    rnd_ctx *ctx = h->data;

    if (events & UV_WRITABLE)
        flush_out(ctx);
    if (events & UV_READABLE || status < 0)
        rnd_transport_receive_all(ctx);
}

/* ---- the front's life ------------------------------------------------------------------- */

static void close_link(rnd_transport *t)
{
    if (t->poll_init && !uv_is_closing((uv_handle_t *)&t->poll))
        uv_close((uv_handle_t *)&t->poll, NULL);
    t->poll_init = false;
    t->poll_writable = false;
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    drop_out(t);
}

/* Close the timers when start-up fails (the loop must end). */
static void close_timers(rnd_transport *t)
{
    if (!uv_is_closing((uv_handle_t *)&t->restart_timer))
        uv_close((uv_handle_t *)&t->restart_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&t->probe_timer))
        uv_close((uv_handle_t *)&t->probe_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&t->spin))
        uv_close((uv_handle_t *)&t->spin, NULL);
}

static void on_restart_timer(uv_timer_t *timer)
{
    start_front(timer->data);
}

/* Each RND_PROBE_MS: a probe unanswered since the last tick means the front
 * does not serve (a new client would not get in either): restart it.  Else
 * start the next probe. */
static void on_probe_timer(uv_timer_t *timer)
{
    rnd_ctx *ctx = timer->data;
    rnd_transport *t = &ctx->tx;

    if (t->closing || !t->front_running || t->fd < 0)
        return;
    if (t->probe_sent_ns) {
        t->probe_failed = true;
        t->probe_sent_ns = 0;
        rnd_err("Front process %d did not answer a connection to its own endpoint within %d "
                "ms: restarting it", t->front.pid, RND_PROBE_MS);
        uv_process_kill(&t->front, SIGKILL);   /* its exit restarts it */
        return;
    }
    t->probe_token++;
    t->probe_sent_ns = rnd_now_ns();
    link_send(ctx, handle_of(t->gen, t->probe_token), RND_LINK_PROBE, NULL, 0);
}

static void on_kill_timer(uv_timer_t *timer)
{
    rnd_ctx *ctx = timer->data;
    if (ctx->tx.front_running) {
        rnd_warn("Front process %d did not exit: killing it", ctx->tx.front.pid);
        uv_process_kill(&ctx->tx.front, SIGKILL);
    }
}

static void on_front_closed(uv_handle_t *h)
{
    rnd_ctx *ctx = h->data;
    rnd_transport *t = &ctx->tx;
    uint64_t now = rnd_now_ns(), delay_ms = 0;

    if (t->closing) {
        if (t->timer_init && !uv_is_closing((uv_handle_t *)&t->restart_timer))
            uv_close((uv_handle_t *)&t->restart_timer, NULL);
        return;
    }
    if (t->spawn_failed) {
        t->spawn_failed = false;
        uv_timer_start(&t->restart_timer, on_restart_timer, 1000, 0);
        return;
    }
    /* Restart at once, unless it died RND_FRONT_RESTARTS times within a
     * minute: then report failing and go on trying once a second. */
    if (rnd_transport_flapping(ctx))
        delay_ms = 1000;
    t->restarts[t->nrestarts % RND_FRONT_RESTARTS] = now;
    t->nrestarts++;
    ctx->stats.front_restarts++;
    uv_timer_start(&t->restart_timer, on_restart_timer, delay_ms, 0);
}

static void on_front_exit(uv_process_t *p, int64_t status, int sig)
{
    rnd_ctx *ctx = p->data;
    rnd_transport *t = &ctx->tx;

    t->front_running = false;
    if (t->closing)
        rnd_debug("Front process %d exited", p->pid);
    else if (sig == SIGKILL && t->probe_failed)
        rnd_notice("Front process %d stopped; starting a new one", p->pid);
    else if (sig)
        rnd_err("Front process %d died of signal %d (nanomsg aborts on malformed frames): "
                "restarting it; sessions and GPU work are unaffected", p->pid, sig);
    else
        rnd_err("Front process %d exited with status %lld: restarting it", p->pid,
                (long long)status);
    close_link(t);
    uv_close((uv_handle_t *)p, on_front_closed);
}

/* Spawn a front with a fresh link; 0 or an errno-style libuv code. */
static int spawn_front(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;
    char mode[16];
    int sv[2], rc;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -errno;
    snprintf(mode, sizeof mode, "%04o", (unsigned)ctx->cfg.socket_mode);
    t->refused_front = 0;
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    char maxconn[16], spin[16];
    snprintf(maxconn, sizeof maxconn, "%u", (unsigned)ctx->cfg.max_connections);
    snprintf(spin, sizeof spin, "%d", (int)ctx->cfg.spin_us);
    char *args[] = {t->exe, "--front", pid,    ctx->cfg.endpoint, mode, ctx->cfg.socket_group,
                    maxconn, spin, NULL};
    uv_stdio_container_t io[4] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = 1},
        {.flags = UV_INHERIT_FD, .data.fd = 2},
        {.flags = UV_INHERIT_FD, .data.fd = sv[1]},
    };
    uv_process_options_t o = {
        .exit_cb = on_front_exit,
        .file = t->exe,
        .args = args,
        .stdio_count = 4,
        .stdio = io,
    };
    t->front.data = ctx;
    if ((rc = uv_spawn(ctx->loop, &t->front, &o)) != 0) {
        close(sv[0]);
        close(sv[1]);
        /* uv_spawn added the handle to the loop even so: it must be closed
         * before the handle is used again. */
        t->spawn_failed = true;
        uv_close((uv_handle_t *)&t->front, on_front_closed);
        return rc;
    }
    /* Room for the largest message in one datagram, whatever the host's
     * default socket buffers. */
    int sz = (int)(2 * RBUF_BYTES);
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    close(sv[1]);
    t->front_running = true;
    t->gen++;
    /* The new front numbers its requests from 1 again: the drain's
     * LAST_READ must not name the old front's last (found in review). */
    t->last_req = 0;
    t->fd = sv[0];
    t->probe_sent_ns = 0;
    return 0;
}

static int watch_link(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;
    int rc;

    if ((rc = uv_poll_init(ctx->loop, &t->poll, t->fd)) != 0)
        return rc;
    t->poll_init = true;
    t->poll.data = ctx;
    return uv_poll_start(&t->poll, UV_READABLE, on_link);
}

/* A restart: asynchronous, the new front says READY or FAIL on the link. */
static void start_front(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;
    int rc;

    if (t->closing)
        return;
    t->last_restart_ns = rnd_now_ns();
    if ((rc = spawn_front(ctx)) != 0) {
        /* The handle's close callback tries again in a second. */
        rnd_err("Failed to restart the front process: %s; trying again in 1 s", uv_strerror(rc));
    } else if ((rc = watch_link(ctx)) != 0) {
        rnd_err("Failed to watch the front's link: %s; restarting it", uv_strerror(rc));
        close_link(t);
        uv_process_kill(&t->front, SIGKILL);   /* its exit restarts it */
    }
}

int rnd_transport_open(rnd_ctx *ctx, rnd_rx_fn rx, rnp_error *err)
{
    rnd_transport *t = &ctx->tx;
    rnd_link_hdr h;
    ssize_t n;
    int rc;

    t->fd = -1;
    t->rx = rx;
    rn_queue_init(&t->out);
    if (!(t->rbuf = malloc(RBUF_BYTES)))
        return rnp_fail(err, RN_NOMEM, "transport: out of memory");
    /* The front is this binary.  Its path, as the kernel names it (valgrind
     * answers this with the program it runs, where executing
     * /proc/self/exe would start valgrind's own tool); once a package
     * upgrade has replaced the file ("... (deleted)"), /proc/self/exe, which
     * still is the very binary the core runs. */
    ssize_t len = readlink("/proc/self/exe", t->exe, sizeof t->exe - 1);
    if (len < 0 || (size_t)len >= sizeof t->exe - 1)
        len = 0;
    t->exe[len] = '\0';
    if (!t->exe[0] || access(t->exe, X_OK) != 0)
        snprintf(t->exe, sizeof t->exe, "/proc/self/exe");
    uv_timer_init(ctx->loop, &t->restart_timer);
    t->restart_timer.data = ctx;
    uv_timer_init(ctx->loop, &t->probe_timer);
    t->probe_timer.data = ctx;
    uv_idle_init(ctx->loop, &t->spin);
    t->spin.data = ctx;
    t->timer_init = true;
    if ((rc = spawn_front(ctx)) != 0) {
        t->closing = true;
        close_timers(t);
        return rnp_fail(err, RN_SYSTEM, "Failed to start the front process: %s",
                        uv_strerror(rc));
    }
    /* The first front binds before the daemon says READY=1: wait for it. */
    struct pollfd pf = {t->fd, POLLIN, 0};
    do
        rc = poll(&pf, 1, FRONT_READY_MS);
    while (rc < 0 && errno == EINTR);
    n = rc > 0 ? recv(t->fd, t->rbuf, RBUF_BYTES, 0) : -1;
    if (n >= (ssize_t)sizeof h)
        memcpy(&h, t->rbuf, sizeof h);
    if (n < (ssize_t)sizeof h || h.kind != RND_LINK_READY) {
        if (n >= (ssize_t)sizeof h && h.kind == RND_LINK_FAIL)
            rnp_fail(err, RN_ENDPOINT, "%.*s", (int)(n - (ssize_t)sizeof h),
                     (const char *)t->rbuf + sizeof h);
        else
            rnp_fail(err, RN_SYSTEM, "The front process did not start (%s)",
                     rc == 0 ? "no answer within 10 s" : "it exited");
        t->closing = true;
        close_link(t);
        close_timers(t);
        uv_process_kill(&t->front, SIGKILL);
        return err ? err->code : RN_SYSTEM;
    }
    if ((rc = watch_link(ctx)) != 0) {
        t->closing = true;
        close_link(t);
        close_timers(t);
        uv_process_kill(&t->front, SIGKILL);
        return rnp_fail(err, RN_SYSTEM, "Failed to poll the front's link: %s", uv_strerror(rc));
    }
    uv_timer_start(&t->probe_timer, on_probe_timer, RND_PROBE_MS, RND_PROBE_MS);
    uv_unref((uv_handle_t *)&t->probe_timer);
    return 0;
}

void rnd_transport_close(rnd_ctx *ctx)
{
    rnd_transport *t = &ctx->tx;

    if (t->closing && t->fd < 0)
        return;
    t->closing = true;
    uv_timer_stop(&t->restart_timer);
    if (t->timer_init && !uv_is_closing((uv_handle_t *)&t->probe_timer))
        uv_close((uv_handle_t *)&t->probe_timer, NULL);
    if (t->timer_init && !uv_is_closing((uv_handle_t *)&t->spin))
        uv_close((uv_handle_t *)&t->spin, NULL);
    if (t->fd >= 0) {
        /* The replies still queued go out as far as the link takes them now;
         * never blocking: a full link means the front is itself blocked
         * sending to us, and waiting here would wait forever. */
        flush_out(ctx);
        if (!rn_queue_empty(&t->out))
            rnd_warn("The drain drops replies the front could not take in time");
        /* The requests after the last one read were never seen here: the
         * front answers them RN_DRAINING (a reply dropped above is for a
         * request read, which the front leaves unanswered). */
        rnd_link_hdr last = {RND_LINK_LAST_READ, t->last_req, 0};
        if (send(t->fd, &last, sizeof last, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof last)
            rnd_warn("The front could not be told which requests the drain did not read");
        /* EOF tells the front to close the socket, remove its file and
         * exit; its exit closes the process handle, and the loop ends. */
        shutdown(t->fd, SHUT_WR);
    }
    close_link(t);
    if (t->front_running)
        /* A front wedged inside nanomsg would hold the loop (and the exit)
         * forever: it gets two seconds. */
        uv_timer_start(&t->restart_timer, on_kill_timer, 2000, 0);
    else if (t->timer_init && !uv_is_closing((uv_handle_t *)&t->restart_timer))
        uv_close((uv_handle_t *)&t->restart_timer, NULL);
    free(t->rbuf);
    t->rbuf = NULL;
}

bool rnd_transport_flapping(const rnd_ctx *ctx)
{
    const rnd_transport *t = &ctx->tx;
    /* The slot of the next restart holds the RND_FRONT_RESTARTS-th last. */
    uint64_t oldest = t->restarts[t->nrestarts % RND_FRONT_RESTARTS];
    return t->nrestarts >= RND_FRONT_RESTARTS && rnd_now_ns() - oldest < 60000000000ull;
}

bool rnd_transport_serving(const rnd_ctx *ctx)
{
    return ctx->tx.front_running && !rnd_transport_flapping(ctx) && !ctx->tx.probe_failed;
}
