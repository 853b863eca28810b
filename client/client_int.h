/* SPDX-License-Identifier: MIT */
/*
 * client_int.h - libclient's internals shared by its source files.  Not
 * installed.  Internal non-static names use the prefix rnc_; every one of
 * them is declared here, once.
 *
 * The files form layers, and each calls only the layers below it:
 *
 *   client.c        rn_connect, rn_close, the observation calls, the small
 *                   public helpers (version, error text, default endpoint)
 *   client_cuda.c   rn_rmsnorm_bwd(_sync): the CUDA pointer mapper (IPC
 *                   registration cache) and the event ring
 *   vmm_cuda.c      pointers in cuMemCreate memory: ranges of physical
 *                   allocations shared by descriptor (vmm_walk.c: its
 *                   host-only logic; vmm.h)
 *   bwd.c           the backward call both entry points share: argument
 *                   checks, request, timing; rn_rmsnorm_bwd_host(_async),
 *                   rn_sync, rn_check
 *   ring.c          the fast path: the ring, its slots, waiting for done
 *   ring_cuda.c     the fast path's device side on a CUDA stream
 *   buffer.c        the shm buffers and the host pointer mapper
 *   session.c       HELLO, BYE, re-opening a lost session, regions, and the
 *                   one retry loop around a lost session
 *   chan.c          the session channel: AUTH, shm registered by descriptor
 *   conn.c          the socket, one request/reply exchange with its timeout,
 *                   and the last error of a client
 *   watch.c         the daemon watcher: a thread that lets go of the ring's
 *                   words the client's streams wait on when the daemon goes
 *
 * libclient depends on proto/ (and nanomsg, msgpack-c, the CUDA runtime for
 * client_cuda.c), never on kernels/ or daemon/.
 */
#ifndef RN_CLIENT_INT_H
#define RN_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rmsnorm_client.h"
#include "rn_proto.h"

/* One shared buffer: a POSIX shm object mapped here and registered with the
 * daemon under `region` in the current session (0 while not registered). */
typedef struct rnc_buf {
    void *base;
    size_t size;
    uint32_t region;
    int fd;        /* kept open: a new session registers the buffer again by it */
    char name[64]; /* "/rmsnormd.<pid>.<n>.<pidns>"; "" once unlinked, which is
                    * at once where the daemon takes descriptors */
} rnc_buf;

/* The CUDA state of a client (client_cuda.c); NULL until its first device
 * call, and always NULL in a build without CUDA. */
typedef struct rnc_cuda rnc_cuda;

/* The fast path's ring of a client (ring.c); NULL until its first call. */
typedef struct rnc_ring rnc_ring;

/* The CUDA VMM registrations of a client (vmm_cuda.c); NULL until its first
 * pointer in cuMemCreate memory. */
typedef struct rnc_vmm rnc_vmm;

/* The daemon watcher of a client (watch.c); NULL until its ring first
 * opens. */
typedef struct rnc_watch rnc_watch;

struct rn_client {
    pthread_mutex_t mu; /* serialises every call */
    int sock;           /* nanomsg NN_REQ socket; < 0: open it at the next call */
    int timeout_ms;     /* -1: forever */
    uint64_t down_ns;   /* since when no daemon listens at the endpoint (hello's
                         * probes), 0: one did at the last look */
    char endpoint[256];
    char name[RNP_MAX_NAME];

    pid_t owner;       /* the process that opened it: a fork child's copy is not used */
    bool have_session; /* false: the next call that needs one opens it (HELLO) */
    /* The last exchange saw a new connection after its request may already
     * have gone out on an earlier one (rnc_transact). */
    bool reconnected;
    bool replied;      /* the last rnc_transact got a reply (an error one too) */
    bool have_chan;    /* chan is the session's channel connection */
    int chan;
    /* The reply types the daemon still owes on the channel for requests
     * whose wait ended without one, oldest first; read before the next
     * request (and without waiting at each call).  A region a late reply
     * names goes through chan_forget (session.c's UNREGISTER). */
    uint8_t chan_owed[2];
    uint8_t chan_nowed;
    int (*chan_forget)(rn_client *c, uint32_t region);
    /* rnc_ring_orphan, set once c has a ring: how the channel and the
     * session (below the ring) hand it a session gone unanswered. */
    void (*ring_orphan)(rn_client *c);
    /* The session's bell (one end of a stream socket pair, from AUTH_OK):
     * a byte sent on it (MSG_NOSIGNAL) instead of the doorbell's futex
     * when the daemon sleeps; RMSNORMD_BELL=0: not used. */
    bool have_bell, bell_off;
    int bell;
    rnp_session session;
    rnp_hello_rep hello;
    rnp_session cuda_asked; /* the session client_cuda.c asked again for CUDA in */
    uint64_t next_id, next_seq;

    rnc_buf *bufs;
    size_t nbufs, capbufs;

    rnc_cuda *cuda;
    rnc_vmm *vmm;
    int path;           /* RN_PATH_CLASSIC, RN_PATH_FAST or RN_PATH_AUTO */
    bool ring_setup_failed; /* the last ring call failed setting up the ring (ring.c) */
    bool ring_off;      /* RN_PATH_AUTO: the ring could not be set up here; classic */
    rnc_ring *ring;
    void *done_buf;     /* device memory of the rings' done words (ring_cuda.c), or NULL */
    uint32_t done_next; /* its next word never handed out */
    void (*done_free)(rn_client *c); /* frees done_buf (rnc_ring_release) */
    /* Raise the done word at addr to seq from any thread (the watcher's
     * too), on a stream of its own (ring_cuda.c); NULL with no done_buf. */
    void (*done_raise)(rn_client *c, uint64_t addr, uint64_t seq);
    /* Read that word into *v from any thread: 0, or -1 (the device failed). */
    int (*done_read)(rn_client *c, uint64_t addr, uint64_t *v);
    void *done_stream;  /* that stream, on done_device */
    int done_device;
    void *done_ctx;     /* the CUcontext they were made in, or NULL (unknown) */

    rnc_watch *watch;
    bool watch_off;     /* RMSNORMD_WATCH=0: no watcher thread */
    bool done_host;     /* RMSNORMD_DONE_WORD=host: streams wait on the ring's word */
    uint32_t ring_slots; /* its ring's depth (RMSNORMD_RING_SLOTS, client.c) */
    /* Written by the watcher thread when the daemon went (watch.c), read by
     * the calls: __atomic loads and stores only.  watch_fired is 0 or an
     * RNC_WATCH_* reason; watch_answered the done word the daemon left. */
    uint32_t watch_fired;
    uint64_t watch_answered;

    char last_error[RN_ERRMSG_LEN];
    /* Scratch space for one exchange; the mutex makes it private to a call. */
    rnp_request req;
    rnp_reply rep;
    uint8_t tx[RNP_MAX_MSG];
};

/* ---- conn.c: the connection ------------------------------------------------------- */

/*
 * The one way libclient records a failure: the message goes to c's last
 * error, or, with c NULL, to the calling thread's (rn_connect fails before
 * there is a client to hold it).  Returns code.  printf-style.
 */
int rnc_fail(rn_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Forget the calling thread's last error (the start of rn_connect). */
void rnc_clear_thread_error(void);

/* Monotonic clock, nanoseconds. */
uint64_t rnc_now_ns(void);

/*
 * Check c->endpoint (ipc:// with a path that fits a Unix socket, a socket
 * that a stranger cannot have planted, and a daemon listening there, waiting
 * at most timeout_ms for it to accept) and open c's REQ socket on it.  On
 * failure c->sock is closed again (< 0) and c's last error says why.
 */
int rnc_conn_open(rn_client *c, int timeout_ms);
/* Whether anybody listens at c's endpoint (a plain connect, as before the
 * first connection): 0, else the rn_status with c's last error set
 * (RN_UNREACHABLE at once where no daemon runs). */
int rnc_conn_probe(rn_client *c, int timeout_ms);

/* Close c's socket; c->sock < 0 afterwards.  Fine when it is closed. */
void rnc_conn_close(rn_client *c);

/* Clear c->req for a request of type op and return it, for the caller to
 * fill in before rnc_transact. */
rnp_request *rnc_request(rn_client *c, uint32_t op);

/*
 * One request/reply exchange of c->req on c's socket: fills version and
 * id, encodes, sends, waits for the reply (timeout_ms) and checks its op
 * and id.  Returns 0 with c->rep filled, the daemon's error code (message
 * kept), or a transport error (RN_TIMEOUT, RN_SYSTEM, RN_BAD_REPLY).
 * Sets c->reconnected.
 */
int rnc_transact(rn_client *c, int timeout_ms);

/* ---- chan.c: the session channel ----------------------------------------------------- */

/*
 * Connect to the session channel beside c->endpoint and authenticate
 * c->session (within c->timeout_ms).  On failure the connection is closed
 * and c's last error says why.
 */
int rnc_chan_open(rn_client *c);
/* Whether the daemon closed the session channel (it died, or the session
 * ended). */
bool rnc_chan_closed(rn_client *c);

/*
 * REGISTER_FD: share size bytes of fd (stays c's) with the daemon in the
 * current session; sets *region.  A connection the daemon closed reads as
 * RN_UNKNOWN_SESSION.  A reply that does not come within c's timeout is
 * RN_TIMEOUT and leaves the connection, and so the session, as it was: the
 * late reply is read before the next request (a region it names is
 * unregistered).
 */
int rnc_chan_register(rn_client *c, int fd, uint64_t size, uint32_t *region);

/*
 * A CUDA VMM range (PROTOCOL.md section 12): VMM_CHUNK sends chunk index
 * (its descriptor fd, which stays c's) at offset in the range, size bytes;
 * VMM_MAP then maps the count chunks sent, total bytes, as one region
 * (*region).  An error drops the daemon's pending chunks of the range.
 */
int rnc_chan_vmm_chunk(rn_client *c, int fd, uint32_t index, uint64_t offset, uint64_t size);
int rnc_chan_vmm_map(rn_client *c, uint32_t count, uint64_t total,
                     const uint8_t uuid[RNP_UUID_BYTES], uint32_t *region);

/* Read the late replies of the channel that came already (see
 * rnc_chan_register), without waiting; c's last error stays. */
void rnc_chan_collect(rn_client *c);

/* The daemon sleeps on c's ring: wake it by the session's bell, else the
 * ring's doorbell word (a futex). */
void rnc_chan_wake(rn_client *c, uint32_t *doorbell);

/* Close c's channel connection; fine when there is none. */
void rnc_chan_close(rn_client *c);

/* A pidfd of the daemon at the other end of the channel chan (its
 * SO_PEERCRED pid, while the connection is up), or -1 (none visible in this
 * pid namespace, a kernel before 5.3, or the connection closed).  watch.c. */
int rnc_daemon_pidfd(int chan);

/* ---- session.c: sessions and regions ------------------------------------------------ */

/*
 * Make sure c has a session: HELLO, then register every live buffer again
 * (region ids change).  No-op when c->have_session.
 */
int rnc_ensure_session(rn_client *c);

/*
 * End c's session with BYE, best effort: a dead daemon delays this by
 * BYE_TIMEOUT_MS at most.  Keeps c->last_error as it was.  The next call
 * opens a new session (rnc_ensure_session).  0 when the daemon answered
 * (its reply an error or not), else why not (RN_TIMEOUT, RN_SYSTEM, ...).
 */
int rnc_end_session(rn_client *c);

/*
 * Run step(c, arg) in a session: make sure there is one, run the step, and
 * when the daemon no longer knows the session (it restarted: the step
 * returns RN_UNKNOWN_SESSION) open a new one and run the step once more.
 * A step sends its own requests.  Running it again must give what running
 * it once does; a step for which that is not so (an in-place BWD whose
 * first copy may have started, see bwd.c) returns RN_RESTARTED instead of
 * RN_UNKNOWN_SESSION, with c->have_session cleared.  Inline: a call with a
 * live session stays in its caller's file.
 */
static inline int rnc_in_session(rn_client *c, int (*step)(rn_client *c, void *arg), void *arg)
{
    if (c->chan_nowed)
        rnc_chan_collect(c); /* (what a late reply left on the daemon goes soon) */
    for (int attempt = 0;; attempt++) {
        int rv;
        if (!c->have_session && (rv = rnc_ensure_session(c)) != 0)
            return rv;
        rv = step(c, arg);
        if (rv != RN_UNKNOWN_SESSION || attempt > 0)
            return rv;
        c->have_session = false;
    }
}

/* Register a region described by r (kind, size and the shm name or the IPC
 * handle; the session is filled here) and set *region. */
int rnc_register(rn_client *c, const rnp_register_req *r, uint32_t *region);

/* Register shm buffer b in the current session; sets b->region. */
int rnc_register_buf(rn_client *c, rnc_buf *b);

/* UNREGISTER region in the current session; the daemon's answer. */
int rnc_unregister(rn_client *c, uint32_t region);

/* ---- ring.c: the fast path ----------------------------------------------------------- */

/*
 * The device side of a fast-path call made on a CUDA stream (ring_cuda.c;
 * tests put a fake GPU here).  Addresses are device addresses of the ring's
 * words.  Each returns 0 or an rn_status (c's last error set).
 */
typedef struct rnc_ring_dev {
    /* Once per ring memory: register [base, base + size) with the device;
     * *dev gets base's device address. */
    int (*attach)(rn_client *c, void *base, size_t size, uint64_t *dev);
    /* Before the memory is unmapped (rn_close). */
    void (*detach)(void *base);
    /* Enqueue on stream, after the work queued so far: *addr = seq. */
    int (*write)(rn_client *c, void *stream, uint64_t addr, uint64_t seq);
    /* Enqueue on stream: later work waits until *addr reaches seq. */
    int (*wait)(rn_client *c, void *stream, uint64_t addr, uint64_t seq);
    /* Whether stream is being captured into a CUDA graph: 1, 0, or minus
     * an rn_status (c's last error set).  May be NULL (never captured). */
    int (*captured)(rn_client *c, void *stream);
    /* On the stream being captured, for the graph slot at device address
     * addr (PROTOCOL.md 13.8): the replay's start (reset done, bump gen,
     * after the work captured so far) and the wait for done; gone(arg)
     * runs once the graph and every instantiation of it are destroyed
     * (never if this fails; then *queued says whether anything went into
     * the capture before it failed). */
    int (*graph)(rn_client *c, void *stream, uint64_t addr, void (*gone)(void *), void *arg,
                 bool *queued);
    /* A fresh done word in device memory for the next RING_OPEN (zero, never
     * handed out before in this process) in *p, or *p NULL for none (the
     * ring's word serves): 0 or an rn_status.  May be NULL. */
    int (*done_word)(rn_client *c, void **p);
    /* What names stream for as long as it lives, unlike its handle, which
     * a new stream may get once it is destroyed, and which the per-thread
     * default stream has in every thread; 0: not known (the handle serves
     * alone).  May be NULL. */
    uint64_t (*stream_id)(void *stream);
    /* write's for two words, *addr = seq and then *addr2 = seq, in one
     * call: 0, or an rn_status with nothing queued (RN_UNSUPPORTED: the
     * device side cannot, two writes instead).  May be NULL (two writes). */
    int (*write2)(rn_client *c, void *stream, uint64_t addr, uint64_t addr2, uint64_t seq);
} rnc_ring_dev;

/*
 * Publish b (tensors mapped, shape, dtypes, scalars; its session and seq are
 * not used) as the next slot of c's ring, opening the ring in the current
 * session first (RN_UNSUPPORTED when the daemon offers no fast path).  An
 * error of an earlier call that finished is returned instead, once, and
 * nothing is published.  Waits while the ring is full.  Sets *seq.
 * dev NULL: the calling thread is producer and consumer (ready is written
 * here).  Else the call is stream-ordered: dev writes ready = seq on
 * stream before the slot is published, and makes stream wait for done >=
 * seq after; nothing waits on the host.  done: where the ring opens now,
 * a done word in device memory the session registered, which the
 * stream then waits on instead of the ring's (NULL: the ring's).
 */
typedef struct rnc_done_word {
    rnp_tensor t;                  /* its region and offset */
    uint64_t addr;                 /* its device address here */
} rnc_done_word;
int rnc_ring_publish(rn_client *c, const rnp_bwd_req *b, const rnc_ring_dev *dev, void *stream,
                     const rnc_done_word *done, uint64_t *seq);
/* Whether c's next fast-path call opens its ring (a new session). */
bool rnc_ring_opening(const rn_client *c);
/* Whether c's ring has calls out (published, done not past them). */
bool rnc_ring_busy(const rn_client *c);
/* RING_OPEN of the ring at offset 0 of region, with go (the client writes
 * it after ready: PROTOCOL.md 13.3) and *done's word if any; where the
 * daemon refuses that (older than these fields, or no such word for this
 * memory) *go becomes false, then *done NULL, and the ring opens without.
 * Sets *go and *ring. */
int rnc_ring_open_call(rn_client *c, uint32_t region, uint32_t slots, const rnc_done_word **done,
                       bool *go, uint32_t *ring);
/* (A call on a stream being captured takes a graph slot instead of a seq:
 * *seq is 0, and nothing waits for it on the host.) */
/* Wait until the call seq finished; then the first error not yet
 * reported, or 0.  RN_UNKNOWN_SESSION when the session is gone. */
int rnc_ring_wait(rn_client *c, uint64_t seq);
/* rn_sync (wait true) and rn_check (false) on c's ring. */
int rnc_ring_sync(rn_client *c, bool wait);
/* c's session ended and its daemon will not answer the ring's calls (a BYE
 * answered with an error, by a daemon that did not know the session, or no
 * session left to end: a HELLO after the channel was found closed): where
 * no daemon holds the ring any more (it exited, or closed the ring; at
 * once without a pidfd of it), the calls still out are lost now, so that
 * streams waiting on their done words go on.  A daemon that still holds the
 * ring answers them itself, and a watcher that fired let them go already. */
void rnc_ring_orphan(rn_client *c);
/* Unmap and close c's ring; rn_close calls it after the session ended.
 * answered false (the BYE went unanswered): calls in flight are lost first,
 * so that streams waiting on their done words go on. */
void rnc_ring_release(rn_client *c, bool answered);
/* In a fork child (rn_close of the parent's copy): the child's own mappings
 * and descriptors of the ring memory go; nothing shared with the parent is
 * written, nothing of CUDA is called. */
void rnc_ring_forget(rn_client *c);

/* ---- watch.c: the daemon watcher ------------------------------------------------------- */

/*
 * A thread per client, started when its ring first opens (unless
 * RMSNORMD_WATCH=0), asleep in poll(2) until the daemon exits or ends the
 * session.  Then it does what the client's next call would do for the
 * streams that wait on the ring (PROTOCOL.md 13): the slots published and
 * not answered get status RN_RESTARTED and done passes them; every graph
 * slot a live graph holds gets closed, then done.  It sets c->watch_fired
 * before any of that, so that the calls report the loss once.
 *
 * Threads: the watcher never takes c->mu.  Its state and every write it
 * makes into the ring happen under a mutex of its own, which the calls
 * below take (never while they wait for anything); the calls' hot path
 * reads only c->watch_fired, with an atomic load.  None of these fails:
 * a watcher that cannot start leaves the client as it was without one.
 */
/* After the channel closed with the ring still open: how long a live
 * daemon may take to answer what it took, with a pidfd of it ... */
#define RNC_LINGER_MS 10000
/* ... and without one (the close may be the daemon's death).  The watcher
 * and the calls that find the channel closed (ring.c) both wait so long. */
#define RNC_LINGER_BLIND_MS 1000

enum {
    RNC_WATCH_QUIET = 0,  /* the daemon is there (or nothing is watched) */
    RNC_WATCH_EXITED = 1, /* the daemon's process exited */
    RNC_WATCH_ENDED = 2,  /* the daemon ended the session; its ring is closed */
    RNC_WATCH_SILENT = 3, /* the channel closed and the ring stayed open too long */
};

/* Watch the session of c's channel for the ring at base (slots slots,
 * then graph graph slots of RNP_GRAPH_SLOT bytes from graph_off on), just
 * opened, whose streams wait on the device word at done_dev (0: on the
 * ring's own).  Clears c->watch_fired. */
void rnc_watch_arm(rn_client *c, uint8_t *base, uint32_t slots, uint64_t graph_off,
                   uint32_t graphs, uint64_t done_dev);
/* Stop watching: once it returns the watcher touches the ring no more (the
 * memory may be reused).  Fine when nothing is watched. */
void rnc_watch_disarm(rn_client *c);
/* Graph slot i of the ring at base is held by a live graph (held), or no
 * more.  Held after the watcher fired: let go at once. */
void rnc_watch_graph(rn_client *c, const uint8_t *base, uint32_t i, bool held);
/* After a slot was published with c->watch_fired set (the Dekker pair of
 * the watcher's reading of prod): release it too. */
void rnc_watch_catch_up(rn_client *c);
/* Stop the thread and free the watcher (rn_close, before the ring's memory
 * goes).  In a fork child, where the thread does not exist, only frees.
 * Returns whether it saw the current session end (no BYE is due). */
bool rnc_watch_stop(rn_client *c);
/* Raise the 64-bit word w to seq unless it is there already (done only
 * grows: the watcher and a call may raise it at once). */
void rnc_watch_raise(uint64_t *w, uint64_t seq);
/* The reason as words: "the daemon exited", ... */
const char *rnc_watch_why(uint32_t fired);

static inline uint32_t rnc_watch_fired(rn_client *c)
{
    return __atomic_load_n(&c->watch_fired, __ATOMIC_SEQ_CST);
}

/* ---- buffer.c: shm buffers -------------------------------------------------------- */

/* Remove this user's shm names of processes that no longer exist. */
void rnc_sweep_stale(void);

/* Unmap, close and unlink b (no daemon traffic) and forget it process-wide. */
void rnc_buf_release(rnc_buf *b);


/* ---- bwd.c: the backward call -------------------------------------------------------- */

/*
 * How a backward call turns the caller's pointers into regions: a buffer
 * lookup for host memory (buffer.c), the IPC registration cache for device
 * memory (client_cuda.c).  Every hook runs under c's mutex inside the
 * session retry loop (so it may run twice) and returns 0 or an error
 * recorded with rnc_fail.  ctx is the mapper's own, per call.
 */
typedef struct rnc_mapper {
    /* Before any tensor is mapped: set up what the session needs.  May be
     * NULL. */
    int (*prepare)(rn_client *c, void *ctx);
    /* p (never NULL) to (region, offset) in *t; field names the tensor. */
    int (*map)(rn_client *c, void *ctx, const char *field, const void *p, rnp_tensor *t);
    /* Right before the request goes out: the ready slot the daemon waits
     * on.  May be NULL (no slot, -1). */
    int (*ready)(rn_client *c, void *ctx, int32_t *slot);
    /* After the daemon accepted the request (c->rep holds its reply).  May
     * be NULL. */
    int (*accepted)(rn_client *c, void *ctx);
} rnc_mapper;

/* The host mapper: pointers into c's buffers from rn_buffer_alloc. */
extern const rnc_mapper rnc_host_mapper;

/*
 * The one backward call: checks a, then in a session maps the tensors with
 * m, sends BWD in mode (rnp_mode) and, on success, fills *t (may be NULL).
 * Takes c's mutex.
 */
int rnc_bwd(rn_client *c, const rn_bwd_args *a, int mode, const rnc_mapper *m, void *ctx,
            rn_timing *t);

/*
 * A stream-ordered call (async mode) that takes the fast path when the
 * daemon offers it (HELLO's paths, a session channel) and the classic path
 * (rnc_bwd's) otherwise: m maps the tensors (its prepare runs first), dev
 * puts ready and the wait for done on stream.  Takes c's mutex.
 */
int rnc_bwd_ring_dev(rn_client *c, const rn_bwd_args *a, const rnc_mapper *m, void *ctx,
                     const rnc_ring_dev *dev, void *stream);
/* Whether this thread's last rnc_bwd_ring_dev failed setting up the ring
 * (c->ring_setup_failed as it stood under c's mutex, which another
 * thread's call may have changed since). */
bool rnc_ring_setup_failed_here(void);

/* ---- client_cuda.c ----------------------------------------------------------------- */

/* Free c's CUDA state (events, registration cache); rn_close calls it. */
#ifdef RN_HAVE_CUDA
void rnc_cuda_release(rn_client *c);
/* ring_cuda.c: the fast path's device side on a CUDA stream. */
extern const rnc_ring_dev rnc_cuda_ring_dev;

/* ---- vmm_cuda.c -------------------------------------------------------------------- */

/*
 * p, a device pointer with no CUDA IPC handle (cuMemCreate memory), of a
 * tensor of bytes bytes on the device of uuid, to (region, offset) in *t:
 * a cached range that still maps the same physical allocations, or a new
 * one registered on the session channel.  Fails RN_NOT_SHARED, naming
 * field, where the memory cannot be shared that way (and says what to
 * change).
 */
int rnc_vmm_map(rn_client *c, const char *field, const void *p, uint64_t bytes,
                const uint8_t uuid[RNP_UUID_BYTES], rnp_tensor *t);
/* Free c's VMM state (the daemon's regions go with the session). */
void rnc_vmm_release(rn_client *c);
/*
 * A call captured into a CUDA graph names regions[0 .. n) (0: none) of
 * session: hold (true, at capture) keeps their ranges registered while the
 * graph may replay it, neither evicted from the cache nor dropped when an
 * allocation changes under them (new calls then register a range of their
 * own); hold false (the graph is gone) undoes one hold, and drops a range
 * found stale meanwhile once nothing holds it.  Regions of another session
 * than the cache's or c's live one, or not VMM ranges, are left alone.
 */
void rnc_vmm_hold(rn_client *c, const rnp_session *session, const uint32_t *regions, size_t n,
                  bool hold);
/* Whether VMM sharing is on: yes unless the environment turns it off
 * with RMSNORMD_VMM=0 (issue 17). */
bool rnc_vmm_enabled(void);
#else
static inline void rnc_cuda_release(rn_client *c)
{
    (void)c;
}
static inline void rnc_vmm_hold(rn_client *c, const rnp_session *session,
                                const uint32_t *regions, size_t n, bool hold)
{
    (void)c, (void)session, (void)regions, (void)n, (void)hold;
}
#endif

#endif /* RN_CLIENT_INT_H */
