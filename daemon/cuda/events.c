/* SPDX-License-Identifier: MIT */
/*
 * events.c - the backend's events.  A job's start, completion and (sync
 * mode) timing events come from pools of events, reused, so a job creates
 * none once the pools have grown to the number of jobs in flight.  Each
 * session has a ring of IPC ready events (opened from the client's handles)
 * and IPC done events (ours, whose handles go to the client), exchanged by
 * the EVENTS request.
 */
#include "cuda_int.h"

#include <stdlib.h>
#include <string.h>

/* An event from the pool, or a new one. */
static cudaError_t pool_get(rnd_cuda_evpool *p, cudaEvent_t *out)
{
    if (p->n) {
        *out = p->v[--p->n];
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(out, p->flags);
}

/* Back to the pool (destroyed if the pool cannot grow); *ev becomes NULL. */
static void pool_put(rnd_cuda_evpool *p, cudaEvent_t *ev)
{
    if (!*ev)
        return;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        cudaEvent_t *n = realloc(p->v, cap * sizeof *n);
        if (!n) {
            cudaEventDestroy(*ev);
            *ev = NULL;
            return;
        }
        p->v = n;
        p->cap = cap;
    }
    p->v[p->n++] = *ev;
    *ev = NULL;
}

void rnd_cuda_pool_free(rnd_cuda_evpool *p)
{
    for (size_t i = 0; i < p->n; i++)
        cudaEventDestroy(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

/* g's events: start and completion, and in sync mode the timing pair. */
int rnd_cuda_gjob_events(rnd_cuda *b, rnd_cuda_gjob *g, bool sync, rnp_error *err)
{
    rn_fault f;

    RN_CUDA_GOTO(pool_get(&b->fins, &g->fin), &f, fail);
    RN_CUDA_GOTO(pool_get(&b->starts, &g->started), &f, fail);
    if (sync) {
        RN_CUDA_GOTO(pool_get(&b->timing, &g->t0), &f, fail);
        RN_CUDA_GOTO(pool_get(&b->timing, &g->t1), &f, fail);
    }
    return 0;
fail:
    return rnd_cuda_fault(b, &f, false, err, "bwd: events");
}

/* A ring job's: start and completion, which time its kernel when it runs
 * and is one in RND_CUDA_TIME_EVERY of those (ends_timed), so that the loop
 * records two events a job, not four (each record costs the loop 1-2.5 us;
 * bench_submit), and the GPU pays for timing on a sample only. */
int rnd_cuda_gjob_events_ring(rnd_cuda *b, rnd_cuda_gjob *g, bool run, rnp_error *err)
{
    rn_fault f;

    g->ends_timed = run && b->ring_runs++ % RND_CUDA_TIME_EVERY == 0;
    RN_CUDA_GOTO(pool_get(g->ends_timed ? &b->fins_timed : &b->fins, &g->fin), &f, fail);
    RN_CUDA_GOTO(pool_get(g->ends_timed ? &b->starts_timed : &b->starts, &g->started), &f, fail);
    return 0;
fail:
    return rnd_cuda_fault(b, &f, false, err, "bwd: events");
}

/* Give g's events back to their pools and free g. */
void rnd_cuda_gjob_free(rnd_cuda *b, rnd_cuda_gjob *g)
{
    rnd_cuda_gate_drop(b, g);
    pool_put(&b->timing, &g->t0);
    pool_put(&b->timing, &g->t1);
    pool_put(g->ends_timed ? &b->starts_timed : &b->starts, &g->started);
    pool_put(g->ends_timed ? &b->fins_timed : &b->fins, &g->fin);
    free(g);
}

void rnd_cuda_sess_events_destroy(rnd_cuda_sess *cs)
{
    for (uint32_t i = 0; i < cs->nev; i++) {
        if (cs->ready[i])
            cudaEventDestroy(cs->ready[i]);
        if (cs->done[i])
            cudaEventDestroy(cs->done[i]);
        cs->ready[i] = cs->done[i] = NULL;
    }
    cs->nev = 0;
    (void)cudaGetLastError();
}

int rnd_cuda_events(rnd_backend *be, void *bsess, const rnp_events_req *req, rnp_events_rep *out,
                    rnp_error *err)
{
    rnd_cuda *b = (rnd_cuda *)be;
    rnd_cuda_sess *cs = bsess;
    cudaIpcEventHandle_t h;
    uint32_t i = 0;
    rn_fault f;
    int rc;

    _Static_assert(sizeof h == RNP_IPC_HANDLE_BYTES, "IPC event handle size");
    if ((rc = rnd_cuda_same_device(b, req->device_uuid, "events.device_uuid", "the events are",
                                   err)) != 0)
        return rc;
    if (req->n < 1 || req->n > RNP_MAX_EVENTS)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "events.n: %u is outside 1..%u", req->n,
                        RNP_MAX_EVENTS);
    if (b->failed)
        return rnd_cuda_failed_err(b, err, "events");
    if (cs->nev && cs->njobs)
        return rnp_fail(err, RN_BUSY,
                        "events: requests of this session are still on the GPU; exchange events "
                        "again once they completed");
    rnd_cuda_sess_events_destroy(cs);
    for (i = 0; i < req->n; i++) {
        memcpy(&h, req->ready[i], sizeof h);
        RN_CUDA_GOTO(cudaIpcOpenEventHandle(&cs->ready[i], h), &f, fail_client);
        RN_CUDA_GOTO(
            cudaEventCreateWithFlags(&cs->done[i], cudaEventDisableTiming | cudaEventInterprocess),
            &f, fail);
        RN_CUDA_GOTO(cudaIpcGetEventHandle(&h, cs->done[i]), &f, fail);
        memcpy(out->done[i], &h, sizeof h);
    }
    cs->nev = req->n;
    cs->done_next = 0;
    out->n = req->n;
    return 0;

fail_client:
    /* The usual cause: the client is in another IPC namespace or container,
     * whose /dev/shm (where CUDA keeps an IPC event) the daemon cannot see. */
    rc = rnd_cuda_fault(b, &f, true, err,
                        "events.ready (IPC events need a /dev/shm shared with the daemon; the "
                        "fast path needs none)");
    goto undo;
fail:
    rc = rnd_cuda_fault(b, &f, false, err, "events");
undo:
    cs->nev = i + 1;
    rnd_cuda_sess_events_destroy(cs);
    return rc;
}
