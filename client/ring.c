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
 *
 * A call on a stream being captured into a CUDA graph takes a graph slot
 * (PROTOCOL.md 13.8, ring_graph.c) in the area after the ring: its descriptor is written
 * and registered (GRAPH_OPEN, which checks it: a bad call fails the
 * capture, not a replay) once, and the device side captures the replay's
 * start and the wait for done.  A graph slot is held until CUDA destroys
 * the graph and its instantiations (a user object's destructor, which only
 * queues the slot: the next call gives it back with GRAPH_CLOSE).  Errors
 * of replays (the slot's fails counter moved) are reported like a slot's.
 *
 * The daemon watcher (watch.c) is armed for the ring in each session: when
 * the daemon goes while no call runs, it answers the slots left
 * RN_RESTARTED and lets go of the words streams wait on; the calls then
 * find c->watch_fired set and treat the session as lost, as they do when
 * they find the channel closed themselves.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ring_int.h"

/* Spin this long on done before sleeping on it ... */
#define SPIN_NS 20000ull
/* ... and sleep at most this long at a time, to notice a dead daemon. */
#define NAP_NS 50000000ull

static uint64_t load_done(const rnc_ring *g)
{
    return __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
}

static int create(rn_client *c, rnc_ring **out)
{
    rnc_ring *g = calloc(1, sizeof *g);

    if (!g)
        return rnc_fail(c, RN_NOMEM, "ring: out of memory");
    g->slots = c->ring_slots ? c->ring_slots : RING_SLOTS_DEFAULT;
    c->ring_orphan = rnc_ring_orphan; /* (chan.c and session.c's way up) */
    /* RMSNORMD_DEBUG_RING_AHEAD=N (for measurements): the caller at most N
     * calls ahead of the answers instead of a ring's worth. */
    const char *ae = getenv("RMSNORMD_DEBUG_RING_AHEAD");
    long ahead = ae ? strtol(ae, NULL, 10) : 0;
    g->ahead = ahead >= 1 && ahead < (long)g->slots ? (uint32_t)ahead : g->slots;
    g->size = (size_t)rnc_gslot_off(g, GRAPH_SLOTS);
    g->c = c;
    /* Sealed against shrinking: the daemon reads the ring from its own
     * mapping, and a cut file would fault it (the cuda backend refuses an
     * unsealed one). */
    g->fd = (int)syscall(SYS_memfd_create, "rmsnormd-ring", 3u /* MFD_CLOEXEC|ALLOW_SEALING */);
    if (g->fd < 0 || ftruncate(g->fd, (off_t)g->size) != 0 ||
        fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        int e = errno;
        size_t size = g->size;
        if (g->fd >= 0)
            close(g->fd);
        free(g);
        return rnc_fail(c, RN_SYSTEM, "ring: memfd of %zu bytes: %s", size, strerror(e));
    }
    g->base = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
    if (g->base == MAP_FAILED) {
        int e = errno;
        close(g->fd);
        free(g);
        return rnc_fail(c, RN_SYSTEM, "ring: mmap: %s", strerror(e));
    }
    g->token = rnc_ring_token();
    g->dpid = -1;
    *out = g;
    return 0;
}

static void lost(rnc_ring *g, int code, const char *why);
static void collect(rnc_ring *g, uint64_t done);

/* Let go of g: its memory unmapped (detached from the device first, when
 * detach) unless keep (a graph or a stream may still use it), its
 * descriptors closed. */
static void ring_free(rnc_ring *g, bool detach, bool keep)
{
    if (!keep) {
        if (detach && g->dev)
            g->dev->detach(g->base);
        munmap(g->base, g->size);
    }
    close(g->fd);
    if (g->dpid >= 0)
        close(g->dpid);
    free(g);
}

void rnc_ring_forget(rn_client *c)
{
    rnc_ring *g = c->ring, *next;
    for (; g; g = next) {
        next = g->retired;
        ring_free(g, false, false);
    }
    c->ring = NULL;
}

/* A stream may still write ready (or go: unless it failed) into g's memory,
 * or wait on its done words: a producer not done yet (rn_close, no sync). */
static bool streams_pending(rnc_ring *g)
{
    const uint64_t *r = rnp_ring_u64(g->base, RNP_RING_O_READY);
    const uint64_t go = __atomic_load_n(rnp_ring_u64(g->base, RNP_RING_O_GO), __ATOMIC_ACQUIRE);
    return g->dev && (!rnp_seq_reached(rnp_ring_ready_seq(__atomic_load_n(r, __ATOMIC_ACQUIRE)),
                                       g->seq) ||
                      (g->go && !g->go_missing && !rnp_seq_reached(go, g->seq)) ||
                      !rnp_seq_reached(load_done(g), g->seq));
}

void rnc_ring_release(rn_client *c, bool answered)
{
    rnc_ring *g = c->ring, *next;
    bool kept = false;
    if (g && !answered) { /* (a daemon stopped, or gone unseen: no pidfd) */
        if (g->open)
            collect(g, load_done(g));
        lost(g, RN_RESTARTED, "the session's end went unanswered");
    }
    for (; g; g = next) {
        next = g->retired;
        /* A graph that outlives the client still replays into this memory
         * (and finds its slots closed), or a stream may still write ready
         * or wait on done there: it stays mapped and registered (a leak of
         * its size) rather than a GPU fault; for a stream the done words
         * stay too. */
        bool held = rnc_graphs_release(g), busy = !held && streams_pending(g);
        kept |= busy;
        ring_free(g, true, held || busy);
    }
    c->ring = NULL;
    if (c->done_free && !kept)
        c->done_free(c);
}

/* Record the errors of the calls up to done that are not yet known. */
static void collect(rnc_ring *g, uint64_t done)
{
    char m[RNP_MAX_ERRMSG];

    while (!rnp_seq_reached(g->checked, done)) {
        uint64_t seq = ++g->checked;
        int st = rnp_ring_get_result(g->base + rnp_ring_slot_off(seq, g->slots), m, sizeof m);
        /* A slot the daemon answered at its session's end: reported as a
         * lost call, not as RN_UNKNOWN_SESSION, which would make the call
         * that reports it start a new session and run again (client_int.h's
         * rnc_in_session), the error gone with it. */
        if (st == RN_UNKNOWN_SESSION)
            st = RN_RESTARTED;
        if (st != 0)
            rnc_ring_note(g, st, "call %llu: %s", (unsigned long long)seq, m);
    }
}

/* Report g's recorded errors once (as c's last error: the first one's code
 * and message, then how many came after it and the last), or 0. */
static int report(rn_client *c, rnc_ring *g)
{
    int e = g->err;
    uint32_t more = g->err_more;
    if (!e)
        return 0;
    g->err = 0;
    g->err_more = 0;
    if (!more)
        return rnc_fail(c, e, "%s", g->msg);
    return rnc_fail(c, e, "%.120s (and %u error%s after it; the last: %.100s)", g->msg, more,
                    more == 1 ? "" : "s", g->last);
}

/* The ring is of no use any more (its session is gone): calls that were
 * in it may or may not have run.  The note names the calls up to last (a
 * call whose caller waits for it learns its fate from that wait's return,
 * and is not reported again at the next call). */
static void lost_upto(rnc_ring *g, int code, const char *why, uint64_t last)
{
    if (g->open && rnp_seq_reached(last, g->checked + 1))
        rnc_ring_note(g, code, "calls %llu..%llu: %s before they finished; their outputs are "
                      "undefined", (unsigned long long)g->checked + 1,
                      (unsigned long long)last, why);
    bool graphs = false;
    for (uint32_t i = 0; i < GRAPH_SLOTS; i++) {
        if (g->gdaemon[i]) /* (no graph; the daemon's hold ends with the session) */
            g->gheld[i] = g->gdaemon[i] = false;
        if (!g->gid[i])
            continue;
        /* Its replays compute nothing from now on, and wait for nothing. */
        rnc_graph_let_go(g, i);
        g->gid[i] = 0;
        graphs = true;
    }
    if (graphs)
        rnc_ring_note(g, code, "graph calls: %s; replays of graphs captured before compute "
                      "nothing now (capture them again)", why);
    if (g->open && g->dev) {
        /* Streams wait for done on calls that will not be answered: let
         * them go, and keep this memory away from the next session. */
        rnc_watch_raise(rnp_ring_u64(g->base, RNP_RING_O_DONE), g->seq);
        if (g->done_addr && g->c->done_raise)
            g->c->done_raise(g->c, g->done_addr, g->seq);
        g->retire = true;
    }
    g->open = false;
}

static void lost(rnc_ring *g, int code, const char *why)
{
    lost_upto(g, code, why, g->seq);
}

/* No daemon holds g's ring any more: the one that did wrote state = 1
 * once its last job let go, or exited. */
static bool let_go(const rnc_ring *g)
{
    struct pollfd p = {g->dpid, POLLIN, 0};
    if (__atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_STATE), __ATOMIC_ACQUIRE) ==
        RNP_RING_CLOSED)
        return true;
    return g->dpid >= 0 && poll(&p, 1, 0) == 1;
}

void rnc_ring_orphan(rn_client *c)
{
    rnc_ring *g = c->ring;

    /* (A watcher that fired let the streams go already.) */
    if (!g || !g->open || rnc_watch_fired(c) || !(let_go(g) || g->dpid < 0))
        return;
    collect(g, load_done(g));
    lost(g, RN_RESTARTED, "the daemon that took them is gone");
}

/* g's session is c's current one (not one a newer session replaced). */
static bool current(const rn_client *c, const rnc_ring *g)
{
    return memcmp(&g->of, &c->session, sizeof g->of) == 0;
}

/* Whether the calls of g still out will not be answered any more, as the
 * watcher judges (watch.c): the session's channel is gone (closed, or g's
 * session is not c's current one) and no daemon holds the ring (let_go),
 * or none said so within the linger since a call first saw the channel
 * gone.  A live daemon that closed the channel may still run slots it
 * took (the drain): their streams must not run ahead of those kernels,
 * nor their memory be handed back under them. */
static bool session_over(rn_client *c, rnc_ring *g)
{
    if (current(c, g) && !rnc_chan_closed(c))
        return false;
    uint64_t now = rnc_now_ns();
    if (!g->closed_ns)
        g->closed_ns = now;
    uint64_t linger = (uint64_t)(g->dpid >= 0 ? RNC_LINGER_MS : RNC_LINGER_BLIND_MS) * 1000000u;
    return let_go(g) || now - g->closed_ns >= linger;
}

/* g's session is over: the calls answered up to done are read, the rest up
 * to last lost (why), and c's session is over too where it is g's. */
static int ended(rn_client *c, rnc_ring *g, uint64_t done, uint64_t last, const char *why)
{
    collect(g, done);
    lost_upto(g, RN_RESTARTED, why, last);
    if (current(c, g)) /* (a newer session is not the one that ended) */
        c->have_session = false;
    return rnc_fail(c, RN_UNKNOWN_SESSION, "ring: %s", why);
}

static bool graphs_held(const rnc_ring *g)
{
    for (uint32_t i = 0; i < GRAPH_SLOTS; i++)
        if (g->gheld[i])
            return true;
    return false;
}

/* The retired memory after g that nobody uses any more (no daemon holds
 * its ring, no graph replays into it, no stream writes or waits there) is
 * freed: a client that lives through many sessions does not keep them
 * all. */
static void reclaim(rnc_ring *g)
{
    rnc_ring **pp = &g->retired;
    while (*pp) {
        rnc_ring *r = *pp;
        if (!let_go(r) || graphs_held(r) || streams_pending(r)) {
            pp = &r->retired;
            continue;
        }
        *pp = r->retired;
        (void)rnc_graphs_release(r); /* (none held: queued closes dropped) */
        ring_free(r, true, false);
    }
}

/* c's ring memory is retired: fresh memory for the next session, the old
 * one kept (and its recorded error carried over) until nothing uses it. */
static int renew(rn_client *c)
{
    rnc_ring *old = c->ring, *g;
    int rv;

    if ((rv = create(c, &g)) != 0)
        return rv;
    g->err = old->err;
    g->err_more = old->err_more;
    memcpy(g->msg, old->msg, sizeof g->msg);
    memcpy(g->last, old->last, sizeof g->last);
    old->err = 0;
    old->err_more = 0;
    g->retired = old;
    c->ring = g;
    reclaim(g);
    return 0;
}

bool rnc_ring_opening(const rn_client *c)
{
    return !c->ring || !c->ring->open || memcmp(&c->ring->of, &c->session, sizeof c->session);
}

bool rnc_ring_busy(const rn_client *c)
{
    return c->ring && c->ring->open && !rnp_seq_reached(load_done(c->ring), c->ring->seq);
}

/* Make sure c's ring is open in the current session (with done's word). */
static int ensure_open(rn_client *c, const rnc_done_word *done)
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
    /* The watcher lets go of the memory before it is reused.  Calls that
     * finished are read first: only the others are lost. */
    rnc_watch_disarm(c);
    if (g->open)
        collect(g, load_done(g));
    lost(g, RN_RESTARTED, "the session ended");
    /* A daemon that lives on writes state = 1 into the memory of a ring it
     * held once its last job let go, however its session ended: memory
     * whose ring a live daemon may still hold is not reused. */
    if (g->opened && !let_go(g))
        g->retire = true;
    if (g->retire) {
        if ((rv = renew(c)) != 0)
            return rv;
        g = c->ring;
    }
    rnp_ring_init(g->base, g->slots);
    memset(g->base + RNP_RING_HDR, 0, g->size - RNP_RING_HDR);
    g->seq = g->checked = 0;
    g->closed_ns = 0; /* (session_over's clock is per session) */
    g->ready_queued = g->go_missing = false;
    if ((rv = rnc_chan_register(c, g->fd, g->size, &g->region)) != 0)
        return rv;
    g->done_addr = 0;
    if ((rv = rnc_ring_open_call(c, g->region, g->slots, &done, &g->go, &g->id)) != 0) {
        if (!c->replied) {
            /* No answer: the daemon may have opened it all the same, and
             * would refuse every RING_OPEN after it in this session.  The
             * session ends (BYE; the daemon writes state = 1 into this
             * memory once it lets go of a ring it opened): the next call
             * starts a new one, with new memory. */
            g->opened = true;
            (void)rnc_end_session(c);
        } else {
            /* Refused: the ring's region goes again (the next call
             * registers the memory anew). */
            char why[RN_ERRMSG_LEN];
            snprintf(why, sizeof why, "%s", c->last_error);
            (void)rnc_unregister(c, g->region);
            snprintf(c->last_error, sizeof c->last_error, "%s", why);
        }
        return rv;
    }
    if (g->dpid >= 0)
        close(g->dpid);
    g->dpid = c->have_chan ? rnc_daemon_pidfd(c->chan) : -1;
    g->done_addr = done ? done->addr : 0;
    g->of = c->session;
    g->open = g->opened = true;
    rnc_watch_arm(c, g->base, g->slots, rnc_gslot_off(g, 0), GRAPH_SLOTS, g->done_addr);
    return 0;
}

static void futex_wait(uint32_t *w, uint32_t val, uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
    syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* A call of the host path after calls on streams: until the ready word
 * (go, on a ring opened with it: written last, and it must not go back
 * either), which those streams write once their producers are done (and,
 * on one stream, once the call before was answered), reaches seq.  0, or
 * RN_TIMEOUT after c's timeout (nothing published); a daemon the watcher
 * saw go ends the wait too (the call then finds the loss), and without the
 * watcher a session found over (session_over) ends it RN_UNKNOWN_SESSION,
 * the ring's calls lost. */
static int wait_ready(rn_client *c, rnc_ring *g, uint64_t seq)
{
    const uint64_t *w = rnp_ring_u64(g->base, g->go ? RNP_RING_O_GO : RNP_RING_O_READY);
    const uint64_t t0 = rnc_now_ns();
    const uint64_t lim = c->timeout_ms < 0 ? UINT64_MAX : (uint64_t)c->timeout_ms * 1000000u;
    for (unsigned i = 0; !rnp_seq_reached(__atomic_load_n(w, __ATOMIC_ACQUIRE), seq); i++) {
        if (rnc_watch_fired(c))
            return 0;
        /* Without the watcher, the session's end is looked for here (a
         * stream whose ready waits behind a call the gone daemon never
         * answers never writes it: the wait ran out, found in review). */
        if (i % 50 == 49 && session_over(c, g))
            return ended(c, g, load_done(g), g->seq, "the daemon ended the session (or exited)");
        if (rnc_now_ns() - t0 > lim)
            return rnc_fail(c, RN_TIMEOUT,
                            "ready: the calls before this one on streams had not their inputs "
                            "ready within %u ms; this call was not made",
                            (unsigned)c->timeout_ms);
        struct timespec d = {0, 20000};
        nanosleep(&d, NULL);
    }
    return 0;
}

/*
 * Wait until done reaches seq.  0; RN_TIMEOUT after c's timeout;
 * RN_UNKNOWN_SESSION when the daemon closed the ring or the session (the
 * ring is then lost: lost() recorded what became of its calls).
 */
static int wait_done(rn_client *c, rnc_ring *g, uint64_t seq, bool own)
{
    /* own: seq is the caller's own call (a host-path call waiting for its
     * answer), whose loss the return value says: left out of the note. */
    const uint64_t last = own ? seq - 1 : g->seq;
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
            /* Everything the daemon took is answered by now: read, then
             * the rest is lost. */
            uint64_t d = load_done(g);
            if (rnp_seq_reached(d, seq))
                break;
            collect(g, d);
            lost_upto(g, RN_RESTARTED, "the daemon closed the ring", last);
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
        if (!rnp_seq_reached(load_done(g), seq) && session_over(c, g))
            return ended(c, g, load_done(g), last, "the daemon ended the session (or exited)");
    }
    /* done moved because the watcher let it go: as a closed channel. */
    uint32_t fired = rnc_watch_fired(c);
    uint64_t answered = __atomic_load_n(&c->watch_answered, __ATOMIC_SEQ_CST);
    if (fired && !rnp_seq_reached(answered, seq))
        return ended(c, g, answered, last, rnc_watch_why(fired));
    collect(g, load_done(g));
    return 0;
}

int rnc_ring_publish(rn_client *c, const rnp_bwd_req *b, const rnc_ring_dev *dev, void *stream,
                     const rnc_done_word *done, uint64_t *seqp)
{
    rnc_ring *g;
    int rv, go_rv = 0;

    c->ring_setup_failed = false;
    if ((rv = ensure_open(c, done)) != 0) {
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
    uint32_t fired = rnc_watch_fired(c);
    if (fired || __atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_STATE), __ATOMIC_ACQUIRE) !=
                     RNP_RING_OPEN) {
        /* The daemon ended the session (the idle timeout, say) or exited:
         * a new session opens a new ring, and the call runs there. */
        collect(g, fired ? __atomic_load_n(&c->watch_answered, __ATOMIC_SEQ_CST) : load_done(g));
        lost(g, RN_RESTARTED, fired ? rnc_watch_why(fired) : "the daemon closed the ring");
        c->have_session = false;
        return rnc_fail(c, RN_UNKNOWN_SESSION, "ring: %s (session ended)",
                        fired ? rnc_watch_why(fired) : "the daemon closed it");
    }
    /* Earlier calls' errors first: a call after a failed one is not run. */
    rnc_take_gone(c);
    collect(g, load_done(g));
    rnc_collect_graphs(g);
    if ((rv = report(c, g)) != 0)
        return rv;
    int cap = dev && dev->captured ? dev->captured(c, stream) : 0;
    if (cap < 0)
        return -cap;
    if (cap) {
        *seqp = 0;
        return rnc_graph_publish(c, g, b, dev, stream);
    }
    uint64_t seq = g->seq + 1;
    /* A full ring (or g->ahead calls out): wait for the oldest call. */
    if (!rnp_ring_can_publish(seq, load_done(g), g->ahead) &&
        (rv = wait_done(c, g, seq - g->ahead, false)) != 0)
        return rv;
    if ((rv = report(c, g)) != 0)
        return rv;
    uint8_t *slot = g->base + rnp_ring_slot_off(seq, g->slots);
    rnp_ring_encode(b, seq, slot);
    rnp_ring_put_result(slot, 0, NULL);
    /* The ready word says that every slot up to it is ready (13.3): a call
     * must not raise it past an earlier call whose producer, on another
     * stream, is still running, nor may that stream's write come after
     * this one's and lower it (nor its go: a ring opened with go waits for
     * the last one's go, written after its ready).  So a call on another
     * stream than the last one's first waits for it there, and a call of
     * the host path for it here. */
    uint64_t sid = dev && dev->stream_id ? dev->stream_id(stream) : 0;
    bool elsewhere = !dev || g->ready_stream != stream || g->ready_sid != sid;
    /* A go that could not be queued (below) only a later call on its own
     * stream writes: a call anywhere else would wait for it for good. */
    if (g->ready_queued && g->go_missing && elsewhere)
        return rnc_fail(c, RN_CUDA, "ready: call %llu's go could not be queued on its stream, "
                        "which a call elsewhere would wait for; nothing was published (the "
                        "next call on that stream writes it)", (unsigned long long)g->seq);
    if (dev) {
        /* The stream writes ready once the producer's work before this
         * call is done; nothing is published if that cannot be queued. */
        if (g->ready_queued && elsewhere &&
            (rv = dev->wait(c, stream, g->dev_base + (g->go ? RNP_RING_O_GO : RNP_RING_O_READY),
                            g->seq)) != 0) {
            char why[RN_ERRMSG_LEN];
            snprintf(why, sizeof why, "%s", c->last_error);
            return rnc_fail(c, rv, "ready: this stream's wait for the previous call's inputs "
                            "(another stream) could not be queued; nothing was published "
                            "(%.150s)", why);
        }
        /* ready, then go (13.3: what this client's own calls on other
         * streams wait for; the daemon's bit of ready cannot pass that) */
        uint64_t ra = g->dev_base + RNP_RING_O_READY, ga = g->dev_base + RNP_RING_O_GO;
        rv = g->go && dev->write2 ? dev->write2(c, stream, ra, ga, seq) : RN_UNSUPPORTED;
        bool both = rv != RN_UNSUPPORTED;
        if (!both)
            rv = dev->write(c, stream, ra, seq);
        if (rv != 0)
            return rv;
        /* (a failed second write: ready is queued for seq, which no later
         * call may take with inputs not yet written, so the call is
         * published all the same, reported failed; the next call's go
         * covers it) */
        if (g->go && !both)
            go_rv = dev->write(c, stream, ga, seq);
        g->ready_stream = stream;
        g->ready_sid = sid;
        g->ready_queued = true;
        g->go_missing = go_rv != 0;
    } else {
        if (g->ready_queued && (rv = wait_ready(c, g, g->seq)) != 0)
            return rv;
        g->ready_queued = false;
        /* The host's inputs are written: ready, then publish. */
        __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_READY), seq, __ATOMIC_RELEASE);
        if (g->go)
            __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_GO), seq, __ATOMIC_RELEASE);
    }
    /* Release: the slot (and a host's inputs) before the producer word. */
    __atomic_store_n(rnp_ring_u64(g->base, RNP_RING_O_PROD), seq, __ATOMIC_RELEASE);
    g->seq = seq;
    /* Pairs with the daemon's sleeping flag: it sets it, then looks at
     * the producer words; this publishes, then looks at the flag. */
    atomic_thread_fence(memory_order_seq_cst);
    if (__atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_SLEEPING), __ATOMIC_SEQ_CST))
        rnc_chan_wake(c, rnp_ring_u32(g->base, RNP_RING_O_DOORBELL));
    /* The same fence pairs with the watcher's (fired, then prod): if it
     * fired before it could see this slot, the slot is released here. */
    if (rnc_watch_fired(c))
        rnc_watch_catch_up(c);
    *seqp = seq;
    /* Later work on the stream sees the outputs.  Published already: a
     * failure here leaves the call to run, unwaited for. */
    uint64_t done_at = g->done_addr ? g->done_addr : g->dev_base + RNP_RING_O_DONE;
    if (dev && (rv = dev->wait(c, stream, done_at, seq)) != 0)
        return rv;
    return go_rv;
}

int rnc_ring_wait(rn_client *c, uint64_t seq)
{
    rnc_ring *g = c->ring;
    int rv;

    if (!g || !g->open)
        return report(c, g);
    if ((rv = wait_done(c, g, seq, true)) != 0)
        return rv;
    return report(c, g);
}

int rnc_ring_sync(rn_client *c, bool wait)
{
    rnc_ring *g = c->ring;
    int rv;

    if (!g)
        return 0;
    rnc_take_gone(c);
    g = c->ring;
    /* A wait that ended because the session did (lost() recorded what
     * became of the calls) reports that below, once; a timeout is
     * returned. */
    if (g->open && wait && (rv = wait_done(c, g, g->seq, false)) != 0 && g->open)
        return rv;
    /* Whether the session is gone, before done is read: a call answered
     * before the session ended is collected, not reported lost (a stream
     * past its wait on the device word may find done a moment behind:
     * PROTOCOL.md 13.2). */
    uint32_t fired = g->open ? rnc_watch_fired(c) : 0;
    bool gone = g->open && (fired || session_over(c, g));
    bool ended = g->open && (gone || __atomic_load_n(rnp_ring_u32(g->base, RNP_RING_O_STATE),
                                                     __ATOMIC_ACQUIRE) != RNP_RING_OPEN);
    if (g->open)
        collect(g, fired ? __atomic_load_n(&c->watch_answered, __ATOMIC_SEQ_CST) : load_done(g));
    rnc_collect_graphs(g);
    /* A session the daemon ended (its idle timeout, a restart) with no call
     * outstanding: said now, so that graphs whose replays compute nothing
     * any more are not silent (lost() reports them). */
    if (g->open) {
        if (ended)
            lost(g, RN_RESTARTED,
                 fired ? rnc_watch_why(fired) : "the daemon ended the session (or exited)");
        if (gone && current(c, g)) /* (a newer session is not the one that ended) */
            c->have_session = false;
    }
    return report(c, g);
}
