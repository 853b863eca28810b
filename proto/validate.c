/* SPDX-License-Identifier: MIT */
/*
 * validate.c - the checks the daemon applies to a decoded BWD request before
 * anything touches memory: dtypes, shape limits, strides, each tensor's byte
 * extent inside its region (overflow-checked), alignment and aliasing.
 *
 * The caller looks every region up once, in the requesting session, and
 * passes the sizes in: the same lookup then serves to validate and to pin,
 * and this file stays pure (no callback into the daemon).
 *
 * Spans are conservative: a strided tensor's span is the [begin, end) hull
 * from its first byte to its last, including the gaps between rows.  Two
 * tensors that interleave rows without touching the same bytes therefore
 * count as overlapping; that is rejected too, since no caller needs it and
 * the exact test is not worth its complexity.
 */
#include <string.h>

#include "rn_proto.h"

static const char *const tnames[RNP_T_COUNT] = { "x", "dy", "dx", "w", "rstd", "dres", "dw" };

static bool is_float_dtype(int dt)
{
    return dt == RN_DTYPE_F32 || dt == RN_DTYPE_F16 || dt == RN_DTYPE_BF16;
}

static int check_dtypes(const rnp_bwd_req *q, rnp_error *err)
{
    const struct { const char *name; int dt; } req[] = {
        { "bwd.x.dtype", q->x_dtype }, { "bwd.dy.dtype", q->dy_dtype }, { "bwd.dx.dtype", q->dx_dtype },
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!is_float_dtype(req[i].dt))
            return rnp_fail(err, RN_INVALID_ARGUMENT, "%s: %s (%d) is not f32, f16 or bf16",
                            req[i].name, rnp_dtype_name(req[i].dt), req[i].dt);
    /* An optional tensor is present exactly when its dtype is not NONE. */
    const struct { const char *name; bool has; int dt; } opt[] = {
        { "bwd.w", q->has_w, q->w_dtype },
        { "bwd.dres", q->has_dres, q->dres_dtype },
        { "bwd.dw", q->has_dw, q->dw_dtype },
    };
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        if (!opt[i].has && opt[i].dt != RN_DTYPE_NONE)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "%s.dtype: %s given for an absent tensor",
                            opt[i].name, rnp_dtype_name(opt[i].dt));
        if (opt[i].has && !is_float_dtype(opt[i].dt))
            return rnp_fail(err, RN_INVALID_ARGUMENT, "%s.dtype: %s (%d) is not f32, f16 or bf16",
                            opt[i].name, rnp_dtype_name(opt[i].dt), opt[i].dt);
    }
    /* dw is the weight's gradient: without a weight there is none to
     * compute, and its type is f32 or the weight's own. */
    if (q->has_dw && !q->has_w)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.dw: requested without a weight (bwd.w)");
    if (q->has_dw && q->dw_dtype != RN_DTYPE_F32 && q->dw_dtype != q->w_dtype)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.dw.dtype: %s must be f32 or the weight's %s",
                        rnp_dtype_name(q->dw_dtype), rnp_dtype_name(q->w_dtype));
    return 0;
}

/* Number of bytes a tensor of `rows` rows of n elements, row stride `stride`
 * elements, covers from its first byte; false on overflow. */
static bool extent(uint64_t rows, uint64_t n, uint64_t stride, size_t es, uint64_t *bytes)
{
    uint64_t elems;
    if (rows == 0 || n == 0) {
        *bytes = 0;
        return true;
    }
    if (__builtin_mul_overflow(rows - 1, stride, &elems) || __builtin_add_overflow(elems, n, &elems))
        return false;
    return !__builtin_mul_overflow(elems, (uint64_t)es, bytes);
}

/* The shape of one tensor of the request; rnp_bwd_tensor says whether it is present. */
typedef struct tdesc {
    int dtype;
    bool two_d;
    uint64_t rows;     /* 2-D: m; 1-D: 1 */
    uint64_t len;      /* elements per row */
} tdesc;

static int check_tensor(const char *name, const rnp_tensor *t, const tdesc *d, uint64_t size,
                        rnp_span *span, rnp_error *err)
{
    size_t es = rnp_dtype_size(d->dtype);
    uint64_t bytes, end;

    if (t->region.id == 0 || size == RNP_NO_REGION)
        return rnp_fail(err, RN_UNKNOWN_REGION, "bwd.%s.region: %u is not a region of this session",
                        name, t->region.id);
    /* The stride is in elements, so an aligned offset keeps every row
     * aligned: the offset is the only alignment to check. */
    if (t->offset % es != 0)
        return rnp_fail(err, RN_MISALIGNED, "bwd.%s.offset: %llu is not a multiple of %zu (%s)",
                        name, (unsigned long long)t->offset, es, rnp_dtype_name(d->dtype));
    if (!extent(d->rows, d->len, d->two_d ? t->stride : d->len, es, &bytes) ||
        __builtin_add_overflow(t->offset, bytes, &end))
        return rnp_fail(err, RN_OUT_OF_BOUNDS,
                        "bwd.%s: offset %llu + extent overflows 64 bits", name,
                        (unsigned long long)t->offset);
    if (end > size || t->offset > size)
        return rnp_fail(err, RN_OUT_OF_BOUNDS,
                        "bwd.%s: bytes [%llu, %llu) exceed region %u of %llu bytes", name,
                        (unsigned long long)t->offset, (unsigned long long)end, t->region.id,
                        (unsigned long long)size);
    span->region = t->region.id;
    span->begin = t->offset;
    span->end = end;
    return 0;
}

static bool overlap(const rnp_span *a, const rnp_span *b)
{
    return a->region == b->region && a->begin < a->end && b->begin < b->end &&
           a->begin < b->end && b->begin < a->end;
}

/* a + b, saturating: plan->bytes is a statistic, never a bound. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

const rnp_tensor *rnp_bwd_tensor(const rnp_bwd_req *q, int t)
{
    if (!q)
        return NULL;
    switch (t) {
    case RNP_T_X: return &q->x;
    case RNP_T_DY: return &q->dy;
    case RNP_T_DX: return &q->dx;
    case RNP_T_W: return q->has_w ? &q->w : NULL;
    case RNP_T_RSTD: return q->has_rstd ? &q->rstd : NULL;
    case RNP_T_DRES: return q->has_dres ? &q->dres : NULL;
    case RNP_T_DW: return q->has_dw ? &q->dw : NULL;
    }
    return NULL;
}

int rnp_validate_bwd(const rnp_bwd_req *q, const rnp_limits *lim,
                     const uint64_t region_size[RNP_T_COUNT], rnp_bwd_plan *plan, rnp_error *err)
{
    rnp_bwd_plan p;
    int rc;

    if (!q || !lim || !region_size || !plan)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd: NULL argument to validation");
    memset(&p, 0, sizeof p);
    if ((rc = check_dtypes(q, err)) != 0)
        return rc;
    if (q->n == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.n: must be at least 1");
    if (lim->max_n != 0 && q->n > lim->max_n)
        return rnp_fail(err, RN_TOO_LARGE, "bwd.n: %u exceeds the limit %u", q->n, lim->max_n);
    if (lim->max_m != 0 && q->m > lim->max_m)
        return rnp_fail(err, RN_TOO_LARGE, "bwd.m: %llu exceeds the limit %llu",
                        (unsigned long long)q->m, (unsigned long long)lim->max_m);

    const tdesc td[RNP_T_COUNT] = {
        [RNP_T_X] = { q->x_dtype, true, q->m, q->n },
        [RNP_T_DY] = { q->dy_dtype, true, q->m, q->n },
        [RNP_T_DX] = { q->dx_dtype, true, q->m, q->n },
        [RNP_T_W] = { q->w_dtype, false, 1, q->n },
        [RNP_T_RSTD] = { RN_DTYPE_F32, false, 1, q->m },
        [RNP_T_DRES] = { q->dres_dtype, true, q->m, q->n },
        [RNP_T_DW] = { q->dw_dtype, false, 1, q->n },
    };
    for (int i = 0; i < RNP_T_COUNT; i++) {
        const rnp_tensor *t = rnp_bwd_tensor(q, i);
        if (t && td[i].two_d && t->stride < q->n)
            return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.%s.stride: %llu is less than n (%u)",
                            tnames[i], (unsigned long long)t->stride, q->n);
    }
    for (int i = 0; i < RNP_T_COUNT; i++) {
        const rnp_tensor *t = rnp_bwd_tensor(q, i);
        if (!t)
            continue;
        if ((rc = check_tensor(tnames[i], t, &td[i], region_size[i], &p.span[i], err)) != 0)
            return rc;
        p.present[i] = true;
        p.bytes = sat_add(p.bytes, sat_mul(sat_mul(td[i].rows, td[i].len), rnp_dtype_size(td[i].dtype)));
    }

    /* Outputs must not overlap anything else, except that dx may be dy
     * itself (in-place backward): same region, offset, stride and dtype. */
    static const int outputs[] = { RNP_T_DX, RNP_T_DW };
    for (size_t o = 0; o < sizeof outputs / sizeof outputs[0]; o++) {
        int a = outputs[o];
        if (!p.present[a])
            continue;
        for (int b = 0; b < RNP_T_COUNT; b++) {
            if (b == a || !p.present[b] || !overlap(&p.span[a], &p.span[b]))
                continue;
            if (a == RNP_T_DX && b == RNP_T_DY && q->dx.region.id == q->dy.region.id &&
                q->dx.offset == q->dy.offset && q->dx.stride == q->dy.stride &&
                q->dx_dtype == q->dy_dtype)
                continue;
            return rnp_fail(err, RN_ALIASING, "bwd.%s: overlaps bwd.%s in region %u%s", tnames[a],
                            tnames[b], p.span[a].region,
                            a == RNP_T_DX && b == RNP_T_DY
                                ? " (only an exact alias of dy is allowed)" : "");
        }
    }
    *plan = p;
    return 0;
}
