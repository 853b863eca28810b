/*
 * server.h - the daemon's state on the loop thread: the nanomsg raw REP
 * socket polled through libuv, the sessions with their regions and in-flight
 * requests, the backend, statistics, health, timers and signals.
 *
 * Everything here runs on the loop thread; backends hand completions back to
 * it, so none of these structures is locked.
 */
#ifndef RND_SERVER_H
#define RND_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "dedupe.h"
#include "rn_proto.h"
#include "stats.h"

typedef struct rnd_server rnd_server;
typedef struct rnd_session rnd_session;
typedef struct rnd_pending rnd_pending;

/* A registered region.  Tensors of in-flight requests hold references; the
 * mapping is closed when it is unlinked (UNREGISTER, session end) and its
 * last reference is gone. */
typedef struct rnd_region {
    uint32_t id;
    uint32_t refs;
    bool unlinked;
    rnd_mapping map;
    rnd_session *sess;
} rnd_region;

/* A client that arrives while the first copy of its (session, seq) runs. */
typedef struct rnd_dup {
    void *control;                 /* nanomsg header of the copy */
    uint64_t id;
    struct rnd_dup *next;
} rnd_dup;

/* A BWD request between submit and reply. */
struct rnd_pending {
    rnd_job job;                   /* first: the backend hands it back */
    rnd_server *srv;
    rnd_session *sess;
    void *control;                 /* nanomsg header of the request */
    uint64_t id, seq, recv_ns, bytes;
    rnd_region *regs[RNP_T_COUNT];
    rnd_dup *dups;
    uint32_t ndups;
    bool answered;                 /* replied already (async acknowledgement) */
    rnd_pending *prev, *next;      /* the session's running list */
};

struct rnd_session {
    rnp_session cap;               /* 128-bit capability from getrandom() */
    uint32_t pid;
    char name[RNP_MAX_NAME];
    int pidfd;                     /* -1: not watched */
    uv_poll_t pid_poll;
    bool pid_poll_init;
    void *bsess;
    rnd_region **regions;          /* linked regions, unordered */
    uint32_t nregions;
    uint64_t mapped_bytes;         /* sum of the sizes of the regions still mapped */
    uint32_t next_region_id;
    uint32_t inflight;
    rnd_pending *running;
    rnd_dedupe dedupe;
    uint64_t last_active_ns;
    bool ending;                   /* no new requests; freed at inflight == 0 */
    rnd_server *srv;
    rnd_session *prev, *next;
};

struct rnd_server {
    uv_loop_t *loop;
    rnd_config cfg;
    rnd_backend *be;
    rnd_device_info dev;
    rnp_limits limits;

    int sock;                      /* nanomsg socket, -1 when closed */
    uv_poll_t rcv_poll;
    bool rcv_poll_init;
    char sock_path[RND_SUN_PATH_MAX];
    uv_timer_t idle_timer, tick_timer, wd_timer;
    uv_signal_t sig_term, sig_int, sig_hup;
    bool handles_init;

    rnd_stats stats;
    rnd_session *sessions;
    uint32_t nsessions;            /* including ending ones */
    uint64_t regions_active;       /* open mappings */
    uint32_t inflight_total;

    bool draining, closing, failing;
    int exit_code;
    char fail_msg[RNP_REASON_LEN];
    char fallback[RNP_REASON_LEN]; /* why --backend auto is not on CUDA; "" if fine */
    uint64_t last_busy_ns;
    bool stuck_logged;
    uint64_t wd_usec;
    char last_status[128];

    uint8_t buf[RNP_MAX_MSG];      /* reply encoding */
};

/* A request older than this (receipt to now) marks the daemon failing and
 * stops the watchdog pings, so systemd restarts a wedged daemon. */
#define RND_STUCK_NS (120ull * 1000000000ull)

/*
 * Start serving: bind the socket (mode, group), install signals and timers.
 * cfg is copied; be is borrowed (the server calls its fini at shutdown).
 * Returns 0, or -1 with a one-line message in err.
 */
int rnd_server_start(rnd_server *srv, uv_loop_t *loop, const rnd_config *cfg, rnd_backend *be,
                     char *err, size_t errlen);
/* Under --backend auto, CUDA was present but its backend did not start: HEALTH
 * reports degraded with this reason.  (No CUDA device at all is not degraded.) */
void rnd_server_set_fallback(rnd_server *srv, const char *why);
/* Tell systemd (READY=1) that the daemon serves. */
void rnd_server_announce(rnd_server *srv);
/* Begin the drain (what SIGTERM does). */
void rnd_server_drain(rnd_server *srv, const char *why);
/* After uv_run returned: free what is left. */
void rnd_server_fini(rnd_server *srv);
/* The fatal-error hook handed to the backend. */
void rnd_server_fatal(void *srv, const char *msg);

/* session.c */
int rnd_session_create(rnd_server *srv, const rnp_hello_req *hello, rnd_session **out,
                       rnp_error *err);
rnd_session *rnd_session_find(rnd_server *srv, const rnp_session *cap);
void rnd_session_end(rnd_session *s, const char *why);
/* Free an ending session once its last request has been answered. */
void rnd_session_maybe_free(rnd_session *s);
rnd_region *rnd_region_find(rnd_session *s, uint32_t id);
int rnd_region_add(rnd_session *s, const rnp_register_req *req, uint32_t *id, rnp_error *err);
int rnd_region_remove(rnd_session *s, uint32_t id, rnp_error *err);
void rnd_region_unref(rnd_region *r);
/* End sessions whose client is gone, for clients without a pidfd watch. */
void rnd_sessions_check_pids(rnd_server *srv);
/* End sessions idle longer than the timeout. */
void rnd_sessions_expire(rnd_server *srv, uint64_t now_ns);

#endif
