/* SPDX-License-Identifier: MIT */
/*
 * daemon/cuda/ - the CUDA backend (built only with a CUDA Toolkit,
 * RN_HAVE_CUDA): one device per daemon (index or UUID), CUDA IPC memory
 * handles as regions, IPC events for the ordering between a client's stream
 * and ours, and the fused kernel (kernels/rnk.h) on a pool of streams.  It
 * fills in rnd_backend_cuda_ops (backend.h) and depends on proto/, kernels/,
 * the daemon's log.h and stats.h, the CUDA runtime and libuv.
 *
 *   backend.c   the ops table, init/fini, info, health, sessions
 *   device.c    device choice, UUIDs, sticky errors, the failed state, and
 *               the one conversion of a failed call (rn_fault) into an error
 *   mapcache.c  IPC memory mappings
 *   closer.c    released mappings and ring memory, closed on a thread of
 *               their own once their fence event has completed
 *   gate.c      the closer's gate: no close while a stream waits, late, on a
 *               client's producer
 *   vmm.c       clients' VMM ranges (cuMemCreate memory by descriptor)
 *   events.c    event pools and the per-session IPC ready/done rings
 *   submit.c    one request onto its stream
 *   complete.c  completion threads, the acked and done events, the fatal path
 *   watch.c     the deadline watch
 *   ring.c      the fast path's ring memory and its answers from the host
 *               (on unless --cuda-fast-path=no); the ring job's submission
 *               is in submit.c
 *
 * cuda_int.h - the backend's private structures and internal functions
 * (prefix rnd_cuda_).  Everything here runs on the loop thread, except the
 * completion threads (complete.c), which share with it only what b->mu
 * guards, and the closer thread (closer.c), which gets released objects
 * through b->closer and otherwise touches only what b->gate_mu guards (the
 * gate, gate.c).
 */
#ifndef RND_CUDA_INT_H
#define RND_CUDA_INT_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* After the CUDA headers, so that the CUDA check forms exist. */
#include "rn_check.h"
#include "rn_queue.h"

#include "backend.h"
#include "closeq.h"

/* Streams in the pool (and so sessions that each get a stream of their own). */
#define RND_CUDA_STREAMS 16
/* A CUDA call on the loop or the closer thread longer than this is logged
 * (one that waited for the device). */
#define RND_CUDA_SLOW_CALL_NS (10 * 1000000ull)
/* Streams of their own for rings (ownstream.c): two per ring (its slots,
 * its graph slots), after the pool in b->streams. */
#define RND_CUDA_OWN_STREAMS 256
#define RND_CUDA_MAX_STREAMS (RND_CUDA_STREAMS + RND_CUDA_OWN_STREAMS)
/* Own streams of ended sessions kept, with their threads and workspaces,
 * for the next rings (ownstream.c): a new stream's creation was seen to
 * wait 4.3 s on the loop for a late producer's GPU wait. */
#define RND_CUDA_SPARE_STREAMS 32
/* Cancel words for the fast path's sessions (ring.c); a session past them
 * runs its ring jobs without one. */
#define RND_CUDA_CANCEL_WORDS 4096
/* Released objects the closer thread holds at most; more wait in the loop's
 * backlog, which has no bound (closer.c). */
#define RND_CUDA_CLOSE_QUEUE 256
/* The gate (gate.c): a stream's wait on a client not satisfied for longer
 * than this holds closes (RMSNORMD_DEBUG_CLOSE_GATE_MS; 0: any wait). */
#define RND_CUDA_GATE_GRACE_MS 50
/* One ring job in this many that runs a kernel is timed (its start and
 * completion events with timing): a timing event costs the GPU about 2 us
 * a kernel, an event without timing nothing measurable (bench_seqwords
 * --like-daemon-mask, bench/RESULTS.md).  fast.queue and fast.compute are
 * that sample. */
#define RND_CUDA_TIME_EVERY 16
/* RMSNORMD_DEBUG_STAMPS (stamps.c): the stamp pairs kept, the last ones. */
#define RND_CUDA_STAMPS 65536
/* When the gate holds a close for an armed call's wait, no call is armed
 * for this long (gate.c's ask_revoke). */
#define RND_CUDA_NO_ARM_NS 20000000ull
/* Closes wait for a quiet moment (gate.c): nothing of ours on the GPU and
 * no submission for RND_CUDA_QUIET_NS; while the work goes on, at most
 * RND_CUDA_BUSY_DEFER_MS (RMSNORMD_DEBUG_CLOSE_DEFER_MS; 0: no wait), and
 * then for as long again whatever the work. */
#define RND_CUDA_QUIET_NS 1000000ull
#define RND_CUDA_BUSY_DEFER_MS 500
/* A gate that held closes longer than this is logged when it opens. */
#define RND_CUDA_GATE_LOG_NS (100 * 1000000ull)
/* A kernel running longer than this marks the device failing, unless
 * rnd_backend_opts.kernel_deadline_ms says otherwise. */
#define RND_CUDA_DEADLINE_MS 60000
/* How often the loop looks for sticky errors, started requests and overdue
 * kernels (at most; a quarter of a shorter deadline, at least 1 ms). */
#define RND_CUDA_WATCH_MS 200
/* Workspace each stream gets at start-up; a larger request grows it
 * (stream-ordered, so kernels already queued keep the old one). */
#define RND_CUDA_WS_M 32768
#define RND_CUDA_WS_N 8192
/* A submission slower than this is logged with where the time went. */
#define RND_CUDA_SLOW_SUBMIT_NS 2000000u
/* A ring call this long from submission to completion is logged (debug). */
#define RND_CUDA_SLOW_RING_NS 5000000u
/* fini after a failure: how long the completion threads get to return
 * before they are left to the process exit. */
#define RND_CUDA_JOIN_MS 2000

typedef struct rnd_cuda rnd_cuda;
typedef struct rnd_cuda_sess rnd_cuda_sess;
typedef struct rnd_cuda_vmm rnd_cuda_vmm;

/* Something the server released that the closer thread closes (closer.c):
 * embedded in a mapping and in a ring's memory. */
typedef struct rnd_cuda_release {
    rnd_closeq_item it;            /* b->closer */
    cudaEvent_t fence[3];          /* recorded at the release on each stream its session
                                    * uses (the pool's, its ring's own two); NULL: none
                                    * (the closer off, or no session) */
    /* Close and free the object that holds this (any thread; no b). */
    void (*close)(struct rnd_cuda_release *r);
    const char *what;              /* for the log: what close closes */
    uint64_t bytes;                /* and its size */
} rnd_cuda_release;

/* A mapped CUDA IPC allocation, or a client's VMM range (vmm.c) (rnd_mapping.handle). */
typedef struct rnd_cuda_map {
    void *dptr;
    rnd_cuda_vmm *vmm;             /* NULL: dptr is an IPC mapping */
    rnd_cuda_release rel;          /* once the server closed it */
} rnd_cuda_map;

/* One job on the GPU, from submit until its completion event fired. */
typedef struct rnd_cuda_gjob {
    rnd_job *job;                  /* NULL once its done event ran early (a failure) */
    rnd_cuda_sess *cs;             /* valid while job is */
    int stream;                    /* index into b->streams */
    int32_t done_slot;             /* async: the done event recorded; else -1 */
    uint64_t submit_ns;            /* handed to the stream */
    uint64_t start_ns;             /* the watch first saw started complete; 0: not yet */
    bool unready_warned;           /* "inputs not ready" logged (once per job) */
    bool acked;                    /* the acked event ran */
    bool in_fifo;                  /* handed to its stream's completion thread */
    bool ring_timed;               /* a timed ring job whose kernel was launched */
    bool ready_forced;             /* a cancelled ring job: the daemon wrote ready */
    bool ends_timed;               /* a ring job's started and fin time its kernel (and its
                                    * done words; one in RND_CUDA_TIME_EVERY): no t0, t1 */
    cudaEvent_t started;           /* recorded after the wait on the ready event */
    bool no_start;                 /* started not recorded: a ring job that waits for
                                    * nothing and is not timed (RMSNORMD_DEBUG_LEAN_START=1):
                                    * it starts when the jobs before it on its stream end */
    cudaEvent_t t0, t1;            /* sync mode: kernel timing; else NULL */
    cudaEvent_t fin;               /* completion, waited on by the stream's thread */
    cudaError_t err;               /* what the wait returned (under b->mu) */
    /* Its stream's wait on a client, for the gate (gate.c): a ring slot
     * (the ring's ready word >= seq) or the client's ready event; both NULL:
     * none, or it left the gate's list for good.  Set on the loop. */
    const rnd_ring_job *wait_rj;
    cudaEvent_t wait_ev;
    uint64_t wait_ns;              /* when it went on the gate's list */
    rn_queue wlink;                /* b->waits until the GPU is past the wait (b->gate_mu) */
    rn_queue link;                 /* b->outstanding, oldest first (loop thread) */
    rn_queue alink;                /* b->acked while its acked event waits (loop thread) */
    rn_queue flink;                /* its stream's FIFO, then b->completed (under b->mu) */
} rnd_cuda_gjob;

typedef struct rnd_cuda_stream {
    rnd_cuda *b;
    cudaStream_t st;
    void *ws;
    size_t ws_bytes;
    uint32_t nsess;                /* live sessions assigned to it */
    pthread_t thr;
    bool thr_started;
    pthread_cond_t cv;
    rn_queue fifo;                 /* submitted, oldest first (under b->mu) */
    bool live;                     /* st exists (the pool's always; an own one while held) */
    bool own;                      /* a ring's own stream (ownstream.c) */
    bool quit;                     /* its completion thread returns (under b->mu) */
    bool spare;                    /* an own one whose session ended, kept live for the
                                    * next ring (ownstream.c) */
    bool giveback;                 /* an own one whose session ended: its destruction and
                                    * its thread's join wait for the gate (ownstream.c) */
    uint64_t giveback_ns;          /* since when */
} rnd_cuda_stream;

struct rnd_cuda_sess {
    uint32_t id;                   /* for the log: "session #id" */
    int stream;                    /* index into the pool */
    int ring_stream;               /* its ring's own stream (ring jobs), -1: the pool's */
    int graph_stream;              /* its ring's graph slots' own stream, -1: another of
                                    * the pool's (ownstream.c) */
    bool own_tried;                /* ring setup asked for them (once) */
    uint32_t nev;                  /* events exchanged (ready and done rings) */
    cudaEvent_t ready[RNP_MAX_EVENTS];
    cudaEvent_t done[RNP_MAX_EVENTS];
    uint32_t done_next;
    uint32_t njobs;                /* submitted and not yet done */
    int32_t cancel;                /* its cancel word (ring.c), -1: none yet */
    bool ending;                   /* its client is gone or said BYE */
    rn_queue link;                 /* b->sessions */
};

/* Free events of one kind, reused from job to job. */
typedef struct rnd_cuda_evpool {
    cudaEvent_t *v;
    size_t n, cap;
    unsigned flags;                /* for cudaEventCreateWithFlags */
} rnd_cuda_evpool;

typedef CUresult (*rnd_cuda_get_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
typedef CUresult (*rnd_cuda_wait64_fn)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*rnd_cuda_write64_fn)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*rnd_cuda_batch_fn)(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,
                                      unsigned flags);

struct rnd_cuda {
    rnd_backend base;
    void (*fatal)(void *ctx, const char *msg);
    void *fatal_ctx;
    void (*revoke)(void *ctx);     /* rnd_backend_opts.revoke (ctx: fatal_ctx) */
    const uint32_t *revoked_held;  /* rnd_backend_opts.revoked_held (loop thread) */
    atomic_uint_fast64_t no_arm_until; /* the gate holds a close for armed waits: none is
                                    * armed before this (gate.c; ns) */
    atomic_bool revoke_wanted;     /* the gate found an armed wait unmet (gate.c) */

    int dev;
    struct cudaDeviceProp prop;
    bool mps;
    rnk_device *kdev;
    rnd_cuda_get_range_fn get_range;
    rnd_cuda_stream streams[RND_CUDA_MAX_STREAMS];
    int nstreams;                  /* the pool's, then own streams up to this index */

    uv_async_t async;              /* GPU completions, and a failure to report */
    uv_check_t check;              /* acked events and the fatal path, after each poll */
    uv_idle_t kick;                /* keeps the loop from sleeping while acks wait */
    uv_timer_t watch;              /* sticky errors and the deadline */
    int handles;                   /* initialised handles, for the close count */

    pthread_mutex_t mu;
    rn_queue completed;            /* completed on the GPU, for the loop (under mu) */
    bool stop;                     /* completion threads end when their FIFO is empty */
    bool gone;                     /* fini left the device to the process exit: b stays
                                    * allocated, and completion threads that may still
                                    * run no longer touch the loop (under mu) */

    rn_queue outstanding;          /* gjobs not yet done, oldest first */
    rn_queue acked;                /* gjobs whose acked event waits */
    rn_queue sessions;
    rnd_closeq closer;             /* released mappings and ring memory (closer.c) */
    uint64_t ipc_large;            /* IPC allocations over RND_CUDA_IPC_LARGE mapped (loop) */
    uint64_t remap_waits;          /* opens that waited for released mappings (loop) */
    bool closer_thread;            /* they close on the closer thread (else on the loop,
                                    * once no stream waits: RMSNORMD_DEBUG_CLOSER=0) */
    int close_fences;              /* streams a release fences: 3 (all the session's),
                                    * 1 (its pool stream), 0 (RMSNORMD_DEBUG_CLOSE_FENCE) */
    bool backlog_warned;           /* "more than RND_CUDA_CLOSE_QUEUE wait" said once */
    /* The gate (gate.c). */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;        /* closing went false */
    rn_queue waits;                /* gjobs whose stream waits on a client, oldest first */
    bool closing;                  /* a close the gate let through runs (gate_mu) */
    uint64_t gate_grace_ns;        /* a wait younger than this holds no close */
    atomic_uint busy_jobs;         /* jobs outstanding: the loop's mirror for the gate */
    atomic_uint_least64_t busy_last_ns; /* the loop's last submission */
    atomic_bool close_now;         /* a drain waits (or fini): no wait for quiet */
    uint64_t busy_defer_ns;        /* at most this long a close waits for quiet, 0: never */
    uint64_t busy_since;           /* the gate first held a close for busy work (gate_mu) */
    uint64_t busy_go_until;        /* then lets closes go until this (gate_mu), 0: not */
    uint64_t busy_held;            /* looks that did (gate_mu): closes.busy_held */
    uint32_t ngiveback;            /* own streams whose give-back waits for the gate */
    uint32_t nspare;               /* own streams kept for the next rings */
    uint32_t noutstanding, max_jobs;
    rnd_cuda_evpool fins;          /* completion events (blocking sync) */
    rnd_cuda_evpool starts;        /* start events */
    rnd_cuda_evpool timing;        /* sync mode's kernel timing pairs */
    rnd_cuda_evpool starts_timed;  /* ring jobs' start events, timing (the kernel's t0) */
    rnd_cuda_evpool fins_timed;    /* ring jobs' completion events, blocking sync and timing */
    uint32_t next_sess_id;
    uint64_t deadline_ns;          /* a kernel's, from its start */
    uint64_t watch_ms;
    uint64_t nsubmitted;           /* jobs launched so far */
    uint64_t ring_runs;            /* ring jobs given events to run (RND_CUDA_TIME_EVERY) */
    uint64_t *stamps;              /* RMSNORMD_DEBUG_STAMPS (stamps.c): NULL, or pairs of GPU
                                    * clock values, pinned and mapped ... */
    uint64_t *stamps_dev;          /* ... at this device address */
    int64_t (*stamp_shape)[2];     /* each pair's m and n */
    char *stamp_path;
    uint64_t nstamps, stamp_cur;   /* pairs taken; the current one's index */
    uint64_t slow_ring_submits;    /* ring submissions over RND_CUDA_SLOW_SUBMIT_NS not
                                    * said since the last line, at most one a second (loop) */
    uint64_t slow_ring_said_ns;
    uint32_t fail_after;           /* rnd_backend_opts.debug_fail_after */

    /* The fast path (ring.c): offered only with --cuda-fast-path on a device
     * with 64-bit stream memory operations. */
    bool rings;
    bool done_words;               /* rings may name a done word in device memory */
    rnd_cuda_wait64_fn wait64;
    rnd_cuda_write64_fn write64;
    rnd_cuda_batch_fn batch;       /* cuStreamBatchMemOp: both done words in one call */
    rn_queue hostmaps;             /* rings' memory registered with CUDA (released: closer) */
    unsigned *cancel_host;         /* cancel words (pinned, mapped): one per session */
    CUdeviceptr cancel_dev;        /* ... their device address */
    uint8_t *cancel_used;          /* which words a session holds */
    bool cancel_words;             /* kernels get theirs (off: RMSNORMD_DEBUG_CANCEL_WORD=0) */
    uint64_t *arm_host;            /* armed rings' latches {epoch, first skipped key}
                                    * (pinned, mapped; made at the first arm_open):
                                    * RND_CUDA_CANCEL_WORDS pairs */
    CUdeviceptr arm_dev;           /* ... their device address */
    uint8_t *arm_used;             /* which pairs a ring holds */
    bool kernel_done;              /* kernels write the done words (RMSNORMD_DEBUG_KERNEL_DONE=0: no) */
    bool lean_start;               /* no start event for ring jobs that wait for nothing
                                    * and are not timed (RMSNORMD_DEBUG_LEAN_START=1) */
    bool gate_ready;               /* unarmed ring kernels gated on the ring's ready word
                                    * (RMSNORMD_DEBUG_GATE_READY=1: a measurement) */

    bool failed, fatal_pending;
    char fail_msg[RNP_MAX_ERRMSG]; /* for the fatal hook; HEALTH shows the start */
};

/* device.c */
bool rnd_cuda_sticky(cudaError_t e);
void rnd_cuda_mark_failed(rnd_cuda *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int rnd_cuda_fault(rnd_cuda *b, const rn_fault *f, bool client, rnp_error *err,
                   const char *what);
int rnd_cuda_failed_err(const rnd_cuda *b, rnp_error *err, const char *op);
int rnd_cuda_same_device(const rnd_cuda *b, const uint8_t uuid[RNP_UUID_BYTES],
                         const char *field, const char *what, rnp_error *err);
int rnd_cuda_pick_device(rnd_cuda *b, const char *spec, rnp_error *err);

/* mapcache.c */
/* A CUDA IPC allocation larger than this is counted ("regions.ipc_large")
 * and the first one noted in the log: the driver's mapping of one such
 * allocation made the kernel 3 % slower on it at 768 MiB and up to 2.1x at
 * 3 GiB (bench_ipcmem, bench/RESULTS.md), where VMM memory and tensors in
 * allocations of their own ran at full speed. */
#define RND_CUDA_IPC_LARGE ((size_t)512 << 20)
/* How long a REGISTER may wait on the loop for released mappings of the
 * same memory to close (mapcache.c). */
#define RND_CUDA_REMAP_WAIT_MS 250
/* The backend's counters: the closer's (closer.c), "regions.ipc_large" and
 * "regions.remap_waits". */
void rnd_cuda_stats(rnd_backend *be, rnp_stats_rep *out);
int rnd_cuda_region_open(rnd_backend *be, void *bsess, const rnp_register_req *req,
                         rnd_mapping *out, rnp_error *err);
void rnd_cuda_region_close(rnd_backend *be, void *bsess, rnd_mapping *m);

/* closer.c: what the server released, closed off the loop thread. */
int rnd_cuda_closer_start(rnd_cuda *b, rnp_error *err);
/* r (its close set) was released by session bsess (NULL: none): its fence
 * is recorded and it goes to the closer. */
void rnd_cuda_release_later(rnd_cuda *b, void *bsess, rnd_cuda_release *r);
/* Hand the closer what waits on the loop (after each poll); with the
 * closer off, close it here once no stream waits.  On a failed device:
 * nothing more is closed. */
void rnd_cuda_flush_unmaps(rnd_cuda *b);
/* Whether a job on the GPU has not started yet (its stream waits): the
 * closes on the loop (RMSNORMD_DEBUG_CLOSER=0) wait for none, which is
 * stricter than the gate. */
bool rnd_cuda_streams_waiting(rnd_cuda *b);
/* Wait on the loop, at most timeout_ms, until nothing released waits to be
 * closed; returns whether that was reached.  For a REGISTER whose handle
 * names memory that a released mapping still holds (mapcache.c). */
bool rnd_cuda_closer_drain(rnd_cuda *b, int timeout_ms);
/* fini on an idle device: close everything released, end the thread. */
void rnd_cuda_close_unmaps(rnd_cuda *b);
/* fini otherwise: end the thread within timeout_ms; false: it was left
 * running (b must stay allocated). */
bool rnd_cuda_closer_stop(rnd_cuda *b, int timeout_ms);
/* The closes' counters for STATS (closes.*). */
void rnd_cuda_closer_stats(rnd_backend *be, rnp_stats_rep *out);

/* gate.c: the closer's gate.  init reads RMSNORMD_DEBUG_CLOSE_GATE_MS (b's
 * mutex, condition and list are set up by the caller).  add: g's stream is
 * about to wait on a client (rj: a ring slot's ready word; else ev, the
 * client's ready event), before the wait is queued (loop thread; with the
 * strict gate it waits for a close in progress to return); false, adding
 * nothing, for an armed ring job while a close runs (its wait could hold
 * the close up: the caller does not arm it).  drop: g leaves the GPU or is
 * freed (loop thread; harmless twice). */
void rnd_cuda_gate_init(rnd_cuda *b);
bool rnd_cuda_gate_add(rnd_cuda *b, rnd_cuda_gjob *g, const rnd_ring_job *rj, cudaEvent_t ev);
void rnd_cuda_gate_drop(rnd_cuda *b, rnd_cuda_gjob *g);
/* On the loop: whether no stream has waited on a client for longer than
 * the grace without the wait being satisfied, as the host sees it (the
 * ready word, the event's query); a sticky error marks the device failed
 * (false). */
bool rnd_cuda_waits_clear(rnd_cuda *b);
/* closeq's gate (ctx: b): 1 clear, and closing until leave; 0 shut; -1
 * the device failed. */
int rnd_cuda_gate_enter(void *ctx);
void rnd_cuda_gate_leave(void *ctx);
/* The own streams' give-backs that waited for the gate (ownstream.c): done
 * now if it is clear, or whatever it says when idle (fini: the device is
 * idle, the threads joined); the loop's check phase calls it. */
void rnd_cuda_own_streams_giveback(rnd_cuda *b, bool idle);

/* vmm.c */
int rnd_cuda_vmm_import(rnd_backend *be, void *bsess, int fd, uint64_t offset, uint64_t size,
                        void **chunk, rnp_error *err);
void rnd_cuda_vmm_drop(rnd_backend *be, void *chunk);
int rnd_cuda_region_open_vmm(rnd_backend *be, void *bsess, void **chunks, uint32_t n,
                             uint64_t total, const uint8_t uuid[RNP_UUID_BYTES], rnd_mapping *out,
                             rnp_error *err);
void rnd_cuda_vmm_release(rnd_cuda_vmm *v);

/* events.c */
void rnd_cuda_pool_free(rnd_cuda_evpool *p);
int rnd_cuda_gjob_events(rnd_cuda *b, rnd_cuda_gjob *g, bool sync, rnp_error *err);
int rnd_cuda_gjob_events_ring(rnd_cuda *b, rnd_cuda_gjob *g, bool run, rnp_error *err);
void rnd_cuda_gjob_free(rnd_cuda *b, rnd_cuda_gjob *g);
void rnd_cuda_sess_events_destroy(rnd_cuda_sess *cs);
int rnd_cuda_events(rnd_backend *be, void *bsess, const rnp_events_req *req,
                    rnp_events_rep *out, rnp_error *err);

/* complete.c */
int rnd_cuda_threads_start(rnd_cuda *b, rnp_error *err);
void *rnd_cuda_completion_thread(void *stream);
bool rnd_cuda_threads_stop(rnd_cuda *b, int timeout_ms);
void rnd_cuda_fifo_push(rnd_cuda *b, rnd_cuda_gjob *g);
void rnd_cuda_ack_later(rnd_cuda *b, rnd_cuda_gjob *g);
void rnd_cuda_run_fatal(rnd_cuda *b);
void rnd_cuda_on_async(uv_async_t *h);
void rnd_cuda_on_check(uv_check_t *h);
void rnd_cuda_on_idle(uv_idle_t *h);

/* ownstream.c: a stream of the ring's own, with its completion thread and
 * a workspace grown on first use; -1 from new when none can be made (the
 * caller falls back to the pool, and the reason is logged). */
int rnd_cuda_own_stream_new(rnd_cuda *b, const char *what);
/* Its session ended: it is kept, live and idle, for the next ring while
 * fewer than RND_CUDA_SPARE_STREAMS are; else its thread is told to return,
 * and the join and the CUDA calls wait until the gate is clear (never on a
 * failed device: rnd_cuda_own_streams_giveback, gate.c). */
void rnd_cuda_own_stream_free(rnd_cuda *b, int i);
/* A session's stream for ring jobs, and for graph jobs (never one of its
 * ring jobs waits on: a graph job must not queue behind a wait for ready
 * that the replay itself holds up). */
static inline int rnd_cuda_ring_stream(const rnd_cuda *b, const rnd_cuda_sess *cs)
{
    (void)b;
    return cs->ring_stream >= 0 ? cs->ring_stream : cs->stream;
}
static inline int rnd_cuda_graph_stream(const rnd_cuda *b, const rnd_cuda_sess *cs)
{
    if (cs->graph_stream >= 0)
        return cs->graph_stream;
    /* Not reached: GRAPH_OPEN is refused without a graph stream of the
     * ring's own (rnd_cuda_graphs_ok), since a pool stream may hold a
     * classic job waiting on a client's event.  Any stream but the one its
     * ring jobs wait on. */
    int r = rnd_cuda_ring_stream(b, cs);
    if (r >= RND_CUDA_STREAMS)
        return cs->stream;
    return b->nstreams > 1 ? (r + 1) % RND_CUDA_STREAMS : r;
}
/* Give session cs its ring's own streams (ring setup), once. */
void rnd_cuda_own_streams_open(rnd_cuda *b, rnd_cuda_sess *cs);
/* backend.h's graphs_ok: whether session bsess's graph replays have a
 * stream of their own (else GRAPH_OPEN is refused). */
bool rnd_cuda_graphs_ok(rnd_backend *be, void *bsess);

/* watch.c */
void rnd_cuda_on_watch(uv_timer_t *t);

/* submit.c */
int rnd_cuda_submit(rnd_backend *be, rnd_job *job, rnp_error *err);

/* ring.c: the fast path.  probe at init (want: --cuda-fast-path) decides
 * b->rings and logs why not; the rest is used only when it is set. */
void rnd_cuda_ring_probe(rnd_cuda *b, bool want);
int rnd_cuda_region_open_fd(rnd_backend *be, void *bsess, int fd, uint64_t size,
                            rnd_mapping *out, rnp_error *err);
void rnd_cuda_region_close_any(rnd_backend *be, void *bsess, rnd_mapping *m);
int rnd_cuda_device_word(rnd_backend *be, const rnd_mapping *m, uint64_t off, void **out,
                         rnp_error *err);
void rnd_cuda_ring_fini(rnd_cuda *b);
/* stamps.c: RMSNORMD_DEBUG_STAMPS (read once, at the backend's start); a
 * stamp before (after false) and after a ring job's kernel on st; at the
 * end, the file. */
void rnd_cuda_stamps_init(rnd_cuda *b);
int rnd_cuda_stamp(rnd_cuda *b, const rnd_job *job, bool after, cudaStream_t st);
void rnd_cuda_stamps_fini(rnd_cuda *b);
/* The rings' memory the server released goes to the closer with the IPC
 * mappings (one backlog): the same as rnd_cuda_flush_unmaps, kept for its
 * callers. */
void rnd_cuda_ring_flush_released(rnd_cuda *b);
/* A ring job's cancel word for the kernel (rnk_bwd_args.cancel), the
 * session's, taken at its first ring job; NULL when none is left (the job
 * then runs without one).  Released with the session. */
const unsigned *rnd_cuda_cancel_word(rnd_cuda *b, rnd_cuda_sess *cs);
void rnd_cuda_cancel_release(rnd_cuda *b, rnd_cuda_sess *cs);
/* backend.h's arm_open and arm_close: a pair of the pool, NULL when none is
 * left or the kernels do not write the done words (a shut gate skips them). */
uint64_t *rnd_cuda_arm_open(rnd_backend *be);
void rnd_cuda_arm_close(rnd_backend *be, uint64_t *words);
/* Whether the GPU's queue is at its limit (rnd_backend_queue_full). */
static inline bool rnd_cuda_queue_full(const rnd_cuda *b)
{
    return rnd_backend_queue_full(b->noutstanding, b->revoked_held, b->max_jobs);
}
/* The device address of an armed ring's word (0: the gates' latch). */
CUdeviceptr rnd_cuda_arm_dev(const rnd_cuda *b, const uint64_t *words, int which);
/* A tensor of job in a ring's host memory: RN_INVALID_ARGUMENT. */
int rnd_cuda_host_tensors(rnd_cuda *b, const rnd_job *job, rnp_error *err);
/* The device address of host pointer p in a ring's memory; 0 if none. */
CUdeviceptr rnd_cuda_ring_dev_addr(rnd_cuda *b, const void *p);
/* A ring job's completion: wake the client's threads sleeping on done. */
void rnd_cuda_ring_wake(rnd_job *job);
/* A ring job the failure path ends: its status, then done, from the host. */
void rnd_cuda_ring_answer_host(rnd_job *job);
/* Cancelled ring jobs whose ready never came: write it (ring.c's top). */
void rnd_cuda_ring_release_cancelled(rnd_cuda *b);

#endif
