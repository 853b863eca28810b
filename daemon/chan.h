/* SPDX-License-Identifier: MIT */
/*
 * chan.h - the session channel: a SOCK_SEQPACKET Unix socket beside the
 * nanomsg socket file (its path plus ".chan"), owned by the core.  nanomsg
 * tells nothing of its peers and passes no descriptors; this socket does
 * both.  A client proves its session capability there (AUTH), the kernel
 * vouches for its pid and uid (SO_PEERCRED, read once at accept), and shared
 * memory arrives as descriptors (REGISTER_FD, SCM_RIGHTS), so the daemon only
 * maps what the client itself could open.  PROTOCOL.md section 12 is the
 * specification of the messages; every one is a small fixed-size datagram,
 * parsed and built field by field by proto/chan.c.
 *
 * One connection per session: AUTH binds the two (rnd_session_bind), and
 * from then on the session ends when the connection closes, and the
 * connection closes when the session ends.  Connections beyond
 * max-sessions plus a few close one not yet authenticated (the oldest of the
 * user who holds the most), or are refused at accept when every one is
 * (stats channel.evicted, channel.refused); one that has not
 * authenticated within RND_CHAN_AUTH_MS is closed.
 */
#ifndef RND_CHAN_H
#define RND_CHAN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "rn_proto.h"
#include "rn_queue.h"

typedef struct rnd_ctx rnd_ctx;

/* Connections the channel holds beyond max-sessions: clients between their
 * connect and their AUTH while every session is in use. */
#define RND_CHAN_SPARE 8
/* A connection that has not authenticated this long is closed. */
#define RND_CHAN_AUTH_MS 10000

typedef struct rnd_chan {
    int fd;                        /* the listening socket, -1 when none */
    uv_poll_t poll;
    bool poll_init;
    bool paused;                   /* out of descriptors: accepting again at the next tick */
    char path[RND_SUN_PATH_MAX];   /* "" until bound; unlinked at the close */
    rn_queue conns;
    uint32_t nconns;
} rnd_chan;

/* Bind the channel's socket (mode and group as the nanomsg socket's; a stale
 * file of a dead daemon is replaced).  No libuv yet.  Returns 0 or an
 * rn_status with err. */
int rnd_chan_open(rnd_ctx *ctx, rnp_error *err);
/* Accept and serve connections on ctx's loop.  Returns 0 or an rn_status
 * with err. */
int rnd_chan_start(rnd_ctx *ctx, rnp_error *err);
/* Close connections that have not authenticated within RND_CHAN_AUTH_MS;
 * accept again after a pause for want of descriptors (the server's 1 s
 * tick calls it). */
void rnd_chan_expire(rnd_ctx *ctx, uint64_t now_ns);
/* Close every connection and the socket, and remove its file (the end of
 * the drain, or a start-up that failed).  Idempotent. */
void rnd_chan_close(rnd_ctx *ctx);

#endif
