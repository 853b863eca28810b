/* SPDX-License-Identifier: MIT */
/*
 * complete.c - how a job's events reach the server, and the fatal path.
 *
 * Completion: one thread per stream waits (cudaEventSynchronize, blocking
 * sync) on the completion events of its stream in order, queues each
 * finished job and wakes the loop with uv_async_send; the loop drains the
 * whole queue (uv_async_send coalesces wake-ups).  Not cudaLaunchHostFunc: a
 * host function holds its stream until the callback has run, which put the
 * callback's latency (tens of us) between one request's kernel and the next
 * on the GPU.
 *
 * Events: an async job's acked event runs from the loop's check phase right
 * after submit (its done event is recorded, so the client can wait on it
 * itself), and its done event when its completion event has fired; a sync
 * job has only the done event, at completion, with the kernel time.  A job
 * whose completion comes before its acked event went out gets the done
 * event alone, which answers it just as well.
 *
 * Failures: a sticky CUDA error (the context is unusable), a kernel running
 * past the deadline, or the debug-fail-after knob marks the backend failed
 * (device.c).  Then, from the loop, every job not yet done gets its done
 * event with RN_DEVICE_FAILING (acked ones too: the server then only logs),
 * HEALTH reports failing, and the server's fatal hook drains and exits with
 * status 2 for systemd to restart.  The backend touches nothing of a job
 * after its done event.
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"
#include "ring_io.h"
#include "stats.h"

/* One per stream: wait for its jobs in order, hand each to the loop.  A
 * ring's own stream's thread also returns when told to (quit, ownstream.c). */
void *rnd_cuda_completion_thread(void *arg)
{
    rnd_cuda_stream *s = arg;
    rnd_cuda *b = s->b;
    rn_queue *q;

    (void)cudaSetDevice(b->dev);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while ((q = rn_queue_head(&s->fifo)) == NULL && !b->stop && !s->quit)
            pthread_cond_wait(&s->cv, &b->mu);
        if (!q)
            break;
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, flink);
        pthread_mutex_unlock(&b->mu);
        cudaError_t e = cudaEventSynchronize(g->fin);
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        pthread_mutex_lock(&b->mu);
        rn_queue_remove(&g->flink);
        if (b->gone)
            continue; /* fini left the device to the process exit: nobody takes it */
        g->err = e;
        rn_queue_push_back(&b->completed, &g->flink);
        uv_async_send(&b->async);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int rnd_cuda_threads_start(rnd_cuda *b, rnp_error *err)
{
    rn_fault f;

    for (int i = 0; i < b->nstreams; i++) {
        rnd_cuda_stream *s = &b->streams[i];
        RN_PT_GOTO(pthread_create(&s->thr, NULL, rnd_cuda_completion_thread, s), &f, fail);
        s->thr_started = true;
    }
    return 0;
fail:
    rnd_cuda_threads_stop(b, -1);
    return rnd_cuda_fault(b, &f, false, err, "backend: a completion thread");
}

/*
 * Stop the completion threads once their FIFOs are empty and join them:
 * within timeout_ms (< 0: however long it takes), else detach the ones left
 * and mark b gone, so that they no longer touch the loop.  A thread waits in
 * cudaEventSynchronize, which returns at once with an error on a failed
 * context, but only when the kernel ends if the deadline failed it.
 * Returns whether every thread was joined.
 */
bool rnd_cuda_threads_stop(rnd_cuda *b, int timeout_ms)
{
    struct timespec until;
    bool all = true;

    pthread_mutex_lock(&b->mu);
    b->stop = true;
    for (int i = 0; i < b->nstreams; i++)
        if (b->streams[i].live)
            pthread_cond_broadcast(&b->streams[i].cv);
    pthread_mutex_unlock(&b->mu);
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms >= 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    for (int i = 0; i < b->nstreams; i++) {
        rnd_cuda_stream *s = &b->streams[i];
        if (!s->thr_started)
            continue;
        s->thr_started = false;
        if ((timeout_ms < 0 ? pthread_join(s->thr, NULL)
                            : pthread_timedjoin_np(s->thr, NULL, &until)) != 0) {
            pthread_detach(s->thr);
            all = false;
        }
    }
    if (!all) {
        pthread_mutex_lock(&b->mu);
        b->gone = true;
        pthread_mutex_unlock(&b->mu);
    }
    return all;
}

/* Hand g to its stream's completion thread. */
void rnd_cuda_fifo_push(rnd_cuda *b, rnd_cuda_gjob *g)
{
    rnd_cuda_stream *s = &b->streams[g->stream];

    pthread_mutex_lock(&b->mu);
    rn_queue_push_back(&s->fifo, &g->flink);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&b->mu);
    g->in_fifo = true;
}

/* g's acked event, from the loop's next check (or idle) phase.  The idle
 * handle keeps the loop from sleeping in its poll when the job came from a
 * callback that ran after our check in this iteration. */
void rnd_cuda_ack_later(rnd_cuda *b, rnd_cuda_gjob *g)
{
    if (!g->job->acked)
        return; /* the server wants the done event only */
    if (rn_queue_empty(&b->acked))
        uv_idle_start(&b->kick, rnd_cuda_on_idle);
    rn_queue_push_back(&b->acked, &g->alink);
}

static void flush_acked(rnd_cuda *b)
{
    rn_queue *q;

    /* A failure answers them instead (run_fatal). */
    while (!b->failed && (q = rn_queue_head(&b->acked)) != NULL) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, alink);
        rn_queue_remove(q);
        g->acked = true;
        g->job->acked(g->job);
    }
    if (rn_queue_empty(&b->acked))
        uv_idle_stop(&b->kick);
}

/*
 * Take the job from g: g leaves the outstanding list (and the acked queue:
 * the done event answers a job not acknowledged yet) and no longer refers to
 * the job or its session.  Returns the job, or NULL if it had its done event
 * already.
 */
static rnd_job *detach(rnd_cuda *b, rnd_cuda_gjob *g)
{
    rnd_job *job = g->job;

    if (!job)
        return NULL;
    /* Off the gate's list before the job's done event may release the
     * ring its wait reads (gate.c). */
    rnd_cuda_gate_drop(b, g);
    rn_queue_remove(&g->link);
    rn_queue_remove(&g->alink);
    b->noutstanding--;
    atomic_fetch_sub(&b->busy_jobs, 1);
    g->cs->njobs--;
    g->job = NULL;
    g->cs = NULL;
    return job;
}

static void fail_job(rnd_job *job, bool acked, const char *why)
{
    job->status = RN_DEVICE_FAILING;
    snprintf(job->msg, sizeof job->msg, "bwd: the GPU failed: %.160s", why);
    if (!acked) {
        job->done_slot = -1;
        job->start_ns = job->end_ns = rnd_now_ns();
    }
    if (job->ring && job->ring->arm_key && atomic_load(&job->ring->revoked) &&
        !rnp_seq_reached(__atomic_load_n(rnd_ring_done_word(job->ring), __ATOMIC_ACQUIRE),
                         job->ring->seq))
        atomic_store(&job->ring->skipped, true); /* (taken back: answered when taken again) */
    if (job->ring)
        rnd_cuda_ring_answer_host(job);
}

/* The kernel's own time, ending now: the server reports end - start as
 * compute time and the rest since receipt as queue time. */
static void sync_times(const rnd_cuda_gjob *g, rnd_job *job)
{
    float ms = 0;
    uint64_t now = rnd_now_ns(), kns;

    if (cudaEventElapsedTime(&ms, g->ends_timed ? g->started : g->t0,
                             g->ends_timed ? g->fin : g->t1) != cudaSuccess) {
        (void)cudaGetLastError();
        ms = 0;
    }
    kns = (uint64_t)((double)ms * 1e6);
    job->end_ns = now;
    job->start_ns = now > kns ? now - kns : 0;
}

/* An armed ring call (--ring-ready=armed), not cancelled, at its
 * completion: the ring's latch says whether its gate was shut (its epoch's
 * first skip at or before its key: rnd_ring_gate_was_shut; not done, which
 * a job taken ungated after it may have moved past).  Revoked, it was taken
 * back (skipped set: the daemon takes the slot again); else its client's
 * ready was below it after its wait ended (it went back, or carried the
 * daemon's bit): it is answered with RN_INVALID_ARGUMENT, its status
 * (even if done passed it: a job taken ungated after it ran) and done from
 * the host, with a log line at the 1st, 2nd, 4th, ... time (a client can
 * cause it), not reported done with nothing computed.  The client's device
 * done word is not raised here (the next call's kernel raises it). */
static void armed_skip_check(rnd_job *job, uint32_t sess_id)
{
    static uint64_t seen;
    rnd_ring_job *rj = job->ring;
    if (!rj->arm_key || rj->graph || atomic_load(&job->cancelled) || !rnd_ring_gate_was_shut(rj))
        return;
    atomic_store(&rj->skipped, true);
    if (atomic_load(&rj->revoked))
        return;
    unsigned long long word = __atomic_load_n(rnp_ring_u64(rj->ring, RNP_RING_O_READY),
                                              __ATOMIC_ACQUIRE),
                       rd = rnp_ring_ready_seq(word),
                       go = __atomic_load_n(rnp_ring_u64(rj->ring, RNP_RING_O_GO),
                                            __ATOMIC_ACQUIRE);
    const char *bit = word & RNP_RING_READY_RAISED ? " and bit 62" : "";
    seen++;
    if ((seen & (seen - 1)) == 0)
        rnd_warn("cuda session #%u: armed ring call %" PRIu64 " skipped without a revocation "
                 "(ready %llu%s, go %llu; %" PRIu64 " such calls so far)",
                 sess_id, rj->seq, rd, bit, go, seen);
    job->status = RN_INVALID_ARGUMENT;
    snprintf(job->msg, sizeof job->msg, "%s (ready %llu%s, go %llu); it was not run",
             RND_READY_BACK_MSG, rd, bit, go);
    rnd_ring_put(rj, job->status, job->msg);
    rnd_cuda_ring_answer_host(job);
}

/* One job's completion event fired (loop thread).  Everything of g is
 * settled before the done event, after which neither the job nor (through
 * it) its session may exist. */
static void complete(rnd_cuda *b, rnd_cuda_gjob *g)
{
    bool acked = g->acked;
    uint32_t sess_id = g->cs ? g->cs->id : 0;
    rnd_job *job = detach(b, g);

    if (!job) {
        rnd_cuda_gjob_free(b, g); /* answered by the failure path */
        return;
    }
    if (job->mode == RNP_MODE_SYNC)
        rnd_debug("cuda session #%u (stream %d): sync request done %" PRIu64 " us after its "
                  "submission (started %s)",
                  sess_id, g->stream, (rnd_now_ns() - g->submit_ns) / 1000,
                  g->start_ns ? "seen" : "not seen");
    if (g->unready_warned && g->err == cudaSuccess)
        rnd_info("cuda session #%u (stream %d): the request whose inputs were late completed "
                 "%" PRIu64 " ms after its submission",
                 sess_id, g->stream, (rnd_now_ns() - g->submit_ns) / 1000000);
    if (g->err != cudaSuccess) {
        rnd_cuda_mark_failed(b, "waiting for a kernel: %s", cudaGetErrorString(g->err));
        fail_job(job, acked, cudaGetErrorString(g->err));
    } else if (job->ring) {
        /* (status set at submit; done is in the ring, written by the stream) */
        if (rnd_now_ns() - g->submit_ns > RND_CUDA_SLOW_RING_NS)
            rnd_debug("cuda session #%u (stream %d): ring call %" PRIu64 " completed %" PRIu64
                      " us after its submission", sess_id, g->stream, job->ring->seq,
                      (rnd_now_ns() - g->submit_ns) / 1000);
        if (g->ring_timed)
            sync_times(g, job);
        else
            job->start_ns = job->end_ns = 0; /* not timed (RND_CUDA_TIME_EVERY) */
        armed_skip_check(job, sess_id);
        rnd_cuda_ring_wake(job);
    } else if (job->mode == RNP_MODE_SYNC) {
        sync_times(g, job);
        job->status = RN_OK;
        job->msg[0] = '\0';
        job->done_slot = -1;
    }
    /* (async: status, done_slot and the times were set at submit) */
    rnd_cuda_gjob_free(b, g);
    job->done(job);
}

static void drain_completions(rnd_cuda *b)
{
    rn_queue list, *q;

    rn_queue_init(&list);
    pthread_mutex_lock(&b->mu);
    rn_queue_move(&list, &b->completed);
    pthread_mutex_unlock(&b->mu);
    while ((q = rn_queue_head(&list)) != NULL) {
        rn_queue_remove(q);
        complete(b, RN_QUEUE_DATA(q, rnd_cuda_gjob, flink));
    }
}

/*
 * After a failure: the jobs whose completion came first get their done
 * event as usual, every other job not yet done gets it with
 * RN_DEVICE_FAILING (they may never complete), then the server hears of the
 * failure.  The gjobs stay with their completion threads, which free them
 * when their events fire (or fini leaves them to the process exit).
 */
void rnd_cuda_run_fatal(rnd_cuda *b)
{
    rn_queue *q;

    if (!b->fatal_pending)
        return;
    b->fatal_pending = false;
    drain_completions(b);
    while ((q = rn_queue_head(&b->outstanding)) != NULL) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, link);
        bool acked = g->acked;
        rnd_job *job = detach(b, g);
        if (!g->in_fifo)
            rnd_cuda_gjob_free(b, g); /* its completion was never recorded */
        fail_job(job, acked, b->fail_msg);
        job->done(job);
    }
    uv_idle_stop(&b->kick);
    if (b->fatal)
        b->fatal(b->fatal_ctx, b->fail_msg);
}

void rnd_cuda_on_async(uv_async_t *h)
{
    rnd_cuda *b = h->data;

    /* (gate.c: a close would wait for an armed call's inputs) */
    if (atomic_load(&b->revoke_wanted) && atomic_exchange(&b->revoke_wanted, false) && b->revoke)
        b->revoke(b->fatal_ctx);
    flush_acked(b);
    drain_completions(b);
    rnd_cuda_run_fatal(b);
}

/* After each poll: the acknowledgements queued by submit, the released
 * mappings and ring memory that wait for room on the closer thread (or,
 * with it off, for the streams), and a failure's fatal path. */
void rnd_cuda_on_check(uv_check_t *h)
{
    rnd_cuda *b = h->data;

    flush_acked(b);
    rnd_cuda_flush_unmaps(b);
    rnd_cuda_run_fatal(b);
}

void rnd_cuda_on_idle(uv_idle_t *h)
{
    rnd_cuda *b = h->data;

    flush_acked(b);
    rnd_cuda_run_fatal(b);
}
