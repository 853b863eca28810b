/* SPDX-License-Identifier: MIT */
/*
 * digest.c - a 64-bit digest of a decoded BWD request, so that the daemon
 * can tell a re-sent copy of a request (same session and seq, same work)
 * from another request that reuses the seq (RN_SEQ_REUSED).  Pure.
 *
 * The digest is FNV-1a over the fields one by one, each as a fixed number of
 * little-endian bytes, never over the struct's memory: padding and the
 * bytes of absent tensors would make equal requests differ.
 */
#include <string.h>

#include "rn_proto.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t mix(uint64_t h, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        h ^= (uint8_t)(v >> (8 * i));
        h *= FNV_PRIME;
    }
    return h;
}

/* The float's bits, with -0.0 as 0.0: both give the same results (eps is
 * added to a mean of squares, weight_offset to the weight). */
static uint64_t mix_float(uint64_t h, float f)
{
    uint32_t bits = 0;
    if (f != 0.0f)
        memcpy(&bits, &f, sizeof bits);
    return mix(h, bits, 4);
}

uint64_t rnp_bwd_digest(const rnp_bwd_req *b)
{
    uint64_t h = FNV_OFFSET;
    if (!b)
        return 0;
    for (int i = 0; i < RNP_SESSION_BYTES; i++)
        h = mix(h, b->session.b[i], 1);
    h = mix(h, b->seq, 8);
    h = mix(h, b->m, 8);
    h = mix(h, b->n, 4);
    for (int t = 0; t < RNP_T_COUNT; t++) {
        const rnp_tensor *x = rnp_bwd_tensor(b, t);
        static const int dims[RNP_T_COUNT] = { 2, 2, 2, 1, 1, 2, 1 };
        uint8_t dtype = 0;
        switch (t) {
        case RNP_T_X: dtype = b->x_dtype; break;
        case RNP_T_DY: dtype = b->dy_dtype; break;
        case RNP_T_DX: dtype = b->dx_dtype; break;
        case RNP_T_W: dtype = b->w_dtype; break;
        case RNP_T_DRES: dtype = b->dres_dtype; break;
        case RNP_T_DW: dtype = b->dw_dtype; break;
        default: break; /* rstd: always float32, no dtype on the wire */
        }
        /* Presence first, so that an absent tensor and a present one of
         * zeros differ; an absent one contributes nothing else. */
        h = mix(h, x != NULL, 1);
        if (!x)
            continue;
        h = mix(h, x->region.id, 4);
        h = mix(h, x->offset, 8);
        h = mix(h, dtype, 1);
        h = mix(h, dims[t] == 2 ? x->stride : 0, 8);
    }
    h = mix_float(h, b->eps);
    h = mix_float(h, b->weight_offset);
    h = mix(h, (uint32_t)b->ready_slot, 4);
    h = mix(h, b->mode, 4);
    h = mix(h, b->ordering, 4);
    return h;
}
