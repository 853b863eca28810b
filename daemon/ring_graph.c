/* SPDX-License-Identifier: MIT */
/*
 * ring_graph.c - graph slots (PROTOCOL.md 13.8): GRAPH_OPEN and
 * GRAPH_CLOSE, the doorbell thread's polling of their generation words
 * (rnd_graphs_poll, from ring.c's scan), and the loop's taking of replays
 * (rnd_graphs_take, from ring.c's wake-up).  ring_int.h has the objects.
 */
#include "ring_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "log.h"

/* ---- the doorbell thread ---------------------------------------------------------------- */

bool rnd_graphs_poll(rnd_ring *g)
{
    bool any = false;
    rn_queue *k;

    RN_QUEUE_FOREACH(k, &g->graphs) {
        rnd_graph *gr = RN_QUEUE_DATA(k, rnd_graph, link);
        uint64_t gen = __atomic_load_n(rnp_ring_u64(gr->base, RNP_GSLOT_O_GEN), __ATOMIC_ACQUIRE);
        if (gen != gr->polled) {
            gr->polled = gen;
            any = true;
        }
    }
    return any;
}

/* ---- the loop: replays --------------------------------------------------------------------- */

/* Answer replay gen of gr from the host (not run): result, a failure, done. */
static void graph_answer(rnd_graph *gr, uint64_t gen, int status, const char *msg)
{
    rnp_ring_put_result(gr->base, status, msg);
    __atomic_add_fetch(rnp_ring_u64(gr->base, RNP_GSLOT_O_FAILS), 1, __ATOMIC_RELEASE);
    __atomic_store_n(rnp_ring_u64(gr->base, RNP_GSLOT_O_DONE), 1, __ATOMIC_RELEASE);
    gr->taken = gen;
}

/* The closed word is set: a replay that began before it saw the word (gen
 * past what the loop took) is answered here, as the loop will not take it
 * (13.8).  Not while one runs (its release calls this), nor if gone. */
static void graph_answer_late(rnd_graph *gr)
{
    if (gr->busy || gr->ring->gone)
        return;
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t gen = __atomic_load_n(rnp_ring_u64(gr->base, RNP_GSLOT_O_GEN), __ATOMIC_SEQ_CST);
    if (gen == gr->taken)
        return;
    graph_answer(gr, gen, gr->end_status,
                 gr->end_status == RN_UNKNOWN_SESSION
                     ? "bwd: the session ended; the replay was not run"
                     : "bwd: the graph was closed; the replay was not run");
}

/* Off its ring's list (under mu) and freed, or freed by its release. */
static void graph_drop(rnd_graph *gr)
{
    rnd_rings *tab = gr->ring->tab;

    pthread_mutex_lock(&tab->mu);
    rn_queue_remove(&gr->link);
    gr->ring->ngraphs--;
    tab->graphs--;
    pthread_mutex_unlock(&tab->mu);
    gr->closed = true;
    if (!gr->busy)
        free(gr);
}

static void on_graph_released(void *owner)
{
    rnd_graph *gr = owner;
    rnd_ring *g = gr->ring;

    gr->busy = false;
    if (gr->closed)
        graph_answer_late(gr); /* a replay that began while this one was released */
    if (gr->closed && !rn_queue_linked(&gr->link))
        free(gr); /* GRAPH_CLOSE came while it ran */
    g->released(g);
}

/* A replay began whose generation the loop has not taken: submit the
 * slot's descriptor once more.  A replay cannot begin before the previous
 * one was answered (the graph waits for done), so at most one is due; a
 * word that moved by more than one means that two launches of the graph
 * ran at once, which the answer says. */
static void take_graph(rnd_ring *g, rnd_graph *gr)
{
    rnd_rings *tab = g->tab;
    uint64_t gen = __atomic_load_n(rnp_ring_u64(gr->base, RNP_GSLOT_O_GEN), __ATOMIC_ACQUIRE);
    rnp_error err = {0};
    rnp_bwd_req b;
    int rc;

    /* (a ring whose client died takes nothing: frozen at its session's end,
     * it stays on the list until its revoked jobs end) */
    if (gr->busy || gr->closed || gen == gr->taken || !g->sess || g->gone)
        return;
    if (g->stopped) {
        /* The ring takes nothing more: answered, not left waiting. */
        graph_answer(gr, gen, g->stop_status,
                     "bwd: the ring stopped (the daemon refused a call of it); the replay was "
                     "not run");
        return;
    }
    rnd_ring_slot at = { g->base, gr->base, gen, false, on_graph_released, gr, true, true, NULL,
                         NULL, 0, 0, NULL };
    bool ok = rnp_ring_decode(gr->desc, 0, &b, &err) == 0;
    if (ok && gen - gr->taken != 1) {
        rnp_fail(&err, RN_INVALID_ARGUMENT,
                 "graph %u: its generation word went from %llu to %llu: replays of it ran at "
                 "once (one instantiation per graph slot, launched on one stream at a time)",
                 gr->id, (unsigned long long)gr->taken, (unsigned long long)gen);
        ok = false;
    }
    /* (--ring-ready=armed: no armed wait, its own ring's included, may hold
     * a replay up) */
    rnd_rings_revoke_others(tab, NULL, "a graph replay");
    rc = tab->submit(tab->ctx, g->sess, ok ? &b : NULL, ok ? NULL : &err, &at, rnd_now_ns());
    if (rc == RN_BUSY) {
        tab->deferred = true; /* taken again once a request frees a limit */
        return;
    }
    if (rc != 0) {
        /* The backend failed: answer the replay from here, so that the
         * client's stream moves on. */
        graph_answer(gr, gen, rc, "bwd: the daemon could not run the replay");
        return;
    }
    gr->taken = gen;
    gr->busy = true;
    g->jobs++;
    g->sess->last_active_ns = rnd_now_ns();
}

void rnd_graphs_take(rnd_ring *g)
{
    rn_queue *q, *next;

    for (q = g->graphs.next; q != &g->graphs; q = next) {
        next = q->next;
        take_graph(g, RN_QUEUE_DATA(q, rnd_graph, link));
    }
}

/* The closed word first, then the generation word: a replay that began
 * before it saw the word is answered here (if it is not running), and one
 * that begins after sees it and does not wait (PROTOCOL.md 13.8). */
void rnd_graphs_end(rnd_ring *g, int status)
{
    rn_queue *q;

    RN_QUEUE_FOREACH(q, &g->graphs) {
        rnd_graph *gr = RN_QUEUE_DATA(q, rnd_graph, link);
        __atomic_store_n(rnp_ring_u32(gr->base, RNP_GSLOT_O_CLOSED), 1u, __ATOMIC_SEQ_CST);
        gr->end_status = status;
        graph_answer_late(gr);
        gr->closed = true;
    }
}

void rnd_graphs_drop(rnd_ring *g)
{
    rn_queue *q, *n;

    RN_QUEUE_FOREACH_SAFE(q, n, &g->graphs)
        graph_drop(RN_QUEUE_DATA(q, rnd_graph, link));
}

void rnd_graphs_free(rnd_ring *g)
{
    rn_queue *q;

    /* Off the thread's list already (ring_close): no lock needed.  No
     * replay runs (the ring's last job was released). */
    while ((q = rn_queue_head(&g->graphs)) != NULL) {
        rn_queue_remove(q);
        free(RN_QUEUE_DATA(q, rnd_graph, link));
    }
}

/* ---- GRAPH_OPEN, GRAPH_CLOSE ------------------------------------------------------------- */

/* The descriptor of a graph slot checked as a slot would be at each
 * replay, so that a bad one fails the capture, not a replay. */
static int check_graph_desc(rnd_ctx *ctx, rnd_session *s, const uint8_t *desc, rnp_error *err)
{
    static const char *const names[RNP_T_COUNT] = { "x", "dy", "dx", "w", "rstd", "dres", "dw" };
    uint64_t size[RNP_T_COUNT];
    rnp_bwd_plan plan;
    rnp_bwd_req b;
    int rc;

    if ((rc = rnp_ring_decode(desc, 0, &b, err)) != 0)
        return rc;
    for (int t = 0; t < RNP_T_COUNT; t++) {
        const rnp_tensor *tn = rnp_bwd_tensor(&b, t);
        rnd_region *r = tn && tn->region.id ? rnd_region_find(s, tn->region.id) : NULL;
        if (r && r->ring)
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "bwd.%s: its region holds the ring; tensors must be elsewhere",
                            names[t]);
        size[t] = r ? r->map.size : RNP_NO_REGION;
    }
    return rnp_validate_bwd(&b, &ctx->limits, size, &plan, err);
}

int rnd_op_graph_open(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                      rnp_error *err)
{
    const rnp_graph_open_req *o = &req->u.graph_open;
    rnd_ring *g = s->ring;
    rnd_rings *tab = &ctx->rings;
    rnd_graph *gr;
    int rc;

    if (!g || g->id != o->ring || g->closing)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "graph_open.ring: no ring %u open in this "
                        "session%s", (unsigned)o->ring, g && g->closing ? " (it is closing)" : "");
    if (g->stopped)
        return rnp_fail(err, g->stop_status, "graph_open.ring: ring %u stopped (the daemon "
                        "refused a call of it); open a new session", (unsigned)o->ring);
    /* Its replays would share a stream with jobs that wait for clients:
     * one of them could wait behind a wait the replay holds up. */
    if (ctx->be->ops->graphs_ok && !ctx->be->ops->graphs_ok(ctx->be, s->bsess))
        return rnp_fail(err, RN_UNSUPPORTED, "graph_open.ring: ring %u has no stream of its own "
                        "for graph replays (all taken, or one could not be made); capture in "
                        "a later session", (unsigned)o->ring);
    if ((rc = rnp_graph_check_offset(o->offset, g->region->map.size, g->region_off, g->slots,
                                     err)) != 0)
        return rc;
    uint8_t *base = (uint8_t *)g->region->map.base + o->offset;
    rn_queue *q;
    RN_QUEUE_FOREACH(q, &g->graphs) {
        const rnd_graph *o2 = RN_QUEUE_DATA(q, rnd_graph, link);
        if (o2->base == base && memcmp(o2->desc, base, sizeof o2->desc) == 0) {
            rep->u.graph_open.graph = o2->id; /* a re-send (section 1): the same graph */
            return 0;
        }
        if (o2->base < base + RNP_GRAPH_SLOT && base < o2->base + RNP_GRAPH_SLOT)
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "graph_open.offset: %llu overlaps graph %u", (unsigned long long)
                            o->offset, o2->id);
    }
    if (g->ngraphs >= RNP_GRAPH_MAX)
        return rnp_fail(err, RN_TOO_LARGE, "graph_open: the ring has %u graph slots open, the "
                        "limit (GRAPH_CLOSE gives them back)", RNP_GRAPH_MAX);
    /* The doorbell thread polls every open graph slot every 20 us, under
     * the rings' mutex: their number is bounded per daemon. */
    if (tab->graphs >= ctx->cfg.max_graphs) {
        ctx->last_busy_ns = rnd_now_ns();
        return rnp_fail(err, RN_BUSY, "graph_open: the daemon has %u graph slots open, the "
                        "limit (--max-graphs); GRAPH_CLOSE gives them back", tab->graphs);
    }
    if (!(gr = calloc(1, sizeof *gr)))
        return rnp_fail(err, RN_NOMEM, "graph_open: out of memory");
    /* Once: replays use this copy, whatever the shared bytes say later. */
    memcpy(gr->desc, base, sizeof gr->desc);
    if ((rc = check_graph_desc(ctx, s, gr->desc, err)) != 0) {
        free(gr);
        return rc;
    }
    gr->id = ++g->next_graph ? g->next_graph : ++g->next_graph;
    gr->ring = g;
    gr->base = base;
    rnp_ring_put_result(base, 0, NULL);
    __atomic_store_n(rnp_ring_u64(base, RNP_GSLOT_O_FAILS), 0, __ATOMIC_RELAXED);
    __atomic_store_n(rnp_ring_u32(base, RNP_GSLOT_O_CLOSED), 0, __ATOMIC_RELAXED);
    /* The client's word as it is now: a replay is a change of it. */
    gr->taken = gr->polled = __atomic_load_n(rnp_ring_u64(base, RNP_GSLOT_O_GEN),
                                             __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&tab->mu);
    rn_queue_push_back(&g->graphs, &gr->link);
    g->ngraphs++;
    tab->graphs++;
    pthread_mutex_unlock(&tab->mu);
    rnd_rings_kick(tab); /* from a long sleep to polling */
    rnd_debug("Ring %u of '%s': graph %u at %llu", g->id, s->name, gr->id,
              (unsigned long long)o->offset);
    rep->u.graph_open.graph = gr->id;
    return 0;
}

int rnd_op_graph_close(rnd_ctx *ctx, rnd_session *s, const rnp_request *req, rnp_reply *rep,
                       rnp_error *err)
{
    const rnp_graph_close_req *o = &req->u.graph_close;
    rnd_ring *g = s->ring;
    rn_queue *q;

    (void)ctx;
    (void)rep;
    if (!g || g->id != o->ring)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "graph_close.ring: no ring %u open in this "
                        "session", (unsigned)o->ring);
    RN_QUEUE_FOREACH(q, &g->graphs) {
        rnd_graph *gr = RN_QUEUE_DATA(q, rnd_graph, link);
        if (gr->id != o->graph)
            continue;
        /* A replay the loop has not taken yet is answered (not run): the
         * client gives the slot back only once its graphs are gone. */
        __atomic_store_n(rnp_ring_u32(gr->base, RNP_GSLOT_O_CLOSED), 1u, __ATOMIC_SEQ_CST);
        gr->end_status = RN_INVALID_ARGUMENT;
        graph_answer_late(gr);
        graph_drop(gr);
        return 0;
    }
    return rnp_fail(err, RN_INVALID_ARGUMENT, "graph_close.graph: no graph %u in ring %u",
                    (unsigned)o->graph, (unsigned)o->ring);
}
