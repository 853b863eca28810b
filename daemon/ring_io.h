/* SPDX-License-Identifier: MIT */
/*
 * ring_io.h - a backend's side of a ring job (backend.h, rnd_ring_job): is
 * the job's input ready, and its answer (status into the slot, then done,
 * then a wake-up for the client's sleepers).  The words are in memory the
 * client maps too: every access is atomic, and the futex calls are the
 * shared (not process-private) kind.  PROTOCOL.md section 13 is the
 * specification.
 */
#ifndef RND_RING_IO_H
#define RND_RING_IO_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend.h"
#include "rn_ring.h"

/* Whether the client's ready word has reached the job's seq, the daemon's
 * bit aside (acquire: the client's inputs, written before ready, are
 * visible after). */
static inline bool rnd_ring_ready(const rnd_ring_job *rj)
{
    if (rj->graph)
        return true; /* the generation word moved: its inputs are written */
    uint64_t ready = __atomic_load_n(rnp_ring_u64(rj->ring, RNP_RING_O_READY), __ATOMIC_ACQUIRE);
    return rnp_seq_reached(rnp_ring_ready_seq(ready), rj->seq);
}

/* Whether the job's wait is over: an armed job's as its stream's wait
 * decides it, once the ready word with the daemon's bit reached its key
 * (its client's stream, or the daemon's revocation); another's once the
 * client's ready reached it. */
static inline bool rnd_ring_wait_met(const rnd_ring_job *rj)
{
    if (rj->arm_key)
        return rnp_seq_reached(
            __atomic_load_n(rnp_ring_u64(rj->ring, RNP_RING_O_READY), __ATOMIC_ACQUIRE),
            rj->arm_key);
    return rnd_ring_ready(rj);
}

/* An armed job past its wait: whether its gate is open (backend.h), as the
 * kernel's gate decides it (rnk_bwd_args.gate, latch): no earlier job of
 * its epoch found its gate shut (the latch, arm[0]), and the ready word
 * reached its key.  A shut gate latches (arm[1] = its key, then arm[0] =
 * its epoch).  Once per job; true for a job not armed. */
static inline bool rnd_ring_gate_open(const rnd_ring_job *rj)
{
    if (!rj->arm_key)
        return true;
    if (__atomic_load_n(&rj->arm[0], __ATOMIC_ACQUIRE) == rj->arm_epoch)
        return false;
    if (rnd_ring_ready(rj))
        return true;
    __atomic_store_n(&rj->arm[1], rj->arm_key, __ATOMIC_RELAXED);
    __atomic_store_n(&rj->arm[0], rj->arm_epoch, __ATOMIC_RELEASE);
    return false;
}

/* After an armed job ended: whether its gate was shut, from the latch (the
 * first key that skipped in the job's epoch, and every one after it). */
static inline bool rnd_ring_gate_was_shut(const rnd_ring_job *rj)
{
    return rj->arm_key && __atomic_load_n(&rj->arm[0], __ATOMIC_ACQUIRE) == rj->arm_epoch &&
           rnp_seq_reached(rj->arm_key, __atomic_load_n(&rj->arm[1], __ATOMIC_RELAXED));
}

/* Wake every thread sleeping on the low half of a ring word. */
static inline void rnd_ring_wake(void *ring, unsigned off)
{
    syscall(SYS_futex, rnp_ring_u32(ring, off), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The word a job's answer ends with, and its value: the ring's done and
 * the seq; a graph slot's done and 1. */
static inline uint64_t *rnd_ring_done_word(const rnd_ring_job *rj)
{
    return rj->graph ? rnp_ring_u64(rj->slot, RNP_GSLOT_O_DONE)
                     : rnp_ring_u64(rj->ring, RNP_RING_O_DONE);
}

static inline uint64_t rnd_ring_done_value(const rnd_ring_job *rj)
{
    return rj->graph ? 1u : rj->seq;
}

/* The job's result before its done word: a ring slot's status and
 * message; for a graph slot only an error, which also counts in fails
 * (the client reports each new one once, PROTOCOL.md 13.8). */
static inline void rnd_ring_put(const rnd_ring_job *rj, int status, const char *msg)
{
    if (!rj->graph) {
        rnp_ring_put_result(rj->slot, status, status ? msg : NULL);
    } else if (status) {
        rnp_ring_put_result(rj->slot, status, msg);
        __atomic_add_fetch(rnp_ring_u64(rj->slot, RNP_GSLOT_O_FAILS), 1, __ATOMIC_RELEASE);
    }
}

/* The job's answer: status and message into its slot, then done = seq
 * (release: the outputs and the status are visible to whoever sees done),
 * then a wake-up if a client thread sleeps on done.  Nothing for a
 * cancelled job: its client is gone. */
static inline void rnd_ring_answer(rnd_job *job)
{
    rnd_ring_job *rj = job->ring;

    if (atomic_load(&job->cancelled))
        return;
    rnd_ring_put(rj, job->status, job->msg);
    __atomic_store_n(rnd_ring_done_word(rj), rnd_ring_done_value(rj), __ATOMIC_RELEASE);
    if (rj->done_dev) /* (RING_OPEN's done word; host memory on this path) */
        __atomic_store_n((uint64_t *)rj->done_dev, rnd_ring_done_value(rj), __ATOMIC_RELEASE);
    if (rj->graph)
        return; /* a stream waits on it, no thread */
    /* Pairs with the client's increment of waiters before it reads done:
     * either it sees done, or this sees its waiter. */
    atomic_thread_fence(memory_order_seq_cst);
    if (__atomic_load_n(rnp_ring_u32(rj->ring, RNP_RING_O_WAITERS), __ATOMIC_SEQ_CST))
        rnd_ring_wake(rj->ring, RNP_RING_O_DONE);
}

#endif
