/* SPDX-License-Identifier: MIT */
/*
 * rnk_conv.h - bf16 / fp16 <-> float conversions (round to nearest even,
 * NaN kept a NaN, subnormals exact) and whole-row load/store, shared by
 * rnk_load/rnk_store and the CPU twin's row loops.  Inline so that a row
 * loop switches on the dtype once, not per element: the results are the
 * same bits as element by element.  Internal to kernels/.
 */
#ifndef RNK_CONV_H
#define RNK_CONV_H

#include <stdint.h>
#include <string.h>

#include "rnk.h"

static inline uint32_t rnk_f2u_(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float rnk_u2f_(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t rnk_f32_to_bf16(float f)
{
    uint32_t u = rnk_f2u_(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    /* Round to nearest, ties to even; a carry into the exponent is correct,
     * up to and including overflow to infinity. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float rnk_bf16_to_f32(uint16_t h)
{
    return rnk_u2f_((uint32_t)h << 16);
}

static inline uint16_t rnk_f32_to_f16(float f)
{
    uint32_t x = rnk_f2u_(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) { /* a normal fp16 (>= 2^-14): rebias, round */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    uint32_t e = ax >> 23;
    if (e < 102) /* below 2^-25: rounds to zero */
        return sign;
    /* Subnormal fp16: the value in units of 2^-24 is mant * 2^(e - 126). */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t s = 126 - e; /* 14 .. 24 */
    uint32_t q = mant >> s, rem = mant & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return sign | (uint16_t)q;
}

static inline float rnk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return rnk_u2f_(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact */
        return sign ? -v : v;
    }
    return rnk_u2f_(sign | ((e + 112) << 23) | (m << 13));
}

/* out[0..n) = row elements base[off .. off + n) as float. */
static inline void rnk_load_row(rnk_dtype dt, const void *base, int64_t off, int64_t n, float *out)
{
    if (dt == RNK_F32) {
        memcpy(out, (const float *)base + off, (size_t)n * sizeof(float));
    } else if (dt == RNK_BF16) {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t j = 0; j < n; j++)
            out[j] = rnk_bf16_to_f32(p[j]);
    } else {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t j = 0; j < n; j++)
            out[j] = rnk_f16_to_f32(p[j]);
    }
}

/* base[off .. off + n) = in[0..n), rounded to dt. */
static inline void rnk_store_row(rnk_dtype dt, void *base, int64_t off, int64_t n, const float *in)
{
    if (dt == RNK_F32) {
        memcpy((float *)base + off, in, (size_t)n * sizeof(float));
    } else if (dt == RNK_BF16) {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t j = 0; j < n; j++)
            p[j] = rnk_f32_to_bf16(in[j]);
    } else {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t j = 0; j < n; j++)
            p[j] = rnk_f32_to_f16(in[j]);
    }
}

#endif /* RNK_CONV_H */
