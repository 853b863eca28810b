/* SPDX-License-Identifier: MIT */
/*
 * watch.c - the daemon watcher: a thread per client that notices the
 * daemon's end while no call of the client runs, and lets go of the ring's
 * words the client's streams wait on (PROTOCOL.md 13, "A client whose
 * session is lost ..."; 13.8, "Ends").
 *
 * Why.  On the fast path a call's completion is a wait in the client's
 * stream (cuStreamWaitValue64: done >= seq), and a graph replay's too (its
 * graph slot's done >= 1).  Only the daemon answers them.  When it dies
 * (kill -9, a crash) the words stay as they are; without this thread the
 * streams waited until the client's next libclient call found the session
 * channel closed, and a client that only replays graphs, or waits for the
 * stream inside its framework, makes no such call.
 *
 * What.  The thread starts when the client's ring first opens (ring.c arms
 * it in each session) and sleeps in poll(2) on an eventfd (arm, disarm,
 * stop), a duplicate of the session channel (the daemon's end closing:
 * POLLHUP/POLLRDHUP; replies, POLLIN, are not asked for, so a call's
 * exchange never wakes it) and a pidfd of the daemon (readable once its
 * process exited).  It fires:
 *   - when the daemon exited: the pidfd (from the channel's SO_PEERCRED);
 *   - when the channel closed and the ring's state word says closed: a live
 *     daemon ended the session and answered every slot it took (or, taking
 *     the client for dead, let go of them: nothing of the ring runs);
 *   - when the channel closed and neither happened within RNC_LINGER_MS
 *     (RNC_LINGER_BLIND_MS without a pidfd: a daemon in another pid namespace,
 *     or a kernel before 5.3; then the close is all there is to go by).
 * A live daemon that closes the channel may still be running slots it took
 * (the drain): waiting for the state word keeps the client's streams from
 * running ahead of those kernels.  Firing is what the next call would do
 * (ring.c's lost()): the slots published and not answered (after the
 * larger of the ring's done and the device done word: answered_upto) get
 * status RN_RESTARTED and a message, then done passes them (a CAS: done only
 * grows), waiters on done are woken; every graph slot a live graph holds
 * gets closed, a fence, then done = 1 (the Dekker pair of the replay's
 * kernel, ring_cuda.c).  c->watch_answered and c->watch_fired are stored
 * first, so a call that sees done moved sees the loss too.
 *
 * Threads.  The watcher never takes c->mu (a call may hold it for a whole
 * timeout).  Its state (struct rnc_watch) and every write it makes into the
 * ring happen under w->mu, which the calls take to arm, disarm and keep the
 * held graph slots up to date, never while they wait; so once disarm
 * returned the watcher touches the ring no more, and ring.c may reuse the
 * memory.  The hot path of a call reads only c->watch_fired (an atomic
 * load; no syscall, no lock).  A slot published while the watcher fires is
 * the Dekker pair: the watcher stores fired, fences and reads prod; the
 * call stores prod, fences (the fence it has for `sleeping`) and reads
 * fired, and if set releases its slot through rnc_watch_catch_up.  The
 * thread closes the descriptors it polls itself (after poll returned): a
 * descriptor closed under another thread's poll is not woken, and its
 * number may be reused.  The duplicate of the channel keeps the connection
 * open until the thread drops it, a few microseconds after a disarm.
 *
 * fork.  Only the forking thread exists in the child: a client copied
 * there has no watcher (rmsnorm_client.h: a child must not use its
 * parent's client).  rnc_watch_stop in a child frees the copy and closes
 * the child's copies of the descriptors without touching the thread or the
 * mutex (either may have been busy at the fork).  Descriptors are
 * close-on-exec.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "rn_ring.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* While it lingers, the state word is looked at after 1 ms, then at
 * doubling intervals up to this. */
#define NAP_MAX_MS  50
#define STACK_BYTES (256u * 1024u)

struct rnc_watch {
    rn_client *c;
    pthread_t thread;
    pid_t owner;        /* the process the thread runs in */
    int efd;            /* eventfd: wakes the thread */
    pthread_mutex_t mu; /* everything below, and the watcher's writes into the ring */
    bool stop;
    bool armed;              /* a session's ring is watched */
    uint64_t gen;            /* arms and disarms so far: the thread takes new descriptors */
    int chan, pidfd;         /* of the latest arm, until the thread takes them; -1 */
    int cur_chan, cur_pidfd; /* the ones the thread polls (closed only by it, or
                              * by rnc_watch_stop once it is gone) */
    uint8_t *base;           /* the ring; graph slots at graph_off, RNP_GRAPH_SLOT apart */
    uint32_t slots, graphs;
    uint64_t graph_off;
    uint64_t done_dev;       /* the device done word the streams wait on, 0: the ring's */
    uint64_t held[RNP_GRAPH_MAX / 64]; /* graph slots a live graph holds */
};

static const char *const whys[] = {
    [RNC_WATCH_QUIET] = "the session ended",
    [RNC_WATCH_EXITED] = "the daemon exited",
    [RNC_WATCH_ENDED] = "the daemon ended the session",
    [RNC_WATCH_SILENT] = "the daemon closed the session channel",
};

const char *rnc_watch_why(uint32_t fired)
{
    return fired < sizeof whys / sizeof whys[0] ? whys[fired] : whys[0];
}

void rnc_watch_raise(uint64_t *w, uint64_t seq)
{
    uint64_t d = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    while (!rnp_seq_reached(d, seq) &&
           !__atomic_compare_exchange_n(w, &d, seq, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
        ;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void wake(rnc_watch *w)
{
    uint64_t one = 1;
    /* EAGAIN: the counter is full, the thread will wake anyway. */
    (void)!write(w->efd, &one, sizeof one);
}

/*
 * The daemon's pidfd, from the channel's peer (the process that listens:
 * the daemon's core), or -1: a daemon in another pid namespace (pid 0), a
 * kernel without pidfd_open.  A pid names the daemon only while its end of
 * the channel is open, so a channel already closed gives none (the pid may
 * be another process's by now).
 */
int rnc_daemon_pidfd(int chan)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    struct pollfd p = {chan, POLLRDHUP, 0};
    int fd;

    if (getsockopt(chan, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr ||
        cr.pid <= 0)
        return -1;
    if ((fd = (int)syscall(SYS_pidfd_open, (pid_t)cr.pid, 0u)) < 0)
        return -1;
    if (poll(&p, 1, 0) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- the release (under w->mu, armed) ------------------------------------------------- */

/* Graph slot i: closed first, then done (ring.c's graph_let_go). */
static void let_go(rnc_watch *w, uint32_t i)
{
    uint8_t *s = w->base + w->graph_off + (uint64_t)i * RNP_GRAPH_SLOT;
    __atomic_store_n(rnp_ring_u32(s, RNP_GSLOT_O_CLOSED), 1u, __ATOMIC_SEQ_CST);
    atomic_thread_fence(memory_order_seq_cst);
    __atomic_store_n(rnp_ring_u64(s, RNP_GSLOT_O_DONE), 1u, __ATOMIC_SEQ_CST);
}

/* The calls the daemon answered: up to the ring's done word, or to the
 * device done word the streams wait on where that is further.  The kernel
 * writes the device word first: a daemon that died between its two stores
 * ran the call, and its stream went on (the daemon wrote the slot's status
 * 0 before the launch). */
static uint64_t answered_upto(rnc_watch *w)
{
    uint64_t done = __atomic_load_n(rnp_ring_u64(w->base, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
    uint64_t dev;
    if (w->done_dev && w->c->done_read && w->c->done_read(w->c, w->done_dev, &dev) == 0 &&
        rnp_seq_reached(dev, done) && dev - done <= w->slots)
        done = dev;
    return done;
}

/* The slots published and not answered (after done, answered_upto's):
 * their status, then the ring's done word past them, then the device done
 * word (if the streams wait on one) to prod.  The slots up to prod were
 * written before prod (release), and a call reads a result only after done
 * reached it. */
static void release_ring(rnc_watch *w, uint64_t done)
{
    uint8_t *b = w->base;
    uint32_t fired = __atomic_load_n(&w->c->watch_fired, __ATOMIC_RELAXED);
    uint64_t prod = __atomic_load_n(rnp_ring_u64(b, RNP_RING_O_PROD), __ATOMIC_ACQUIRE);
    uint64_t ring = __atomic_load_n(rnp_ring_u64(b, RNP_RING_O_DONE), __ATOMIC_ACQUIRE);
    char msg[RNP_MAX_ERRMSG];

    if (rnp_seq_reached(ring, done))
        done = ring;
    if (!rnp_seq_reached(done, prod)) {
        if (prod - done > w->slots) /* cannot happen: a client is at most a ring ahead */
            done = prod - w->slots;
        snprintf(msg, sizeof msg, "%s before the call was answered; its outputs are undefined",
                 rnc_watch_why(fired));
        for (uint64_t s = done + 1;; s++) {
            rnp_ring_put_result(b + rnp_ring_slot_off(s, w->slots), RN_RESTARTED, msg);
            if (s == prod)
                break;
        }
    }
    if (!rnp_seq_reached(ring, prod)) {
        rnc_watch_raise(rnp_ring_u64(b, RNP_RING_O_DONE), prod);
        atomic_thread_fence(memory_order_seq_cst);
        if (__atomic_load_n(rnp_ring_u32(b, RNP_RING_O_WAITERS), __ATOMIC_SEQ_CST))
            syscall(SYS_futex, rnp_ring_u32(b, RNP_RING_O_DONE), FUTEX_WAKE, INT32_MAX, NULL,
                    NULL, 0);
    }
    /* The device word too, even where the ring's reached prod: a daemon
     * that failed answers from the host, into the ring's word alone. */
    if (w->done_dev && w->c->done_raise)
        w->c->done_raise(w->c, w->done_dev, prod);
}

static void fire(rnc_watch *w, uint32_t why)
{
    rn_client *c = w->c;
    uint64_t answered = answered_upto(w);

    __atomic_store_n(&c->watch_answered, answered, __ATOMIC_SEQ_CST);
    __atomic_store_n(&c->watch_fired, why, __ATOMIC_SEQ_CST);
    /* Pairs with the fence after a call's prod: fired, then prod. */
    atomic_thread_fence(memory_order_seq_cst);
    release_ring(w, answered);
    for (uint32_t i = 0; i < w->graphs; i++)
        if (w->held[i / 64] >> (i % 64) & 1u)
            let_go(w, i);
}

/* ---- the thread ---------------------------------------------------------------------- */

static void *watch_main(void *arg)
{
    rnc_watch *w = arg;
    uint64_t mine = 0;
    bool spent = true, hup = false;
    int64_t hup_ms = 0;
    int nap = -1;

    for (;;) {
        struct pollfd p[3];
        int n;

        pthread_mutex_lock(&w->mu);
        if (w->stop) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        if (w->gen != mine) {
            /* Armed again, or disarmed: the old descriptors go, here. */
            close_fd(&w->cur_chan);
            close_fd(&w->cur_pidfd);
            w->cur_chan = w->chan;
            w->cur_pidfd = w->pidfd;
            w->chan = w->pidfd = -1;
            mine = w->gen;
            spent = !w->armed;
            hup = false;
            nap = -1;
        }
        p[0] = (struct pollfd){w->efd, POLLIN, 0};
        p[1] = (struct pollfd){spent || hup ? -1 : w->cur_chan, POLLRDHUP, 0};
        p[2] = (struct pollfd){spent ? -1 : w->cur_pidfd, POLLIN, 0};
        pthread_mutex_unlock(&w->mu);

        n = poll(p, 3, spent ? -1 : nap);
        if (n < 0) {
            if (errno != EINTR)
                poll(NULL, 0, 10); /* ENOMEM: try again shortly */
            continue;
        }
        if (p[0].revents) {
            uint64_t v;
            (void)!read(w->efd, &v, sizeof v);
            continue; /* the state changed: look again (poll is level-triggered) */
        }
        if (spent)
            continue;
        if (p[1].revents && !hup) {
            hup = true;
            hup_ms = now_ms();
        }
        bool died = p[2].revents != 0;
        if (!died && !hup)
            continue;
        pthread_mutex_lock(&w->mu);
        if (w->armed && w->gen == mine && !w->stop) {
            uint32_t state =
                __atomic_load_n(rnp_ring_u32(w->base, RNP_RING_O_STATE), __ATOMIC_ACQUIRE);
            int64_t linger = w->cur_pidfd >= 0 ? RNC_LINGER_MS : RNC_LINGER_BLIND_MS;
            if (died)
                fire(w, RNC_WATCH_EXITED);
            else if (state != RNP_RING_OPEN)
                fire(w, RNC_WATCH_ENDED);
            else if (now_ms() - hup_ms >= linger)
                fire(w, RNC_WATCH_SILENT);
            else
                nap = nap < 0 ? 1 : nap * 2 > NAP_MAX_MS ? NAP_MAX_MS : nap * 2;
            spent = __atomic_load_n(&w->c->watch_fired, __ATOMIC_RELAXED) != RNC_WATCH_QUIET;
        }
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_lock(&w->mu);
    close_fd(&w->cur_chan);
    close_fd(&w->cur_pidfd);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The watcher of c, started now; NULL when it cannot be (no error: the
 * client goes on without one, as with RMSNORMD_WATCH=0). */
static rnc_watch *start(rn_client *c)
{
    rnc_watch *w = calloc(1, sizeof *w);
    pthread_attr_t at;
    sigset_t all, old;
    int rc;

    if (!w)
        return NULL;
    w->c = c;
    w->owner = getpid();
    w->chan = w->pidfd = w->cur_chan = w->cur_pidfd = -1;
    if ((w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        goto no_efd;
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        goto no_mutex;
    if (pthread_attr_init(&at) != 0)
        goto no_attr;
    (void)pthread_attr_setstacksize(&at, STACK_BYTES);
    /* The application's signals are not for this thread. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&w->thread, &at, watch_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&at);
    if (rc != 0)
        goto no_attr;
    (void)pthread_setname_np(w->thread, "rn-watch");
    return w;
no_attr:
    pthread_mutex_destroy(&w->mu);
no_mutex:
    close(w->efd);
no_efd:
    free(w);
    return NULL;
}

void rnc_watch_arm(rn_client *c, uint8_t *base, uint32_t slots, uint64_t graph_off, uint32_t graphs,
                   uint64_t done_dev)
{
    rnc_watch *w;
    int chan;

    if (c->watch_off || !c->have_chan)
        return;
    if (!c->watch && !(c->watch = start(c)))
        goto none;
    w = c->watch;
    if ((chan = fcntl(c->chan, F_DUPFD_CLOEXEC, 0)) < 0) {
        rnc_watch_disarm(c);
        goto none;
    }
    int pidfd = rnc_daemon_pidfd(chan);
    pthread_mutex_lock(&w->mu);
    close_fd(&w->chan); /* an arm the thread has not taken yet: never polled */
    close_fd(&w->pidfd);
    w->chan = chan;
    w->pidfd = pidfd;
    w->armed = true;
    w->gen++;
    w->base = base;
    w->slots = slots;
    w->graph_off = graph_off;
    w->done_dev = done_dev;
    w->graphs = graphs <= RNP_GRAPH_MAX ? graphs : RNP_GRAPH_MAX;
    memset(w->held, 0, sizeof w->held);
    __atomic_store_n(&c->watch_answered, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&c->watch_fired, RNC_WATCH_QUIET, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&w->mu);
    wake(w);
    return;
none:
    /* No watcher for this ring (the thread disarmed, or none): the client
     * goes on as one without, and the last ring's firing must not be taken
     * for this one's (every call failed RN_UNKNOWN_SESSION against a live
     * daemon, found in review). */
    __atomic_store_n(&c->watch_answered, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&c->watch_fired, RNC_WATCH_QUIET, __ATOMIC_SEQ_CST);
}

void rnc_watch_disarm(rn_client *c)
{
    rnc_watch *w = c->watch;

    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    bool was = w->armed;
    close_fd(&w->chan);
    close_fd(&w->pidfd);
    if (was) {
        w->armed = false;
        w->base = NULL;
        w->gen++;
    }
    pthread_mutex_unlock(&w->mu);
    /* The thread drops the channel's duplicate (the daemon then sees the
     * connection close) and stops polling. */
    if (was)
        wake(w);
}

void rnc_watch_graph(rn_client *c, const uint8_t *base, uint32_t i, bool held)
{
    rnc_watch *w = c->watch;

    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->armed && w->base == base && i < w->graphs) {
        if (held)
            w->held[i / 64] |= 1ull << (i % 64);
        else
            w->held[i / 64] &= ~(1ull << (i % 64));
        if (held && rnc_watch_fired(c) != RNC_WATCH_QUIET)
            let_go(w, i);
    }
    pthread_mutex_unlock(&w->mu);
}

void rnc_watch_catch_up(rn_client *c)
{
    rnc_watch *w = c->watch;

    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->armed && rnc_watch_fired(c) != RNC_WATCH_QUIET)
        release_ring(w, __atomic_load_n(&c->watch_answered, __ATOMIC_SEQ_CST));
    pthread_mutex_unlock(&w->mu);
}

bool rnc_watch_stop(rn_client *c)
{
    rnc_watch *w = c->watch;
    bool ended = false;

    if (!w)
        return false;
    c->watch = NULL;
    if (w->owner == getpid()) {
        pthread_mutex_lock(&w->mu);
        ended = w->armed && rnc_watch_fired(c) != RNC_WATCH_QUIET;
        w->stop = true;
        pthread_mutex_unlock(&w->mu);
        wake(w);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
    }
    /* In a fork child the thread's descriptors are still here (copies). */
    close_fd(&w->chan);
    close_fd(&w->pidfd);
    close_fd(&w->cur_chan);
    close_fd(&w->cur_pidfd);
    close(w->efd);
    free(w);
    return ended;
}
