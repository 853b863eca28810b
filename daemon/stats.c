/* SPDX-License-Identifier: MIT */
/*
 * stats.c - counters and log-scale latency histograms.
 */
#include "stats.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

uint64_t rnd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

unsigned rnd_hist_index(uint64_t v)
{
    const unsigned sub = 1u << RND_HIST_SUB_BITS;
    unsigned e;

    if (v < sub)
        return (unsigned)v;
    e = 63u - (unsigned)__builtin_clzll(v); /* e >= SUB_BITS */
    return ((e - RND_HIST_SUB_BITS + 1) << RND_HIST_SUB_BITS) +
           (unsigned)((v >> (e - RND_HIST_SUB_BITS)) & (sub - 1));
}

uint64_t rnd_hist_upper(unsigned i)
{
    const unsigned sub = 1u << RND_HIST_SUB_BITS;
    unsigned e, s;
    uint64_t width, lo;

    if (i < sub)
        return i;
    e = (i >> RND_HIST_SUB_BITS) + RND_HIST_SUB_BITS - 1;
    s = i & (sub - 1);
    width = (uint64_t)1 << (e - RND_HIST_SUB_BITS);
    lo = ((uint64_t)1 << e) + s * width;
    return lo + (width - 1);   /* wraps to UINT64_MAX for the very last bucket */
}

void rnd_hist_add(rnd_hist *h, uint64_t v)
{
    h->bucket[rnd_hist_index(v)]++;
    h->count++;
    h->sum += v;
    if (v > h->max)
        h->max = v;
}

uint64_t rnd_hist_quantile(const rnd_hist *h, double p)
{
    uint64_t rank, seen = 0;

    if (h->count == 0)
        return 0;
    if (!(p > 0))
        p = 0;
    if (p > 1)
        p = 1;
    rank = (uint64_t)ceil(p * (double)h->count);
    if (rank < 1)
        rank = 1;
    for (unsigned i = 0; i < RND_HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= rank) {
            uint64_t up = rnd_hist_upper(i);
            return up < h->max ? up : h->max;
        }
    }
    return h->max;
}

_Static_assert((RND_HIST_BUCKETS >> RND_HIST_SUB_BITS) <= RNP_MAX_BUCKETS,
               "one bucket per power of two must fit a STATS reply");

/*
 * The non-empty buckets, coarsened until they fit RNP_MAX_BUCKETS.  Level s
 * merges aligned runs of 2^s buckets; a run never crosses a power of two
 * (each power of two is 2^SUB_BITS buckets, aligned), so level s is the same
 * log scale with 2^(SUB_BITS - s) buckets per power of two.  A merged
 * bucket's bound is the upper edge of its last fine bucket and its count the
 * sum of the run's counts: every bound stays one of the daemon's bucket
 * edges and the cumulative count at it stays exact; only the edges inside
 * a run are lost.  The lowest level that fits is taken; level SUB_BITS (one
 * bucket per power of two, RND_HIST_BUCKETS >> SUB_BITS in all) always
 * fits.
 */
void rnd_hist_export(const rnd_hist *h, rnp_bucket *out, uint32_t *n)
{
    for (unsigned s = 0; s <= RND_HIST_SUB_BITS; s++) {
        unsigned runs = 0;
        for (unsigned i = 0; i < RND_HIST_BUCKETS; i += 1u << s) {
            uint64_t c = 0;
            for (unsigned j = i; j < i + (1u << s); j++)
                c += h->bucket[j];
            runs += c != 0;
        }
        if (runs > RNP_MAX_BUCKETS && s < RND_HIST_SUB_BITS)
            continue;
        *n = 0;
        for (unsigned i = 0; i < RND_HIST_BUCKETS; i += 1u << s) {
            uint64_t c = 0;
            for (unsigned j = i; j < i + (1u << s); j++)
                c += h->bucket[j];
            if (c == 0 || *n >= RNP_MAX_BUCKETS)
                continue;
            out[*n].upper = rnd_hist_upper(i + (1u << s) - 1);
            out[*n].count = c;
            (*n)++;
        }
        return;
    }
}

void rnd_stats_init(rnd_stats *s, uint64_t now_ns)
{
    memset(s, 0, sizeof *s);
    s->start_ns = now_ns;
}

void rnd_stats_request(rnd_stats *s, uint32_t op)
{
    s->requests[op >= 1 && op <= RN_OP_MAX ? op : 0]++;
}

void rnd_stats_reply(rnd_stats *s, int code)
{
    if (code == 0)
        s->replies_ok++;
    else if (code > 0 && code < RND_MAX_CODE)
        s->errors[code]++;
    if (code == RN_BUSY)
        s->busy_rejected++;
}

void rnd_stats_put(rnp_stats_rep *out, const char *name, uint64_t v)
{
    if (out->nstats >= RNP_MAX_STATS)
        return;
    snprintf(out->stats[out->nstats].name, RNP_STAT_NAME, "%s", name);
    out->stats[out->nstats].value = v;
    out->nstats++;
}

static void put_hist(rnp_stats_rep *out, const char *name, const rnd_hist *h)
{
    rnp_hist *o;
    if (out->nhists >= RNP_MAX_HISTS)
        return;
    o = &out->hists[out->nhists++];
    snprintf(o->name, RNP_STAT_NAME, "%s", name);
    o->count = h->count;
    o->p50 = rnd_hist_quantile(h, 0.50);
    o->p90 = rnd_hist_quantile(h, 0.90);
    o->p99 = rnd_hist_quantile(h, 0.99);
    o->max = h->max;
    o->sum = h->sum;
    o->has_buckets = true;
    rnd_hist_export(h, o->buckets, &o->nbuckets);
}

void rnd_stats_fill(const rnd_stats *s, const rnd_gauges *g, rnp_stats_rep *out)
{
    char name[RNP_STAT_NAME];

    out->nstats = 0;
    out->nhists = 0;
    for (uint32_t op = 1; op <= RN_OP_MAX; op++) {
        snprintf(name, sizeof name, "requests.%s", rnp_op_name((int)op));
        rnd_stats_put(out, name, s->requests[op]);
    }
    rnd_stats_put(out, "requests.unknown", s->requests[0]);
    rnd_stats_put(out, "requests.auth", s->chan_auth);
    rnd_stats_put(out, "requests.register_fd", s->chan_register_fd);
    rnd_stats_put(out, "channel.evicted", s->chan_evicted);
    rnd_stats_put(out, "channel.refused", s->chan_refused);
    rnd_stats_put(out, "replies.ok", s->replies_ok);
    rnd_stats_put(out, "bytes.processed", s->bytes_processed);
    rnd_stats_put(out, "sessions.active", g->sessions_active);
    rnd_stats_put(out, "sessions.total", s->sessions_total);
    rnd_stats_put(out, "sessions.expired", s->sessions_expired);
    rnd_stats_put(out, "sessions.unauthenticated", g->sessions_unauth);
    rnd_stats_put(out, "sessions.unauth_ended", s->sessions_unauth_ended);
    rnd_stats_put(out, "regions.active", g->regions_active);
    rnd_stats_put(out, "inflight.current", g->inflight_current);
    rnd_stats_put(out, "inflight.max", s->inflight_max);
    rnd_stats_put(out, "uptime.seconds", g->now_ns > s->start_ns ? (g->now_ns - s->start_ns) / 1000000000u : 0);
    rnd_stats_put(out, "busy.rejected", s->busy_rejected);
    rnd_stats_put(out, "dup.answered", s->dup_answered);
    rnd_stats_put(out, "clients.died", s->clients_died);
    rnd_stats_put(out, "front.restarts", s->front_restarts);
    rnd_stats_put(out, "fast.slots", s->fast_ok + s->fast_errors);
    rnd_stats_put(out, "fast.ok", s->fast_ok);
    rnd_stats_put(out, "fast.errors", s->fast_errors);
    rnd_stats_put(out, "fast.rings", g->rings_open);
    rnd_stats_put(out, "fast.graphs", g->graphs_open);
    rnd_stats_put(out, "fast.deferred", s->fast_deferred);
    rnd_stats_put(out, "fast.polled", s->fast_polled);
    rnd_stats_put(out, "fast.bells", s->fast_bells);
    rnd_stats_put(out, "fast.prepared", s->fast_prepared);
    rnd_stats_put(out, "fast.armed", s->fast_armed);
    rnd_stats_put(out, "fast.revoked", s->fast_revoked);
    rnd_stats_put(out, "fast.revokes", s->fast_revokes);
    rnd_stats_put(out, "fast.ready_waits", s->fast_ready_waits);
    /* Only the codes seen, so the table stays short; a code appears once
     * its first error was answered and stays from then on. */
    for (int code = 1; code < RND_MAX_CODE; code++) {
        if (!s->errors[code])
            continue;
        snprintf(name, sizeof name, "errors.%s", rnp_err_name(code));
        rnd_stats_put(out, name, s->errors[code]);
    }
    put_hist(out, "queue", &s->queue);
    put_hist(out, "compute", &s->compute);
    put_hist(out, "total", &s->total);
    /* The fast path's once it was used, as errors appear once seen. */
    if (s->fast_ok + s->fast_errors) {
        put_hist(out, "fast.queue", &s->fast_queue);
        put_hist(out, "fast.compute", &s->fast_compute);
        put_hist(out, "fast.total", &s->fast_total);
        put_hist(out, "fast.take", &s->fast_take);
    }
}
