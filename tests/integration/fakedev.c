/* SPDX-License-Identifier: MIT */
/* fakedev.c - the fake device side of fakedev.h. */
#include "integration/fakedev.h"

#include "rn_ring.h"

static int f_attach(rn_client *c, void *base, size_t size, uint64_t *dev)
{
    (void)c, (void)size;
    *dev = (uint64_t)(uintptr_t)base;
    return 0;
}

static void f_detach(void *base)
{
    (void)base;
}

static int f_write(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    rnt_fake *s = stream;
    (void)c;
    s->writes++;
    s->base = addr - RNP_RING_O_READY;
    if (!s->defer)
        __atomic_store_n((uint64_t *)(uintptr_t)addr, seq, __ATOMIC_RELEASE);
    return 0;
}

static int f_wait(rn_client *c, void *stream, uint64_t addr, uint64_t seq)
{
    (void)c, (void)addr, (void)seq;
    ((rnt_fake *)stream)->waits++;
    return 0;
}

static int f_captured(rn_client *c, void *stream)
{
    (void)c;
    return ((rnt_fake *)stream)->capturing;
}

static int f_graph(rn_client *c, void *stream, uint64_t addr, void (*gone)(void *), void *arg,
                   bool *queued)
{
    rnt_fake *s = stream;
    *queued = s->graph_fail == 2;
    if (s->graph_fail)
        return rnc_fail(c, RN_CUDA, "fake: the graph's %s failed",
                        s->graph_fail == 2 ? "wait" : "start");
    s->graphs++;
    s->slot = addr;
    s->gone = gone;
    s->arg = arg;
    return 0;
}

/* ready and go (one call's write: writes counts calls) */
static int f_write2(rn_client *c, void *stream, uint64_t addr, uint64_t addr2, uint64_t seq)
{
    int rv = f_write(c, stream, addr, seq);
    if (rv == 0 && !((rnt_fake *)stream)->defer)
        __atomic_store_n((uint64_t *)(uintptr_t)addr2, seq, __ATOMIC_RELEASE);
    return rv;
}

const rnc_ring_dev rnt_fake_dev = {f_attach, f_detach, f_write,  f_wait,
                                   f_captured, f_graph, NULL, NULL, f_write2};
