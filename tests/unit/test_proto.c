/* SPDX-License-Identifier: MIT */
/*
 * test_proto.c - the wire protocol's encoder and decoder (proto/): round trips
 * of every message, and the decoder's answer to bad input as a whole:
 * truncation at every byte, huge counts, trailing bytes, the message size
 * limit, the envelope, alternative msgpack encodings.  Every field's own
 * mutations are test_proto_mutations.c, its limits test_proto_bounds.c.
 *
 * Run with --write-corpus DIR to write every sample message to DIR (the
 * fuzzers' seed corpus, tests/fuzz/corpus); test_corpus_fresh checks that the
 * checked-in corpus matches what the encoder produces now.
 */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto_samples.h"

static uint8_t g_buf[RNP_MAX_MSG + 64];

/* ---- round trips -------------------------------------------------------------------- */

static void test_round_trip_requests(void **state)
{
    (void)state;
    for (int i = 0; i < TP_NREQ; i++) {
        rnp_request q, back;
        rnp_error err = { 0 };
        const char *name = tp_make_request(i, &q);
        size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
        memset(&back, 0xa5, sizeof back);
        int rc = rnp_decode_request(g_buf, len, &back, &err);
        if (rc)
            fail_msg("%s: %s", name, err.msg);
        if (memcmp(&q, &back, sizeof q) != 0)
            fail_msg("%s: decoded request differs", name);
        /* A second encoding is byte-identical. */
        static uint8_t again[RNP_MAX_MSG];
        size_t len2 = tp_enc_req(&back, again, sizeof again);
        assert_int_equal(len, len2);
        assert_memory_equal(g_buf, again, len);
    }
}

static void test_round_trip_replies(void **state)
{
    (void)state;
    for (int i = 0; i < TP_NREP; i++) {
        static rnp_reply p, back;
        rnp_error err = { 0 };
        const char *name = tp_make_reply(i, &p);
        size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
        memset(&back, 0xa5, sizeof back);
        int rc = rnp_decode_reply(g_buf, len, &back, &err);
        if (rc)
            fail_msg("%s: %s", name, err.msg);
        if (memcmp(&p, &back, sizeof p) != 0)
            fail_msg("%s: decoded reply differs", name);
    }
}

/* The absent optional fields of BWD decode to their documented defaults. */
static void test_bwd_defaults(void **state)
{
    (void)state;
    rnp_request q, back;
    rnp_error err;
    tp_make_request(5, &q);
    size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
    assert_int_equal(rnp_decode_request(g_buf, len, &back, &err), 0);
    assert_int_equal(back.u.bwd.ready_slot, -1);
    assert_int_equal(back.u.bwd.mode, RNP_MODE_ASYNC);
    assert_int_equal(back.u.bwd.ordering, RNP_ORDER_EVENTS);
    assert_true(back.u.bwd.weight_offset == 0.0f);
    assert_false(back.u.bwd.has_w || back.u.bwd.has_rstd || back.u.bwd.has_dres || back.u.bwd.has_dw);
    assert_int_equal(back.u.bwd.w_dtype, RN_DTYPE_NONE);
}

/* ---- truncation, trailing bytes, sizes ------------------------------------------------ */

static void truncate_all(bool reply, const uint8_t *msg, size_t len, const char *name)
{
    for (size_t k = 0; k < len; k++) {
        /* A fresh heap copy of exactly k bytes, so ASAN sees any read past it. */
        uint8_t *cut = malloc(k ? k : 1);
        assert_non_null(cut);
        memcpy(cut, msg, k);
        static rnp_reply out;
        rnp_error err = { 0 };
        int rc = tp_dec(reply, cut, k, &out, &err);
        if (rc == 0)
            fail_msg("%s truncated to %zu of %zu bytes decoded", name, k, len);
        free(cut);
    }
}

static void test_truncated_everywhere(void **state)
{
    (void)state;
    for (int i = 0; i < TP_NREQ; i++) {
        rnp_request q;
        const char *name = tp_make_request(i, &q);
        size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
        truncate_all(false, g_buf, len, name);
    }
    for (int i = 0; i < TP_NREP; i++) {
        static rnp_reply p;
        const char *name = tp_make_reply(i, &p);
        size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
        truncate_all(true, g_buf, len, name);
    }
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    rnp_request q;
    tp_make_request(0, &q);
    size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
    g_buf[len] = 0xc0; /* nil */
    tp_expect_code(false, g_buf, len + 1, RN_TRAILING_BYTES, "one nil after hello");
    memcpy(g_buf + len, g_buf, len); /* the same message twice */
    tp_expect_code(false, g_buf, 2 * len, RN_TRAILING_BYTES, "hello twice");
    static rnp_reply p;
    tp_make_reply(7, &p);
    len = tp_enc_rep(&p, g_buf, sizeof g_buf);
    g_buf[len] = 0;
    tp_expect_code(true, g_buf, len + 1, RN_TRAILING_BYTES, "ping reply + 0");
    tp_expect_code(false, g_buf, 0, RN_MALFORMED, "empty message");
    tp_expect_code(true, g_buf, 0, RN_MALFORMED, "empty reply");
}

/* Headers that claim far more elements or bytes than follow: msgpack-c
 * itself would try to allocate for them.  Under ASAN any such allocation
 * would fail loudly; here it must simply be rejected. */
static void test_huge_counts(void **state)
{
    (void)state;
    static const struct { uint8_t b[8]; size_t n; const char *what; } raw[] = {
        { { 0xdd, 0xff, 0xff, 0xff, 0xff }, 5, "array32 of 2^32-1" },
        { { 0xdf, 0xff, 0xff, 0xff, 0xff }, 5, "map32 of 2^32-1" },
        { { 0xdc, 0xff, 0xff }, 3, "array16 of 65535" },
        { { 0xde, 0xff, 0xff }, 3, "map16 of 65535" },
        { { 0xdb, 0xff, 0xff, 0xff, 0xff }, 5, "str32 of 4 GiB" },
        { { 0xc6, 0xff, 0xff, 0xff, 0xff }, 5, "bin32 of 4 GiB" },
        { { 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01 }, 6, "ext32 of 4 GiB" },
        { { 0x81, 0xdd, 0x7f, 0xff, 0xff, 0xff }, 6, "map with an array32 key" },
        { { 0x8f }, 1, "fixmap of 15 with nothing after" },
        { { 0xc1 }, 1, "reserved byte" },
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        tp_expect_code(false, raw[i].b, raw[i].n, RN_MALFORMED, raw[i].what);
        tp_expect_code(true, raw[i].b, raw[i].n, RN_MALFORMED, raw[i].what);
    }
    /* A valid envelope whose body is an array32 claiming 2^32-1 elements. */
    static const uint8_t env[] = { 0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x05, 0xa2, 'i', 'd', 0x2a,
                                   0xa4, 'b', 'o', 'd', 'y', 0xdd, 0xff, 0xff, 0xff, 0xff };
    tp_expect_code(false, env, sizeof env, RN_MALFORMED, "body array32 of 2^32-1");
    rnp_request out = { 0 };
    rnp_error err;
    assert_int_equal(rnp_decode_request(env, sizeof env, &out, &err), RN_MALFORMED);
    assert_int_equal(out.op, 5); /* the header is still readable for the error reply */
    assert_int_equal(out.id, 42);
}

/* Decoding and encoding allocate nothing, whatever a header claims: the
 * heap's in-use bytes are the same before and after.  (Under ASAN, whose
 * allocator glibc's counters do not see, the huge-count test above is the
 * check that matters.) */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void test_no_allocation(void **state)
{
    (void)state;
    static const uint8_t huge[] = { 0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x05, 0xa2, 'i', 'd', 0x2a,
                                    0xa4, 'b', 'o', 'd', 'y', 0xdf, 0xff, 0xff, 0xff, 0xff };
    static rnp_reply p;
    rnp_request q;
    rnp_error err;
    size_t len, n;
    for (int i = 0; i < TP_NREQ + TP_NREP; i++) {
        if (i < TP_NREQ) {
            tp_make_request(i, &q);
            len = tp_enc_req(&q, g_buf, sizeof g_buf);
        } else {
            tp_make_reply(i - TP_NREQ, &p);
            len = tp_enc_rep(&p, g_buf, sizeof g_buf);
        }
        size_t before = heap_in_use();
        if (i < TP_NREQ) {
            assert_int_equal(rnp_decode_request(g_buf, len, &q, &err), 0);
            assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &n, &err), 0);
        } else {
            assert_int_equal(rnp_decode_reply(g_buf, len, &p, &err), 0);
            assert_int_equal(rnp_encode_reply(&p, g_buf, sizeof g_buf, &n, &err), 0);
        }
        assert_int_equal(rnp_decode_request(huge, sizeof huge, &q, &err), RN_MALFORMED);
        assert_int_equal(rnp_decode_reply(huge, sizeof huge, &p, &err), RN_MALFORMED);
        assert_int_equal(heap_in_use(), before);
    }
}

static void test_message_size_limit(void **state)
{
    (void)state;
    /* A ping reply padded with an unknown key (replies skip unknown keys)
     * to exactly RNP_MAX_MSG bytes decodes; one byte more does not. */
    static rnp_reply p;
    tp_make_reply(7, &p);
    size_t len = tp_enc_rep(&p, g_buf, sizeof g_buf);
    /* Rebuild: fixmap count + 1, then "pad": bin32 of k bytes. */
    size_t pad_hdr = 4 + 5; /* "pad" key (fixstr 3) + bin32 header */
    size_t k = RNP_MAX_MSG - len - pad_hdr;
    memmove(g_buf + 1 + pad_hdr + k, g_buf + 1, len - 1);
    g_buf[0]++;
    uint8_t *o = g_buf + 1;
    *o++ = 0xa3, *o++ = 'p', *o++ = 'a', *o++ = 'd';
    *o++ = 0xc6, *o++ = (uint8_t)(k >> 24), *o++ = (uint8_t)(k >> 16), *o++ = (uint8_t)(k >> 8),
    *o++ = (uint8_t)k;
    memset(o, 0x55, k);
    tp_expect_code(true, g_buf, RNP_MAX_MSG, 0, "reply of exactly RNP_MAX_MSG bytes");
    tp_expect_code(true, g_buf, RNP_MAX_MSG + 1, RN_TOO_BIG, "reply of RNP_MAX_MSG + 1 bytes");
    tp_expect_code(false, g_buf, RNP_MAX_MSG + 1, RN_TOO_BIG, "request of RNP_MAX_MSG + 1 bytes");
}

static void test_encode_buffer_too_small(void **state)
{
    (void)state;
    rnp_request q;
    rnp_error err;
    size_t len = 0, full;
    tp_make_request(6, &q);
    full = tp_enc_req(&q, g_buf, sizeof g_buf);
    for (size_t cap = 0; cap < full; cap++) {
        len = 12345;
        assert_int_equal(rnp_encode_request(&q, g_buf, cap, &len, &err), RN_TOO_BIG);
        assert_int_equal(len, 12345); /* untouched on failure */
    }
    assert_int_equal(rnp_encode_request(&q, g_buf, full, &len, &err), 0);
    assert_int_equal(len, full);
    /* Unknown op, string not terminated, too many handles. */
    q.op = 0;
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
    tp_make_request(0, &q);
    memset(q.u.hello.client_name, 'a', RNP_MAX_NAME);
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "hello.client"));
    tp_make_request(4, &q);
    q.u.events.n = RNP_MAX_EVENTS + 1;
    assert_int_equal(rnp_encode_request(&q, g_buf, sizeof g_buf, &len, &err), RN_INVALID_ARGUMENT);
}

/* ---- envelope ------------------------------------------------------------------------- */

/* Small hand-made messages through msgpack-c's packer. */
typedef struct mb {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mb;

static void mb_init(mb *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mb_key(mb *m, const char *k)
{
    msgpack_pack_str(&m->pk, strlen(k));
    msgpack_pack_str_body(&m->pk, k, strlen(k));
}

static void test_envelope_errors(void **state)
{
    (void)state;
    struct { int v, op, id, body; int want; const char *what; } cases[] = {
        { 1, 6, 9, 0, 0, "ping" },
        { 2, 6, 9, 0, RN_BAD_VERSION, "version 2" },
        { 0, 6, 9, 0, RN_BAD_VERSION, "version 0" },
        { -1, 6, 9, 0, RN_MISSING_FIELD, "no version" },
        { 1, 0, 9, 0, RN_UNKNOWN_OP, "op 0" },
        { 1, RN_OP_MAX + 1, 9, 0, RN_UNKNOWN_OP, "op past the last" },
        { 1, -1, 9, 0, RN_MISSING_FIELD, "no op" },
        { 1, 6, -1, 0, RN_MISSING_FIELD, "no id" },
        { 1, 1, 9, 0, RN_MISSING_FIELD, "hello without body" },
        { 1, 6, 9, 1, 0, "ping with an empty body" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mb m;
        mb_init(&m);
        msgpack_pack_map(&m.pk, (cases[i].v >= 0) + (cases[i].op >= 0) + (cases[i].id >= 0) +
                                    cases[i].body);
        if (cases[i].v >= 0)
            mb_key(&m, "v"), msgpack_pack_int(&m.pk, cases[i].v);
        if (cases[i].op >= 0)
            mb_key(&m, "op"), msgpack_pack_int(&m.pk, cases[i].op);
        if (cases[i].id >= 0)
            mb_key(&m, "id"), msgpack_pack_int(&m.pk, cases[i].id);
        if (cases[i].body)
            mb_key(&m, "body"), msgpack_pack_map(&m.pk, 0);
        tp_expect_code(false, m.sb.data, m.sb.size, cases[i].want, cases[i].what);
        rnp_request out;
        rnp_error err;
        memset(&out, 0xee, sizeof out);
        int rc = rnp_decode_request(m.sb.data, m.sb.size, &out, &err);
        /* op and id of a failed decode: as read, or 0. */
        if (rc) {
            assert_int_equal(out.op, cases[i].op >= 0 ? (uint32_t)cases[i].op : 0);
            assert_int_equal(out.id, cases[i].id >= 0 ? (uint64_t)cases[i].id : 0);
        }
        msgpack_sbuffer_destroy(&m.sb);
    }
    /* The top level must be a map; op too large for 32 bits. */
    static const uint8_t arr[] = { 0x90 };
    tp_expect_code(false, arr, 1, RN_BAD_TYPE, "top-level array");
    static const uint8_t big_op[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xcf, 0, 0, 0, 1, 0, 0, 0, 5,
                                      0xa2, 'i', 'd', 0x01 };
    tp_expect_code(false, big_op, sizeof big_op, RN_BAD_TYPE, "op of 2^32 + 5");
    /* A version check comes before anything else: a v2 message with an
     * unknown envelope key is BAD_VERSION, not UNKNOWN_FIELD. */
    static const uint8_t v2[] = { 0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd', 0x01,
                                  0xa3, 'n', 'e', 'w', 0xc0 };
    tp_expect_code(false, v2, sizeof v2, RN_BAD_VERSION, "v2 with a new key");
}

/* Any msgpack format of the right family is accepted: signed formats for
 * non-negative values, wide formats for small values, str 8/16 keys, map 16,
 * float 64 (as other msgpack libraries write them). */
static void test_alternative_encodings(void **state)
{
    (void)state;
    static const uint8_t ping[] = {
        0xde, 0x00, 0x04,                         /* map 16 of 4 */
        0xd9, 0x01, 'v', 0xd0, 0x01,              /* str 8 "v" -> int 8 1 */
        0xda, 0x00, 0x02, 'o', 'p', 0xd1, 0x00, 0x06,  /* str 16 "op" -> int 16 6 */
        0xa2, 'i', 'd', 0xcf, 0, 0, 0, 0, 0, 0, 0, 9,  /* "id" -> uint 64 9 */
        0xa4, 'b', 'o', 'd', 'y', 0xdf, 0, 0, 0, 0,    /* "body" -> map 32 of 0 */
    };
    rnp_request q;
    rnp_error err;
    assert_int_equal(rnp_decode_request(ping, sizeof ping, &q, &err), 0);
    assert_int_equal(q.op, RN_OP_PING);
    assert_int_equal(q.id, 9);
    /* hello with client as str 8 and pid as int 32; body keys reordered. */
    static const uint8_t hello[] = {
        0x84, 0xa4, 'b', 'o', 'd', 'y',
        0x82, 0xa3, 'p', 'i', 'd', 0xd2, 0x00, 0x00, 0x10, 0x92,
              0xa6, 'c', 'l', 'i', 'e', 'n', 't', 0xd9, 0x02, 'p', 'y',
        0xa2, 'i', 'd', 0x00, 0xa2, 'o', 'p', 0x01, 0xa1, 'v', 0x01,
    };
    assert_int_equal(rnp_decode_request(hello, sizeof hello, &q, &err), 0);
    assert_int_equal(q.u.hello.pid, 0x1092);
    assert_string_equal(q.u.hello.client_name, "py");
    /* A negative number in a signed format where an unsigned one is due. */
    static const uint8_t neg_id[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd',
                                      0xd0, 0xff };
    tp_expect_code(false, neg_id, sizeof neg_id, RN_BAD_TYPE, "id of -1");
    /* Extensions are never valid values. */
    static const uint8_t ext_id[] = { 0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x06, 0xa2, 'i', 'd',
                                      0xd4, 0x01, 0x05 };
    tp_expect_code(false, ext_id, sizeof ext_id, RN_BAD_TYPE, "id as fixext 1");
}

/* ---- the fuzzer's seed corpus -------------------------------------------------------- */

/* Encoding of sample k: requests first, then replies.  Returns its length
 * and sets *name to the corpus file name, or returns 0 past the last. */
static size_t sample_bytes(int k, uint8_t *buf, size_t cap, char *name, size_t namecap)
{
    if (k < TP_NREQ) {
        rnp_request q;
        snprintf(name, namecap, "req-%s.msgpack", tp_make_request(k, &q));
        return tp_enc_req(&q, buf, cap);
    }
    if (k < TP_NREQ + TP_NREP) {
        static rnp_reply p;
        snprintf(name, namecap, "rep-%s.msgpack", tp_make_reply(k - TP_NREQ, &p));
        return tp_enc_rep(&p, buf, cap);
    }
    return 0;
}

static int write_corpus(const char *dir)
{
    char name[128], path[4096];
    size_t len;
    for (int k = 0; (len = sample_bytes(k, g_buf, sizeof g_buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(g_buf, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        printf("%s\n", path);
    }
    return 0;
}

/* The checked-in seed corpus is what the encoder produces now (regenerate
 * it with --write-corpus tests/fuzz/corpus after a protocol change). */
static void test_corpus_fresh(void **state)
{
    (void)state;
    const char *src = getenv("RN_SRC");
    char name[128], path[4096];
    size_t len;
    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    for (int k = 0; (len = sample_bytes(k, g_buf, sizeof g_buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/tests/fuzz/corpus/%s", src, name);
        size_t n = 0;
        char *file = rn_test_read_file(path, &n);
        if (!file)
            fail_msg("%s is missing: run test_proto --write-corpus tests/fuzz/corpus", path);
        bool same = n == len && memcmp(file, g_buf, len) == 0;
        free(file);
        if (!same)
            fail_msg("%s is stale: run test_proto --write-corpus tests/fuzz/corpus", path);
    }
}

/* The worked example of PROTOCOL.md section 10: its three hex dumps are
 * what the encoder produces for these structs. */
static void doc_example(rnp_request *q, rnp_reply *ok, rnp_reply *bad)
{
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION, q->op = RN_OP_BWD, q->id = 42;
    rnp_bwd_req *b = &q->u.bwd;
    for (int i = 0; i < RNP_SESSION_BYTES; i++)
        b->session.b[i] = (uint8_t)(0xa0 + i);
    b->seq = 7, b->m = 2, b->n = 4;
    b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_BF16;
    tp_set_tensor(&b->x, 1, 0, 4);
    tp_set_tensor(&b->dy, 1, 16, 4);
    tp_set_tensor(&b->dx, 2, 0, 4);
    b->has_w = true, b->w_dtype = RN_DTYPE_BF16;
    tp_set_tensor(&b->w, 2, 64, 0);
    b->eps = 1e-6f, b->ready_slot = -1, b->mode = RNP_MODE_SYNC;
    memset(ok, 0, sizeof *ok);
    ok->version = RNP_VERSION, ok->op = RN_OP_BWD, ok->id = 42;
    ok->u.bwd = (rnp_bwd_rep){ .seq = 7, .done_slot = -1, .queue_ns = 1200, .compute_ns = 35000 };
    rnp_reply_error(bad, q, RN_OUT_OF_BOUNDS, "bwd.dx: bytes [0, 16) exceed region 2 of 8 bytes");
}

static void test_protocol_md_example(void **state)
{
    (void)state;
    const char *src = getenv("RN_SRC");
    char path[4096], line[512];
    static uint8_t dumps[3][512];
    size_t lens[3] = { 0 };
    int nd = -1;
    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    snprintf(path, sizeof path, "%s/proto/PROTOCOL.md", src);
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    /* Hex dump lines: "0000  84 a1 ..."; a dump starts at offset 0000. */
    while (fgets(line, sizeof line, f)) {
        unsigned off;
        int used;
        bool hex4 = true;
        for (int k = 0; k < 4; k++)
            hex4 = hex4 && strchr("0123456789abcdef", line[k]) && line[k];
        if (!hex4 || line[4] != ' ' || line[5] != ' ' || sscanf(line, "%4x  %n", &off, &used) != 1)
            continue;
        if (off == 0 && ++nd >= 3)
            break;
        if (nd < 0 || lens[nd] != off)
            fail_msg("PROTOCOL.md: dump %d: unexpected offset %04x", nd, off);
        const char *p = line + used;
        unsigned byte;
        int n;
        while (sscanf(p, "%2x%n", &byte, &n) == 1 && lens[nd] < sizeof dumps[0]) {
            dumps[nd][lens[nd]++] = (uint8_t)byte;
            p += n;
        }
    }
    fclose(f);
    assert_int_equal(nd, 2);
    rnp_request q;
    static rnp_reply ok, bad;
    doc_example(&q, &ok, &bad);
    size_t len = tp_enc_req(&q, g_buf, sizeof g_buf);
    assert_int_equal(lens[0], len);
    assert_memory_equal(dumps[0], g_buf, len);
    len = tp_enc_rep(&ok, g_buf, sizeof g_buf);
    assert_int_equal(lens[1], len);
    assert_memory_equal(dumps[1], g_buf, len);
    len = tp_enc_rep(&bad, g_buf, sizeof g_buf);
    assert_int_equal(lens[2], len);
    assert_memory_equal(dumps[2], g_buf, len);
    /* And they decode to the structs. */
    rnp_request back;
    rnp_error err;
    assert_int_equal(rnp_decode_request(dumps[0], lens[0], &back, &err), 0);
    assert_memory_equal(&back, &q, sizeof q);
}


/* ---- the error table ------------------------------------------------------------- */

/* Every code of the table has its name and message; codes outside it get
 * the documented fallbacks, never NULL. */
static void test_error_table(void **state)
{
    (void)state;
    int n = 0;
#define CHECK_ENTRY_(code, name, msg)                     \
    assert_string_equal(rnp_err_name(code), #name);       \
    assert_string_equal(rnp_strerror(code), msg);         \
    n++;
    RN_ERRORS(CHECK_ENTRY_)
#undef CHECK_ENTRY_
    assert_true(n > 20);
    assert_string_equal(rnp_err_name(RN_OUT_OF_BOUNDS), "OUT_OF_BOUNDS");
    assert_string_equal(rnp_strerror(RN_OUT_OF_BOUNDS), "tensor extends past the end of its region");
    static const int unknown[] = { -1, 1, 99, 199, 211, 302, 12345, INT32_MIN, INT32_MAX };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(rnp_err_name(unknown[i]), "UNKNOWN");
        assert_string_equal(rnp_strerror(unknown[i]), "unknown error");
    }
    assert_string_equal(rnp_op_name(RN_OP_BWD), "bwd");
    assert_string_equal(rnp_op_name(0), "unknown");
    assert_string_equal(rnp_dtype_name(RN_DTYPE_BF16), "bf16");
    assert_string_equal(rnp_dtype_name(9), "invalid");
    /* rnp_fail: the code back, err optional, the message cut to fit. */
    rnp_error err;
    char longer[2 * RNP_MAX_ERRMSG];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    assert_int_equal(rnp_fail(NULL, RN_BUSY, "%s", "no err"), RN_BUSY);
    assert_int_equal(rnp_fail(&err, RN_TIMEOUT, "a: %s", longer), RN_TIMEOUT);
    assert_int_equal(err.code, RN_TIMEOUT);
    assert_int_equal(strlen(err.msg), RNP_MAX_ERRMSG - 1);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_requests),
        cmocka_unit_test(test_round_trip_replies),
        cmocka_unit_test(test_bwd_defaults),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_no_allocation),
        cmocka_unit_test(test_message_size_limit),
        cmocka_unit_test(test_encode_buffer_too_small),
        cmocka_unit_test(test_envelope_errors),
        cmocka_unit_test(test_alternative_encodings),
        cmocka_unit_test(test_corpus_fresh),
        cmocka_unit_test(test_protocol_md_example),
        cmocka_unit_test(test_error_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

