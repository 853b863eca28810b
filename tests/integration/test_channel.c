/* SPDX-License-Identifier: MIT */
/*
 * test_channel - the session channel: who a client is, and what it may make
 * the daemon touch.
 *
 * - A client of another user (nobody, let in by the socket's group) cannot
 *   make a root daemon read or write a root-only 0600 shm object: REGISTER by
 *   name is refused, and it cannot open the object to pass its descriptor.
 * - AUTH takes only a live capability, once, on one connection; descriptors
 *   come only with REGISTER_FD, exactly one, of a large enough object.
 * - A HELLO's pid is a claim: AUTH binds the verified one, whose exit ends
 *   the session; HELLOs nobody authenticates end, so they cannot lock other
 *   clients out.
 * - Sessions per verified uid are limited; the drain removes the channel's
 *   socket file.
 * - libclient passes buffers only to a channel whose peer is the caller's
 *   own user, root or the service user.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nanomsg/nn.h>

#include "rn_test.h"
#include "integration/harness.h"
#include "integration/raw.h"
#include "integration/rawchan.h"

/* A raw HELLO claiming pid; the session in *s.  Returns the status. */
static int hello_as(int sock, uint32_t pid, rnp_session *s)
{
    static rnp_request q;
    static rnp_reply r;

    memset(&q, 0, sizeof q);
    q.version = RNP_VERSION;
    q.op = RN_OP_HELLO;
    q.id = 1;
    snprintf(q.u.hello.client_name, sizeof q.u.hello.client_name, "claims pid %u", (unsigned)pid);
    q.u.hello.pid = pid;
    if (rnr_call(sock, &q, &r) != 0)
        return -1;
    *s = r.u.hello.session;
    return r.status;
}

/* Let another user reach the socket files inside the test's directory. */
static void open_dir(const rnh_daemon *d)
{
    assert_int_equal(chmod(d->dir, 0711), 0);
}

static void test_other_uid(void **state)
{
    rnh_daemon *d = *state;
    char name[64], line[200], want[200];
    uint8_t *secret;
    rnh_proc p;
    int fd;

    /* A root-only object with known contents. */
    snprintf(name, sizeof name, "/rn-it.%d.secret", (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, 0600), 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    secret = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(secret != MAP_FAILED);
    memset(secret, 'S', 4096);

    rnh_arg(d, "--socket-group");
    rnh_arg(d, "nogroup");
    assert_int_equal(rnh_start(d), 0);
    open_dir(d);
    {
        const char *argv[] = {"prog_chan", "--drop", d->endpoint, "attack", name, NULL};
        assert_int_equal(rnh_spawn("prog_chan", argv, false, &p), 0);
    }
    /* The object is out of the client's own reach... */
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    assert_string_equal(line, "open EACCES");
    /* ...and the daemon no longer opens names for it. */
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    snprintf(want, sizeof want, "register_name %d", RN_UNSUPPORTED);
    assert_string_equal(line, want);
    /* The channel knows who it is. */
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    snprintf(want, sizeof want, "auth 0 pid=%d uid=65534", (int)p.pid);
    assert_string_equal(line, want);
    /* And its own buffers work as usual, by descriptor. */
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    assert_string_equal(line, "libclient 0");
    assert_int_equal(rnh_wait(&p, 20000), 0);
    rnh_proc_close(&p);

    for (int i = 0; i < 4096; i++)
        assert_int_equal(secret[i], 'S');
    assert_int_equal(rnh_stat(d, "regions.active"), 0);
    munmap(secret, 4096);
    shm_unlink(name);
    RNH_PASS(d);
}

/* At --max-sessions, a HELLO evicts the oldest unauthenticated session
 * only where that frees a place at once, and only a HELLO not refused for
 * its pid: one with a BWD in flight is kept
 * (it was ended, and the newcomer refused all the same: the old client's
 * session gone for nothing, found in review), and the newcomer gets BUSY.
 * The old client (an older one, without a channel: --auth-timeout 0 and
 * memory by name) goes on. */
static void test_hello_evicts_only_idle(void **state)
{
    rnh_daemon *d = *state;
    const uint64_t m = 4096, n = 4096, t = m * n * 2;
    static rnp_request q, h, bye;
    static rnp_reply r;
    static uint8_t buf[RNP_MAX_MSG];
    char name[64];
    rnp_session cap;
    rnp_error err;
    uint32_t reg;
    size_t len;

    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "1");
    rnh_arg(d, "--allow-shm-names");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "0");
    rnh_arg(d, "--threads");
    rnh_arg(d, "1");
    assert_int_equal(rnh_start(d), 0);
    snprintf(name, sizeof name, "/rn-it-evict-%d", (int)getpid());
    int shm = shm_open(name, O_CREAT | O_RDWR | O_EXCL, 0600);
    assert_true(shm >= 0);
    assert_int_equal(ftruncate(shm, (off_t)(3 * t)), 0);
    uint16_t *p = mmap(NULL, 3 * t, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    assert_true(p != MAP_FAILED);
    for (uint64_t i = 0; i < 2 * m * n; i++)
        p[i] = 0x3f80; /* bf16 ones */
    int a = rnr_open(d->endpoint);
    assert_true(a >= 0);
    assert_int_equal(rnr_hello(a, &cap), 0);
    assert_int_equal(rnr_register(a, &cap, name, 3 * t, &reg), 0);
    usleep(1200000); /* (past the grace an unauthenticated session has) */
    q.version = RNP_VERSION;
    q.op = RN_OP_BWD;
    q.id = 5;
    rnp_bwd_req *b = &q.u.bwd;
    b->session = cap;
    b->seq = 1;
    b->m = m, b->n = n;
    b->x_dtype = b->dy_dtype = b->dx_dtype = RN_DTYPE_BF16;
    b->x = (rnp_tensor){.region = {reg}, .offset = 0, .stride = n};
    b->dy = (rnp_tensor){.region = {reg}, .offset = t, .stride = n};
    b->dx = (rnp_tensor){.region = {reg}, .offset = 2 * t, .stride = n};
    b->eps = 1e-6f;
    b->ready_slot = -1;
    b->mode = 1;
    assert_int_equal(rnp_encode_request(&q, buf, sizeof buf, &len, &err), 0);
    assert_int_equal(nn_send(a, buf, len, 0), (int)len); /* in flight */
    assert_int_equal(rnh_wait_stat(d, "inflight.current", 1, 10000), 0);
    int c = rnr_open(d->endpoint);
    assert_true(c >= 0);
    h.version = RNP_VERSION;
    h.op = RN_OP_HELLO;
    h.id = 7;
    snprintf(h.u.hello.client_name, sizeof h.u.hello.client_name, "newcomer");
    h.u.hello.pid = (uint32_t)getpid();
    assert_int_equal(rnr_call(c, &h, &r), 0);
    assert_int_equal(r.status, RN_BUSY);
    void *mm;
    int got = nn_recv(a, &mm, NN_MSG, 0);
    assert_true(got > 0);
    assert_int_equal(rnp_decode_reply(mm, (size_t)got, &r, &err), 0);
    nn_freemsg(mm);
    assert_int_equal(r.status, 0); /* the old client's call ran */
    /* Idle now: a HELLO refused for its pid (a process that exited) evicts
     * nobody (before, the old session was ended for a newcomer refused). */
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    assert_true(gone > 0 && waitpid(gone, NULL, 0) == gone);
    h.id = 8;
    h.u.hello.pid = (uint32_t)gone;
    assert_int_equal(rnr_call(c, &h, &r), 0);
    assert_int_equal(r.status, RN_INVALID_ARGUMENT);
    assert_non_null(strstr(r.error, "hello.pid"));
    bye.version = RNP_VERSION;
    bye.op = RN_OP_BYE;
    bye.id = 9;
    bye.u.bye = cap;
    assert_int_equal(rnr_call(a, &bye, &r), 0);
    assert_int_equal(r.status, 0); /* its session was kept */
    assert_int_equal(rnh_stat(d, "sessions.unauth_ended"), 0);
    rnr_close(a);
    rnr_close(c);
    munmap(p, 3 * t);
    close(shm);
    shm_unlink(name);
    RNH_PASS(d);
}

/* An empty datagram that carries descriptors, before any AUTH: answered
 * MALFORMED, its descriptors closed, the connection kept.  They were left
 * open in the daemon (recvmsg's 0 was taken for the peer's close before the
 * descriptors were collected): anyone who could reach the socket could fill
 * the daemon's descriptor table and pin memory (found in review). */
static void test_empty_datagram_with_fds(void **state)
{
    rnh_daemon *d = *state;
    char msg[RNP_CHAN_ERROR_MSG + 1];
    int fds[8];

    assert_int_equal(rnh_start(d), 0);
    int before = rnh_fd_count(d->pid);
    assert_true(before > 0);
    for (int k = 0; k < 20; k++) {
        int c = rnr_chan_connect(d->endpoint);
        assert_true(c >= 0);
        for (int i = 0; i < 8; i++) {
            fds[i] = memfd_create("rn-it-empty", MFD_CLOEXEC);
            assert_true(fds[i] >= 0);
        }
        assert_int_equal(rnr_chan_send(c, "", 0, fds, 8), 0);
        for (int i = 0; i < 8; i++)
            close(fds[i]);
        if (k == 0) /* (answered, and the connection still served) */
            assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_MALFORMED);
        close(c);
    }
    /* Every datagram answered first: until then the daemon may still be
     * accepting connections, and a count taken early would pass while the
     * next reads more (the test once failed so, on a loaded host). */
    assert_int_equal(rnh_wait_stat_ge(d, "errors.MALFORMED", 20, 10000), 0);
    int64_t t0 = rnh_now_ms();
    int now;
    while ((now = rnh_fd_count(d->pid)) > before + 2 && rnh_now_ms() - t0 < 5000)
        usleep(10000);
    if (now > before + 2)
        fail_msg("the daemon holds %d descriptors, %d before 160 were sent", now, before);
    RNH_PASS(d);
}

/* VMM_CHUNK and VMM_MAP (CUDA virtual memory) reach the core on any
 * backend: before AUTH, the session is unknown; the CPU backend maps no
 * CUDA memory; VMM_MAP's count and the descriptors are checked as
 * PROTOCOL.md section 12 says; nothing is left mapped.  (The CUDA backend's
 * side: tests/gpu/test_vmm_cuda.c.) */
static void test_vmm_messages(void **state)
{
    rnh_daemon *d = *state;
    uint8_t m[RNP_CHAN_VMM_CHUNK_LEN], mm[RNP_CHAN_VMM_MAP_LEN];
    char msg[RNP_CHAN_ERROR_MSG + 1];
    rnp_session s;
    uint32_t pid, uid;
    int sock, c, mfd;

    assert_int_equal(rnh_start(d), 0);
    assert_true((sock = rnr_open(d->endpoint)) >= 0);
    assert_int_equal(rnr_hello(sock, &s), 0);
    assert_true((c = rnr_chan_connect(d->endpoint)) >= 0);
    mfd = memfd_create("rn-it-vmm", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(ftruncate(mfd, 2 << 20), 0);

    rnp_chan_hdr(m, RNP_CHAN_VMM_CHUNK);
    memset(m + RNP_CHAN_HDR, 0, sizeof m - RNP_CHAN_HDR);
    rnp_le64_put(m + RNP_CHAN_HDR + 8, 2 << 20);
    rnp_chan_hdr(mm, RNP_CHAN_VMM_MAP);
    memset(mm + RNP_CHAN_HDR, 0, sizeof mm - RNP_CHAN_HDR);

    /* Before AUTH. */
    assert_int_equal(rnr_chan_send(c, m, sizeof m, &mfd, 1), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_UNKNOWN_SESSION);
    assert_non_null(strstr(msg, "vmm_chunk"));
    assert_int_equal(rnr_chan_send(c, mm, sizeof mm, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_UNKNOWN_SESSION);
    assert_non_null(strstr(msg, "vmm_map"));
    assert_int_equal(rnr_chan_auth(c, &s, &pid, &uid, msg, sizeof msg), 0);

    /* A chunk carries exactly one descriptor, and has its exact length. */
    assert_int_equal(rnr_chan_send(c, m, sizeof m, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_string_equal(msg, "vmm_chunk: carries exactly one descriptor, got 0");
    assert_int_equal(rnr_chan_send(c, m, sizeof m - 1, &mfd, 1), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_MALFORMED);
    assert_string_equal(msg, "vmm_chunk: 31 bytes, expected 32");
    /* VMM_MAP carries none, and without chunks its count is wrong. */
    assert_int_equal(rnr_chan_send(c, mm, sizeof mm, &mfd, 1), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_string_equal(msg, "vmm_map: carries no descriptors, got 1");
    assert_int_equal(rnr_chan_send(c, mm, sizeof mm, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_string_equal(msg, "vmm_map.count: a range has at least one chunk");
    rnp_le32_put(mm + RNP_CHAN_HDR + 8, 1);
    assert_int_equal(rnr_chan_send(c, mm, sizeof mm, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_string_equal(msg, "vmm_map.count: 1, but 0 chunks were received for the range");
    /* The CPU backend maps no CUDA memory. */
    assert_int_equal(rnr_chan_send(c, m, sizeof m, &mfd, 1), 0);
    assert_int_equal(rnr_chan_recv(c, NULL, NULL, msg, sizeof msg), RN_UNSUPPORTED);
    assert_string_equal(msg, "vmm_chunk: the cpu backend maps no CUDA memory");
    /* The connection lives on: a shm buffer still registers. */
    {
        uint32_t region = 0;
        assert_int_equal(rnr_chan_register(c, mfd, 4096, &region, msg, sizeof msg), 0);
        assert_true(region != 0);
    }
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    close(mfd);
    close(c);
    close(sock);
    RNH_PASS(d);
}

static void test_auth_rules(void **state)
{
    rnh_daemon *d = *state;
    rnp_session a, b, wrong;
    uint32_t pid = 0, uid = 0, region = 0;
    char msg[200];
    int sock, c1, c2, c3, mfd, fds[2];
    uint8_t m[RNP_CHAN_REGISTER_FD_LEN];

    assert_int_equal(rnh_start(d), 0);
    sock = rnr_open(d->endpoint);
    assert_true(sock >= 0);
    assert_int_equal(hello_as(sock, (uint32_t)getpid(), &a), 0);
    assert_int_equal(hello_as(sock, (uint32_t)getpid(), &b), 0);
    assert_true((c1 = rnr_chan_connect(d->endpoint)) >= 0);
    assert_true((c2 = rnr_chan_connect(d->endpoint)) >= 0);
    assert_true((c3 = rnr_chan_connect(d->endpoint)) >= 0);

    /* Nothing before AUTH. */
    mfd = memfd_create("rn-it", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(ftruncate(mfd, 4096), 0);
    assert_int_equal(rnr_chan_register(c1, mfd, 4096, &region, msg, sizeof msg),
                     RN_UNKNOWN_SESSION);

    /* A capability nobody was given. */
    wrong = a;
    wrong.b[15] ^= 1;
    assert_int_equal(rnr_chan_auth(c1, &wrong, &pid, &uid, msg, sizeof msg), RN_UNKNOWN_SESSION);

    /* The right one: bound to the verified peer. */
    assert_int_equal(rnr_chan_auth(c1, &a, &pid, &uid, msg, sizeof msg), 0);
    assert_int_equal(pid, (uint32_t)getpid());
    assert_int_equal(uid, (uint32_t)getuid());
    /* Once: not on another connection, and this one takes no second. */
    assert_int_equal(rnr_chan_auth(c2, &a, &pid, &uid, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "already"));
    assert_int_equal(rnr_chan_auth(c1, &b, &pid, &uid, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_int_equal(rnr_chan_auth(c3, &b, &pid, &uid, msg, sizeof msg), 0);

    /* Descriptors: never with AUTH, exactly one with REGISTER_FD, of an
     * object at least as large as claimed, and a shared memory object. */
    {
        uint8_t am[RNP_CHAN_AUTH_LEN];
        rnp_chan_hdr(am, RNP_CHAN_AUTH);
        memcpy(am + RNP_CHAN_HDR, b.b, sizeof b.b);
        assert_int_equal(rnr_chan_send(c2, am, sizeof am, &mfd, 1), 0);
        assert_int_equal(rnr_chan_recv(c2, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
        assert_non_null(strstr(msg, "descriptor"));
    }
    rnp_chan_hdr(m, RNP_CHAN_REGISTER_FD);
    rnp_le64_put(m + RNP_CHAN_HDR, 4096);
    assert_int_equal(rnr_chan_send(c1, m, sizeof m, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c1, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    fds[0] = fds[1] = mfd;
    assert_int_equal(rnr_chan_send(c1, m, sizeof m, fds, 2), 0);
    assert_int_equal(rnr_chan_recv(c1, NULL, NULL, msg, sizeof msg), RN_INVALID_ARGUMENT);
    assert_int_equal(rnr_chan_register(c1, mfd, 8192, &region, msg, sizeof msg),
                     RN_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "claimed"));
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(rnr_chan_register(c1, fds[0], 4096, &region, msg, sizeof msg),
                     RN_INVALID_ARGUMENT);
    close(fds[0]);
    close(fds[1]);
    /* A short message and a wrong magic: answered, not trusted. */
    assert_int_equal(rnr_chan_send(c1, m, 7, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c1, NULL, NULL, msg, sizeof msg), RN_MALFORMED);
    m[0] ^= 0xff;
    assert_int_equal(rnr_chan_send(c1, m, sizeof m, NULL, 0), 0);
    assert_int_equal(rnr_chan_recv(c1, NULL, NULL, msg, sizeof msg), RN_MALFORMED);
    assert_int_equal(rnr_chan_register(c1, mfd, 4096, &region, msg, sizeof msg), 0);
    assert_true(region != 0);
    assert_int_equal(rnh_stat(d, "regions.active"), 1);
    close(mfd);

    /* REGISTER by name is refused by default, naming the channel. */
    {
        char name[64];
        uint32_t r2 = 0;
        snprintf(name, sizeof name, "/rn-it.%d.byname", (int)getpid());
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 4096), 0);
        close(fd);
        assert_int_equal(rnr_register(sock, &a, name, 4096, &r2), RN_UNSUPPORTED);
        shm_unlink(name);
    }

    /* The connection is the session: closing it ends the session and
     * releases its region. */
    close(c1);
    assert_int_equal(rnh_wait_stat(d, "regions.active", 0, 10000), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.unauthenticated", 0, 10000), 0);
    close(c2);
    close(c3);
    rnr_close(sock);
    RNH_PASS(d);
}

/* One counter from c's own STATS, -1 on error. */
static int64_t stat_of(rn_client *c, const char *name)
{
    static rn_stats_info s;
    if (rn_stats(c, &s) != 0)
        return -1;
    return (int64_t)rn_stats_get(&s, name, (uint64_t)-1);
}

static void test_claimed_pid(void **state)
{
    rnh_daemon *d = *state;
    char line[200], want[200];
    rnp_session s[8];
    rn_client *c, *late;
    rnh_proc p;
    int sock;
    int64_t t0;

    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "8");
    rnh_arg(d, "--auth-timeout");
    rnh_arg(d, "2");
    assert_int_equal(rnh_start(d), 0);

    /* A HELLO claiming pid 1: after AUTH the verified pid counts, and its
     * exit ends the session. */
    {
        const char *argv[] = {"prog_chan", d->endpoint, "claim1", NULL};
        assert_int_equal(rnh_spawn("prog_chan", argv, false, &p), 0);
    }
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    snprintf(want, sizeof want, "auth 0 pid=%d", (int)p.pid);
    assert_string_equal(line, want);
    /* It exits while its child keeps the channel open. */
    assert_int_equal(rnh_wait(&p, 20000), 0);
    assert_int_equal(rnh_wait_stat(d, "clients.died", 1, 10000), 0);
    assert_int_equal(rnh_wait_stat(d, "sessions.active", 0, 10000), 0);
    close(p.in_fd);
    p.in_fd = -1;
    rnh_proc_close(&p);

    /* Every place taken by HELLOs claiming pid 1 that nobody
     * authenticates (c asks for STATS, which needs no session). */
    c = rnh_client(d);
    assert_non_null(c);
    sock = rnr_open(d->endpoint);
    assert_true(sock >= 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(hello_as(sock, 1, &s[i]), 0);
    assert_int_equal(hello_as(sock, 1, &s[0]), RN_BUSY);
    assert_int_equal(stat_of(c, "sessions.unauthenticated"), 8);

    /* They end (auth-timeout, or a newcomer takes the place of the
     * oldest), touched or not, and a new client gets in. */
    t0 = rnh_now_ms();
    while (stat_of(c, "sessions.unauth_ended") < 8 && rnh_now_ms() - t0 < 20000) {
        static rnp_request q;
        static rnp_reply r;
        memset(&q, 0, sizeof q);
        q.version = RNP_VERSION;
        q.op = RN_OP_UNREGISTER;
        q.id = 3;
        q.u.unreg.session = s[7];
        q.u.unreg.region.id = 1;
        assert_int_equal(rnr_call(sock, &q, &r), 0);
        poll(NULL, 0, 20);
    }
    assert_int_equal(stat_of(c, "sessions.unauth_ended"), 8);
    assert_int_equal(stat_of(c, "sessions.unauthenticated"), 0);
    late = rnh_client(d);
    assert_non_null(late);
    {
        void *b = NULL;
        assert_int_equal(rn_buffer_alloc(late, 4096, &b), 0);
    }
    rn_close(late);
    rn_close(c);
    rnr_close(sock);
    RNH_PASS(d);
}

static void test_uid_quota(void **state)
{
    rnh_daemon *d = *state;
    char line[200];
    rnh_proc p;
    rn_client *c[3];

    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "8");
    rnh_arg(d, "--max-sessions-per-uid");
    rnh_arg(d, "2");
    rnh_arg(d, "--socket-group");
    rnh_arg(d, "nogroup");
    assert_int_equal(rnh_start(d), 0);
    open_dir(d);
    {
        const char *argv[] = {"prog_chan", "--drop", d->endpoint, "sessions", "4", NULL};
        assert_int_equal(rnh_spawn("prog_chan", argv, false, &p), 0);
    }
    assert_true(rnh_read_line(&p, line, sizeof line, 30000) >= 0);
    printf("%s\n", line);
    assert_true(strncmp(line, "opened 2 rc=300 ", 16) == 0);
    assert_non_null(strstr(line, "max-sessions-per-uid"));
    /* The refused sessions did not linger; the daemon's own user is not
     * counted. */
    for (int i = 0; i < 3; i++) {
        void *b = NULL;
        assert_non_null(c[i] = rnh_client(d));
        assert_int_equal(rn_buffer_alloc(c[i], 4096, &b), 0);
    }
    assert_int_equal(stat_of(c[0], "sessions.unauthenticated"), 0);
    for (int i = 0; i < 3; i++)
        rn_close(c[i]);
    close(p.in_fd);
    p.in_fd = -1;
    assert_int_equal(rnh_wait(&p, 20000), 0);
    rnh_proc_close(&p);

    /* The drain removes the channel's socket with the daemon's. */
    {
        char path[300];
        snprintf(path, sizeof path, "%s" RNP_CHAN_SUFFIX, d->endpoint + 6);
        assert_int_equal(access(path, F_OK), 0);
        assert_int_equal(rnh_stop(d, RNH_STOP_TIMEOUT_MS), 0);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(errno, ENOENT);
    }
    RNH_PASS(d);
}

/* A channel socket planted by another user (nobody) where the daemon's
 * was: libclient refuses to pass its buffer there. */
static void test_untrusted_channel(void **state)
{
    rnh_daemon *d = *state;
    struct sockaddr_un sa;
    int go[2], ready[2], status;
    rn_client *c;
    void *b = NULL;
    pid_t pid;
    char x;

    assert_int_equal(rnh_start(d), 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s" RNP_CHAN_SUFFIX, d->endpoint + 6);
    assert_int_equal(unlink(sa.sun_path), 0);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(ready), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The listener's credentials are those of the process that called
         * listen(): bind where root may, then listen as nobody. */
        int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        close(go[1]);
        close(ready[0]);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
            chmod(sa.sun_path, 0666) != 0 || setgid(65534) != 0 || setuid(65534) != 0 ||
            listen(fd, 8) != 0)
            _exit(1);
        if (write(ready[1], "r", 1) != 1)
            _exit(1);
        _exit(read(go[0], &x, 1) >= 0 ? 0 : 1);
    }
    close(go[0]);
    close(ready[1]);
    assert_int_equal(read(ready[0], &x, 1), 1);

    c = rnh_client(d);
    assert_non_null(c);
    assert_int_equal(rn_buffer_alloc(c, 4096, &b), RN_ENDPOINT);
    assert_non_null(strstr(rn_last_error(c), "refusing to share buffers"));
    rn_close(c);
    close(go[1]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(ready[0]);
    RNH_PASS(d);
}

/* Idle connections to the session channel (anyone on the socket may open
 * them) do not lock clients out of AUTH: at the limit (max-sessions plus a
 * few) the oldest connection not yet authenticated is closed for the new
 * one.  Before, 16 idle connections with --max-sessions 4 made every
 * client's channel fail until they expired (10 s). */
static void test_idle_conns_evicted(void **state)
{
    rnh_daemon *d = *state;
    int fds[16];
    void *b;

    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "4");
    assert_int_equal(rnh_start(d), 0);
    for (int i = 0; i < 16; i++) {
        fds[i] = rnr_chan_connect(d->endpoint);
        assert_true(fds[i] >= 0);
    }
    usleep(200000);
    rn_client *c = rnh_client(d);
    assert_non_null(c);
    if (rn_buffer_alloc(c, 4096, &b) != 0)
        fail_msg("rn_buffer_alloc beside 16 idle connections: %s", rn_last_error(c));
    assert_int_equal(rn_buffer_free(c, b), 0);
    rn_close(c);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    RNH_PASS(d);
}

/*
 * At the connection limit a newcomer closes a connection not yet
 * authenticated of the user who holds the most: another user's flood of
 * idle connections (nobody here, 16 of them with --max-sessions 4, room for
 * 12) closes its own, not a client's connection between its connect and its
 * AUTH.  Before, the oldest went, which was the client's: its AUTH found
 * the connection closed.
 */
static void test_flood_other_uid(void **state)
{
    rnh_daemon *d = *state;
    uint32_t pid = 0, uid = 0;
    char msg[200], line[64];
    rnp_session a;
    rnh_proc p;
    int sock, ch;

    rnh_arg(d, "--max-sessions");
    rnh_arg(d, "4");
    rnh_arg(d, "--socket-group");
    rnh_arg(d, "nogroup");
    assert_int_equal(rnh_start(d), 0);
    open_dir(d);
    sock = rnr_open(d->endpoint);
    assert_true(sock >= 0);
    assert_int_equal(hello_as(sock, (uint32_t)getpid(), &a), 0);
    assert_true((ch = rnr_chan_connect(d->endpoint)) >= 0); /* the oldest, not yet AUTH */
    {
        const char *argv[] = {"prog_chan", "--drop", d->endpoint, "flood", "16", NULL};
        assert_int_equal(rnh_spawn("prog_chan", argv, false, &p), 0);
    }
    assert_true(rnh_read_line(&p, line, sizeof line, 20000) >= 0);
    assert_string_equal(line, "flooded 16");
    /* Every one of them accepted (or refused) by now: 1 + 16 = 17 for 12. */
    assert_int_equal(rnh_wait_stat(d, "channel.evicted", 5, 20000), 0);
    assert_int_equal(rnr_chan_auth(ch, &a, &pid, &uid, msg, sizeof msg), 0);
    assert_int_equal(pid, (uint32_t)getpid());
    assert_int_equal(rnh_stat(d, "channel.refused"), 0);
    close(p.in_fd);
    p.in_fd = -1;
    assert_int_equal(rnh_wait(&p, 20000), 0);
    rnh_proc_close(&p);
    close(ch);
    rnr_close(sock);
    RNH_PASS(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_other_uid, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_empty_datagram_with_fds, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_hello_evicts_only_idle, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_auth_rules, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_vmm_messages, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_claimed_pid, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_uid_quota, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_untrusted_channel, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_idle_conns_evicted, rnh_setup, rnh_teardown),
        cmocka_unit_test_setup_teardown(test_flood_other_uid, rnh_setup, rnh_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
