/* SPDX-License-Identifier: MIT */
/*
 * fuzz_validate.c - libFuzzer harness for rnp_validate_bwd (proto/validate.c).
 *
 * The input is a message: when it decodes as a BWD request, it is validated
 * against region sizes and limits derived from a hash of the input bytes.
 * For each region id the hash picks a size the request's own tensors make
 * interesting (exactly the end of the last tensor in it, one byte less, a
 * little more) or a plain one (unknown, 0, tiny, the largest), so the seed
 * corpus of valid messages (tests/fuzz/corpus) reaches both sides of every
 * bound without a corpus of its own.
 *
 * The checks are an independent model of PROTOCOL.md section 5, in 128-bit
 * arithmetic that cannot overflow: the validator accepts exactly the
 * requests the model accepts, and an accepted request's plan has each
 * present tensor (and only those) with its exact span inside its region,
 * and no output overlapping another tensor except dx exactly aliasing dy.
 * A rejection carries one of the validator's codes and leaves the plan
 * untouched.  Any violation abort()s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef unsigned __int128 u128;

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_validate: violated: %s\n", what);
        abort();
    }
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t hash_bytes(const uint8_t *data, size_t size)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    return h;
}

static bool float_dtype(int dt)
{
    return dt == RN_DTYPE_F32 || dt == RN_DTYPE_F16 || dt == RN_DTYPE_BF16;
}

/* The model's view of tensor t: present (t != NULL), dtype, rows, elements
 * per row. */
typedef struct shape {
    const rnp_tensor *t;
    int dtype;
    bool two_d;
    u128 rows, len;
} shape;

static void shapes(const rnp_bwd_req *q, shape s[RNP_T_COUNT])
{
    const int dt[RNP_T_COUNT] = { q->x_dtype, q->dy_dtype, q->dx_dtype, q->w_dtype,
                                  RN_DTYPE_F32, q->dres_dtype, q->dw_dtype };
    for (int i = 0; i < RNP_T_COUNT; i++) {
        s[i].t = rnp_bwd_tensor(q, i);
        s[i].dtype = dt[i];
        s[i].two_d = i == RNP_T_X || i == RNP_T_DY || i == RNP_T_DX || i == RNP_T_DRES;
        s[i].rows = s[i].two_d ? q->m : 1;
        s[i].len = i == RNP_T_RSTD ? q->m : q->n;
    }
}

/* The exact end of a tensor's bytes (offset + extent), with no overflow. */
static u128 exact_end(const shape *s)
{
    u128 es = rnp_dtype_size(s->dtype);
    u128 stride = s->two_d ? s->t->stride : s->len;
    if (s->rows == 0 || s->len == 0)
        return s->t->offset;
    return s->t->offset + ((s->rows - 1) * stride + s->len) * es;
}

/* A size for region id, chosen by the input's hash among sizes that matter
 * for this request. */
static uint64_t pick_size(uint64_t seed, const shape s[RNP_T_COUNT], uint32_t id)
{
    u128 need = 0;
    for (int i = 0; i < RNP_T_COUNT; i++) {
        if (s[i].t && s[i].t->region.id == id && float_dtype(s[i].dtype)) {
            u128 e = exact_end(&s[i]);
            need = e > need ? e : need;
        }
    }
    uint64_t need64 = need >= RNP_NO_REGION ? RNP_NO_REGION - 1 : (uint64_t)need;
    uint64_t h = mix(seed ^ ((uint64_t)id * 0x9e3779b97f4a7c15ull));
    uint64_t more = (h >> 8) % 64;
    switch (h % 10) {
    case 0: return RNP_NO_REGION;
    case 1: return 0;
    case 2: return (uint64_t)1 << (h >> 8) % 24;
    case 3: return RNP_NO_REGION - 1;
    case 4: return need64 > 0 ? need64 - 1 : 0;
    case 5: return need64 < RNP_NO_REGION - 1 - more ? need64 + more : need64;
    default: return need64;
    }
}

static bool overlap(const rnp_span *a, const rnp_span *b)
{
    return a->region == b->region && a->begin < a->end && b->begin < b->end &&
           a->begin < b->end && b->begin < a->end;
}

/* No output overlaps another present tensor, except dx exactly on dy. */
static bool outputs_clear(const rnp_bwd_req *q, const bool present[RNP_T_COUNT],
                          const rnp_span sp[RNP_T_COUNT])
{
    static const int outputs[] = { RNP_T_DX, RNP_T_DW };
    for (int o = 0; o < 2; o++) {
        int a = outputs[o];
        for (int b = 0; b < RNP_T_COUNT && present[a]; b++) {
            if (b == a || !present[b] || !overlap(&sp[a], &sp[b]))
                continue;
            if (a == RNP_T_DX && b == RNP_T_DY && q->dx.region.id == q->dy.region.id &&
                q->dx.offset == q->dy.offset && q->dx.stride == q->dy.stride &&
                q->dx_dtype == q->dy_dtype)
                continue;
            return false;
        }
    }
    return true;
}

/* PROTOCOL.md section 5, rules 4 to 8: does the model accept q? */
static bool model_accepts(const rnp_bwd_req *q, const rnp_limits *lim, const shape s[RNP_T_COUNT],
                          const uint64_t size[RNP_T_COUNT])
{
    const bool has[RNP_T_COUNT] = { true, true, true, q->has_w,
                                    q->has_rstd, q->has_dres, q->has_dw };
    bool present[RNP_T_COUNT];
    rnp_span sp[RNP_T_COUNT];
    for (int i = 0; i < RNP_T_COUNT; i++) {
        if (i != RNP_T_RSTD && (has[i] ? !float_dtype(s[i].dtype) : s[i].dtype != RN_DTYPE_NONE))
            return false;
    }
    if (q->has_dw && (!q->has_w || (q->dw_dtype != RN_DTYPE_F32 && q->dw_dtype != q->w_dtype)))
        return false;
    if (q->n == 0 || (lim->max_n && q->n > lim->max_n) || (lim->max_m && q->m > lim->max_m))
        return false;
    for (int i = 0; i < RNP_T_COUNT; i++) {
        present[i] = s[i].t != NULL;
        if (!present[i])
            continue;
        if (s[i].two_d && s[i].t->stride < q->n)
            return false;
        if (s[i].t->region.id == 0 || size[i] == RNP_NO_REGION)
            return false;
        if (s[i].t->offset % rnp_dtype_size(s[i].dtype) != 0)
            return false;
        u128 end = exact_end(&s[i]);
        if (end > size[i] || s[i].t->offset > size[i])
            return false;
        sp[i] = (rnp_span){ s[i].t->region.id, s[i].t->offset, (uint64_t)end };
    }
    return outputs_clear(q, present, sp);
}

static void check_plan(const rnp_bwd_req *q, const shape s[RNP_T_COUNT],
                       const uint64_t size[RNP_T_COUNT], const rnp_bwd_plan *plan)
{
    u128 bytes = 0;
    for (int i = 0; i < RNP_T_COUNT; i++) {
        check(plan->present[i] == (s[i].t != NULL), "present tensors as declared");
        if (!s[i].t)
            continue;
        const rnp_span *sp = &plan->span[i];
        check(sp->region == s[i].t->region.id && sp->region != 0, "span names the tensor's region");
        check(size[i] != RNP_NO_REGION, "span in a known region");
        check(sp->begin == s[i].t->offset && sp->begin <= sp->end, "span starts at the offset");
        check(sp->end == exact_end(&s[i]), "span ends after the tensor's last byte");
        check(sp->end <= size[i], "span inside its region");
        bytes += s[i].rows * s[i].len * rnp_dtype_size(s[i].dtype);
    }
    check(plan->bytes == (bytes > UINT64_MAX ? UINT64_MAX : (uint64_t)bytes), "plan bytes");
    check(outputs_clear(q, plan->present, plan->span),
          "no output overlaps another tensor but dx exactly on dy");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static rnp_request req;
    rnp_error err;
    if (rnp_decode_request(data, size, &req, &err) != 0 || req.op != RN_OP_BWD)
        return 0;
    const rnp_bwd_req *q = &req.u.bwd;
    uint64_t seed = hash_bytes(data, size);
    shape s[RNP_T_COUNT];
    uint64_t sizes[RNP_T_COUNT];
    shapes(q, s);
    /* Absent tensors get garbage: their entries must be ignored. */
    for (int i = 0; i < RNP_T_COUNT; i++)
        sizes[i] = s[i].t ? pick_size(seed, s, s[i].t->region.id) : mix(seed + (uint64_t)i);
    /* Limits: often none, else around the request's own shape. */
    uint64_t h = mix(seed ^ 0x5bd1e995u);
    rnp_limits lim = { 0 };
    if (h & 1)
        lim.max_m = q->m + (h >> 1) % 3 - 1;
    if (h & 8)
        lim.max_n = q->n + (uint32_t)((h >> 4) % 3) - 1;

    rnp_bwd_plan plan;
    static rnp_bwd_plan untouched;
    memset(&plan, 0x5a, sizeof plan);
    memset(&untouched, 0x5a, sizeof untouched);
    int rc = rnp_validate_bwd(q, &lim, sizes, &plan, &err);
    check(rc == 0 || rc == RN_INVALID_ARGUMENT || rc == RN_TOO_LARGE || rc == RN_UNKNOWN_REGION ||
              rc == RN_MISALIGNED || rc == RN_OUT_OF_BOUNDS || rc == RN_ALIASING,
          "a validator's code");
    check((rc == 0) == model_accepts(q, &lim, s, sizes), "accepted exactly when the model accepts");
    if (rc != 0) {
        check(err.code == rc && strncmp(err.msg, "bwd", 3) == 0, "the error names a bwd field");
        check(memcmp(&plan, &untouched, sizeof plan) == 0, "plan untouched on failure");
        return 0;
    }
    check_plan(q, s, sizes, &plan);
    return 0;
}
