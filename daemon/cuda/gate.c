/* SPDX-License-Identifier: MIT */
/*
 * gate.c - the closer's gate: no close that may wait for the device while a
 * stream of the daemon waits, late, on a client.
 *
 * Why: a close (cudaIpcCloseMemHandle, the VMM unmaps, cudaHostUnregister)
 * waits for the device, for the work queued on every stream when it
 * started, and a stream of ours may be waiting on the GPU for a client's
 * producer (a ring slot's wait for ready >= seq, a classic job's wait on the
 * client's IPC ready event).  Seen on the H200 (with and without MPS): a
 * producer 5 s late held a close on the closer thread for 4.7 s, and the
 * loop's next CUDA call (a stream's give-back) waited the same 4.7 s behind
 * it, so every client stopped (HACKING.md, "Closes run on a thread of their
 * own").
 *
 * What: every job whose stream waits on a client goes on b->waits (oldest
 * first) before the wait is queued, and leaves it when the job leaves the
 * GPU (detach, or its free).  The gate looks at them from the host: a ring
 * slot's ready word through the daemon's mapping of the ring (rnd_ring_ready,
 * acquire), a classic job's ready event with cudaEventQuery.  A wait seen
 * satisfied stays on the list until the job's started event (recorded after
 * the wait) has completed, so that a client that lowers its ready word again
 * cannot make the gate forget a wait the GPU has not passed.  The gate is
 * shut while a wait not satisfied is older than the grace
 * (RND_CUDA_GATE_GRACE_MS, RMSNORMD_DEBUG_CLOSE_GATE_MS), or while an armed
 * call's wait on the ring's ready word is (--ring-ready=armed: the gate then
 * asks the loop to take such calls back, rnd_backend_opts.revoke); the look stops
 * there, or at the first wait not satisfied that is younger (the ones after
 * it were queued later still), so it costs a load or a query or two.
 *
 * The grace: a client that keeps calls in flight (a training loop, the
 * tests' busy client) always has a wait or a few not yet satisfied, each
 * for a few milliseconds; a gate shut by every such wait would hold every
 * close while any such client runs, which is what the closer thread was
 * made to cure (closes piling up, and with them the memory clients freed).
 * So a wait counts once it is older than the grace: a producer that late is
 * late.  The price: a close that started while a wait was young, which then
 * turns out late, waits for it (as before the gate).  With a grace of 0
 * (RMSNORMD_DEBUG_CLOSE_GATE_MS=0) the gate is strict: any wait not
 * satisfied shuts it, and the loop, before it queues a wait, waits for a
 * close in progress to return (closing), so that no close can end up
 * waiting for a wait queued after the gate let it through.
 *
 * The give-back of a ring's own streams (ownstream.c) at its session's end
 * waits for the gate as well: its CUDA calls (cudaFreeAsync,
 * cudaStreamDestroy) were the loop's that waited behind the close.
 *
 * Threads: add and drop on the loop; enter and leave on the thread that
 * closes (the closer, or the loop with RMSNORMD_DEBUG_CLOSER=0); all of it
 * under b->gate_mu, held across host reads and event queries only, never
 * across a call that may wait for the device.
 */
#include "cuda_int.h"

#include <inttypes.h>
#include <stdlib.h>

#include "log.h"
#include "ring_io.h"
#include "stats.h"

/* A debugging knob of milliseconds (up to 600000), def when unset or not one. */
static uint64_t env_ms(const char *name, uint64_t def)
{
    const char *env = getenv(name);

    if (!env || !*env)
        return def;
    char *end;
    unsigned long long v = strtoull(env, &end, 10);
    if (*end == '\0' && v <= 600000)
        return v;
    rnd_warn("%s=%s is not a number of ms up to 600000; using %" PRIu64, name, env, def);
    return def;
}

void rnd_cuda_gate_init(rnd_cuda *b)
{
    uint64_t ms = env_ms("RMSNORMD_DEBUG_CLOSE_GATE_MS", RND_CUDA_GATE_GRACE_MS);
    uint64_t defer = env_ms("RMSNORMD_DEBUG_CLOSE_DEFER_MS", RND_CUDA_BUSY_DEFER_MS);

    b->gate_grace_ns = ms * 1000000u;
    if (ms != RND_CUDA_GATE_GRACE_MS)
        rnd_warn("RMSNORMD_DEBUG_CLOSE_GATE_MS=%" PRIu64 ": closes wait while a stream has "
                 "waited on a client for more than %" PRIu64 " ms%s",
                 ms, ms, ms ? "" : " (any wait: the strict gate)");
    b->busy_defer_ns = defer * 1000000u;
    if (defer != RND_CUDA_BUSY_DEFER_MS)
        rnd_warn("RMSNORMD_DEBUG_CLOSE_DEFER_MS=%" PRIu64 ": a close waits at most that long "
                 "for a moment with nothing of ours on the GPU",
                 defer);
}

bool rnd_cuda_gate_add(rnd_cuda *b, rnd_cuda_gjob *g, const rnd_ring_job *rj, cudaEvent_t ev)
{
    uint64_t t0 = 0;

    pthread_mutex_lock(&b->gate_mu);
    if (rj && rj->arm_key && b->closing) {
        /* An armed wait queued now could hold the close that runs. */
        pthread_mutex_unlock(&b->gate_mu);
        return false;
    }
    if (!b->gate_grace_ns && b->closing) {
        /* The strict gate: a close the gate let through before this wait
         * existed must not end up waiting for it. */
        t0 = rnd_now_ns();
        while (b->closing)
            pthread_cond_wait(&b->gate_cv, &b->gate_mu);
    }
    g->wait_rj = rj;
    g->wait_ev = ev;
    g->wait_ns = rnd_now_ns();
    rn_queue_push_back(&b->waits, &g->wlink);
    pthread_mutex_unlock(&b->gate_mu);
    if (t0 && g->wait_ns - t0 > RND_CUDA_SLOW_CALL_NS)
        rnd_info("A submission waited %" PRIu64 " ms for a close in progress (the strict gate)",
                 (g->wait_ns - t0) / 1000000);
    return true;
}

void rnd_cuda_gate_drop(rnd_cuda *b, rnd_cuda_gjob *g)
{
    if (!g->wait_rj && !g->wait_ev)
        return; /* never on the list (the fields are the loop's) */
    pthread_mutex_lock(&b->gate_mu);
    rn_queue_remove(&g->wlink);
    g->wait_rj = NULL;
    g->wait_ev = NULL;
    pthread_mutex_unlock(&b->gate_mu);
}

/* 1: a query's error that concerns the query alone (it counts as passed),
 * -1: the device failed (a sticky error, kept in *err). */
static int query_error(cudaError_t e, cudaError_t *err)
{
    (void)cudaGetLastError();
    if (!rnd_cuda_sticky(e))
        return 1;
    *err = e;
    return -1;
}

/* Whether g's wait is satisfied as the host sees it.  An error of the
 * client's event counts as satisfied: it may be the client's doing (a dead
 * process's event), so it alone does not fail the device; a device that
 * failed shows in the query of our own started event that follows. */
static bool wait_seen(const rnd_cuda_gjob *g)
{
    if (g->wait_rj)
        return rnd_ring_wait_met(g->wait_rj);
    cudaError_t e = cudaEventQuery(g->wait_ev);
    if (e == cudaSuccess)
        return true;
    if (e == cudaErrorNotReady)
        return false;
    (void)cudaGetLastError();
    return true;
}

/* The look (under gate_mu): 1 clear, 0 shut, -1 the device failed (*err).
 * *armed: shut by an armed call's wait (--ring-ready=armed), which the
 * daemon can end itself (ask_revoke): at once, not after the grace, and
 * wherever it stands in the list. */
static int check_locked(rnd_cuda *b, uint64_t now, cudaError_t *err, bool *armed)
{
    rn_queue *q, *next;
    bool young = false;

    *armed = false;
    RN_QUEUE_FOREACH_SAFE(q, next, &b->waits) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, wlink);
        bool arm = g->wait_rj && g->wait_rj->arm_key;
        if (young) {
            /* Behind a young wait only an armed one counts (a load each:
             * the others' event queries are left for a later look). */
            if (arm && !wait_seen(g)) {
                *armed = true;
                return 0;
            }
            continue;
        }
        if (!wait_seen(g)) {
            if (arm) {
                *armed = true;
                return 0;
            }
            /* Every wait after this one was queued later: none is older;
             * an armed one may still follow. */
            if (now > g->wait_ns && now - g->wait_ns > b->gate_grace_ns)
                return 0;
            if (!b->arm_host)
                return 1; /* (no ring was ever armed: the look ends here, as it did) */
            young = true;
            continue;
        }
        /* Satisfied: off the list once the GPU is past it.  (Its started
         * event may not be recorded yet, right after add: then it is the
         * pool's event from before, complete, and the wait, satisfied
         * already, leaves a little early.) */
        cudaError_t e = cudaEventQuery(g->started);
        if (e == cudaErrorNotReady)
            continue;
        if (e != cudaSuccess && query_error(e, err) < 0)
            return -1;
        rn_queue_remove(q);
    }
    return 1;
}

/* Shut by an armed wait, and a close (or give-back) would go otherwise:
 * no call is armed for a while (ring_submit refuses, RND_UNARMABLE), and
 * the loop is asked to take the armed ones back (rnd_cuda_on_async), after
 * which the gate opens.  Asking at every look would take calls back about
 * a hundred times a second while a close waits for quiet anyway. */
static void ask_revoke(rnd_cuda *b, uint64_t now)
{
    atomic_store(&b->no_arm_until, now + RND_CUDA_NO_ARM_NS);
    if (!atomic_exchange(&b->revoke_wanted, true))
        uv_async_send(&b->async);
}

bool rnd_cuda_waits_clear(rnd_cuda *b)
{
    cudaError_t err = cudaSuccess;
    uint64_t now = rnd_now_ns();
    bool armed;

    pthread_mutex_lock(&b->gate_mu);
    int r = check_locked(b, now, &err, &armed);
    if (r == 0 && armed)
        ask_revoke(b, now);
    pthread_mutex_unlock(&b->gate_mu);
    if (r < 0)
        rnd_cuda_mark_failed(b, "a stream's wait on a client: %s", cudaGetErrorString(err));
    return r > 0;
}

/*
 * Under gate_mu: whether the loop's work leaves room for a close.  A close
 * waits for the device (10-70 ms each on the H200, even idle), and the
 * loop's CUDA calls wait behind it: when clients left while another
 * made calls, that client's next calls waited 100-170 ms for the closes
 * of the others' mappings (bench/RESULTS.md).  So a close waits for a
 * moment with nothing of ours on the GPU and no submission for
 * RND_CUDA_QUIET_NS; while the work goes on, for at most busy_defer_ns,
 * and then closes go for as long again before they wait once more, so
 * that a client that never pauses delays them, but never stops them.
 */
static bool room_for_close(rnd_cuda *b, uint64_t now)
{
    if (!b->busy_defer_ns || atomic_load(&b->close_now))
        return true;
    uint64_t last = atomic_load(&b->busy_last_ns);
    if (atomic_load(&b->busy_jobs) == 0 && (now < last || now - last >= RND_CUDA_QUIET_NS)) {
        b->busy_since = b->busy_go_until = 0;
        return true;
    }
    if (b->busy_go_until) {
        if (now < b->busy_go_until)
            return true;
        b->busy_go_until = 0; /* held long enough, let go as long: hold again */
    }
    if (!b->busy_since)
        b->busy_since = now;
    if (now - b->busy_since >= b->busy_defer_ns) {
        b->busy_since = 0;
        b->busy_go_until = now + b->busy_defer_ns;
        return true;
    }
    b->busy_held++;
    return false;
}

int rnd_cuda_gate_enter(void *ctx)
{
    rnd_cuda *b = ctx;
    cudaError_t err = cudaSuccess;
    uint64_t now = rnd_now_ns();

    bool armed;

    pthread_mutex_lock(&b->gate_mu);
    int r = check_locked(b, now, &err, &armed);
    if (r > 0 && !room_for_close(b, now))
        r = 0;
    else if (r == 0 && armed && room_for_close(b, now))
        ask_revoke(b, now);
    if (r > 0)
        b->closing = true;
    pthread_mutex_unlock(&b->gate_mu);
    return r;
}

void rnd_cuda_gate_leave(void *ctx)
{
    rnd_cuda *b = ctx;

    pthread_mutex_lock(&b->gate_mu);
    b->closing = false;
    pthread_cond_broadcast(&b->gate_cv);
    pthread_mutex_unlock(&b->gate_mu);
}

/* ---- the give-backs of rings' own streams (ownstream.c), which wait for
 * the gate ---- */

/* The rest of a give-back: the thread (told to return) joined, the
 * workspace and the stream destroyed, the slot free again. */
static void giveback(rnd_cuda *b, int i)
{
    rnd_cuda_stream *s = &b->streams[i];
    const uint64_t t0 = rnd_now_ns();

    if (s->thr_started) {
        pthread_join(s->thr, NULL);
        s->thr_started = false;
    }
    /* Stream-ordered, so that no call here waits for the device. */
    if (s->ws && cudaFreeAsync(s->ws, s->st) != cudaSuccess)
        (void)cudaGetLastError();
    s->ws = NULL;
    s->ws_bytes = 0;
    if (cudaStreamDestroy(s->st) != cudaSuccess)
        (void)cudaGetLastError();
    s->st = NULL;
    pthread_cond_destroy(&s->cv);
    s->giveback = false;
    b->ngiveback--;
    const uint64_t took = rnd_now_ns() - t0;
    if (took > RND_CUDA_SLOW_CALL_NS)
        rnd_info("Giving back stream %d took %" PRIu64 " ms (a CUDA call waited)", i,
                 took / 1000000);
}

void rnd_cuda_own_streams_giveback(rnd_cuda *b, bool idle)
{
    uint64_t now = rnd_now_ns(), oldest = 0;
    unsigned n = 0;

    if (!b->ngiveback || b->failed)
        return; /* (a failed device's streams are left to the process exit) */
    /* The destruction and the join wait until no stream waits, late, on a
     * client: a CUDA call on the loop then waits behind no close for long.
     * Until then the slot is not reused (thr_started). */
    if (!idle && !rnd_cuda_waits_clear(b))
        return;
    for (int i = RND_CUDA_STREAMS; i < b->nstreams && b->ngiveback; i++) {
        rnd_cuda_stream *s = &b->streams[i];
        if (!s->giveback)
            continue;
        if (now > s->giveback_ns && now - s->giveback_ns > oldest)
            oldest = now - s->giveback_ns;
        giveback(b, i);
        n++;
    }
    if (!idle && oldest > RND_CUDA_GATE_LOG_NS)
        rnd_info("Gave back %u stream%s of ended sessions, the oldest %" PRIu64 " ms after "
                 "its session's end (the gate held %s: a stream waited on a client's inputs)",
                 n, n == 1 ? "" : "s", oldest / 1000000, n == 1 ? "it" : "them");
}
