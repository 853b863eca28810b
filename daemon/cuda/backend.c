/* SPDX-License-Identifier: MIT */
/*
 * backend.c - the cuda backend's table of functions (backend.h): init and
 * fini, info, health, and sessions.
 *
 * Streams: a fixed pool of RND_CUDA_STREAMS non-blocking streams, created at
 * init, each with its own kernel workspace and completion thread.  A new
 * session takes the stream that the fewest live sessions use, so as long as
 * there are no more sessions than streams every session has a stream of its
 * own and one client's unready inputs (its ready event) never hold up
 * another client's work.  Past that, sessions share streams: still correct,
 * but a client that is slow to produce its inputs then delays the others on
 * its stream.  A ring gets streams of its own (ownstream.c).
 */
#include "cuda_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void sess_free(rnd_cuda *b, rnd_cuda_sess *cs)
{
    /* Every job of the session had its done event (backend.h): on a working
     * device its kernels have ended, and with them the waits on its ready
     * events.  A failed device's objects are left to the process exit. */
    if (!b->failed)
        rnd_cuda_sess_events_destroy(cs);
    rnd_cuda_cancel_release(b, cs);
    rnd_cuda_own_stream_free(b, cs->ring_stream);
    rnd_cuda_own_stream_free(b, cs->graph_stream);
    b->streams[cs->stream].nsess--;
    rn_queue_remove(&cs->link);
    free(cs);
}

static void release_streams(rnd_cuda *b)
{
    for (int i = 0; i < b->nstreams; i++) {
        rnd_cuda_stream *s = &b->streams[i];
        if (!s->live && i >= RND_CUDA_STREAMS)
            continue; /* an own stream given back (ownstream.c) */
        cudaFree(s->ws);
        if (s->st)
            cudaStreamDestroy(s->st);
        pthread_cond_destroy(&s->cv);
    }
    b->nstreams = 0;
    (void)cudaGetLastError();
}

/* The device is idle and the completion threads are joined: release every
 * object of the backend but b itself. */
static void release_all(rnd_cuda *b)
{
    rn_queue *q;

    /* (The server gave back every job and session first; what is left here
     * would be its bug, released without events.) */
    while ((q = rn_queue_head(&b->completed)) != NULL) {
        rnd_cuda_gjob *g = RN_QUEUE_DATA(q, rnd_cuda_gjob, flink);
        rn_queue_remove(q);
        if (!rn_queue_linked(&g->link))
            rnd_cuda_gjob_free(b, g);
    }
    while ((q = rn_queue_head(&b->outstanding)) != NULL) {
        rn_queue_remove(q);
        rnd_cuda_gjob_free(b, RN_QUEUE_DATA(q, rnd_cuda_gjob, link));
    }
    while ((q = rn_queue_head(&b->sessions)) != NULL)
        sess_free(b, RN_QUEUE_DATA(q, rnd_cuda_sess, link));
    rnd_cuda_own_streams_giveback(b, true);
    rnd_cuda_close_unmaps(b); /* the device is idle: every fence has completed */
    rnd_cuda_ring_fini(b);
    rnd_cuda_stamps_fini(b);
    rnd_cuda_pool_free(&b->fins);
    rnd_cuda_pool_free(&b->starts);
    rnd_cuda_pool_free(&b->timing);
    rnd_cuda_pool_free(&b->starts_timed);
    rnd_cuda_pool_free(&b->fins_timed);
    release_streams(b);
    rnk_cuda_fini(b->kdev);
    b->kdev = NULL;
}

/* The device, the kernel library and the streams, each with its workspace:
 * everything the first request needs exists before the daemon says
 * READY=1. */
static int open_device(rnd_cuda *b, const rnd_backend_opts *o, rnp_error *err)
{
    char kmsg[RNP_MAX_ERRMSG] = "";
    enum cudaDriverEntryPointQueryResult q;
    size_t ws0;
    rn_fault f;
    cudaError_t e;
    int rc, v = 0;

    if ((rc = rnd_cuda_pick_device(b, o->device, err)) != 0)
        return rc;
    /* From here a failure is not "no CUDA": the device exists but does not
     * work, which --backend auto reports as a warning. */
    if ((e = cudaSetDevice(b->dev)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess) {
        (void)cudaGetLastError();
        return rnp_fail(err, RN_CUDA, "device %d: creating the CUDA context: %s", b->dev,
                        cudaGetErrorString(e));
    }
    RN_CUDA_GOTO(cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, b->dev), &f, fail);
    b->mps = v != 0;
    RN_CUDA_GOTO(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&b->get_range,
                                                  12000, cudaEnableDefault, &q),
                 &f, fail);
    if (q != cudaDriverEntryPointSuccess || !b->get_range)
        return rnp_fail(err, RN_CUDA, "device: the driver has no cuMemGetAddressRange");
    if (rnk_cuda_init(b->dev, &b->kdev, kmsg, sizeof kmsg) != RNK_OK)
        return rnp_fail(err, RN_CUDA, "kernel init: %s", kmsg);
    /* Every launch with N CTAs (rnk_cuda_force_grid): same results, bit for
     * bit, but with a small N a large request runs for long, which the GPU
     * tests use to reach the deadline. */
    if (o->debug_force_grid) {
        uint32_t ctas = o->debug_force_grid > INT32_MAX ? INT32_MAX : o->debug_force_grid;
        rnk_cuda_force_grid(b->kdev, (int)ctas);
        rnd_warn("Debugging knob --debug-force-grid is on: every kernel launches %u CTA%s, "
                 "whatever the shape (same results, far slower); never use it in production",
                 ctas, ctas == 1 ? "" : "s");
    }
    ws0 = rnk_cuda_workspace_size(b->kdev, RND_CUDA_WS_M, RND_CUDA_WS_N);
    while (b->nstreams < RND_CUDA_STREAMS) {
        rnd_cuda_stream *s = &b->streams[b->nstreams];
        s->b = b;
        rn_queue_init(&s->fifo);
        RN_PT_GOTO(pthread_cond_init(&s->cv, NULL), &f, fail);
        b->nstreams++;
        s->live = true;
        RN_CUDA_GOTO(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking), &f, fail);
        RN_CUDA_GOTO(cudaMalloc(&s->ws, ws0), &f, fail);
        s->ws_bytes = ws0;
        if (rnk_cuda_workspace_init(s->ws, ws0, s->st, kmsg, sizeof kmsg) != RNK_OK)
            return rnp_fail(err, RN_CUDA, "workspace: %s", kmsg);
    }
    RN_CUDA_GOTO(cudaDeviceSynchronize(), &f, fail);
    return 0;
fail:
    return rnd_cuda_fault(b, &f, false, err, "device");
}

/* The loop's handles: completions, the check phase, the idle kick, the
 * watch.  Only the completions keep the loop alive. */
static int start_handles(rnd_cuda *b, uv_loop_t *loop, rnp_error *err)
{
    int rc;

    if ((rc = uv_async_init(loop, &b->async, rnd_cuda_on_async)) != 0)
        return rnp_fail(err, RN_SYSTEM, "backend: uv_async_init: %s", uv_strerror(rc));
    b->async.data = b;
    b->handles++;
    uv_check_init(loop, &b->check);
    b->check.data = b;
    b->handles++;
    uv_check_start(&b->check, rnd_cuda_on_check);
    uv_unref((uv_handle_t *)&b->check);
    uv_idle_init(loop, &b->kick);
    b->kick.data = b;
    b->handles++;
    uv_timer_init(loop, &b->watch);
    b->watch.data = b;
    b->handles++;
    uv_timer_start(&b->watch, rnd_cuda_on_watch, b->watch_ms, b->watch_ms);
    uv_unref((uv_handle_t *)&b->watch);
    return 0;
}

/*
 * main.c sets CUDA_MODULE_LOADING=EAGER before this runs, so that every
 * kernel variant loads when the context is created.  With lazy loading the
 * first launch of a variant loads its module, which waits for work already
 * queued on the device - including a session stream blocked on a client's
 * unready input - and so stalls the loop thread for as long as that client
 * takes.
 */
static int cuda_init(const rnd_backend_opts *o, rnd_backend **out, rnp_error *err)
{
    rnd_cuda *b;
    rn_fault f;
    int rc;

    b = calloc(1, sizeof *b);
    if (!b)
        return rnp_fail(err, RN_NOMEM, "backend: out of memory");
    b->base.ops = &rnd_backend_cuda_ops;
    b->fatal = o->fatal;
    b->fatal_ctx = o->fatal_ctx;
    b->revoke = o->revoke;
    b->revoked_held = o->revoked_held;
    b->max_jobs = o->max_jobs ? o->max_jobs : 1024;
    b->fail_after = o->debug_fail_after;
    b->fins.flags = cudaEventDisableTiming | cudaEventBlockingSync;
    b->starts.flags = cudaEventDisableTiming;
    b->timing.flags = cudaEventDefault;
    b->starts_timed.flags = cudaEventDefault;
    b->fins_timed.flags = cudaEventBlockingSync;
    b->deadline_ns = o->kernel_deadline_ms ? o->kernel_deadline_ms : RND_CUDA_DEADLINE_MS;
    b->deadline_ns =
        b->deadline_ns > UINT64_MAX / 1000000u ? UINT64_MAX : b->deadline_ns * 1000000u;
    /* A start is seen at most one period late: a short deadline (the
     * tests') gets a shorter period. */
    b->watch_ms = b->deadline_ns / 4000000u;
    if (b->watch_ms > RND_CUDA_WATCH_MS)
        b->watch_ms = RND_CUDA_WATCH_MS;
    if (b->watch_ms < 1)
        b->watch_ms = 1;
    rn_queue_init(&b->completed);
    rn_queue_init(&b->outstanding);
    rn_queue_init(&b->acked);
    rn_queue_init(&b->sessions);
    rn_queue_init(&b->hostmaps);
    rn_queue_init(&b->waits);
    RN_PT_GOTO(pthread_mutex_init(&b->mu, NULL), &f, fail_mutex);
    RN_PT_GOTO(pthread_mutex_init(&b->gate_mu, NULL), &f, fail_gate_mu);
    RN_PT_GOTO(pthread_cond_init(&b->gate_cv, NULL), &f, fail_gate_cv);
    rnd_cuda_gate_init(b);

    if ((rc = open_device(b, o, err)) != 0)
        goto fail;
    rnd_cuda_ring_probe(b, o->cuda_fast_path);
    if (b->rings)
        rnd_cuda_stamps_init(b);
    if ((rc = rnd_cuda_closer_start(b, err)) != 0)
        goto fail;
    if ((rc = rnd_cuda_threads_start(b, err)) != 0) {
        rnd_cuda_close_unmaps(b); /* (nothing was released yet) */
        goto fail;
    }
    if ((rc = start_handles(b, o->loop, err)) != 0) {
        rnd_cuda_threads_stop(b, -1);
        rnd_cuda_close_unmaps(b);
        goto fail;
    }
    if (!b->mps)
        rnd_warn("The cuda backend is not an MPS client: every dependency between a client's "
                 "kernels and ours is a GPU context switch (about 142 us each on an H200, two "
                 "per request); run the daemon and its clients under one MPS server");
    if (b->fail_after)
        rnd_warn("Debugging knob --debug-fail-after is on: request %u fails the backend as a "
                 "sticky CUDA error would (exit 2); never use it in production",
                 b->fail_after);
    *out = &b->base;
    return 0;

fail:
    rnd_cuda_ring_fini(b); /* (its pinned cancel words; no ring was open) */
    rnd_cuda_stamps_fini(b); /* (nothing ran: no file) */
    release_streams(b);
    rnk_cuda_fini(b->kdev);
    (void)cudaGetLastError();
    pthread_cond_destroy(&b->gate_cv);
    pthread_mutex_destroy(&b->gate_mu);
    pthread_mutex_destroy(&b->mu);
    free(b);
    /* A device that exists but cannot be used is not RN_NO_CUDA, so that
     * --backend auto says why it fell back. */
    return rc == RN_DEVICE_FAILING ? RN_CUDA : rc;
fail_gate_cv:
    pthread_mutex_destroy(&b->gate_mu);
fail_gate_mu:
    pthread_mutex_destroy(&b->mu);
fail_mutex:
    rc = rnd_cuda_fault(b, &f, false, err, "backend");
    free(b);
    return rc;
}

static void on_handle_closed(uv_handle_t *h)
{
    rnd_cuda *b = h->data;

    if (--b->handles > 0)
        return;
    if (b->gone)
        return; /* completion threads may still run: keep b */
    pthread_cond_destroy(&b->gate_cv);
    pthread_mutex_destroy(&b->gate_mu);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/*
 * Every job's done event has run (backend.h).  On a working device that
 * means every completion event fired: the streams are idle, the completion
 * threads return at once, and everything is released.  On a failed device
 * (or with work still on it) nothing may block for long: the threads get
 * RND_CUDA_JOIN_MS to return and are detached if they do not, and the
 * device's objects and b are left to the process exit (main ends with
 * _exit(2) after a failure, so no teardown runs under a detached thread).
 */
static void cuda_fini(rnd_backend *be)
{
    rnd_cuda *b = (rnd_cuda *)be;
    bool idle;

    if (!b)
        return;
    idle = !b->failed && rn_queue_empty(&b->outstanding);
    if (rnd_cuda_threads_stop(b, idle ? -1 : RND_CUDA_JOIN_MS) && idle) {
        release_all(b);
    } else {
        /* The closer closes nothing more: a close in progress gets the same
         * time as the completion threads, then it is left running too. */
        (void)rnd_cuda_closer_stop(b, RND_CUDA_JOIN_MS);
        if (b->stamps)
            rnd_warn("RMSNORMD_DEBUG_STAMPS: the GPU was not idle at the end; %s not written",
                     b->stamp_path);
        pthread_mutex_lock(&b->mu);
        b->gone = true;
        pthread_mutex_unlock(&b->mu);
    }
    (void)cudaGetLastError();
    uv_close((uv_handle_t *)&b->async, on_handle_closed);
    uv_close((uv_handle_t *)&b->check, on_handle_closed);
    uv_close((uv_handle_t *)&b->kick, on_handle_closed);
    uv_close((uv_handle_t *)&b->watch, on_handle_closed);
}

static void cuda_info(rnd_backend *be, rnd_device_info *out)
{
    rnd_cuda *b = (rnd_cuda *)be;

    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cuda");
    snprintf(out->device_name, sizeof out->device_name, "%.63s", b->prop.name);
    memcpy(out->uuid, b->prop.uuid.bytes, RNP_UUID_BYTES);
    out->sm_count = (uint32_t)b->prop.multiProcessorCount;
    out->cc_major = (uint32_t)b->prop.major;
    out->cc_minor = (uint32_t)b->prop.minor;
    out->mps = b->mps;
    out->event_slots = RNP_MAX_EVENTS;
    out->rings = b->rings;
    out->done_words = b->done_words;
}

static int cuda_health(rnd_backend *be, char (*reasons)[RNP_REASON_LEN], uint32_t max, uint32_t *n)
{
    rnd_cuda *b = (rnd_cuda *)be;
    int st = RNP_HEALTH_OK;

    *n = 0;
    if (b->failed) {
        st = RNP_HEALTH_FAILING;
        if (*n < max)
            snprintf(reasons[(*n)++], RNP_REASON_LEN, "cuda: %.100s", b->fail_msg);
    }
    if (!b->mps) {
        st = st > RNP_HEALTH_DEGRADED ? st : RNP_HEALTH_DEGRADED;
        if (*n < max)
            snprintf(reasons[(*n)++], RNP_REASON_LEN,
                     "mps: not an MPS client; each request pays two GPU context switches");
    }
    return st;
}

static int cuda_session_open(rnd_backend *be, void **bsess, rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_cuda_sess *cs;
    int best = 0;

    if (b->failed)
        return rnd_cuda_failed_err(b, err, "hello");
    cs = calloc(1, sizeof *cs);
    if (!cs)
        return rnp_fail(err, RN_NOMEM, "hello: out of memory");
    for (int i = 1; i < b->nstreams; i++)
        if (b->streams[i].nsess < b->streams[best].nsess)
            best = i;
    cs->id = ++b->next_sess_id;
    cs->cancel = -1;
    cs->stream = best;
    cs->ring_stream = cs->graph_stream = -1;
    b->streams[best].nsess++;
    /* The server's "Session ... opened for" line follows: it names the
     * client of this number. */
    rnd_debug("cuda session #%u uses stream %d", cs->id, best);
    rn_queue_push_back(&b->sessions, &cs->link);
    *bsess = cs;
    return 0;
}

static void cuda_session_ending(rnd_backend *be, void *bsess)
{
    rnd_cuda_sess *cs = bsess;

    if (cs)
        cs->ending = true;
    /* A dead client's ring jobs need not wait for the watch. */
    rnd_cuda_ring_release_cancelled((rnd_cuda *)be);
}

/* A ring's memory (ring.c) is its setup: the ring's streams of its own
 * come with it (ownstream.c). */
static int cuda_region_open_fd(rnd_backend *be, void *bsess, int fd, uint64_t size,
                               rnd_mapping *out, rnp_error *err)
{
    int rc = rnd_cuda_region_open_fd(be, bsess, fd, size, out, err);

    if (rc == 0 && bsess)
        rnd_cuda_own_streams_open((rnd_cuda *)be, bsess);
    return rc;
}

static void cuda_session_close(rnd_backend *be, void *bsess)
{
    if (bsess)
        sess_free((rnd_cuda *)be, bsess);
}

const rnd_backend_ops rnd_backend_cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .info = cuda_info,
    .session_open = cuda_session_open,
    .session_close = cuda_session_close,
    .session_ending = cuda_session_ending,
    .region_open = rnd_cuda_region_open,
    /* A ring's memfd with --cuda-fast-path (ring.c); else refused.  Device
     * memory comes as CUDA IPC handles over nanomsg, or as cuMem exports on
     * the session channel (VMM_CHUNK, vmm.c). */
    .region_open_fd = cuda_region_open_fd,
    .region_close = rnd_cuda_region_close_any,
    .device_word = rnd_cuda_device_word,
    .arm_open = rnd_cuda_arm_open,
    .arm_close = rnd_cuda_arm_close,
    .vmm_import = rnd_cuda_vmm_import,
    .vmm_drop = rnd_cuda_vmm_drop,
    .region_open_vmm = rnd_cuda_region_open_vmm,
    .events = rnd_cuda_events,
    .submit = rnd_cuda_submit,
    .graphs_ok = rnd_cuda_graphs_ok,
    .health = cuda_health,
    .stats = rnd_cuda_stats,
};
