/* SPDX-License-Identifier: MIT */
/*
 * test_proto_rules.c - the decoder's order of checks where a client written
 * from PROTOCOL.md must agree with it exactly: the version before anything
 * else of the envelope, keys before values, a key twice whether or not it is
 * known, the message size limit (op and id kept for the reply); and the
 * protocol's duplicate detection: the BWD digest and HELLO's seq_window;
 * and the checks of STATS histogram buckets (optional, whole, ascending,
 * counts adding up).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto_samples.h"

enum { S_BWD_MIN = 5, S_BWD_FULL = 6, S_BWD_SCALARS = 12, P_HELLO_CPU = 0 };

static uint8_t g_buf[RNP_MAX_RECV + 64];

/* Small hand-made messages through msgpack-c's packer. */
typedef struct mb {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mb;

static void mb_init(mb *m, uint32_t entries)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_pack_map(&m->pk, entries);
}

static void mb_key(mb *m, const char *k)
{
    msgpack_pack_str(&m->pk, strlen(k));
    msgpack_pack_str_body(&m->pk, k, strlen(k));
}

static void mb_kuint(mb *m, const char *k, uint64_t v)
{
    mb_key(m, k);
    msgpack_pack_uint64(&m->pk, v);
}

static void mb_kstr(mb *m, const char *k, const char *v)
{
    mb_key(m, k);
    mb_key(m, v);
}

/* Decode m as a request, expect want and (when want is not 0) a message
 * that contains has; free m. */
static void mb_expect(mb *m, int want, const char *has, const char *what)
{
    rnp_request q;
    rnp_error err = { 0 };
    int rc = tp_dec(false, m->sb.data, m->sb.size, &q, &err);
    if (rc != want)
        fail_msg("%s: expected %s, got %s (%s)", what, rnp_err_name(want), rnp_err_name(rc),
                 rc ? err.msg : "success");
    if (rc && has && !strstr(err.msg, has))
        fail_msg("%s: message '%s' does not name '%s'", what, err.msg, has);
    msgpack_sbuffer_destroy(&m->sb);
}

/* ---- the envelope: the version first ------------------------------------------------ */

static void test_version_before_everything(void **state)
{
    (void)state;
    mb m;
    /* Another version is BAD_VERSION whatever the other keys hold. */
    mb_init(&m, 3), mb_kuint(&m, "v", 2), mb_kstr(&m, "op", "bwd"), mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_BAD_VERSION, "v: version 2", "v 2 with a string op");
    mb_init(&m, 3), mb_kstr(&m, "op", "bwd"), mb_kstr(&m, "id", "x"), mb_kuint(&m, "v", 2);
    mb_expect(&m, RN_BAD_VERSION, "v: version 2", "v 2 last, string op and id");
    mb_init(&m, 4), mb_kuint(&m, "v", 2), mb_kuint(&m, "op", 5), mb_kuint(&m, "op", 5);
    mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_BAD_VERSION, "v: version 2", "v 2 with op twice");
    mb_init(&m, 4), mb_kuint(&m, "v", 2), mb_kuint(&m, "op", 6), mb_kuint(&m, "id", 1);
    mb_key(&m, "body"), msgpack_pack_array(&m.pk, 0);
    mb_expect(&m, RN_BAD_VERSION, "v: version 2", "v 2 with an array body");
    /* The version's own problems. */
    mb_init(&m, 3), mb_kstr(&m, "v", "1"), mb_kuint(&m, "op", 6), mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_BAD_TYPE, "v: ", "v as a string");
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", 6), mb_kuint(&m, "v", 1);
    mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_DUPLICATE_FIELD, "v: appears twice", "v twice");
    mb_init(&m, 2), mb_kstr(&m, "op", "x"), mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_MISSING_FIELD, "v: required", "no v, string op");
    /* Version 1: the envelope's keys before its values. */
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kstr(&m, "op", "x"), mb_kuint(&m, "new", 1);
    mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_UNKNOWN_FIELD, "new: unknown field", "v 1, string op, unknown key");
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kstr(&m, "op", "x"), mb_kuint(&m, "id", 1);
    mb_kuint(&m, "id", 2);
    mb_expect(&m, RN_DUPLICATE_FIELD, "id: appears twice", "v 1, string op, id twice");
    mb_init(&m, 2), mb_kuint(&m, "v", 1), mb_kstr(&m, "op", "x");
    mb_expect(&m, RN_MISSING_FIELD, "message.id", "v 1, string op, no id");
    mb_init(&m, 3), mb_kuint(&m, "v", 1), mb_kstr(&m, "op", "x"), mb_kuint(&m, "id", 1);
    mb_expect(&m, RN_BAD_TYPE, "op: ", "v 1, string op");
    mb_init(&m, 3), mb_kuint(&m, "v", 1), mb_kstr(&m, "id", "x"), mb_kuint(&m, "op", 99);
    mb_expect(&m, RN_BAD_TYPE, "id: ", "v 1, string id, unknown op: op and id types first");
}

/* ---- a key twice, known or not --------------------------------------------------------- */

static void test_duplicate_keys(void **state)
{
    (void)state;
    mb m;
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", 6), mb_kuint(&m, "id", 1);
    mb_key(&m, "body"), msgpack_pack_map(&m.pk, 2), mb_kuint(&m, "a", 1), mb_kuint(&m, "a", 2);
    mb_expect(&m, RN_DUPLICATE_FIELD, "ping.a: appears twice", "unknown body key twice");
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", 6), mb_kuint(&m, "id", 1);
    mb_key(&m, "body"), msgpack_pack_map(&m.pk, 2), mb_kuint(&m, "a", 1), mb_kuint(&m, "b", 2);
    mb_expect(&m, RN_UNKNOWN_FIELD, "ping.a: unknown field", "two unknown body keys");
    mb_init(&m, 5), mb_kuint(&m, "zz", 1), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", 6);
    mb_kuint(&m, "id", 1), mb_kstr(&m, "zz", "again");
    mb_expect(&m, RN_DUPLICATE_FIELD, "zz: appears twice", "unknown envelope key twice");
    mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", 1), mb_kuint(&m, "id", 1);
    mb_key(&m, "body"), msgpack_pack_map(&m.pk, 4), mb_kstr(&m, "client", "c");
    mb_kuint(&m, "pid", 1), mb_kuint(&m, "pid", 1), mb_kuint(&m, "x", 1);
    mb_expect(&m, RN_DUPLICATE_FIELD, "hello.pid: appears twice", "known body key twice");
}

/* RING_OPEN's done_region names a region: 0 (no region has it) is refused,
 * not taken for "absent" (the word would then be silently not written). */
static void test_ring_open_done_region_zero(void **state)
{
    (void)state;
    static const uint8_t sess[RNP_SESSION_BYTES];
    mb m;
    for (uint64_t dr = 0; dr < 2; dr++) {
        mb_init(&m, 4), mb_kuint(&m, "v", 1), mb_kuint(&m, "op", RN_OP_RING_OPEN);
        mb_kuint(&m, "id", 1), mb_key(&m, "body"), msgpack_pack_map(&m.pk, 5);
        mb_key(&m, "session"), msgpack_pack_bin(&m.pk, sizeof sess);
        msgpack_pack_bin_body(&m.pk, sess, sizeof sess);
        mb_kuint(&m, "region", 1), mb_kuint(&m, "offset", 0), mb_kuint(&m, "slots", 8);
        mb_kuint(&m, "done_region", dr);
        mb_expect(&m, dr ? 0 : RN_INVALID_ARGUMENT, "ring_open.done_region: 0 names no region",
                  "done_region");
    }
}

/* ---- the size limit ------------------------------------------------------------------------ */

/* A ping request of exactly len bytes: v, op 5 (so that op is not the
 * ping's), id 77 and an unknown key "pad" holding a bin 32, placed before
 * or after op and id. */
static void padded(size_t len, bool pad_first)
{
    static const uint8_t head[] = { 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x05, 0xa2, 'i', 'd', 0x4d };
    size_t pad_hdr = 4 + 5, k = len - 1 - sizeof head - pad_hdr;
    uint8_t *o = g_buf;
    *o++ = 0x84;
    if (!pad_first)
        memcpy(o, head, sizeof head), o += sizeof head;
    *o++ = 0xa3, *o++ = 'p', *o++ = 'a', *o++ = 'd';
    *o++ = 0xc6, *o++ = (uint8_t)(k >> 24), *o++ = (uint8_t)(k >> 16), *o++ = (uint8_t)(k >> 8),
    *o++ = (uint8_t)k;
    memset(o, 0x55, k), o += k;
    if (pad_first)
        memcpy(o, head, sizeof head), o += sizeof head;
    assert_int_equal((size_t)(o - g_buf), len);
}

static void test_size_limit(void **state)
{
    (void)state;
    static const size_t sizes[] = { RNP_MAX_MSG + 1, RNP_MAX_MSG + 4, RNP_MAX_MSG + 1000,
                                    RNP_MAX_RECV - 1, RNP_MAX_RECV };
    char want[64];
    for (int first = 0; first < 2; first++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            rnp_request q;
            rnp_error err = { 0 };
            padded(sizes[i], first);
            memset(&q, 0xee, sizeof q);
            assert_int_equal(rnp_decode_request(g_buf, sizes[i], &q, &err), RN_TOO_BIG);
            /* The reply can be addressed: op and id as read. */
            assert_int_equal(q.op, RN_OP_BWD);
            assert_int_equal(q.id, 77);
            snprintf(want, sizeof want, "message: %zu bytes, limit %u", sizes[i], RNP_MAX_MSG);
            assert_string_equal(err.msg, want);
        }
        /* At the limit the size is fine and the unknown key is the answer. */
        padded(RNP_MAX_MSG, first);
        tp_expect_code(false, g_buf, RNP_MAX_MSG, RN_UNKNOWN_FIELD, "request of RNP_MAX_MSG bytes");
    }
    /* A size check needs no structure: garbage of RNP_MAX_MSG + 1 bytes. */
    memset(g_buf, 0xc1, RNP_MAX_MSG + 1);
    tp_expect_code(false, g_buf, RNP_MAX_MSG + 1, RN_TOO_BIG, "garbage past the limit");
    tp_expect_code(false, g_buf, RNP_MAX_MSG, RN_MALFORMED, "garbage at the limit");
}

/* ---- the BWD digest ------------------------------------------------------------------------- */

static uint64_t digest_of(int sample, void (*edit)(rnp_bwd_req *))
{
    rnp_request q;
    tp_make_request(sample, &q);
    if (edit)
        edit(&q.u.bwd);
    return rnp_bwd_digest(&q.u.bwd);
}

#define EDIT(name, stmt) static void name(rnp_bwd_req *b) { stmt; }
EDIT(e_session, b->session.b[15] ^= 1)
EDIT(e_seq, b->seq++)
EDIT(e_m, b->m++)
EDIT(e_n, b->n++)
EDIT(e_x_region, b->x.region.id++)
EDIT(e_x_offset, b->x.offset += 2)
EDIT(e_x_stride, b->x.stride++)
EDIT(e_x_dtype, b->x_dtype = b->x_dtype == 1 ? 2 : 1)
EDIT(e_dy_offset, b->dy.offset += 2)
EDIT(e_dy_dtype, b->dy_dtype = b->dy_dtype == 1 ? 2 : 1)
EDIT(e_dx_offset, b->dx.offset += 2)
EDIT(e_dx_stride, b->dx.stride++)
EDIT(e_dx_dtype, b->dx_dtype = b->dx_dtype == 1 ? 2 : 1)
EDIT(e_w_offset, b->w.offset += 2)
EDIT(e_w_dtype, b->w_dtype = b->w_dtype == 1 ? 2 : 1)
EDIT(e_no_w, (b->has_w = false, memset(&b->w, 0, sizeof b->w), b->w_dtype = 0))
EDIT(e_rstd_region, b->rstd.region.id++)
EDIT(e_no_rstd, (b->has_rstd = false, memset(&b->rstd, 0, sizeof b->rstd)))
EDIT(e_dres_stride, b->dres.stride++)
EDIT(e_dres_dtype, b->dres_dtype = b->dres_dtype == 1 ? 2 : 1)
EDIT(e_dw_offset, b->dw.offset += 4)
EDIT(e_dw_dtype, b->dw_dtype = b->dw_dtype == 1 ? 2 : 1)
EDIT(e_no_dw, (b->has_dw = false, memset(&b->dw, 0, sizeof b->dw), b->dw_dtype = 0))
EDIT(e_eps, b->eps *= 2)
EDIT(e_woff, b->weight_offset += 1)
EDIT(e_ready, b->ready_slot++)
EDIT(e_mode, b->mode ^= 1)
EDIT(e_ordering, b->ordering++)
/* What the digest leaves out: the 1-D tensors' strides (not on the wire),
 * the sign of a zero weight_offset. */
EDIT(e_w_stride, b->w.stride = 99)
EDIT(e_woff_neg_zero, b->weight_offset = -0.0f)
EDIT(e_woff_zero, b->weight_offset = 0.0f)

static void test_bwd_digest(void **state)
{
    (void)state;
    static void (*const changes[])(rnp_bwd_req *) = {
        e_session, e_seq, e_m, e_n, e_x_region, e_x_offset, e_x_stride, e_x_dtype, e_dy_offset,
        e_dy_dtype, e_dx_offset, e_dx_stride, e_dx_dtype, e_w_offset, e_w_dtype, e_no_w,
        e_rstd_region, e_no_rstd, e_dres_stride, e_dres_dtype, e_dw_offset, e_dw_dtype, e_no_dw,
        e_eps, e_woff, e_ready, e_mode, e_ordering,
    };
    uint64_t full = digest_of(S_BWD_FULL, NULL);
    assert_int_not_equal(full, 0);
    assert_int_not_equal(full, digest_of(S_BWD_MIN, NULL));
    for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++)
        if (digest_of(S_BWD_FULL, changes[i]) == full)
            fail_msg("edit %zu of bwd-full does not change the digest", i);
    assert_int_equal(digest_of(S_BWD_FULL, e_w_stride), full);
    assert_int_equal(digest_of(S_BWD_SCALARS, e_woff_neg_zero),
                     digest_of(S_BWD_SCALARS, e_woff_zero));
    assert_int_equal(rnp_bwd_digest(NULL), 0);

    /* Over the decoded fields, never the struct's bytes: the same request
     * decoded into memory of different garbage, with another message id,
     * has the same digest. */
    rnp_request q, a, b;
    rnp_error err;
    tp_make_request(S_BWD_FULL, &q);
    size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
    memset(&a, 0x00, sizeof a);
    assert_int_equal(rnp_decode_request(g_buf, len, &a, &err), 0);
    q.id ^= 0xffff;
    len = tp_enc_req(&q, g_buf, sizeof g_buf);
    memset(&b, 0xa5, sizeof b);
    assert_int_equal(rnp_decode_request(g_buf, len, &b, &err), 0);
    memset(&b.u.bwd.w.stride, 0x5a, sizeof b.u.bwd.w.stride);
    assert_int_equal(rnp_bwd_digest(&a.u.bwd), rnp_bwd_digest(&b.u.bwd));
    assert_int_equal(rnp_bwd_digest(&a.u.bwd), full);
}

/* ---- HELLO's seq_window ---------------------------------------------------------------------- */

static void test_seq_window(void **state)
{
    (void)state;
    static rnp_reply p, back;
    rnp_error err;
    tp_make_reply(P_HELLO_CPU, &p);
    p.u.hello.limits.seq_window = 4096;
    size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
    assert_int_equal(rnp_decode_reply(g_buf, len, &back, &err), 0);
    assert_int_equal(back.u.hello.limits.seq_window, 4096);

    /* A 0.1.0 daemon does not send it: the reply decodes, with 0. */
    static const char key[] = "\xaa" "seq_window", lim[] = "\xa6" "limits\x89";
    uint8_t *k = memmem(g_buf, len, key, sizeof key - 1);
    uint8_t *l = memmem(g_buf, len, lim, sizeof lim - 1);
    assert_non_null(k), assert_non_null(l);
    size_t cut = sizeof key - 1 + 3; /* the key and "cd 10 00" (uint 16 4096) */
    assert_int_equal(k[sizeof key - 1], 0xcd);
    memmove(k, k + cut, len - (size_t)(k - g_buf) - cut);
    len -= cut;
    l[sizeof lim - 2] = 0x88;
    memset(&back, 0xee, sizeof back);
    assert_int_equal(rnp_decode_reply(g_buf, len, &back, &err), 0);
    assert_int_equal(back.u.hello.limits.seq_window, 0);
    assert_int_equal(back.u.hello.limits.event_slots, p.u.hello.limits.event_slots);
}

/* ---- STATS histograms with buckets -------------------------------------------------------- */

/* A STATS reply with one histogram "total" of count values: fields sum and
 * buckets as given (has_sum, nb: -1 leaves the key out), the bucket records
 * as raw bytes. */
static void stats_one_hist(mb *m, uint64_t count, bool has_sum, const uint8_t *bk, int nb)
{
    mb_init(m, 5);
    mb_kuint(m, "v", RNP_VERSION);
    mb_kuint(m, "op", RN_OP_STATS);
    mb_kuint(m, "id", 1);
    mb_kuint(m, "status", 0);
    mb_key(m, "body");
    msgpack_pack_map(&m->pk, 4);
    mb_kstr(m, "backend", "cpu");
    mb_kstr(m, "device", "cpu");
    mb_key(m, "counters");
    msgpack_pack_map(&m->pk, 0);
    mb_key(m, "hists");
    msgpack_pack_map(&m->pk, 1);
    mb_key(m, "total");
    msgpack_pack_map(&m->pk, 5 + has_sum + (nb >= 0));
    mb_kuint(m, "count", count);
    mb_kuint(m, "p50", 1), mb_kuint(m, "p90", 1), mb_kuint(m, "p99", 1), mb_kuint(m, "max", 1);
    if (has_sum)
        mb_kuint(m, "sum", 12345);
    if (nb >= 0) {
        mb_key(m, "buckets");
        msgpack_pack_bin(&m->pk, (size_t)nb);
        msgpack_pack_bin_body(&m->pk, bk, (size_t)nb);
    }
}

static void reply_expect(mb *m, int want, const char *has, const char *what, rnp_reply *out)
{
    rnp_error err = { 0 };
    int rc = tp_dec(true, m->sb.data, m->sb.size, out, &err);
    if (rc != want)
        fail_msg("%s: expected %s, got %s (%s)", what, rnp_err_name(want), rnp_err_name(rc),
                 rc ? err.msg : "success");
    if (rc && has && !strstr(err.msg, has))
        fail_msg("%s: message '%s' does not name '%s'", what, err.msg, has);
    msgpack_sbuffer_destroy(&m->sb);
}

/* Bucket records (upper, count) as the wire has them. */
static int put_buckets(uint8_t *b, const uint64_t (*v)[2], int n)
{
    for (int k = 0; k < n; k++) {
        rnp_le64_put(b + 16 * k, v[k][0]);
        rnp_le64_put(b + 16 * k + 8, v[k][1]);
    }
    return 16 * n;
}

static void test_stats_buckets(void **state)
{
    (void)state;
    static rnp_reply out;
    static uint8_t b[(RNP_MAX_BUCKETS + 1) * 16];
    mb m;
    const uint64_t good[][2] = { { 7, 1 }, { 1023, 5 }, { UINT64_MAX, 4 } };
    int len = put_buckets(b, good, 3);

    stats_one_hist(&m, 10, true, b, len);
    reply_expect(&m, 0, NULL, "three buckets", &out);
    assert_true(out.u.stats.hists[0].has_buckets);
    assert_int_equal(out.u.stats.hists[0].nbuckets, 3);
    assert_int_equal(out.u.stats.hists[0].sum, 12345);
    assert_int_equal(out.u.stats.hists[0].buckets[1].upper, 1023);
    assert_int_equal(out.u.stats.hists[0].buckets[2].count, 4);

    /* An older daemon sends neither key: no buckets, and that is no error. */
    stats_one_hist(&m, 10, false, NULL, -1);
    reply_expect(&m, 0, NULL, "no buckets", &out);
    assert_false(out.u.stats.hists[0].has_buckets);
    assert_int_equal(out.u.stats.hists[0].nbuckets, 0);

    /* An empty histogram has an empty bin. */
    stats_one_hist(&m, 0, true, b, 0);
    reply_expect(&m, 0, NULL, "empty", &out);
    assert_true(out.u.stats.hists[0].has_buckets);

    /* One without the other. */
    stats_one_hist(&m, 10, false, b, len);
    reply_expect(&m, RN_MISSING_FIELD, "stats.hists.total.sum", "buckets without sum", &out);
    stats_one_hist(&m, 10, true, NULL, -1);
    reply_expect(&m, RN_MISSING_FIELD, "stats.hists.total.buckets", "sum without buckets", &out);

    /* Counts must add up to count, exactly. */
    stats_one_hist(&m, 11, true, b, len);
    reply_expect(&m, RN_INVALID_ARGUMENT, "add up to 10, count is 11", "counts short", &out);
    const uint64_t wrap[][2] = { { 7, UINT64_MAX }, { 9, 2 } };
    stats_one_hist(&m, 1, true, b, put_buckets(b, wrap, 2));
    reply_expect(&m, RN_INVALID_ARGUMENT, "overflow", "counts wrap", &out);

    /* Bounds strictly ascending. */
    const uint64_t same[][2] = { { 7, 1 }, { 7, 1 } }, down[][2] = { { 9, 1 }, { 8, 1 } };
    stats_one_hist(&m, 2, true, b, put_buckets(b, same, 2));
    reply_expect(&m, RN_INVALID_ARGUMENT, "bucket 1: upper bound 7", "equal bounds", &out);
    stats_one_hist(&m, 2, true, b, put_buckets(b, down, 2));
    reply_expect(&m, RN_INVALID_ARGUMENT, "not above the previous 9", "descending", &out);

    /* Whole records only, and at most RNP_MAX_BUCKETS of them. */
    len = put_buckets(b, good, 3);
    stats_one_hist(&m, 10, true, b, len - 1);
    reply_expect(&m, RN_INVALID_ARGUMENT, "not whole 16-byte buckets", "a cut record", &out);
    uint64_t many[RNP_MAX_BUCKETS + 1][2];
    for (int k = 0; k <= RNP_MAX_BUCKETS; k++)
        many[k][0] = (uint64_t)k, many[k][1] = 1;
    stats_one_hist(&m, RNP_MAX_BUCKETS, true, b, put_buckets(b, many, RNP_MAX_BUCKETS));
    reply_expect(&m, 0, NULL, "the limit", &out);
    assert_int_equal(out.u.stats.hists[0].nbuckets, RNP_MAX_BUCKETS);
    stats_one_hist(&m, RNP_MAX_BUCKETS + 1, true, b, put_buckets(b, many, RNP_MAX_BUCKETS + 1));
    reply_expect(&m, RN_TOO_BIG, "65 buckets, limit 64", "over the limit", &out);

    /* Buckets of another type: the bin 8 header of the 48 bytes made a str 8. */
    stats_one_hist(&m, 10, true, b, len);
    uint8_t *bin = memmem(m.sb.data, m.sb.size, "\xc4\x30", 2);
    assert_non_null(bin);
    bin[0] = 0xd9;
    reply_expect(&m, RN_BAD_TYPE, "stats.hists.total.buckets", "buckets as a string", &out);
}

/* The largest STATS reply (every counter and histogram, names of 47 bytes,
 * 64 buckets each) still fits RNP_MAX_MSG, and decodes. */
static void test_stats_largest(void **state)
{
    (void)state;
    static rnp_reply p, back;
    static uint8_t buf[RNP_MAX_MSG];
    rnp_error err = { 0 };
    size_t len;
    p.version = RNP_VERSION, p.op = RN_OP_STATS;
    rnp_stats_rep *s = &p.u.stats;
    memset(s->backend, 'b', RNP_MAX_NAME - 1);
    memset(s->device, 'd', RNP_MAX_NAME - 1);
    for (uint32_t i = 0; i < RNP_MAX_STATS; i++) {
        snprintf(s->stats[i].name, RNP_STAT_NAME, "%02u%045u", i, 0u);
        s->stats[i].value = UINT64_MAX;
    }
    s->nstats = RNP_MAX_STATS;
    for (uint32_t i = 0; i < RNP_MAX_HISTS; i++) {
        rnp_hist *h = &s->hists[i];
        snprintf(h->name, RNP_STAT_NAME, "%02u%045u", i, 0u);
        h->count = h->p50 = h->p90 = h->p99 = h->max = h->sum = UINT64_MAX - 1;
        h->has_buckets = true;
        h->nbuckets = RNP_MAX_BUCKETS;
        for (uint32_t k = 0; k < RNP_MAX_BUCKETS; k++)
            h->buckets[k] = (rnp_bucket){ .upper = UINT64_MAX - RNP_MAX_BUCKETS + k,
                                          .count = k ? 0 : UINT64_MAX - 1 };
    }
    s->nhists = RNP_MAX_HISTS;
    assert_int_equal(rnp_encode_reply(&p, buf, sizeof buf, &len, &err), 0);
    assert_true(len < RNP_MAX_MSG / 2);
    assert_int_equal(rnp_decode_reply(buf, len, &back, &err), 0);
    assert_int_equal(back.u.stats.hists[RNP_MAX_HISTS - 1].nbuckets, RNP_MAX_BUCKETS);
}

/* ---- PROTOCOL.md agrees with the code ---------------------------------------------------- */

static char *read_protocol_md(void)
{
    const char *src = getenv("RN_SRC");
    char path[4096];
    if (!src)
        return NULL;
    snprintf(path, sizeof path, "%s/proto/PROTOCOL.md", src);
    char *text = rn_test_read_file(path, NULL);
    if (!text)
        fail_msg("cannot open %s", path);
    return text;
}

/* Every status code of rn_wire.h is a row of section 6's table, and every
 * key of HELLO's limits as encoded is a row of section 4.1's. */
static void test_protocol_md_tables(void **state)
{
    (void)state;
    char *md = read_protocol_md(), row[128];
    if (!md)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
#define ROW_(code, name, msg)                                                   \
    snprintf(row, sizeof row, "| %d | `RN_%s` |", code, #name);                 \
    if (code != 0 && !strstr(md, row))                                          \
        fail_msg("PROTOCOL.md section 6 has no row '%s'", row);
    RN_ERRORS(ROW_)
#undef ROW_

    static rnp_reply p;
    tp_make_reply(P_HELLO_CPU, &p);
    size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)g_buf, len, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *limits = NULL;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
        if (kv->key.via.str.size == 4 && memcmp(kv->key.via.str.ptr, "body", 4) == 0)
            for (uint32_t j = 0; j < kv->val.via.map.size; j++)
                if (kv->val.via.map.ptr[j].key.via.str.size == 6 &&
                    memcmp(kv->val.via.map.ptr[j].key.via.str.ptr, "limits", 6) == 0)
                    limits = &kv->val.via.map.ptr[j].val;
    }
    assert_non_null(limits);
    for (uint32_t i = 0; i < limits->via.map.size; i++) {
        const msgpack_object_str *k = &limits->via.map.ptr[i].key.via.str;
        snprintf(row, sizeof row, "| `%.*s` ", (int)k->size, k->ptr);
        if (!strstr(md, row))
            fail_msg("PROTOCOL.md section 4.1 has no limits row '%s'", row);
    }
    msgpack_unpacked_destroy(&u);
    free(md);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_before_everything),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_ring_open_done_region_zero),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_bwd_digest),
        cmocka_unit_test(test_seq_window),
        cmocka_unit_test(test_stats_buckets),
        cmocka_unit_test(test_stats_largest),
        cmocka_unit_test(test_protocol_md_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
