/* SPDX-License-Identifier: MIT */
/*
 * request_int.h - the BWD request object (request.h has its states), shared
 * by request.c (receipt, answer, release; the nanomsg BWD) and
 * request_ring.c (ring slots as requests, the fast path).  Loop thread only.
 */
#ifndef RND_REQUEST_INT_H
#define RND_REQUEST_INT_H

#include "request.h"
#include "ring.h"

typedef enum req_state {
    REQ_RECEIVED,
    REQ_PINNED,
    REQ_SUBMITTED,
    REQ_ACKED,
    REQ_DONE,
} req_state;

typedef struct req {
    rnd_job job;                   /* the backend hands this back */
    req_state state;
    bool answered;
    bool counted;                  /* in the in-flight counts (until answered) */
    rnd_uid_load *uid_load;        /* ... and in this user's count (the session's when
                                    * counted: a session may authenticate meanwhile) */
    rnd_ctx *ctx;
    rnd_session *sess;
    void *control;                 /* the sender until the reply */
    uint64_t id, seq, digest, bytes;
    rnd_region *regs[RNP_T_COUNT];
    rn_queue dups;
    uint32_t ndups;
    rnd_running run;               /* on the session's running queue */
    rnd_ring_slot at;              /* a ring slot's (at.owner set): answered in the
                                    * ring by the backend, never by a reply */
    rnd_ring_job rj;
} req;

#define REQ_OF_JOB(j) ((req *)(void *)((char *)(j) - offsetof(req, job)))
#define REQ_OF_RUN(q) RN_QUEUE_DATA(q, req, run.link)

/* The in-flight counts (until answered) and their undoing (false: not counted). */
void rnd_req_count(req *r);
/* Which in-flight limit s is at (REQ_LIMIT_*), 0 if none; no side effect
 * (a BWD is refused at one, a ring slot waits in its ring). */
enum { REQ_LIMIT_SESSION = 1, REQ_LIMIT_TOTAL, REQ_LIMIT_UID };
int rnd_req_at_limit(const rnd_ctx *ctx, const rnd_session *s);
bool rnd_req_uncount(req *r);
/* The end of a request: references, counters, memory; once (request.h). */
void rnd_req_release(req *r);
/* Validate b against the session's regions, each looked up once and
 * referenced (PINNED); 0 or an rn_status with err. */
int rnd_req_pin(req *r, const rnp_bwd_req *b, rnp_bwd_plan *plan, rnp_error *err);
/* Hand r to the backend: on the session's running queue, counted in flight,
 * SUBMITTED.  0, or -1 with err and r back as it was (state included). */
int rnd_req_submit(req *r, rnp_error *err);
/* The wire request in the kernel's terms, pointers inside the mappings. */
void rnd_req_translate(req *r, const rnp_bwd_req *b);
/* The backend's events (backend.h). */
void rnd_req_on_acked(rnd_job *job);
void rnd_req_on_done(rnd_job *job);

#endif
