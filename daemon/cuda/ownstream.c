/* SPDX-License-Identifier: MIT */
/*
 * ownstream.c - a stream of its own for each ring (issue 14).  The pool's
 * RND_CUDA_STREAMS streams are shared once there are more sessions than
 * streams, and then a session whose producer is late holds up the ring
 * jobs of another that shares its stream (a ring job waits on the GPU for
 * its ready word).  A ring gets two streams of its own at its setup (the
 * REGISTER_FD of its memory): one for its slots, one for its graph slots,
 * whose jobs never wait on the GPU (the daemon enqueues them once it saw
 * the generation word move, so their inputs are ready) and so must not
 * queue behind a wait for ready that the very replay holds up.  They live
 * after the pool in b->streams, each with its completion thread (as the
 * pool's: complete.c).  When the session ends they are kept as spares for
 * the next rings (up to RND_CUDA_SPARE_STREAMS), idle, with their threads
 * and workspaces: no CUDA call at a session's end, none at the next ring's
 * setup.  Making a stream can wait for the device (4.3 s on the loop behind
 * a late producer's GPU wait, on the H200 without MPS), and so can
 * destroying one.  Past the spares a stream is destroyed as soon as no
 * stream waits, late, on a client (the gate, gate.c: the give-back's CUDA
 * calls were seen to wait 4.7 s on the loop behind a close that waited for
 * a late producer).  Where a
 * stream cannot be made (a limit, the device's resources) the ring's slots
 * fall back to the pool, as before; its graph slots are refused instead
 * (GRAPH_OPEN, rnd_cuda_graphs_ok): a replay on a pool stream could queue
 * behind a classic job that waits on another client's event, or on a ring
 * slot whose ready the replay itself holds up.
 */
#include "cuda_int.h"

#include <string.h>

#include "log.h"
#include "stats.h"

int rnd_cuda_own_stream_new(rnd_cuda *b, const char *what)
{
    static bool warned;
    rnd_cuda_stream *s = NULL;
    rn_fault f;
    int i;

    for (i = RND_CUDA_STREAMS; i < b->nstreams; i++)
        if (b->streams[i].spare) {
            /* Idle (every job of its last session had its done event), its
             * thread waiting for work, its workspace kept. */
            b->streams[i].spare = false;
            b->nspare--;
            return i;
        }
    for (i = RND_CUDA_STREAMS; i < RND_CUDA_MAX_STREAMS; i++)
        if (!b->streams[i].live && !b->streams[i].thr_started) {
            s = &b->streams[i];
            break;
        }
    if (!s) {
        if (!warned)
            rnd_warn("All %d streams for rings are taken: newer rings use the pool's %d "
                     "streams (a late producer may then hold up another session)",
                     RND_CUDA_OWN_STREAMS, RND_CUDA_STREAMS);
        warned = true;
        return -1;
    }
    memset(s, 0, sizeof *s);
    s->b = b;
    s->own = true;
    rn_queue_init(&s->fifo);
    RN_PT_GOTO(pthread_cond_init(&s->cv, NULL), &f, fail);
    /* The workspace comes with the first job (submit.c's ws_ensure,
     * stream-ordered), so that nothing here waits for the device. */
    RN_CUDA_GOTO(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking), &f, fail_cv);
    RN_PT_GOTO(pthread_create(&s->thr, NULL, rnd_cuda_completion_thread, s), &f, fail_stream);
    s->thr_started = true;
    s->live = true;
    if (i + 1 > b->nstreams)
        b->nstreams = i + 1;
    return i;
fail_stream:
    cudaStreamDestroy(s->st);
    s->st = NULL;
fail_cv:
    pthread_cond_destroy(&s->cv);
fail:
    (void)cudaGetLastError();
    rnd_warn("A stream of its own for %s: %s; it uses the pool's", what, f.why);
    return -1;
}

void rnd_cuda_own_stream_free(rnd_cuda *b, int i)
{
    rnd_cuda_stream *s;

    if (i < RND_CUDA_STREAMS || i >= RND_CUDA_MAX_STREAMS || !b->streams[i].live)
        return;
    s = &b->streams[i];
    if (s->spare)
        return;
    /* Every job on it had its done event (the session ends): its FIFO is
     * empty, and the stream idle. */
    if (!b->failed && b->nspare < RND_CUDA_SPARE_STREAMS) {
        s->spare = true;
        b->nspare++;
        return;
    }
    /* Its thread returns at once. */
    pthread_mutex_lock(&b->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&b->mu);
    s->live = false;
    if (b->failed)
        /* Its thread may sit in a wait for a kernel that never ends: not
         * joined (the loop must not block), and the slot is not reused
         * (thr_started stays set); the process exit takes the rest. */
        return;
    s->giveback = true;
    s->giveback_ns = rnd_now_ns();
    b->ngiveback++;
    rnd_cuda_own_streams_giveback(b, false);
}

void rnd_cuda_own_streams_open(rnd_cuda *b, rnd_cuda_sess *cs)
{
    if (cs->own_tried)
        return;
    cs->own_tried = true;
    cs->ring_stream = rnd_cuda_own_stream_new(b, "a ring");
    if (cs->ring_stream >= 0)
        cs->graph_stream = rnd_cuda_own_stream_new(b, "a ring's graph slots");
    if (cs->ring_stream >= 0)
        rnd_debug("cuda session #%u: its ring uses stream %d, its graph slots stream %d",
                  cs->id, cs->ring_stream, cs->graph_stream);
}

bool rnd_cuda_graphs_ok(rnd_backend *be, void *bsess)
{
    const rnd_cuda_sess *cs = bsess;

    (void)be;
    return cs && cs->graph_stream >= 0;
}
