/* SPDX-License-Identifier: MIT */
/*
 * test_proto_chan.c - the session channel's messages (proto/chan.c,
 * PROTOCOL.md section 12): every check of rnp_chan_parse with its code and
 * the field its message names, in the documented order; the message type
 * known as soon as the header is; descriptor counts; every type's exact
 * length and its bytes on the wire; round trips; an ERROR whose text has no
 * NUL; rnp_chan_send on a socket pair.
 *
 * Run with --write-corpus DIR to write fuzz_chan's seeds (one message of
 * every type, behind the harness's control byte) to DIR (tests/fuzz/corpus);
 * test_corpus_fresh checks that the checked-in seeds match.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "rn_proto.h"
#include "rn_test.h"

static const int types[] = {RNP_CHAN_AUTH,      RNP_CHAN_REGISTER_FD, RNP_CHAN_VMM_CHUNK,
                            RNP_CHAN_VMM_MAP,   RNP_CHAN_AUTH_OK,     RNP_CHAN_REGION_OK,
                            RNP_CHAN_VMM_CHUNK_OK, RNP_CHAN_ERROR};
static const char *const names[] = {"auth",     "register_fd", "vmm_chunk",    "vmm_map",
                                    "auth_ok",  "region_ok",   "vmm_chunk_ok", "error"};
#define NTYPES (int)(sizeof types / sizeof types[0])

/* A message of type t with every field set to something recognisable. */
static rnp_chan_msg sample(int t)
{
    rnp_chan_msg m;
    memset(&m, 0, sizeof m);
    m.type = t;
    switch (t) {
    case RNP_CHAN_AUTH:
        for (int i = 0; i < RNP_SESSION_BYTES; i++)
            m.u.auth.session.b[i] = (uint8_t)(0xa0 + i);
        break;
    case RNP_CHAN_REGISTER_FD: m.u.register_fd.size = 0x0102030405060708ull; break;
    case RNP_CHAN_VMM_CHUNK:
        m.u.vmm_chunk.offset = 0x1112131415161718ull;
        m.u.vmm_chunk.size = 0x2122232425262728ull;
        m.u.vmm_chunk.index = 0x31323334u;
        break;
    case RNP_CHAN_VMM_MAP:
        m.u.vmm_map.total = 0x4142434445464748ull;
        m.u.vmm_map.count = 0x51525354u;
        for (int i = 0; i < RNP_UUID_BYTES; i++)
            m.u.vmm_map.device_uuid[i] = (uint8_t)(0xc0 + i);
        break;
    case RNP_CHAN_VMM_CHUNK_OK: m.u.vmm_chunk_ok.index = 0x61626364u; break;
    case RNP_CHAN_AUTH_OK: m.u.auth_ok.pid = 0x11223344u, m.u.auth_ok.uid = 65534; break;
    case RNP_CHAN_REGION_OK: m.u.region_ok.region = 0xdeadbeefu; break;
    case RNP_CHAN_ERROR:
        m.u.error.code = RN_INVALID_ARGUMENT;
        strcpy(m.u.error.msg, "register_fd.size: 8192 bytes claimed, the object has 4096");
        break;
    }
    return m;
}

/* The descriptors a valid message of type t carries. */
static unsigned fds_of(int t)
{
    return t == RNP_CHAN_REGISTER_FD || t == RNP_CHAN_VMM_CHUNK ? 1 : 0;
}

/* Parse and expect code want (0: success) with a message starting with
 * prefix (when want is not 0), and type as msg's type. */
static void expect(const uint8_t *b, size_t len, bool cut, unsigned nfds, int want,
                   const char *prefix, int type)
{
    rnp_chan_msg msg;
    rnp_error err = {0};
    int rc;

    memset(&msg, 0x5a, sizeof msg);
    rc = rnp_chan_parse(b, len, cut, nfds, &msg, &err);
    if (rc != want)
        fail_msg("%zu bytes, %u fds: got %d (%s), expected %d", len, nfds, rc, err.msg, want);
    assert_int_equal(msg.type, type);
    if (want) {
        assert_int_equal(err.code, want);
        if (strncmp(err.msg, prefix, strlen(prefix)) != 0)
            fail_msg("message \"%s\" does not start with \"%s\"", err.msg, prefix);
        /* Nothing of the body is kept from a message that failed. */
        rnp_chan_msg zero;
        memset(&zero, 0, sizeof zero);
        assert_memory_equal(&msg.u, &zero.u, sizeof msg.u);
    }
}

static void test_lengths(void **state)
{
    (void)state;
    assert_int_equal(rnp_chan_len(RNP_CHAN_AUTH), 24);
    assert_int_equal(rnp_chan_len(RNP_CHAN_REGISTER_FD), 16);
    assert_int_equal(rnp_chan_len(RNP_CHAN_AUTH_OK), 16);
    assert_int_equal(rnp_chan_len(RNP_CHAN_REGION_OK), 16);
    assert_int_equal(rnp_chan_len(RNP_CHAN_VMM_CHUNK), 32);
    assert_int_equal(rnp_chan_len(RNP_CHAN_VMM_MAP), 40);
    assert_int_equal(rnp_chan_len(RNP_CHAN_VMM_CHUNK_OK), 16);
    assert_int_equal(rnp_chan_len(RNP_CHAN_ERROR), 128);
    assert_int_equal(RNP_CHAN_MAX, 128);
    for (int t = -1; t < 0x10000; t++) {
        bool known = t == RNP_CHAN_AUTH || t == RNP_CHAN_REGISTER_FD || t == RNP_CHAN_AUTH_OK ||
                     t == RNP_CHAN_REGION_OK || t == RNP_CHAN_ERROR || t == RNP_CHAN_VMM_CHUNK ||
                     t == RNP_CHAN_VMM_MAP || t == RNP_CHAN_VMM_CHUNK_OK;
        if (!known)
            assert_int_equal(rnp_chan_len(t), 0);
    }
}

/* The bytes on the wire, written out by hand from PROTOCOL.md's tables. */
static void test_wire_bytes(void **state)
{
    (void)state;
    uint8_t buf[RNP_CHAN_MAX];
    rnp_chan_msg m;
    static const uint8_t hdr_auth[8] = {'r', 'n', 'c', 'h', 1, 0, 1, 0};
    static const uint8_t reg[16] = {'r', 'n', 'c', 'h', 1, 0, 2, 0, 8, 7, 6, 5, 4, 3, 2, 1};
    static const uint8_t ok[16] = {'r', 'n', 'c', 'h', 1, 0, 0x81, 0,
                                   0x44, 0x33, 0x22, 0x11, 0xfe, 0xff, 0, 0};
    static const uint8_t region[16] = {'r', 'n', 'c', 'h', 1, 0, 0x82, 0,
                                       0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0};

    m = sample(RNP_CHAN_AUTH);
    assert_int_equal(rnp_chan_encode(&m, buf), 24);
    assert_memory_equal(buf, hdr_auth, 8);
    assert_memory_equal(buf + 8, m.u.auth.session.b, 16);
    m = sample(RNP_CHAN_REGISTER_FD);
    assert_int_equal(rnp_chan_encode(&m, buf), 16);
    assert_memory_equal(buf, reg, 16);
    m = sample(RNP_CHAN_AUTH_OK);
    assert_int_equal(rnp_chan_encode(&m, buf), 16);
    assert_memory_equal(buf, ok, 16);
    m = sample(RNP_CHAN_REGION_OK);
    assert_int_equal(rnp_chan_encode(&m, buf), 16);
    assert_memory_equal(buf, region, 16);
    m = sample(RNP_CHAN_ERROR);
    memset(buf, 0xee, sizeof buf);
    assert_int_equal(rnp_chan_encode(&m, buf), 128);
    assert_memory_equal(buf, ((const uint8_t[]){'r', 'n', 'c', 'h', 1, 0, 0xff, 0,
                                                RN_INVALID_ARGUMENT & 0xff,
                                                RN_INVALID_ARGUMENT >> 8, 0, 0}), 12);
    assert_string_equal((const char *)buf + 12, m.u.error.msg);
    for (size_t i = 12 + strlen(m.u.error.msg); i < 128; i++)
        assert_int_equal(buf[i], 0);

    m = sample(RNP_CHAN_VMM_CHUNK);
    assert_int_equal(rnp_chan_encode(&m, buf), 32);
    assert_memory_equal(buf, ((const uint8_t[]){'r', 'n', 'c', 'h', 1, 0, 3, 0,
                                                0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
                                                0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
                                                0x34, 0x33, 0x32, 0x31, 0, 0, 0, 0}), 32);
    m = sample(RNP_CHAN_VMM_MAP);
    assert_int_equal(rnp_chan_encode(&m, buf), 40);
    assert_memory_equal(buf, ((const uint8_t[]){'r', 'n', 'c', 'h', 1, 0, 4, 0,
                                                0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41,
                                                0x54, 0x53, 0x52, 0x51, 0, 0, 0, 0}), 24);
    assert_memory_equal(buf + 24, m.u.vmm_map.device_uuid, 16);
    m = sample(RNP_CHAN_VMM_CHUNK_OK);
    assert_int_equal(rnp_chan_encode(&m, buf), 16);
    assert_memory_equal(buf, ((const uint8_t[]){'r', 'n', 'c', 'h', 1, 0, 0x83, 0,
                                                0x64, 0x63, 0x62, 0x61, 0, 0, 0, 0}), 16);

    /* A type that is not the channel's writes nothing. */
    memset(buf, 0xee, sizeof buf);
    m.type = 5;
    assert_int_equal(rnp_chan_encode(&m, buf), 0);
    m.type = RNP_CHAN_NONE;
    assert_int_equal(rnp_chan_encode(&m, buf), 0);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xee);
}

static void test_round_trips(void **state)
{
    (void)state;
    for (int k = 0; k < NTYPES; k++) {
        uint8_t buf[RNP_CHAN_MAX], again[RNP_CHAN_MAX];
        rnp_chan_msg m = sample(types[k]), back;
        rnp_error err = {0};
        size_t len = rnp_chan_encode(&m, buf);

        assert_int_equal(len, rnp_chan_len(types[k]));
        if (rnp_chan_parse(buf, len, false, fds_of(types[k]), &back, &err) != 0)
            fail_msg("%s: %s", names[k], err.msg);
        assert_int_equal(back.type, m.type);
        assert_memory_equal(&back.u, &m.u, sizeof m.u);
        assert_int_equal(rnp_chan_encode(&back, again), len);
        assert_memory_equal(buf, again, len);
        /* err may be NULL, on success and on failure alike. */
        assert_int_equal(rnp_chan_parse(buf, len, false, fds_of(types[k]), &back, NULL), 0);
        assert_int_equal(rnp_chan_parse(buf, len - 1, false, fds_of(types[k]), &back, NULL),
                         RN_MALFORMED);
    }
    /* Extreme values. */
    {
        uint8_t buf[RNP_CHAN_MAX];
        rnp_chan_msg m = {.type = RNP_CHAN_REGISTER_FD}, back;
        m.u.register_fd.size = UINT64_MAX;
        assert_int_equal(rnp_chan_parse(buf, rnp_chan_encode(&m, buf), false, 1, &back, NULL), 0);
        assert_true(back.u.register_fd.size == UINT64_MAX);
        m.type = RNP_CHAN_AUTH_OK;
        m.u.auth_ok.pid = m.u.auth_ok.uid = UINT32_MAX;
        assert_int_equal(rnp_chan_parse(buf, rnp_chan_encode(&m, buf), false, 0, &back, NULL), 0);
        assert_int_equal(back.u.auth_ok.pid, UINT32_MAX);
        assert_int_equal(back.u.auth_ok.uid, UINT32_MAX);
    }
}

/* The header's checks, each with its code and field, in order. */
static void test_header(void **state)
{
    (void)state;
    uint8_t b[RNP_CHAN_MAX + 1];
    rnp_chan_msg m = sample(RNP_CHAN_AUTH);
    size_t len = rnp_chan_encode(&m, b);

    /* Cut (MSG_TRUNC or MSG_CTRUNC), or too many descriptors: before
     * anything else, whatever the bytes. */
    expect(b, len, true, 0, RN_TOO_BIG, "message: longer than 128 bytes, or more than 16 "
           "descriptors", RNP_CHAN_NONE);
    expect(NULL, 0, true, 0, RN_TOO_BIG, "message:", RNP_CHAN_NONE);
    expect(b, len, false, RNP_CHAN_MAX_FDS + 1, RN_TOO_BIG, "message:", RNP_CHAN_NONE);
    expect(b, len, false, UINT32_MAX, RN_TOO_BIG, "message:", RNP_CHAN_NONE);
    /* 129 bytes fit the daemon's receive buffer, but not the protocol's
     * limit (PROTOCOL.md section 12: over 128 bytes is TOO_BIG). */
    memset(b + len, 0, sizeof b - len);
    expect(b, RNP_CHAN_MAX + 1, false, 0, RN_TOO_BIG, "message:", RNP_CHAN_NONE);
    /* Shorter than the header. */
    expect(NULL, 0, false, 0, RN_MALFORMED, "message: 0 bytes, shorter than the header",
           RNP_CHAN_NONE);
    for (size_t n = 1; n < RNP_CHAN_HDR; n++)
        expect(b, n, false, 0, RN_MALFORMED, "message: ", RNP_CHAN_NONE);
    expect(b, 7, false, 1, RN_MALFORMED, "message: 7 bytes, shorter than the header",
           RNP_CHAN_NONE);
    /* The magic, byte by byte; before the version. */
    for (int i = 0; i < 4; i++) {
        b[i] ^= 0x20;
        b[5] = 9;
        expect(b, len, false, 0, RN_MALFORMED, "message.magic: 0x", RNP_CHAN_NONE);
        b[5] = 0;
        b[i] ^= 0x20;
    }
    b[0] = 'R';
    expect(b, len, false, 0, RN_MALFORMED, "message.magic: 0x68636e52 is not the channel's",
           RNP_CHAN_NONE);
    b[0] = 'r';
    /* The version: before the type and the descriptors. */
    b[4] = 0;
    b[6] = 0x77;
    expect(b, len, false, 3, RN_BAD_VERSION, "message.version: 0, this daemon speaks 1",
           RNP_CHAN_NONE);
    b[6] = 1;
    b[4] = 2;
    expect(b, len, false, 0, RN_BAD_VERSION, "message.version: 2,", RNP_CHAN_NONE);
    b[4] = 1, b[5] = 1;
    expect(b, len, false, 0, RN_BAD_VERSION, "message.version: 257,", RNP_CHAN_NONE);
    b[5] = 0;
    expect(b, len, false, 0, 0, NULL, RNP_CHAN_AUTH);
}

/* Any other type: RN_UNKNOWN_OP, before its descriptors or length, with
 * the type known to the caller. */
static void test_unknown_type(void **state)
{
    (void)state;
    static const unsigned others[] = {0, 5, 0x7f, 0x80, 0x84, 0xfe, 0x100, 0x101, 0x181,
                                      0x1ff, 0x303, 0xffff};
    uint8_t b[RNP_CHAN_MAX];
    char want[64];

    memset(b, 0, sizeof b);
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        rnp_chan_hdr(b, (uint16_t)others[i]);
        snprintf(want, sizeof want, "message.type: unknown type %u", others[i]);
        expect(b, RNP_CHAN_HDR, false, 0, RN_UNKNOWN_OP, want, (int)others[i]);
        expect(b, sizeof b, false, 5, RN_UNKNOWN_OP, want, (int)others[i]);
    }
}

/* Descriptors: REGISTER_FD exactly one, everything else none; checked
 * before the length. */
static void test_descriptors(void **state)
{
    (void)state;
    for (int k = 0; k < NTYPES; k++) {
        uint8_t b[RNP_CHAN_MAX];
        rnp_chan_msg m = sample(types[k]);
        size_t len = rnp_chan_encode(&m, b);
        char want[80];

        for (unsigned n = 0; n <= RNP_CHAN_MAX_FDS; n++) {
            if (n == fds_of(types[k])) {
                expect(b, len, false, n, 0, NULL, types[k]);
                continue;
            }
            if (fds_of(types[k]) == 1)
                snprintf(want, sizeof want, "%s: carries exactly one descriptor, got %u",
                         names[k], n);
            else
                snprintf(want, sizeof want, "%s: carries no descriptors, got %u", names[k], n);
            expect(b, len, false, n, RN_INVALID_ARGUMENT, want, types[k]);
            /* Before the length. */
            expect(b, len - 1, false, n, RN_INVALID_ARGUMENT, want, types[k]);
            expect(b, RNP_CHAN_HDR, false, n, RN_INVALID_ARGUMENT, want, types[k]);
        }
        expect(b, len, false, RNP_CHAN_MAX_FDS + 1, RN_TOO_BIG, "message:", RNP_CHAN_NONE);
    }
}

/* rnp_chan_send on a real socket pair: the encoded bytes arrive as one
 * message, with the descriptor attached (a working duplicate of it) or
 * none; a full socket is EAGAIN with nothing sent, a closed peer an error
 * without SIGPIPE. */
static void test_send(void **state)
{
    (void)state;
    int sv[2], pfd[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, sv), 0);
    assert_int_equal(pipe(pfd), 0);
    for (int with_fd = 0; with_fd <= 1; with_fd++) {
        rnp_chan_msg m = sample(RNP_CHAN_REGISTER_FD);
        uint8_t want[RNP_CHAN_MAX], got[RNP_CHAN_MAX + 1];
        size_t len = rnp_chan_encode(&m, want);
        union {
            struct cmsghdr align;
            char b[CMSG_SPACE(sizeof(int))];
        } cb;
        struct iovec iov = {got, sizeof got};
        struct msghdr mh = {0};
        int fds[1] = {-1};

        assert_int_equal(rnp_chan_send(sv[0], &m, with_fd ? pfd[1] : -1), 0);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cb.b;
        mh.msg_controllen = sizeof cb.b;
        assert_int_equal(recvmsg(sv[1], &mh, 0), (ssize_t)len);
        assert_memory_equal(got, want, len);
        assert_int_equal(rnp_chan_take_fds(&mh, fds, 1), (unsigned)with_fd);
        if (with_fd) {
            assert_int_equal(write(fds[0], "k", 1), 1);
            char c = 0;
            assert_int_equal(read(pfd[0], &c, 1), 1);
            assert_int_equal(c, 'k');
            close(fds[0]);
        }
    }
    /* Full: the peer reads nothing. */
    rnp_chan_msg m = sample(RNP_CHAN_AUTH);
    int e = 0, sent = 0;
    while (sent < 100000 && (e = rnp_chan_send(sv[0], &m, -1)) == 0)
        sent++;
    assert_true(e == EAGAIN || e == EWOULDBLOCK);
    assert_true(sent > 0);
    close(sv[1]);
    e = rnp_chan_send(sv[0], &m, -1); /* (ECONNRESET: it closed unread) */
    assert_true(e == EPIPE || e == ECONNRESET);
    close(sv[0]);
    close(pfd[0]);
    close(pfd[1]);
}

/* Each type's exact length, every other one up to RNP_CHAN_MAX RN_MALFORMED
 * naming the type (longer is RN_TOO_BIG: test_header). */
static void test_exact_length(void **state)
{
    (void)state;
    for (int k = 0; k < NTYPES; k++) {
        uint8_t b[RNP_CHAN_MAX + 1];
        rnp_chan_msg m = sample(types[k]);
        size_t len = rnp_chan_encode(&m, b);
        char want[80];

        b[RNP_CHAN_MAX] = 0;
        for (size_t n = RNP_CHAN_HDR; n <= RNP_CHAN_MAX; n++) {
            if (n == len) {
                expect(b, n, false, fds_of(types[k]), 0, NULL, types[k]);
                continue;
            }
            snprintf(want, sizeof want, "%s: %zu bytes, expected %zu", names[k], n, len);
            expect(b, n, false, fds_of(types[k]), RN_MALFORMED, want, types[k]);
        }
    }
}

/* An ERROR's text: NUL-terminated and zero-filled after parsing, whatever
 * the bytes; cut to its field by the encoder. */
static void test_error_text(void **state)
{
    (void)state;
    uint8_t b[RNP_CHAN_MAX], again[RNP_CHAN_MAX];
    rnp_chan_msg m = {.type = RNP_CHAN_ERROR}, back;

    /* No NUL at all: cut at the field's last byte. */
    m.u.error.code = RN_BUSY;
    memset(m.u.error.msg, 'x', sizeof m.u.error.msg);
    assert_int_equal(rnp_chan_encode(&m, b), RNP_CHAN_ERROR_LEN);
    assert_int_equal(b[RNP_CHAN_ERROR_LEN - 1], 0);
    memset(b + 12, 'y', RNP_CHAN_ERROR_MSG);
    assert_int_equal(rnp_chan_parse(b, sizeof b, false, 0, &back, NULL), 0);
    assert_int_equal(back.u.error.code, RN_BUSY);
    assert_int_equal(strlen(back.u.error.msg), RNP_CHAN_ERROR_MSG - 1);
    for (int i = 0; i < RNP_CHAN_ERROR_MSG - 1; i++)
        assert_int_equal(back.u.error.msg[i], 'y');

    /* Bytes after the NUL are not kept, and do not come back. */
    memset(b + 12, 'z', RNP_CHAN_ERROR_MSG);
    memcpy(b + 12, "auth\0garbage", 12);
    assert_int_equal(rnp_chan_parse(b, sizeof b, false, 0, &back, NULL), 0);
    assert_string_equal(back.u.error.msg, "auth");
    for (size_t i = 4; i < sizeof back.u.error.msg; i++)
        assert_int_equal(back.u.error.msg[i], 0);
    assert_int_equal(rnp_chan_encode(&back, again), RNP_CHAN_ERROR_LEN);
    assert_memory_equal(again, b, 12 + 5);
    for (size_t i = 12 + 5; i < sizeof again; i++)
        assert_int_equal(again[i], 0);

    /* An empty text, and any code: the parser does not judge values. */
    memset(b + 12, 0, RNP_CHAN_ERROR_MSG);
    rnp_le32_put(b + 8, 0xffffffffu);
    assert_int_equal(rnp_chan_parse(b, sizeof b, false, 0, &back, NULL), 0);
    assert_int_equal(back.u.error.code, 0xffffffffu);
    assert_string_equal(back.u.error.msg, "");
}

/* REGION_OK's reserved field is written 0 and not read; values a side
 * refuses (region 0, size 0) are its own business. */
static void test_values_not_judged(void **state)
{
    (void)state;
    uint8_t b[RNP_CHAN_MAX];
    rnp_chan_msg m = {.type = RNP_CHAN_REGION_OK}, back;

    rnp_chan_encode(&m, b);
    rnp_le32_put(b + 12, 0x12345678u);
    assert_int_equal(rnp_chan_parse(b, RNP_CHAN_REGION_OK_LEN, false, 0, &back, NULL), 0);
    assert_int_equal(back.u.region_ok.region, 0);
    m.type = RNP_CHAN_REGISTER_FD;
    rnp_chan_encode(&m, b);
    assert_int_equal(rnp_chan_parse(b, RNP_CHAN_REGISTER_FD_LEN, false, 1, &back, NULL), 0);
    assert_true(back.u.register_fd.size == 0);
    /* The reserved words of VMM_CHUNK, VMM_MAP and VMM_CHUNK_OK likewise. */
    m = sample(RNP_CHAN_VMM_CHUNK);
    rnp_chan_encode(&m, b);
    rnp_le32_put(b + 28, 0xffffffffu);
    assert_int_equal(rnp_chan_parse(b, RNP_CHAN_VMM_CHUNK_LEN, false, 1, &back, NULL), 0);
    assert_memory_equal(&back.u, &m.u, sizeof m.u);
    m = sample(RNP_CHAN_VMM_MAP);
    rnp_chan_encode(&m, b);
    rnp_le32_put(b + 20, 0xffffffffu);
    assert_int_equal(rnp_chan_parse(b, RNP_CHAN_VMM_MAP_LEN, false, 0, &back, NULL), 0);
    assert_memory_equal(&back.u, &m.u, sizeof m.u);
    m = sample(RNP_CHAN_VMM_CHUNK_OK);
    rnp_chan_encode(&m, b);
    rnp_le32_put(b + 12, 0xffffffffu);
    assert_int_equal(rnp_chan_parse(b, RNP_CHAN_VMM_CHUNK_OK_LEN, false, 0, &back, NULL), 0);
    assert_memory_equal(&back.u, &m.u, sizeof m.u);
}

/* ---- VMM ranges: the layout rules (rnp_vmm_*_check) --------------------------------- */

static void expect_rc(int rc, const rnp_error *err, int want, const char *prefix)
{
    if (rc != want)
        fail_msg("got %d (%s), expected %d", rc, err->msg, want);
    if (want && strncmp(err->msg, prefix, strlen(prefix)) != 0)
        fail_msg("message \"%s\" does not start with \"%s\"", err->msg, prefix);
}

/* Every field of VMM_CHUNK against the chunks before it, in the documented
 * order. */
static void test_vmm_chunk_rules(void **state)
{
    (void)state;
    const uint64_t M2 = 2u << 20;
    rnp_error err = {0};

    /* The first chunk, then the next ones, tiling the range. */
    expect_rc(rnp_vmm_chunk_check(0, 0, 0, 0, M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_chunk_check(1, M2, 1, M2, 10 * M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_chunk_check(RNP_VMM_MAX_CHUNKS - 1, 5 * M2, RNP_VMM_MAX_CHUNKS - 1, 5 * M2,
                                  M2, &err), &err, 0, NULL);
    /* index: the limit first (even when it is the expected one), then the order. */
    expect_rc(rnp_vmm_chunk_check(RNP_VMM_MAX_CHUNKS, 0, RNP_VMM_MAX_CHUNKS, 0, 0, &err), &err,
              RN_TOO_LARGE, "vmm_chunk.index: 16384, a range has at most 16384 chunks");
    expect_rc(rnp_vmm_chunk_check(0, 0, UINT32_MAX, 1, 0, &err), &err, RN_TOO_LARGE,
              "vmm_chunk.index:");
    expect_rc(rnp_vmm_chunk_check(0, 0, 1, 7, 0, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.index: 1, expected 0");
    expect_rc(rnp_vmm_chunk_check(3, 3 * M2, 2, 2 * M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.index: 2, expected 3");
    expect_rc(rnp_vmm_chunk_check(3, 3 * M2, 4, 3 * M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.index: 4, expected 3");
    /* size 0, before the offset. */
    expect_rc(rnp_vmm_chunk_check(1, M2, 1, 7, 0, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.size: must be at least 1 byte");
    /* offset: exactly the end of the chunks before (no gap, no overlap). */
    expect_rc(rnp_vmm_chunk_check(0, 0, 0, M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.offset: 2097152, expected 0");
    expect_rc(rnp_vmm_chunk_check(2, 2 * M2, 2, 3 * M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.offset: 6291456, expected 4194304");
    expect_rc(rnp_vmm_chunk_check(2, 2 * M2, 2, M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.offset: 2097152, expected 4194304");
    /* The range's limit, without overflow. */
    expect_rc(rnp_vmm_chunk_check(0, 0, 0, 0, RNP_VMM_MAX_RANGE, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_chunk_check(0, 0, 0, 0, RNP_VMM_MAX_RANGE + 1, &err), &err, RN_TOO_LARGE,
              "vmm_chunk.size: 281474976710657 bytes at 0 pass");
    expect_rc(rnp_vmm_chunk_check(1, M2, 1, M2, RNP_VMM_MAX_RANGE - M2 + 1, &err), &err,
              RN_TOO_LARGE, "vmm_chunk.size:");
    expect_rc(rnp_vmm_chunk_check(1, M2, 1, M2, UINT64_MAX, &err), &err, RN_TOO_LARGE,
              "vmm_chunk.size:");
    /* err may be NULL. */
    assert_int_equal(rnp_vmm_chunk_check(0, 0, 1, 0, 1, NULL), RN_INVALID_ARGUMENT);
}

static void test_vmm_granularity(void **state)
{
    (void)state;
    const uint64_t M2 = 2u << 20;
    rnp_error err = {0};

    expect_rc(rnp_vmm_gran_check(0, M2, M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_gran_check(10 * M2, 10 * M2, M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_gran_check(3, 5, 1, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_gran_check(M2 / 2, M2, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.offset: 1048576 is not a multiple of the allocation's granularity "
              "(2097152 bytes)");
    expect_rc(rnp_vmm_gran_check(M2, M2 + 4096, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_chunk.size: 2101248 is not a multiple");
    /* The offset first. */
    expect_rc(rnp_vmm_gran_check(1, 1, M2, &err), &err, RN_INVALID_ARGUMENT, "vmm_chunk.offset:");
    expect_rc(rnp_vmm_gran_check(0, M2, 0, &err), &err, RN_INTERNAL, "vmm_chunk:");
}

static void test_vmm_map_rules(void **state)
{
    (void)state;
    const uint64_t M2 = 2u << 20;
    rnp_error err = {0};

    expect_rc(rnp_vmm_map_check(1, M2, 1, M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_map_check(3, 7 * M2, 3, 7 * M2, &err), &err, 0, NULL);
    expect_rc(rnp_vmm_map_check(0, 0, 0, 0, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.count: a range has at least one chunk");
    expect_rc(rnp_vmm_map_check(2, 2 * M2, 0, 2 * M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.count: a range");
    expect_rc(rnp_vmm_map_check(2, 2 * M2, 3, 2 * M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.count: 3, but 2 chunks were received for the range");
    expect_rc(rnp_vmm_map_check(0, 0, 1, M2, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.count: 1, but 0 chunks");
    expect_rc(rnp_vmm_map_check(2, 2 * M2, 2, 2 * M2 - 1, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.total: 4194303 bytes, but the chunks cover 4194304");
    expect_rc(rnp_vmm_map_check(2, 2 * M2, 2, UINT64_MAX, &err), &err, RN_INVALID_ARGUMENT,
              "vmm_map.total:");
}

/* ---- fuzz_chan's seeds --------------------------------------------------------------- */

/* Seed k (fuzz_chan's input: a control byte, truncated in bit 7 and the
 * descriptor count in bits 0-4, then the datagram) into buf; its file name
 * into name.  Returns its length, 0 past the last. */
static size_t seed(int k, uint8_t *buf, char *name, size_t namelen)
{
    rnp_chan_msg m;

    if (k >= NTYPES)
        return 0;
    m = sample(types[k]);
    snprintf(name, namelen, "chan-%s.bin", names[k]);
    buf[0] = (uint8_t)fds_of(types[k]);
    return 1 + rnp_chan_encode(&m, buf + 1);
}

static void test_corpus_fresh(void **state)
{
    (void)state;
    const char *src = getenv("RN_SRC");
    uint8_t buf[RNP_CHAN_MAX + 1];
    char name[64], path[4096];
    size_t len;

    if (!src)
        RN_SKIP("RN_SRC is not set (run through tests/run.sh)");
    for (int k = 0; (len = seed(k, buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/tests/fuzz/corpus/%s", src, name);
        size_t n = 0;
        char *file = rn_test_read_file(path, &n);
        if (!file)
            fail_msg("%s is missing: run test_proto_chan --write-corpus tests/fuzz/corpus", path);
        bool same = n == len && memcmp(file, buf, len) == 0;
        free(file);
        if (!same)
            fail_msg("%s is stale: run test_proto_chan --write-corpus tests/fuzz/corpus", path);
    }
}

static int write_corpus(const char *dir)
{
    uint8_t buf[RNP_CHAN_MAX + 1];
    char name[64], path[4096];
    size_t len;

    for (int k = 0; (len = seed(k, buf, name, sizeof name)) > 0; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "test_proto_chan: cannot write %s\n", path);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_wire_bytes),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_header),
        cmocka_unit_test(test_unknown_type),
        cmocka_unit_test(test_descriptors),
        cmocka_unit_test(test_send),
        cmocka_unit_test(test_exact_length),
        cmocka_unit_test(test_error_text),
        cmocka_unit_test(test_values_not_judged),
        cmocka_unit_test(test_vmm_chunk_rules),
        cmocka_unit_test(test_vmm_granularity),
        cmocka_unit_test(test_vmm_map_rules),
        cmocka_unit_test(test_corpus_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
