/* SPDX-License-Identifier: MIT */
/*
 * ring_int.h - what libclient's ring.c (the ring and its calls) and
 * ring_graph.c (graph slots, PROTOCOL.md 13.8) share: the ring's memory
 * object, and the graph slots' entries for ring.c.
 */
#ifndef RNC_RING_INT_H
#define RNC_RING_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "client_int.h"
#include "rn_ring.h"

/* Slots of a client's ring (calls published and not answered, at most),
 * unless RMSNORMD_RING_SLOTS says otherwise (a power of two up to
 * RNP_RING_MAX_SLOTS). */
#define RING_SLOTS_DEFAULT 1024u
/* Graph slots after the ring: calls captured in live graphs at most. */
#define GRAPH_SLOTS 128u

struct rnc_ring {
    int fd; /* the memfd; -1 when none */
    uint8_t *base;
    size_t size;
    uint32_t slots; /* the ring's, a power of two; graph slots after them */
    uint32_t ahead; /* calls out at most before one waits: slots, or less */
    bool open; /* RING_OPEN answered in the session `of` */
    bool opened; /* ... in some session: a daemon may hold this memory */
    int dpid;    /* a pidfd of that daemon (-1: none): once it exited, nobody does */
    rnp_session of;
    uint32_t id, region;
    bool go;            /* opened with go: ready is followed by go (PROTOCOL.md 13.3) */
    uint64_t seq;       /* the last published */
    void *ready_stream; /* the stream the last call's ready went to (its id, */
    uint64_t ready_sid; /* rnc_ring_dev.stream_id, 0: none) ... */
    bool ready_queued;  /* ... if it may not have landed yet (else ready = seq) */
    bool go_missing;    /* the last call's go could not be queued on its stream */
    uint64_t checked;   /* results read up to this seq */
    int err;            /* the first error not yet reported (rnc_ring_note) */
    char msg[RN_ERRMSG_LEN];
    uint32_t err_more;  /* errors recorded after it, not yet reported ... */
    char last[RN_ERRMSG_LEN]; /* ... and the last of them */
    const rnc_ring_dev *dev; /* registered with a device (dev_base) */
    uint64_t dev_base;
    uint64_t done_addr;           /* the device done word streams wait on; 0: the ring's */
    rn_client *c;                 /* whose ring */
    bool retire;                  /* streams may wait on it: a new session gets new memory */
    struct rnc_ring *retired;     /* older memory of this client, kept until rn_close */
    uint64_t token;               /* names this memory to graph destructors */
    uint32_t gid[GRAPH_SLOTS];    /* the daemon's graph id in the session `of`; 0: none */
    uint64_t gfails[GRAPH_SLOTS]; /* the slot's fails counter as last read */
    uint32_t gregion[GRAPH_SLOTS][RNP_T_COUNT]; /* the regions its call names, held
                                                 * (rnc_vmm_hold) while its graph lives */
    bool gheld[GRAPH_SLOTS];      /* a live graph holds the slot, or the daemon may: */
    bool gdaemon[GRAPH_SLOTS];    /* ... the daemon alone (no graph: a GRAPH_OPEN unanswered, a
                                   * GRAPH_CLOSE failed), until the session `of` is over */
    uint64_t closed_ns;           /* when a call first found the session `of`'s channel gone
                                   * with calls out (0: not yet; ring.c's session_over) */
};

/* Graph slot i's offset in the ring's memory, and its address. */
static inline uint64_t rnc_gslot_off(const rnc_ring *g, uint32_t i)
{
    return rnp_ring_bytes(g->slots) + (uint64_t)i * RNP_GRAPH_SLOT;
}

static inline uint8_t *rnc_gslot(const rnc_ring *g, uint32_t i)
{
    return g->base + rnc_gslot_off(g, i);
}

/* Record an error of g's calls, to be reported once (the next call,
 * rn_check or rn_sync): the first is kept whole, the ones after it are
 * counted and the last kept, so that a failure does not hide a loss or
 * failures after it. */
static inline __attribute__((format(printf, 3, 4))) void
rnc_ring_note(rnc_ring *g, int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    if (g->err == 0) {
        g->err = code;
        vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    } else {
        g->err_more++;
        vsnprintf(g->last, sizeof g->last, fmt, ap);
    }
    va_end(ap);
}

/* ring_graph.c, for ring.c. */

/* A token that names new ring memory to graph destructors. */
uint64_t rnc_ring_token(void);
/* Graph slot i of g is no longer served: a replay must not wait for it. */
void rnc_graph_let_go(rnc_ring *g, uint32_t i);
/* g's memory goes (rn_close): its queued destructor nodes are dropped and
 * its held slots let go; true when a live graph still holds one (the
 * memory must then stay: its replays still write there). */
bool rnc_graphs_release(rnc_ring *g);
/* Record the first error of graph replays answered since the last look. */
void rnc_collect_graphs(rnc_ring *g);
/* Give back the graph slots of c whose graphs are gone. */
void rnc_take_gone(rn_client *c);
/* A call on a stream being captured: a graph slot of its own. */
int rnc_graph_publish(rn_client *c, rnc_ring *g, const rnp_bwd_req *b, const rnc_ring_dev *dev,
                      void *stream);

#endif
