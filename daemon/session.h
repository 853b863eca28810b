/* SPDX-License-Identifier: MIT */
/*
 * session.h - client sessions and their regions.
 *
 * A session is created by HELLO (a random 128-bit capability names it), ends
 * on BYE, client exit (pidfd watch, or a once-a-second check), idle timeout,
 * the drain, the close of its session channel connection, or when it has not
 * authenticated there in time, and is freed once its last request has been
 * released.
 *
 * Authentication (chan.c): a client presents the capability on the session
 * channel, whose peer credentials the kernel vouches for; rnd_session_bind
 * then replaces HELLO's claimed pid by the verified one (the pid watch moves
 * with it), records the verified uid and counts the session against that
 * uid's quota.  Until then the session's pid is only a claim.  A region
 * is a mapping of client memory made by REGISTER; requests hold references,
 * and the mapping is closed once the region is unlinked (UNREGISTER, session
 * end) and its last reference is gone.
 *
 * session.c knows nothing of requests: a request links itself on its
 * session's `running` queue with an rnd_running node, and the table's cancel
 * hook (set by the owner) is how a dead client's requests get cancelled.
 */
#ifndef RND_SESSION_H
#define RND_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "dedupe.h"
#include "rn_proto.h"
#include "rn_queue.h"
#include "stats.h"

typedef struct rnd_session rnd_session;
typedef struct rnd_sessions rnd_sessions;
typedef struct rnd_pidwatch rnd_pidwatch;

/* How long a session may stay unauthenticated before a HELLO at the
 * max-sessions limit may take its place: far longer than a client needs
 * between its HELLO and its AUTH. */
#define RND_AUTH_GRACE_NS 1000000000ull

/* What one verified user's sessions have in flight (session.c). */
typedef struct rnd_uid_load {
    uint32_t refs;                 /* sessions that share it */
    uint32_t inflight;
} rnd_uid_load;

typedef struct rnd_region {
    uint32_t id;
    uint32_t refs;                 /* requests between validation and release, rings */
    bool unlinked;
    bool ring;                     /* holds the session's open ring (ring.c) */
    uint32_t rings;                /* rings over it not yet freed, open or closed
                                    * (a closed one may still answer its slots) */
    rnd_mapping map;
    rnd_session *sess;
} rnd_region;

/* A request on its session's running queue, oldest first. */
typedef struct rnd_running {
    rn_queue link;
    uint64_t recv_ns;
    bool ring;                     /* a ring slot's: it may wait for its client's
                                    * ready word, which says nothing of the daemon's
                                    * health (rnd_sessions_oldest skips it) */
} rnd_running;

struct rnd_session {
    rnp_session cap;               /* 128-bit capability from getrandom() */
    uint32_t pid;                  /* HELLO's claim, the verified pid once authed */
    uint32_t uid;                  /* verified; meaningful once authed */
    bool authed;                   /* bound to a session channel connection */
    void *chan;                    /* that connection (chan.c's), NULL when none */
    uint64_t created_ns;
    char name[RNP_MAX_NAME];
    rnd_pidwatch *watch;           /* NULL: not watched by pidfd */
    void *bsess;                   /* the backend's per-session state */
    rnd_region **regions;          /* linked regions, unordered */
    uint32_t nregions;
    uint64_t mapped_bytes;         /* sum of the sizes of the regions still mapped */
    uint32_t next_region_id;
    uint32_t inflight;             /* requests submitted and not yet answered */
    struct rnd_uid_load *uid_load; /* its user's in-flight count, shared by the user's
                                    * sessions (--max-inflight-per-uid); NULL: not
                                    * counted (not authenticated, root, the daemon's
                                    * own user) */
    rn_queue running;              /* rnd_running nodes: submitted, not yet released */
    rnd_dedupe dedupe;
    uint64_t last_active_ns;
    bool ending;                   /* no new requests; freed once running is empty */
    bool in_end;                   /* rnd_session_end runs: not freed under it (a request
                                    * its ring's last takes release may empty running) */
    bool gone;                     /* ended because its client is gone */
    void *ring;                    /* its open ring (ring.c), NULL when none */
    rnd_sessions *tab;
    rn_queue link;
};

struct rnd_sessions {
    uv_loop_t *loop;
    rnd_backend *be;
    const rnd_config *cfg;
    rnd_stats *stats;
    rn_queue list;
    uint32_t n;                    /* including ending ones */
    uint64_t regions_active;       /* open mappings */
    uint64_t map_budget;           /* mappings the daemon allows in all */
    uint64_t map_share;            /* ... and one client process (by pid) */
    /* The client of s died: cancel its requests (they may be skipped). */
    void (*cancel)(rnd_session *s);
    /* s, bound to a channel connection (s->chan), ends: let go of the
     * connection.  Set by the channel's owner; NULL when there is none. */
    void (*unbind)(rnd_session *s);
    /* s ends: close its ring (s->ring, maybe NULL) and settle its ring
     * jobs.  Set by the rings' owner. */
    void (*ring_end)(rnd_session *s);
    /* Whether s's ring holds calls not yet taken (their inputs are late):
     * s is not idle.  Set by the rings' owner; NULL: none. */
    bool (*ring_pending)(const rnd_session *s);
    /* s is about to map a region (a backend call that may wait for the
     * device): every armed call is taken back first (--ring-ready=armed).
     * Set by the rings' owner; NULL: none. */
    void (*before_map)(rnd_session *s);
};

/* The mapping budget comes from cfg->max_mappings, or vm.max_map_count
 * less an eighth (at least 1024) for the daemon's own mappings. */
void rnd_sessions_init(rnd_sessions *tab, uv_loop_t *loop, rnd_backend *be,
                       const rnd_config *cfg, rnd_stats *stats, void (*cancel)(rnd_session *));
/* End every session (the drain); each is freed as its last request ends. */
void rnd_sessions_end_all(rnd_sessions *tab, const char *why);
/* End sessions whose client is gone, for clients without a pidfd watch. */
void rnd_sessions_check_pids(rnd_sessions *tab);
/* End sessions idle longer than the timeout. */
void rnd_sessions_expire(rnd_sessions *tab, uint64_t now_ns);
/* End sessions that did not authenticate within cfg->auth_timeout. */
void rnd_sessions_expire_unauthenticated(rnd_sessions *tab, uint64_t now_ns);
/* At the max-sessions limit: end the oldest session that has stayed
 * unauthenticated longer than RND_AUTH_GRACE_NS, so that HELLOs nobody
 * authenticates cannot keep clients out.  Returns whether one ended. */
bool rnd_sessions_evict_unauthenticated(rnd_sessions *tab, uint64_t now_ns);
/* Sessions not (yet) authenticated, ending ones excluded. */
uint32_t rnd_sessions_unauthenticated(const rnd_sessions *tab);
/* The receipt time of the oldest request still running, 0 if none. */
uint64_t rnd_sessions_oldest(const rnd_sessions *tab);

/* HELLO.  Returns 0 or an rn_status with err. */
int rnd_session_create(rnd_sessions *tab, const rnp_hello_req *hello, rnd_session **out,
                       rnp_error *err);
/* A live (not ending) session by capability, or NULL; touches it. */
rnd_session *rnd_session_find(rnd_sessions *tab, const rnp_session *cap);
/*
 * AUTH on the session channel: bind s to connection chan and to the peer's
 * verified pid and uid (the pid watch moves to pid).  Refused when s is
 * bound already or uid is at --max-sessions-per-uid (the daemon's own uid
 * and root are not counted: they could stop the daemon anyway).  Returns 0
 * or an rn_status with err; s is unchanged on failure.
 */
int rnd_session_bind(rnd_session *s, uint32_t pid, uint32_t uid, void *chan, rnp_error *err);
void rnd_session_end(rnd_session *s, const char *why);
/* The client of s is gone (its process exited, or its session channel
 * connection closed): cancel its requests that have not started and end s. */
void rnd_session_client_gone(rnd_session *s, const char *why);
/* A request of s was released: free an ending session with none running. */
void rnd_session_maybe_free(rnd_session *s);

/* REGISTER / UNREGISTER.  err may be NULL for remove. */
int rnd_region_add(rnd_session *s, const rnp_register_req *req, uint32_t *id, rnp_error *err);
/* REGISTER_FD on the session channel: map size bytes of fd (the caller
 * keeps and closes fd), with the same limits as REGISTER. */
int rnd_region_add_fd(rnd_session *s, int fd, uint64_t size, uint32_t *id, rnp_error *err);
/* VMM_MAP on the session channel: map the n chunks the backend imported
 * (vmm_import) as one region of total bytes, with the same limits as
 * REGISTER.  Takes every chunk, whatever the outcome. */
int rnd_region_add_vmm(rnd_session *s, void **chunks, uint32_t n, uint64_t total,
                       const uint8_t uuid[RNP_UUID_BYTES], uint32_t *id, rnp_error *err);
int rnd_region_remove(rnd_session *s, uint32_t id, rnp_error *err);
void rnd_region_unref(rnd_region *r);

/* BWD results each session remembers for re-sent copies (HELLO's
 * limits.seq_window). */
static inline uint32_t rnd_seq_window(const rnd_config *cfg)
{
    return cfg->max_inflight * 2 > RNP_SEQ_WINDOW_MIN ? cfg->max_inflight * 2 : RNP_SEQ_WINDOW_MIN;
}

/* The region id of s, or NULL.  Inline: the hot path looks up each tensor's
 * region once per request. */
static inline rnd_region *rnd_region_find(const rnd_session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nregions; i++)
        if (s->regions[i]->id == id)
            return s->regions[i];
    return NULL;
}

#endif
