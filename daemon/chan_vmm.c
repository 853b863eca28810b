/* SPDX-License-Identifier: MIT */
/*
 * chan_vmm.c - CUDA virtual memory ranges on the session channel
 * (chan_vmm.h): the pending chunks of one connection, the layout rules
 * (proto's rnp_vmm_*_check), the backend's import and the region.
 */
#include "chan_vmm.h"

#include <stdlib.h>

void rnd_vmm_pending_clear(rnd_backend *be, rnd_vmm_pending *p)
{
    /* (No backend any more: the process is exiting, which releases all.) */
    for (uint32_t i = 0; i < p->n; i++)
        if (p->chunks[i] && be)
            be->ops->vmm_drop(be, p->chunks[i]);
    p->n = 0;
    p->end = 0;
}

void rnd_vmm_pending_free(rnd_vmm_pending *p)
{
    free(p->chunks);
    p->chunks = NULL;
    p->cap = 0;
}

static int fail_clear(rnd_backend *be, rnd_vmm_pending *p, int rc)
{
    rnd_vmm_pending_clear(be, p);
    return rc;
}

int rnd_vmm_chunk(rnd_session *s, rnd_vmm_pending *p, const rnp_chan_msg *m, int fd,
                  rnp_error *err)
{
    rnd_backend *be = s->tab->be;
    uint64_t off = m->u.vmm_chunk.offset, size = m->u.vmm_chunk.size;
    void *chunk = NULL;
    int rc;

    if (!be->ops->vmm_import)
        return fail_clear(be, p,
                          rnp_fail(err, RN_UNSUPPORTED,
                                   "vmm_chunk: the %s backend maps no CUDA memory",
                                   be->ops->name));
    /* Chunk 0 starts a range: one the client gave up half-way (a reply it
     * stopped waiting for) leaves nothing behind. */
    if (m->u.vmm_chunk.index == 0)
        rnd_vmm_pending_clear(be, p);
    if ((rc = rnp_vmm_chunk_check(p->n, p->end, m->u.vmm_chunk.index, off, size, err)) != 0)
        return fail_clear(be, p, rc);
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 16;
        void **n = realloc(p->chunks, cap * sizeof *n);
        if (!n)
            return fail_clear(be, p, rnp_fail(err, RN_NOMEM, "vmm_chunk: out of memory"));
        p->chunks = n;
        p->cap = cap;
    }
    if ((rc = be->ops->vmm_import(be, s->bsess, fd, off, size, &chunk, err)) != 0)
        return fail_clear(be, p, rc);
    p->chunks[p->n++] = chunk;
    p->end = off + size;
    return 0;
}

int rnd_vmm_map(rnd_session *s, rnd_vmm_pending *p, const rnp_chan_msg *m, uint32_t *region,
                rnp_error *err)
{
    rnd_backend *be = s->tab->be;
    int rc = rnp_vmm_map_check(p->n, p->end, m->u.vmm_map.count, m->u.vmm_map.total, err);

    if (rc != 0)
        return fail_clear(be, p, rc);
    /* The region takes the chunks, whatever it answers. */
    rc = rnd_region_add_vmm(s, p->chunks, p->n, p->end, m->u.vmm_map.device_uuid, region, err);
    p->n = 0;
    p->end = 0;
    return rc;
}
