/* SPDX-License-Identifier: MIT */
/*
 * conn_limit.c - the front's connection limit (--max-connections).
 *
 * nanomsg accepts every connection on its own thread and offers no hook or
 * option to refuse one; past the descriptor limit its accept fails with
 * EMFILE, which it retries at once, forever (100 % CPU while new clients
 * hang).  So the front takes accept4() itself: this file defines it, the
 * executable's definition comes first in the dynamic linker's lookup, and
 * nanomsg's calls land here.  Each accepted connection is counted against
 * the limit; one over it gets RNP_CONN_REFUSED (8 bytes, so that libclient's
 * probe can say why) and is closed, and nanomsg hears ECONNABORTED, which it
 * takes as "nothing to accept, wait for the next one".  Only the front arms
 * the limit; in the core (the same binary) accept4 is the plain system call.
 *
 * Counting: the front's other descriptors are few and fixed, and its
 * connections are the sockets whose local address is the socket file.  So
 * the count walks the descriptors from the first one free after the bind to
 * the highest one accepted so far and asks each for its address; the front's
 * own probe (front.h: it connects as a client would) is not counted and is
 * never refused.  That is one system call per descriptor, per accept: a
 * millisecond at a thousand connections, and connections are made once per
 * client.
 */
#include "conn_limit.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

static struct {
    atomic_bool armed;
    uint32_t max;
    int first_fd;            /* descriptors below belong to the front itself */
    atomic_int high_fd;      /* the highest connection accepted so far */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    atomic_uint_fast64_t refused;
} lim;

void rnd_conn_limit_arm(const char *path, uint32_t max)
{
    /* The lowest free descriptor now: the front's own are below it. */
    int fd = dup(0);
    lim.first_fd = fd >= 0 ? fd : 3;
    if (fd >= 0)
        close(fd);
    lim.max = max;
    atomic_store(&lim.high_fd, lim.first_fd);
    strncpy(lim.path, path, sizeof lim.path - 1);
    atomic_store(&lim.armed, true);
}

uint64_t rnd_conn_limit_refused(void)
{
    return atomic_load(&lim.refused);
}

/* fd is a connection accepted on the socket file (not the listener, not the
 * front's own probe, not any other descriptor of the front). */
static bool is_connection(int fd, pid_t self)
{
    struct sockaddr_un sa;
    socklen_t len = sizeof sa;
    int listening = 0;
    socklen_t ilen = sizeof listening;
    struct ucred cr;
    socklen_t clen = sizeof cr;

    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || sa.sun_family != AF_UNIX ||
        len <= offsetof(struct sockaddr_un, sun_path) ||
        strncmp(sa.sun_path, lim.path, sizeof sa.sun_path) != 0)
        return false;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) != 0 || listening)
        return false;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &clen) == 0 && cr.pid == self)
        return false;
    return true;
}

static bool over_limit(int fd)
{
    pid_t self = getpid();
    struct ucred cr;
    socklen_t clen = sizeof cr;
    uint32_t n = 0;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &clen) == 0 && cr.pid == self)
        return false;   /* the front's probe: it must always get through */
    int high = atomic_load(&lim.high_fd);
    for (int i = lim.first_fd; i <= high; i++)
        if (i != fd && is_connection(i, self) && ++n >= lim.max)
            return true;
    return false;
}

static int limited(int fd)
{
    if (fd < 0 || !atomic_load(&lim.armed))
        return fd;
    if (over_limit(fd)) {
        /* Best effort: the peer may be gone, or its buffer full. */
        (void)!send(fd, RNP_CONN_REFUSED, RNP_CONN_REFUSED_LEN, MSG_DONTWAIT | MSG_NOSIGNAL);
        close(fd);
        atomic_fetch_add(&lim.refused, 1);
        errno = ECONNABORTED;
        return -1;
    }
    int high = atomic_load(&lim.high_fd);
    while (fd > high && !atomic_compare_exchange_weak(&lim.high_fd, &high, fd))
        ;
    return fd;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    return limited((int)syscall(SYS_accept4, fd, addr, len, flags));
}

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    return limited((int)syscall(SYS_accept4, fd, addr, len, 0));
}
