/* SPDX-License-Identifier: MIT */
/*
 * mpread.c - the allocation-free msgpack reader of rnp_mp.h.  Format
 * reference: the msgpack specification (formats by first byte).
 */
#include <string.h>

#include "rnp_mp.h"

/* One decoded header.  For str, bin and ext, n is the payload length and the
 * payload is known to be inside the buffer; for arrays and maps n is the
 * element (pair) count, which only rnp_mp_scan checks against the bytes left. */
typedef struct tok {
    rnp_mp_kind kind;
    size_t hlen;        /* header bytes (ext: including the type byte) */
    uint64_t n;
    uint64_t u;         /* UINT value, BOOL value */
    int64_t i;          /* NINT value */
    double f;
} tok;

static uint64_t be(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++)
        v = v << 8 | p[k];
    return v;
}

/* Reads the header at p; returns false if it is truncated, if a str/bin/ext
 * payload runs past end, or for the reserved byte 0xc1. */
static bool tok_read(const uint8_t *p, const uint8_t *end, tok *t)
{
    size_t left = (size_t)(end - p);
    if (left == 0)
        return false;
    uint8_t b = p[0];
    memset(t, 0, sizeof *t);
    t->hlen = 1;
    int lenbytes = 0; /* size of the big-endian field after the first byte */

    if (b <= 0x7f) {
        t->kind = RNP_MP_UINT, t->u = b;
        return true;
    }
    if (b >= 0xe0) {
        t->kind = RNP_MP_NINT, t->i = (int8_t)b;
        return true;
    }
    if (b >= 0x80 && b <= 0x8f) {
        t->kind = RNP_MP_MAP, t->n = b & 0x0f;
        return true;
    }
    if (b >= 0x90 && b <= 0x9f) {
        t->kind = RNP_MP_ARRAY, t->n = b & 0x0f;
        return true;
    }
    if (b >= 0xa0 && b <= 0xbf) {
        t->kind = RNP_MP_STR, t->n = b & 0x1f;
        goto payload;
    }
    switch (b) {
    case 0xc0: t->kind = RNP_MP_NIL; return true;
    case 0xc2: t->kind = RNP_MP_BOOL, t->u = 0; return true;
    case 0xc3: t->kind = RNP_MP_BOOL, t->u = 1; return true;
    case 0xc4: t->kind = RNP_MP_BIN, lenbytes = 1; break;
    case 0xc5: t->kind = RNP_MP_BIN, lenbytes = 2; break;
    case 0xc6: t->kind = RNP_MP_BIN, lenbytes = 4; break;
    case 0xc7: t->kind = RNP_MP_EXT, lenbytes = 1; break;
    case 0xc8: t->kind = RNP_MP_EXT, lenbytes = 2; break;
    case 0xc9: t->kind = RNP_MP_EXT, lenbytes = 4; break;
    case 0xca:
    case 0xcb: {
        int w = b == 0xca ? 4 : 8;
        if (left < 1 + (size_t)w)
            return false;
        uint64_t bits = be(p + 1, w);
        t->kind = RNP_MP_FLOAT, t->hlen = 1 + w;
        if (w == 4) {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, 4);
            t->f = f;
        } else {
            memcpy(&t->f, &bits, 8);
        }
        return true;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int w = 1 << (b - 0xcc);
        if (left < 1 + (size_t)w)
            return false;
        t->kind = RNP_MP_UINT, t->u = be(p + 1, w), t->hlen = 1 + w;
        return true;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = 1 << (b - 0xd0);
        if (left < 1 + (size_t)w)
            return false;
        uint64_t raw = be(p + 1, w);
        int64_t v;
        /* Sign-extend from w bytes. */
        if (w == 8) {
            memcpy(&v, &raw, 8);
        } else {
            uint64_t sign = 1ull << (8 * w - 1);
            v = (int64_t)(raw ^ sign) - (int64_t)sign;
        }
        t->hlen = 1 + w;
        if (v >= 0)
            t->kind = RNP_MP_UINT, t->u = (uint64_t)v;
        else
            t->kind = RNP_MP_NINT, t->i = v;
        return true;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        t->kind = RNP_MP_EXT, t->n = 1u << (b - 0xd4), t->hlen = 2;
        goto payload;
    case 0xd9: t->kind = RNP_MP_STR, lenbytes = 1; break;
    case 0xda: t->kind = RNP_MP_STR, lenbytes = 2; break;
    case 0xdb: t->kind = RNP_MP_STR, lenbytes = 4; break;
    case 0xdc: case 0xdd: case 0xde: case 0xdf: {
        int w = (b == 0xdc || b == 0xde) ? 2 : 4;
        if (left < 1 + (size_t)w)
            return false;
        t->kind = b <= 0xdd ? RNP_MP_ARRAY : RNP_MP_MAP;
        t->n = be(p + 1, w), t->hlen = 1 + w;
        return true;
    }
    default: /* 0xc1, never used */
        return false;
    }
    /* bin, ext, str 8/16/32: a big-endian length, then (ext) a type byte. */
    if (left < 1 + (size_t)lenbytes)
        return false;
    t->n = be(p + 1, lenbytes);
    t->hlen = 1 + lenbytes + (t->kind == RNP_MP_EXT ? 1 : 0);
payload:
    if (t->hlen > left || t->n > left - t->hlen)
        return false;
    return true;
}

/* Bytes a value's header and inline payload occupy (containers: header only). */
static size_t tok_size(const tok *t)
{
    if (t->kind == RNP_MP_STR || t->kind == RNP_MP_BIN || t->kind == RNP_MP_EXT)
        return t->hlen + (size_t)t->n;
    return t->hlen;
}

void rnp_mp_init(rnp_mp *r, const void *buf, size_t len)
{
    r->start = r->p = buf;
    r->end = r->p + len;
}

int rnp_mp_scan(const void *buf, size_t len, int max_depth, rnp_error *err)
{
    enum { CAP = 16 };
    uint64_t rem[CAP + 1];
    const uint8_t *p = buf, *end = p + len;
    int lv = 0;

    if (max_depth > CAP)
        max_depth = CAP;
    if (len == 0)
        return rnp_fail(err, RN_MALFORMED, "message: empty");
    rem[0] = 1; /* the one top-level object */
    while (lv >= 0) {
        if (rem[lv] == 0) {
            lv--;
            continue;
        }
        tok t;
        size_t off = (size_t)(p - (const uint8_t *)buf);
        if (!tok_read(p, end, &t)) {
            if (p < end && *p == 0xc1)
                return rnp_fail(err, RN_MALFORMED, "message: reserved byte 0xc1 at byte %zu", off);
            return rnp_fail(err, RN_MALFORMED, "message: truncated value at byte %zu", off);
        }
        p += tok_size(&t);
        rem[lv]--;
        if (t.kind == RNP_MP_ARRAY || t.kind == RNP_MP_MAP) {
            uint64_t items = t.kind == RNP_MP_MAP ? 2 * t.n : t.n;
            if (lv + 1 > max_depth)
                return rnp_fail(err, RN_TOO_DEEP, "message: nesting deeper than %d at byte %zu",
                                max_depth, off);
            /* Every element takes at least one byte: a count larger than the
             * bytes left is a lie, whatever the decoder would do with it. */
            if (items > (uint64_t)(end - p))
                return rnp_fail(err, RN_MALFORMED,
                                "message: %s at byte %zu claims %llu elements but %zu bytes follow",
                                t.kind == RNP_MP_MAP ? "map" : "array", off,
                                (unsigned long long)items, (size_t)(end - p));
            rem[++lv] = items;
        }
    }
    if (p != end)
        return rnp_fail(err, RN_TRAILING_BYTES, "message: %zu bytes after the end of the message",
                        (size_t)(end - p));
    return 0;
}

rnp_mp_kind rnp_mp_peek(const rnp_mp *r)
{
    tok t;
    return tok_read(r->p, r->end, &t) ? t.kind : RNP_MP_BAD;
}

const char *rnp_mp_kind_name(rnp_mp_kind k)
{
    switch (k) {
    case RNP_MP_BAD: return "truncated value";
    case RNP_MP_NIL: return "nil";
    case RNP_MP_BOOL: return "boolean";
    case RNP_MP_UINT: return "unsigned integer";
    case RNP_MP_NINT: return "negative integer";
    case RNP_MP_FLOAT: return "float";
    case RNP_MP_STR: return "string";
    case RNP_MP_BIN: return "binary";
    case RNP_MP_ARRAY: return "array";
    case RNP_MP_MAP: return "map";
    case RNP_MP_EXT: return "extension";
    }
    return "?";
}

/* Reads one token of kind k, or nothing. */
static bool take(rnp_mp *r, rnp_mp_kind k, tok *t)
{
    if (!tok_read(r->p, r->end, t) || t->kind != k)
        return false;
    r->p += tok_size(t);
    return true;
}

bool rnp_mp_read_uint(rnp_mp *r, uint64_t *v)
{
    tok t;
    if (!take(r, RNP_MP_UINT, &t))
        return false;
    *v = t.u;
    return true;
}

bool rnp_mp_read_int(rnp_mp *r, int64_t *v)
{
    tok t;
    if (!tok_read(r->p, r->end, &t))
        return false;
    if (t.kind == RNP_MP_NINT)
        *v = t.i;
    else if (t.kind == RNP_MP_UINT && t.u <= INT64_MAX)
        *v = (int64_t)t.u;
    else
        return false;
    r->p += tok_size(&t);
    return true;
}

bool rnp_mp_read_float(rnp_mp *r, double *v)
{
    tok t;
    if (!take(r, RNP_MP_FLOAT, &t))
        return false;
    *v = t.f;
    return true;
}

bool rnp_mp_read_bool(rnp_mp *r, bool *v)
{
    tok t;
    if (!take(r, RNP_MP_BOOL, &t))
        return false;
    *v = t.u != 0;
    return true;
}

/* A str or bin (kind k): its payload stays in place. */
static bool take_payload(rnp_mp *r, rnp_mp_kind k, const uint8_t **s, uint32_t *len)
{
    tok t;
    const uint8_t *at = r->p;
    if (!take(r, k, &t))
        return false;
    *s = at + t.hlen;
    *len = (uint32_t)t.n;
    return true;
}

/* An array or map header (kind k): the element or pair count. */
static bool take_count(rnp_mp *r, rnp_mp_kind k, uint32_t *count)
{
    tok t;
    if (!take(r, k, &t))
        return false;
    *count = (uint32_t)t.n;
    return true;
}

bool rnp_mp_read_str(rnp_mp *r, const uint8_t **s, uint32_t *len)
{
    return take_payload(r, RNP_MP_STR, s, len);
}

bool rnp_mp_read_bin(rnp_mp *r, const uint8_t **s, uint32_t *len)
{
    return take_payload(r, RNP_MP_BIN, s, len);
}

bool rnp_mp_read_array(rnp_mp *r, uint32_t *count)
{
    return take_count(r, RNP_MP_ARRAY, count);
}

bool rnp_mp_read_map(rnp_mp *r, uint32_t *count)
{
    return take_count(r, RNP_MP_MAP, count);
}

bool rnp_mp_skip(rnp_mp *r)
{
    uint64_t pending = 1;
    const uint8_t *p = r->p;
    while (pending > 0) {
        tok t;
        if (!tok_read(p, r->end, &t))
            return false;
        p += tok_size(&t);
        pending--;
        if (t.kind == RNP_MP_ARRAY || t.kind == RNP_MP_MAP) {
            uint64_t items = t.kind == RNP_MP_MAP ? 2 * t.n : t.n;
            /* Same bound as the scan: it also keeps pending from growing
             * past the buffer's size. */
            if (items > (uint64_t)(r->end - p))
                return false;
            pending += items;
        }
        if (pending > (uint64_t)(r->end - p))
            return false;
    }
    r->p = p;
    return true;
}
