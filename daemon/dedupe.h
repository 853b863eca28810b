/* SPDX-License-Identifier: MIT */
/*
 * dedupe.h - the per-session window of recent BWD results, keyed by seq.
 *
 * nanomsg's REQ socket re-sends a request after a timeout or a reconnect, so
 * one (session, seq) can arrive twice.  The first copy runs; a copy that
 * arrives after it finished is answered from this window.  (A copy that
 * arrives while the first still runs waits for it: session.c tracks those.)
 * Seqs increase per session, so a seq at or below the newest one evicted
 * from the window cannot be told apart from a forgotten duplicate and is
 * refused rather than run twice.  A copy is a copy only when its body's
 * digest matches the first's; another request under a seq already used is
 * refused (RN_SEQ_REUSED), never answered with the first one's result.
 */
#ifndef RND_DEDUPE_H
#define RND_DEDUPE_H

#include <stdbool.h>
#include <stdint.h>

#include "rn_proto.h"

typedef struct rnd_result {
    uint64_t seq;
    uint64_t digest;             /* rnp_bwd_digest of the request that ran */
    int32_t status;
    char error[RNP_MAX_ERRMSG];
    rnp_bwd_rep rep;
} rnd_result;

typedef struct rnd_dedupe {
    rnd_result *ring;
    uint32_t cap, head, n;       /* head: next slot to write */
    bool evicted_any;
    uint64_t max_evicted;        /* largest seq evicted so far */
} rnd_dedupe;

enum rnd_dedupe_state { RND_SEQ_NEW = 0, RND_SEQ_DONE, RND_SEQ_TOO_OLD };

/* Returns 0 or -1 (no memory). */
int rnd_dedupe_init(rnd_dedupe *d, uint32_t cap);
void rnd_dedupe_fini(rnd_dedupe *d);          /* NULL and zeroed are fine */
/* NEW, DONE (with *out pointing at the stored result) or TOO_OLD. */
int rnd_dedupe_lookup(const rnd_dedupe *d, uint64_t seq, const rnd_result **out);
/* Store a finished result, evicting the oldest when full. */
void rnd_dedupe_put(rnd_dedupe *d, const rnd_result *r);

#endif
