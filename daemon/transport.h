/*
 * transport.h - the nanomsg raw REP socket, polled through libuv, and the one
 * way a reply leaves the daemon.
 *
 * A raw REP socket keeps each request's routing header (its "control"), so
 * many requests can be in flight and replies can go out in any order: a
 * reply is sent with the control header of its request.  Ownership of a
 * control header: the receive callback gets it; whoever replies hands it to
 * rnd_reply, which takes it whatever happens (sent, or freed).
 */
#ifndef RND_TRANSPORT_H
#define RND_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "rn_proto.h"

typedef struct rnd_ctx rnd_ctx;

/*
 * What nanomsg delivers at most: twice the largest valid message, plus the
 * 4-byte SP header that NN_RCVMAXSIZE counts.  A message between RNP_MAX_MSG
 * and this still reaches the daemon and gets its reply (TOO_BIG, from the
 * decoder); nanomsg drops a longer one, and its connection, before the
 * daemon sees it.
 */
#define RND_RCV_MAX (2 * RNP_MAX_MSG + 4)

/* A message arrived: body is valid during the call only; *control is the
 * request's header, which the callback takes (set it to NULL) or leaves for
 * the transport to free. */
typedef void (*rnd_rx_fn)(rnd_ctx *ctx, void **control, const void *body, size_t len,
                          uint64_t recv_ns);

typedef struct rnd_transport {
    int sock;                      /* nanomsg socket, -1 when closed */
    uv_poll_t poll;                /* on NN_RCVFD */
    bool poll_init;
    char path[RND_SUN_PATH_MAX];   /* the socket file */
    rnd_rx_fn rx;
    uint8_t buf[RNP_MAX_MSG];      /* reply encoding */
} rnd_transport;

/* Bind ctx->cfg.endpoint (mode, group) and start receiving into rx.
 * Returns 0 or an rn_status with err. */
int rnd_transport_open(rnd_ctx *ctx, rnd_rx_fn rx, rnp_error *err);
/* Receive and hand to rx every message waiting now (the poll does this on
 * its own; the drain calls it once more right before the close). */
void rnd_transport_receive_all(rnd_ctx *ctx);
/* Stop receiving, close the socket and remove its file.  Idempotent. */
void rnd_transport_close(rnd_ctx *ctx);

/* Encode rep and send it with the request's control header (taken, see
 * above); count it in the statistics.  A reply that cannot be encoded goes
 * out as RN_INTERNAL instead. */
void rnd_reply(rnd_ctx *ctx, void *control, rnp_reply *rep);
/* An error reply to (op, id): the message is printf-formatted. */
void rnd_reply_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id, int code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The same from an rnp_error (code 0 counts as RN_INTERNAL). */
void rnd_reply_rnp_error(rnd_ctx *ctx, void *control, uint32_t op, uint64_t id,
                         const rnp_error *err);
/* Clear rep's header and set version, op and id. */
void rnd_reply_init(rnp_reply *rep, uint32_t op, uint64_t id);

#endif
