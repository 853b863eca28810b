/*
 * session.h - client sessions and their regions.
 *
 * A session is created by HELLO (a random 128-bit capability names it), ends
 * on BYE, client exit (pidfd watch, or a once-a-second check), idle timeout or
 * the drain, and is freed once its last request has been released.  A region
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

typedef struct rnd_region {
    uint32_t id;
    uint32_t refs;                 /* requests between validation and release */
    bool unlinked;
    rnd_mapping map;
    rnd_session *sess;
} rnd_region;

/* A request on its session's running queue, oldest first. */
typedef struct rnd_running {
    rn_queue link;
    uint64_t recv_ns;
} rnd_running;

struct rnd_session {
    rnp_session cap;               /* 128-bit capability from getrandom() */
    uint32_t pid;
    char name[RNP_MAX_NAME];
    int pidfd;                     /* -1: not watched */
    uv_poll_t pid_poll;
    bool pid_poll_init;
    void *bsess;                   /* the backend's per-session state */
    rnd_region **regions;          /* linked regions, unordered */
    uint32_t nregions;
    uint64_t mapped_bytes;         /* sum of the sizes of the regions still mapped */
    uint32_t next_region_id;
    uint32_t inflight;             /* requests submitted and not yet answered */
    rn_queue running;              /* rnd_running nodes: submitted, not yet released */
    rnd_dedupe dedupe;
    uint64_t last_active_ns;
    bool ending;                   /* no new requests; freed once running is empty */
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
/* The receipt time of the oldest request still running, 0 if none. */
uint64_t rnd_sessions_oldest(const rnd_sessions *tab);

/* HELLO.  Returns 0 or an rn_status with err. */
int rnd_session_create(rnd_sessions *tab, const rnp_hello_req *hello, rnd_session **out,
                       rnp_error *err);
/* A live (not ending) session by capability, or NULL; touches it. */
rnd_session *rnd_session_find(rnd_sessions *tab, const rnp_session *cap);
void rnd_session_end(rnd_session *s, const char *why);
/* A request of s was released: free an ending session with none running. */
void rnd_session_maybe_free(rnd_session *s);

/* REGISTER / UNREGISTER.  err may be NULL for remove. */
int rnd_region_add(rnd_session *s, const rnp_register_req *req, uint32_t *id, rnp_error *err);
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
