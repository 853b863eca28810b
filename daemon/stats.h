/* SPDX-License-Identifier: MIT */
/*
 * stats.h - the daemon's counters and latency histograms, and their
 * rendering into a STATS reply.  Counter names are part of the interface
 * (rmsnormctl renders them generically): "requests.<op>", "replies.ok",
 * "errors.<ERR_NAME>", "bytes.processed", "sessions.active", "sessions.total",
 * "sessions.expired", "sessions.unauthenticated", "sessions.unauth_ended", "regions.active", "inflight.current", "inflight.max",
 * "uptime.seconds", "busy.rejected", "dup.answered", "clients.died",
 * "front.restarts".
 * The cuda backend's closes of released mappings and ring memory
 * (daemon/cuda/closer.c): "closes.pending" (released, not closed yet),
 * "closes.done", "closes.pending_max", "closes.wait_max_us" (the longest
 * from release to close), "closes.thread" (1: on the closer thread),
 * "closes.gated" (times the gate held closes: a stream waited on a late
 * client, or our own GPU work left no quiet moment, daemon/cuda/gate.c),
 * "closes.gated_max_us" (the longest it held them, the current hold
 * included), "closes.busy_held" (looks of the gate that held a close for a
 * quiet moment of our own GPU work), "closes.streams_pending" (rings' own
 * streams whose give-back waits for the gate); "regions.ipc_large" (CUDA
 * IPC allocations over 512 MiB mapped, daemon/cuda/mapcache.c: the kernel
 * runs slower on tensors inside one), "regions.remap_waits" (REGISTERs that
 * waited for released mappings of the same memory to close).
 * The fast path (the ring): "fast.slots" (slots answered), "fast.ok",
 * "fast.errors", "fast.rings" (rings open), "fast.graphs" (graph slots
 * open), "fast.deferred" (times a slot or replay was left in its ring at a
 * limit, to be taken later), "fast.polled" (slots the loop found itself
 * while it polled the rings after a slot: --ring-spin-us), "fast.prepared"
 * (slots decoded, validated and pinned while their ready word had not come,
 * --ring-ready=host: at the ready word only their submission is left);
 * errors of both paths count in "errors.<ERR_NAME>".
 * Histograms "queue", "compute", "total" (the nanomsg BWD) and "fast.queue",
 * "fast.compute", "fast.total" (ring slots: from the daemon taking the slot;
 * sent once a slot was answered) and "fast.take" (the loop's own time taking
 * a slot: its copy, checks, pins and the backend's submission) are in
 * nanoseconds.
 *
 * Loop-thread only: no locking.
 */
#ifndef RND_STATS_H
#define RND_STATS_H

#include <stdint.h>

#include "rn_proto.h"

/*
 * Log-scale buckets: values below 2^SUB_BITS are exact; above, each power of
 * two is split into 2^SUB_BITS equal buckets, so a reported percentile is at
 * most 1/2^SUB_BITS (12.5 %) above the true value, and never above the max.
 */
#define RND_HIST_SUB_BITS 3
#define RND_HIST_BUCKETS ((64 - RND_HIST_SUB_BITS + 1) << RND_HIST_SUB_BITS)

typedef struct rnd_hist {
    uint64_t count, max, sum;
    uint64_t bucket[RND_HIST_BUCKETS];
} rnd_hist;

void rnd_hist_add(rnd_hist *h, uint64_t v);
/* The p-quantile (0 < p <= 1): the upper edge of the bucket holding the
 * ceil(p * count)-th smallest value, clamped to the max.  0 when empty. */
uint64_t rnd_hist_quantile(const rnd_hist *h, double p);
/* Bucket index of v and the largest value that lands in bucket i. */
unsigned rnd_hist_index(uint64_t v);
uint64_t rnd_hist_upper(unsigned i);

/* The non-empty buckets of h for a STATS reply, at most RNP_MAX_BUCKETS
 * (into out; *n gets how many): the daemon's own buckets, or, when more are
 * non-empty, aligned runs of them merged (stats.c says how), so that every
 * bound is an exact upper bound and every count exact. */
void rnd_hist_export(const rnd_hist *h, rnp_bucket *out, uint32_t *n);

#define RND_MAX_CODE 700   /* rn_status codes are below this */

typedef struct rnd_stats {
    uint64_t start_ns;                   /* CLOCK_MONOTONIC at start */
    uint64_t requests[RN_OP_MAX + 1];    /* [0]: op unreadable or unknown */
    uint64_t errors[RND_MAX_CODE];
    uint64_t replies_ok;
    uint64_t bytes_processed;
    uint64_t sessions_total;
    uint64_t sessions_expired;
    uint64_t sessions_unauth_ended;      /* not authenticated in time, or evicted */
    uint64_t chan_auth, chan_register_fd; /* session channel messages received */
    uint64_t chan_evicted;               /* unauthenticated connections closed for a new one */
    uint64_t chan_refused;               /* connections refused at accept (every one authed) */
    uint64_t busy_rejected;
    uint64_t dup_answered;
    uint64_t clients_died;
    uint64_t front_restarts;
    uint64_t inflight_max;
    rnd_hist queue, compute, total;
    uint64_t fast_ok, fast_errors;       /* ring slots answered */
    uint64_t fast_deferred;              /* slots and replays left at a limit */
    uint64_t fast_polled;                /* slots the loop's own poll took (--ring-spin-us) */
    uint64_t fast_bells;                 /* wake-ups of the loop by a session's bell */
    uint64_t fast_prepared;              /* slots prepared while their ready word had not come */
    uint64_t fast_armed;                 /* slots taken armed (--ring-ready=armed) */
    uint64_t fast_revoked;               /* of them taken back (revoked) and taken again */
    uint64_t fast_revokes;               /* revocations (each of one ring's armed slots) */
    uint64_t fast_ready_waits;           /* slots left in the ring until their ready word
                                          * came (--ring-ready=host) */
    rnd_hist fast_queue, fast_compute, fast_total;
    rnd_hist fast_take;                  /* the loop's time taking one slot (ring.c) */
} rnd_stats;

/* The values that are read from the live state when a STATS reply is built. */
typedef struct rnd_gauges {
    uint64_t sessions_active, sessions_unauth, regions_active, inflight_current, now_ns;
    uint64_t rings_open, graphs_open;
} rnd_gauges;

void rnd_stats_init(rnd_stats *s, uint64_t now_ns);
/* Count one reply with status code (0 = success). */
void rnd_stats_reply(rnd_stats *s, int code);
void rnd_stats_request(rnd_stats *s, uint32_t op);
/* Fill out's counters and histograms (not backend/device). */
void rnd_stats_fill(const rnd_stats *s, const rnd_gauges *g, rnp_stats_rep *out);
/* Append one counter (dropped past RNP_MAX_STATS): for a backend's own,
 * rnd_backend_ops.stats. */
void rnd_stats_put(rnp_stats_rep *out, const char *name, uint64_t v);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t rnd_now_ns(void);

#endif
