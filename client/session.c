/* SPDX-License-Identifier: MIT */
/*
 * session.c - libclient's sessions: HELLO, BYE, re-opening a session the
 * daemon lost (a restart) with every live buffer registered again, and the
 * regions of a session.  (The one retry loop around a lost session,
 * rnc_in_session, is inline in client_int.h.)
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"

/* BYE in rn_close waits at most this long: a dead daemon must not hold up
 * the caller's shutdown, and the daemon notices the exit by itself. */
#define BYE_TIMEOUT_MS 2000
/* While no daemon listens, a new session looks again this often. */
#define PROBE_EVERY_NS 20000000L

/* 0 unless no daemon listens at the endpoint (RN_UNREACHABLE, c's last
 * error set).  nanomsg's socket reconnects by itself and queues a request,
 * so to a daemon that stopped each call waited out the whole timeout and
 * then said "no reply"; a batch of asynchronous calls waited one timeout
 * each.  Now a daemon that is restarting is waited for, probing, at most
 * the timeout (the call then goes on as if nothing happened), and once a
 * whole timeout went by without one, the calls that follow fail at once
 * until a probe finds one again.  Any other answer of the probe (a daemon
 * at its connection limit, or one that accepts no connection in time)
 * leaves the HELLO to the connection the client has. */
static int await_daemon(rn_client *c)
{
    const uint64_t t0 = rnc_now_ns();
    const uint64_t lim = c->timeout_ms < 0 ? UINT64_MAX : (uint64_t)c->timeout_ms * 1000000u;
    int ms = c->timeout_ms;

    while (rnc_conn_probe(c, ms) == RN_UNREACHABLE) {
        uint64_t now = rnc_now_ns();
        if (!c->down_ns)
            c->down_ns = t0;
        if (now - c->down_ns >= lim || (lim != UINT64_MAX && now - t0 >= lim)) {
            char why[RN_ERRMSG_LEN];
            snprintf(why, sizeof why, "%s", c->last_error);
            return rnc_fail(c, RN_UNREACHABLE, "%.200s; none for %llu ms", why,
                            (unsigned long long)((now - c->down_ns) / 1000000u));
        }
        uint64_t left = lim == UINT64_MAX ? UINT64_MAX : lim - (now - t0);
        struct timespec d = {0, (long)(left < PROBE_EVERY_NS ? left : PROBE_EVERY_NS)};
        nanosleep(&d, NULL);
        if (lim != UINT64_MAX) { /* the next probe waits at most what is left */
            uint64_t spent = rnc_now_ns() - t0;
            ms = spent < lim ? (int)((lim - spent) / 1000000u) : 0;
        }
    }
    c->down_ns = 0;
    return 0;
}

static int hello(rn_client *c)
{
    rnp_request *r = rnc_request(c, RN_OP_HELLO);
    int rv;

    /* A lost session's ring calls, when no daemon will answer them (the
     * watcher lets go of the ring below, before it could see that). */
    if (c->ring_orphan)
        c->ring_orphan(c);
    /* A lost session's channel connection is of no use to the next. */
    rnc_chan_close(c);
    if ((rv = await_daemon(c)) != 0)
        return rv;
    r = rnc_request(c, RN_OP_HELLO);
    snprintf(r->u.hello.client_name, sizeof r->u.hello.client_name, "%s", c->name);
    r->u.hello.pid = (uint32_t)getpid();
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        return rv;
    c->session = c->rep.u.hello.session;
    c->hello = c->rep.u.hello;
    c->have_session = true;
    /* The daemon takes the session's pid and uid, and shared memory, from
     * the session channel; only a daemon without one is spoken to by
     * names. */
    c->chan_forget = rnc_unregister;
    if (c->hello.channel && (rv = rnc_chan_open(c)) != 0) {
        rnc_end_session(c);
        return rv;
    }
    return 0;
}

int rnc_end_session(rn_client *c)
{
    char keep[RN_ERRMSG_LEN];
    int t = c->timeout_ms < 0 || c->timeout_ms > BYE_TIMEOUT_MS ? BYE_TIMEOUT_MS : c->timeout_ms;

    snprintf(keep, sizeof keep, "%s", c->last_error);
    rnc_request(c, RN_OP_BYE)->u.bye = c->session;
    c->replied = false;
    int rv = rnc_transact(c, t);
    bool replied = c->replied;
    rnc_chan_close(c);
    c->have_session = false;
    snprintf(c->last_error, sizeof c->last_error, "%s", keep);
    /* A reply, even an error (a session it had ended), is a live daemon. */
    return replied ? 0 : rv ? rv : RN_SYSTEM;
}

int rnc_ensure_session(rn_client *c)
{
    int rv;
    if (c->have_session)
        return 0;
    if ((rv = hello(c)) != 0)
        return rv;
    for (size_t i = 0; i < c->nbufs; i++) {
        c->bufs[i].region = 0;
        if ((rv = rnc_register_buf(c, &c->bufs[i])) != 0) {
            char why[RN_ERRMSG_LEN];
            snprintf(why, sizeof why, "%s", c->last_error);
            /* End the half-built session now: the process lives on, so the
             * daemon's pid watch would not, and each retry would hold
             * another session until the idle timeout.  The next call
             * starts over with a fresh HELLO. */
            rnc_end_session(c);
            return rnc_fail(c, rv, "re-registering a buffer of %zu bytes after a new session: %s",
                            c->bufs[i].size, why);
        }
    }
    return 0;
}

/* ---- rings ------------------------------------------------------------------------- */

int rnc_ring_open_call(rn_client *c, uint32_t region, uint32_t slots, const rnc_done_word **done,
                       bool *go, uint32_t *ring)
{
    int rv;

    *go = true; /* (ring.c writes go after ready at every call) */
    for (;;) {
        rnp_request *q = rnc_request(c, RN_OP_RING_OPEN);
        q->u.ring_open.session = c->session;
        q->u.ring_open.region.id = region;
        q->u.ring_open.offset = 0;
        q->u.ring_open.slots = slots;
        q->u.ring_open.go = *go;
        if (*done) {
            q->u.ring_open.done_region.id = (*done)->t.region.id;
            q->u.ring_open.done_offset = (*done)->t.offset;
        }
        rv = rnc_transact(c, c->timeout_ms);
        /* Refused with an optional field (a daemon older than it, or one
         * that has no such word for it): again without go, then without
         * the done word too (the ring's).  Not after no answer: the daemon
         * may have opened it. */
        if (rv == 0 || !c->replied || (!*done && !*go))
            break;
        if (*go)
            *go = false;
        else
            *done = NULL;
    }
    if (rv == 0)
        *ring = c->rep.u.ring_open.ring;
    return rv;
}

/* ---- regions ------------------------------------------------------------------------ */

int rnc_register(rn_client *c, const rnp_register_req *r, uint32_t *region)
{
    rnp_request *q = rnc_request(c, RN_OP_REGISTER);
    int rv;

    q->u.reg = *r;
    q->u.reg.session = c->session;
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        return rv;
    *region = c->rep.u.reg.region.id;
    return 0;
}

int rnc_register_buf(rn_client *c, rnc_buf *b)
{
    rnp_register_req r;

    if (c->have_chan)
        return rnc_chan_register(c, b->fd, b->size, &b->region);
    if (!b->name[0])
        return rnc_fail(c, RN_UNSUPPORTED,
                        "buffer: the daemon has no session channel (an older rmsnormd?), and "
                        "this buffer was shared by descriptor only");
    memset(&r, 0, sizeof r);
    r.kind = RNP_REGION_SHM;
    r.size = b->size;
    snprintf(r.shm_name, sizeof r.shm_name, "%s", b->name);
    return rnc_register(c, &r, &b->region);
}

int rnc_unregister(rn_client *c, uint32_t region)
{
    rnp_request *r = rnc_request(c, RN_OP_UNREGISTER);

    r->u.unreg.session = c->session;
    r->u.unreg.region.id = region;
    return rnc_transact(c, c->timeout_ms);
}
