/* SPDX-License-Identifier: MIT */
/*
 * rnp_dec.h - the decoder's field walker (decode_walk.c), shared by the
 * request decoder (decode_req.c) and the reply decoder (decode_rep.c).
 * Internal to proto/.
 *
 * A decoder reads a message through an rnp_dctx: typed values that name
 * their field in every error ("bwd.dres.offset: expected unsigned integer,
 * got string"), and maps of known fields, read by rnp_dec_map with one
 * callback per message kind.  Every function returns 0 or an rn_status with
 * the context's error set.
 */
#ifndef RNP_DEC_H
#define RNP_DEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rn_proto.h"
#include "rnp_mp.h"

/* Field paths in messages are short ("bwd.dres.offset"); longer ones are cut. */
#define RNP_PATH_MAX 80

typedef struct rnp_dctx {
    rnp_mp r;
    rnp_error *err;
    bool strict;      /* unknown keys are errors (requests) or skipped (replies) */
} rnp_dctx;

/* Starts decoding a whole message: the size limit and rnp_mp_scan's
 * structure check, then a reader at its first byte. */
int rnp_dec_begin(rnp_dctx *d, const void *buf, size_t len, bool strict, rnp_error *err);

/* err = "path: fmt...". */
int rnp_dec_fail(rnp_dctx *d, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* dst (RNP_PATH_MAX bytes) = path "." key, or key alone when path is "". */
void rnp_dec_join(char *dst, const char *path, const char *key);

/* dst = s[0..len) with every byte outside printable ASCII as '?', cut with
 * "..." to fit cap (at least 5): for names from the wire in messages. */
void rnp_dec_printable(char *dst, size_t cap, const uint8_t *s, uint32_t len);

/* RN_BAD_TYPE naming the kind found instead of want. */
int rnp_dec_wrong_type(rnp_dctx *d, const char *path, const char *want);

/* Typed values: each reads one value, or fails with RN_BAD_TYPE for another
 * kind or a number out of range. */
int rnp_dec_uint(rnp_dctx *d, const char *path, uint64_t max, uint64_t *v);
int rnp_dec_u32(rnp_dctx *d, const char *path, uint32_t *v);
int rnp_dec_u64(rnp_dctx *d, const char *path, uint64_t *v);
int rnp_dec_i32(rnp_dctx *d, const char *path, int32_t *v);
int rnp_dec_bool(rnp_dctx *d, const char *path, bool *v);
/* float 32 or 64, finite once narrowed to float (else RN_INVALID_ARGUMENT). */
int rnp_dec_f32(rnp_dctx *d, const char *path, float *v);
/* A string of at most cap-1 bytes without NUL (RN_TOO_BIG, RN_INVALID_ARGUMENT),
 * copied NUL-terminated; nonempty: the empty string is RN_INVALID_ARGUMENT. */
int rnp_dec_str(rnp_dctx *d, const char *path, char *dst, size_t cap, bool nonempty);
/* A bin of exactly size bytes (longer: RN_TOO_BIG, shorter: RN_BAD_TYPE). */
int rnp_dec_bin(rnp_dctx *d, const char *path, uint8_t *dst, size_t size);
int rnp_dec_session(rnp_dctx *d, const char *path, rnp_session *s);
/* An array of 1..RNP_MAX_EVENTS IPC handles; *n is set on success. */
int rnp_dec_handles(rnp_dctx *d, const char *path, uint32_t *n, uint8_t (*h)[RNP_IPC_HANDLE_BYTES]);
/* Skips the next value, keeping where it starts in *at (a body read later). */
int rnp_dec_capture(rnp_dctx *d, const char *path, rnp_mp *at);

/* The body of an envelope, captured at body (NULL: the message has none):
 * dec reads it into msg.  A missing body is RN_MISSING_FIELD for an op that
 * has one (rnp_op_has_body). */
int rnp_dec_body(rnp_dctx *d, const rnp_mp *body, uint32_t op, bool request,
                 int (*dec)(rnp_dctx *d, void *msg), void *msg);

/*
 * Maps whose keys are a table of at most 32 known names.  rnp_dec_map_next
 * reads the next key and sets *idx to the index of a known field (or -1 at
 * the end of the map); an unknown key is RN_UNKNOWN_FIELD in a strict
 * context (RN_DUPLICATE_FIELD when the same key appears again later in the
 * map) and skipped otherwise; a known key seen twice is RN_DUPLICATE_FIELD.
 * Seen fields are bits in it->seen.
 */
typedef struct rnp_mapit {
    const char *path;
    const char *const *names;
    int nnames;
    uint32_t left;
    uint32_t seen;
} rnp_mapit;

int rnp_dec_map_open(rnp_dctx *d, rnp_mapit *it, const char *path, const char *const *names,
                     int nnames);
int rnp_dec_map_next(rnp_dctx *d, rnp_mapit *it, int *idx);
/* RN_MISSING_FIELD naming the first field of req (bits into names) not in seen. */
int rnp_dec_require(rnp_dctx *d, const char *path, const char *const *names, uint32_t seen,
                    uint32_t req);

/* Reads the value of known field idx of obj; path is "parent.name". */
typedef int (*rnp_dec_field_fn)(rnp_dctx *d, void *obj, int idx, const char *path);

/* A whole map of known fields: field() for each, then every field of
 * required must have been seen.  *seen (if not NULL) gets the seen bits. */
int rnp_dec_map(rnp_dctx *d, const char *path, const char *const *names, int nnames,
                uint32_t required, rnp_dec_field_fn field, void *obj, uint32_t *seen);

/* A map that must have no known fields (the body of an op without one). */
int rnp_dec_empty(rnp_dctx *d, const char *path);

/*
 * Lenient look at a message that failed to decode: the top-level "op" and
 * "id" if they can be read as unsigned integers (else 0), so that an error
 * reply can be addressed.  Works on unscanned bytes.
 */
void rnp_dec_peek_header(const void *buf, size_t len, uint32_t *op, uint64_t *id);

#define RNP_BIT(i) (1u << (i))

#endif /* RNP_DEC_H */
