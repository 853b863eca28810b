/* SPDX-License-Identifier: MIT */
/*
 * rn_ring.h - the fast path's ring (PROTOCOL.md section 13): a header and a
 * power-of-two number of slots in shared memory that the client registered
 * as a region, opened with RING_OPEN.  A slot holds what a BWD request holds,
 * in a fixed little-endian layout; the client publishes slots by raising
 * the producer word, the daemon answers each one by writing its status into
 * the slot and then the slot's seq into the done word.
 *
 * This header gives the layout (byte offsets, never a struct cast over
 * shared bytes), the pure helpers both sides share (slot encode, decode and
 * check, the result, sequence arithmetic) and the atomic accessors of the
 * header's words.  Whoever reads a slot copies its RNP_RING_DESC bytes out
 * once and decodes the copy: the other side may change the shared bytes at
 * any time.
 *
 * The words are naturally aligned 32- and 64-bit little-endian integers,
 * each on its own 64-byte line, so that a CUDA stream can write and wait on
 * ready and done (cuStreamWriteValue64 / cuStreamWaitValue64) in memory both
 * processes registered with CUDA, and so that a futex can sleep on the low
 * half of a 64-bit word.
 */
#ifndef RN_RING_H
#define RN_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rn_proto.h"

#define RNP_RING_MAGIC 0x676e6972u     /* the bytes "ring" */
#define RNP_RING_VERSION 1u
#define RNP_RING_LINE 64u              /* one cache line */
#define RNP_RING_ALIGN 64u             /* the ring's offset in its region */
#define RNP_RING_HDR 512u              /* header bytes; slot 0 follows */
#define RNP_RING_SLOT 512u             /* bytes per slot */
#define RNP_RING_DESC 256u             /* a slot's descriptor (client) ... */
#define RNP_RING_RESULT 256u           /* ... then its result (daemon), at this offset */
#define RNP_RING_MAX_SLOTS 1024u

/* Header words: byte offsets from the ring's start, and who writes them. */
enum rnp_ring_hdr_off {
    RNP_RING_O_MAGIC = 0,              /* u32, client, before RING_OPEN */
    RNP_RING_O_VERSION = 4,            /* u32, client, before RING_OPEN */
    RNP_RING_O_SLOTS = 8,              /* u32, client, before RING_OPEN */
    RNP_RING_O_SLOT_SIZE = 12,         /* u32, client, before RING_OPEN: RNP_RING_SLOT */
    RNP_RING_O_PROD = 64,              /* u64, client: seq of the last published slot */
    RNP_RING_O_READY = 128,            /* u64, client or its stream: inputs ready up to seq;
                                        * bit 62 the daemon's (RNP_RING_READY_RAISED) */
    RNP_RING_O_GO = 136,               /* u64, the client's stream after ready (RING_OPEN's
                                        * go): its own calls on other streams wait on it */
    RNP_RING_O_DONE = 192,             /* u64, daemon or its stream: answered up to seq */
    RNP_RING_O_SLEEPING = 256,         /* u32, daemon: 1 while it may sleep on doorbell */
    RNP_RING_O_DOORBELL = 320,         /* u32, client: bumped to wake the daemon (futex) */
    RNP_RING_O_WAITERS = 384,          /* u32, client: threads sleeping on done (futex) */
    RNP_RING_O_STATE = 448,            /* u32, daemon: RNP_RING_OPEN or RNP_RING_CLOSED */
    RNP_RING_O_CLOSE_STATUS = 452,     /* i32, daemon: why it closed (an rn_status) */
};

enum rnp_ring_state { RNP_RING_OPEN = 0, RNP_RING_CLOSED = 1 };

/* Slot fields: byte offsets from the slot's start. */
enum rnp_ring_slot_off {
    RNP_SLOT_O_SEQ = 0,                /* u64: the slot's seq, 1, 2, ... */
    RNP_SLOT_O_M = 8,                  /* u64 */
    RNP_SLOT_O_N = 16,                 /* u32 */
    RNP_SLOT_O_FLAGS = 20,             /* u32: RNP_SLOT_F_* */
    RNP_SLOT_O_EPS = 24,               /* f32 (IEEE bits) */
    RNP_SLOT_O_WOFF = 28,              /* f32: weight_offset */
    RNP_SLOT_O_TENSORS = 32,           /* 7 tensors x RNP_SLOT_TENSOR, order rnp_tensor_index */
    RNP_SLOT_O_RESERVED = 200,         /* 200 .. 255: zero */
    RNP_SLOT_O_STATUS = 256,           /* i32, daemon: 0 or an rn_status */
    RNP_SLOT_O_MSG = 260,              /* char[RNP_MAX_ERRMSG], daemon: NUL-terminated */
};

/* One tensor inside a slot: region u32, dtype u32, offset u64, stride u64. */
#define RNP_SLOT_TENSOR 24u
enum { RNP_SLOT_T_REGION = 0, RNP_SLOT_T_DTYPE = 4, RNP_SLOT_T_OFFSET = 8, RNP_SLOT_T_STRIDE = 16 };

/* Which optional tensors a slot carries. */
#define RNP_SLOT_F_W 1u
#define RNP_SLOT_F_RSTD 2u
#define RNP_SLOT_F_DRES 4u
#define RNP_SLOT_F_DW 8u
#define RNP_SLOT_F_ALL 15u

/*
 * Graph slots (PROTOCOL.md 13.8): a call captured into a CUDA graph cannot
 * take a seq (the values a graph writes and waits for are fixed at
 * capture), so it gets a slot of its own, outside the ring's order, in the
 * ring's region (GRAPH_OPEN).  Its descriptor (a ring slot's, with seq 0)
 * is written once, before GRAPH_OPEN, and the daemon copies it then; at
 * each replay the graph resets done, bumps gen, and waits for done.
 */
#define RNP_GRAPH_SLOT 1024u           /* bytes per graph slot */
#define RNP_GRAPH_MAX 1024u            /* graph slots open per ring, at most */
enum rnp_graph_off {
    /* 0 .. 255: the descriptor (rnp_ring_slot_off's layout, seq 0);
     * 256 .. 511: the result (status, error), as a ring slot's */
    RNP_GSLOT_O_GEN = 512,             /* u64, the client's stream: replays begun */
    RNP_GSLOT_O_DONE = 576,            /* u64, 0 (the replay's start) or 1 (answered) */
    RNP_GSLOT_O_CLOSED = 640,          /* u32, 1: the daemon stopped serving it */
    RNP_GSLOT_O_FAILS = 704,           /* u64, daemon: replays answered with an error */
};

/*
 * The daemon, at GRAPH_OPEN: a graph slot at offset in a region of
 * region_size bytes whose ring (slots slots) is at ring_off.  Returns 0, or
 * RN_MISALIGNED (not a multiple of RNP_RING_ALIGN), RN_OUT_OF_BOUNDS (past
 * the region) or RN_INVALID_ARGUMENT (it overlaps the ring), naming
 * graph_open.offset.
 */
int rnp_graph_check_offset(uint64_t offset, uint64_t region_size, uint64_t ring_off,
                           uint32_t slots, rnp_error *err);

/* Bytes of a ring of slots slots, header included. */
static inline uint64_t rnp_ring_bytes(uint32_t slots)
{
    return RNP_RING_HDR + (uint64_t)slots * RNP_RING_SLOT;
}

/* The byte offset of seq's slot from the ring's start (slots a power of two). */
static inline uint64_t rnp_ring_slot_off(uint64_t seq, uint32_t slots)
{
    return RNP_RING_HDR + ((seq - 1) & (uint64_t)(slots - 1)) * RNP_RING_SLOT;
}

/* Sequence arithmetic modulo 2^64: whether a word that reached `word` has
 * reached seq (true also when it went past it). */
static inline bool rnp_seq_reached(uint64_t word, uint64_t seq)
{
    return (int64_t)(word - seq) >= 0;
}

/* The daemon's bit of the ready word (PROTOCOL.md 13.3): set while it takes
 * a ring's armed calls back, so that their stream waits (ready >= seq,
 * modulo 2^64) pass; bit 62, not 63, because such a wait is cyclic.  The
 * client's progress is the word without it, and seqs stay below 2^62. */
#define RNP_RING_READY_RAISED (1ull << 62)

/* The seq the client's ready word says, the daemon's bit cleared. */
static inline uint64_t rnp_ring_ready_seq(uint64_t word)
{
    return word & ~RNP_RING_READY_RAISED;
}

/* Whether the client may publish seq with done at `done`: the slot it
 * reuses was answered (seq - done <= slots). */
static inline bool rnp_ring_can_publish(uint64_t seq, uint64_t done, uint32_t slots)
{
    return seq - done - 1 < (uint64_t)slots;
}

/* The header's words, for atomic access (__atomic builtins: the other side
 * is another process). */
static inline uint64_t *rnp_ring_u64(void *ring, unsigned off)
{
    return (uint64_t *)(void *)((char *)ring + off);
}
static inline uint32_t *rnp_ring_u32(void *ring, unsigned off)
{
    return (uint32_t *)(void *)((char *)ring + off);
}

/* The client: a fresh header for slots slots (every word zero but the
 * constants). */
void rnp_ring_init(void *ring, uint32_t slots);

/*
 * The daemon, at RING_OPEN: check a copy of the header's first line
 * (RNP_RING_LINE bytes) against the request's slot count.  Returns 0, or
 * RN_INVALID_ARGUMENT (magic, slot size, slots not a power of two or not
 * the header's), RN_BAD_VERSION or RN_TOO_LARGE (slots over
 * RNP_RING_MAX_SLOTS) with err naming the ring_open.* field.  The slot
 * count is checked first; line NULL is RN_INVALID_ARGUMENT after it.
 */
int rnp_ring_check_header(const uint8_t *line, uint32_t slots, rnp_error *err);

/* The client: b's shape, dtypes, scalars and tensors as the descriptor of
 * slot seq (RNP_RING_DESC bytes into out; reserved bytes zero).  Session,
 * ready slot, mode and ordering are not part of a slot. */
void rnp_ring_encode(const rnp_bwd_req *b, uint64_t seq, uint8_t *out);

/*
 * The daemon: decode a private copy of a slot's descriptor (RNP_RING_DESC
 * bytes) that should be slot seq.  Returns 0 and fills *out as the BWD
 * decoder would (ready_slot -1, mode and ordering 0; absent tensors zero),
 * or an rn_status with err naming the field with BWD's names
 * ("bwd.x.dtype"): RN_INVALID_ARGUMENT for a seq that is not seq, flags or
 * a dtype out of range, fields of an absent tensor set, a negative or
 * non-finite eps, a non-finite weight_offset, reserved bytes set;
 * RN_UNKNOWN_FIELD for a field the tensor's kind has not (a stride of w,
 * rstd or dw, a dtype of rstd).  The result is for rnp_validate_bwd.
 */
int rnp_ring_decode(const uint8_t *desc, uint64_t seq, rnp_bwd_req *out, rnp_error *err);

/* The daemon: write a slot's result (status, message; msg NULL or "" for
 * none) into the result area of the slot at slot. */
void rnp_ring_put_result(uint8_t *slot, int status, const char *msg);

/* The client: read a slot's result; the message (always NUL-terminated,
 * non-printable bytes as '?') into msg of len bytes.  Returns the status. */
int rnp_ring_get_result(const uint8_t *slot, char *msg, size_t len);

#endif /* RN_RING_H */
