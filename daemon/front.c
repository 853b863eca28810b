/* SPDX-License-Identifier: MIT */
/*
 * front.c - the front process (front.h says why it exists): the nanomsg raw
 * REP socket on one side, the link to the core on the other, and a table of
 * routing headers by token in between.  It parses nothing of the protocol:
 * every message goes to the core as it came, and every reply comes back as
 * bytes.  It does not log either: it reports a start-up failure to the core
 * (RND_LINK_FAIL), and the core logs how the front ended.
 *
 * Single-threaded, poll(2) on two descriptors.  Sends to the core block
 * (SOCK_SEQPACKET keeps datagrams whole), which stops the front reading the
 * socket while the core is behind: backpressure rather than a queue here.
 */
#include "front.h"

#include <errno.h>
#include <grp.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conn_limit.h"
#include "rn_proto.h"
#include "rnp_dec.h"
#include "stats.h"
#include "transport.h"

/* ---- the routing headers by token: open addressing, linear probing ---------------- */

typedef struct slot {
    uint32_t token;       /* 0: empty */
    void *control;
    uint32_t op;          /* the request's op and id, as far as they decode: */
    uint64_t id;          /* what a reply from here names (drained) */
} slot;

typedef struct table {
    slot *v;
    uint32_t cap, n;      /* cap: a power of two */
    bool have_last;       /* the core said which request it read last (its drain ended) */
    uint32_t last_read;
} table;

static slot *find(table *t, uint32_t token)
{
    for (uint32_t i = token & (t->cap - 1);; i = (i + 1) & (t->cap - 1))
        if (t->v[i].token == token || t->v[i].token == 0)
            return &t->v[i];
}

static int grow(table *t)
{
    table g = {calloc(t->cap * 2, sizeof(slot)), t->cap * 2, 0, t->have_last, t->last_read};
    if (!g.v)
        return -1;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->v[i].token) {
            *find(&g, t->v[i].token) = t->v[i];
            g.n++;
        }
    free(t->v);
    *t = g;
    return 0;
}

static int put(table *t, uint32_t token, void *control, const void *body, size_t len)
{
    if ((t->n + 1) * 2 > t->cap && grow(t) != 0)
        return -1;
    slot *s = find(t, token);
    s->token = token;
    s->control = control;
    rnp_dec_peek_header(body, len, &s->op, &s->id);
    t->n++;
    return 0;
}

/* Remove token's entry and return its header (NULL if none), shifting the
 * entries behind it back so that every probe chain stays unbroken. */
static void *take(table *t, uint32_t token)
{
    slot *s = find(t, token);
    void *control = s->control;
    uint32_t i, j;

    if (s->token == 0)
        return NULL;
    i = (uint32_t)(s - t->v);
    s->token = 0;
    s->control = NULL;
    t->n--;
    for (j = (i + 1) & (t->cap - 1); t->v[j].token; j = (j + 1) & (t->cap - 1)) {
        uint32_t home = t->v[j].token & (t->cap - 1);
        /* Entry j may move to the hole at i unless its home lies in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            t->v[i] = t->v[j];
            t->v[j].token = 0;
            t->v[j].control = NULL;
            i = j;
        }
    }
    return control;
}

/* ---- the probe ---------------------------------------------------------------- */

/* A probe in flight: its own client socket and the message it sent. */
typedef struct probe {
    int sock;             /* -1: none */
    uint32_t token;
    char msg[48];
    size_t len;
} probe;

/* How long a probe's send may wait for its connection. */
#define PROBE_SEND_MS 200

static void probe_end(probe *p)
{
    if (p->sock >= 0)
        nn_close(p->sock);
    p->sock = -1;
}

/* Connect to our own endpoint and send the probe message; the reply comes
 * on p->sock (polled by the loop).  A failure just leaves no reply: the
 * core's deadline decides. */
static void probe_start(probe *p, const char *endpoint, uint32_t token)
{
    int ms = PROBE_SEND_MS;

    probe_end(p);
    p->token = token;
    p->len = (size_t)snprintf(p->msg, sizeof p->msg, "rmsnormd front probe %u", token);
    if ((p->sock = nn_socket(AF_SP, NN_REQ)) < 0)
        return;
    if (nn_setsockopt(p->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &ms, sizeof ms) < 0 ||
        nn_connect(p->sock, endpoint) < 0 || nn_send(p->sock, p->msg, p->len, 0) < 0)
        probe_end(p);
}

/* ---- the link -------------------------------------------------------------------- */

static int link_send(int fd, uint32_t kind, uint32_t token, uint64_t recv_ns, const void *body,
                     size_t len)
{
    rnd_link_hdr h = {kind, token, recv_ns};
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)body, len}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = body ? 2 : 1};
    ssize_t n;

    do
        n = sendmsg(fd, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : 0;
}

static int fail(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int fd, const char *fmt, ...)
{
    char msg[RNP_MAX_ERRMSG];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    link_send(fd, RND_LINK_FAIL, 0, 0, msg, strlen(msg));
    return 1;
}

/* Bind endpoint with the socket file's mode and group set before anyone
 * else can connect.  Returns the socket, or -1 after telling the core. */
static int bind_socket(int link, const char *endpoint, mode_t mode, const char *group)
{
    const char *path = endpoint + 6;
    int maxsize = (int)RND_RCV_MAX, sock, rc;
    gid_t gid = (gid_t)-1;
    mode_t old;

    if (group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        if (getgrnam_r(group, &gr, buf, sizeof buf, &res) != 0 || !res)
            return fail(link, "socket-group: no group '%s'", group), -1;
        gid = res->gr_gid;
    }
    if ((sock = nn_socket(AF_SP_RAW, NN_REP)) < 0)
        return fail(link, "Failed to create the nanomsg socket: %s", nn_strerror(nn_errno())), -1;
    if (nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsize, sizeof maxsize) < 0) {
        fail(link, "Failed to set NN_RCVMAXSIZE: %s", nn_strerror(nn_errno()));
        goto out;
    }
    /* The socket file appears with no access for others until its mode and
     * group are set, so there is no window in which it is too open. */
    old = umask(0177);
    rc = nn_bind(sock, endpoint);
    umask(old);
    if (rc < 0) {
        int e = nn_errno();
        fail(link, "Failed to bind %s: %s%s", endpoint, nn_strerror(e),
             e == EADDRINUSE ? " (another rmsnormd is serving it?)" : "");
        goto out;
    }
    if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) != 0) {
        fail(link, "Failed to set the group of %s to %s: %s", path, group, strerror(errno));
        goto out_unlink;
    }
    if (chmod(path, mode) != 0) {
        fail(link, "Failed to set the mode of %s to %04o: %s", path, (unsigned)mode,
             strerror(errno));
        goto out_unlink;
    }
    return sock;
out_unlink:
    unlink(path);
out:
    nn_close(sock);
    return -1;
}

/* Send bytes to the peer that control routes to; control is taken (on
 * failure nanomsg has taken it already: a vanished peer, whose replies a raw
 * REP socket drops silently). */
static void reply(int sock, void *control, const void *bytes, size_t len)
{
    struct nn_msghdr hdr;
    struct nn_iovec iov = {(void *)bytes, len};

    memset(&hdr, 0, sizeof hdr);
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = &control;
    hdr.msg_controllen = NN_MSG;
    (void)nn_sendmsg(sock, &hdr, NN_DONTWAIT);
}

/* One message waiting on the socket, without blocking: its body and its
 * routing header (nanomsg's chunks, the caller's to free).  Its length, or
 * -1 with nn_errno() set. */
static int recv_with_header(int sock, void **body, void **control)
{
    struct nn_msghdr hdr;
    struct nn_iovec iov = {body, NN_MSG};

    memset(&hdr, 0, sizeof hdr);
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control;
    hdr.msg_controllen = NN_MSG;
    return nn_recvmsg(sock, &hdr, NN_DONTWAIT);
}

/* Every message waiting on the socket, to the core.  Returns -1 when the
 * link is gone. */
static int forward_requests(int sock, int link, table *t, uint32_t *next_token, const probe *pr)
{
    for (;;) {
        void *body = NULL, *control = NULL;
        int n = recv_with_header(sock, &body, &control);
        if (n < 0)
            return nn_errno() == EAGAIN || nn_errno() == EINTR ? 0 : -1;
        if (!control) {
            /* A raw socket always delivers the routing header; without it
             * there is nobody to reply to. */
            nn_freemsg(body);
            continue;
        }
        if (pr->sock >= 0 && (size_t)n == pr->len && memcmp(body, pr->msg, pr->len) == 0) {
            /* Our own probe: answer it here (echo); the core needs no part
             * in it. */
            reply(sock, control, body, (size_t)n);
            nn_freemsg(body);
            continue;
        }
        /* A token still waiting for its reply (after the counter wrapped)
         * is skipped: its header must not be overwritten. */
        uint32_t token;
        do
            token = (*next_token)++;
        while (token == 0 || find(t, token)->token == token);
        if (put(t, token, control, body, (size_t)n) != 0) {
            /* Out of memory: the request is dropped as if it never came;
             * the client's REQ socket re-sends it. */
            nn_freemsg(control);
            nn_freemsg(body);
            continue;
        }
        int rc = link_send(link, RND_LINK_REQ, token, rnd_now_ns(), body, (size_t)n);
        int e = errno;
        nn_freemsg(body);
        if (rc != 0 && e == EMSGSIZE) {
            /* Too large for one datagram on this host: dropped, as nanomsg
             * drops what passes NN_RCVMAXSIZE. */
            nn_freemsg(take(t, token));
            continue;
        }
        if (rc != 0)
            return -1;
    }
}

/* Replies and forgotten tokens from the core.  Returns -1 when the core
 * closed the link (time to stop). */
static int handle_core(int sock, int link, table *t, uint8_t *buf, size_t cap, probe *pr,
                       const char *endpoint)
{
    for (;;) {
        ssize_t n = recv(link, buf, cap, MSG_DONTWAIT);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        if (n == 0)
            return -1;
        if ((size_t)n < sizeof(rnd_link_hdr))
            continue;
        rnd_link_hdr h;
        memcpy(&h, buf, sizeof h);
        if (h.kind == RND_LINK_PROBE) {
            probe_start(pr, endpoint, h.token);
            continue;
        }
        if (h.kind == RND_LINK_LAST_READ) {
            t->have_last = true;
            t->last_read = h.token;
            continue;
        }
        void *control = take(t, h.token);
        if (!control)
            continue;
        if (h.kind != RND_LINK_REP) {
            nn_freemsg(control);
            continue;
        }
        reply(sock, control, buf + sizeof h, (size_t)n - sizeof h);
    }
}

/* The drain's end (drained): refuse what comes until the socket has been
 * quiet this long, for at most this long in all. */
#define QUIET_MS 30
#define QUIET_MAX_MS 300

/* RN_DRAINING for a request the core never saw, as it would answer it. */
static void answer_draining(int sock, void *control, uint32_t op, uint64_t id, uint8_t *buf,
                            size_t cap)
{
    rnp_reply rep;
    rnp_error err = {0};
    size_t len = 0;

    memset(&rep, 0, offsetof(rnp_reply, u));
    rep.version = RNP_VERSION;
    rep.op = op;
    rep.id = id;
    rep.status = RN_DRAINING;
    snprintf(rep.error, sizeof rep.error,
             "%s: the daemon is shutting down; the request was not run", rnp_op_name((int)op));
    if (rnp_encode_reply(&rep, buf, cap, &len, &err) == 0)
        reply(sock, control, buf, len);
    else
        nn_freemsg(control);
}

/* Every request waiting on the socket gets RN_DRAINING: how many. */
static unsigned refuse_waiting(int sock, uint8_t *buf, size_t cap)
{
    unsigned n = 0;
    for (;;) {
        void *body = NULL, *control = NULL;
        uint32_t op;
        uint64_t id;
        int len = recv_with_header(sock, &body, &control);
        if (len < 0)
            return n;
        if (control) {
            rnp_dec_peek_header(body, (size_t)len, &op, &id);
            answer_draining(sock, control, op, id, buf, cap);
            n++;
        }
        nn_freemsg(body);
    }
}

/*
 * The link closed.  After a drain the core said which request it read last
 * (RND_LINK_LAST_READ): it answered those, and its replies came before
 * the close; the requests after it, forwarded after the core's last read,
 * and those still waiting on the socket were never seen there, and each
 * gets RN_DRAINING from here, as the core answers a request while it
 * drains (before, they went unanswered, and their clients waited out their
 * timeout).  Replies still on the link are passed on first (the loop may
 * have stopped at a failed forward while they were there).  Without the
 * marker (the core died, or the link broke) nothing is answered from
 * here.
 */
static void drained(int sock, int link, table *t, uint8_t *buf, size_t cap, probe *pr,
                    const char *endpoint)
{
    struct pollfd pl = {link, POLLIN, 0};

    for (int i = 0; i < 2 && handle_core(sock, link, t, buf, cap, pr, endpoint) == 0; i++)
        (void)poll(&pl, 1, 100);
    for (uint32_t i = 0; i < t->cap; i++) {
        slot *s = &t->v[i];
        if (!s->token)
            continue;
        if (t->have_last && (int32_t)(s->token - t->last_read) > 0) {
            answer_draining(sock, s->control, s->op, s->id, buf, cap);
        } else {
            nn_freemsg(s->control);
        }
        s->token = 0;
    }
    if (!t->have_last)
        return;
    /* Clients that come while this runs are refused too, until the socket
     * has been quiet for QUIET_MS (at most QUIET_MAX_MS in all): whatever
     * still comes after the close is nanomsg's to send again, to the next
     * daemon.  The replies go out meanwhile. */
    struct pollfd ps = {-1, POLLIN, 0};
    size_t fdlen = sizeof ps.fd;
    (void)nn_getsockopt(sock, NN_SOL_SOCKET, NN_RCVFD, &ps.fd, &fdlen);
    uint64_t t0 = rnd_now_ns(), quiet = t0;
    for (;;) {
        uint64_t now = rnd_now_ns();
        if (refuse_waiting(sock, buf, cap))
            quiet = now;
        if (now - quiet >= QUIET_MS * 1000000ull || now - t0 >= QUIET_MAX_MS * 1000000ull)
            break;
        (void)poll(&ps, 1, 5); /* (without the descriptor: a 5 ms sleep) */
    }
}

int rnd_front_main(int argc, char **argv)
{
    const int link = RND_FRONT_FD;
    table t = {calloc(1024, sizeof(slot)), 1024, 0, false, 0};
    uint8_t *buf = malloc(sizeof(rnd_link_hdr) + RNP_MAX_MSG * 2);
    uint32_t next_token = 1;
    uint64_t spin_until = 0, spin_ns, refused = 0;
    probe pr = {.sock = -1};
    struct pollfd pf[3];
    size_t fdlen = sizeof pf[0].fd;
    char *end;
    long mode;
    int sock;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    if (argc != 6 || strncmp(argv[1], "ipc://", 6) != 0)
        return fail(link, "front: expected CORE_PID ENDPOINT MODE GROUP MAX_CONNECTIONS SPIN_US");
    if (getppid() != (pid_t)atol(argv[0]))
        return 1;   /* the core died before the death signal was armed */
    argv++;
    mode = strtol(argv[1], &end, 8);
    if (*end || mode < 0 || mode > 07777)
        return fail(link, "front: bad mode '%s'", argv[1]);
    long maxconn = strtol(argv[3], &end, 10);
    if (*end || maxconn < 1 || maxconn > UINT32_MAX)
        return fail(link, "front: bad connection limit '%s'", argv[3]);
    long spin_us = strtol(argv[4], &end, 10);
    if (*end || spin_us < 0 || spin_us > 1000000)
        return fail(link, "front: bad spin time '%s'", argv[4]);
    spin_ns = (uint64_t)spin_us * 1000;
    if (!t.v || !buf)
        return fail(link, "front: out of memory");
    if ((sock = bind_socket(link, argv[0], (mode_t)mode, argv[2])) < 0)
        return 1;
    rnd_conn_limit_arm(argv[0] + 6, (uint32_t)maxconn);
    if (nn_getsockopt(sock, NN_SOL_SOCKET, NN_RCVFD, &pf[0].fd, &fdlen) < 0)
        return fail(link, "Failed to get NN_RCVFD: %s", nn_strerror(nn_errno()));
    pf[0].events = POLLIN;
    pf[1].fd = link;
    pf[1].events = POLLIN;
    if (link_send(link, RND_LINK_READY, 0, 0, NULL, 0) != 0)
        return 1;
    for (;;) {
        /* Right after forwarding requests, look for the replies for a short
         * while before sleeping: most control replies come back within tens
         * of microseconds, and a sleep and wake-up here would add that much
         * again to every round trip. */
        int timeout = -1;
        if (spin_until && rnd_now_ns() < spin_until)
            timeout = 0;
        else
            spin_until = 0;
        pf[2].fd = -1;
        pf[2].events = POLLIN;
        if (pr.sock >= 0)
            nn_getsockopt(pr.sock, NN_SOL_SOCKET, NN_RCVFD, &pf[2].fd, &fdlen);
        int r = poll(pf, 3, timeout);
        if (r < 0 && errno != EINTR)
            break;
        /* Refusals happen on nanomsg's thread; the count reaches the core
         * at the next wake-up (the probe every few seconds at the latest). */
        uint64_t nref = rnd_conn_limit_refused();
        if (nref != refused && link_send(link, RND_LINK_REFUSED, 0, nref, NULL, 0) == 0)
            refused = nref;
        if (r == 0)
            continue;
        if ((pf[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
            handle_core(sock, link, &t, buf, sizeof(rnd_link_hdr) + RNP_MAX_MSG * 2, &pr,
                        argv[0]) != 0)
            break;
        if (pf[0].revents & POLLIN) {
            if (forward_requests(sock, link, &t, &next_token, &pr) != 0)
                break;
            if (spin_ns)
                spin_until = rnd_now_ns() + spin_ns;
        }
        if (pf[2].fd >= 0 && (pf[2].revents & POLLIN)) {
            void *m = NULL;
            if (nn_recv(pr.sock, &m, NN_MSG, NN_DONTWAIT) >= 0) {
                nn_freemsg(m);
                uint32_t token = pr.token;
                probe_end(&pr);
                if (link_send(link, RND_LINK_PROBE_OK, token, 0, NULL, 0) != 0)
                    break;
            }
        }
    }
    /* The core closed the link (its drain ended) or went away.  nanomsg
     * leaves the socket file behind; an orderly exit should not. */
    probe_end(&pr);
    drained(sock, link, &t, buf, sizeof(rnd_link_hdr) + RNP_MAX_MSG * 2, &pr, argv[0]);
    free(t.v);
    free(buf);
    nn_close(sock);
    unlink(argv[0] + 6);
    return 0;
}
