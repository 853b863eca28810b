/* SPDX-License-Identifier: MIT */
/*
 * closeq.h - a thread of its own for closes that may block: the loop hands
 * it what it released (a bounded inbox, so that the thread's own list stays
 * short to walk: what does not fit waits in the loop's backlog, which has no
 * bound, so that a release never blocks the loop however long the thread is
 * held up), and the thread closes each item once the owner
 * says it may (ready), in whatever order items become ready, polling with a
 * growing pause while none is.  Nothing here knows CUDA: the cuda backend
 * (daemon/cuda/closer.c) supplies ready (its fence event has completed) and
 * close (cudaIpcCloseMemHandle, the VMM unmaps, cudaHostUnregister), and the
 * unit test supplies fakes (tests/unit/test_daemon_closeq.c).
 *
 * The gate: an owner whose closes may wait for work that can be late (the
 * cuda backend: a close waits for the device, and a stream of the daemon
 * may wait on a client's producer) supplies gate_enter and gate_leave.  The
 * thread asks gate_enter before each close; while it says not now, nothing
 * is closed (items keep coming into the inbox and the backlog, and the
 * thread looks again after its pause), and each close runs between a
 * gate_enter that said yes and its gate_leave.
 *
 * Threads: rnd_closeq_push, _flush, _close_here and _halt run on the loop
 * thread (the backlog is the loop's alone); the two callbacks run on the
 * closer thread, or on the caller of rnd_closeq_close_here; _stats from any
 * thread.  The counters are under mu.
 */
#ifndef RND_CLOSEQ_H
#define RND_CLOSEQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "rn_queue.h"

/* Embedded in what the owner releases. */
typedef struct rnd_closeq_item {
    rn_queue link;                 /* the backlog, the inbox, or the thread's own list */
    uint64_t queued_ns;            /* released (rnd_now_ns) */
} rnd_closeq_item;

typedef struct rnd_closeq_ops {
    /* Whether it may be closed now: 1 yes, 0 not yet (asked again at the
     * next poll), -1 never (the owner's device failed: the thread stops
     * closing and leaves every item to the process exit). */
    int (*ready)(void *ctx, rnd_closeq_item *it);
    /* Close it and free it; may block as long as the close takes. */
    void (*close)(void *ctx, rnd_closeq_item *it);
    /* On the closer thread before anything else; NULL is fine. */
    void (*thread_start)(void *ctx);
    /* Whether a close may run now (NULL: always): 1 yes, and the owner
     * keeps it so until gate_leave, which follows the close; 0 not now
     * (asked again at the next look); -1 never (as ready's -1).  On the
     * thread that closes. */
    int (*gate_enter)(void *ctx);
    void (*gate_leave)(void *ctx);
    /* The gate opened after it held closes for held_ns (pending: items not
     * closed at that moment); for the owner's log.  NULL is fine. */
    void (*gate_opened)(void *ctx, uint64_t held_ns, uint64_t pending);
} rnd_closeq_ops;

typedef struct rnd_closeq_stats {
    uint64_t pending;              /* released and not closed yet (backlog included) */
    uint64_t closed;               /* closed so far */
    uint64_t pending_max;          /* the most pending at once */
    uint64_t wait_max_ns;          /* the longest from release to close */
    uint64_t gated;                /* times the gate held a close (once per time it was shut) */
    uint64_t gated_max_ns;         /* the longest the gate held closes */
    bool gate_shut;                /* the gate holds closes now */
} rnd_closeq_stats;

typedef struct rnd_closeq {
    const rnd_closeq_ops *ops;
    void *ctx;
    uint32_t cap;                  /* items the thread holds at most (inbox and its own) */
    uint32_t poll_min_us, poll_max_us; /* the pause between looks while none is ready */
    rn_queue backlog;              /* released, waiting for room (loop thread) */
    uint32_t nbacklog;             /* (loop thread; read by _stats under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rn_queue inbox;                /* handed over, not yet taken by the thread (mu) */
    uint32_t held;                 /* inbox and the thread's own list (mu) */
    uint64_t closed, pending_max, wait_max_ns; /* (mu) */
    uint64_t gated, gated_max_ns;  /* (mu) */
    uint64_t shut_since;           /* the gate was found shut (rnd_now_ns); 0: open (mu) */
    bool stop;                     /* the thread ends once it holds nothing (mu) */
    bool halted;                   /* close nothing more (mu) */
    bool running;                  /* the thread was started and not joined */
    bool busy;                     /* the thread is inside a close (mu), for the tests */
    pthread_t thr;
} rnd_closeq;

/* Start the thread.  Returns 0 or an errno value (nothing started).
 * cap 0: 256. */
int rnd_closeq_start(rnd_closeq *q, const rnd_closeq_ops *ops, void *ctx, uint32_t cap);
/* Set q up without a thread: items wait in the backlog until
 * rnd_closeq_close_here closes them on the caller's thread. */
void rnd_closeq_init_inline(rnd_closeq *q, const rnd_closeq_ops *ops, void *ctx);
/* Release it: into the backlog, then as much of the backlog as fits goes to
 * the thread. */
void rnd_closeq_push(rnd_closeq *q, rnd_closeq_item *it);
/* Hand the thread as much of the backlog as fits (the loop calls this after
 * each poll). */
void rnd_closeq_flush(rnd_closeq *q);
/* Close the backlog on the calling thread, each item whose ready is not 0
 * (an item not ready stays; -1 leaves it too), while the gate lets it.
 * Without a thread this is how items get closed at all. */
void rnd_closeq_close_here(rnd_closeq *q);
/* Close nothing more: the owner's device failed and may still hold what was
 * released.  Items stay where they are, for the process exit. */
void rnd_closeq_halt(rnd_closeq *q);
/*
 * End the thread once everything handed to it is closed (or at once if
 * halted), within timeout_ms (< 0: however long it takes).  The backlog is
 * not handed over: the caller closes it (rnd_closeq_close_here) once the
 * thread is gone.  Returns whether the thread was joined; if not it was
 * detached and still uses q, which must then stay allocated.
 */
bool rnd_closeq_stop(rnd_closeq *q, int timeout_ms);
/* Release the mutex and condition (after rnd_closeq_stop returned true). */
void rnd_closeq_destroy(rnd_closeq *q);
void rnd_closeq_get_stats(rnd_closeq *q, rnd_closeq_stats *out);

#endif
