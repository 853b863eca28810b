/* SPDX-License-Identifier: MIT */
/*
 * test_badinput - bad input over the real socket, on a plain NN_REQ socket:
 * every malformed class of the protocol, out-of-bounds offsets, unknown
 * sessions and regions, wrong dtypes.  Each gets its error code in a reply,
 * the daemon stays healthy, and its memory does not grow.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <msgpack.h>
#include <nanomsg/nn.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/raw.h"

/* ---- building messages by hand -------------------------------------------------------- */

typedef struct msg {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} msg;

static void m_init(msg *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void m_free(msg *m)
{
    msgpack_sbuffer_destroy(&m->sb);
}

static void m_str(msg *m, const char *s)
{
    msgpack_pack_str(&m->pk, strlen(s));
    msgpack_pack_str_body(&m->pk, s, strlen(s));
}

static void m_kuint(msg *m, const char *k, uint64_t v)
{
    m_str(m, k);
    msgpack_pack_uint64(&m->pk, v);
}

static void m_kbin(msg *m, const char *k, const void *b, size_t n)
{
    m_str(m, k);
    msgpack_pack_bin(&m->pk, n);
    msgpack_pack_bin_body(&m->pk, b, n);
}

/* The envelope header of a request with a body: {"v","op","id","body": */
static void m_env(msg *m, uint64_t v, uint64_t op, uint64_t id, int extra_keys)
{
    msgpack_pack_map(&m->pk, (size_t)(4 + extra_keys));
    m_kuint(m, "v", v);
    m_kuint(m, "op", op);
    m_kuint(m, "id", id);
    m_str(m, "body");
}

/* A HELLO with a given client name. */
static void m_hello(msg *m, uint64_t v, uint64_t op, const char *name)
{
    m_env(m, v, op, 77, 0);
    msgpack_pack_map(&m->pk, 2);
    m_str(m, "client");
    m_str(m, name);
    m_kuint(m, "pid", (uint64_t)getpid());
}

/* ---- the cases --------------------------------------------------------------------------- */

typedef struct ctx {
    int sock;
    rnp_session session;
    uint32_t region;
    uint64_t region_size;
    int cases; /* checked so far */
} ctx;

static rnp_reply rep;

/* Send bytes, expect a reply with code `want`. */
static void expect_bytes(ctx *x, const char *what, const void *b, size_t n, int want)
{
    if (rnr_send_bytes(x->sock, b, n, &rep) != 0)
        fail_msg("%s: no reply", what);
    if (rep.status != want)
        fail_msg("%s: got %d %s (\"%s\"), expected %d %s", what, rep.status,
                 rn_err_name(rep.status), rep.error, want, rn_err_name(want));
    if (want != 0 && rep.error[0] == '\0')
        fail_msg("%s: error reply without a message", what);
    x->cases++;
}

static void expect_msg(ctx *x, const char *what, msg *m, int want)
{
    expect_bytes(x, what, m->sb.data, m->sb.size, want);
    m_free(m);
}

static void expect_req(ctx *x, const char *what, const rnp_request *q, int want)
{
    if (rnr_call(x->sock, q, &rep) != 0)
        fail_msg("%s: no reply", what);
    if (rep.status != want)
        fail_msg("%s: got %d %s (\"%s\"), expected %d %s", what, rep.status,
                 rn_err_name(rep.status), rep.error, want, rn_err_name(want));
    if (want != 0) {
        assert_int_equal(rep.op, q->op);
        assert_int_equal(rep.id, q->id);
    }
    x->cases++;
}

/* A valid BWD on the test's region: x, dy, dx of 4 x 64 f32, w, dw. */
static void valid_bwd(rnp_request *q, const ctx *x)
{
    rnp_bwd_req *b = &q->u.bwd;
    static uint64_t seq = 1;
    memset(q, 0, sizeof *q);
    q->version = RNP_VERSION;
    q->op = RN_OP_BWD;
    q->id = 500 + seq;
    b->session = x->session;
    b->seq = seq++;
    b->m = 4;
    b->n = 64;
    b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_F32;
    b->x = (rnp_tensor){{x->region}, 0, 64};
    b->dy = (rnp_tensor){{x->region}, 1024, 64};
    b->dx = (rnp_tensor){{x->region}, 2048, 64};
    b->has_w = true;
    b->w_dtype = RN_DTYPE_F32;
    b->w = (rnp_tensor){{x->region}, 3072, 0};
    b->has_dw = true;
    b->dw_dtype = RN_DTYPE_F32;
    b->dw = (rnp_tensor){{x->region}, 3328, 0};
    b->eps = 1e-6f;
    b->ready_slot = -1;
    b->mode = RNP_MODE_SYNC;
}

/* One round of every bad input the daemon must refuse. */
static void bad_round(ctx *x)
{
    static uint8_t buf[RNP_MAX_MSG + 16];
    static rnp_request q;
    rnp_error err;
    size_t len = 0;
    msg m;

    /* -- structure -- */
    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_HELLO;
    q.id = 9;
    snprintf(q.u.hello.client_name, sizeof q.u.hello.client_name, "bad");
    q.u.hello.pid = (uint32_t)getpid();
    assert_int_equal(rnp_encode_request(&q, buf, sizeof buf, &len, &err), 0);
    /* Truncated at every byte (0 is the empty message). */
    for (size_t cut = 0; cut < len; cut++)
        expect_bytes(x, "truncated hello", buf, cut, RN_MALFORMED);
    /* Trailing bytes. */
    buf[len] = 0xc0;
    expect_bytes(x, "trailing byte", buf, len + 1, RN_TRAILING_BYTES);
    /* A count larger than the bytes left: array32 / map32 / str32 / bin32
     * headers claiming 2^32 - 1 entries or bytes. */
    {
        static const uint8_t huge[][5] = {{0xdd, 0xff, 0xff, 0xff, 0xff},
                                          {0xdf, 0xff, 0xff, 0xff, 0xff},
                                          {0xdb, 0xff, 0xff, 0xff, 0xff},
                                          {0xc6, 0xff, 0xff, 0xff, 0xff}};
        for (size_t i = 0; i < 4; i++)
            expect_bytes(x, "huge count", huge[i], 5, RN_MALFORMED);
        /* The same inside a valid envelope: body = map32 of 2^32 - 1. */
        m_init(&m);
        m_env(&m, 1, RN_OP_HELLO, 5, 0);
        msgpack_sbuffer_write(&m.sb, (const char *)huge[1], 5);
        expect_msg(x, "huge body count", &m, RN_MALFORMED);
    }
    /* The reserved byte. */
    expect_bytes(x, "byte 0xc1", "\xc1", 1, RN_MALFORMED);
    /* Not a map at the top. */
    m_init(&m);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_uint64(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 2);
    expect_msg(x, "array at the top", &m, RN_BAD_TYPE);
    /* Too deep: arrays nested past the limit where the body should be. */
    m_init(&m);
    m_env(&m, 1, RN_OP_HELLO, 6, 0);
    for (int i = 0; i < 8; i++)
        msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 1);
    expect_msg(x, "too deep", &m, RN_TOO_DEEP);

    /* -- envelope -- */
    m_init(&m);
    m_hello(&m, 2, RN_OP_HELLO, "v2");
    expect_msg(x, "wrong version", &m, RN_BAD_VERSION);
    m_init(&m);
    m_hello(&m, 1, 99, "op99");
    expect_msg(x, "unknown op", &m, RN_UNKNOWN_OP);
    m_init(&m);
    m_hello(&m, 1, 0, "op0");
    expect_msg(x, "op 0", &m, RN_UNKNOWN_OP);
    m_init(&m); /* "v" as a string */
    msgpack_pack_map(&m.pk, 3);
    m_str(&m, "v");
    m_str(&m, "1");
    m_kuint(&m, "op", RN_OP_PING);
    m_kuint(&m, "id", 1);
    expect_msg(x, "v as a string", &m, RN_BAD_TYPE);
    m_init(&m); /* negative id */
    msgpack_pack_map(&m.pk, 3);
    m_kuint(&m, "v", 1);
    m_kuint(&m, "op", RN_OP_PING);
    m_str(&m, "id");
    msgpack_pack_int64(&m.pk, -1);
    expect_msg(x, "negative id", &m, RN_BAD_TYPE);
    m_init(&m); /* duplicate key */
    msgpack_pack_map(&m.pk, 4);
    m_kuint(&m, "v", 1);
    m_kuint(&m, "op", RN_OP_PING);
    m_kuint(&m, "op", RN_OP_PING);
    m_kuint(&m, "id", 1);
    expect_msg(x, "duplicate key", &m, RN_DUPLICATE_FIELD);
    m_init(&m); /* missing id */
    msgpack_pack_map(&m.pk, 2);
    m_kuint(&m, "v", 1);
    m_kuint(&m, "op", RN_OP_PING);
    expect_msg(x, "missing id", &m, RN_MISSING_FIELD);
    m_init(&m); /* unknown key */
    msgpack_pack_map(&m.pk, 4);
    m_kuint(&m, "v", 1);
    m_kuint(&m, "op", RN_OP_PING);
    m_kuint(&m, "id", 1);
    m_kuint(&m, "surprise", 1);
    expect_msg(x, "unknown key", &m, RN_UNKNOWN_FIELD);

    /* -- body types and sizes -- */
    m_init(&m); /* pid as a string */
    m_env(&m, 1, RN_OP_HELLO, 8, 0);
    msgpack_pack_map(&m.pk, 2);
    m_str(&m, "client");
    m_str(&m, "x");
    m_str(&m, "pid");
    m_str(&m, "123");
    expect_msg(x, "pid as a string", &m, RN_BAD_TYPE);
    {
        char big[1001];
        memset(big, 'n', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        m_init(&m);
        m_hello(&m, 1, RN_OP_HELLO, big);
        expect_msg(x, "oversize client name", &m, RN_TOO_BIG);
    }
    {
        uint8_t s17[17] = {0}, s15[15] = {0};
        m_init(&m); /* session of 17 bytes */
        m_env(&m, 1, RN_OP_BYE, 10, 0);
        msgpack_pack_map(&m.pk, 1);
        m_kbin(&m, "session", s17, sizeof s17);
        expect_msg(x, "oversize session", &m, RN_TOO_BIG);
        m_init(&m); /* session of 15 bytes */
        m_env(&m, 1, RN_OP_BYE, 11, 0);
        msgpack_pack_map(&m.pk, 1);
        m_kbin(&m, "session", s15, sizeof s15);
        expect_msg(x, "short session", &m, RN_BAD_TYPE);
        m_init(&m); /* session as a string */
        m_env(&m, 1, RN_OP_BYE, 12, 0);
        msgpack_pack_map(&m.pk, 1);
        m_str(&m, "session");
        m_str(&m, "0123456789abcdef");
        expect_msg(x, "session as a string", &m, RN_BAD_TYPE);
    }
    {
        static rnp_request r;
        char name[400];
        memset(&r, 0, sizeof r);
        /* An oversize shm name, by hand (the encoder refuses it). */
        memset(name, 'a', sizeof name - 1);
        name[0] = '/';
        name[sizeof name - 1] = '\0';
        m_init(&m);
        m_env(&m, 1, RN_OP_REGISTER, 13, 0);
        msgpack_pack_map(&m.pk, 4);
        m_kbin(&m, "session", x->session.b, sizeof x->session.b);
        m_kuint(&m, "kind", RNP_REGION_SHM);
        m_kuint(&m, "size", 4096);
        m_str(&m, "shm_name");
        m_str(&m, name);
        expect_msg(x, "oversize shm name", &m, RN_TOO_BIG);
    }

    /* -- semantics: valid encodings the daemon must refuse -- */
    valid_bwd(&q, x);
    q.u.bwd.dx.offset = x->region_size - 64;
    expect_req(x, "dx past the end", &q, RN_OUT_OF_BOUNDS);
    valid_bwd(&q, x);
    q.u.bwd.x.offset = UINT64_MAX - 15; /* aligned, so only the bound can fail */
    expect_req(x, "offset near 2^64", &q, RN_OUT_OF_BOUNDS);
    valid_bwd(&q, x);
    q.u.bwd.m = 1u << 20;
    expect_req(x, "m past the region", &q, RN_OUT_OF_BOUNDS);
    valid_bwd(&q, x);
    q.u.bwd.x.stride = UINT64_MAX / 2;
    expect_req(x, "stride overflow", &q, RN_OUT_OF_BOUNDS);
    valid_bwd(&q, x);
    q.u.bwd.dy.offset = 1026;
    expect_req(x, "misaligned dy", &q, RN_MISALIGNED);
    valid_bwd(&q, x);
    q.u.bwd.dx.offset = 0;
    expect_req(x, "dx over x", &q, RN_ALIASING);
    valid_bwd(&q, x);
    q.u.bwd.x_dtype = 7;
    expect_req(x, "dtype 7", &q, RN_INVALID_ARGUMENT);
    valid_bwd(&q, x);
    q.u.bwd.dw_dtype = RN_DTYPE_BF16;
    expect_req(x, "dw dtype neither f32 nor w's", &q, RN_INVALID_ARGUMENT);
    valid_bwd(&q, x);
    q.u.bwd.n = 0;
    expect_req(x, "n 0", &q, RN_INVALID_ARGUMENT);
    valid_bwd(&q, x);
    q.u.bwd.x.stride = 3;
    expect_req(x, "stride below n", &q, RN_INVALID_ARGUMENT);
    valid_bwd(&q, x);
    q.u.bwd.n = 1u << 30;
    expect_req(x, "n past the limit", &q, RN_TOO_LARGE);
    valid_bwd(&q, x);
    q.u.bwd.dy.region.id = 9999;
    expect_req(x, "unknown region", &q, RN_UNKNOWN_REGION);
    valid_bwd(&q, x);
    q.u.bwd.session.b[0] ^= 0xff;
    expect_req(x, "unknown session", &q, RN_UNKNOWN_SESSION);
    valid_bwd(&q, x);
    q.u.bwd.ordering = 1;
    expect_req(x, "ordering 1", &q, RN_UNSUPPORTED);

    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_UNREGISTER;
    q.id = 20;
    q.u.unreg.session = x->session;
    q.u.unreg.region.id = 4242;
    expect_req(x, "unregister an unknown region", &q, RN_UNKNOWN_REGION);

    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_REGISTER;
    q.id = 21;
    q.u.reg.session = x->session;
    q.u.reg.kind = RNP_REGION_SHM;
    q.u.reg.size = x->region_size * 4;
    snprintf(q.u.reg.shm_name, sizeof q.u.reg.shm_name, "/rn-it.%d.bad", (int)getpid());
    expect_req(x, "register more than the object has", &q, RN_INVALID_ARGUMENT);
    snprintf(q.u.reg.shm_name, sizeof q.u.reg.shm_name, "/rn-it.%d.missing", (int)getpid());
    q.u.reg.size = 4096;
    q.id = 22;
    {
        /* A missing object is the caller's mistake or a system refusal;
         * either way an error that names the field. */
        if (rnr_call(x->sock, &q, &rep) != 0)
            fail_msg("register missing: no reply");
        assert_true(rep.status == RN_INVALID_ARGUMENT || rep.status == RN_SYSTEM);
        assert_non_null(strstr(rep.error, "shm_name"));
        x->cases++;
    }
    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_REGISTER;
    q.id = 23;
    q.u.reg.session = x->session;
    q.u.reg.kind = RNP_REGION_CUDA_IPC;
    q.u.reg.size = 4096;
    q.u.reg.ipc_handle[0] = 1;
    q.u.reg.device_uuid[0] = 1;
    expect_req(x, "CUDA IPC on the CPU backend", &q, RN_UNSUPPORTED);
}

static void test_bad_input(void **state)
{
    rnh_daemon *d = *state;
    static rnp_request q;
    ctx x = {0};
    char name[64];
    int fd;
    void *base;
    long rss0, rss1;
    int64_t t0;
    rn_client *c;
    rn_health_info h;

    /* This test registers shared memory by name on a plain socket, as a
     * client from before the session channel does. */
    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    assert_int_equal(rnh_start(d), 0);
    x.region_size = 1 << 16;
    snprintf(name, sizeof name, "/rn-it.%d.bad", (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)x.region_size), 0);
    base = mmap(NULL, x.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(base != MAP_FAILED);
    x.sock = rnr_open(d->endpoint);
    assert_true(x.sock >= 0);
    assert_int_equal(rnr_hello(x.sock, &x.session), 0);
    assert_int_equal(rnr_register(x.sock, &x.session, name, x.region_size, &x.region), 0);

    /* A valid request works before... */
    valid_bwd(&q, &x);
    expect_req(&x, "valid bwd", &q, 0);
    /* A BWD refused as it is decoded (eps < 0) counts as a BWD, not as an
     * unknown request (it did before). */
    int64_t bwd0 = rnh_stat(d, "requests.bwd"), unknown0 = rnh_stat(d, "requests.unknown");
    valid_bwd(&q, &x);
    q.u.bwd.eps = -1.0f;
    expect_req(&x, "bwd with eps -1", &q, RN_INVALID_ARGUMENT);
    assert_int_equal(rnh_stat(d, "requests.bwd"), bwd0 + 1);
    assert_int_equal(rnh_stat(d, "requests.unknown"), unknown0);

    /* Warm up (allocator pools, histograms), then measure. */
    for (int i = 0; i < 5; i++)
        bad_round(&x);
    rss0 = rnh_vmrss_kb(d->pid);
    t0 = rnh_now_ms();
    for (int i = 0; i < 200; i++)
        bad_round(&x);
    rss1 = rnh_vmrss_kb(d->pid);
    printf("%d bad requests in %lld ms; daemon VmRSS %ld kB -> %ld kB\n", x.cases,
           (long long)(rnh_now_ms() - t0), rss0, rss1);
    assert_true(rss0 > 0 && rss1 > 0);
    assert_true(rss1 - rss0 < (rnh_asan() ? 4096 : 1024));

    /* ... and after; the daemon is healthy and counted the errors. */
    valid_bwd(&q, &x);
    expect_req(&x, "valid bwd", &q, 0);
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_OK);
    rn_close(c);
    assert_true(rnh_stat(d, "errors.MALFORMED") >= 205 * 40);
    assert_int_equal(rnh_stat(d, "requests.bwd") >= 2, 1);

    rnr_close(x.sock);
    munmap(base, x.region_size);
    shm_unlink(name);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

/*
 * A message over the daemon's size limit never reaches it: nanomsg drops it
 * (and the connection) below the protocol, so no reply comes.  The daemon
 * must stay up and serve everyone else.
 */
/*
 * Sizes around the limits (PROTOCOL.md section 1): a body of up to
 * RNP_MAX_MSG bytes is decoded (this one is valid msgpack but no request);
 * one of up to RNP_MAX_RECV bytes gets TOO_BIG; a longer one is dropped by
 * nanomsg with its connection, unanswered.  Every answered size gets exactly
 * one reply, and the daemon serves on.
 */
static void test_oversize(void **state)
{
    rnh_daemon *d = *state;
    static uint8_t big[RNP_MAX_RECV + 4096];
    static const size_t sizes[] = {RNP_MAX_MSG - 3, RNP_MAX_MSG, RNP_MAX_MSG + 1,
                                   RNP_MAX_MSG + 4, RNP_MAX_RECV, RNP_MAX_RECV + 4096};
    int t = 2000;
    rn_client *c;
    rn_health_info h;

    assert_int_equal(rnh_start(d), 0);
    memset(big, 0xa5, sizeof big);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t len = sizes[i];
        int sock = rnr_open(d->endpoint);
        void *m = NULL;
        assert_true(sock >= 0);
        assert_int_equal(nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVTIMEO, &t, sizeof t), 0);
        big[0] = 0xc6; /* bin32 of the rest: valid msgpack, no request */
        big[1] = (uint8_t)((len - 5) >> 24);
        big[2] = (uint8_t)((len - 5) >> 16);
        big[3] = (uint8_t)((len - 5) >> 8);
        big[4] = (uint8_t)((len - 5) & 0xff);
        assert_int_equal(nn_send(sock, big, len, 0), (int)len);
        int n = nn_recv(sock, &m, NN_MSG, 0);
        printf("%zu bytes: %s\n", len, n < 0 ? "no reply" : "a reply");
        if (len > RNP_MAX_RECV) {
            assert_true(n < 0);
        } else {
            rnp_error err;
            if (n < 0)
                fail_msg("%zu bytes: no reply", len);
            assert_int_equal(rnp_decode_reply(m, (size_t)n, &rep, &err), 0);
            printf("  %s: %s\n", rn_err_name(rep.status), rep.error);
            if (len > RNP_MAX_MSG)
                assert_int_equal(rep.status, RN_TOO_BIG);
            else
                assert_true(rep.status != 0 && rep.status != RN_TOO_BIG);
            nn_freemsg(m);
        }
        rnr_close(sock);
    }
    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_health(c, &h), 0);
    assert_int_equal(h.state, RN_HEALTH_OK);
    assert_int_equal(rn_ping(c, NULL), 0);
    rn_close(c);
    assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_input, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_oversize, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
