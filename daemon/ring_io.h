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

/* Whether the ring's ready word has reached the job's seq (acquire: the
 * client's inputs, written before ready, are visible after). */
static inline bool rnd_ring_ready(const rnd_ring_job *rj)
{
    uint64_t ready = __atomic_load_n(rnp_ring_u64(rj->ring, RNP_RING_O_READY), __ATOMIC_ACQUIRE);
    return rnp_seq_reached(ready, rj->seq);
}

/* Wake every thread sleeping on the low half of a ring word. */
static inline void rnd_ring_wake(void *ring, unsigned off)
{
    syscall(SYS_futex, rnp_ring_u32(ring, off), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
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
    rnp_ring_put_result(rj->slot, job->status, job->status ? job->msg : NULL);
    __atomic_store_n(rnp_ring_u64(rj->ring, RNP_RING_O_DONE), rj->seq, __ATOMIC_RELEASE);
    /* Pairs with the client's increment of waiters before it reads done:
     * either it sees done, or this sees its waiter. */
    atomic_thread_fence(memory_order_seq_cst);
    if (__atomic_load_n(rnp_ring_u32(rj->ring, RNP_RING_O_WAITERS), __ATOMIC_SEQ_CST))
        rnd_ring_wake(rj->ring, RNP_RING_O_DONE);
}

#endif
