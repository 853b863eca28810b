/* SPDX-License-Identifier: MIT */
/*
 * chan.c - the session channel (chan.h): the listening socket, accept with
 * the peer's credentials, and the requests AUTH, REGISTER_FD, VMM_CHUNK and
 * VMM_MAP (the last two: chan_vmm.c), each parsed by proto (rnp_chan_parse)
 * before anything is done with it.
 */
#include "chan.h"
#include "chan_vmm.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctx.h"
#include "log.h"
#include "ring.h"

/* A session's bell (PROTOCOL.md 12, AUTH_OK): a stream socket pair whose
 * one end the client gets and sends a byte on when it published a slot and
 * the daemon sleeps; the loop polls the other end and takes the slots at
 * once, one wake-up instead of the doorbell thread's and then the loop's.
 * Two sockets, not an eventfd: nothing the client does to its end
 * (O_NONBLOCK off, reading) reaches the daemon's; and not a pipe: a send
 * with MSG_NOSIGNAL raises no SIGPIPE in a client whose daemon died.
 * Apart from its connection: libuv lets go of a handle only in a later
 * callback. */
typedef struct bell {
    uv_poll_t poll;
    int fd, wfd;                   /* the daemon's end; the client's until sent (then -1) */
    struct conn *c;                /* whose: valid while the poll runs */
} bell;

typedef struct conn conn;

struct conn {
    int fd;
    uv_poll_t poll;
    bell *bell;                    /* NULL: none (no fast path, or not bound yet) */
    uint32_t pid, uid;             /* SO_PEERCRED at accept */
    uint64_t accepted_ns;
    rnd_session *sess;             /* bound by AUTH; NULL before and after */
    rnd_ctx *ctx;
    rnd_vmm_pending vmm;           /* VMM_CHUNKs waiting for their VMM_MAP */
    rn_queue link;
};

static void on_conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    close(c->fd);
    free(c);
}

static void on_bell_closed(uv_handle_t *h)
{
    bell *b = h->data;
    close(b->fd);
    if (b->wfd >= 0)
        close(b->wfd);
    free(b);
}

/* A bell rang: what came is read (a bounded amount: a client writing
 * without pause costs wake-ups, not a loop that never ends), and the loop
 * takes the rings' slots, unless the session's ring has none new. */
static void on_bell(uv_poll_t *h, int status, int events)
{
    bell *b = h->data;
    char buf[256];
    ssize_t n = 0;
    (void)status, (void)events;
    for (int i = 0; i < 16 && (n = recv(b->fd, buf, sizeof buf, MSG_DONTWAIT)) ==
                                   (ssize_t)sizeof buf;
         i++) {
    }
    if (n == 0) {
        /* The client closed its end (RMSNORMD_BELL=0, or its exit): a
         * socket at its end reads as ready for good, so it is polled no
         * more; the doorbell serves. */
        uv_poll_stop(&b->poll);
        return;
    }
    rnd_rings_bell(&b->c->ctx->rings, b->c->sess);
}

/* A bell for c's session, or NULL (then the client rings the doorbell). */
static bell *bell_new(conn *c)
{
    bell *b = calloc(1, sizeof *b);
    int p[2];

    if (!b || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, p) != 0) {
        free(b);
        return NULL;
    }
    b->fd = p[0];
    b->wfd = p[1];
    b->c = c;
    b->poll.data = b;
    if (uv_poll_init(c->ctx->loop, &b->poll, b->fd) != 0) {
        close(p[0]);
        close(p[1]);
        free(b);
        return NULL;
    }
    if (uv_poll_start(&b->poll, UV_READABLE, on_bell) != 0) {
        uv_close((uv_handle_t *)&b->poll, on_bell_closed);
        return NULL;
    }
    return b;
}

/* Forget c; its session, if any, has let go of it already. */
static void conn_free(conn *c)
{
    rnd_chan *ch = &c->ctx->chan;

    if (c->bell) {
        uv_poll_stop(&c->bell->poll);
        uv_close((uv_handle_t *)&c->bell->poll, on_bell_closed);
        c->bell = NULL;
    }

    rnd_vmm_pending_clear(c->ctx->be, &c->vmm);
    rnd_vmm_pending_free(&c->vmm);
    rn_queue_remove(&c->link);
    ch->nconns--;
    uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

/* The connection ends: so does the session bound to it.  Its client closed
 * it (or exited), or stopped reading: nobody waits for the session's queued
 * work any more. */
static void conn_end(conn *c, const char *why)
{
    rnd_session *s = c->sess;

    if (s) {
        c->sess = NULL;
        s->chan = NULL;
        rnd_session_client_gone(s, why);
    }
    conn_free(c);
}

/* The session table's unbind hook: s ends, and its connection with it. */
static void unbind(rnd_session *s)
{
    conn *c = s->chan;

    s->chan = NULL;
    if (c) {
        c->sess = NULL;
        conn_free(c);
    }
}

/* Encode and send one reply, with descriptor fd attached unless it is -1;
 * a client that does not read its replies loses its connection.  Returns
 * 0, or -1 after ending c. */
static int send_rep_fd(conn *c, const rnp_chan_msg *rep, int fd)
{
    int e = rnp_chan_send(c->fd, rep, fd);

    if (!e)
        return 0;
    rnd_debug("Session channel of pid %u: reply not sent (%s): closing", (unsigned)c->pid,
              e == EMSGSIZE ? "short" : strerror(e));
    conn_end(c, "session channel closed");
    return -1;
}

static int send_rep(conn *c, const rnp_chan_msg *rep)
{
    return send_rep_fd(c, rep, -1);
}

static int send_error(conn *c, const rnp_error *err)
{
    rnp_chan_msg rep = {.type = RNP_CHAN_ERROR};
    int code = err->code ? err->code : RN_INTERNAL;
    const char *msg = err->msg[0] ? err->msg : rnp_strerror(code);

    rep.u.error.code = (uint32_t)code;
    /* Cut to the field, which keeps its terminating NUL (rep is zeroed). */
    memcpy(rep.u.error.msg, msg, strnlen(msg, RNP_CHAN_ERROR_MSG - 1));
    c->ctx->stats.errors[code < RND_MAX_CODE ? code : RN_INTERNAL]++;
    return send_rep(c, &rep);
}

static int auth(conn *c, const rnp_session *cap, rnp_error *err)
{
    rnd_ctx *ctx = c->ctx;
    rnp_chan_msg rep = {.type = RNP_CHAN_AUTH_OK};
    rnd_session *s;
    int rc;

    if (c->sess)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "auth: this connection is bound to a session already");
    if (!(s = rnd_session_find(&ctx->sessions, cap)))
        return rnp_fail(err, RN_UNKNOWN_SESSION, "auth.session: unknown or expired session");
    if ((rc = rnd_session_bind(s, c->pid, c->uid, c, err)) != 0)
        return rc;
    c->sess = s;
    rep.u.auth_ok.pid = c->pid;
    rep.u.auth_ok.uid = c->uid;
    /* With the fast path, the session's bell goes with the answer (the
     * write end: the daemon keeps none of it). */
    if (ctx->dev.rings && ctx->rings.started && (c->bell = bell_new(c)) != NULL) {
        bell *b = c->bell;
        if (send_rep_fd(c, &rep, b->wfd) != 0)
            return -1;
        close(b->wfd);
        b->wfd = -1;
        return 0;
    }
    return send_rep(c, &rep) == 0 ? 0 : -1;
}

static int register_fd(conn *c, uint64_t size, int fd, rnp_error *err)
{
    rnp_chan_msg rep = {.type = RNP_CHAN_REGION_OK};
    int rc;

    if (!c->sess)
        return rnp_fail(err, RN_UNKNOWN_SESSION, "register_fd: authenticate (AUTH) first");
    if (c->ctx->draining)
        return rnp_fail(err, RN_DRAINING, "register_fd: the daemon is shutting down");
    if ((rc = rnd_region_add_fd(c->sess, fd, size, &rep.u.region_ok.region, err)) != 0)
        return rc;
    return send_rep(c, &rep) == 0 ? 0 : -1;
}

/* VMM_CHUNK (fd: its descriptor) or VMM_MAP. */
static int vmm(conn *c, const rnp_chan_msg *msg, int fd, rnp_error *err)
{
    const char *name = msg->type == RNP_CHAN_VMM_CHUNK ? "vmm_chunk" : "vmm_map";
    rnp_chan_msg rep = {.type = RNP_CHAN_VMM_CHUNK_OK};
    int rc;

    if (!c->sess)
        return rnp_fail(err, RN_UNKNOWN_SESSION, "%s: authenticate (AUTH) first", name);
    if (c->ctx->draining)
        return rnp_fail(err, RN_DRAINING, "%s: the daemon is shutting down", name);
    if (msg->type == RNP_CHAN_VMM_CHUNK) {
        if ((rc = rnd_vmm_chunk(c->sess, &c->vmm, msg, fd, err)) != 0)
            return rc;
        rep.u.vmm_chunk_ok.index = msg->u.vmm_chunk.index;
    } else {
        rep.type = RNP_CHAN_REGION_OK;
        if ((rc = rnd_vmm_map(c->sess, &c->vmm, msg, &rep.u.region_ok.region, err)) != 0)
            return rc;
    }
    return send_rep(c, &rep) == 0 ? 0 : -1;
}

/*
 * One message of len bytes with nfds descriptors (closed here, whatever
 * happens).  Returns 0 when c lives on, -1 when it was ended.
 */
static int handle(conn *c, const uint8_t *m, size_t len, bool truncated, int *fds, int nfds)
{
    rnd_stats *st = &c->ctx->stats;
    rnp_error err = {0};
    rnp_chan_msg msg;
    int rc = rnp_chan_parse(m, len, truncated, (unsigned)nfds, &msg, &err);

    /* A request counts once its header is valid, whatever follows; a
     * reply's type from a client is a type the daemon does not know. */
    if (msg.type == RNP_CHAN_AUTH)
        st->chan_auth++;
    else if (msg.type == RNP_CHAN_REGISTER_FD)
        st->chan_register_fd++;
    else if (msg.type == RNP_CHAN_VMM_CHUNK || msg.type == RNP_CHAN_VMM_MAP)
        ; /* not counted apart yet */
    else if (msg.type != RNP_CHAN_NONE)
        rc = rnp_fail(&err, RN_UNKNOWN_OP, "message.type: unknown type %u", (unsigned)msg.type);
    if (rc == 0 && msg.type == RNP_CHAN_AUTH)
        rc = auth(c, &msg.u.auth.session, &err);
    else if (rc == 0 && msg.type == RNP_CHAN_REGISTER_FD)
        rc = register_fd(c, msg.u.register_fd.size, fds[0], &err);
    else if (rc == 0)
        rc = vmm(c, &msg, nfds ? fds[0] : -1, &err);
    /* A VMM message answered with an error drops the range's pending
     * chunks: the client starts it again at chunk 0. */
    if (rc > 0 && (msg.type == RNP_CHAN_VMM_CHUNK || msg.type == RNP_CHAN_VMM_MAP))
        rnd_vmm_pending_clear(c->ctx->be, &c->vmm);
    /* The daemon keeps no descriptor: a region is a mapping, which stays
     * valid once its descriptor is closed. */
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (rc < 0)
        return -1;
    if (rc > 0) {
        rnd_debug("Session channel of pid %u: %s", (unsigned)c->pid, err.msg);
        return send_error(c, &err);
    }
    return 0;
}

static void on_conn(uv_poll_t *h, int status, int events)
{
    conn *c = h->data;
    uint8_t buf[RNP_CHAN_MAX + 1];
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(int) * RNP_CHAN_MAX_FDS)];
    } cb;

    for (;;) {
        struct iovec iov = {buf, sizeof buf};
        struct msghdr mh = {0};
        int fds[RNP_CHAN_MAX_FDS], nfds = 0;
        ssize_t n;

        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cb.b;
        mh.msg_controllen = sizeof cb.b;
        n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        /* After a socket error (status < 0) libuv polls c no more: what
         * was left is read, and then the connection ends, rather than
         * linger unwatched. */
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && status >= 0)
            return;
        if (n < 0) {
            conn_end(c, "session channel closed"); /* (the socket failed) */
            return;
        }
        /* The descriptors first, whatever the datagram: the kernel has put
         * them in this process already.  An empty datagram is the peer's
         * close only without any (SOCK_SEQPACKET: recvmsg says 0 for both);
         * with some it is a malformed message, answered, its descriptors
         * closed (they were left open, a descriptor leak anyone who could
         * reach the socket could cause, found in review). */
        nfds = (int)rnp_chan_take_fds(&mh, fds, RNP_CHAN_MAX_FDS);
        if (n == 0 && nfds == 0 && !(mh.msg_flags & MSG_CTRUNC)) {
            conn_end(c, "session channel closed");
            return;
        }
        /* Fewer descriptors than the buffer holds, and some dropped: the
         * kernel could not install them (the daemon is out of descriptors),
         * which is no fault of the message. */
        if ((mh.msg_flags & MSG_CTRUNC) && nfds < RNP_CHAN_MAX_FDS) {
            rnp_error err = {0};
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            rnp_fail(&err, RN_BUSY, "message: the daemon could not take its descriptors "
                                    "(out of descriptors); retry later");
            rnd_warn("Session channel of pid %u: %s", (unsigned)c->pid, err.msg);
            if (send_error(c, &err) != 0)
                return;
            continue;
        }
        if (handle(c, buf, (size_t)n, (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0, fds,
                   nfds) != 0)
            return;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* How many of the n sorted uids are v. */
static uint32_t count_of(const uint32_t *u, uint32_t n, uint32_t v)
{
    uint32_t lo = 0, hi = n, first;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (u[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    first = lo;
    for (hi = n; lo < hi;) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (u[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - first;
}

/*
 * Which unauthenticated connection goes for a newcomer of uid at the limit:
 * the oldest of the user who holds the most of them (the newcomer counted),
 * so that one user's flood closes its own connections, not another user's
 * between its connect and its AUTH.  NULL when every one is authenticated.
 * (The users' counts from their sorted uids: max-sessions may be large.)
 */
static conn *evictee(rnd_chan *ch, uint32_t uid)
{
    uint32_t *u = malloc(((size_t)ch->nconns + 1) * sizeof *u), n = 0, most = 0;
    conn *pick = NULL;
    rn_queue *q;

    if (!u)
        return NULL;
    RN_QUEUE_FOREACH(q, &ch->conns) {
        const conn *o = RN_QUEUE_DATA(q, conn, link);
        if (!o->sess)
            u[n++] = o->uid;
    }
    u[n++] = uid; /* (the newcomer) */
    qsort(u, n, sizeof *u, cmp_u32);
    for (uint32_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && u[j] == u[i]; j++) {
        }
        most = j - i > most ? j - i : most;
    }
    /* Newest first on the list: the last one of a user who holds the most
     * is the oldest of theirs (of all of them, where several do). */
    RN_QUEUE_FOREACH(q, &ch->conns) {
        conn *o = RN_QUEUE_DATA(q, conn, link);
        if (!o->sess && count_of(u, n, o->uid) == most)
            pick = o;
    }
    free(u);
    return pick;
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    rnd_ctx *ctx = h->data;
    rnd_chan *ch = &ctx->chan;

    for (;;) {
        struct ucred cr;
        socklen_t crlen = sizeof cr;
        int fd = accept4(ch->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        conn *c;

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* Out of descriptors (or another failure that a retry at once
             * would meet again): the connection stays in the backlog and the
             * socket reads ready at every turn of the loop, which would spin
             * and log without end; the listener rests till the next tick. */
            rnd_warn("Failed to accept on the session channel: %s; accepting again in a second",
                     strerror(errno));
            uv_poll_stop(&ch->poll);
            ch->paused = true;
            return;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 || crlen != sizeof cr) {
            rnd_warn("Failed to read the session channel peer's credentials: %s",
                     strerror(errno));
            close(fd);
            continue;
        }
        /* One connection per session, and a few being set up: more would
         * let anyone on the socket take the daemon's descriptors.  At the
         * limit a connection not yet authenticated goes, as HELLO ends an
         * idle session: idle connections (anyone on the socket can open
         * them) must not lock clients out of AUTH for their 10 s. */
        if (ch->nconns >= ctx->cfg.max_sessions + RND_CHAN_SPARE && !ctx->draining) {
            conn *old = evictee(ch, (uint32_t)cr.uid);
            if (old) {
                ctx->stats.chan_evicted++;
                conn_free(old);
            }
        }
        if (ch->nconns >= ctx->cfg.max_sessions + RND_CHAN_SPARE || ctx->draining) {
            ctx->stats.chan_refused++;
            close(fd);
            continue;
        }
        if (!(c = calloc(1, sizeof *c)) || uv_poll_init(ctx->loop, &c->poll, fd) != 0) {
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->pid = (uint32_t)cr.pid;
        c->uid = (uint32_t)cr.uid;
        c->accepted_ns = rnd_now_ns();
        c->ctx = ctx;
        c->poll.data = c;
        rn_queue_push_front(&ch->conns, &c->link);
        ch->nconns++;
        if (uv_poll_start(&c->poll, UV_READABLE, on_conn) != 0)
            conn_free(c);
    }
}

/* Is somebody serving path?  A file left by a dead daemon refuses. */
static bool in_use(const struct sockaddr_un *sa)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    bool used;

    if (fd < 0)
        return true;
    used = connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0 || errno != ECONNREFUSED;
    close(fd);
    return used;
}

int rnd_chan_open(rnd_ctx *ctx, rnp_error *err)
{
    rnd_chan *ch = &ctx->chan;
    const rnd_config *cfg = &ctx->cfg;
    struct sockaddr_un sa;
    gid_t gid = (gid_t)-1;
    mode_t old;
    int rc, e;

    ch->fd = -1;
    rn_queue_init(&ch->conns);
    if (cfg->socket_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        if (getgrnam_r(cfg->socket_group, &gr, buf, sizeof buf, &res) != 0 || !res)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "socket-group: no group '%s'",
                            cfg->socket_group);
        gid = res->gr_gid;
    }
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    /* rnd_config_finish checked that the path and the suffix fit. */
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", rnd_config_ipc_path(cfg), RND_CHAN_SUFFIX);
    if ((ch->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return rnp_fail(err, RN_SYSTEM, "Failed to create the session channel's socket: %s",
                        strerror(errno));
    /* The file appears with no access for others until its mode and group
     * are set, as the nanomsg socket's does. */
    old = umask(0177);
    rc = bind(ch->fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc != 0 && errno == EADDRINUSE && !in_use(&sa) && unlink(sa.sun_path) == 0)
        rc = bind(ch->fd, (struct sockaddr *)&sa, sizeof sa);
    e = errno;
    umask(old);
    if (rc != 0) {
        rnp_fail(err, RN_SYSTEM, "Failed to bind %s: %s%s", sa.sun_path, strerror(e),
                 e == EADDRINUSE ? " (another rmsnormd is serving it?)" : "");
        goto fail;
    }
    snprintf(ch->path, sizeof ch->path, "%s", sa.sun_path);
    if (gid != (gid_t)-1 && chown(ch->path, (uid_t)-1, gid) != 0) {
        rnp_fail(err, RN_SYSTEM, "Failed to set the group of %s to %s: %s", ch->path,
                 cfg->socket_group, strerror(errno));
        goto fail;
    }
    if (chmod(ch->path, cfg->socket_mode) != 0) {
        rnp_fail(err, RN_SYSTEM, "Failed to set the mode of %s to %04o: %s", ch->path,
                 (unsigned)cfg->socket_mode, strerror(errno));
        goto fail;
    }
    if (listen(ch->fd, 128) != 0) {
        rnp_fail(err, RN_SYSTEM, "Failed to listen on %s: %s", ch->path, strerror(errno));
        goto fail;
    }
    ctx->sessions.unbind = unbind;
    return 0;
fail:
    rnd_chan_close(ctx);
    return err->code;
}

int rnd_chan_start(rnd_ctx *ctx, rnp_error *err)
{
    rnd_chan *ch = &ctx->chan;
    int urc;

    if ((urc = uv_poll_init(ctx->loop, &ch->poll, ch->fd)) != 0)
        return rnp_fail(err, RN_SYSTEM, "Failed to poll the session channel: %s",
                        uv_strerror(urc));
    ch->poll_init = true;
    ch->poll.data = ctx;
    if ((urc = uv_poll_start(&ch->poll, UV_READABLE, on_accept)) != 0)
        return rnp_fail(err, RN_SYSTEM, "Failed to poll the session channel: %s",
                        uv_strerror(urc));
    return 0;
}

void rnd_chan_expire(rnd_ctx *ctx, uint64_t now_ns)
{
    rnd_chan *ch = &ctx->chan;
    rn_queue *q, *n;

    if (ch->paused && ch->poll_init && !ctx->draining &&
        uv_poll_start(&ch->poll, UV_READABLE, on_accept) == 0)
        ch->paused = false;

    RN_QUEUE_FOREACH_SAFE(q, n, &ctx->chan.conns) {
        conn *c = RN_QUEUE_DATA(q, conn, link);
        if (!c->sess && now_ns - c->accepted_ns >= (uint64_t)RND_CHAN_AUTH_MS * 1000000u)
            conn_free(c);
    }
}

static void on_listener_closed(uv_handle_t *h)
{
    rnd_ctx *ctx = h->data;
    close(ctx->chan.fd);
    ctx->chan.fd = -1;
}

void rnd_chan_close(rnd_ctx *ctx)
{
    rnd_chan *ch = &ctx->chan;
    rn_queue *q, *n;

    if (ch->conns.next)
        RN_QUEUE_FOREACH_SAFE(q, n, &ch->conns)
            conn_end(RN_QUEUE_DATA(q, conn, link), "daemon shutting down");
    if (ch->path[0]) {
        unlink(ch->path);
        ch->path[0] = '\0';
    }
    if (ch->poll_init) {
        ch->poll_init = false;
        uv_close((uv_handle_t *)&ch->poll, on_listener_closed);
    } else if (ch->fd >= 0) {
        close(ch->fd);
        ch->fd = -1;
    }
}
