/* SPDX-License-Identifier: MIT */
/*
 * dedupe.c - a fixed ring of recent results, searched newest first because a
 * re-sent request is almost always one of the last few.
 */
#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

int rnd_dedupe_init(rnd_dedupe *d, uint32_t cap)
{
    rnd_result *ring;

    if (cap == 0)
        cap = 1;
    ring = calloc(cap, sizeof *ring);
    if (!ring)
        return -1;
    memset(d, 0, sizeof *d);
    d->ring = ring;
    d->cap = cap;
    return 0;
}

void rnd_dedupe_fini(rnd_dedupe *d)
{
    if (!d)
        return;
    free(d->ring);
    d->ring = NULL;
    d->cap = d->n = d->head = 0;
}

int rnd_dedupe_lookup(const rnd_dedupe *d, uint64_t seq, const rnd_result **out)
{
    for (uint32_t k = 1; k <= d->n; k++) {
        const rnd_result *r = &d->ring[(d->head + d->cap - k) % d->cap];
        if (r->seq == seq) {
            *out = r;
            return RND_SEQ_DONE;
        }
    }
    if (d->evicted_any && seq <= d->max_evicted)
        return RND_SEQ_TOO_OLD;
    return RND_SEQ_NEW;
}

void rnd_dedupe_put(rnd_dedupe *d, const rnd_result *r)
{
    rnd_result *slot = &d->ring[d->head];

    if (d->n == d->cap) {
        if (!d->evicted_any || slot->seq > d->max_evicted)
            d->max_evicted = slot->seq;
        d->evicted_any = true;
    } else {
        d->n++;
    }
    *slot = *r;
    d->head = (d->head + 1) % d->cap;
}
