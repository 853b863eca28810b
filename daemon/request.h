/* SPDX-License-Identifier: MIT */
/*
 * request.h - one request from receipt to its reply, and for BWD to the
 * release of what it held.
 *
 * rnd_request_receive is the transport's receive callback: it decodes the
 * message, looks the operation up in the op table, admits it once from the
 * table's flags (a session it names, the daemon draining or failing), and
 * runs the operation.  Every received message gets exactly one reply.
 *
 * A BWD request is an object with an explicit state:
 *
 *   RECEIVED -> PINNED -> SUBMITTED -> [ACKED] -> DONE
 *
 *   RECEIVED   decoded and admitted; a copy of a seq that ran or runs is
 *              answered from the first (never run twice)
 *   PINNED     validated against the session's regions, each looked up once
 *              and referenced
 *   SUBMITTED  the backend has the job
 *   ACKED      answered early: the backend queued the work so that the
 *              client's stream waits for it (async CUDA)
 *   DONE       the work ended: answered if it was not, regions released,
 *              the object freed
 *
 * Two functions end a request and nothing else does: answer (the reply, to
 * the request and every copy that waits for it; once) and release (the
 * references, the counters, the memory; once).  A request that fails before
 * SUBMITTED goes straight to both.
 */
#ifndef RND_REQUEST_H
#define RND_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"

/* The transport's receive callback (see transport.h for the ownership of
 * *control). */
void rnd_request_receive(rnd_ctx *ctx, void **control, const void *body, size_t len,
                         uint64_t recv_ns);
/* The session table's cancel hook: the client of s died, so its requests
 * that have not started may be skipped. */
void rnd_request_cancel_session(rnd_session *s);
/* Ring slots of s taken but not started whose input is not ready end with
 * status instead of waiting for it (the session ended while its client
 * lives: RN_UNKNOWN_SESSION). */
void rnd_request_abandon_ring(rnd_session *s, int status);
/* The drain began: the same for every session, with RN_DRAINING. */
void rnd_request_drain_rings(rnd_ctx *ctx);
/* A ring slot as a BWD request (ring.h's rnd_ring_submit_fn): the same
 * object, admission, validation, pinning and statistics; the backend
 * answers it in the ring. */
int rnd_request_ring(rnd_ctx *ctx, rnd_session *s, const rnp_bwd_req *b, const rnp_error *bad,
                     const rnd_ring_slot *at, uint64_t recv_ns);
/* --ring-ready=armed: mark s's armed requests of ring owner after seq upto
 * revoked, their release going to released (rnd_rings.revoke); how many. */
unsigned rnd_request_revoke_ring(rnd_session *s, void *owner, uint64_t upto,
                                 void (*released)(void *owner));
/* Free a slot prepared ahead and never submitted (rnd_rings.discard). */
void rnd_request_ring_discard(void *prep);

#endif
