/* SPDX-License-Identifier: MIT */
/*
 * ring.c - libclient's side of the fast path (PROTOCOL.md section 13): the
 * ring's memory (a memfd registered on the session channel), RING_OPEN in
 * each session, publishing a slot, waiting for done, and the errors the
 * daemon recorded in the slots.
 *
 * The host path has no stream: the calling thread is the producer (it
 * writes ready itself, right before it publishes) and the consumer (it
 * waits for done, spinning briefly, then sleeping on the done word's futex
 * while the waiters word says so).
 *
 * A stream-ordered call (rn_rmsnorm_bwd on the fast path) hands ready and
 * the wait for done to the stream
 * through a device side (rnc_ring_dev): the ring's memory is registered
 * with the device once, ready = seq is enqueued on the caller's stream
 * before the slot is published, the wait for done >= seq after.  A ring
 * whose calls a stream may still wait on is never reused for another
 * session: when its session is lost, done is raised to its last seq from
 * here (the streams move on; the calls' outputs are undefined and the loss
 * is reported) and the next session gets fresh memory.
 */

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "rn_ring.h"

/* Slots of a client's ring: calls in flight at most. */
#define RING_SLOTS 64u
/* Spin this long on done before sleeping on it ... */
#define SPIN_NS 20000ull
/* ... and sleep at most this long at a time, to notice a dead daemon. */
#define NAP_NS 50000000ull

struct rnc_ring {
    int fd;                        /* the memfd; -1 when none */
    uint8_t *base;
    size_t size;
    bool open;                     /* RING_OPEN answered in the session `of` */
    rnp_session of;
    uint32_t id, region;
    uint64_t seq;                  /* the last published */
    uint64_t checked;              /* results read up to this seq */
    int err;                       /* the first error not yet reported */
    char msg[RN_ERRMSG_LEN];
    const rnc_ring_dev *dev;       /* registered with a device (dev_base) */
    uint64_t dev_base;
    bool retire;                   /* streams may wait on it: a new session gets new memory */
    struct rnc_ring *retired;      /* older memory of this client, kept until rn_close */
};

static uint64_t load_done(const rnc_ring *g)
{
    return __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
}

static int create(rn_client *c, rnc_ring **out)
{
    rnc_ring *g = calloc(1, sizeof *g);

    if (!g)
        return rnc_fail(c, RN_NOMEM, "ring: out of memory");
    g->size = (size_t)rnp_ring_bytes(RING_SLOTS);
    g->fd = (int)syscall(SYS_memfd_create, "rmsnormd-ring", 1u /* MFD_CLOEXEC */);
    if (g->fd < 0 || ftruncate(g->fd, (off_t)g->size) != 0) {
        int e = errno;
        if (g->fd >= 0)
            close(g->fd);
        free(g);
        return rnc_fail(c, RN_SYSTEM, "ring: memfd of %zu bytes: %s",
                        (size_t)rnp_ring_bytes(RING_SLOTS), strerror(e));
    }
    g->base = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
    if (g->base == MAP_FAILED) {
        int e = errno;
        close(g->fd);
        free(g);
        return rnc_fail(c, RN_SYSTEM, "ring: mmap: %s", strerror(e));
    }
    *out = g;
    return 0;
}

void rnc_ring_release(rn_client *c)
{
    rnc_ring *g = c->ring, *next;
    for (; g; g = next) {
        next = g->retired;
        if (g->dev)
            g->dev->detach(g->base);
        munmap(g->base, g->size);
        close(g->fd);
        free(g);
    }
    c->ring = NULL;
}

/* Record the first error of the calls up to done that is not yet known. */
static void collect(rnc_ring *g, uint64_t done)
{
    char m[RNP_MAX_ERRMSG];

    while (!rnp_seq_reached(g->checked, done)) {
        uint64_t seq = ++g->checked;
        int st = rnp_ring_get_result(g->base + rnp_ring_slot_off(seq, RING_SLOTS), m, sizeof m);
        if (st != 0 && g->err == 0) {
            g->err = st;
            snprintf(g->msg, sizeof g->msg, "call %llu: %s", (unsigned long long)seq, m);
        }
    }
}

/* Report g's recorded error once (as c's last error), or 0. */
static int report(rn_client *c, rnc_ring *g)
{
    int e = g->err;
    if (!e)
        return 0;
    g->err = 0;
    return rnc_fail(c, e, "%s", g->msg);
}

/* The ring is of no use any more (its session is gone): calls that were
 * in it may or may not have run. */
static void lost(rnc_ring *g, int code, const char *why)
{
    if (g->open && g->seq != g->checked && g->err == 0) {
        g->err = code;
        snprintf(g->msg, sizeof g->msg,
                 "calls %llu..%llu: %s before they finished; their outputs are undefined",
                 (unsigned long long)g->checked + 1, (unsigned long long)g->seq, why);
    }
    if (g->open && g->dev) {
        /* Streams wait for done on calls that will not be answered: let
         * them go, and keep this memory away from the next session. */
        if (!rnp_seq_reached(load_done(g), g->seq))
            __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), g->seq, __ATOMIC_RELEASE);
        g->retire = true;
    }
    g->open = false;
}

/* c's ring memory is retired: fresh memory for the next session, the old
 * one kept (and its recorded error carried over). */
static int renew(rn_client *c)
{
    rnc_ring *old = c->ring, *g;
    int rv;

    if ((rv = create(c, &g)) != 0)
        return rv;
    g->err = old->err;
    memcpy(g->msg, old->msg, sizeof g->msg);
    old->err = 0;
    g->retired = old;
    c->ring = g;
    return 0;
}

/* Make sure c's ring is open in the current session. */
static int ensure_open(rn_client *c)
{
    rnc_ring *g = c->ring;
    int rv;

    if (!(c->hello.paths & RNP_PATH_FAST) || !c->have_chan)
        return rnc_fail(c, RN_UNSUPPORTED,
                        "path: the daemon does not offer the fast path (%s backend%s); use "
                        "RN_PATH_CLASSIC", c->hello.backend,
                        c->have_chan ? "" : ", no session channel");
    if (!g && (rv = create(c, &c->ring)) != 0)
        return rv;
    g = c->ring;
    if (g->open && memcmp(&g->of, &c->session, sizeof g->of) == 0)
        return 0;
    lost(g, RN_RESTARTED, "the session ended");
    if (g->retire) {
        if ((rv = renew(c)) != 0)
            return rv;
        g = c->ring;
    }
    rnp_ring_init(g->base, RING_SLOTS);
    memset(g->base + RNP_RING_HDR, 0, g->size - RNP_RING_HDR);
    g->seq = g->checked = 0;
    if ((rv = rnc_chan_register(c, g->fd, g->size, &g->region)) != 0)
        return rv;
    rnp_request *q = rnc_request(c, RN_OP_RING_OPEN);
    q->u.ring_open.session = c->session;
    q->u.ring_open.region.id = g->region;
    q->u.ring_open.offset = 0;
    q->u.ring_open.slots = RING_SLOTS;
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0)
        return rv;
    g->id = c->rep.u.ring_open.ring;
    g->of = c->session;
    g->open = true;
    return 0;
}

static void futex_wait(uint32_t *w, uint32_t val, uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
    syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Whether the daemon closed the session channel (it died, or the session
 * ended). */
static bool chan_closed(rn_client *c)
{
    struct pollfd p = { c->chan, POLLIN, 0 };
    return !c->have_chan || (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLIN)));
}

/*
 * Wait until done reaches seq.  0; RN_TIMEOUT after c's timeout;
 * RN_UNKNOWN_SESSION when the daemon closed the ring or the session (the
 * ring is then lost: lost() recorded what became of its calls).
 */
static int wait_done(rn_client *c, rnc_ring *g, uint64_t seq)
{
    uint32_t *waiters = rnp_ring_u32(g->base, RNP_RING_O_WAITERS);
    uint64_t t0 = rnc_now_ns();
    uint64_t limit = c->timeout_ms < 0 ? UINT64_MAX : (uint64_t)c->timeout_ms * 1000000u;

    while (!rnp_seq_reached(load_done(g), seq)) {
        uint64_t spent = rnc_now_ns() - t0;
        if (spent < SPIN_NS) {
            sched_yield();
            continue;
        }
        if (__atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_STATE), __ATOMIC_ACQUIRE) !=
            RNP_RING_OPEN) {
            /* Everything the daemon took is answered by now. */
            if (rnp_seq_reached(load_done(g), seq))
                break;
            lost(g, RN_RESTARTED, "the daemon closed the ring");
            return rnc_fail(c, RN_UNKNOWN_SESSION, "ring: the daemon closed it (session ended)");
        }
        if (spent >= limit)
            return rnc_fail(c, RN_TIMEOUT, "ring: call %llu did not finish within %d ms",
                            (unsigned long long)seq, c->timeout_ms);
        __atomic_add_fetch(waiters, 1, __ATOMIC_SEQ_CST);
        uint64_t d = load_done(g);
        if (!rnp_seq_reached(d, seq))
            futex_wait(rnp_ring_u32(g->base, RNP_RING_O_DONE), (uint32_t)d, NAP_NS);
        __atomic_sub_fetch(waiters, 1, __ATOMIC_SEQ_CST);
        if (!rnp_seq_reached(load_done(g), seq) && chan_closed(c)) {
            lost(g, RN_RESTARTED, "the daemon ended the session (or exited)");
            c->have_session = false;
            return rnc_fail(c, RN_UNKNOWN_SESSION, "ring: the daemon ended the session");
        }
    }
    collect(g, load_done(g));
    return 0;
}

int rnc_ring_publish(rn_client *c, const rnp_bwd_req *b, const rnc_ring_dev *dev, void *stream,
                     uint64_t *seqp)
{
    rnc_ring *g;
    int rv;

    c->ring_setup_failed = false;
    if ((rv = ensure_open(c)) != 0) {
        c->ring_setup_failed = true;
        return rv;
    }
    g = c->ring;
    if (dev && !g->dev) {
        if ((rv = dev->attach(c, g->base, g->size, &g->dev_base)) != 0) {
            c->ring_setup_failed = true;
            return rv;
        }
        g->dev = dev;
    }
    if (__atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_STATE), __ATOMIC_ACQUIRE) !=
        RNP_RING_OPEN) {
        /* The daemon ended the session (the idle timeout, say): a new
         * session opens a new ring, and the call runs there. */
        collect(g, load_done(g));
        lost(g, RN_RESTARTED, "the daemon closed the ring");
        c->have_session = false;
        return rnc_fail(c, RN_UNKNOWN_SESSION, "ring: the daemon closed it (session ended)");
    }
    /* Earlier calls' errors first: a call after a failed one is not run. */
    collect(g, load_done(g));
    if ((rv = report(c, g)) != 0)
        return rv;
    uint64_t seq = g->seq + 1;
    /* A full ring: wait for the oldest call. */
    if (!rnp_ring_can_publish(seq, load_done(g), RING_SLOTS) &&
        (rv = wait_done(c, g, seq - RING_SLOTS)) != 0)
        return rv;
    if ((rv = report(c, g)) != 0)
        return rv;
    uint8_t *slot = g->base + rnp_ring_slot_off(seq, RING_SLOTS);
    rnp_ring_encode(b, seq, slot);
    rnp_ring_put_result(slot, 0, NULL);
    if (dev) {
        /* The stream writes ready once the producer's work before this
         * call is done; nothing is published if that cannot be queued. */
        if ((rv = dev->write(c, stream, g->dev_base + RNP_RING_O_READY, seq)) != 0)
            return rv;
    } else {
        /* The host's inputs are written: ready, then publish. */
        __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_READY), seq, __ATOMIC_RELEASE);
    }
    /* Release: the slot (and a host's inputs) before the producer word. */
    __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_PROD), seq, __ATOMIC_RELEASE);
    g->seq = seq;
    /* Pairs with the daemon's sleeping flag: it sets it, then looks at
     * the producer words; this publishes, then looks at the flag. */
    atomic_thread_fence(memory_order_seq_cst);
    if (__atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_SLEEPING), __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(rnp_ring_u32(g->base, RNP_RING_O_DOORBELL), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, rnp_ring_u32(g->base, RNP_RING_O_DOORBELL), FUTEX_WAKE, 1, NULL, NULL,
                0);
    }
    *seqp = seq;
    /* Later work on the stream sees the outputs.  Published already: a
     * failure here leaves the call to run, unwaited for. */
    if (dev && (rv = dev->wait(c, stream, g->dev_base + RNP_RING_O_DONE, seq)) != 0)
        return rv;
    return 0;
}

int rnc_ring_wait(rn_client *c, uint64_t seq)
{
    rnc_ring *g = c->ring;
    int rv;

    if (!g || !g->open)
        return report(c, g);
    if ((rv = wait_done(c, g, seq)) != 0)
        return rv;
    return report(c, g);
}

int rnc_ring_sync(rn_client *c, bool wait)
{
    rnc_ring *g = c->ring;
    int rv;

    if (!g)
        return 0;
    if (g->open && wait && (rv = wait_done(c, g, g->seq)) != 0)
        return rv;
    if (g->open)
        collect(g, load_done(g));
    return report(c, g);
}
