/* SPDX-License-Identifier: MIT */
/*
 * transport.h - the core's side of the socket: the link to the front
 * process that owns the nanomsg socket (front.h), and the one way a reply
 * leaves the daemon.
 *
 * A request's "control" is an opaque handle naming its sender: the front's
 * token and the front's generation.  Many requests can be in flight and
 * replies can go out in any order.  Ownership: the receive callback gets the
 * handle; whoever replies hands it to rnd_reply, which takes it whatever
 * happens (sent; or dropped when the front that received the request has
 * been replaced since).  A handle the callback leaves is forgotten (the
 * front frees what it kept).
 *
 * When the front dies (nanomsg aborted on hostile bytes), the transport
 * starts a new one at once; past RND_FRONT_RESTARTS restarts within a
 * minute it reports the daemon failing and waits a second between starts.
 */
#ifndef RND_TRANSPORT_H
#define RND_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "rn_proto.h"
#include "rn_queue.h"

typedef struct rnd_ctx rnd_ctx;

/*
 * What nanomsg delivers at most: twice the largest valid message, plus the
 * 4-byte SP header that NN_RCVMAXSIZE counts.  A message between RNP_MAX_MSG
 * and this still reaches the daemon and gets its reply (TOO_BIG, from the
 * decoder); nanomsg drops a longer one, and its connection, before the
 * daemon sees it.
 */
#define RND_RCV_MAX (RNP_MAX_RECV + 4)
/* Front restarts within a minute before the daemon reports failing. */
#define RND_FRONT_RESTARTS 10
/* How often the front is asked to probe its own endpoint, and how long the
 * probe may take before the front counts as not serving. */
#define RND_PROBE_MS 5000


/* A message arrived: body is valid during the call only; *control names its
 * sender, which the callback takes (set it to NULL) or leaves. */
typedef void (*rnd_rx_fn)(rnd_ctx *ctx, void **control, const void *body, size_t len,
                          uint64_t recv_ns);

typedef struct rnd_transport {
    int fd;                        /* the core's end of the link, -1 when none */
    uv_poll_t poll;
    bool poll_init, poll_writable;
    uv_process_t front;
    bool front_running;            /* spawned and not yet exited */
    uint32_t gen;                  /* the front's generation, in every handle */
    bool closing;                  /* the drain closed the link: no restart */
    uv_timer_t restart_timer;
    bool timer_init;
    uint64_t restarts[RND_FRONT_RESTARTS];  /* when the last restarts began */
    uint32_t nrestarts;            /* since start-up */
    uint64_t last_restart_ns;      /* 0: never */
    bool spawn_failed;             /* the front's handle closes after a failed spawn */
    uv_idle_t spin;                /* active: the loop polls without sleeping */
    uint64_t spin_until;           /* until then (--spin-us after a request: a client's
                                      next request usually follows within tens of us,
                                      and waking a sleeping loop adds ~10 us to each) */
    uv_timer_t probe_timer;        /* the end-to-end probe (front.h) */
    uint32_t probe_token;
    uint64_t probe_sent_ns;        /* 0: no probe outstanding */
    bool probe_failed;             /* the last probe went unanswered */
    rn_queue out;                  /* datagrams waiting for room on the link */
    char exe[4096];                /* this binary, for the front */
    uint64_t replies_dropped;      /* to a front that was replaced */
    uint32_t last_req;             /* the token of the last request read (RND_LINK_LAST_READ) */
    uint64_t refused;              /* connections the fronts refused (--max-connections) */
    uint64_t refused_front;        /* of those, by the front running now */
    uint64_t refused_last_ns;      /* when that count last grew; 0: never */
    uint64_t refused_logged_ns;    /* when it was last logged */
    rnd_rx_fn rx;
    uint8_t *rbuf;                 /* one datagram from the front */
    uint8_t buf[RNP_MAX_MSG];      /* reply encoding */
} rnd_transport;

/* Start the front, which binds ctx->cfg.endpoint (mode, group), and wait
 * for it to say so; then receive into rx.  Returns 0 or an rn_status with
 * err (the front's own message when the bind failed). */
int rnd_transport_open(rnd_ctx *ctx, rnd_rx_fn rx, rnp_error *err);
/* Receive and hand to rx every message waiting now (the poll does this on
 * its own; the drain calls it once more right before the close). */
void rnd_transport_receive_all(rnd_ctx *ctx);
/* Close the link: the front closes the socket, removes its file and exits;
 * the loop ends once it has.  Idempotent. */
void rnd_transport_close(rnd_ctx *ctx);
/* The front died RND_FRONT_RESTARTS times within the last minute. */
bool rnd_transport_flapping(const rnd_ctx *ctx);
/* A front is serving (for the watchdog and HEALTH): running, answering its
 * end-to-end probe, and not restarting too often. */
bool rnd_transport_serving(const rnd_ctx *ctx);

/* Encode rep and send it to the request's sender (control, taken); count it
 * in the statistics.  A reply that cannot be encoded goes out as
 * RN_INTERNAL instead. */
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
