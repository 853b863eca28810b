/* SPDX-License-Identifier: MIT */
/*
 * closer.c - what the server released (CUDA IPC mappings, clients' VMM
 * ranges, the rings' registered memory), closed on a thread of its own.
 *
 * Why a thread: closing may wait for the device.  cudaIpcCloseMemHandle was
 * seen on the H200 (with and without MPS) to wait until another client's
 * late inputs came, 3 s in a test, and cudaHostUnregister and the VMM unmaps
 * may do the same.  On the loop that stalled every client, so the closes
 * used to wait until no stream waited on a client; but with the fast path a
 * busy client nearly always has its next call waiting for its producer, so
 * released mappings and ring memory piled up while it ran.  On the closer
 * thread (daemon/closeq.c) a close that waits for the device holds up
 * nobody but the closes behind it.
 *
 * When a close is correct: the server releases a region only after the done
 * event of every job that used it (backend.h), and on a working device done
 * runs only once the job's completion event fired, so no kernel, wait or
 * write that touches the memory is still queued.  On top of that, each
 * release records a fence: an event on its session's stream at the moment
 * of the release, and the closer closes only once the fence has completed
 * (cudaEventQuery, polled: one fence far off holds up no other close).  The
 * fence (one per stream the session uses: the pool's, its ring's own two)
 * covers whatever the session queued before the release, so even
 * work the server's bookkeeping missed cannot still use the memory when it
 * goes, and the close's own wait for the device has that much less to wait
 * for.  After a failure nothing more is closed: the
 * failure path answers jobs whose kernels may still run, and the process
 * exits, which unmaps everything.
 *
 * The gate (gate.c): a close waits for the device, so one that runs while
 * a stream of ours waits on a late producer waits for that producer; seen
 * on the H200 for 4.7 s, while holding something of the driver's that the
 * loop's next CUDA call then waited for, so every client stopped.  Each
 * close asks the gate first (closeq's gate_enter): while a stream has
 * waited on a client for longer than the grace, nothing is closed, the
 * releases queue (in the thread's inbox, then in the loop's backlog, which
 * never blocks the loop), and the gate's look is repeated at each poll.  A
 * hung client that never writes ready holds closes up until it dies (the
 * daemon then writes its ready: the gate opens), but not the loop or other
 * clients' calls.
 *
 * Even with no late producer a close takes 10-70 ms on the H200, and the
 * loop's next submission waits for it: when clients left while another
 * made calls, that one's calls waited 100-170 ms.  So the gate also waits
 * for a quiet moment (nothing of ours on the GPU, no submission for 1 ms),
 * at most RND_CUDA_BUSY_DEFER_MS at a time (gate.c's room_for_close).
 *
 * RMSNORMD_DEBUG_CLOSER=0 turns the thread off: the closes then run on the
 * loop once no stream waits, as before (for comparison, and as a fallback
 * should a driver serialise the loop's calls behind a close on another
 * thread).
 *
 * Everything here runs on the loop thread except ready, closer_close,
 * gate_opened and the gate's enter and leave, which run on the closer
 * thread and touch only the released object and the gate (under its
 * mutex).
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "stats.h"

/* 1: the fence has completed (or there is none), 0: not yet, -1: the
 * device failed (a sticky error): close nothing more. */
static int fence_ready(void *ctx, rnd_closeq_item *it)
{
    rnd_cuda_release *r = RN_QUEUE_DATA(it, rnd_cuda_release, it);
    cudaError_t e;

    (void)ctx;
    for (int i = 0; i < 3; i++) {
        if (!r->fence[i])
            continue;
        e = cudaEventQuery(r->fence[i]);
        if (e == cudaErrorNotReady)
            return 0;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            /* A failed device (the loop's watch reports it): close nothing
             * more.  Any other error concerns this query alone: the fence
             * counts as passed (the server's bookkeeping already says no
             * job uses the memory), so that one error stops no closes. */
            if (rnd_cuda_sticky(e))
                return -1;
        }
    }
    return 1;
}

static void closer_close(void *ctx, rnd_closeq_item *it)
{
    rnd_cuda_release *r = RN_QUEUE_DATA(it, rnd_cuda_release, it);

    (void)ctx;
    for (int i = 0; i < 3; i++) {
        if (r->fence[i] && cudaEventDestroy(r->fence[i]) != cudaSuccess)
            (void)cudaGetLastError();
        r->fence[i] = NULL;
    }
    const char *what = r->what ? r->what : "a mapping";
    const uint64_t bytes = r->bytes;
    const uint64_t t0 = rnd_now_ns();
    r->close(r); /* (r is freed) */
    const uint64_t took = rnd_now_ns() - t0;
    /* A close that waited for the device (HACKING.md: what the late-producer
     * test shows): said, so that a log tells which call waited. */
    if (took > RND_CUDA_SLOW_CALL_NS)
        rnd_info("A release's close took %" PRIu64 " ms (it waited for the device): %s of %"
                 PRIu64 " bytes", took / 1000000, what, bytes);
}

/* The gate held closes for held_ns: said when that was long (the closer
 * thread, or the loop with the closer off). */
static void gate_opened(void *ctx, uint64_t held_ns, uint64_t pending)
{
    (void)ctx;
    if (held_ns > RND_CUDA_GATE_LOG_NS)
        rnd_info("The gate held closes for %" PRIu64 " ms (a stream waited on a client's "
                 "inputs, or our work kept the GPU busy); %" PRIu64 " released mapping%s close%s "
                 "now",
                 held_ns / 1000000, pending, pending == 1 ? "" : "s", pending == 1 ? "s" : "");
}

/* On the closer thread, before anything else: its CUDA calls go to the
 * daemon's device (the runtime's current device is per thread). */
static void thread_start(void *ctx)
{
    rnd_cuda *b = ctx;

    if (cudaSetDevice(b->dev) != cudaSuccess)
        (void)cudaGetLastError(); /* (then the first fence query fails: -1) */
}

static const rnd_closeq_ops thread_ops = {.ready = fence_ready,
                                          .close = closer_close,
                                          .thread_start = thread_start,
                                          .gate_enter = rnd_cuda_gate_enter,
                                          .gate_leave = rnd_cuda_gate_leave,
                                          .gate_opened = gate_opened};
static const rnd_closeq_ops inline_ops = {.ready = fence_ready,
                                          .close = closer_close,
                                          .gate_enter = rnd_cuda_gate_enter,
                                          .gate_leave = rnd_cuda_gate_leave,
                                          .gate_opened = gate_opened};

int rnd_cuda_closer_start(rnd_cuda *b, rnp_error *err)
{
    const char *env = getenv("RMSNORMD_DEBUG_CLOSER");
    /* RMSNORMD_DEBUG_CLOSE_FENCE (being measured): all (the default), pool
     * (the session's pool stream only) or none. */
    const char *fm = getenv("RMSNORMD_DEBUG_CLOSE_FENCE");
    int rc;

    b->close_fences = fm && !strcmp(fm, "none") ? 0 : fm && !strcmp(fm, "pool") ? 1 : 3;
    if (env && !strcmp(env, "0")) {
        rnd_closeq_init_inline(&b->closer, &inline_ops, b);
        rnd_warn("RMSNORMD_DEBUG_CLOSER=0: released mappings close on the loop once no stream "
                 "waits on a client, so they pile up while a client keeps calls in flight");
        return 0;
    }
    if ((rc = rnd_closeq_start(&b->closer, &thread_ops, b, RND_CUDA_CLOSE_QUEUE)) != 0)
        return rnp_fail(err, RN_SYSTEM, "backend: the closer thread: %s", strerror(rc));
    b->closer_thread = true;
    return 0;
}

void rnd_cuda_release_later(rnd_cuda *b, void *bsess, rnd_cuda_release *r)
{
    rnd_cuda_sess *cs = bsess;
    cudaError_t e;

    r->fence[0] = r->fence[1] = r->fence[2] = NULL;
    /* With the closer off the loop closes only once no stream waits, which
     * implies every fence; after a failure nothing is closed. */
    const int nf = b->close_fences;
    if (b->closer_thread && !b->failed && cs) {
        /* (a session without a graph stream has no graph jobs: no fence on
         * rnd_cuda_graph_stream's stand-in, another session's pool stream) */
        const int st[3] = {cs->stream, rnd_cuda_ring_stream(b, cs),
                           cs->graph_stream >= 0 ? cs->graph_stream : cs->stream};
        for (int i = 0; i < nf; i++) {
            if ((i >= 1 && st[i] == st[0]) || (i == 2 && st[2] == st[1]))
                continue; /* one fence a stream */
            if ((e = cudaEventCreateWithFlags(&r->fence[i], cudaEventDisableTiming)) ==
                    cudaSuccess &&
                (e = cudaEventRecord(r->fence[i], b->streams[st[i]].st)) != cudaSuccess)
                (void)cudaEventDestroy(r->fence[i]);
            if (e != cudaSuccess) {
                /* The server's bookkeeping alone (backend.h) says nothing
                 * uses it; the watch reports a device that fails. */
                (void)cudaGetLastError();
                r->fence[i] = NULL;
                rnd_debug("cuda session #%u: no fence on stream %d for a released mapping (%s); "
                          "it closes without one",
                          cs->id, st[i], cudaGetErrorString(e));
            }
        }
    }
    rnd_closeq_push(&b->closer, &r->it);
    rnd_cuda_flush_unmaps(b);
}

/*
 * Whether a job on the GPU has not started yet: its stream still waits, on a
 * client's ready event or on the job before it.  Queries only; a start seen
 * here counts for the deadline too.
 */
bool rnd_cuda_streams_waiting(rnd_cuda *b)
{
    rn_queue *q;

    RN_QUEUE_FOREACH(q, &b->outstanding) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, link);
        if (g->start_ns || g->no_start)
            continue; /* (no_start: it waits for nothing but the jobs before it) */
        cudaError_t e = cudaEventQuery(g->started);
        if (e != cudaSuccess) {
            if (e != cudaErrorNotReady)
                (void)cudaGetLastError(); /* the watch reports it */
            return true;
        }
        g->start_ns = rnd_now_ns();
    }
    return false;
}

void rnd_cuda_flush_unmaps(rnd_cuda *b)
{
    if (b->failed) {
        /* (The process exits, which unmaps.) */
        rnd_closeq_halt(&b->closer);
        return;
    }
    rnd_cuda_own_streams_giveback(b, false);
    if (b->closer_thread) {
        rnd_closeq_flush(&b->closer);
        /* More than the thread holds: they stay in the backlog (no bound:
         * refusing new mappings instead would fail every client's new
         * allocations for one client's late producer), with the memory
         * clients freed still mapped until they close.  Said once. */
        if (b->closer.nbacklog && !b->backlog_warned) {
            rnd_closeq_stats st;
            rnd_closeq_get_stats(&b->closer, &st);
            b->backlog_warned = true;
            rnd_warn("More than %d released mappings wait to be closed%s; they stay queued "
                     "(and what clients freed of them stays allocated) until they close",
                     RND_CUDA_CLOSE_QUEUE,
                     st.gate_shut ? " (the gate holds them: a stream waits on a client's "
                                    "late inputs)"
                                  : "");
        }
    } else if (!rn_queue_empty(&b->closer.backlog) && !rnd_cuda_streams_waiting(b)) {
        rnd_closeq_close_here(&b->closer);
    }
}

bool rnd_cuda_closer_drain(rnd_cuda *b, int timeout_ms)
{
    uint64_t end = rnd_now_ns() + (uint64_t)timeout_ms * 1000000u;
    bool drained;

    /* The loop waits here: its work on the GPU is not what holds closes
     * up now (the gate's room_for_close). */
    atomic_store(&b->close_now, true);
    for (;;) {
        rnd_closeq_stats st;
        rnd_cuda_flush_unmaps(b);
        rnd_closeq_get_stats(&b->closer, &st);
        if (st.pending == 0) {
            drained = true;
            break;
        }
        if (b->failed || rnd_now_ns() >= end) {
            drained = false;
            break;
        }
        usleep(200);
    }
    atomic_store(&b->close_now, false);
    return drained;
}

void rnd_cuda_close_unmaps(rnd_cuda *b)
{
    /* The device is idle (fini): every fence has completed, so the thread
     * ends once it closed what it holds, and the backlog closes here. */
    atomic_store(&b->close_now, true);
    (void)rnd_closeq_stop(&b->closer, -1);
    b->closer_thread = false;
    rnd_closeq_close_here(&b->closer);
    rnd_closeq_destroy(&b->closer);
}

bool rnd_cuda_closer_stop(rnd_cuda *b, int timeout_ms)
{
    rnd_closeq_halt(&b->closer);
    b->closer_thread = false;
    return rnd_closeq_stop(&b->closer, timeout_ms);
}

void rnd_cuda_closer_stats(rnd_backend *be, rnp_stats_rep *out)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_closeq_stats st;

    rnd_closeq_get_stats(&b->closer, &st);
    rnd_stats_put(out, "closes.pending", st.pending);
    rnd_stats_put(out, "closes.done", st.closed);
    rnd_stats_put(out, "closes.pending_max", st.pending_max);
    rnd_stats_put(out, "closes.wait_max_us", st.wait_max_ns / 1000u);
    rnd_stats_put(out, "closes.thread", b->closer_thread);
    rnd_stats_put(out, "closes.gated", st.gated);
    rnd_stats_put(out, "closes.gated_max_us", st.gated_max_ns / 1000u);
    pthread_mutex_lock(&b->gate_mu);
    uint64_t held = b->busy_held;
    pthread_mutex_unlock(&b->gate_mu);
    rnd_stats_put(out, "closes.busy_held", held);
    rnd_stats_put(out, "closes.streams_pending", b->ngiveback);
    rnd_stats_put(out, "closes.streams_spare", b->nspare);
}
