/* SPDX-License-Identifier: MIT */
/*
 * rawring.h - a fast-path client below libclient, for tests that must
 * control every word of the ring (PROTOCOL.md section 13): it plays the
 * client and its "GPU side" (it writes ready when the test says so), and can
 * publish any bytes as a slot.  Internal names: rnr_ring_.
 */
#ifndef RN_RAWRING_H
#define RN_RAWRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_client.h"
#include "rn_ring.h"

typedef struct rnr_ring {
    int sock, chan, fd;            /* NN_REQ socket, session channel, the memfd */
    rnp_session session;
    uint8_t *mem;                  /* the ring at mem, the data at data */
    size_t size;
    uint8_t *data;
    size_t data_bytes;
    uint32_t region, ring, slots;
    uint64_t seq;                  /* the last published */
    bool no_bell;                  /* publish without ringing the doorbell */
    bool no_go;                    /* opened without go (rnr_ring_open_nogo): ready
                                    * writes no go */
} rnr_ring;

/* HELLO, AUTH, a memfd with a ring of slots slots and data_bytes of data
 * after it registered as one region, RING_OPEN at offset 0.  Returns 0 or
 * -1 (printed). */
int rnr_ring_open(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes);
/* The same with RING_OPEN's go unset: a client whose ready comes without
 * go (PROTOCOL.md 13.3), which the daemon never arms. */
int rnr_ring_open_nogo(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes);
/* The same with the memfd sealed against shrinking, as libclient seals its
 * rings (the cuda backend takes no other; the CPU backend's test of a ring
 * shrunk under the daemon needs one that is not). */
int rnr_ring_open_sealed(rnr_ring *g, const char *endpoint, uint32_t slots, size_t data_bytes);
/* Close the connections and unmap (no BYE: the channel's close ends the
 * session). */
void rnr_ring_close(rnr_ring *g);
/* One request on g's socket; the reply's status, -1 when none came. */
int rnr_ring_call(rnr_ring *g, rnp_request *q, rnp_reply *rep);

/* a's pointers (inside g->data) as a slot's request in g's region. */
void rnr_ring_req(const rnr_ring *g, const rn_bwd_args *a, rnp_bwd_req *b);
/* Publish b as the next slot (desc NULL) or the RNP_RING_DESC bytes desc;
 * set ready to it first when set_ready.  Rings the doorbell when the daemon
 * sleeps.  Returns the slot's seq. */
uint64_t rnr_ring_publish(rnr_ring *g, const rnp_bwd_req *b, const uint8_t *desc, bool set_ready);
/* The "GPU side": ready = seq, then go = seq (unless no_go). */
void rnr_ring_ready(rnr_ring *g, uint64_t seq);
/* go = seq alone (a client that breaks PROTOCOL.md 13.3's order). */
void rnr_ring_go(rnr_ring *g, uint64_t seq);
uint64_t rnr_ring_done(const rnr_ring *g);
/* Wait until done reaches seq (at most timeout_ms).  0 or -1. */
int rnr_ring_wait(const rnr_ring *g, uint64_t seq, int timeout_ms);
/* The status of slot seq (its message into msg). */
int rnr_ring_status(const rnr_ring *g, uint64_t seq, char *msg, size_t len);
/* The ring's state word (RNP_RING_OPEN / RNP_RING_CLOSED). */
uint32_t rnr_ring_state(const rnr_ring *g);

#endif
