/* SPDX-License-Identifier: MIT */
/*
 * test_proto_ring.c - the fast path's slots (proto/ring.c, rn_ring.h): the
 * layout's constants, encode and decode, every bad field with its code and
 * the field its message names, a decoded slot validated exactly as the same
 * BWD over msgpack, the header check, the result, and the sequence
 * arithmetic at the ring's wrap and at 2^32 and 2^64.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn_ring.h"
#include "rn_test.h"

/* Every optional tensor present: 4 rows of 8, regions 1..5. */
static void full(rnp_bwd_req *q)
{
    memset(q, 0, sizeof *q);
    q->seq = 7, q->m = 4, q->n = 8;
    q->x_dtype = q->dy_dtype = q->dx_dtype = RN_DTYPE_BF16;
    q->x = (rnp_tensor){ { 1 }, 0, 8 };
    q->dy = (rnp_tensor){ { 2 }, 64, 9 };
    q->dx = (rnp_tensor){ { 3 }, 128, 10 };
    q->has_w = q->has_rstd = q->has_dres = q->has_dw = true;
    q->w_dtype = RN_DTYPE_F16, q->w = (rnp_tensor){ { 4 }, 0, 0 };
    q->rstd = (rnp_tensor){ { 4 }, 16, 0 };
    q->dw_dtype = RN_DTYPE_F32, q->dw = (rnp_tensor){ { 4 }, 32, 0 };
    q->dres_dtype = RN_DTYPE_F32, q->dres = (rnp_tensor){ { 5 }, 8, 8 };
    q->eps = 1e-6f, q->weight_offset = 1.0f, q->ready_slot = -1;
}

static void test_layout(void **state)
{
    (void)state;
    /* Each word on its own line, 64-bit words 8-aligned, slots whole lines. */
    const unsigned words[] = { RNP_RING_O_PROD, RNP_RING_O_READY, RNP_RING_O_DONE,
                               RNP_RING_O_SLEEPING, RNP_RING_O_DOORBELL, RNP_RING_O_WAITERS,
                               RNP_RING_O_STATE };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        assert_int_equal(words[i] % RNP_RING_LINE, 0);
        for (size_t j = 0; j < i; j++)
            assert_true(words[i] / RNP_RING_LINE != words[j] / RNP_RING_LINE);
    }
    assert_true(RNP_RING_O_STATE + RNP_RING_LINE <= RNP_RING_HDR);
    assert_int_equal(RNP_RING_HDR % RNP_RING_LINE, 0);
    assert_int_equal(RNP_RING_SLOT % RNP_RING_LINE, 0);
    assert_int_equal(RNP_SLOT_O_TENSORS + RNP_T_COUNT * RNP_SLOT_TENSOR, RNP_SLOT_O_RESERVED);
    assert_true(RNP_SLOT_O_MSG + RNP_MAX_ERRMSG <= RNP_RING_SLOT);
    assert_int_equal(RNP_RING_DESC, RNP_SLOT_O_STATUS);
    assert_int_equal(rnp_ring_bytes(64), 512 + 64 * 512);
}

static void same_req(const rnp_bwd_req *a, const rnp_bwd_req *b)
{
    assert_int_equal(rnp_bwd_digest(a), rnp_bwd_digest(b));
    assert_int_equal(a->has_w, b->has_w);
    assert_int_equal(a->has_rstd, b->has_rstd);
    assert_int_equal(a->has_dres, b->has_dres);
    assert_int_equal(a->has_dw, b->has_dw);
}

static void test_roundtrip(void **state)
{
    (void)state;
    uint8_t d[RNP_RING_DESC];
    rnp_bwd_req q, back;
    rnp_error err = { 0 };

    full(&q);
    rnp_ring_encode(&q, 7, d);
    assert_int_equal(rnp_ring_decode(d, 7, &back, &err), 0);
    same_req(&q, &back);
    assert_int_equal(back.ready_slot, -1);
    assert_int_equal(back.dy.stride, 9);
    assert_int_equal(back.dres.offset, 8);
    /* The fixed layout, byte by byte where it matters. */
    assert_int_equal(rnp_le64_get(d + RNP_SLOT_O_SEQ), 7);
    assert_int_equal(rnp_le32_get(d + RNP_SLOT_O_FLAGS), RNP_SLOT_F_ALL);
    assert_int_equal(rnp_le32_get(d + RNP_SLOT_O_TENSORS + RNP_T_DY * RNP_SLOT_TENSOR +
                                  RNP_SLOT_T_REGION), 2);
    assert_int_equal(rnp_le64_get(d + RNP_SLOT_O_TENSORS + RNP_T_DX * RNP_SLOT_TENSOR +
                                  RNP_SLOT_T_OFFSET), 128);

    /* The minimal request: no optional tensor, all their bytes zero. */
    memset(&q, 0, sizeof q);
    q.m = 2, q.n = 4, q.x_dtype = q.dy_dtype = q.dx_dtype = RN_DTYPE_F32, q.ready_slot = -1;
    q.x = q.dy = q.dx = (rnp_tensor){ { 1 }, 0, 4 };
    rnp_ring_encode(&q, 1, d);
    for (unsigned i = RNP_SLOT_O_TENSORS + RNP_T_W * RNP_SLOT_TENSOR; i < RNP_RING_DESC; i++)
        assert_int_equal(d[i], 0);
    assert_int_equal(rnp_ring_decode(d, 1, &back, &err), 0);
    q.seq = 1;
    same_req(&q, &back);
    /* -0.0 weight_offset decodes as 0.0, as the digest takes it. */
    q.weight_offset = -0.0f;
    rnp_ring_encode(&q, 1, d);
    assert_int_equal(rnp_ring_decode(d, 1, &back, &err), 0);
    assert_false(signbit(back.weight_offset));
}

/* Patch one field of a good slot and expect code, with field in the message. */
typedef void patch_fn(uint8_t *d);
static void expect(patch_fn *p, int code, const char *field, int line)
{
    uint8_t d[RNP_RING_DESC];
    rnp_bwd_req q, out;
    rnp_error err = { 0 };

    full(&q);
    rnp_ring_encode(&q, 7, d);
    p(d);
    memset(&out, 0x5a, sizeof out);
    int rc = rnp_ring_decode(d, 7, &out, &err);
    if (rc != code)
        fail_msg("line %d: expected %s, got %s (%s)", line, rnp_err_name(code), rnp_err_name(rc),
                 err.msg);
    assert_int_equal(err.code, code);
    if (!strstr(err.msg, field))
        fail_msg("line %d: \"%s\" does not name %s", line, err.msg, field);
    assert_int_equal(((uint8_t *)&out)[0], 0x5a);   /* untouched on failure */
}

#define T(t, f) (RNP_SLOT_O_TENSORS + (t) * RNP_SLOT_TENSOR + (f))
static void p_seq(uint8_t *d) { rnp_le64_put(d + RNP_SLOT_O_SEQ, 8); }
static void p_flags(uint8_t *d) { rnp_le32_put(d + RNP_SLOT_O_FLAGS, RNP_SLOT_F_ALL | 0x10); }
static void p_x_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_X, RNP_SLOT_T_DTYPE), 4); }
static void p_dy_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_DY, RNP_SLOT_T_DTYPE), 99); }
static void p_dx_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_DX, RNP_SLOT_T_DTYPE), 0x10003); }
static void p_w_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_W, RNP_SLOT_T_DTYPE), 5); }
static void p_dres_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_DRES, RNP_SLOT_T_DTYPE), 4); }
static void p_dw_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_DW, RNP_SLOT_T_DTYPE), 4); }
static void p_rstd_dtype(uint8_t *d) { rnp_le32_put(d + T(RNP_T_RSTD, RNP_SLOT_T_DTYPE), 1); }
static void p_w_stride(uint8_t *d) { rnp_le64_put(d + T(RNP_T_W, RNP_SLOT_T_STRIDE), 8); }
static void p_rstd_stride(uint8_t *d) { rnp_le64_put(d + T(RNP_T_RSTD, RNP_SLOT_T_STRIDE), 1); }
static void p_dw_stride(uint8_t *d) { rnp_le64_put(d + T(RNP_T_DW, RNP_SLOT_T_STRIDE), 1); }
static void p_absent_dres(uint8_t *d)
{
    /* dres's flag cleared, its fields left set. */
    rnp_le32_put(d + RNP_SLOT_O_FLAGS, RNP_SLOT_F_ALL & ~RNP_SLOT_F_DRES);
}
static void p_absent_w(uint8_t *d)
{
    rnp_le32_put(d + RNP_SLOT_O_FLAGS, RNP_SLOT_F_RSTD);
    memset(d + T(RNP_T_DW, 0), 0, RNP_SLOT_TENSOR);
    memset(d + T(RNP_T_DRES, 0), 0, RNP_SLOT_TENSOR);
    memset(d + T(RNP_T_W, 0), 0, RNP_SLOT_TENSOR);
    d[T(RNP_T_W, RNP_SLOT_T_OFFSET) + 7] = 1;   /* one stray byte of w */
}
static void put_f32(uint8_t *d, unsigned off, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    rnp_le32_put(d + off, u);
}
static void p_eps_neg(uint8_t *d) { put_f32(d, RNP_SLOT_O_EPS, -1e-6f); }
static void p_eps_nan(uint8_t *d) { put_f32(d, RNP_SLOT_O_EPS, NAN); }
static void p_eps_inf(uint8_t *d) { put_f32(d, RNP_SLOT_O_EPS, INFINITY); }
static void p_woff_inf(uint8_t *d) { put_f32(d, RNP_SLOT_O_WOFF, -INFINITY); }
static void p_reserved(uint8_t *d) { d[RNP_RING_DESC - 1] = 1; }
static void p_reserved0(uint8_t *d) { d[RNP_SLOT_O_RESERVED] = 0x80; }

static void test_bad_fields(void **state)
{
    (void)state;
    expect(p_seq, RN_INVALID_ARGUMENT, "bwd.seq", __LINE__);
    expect(p_flags, RN_INVALID_ARGUMENT, "bwd.flags", __LINE__);
    expect(p_x_dtype, RN_INVALID_ARGUMENT, "bwd.x.dtype", __LINE__);
    expect(p_dy_dtype, RN_INVALID_ARGUMENT, "bwd.dy.dtype", __LINE__);
    expect(p_dx_dtype, RN_INVALID_ARGUMENT, "bwd.dx.dtype", __LINE__);
    expect(p_w_dtype, RN_INVALID_ARGUMENT, "bwd.w.dtype", __LINE__);
    expect(p_dres_dtype, RN_INVALID_ARGUMENT, "bwd.dres.dtype", __LINE__);
    expect(p_dw_dtype, RN_INVALID_ARGUMENT, "bwd.dw.dtype", __LINE__);
    expect(p_rstd_dtype, RN_UNKNOWN_FIELD, "bwd.rstd.dtype", __LINE__);
    expect(p_w_stride, RN_UNKNOWN_FIELD, "bwd.w.stride", __LINE__);
    expect(p_rstd_stride, RN_UNKNOWN_FIELD, "bwd.rstd.stride", __LINE__);
    expect(p_dw_stride, RN_UNKNOWN_FIELD, "bwd.dw.stride", __LINE__);
    expect(p_absent_dres, RN_INVALID_ARGUMENT, "bwd.dres", __LINE__);
    expect(p_absent_w, RN_INVALID_ARGUMENT, "bwd.w", __LINE__);
    expect(p_eps_neg, RN_INVALID_ARGUMENT, "bwd.eps", __LINE__);
    expect(p_eps_nan, RN_INVALID_ARGUMENT, "bwd.eps", __LINE__);
    expect(p_eps_inf, RN_INVALID_ARGUMENT, "bwd.eps", __LINE__);
    expect(p_woff_inf, RN_INVALID_ARGUMENT, "bwd.weight_offset", __LINE__);
    expect(p_reserved, RN_INVALID_ARGUMENT, "bwd.reserved", __LINE__);
    expect(p_reserved0, RN_INVALID_ARGUMENT, "bwd.reserved", __LINE__);
}

/*
 * "Validated exactly like a BWD": the same request sent as msgpack (decoded
 * by the BWD decoder) and as a slot gets the same code and message from
 * rnp_validate_bwd, for a good request and for one bad case of each rule.
 */
static void validate_both(rnp_bwd_req q, const uint64_t size[RNP_T_COUNT])
{
    static uint8_t buf[RNP_MAX_MSG];
    rnp_request rq, dq;
    rnp_bwd_req sq;
    uint8_t d[RNP_RING_DESC];
    rnp_error e1 = { 0 }, e2 = { 0 };
    rnp_bwd_plan p1, p2;
    size_t len;

    memset(&rq, 0, sizeof rq);
    rq.version = RNP_VERSION, rq.op = RN_OP_BWD, rq.id = 1, rq.u.bwd = q;
    assert_int_equal(rnp_encode_request(&rq, buf, sizeof buf, &len, NULL), 0);
    assert_int_equal(rnp_decode_request(buf, len, &dq, NULL), 0);
    rnp_ring_encode(&q, q.seq, d);
    assert_int_equal(rnp_ring_decode(d, q.seq, &sq, NULL), 0);
    int c1 = rnp_validate_bwd(&dq.u.bwd, &(rnp_limits){ .max_m = 64, .max_n = 64 }, size, &p1, &e1);
    int c2 = rnp_validate_bwd(&sq, &(rnp_limits){ .max_m = 64, .max_n = 64 }, size, &p2, &e2);
    assert_int_equal(c1, c2);
    assert_string_equal(e1.msg, e2.msg);
    if (c1 == 0)
        assert_int_equal(p1.bytes, p2.bytes);
}

static void test_validated_like_bwd(void **state)
{
    (void)state;
    uint64_t size[RNP_T_COUNT] = { 1024, 1024, 1024, 1024, 1024, 1024, 1024 };
    rnp_bwd_req q;

    full(&q);
    validate_both(q, size);                           /* accepted */
    full(&q), q.n = 0;
    validate_both(q, size);                           /* INVALID_ARGUMENT: n */
    full(&q), q.m = 65;
    validate_both(q, size);                           /* TOO_LARGE */
    full(&q), q.x.stride = 7;
    validate_both(q, size);                           /* stride < n */
    full(&q), q.dy.offset = 1;
    validate_both(q, size);                           /* MISALIGNED */
    full(&q);
    size[RNP_T_DX] = 100;
    validate_both(q, size);                           /* OUT_OF_BOUNDS */
    size[RNP_T_DX] = RNP_NO_REGION;
    validate_both(q, size);                           /* UNKNOWN_REGION */
    size[RNP_T_DX] = 1024;
    full(&q), q.dw = q.w, q.dw_dtype = q.w_dtype;
    validate_both(q, size);                           /* ALIASING */
    full(&q), q.dw_dtype = RN_DTYPE_BF16;
    validate_both(q, size);                           /* dw's dtype */
}

static void test_header(void **state)
{
    (void)state;
    uint8_t ring[RNP_RING_HDR];
    rnp_error err = { 0 };

    rnp_ring_init(ring, 8);
    assert_int_equal(rnp_ring_check_header(ring, 8, &err), 0);
    assert_int_equal(rnp_le64_get(ring + RNP_RING_O_PROD), 0);
    assert_int_equal(rnp_ring_check_header(ring, 16, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "ring_open.slots"));
    assert_int_equal(rnp_ring_check_header(ring, 6, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "power of two"));
    assert_int_equal(rnp_ring_check_header(ring, 0, &err), RN_INVALID_ARGUMENT);
    assert_int_equal(rnp_ring_check_header(ring, 2048, &err), RN_TOO_LARGE);
    assert_int_equal(rnp_ring_check_header(NULL, 8, &err), RN_INVALID_ARGUMENT);
    ring[RNP_RING_O_MAGIC] ^= 1;
    assert_int_equal(rnp_ring_check_header(ring, 8, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "ring_open.magic"));
    rnp_ring_init(ring, 8);
    rnp_le32_put(ring + RNP_RING_O_VERSION, 2);
    assert_int_equal(rnp_ring_check_header(ring, 8, &err), RN_BAD_VERSION);
    assert_non_null(strstr(err.msg, "ring_open.version"));
    rnp_ring_init(ring, 8);
    rnp_le32_put(ring + RNP_RING_O_SLOT_SIZE, 256);
    assert_int_equal(rnp_ring_check_header(ring, 8, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "ring_open.slot_size"));
}

static void test_result(void **state)
{
    (void)state;
    uint8_t slot[RNP_RING_SLOT];
    char m[RNP_MAX_ERRMSG], longmsg[400];

    memset(slot, 0xee, sizeof slot);
    rnp_ring_put_result(slot, RN_OUT_OF_BOUNDS, "bwd.dx: bytes [0, 16) exceed region 2");
    assert_int_equal(rnp_ring_get_result(slot, m, sizeof m), RN_OUT_OF_BOUNDS);
    assert_string_equal(m, "bwd.dx: bytes [0, 16) exceed region 2");
    rnp_ring_put_result(slot, 0, NULL);
    assert_int_equal(rnp_ring_get_result(slot, m, sizeof m), 0);
    assert_string_equal(m, "");
    /* A long message is cut inside the slot; a short buffer cuts more. */
    memset(longmsg, 'a', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    rnp_ring_put_result(slot, RN_INTERNAL, longmsg);
    assert_int_equal(slot[RNP_SLOT_O_MSG + RNP_MAX_ERRMSG - 1], 0);
    assert_int_equal(rnp_ring_get_result(slot, m, sizeof m), RN_INTERNAL);
    assert_int_equal(strlen(m), RNP_MAX_ERRMSG - 1);
    assert_int_equal(rnp_ring_get_result(slot, m, 5), RN_INTERNAL);
    assert_string_equal(m, "aaaa");
    /* Whatever the bytes, the message read is printable and terminated. */
    memset(slot + RNP_SLOT_O_MSG, 0x07, RNP_RING_SLOT - RNP_SLOT_O_MSG);
    rnp_ring_get_result(slot, m, sizeof m);
    assert_int_equal(strlen(m), RNP_MAX_ERRMSG - 1);
    assert_int_equal(m[0], '?');
}

/* RING_OPEN's optional done word: both keys or neither on the wire, and a
 * request without them (what an older client sends) decodes to region 0. */
static void test_ring_open_done_word(void **state)
{
    uint8_t buf[256];
    size_t len, len_without;
    rnp_request rq, dq;

    (void)state;
    memset(&rq, 0, sizeof rq);
    rq.version = RNP_VERSION;
    rq.op = RN_OP_RING_OPEN;
    rq.id = 5;
    rq.u.ring_open.session.b[0] = 9;
    rq.u.ring_open.region.id = 3;
    rq.u.ring_open.offset = 4096;
    rq.u.ring_open.slots = 64;
    assert_int_equal(rnp_encode_request(&rq, buf, sizeof buf, &len_without, NULL), 0);
    memset(&dq, 0xa5, sizeof dq);
    assert_int_equal(rnp_decode_request(buf, len_without, &dq, NULL), 0);
    assert_int_equal(dq.u.ring_open.done_region.id, 0);
    assert_int_equal(dq.u.ring_open.done_offset, 0);
    assert_null(memmem(buf, len_without, "done_region", 11));
    rq.u.ring_open.done_region.id = 4;
    rq.u.ring_open.done_offset = 1ull << 33;
    assert_int_equal(rnp_encode_request(&rq, buf, sizeof buf, &len, NULL), 0);
    assert_true(len > len_without);
    assert_int_equal(rnp_decode_request(buf, len, &dq, NULL), 0);
    assert_int_equal(dq.u.ring_open.done_region.id, 4);
    assert_int_equal(dq.u.ring_open.done_offset, 1ull << 33);
    assert_int_equal(dq.u.ring_open.region.id, 3);
    assert_int_equal(dq.u.ring_open.slots, 64);
    assert_false(dq.u.ring_open.go);
    assert_null(memmem(buf, len, "go", 2));
    /* go: on the wire only when set */
    rq.u.ring_open.go = true;
    size_t len_go;
    assert_int_equal(rnp_encode_request(&rq, buf, sizeof buf, &len_go, NULL), 0);
    assert_int_equal(len_go, len + 4); /* (fixstr "go", true) */
    memset(&dq, 0xa5, sizeof dq);
    assert_int_equal(rnp_decode_request(buf, len_go, &dq, NULL), 0);
    assert_true(dq.u.ring_open.go);
    assert_int_equal(dq.u.ring_open.done_region.id, 4);
}

static void test_sequence(void **state)
{
    (void)state;
    /* Slots in order, wrapping at the ring's size. */
    assert_int_equal(rnp_ring_slot_off(1, 4), RNP_RING_HDR);
    assert_int_equal(rnp_ring_slot_off(4, 4), RNP_RING_HDR + 3 * RNP_RING_SLOT);
    assert_int_equal(rnp_ring_slot_off(5, 4), RNP_RING_HDR);
    assert_int_equal(rnp_ring_slot_off(1, 1), RNP_RING_HDR);
    assert_int_equal(rnp_ring_slot_off(1000001, 1), RNP_RING_HDR);
    /* A full ring: seq may be published only when seq - slots is done. */
    assert_true(rnp_ring_can_publish(1, 0, 4));
    assert_true(rnp_ring_can_publish(4, 0, 4));
    assert_false(rnp_ring_can_publish(5, 0, 4));
    assert_true(rnp_ring_can_publish(5, 1, 4));
    assert_false(rnp_ring_can_publish(9, 4, 4));
    assert_false(rnp_ring_can_publish(3, 3, 4));   /* already done: not "next" */
    /* Comparisons are modulo 2^64 ... */
    assert_true(rnp_seq_reached(5, 5));
    assert_true(rnp_seq_reached(6, 5));
    assert_false(rnp_seq_reached(4, 5));
    assert_true(rnp_seq_reached(2, UINT64_MAX));   /* done wrapped past seq */
    assert_false(rnp_seq_reached(UINT64_MAX, 2));
    assert_true(rnp_ring_can_publish(1, UINT64_MAX - 2, 4));
    assert_false(rnp_ring_can_publish(2, UINT64_MAX - 2, 4));
    assert_int_equal(rnp_ring_slot_off(0, 4), RNP_RING_HDR + 3 * RNP_RING_SLOT);
    /* ... and the low half a futex sleeps on wraps at 2^32 without harm. */
    uint64_t done = 0xffffffffull;
    assert_true(rnp_seq_reached(done + 1, 0x100000000ull));
    assert_int_equal((uint32_t)(done + 1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_validated_like_bwd),
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_result),
        cmocka_unit_test(test_ring_open_done_word),
        cmocka_unit_test(test_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
