/* SPDX-License-Identifier: MIT */
/*
 * closeq.c - the closer thread and its bounded inbox (closeq.h says what
 * for).  The thread takes the whole inbox at once into a list of its own,
 * then asks each item whether it is ready and closes those that are, so one
 * item whose fence is far off holds up none behind it; when a look finds
 * none ready it pauses (poll_min_us, doubling up to poll_max_us; a new item
 * or a stop cuts the pause short) and looks again.  Before each close it
 * asks the owner's gate (closeq.h): a shut gate ends the look, and the
 * thread looks again after its pause, as when none was ready.
 */
#include "closeq.h"

#include <time.h>

#include "stats.h"

#define CLOSEQ_CAP 256
#define CLOSEQ_POLL_MIN_US 100
#define CLOSEQ_POLL_MAX_US 10000

static void init_common(rnd_closeq *q, const rnd_closeq_ops *ops, void *ctx)
{
    pthread_condattr_t ca;

    q->ops = ops;
    q->ctx = ctx;
    rn_queue_init(&q->backlog);
    rn_queue_init(&q->inbox);
    pthread_mutex_init(&q->mu, NULL);
    /* The pause is a relative time: a monotonic clock keeps a change of the
     * wall clock from stretching it. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!q->cap)
        q->cap = CLOSEQ_CAP;
    if (!q->poll_min_us)
        q->poll_min_us = CLOSEQ_POLL_MIN_US;
    if (!q->poll_max_us)
        q->poll_max_us = CLOSEQ_POLL_MAX_US;
}

/* One item closed (under mu). */
static void count_closed(rnd_closeq *q, const rnd_closeq_item *it, uint64_t now)
{
    uint64_t w = now > it->queued_ns ? now - it->queued_ns : 0;
    q->closed++;
    if (w > q->wait_max_ns)
        q->wait_max_ns = w;
}

static void note_pending(rnd_closeq *q)
{
    uint64_t p = (uint64_t)q->nbacklog + q->held;
    if (p > q->pending_max)
        q->pending_max = p;
}

/*
 * The gate before a close (no lock held): 1 go (gate_leave follows the
 * close), 0 shut, -1 never.  A time the gate held closes counts once, from
 * when a look first found it shut until one finds it open; the owner hears
 * how long it was then.
 */
static int gate_enter(rnd_closeq *q)
{
    uint64_t held = 0, pending = 0;
    bool opened = false;

    if (!q->ops->gate_enter)
        return 1;
    int g = q->ops->gate_enter(q->ctx);
    uint64_t now = rnd_now_ns();
    pthread_mutex_lock(&q->mu);
    if (g == 0 && !q->shut_since) {
        q->shut_since = now ? now : 1;
        q->gated++;
    } else if (g > 0 && q->shut_since) {
        held = now > q->shut_since ? now - q->shut_since : 0;
        if (held > q->gated_max_ns)
            q->gated_max_ns = held;
        q->shut_since = 0;
        pending = (uint64_t)q->nbacklog + q->held;
        opened = true;
    }
    pthread_mutex_unlock(&q->mu);
    if (opened && q->ops->gate_opened)
        q->ops->gate_opened(q->ctx, held, pending);
    return g;
}

static void gate_leave(rnd_closeq *q)
{
    if (q->ops->gate_leave)
        q->ops->gate_leave(q->ctx);
}

/* One look at every item of mine: close the ready ones while the gate lets
 * them.  Returns how many were closed, or -1 when an item or the gate said
 * never (or the loop halted q). */
static int pass(rnd_closeq *q, rn_queue *mine)
{
    rn_queue *e, *next;
    int n = 0;

    RN_QUEUE_FOREACH_SAFE(e, next, mine) {
        rnd_closeq_item *it = RN_QUEUE_DATA(e, rnd_closeq_item, link);
        pthread_mutex_lock(&q->mu);
        bool halted = q->halted;
        pthread_mutex_unlock(&q->mu);
        if (halted)
            return -1;
        int r = q->ops->ready(q->ctx, it);
        if (r < 0)
            return -1;
        if (r == 0)
            continue;
        if ((r = gate_enter(q)) < 0)
            return -1;
        if (r == 0)
            return n; /* shut: the next look asks again */
        rn_queue_remove(e);
        pthread_mutex_lock(&q->mu);
        q->busy = true;
        pthread_mutex_unlock(&q->mu);
        uint64_t queued = it->queued_ns;
        q->ops->close(q->ctx, it); /* frees it */
        gate_leave(q);
        rnd_closeq_item done = {.queued_ns = queued};
        pthread_mutex_lock(&q->mu);
        q->busy = false;
        q->held--;
        count_closed(q, &done, rnd_now_ns());
        pthread_mutex_unlock(&q->mu);
        n++;
    }
    return n;
}

static void pause_us(rnd_closeq *q, uint32_t us)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)us * 1000L;
    while (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&q->cv, &q->mu, &until);
}

static void *closer_main(void *arg)
{
    rnd_closeq *q = arg;
    uint32_t pause = q->poll_min_us;
    rn_queue mine;

    rn_queue_init(&mine);
    if (q->ops->thread_start)
        q->ops->thread_start(q->ctx);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        rn_queue_move(&mine, &q->inbox);
        if (q->halted || (rn_queue_empty(&mine) && q->stop))
            break;
        if (rn_queue_empty(&mine)) {
            pthread_cond_wait(&q->cv, &q->mu);
            pause = q->poll_min_us;
            continue;
        }
        pthread_mutex_unlock(&q->mu);
        int n = pass(q, &mine);
        pthread_mutex_lock(&q->mu);
        if (n < 0) {
            q->halted = true; /* what mine holds is left to the process exit */
            break;
        }
        if (n > 0 || !rn_queue_empty(&q->inbox)) {
            pause = q->poll_min_us;
            continue;
        }
        /* None ready (a fence is still ahead on the device), or the gate
         * is shut.  A push or a stop wakes the thread early; else it looks
         * again after pause. */
        pause_us(q, pause);
        pause = pause * 2 > q->poll_max_us ? q->poll_max_us : pause * 2;
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int rnd_closeq_start(rnd_closeq *q, const rnd_closeq_ops *ops, void *ctx, uint32_t cap)
{
    int rc;

    q->cap = cap;
    init_common(q, ops, ctx);
    if ((rc = pthread_create(&q->thr, NULL, closer_main, q)) != 0) {
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        return rc;
    }
    q->running = true;
    return 0;
}

void rnd_closeq_init_inline(rnd_closeq *q, const rnd_closeq_ops *ops, void *ctx)
{
    init_common(q, ops, ctx);
    q->running = false;
}

void rnd_closeq_flush(rnd_closeq *q)
{
    bool moved = false;

    if (!q->running || rn_queue_empty(&q->backlog))
        return;
    pthread_mutex_lock(&q->mu);
    while (!q->halted && q->held < q->cap && !rn_queue_empty(&q->backlog)) {
        rn_queue *e = rn_queue_head(&q->backlog);
        rn_queue_remove(e);
        rn_queue_push_back(&q->inbox, e);
        q->nbacklog--;
        q->held++;
        moved = true;
    }
    if (moved)
        pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void rnd_closeq_push(rnd_closeq *q, rnd_closeq_item *it)
{
    it->queued_ns = rnd_now_ns();
    rn_queue_push_back(&q->backlog, &it->link);
    pthread_mutex_lock(&q->mu);
    q->nbacklog++;
    note_pending(q);
    pthread_mutex_unlock(&q->mu);
    rnd_closeq_flush(q);
}

void rnd_closeq_close_here(rnd_closeq *q)
{
    rn_queue *e, *next;

    RN_QUEUE_FOREACH_SAFE(e, next, &q->backlog) {
        rnd_closeq_item *it = RN_QUEUE_DATA(e, rnd_closeq_item, link);
        if (q->ops->ready(q->ctx, it) <= 0)
            continue;
        if (gate_enter(q) <= 0)
            return; /* shut (or never): the next call asks again */
        rn_queue_remove(e);
        rnd_closeq_item done = {.queued_ns = it->queued_ns};
        q->ops->close(q->ctx, it); /* frees it */
        gate_leave(q);
        pthread_mutex_lock(&q->mu);
        q->nbacklog--;
        count_closed(q, &done, rnd_now_ns());
        pthread_mutex_unlock(&q->mu);
    }
}

void rnd_closeq_halt(rnd_closeq *q)
{
    pthread_mutex_lock(&q->mu);
    q->halted = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

bool rnd_closeq_stop(rnd_closeq *q, int timeout_ms)
{
    struct timespec until;

    if (!q->running)
        return true;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    q->running = false;
    if (timeout_ms < 0)
        return pthread_join(q->thr, NULL) == 0;
    /* pthread_timedjoin_np counts on the realtime clock. */
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(q->thr, NULL, &until) == 0)
        return true;
    pthread_detach(q->thr);
    return false;
}

void rnd_closeq_destroy(rnd_closeq *q)
{
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

void rnd_closeq_get_stats(rnd_closeq *q, rnd_closeq_stats *out)
{
    pthread_mutex_lock(&q->mu);
    out->pending = (uint64_t)q->nbacklog + q->held;
    out->closed = q->closed;
    out->pending_max = q->pending_max;
    out->wait_max_ns = q->wait_max_ns;
    out->gated = q->gated;
    out->gate_shut = q->shut_since != 0;
    /* A gate shut now counts with how long it has held so far. */
    uint64_t now = rnd_now_ns();
    out->gated_max_ns = q->gated_max_ns;
    if (q->shut_since && now > q->shut_since && now - q->shut_since > out->gated_max_ns)
        out->gated_max_ns = now - q->shut_since;
    pthread_mutex_unlock(&q->mu);
}
