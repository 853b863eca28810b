/* SPDX-License-Identifier: MIT */
/*
 * submit.c - one BWD job onto its session's stream: wait on the client's
 * ready event, record a start event, launch, record a done event of the
 * session's ring, record a completion event.  An async job is acknowledged
 * right after the records (the client waits on the done event on its own
 * stream), so the reply never waits for the GPU; a sync job is answered at
 * completion, with the kernel time from a pair of timing events.  A ring
 * job of the fast path (ring_submit, --cuda-fast-path) waits on the ring's
 * ready word instead and writes its done word (ring.c's top).
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ring_io.h"
#include "stats.h"

static int ws_ensure(rnd_cuda *b, rnd_cuda_stream *s, int64_t m, int64_t n, rnp_error *err)
{
    size_t need = rnk_cuda_workspace_size(b->kdev, m, n);
    char kmsg[RNP_MAX_ERRMSG] = "";
    void *ws = NULL;
    rn_fault f;

    if (need <= s->ws_bytes)
        return 0;
    /* Stream-ordered: kernels queued before keep the old workspace until
     * they are done, and the new one is zeroed before the next launch. */
    RN_CUDA_GOTO(cudaMallocAsync(&ws, need, s->st), &f, fail);
    if (rnk_cuda_workspace_init(ws, need, s->st, kmsg, sizeof kmsg) != RNK_OK) {
        cudaFreeAsync(ws, s->st);
        (void)cudaGetLastError();
        return rnp_fail(err, RN_CUDA, "bwd: workspace: %s", kmsg);
    }
    if (s->ws && cudaFreeAsync(s->ws, s->st) != cudaSuccess)
        (void)cudaGetLastError(); /* (a leak at worst; not the next launch's error) */
    s->ws = ws;
    s->ws_bytes = need;
    return 0;
fail:
    return rnd_cuda_fault(b, &f, false, err, "bwd: workspace");
}

/* What the server may not submit: a job the session's events cannot serve,
 * or one past the limit of jobs on the GPU. */
static int admit(const rnd_cuda *b, const rnd_job *job, rnp_error *err)
{
    const rnd_cuda_sess *cs = job->bsess;

    if (b->failed)
        return rnd_cuda_failed_err(b, err, "bwd");
    if (job->ready_slot >= 0 && cs->nev == 0)
        return rnp_fail(err, RN_NO_EVENTS,
                        "bwd.ready: %d, but this session has exchanged no events (EVENTS)",
                        (int)job->ready_slot);
    if (job->ready_slot >= (int32_t)cs->nev)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.ready: %d is outside 0..%u",
                        (int)job->ready_slot, cs->nev - 1);
    if (job->mode != RNP_MODE_SYNC && cs->nev == 0)
        return rnp_fail(err, RN_NO_EVENTS,
                        "bwd.mode: async needs a done event to wait on; exchange events (EVENTS) "
                        "or use sync mode");
    if (rnd_cuda_queue_full(b))
        return rnp_fail(err, RN_BUSY, "bwd: %u requests are queued on the GPU, the limit",
                        b->noutstanding);
    return 0;
}

/* The kernel library's error as the client's error; a broken context shows
 * on the stream (the library cleared CUDA's error state). */
static int launch_err(rnd_cuda *b, rnd_cuda_stream *s, int krc, const char *kmsg, rnp_error *err)
{
    bool failed = false;
    if (krc == RNK_ECUDA) {
        cudaError_t e = cudaStreamQuery(s->st);
        if (e != cudaSuccess && e != cudaErrorNotReady && rnd_cuda_sticky(e)) {
            rnd_cuda_mark_failed(b, "launch: %.100s", kmsg);
            failed = true;
        }
        (void)cudaGetLastError();
    }
    /* (a device it marked failed: the code rnd_cuda_fault gives, PROTOCOL.md 5) */
    return rnp_fail(err,
                    failed              ? RN_DEVICE_FAILING
                    : krc == RNK_EINVAL ? RN_INVALID_ARGUMENT
                    : krc == RNK_ENOMEM ? RN_NOMEM
                                        : RN_CUDA,
                    "bwd: %.190s", kmsg);
}

/* A driver call that failed on the stream: the client's error, and the
 * device failed if the stream shows a sticky error. */
static int drv_fail(rnd_cuda *b, rnd_cuda_stream *s, const char *what, CUresult r, rnp_error *err)
{
    cudaError_t e = cudaStreamQuery(s->st);
    bool failed = e != cudaSuccess && e != cudaErrorNotReady && rnd_cuda_sticky(e);
    if (failed)
        rnd_cuda_mark_failed(b, "%s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return rnp_fail(err, failed ? RN_DEVICE_FAILING : RN_CUDA, "bwd: %s: CUDA driver error %d",
                    what, (int)r);
}

/* The job's answer in the ring without a kernel: the host writes status
 * and message now (the client reads them only after done). */
static void put_error(rnd_job *job, int status, const char *msg)
{
    rnd_ring_job *rj = job->ring;

    rj->status = status;
    snprintf(rj->msg, sizeof rj->msg, "%s", msg && msg[0] ? msg : rnp_strerror(status));
    if (!atomic_load(&job->cancelled))
        rnd_ring_put(rj, rj->status, rj->msg);
}

/* From here g's job is on the GPU (or its stream waits for it): it is
 * outstanding, and its done event will run whatever follows. */
static void outstanding(rnd_cuda *b, rnd_cuda_sess *cs, rnd_cuda_gjob *g, rnd_job *job)
{
    g->job = job;
    job->priv = g;
    g->submit_ns = rnd_now_ns();
    rn_queue_push_back(&b->outstanding, &g->link);
    b->noutstanding++;
    atomic_fetch_add(&b->busy_jobs, 1);
    atomic_store(&b->busy_last_ns, g->submit_ns);
    cs->njobs++;
}

/* A job for stream si of session cs, on no list yet; NULL when out of
 * memory. */
static rnd_cuda_gjob *gjob_new(rnd_cuda_sess *cs, int si)
{
    rnd_cuda_gjob *g = calloc(1, sizeof *g);

    if (g) {
        rn_queue_init(&g->link);
        rn_queue_init(&g->alink);
        rn_queue_init(&g->flink);
        rn_queue_init(&g->wlink);
        g->cs = cs;
        g->stream = si;
        g->done_slot = -1;
    }
    return g;
}

/* Work is on the stream that we cannot track (a CUDA call failed after it
 * was queued): the device state is unknown, so the backend stops serving. */
static void lost_track(rnd_cuda *b, rn_fault *f, const char *when)
{
    rnp_error lost;
    rnd_cuda_fault(b, f, false, &lost, "bwd");
    rnd_cuda_mark_failed(b, "%s: %.150s", when, lost.msg);
}

/* A ring job's done words, in order (each write with its memory barrier):
 * the ring's, then the client's device word if it has one, in one call
 * where the driver has cuStreamBatchMemOp. */
static CUresult write_done(rnd_cuda *b, cudaStream_t st, CUdeviceptr done, const rnd_ring_job *rj)
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
 * A ring job (the fast path; ring.c's top says what goes on the stream), on
 * its ring's own stream.  A graph slot's replay (rj->graph) goes on the
 * ring's other stream without a wait for ready (the loop saw its
 * generation word move, so its inputs are written) and ends with done = 1
 * in the graph slot.
 */
static int ring_submit(rnd_cuda *b, rnd_job *job, rnp_error *err)
{
    rnd_cuda_sess *cs = job->bsess;
    rnd_ring_job *rj = job->ring;
    bool graph = rj->graph;
    int si = graph ? rnd_cuda_graph_stream(b, cs) : rnd_cuda_ring_stream(b, cs);
    rnd_cuda_stream *s = &b->streams[si];
    char kmsg[RNP_MAX_ERRMSG] = "";
    CUdeviceptr ready = rnd_cuda_ring_dev_addr(b, rnp_ring_u64(rj->ring, RNP_RING_O_READY));
    CUdeviceptr done = rnd_cuda_ring_dev_addr(b, rnd_ring_done_word(rj));
    bool run = rj->status == 0;
    rnp_error kerr = {0};
    rnd_cuda_gjob *g;
    CUresult r;
    rn_fault f;
    int rc, krc;

    if (b->failed)
        return rnd_cuda_failed_err(b, err, "bwd");
    if (!ready || !done)
        return rnp_fail(err, RN_INTERNAL, "bwd: the ring's memory is not registered with CUDA");
    if (rnd_cuda_queue_full(b) && !rj->force)
        return rnp_fail(err, RN_BUSY, "bwd: %u requests are queued on the GPU, the limit",
                        b->noutstanding);
    bool put = false; /* the answer is in the slot (a graph slot counts each put in fails) */
    if (run && rnd_cuda_host_tensors(b, job, &kerr) != 0) {
        put_error(job, kerr.code, kerr.msg);
        run = false;
        put = true;
    }
    /* Growing the workspace maps memory, which might wait for the device:
     * never behind this ring's own armed waits (the slot is taken again
     * once ready, unarmed, and then grows it). */
    if (run && rj->arm_key &&
        rnk_cuda_workspace_size(b->kdev, job->args.m, job->args.n) > s->ws_bytes)
        return rnp_fail(err, RND_UNARMABLE, "bwd: the stream's workspace must grow first");
    if (run && ws_ensure(b, s, job->args.m, job->args.n, &kerr) != 0) {
        put_error(job, kerr.code, kerr.msg);
        run = false;
        put = true;
    }
    if (!run && !put && rj->status && !atomic_load(&job->cancelled))
        rnd_ring_put(rj, rj->status, rj->msg);
    /* An armed job (backend.h) is one whose kernel writes done, so that a
     * shut gate can skip both; another is taken back before anything is
     * queued (RND_UNARMABLE: the daemon takes the slot again unarmed). */
    bool armed = rj->arm_key != 0;
    if (armed && !(run && b->kernel_done && job->args.m > 0 &&
                   rnd_now_ns() >= atomic_load(&b->no_arm_until) &&
                   rnk_cuda_check(b->kdev, &job->args, s->ws, s->ws_bytes, kmsg, sizeof kmsg) ==
                       RNK_OK))
        return rnp_fail(err, RND_UNARMABLE, "bwd: this call cannot be armed");
    if (!(g = gjob_new(cs, si)))
        return rnp_fail(err, RN_NOMEM, "bwd: out of memory");
    if ((rc = rnd_cuda_gjob_events_ring(b, g, run, err)) != 0) {
        rnd_cuda_gjob_free(b, g);
        return rc;
    }
    if (run && !graph) {
        rnp_ring_put_result(rj->slot, 0, NULL);
        atomic_thread_fence(memory_order_release);
    }
    /* A slot taken once its ready word had reached it (--ring-ready=host)
     * waits for nothing: the client's stream wrote ready after its
     * producer's work, with the write's memory barrier, so the inputs are
     * visible to whatever the daemon launches after it saw the word. */
    if (run && !graph && !rj->ready_seen) {
        /* The gate sees the wait before the stream has it (gate.c).  An
         * armed job waits on the ready word for its key, which the daemon's
         * bit of the word passes too (to take it back). */
        if (!rnd_cuda_gate_add(b, g, rj, NULL)) { /* (armed, a close runs) */
            rnd_cuda_gjob_free(b, g);
            return rnp_fail(err, RND_UNARMABLE, "bwd: a close runs; not armed now");
        }
        uint64_t wv = armed ? rj->arm_key : rj->seq;
        if ((r = b->wait64(s->st, ready, wv, CU_STREAM_WAIT_VALUE_GEQ)) != CUDA_SUCCESS) {
            rc = drv_fail(b, s, "cuStreamWaitValue64 (ready)", r, err);
            rnd_cuda_gjob_free(b, g);
            return rc;
        }
    }
    /* From here the stream may wait on the ring: the job is outstanding,
     * and done will be written in its turn whatever follows. */
    outstanding(b, cs, g, job);
    /* (A job that runs: started is its kernel's t0 and fin its t1, which
     * count the done words' writes too: each record costs the loop 1-2.5
     * us, bench_submit.) */
    /* (RMSNORMD_DEBUG_LEAN_START=1: none for a job that waits for nothing
     * and is not timed; the watch and the closer then take it as started
     * once it is the oldest job of its stream, g->no_start.) */
    /* Only on a stream of the ring's own: a pool stream may hold a classic
     * job's wait for a client's event that no outstanding job stands for
     * (its launch failed), and the oldest job there is not running. */
    g->no_start = b->lean_start && (graph || rj->ready_seen) && !g->ends_timed &&
                  si >= RND_CUDA_STREAMS;
    if (!g->no_start)
        RN_CUDA_GOTO(cudaEventRecord(g->started, s->st), &f, fail_queued);
    bool kdone = run && b->kernel_done && job->args.m > 0; /* the kernel writes done */
    if (run) {
        /* Read first by the kernel: set if the client dies before ready. */
        job->args.cancel = b->cancel_words ? rnd_cuda_cancel_word(b, cs) : NULL;
        job->args.done[0] = kdone ? (uint64_t *)(uintptr_t)done : NULL;
        job->args.done[1] = kdone ? (uint64_t *)rj->done_dev : NULL;
        job->args.done_value = rnd_ring_done_value(rj);
        /* An armed kernel's gate: the client's ready word, and the ring's
         * latch (backend.h). */
        job->args.gate = armed || (b->gate_ready && !graph && kdone)
                             ? (const uint64_t *)(uintptr_t)ready
                             : NULL;
        job->args.gate_key = armed ? rj->arm_key : rj->seq;
        job->args.latch = armed ? (uint64_t *)(uintptr_t)rnd_cuda_arm_dev(b, rj->arm, 0) : NULL;
        job->args.latch_epoch = armed ? rj->arm_epoch : 0;
        (void)rnd_cuda_stamp(b, job, false, s->st); /* (RMSNORMD_DEBUG_STAMPS) */
        krc = rnk_cuda_bwd(b->kdev, &job->args, s->ws, s->ws_bytes, s->st, kmsg, sizeof kmsg);
        (void)rnd_cuda_stamp(b, job, true, s->st);
        if (krc != RNK_OK) {
            launch_err(b, s, krc, kmsg, &kerr);
            put_error(job, kerr.code, kerr.msg);
            run = kdone = false;
            if (armed) {
                /* (Checked before the wait: a CUDA error.)  The stream's
                 * done write that answers a failed launch would not be
                 * gated: a revocation would let it through.  The failure
                 * path answers it from the host instead. */
                rnd_cuda_mark_failed(b, "an armed launch failed: %.150s", kerr.msg);
                return 0;
            }
        } else {
            b->nsubmitted++;
        }
    }
    /* The ring's done, then the done word in the client's device memory
     * (RING_OPEN's done_region), which the client's stream waits on: a
     * stream past its wait finds the ring's word there too (rn_check), and
     * with it this slot's error.  Written by the kernel when it ran (kdone),
     * the device word first (rnk.h): such a slot has no error to find. */
    if (!kdone && (r = write_done(b, s->st, done, rj)) != CUDA_SUCCESS) {
        drv_fail(b, s, "cuStreamWriteValue64 (done)", r, &kerr);
        rnd_cuda_mark_failed(b, "writing a ring's done word: %.150s", kerr.msg);
        return 0; /* the failure path answers the job from the host */
    }
    RN_CUDA_GOTO(cudaEventRecord(g->fin, s->st), &f, fail_queued);
    rnd_cuda_fifo_push(b, g);
    /* Its answer: set now, kept by complete.c (no acked event). */
    job->status = run ? RN_OK : rj->status;
    snprintf(job->msg, sizeof job->msg, "%s", run ? "" : rj->msg);
    job->done_slot = -1;
    g->ring_timed = run && g->ends_timed;
    return 0;

fail_queued:
    /* Work on the stream that we cannot track: stop serving; the failure
     * path gives the job its done event and its answer in the ring. */
    lost_track(b, &f, "after queueing a ring job");
    return 0;
}

int rnd_cuda_submit(rnd_backend *be, rnd_job *job, rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_cuda_sess *cs = job->bsess;
    char kmsg[RNP_MAX_ERRMSG] = "";
    bool sync = job->mode == RNP_MODE_SYNC;
    uint64_t t_in = rnd_now_ns(), t_wait = 0, t_launch = 0;
    rnd_cuda_stream *s;
    rnd_cuda_gjob *g;
    rn_fault f;
    int rc, krc;

    /* Ring jobs (the fast path) come only to a backend that reports rings
     * (rnd_device_info.rings): with --cuda-fast-path (ring.c). */
    if (job->ring) {
        if (!b->rings)
            return rnp_fail(err, RN_UNSUPPORTED, "bwd: the fast path is off");
        rc = ring_submit(b, job, err);
        /* (the loop takes every ring's slots: a slow one holds them all; at
         * most one line a second, with how many since) */
        uint64_t now = rnd_now_ns();
        if (now - t_in <= RND_CUDA_SLOW_SUBMIT_NS)
            return rc;
        if (b->slow_ring_said_ns && now - b->slow_ring_said_ns < 1000000000u) {
            b->slow_ring_submits++;
            return rc;
        }
        rnd_warn("A ring submission took %" PRIu64 " us (%" PRIu64 " more over %u ms since the "
                 "last such line)", (now - t_in) / 1000, b->slow_ring_submits,
                 RND_CUDA_SLOW_SUBMIT_NS / 1000000u);
        b->slow_ring_said_ns = now;
        b->slow_ring_submits = 0;
        return rc;
    }
    if ((rc = admit(b, job, err)) != 0)
        return rc;
    /* A ring's host memory is no tensor (only with the fast path on). */
    if (b->rings && (rc = rnd_cuda_host_tensors(b, job, err)) != 0)
        return rc;
    if (!(g = gjob_new(cs, cs->stream)))
        return rnp_fail(err, RN_NOMEM, "bwd: out of memory");
    s = &b->streams[cs->stream];
    if ((rc = ws_ensure(b, s, job->args.m, job->args.n, err)) != 0)
        goto fail;
    if ((rc = rnd_cuda_gjob_events(b, g, sync, err)) != 0)
        goto fail;
    /* The plan is checked before the stream waits on the client: a refusal
     * after the wait left it on the pool stream with no job the gate sees
     * (gate.c's rule: every stream wait on a client is on b->waits). */
    if ((krc = rnk_cuda_check(b->kdev, &job->args, s->ws, s->ws_bytes, kmsg, sizeof kmsg)) !=
        RNK_OK) {
        rc = launch_err(b, s, krc, kmsg, err);
        goto fail;
    }
    if (job->ready_slot >= 0) {
        /* The gate sees the wait before the stream has it (gate.c). */
        (void)rnd_cuda_gate_add(b, g, NULL, cs->ready[job->ready_slot]); /* (true: no ring) */
        RN_CUDA_GOTO(cudaStreamWaitEvent(s->st, cs->ready[job->ready_slot], 0), &f, fail_cuda);
    }
    /* Complete once the inputs are ready and the stream's earlier work has
     * ended: the watch counts the kernel deadline from then. */
    RN_CUDA_GOTO(cudaEventRecord(g->started, s->st), &f, fail_cuda);
    t_wait = rnd_now_ns();
    if (sync)
        RN_CUDA_GOTO(cudaEventRecord(g->t0, s->st), &f, fail_cuda);
    krc = rnk_cuda_bwd(b->kdev, &job->args, s->ws, s->ws_bytes, s->st, kmsg, sizeof kmsg);
    t_launch = rnd_now_ns();
    if (krc != RNK_OK) {
        rc = launch_err(b, s, krc, kmsg, err);
        goto fail;
    }
    /* Launched: from here the kernel may read the regions, so the job is
     * outstanding (its done event will run) even if what follows fails. */
    outstanding(b, cs, g, job);
    b->nsubmitted++;
    if (sync)
        RN_CUDA_GOTO(cudaEventRecord(g->t1, s->st), &f, fail_launched);
    if (!sync) {
        g->done_slot = (int32_t)(cs->done_next++ % cs->nev);
        RN_CUDA_GOTO(cudaEventRecord(cs->done[g->done_slot], s->st), &f, fail_launched);
    }
    RN_CUDA_GOTO(cudaEventRecord(g->fin, s->st), &f, fail_launched);
    rnd_cuda_fifo_push(b, g);
    if (!sync) {
        /* Recorded: the client may wait on the done event now.  The acked
         * event runs from the loop, never from inside this call. */
        job->status = RN_OK;
        job->msg[0] = '\0';
        job->done_slot = g->done_slot;
        job->start_ns = job->end_ns = rnd_now_ns();
        rnd_cuda_ack_later(b, g);
    }
    if (b->fail_after && b->nsubmitted == b->fail_after)
        rnd_cuda_mark_failed(b,
                             "debug-fail-after: request %" PRIu64 " was submitted, and the "
                             "debugging knob fails the backend there",
                             b->nsubmitted);
    if (g->submit_ns - t_in > RND_CUDA_SLOW_SUBMIT_NS)
        rnd_warn("A submission took %" PRIu64 " us (wait on the ready event %" PRIu64
                 " us, launch %" PRIu64 " us)",
                 (rnd_now_ns() - t_in) / 1000, (t_wait - t_in) / 1000, (t_launch - t_wait) / 1000);
    return 0;

fail_launched:
    /* A kernel runs that we cannot track: the device state is unknown, so
     * stop serving.  The failure path gives the job its done event (and the
     * server keeps its regions until then). */
    lost_track(b, &f, "after a launch");
    return 0;
fail_cuda:
    rc = rnd_cuda_fault(b, &f, false, err, "bwd");
fail:
    rnd_cuda_gjob_free(b, g);
    return rc;
}
