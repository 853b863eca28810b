/*
 * backend.h - the seam between the server and the hardware: a small table of
 * functions that each backend fills in.  backend_cpu.c maps POSIX shared
 * memory and runs the CPU twin on a worker pool; backend_cuda.c (built only
 * with a CUDA Toolkit, RN_HAVE_CUDA) maps CUDA IPC memory and launches the
 * kernel.
 *
 * Threading: every function here is called on the loop thread.  A backend
 * may compute on its own threads, but it calls job->done on the loop thread
 * (uv_async_send, then the loop drains the whole completion queue).
 *
 * Lifetimes: the server opens a region once per REGISTER and closes it once,
 * after the last in-flight request that used it has completed; it closes a
 * backend session only after all its regions; it calls fini only after every
 * submitted job's done callback ran.
 */
#ifndef RND_BACKEND_H
#define RND_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rn_proto.h"
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
} rnd_device_info;

typedef struct rnd_backend_opts {
    uv_loop_t *loop;
    const char *device;                /* CUDA device: index or UUID */
    uint32_t threads;                  /* CPU workers; 0 = one per online CPU */
    uint32_t max_jobs;                 /* jobs submitted and not yet done, at most */
    /* A failure that makes the backend unusable (a sticky CUDA error).  Called
     * on the loop thread; the server stops taking work, waits for every
     * submitted job's done callback (the backend completes them, with an
     * error status), and exits 2. */
    void (*fatal)(void *ctx, const char *msg);
    void *fatal_ctx;
} rnd_backend_opts;

/* A region as a backend mapped it. */
typedef struct rnd_mapping {
    void *base;                        /* address the compute uses: host or device */
    uint64_t size;                     /* bytes usable from base */
    void *handle;                      /* the backend's own */
} rnd_mapping;

typedef void (*rnd_job_done_fn)(rnd_job *job);

/* One BWD request on its way through a backend.  The server owns the memory. */
struct rnd_job {
    /* in */
    rnk_bwd_args args;                 /* pointers already resolved into mappings */
    void *bsess;                       /* the backend's per-session state */
    int32_t ready_slot;                /* -1: nothing to wait on */
    uint32_t mode;                     /* rnp_mode */
    rnd_job_done_fn done;              /* called exactly once, on the loop thread */
    atomic_bool cancelled;             /* set when the client died: a backend may skip
                                        * the work if it has not started (status
                                        * RN_PEER_DIED; done still runs) */
    /* out: set by the backend before done */
    int status;                        /* rn_status */
    char msg[RNP_MAX_ERRMSG];          /* when status != 0 */
    int32_t done_slot;                 /* -1: none */
    bool acked;                        /* set by submit: the request may be answered
                                        * now (async: done_slot is recorded); done
                                        * still runs once the work has ended */
    uint64_t start_ns, end_ns;         /* compute began and ended, CLOCK_MONOTONIC */
    bool region_fault;                 /* a region shrank under the job: the server
                                        * drops the region holding fault_addr */
    uintptr_t fault_addr;              /* a page of the job's memory that faulted */
    /* private to the backend */
    rnd_job *next;
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
    /* The session's client is gone or said BYE; requests may still be in
     * flight (session_close follows once they are done).  NULL is fine. */
    void (*session_ending)(rnd_backend *be, void *bsess);
    /* Map a region; the error names the register.* field at fault. */
    int (*region_open)(rnd_backend *be, void *bsess, const rnp_register_req *req,
                       rnd_mapping *out, rnp_error *err);
    void (*region_close)(rnd_backend *be, void *bsess, rnd_mapping *m);
    int (*events)(rnd_backend *be, void *bsess, const rnp_events_req *req,
                  rnp_events_rep *out, rnp_error *err);
    /* 0: job->done will run exactly once, later (never from inside submit:
     * the server registers the job after submit returns).  Else an rn_status
     * with err, and done will not run.  In async mode a backend that has recorded the done
     * event sets job->acked (and done_slot, start_ns) before returning: the
     * server answers at once and done later only releases the references. */
    int (*submit)(rnd_backend *be, rnd_job *job, rnp_error *err);
    /* Append reasons (at most max) and return an rnp_health_state. */
    int (*health)(rnd_backend *be, char (*reasons)[RNP_REASON_LEN], uint32_t max,
                  uint32_t *n);
} rnd_backend_ops;

/* Each backend's state starts with this. */
struct rnd_backend {
    const rnd_backend_ops *ops;
};

extern const rnd_backend_ops rnd_backend_cpu_ops;
#ifdef RN_HAVE_CUDA
extern const rnd_backend_ops rnd_backend_cuda_ops;
#endif

#endif
