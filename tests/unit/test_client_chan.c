/* SPDX-License-Identifier: MIT */
/*
 * test_client_chan.c - libclient's end of the session channel
 * (client/chan.c) against a scripted daemon on the other end of a
 * SOCK_SEQPACKET socketpair, run by a thread: a request whose reply does
 * not come within the client's timeout fails with RN_TIMEOUT and keeps the
 * connection; the late reply is read before the next request, which gets
 * its own full timeout; a late REGION_OK's region is given back
 * (chan_forget); a VMM chunk given up is followed by a VMM_MAP of count 0
 * (the daemon drops the range's chunks); late replies that came are read
 * at a call without waiting (rnc_chan_collect), the last error kept; a
 * connection closed while a reply is owed is the session's end.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rn_test.h"
#include "client_int.h"

#define T_MS 400

typedef struct peer {
    int fd;
    int step;                    /* which script */
    uint16_t got[8];             /* the types of the requests it read */
    uint32_t map_count;          /* a VMM_MAP's count */
    int ngot;
    int pipe_r;                  /* case 6: the read end of the pipe it sent */
} peer;

typedef struct world {
    rn_client *c;
    peer p;
    pthread_t t;
    bool joined;
    uint32_t forgot[4];
    int nforgot;
} world;

static world *cur;

static int forget(rn_client *c, uint32_t region)
{
    (void)c;
    cur->forgot[cur->nforgot++] = region;
    return RN_SYSTEM; /* (its failure must not show in the caller's error) */
}

static void ms_sleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Read one request (its descriptor, if any, discarded with the data). */
static void take(peer *p)
{
    uint8_t b[RNP_CHAN_MAX];
    ssize_t n = recv(p->fd, b, sizeof b, 0);
    if (n < 8)
        return;
    uint16_t t = (uint16_t)(b[6] | b[7] << 8);
    p->got[p->ngot++] = t;
    if (t == RNP_CHAN_VMM_MAP && n >= 20)
        p->map_count = (uint32_t)(b[16] | b[17] << 8 | b[18] << 16 | (uint32_t)b[19] << 24);
}

static void answer(peer *p, int type, uint32_t v)
{
    rnp_chan_msg m = {.type = type};
    uint8_t b[RNP_CHAN_MAX];
    if (type == RNP_CHAN_REGION_OK)
        m.u.region_ok.region = v;
    else if (type == RNP_CHAN_VMM_CHUNK_OK)
        m.u.vmm_chunk_ok.index = v;
    else if (type == RNP_CHAN_ERROR) {
        m.u.error.code = v;
        snprintf(m.u.error.msg, sizeof m.u.error.msg, "vmm_map.count: refused");
    }
    size_t n = rnp_chan_encode(&m, b);
    if (send(p->fd, b, n, MSG_NOSIGNAL) != (ssize_t)n)
        fprintf(stderr, "peer: send failed\n");
}

static void *run(void *arg)
{
    peer *p = arg;
    switch (p->step) {
    case 1: /* no answer in time, then late; the next request at once */
        take(p);
        ms_sleep(T_MS + 200);
        answer(p, RNP_CHAN_REGION_OK, 77);
        take(p);
        answer(p, RNP_CHAN_REGION_OK, 78);
        break;
    case 2: /* the second call: the late reply near its deadline, then its own */
        take(p);
        ms_sleep(T_MS + 100); /* (the first call gave up) */
        take(p);              /* never: the second waits for the late reply first */
        break;
    case 3: /* a VMM chunk given up: then its abort comes */
        take(p);
        take(p);
        answer(p, RNP_CHAN_VMM_CHUNK_OK, 0);
        answer(p, RNP_CHAN_ERROR, RN_INVALID_ARGUMENT);
        break;
    case 5: /* late near the second call's first deadline, then its own reply */
        take(p);
        ms_sleep(T_MS + 300);
        answer(p, RNP_CHAN_REGION_OK, 90);
        take(p);
        ms_sleep(250);
        answer(p, RNP_CHAN_REGION_OK, 91);
        break;
    case 6: { /* a reply that brings a descriptor nobody asked for */
        int pp[2];
        take(p);
        if (pipe(pp) != 0)
            break;
        rnp_chan_msg m = {.type = RNP_CHAN_REGION_OK};
        uint8_t b[RNP_CHAN_MAX];
        union {
            struct cmsghdr align;
            char c[CMSG_SPACE(sizeof(int))];
        } cb;
        struct iovec iov = {b, 0};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.c,
                            .msg_controllen = sizeof cb.c};
        m.u.region_ok.region = 5;
        iov.iov_len = rnp_chan_encode(&m, b);
        memset(&cb, 0, sizeof cb);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pp[1], sizeof(int));
        if (sendmsg(p->fd, &mh, MSG_NOSIGNAL) < 0)
            fprintf(stderr, "peer: sendmsg failed\n");
        close(pp[1]);
        p->pipe_r = pp[0];
        break;
    }
    case 4: /* closed while a reply is owed */
        take(p);
        ms_sleep(T_MS + 100);
        shutdown(p->fd, SHUT_RDWR);
        break;
    }
    return NULL;
}

static world *mk(int step)
{
    int sv[2];
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    w->c = calloc(1, sizeof *w->c);
    assert_non_null(w->c);
    w->c->timeout_ms = T_MS;
    w->c->chan = sv[0];
    assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
    w->c->have_chan = true;
    w->c->chan_forget = forget;
    w->p.fd = sv[1];
    w->p.pipe_r = -1;
    w->p.step = step;
    cur = w;
    assert_int_equal(pthread_create(&w->t, NULL, run, &w->p), 0);
    return w;
}

static void join(world *w)
{
    if (!w->joined)
        pthread_join(w->t, NULL);
    w->joined = true;
}

/* (the client's end closes first: a peer still reading sees the end) */
static void done(world *w)
{
    rnc_chan_close(w->c);
    join(w);
    close(w->p.fd);
    free(w->c);
    free(w);
    cur = NULL;
}

static uint64_t ms_since(uint64_t t0)
{
    return (rnc_now_ns() - t0) / 1000000u;
}

static void test_timeout_keeps_connection(void **state)
{
    (void)state;
    world *w = mk(1);
    uint32_t region = 0;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_TIMEOUT);
    assert_non_null(strstr(w->c->last_error, "no reply within 400 ms"));
    assert_true(w->c->have_chan);
    assert_int_equal(w->c->chan_nowed, 1);
    assert_int_equal(w->c->chan_owed[0], RNP_CHAN_REGION_OK);
    /* The late reply is its request's, not the next one's. */
    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), 0);
    assert_int_equal(region, 78);
    assert_int_equal(w->nforgot, 1);
    assert_int_equal(w->forgot[0], 77);
    assert_int_equal(w->c->chan_nowed, 0);
    assert_int_equal(w->p.ngot, 2);
    close(fd);
    done(w);
}

/* Nothing comes: the second call says that the earlier reply is still
 * owed, sends nothing, and returns within its own timeout. */
static void test_still_owed(void **state)
{
    (void)state;
    world *w = mk(2);
    uint32_t region = 0;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_TIMEOUT);
    uint64_t t0 = rnc_now_ns();
    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_TIMEOUT);
    assert_true(ms_since(t0) < T_MS + 300);
    assert_non_null(strstr(w->c->last_error, "has not answered an earlier request"));
    assert_int_equal(w->c->chan_nowed, 1);
    /* (the peer's second take ends when the connection closes) */
    close(fd);
    done(w);
    (void)region;
}

/* A VMM chunk whose reply does not come: a VMM_MAP of count 0 follows at
 * once, and both replies are owed; a call reads them once they came,
 * without waiting, and keeps its last error. */
static void test_vmm_chunk_abort(void **state)
{
    (void)state;
    world *w = mk(3);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    w->c->timeout_ms = 50;
    /* (the peer answers only after the abort: the chunk's wait ends first) */
    assert_int_equal(rnc_chan_vmm_chunk(w->c, fd, 0, 0, 2u << 20), RN_TIMEOUT);
    assert_int_equal(w->c->chan_nowed, 2);
    assert_int_equal(w->c->chan_owed[1], RNP_CHAN_ERROR);
    join(w);
    assert_int_equal(w->p.ngot, 2);
    assert_int_equal(w->p.got[0], RNP_CHAN_VMM_CHUNK);
    assert_int_equal(w->p.got[1], RNP_CHAN_VMM_MAP);
    assert_int_equal(w->p.map_count, 0);
    ms_sleep(20);
    snprintf(w->c->last_error, sizeof w->c->last_error, "kept");
    rnc_chan_collect(w->c);
    assert_int_equal(w->c->chan_nowed, 0);
    assert_string_equal(w->c->last_error, "kept");
    assert_int_equal(w->nforgot, 0);
    close(fd);
    done(w);
}

/* With nothing there yet, a call's collect returns at once. */
static void test_collect_does_not_wait(void **state)
{
    (void)state;
    world *w = mk(4);
    uint32_t region = 0;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_TIMEOUT);
    uint64_t t0 = rnc_now_ns();
    rnc_chan_collect(w->c);
    assert_true(ms_since(t0) < 50);
    assert_int_equal(w->c->chan_nowed, 1);
    /* Then the daemon closes the connection: the session is gone. */
    join(w);
    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_UNKNOWN_SESSION);
    assert_false(w->c->have_chan);
    assert_int_equal(w->c->chan_nowed, 0);
    close(fd);
    done(w);
}

/* The request after a late reply gets its own full timeout from when that
 * reply was read: here the late reply comes 300 ms into the second call,
 * and the second reply 250 ms after it, past the second call's first
 * 400 ms but well within 400 ms of the late one. */
static void test_fresh_deadline(void **state)
{
    (void)state;
    world *w = mk(5);
    uint32_t region = 0;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), RN_TIMEOUT);
    if (rnc_chan_register(w->c, fd, 4096, &region) != 0)
        fail_msg("the request after the late reply: %s", w->c->last_error);
    assert_int_equal(region, 91);
    assert_int_equal(w->nforgot, 1);
    assert_int_equal(w->forgot[0], 90);
    close(fd);
    done(w);
}

/* A descriptor that comes with a reply other than AUTH_OK is closed: the
 * pipe's read end sees its end once the client let go of the write end it
 * was sent (the peer closed its own). */
static void test_stray_descriptor_closed(void **state)
{
    (void)state;
    world *w = mk(6);
    uint32_t region = 0;
    char b;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    assert_int_equal(rnc_chan_register(w->c, fd, 4096, &region), 0);
    assert_int_equal(region, 5);
    join(w);
    assert_true(w->p.pipe_r >= 0);
    assert_int_equal(read(w->p.pipe_r, &b, 1), 0);
    assert_false(w->c->have_bell);
    close(w->p.pipe_r);
    close(fd);
    done(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_keeps_connection),
        cmocka_unit_test(test_still_owed),
        cmocka_unit_test(test_vmm_chunk_abort),
        cmocka_unit_test(test_collect_does_not_wait),
        cmocka_unit_test(test_fresh_deadline),
        cmocka_unit_test(test_stray_descriptor_closed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
