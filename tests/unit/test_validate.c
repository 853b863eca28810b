/* SPDX-License-Identifier: MIT */
/*
 * test_validate.c - rnp_validate_bwd: every rule (dtypes, shape limits,
 * strides, regions, alignment, bounds with overflow, aliasing), each at its
 * limit (accepted) and one past it (rejected with its code and a message
 * naming the field).
 */
#include <stdlib.h>
#include <string.h>

#include "rn_proto.h"
#include "rn_test.h"

/* Regions 1..8 of a fake session; size 0 means "no such region". */
typedef struct regions { uint64_t size[9]; } regions;

/* What the daemon does before validating: one lookup per present tensor. */
static void lookup(const rnp_bwd_req *q, const regions *r, uint64_t size[RNP_T_COUNT])
{
    for (int t = 0; t < RNP_T_COUNT; t++) {
        const rnp_tensor *x = rnp_bwd_tensor(q, t);
        uint32_t id = x ? x->region.id : 0;
        size[t] = id >= 1 && id <= 8 && r->size[id] != 0 ? r->size[id] : RNP_NO_REGION;
    }
}

/* rnp_validate_bwd with the sizes of r. */
static int validate(const rnp_bwd_req *q, const rnp_limits *lim, const regions *r,
                    rnp_bwd_plan *plan, rnp_error *err)
{
    uint64_t size[RNP_T_COUNT];
    lookup(q, r, size);
    return rnp_validate_bwd(q, lim, size, plan, err);
}

static const rnp_limits LIM = { .max_m = 1000, .max_n = 4096 };

/* m = 4 rows of n = 8 bf16 in regions 1 (x), 2 (dy), 3 (dx), each exactly
 * 64 bytes; region 4 (w, dw, rstd) and 5 (dres) of 4096 bytes. */
static void base(rnp_bwd_req *q, regions *r)
{
    memset(q, 0, sizeof *q);
    memset(r, 0, sizeof *r);
    q->m = 4, q->n = 8;
    q->x_dtype = q->dy_dtype = q->dx_dtype = RN_DTYPE_BF16;
    q->x = (rnp_tensor){ { 1 }, 0, 8 };
    q->dy = (rnp_tensor){ { 2 }, 0, 8 };
    q->dx = (rnp_tensor){ { 3 }, 0, 8 };
    q->eps = 1e-6f, q->ready_slot = -1;
    r->size[1] = r->size[2] = r->size[3] = 64;
    r->size[4] = r->size[5] = 4096;
}

/* base() plus every optional tensor, all in bounds and disjoint. */
static void full(rnp_bwd_req *q, regions *r)
{
    base(q, r);
    q->has_w = q->has_rstd = q->has_dres = q->has_dw = true;
    q->w_dtype = RN_DTYPE_BF16, q->w = (rnp_tensor){ { 4 }, 0, 0 };        /* [0, 16) */
    q->rstd = (rnp_tensor){ { 4 }, 16, 0 };                                /* [16, 32) */
    q->dw_dtype = RN_DTYPE_F32, q->dw = (rnp_tensor){ { 4 }, 32, 0 };      /* [32, 64) */
    q->dres_dtype = RN_DTYPE_BF16, q->dres = (rnp_tensor){ { 5 }, 0, 8 };  /* [0, 64) */
}

static void expect(const rnp_bwd_req *q, const regions *r, int want, const char *field, int line)
{
    rnp_bwd_plan plan;
    rnp_error err = { 0 };
    memset(&plan, 0x5a, sizeof plan);
    int rc = validate(q, &LIM, r, &plan, &err);
    if (rc != want)
        fail_msg("line %d: expected %s, got %s (%s)", line, rnp_err_name(want), rnp_err_name(rc),
                 rc ? err.msg : "accepted");
    if (rc) {
        assert_int_equal(err.code, rc);
        if (field && !strstr(err.msg, field))
            fail_msg("line %d: message \"%s\" does not name %s", line, err.msg, field);
        /* The plan is an output: untouched on failure. */
        assert_int_equal(((uint8_t *)&plan)[0], 0x5a);
    }
}
#define EXPECT(q, r, want, field) expect(q, r, want, field, __LINE__)

static void test_valid(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    rnp_bwd_plan plan;
    rnp_error err;
    base(&q, &r);
    assert_int_equal(validate(&q, &LIM, &r, &plan, &err), 0);
    assert_true(plan.present[RNP_T_X] && plan.present[RNP_T_DY] && plan.present[RNP_T_DX]);
    assert_false(plan.present[RNP_T_W] || plan.present[RNP_T_RSTD] || plan.present[RNP_T_DRES] ||
                 plan.present[RNP_T_DW]);
    assert_int_equal(plan.span[RNP_T_DX].region, 3);
    assert_int_equal(plan.span[RNP_T_DX].begin, 0);
    assert_int_equal(plan.span[RNP_T_DX].end, 64);
    assert_int_equal(plan.bytes, 3 * 64);

    full(&q, &r);
    assert_int_equal(validate(&q, &LIM, &r, &plan, &err), 0);
    /* 3 x 64 (x, dy, dx) + 16 (w) + 16 (rstd) + 64 (dres) + 32 (dw) */
    assert_int_equal(plan.bytes, 192 + 16 + 16 + 64 + 32);
    assert_int_equal(plan.span[RNP_T_RSTD].begin, 16);
    assert_int_equal(plan.span[RNP_T_RSTD].end, 32);
    assert_int_equal(plan.span[RNP_T_DW].end, 64);
}

static void test_dtypes(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    static const int bad[] = { RN_DTYPE_NONE, 4, 255 };
    for (size_t i = 0; i < 3; i++) {
        base(&q, &r), q.x_dtype = (uint8_t)bad[i];
        EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.x.dtype");
        base(&q, &r), q.dy_dtype = (uint8_t)bad[i];
        EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dy.dtype");
        base(&q, &r), q.dx_dtype = (uint8_t)bad[i];
        EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dx.dtype");
    }
    /* Mixed input and output types are fine: each tensor has its own. */
    base(&q, &r), q.x_dtype = RN_DTYPE_F16, q.dx_dtype = RN_DTYPE_BF16;
    EXPECT(&q, &r, 0, NULL);
    base(&q, &r), q.x_dtype = RN_DTYPE_F32, r.size[1] = 128;
    EXPECT(&q, &r, 0, NULL);

    /* has_X and X_dtype agree. */
    full(&q, &r), q.has_w = false, q.has_dw = false, q.dw_dtype = RN_DTYPE_NONE;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.w.dtype");
    full(&q, &r), q.w_dtype = RN_DTYPE_NONE;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.w.dtype");
    full(&q, &r), q.dres_dtype = RN_DTYPE_NONE;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dres.dtype");
    full(&q, &r), q.has_dres = false;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dres.dtype");
    full(&q, &r), q.dres_dtype = 4;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dres.dtype");
    full(&q, &r), q.has_dw = false;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dw.dtype");

    /* dw: needs w; f32 or the weight's type. */
    full(&q, &r), q.has_w = false, q.w_dtype = RN_DTYPE_NONE;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dw");
    full(&q, &r), q.dw_dtype = RN_DTYPE_BF16; /* == w_dtype */
    EXPECT(&q, &r, 0, NULL);
    full(&q, &r), q.dw_dtype = RN_DTYPE_F16; /* neither f32 nor bf16 */
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.dw.dtype");
    full(&q, &r), q.w_dtype = RN_DTYPE_F32, q.w.offset = 64, q.dw_dtype = RN_DTYPE_F32;
    EXPECT(&q, &r, 0, NULL);
    /* A weight without dw is the common inference-of-dx-only case. */
    full(&q, &r), q.has_dw = false, q.dw_dtype = RN_DTYPE_NONE;
    EXPECT(&q, &r, 0, NULL);
}

static void test_shape_limits(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    base(&q, &r), q.n = 0;
    EXPECT(&q, &r, RN_INVALID_ARGUMENT, "bwd.n");
    /* n at the limit (strides and regions grown to match) and one past it. */
    base(&q, &r);
    r.size[1] = r.size[2] = r.size[3] = 4 * 4097 * 2;
    q.x.stride = q.dy.stride = q.dx.stride = 4097;
    q.n = 4096;
    EXPECT(&q, &r, 0, NULL);
    q.n = 4097;
    EXPECT(&q, &r, RN_TOO_LARGE, "bwd.n");
    /* m at the limit and one past it. */
    base(&q, &r);
    r.size[1] = r.size[2] = r.size[3] = 1000 * 16;
    q.m = 1000;
    EXPECT(&q, &r, 0, NULL);
    q.m = 1001;
    EXPECT(&q, &r, RN_TOO_LARGE, "bwd.m");
    /* A limit of 0 is no limit. */
    {
        rnp_limits nolim = { 0 };
        rnp_bwd_plan plan;
        rnp_error err;
        q.m = 1000;
        q.n = 8;
        assert_int_equal(validate(&q, &nolim, &r, &plan, &err), 0);
    }
    /* m == 0: a no-op that still needs its regions to exist. */
    base(&q, &r), q.m = 0;
    EXPECT(&q, &r, 0, NULL);
    base(&q, &r), q.m = 0, q.dx.region.id = 8;
    EXPECT(&q, &r, RN_UNKNOWN_REGION, "bwd.dx.region");
    base(&q, &r), q.m = 0, q.x.offset = 66;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.x");
    base(&q, &r), q.m = 0, q.x.offset = 64; /* an empty tensor at the very end */
    EXPECT(&q, &r, 0, NULL);
}

static void test_strides(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    rnp_tensor *ts[] = { &q.x, &q.dy, &q.dx, &q.dres };
    const char *names[] = { "bwd.x.stride", "bwd.dy.stride", "bwd.dx.stride", "bwd.dres.stride" };
    for (int i = 0; i < 4; i++) {
        full(&q, &r);
        ts[i]->stride = 7;
        EXPECT(&q, &r, RN_INVALID_ARGUMENT, names[i]);
        full(&q, &r);
        ts[i]->stride = 0;
        EXPECT(&q, &r, RN_INVALID_ARGUMENT, names[i]);
    }
    /* A padded stride whose last row ends exactly at the region's end. */
    base(&q, &r);
    q.x.stride = 10;
    r.size[1] = (3 * 10 + 8) * 2;
    EXPECT(&q, &r, 0, NULL);
    r.size[1]--;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.x");
    /* The strides of 1-D tensors are not used. */
    full(&q, &r), q.w.stride = 1, q.dw.stride = 99, q.rstd.stride = 0;
    EXPECT(&q, &r, 0, NULL);
}

static void test_regions(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    rnp_tensor *ts[] = { &q.x, &q.dy, &q.dx, &q.w, &q.rstd, &q.dres, &q.dw };
    const char *names[] = { "bwd.x.region", "bwd.dy.region", "bwd.dx.region", "bwd.w.region",
                            "bwd.rstd.region", "bwd.dres.region", "bwd.dw.region" };
    for (int i = 0; i < 7; i++) {
        full(&q, &r);
        ts[i]->region.id = 0;
        EXPECT(&q, &r, RN_UNKNOWN_REGION, names[i]);
        full(&q, &r);
        ts[i]->region.id = 7; /* not in the session */
        EXPECT(&q, &r, RN_UNKNOWN_REGION, names[i]);
        full(&q, &r);
        ts[i]->region.id = UINT32_MAX;
        EXPECT(&q, &r, RN_UNKNOWN_REGION, names[i]);
    }
}

static void test_alignment(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    base(&q, &r), r.size[1] = 66, q.x.offset = 1;
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.x.offset");
    base(&q, &r), r.size[1] = 66, q.x.offset = 2; /* bf16: 2-byte aligned is enough */
    EXPECT(&q, &r, 0, NULL);
    base(&q, &r), q.dx_dtype = RN_DTYPE_F32, r.size[3] = 256, q.dx.offset = 2;
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.dx.offset");
    base(&q, &r), q.dx_dtype = RN_DTYPE_F32, r.size[3] = 256, q.dx.offset = 4;
    EXPECT(&q, &r, 0, NULL);
    full(&q, &r), q.rstd.offset = 18; /* rstd is always f32 */
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.rstd.offset");
    full(&q, &r), q.dw.offset = 34;
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.dw.offset");
    full(&q, &r), q.w.offset = 1;
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.w.offset");
    full(&q, &r), q.dres.offset = 3;
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.dres.offset");
    /* An odd stride of a 2-byte type keeps every row aligned: accepted. */
    base(&q, &r), q.dy.stride = 9, r.size[2] = (3 * 9 + 8) * 2;
    EXPECT(&q, &r, 0, NULL);
}

static void test_bounds(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    /* Each tensor exactly at the end of its region, then one element past. */
    full(&q, &r);
    r.size[4] = 64, r.size[5] = 64;
    EXPECT(&q, &r, 0, NULL);
    struct { rnp_tensor *t; uint32_t reg; uint64_t step; const char *name; } cases[] = {
        { &q.x, 1, 2, "bwd.x" }, { &q.dy, 2, 2, "bwd.dy" }, { &q.dx, 3, 2, "bwd.dx" },
        { &q.dres, 5, 2, "bwd.dres" }, { &q.dw, 4, 4, "bwd.dw" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        full(&q, &r);
        r.size[4] = 64, r.size[5] = 64;
        cases[i].t->offset += cases[i].step;
        EXPECT(&q, &r, RN_OUT_OF_BOUNDS, cases[i].name);
    }
    full(&q, &r), r.size[4] = 64, q.dw = (rnp_tensor){ { 6 }, 0, 0 }, r.size[6] = 31;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.dw");
    r.size[6] = 32;
    EXPECT(&q, &r, 0, NULL);
    full(&q, &r), q.rstd = (rnp_tensor){ { 6 }, 0, 0 }, r.size[6] = 15; /* 4 rows x 4 bytes */
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.rstd");
    r.size[6] = 16;
    EXPECT(&q, &r, 0, NULL);
    full(&q, &r), q.w = (rnp_tensor){ { 6 }, 0, 0 }, r.size[6] = 15; /* 8 x bf16 */
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.w");
    /* An offset past the end, even for an empty tensor. */
    base(&q, &r), q.x.offset = 1ull << 40;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.x");
}

/* Arithmetic that would wrap around 2^64: a checker without overflow checks
 * would compute a small end and accept these. */
static void test_overflow(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    /* The largest region: RNP_NO_REGION (2^64 - 1) is no region at all. */
    base(&q, &r), r.size[1] = UINT64_MAX - 1;
    q.x.offset = UINT64_MAX - 15; /* even, so aligned for bf16; + 64 bytes wraps */
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.x");
    q.x.offset = UINT64_MAX - 62; /* odd: the misalignment is found first */
    EXPECT(&q, &r, RN_MISALIGNED, "bwd.x.offset");
    q.x.offset = UINT64_MAX - 64; /* ends at UINT64_MAX - 1: fits exactly */
    q.x.offset &= ~1ull;
    EXPECT(&q, &r, 0, NULL);
    /* (m - 1) * stride overflows. */
    base(&q, &r), r.size[2] = UINT64_MAX - 1;
    q.dy.stride = 1ull << 63;
    q.m = 3;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.dy");
    /* + n overflows. */
    q.m = 2, q.dy.stride = UINT64_MAX - 4;
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.dy");
    /* elements * element size overflows. */
    q.m = 2, q.dy.stride = (1ull << 63) - 8; /* (stride + 8) * 2 = 2^64 */
    EXPECT(&q, &r, RN_OUT_OF_BOUNDS, "bwd.dy");
    /* Huge m with the limit off, rstd of m floats. */
    {
        rnp_limits nolim = { 0 };
        rnp_bwd_plan plan;
        rnp_error err;
        full(&q, &r);
        q.m = 1ull << 62;
        r.size[1] = r.size[2] = r.size[3] = r.size[5] = UINT64_MAX - 1;
        assert_int_equal(validate(&q, &nolim, &r, &plan, &err), RN_OUT_OF_BOUNDS);
    }
}

static void test_aliasing(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    /* dx exactly dy: the in-place backward. */
    base(&q, &r), q.dx = q.dy;
    EXPECT(&q, &r, 0, NULL);
    /* ... but not with another stride, offset or dtype of the same size. */
    base(&q, &r), q.dx = q.dy, q.dx.stride = 9, r.size[2] = 256;
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    base(&q, &r), q.dx = q.dy, q.dx.offset = 2, r.size[2] = 256;
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    base(&q, &r), q.dx = q.dy, q.dx_dtype = RN_DTYPE_F16;
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    /* dx onto x, partially or fully. */
    base(&q, &r), q.dx = q.x;
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    base(&q, &r), q.dx = q.x, q.dx.offset = 62, r.size[1] = 256;
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.x");
    /* Touching but not overlapping: accepted. */
    base(&q, &r), q.dx = q.x, q.dx.offset = 64, r.size[1] = 128;
    EXPECT(&q, &r, 0, NULL);
    /* Rows interleaved without sharing a byte: the conservative hull
     * rejects it, as documented. */
    base(&q, &r), r.size[1] = 4 * 16 * 2;
    q.x.stride = 16, q.dx = q.x, q.dx.offset = 16;
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    /* Inputs may overlap each other: x and dy the same memory. */
    base(&q, &r), q.dy = q.x;
    EXPECT(&q, &r, 0, NULL);
    /* The same offsets in different regions do not overlap. */
    base(&q, &r);
    EXPECT(&q, &r, 0, NULL);
    /* dw against w, rstd, dres, dx. */
    full(&q, &r), q.dw.offset = 8; /* into w [0, 16) */
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.w");
    full(&q, &r), q.dw.offset = 20; /* into rstd [16, 32) */
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.rstd");
    full(&q, &r), q.dw.region.id = 5; /* onto dres [0, 64) */
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.dres");
    full(&q, &r), q.dw = (rnp_tensor){ { 3 }, 0, 0 }; /* onto dx */
    EXPECT(&q, &r, RN_ALIASING, "bwd.dx");
    /* dx onto dres, w and rstd. */
    full(&q, &r), q.dx.region.id = 5;
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.dres");
    full(&q, &r), q.dx.region.id = 4, q.dw.offset = 64, r.size[4] = 4096;
    EXPECT(&q, &r, RN_ALIASING, "overlaps bwd.w");
    /* Empty tensors (m == 0) overlap nothing. */
    base(&q, &r), q.m = 0, q.dx = q.x;
    EXPECT(&q, &r, 0, NULL);
}

static void test_null_arguments(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    rnp_bwd_plan plan;
    rnp_error err;
    uint64_t size[RNP_T_COUNT];
    base(&q, &r);
    lookup(&q, &r, size);
    assert_int_equal(rnp_validate_bwd(NULL, &LIM, size, &plan, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(rnp_validate_bwd(&q, NULL, size, &plan, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(rnp_validate_bwd(&q, &LIM, NULL, &plan, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, NULL, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, &plan, NULL), 0);
}

/* rnp_bwd_tensor: the mandatory tensors always, the optional ones when present. */
static void test_bwd_tensor(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    base(&q, &r);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_X), &q.x);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_DY), &q.dy);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_DX), &q.dx);
    for (int t = RNP_T_W; t < RNP_T_COUNT; t++)
        assert_null(rnp_bwd_tensor(&q, t));
    full(&q, &r);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_W), &q.w);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_RSTD), &q.rstd);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_DRES), &q.dres);
    assert_ptr_equal(rnp_bwd_tensor(&q, RNP_T_DW), &q.dw);
    assert_null(rnp_bwd_tensor(&q, -1));
    assert_null(rnp_bwd_tensor(&q, RNP_T_COUNT));
    assert_null(rnp_bwd_tensor(NULL, RNP_T_X));
}

/* The sizes are per tensor and only those of present tensors are read;
 * RNP_NO_REGION is the unknown region whatever the id, and the message is
 * the one the daemon has always sent. */
static void test_region_sizes(void **state)
{
    (void)state;
    rnp_bwd_req q;
    regions r;
    rnp_bwd_plan plan;
    rnp_error err;
    uint64_t size[RNP_T_COUNT];
    base(&q, &r);
    lookup(&q, &r, size);
    size[RNP_T_W] = size[RNP_T_RSTD] = size[RNP_T_DRES] = size[RNP_T_DW] = 0; /* ignored */
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, &plan, &err), 0);
    size[RNP_T_DY] = RNP_NO_REGION;
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, &plan, &err), RN_UNKNOWN_REGION);
    assert_string_equal(err.msg, "bwd.dy.region: 2 is not a region of this session");
    /* Region id 0 is unknown even with a size. */
    lookup(&q, &r, size);
    q.x.region.id = 0;
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, &plan, &err), RN_UNKNOWN_REGION);
    assert_string_equal(err.msg, "bwd.x.region: 0 is not a region of this session");
    /* The largest size a region can have: everything up to its last byte. */
    base(&q, &r);
    lookup(&q, &r, size);
    size[RNP_T_X] = RNP_NO_REGION - 1;
    q.x.offset = RNP_NO_REGION - 1 - 64;
    assert_int_equal(rnp_validate_bwd(&q, &LIM, size, &plan, &err), 0);
    assert_true(plan.span[RNP_T_X].end == RNP_NO_REGION - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_shape_limits),
        cmocka_unit_test(test_strides),
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_aliasing),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_bwd_tensor),
        cmocka_unit_test(test_region_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
