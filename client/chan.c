/* SPDX-License-Identifier: MIT */
/*
 * chan.c - libclient's end of the session channel (PROTOCOL.md section
 * 12): a SOCK_SEQPACKET Unix socket at the daemon's socket path plus
 * ".chan", where a session authenticates (AUTH: the kernel tells the daemon
 * our pid and uid) and shared memory is registered by descriptor
 * (REGISTER_FD), so that the daemon maps only what this process could open
 * itself; CUDA virtual memory goes the same way, one descriptor per
 * physical allocation (VMM_CHUNK, then VMM_MAP: vmm_cuda.c).  One connection per session: closing it ends the session on the
 * daemon's side.  Nothing here knows about buffers.
 */
#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_int.h"
#include "rn_check.h"

/* Milliseconds left before deadline_ns (0: none), or -1 for no deadline. */
static int left_ms(uint64_t deadline_ns)
{
    uint64_t now = rnc_now_ns();
    if (!deadline_ns)
        return -1;
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
}

static uint64_t deadline_of(const rn_client *c)
{
    return c->timeout_ms < 0 ? 0 : rnc_now_ns() + (uint64_t)c->timeout_ms * 1000000u;
}

/* The connection is gone: so is the session, on the daemon's side (the
 * next call starts another; it stayed, and every call on the fast path
 * failed RN_UNSUPPORTED for want of a channel, found in review). */
static int lost(rn_client *c, const char *what, int e)
{
    if (c->ring_orphan)
        c->ring_orphan(c);
    rnc_chan_close(c);
    c->have_session = false;
    return rnc_fail(c, RN_UNKNOWN_SESSION, "session channel: %s: %s", what,
                    e ? strerror(e) : "closed by the daemon");
}

/*
 * The reply r of n bytes (more than RNP_CHAN_MAX: cut) into *rep: an ERROR
 * becomes c's error with its code and message; any other reply must be of
 * type want.  Returns 0, or an rn_status with c's last error set.
 */
static int take_reply(rn_client *c, const uint8_t *r, ssize_t n, int want, rnp_chan_msg *rep)
{
    bool cut = n > RNP_CHAN_MAX;
    int rc = rnp_chan_parse(r, cut ? RNP_CHAN_MAX : (size_t)n, cut, 0, rep, NULL);
    int code;

    if (rep->type == RNP_CHAN_NONE)
        return rnc_fail(c, RN_BAD_REPLY, "session channel: a reply of %zd bytes that is not "
                        "the channel's", n);
    if (rep->type == RNP_CHAN_ERROR) {
        if (rc != 0)
            return rnc_fail(c, RN_BAD_REPLY, "session channel: an error reply of %zd bytes", n);
        code = (int)rep->u.error.code;
        return rnc_fail(c, code > 0 ? code : RN_BAD_REPLY, "%s", rep->u.error.msg);
    }
    if (rc != 0 || rep->type != want)
        return rnc_fail(c, RN_BAD_REPLY, "session channel: reply type %u of %d bytes, "
                        "expected type %u of %d", (unsigned)rep->type, (int)n, (unsigned)want,
                        (int)rnp_chan_len(want));
    return 0;
}

/*
 * Wait by the deadline for one datagram on c's channel, into in (of
 * RNP_CHAN_MAX bytes; *n its full length); a descriptor it carries goes
 * into *fd (-1: none), or is closed when fd is NULL.  Returns 0; RN_TIMEOUT
 * with c's last error untouched; or another rn_status with it set (a
 * closed connection: the session is gone).
 */
static int receive(rn_client *c, uint8_t *in, ssize_t *n, uint64_t deadline_ns, int *fd)
{
    struct pollfd p = {.fd = c->chan, .events = POLLIN};
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(4 * sizeof(int))];
    } cb;

    for (;;) {
        int r = poll(&p, 1, left_ms(deadline_ns));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return rnc_fail(c, RN_SYSTEM, "session channel: poll: %s", strerror(errno));
        if (r == 0)
            return RN_TIMEOUT;
        struct iovec iov = {in, RNP_CHAN_MAX};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
                            .msg_controllen = sizeof cb.b};
        *n = recvmsg(c->chan, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
        if (*n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (*n > 0 && rnp_chan_take_fds(&mh, fd, fd ? 1 : 0) == 0 && fd)
            *fd = -1;
        if (*n <= 0)
            return lost(c, "receive", *n < 0 ? errno : 0);
        return 0;
    }
}

/* Send m (with fd >= 0 attached) without waiting.  Returns 0, RN_TIMEOUT
 * when the socket has no room (nothing sent; c's last error untouched), or
 * another rn_status with it set (a closed connection: the session is
 * gone). */
static int send_msg(rn_client *c, const rnp_chan_msg *m, int fd)
{
    int e = rnp_chan_send(c->chan, m, fd);

    if (e == EAGAIN || e == EWOULDBLOCK)
        return RN_TIMEOUT;
    return e ? lost(c, "send", e) : 0;
}

/*
 * The daemon answers each request on the channel once, in order, unless it
 * closes the connection.  The replies a caller stopped waiting for are
 * owed (c->chan_owed, oldest first) and read here before the next request
 * goes out, until the deadline (0: only those there already): a region a
 * late REGION_OK names was registered for a caller that had given up, and
 * is unregistered again (c->chan_forget), c's last error kept.  Returns 0
 * once none is owed, or an rn_status with c's last error set (RN_TIMEOUT:
 * some are still owed).
 */
static int settle(rn_client *c, uint64_t deadline_ns, bool wait)
{
    uint8_t in[RNP_CHAN_MAX];
    char keep[RN_ERRMSG_LEN];
    rnp_chan_msg rep;
    ssize_t n;
    int rv;

    while (c->chan_nowed) {
        if ((rv = receive(c, in, &n, wait ? deadline_ns : rnc_now_ns(), NULL)) == RN_TIMEOUT)
            return rnc_fail(c, RN_TIMEOUT, "session channel: the daemon has not answered an "
                            "earlier request yet (reply type %u): nothing sent",
                            (unsigned)c->chan_owed[0]);
        if (rv != 0)
            return rv;
        bool cut = n > RNP_CHAN_MAX, region = c->chan_owed[0] == RNP_CHAN_REGION_OK;
        memmove(c->chan_owed, c->chan_owed + 1, --c->chan_nowed);
        if (rnp_chan_parse(in, cut ? RNP_CHAN_MAX : (size_t)n, cut, 0, &rep, NULL) == 0 &&
            region && rep.type == RNP_CHAN_REGION_OK && rep.u.region_ok.region &&
            c->chan_forget) {
            snprintf(keep, sizeof keep, "%s", c->last_error);
            (void)c->chan_forget(c, rep.u.region_ok.region);
            snprintf(c->last_error, sizeof c->last_error, "%s", keep);
        }
    }
    return 0;
}

void rnc_chan_collect(rn_client *c)
{
    char keep[RN_ERRMSG_LEN];

    if (!c->chan_nowed || !c->have_chan)
        return;
    snprintf(keep, sizeof keep, "%s", c->last_error);
    (void)settle(c, 0, false);
    snprintf(c->last_error, sizeof c->last_error, "%s", keep);
}

/*
 * Send the request req (with fd >= 0 attached) and receive its reply, of
 * type want, into *rep by the deadline; a request behind late replies gets
 * its own full timeout once they are read.  Returns 0, or an rn_status
 * with c's last error set.  A reply that does not come keeps the
 * connection (closing it would end the session, and with it the ring calls
 * of a client that lives on): it is owed, and settle() reads it before the
 * next request.  A VMM range given up at a chunk is dropped on the daemon's
 * side at once: a VMM_MAP of count 0 goes after the chunk (the daemon
 * answers it ERROR and drops the range's chunks, PROTOCOL.md 12), its
 * reply owed too.
 */
static int exchange(rn_client *c, const rnp_chan_msg *req, int fd, int want, rnp_chan_msg *rep,
                    uint64_t deadline_ns, int *fd_in)
{
    uint8_t in[RNP_CHAN_MAX];
    ssize_t n;
    int rv;

    if (c->chan_nowed) {
        if ((rv = settle(c, deadline_ns, true)) != 0)
            return rv;
        deadline_ns = deadline_of(c);
    }
    /* With no reply owed, the socket has room for a small datagram: a send
     * that would block means the daemon stopped reading. */
    if ((rv = send_msg(c, req, fd)) == RN_TIMEOUT)
        return rnc_fail(c, RN_TIMEOUT, "session channel: the daemon does not read: nothing sent");
    if (rv != 0)
        return rv;
    if ((rv = receive(c, in, &n, deadline_ns, fd_in)) == 0) {
        if ((rv = take_reply(c, in, n, want, rep)) != 0 && fd_in && *fd_in >= 0) {
            close(*fd_in);
            *fd_in = -1;
        }
        return rv;
    }
    if (!c->have_chan)
        return rv; /* (closed: nothing is owed any more) */
    c->chan_owed[c->chan_nowed++] = (uint8_t)want;
    if (req->type == RNP_CHAN_VMM_CHUNK) {
        rnp_chan_msg abort = {.type = RNP_CHAN_VMM_MAP};
        if (send_msg(c, &abort, -1) == 0 && c->have_chan)
            c->chan_owed[c->chan_nowed++] = RNP_CHAN_ERROR;
    }
    if (rv == RN_TIMEOUT)
        return rnc_fail(c, RN_TIMEOUT, "session channel: no reply within %d ms (the request "
                        "stays with the daemon)", c->timeout_ms);
    return rv;
}

/* The service user a system daemon runs as (conn.c checks its socket's
 * owner against the same name). */
#ifndef RN_DAEMON_USER
#define RN_DAEMON_USER "rmsnormd"
#endif

/*
 * Buffers go to whoever listens on the channel, so the peer must be a daemon
 * the caller trusts with them: its own user, root or the service user.  The
 * kernel vouches for the peer of this very connection, which a check of the
 * socket file's owner before connecting cannot (a file replaced meanwhile).
 */
static int check_peer(rn_client *c, const char *path)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    struct passwd pw, *pp = NULL;
    char tmp[1024];

    if (getsockopt(c->chan, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr)
        return rnc_fail(c, RN_SYSTEM, "session channel %s: SO_PEERCRED: %s", path,
                        strerror(errno));
    if (cr.uid == geteuid() || cr.uid == 0)
        return 0;
    if (getpwnam_r(RN_DAEMON_USER, &pw, tmp, sizeof tmp, &pp) == 0 && pp && pp->pw_uid == cr.uid)
        return 0;
    return rnc_fail(c, RN_ENDPOINT,
                    "session channel %s: the daemon runs as uid %u, not as you, root or %s: "
                    "refusing to share buffers with it", path, (unsigned)cr.uid, RN_DAEMON_USER);
}

/* Connect to path by the deadline.  A listener with a full backlog answers
 * EAGAIN at once rather than making the connect wait, so it is tried again
 * until the deadline. */
static int connect_by(rn_client *c, const struct sockaddr_un *sa, uint64_t deadline_ns)
{
    for (;;) {
        if (connect(c->chan, (const struct sockaddr *)sa, sizeof *sa) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN || left_ms(deadline_ns) == 0)
            break;
        poll(NULL, 0, 1);
    }
    if (errno == EAGAIN)
        return rnc_fail(c, RN_TIMEOUT, "session channel %s: no room to connect within %d ms",
                        sa->sun_path, c->timeout_ms);
    return rnc_fail(c, RN_UNREACHABLE, "session channel %s: %s", sa->sun_path, strerror(errno));
}

/* The daemon sends nothing unasked: data with no reply owed is as bad as
 * the close, but a late reply (settle()) is only that. */
bool rnc_chan_closed(rn_client *c)
{
    struct pollfd p = {c->chan, POLLIN | POLLRDHUP, 0};
    short bad = POLLHUP | POLLERR | POLLRDHUP | (c->chan_nowed ? 0 : POLLIN);
    return !c->have_chan || (poll(&p, 1, 0) == 1 && (p.revents & bad));
}

int rnc_chan_open(rn_client *c)
{
    uint64_t deadline = deadline_of(c);
    rnp_chan_msg m = {.type = RNP_CHAN_AUTH}, rep;
    struct sockaddr_un sa;
    int bell = -1;
    const char *path = c->endpoint + 6;
    rn_fault f;
    int rv;

    rnc_chan_close(c);
    if (strncmp(c->endpoint, "ipc://", 6) != 0 ||
        strlen(path) + strlen(RNP_CHAN_SUFFIX) >= sizeof sa.sun_path)
        return rnc_fail(c, RN_ENDPOINT, "endpoint %s: no room for the session channel's path",
                        c->endpoint);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", path, RNP_CHAN_SUFFIX);
    RN_SYS_GOTO(c->chan = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), &f,
                fail);
    c->have_chan = true;
    if ((rv = connect_by(c, &sa, deadline)) != 0 || (rv = check_peer(c, sa.sun_path)) != 0)
        goto out;
    m.u.auth.session = c->session;
    if ((rv = exchange(c, &m, -1, RNP_CHAN_AUTH_OK, &rep, deadline, &bell)) != 0)
        goto out;
    /* The session's bell, when the daemon offers the fast path. */
    if (bell >= 0 && c->bell_off)
        close(bell);
    else if (bell >= 0) {
        c->bell = bell;
        c->have_bell = true;
    }
    return 0;
out:
    rnc_chan_close(c);
    return rv;
fail:
    return rnc_fail(c, RN_SYSTEM, "session channel: socket: %s", strerror(f.err));
}

int rnc_chan_register(rn_client *c, int fd, uint64_t size, uint32_t *region)
{
    rnp_chan_msg m = {.type = RNP_CHAN_REGISTER_FD}, rep;
    int rv;

    if (!c->have_chan)
        return rnc_fail(c, RN_UNKNOWN_SESSION, "session channel: not connected");
    m.u.register_fd.size = size;
    if ((rv = exchange(c, &m, fd, RNP_CHAN_REGION_OK, &rep, deadline_of(c), NULL)) != 0)
        return rv;
    *region = rep.u.region_ok.region;
    if (*region == 0)
        return rnc_fail(c, RN_BAD_REPLY, "session channel: region id 0");
    return 0;
}

int rnc_chan_vmm_chunk(rn_client *c, int fd, uint32_t index, uint64_t offset, uint64_t size)
{
    rnp_chan_msg m = {.type = RNP_CHAN_VMM_CHUNK}, rep;
    int rv;

    if (!c->have_chan)
        return rnc_fail(c, RN_UNKNOWN_SESSION, "session channel: not connected");
    m.u.vmm_chunk.index = index;
    m.u.vmm_chunk.offset = offset;
    m.u.vmm_chunk.size = size;
    if ((rv = exchange(c, &m, fd, RNP_CHAN_VMM_CHUNK_OK, &rep, deadline_of(c), NULL)) != 0)
        return rv;
    if (rep.u.vmm_chunk_ok.index != index)
        return rnc_fail(c, RN_BAD_REPLY, "session channel: chunk %u acknowledged as %u", index,
                        rep.u.vmm_chunk_ok.index);
    return 0;
}

int rnc_chan_vmm_map(rn_client *c, uint32_t count, uint64_t total,
                     const uint8_t uuid[RNP_UUID_BYTES], uint32_t *region)
{
    rnp_chan_msg m = {.type = RNP_CHAN_VMM_MAP}, rep;
    int rv;

    if (!c->have_chan)
        return rnc_fail(c, RN_UNKNOWN_SESSION, "session channel: not connected");
    m.u.vmm_map.count = count;
    m.u.vmm_map.total = total;
    memcpy(m.u.vmm_map.device_uuid, uuid, RNP_UUID_BYTES);
    if ((rv = exchange(c, &m, -1, RNP_CHAN_REGION_OK, &rep, deadline_of(c), NULL)) != 0)
        return rv;
    *region = rep.u.region_ok.region;
    if (*region == 0)
        return rnc_fail(c, RN_BAD_REPLY, "session channel: region id 0");
    return 0;
}

void rnc_chan_wake(rn_client *c, uint32_t *doorbell)
{
    /* The session's bell wakes the daemon's loop itself (one wake-up); the
     * doorbell wakes its ring thread, which then wakes the loop. */
    const char one = 1;
    if (!c->have_bell || send(c->bell, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
        __atomic_add_fetch(doorbell, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

void rnc_chan_close(rn_client *c)
{
    /* The watcher holds a duplicate of the connection: it lets go, so that
     * the daemon sees the close (and the session's end) as before. */
    rnc_watch_disarm(c);
    if (c->have_chan)
        close(c->chan);
    if (c->have_bell)
        close(c->bell);
    c->have_chan = c->have_bell = false;
    c->chan = c->bell = -1;
    c->chan_nowed = 0;
}
