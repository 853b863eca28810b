/* SPDX-License-Identifier: MIT */
/*
 * ring_int.h - what ring.c (rings, the doorbell thread), ring_take.c (the
 * loop's taking of slots) and ring_graph.c (graph slots, PROTOCOL.md 13.8)
 * share: the ring and graph slot objects, and the entries between them.
 * ring.c calls ring_take.c and ring_graph.c; a graph replay's release
 * reaches its ring through the ring's released pointer, which ring.c set.
 *
 * Threads: fields marked "under mu" are read by the doorbell thread and
 * changed by the loop with the rings' mutex held; everything else is the
 * loop's.
 */
#ifndef RND_RING_INT_H
#define RND_RING_INT_H

#include <limits.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ring.h"
#include "rn_ring.h"

struct rnd_ring;

/* A graph slot (PROTOCOL.md 13.8): its descriptor, copied once and checked
 * at GRAPH_OPEN, is submitted again at each replay the generation word
 * announces. */
typedef struct rnd_graph {
    uint32_t id;
    struct rnd_ring *ring;
    uint8_t *base;                 /* the graph slot in the daemon's mapping */
    uint8_t desc[RNP_RING_DESC];   /* the descriptor, the daemon's own copy */
    uint64_t polled;               /* the doorbell thread: gen last seen (under mu) */
    uint64_t taken;                /* the loop: gen last submitted */
    bool busy;                     /* a replay of it is submitted, not yet released */
    bool closed;                   /* GRAPH_CLOSE or the ring's end: freed once idle */
    int end_status;                /* closed: what a replay that began then is answered */
    rn_queue link;                 /* its ring's graphs (under mu) */
} rnd_graph;

typedef struct rnd_ring {
    uint32_t id;
    rnd_rings *tab;
    rnd_session *sess;             /* NULL once closed */
    rnd_region *region;            /* referenced until the ring is freed */
    uint8_t *base;                 /* the header in the daemon's mapping */
    uint32_t slots;
    uint64_t cons;                 /* seq of the last slot taken */
    uint32_t jobs;                 /* slots and replays taken, not yet released */
    bool closed;                   /* no more slots are taken */
    bool closing;                  /* RING_CLOSE came: slots up to close_prod are taken as
                                    * the limits allow, then the ring closes (loop's) */
    uint64_t close_prod;           /* closing, ending: the last slot published before
                                    * RING_CLOSE or the session's end */
    bool ending;                   /* its session ends: the slots up to close_prod are
                                    * taken, past the limits, and nothing after */
    bool gone;                     /* its client died: nothing answered (state at the end) */
    bool stopped;                  /* the backend refused a slot for good */
    int stop_status;               /* stopped: what it refused with */
    uint64_t seen;                 /* the doorbell thread: the last producer word seen */
    uint64_t wait_seq;             /* --ring-ready=host: the slot the loop left because its
                                    * ready word had not reached it, 0 if none (atomic:
                                    * the loop sets it, the doorbell thread clears it when
                                    * ready gets there) */
    rnd_region *done_region;       /* the done word's device region (referenced), or NULL */
    void *done_dev;                /* the word in the daemon's mapping of it */
    void *prep;                    /* slot cons + 1, prepared while its ready word had not
                                    * come (--ring-ready=host; rnd_ring_slot.prep), or NULL */
    uint64_t left_ns;              /* when the loop first left a slot it could not take
                                    * yet (ready not there, a limit), 0 if none */
    const char *left_why;          /* which of them, first */
    bool more;                     /* rnd_rings_take_all: took a slot in its last round */
    rn_queue link;                 /* on tab->list while open (under mu) */
    rn_queue graphs;               /* its open graph slots (under mu) */
    uint32_t ngraphs, next_graph;
    uint64_t region_off;           /* the ring's offset in its region */
    /* --ring-ready=armed (ring_arm.c). */
    bool go;                       /* its client's stream writes go (RING_OPEN's go) */
    uint64_t *arm;                 /* the backend's words (arm_open; arm[0..1] the gates'
                                    * latch), or NULL: the ring runs in host mode */
    uint64_t epoch;                /* the arming epoch (from 1; a revocation moves it) */
    uint64_t armed_upto;           /* the last seq taken armed, 0 if none (under mu) */
    bool frozen;                   /* revoked: nothing is taken or armed until the
                                    * revoked jobs are released (under mu) */
    uint64_t revoke_from;          /* frozen: the last seq not revoked (under mu) */
    bool raised;                   /* frozen: the daemon's bit of the ready word is set,
                                    * and kept set (under mu) */
    uint64_t revoked_upto;         /* the last seq the last revocation took back:
                                    * nothing at or below it is armed again (under mu) */
    bool arm_broken;               /* its ready word went back below an armed call
                                    * (PROTOCOL.md 13.3): not armed again */
    bool end_pending;              /* its session ended (the client alive) while frozen:
                                    * the rest is taken and the ring closed at the thaw */
    uint32_t revoked;              /* jobs revoked, not yet released */
    uint64_t unarmable;            /* a slot the backend refused armed (RND_UNARMABLE):
                                    * taken unarmed once its ready word came */
    /* ring.c's release of one of the ring's jobs (a slot's or a replay's):
     * a graph replay's release ends with it. */
    void (*released)(void *ring);
} rnd_ring;

/* ring_take.c, for ring.c.  Whether prod (g's producer word) publishes a
 * slot after the last one taken that may be taken. */
bool rnd_ring_takeable(const rnd_ring *g, uint64_t prod);
/* Take g's published slots, oldest first, until one cannot be taken now
 * (force: the ring closes, every slot whatever the limits): how many. */
unsigned rnd_ring_take(rnd_ring *g, bool force);
/* Every ring's published slots, the rings taking turns: how many. */
unsigned rnd_rings_take_all(rnd_rings *tab);
/* The producer word as the loop takes it: a closing or ending ring's stops
 * at close_prod. */
uint64_t rnd_ring_prod(const rnd_ring *g);
/* Free g's prepared slot, if any, unsubmitted. */
static inline void rnd_ring_drop_prep(rnd_ring *g)
{
    if (g->prep)
        g->tab->discard(g->prep);
    g->prep = NULL;
}

/* ring_arm.c, for ring.c and ring_take.c (--ring-ready=armed). */
/* A debugging variable of microseconds, name, up to max: *ns set if it is
 * (left as it is if unset or empty).  0 or RN_INVALID_ARGUMENT naming it. */
int rnd_ring_env_us(const char *name, unsigned long max, uint64_t *ns, rnp_error *err);
/* At the rings' start: RMSNORMD_DEBUG_ARM_POLICY.  0 or an rn_status. */
int rnd_rings_arm_init(rnd_rings *tab, rnp_error *err);
/* The ring's words from the backend (g->arm, or NULL: host mode, also for
 * a ring whose client does not write go); and back. */
void rnd_ring_arm_open(rnd_ring *g);
void rnd_ring_arm_free(rnd_ring *g);
/* Under mu (the doorbell thread): a frozen ring's ready word keeps the
 * daemon's bit the revocation set (the client's stream may write ready
 * again meanwhile).  Returns whether g is frozen (the thread keeps
 * looking). */
bool rnd_ring_arm_poll(rnd_ring *g);
/* The loop, about to take slot seq of an armed ring: whether it is taken
 * armed (g->armed_upto is seq then).  A slot whose ready word has not come
 * is, where the ring may arm (else it is left for its word, as in host
 * mode); one whose word came is too while an armed slot before it has not
 * ended (the done word short of armed_upto), so that every slot behind an
 * armed call that may still skip is gated by the same latch. */
bool rnd_ring_arm_take(rnd_ring *g, uint64_t seq);
/* The loop: whether an armed slot of g has not ended yet (its done word
 * short of armed_upto). */
bool rnd_ring_arm_behind(const rnd_ring *g);
/* The backend refused slot seq armed (RND_UNARMABLE): it is taken again
 * unarmed, once its ready word came. */
void rnd_ring_arm_refused(rnd_ring *g, uint64_t seq);
/* End g's armed waits whose ready has not come (the ring freezes until the
 * revoked jobs ended): how many jobs were revoked. */
unsigned rnd_ring_revoke(rnd_ring *g, const char *why);

/* Wake the doorbell thread (from a long sleep: a ring or graph slot came). */
static inline void rnd_rings_kick(rnd_rings *tab)
{
    __atomic_add_fetch(&tab->kick, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &tab->kick, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* ring_graph.c, for ring.c. */

/* Under mu (the doorbell thread): whether a graph slot of g announced a
 * replay the loop has not been told of. */
bool rnd_graphs_poll(rnd_ring *g);
/* The loop: submit the replays g's graph slots announced. */
void rnd_graphs_take(rnd_ring *g);
/* The ring ends with its client alive: no replay is taken any more (a
 * replay that began before is answered status). */
void rnd_graphs_end(rnd_ring *g, int status);
/* RING_CLOSE, after rnd_graphs_end: the ring's graph slots go now (off its
 * list and the daemon's count; a replay running frees its own at its
 * release), not when the closing ring closes. */
void rnd_graphs_drop(rnd_ring *g);
/* The ring is freed (off the thread's list): its graph slots with it. */
void rnd_graphs_free(rnd_ring *g);

#endif
