/* SPDX-License-Identifier: MIT */
/*
 * ring.h - the fast path (PROTOCOL.md section 13): rings of BWD slots in
 * shared memory that a client registered, opened with RING_OPEN and closed
 * with RING_CLOSE or the end of the session.
 *
 * Threads: one doorbell thread per daemon watches the producer words of all
 * open rings: it spins a little after activity, then sleeps on the rings'
 * doorbell words (futex_waitv) with a timeout, and wakes the loop
 * (uv_async_send) when a ring has new slots, or (--ring-ready=host) when the
 * ready word of a slot the loop left has come.  Everything else runs on the
 * loop thread: the loop copies each new slot out once, decodes it, and hands
 * it to the request path (the submit hook, request.c's rnd_request_ring),
 * the rings taking turns, one slot each (ring_take.c),
 * which validates, pins and submits it like a nanomsg BWD; the backend
 * answers it in the ring (backend.h, rnd_ring_job).  A slot or replay the
 * request path cannot take now (a limit) stays in the ring until a request
 * of either path is answered or released (rnd_rings_limit_freed).
 *
 * A ring holds a reference on its region from RING_OPEN until its last job
 * was released; its region cannot be unregistered while the ring is open.
 * When the session ends, the ring takes the slots published so far, past
 * the limits (they get an error status unless they can run) and closes;
 * RING_CLOSE runs them, taken within the limits (the ring is closing until
 * the last is taken, close_finished).  Once its last job ended it writes
 * its state word CLOSED, except when the client died: then nothing of the
 * client's memory is written.
 */
#ifndef RND_RING_H
#define RND_RING_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rn_proto.h"
#include "rn_queue.h"
#include "session.h"

struct rnd_ctx;

/* Where a slot's request is answered, for the request path. */
typedef struct rnd_ring_slot {
    void *ring;                    /* the ring's header in the daemon's mapping */
    uint8_t *slot;                 /* the slot in that mapping */
    uint64_t seq;
    bool force;                    /* the ring closes: take it whatever the limits */
    void (*released)(void *owner); /* the request was released (loop thread) */
    void *owner;
    bool graph;                    /* slot is a graph slot, seq its generation (13.8) */
    bool ready;                    /* its ready word had reached seq when it was taken
                                    * (--ring-ready=host): nothing waits for it */
    void *done_dev;                /* the ring's done word in device memory, or NULL */
    uint64_t *arm;                 /* armed (--ring-ready=armed, ring_arm.c): the ring's
                                    * backend words (arm[0..1]: the gate's latch); else NULL */
    uint64_t arm_key;              /* armed: the key its wait and gate compare (the seq);
                                    * else 0 */
    uint64_t arm_epoch;            /* armed: the ring's arming epoch */
    void **prep;                   /* NULL, or the ring's slot prepared ahead: *prep NULL:
                                    * prepare this slot (decode, validate, pin) and keep
                                    * it there, taking nothing; else submit *prep (b and
                                    * bad unused) and clear it once taken */
} rnd_ring_slot;

/*
 * The request path's entry for one slot: b the decoded slot, or NULL with
 * bad its decoding error.  Returns 0 when it took the slot (its answer
 * will be written in the ring, and at->released called once), RN_BUSY when
 * it cannot take it now (try again after a release), another rn_status
 * when it never will (the backend failed).  With at->prep, see there: a
 * slot whose ready word has not come (--ring-ready=host) is prepared while
 * the loop waits, so that only its submission lies between ready and the
 * kernel; rnd_rings.discard frees a prepared slot never submitted.
 */
typedef int rnd_ring_submit_fn(struct rnd_ctx *ctx, rnd_session *s, const rnp_bwd_req *b,
                               const rnp_error *bad, const rnd_ring_slot *at, uint64_t recv_ns);

typedef struct rnd_rings {
    struct rnd_ctx *ctx;
    rnd_ring_submit_fn *submit;
    uv_async_t async;              /* the doorbell thread wakes the loop */
    uv_idle_t poll;                /* the loop polls the rings itself after a slot
                                    * (--ring-spin-us, ring.c's on_poll) */
    uint64_t poll_until;           /* ... until then (loop thread) */
    uint32_t loop_polls;           /* 1 while it does (atomic): the doorbell thread
                                    * then leaves the rings' slots to the loop */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;            /* list and stop, for the doorbell thread */
    rn_queue list;                 /* open rings */
    rn_queue *start;               /* the loop's: the ring its next take starts at (NULL or
                                    * the list's head: the first) */
    bool stop;
    uint32_t kick;                 /* futex word: the loop wakes the thread */
    uint32_t open;                 /* rings open */
    uint32_t closing;              /* of them closing after RING_CLOSE (loop thread) */
    uint32_t graphs;               /* graph slots open in them: while any, the thread
                                    * polls their generation words (under mu; at most
                                    * --max-graphs) */
    uint32_t next_id;
    int ready_mode;                /* --ring-ready, auto resolved for the backend
                                    * (RND_RING_READY_*, ring.c's take) */
    uint32_t revoked_held;         /* armed mode: jobs taken back, not yet released (the
                                    * backends' queue limits leave them out) */
    bool arm_free;                 /* armed mode: arm whatever else is in flight, and no
                                    * revocation for other rings' calls
                                    * (RMSNORMD_DEBUG_ARM_POLICY=free, being measured) */
    uint64_t ready_spin_ns;        /* host mode: how long the thread spins for a ready
                                    * word after anything came (READY_SPIN_NS;
                                    * RMSNORMD_DEBUG_READY_SPIN_US, being measured) */
    void (*discard)(void *prep);   /* frees a prepared slot (rnd_ring_slot.prep); NULL:
                                    * slots are not prepared ahead */
    /* The request path's side of a revocation (--ring-ready=armed,
     * ring_arm.c): marks s's armed requests of ring owner (rnd_ring_slot's
     * owner) after seq `upto` revoked (rnd_ring_job.revoked) and sets their
     * release to `released`; returns how many. */
    unsigned (*revoke)(rnd_session *s, void *owner, uint64_t upto, void (*released)(void *owner));
    /* ring.c: the thaw of a ring whose session ended meanwhile (its client
     * alive, end_pending): the rest of its slots taken past the limits, and
     * closed, as rnd_ring_session_end does. */
    void (*end_thawed)(void *ring);
    bool deferred;                 /* a slot or replay was left at a limit (RN_BUSY):
                                    * the next request that frees one wakes the rings
                                    * (rnd_rings_limit_freed; loop thread) */
} rnd_rings;

/* Start the doorbell thread.  Returns 0 or an rn_status with err. */
int rnd_rings_init(struct rnd_ctx *ctx, rnd_rings *tab, rnd_ring_submit_fn *submit,
                   rnp_error *err);
/* Stop the thread and close the handle (after every session ended). */
void rnd_rings_fini(rnd_rings *tab);

/* RING_OPEN and RING_CLOSE (ops.h's rnd_op_fn). */
int rnd_op_ring_open(struct rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                     rnp_error *err);
int rnd_op_ring_close(struct rnd_ctx *ctx, rnd_session *s, const rnp_request *req,
                      rnp_reply *rep, rnp_error *err);
/* GRAPH_OPEN and GRAPH_CLOSE: a ring's graph slots (PROTOCOL.md 13.8). */
int rnd_op_graph_open(struct rnd_ctx *ctx, rnd_session *s, const rnp_request *req,
                      rnp_reply *rep, rnp_error *err);
int rnd_op_graph_close(struct rnd_ctx *ctx, rnd_session *s, const rnp_request *req,
                       rnp_reply *rep, rnp_error *err);

/* The session table's ring hook: s ends; close its ring (ring.h above). */
void rnd_ring_session_end(rnd_session *s);
/* Whether s's ring holds published slots not yet taken (--ring-ready=host:
 * a call whose inputs are late): the session is not idle. */
bool rnd_ring_pending(const rnd_session *s);

/* The request path: a request was answered or released, so an in-flight
 * limit or the backend's queue may have room.  When a slot or a replay was
 * left at a limit, the rings take what they can (on the loop, soon after):
 * classic requests that fill a limit must not keep a replay waiting until
 * some ring's next release. */
void rnd_rings_limit_freed(rnd_rings *tab);

/* --ring-ready=armed (ring_arm.c): take back the armed calls whose inputs
 * have not come, of every ring but except's (NULL: of all): another
 * client's work is about to be queued, or a CUDA call that may wait for the
 * device (why, for the log).  Nothing to do in the other modes. */
void rnd_rings_revoke_others(rnd_rings *tab, const rnd_session *except, const char *why);

/* --ring-ready=armed (ring_arm.c): a ring job of owner's (rnd_ring_slot's
 * owner) found its gate shut without a revocation: its client's ready went
 * back below it, or carried the daemon's bit.  The ring is not armed again
 * (loop thread). */
void rnd_ring_arm_misuse(void *owner);

/* s's bell rang (chan.c): its client published while the daemon slept;
 * if s's ring has a slot not yet taken, the loop takes the rings' new
 * slots now (fast.bells counts those), else nothing happens. */
void rnd_rings_bell(rnd_rings *tab, rnd_session *s);

#endif
