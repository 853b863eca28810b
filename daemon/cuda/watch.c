/* SPDX-License-Identifier: MIT */
/*
 * watch.c - the deadline watch.  The deadline (rnd_backend_opts.
 * kernel_deadline_ms, default 60 s) is a kernel's: a timer on the loop
 * (every RND_CUDA_WATCH_MS, or a quarter of the deadline when that is
 * shorter) polls, with cudaEventQuery only, the start event of every job
 * that has not started yet, and takes the host time at which it first sees
 * the event complete as the job's start.  The start event completes once
 * the client's inputs are ready and the work queued before on the stream has
 * ended, so from then on the stream runs our kernel (or waits for SMs that
 * other work holds).  A job that has started longer than the deadline ago
 * marks the backend failed.  A job whose inputs are still not ready a
 * deadline after its submission only logs a warning, once, naming its
 * session and stream, and goes on waiting: a slow or stalled client holds
 * up its own stream (and sessions sharing it), never the daemon.  Unless its
 * session has ended (the client died or said BYE): then the ready event may
 * never come and the stream would stay blocked for the sessions that share
 * it later, so that marks the backend failed.
 */
#include "cuda_int.h"

#include <inttypes.h>

#include "log.h"
#include "stats.h"

/*
 * A job not started a deadline after its submission: say so, once, and keep
 * waiting.  head is the oldest job of its stream that has not started (g
 * itself, or one before g); running: a job before head on the stream has
 * started and not completed yet, so the stream waits for that kernel (which
 * the deadline covers), not for inputs.
 */
static void warn_unready(rnd_cuda *b, rnd_cuda_gjob *g, const rnd_cuda_gjob *head, bool running,
                         uint64_t now)
{
    const rnd_cuda_sess *cs = g->cs;

    if (head == g) {
        if (running)
            return;
        rnd_warn("cuda session #%u (stream %d): inputs not ready after %" PRIu64 " ms; "
                 "waiting (the client's stream has not reached its ready event; the %" PRIu64
                 " ms kernel deadline counts from when it does)",
                 cs->id, g->stream, (now - g->submit_ns) / 1000000, b->deadline_ns / 1000000);
    } else {
        /* Queued behind another job on the same stream.  Behind the
         * session's own job (warned about already) or behind a running
         * kernel there is nothing new to say; behind another session's
         * unready inputs (more sessions than streams) there is. */
        if (head->cs == cs || !head->unready_warned)
            return;
        rnd_warn("cuda session #%u (stream %d): a request has waited %" PRIu64
                 " ms behind one of session #%u, whose inputs are not ready (the two share "
                 "the stream: more than %d sessions); waiting",
                 cs->id, g->stream, (now - g->submit_ns) / 1000000, head->cs->id, b->nstreams);
    }
    g->unready_warned = true;
}

static void check_streams(rnd_cuda *b)
{
    for (int i = 0; i < b->nstreams; i++) {
        if (!b->streams[i].live)
            continue;
        cudaError_t e = cudaStreamQuery(b->streams[i].st);
        if (e == cudaSuccess || e == cudaErrorNotReady)
            continue;
        (void)cudaGetLastError();
        rnd_cuda_mark_failed(b, "stream %d: %s", i, cudaGetErrorString(e));
        return;
    }
}

/*
 * The watch: sticky errors, the start of each job, overdue kernels, and
 * inputs that take long to become ready.  Non-blocking: queries only.
 */
void rnd_cuda_on_watch(uv_timer_t *t)
{
    rnd_cuda *b = t->data;
    uint64_t now = rnd_now_ns();
    /* Per stream, in this pass: its oldest job not started yet, and whether
     * a job before that one has started (its kernel runs). */
    const rnd_cuda_gjob *head[RND_CUDA_MAX_STREAMS] = {NULL};
    bool running[RND_CUDA_MAX_STREAMS] = {false};
    bool earlier[RND_CUDA_MAX_STREAMS] = {false}; /* a job before this one, outstanding */
    rn_queue *q;

    if (b->failed || rn_queue_empty(&b->outstanding))
        return;
    rnd_cuda_ring_release_cancelled(b);
    check_streams(b);
    /* Oldest first, which is each stream's order: once a job of a stream
     * has not started, none after it on that stream has. */
    for (q = b->outstanding.next; q != &b->outstanding && !b->failed; q = q->next) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, link);
        int si = g->stream;
        if (!g->start_ns && !head[si] && g->no_start) {
            /* No start event (submit.c): it waits for nothing but the jobs
             * before it on its stream, so it runs once it is the oldest. */
            if (earlier[si])
                head[si] = g;
            else
                g->start_ns = now;
        } else if (!g->start_ns && !head[si]) {
            cudaError_t e = cudaEventQuery(g->started);
            if (e == cudaSuccess) {
                g->start_ns = now;
            } else if (e == cudaErrorNotReady) {
                head[si] = g;
            } else {
                (void)cudaGetLastError();
                rnd_cuda_mark_failed(b, "stream %d: the start event of a request: %s", si,
                                     cudaGetErrorString(e));
                break;
            }
        }
        if (g->start_ns) {
            running[si] = true;
            if (now - g->start_ns > b->deadline_ns)
                rnd_cuda_mark_failed(
                    b,
                    "kernel deadline: a kernel of session #%u (stream %d) has "
                    "run %" PRIu64 " ms, past %" PRIu64 " ms (a hung or far too slow GPU)",
                    g->cs->id, si, (now - g->start_ns) / 1000000, b->deadline_ns / 1000000);
        } else if (now - g->submit_ns > b->deadline_ns) {
            if (g->cs->ending && head[si] == g && !running[si])
                /* Its client is gone (or said BYE) and the ready event has
                 * not come: a dead process's event may never come, and the
                 * stream, which later sessions share, would stay blocked. */
                rnd_cuda_mark_failed(b,
                                     "cuda session #%u (stream %d): its client is gone and the "
                                     "inputs of its request were still not ready after %" PRIu64
                                     " ms: the stream is blocked for good",
                                     g->cs->id, si, (now - g->submit_ns) / 1000000);
            else if (!g->unready_warned)
                warn_unready(b, g, head[si], running[si], now);
        }
        earlier[si] = true;
    }
    rnd_cuda_run_fatal(b);
}
