/*
 * backend_cuda.c - the CUDA backend (built only with a CUDA Toolkit,
 * RN_HAVE_CUDA): one device per daemon (index or UUID), CUDA IPC memory
 * handles as regions, IPC events for the ordering between a client's stream
 * and ours, and the fused kernel (kernels/rnk.h) on a pool of streams.
 *
 * Streams: a fixed pool of RND_CUDA_STREAMS non-blocking streams, created at
 * init, each with its own kernel workspace.  A new session takes the stream
 * that the fewest live sessions use, so as long as there are no more
 * sessions than streams every session has a stream of its own and one
 * client's unready inputs (its ready event) never hold up another client's
 * work.  Past that, sessions share streams: still correct, but a client that
 * is slow to produce its inputs then delays the others on its stream.
 *
 * One request: wait on the client's ready event, record a start event,
 * launch, record a done event of the session's ring, record a completion
 * event.  Async mode is answered right after the records (the client waits
 * on the done event on its own stream), so the reply never waits for the
 * GPU; sync mode is answered at completion, with the kernel time from a pair
 * of timing events.  Start and completion events come from pools of
 * timing-disabled events, reused, so a request creates none once the pools
 * have grown to the number of requests in flight.
 *
 * Completion: one thread per stream waits (cudaEventSynchronize, blocking
 * sync) on the completion events of its stream in order, queues each
 * finished request and wakes the loop with uv_async_send; the loop drains the
 * whole queue.  Not cudaLaunchHostFunc: a host function holds its stream
 * until the callback has run, which put the callback's latency (tens of us)
 * between one request's kernel and the next on the GPU.
 *
 * Because async requests are answered before their kernel ends, the server
 * may close a region while a kernel that reads it still runs.  So the
 * backend counts, per session, the requests submitted to the GPU and those
 * completed there, and defers cudaIpcCloseMemHandle until every request
 * submitted before the close has completed; a session's events are likewise
 * freed only after its last kernel.  The close itself waits further, until
 * no stream waits on a client (flush_unmaps): it blocks the calling thread
 * while the device is busy.
 *
 * The deadline (RMSNORMD_KERNEL_DEADLINE_MS, default 60 s) is a kernel's:
 * a timer on the loop (every RND_CUDA_WATCH_MS, or a quarter of the deadline
 * when that is shorter) polls, with cudaEventQuery only, the start event of
 * every request that has not started yet, and takes the host time at which
 * it first sees the event complete as the request's start.  The start event
 * completes once the client's inputs are ready and the work queued before on
 * the stream has ended, so from then on the stream runs our kernel (or waits
 * for SMs that other work holds).  A request that has started longer than
 * the deadline ago marks the backend failed (below).  A request whose inputs
 * are still not ready a deadline after its submission only logs a warning,
 * once, naming its session and stream, and goes on waiting: a slow or
 * stalled client holds up its own stream (and sessions sharing it), never
 * the daemon.  Unless its session has ended (the client died or said BYE):
 * then the ready event may never come and the stream would stay blocked for
 * the sessions that share it later, so that marks the backend failed.
 *
 * Failures: a sticky CUDA error (the context is unusable), or a kernel
 * running past the deadline, marks the backend failed: every request still
 * waiting for the GPU is answered RN_DEVICE_FAILING, HEALTH reports failing,
 * and the server's fatal hook drains and exits with status 2 for systemd to
 * restart.
 *
 * Debugging: RMSNORMD_DEBUG_FORCE_GRID=N (read at init) makes every launch
 * use N CTAs (rnk_cuda_force_grid): same results, bit for bit, but with a
 * small N a large request runs for long, which the GPU tests use to reach
 * the deadline.
 */
#include "backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "stats.h"

/* Streams in the pool (and so sessions that each get a stream of their own). */
#define RND_CUDA_STREAMS 16
/* A kernel running longer than this marks the device failing. */
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

typedef struct cuda_backend cuda_backend;
typedef struct csess csess;
typedef struct cstream cstream;

/* A mapped CUDA IPC allocation (rnd_mapping.handle). */
typedef struct cmap {
    void *dptr;
    uint64_t ticket;               /* close once the session completed this many */
    struct cmap *next;             /* the session's deferred closes */
} cmap;

/* One request on the GPU, from submit until its completion event fired. */
typedef struct gjob {
    rnd_job *job;                  /* sync: answered at completion; async: NULL */
    csess *cs;
    uint64_t submit_ns;            /* handed to the stream */
    uint64_t start_ns;             /* the watch first saw started complete; 0: not yet */
    bool unready_warned;           /* "inputs not ready" logged (once per request) */
    cudaEvent_t started;           /* recorded after the wait on the ready event */
    cudaEvent_t t0, t1;            /* sync mode: kernel timing; else NULL */
    cudaEvent_t fin;               /* completion, waited on by the stream's thread */
    cudaError_t err;               /* what the wait returned */
    struct gjob *prev, *next;      /* outstanding list, oldest first (loop thread) */
    struct gjob *fnext;            /* the stream's FIFO (under mu) */
    struct gjob *qnext;            /* completion queue (under mu) */
} gjob;

struct cstream {
    cuda_backend *b;
    int idx;
    cudaStream_t st;
    void *ws;
    size_t ws_bytes;
    uint32_t nsess;                /* live sessions assigned to it */
    pthread_t thr;
    bool thr_started;
    pthread_cond_t cv;
    gjob *fh, *ft;                 /* submitted, oldest first (under mu) */
};

struct csess {
    cuda_backend *b;
    uint32_t id;                   /* for the log: "session #id" */
    int stream;                    /* index into the pool */
    uint32_t nev;                  /* events exchanged (ready and done rings) */
    cudaEvent_t ready[RNP_MAX_EVENTS];
    cudaEvent_t done[RNP_MAX_EVENTS];
    uint32_t done_next;
    uint64_t submitted, completed; /* requests handed to / finished on the GPU */
    cmap *closes;                  /* mappings waiting for their last kernel */
    bool closed;                   /* the server is done with it */
    bool ending;                   /* its client is gone or said BYE (set before closed) */
    csess *prev, *next;            /* all sessions, for fini */
};

typedef struct tpair {
    cudaEvent_t t0, t1;
    struct tpair *next;
} tpair;

/* Free events of one kind, reused from request to request. */
typedef struct evpool {
    cudaEvent_t *v;
    size_t n, cap;
    unsigned flags;                /* for cudaEventCreateWithFlags */
} evpool;

typedef CUresult (*pfn_get_range)(CUdeviceptr *base, size_t *size, CUdeviceptr p);

struct cuda_backend {
    rnd_backend base;
    uv_loop_t *loop;
    void (*fatal)(void *ctx, const char *msg);
    void *fatal_ctx;

    int dev;
    struct cudaDeviceProp prop;
    bool mps;
    rnk_device *kdev;
    pfn_get_range get_range;
    cstream streams[RND_CUDA_STREAMS];
    int nstreams;

    uv_async_t async;              /* GPU completions */
    uv_check_t check;              /* async answers and the fatal hook, after each poll */
    uv_timer_t watch;              /* sticky errors and the deadline */
    int handles;                   /* initialised handles, for the close count */

    pthread_mutex_t mu;
    gjob *qhead, *qtail;           /* completed on the GPU, for the loop */
    bool stop;                     /* completion threads end when their FIFO is empty */
    bool gone;                     /* fini ran on a failed device: the completion
                                    * threads must not touch the loop any more */

    rnd_job *answers, *answers_tail;  /* async jobs to answer (loop thread) */
    gjob *outstanding, *outstanding_tail;  /* on the GPU, oldest first (loop thread) */
    uint32_t noutstanding, max_jobs;
    tpair *tfree;                  /* timing event pairs */
    evpool fins;                   /* completion events (blocking sync) */
    evpool starts;                 /* start events */
    csess *sessions;
    cmap *unmaps;                  /* mappings to close once no stream waits (loop thread) */
    uint32_t next_sess_id;
    uint64_t deadline_ns;          /* a kernel's, from its start */
    uint64_t watch_ms;

    bool failed, fatal_pending;
    char fail_msg[RNP_REASON_LEN];
};

/* ---- errors ----------------------------------------------------------------------------- */

/* Errors after which the context cannot be used again. */
static bool sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsRpcFailure:
    case cudaErrorMpsServerNotReady:
    case cudaErrorMpsClientTerminated:
    case cudaErrorCudartUnloading:
        return true;
    default:
        return false;
    }
}

/* Mark the backend failed; the loop answers what waits and calls the fatal
 * hook at its next check (never from inside a call of the server's, which
 * may be iterating over the state that the drain frees). */
static void mark_failed(cuda_backend *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mark_failed(cuda_backend *b, const char *fmt, ...)
{
    va_list ap;

    if (b->failed)
        return;
    b->failed = true;
    b->fatal_pending = true;
    va_start(ap, fmt);
    vsnprintf(b->fail_msg, sizeof b->fail_msg, fmt, ap);
    va_end(ap);
    if (b->handles)   /* before init finished there is no loop to wake */
        uv_async_send(&b->async);
}

static const char *base_name(const char *file)
{
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

/*
 * Turn a failed CUDA call into err (RN_CUDA, RN_NOMEM for an allocation,
 * RN_DEVICE_FAILING for a sticky error, which also marks the backend failed)
 * with "what: file:line: call: error", and clear a non-sticky error so the
 * next call starts clean.
 */
static int cuda_err(cuda_backend *b, rnp_error *err, cudaError_t e, const char *file, int line,
                    const char *call, const char *what)
{
    int code = e == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA;

    (void)cudaGetLastError();
    if (sticky(e)) {
        code = RN_DEVICE_FAILING;
        if (b)
            mark_failed(b, "%s:%d: %s: %s", base_name(file), line, call, cudaGetErrorString(e));
    }
    return rnp_fail(err, code, "%s: %s:%d: %s: %s", what, base_name(file), line, call,
                    cudaGetErrorString(e));
}

/*
 * The failure of a call whose input comes from a client (an IPC handle) is
 * the client's unless the context itself is broken, which a query of one of
 * our own streams tells: a stale or forged handle can make the driver answer
 * cudaErrorUnknown, and that must not take the daemon down for every client.
 */
static int client_cuda_err(cuda_backend *b, rnp_error *err, cudaError_t e, const char *file,
                           int line, const char *call, const char *what)
{
    (void)cudaGetLastError();
    if (sticky(e) && b->nstreams > 0) {
        cudaError_t p = cudaStreamQuery(b->streams[0].st);
        (void)cudaGetLastError();
        if (p != cudaSuccess && p != cudaErrorNotReady && sticky(p))
            return cuda_err(b, err, p, file, line, call, what);
    }
    return rnp_fail(err, e == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA, "%s: %s:%d: %s: %s",
                    what, base_name(file), line, call, cudaGetErrorString(e));
}

/* CU for calls on a client's input: see client_cuda_err. */
#define CU_CLIENT(call, what, label)                                                    \
    do {                                                                                \
        cudaError_t cu_e_ = (call);                                                     \
        if (cu_e_ != cudaSuccess) {                                                     \
            rc = client_cuda_err(b, err, cu_e_, __FILE__, __LINE__, #call, what);       \
            goto label;                                                                 \
        }                                                                               \
    } while (0)

/* Check a CUDA call: on failure set rc and err, and go to the cleanup label. */
#define CU(call, what, label)                                                           \
    do {                                                                                \
        cudaError_t cu_e_ = (call);                                                     \
        if (cu_e_ != cudaSuccess) {                                                     \
            rc = cuda_err(b, err, cu_e_, __FILE__, __LINE__, #call, what);              \
            goto label;                                                                 \
        }                                                                               \
    } while (0)

/* ---- device choice ------------------------------------------------------------------------ */

static void uuid_str(const uint8_t u[16], char out[41])
{
    static const int dash[] = {4, 6, 8, 10};
    char *p = out + sprintf(out, "GPU-");
    for (int i = 0, d = 0; i < 16; i++) {
        if (d < 4 && i == dash[d]) {
            *p++ = '-';
            d++;
        }
        p += sprintf(p, "%02x", u[i]);
    }
    *p = '\0';
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as nvidia-smi -L prints it). */
static bool parse_uuid(const char *s, uint8_t out[16])
{
    int nib = 0;
    if (strncmp(s, "GPU-", 4) != 0)
        return false;
    memset(out, 0, 16);
    for (s += 4; *s; s++) {
        int v;
        if (*s == '-')
            continue;
        if (*s >= '0' && *s <= '9')
            v = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            v = *s - 'a' + 10;
        else if (*s >= 'A' && *s <= 'F')
            v = *s - 'A' + 10;
        else
            return false;
        if (nib >= 32)
            return false;
        out[nib / 2] |= (uint8_t)(nib % 2 ? v : v << 4);
        nib++;
    }
    return nib == 32;
}

static int pick_device(cuda_backend *b, const char *spec, rnp_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return rnp_fail(err, RN_NO_CUDA, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    }
    if (n == 0)
        return rnp_fail(err, RN_NO_CUDA, "no CUDA device");
    if (!spec || !*spec)
        spec = "0";
    if (strncmp(spec, "GPU-", 4) == 0) {
        uint8_t want[16];
        if (!parse_uuid(spec, want))
            return rnp_fail(err, RN_INVALID_ARGUMENT,
                            "device: '%.60s' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                            "xxxxxxxxxxxx)", spec);
        for (int i = 0; i < n; i++) {
            struct cudaDeviceProp p;
            if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
                continue;
            if (memcmp(p.uuid.bytes, want, 16) == 0) {
                b->dev = i;
                b->prop = p;
                return 0;
            }
        }
        (void)cudaGetLastError();
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "device: no visible CUDA device has UUID %.60s (%d devices; "
                        "CUDA_VISIBLE_DEVICES may hide it)", spec, n);
    }
    char *end;
    errno = 0;
    long idx = strtol(spec, &end, 10);
    if (errno || *end || idx < 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "device: expected an index or a UUID, got '%.60s'",
                        spec);
    if (idx >= n)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "device: index %ld, but %d CUDA device%s visible",
                        idx, n, n == 1 ? " is" : "s are");
    b->dev = (int)idx;
    e = cudaGetDeviceProperties(&b->prop, b->dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return rnp_fail(err, RN_CUDA, "device %d: cudaGetDeviceProperties: %s", b->dev,
                        cudaGetErrorString(e));
    }
    return 0;
}

/* ---- completion ----------------------------------------------------------------------------- */

/* One per stream: wait for its requests in order, hand each to the loop. */
static void *completion_thread(void *arg)
{
    cstream *s = arg;
    cuda_backend *b = s->b;

    (void)cudaSetDevice(b->dev);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!s->fh && !b->stop)
            pthread_cond_wait(&s->cv, &b->mu);
        if (!s->fh)
            break;
        gjob *g = s->fh;
        pthread_mutex_unlock(&b->mu);
        cudaError_t e = cudaEventSynchronize(g->fin);
        pthread_mutex_lock(&b->mu);
        s->fh = g->fnext;
        if (!s->fh)
            s->ft = NULL;
        if (b->gone)
            continue;   /* a failed device: nobody takes it any more */
        g->err = e;
        g->qnext = NULL;
        if (b->qtail)
            b->qtail->qnext = g;
        else
            b->qhead = g;
        b->qtail = g;
        uv_async_send(&b->async);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void close_mapping(cmap *m)
{
    (void)cudaIpcCloseMemHandle(m->dptr);
    (void)cudaGetLastError();
    free(m);
}

static void destroy_events(csess *cs)
{
    for (uint32_t i = 0; i < cs->nev; i++) {
        if (cs->ready[i])
            cudaEventDestroy(cs->ready[i]);
        if (cs->done[i])
            cudaEventDestroy(cs->done[i]);
        cs->ready[i] = cs->done[i] = NULL;
    }
    cs->nev = 0;
    (void)cudaGetLastError();
}

/*
 * Whether a request on the GPU has not started yet: its stream still waits,
 * on a client's ready event or on the request before it.  Queries only; a
 * start seen here counts for the deadline too.
 */
static bool streams_waiting(cuda_backend *b)
{
    for (gjob *g = b->outstanding; g; g = g->next) {
        if (g->start_ns)
            continue;
        cudaError_t e = cudaEventQuery(g->started);
        if (e != cudaSuccess) {
            if (e != cudaErrorNotReady)
                (void)cudaGetLastError(); /* the watch reports it */
            return true;
        }
        g->start_ns = rnd_now_ns();
    }
    return false;
}

/*
 * Unmap what sess_settle released, unless a stream waits: closing an IPC
 * mapping waits for the device (seen on the H200, with and without MPS: a
 * session's close stalled the loop until another client's late inputs came,
 * 3 s in the test), so while one client's inputs are not ready the closes
 * wait here instead, and the loop keeps serving.  The mappings stay open
 * that much longer; nothing reads them any more.
 */
static void close_unmaps(cuda_backend *b)
{
    while (b->unmaps) {
        cmap *m = b->unmaps;
        b->unmaps = m->next;
        close_mapping(m);
    }
}

static void flush_unmaps(cuda_backend *b)
{
    if (!b->unmaps || b->failed || streams_waiting(b))
        return;   /* (a failed device: the process exits, which unmaps) */
    close_unmaps(b);
}

/* Release the mappings whose last kernel has ended (flush_unmaps closes
 * them); free a closed session once its last kernel has ended. */
static void sess_settle(csess *cs)
{
    cuda_backend *b = cs->b;
    cmap **pp = &cs->closes;
    bool released = false;

    while (*pp) {
        cmap *m = *pp;
        if (m->ticket <= cs->completed) {
            *pp = m->next;
            m->next = b->unmaps;
            b->unmaps = m;
            released = true;
        } else {
            pp = &m->next;
        }
    }
    if (released)
        flush_unmaps(b);
    if (!cs->closed || cs->completed < cs->submitted || cs->closes)
        return;
    destroy_events(cs);
    b->streams[cs->stream].nsess--;
    if (cs->prev)
        cs->prev->next = cs->next;
    else
        b->sessions = cs->next;
    if (cs->next)
        cs->next->prev = cs->prev;
    free(cs);
}

static void tpair_put(cuda_backend *b, gjob *g)
{
    if (!g->t0)
        return;
    tpair *t = malloc(sizeof *t);
    if (!t) {
        cudaEventDestroy(g->t0);
        cudaEventDestroy(g->t1);
    } else {
        t->t0 = g->t0;
        t->t1 = g->t1;
        t->next = b->tfree;
        b->tfree = t;
    }
    g->t0 = g->t1 = NULL;
}

/* An event from the pool, or a new one. */
static cudaError_t pool_get(evpool *p, cudaEvent_t *out)
{
    if (p->n) {
        *out = p->v[--p->n];
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(out, p->flags);
}

/* Back to the pool (destroyed if the pool cannot grow); *ev becomes NULL. */
static void pool_put(evpool *p, cudaEvent_t *ev)
{
    if (!*ev)
        return;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        cudaEvent_t *n = realloc(p->v, cap * sizeof *n);
        if (!n) {
            cudaEventDestroy(*ev);
            *ev = NULL;
            return;
        }
        p->v = n;
        p->cap = cap;
    }
    p->v[p->n++] = *ev;
    *ev = NULL;
}

static void pool_free(evpool *p)
{
    for (size_t i = 0; i < p->n; i++)
        cudaEventDestroy(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

static void outstanding_unlink(cuda_backend *b, gjob *g)
{
    if (g->prev)
        g->prev->next = g->next;
    else
        b->outstanding = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        b->outstanding_tail = g->prev;
    g->prev = g->next = NULL;
    b->noutstanding--;
}

/* One request finished on the GPU (loop thread). */
static void complete(cuda_backend *b, gjob *g)
{
    csess *cs = g->cs;
    rnd_job *job = g->job;

    outstanding_unlink(b, g);
    cs->completed++;
    if (job)
        rnd_debug("cuda session #%u (stream %d): sync request done %" PRIu64 " us after its "
                  "submission (started %s)", cs->id, cs->stream,
                  (rnd_now_ns() - g->submit_ns) / 1000, g->start_ns ? "seen" : "not seen");
    if (g->unready_warned && g->err == cudaSuccess)
        rnd_info("cuda session #%u (stream %d): the request whose inputs were late completed "
                 "%" PRIu64 " ms after its submission", cs->id, cs->stream,
                 (rnd_now_ns() - g->submit_ns) / 1000000);
    if (g->err != cudaSuccess) {
        mark_failed(b, "waiting for a kernel: %s", cudaGetErrorString(g->err));
        if (job) {
            job->status = RN_DEVICE_FAILING;
            job->done_slot = -1;
            snprintf(job->msg, sizeof job->msg, "bwd: the GPU failed: %s",
                     cudaGetErrorString(g->err));
            job->done(job);
        }
    } else if (job) {
        float ms = 0;
        uint64_t now = rnd_now_ns(), kns;
        if (cudaEventElapsedTime(&ms, g->t0, g->t1) != cudaSuccess) {
            (void)cudaGetLastError();
            ms = 0;
        }
        /* The kernel's own time, ending now: the server reports end - start
         * as compute time and the rest since receipt as queue time. */
        kns = (uint64_t)((double)ms * 1e6);
        job->end_ns = now;
        job->start_ns = now > kns ? now - kns : 0;
        job->status = RN_OK;
        job->done_slot = -1;
        job->done(job);
    }
    tpair_put(b, g);
    pool_put(&b->starts, &g->started);
    pool_put(&b->fins, &g->fin);
    free(g);
    sess_settle(cs);
}

static void drain_completions(cuda_backend *b)
{
    gjob *list, *next;

    pthread_mutex_lock(&b->mu);
    list = b->qhead;
    b->qhead = b->qtail = NULL;
    pthread_mutex_unlock(&b->mu);
    for (; list; list = next) {
        next = list->qnext;
        complete(b, list);
    }
}

static void answer_async(cuda_backend *b)
{
    rnd_job *list = b->answers, *next;

    b->answers = b->answers_tail = NULL;
    for (; list; list = next) {
        next = list->next;
        list->next = NULL;
        list->done(list);
    }
}

/* After a failure: answer every request that waits for the GPU (they will
 * not complete), then tell the server.  The last thing done here: the
 * server's drain may call fini. */
static void run_fatal(cuda_backend *b)
{
    if (!b->fatal_pending)
        return;
    b->fatal_pending = false;
    for (gjob *g = b->outstanding; g; g = g->next) {
        rnd_job *job = g->job;
        if (!job)
            continue;
        g->job = NULL;
        job->status = RN_DEVICE_FAILING;
        job->done_slot = -1;
        snprintf(job->msg, sizeof job->msg, "bwd: the GPU failed: %.160s", b->fail_msg);
        job->done(job);
    }
    b->fatal(b->fatal_ctx, b->fail_msg);
}

static void on_async(uv_async_t *h)
{
    cuda_backend *b = h->data;

    answer_async(b);
    drain_completions(b);
    run_fatal(b);
}

static void on_check(uv_check_t *h)
{
    cuda_backend *b = h->data;

    answer_async(b);
    flush_unmaps(b);
    run_fatal(b);
}

/*
 * A request not started a deadline after its submission: say so, once, and
 * keep waiting.  head is the oldest request of its stream that has not
 * started (g itself, or one before g); running: a request before head on
 * the stream has started and not completed yet, so the stream waits for that
 * kernel (which the deadline covers), not for inputs.
 */
static void warn_unready(cuda_backend *b, gjob *g, const gjob *head, bool running, uint64_t now)
{
    csess *cs = g->cs;

    if (head == g) {
        if (running)
            return;
        rnd_warn("cuda session #%u (stream %d): inputs not ready after %" PRIu64 " ms; "
                 "waiting (the client's stream has not reached its ready event; the %"
                 PRIu64 " ms kernel deadline counts from when it does)",
                 cs->id, cs->stream, (now - g->submit_ns) / 1000000,
                 b->deadline_ns / 1000000);
    } else {
        /* Queued behind another request on the same stream.  Behind the
         * session's own request (warned about already) or behind a running
         * kernel there is nothing new to say; behind another session's
         * unready inputs (more sessions than streams) there is. */
        if (head->cs == cs || !head->unready_warned)
            return;
        rnd_warn("cuda session #%u (stream %d): a request has waited %" PRIu64
                 " ms behind one of session #%u, whose inputs are not ready (the two share "
                 "the stream: more than %d sessions); waiting",
                 cs->id, cs->stream, (now - g->submit_ns) / 1000000, head->cs->id, b->nstreams);
    }
    g->unready_warned = true;
}

/*
 * The watch: sticky errors, the start of each request, overdue kernels, and
 * inputs that take long to become ready.  Non-blocking: queries only.
 */
static void on_watch(uv_timer_t *t)
{
    cuda_backend *b = t->data;
    uint64_t now = rnd_now_ns();
    /* Per stream, in this pass: its oldest request not started yet, and
     * whether a request before that one has started (its kernel runs). */
    const gjob *head[RND_CUDA_STREAMS] = {NULL};
    bool running[RND_CUDA_STREAMS] = {false};

    if (b->failed || !b->outstanding)
        return;
    for (int i = 0; i < b->nstreams; i++) {
        cudaError_t e = cudaStreamQuery(b->streams[i].st);
        if (e == cudaSuccess || e == cudaErrorNotReady)
            continue;
        (void)cudaGetLastError();
        mark_failed(b, "stream %d: %s", i, cudaGetErrorString(e));
        break;
    }
    /* Oldest first, which is each stream's order: once a request of a
     * stream has not started, none after it on that stream has. */
    for (gjob *g = b->outstanding; g && !b->failed; g = g->next) {
        int si = g->cs->stream;
        if (!g->start_ns && !head[si]) {
            cudaError_t e = cudaEventQuery(g->started);
            if (e == cudaSuccess) {
                g->start_ns = now;
            } else if (e == cudaErrorNotReady) {
                head[si] = g;
            } else {
                (void)cudaGetLastError();
                mark_failed(b, "stream %d: the start event of a request: %s", si,
                            cudaGetErrorString(e));
                break;
            }
        }
        if (g->start_ns) {
            running[si] = true;
            if (now - g->start_ns > b->deadline_ns)
                mark_failed(b, "kernel deadline: a kernel of session #%u (stream %d) has run %"
                            PRIu64 " ms, past %" PRIu64 " ms (a hung or far too slow GPU)",
                            g->cs->id, si, (now - g->start_ns) / 1000000,
                            b->deadline_ns / 1000000);
        } else if (now - g->submit_ns > b->deadline_ns) {
            if (g->cs->ending && head[si] == g && !running[si])
                /* Its client is gone (or said BYE) and the ready event has
                 * not come: a dead process's event may never come, and the
                 * stream, which later sessions share, would stay blocked. */
                mark_failed(b, "cuda session #%u (stream %d): its client is gone and the "
                            "inputs of its request were still not ready after %" PRIu64
                            " ms: the stream is blocked for good", g->cs->id, si,
                            (now - g->submit_ns) / 1000000);
            else if (!g->unready_warned)
                warn_unready(b, g, head[si], running[si], now);
        }
    }
    run_fatal(b);
}

/* ---- init / fini ---------------------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    cuda_backend *b = h->data;
    if (--b->handles > 0)
        return;
    if (b->gone)
        return;   /* a failed device: completion threads may still run; keep b */
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* Stop and join the completion threads (their FIFOs must be empty or
 * finishing). */
static void stop_threads(cuda_backend *b)
{
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    for (int i = 0; i < b->nstreams; i++)
        pthread_cond_broadcast(&b->streams[i].cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->nstreams; i++) {
        if (b->streams[i].thr_started)
            pthread_join(b->streams[i].thr, NULL);
        b->streams[i].thr_started = false;
    }
}

static void release_streams(cuda_backend *b)
{
    for (int i = 0; i < b->nstreams; i++) {
        cudaFree(b->streams[i].ws);
        cudaStreamDestroy(b->streams[i].st);
        pthread_cond_destroy(&b->streams[i].cv);
    }
    b->nstreams = 0;
    (void)cudaGetLastError();
}

static int cuda_init(const rnd_backend_opts *o, rnd_backend **out, rnp_error *err)
{
    cuda_backend *b;
    char kmsg[RNP_MAX_ERRMSG] = "";
    enum cudaDriverEntryPointQueryResult q;
    const char *env;
    int rc, v = 0;
    cudaError_t e;

    /*
     * Load every kernel variant now, before the first CUDA call creates the
     * context.  With lazy loading the first launch of a variant loads its
     * module, which waits for work already queued on the device - including
     * a session stream blocked on a client's unready input - and so stalls
     * the loop thread for as long as that client takes.
     */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);

    b = calloc(1, sizeof *b);
    if (!b)
        return rnp_fail(err, RN_NOMEM, "backend: out of memory");
    b->base.ops = &rnd_backend_cuda_ops;
    b->loop = o->loop;
    b->fatal = o->fatal;
    b->fatal_ctx = o->fatal_ctx;
    b->max_jobs = o->max_jobs ? o->max_jobs : 1024;
    b->fins.flags = cudaEventDisableTiming | cudaEventBlockingSync;
    b->starts.flags = cudaEventDisableTiming;
    b->deadline_ns = (uint64_t)RND_CUDA_DEADLINE_MS * 1000000u;
    if ((env = getenv("RMSNORMD_KERNEL_DEADLINE_MS")) && atol(env) > 0)
        b->deadline_ns = (uint64_t)atol(env) * 1000000u;
    /* A start is seen at most one period late: a short deadline (the
     * tests') gets a shorter period. */
    b->watch_ms = b->deadline_ns / 4000000u;
    if (b->watch_ms > RND_CUDA_WATCH_MS)
        b->watch_ms = RND_CUDA_WATCH_MS;
    if (b->watch_ms < 1)
        b->watch_ms = 1;
    pthread_mutex_init(&b->mu, NULL);

    if ((rc = pick_device(b, o->device, err)) != 0)
        goto fail;
    /* From here a failure is not "no CUDA": the device exists but does not
     * work, which --backend auto reports as a warning. */
    if ((e = cudaSetDevice(b->dev)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess) {
        (void)cudaGetLastError();
        rc = rnp_fail(err, RN_CUDA, "device %d: creating the CUDA context: %s", b->dev,
                      cudaGetErrorString(e));
        goto fail;
    }
    CU(cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, b->dev), "device", fail);
    b->mps = v != 0;
    CU(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&b->get_range, 12000,
                                        cudaEnableDefault, &q),
       "device", fail);
    if (q != cudaDriverEntryPointSuccess || !b->get_range) {
        rc = rnp_fail(err, RN_CUDA, "device: the driver has no cuMemGetAddressRange");
        goto fail;
    }
    if (rnk_cuda_init(b->dev, &b->kdev, kmsg, sizeof kmsg) != RNK_OK) {
        rc = rnp_fail(err, RN_CUDA, "kernel init: %s", kmsg);
        goto fail;
    }
    if ((env = getenv("RMSNORMD_DEBUG_FORCE_GRID")) && *env) {
        char *end;
        long ctas;
        errno = 0;
        ctas = strtol(env, &end, 10);
        if (errno || *end || ctas < 1 || ctas > INT32_MAX) {
            rnd_warn("RMSNORMD_DEBUG_FORCE_GRID='%.40s' is not a positive number of CTAs: "
                     "ignored", env);
        } else {
            rnk_cuda_force_grid(b->kdev, (int)ctas);
            rnd_warn("Debugging knob RMSNORMD_DEBUG_FORCE_GRID is on: every kernel launches "
                     "%ld CTA%s, whatever the shape (same results, far slower); never use it "
                     "in production", ctas, ctas == 1 ? "" : "s");
        }
    }
    size_t ws0 = rnk_cuda_workspace_size(b->kdev, RND_CUDA_WS_M, RND_CUDA_WS_N);
    while (b->nstreams < RND_CUDA_STREAMS) {
        cstream *s = &b->streams[b->nstreams];
        s->b = b;
        s->idx = b->nstreams;
        CU(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking), "streams", fail);
        pthread_cond_init(&s->cv, NULL);
        b->nstreams++;
        CU(cudaMalloc(&s->ws, ws0), "workspace", fail);
        s->ws_bytes = ws0;
        if (rnk_cuda_workspace_init(s->ws, ws0, s->st, kmsg, sizeof kmsg) != RNK_OK) {
            rc = rnp_fail(err, RN_CUDA, "workspace: %s", kmsg);
            goto fail;
        }
    }
    /* Everything the first request needs exists before READY=1. */
    CU(cudaDeviceSynchronize(), "init", fail);
    for (int i = 0; i < b->nstreams; i++) {
        cstream *s = &b->streams[i];
        if ((rc = pthread_create(&s->thr, NULL, completion_thread, s)) != 0) {
            rc = rnp_fail(err, RN_SYSTEM, "backend: starting a completion thread: %s",
                          strerror(rc));
            stop_threads(b);
            goto fail;
        }
        s->thr_started = true;
    }

    if ((rc = uv_async_init(o->loop, &b->async, on_async)) != 0) {
        rc = rnp_fail(err, RN_SYSTEM, "backend: uv_async_init: %s", uv_strerror(rc));
        stop_threads(b);
        goto fail;
    }
    b->async.data = b;
    b->handles++;
    uv_check_init(o->loop, &b->check);
    b->check.data = b;
    b->handles++;
    uv_check_start(&b->check, on_check);
    uv_unref((uv_handle_t *)&b->check);
    uv_timer_init(o->loop, &b->watch);
    b->watch.data = b;
    b->handles++;
    uv_timer_start(&b->watch, on_watch, b->watch_ms, b->watch_ms);
    uv_unref((uv_handle_t *)&b->watch);

    if (!b->mps)
        rnd_warn("The cuda backend is not an MPS client: every dependency between a client's "
                 "kernels and ours is a GPU context switch (about 142 us each on an H200, two "
                 "per request); run the daemon and its clients under one MPS server");
    *out = &b->base;
    return 0;

fail:
    release_streams(b);
    rnk_cuda_fini(b->kdev);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&b->mu);
    free(b);
    /* A device that exists but cannot be used is not RN_NO_CUDA, so that
     * --backend auto says why it fell back. */
    return rc == RN_DEVICE_FAILING ? RN_CUDA : rc;
}

static void cuda_fini(rnd_backend *be)
{
    cuda_backend *b = (cuda_backend *)be;

    if (!b)
        return;
    if (!b->failed && cudaDeviceSynchronize() == cudaSuccess) {
        /* Every completion event has fired: let the threads hand over the
         * rest, then settle every request, mapping and session, and release
         * the device's objects. */
        stop_threads(b);
        answer_async(b);
        drain_completions(b);
        while (b->sessions) {
            csess *cs = b->sessions;
            cs->closed = true;
            cs->completed = cs->submitted;
            sess_settle(cs);
        }
        close_unmaps(b);   /* the device is idle: nothing waits */
        while (b->tfree) {
            tpair *t = b->tfree;
            b->tfree = t->next;
            cudaEventDestroy(t->t0);
            cudaEventDestroy(t->t1);
            free(t);
        }
        pool_free(&b->fins);
        pool_free(&b->starts);
        release_streams(b);
        rnk_cuda_fini(b->kdev);
        b->kdev = NULL;
    } else {
        /* The context is broken: leave its objects to the process exit, and
         * keep b for completion threads that may still wake up. */
        pthread_mutex_lock(&b->mu);
        b->gone = true;
        b->stop = true;
        for (int i = 0; i < b->nstreams; i++) {
            pthread_cond_broadcast(&b->streams[i].cv);
            if (b->streams[i].thr_started)
                pthread_detach(b->streams[i].thr);
        }
        pthread_mutex_unlock(&b->mu);
    }
    (void)cudaGetLastError();
    uv_close((uv_handle_t *)&b->async, on_handle_closed);
    uv_close((uv_handle_t *)&b->check, on_handle_closed);
    uv_close((uv_handle_t *)&b->watch, on_handle_closed);
}

static void cuda_info(rnd_backend *be, rnd_device_info *out)
{
    cuda_backend *b = (cuda_backend *)be;

    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cuda");
    snprintf(out->device_name, sizeof out->device_name, "%.63s", b->prop.name);
    memcpy(out->uuid, b->prop.uuid.bytes, RNP_UUID_BYTES);
    out->sm_count = (uint32_t)b->prop.multiProcessorCount;
    out->cc_major = (uint32_t)b->prop.major;
    out->cc_minor = (uint32_t)b->prop.minor;
    out->mps = b->mps;
    out->event_slots = RNP_MAX_EVENTS;
}

static int cuda_health(rnd_backend *be, char (*reasons)[RNP_REASON_LEN], uint32_t max,
                       uint32_t *n)
{
    cuda_backend *b = (cuda_backend *)be;
    int st = RNP_HEALTH_OK;

    *n = 0;
    if (b->failed) {
        st = RNP_HEALTH_FAILING;
        if (*n < max)
            snprintf(reasons[(*n)++], RNP_REASON_LEN, "cuda: %.100s", b->fail_msg);
    }
    if (!b->mps) {
        st = st > RNP_HEALTH_DEGRADED ? st : RNP_HEALTH_DEGRADED;
        if (*n < max)
            snprintf(reasons[(*n)++], RNP_REASON_LEN,
                     "mps: not an MPS client; each request pays two GPU context switches");
    }
    return st;
}

/* ---- sessions, regions, events ---------------------------------------------------------------- */

static int cuda_session_open(rnd_backend *be, void **bsess, rnp_error *err)
{
    cuda_backend *b = (cuda_backend *)be;
    csess *cs;
    int best = 0;

    if (b->failed)
        return rnp_fail(err, RN_DEVICE_FAILING, "hello: the GPU failed: %.150s", b->fail_msg);
    cs = calloc(1, sizeof *cs);
    if (!cs)
        return rnp_fail(err, RN_NOMEM, "hello: out of memory");
    for (int i = 1; i < b->nstreams; i++)
        if (b->streams[i].nsess < b->streams[best].nsess)
            best = i;
    cs->b = b;
    cs->id = ++b->next_sess_id;
    cs->stream = best;
    b->streams[best].nsess++;
    /* The server's "Session ... opened for" line follows: it names the
     * client of this number. */
    rnd_debug("cuda session #%u uses stream %d", cs->id, best);
    cs->next = b->sessions;
    if (b->sessions)
        b->sessions->prev = cs;
    b->sessions = cs;
    *bsess = cs;
    return 0;
}

static void cuda_session_ending(rnd_backend *be, void *bsess)
{
    csess *cs = bsess;
    (void)be;
    if (cs)
        cs->ending = true;
}

static void cuda_session_close(rnd_backend *be, void *bsess)
{
    csess *cs = bsess;
    if (!cs)
        return;
    cs->closed = true;
    sess_settle(cs);
}

static int cuda_region_open(rnd_backend *be, void *bsess, const rnp_register_req *req,
                            rnd_mapping *out, rnp_error *err)
{
    cuda_backend *b = (cuda_backend *)be;
    cudaIpcMemHandle_t h;
    CUdeviceptr base = 0;
    size_t size = 0;
    void *p = NULL;
    cmap *m = NULL;
    int rc;

    if (req->kind != RNP_REGION_CUDA_IPC)
        return rnp_fail(err, RN_UNSUPPORTED,
                        "register.kind: the cuda backend maps CUDA IPC memory handles only "
                        "(POSIX shared memory needs the cpu backend)");
    if (memcmp(req->device_uuid, b->prop.uuid.bytes, RNP_UUID_BYTES) != 0) {
        char theirs[41], ours[41];
        uuid_str(req->device_uuid, theirs);
        uuid_str((const uint8_t *)b->prop.uuid.bytes, ours);
        return rnp_fail(err, RN_WRONG_DEVICE,
                        "register.device_uuid: the memory is on %s, this daemon serves %s",
                        theirs, ours);
    }
    if (req->size == 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "register.size: must be at least 1 byte");
    if (b->failed)
        return rnp_fail(err, RN_DEVICE_FAILING, "register: the GPU failed: %.150s", b->fail_msg);
    m = calloc(1, sizeof *m);
    if (!m)
        return rnp_fail(err, RN_NOMEM, "register: out of memory");
    _Static_assert(sizeof h == RNP_IPC_HANDLE_BYTES, "IPC handle size");
    memcpy(&h, req->ipc_handle, sizeof h);
    /* Opening a handle this process has open already only counts it again
     * (same address); each region closes its own count. */
    CU_CLIENT(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "register.ipc_handle",
              out_free);
    if (b->get_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) {
        rc = rnp_fail(err, RN_CUDA, "register.ipc_handle: cuMemGetAddressRange of the mapping failed");
        goto out_close;
    }
    if ((uint64_t)size < req->size) {
        rc = rnp_fail(err, RN_INVALID_ARGUMENT,
                      "register.size: %" PRIu64 " bytes claimed, but the allocation has %zu",
                      req->size, size);
        goto out_close;
    }
    m->dptr = p;
    out->base = p;
    out->size = req->size;
    out->handle = m;
    return 0;

out_close:
    (void)cudaIpcCloseMemHandle(p);
    (void)cudaGetLastError();
out_free:
    free(m);
    return rc;
}

static void cuda_region_close(rnd_backend *be, void *bsess, rnd_mapping *mp)
{
    csess *cs = bsess;
    cmap *m = mp ? mp->handle : NULL;

    if (!m)
        return;
    mp->handle = NULL;
    /* Kernels submitted before now may still read it: close after them. */
    m->ticket = cs->submitted;
    m->next = cs->closes;
    cs->closes = m;
    sess_settle(cs);
}

static int cuda_events(rnd_backend *be, void *bsess, const rnp_events_req *req,
                       rnp_events_rep *out, rnp_error *err)
{
    cuda_backend *b = (cuda_backend *)be;
    csess *cs = bsess;
    cudaIpcEventHandle_t h;
    uint32_t i = 0;
    int rc;

    _Static_assert(sizeof h == RNP_IPC_HANDLE_BYTES, "IPC event handle size");
    if (memcmp(req->device_uuid, b->prop.uuid.bytes, RNP_UUID_BYTES) != 0) {
        char theirs[41], ours[41];
        uuid_str(req->device_uuid, theirs);
        uuid_str((const uint8_t *)b->prop.uuid.bytes, ours);
        return rnp_fail(err, RN_WRONG_DEVICE,
                        "events.device_uuid: the events are on %s, this daemon serves %s", theirs,
                        ours);
    }
    if (req->n < 1 || req->n > RNP_MAX_EVENTS)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "events.n: %u is outside 1..%u", req->n,
                        RNP_MAX_EVENTS);
    if (b->failed)
        return rnp_fail(err, RN_DEVICE_FAILING, "events: the GPU failed: %.150s", b->fail_msg);
    if (cs->nev && cs->completed < cs->submitted)
        return rnp_fail(err, RN_BUSY,
                        "events: requests of this session are still on the GPU; exchange events "
                        "again once they completed");
    destroy_events(cs);
    for (i = 0; i < req->n; i++) {
        memcpy(&h, req->ready[i], sizeof h);
        CU_CLIENT(cudaIpcOpenEventHandle(&cs->ready[i], h), "events.ready", undo);
        CU(cudaEventCreateWithFlags(&cs->done[i], cudaEventDisableTiming | cudaEventInterprocess),
           "events", undo);
        CU(cudaIpcGetEventHandle(&h, cs->done[i]), "events", undo);
        memcpy(out->done[i], &h, sizeof h);
    }
    cs->nev = req->n;
    cs->done_next = 0;
    out->n = req->n;
    return 0;

undo:
    cs->nev = i + 1;
    destroy_events(cs);
    return rc;
}

/* ---- BWD ---------------------------------------------------------------------------------------- */

static int ws_ensure(cuda_backend *b, cstream *s, int64_t m, int64_t n, rnp_error *err)
{
    size_t need = rnk_cuda_workspace_size(b->kdev, m, n);
    char kmsg[RNP_MAX_ERRMSG] = "";
    void *ws = NULL;
    int rc;

    if (need <= s->ws_bytes)
        return 0;
    /* Stream-ordered: kernels queued before keep the old workspace until
     * they are done, and the new one is zeroed before the next launch. */
    CU(cudaMallocAsync(&ws, need, s->st), "bwd: workspace", out);
    if (rnk_cuda_workspace_init(ws, need, s->st, kmsg, sizeof kmsg) != RNK_OK) {
        cudaFreeAsync(ws, s->st);
        (void)cudaGetLastError();
        return rnp_fail(err, RN_CUDA, "bwd: workspace: %s", kmsg);
    }
    if (s->ws)
        cudaFreeAsync(s->ws, s->st);
    s->ws = ws;
    s->ws_bytes = need;
    return 0;
out:
    return rc;
}

static int events_get(cuda_backend *b, gjob *g, bool sync, rnp_error *err)
{
    int rc;

    CU(pool_get(&b->fins, &g->fin), "bwd: completion event", out);
    CU(pool_get(&b->starts, &g->started), "bwd: start event", out);
    if (!sync)
        return 0;
    tpair *t = b->tfree;
    if (t) {
        b->tfree = t->next;
        g->t0 = t->t0;
        g->t1 = t->t1;
        free(t);
        return 0;
    }
    CU(cudaEventCreate(&g->t0), "bwd: timing events", out);
    CU(cudaEventCreate(&g->t1), "bwd: timing events", out);
    return 0;
out:
    return rc;
}

static void events_put(cuda_backend *b, gjob *g)
{
    if (g->t0 && g->t1) {
        tpair_put(b, g);
    } else {
        if (g->t0)
            cudaEventDestroy(g->t0);
        g->t0 = NULL;
    }
    pool_put(&b->starts, &g->started);
    pool_put(&b->fins, &g->fin);
}

static int cuda_submit(rnd_backend *be, rnd_job *job, rnp_error *err)
{
    cuda_backend *b = (cuda_backend *)be;
    csess *cs = job->bsess;
    char kmsg[RNP_MAX_ERRMSG] = "";
    bool sync = job->mode == RNP_MODE_SYNC;
    uint64_t t_in = rnd_now_ns(), t_wait = 0, t_launch = 0;
    int32_t j = -1;
    cstream *s;
    gjob *g;
    int rc, krc;

    if (b->failed)
        return rnp_fail(err, RN_DEVICE_FAILING, "bwd: the GPU failed: %.150s", b->fail_msg);
    if (job->ready_slot >= 0 && cs->nev == 0)
        return rnp_fail(err, RN_NO_EVENTS,
                        "bwd.ready_slot: %d, but this session has exchanged no events (EVENTS)",
                        (int)job->ready_slot);
    if (job->ready_slot >= (int32_t)cs->nev)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "bwd.ready_slot: %d is outside 0..%u",
                        (int)job->ready_slot, cs->nev - 1);
    if (!sync && cs->nev == 0)
        return rnp_fail(err, RN_NO_EVENTS,
                        "bwd.mode: async needs a done event to wait on; exchange events (EVENTS) "
                        "or use sync mode");
    if (b->noutstanding >= b->max_jobs)
        return rnp_fail(err, RN_BUSY, "bwd: %u requests are queued on the GPU, the limit",
                        b->noutstanding);
    g = calloc(1, sizeof *g);
    if (!g)
        return rnp_fail(err, RN_NOMEM, "bwd: out of memory");
    g->cs = cs;
    s = &b->streams[cs->stream];
    if ((rc = ws_ensure(b, s, job->args.m, job->args.n, err)) != 0)
        goto fail;
    if ((rc = events_get(b, g, sync, err)) != 0)
        goto fail_ev;
    if (job->ready_slot >= 0)
        CU(cudaStreamWaitEvent(s->st, cs->ready[job->ready_slot], 0), "bwd", fail_ev);
    /* Complete once the inputs are ready and the stream's earlier work has
     * ended: the watch counts the kernel deadline from then. */
    CU(cudaEventRecord(g->started, s->st), "bwd", fail_ev);
    t_wait = rnd_now_ns();
    if (sync)
        CU(cudaEventRecord(g->t0, s->st), "bwd", fail_ev);
    krc = rnk_cuda_bwd(b->kdev, &job->args, s->ws, s->ws_bytes, s->st, kmsg, sizeof kmsg);
    t_launch = rnd_now_ns();
    if (krc != RNK_OK) {
        if (krc == RNK_ECUDA) {
            /* The kernel library cleared the error; a broken context shows
             * on the stream. */
            cudaError_t e = cudaStreamQuery(s->st);
            if (e != cudaSuccess && e != cudaErrorNotReady && sticky(e))
                mark_failed(b, "launch: %.100s", kmsg);
            (void)cudaGetLastError();
        }
        rc = rnp_fail(err, krc == RNK_EINVAL ? RN_INVALID_ARGUMENT : krc == RNK_ENOMEM ? RN_NOMEM : RN_CUDA,
                      "bwd: %.190s", kmsg);
        goto fail_ev;
    }
    /* Launched: from here the kernel may read the regions, so the request
     * counts as submitted even if what follows fails. */
    cs->submitted++;
    g->submit_ns = rnd_now_ns();
    g->prev = b->outstanding_tail;
    if (b->outstanding_tail)
        b->outstanding_tail->next = g;
    else
        b->outstanding = g;
    b->outstanding_tail = g;
    b->noutstanding++;
    if (sync)
        CU(cudaEventRecord(g->t1, s->st), "bwd", fail_launched);
    if (cs->nev) {
        j = (int32_t)(cs->done_next++ % cs->nev);
        CU(cudaEventRecord(cs->done[j], s->st), "bwd", fail_launched);
    }
    CU(cudaEventRecord(g->fin, s->st), "bwd", fail_launched);
    pthread_mutex_lock(&b->mu);
    g->fnext = NULL;
    if (s->ft)
        s->ft->fnext = g;
    else
        s->fh = g;
    s->ft = g;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&b->mu);
    if (sync) {
        g->job = job;
    } else {
        /* Recorded: the reply may go now (after the check phase of this
         * loop iteration, never from inside the server's call). */
        job->status = RN_OK;
        job->done_slot = j;
        job->start_ns = job->end_ns = rnd_now_ns();
        job->next = NULL;
        if (b->answers_tail)
            b->answers_tail->next = job;
        else
            b->answers = job;
        b->answers_tail = job;
    }
    if (g->submit_ns - t_in > RND_CUDA_SLOW_SUBMIT_NS)
        rnd_warn("A submission took %" PRIu64 " us (wait on the ready event %" PRIu64
                 " us, launch %" PRIu64 " us)", (rnd_now_ns() - t_in) / 1000,
                 (t_wait - t_in) / 1000, (t_launch - t_wait) / 1000);
    return 0;

fail_launched:
    /* A kernel runs that we cannot track: the device state is unknown, so
     * stop serving.  The request stays outstanding (it never completes), so
     * its regions stay mapped. */
    mark_failed(b, "after a launch: %.150s", err->msg);
    return rc;
fail_ev:
    events_put(b, g);
fail:
    free(g);
    return rc;
}

const rnd_backend_ops rnd_backend_cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .info = cuda_info,
    .session_open = cuda_session_open,
    .session_close = cuda_session_close,
    .session_ending = cuda_session_ending,
    .region_open = cuda_region_open,
    .region_close = cuda_region_close,
    .events = cuda_events,
    .submit = cuda_submit,
    .health = cuda_health,
};
