/* SPDX-License-Identifier: MIT */
/*
 * rnp_mp.h - a small, allocation-free msgpack reader used by the decoder.
 * Internal to proto/.
 *
 * Why not msgpack_unpack: msgpack-c sizes its array, map, str and bin storage
 * from the header count before it reads a single element, so five bytes of
 * untrusted input can make it ask for tens of gigabytes.  The decoder instead
 * checks the whole message with rnp_mp_scan (every count against the bytes
 * left, the nesting depth, exactly one object, no trailing bytes) and then
 * reads typed values in place through a cursor.  Nothing is ever allocated.
 * Every read is bounds-checked as well, so the reader is also safe on bytes
 * that were never scanned (the lenient header peek relies on that).
 */
#ifndef RNP_MP_H
#define RNP_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rn_proto.h"

/* The msgpack families a value can belong to. */
typedef enum rnp_mp_kind {
    RNP_MP_BAD = 0,   /* truncated, or the reserved byte 0xc1 */
    RNP_MP_NIL,
    RNP_MP_BOOL,
    RNP_MP_UINT,      /* a non-negative integer, whatever its encoding */
    RNP_MP_NINT,      /* a negative integer */
    RNP_MP_FLOAT,     /* float 32 or float 64 */
    RNP_MP_STR,
    RNP_MP_BIN,
    RNP_MP_ARRAY,
    RNP_MP_MAP,
    RNP_MP_EXT,
} rnp_mp_kind;

typedef struct rnp_mp {
    const uint8_t *start, *p, *end;
} rnp_mp;

void rnp_mp_init(rnp_mp *r, const void *buf, size_t len);

/* Structure check of a whole message; see above.  Returns 0 or an rn_status
 * (RN_MALFORMED, RN_TOO_DEEP, RN_TRAILING_BYTES) with err set. */
int rnp_mp_scan(const void *buf, size_t len, int max_depth, rnp_error *err);

/* The kind of the next value (does not consume it). */
rnp_mp_kind rnp_mp_peek(const rnp_mp *r);
const char *rnp_mp_kind_name(rnp_mp_kind k);

/* Each reader consumes one value of its kind and returns true, or returns
 * false and consumes nothing when the next value is of another kind. */
bool rnp_mp_read_uint(rnp_mp *r, uint64_t *v);
bool rnp_mp_read_int(rnp_mp *r, int64_t *v);        /* any integer within int64 */
bool rnp_mp_read_float(rnp_mp *r, double *v);       /* float 32 or 64 */
bool rnp_mp_read_bool(rnp_mp *r, bool *v);
bool rnp_mp_read_str(rnp_mp *r, const uint8_t **s, uint32_t *len);
bool rnp_mp_read_bin(rnp_mp *r, const uint8_t **s, uint32_t *len);
bool rnp_mp_read_array(rnp_mp *r, uint32_t *count);
bool rnp_mp_read_map(rnp_mp *r, uint32_t *count);

/* Skip one value, containers included (iteratively, so depth costs no
 * stack).  Returns false on truncation. */
bool rnp_mp_skip(rnp_mp *r);

#endif
