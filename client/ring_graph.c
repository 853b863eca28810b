/* SPDX-License-Identifier: MIT */
/*
 * ring_graph.c - libclient's graph slots (PROTOCOL.md 13.8), after the ring
 * in its memory: a call on a stream being captured into a CUDA graph takes
 * one (ring.c says when), its descriptor registered with GRAPH_OPEN; CUDA's
 * destructor of the graph queues the slot (any thread) and the client's
 * next call gives it back with GRAPH_CLOSE.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_int.h"

/* A graph's destructor (any thread, no CUDA call allowed) queues its slot
 * here; the client's next call gives it back (rnc_take_gone). */
typedef struct gone_node {
    uint64_t token;
    uint32_t slot;
    struct gone_node *next;
} gone_node;
static pthread_mutex_t gone_mu = PTHREAD_MUTEX_INITIALIZER;
static gone_node *gone_list;
static uint64_t next_token;
/* Tokens of ring memory whose client closed while graphs still held some
 * of its slots: those graphs' destructors free their node at once (no
 * client is left to take it).  16 bytes per such close, kept. */
typedef struct orphan_token {
    uint64_t token;
    struct orphan_token *next;
} orphan_token;
static orphan_token *orphans;

uint64_t rnc_ring_token(void)
{
    pthread_mutex_lock(&gone_mu);
    uint64_t t = ++next_token;
    pthread_mutex_unlock(&gone_mu);
    return t;
}

/* A graph slot the daemon no longer serves: a replay must not wait for
 * it.  closed first, then done: a replay that began before it saw closed
 * has reset done already, and this sets it again (PROTOCOL.md 13.8). */
void rnc_graph_let_go(rnc_ring *g, uint32_t i)
{
    __atomic_store_n(rnp_ring_u32(rnc_gslot(g, i), RNP_GSLOT_O_CLOSED), 1u, __ATOMIC_SEQ_CST);
    atomic_thread_fence(memory_order_seq_cst);
    __atomic_store_n(rnp_ring_u64(rnc_gslot(g, i), RNP_GSLOT_O_DONE), 1u, __ATOMIC_SEQ_CST);
}

/* Under gone_mu: drop the queued nodes of token (no GRAPH_CLOSE is due:
 * the session ends). */
static void gone_drop(uint64_t token)
{
    gone_node **pp = &gone_list, *n;
    while ((n = *pp) != NULL) {
        if (n->token == token) {
            *pp = n->next;
            free(n);
        } else {
            pp = &n->next;
        }
    }
}

bool rnc_graphs_release(rnc_ring *g)
{
    bool held = false;
    pthread_mutex_lock(&gone_mu);
    gone_drop(g->token);
    for (uint32_t i = 0; i < GRAPH_SLOTS; i++)
        if (g->gheld[i] && !g->gdaemon[i]) { /* (no graph replays into a daemon's) */
            rnc_graph_let_go(g, i);
            held = true;
        }
    orphan_token *o = held ? malloc(sizeof *o) : NULL;
    if (o) {
        o->token = g->token;
        o->next = orphans;
        orphans = o;
    }
    pthread_mutex_unlock(&gone_mu);
    return held;
}

void rnc_collect_graphs(rnc_ring *g)
{
    char m[RNP_MAX_ERRMSG];

    for (uint32_t i = 0; i < GRAPH_SLOTS; i++) {
        if (!g->gid[i])
            continue;
        uint64_t f =
            __atomic_load_n(rnp_ring_u64(rnc_gslot(g, i), RNP_GSLOT_O_FAILS), __ATOMIC_ACQUIRE);
        if (f == g->gfails[i])
            continue;
        uint64_t n = f - g->gfails[i];
        g->gfails[i] = f;
        int st = rnp_ring_get_result(rnc_gslot(g, i), m, sizeof m);
        if (st != 0)
            rnc_ring_note(g, st, "graph %u, %llu replay%s failed: %.160s", g->gid[i],
                          (unsigned long long)n, n == 1 ? "" : "s", m);
    }
}

/* A graph's destructor: CUDA destroyed it and its instantiations.  Any
 * thread; no CUDA call, no daemon traffic: queue it for take_gone. */
static void graph_gone(void *arg)
{
    gone_node *n = arg;
    bool orphan = false;

    pthread_mutex_lock(&gone_mu);
    for (orphan_token *o = orphans; o && !orphan; o = o->next)
        orphan = o->token == n->token;
    if (!orphan) {
        n->next = gone_list;
        gone_list = n;
    }
    pthread_mutex_unlock(&gone_mu);
    if (orphan)
        free(n);
}

/* The regions a captured call names, held while its graph lives (or let
 * go): VMM ranges are not to be unregistered under a graph's replays. */
static void hold_regions(rn_client *c, rnc_ring *g, uint32_t i, const rnp_bwd_req *b)
{
    uint32_t *r = g->gregion[i];
    if (b)
        for (int k = 0; k < RNP_T_COUNT; k++) {
            const rnp_tensor *t = rnp_bwd_tensor(b, k);
            r[k] = t ? t->region.id : 0;
        }
    rnc_vmm_hold(c, &g->of, r, RNP_T_COUNT, b != NULL);
    if (!b)
        memset(r, 0, sizeof g->gregion[i]);
}

/* Give back the graph slots of c whose graphs are gone: GRAPH_CLOSE where
 * the daemon serves them (best effort), free for the next capture. */
void rnc_take_gone(rn_client *c)
{
    gone_node *mine = NULL, **pp, *n;

    pthread_mutex_lock(&gone_mu);
    for (pp = &gone_list; (n = *pp) != NULL;) {
        bool ours = false;
        for (rnc_ring *g = c->ring; g && !ours; g = g->retired)
            ours = g->token == n->token;
        if (ours) {
            *pp = n->next;
            n->next = mine;
            mine = n;
        } else {
            pp = &n->next;
        }
    }
    pthread_mutex_unlock(&gone_mu);
    while ((n = mine) != NULL) {
        mine = n->next;
        for (rnc_ring *g = c->ring; g; g = g->retired) {
            if (g->token != n->token || n->slot >= GRAPH_SLOTS)
                continue;
            /* (No GRAPH_CLOSE to a daemon the watcher saw go.) */
            if (g->gid[n->slot] && g->open && memcmp(&g->of, &c->session, sizeof g->of) == 0 &&
                !rnc_watch_fired(c)) {
                rnc_collect_graphs(g);
                rnp_request *q = rnc_request(c, RN_OP_GRAPH_CLOSE);
                q->u.graph_close.session = c->session;
                q->u.graph_close.ring = g->id;
                q->u.graph_close.graph = g->gid[n->slot];
                if (rnc_transact(c, c->timeout_ms) != 0) {
                    /* The daemon may still hold the slot: not reused while
                     * this session lasts (ring.c's lost_upto frees it). */
                    rnc_clear_thread_error();
                    g->gid[n->slot] = 0;
                    g->gdaemon[n->slot] = true;
                    rnc_watch_graph(c, g->base, n->slot, false);
                    hold_regions(c, g, n->slot, NULL); /* (no replay comes any more) */
                    continue;
                }
            }
            g->gid[n->slot] = 0;
            g->gheld[n->slot] = false;
            rnc_watch_graph(c, g->base, n->slot, false);
            hold_regions(c, g, n->slot, NULL);
        }
        free(n);
    }
}

/* A call on a stream being captured: a graph slot of its own, its
 * descriptor registered (and checked) now, the replay's start and the
 * wait for done captured into the graph. */
int rnc_graph_publish(rn_client *c, rnc_ring *g, const rnp_bwd_req *b, const rnc_ring_dev *dev,
                      void *stream)
{
    uint32_t i;
    int rv;

    if (!dev->graph)
        return rnc_fail(c, RN_UNSUPPORTED, "graph: this device side cannot capture calls");
    for (i = 0; i < GRAPH_SLOTS && g->gheld[i]; i++)
        ;
    if (i == GRAPH_SLOTS)
        return rnc_fail(c, RN_TOO_LARGE,
                        "graph: %u calls are captured in CUDA graphs that still exist, the "
                        "limit; destroy graphs no longer used (their slots come back)",
                        GRAPH_SLOTS);
    uint8_t *p = rnc_gslot(g, i);
    memset(p, 0, RNP_GRAPH_SLOT);
    rnp_ring_encode(b, 0, p);
    rnp_request *q = rnc_request(c, RN_OP_GRAPH_OPEN);
    q->u.graph_open.session = c->session;
    q->u.graph_open.ring = g->id;
    q->u.graph_open.offset = rnc_gslot_off(g, i);
    /* The daemon copies the descriptor and checks it as it would check a
     * slot: a bad call fails here, at capture. */
    if ((rv = rnc_transact(c, c->timeout_ms)) != 0) {
        /* No answer: the daemon may hold the slot (and would refuse it
         * again): not used again while this ring's session lasts. */
        if (!c->replied)
            g->gheld[i] = g->gdaemon[i] = true;
        return rv;
    }
    uint32_t gid = c->rep.u.graph_open.graph;
    gone_node *n = calloc(1, sizeof *n);
    bool queued = false;
    if (!n)
        rv = rnc_fail(c, RN_NOMEM, "graph: out of memory");
    else {
        n->token = g->token;
        n->slot = i;
        rv = dev->graph(c, stream, g->dev_base + rnc_gslot_off(g, i), graph_gone, n, &queued);
    }
    if (rv != 0) {
        char why[RN_ERRMSG_LEN];
        snprintf(why, sizeof why, "%s", c->last_error);
        free(n);
        /* Part of the replay's start may be in the graph: the slot stays
         * held (never reused under it) and closed (a replay waits for
         * nothing). */
        rnc_graph_let_go(g, i);
        g->gheld[i] = true;
        q = rnc_request(c, RN_OP_GRAPH_CLOSE);
        q->u.graph_close.session = c->session;
        q->u.graph_close.ring = g->id;
        q->u.graph_close.graph = gid;
        /* Nothing of it in the graph: free again once the daemon let go
         * (before, every such failure kept a slot until the session ended,
         * and GRAPH_SLOTS of them refused every capture). */
        if (rnc_transact(c, c->timeout_ms) == 0 && !queued)
            g->gheld[i] = false;
        else if (!queued)
            g->gdaemon[i] = true;
        return rnc_fail(c, rv, "%s", why);
    }
    g->gid[i] = gid;
    g->gfails[i] = 0;
    g->gheld[i] = true;
    hold_regions(c, g, i, b);
    rnc_watch_graph(c, g->base, i, true);
    return 0;
}
