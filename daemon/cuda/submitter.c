/* SPDX-License-Identifier: MIT */
/*
 * submitter.c - a ring's own stream's submitter thread
 * (RMSNORMD_SUBMIT_THREADS=1), and the two pieces of a ring job's
 * submission that it shares with submit.c's ring_submit: the answer put in
 * the slot without a kernel, and the done words written by the stream.
 */
#include "cuda_int.h"

#include <stdio.h>
#include <string.h>

#include "ring_io.h"

/* The job's answer in the ring without a kernel: the host writes status
 * and message now (the client reads them only after done). */
void rnd_cuda_ring_put_error(rnd_job *job, int status, const char *msg)
{
    rnd_ring_job *rj = job->ring;

    rj->status = status;
    snprintf(rj->msg, sizeof rj->msg, "%s", msg && msg[0] ? msg : rnp_strerror(status));
    if (!atomic_load(&job->cancelled))
        rnd_ring_put(rj, rj->status, rj->msg);
}

/* A ring job's done words, in order (each write with its memory barrier):
 * the ring's, then the client's device word if it has one, in one call
 * where the driver has cuStreamBatchMemOp. */
CUresult rnd_cuda_ring_write_done(rnd_cuda *b, cudaStream_t st, CUdeviceptr done,
                                  const rnd_ring_job *rj)
{
    uint64_t v = rnd_ring_done_value(rj);
    CUresult r;

    if (rj->done_dev && b->batch) {
        CUstreamBatchMemOpParams ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[0].writeValue.address = done;
        ops[0].writeValue.value64 = v;
        ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        ops[1] = ops[0];
        ops[1].writeValue.address = (CUdeviceptr)(uintptr_t)rj->done_dev;
        return b->batch(st, 2, ops, 0);
    }
    if ((r = b->write64(st, done, v, CU_STREAM_WRITE_VALUE_DEFAULT)) != CUDA_SUCCESS ||
        !rj->done_dev)
        return r;
    return b->write64(st, (CUdeviceptr)(uintptr_t)rj->done_dev, v, CU_STREAM_WRITE_VALUE_DEFAULT);
}

/*
 * The submitter threads (RMSNORMD_SUBMIT_THREADS=1).  One loop thread makes
 * every ring job's stream calls, about 8 us of CUDA calls a job (a bare
 * launch 4.3 us under MPS), which bounds K clients at the smallest shapes
 * (4096x256: 45 000-68 000 calls/s against 137 000-167 000 with the kernel
 * in each client, bench/RESULTS.md); the same calls from 2-4 threads, a
 * stream each, reach 1.5-2x one thread's rate (bench_submit --threads).
 * So a ring's own stream may have a thread that makes them: the loop does
 * everything else (the copy, checks, pins, the gate, the job's place on
 * the outstanding list, its kernel's arguments) and hands the job over;
 * the submitter makes ring_submit's calls in the same order (the wait for
 * ready, started, the kernel, done when the kernel does not write it,
 * fin), sets the job's answer and puts it in the stream's FIFO for the
 * completion thread.  Until its started record is made the job's started
 * event stands for nothing (g->queued: the watch, the closer and the gate
 * take it as not started).  A failed call there is the loop's lost_track:
 * the job completes with the error and the loop fails the backend.  A
 * stream's workspace changes only when its submitter's queue is empty
 * (ws_ensure), and an own stream ends only with its jobs done.
 */
static void sub_lost(rnd_cuda *b, rnd_cuda_gjob *g, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    g->nofin = true;
    g->err = e == cudaSuccess || e == cudaErrorNotReady ? cudaErrorUnknown : e;
    __atomic_store_n(&g->queued, true, __ATOMIC_RELEASE);
    pthread_mutex_lock(&b->mu);
    if (!b->sub_failed) {
        b->sub_failed = true;
        snprintf(b->sub_fail_msg, sizeof b->sub_fail_msg,
                 "a ring job's stream calls (its submitter thread): %s: %s", what,
                 cudaGetErrorString(g->err));
    }
    pthread_mutex_unlock(&b->mu);
    uv_async_send(&b->async);
}

static void sub_calls(rnd_cuda *b, rnd_cuda_stream *s, rnd_cuda_gjob *g)
{
    rnd_job *job = g->job; /* (a job the submitter holds is never answered by the failure path) */
    rnd_ring_job *rj = job->ring;
    char kmsg[RNP_MAX_ERRMSG] = "";
    bool run = g->sub.run, kdone = g->sub.kdone;
    cudaError_t e;
    CUresult r;

    if (__atomic_load_n(&b->failed, __ATOMIC_ACQUIRE))
        return sub_lost(b, g, "the backend had failed", cudaErrorUnknown);
    if (g->sub.wait &&
        (r = b->wait64(s->st, g->sub.ready, g->sub.wv, CU_STREAM_WAIT_VALUE_GEQ)) != CUDA_SUCCESS)
        return sub_lost(b, g, "cuStreamWaitValue64 (ready)", cudaStreamQuery(s->st));
    if (!g->no_start && (e = cudaEventRecord(g->started, s->st)) != cudaSuccess)
        return sub_lost(b, g, "cudaEventRecord (started)", e);
    __atomic_store_n(&g->queued, true, __ATOMIC_RELEASE);
    if (run) {
        int krc = rnk_cuda_bwd(b->kdev, &job->args, s->ws, s->ws_bytes, s->st, kmsg, sizeof kmsg);
        if (krc != RNK_OK) {
            e = krc == RNK_ECUDA ? cudaStreamQuery(s->st) : cudaSuccess;
            if ((e != cudaSuccess && e != cudaErrorNotReady && rnd_cuda_sticky(e)) || g->sub.armed)
                /* (armed: as ring_submit says, answered from the host) */
                return sub_lost(b, g, "the kernel's launch", e);
            (void)cudaGetLastError();
            char msg[RNP_MAX_ERRMSG];
            snprintf(msg, sizeof msg, "bwd: %.190s", kmsg); /* (launch_err's) */
            rnd_cuda_ring_put_error(job,
                                    krc == RNK_EINVAL   ? RN_INVALID_ARGUMENT
                                    : krc == RNK_ENOMEM ? RN_NOMEM
                                                        : RN_CUDA,
                                    msg);
            run = kdone = false;
        } else {
            __atomic_fetch_add(&b->nsubmitted, 1, __ATOMIC_RELAXED);
        }
    }
    if (!kdone && (r = rnd_cuda_ring_write_done(b, s->st, g->sub.done, rj)) != CUDA_SUCCESS)
        return sub_lost(b, g, "cuStreamWriteValue64 (done)", cudaStreamQuery(s->st));
    if ((e = cudaEventRecord(g->fin, s->st)) != cudaSuccess)
        return sub_lost(b, g, "cudaEventRecord (fin)", e);
    job->status = run ? RN_OK : rj->status;
    snprintf(job->msg, sizeof job->msg, "%s", run ? "" : rj->msg);
    g->ring_timed = run && g->ends_timed;
}

static void *submitter(void *arg)
{
    rnd_cuda_stream *s = arg;
    rnd_cuda *b = s->b;
    rn_queue *q;

    (void)cudaSetDevice(b->dev);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while ((q = rn_queue_head(&s->subq)) == NULL && !b->stop && !s->quit)
            pthread_cond_wait(&s->scv, &b->mu);
        if (!q)
            break;
        rn_queue_remove(q);
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, slink);
        pthread_mutex_unlock(&b->mu);
        sub_calls(b, s, g);
        pthread_mutex_lock(&b->mu);
        /* (the answer and the events above come before this, for whoever
         * takes the job from the FIFO) */
        rn_queue_push_back(&s->fifo, &g->flink);
        g->by_worker = false;
        s->spending--;
        pthread_cond_signal(&s->cv);
        pthread_cond_broadcast(&s->scv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int rnd_cuda_submitter_start(rnd_cuda *b, rnd_cuda_stream *s)
{
    if (!b->submit_threads || s->sthr_started)
        return 0;
    if (pthread_create(&s->sthr, NULL, submitter, s) != 0)
        return -1; /* (its jobs' calls come from the loop, as without the knob) */
    s->sthr_started = true;
    return 0;
}

void rnd_cuda_submitter_join(rnd_cuda *b, rnd_cuda_stream *s, const struct timespec *until)
{
    if (!s->sthr_started)
        return;
    pthread_mutex_lock(&b->mu);
    pthread_cond_broadcast(&s->scv);
    pthread_mutex_unlock(&b->mu);
    if ((until ? pthread_timedjoin_np(s->sthr, NULL, until) : pthread_join(s->sthr, NULL)) != 0)
        pthread_detach(s->sthr);
    s->sthr_started = false;
}
