/* SPDX-License-Identifier: MIT */
/*
 * proto_samples.h - helpers of the proto unit tests (proto_samples.c): the
 * sample messages, encode/decode wrappers, packing of msgpack-c trees.
 * Include after rn_test.h.
 */
#ifndef PROTO_SAMPLES_H
#define PROTO_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "rn_proto.h"
#include "rn_test.h"

#define TP_NREQ 14  /* sample requests, 0 .. TP_NREQ - 1 */
#define TP_NREP 17  /* sample replies */

/* Set a tensor's fields, leaving its padding as it was (zeroed in samples). */
void tp_set_tensor(rnp_tensor *t, uint32_t region, uint64_t offset, uint64_t stride);

/* Fill *q (*p) with sample i and return its name ("bwd-full"), or NULL past
 * the last. */
const char *tp_make_request(int i, rnp_request *q);
const char *tp_make_reply(int i, rnp_reply *p);

/* Encode into buf; fail the test on an error.  Return the length. */
size_t tp_enc_req(const rnp_request *q, uint8_t *buf, size_t cap);
size_t tp_enc_rep(const rnp_reply *p, uint8_t *buf, size_t cap);

/* Decode as a request (reply == false) or a reply; return the code, checking
 * that a failure comes with a message naming something ("x: ..."). */
int tp_dec(bool reply, const void *buf, size_t len, void *out, rnp_error *err);

/* Decode and fail the test unless the code is want; what names the case. */
void tp_expect_code(bool reply, const void *buf, size_t len, int want, const char *what);

/* Pack a msgpack-c tree into out (cap bytes); return the length. */
size_t tp_pack_obj(const msgpack_object *o, uint8_t *out, size_t cap);

#endif
