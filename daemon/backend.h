/* SPDX-License-Identifier: MIT */
/*
 * backend.h - the seam between the request path and the hardware: a small
 * table of functions that each backend fills in.  backend_cpu.c maps POSIX
 * shared memory and runs the CPU twin on a worker pool; cuda/ (built only
 * with a CUDA Toolkit, RN_HAVE_CUDA) maps CUDA IPC memory and launches the
 * kernel.
 *
 * Threading: every function here is called on the loop thread, and a backend
 * calls the job's events (below) on the loop thread only, never from inside
 * a call of the server's (submit, region_close, session_close, ...): it queues
 * them and runs them from a libuv callback of its own.
 *
 * A job's two events, in this order:
 *   acked  at most once: the work is queued on the device such that the
 *          client can wait for it itself (async mode: the done event is
 *          recorded); the request is answered now.  status, done_slot and
 *          start_ns are set.  A backend that cannot acknowledge early (the
 *          CPU backend, sync mode) never calls it.
 *   done   exactly once: the work has ended (or will never run); after it the
 *          backend no longer touches the job or the memory of its regions.
 *          status, msg, start_ns and end_ns are set.  Without an earlier
 *          acked, the request is answered now; after one, a failure is the
 *          backend's to report (the client learns it on its next request).
 * The server holds every region a job uses until done: a backend closes a
 * mapping only when the server asks (region_close), never while a job that
 * uses it is between submit and done.
 *
 * Lifetimes: the server closes a backend session only after every job of
 * that session has had its done event, and calls fini only after every
 * submitted job's done event.
 */
#ifndef RND_BACKEND_H
#define RND_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rn_proto.h"
#include "rn_queue.h"
#include "rnk.h"

typedef struct rnd_backend rnd_backend;
typedef struct rnd_job rnd_job;

typedef struct rnd_device_info {
    char backend[RNP_MAX_NAME];        /* "cpu" or "cuda" */
    char device_name[RNP_MAX_NAME];
    uint8_t uuid[RNP_UUID_BYTES];      /* zero for the CPU backend */
    uint32_t sm_count;                 /* CPU: worker threads */
    uint32_t cc_major, cc_minor;
    bool mps;
    uint32_t event_slots;              /* ready/done ring size; 0 = no events */
    bool rings;                        /* runs ring jobs (the fast path, rnd_ring_job);
                                        * false: the daemon refuses RING_OPEN */
    bool done_words;                   /* writes a ring's done to a word in another
                                        * region as well (rnd_ring_job.done_dev: device
                                        * memory on the cuda backend) */
} rnd_device_info;

typedef struct rnd_backend_opts {
    uv_loop_t *loop;
    const char *device;                /* CUDA device: index or UUID */
    uint32_t threads;                  /* CPU workers; 0 = one per online CPU */
    uint32_t max_jobs;                 /* jobs submitted and not yet done, at most, not
                                        * counting the revoked_held ones */
    const uint32_t *revoked_held;      /* NULL, or the daemon's count of armed ring jobs
                                        * taken back whose done event has not run
                                        * (--ring-ready=armed): out of the limit (read on
                                        * the loop thread, in submit) */
    uint64_t kernel_deadline_ms;       /* CUDA: a kernel running longer fails the device */
    uint32_t debug_force_grid;         /* CUDA: CTAs of every launch; 0 = the plan's */
    bool cuda_fast_path;               /* CUDA: offer ring jobs (the fast path) where the
                                        * device has 64-bit stream memory operations */
    uint32_t debug_fail_after;         /* debugging: the Nth submitted job fails the
                                        * backend (0 = never); see rmsnormd(8) */
    /* A failure that makes the backend unusable (a sticky CUDA error).  Called
     * on the loop thread, outside the server's calls, after the backend has
     * given every submitted job its done event (status RN_DEVICE_FAILING);
     * the server stops taking work, answers what is left and exits 2. */
    void (*fatal)(void *ctx, const char *msg);
    void *fatal_ctx;
    /* The backend wants the armed calls taken back (--ring-ready=armed): a
     * close of its, which waits for the device, would wait for their
     * inputs (the cuda backend's gate).  Called on the loop thread; NULL is
     * fine.  ctx: fatal_ctx. */
    void (*revoke)(void *ctx);
} rnd_backend_opts;

/* A region as a backend mapped it. */
typedef struct rnd_mapping {
    void *base;                        /* address the compute uses: host or device */
    uint64_t size;                     /* bytes usable from base */
    void *handle;                      /* the backend's own */
    bool lost;                         /* set by the backend (loop thread, before a
                                        * job's done): the memory behind it is gone
                                        * (the client shrank it); the server drops
                                        * the region */
} rnd_mapping;

typedef void (*rnd_job_event_fn)(rnd_job *job);

/*
 * A job from a session's ring (the fast path, daemon/ring.c; PROTOCOL.md
 * section 13).  A backend runs the ring jobs of one session in the order
 * they were submitted, each after the previous one ended, as a stream does,
 * and for each:
 *   - waits until the ring's ready word reaches seq before it reads any
 *     input (rnd_ring_ready, ring_io.h); a job with status set, a cancelled
 *     and an abandoned one need not wait;
 *   - computes, unless status is set (an invalid slot: the status and msg
 *     are its answer), the job was cancelled, or it was abandoned (the
 *     drain, the end of its session) while its input was not ready: then
 *     the abandon status is its answer;
 *   - then writes the job's status and message into the slot, seq into the
 *     done word with release ordering, and wakes the client's sleepers
 *     (rnd_ring_answer); a cancelled job (its client died) writes nothing.
 * Then the job's done event runs as for any job.  The server keeps the
 * ring's memory mapped until every ring job's done event.
 *
 * An armed job (arm_key nonzero; --ring-ready=armed, ring_arm.c) was taken
 * before its ready word came, from a ring whose client's stream writes the
 * go word after ready (RING_OPEN's go; PROTOCOL.md 13.3).  It waits until
 * the ready word, the daemon's bit RNP_RING_READY_RAISED included, reaches
 * arm_key (rnd_ring_wait_met: a stream wait's cyclic compare), and then
 * runs as above only if its gate is open (rnd_ring_gate_open, ring_io.h):
 * the client's ready, the bit left out, reached arm_key, and no earlier job
 * of its arm_epoch found its own gate shut.  A shut gate
 * latches (the backend's words: arm[1] = arm_key, arm[0] = arm_epoch), so
 * that once one job skipped, every later one of its epoch skips too (and
 * arm[1] says which skipped first): done never passes a
 * slot that did not run.  A job that finds its gate shut does nothing at
 * all: no input read, no status, no done word, no wake-up; the backend
 * sets skipped before its done event.  The daemon sets its bit itself to
 * end the waits (a revocation, ring_arm.c): it marks the jobs revoked
 * first, then sets the bit, so a revoked job whose gate is shut was taken
 * back (the daemon takes its slot again: rnd_ring_taken_back); one that
 * found its gate open ran and is answered as any other.  A skip that was
 * not revoked is the client's error (its ready word went back below the
 * call after the wait saw it, or carried the daemon's bit): the backend
 * answers it
 * with RN_INVALID_ARGUMENT, status and done from the host.  Abandon does
 * not apply to an armed job (the daemon revokes it instead); a cancelled
 * one writes nothing either way.
 */
typedef struct rnd_ring_job {
    void *ring;                        /* the ring's header, in the daemon's mapping */
    uint8_t *slot;                     /* the job's slot in that mapping */
    uint64_t seq;
    int status;                        /* nonzero: nothing to compute; answer this */
    char msg[RNP_MAX_ERRMSG];
    bool graph;                        /* a graph slot's replay (PROTOCOL.md 13.8): slot
                                        * is the graph slot, seq its generation; its
                                        * input is ready (the daemon saw gen move), and
                                        * its answer is an error (if any: the slot's
                                        * result and fails) then done = 1 in the graph
                                        * slot.  It does not wait behind the ring's
                                        * slots (a replay may hold up their ready). */
    void *done_dev;                    /* NULL, or the ring's done word in device memory
                                        * (the client's region, the daemon's mapping): done
                                        * is written there too, after the ring's (before
                                        * it by a kernel that ran: rnk.h) */
    bool ready_seen;                   /* the ring's ready word had reached seq before the
                                        * job was taken (--ring-ready=host): its input is
                                        * ready, no stream waits for it */
    bool force;                        /* taken as its session ends: past the backend's
                                        * queue limit too, since nothing would take it
                                        * again (at most a ring's worth of slots, answered
                                        * without running) */
    atomic_int abandon;                /* nonzero: the status to answer, without
                                        * waiting, if the input is not ready yet
                                        * (RN_DRAINING, RN_UNKNOWN_SESSION) */
    uint64_t *arm;                     /* armed: the ring's backend words (arm_open):
                                        * arm[0..1] the gate's latch */
    uint64_t arm_key;                  /* 0: not armed; else its key (the seq) */
    uint64_t arm_epoch;                /* armed: the ring's arming epoch (nonzero) */
    atomic_bool revoked;               /* set by the loop when it takes the ring's armed
                                        * calls back, before it sets its bit */
    atomic_bool skipped;               /* set by the backend before the done event: the
                                        * armed job found its gate shut and did nothing */
} rnd_ring_job;

/* The answer of an armed job that skipped without a revocation (both
 * backends; PROTOCOL.md 13.3 names it). */
#define RND_READY_BACK_MSG \
    "bwd: the ring's ready word was below this call after its wait ended (PROTOCOL.md 13.3: " \
    "ready only grows, and its bit 62 is the daemon's)"

/* Whether a ring job was taken back: revoked, and it found its gate shut
 * (its done event answers nothing; the daemon takes the slot again). */
static inline bool rnd_ring_taken_back(const rnd_ring_job *rj)
{
    return atomic_load(&rj->revoked) && atomic_load(&rj->skipped);
}

/* One BWD request on its way through a backend.  The server owns the memory. */
struct rnd_job {
    /* in */
    rnk_bwd_args args;                 /* pointers already resolved into mappings */
    rnd_mapping *maps[RNP_T_COUNT];    /* the mapping of each tensor; NULL: absent */
    void *bsess;                       /* the backend's per-session state */
    int32_t ready_slot;                /* -1: nothing to wait on */
    uint32_t mode;                     /* rnp_mode */
    rnd_job_event_fn acked;            /* see the top of this file */
    rnd_job_event_fn done;
    rnd_ring_job *ring;                /* NULL: a nanomsg BWD (backend.h above) */
    atomic_bool cancelled;             /* set when the client died: a backend may skip
                                        * the work if it has not started (status
                                        * RN_PEER_DIED; done still runs) */
    /* out: set by the backend before each event */
    int status;                        /* rn_status */
    char msg[RNP_MAX_ERRMSG];          /* when status != 0 */
    int32_t done_slot;                 /* -1: none */
    uint64_t start_ns, end_ns;         /* compute began and ended, CLOCK_MONOTONIC;
                                        * at acked: both the acknowledgement time;
                                        * a ring job's end_ns 0: not timed */
    /* private to the backend */
    void *priv;
    rn_queue link;
};

typedef struct rnd_backend_ops {
    const char *name;
    /* Returns 0 or an rn_status (RN_NO_CUDA: no usable device, so that
     * --backend auto falls back) with err. */
    int (*init)(const rnd_backend_opts *o, rnd_backend **out, rnp_error *err);
    /* Release everything; closes its libuv handles, so the loop must run
     * once more afterwards.  NULL is fine. */
    void (*fini)(rnd_backend *be);
    void (*info)(rnd_backend *be, rnd_device_info *out);
    int (*session_open)(rnd_backend *be, void **bsess, rnp_error *err);
    void (*session_close)(rnd_backend *be, void *bsess);     /* NULL is fine */
    /* The session's client is gone or said BYE; jobs may still be in
     * flight (session_close follows once they are done).  NULL is fine. */
    void (*session_ending)(rnd_backend *be, void *bsess);
    /* Map a region; the error names the register.* field at fault. */
    int (*region_open)(rnd_backend *be, void *bsess, const rnp_register_req *req,
                       rnd_mapping *out, rnp_error *err);
    /* Map size bytes of the descriptor fd a client passed on the session
     * channel (the CPU backend: a regular file or memfd, at least size
     * bytes).  fd stays the caller's (it closes it).  The error names the
     * register_fd.* field at fault; RN_UNSUPPORTED where the backend's
     * memory comes another way (CUDA: IPC handles over nanomsg). */
    int (*region_open_fd)(rnd_backend *be, void *bsess, int fd, uint64_t size, rnd_mapping *out,
                          rnp_error *err);
    /*
     * CUDA virtual memory ranges (VMM_CHUNK and VMM_MAP on the session
     * channel, PROTOCOL.md section 12); the three are NULL where the backend
     * has none (the core answers RN_UNSUPPORTED).  vmm_import imports the
     * physical allocation behind the descriptor fd (fd stays the caller's),
     * a chunk of size bytes at offset in its range, and checks both against
     * the allocation's own properties; the error names the vmm_chunk.*
     * field at fault.  The chunk (*chunk) is the caller's until it hands it
     * to vmm_drop or region_open_vmm.  region_open_vmm maps n chunks, in
     * order, into one range of total bytes for the device of uuid; it takes
     * every chunk (and sets chunks[i] to NULL), whatever it answers (the
     * error names vmm_map.*), and the
     * region closes by region_close as any other.
     */
    int (*vmm_import)(rnd_backend *be, void *bsess, int fd, uint64_t offset, uint64_t size,
                      void **chunk, rnp_error *err);
    void (*vmm_drop)(rnd_backend *be, void *chunk);
    int (*region_open_vmm)(rnd_backend *be, void *bsess, void **chunks, uint32_t n,
                           uint64_t total, const uint8_t uuid[RNP_UUID_BYTES], rnd_mapping *out,
                           rnp_error *err);
    /* No job that uses m is between submit and done. */
    void (*region_close)(rnd_backend *be, void *bsess, rnd_mapping *m);
    /* A ring's done word at off in m (RING_OPEN's done_region, aligned and
     * in bounds): its address for rnd_ring_job.done_dev, or an rn_status
     * naming ring_open.done_region (on the cuda backend: not device
     * memory).  NULL: the backend has no done words (info's done_words
     * false). */
    int (*device_word)(rnd_backend *be, const rnd_mapping *m, uint64_t off, void **out,
                       rnp_error *err);
    int (*events)(rnd_backend *be, void *bsess, const rnp_events_req *req,
                  rnp_events_rep *out, rnp_error *err);
    /* 0: the job's events will run as described above, later (never from
     * inside submit).  Else an rn_status with err, and no event runs. */
    int (*submit)(rnd_backend *be, rnd_job *job, rnp_error *err);
    /* Whether graph replays (rnd_ring_job.graph) of session bsess run where
     * no job waits for a client's producer: a replay must not queue behind
     * a wait for a ready word that the replay itself holds up on the
     * client's stream (PROTOCOL.md 13.8).  The server refuses GRAPH_OPEN
     * where not.  NULL: always (the CPU backend runs replays from its
     * unordered queue). */
    bool (*graphs_ok)(rnd_backend *be, void *bsess);
    /* The armed calls (--ring-ready=armed, rnd_ring_job.arm): a ring's two
     * words, zeroed, in memory this backend's jobs read and write (the
     * gate's latch; the cuda backend: pinned host memory mapped for the
     * device), or NULL where it has none left (the ring then runs in host
     * mode);
     * arm_close takes them back once no job of the ring is left.  NULL
     * ops: the backend has none. */
    uint64_t *(*arm_open)(rnd_backend *be);
    void (*arm_close)(rnd_backend *be, uint64_t *words);
    /* Append reasons (at most max) and return an rnp_health_state. */
    int (*health)(rnd_backend *be, char (*reasons)[RNP_REASON_LEN], uint32_t max,
                  uint32_t *n);
    /* Append the backend's own counters to a STATS reply (rnd_stats_put,
     * stats.h), after the server's.  NULL is fine. */
    void (*stats)(rnd_backend *be, rnp_stats_rep *out);
} rnd_backend_ops;

/* The rn_status of a kernel library result (rnk_status): the one mapping
 * between the two, for both backends. */
static inline int rnd_status_of_rnk(int krc)
{
    switch (krc) {
    case RNK_OK: return RN_OK;
    case RNK_EINVAL: return RN_INVALID_ARGUMENT;
    case RNK_ENOMEM: return RN_NOMEM;
    case RNK_ECUDA: return RN_CUDA;
    }
    return RN_INTERNAL;
}

/* Whether a backend's queue of used jobs is at max, the taken-back ones
 * (rnd_backend_opts.revoked_held, NULL: none) left out. */
static inline bool rnd_backend_queue_full(uint32_t used, const uint32_t *revoked_held,
                                          uint32_t max)
{
    uint32_t held = revoked_held ? *revoked_held : 0;
    return (used > held ? used - held : 0) >= max;
}

/* A backend's submit may refuse an armed ring job (rnd_ring_job.arm_key)
 * with this code before it queued anything: the job cannot be gated (it
 * runs no kernel that writes done).  The daemon then takes the slot again
 * unarmed.  Never sent to a client. */
#define RND_UNARMABLE 1000

/* Each backend's state starts with this. */
struct rnd_backend {
    const rnd_backend_ops *ops;
};

extern const rnd_backend_ops rnd_backend_cpu_ops;
#ifdef RN_HAVE_CUDA
extern const rnd_backend_ops rnd_backend_cuda_ops;
#endif

#endif
