/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the fast path's slots (rn_ring.h, PROTOCOL.md section 13): the
 * header's check, a slot's encode and decode, its result.  Pure: bytes in,
 * struct or error out, little-endian field by field.
 */
#include "rn_ring.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const tnames[RNP_T_COUNT] = { "x", "dy", "dx", "w", "rstd", "dres", "dw" };

/* Which tensors are 2-D (a stride), which have a dtype. */
static bool two_d(int t)
{
    return t == RNP_T_X || t == RNP_T_DY || t == RNP_T_DX || t == RNP_T_DRES;
}

static bool typed(int t)
{
    return t != RNP_T_RSTD;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void rnp_ring_init(void *ring, uint32_t slots)
{
    uint8_t *p = ring;
    memset(p, 0, RNP_RING_HDR);
    rnp_le32_put(p + RNP_RING_O_MAGIC, RNP_RING_MAGIC);
    rnp_le32_put(p + RNP_RING_O_VERSION, RNP_RING_VERSION);
    rnp_le32_put(p + RNP_RING_O_SLOTS, slots);
    rnp_le32_put(p + RNP_RING_O_SLOT_SIZE, RNP_RING_SLOT);
}

int rnp_ring_check_header(const uint8_t *line, uint32_t slots, rnp_error *err)
{
    uint32_t magic, version, hslots, ssize;

    if (slots == 0 || (slots & (slots - 1)) != 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "ring_open.slots: %u is not a power of two",
                        slots);
    if (slots > RNP_RING_MAX_SLOTS)
        return rnp_fail(err, RN_TOO_LARGE, "ring_open.slots: %u exceeds the limit %u", slots,
                        RNP_RING_MAX_SLOTS);
    if (!line)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "ring_open: no header");
    magic = rnp_le32_get(line + RNP_RING_O_MAGIC);
    version = rnp_le32_get(line + RNP_RING_O_VERSION);
    hslots = rnp_le32_get(line + RNP_RING_O_SLOTS);
    ssize = rnp_le32_get(line + RNP_RING_O_SLOT_SIZE);
    if (magic != RNP_RING_MAGIC)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.magic: 0x%08x is not a ring header (0x%08x)", magic,
                        RNP_RING_MAGIC);
    if (version != RNP_RING_VERSION)
        return rnp_fail(err, RN_BAD_VERSION,
                        "ring_open.version: ring version %u is not supported (supported: %u)",
                        version, RNP_RING_VERSION);
    if (ssize != RNP_RING_SLOT)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "ring_open.slot_size: %u, expected %u", ssize,
                        RNP_RING_SLOT);
    if (hslots != slots)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "ring_open.slots: %u, but the ring's header says %u", slots, hslots);
    return 0;
}

static void put_tensor(uint8_t *p, const rnp_tensor *t, uint8_t dtype)
{
    rnp_le32_put(p + RNP_SLOT_T_REGION, t->region.id);
    rnp_le32_put(p + RNP_SLOT_T_DTYPE, dtype);
    rnp_le64_put(p + RNP_SLOT_T_OFFSET, t->offset);
    rnp_le64_put(p + RNP_SLOT_T_STRIDE, t->stride);
}

void rnp_ring_encode(const rnp_bwd_req *b, uint64_t seq, uint8_t *out)
{
    uint32_t flags = (b->has_w ? RNP_SLOT_F_W : 0) | (b->has_rstd ? RNP_SLOT_F_RSTD : 0) |
                     (b->has_dres ? RNP_SLOT_F_DRES : 0) | (b->has_dw ? RNP_SLOT_F_DW : 0);
    const uint8_t dt[RNP_T_COUNT] = { b->x_dtype, b->dy_dtype, b->dx_dtype, b->w_dtype, 0,
                                      b->dres_dtype, b->dw_dtype };

    memset(out, 0, RNP_RING_DESC);
    rnp_le64_put(out + RNP_SLOT_O_SEQ, seq);
    rnp_le64_put(out + RNP_SLOT_O_M, b->m);
    rnp_le32_put(out + RNP_SLOT_O_N, b->n);
    rnp_le32_put(out + RNP_SLOT_O_FLAGS, flags);
    rnp_le32_put(out + RNP_SLOT_O_EPS, f32_bits(b->eps));
    rnp_le32_put(out + RNP_SLOT_O_WOFF, f32_bits(b->weight_offset));
    for (int t = 0; t < RNP_T_COUNT; t++) {
        const rnp_tensor *tn = rnp_bwd_tensor(b, t);
        if (!tn)
            continue;
        rnp_tensor c = *tn;
        if (!two_d(t))
            c.stride = 0;
        put_tensor(out + RNP_SLOT_O_TENSORS + (size_t)t * RNP_SLOT_TENSOR, &c, dt[t]);
    }
}

/* A tensor's fields into b (present) or checked to be zero (absent). */
static int get_tensor(const uint8_t *p, int t, bool present, rnp_bwd_req *b, rnp_error *err)
{
    uint32_t region = rnp_le32_get(p + RNP_SLOT_T_REGION);
    uint32_t dtype = rnp_le32_get(p + RNP_SLOT_T_DTYPE);
    uint64_t offset = rnp_le64_get(p + RNP_SLOT_T_OFFSET);
    uint64_t stride = rnp_le64_get(p + RNP_SLOT_T_STRIDE);
    rnp_tensor *tn;
    uint8_t *dt[RNP_T_COUNT] = { &b->x_dtype, &b->dy_dtype, &b->dx_dtype, &b->w_dtype, NULL,
                                 &b->dres_dtype, &b->dw_dtype };

    if (!present) {
        if (region || dtype || offset || stride)
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "bwd.%s: absent (its flag is clear) but its fields are set", tnames[t]);
        return 0;
    }
    if (!typed(t) && dtype)
        return rnp_fail(err, RN_UNKNOWN_FIELD, "bwd.%s.dtype: rstd has no dtype (always float32)",
                        tnames[t]);
    if (!two_d(t) && stride)
        return rnp_fail(err, RN_UNKNOWN_FIELD, "bwd.%s.stride: a 1-D tensor has no stride",
                        tnames[t]);
    if (dtype > RN_DTYPE_BF16)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.%s.dtype: %u is not a dtype (0..3)",
                        tnames[t], dtype);
    /* rnp_bwd_tensor gives NULL for an absent optional tensor: mark it
     * present first. */
    switch (t) {
    case RNP_T_W: b->has_w = true; break;
    case RNP_T_RSTD: b->has_rstd = true; break;
    case RNP_T_DRES: b->has_dres = true; break;
    case RNP_T_DW: b->has_dw = true; break;
    }
    tn = (rnp_tensor *)rnp_bwd_tensor(b, t);
    tn->region.id = region;
    tn->offset = offset;
    tn->stride = stride;
    if (dt[t])
        *dt[t] = (uint8_t)dtype;
    return 0;
}

int rnp_ring_decode(const uint8_t *desc, uint64_t seq, rnp_bwd_req *out, rnp_error *err)
{
    rnp_bwd_req b;
    uint64_t got = rnp_le64_get(desc + RNP_SLOT_O_SEQ);
    uint32_t flags = rnp_le32_get(desc + RNP_SLOT_O_FLAGS);
    int rc;

    memset(&b, 0, sizeof b);
    b.ready_slot = -1;
    if (got != seq)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.seq: %llu in the slot of seq %llu",
                        (unsigned long long)got, (unsigned long long)seq);
    b.seq = seq;
    b.m = rnp_le64_get(desc + RNP_SLOT_O_M);
    b.n = rnp_le32_get(desc + RNP_SLOT_O_N);
    if (flags & ~RNP_SLOT_F_ALL)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.flags: unknown bits 0x%x",
                        flags & ~RNP_SLOT_F_ALL);
    b.eps = bits_f32(rnp_le32_get(desc + RNP_SLOT_O_EPS));
    b.weight_offset = bits_f32(rnp_le32_get(desc + RNP_SLOT_O_WOFF));
    if (!isfinite(b.eps))
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.eps: must be finite");
    if (b.eps < 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.eps: must not be negative");
    if (!isfinite(b.weight_offset))
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.weight_offset: must be finite");
    if (b.weight_offset == 0)
        b.weight_offset = 0; /* -0.0 as 0.0, as the BWD digest takes it */
    for (int t = 0; t < RNP_T_COUNT; t++) {
        bool present = t <= RNP_T_DX || (t == RNP_T_W && (flags & RNP_SLOT_F_W)) ||
                       (t == RNP_T_RSTD && (flags & RNP_SLOT_F_RSTD)) ||
                       (t == RNP_T_DRES && (flags & RNP_SLOT_F_DRES)) ||
                       (t == RNP_T_DW && (flags & RNP_SLOT_F_DW));
        if ((rc = get_tensor(desc + RNP_SLOT_O_TENSORS + (size_t)t * RNP_SLOT_TENSOR, t, present,
                             &b, err)) != 0)
            return rc;
    }
    for (unsigned i = RNP_SLOT_O_RESERVED; i < RNP_RING_DESC; i++)
        if (desc[i])
            return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.reserved: byte %u of the slot is not 0",
                            i);
    if (out)
        *out = b;
    return 0;
}

void rnp_ring_put_result(uint8_t *slot, int status, const char *msg)
{
    size_t n = msg ? strnlen(msg, RNP_MAX_ERRMSG - 1) : 0;
    rnp_le32_put(slot + RNP_SLOT_O_STATUS, (uint32_t)status);
    if (n)
        memcpy(slot + RNP_SLOT_O_MSG, msg, n);
    slot[RNP_SLOT_O_MSG + n] = '\0';
}

int rnp_ring_get_result(const uint8_t *slot, char *msg, size_t len)
{
    int status = (int)rnp_le32_get(slot + RNP_SLOT_O_STATUS);
    size_t i = 0;

    if (msg && len) {
        for (; i + 1 < len && i < RNP_MAX_ERRMSG - 1; i++) {
            uint8_t c = slot[RNP_SLOT_O_MSG + i];
            if (!c)
                break;
            msg[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
        }
        msg[i] = '\0';
    }
    return status;
}

int rnp_graph_check_offset(uint64_t offset, uint64_t region_size, uint64_t ring_off,
                           uint32_t slots, rnp_error *err)
{
    uint64_t end, ring_end = ring_off + rnp_ring_bytes(slots);

    if (offset % RNP_RING_ALIGN)
        return rnp_fail(err, RN_MISALIGNED, "graph_open.offset: %llu is not a multiple of %u",
                        (unsigned long long)offset, RNP_RING_ALIGN);
    if (__builtin_add_overflow(offset, (uint64_t)RNP_GRAPH_SLOT, &end) || end > region_size)
        return rnp_fail(err, RN_OUT_OF_BOUNDS,
                        "graph_open.offset: a graph slot of %u bytes at %llu exceeds the ring's "
                        "region of %llu bytes", RNP_GRAPH_SLOT, (unsigned long long)offset,
                        (unsigned long long)region_size);
    if (offset < ring_end && ring_off < end)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "graph_open.offset: %llu overlaps the ring (bytes %llu .. %llu)",
                        (unsigned long long)offset, (unsigned long long)ring_off,
                        (unsigned long long)ring_end - 1);
    return 0;
}
