/* SPDX-License-Identifier: MIT */
/*
 * fakedev.h - a fake device side for libclient's ring path (rnc_ring_dev)
 * without a GPU, shared by the tests that drive rnc_bwd_ring_dev against a
 * CPU daemon: ring memory used at its host address, "stream" writes of
 * ready and go done at once from the host (or never, with defer: a
 * producer that does not end), waits that return at once, and a capture flag under which
 * a call registers a graph slot the test then replays by hand.
 */
#ifndef RN_TEST_FAKEDEV_H
#define RN_TEST_FAKEDEV_H

#include <stdbool.h>
#include <stdint.h>

#include "client_int.h"

typedef struct rnt_fake {
    bool defer;                /* ready and go are never written */
    bool capturing;            /* calls are captured: graph slots */
    int graph_fail;            /* capture fails: 1 before queuing anything, 2 after */
    int writes, waits, graphs; /* what libclient asked of the "stream" */
    uint64_t base;             /* the ring, at the last ready */
    uint64_t slot;             /* the last graph slot captured */
    void (*gone)(void *);      /* its destructor, as CUDA would call it */
    void *arg;
} rnt_fake;

/* The device operations; a call's stream argument is an rnt_fake. */
extern const rnc_ring_dev rnt_fake_dev;

/* The 64-bit word at offset off of a ring or graph slot at address at. */
static inline uint64_t *rnt_w64(uint64_t at, unsigned off)
{
    return (uint64_t *)(uintptr_t)(at + off);
}

#endif
