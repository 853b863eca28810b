/* SPDX-License-Identifier: MIT */
/*
 * rmsnorm_client.h - the public API of libclient (librmsnorm_client): connect
 * to rmsnormd, share buffers with it and run RMSNorm's backward pass there.
 *
 * client/ holds libclient (this header and its sources) and the rmsnormctl
 * command-line tool.  libclient depends on proto/ (the wire protocol),
 * nanomsg and msgpack-c; rmsnormctl also uses kernels/ (the CPU twin and the
 * fp64 reference) to check the daemon's results.  This is the only header a
 * worker includes: the installed copy carries rn_wire.h folded in.
 *
 * Conventions:
 *  - Every call returns 0 or an rn_status code (see RN_ERRORS below); the
 *    library never logs and never prints.  rn_last_error() gives the one-line
 *    message of the last failure, naming the field at fault.
 *  - Output parameters are written only on success.
 *  - Destructors (rn_close) accept NULL.
 *
 * ABI: the library keeps its binary interface within a major version (the
 * SONAME, librmsnorm_client.so.RN_VERSION_MAJOR).  Every struct a caller
 * passes or receives starts with `size_t struct_size`:
 *  - structs the caller fills in (rn_connect_opts, rn_bwd_args): set it
 *    with the RN_*_INIT macro, or zero-initialise the struct; 0 means the
 *    layout of 0.1.  A later version appends fields and reads them only when
 *    struct_size covers them, so a binary built against this header keeps
 *    working with a newer library.
 *  - structs the library fills in (rn_health_info, rn_stats_info, struct
 *    rn_server_info): they end in reserved space, so their size never
 *    changes; a later version puts new fields there.  The library sets
 *    struct_size to the number of bytes it filled in: a caller built against
 *    a newer header tells a field the library did not know by its offset.
 *
 * Thread safety: an rn_client may be shared by threads; an internal mutex
 * serialises its calls (the daemon connection carries one request at a time
 * anyway), so for parallel requests open one rn_client per thread.  rn_close
 * must not run concurrently with another call on the same client.  The
 * functions that take no rn_client are thread-safe.
 *
 * fork(): a child must not use an rn_client opened by its parent (nanomsg is
 * not fork-safe); it opens its own, which is possible only if no client
 * was open in the parent at the fork (nanomsg's thread is the parent's):
 * else rn_connect fails at once with RN_UNSUPPORTED, and children should
 * be started by fork-and-exec (spawn, forkserver).  libclient sees only its
 * own nanomsg sockets: a process that opens nanomsg sockets itself, and
 * forks while one is open, has a child whose connect waits for good.
 * Buffers stay the
 * parent's.  rn_close in the child frees its copy and leaves the parent's
 * session alone.
 *
 * The daemon watcher: a client on the fast path runs one thread of its own
 * (named "rn-watch"), started with its ring and joined by rn_close, that
 * sleeps until the daemon exits or ends the session.  Then calls in flight
 * are finished as lost: a stream (or a graph replay) waiting for one goes
 * on at once, without a further call of this library, the outputs of those
 * calls are undefined, and the next call, rn_check or rn_sync reports the
 * loss once (RN_RESTARTED).  RMSNORMD_WATCH=0 in the environment at
 * rn_connect starts no thread: the waits then end at the next call.  The
 * thread blocks every signal and does not exist in a fork child.
 */
#ifndef RMSNORM_CLIENT_H
#define RMSNORM_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "rn_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; rn_version() gives the library's. */
#define RN_VERSION_MAJOR 0
#define RN_VERSION_MINOR 1
#define RN_VERSION_PATCH 0
/* Compare versions: #if RN_VERSION_NUMBER >= RN_MAKE_VERSION(0, 2, 0) */
#define RN_MAKE_VERSION(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define RN_VERSION_NUMBER RN_MAKE_VERSION(RN_VERSION_MAJOR, RN_VERSION_MINOR, RN_VERSION_PATCH)

#if defined(RN_BUILDING_CLIENT)
#define RN_EXPORT __attribute__((visibility("default")))
#else
#define RN_EXPORT
#endif

/* Sizes of the fixed arrays in the structs below (bytes include the NUL). */
#define RN_NAME_LEN           64  /* backend, device and version strings */
#define RN_UUID_LEN           16  /* device UUID bytes */
#define RN_MAX_REASONS        8   /* health reasons */
#define RN_REASON_LEN         120 /* one health reason */
#define RN_MAX_STATS          96  /* counters in rn_stats_info */
#define RN_MAX_HISTS          8   /* histograms in rn_stats_info */
#define RN_STAT_NAME_LEN      48
#define RN_MAX_BUCKETS        64  /* buckets in rn_hist_buckets */
#define RN_ERRMSG_LEN         256 /* rn_last_error() text */
#define RN_DEFAULT_TIMEOUT_MS 10000

/* ---- connection ----------------------------------------------------------- */

typedef struct rn_client rn_client;

typedef struct rn_connect_opts {
    size_t struct_size;      /* sizeof(rn_connect_opts) or 0 (see ABI above) */
    const char *endpoint;    /* "ipc:///path"; NULL: rn_default_endpoint() */
    int timeout_ms;          /* per request and for rn_connect as a whole;
                                0: RN_DEFAULT_TIMEOUT_MS; -1: wait forever */
    const char *client_name; /* shown in the daemon's log; NULL: "pid <pid>" */
    /* Added in 0.2 (read only when struct_size covers it): how the backward
     * calls reach the daemon, RN_PATH_* below. */
    int path;
} rn_connect_opts;

/*
 * Paths (rn_connect_opts.path):
 *   RN_PATH_DEFAULT  $RMSNORMD_PATH ("classic", "fast" or "auto") when
 *                    set, else RN_PATH_AUTO
 *   RN_PATH_CLASSIC  every call is one request and its reply over the socket
 *   RN_PATH_FAST     calls go through a ring of slots in memory shared with
 *                    the daemon (proto/PROTOCOL.md section 13): no round
 *                    trip per call.  Host calls: rn_rmsnorm_bwd_host_async
 *                    returns without waiting; a daemon that does not offer
 *                    the path fails them with RN_UNSUPPORTED.  Stream calls
 *                    (rn_rmsnorm_bwd, CUDA backend): ready and the wait for
 *                    the call are enqueued on the stream, no reply is
 *                    awaited, and errors surface as for
 *                    rn_rmsnorm_bwd_host_async (the next call on the fast
 *                    path, rn_check, rn_sync; a classic call in between
 *                    does not report them); where the daemon does not
 *                    offer the path,
 *                    rn_rmsnorm_bwd takes the classic path.
 *   RN_PATH_AUTO     rn_rmsnorm_bwd as with RN_PATH_FAST (the fast path
 *                    where the daemon offers it, which the CUDA backend
 *                    does by default), host calls as with RN_PATH_CLASSIC.
 * An invalid RMSNORMD_PATH makes rn_connect fail with RN_INVALID_ARGUMENT.
 * A stream call on the fast path waits for the daemon on a word in device
 * memory that libclient allocates (2 MiB a client); RMSNORMD_DONE_WORD=host
 * at rn_connect makes it wait on the ring's word in host memory instead
 * ("device" is the default; another value: RN_INVALID_ARGUMENT).
 * RMSNORMD_RING_SLOTS=N at rn_connect sets the ring's depth, how many
 * fast-path calls a client may have published and not answered before a
 * call waits on the host for the oldest: a power of two from 1 to 1024
 * (1024 by default; another value: RN_INVALID_ARGUMENT).  The ring takes
 * 512 bytes of shared memory a slot, and 128 KiB for graph slots (about
 * 640 KiB at 1024 slots; on the CUDA backend page-locked in both
 * processes).
 */
enum { RN_PATH_DEFAULT = 0, RN_PATH_CLASSIC = 1, RN_PATH_FAST = 2, RN_PATH_AUTO = 3 };

#define RN_CONNECT_OPTS_INIT {.struct_size = sizeof(rn_connect_opts)}

/*
 * Connect to the daemon and check that it answers (PING).  No session is
 * opened here: the first call that needs one (rn_buffer_alloc, the backward
 * calls, rn_server_info) opens it (HELLO), and fails with RN_BUSY while the
 * daemon is at its session limit; rn_ping, rn_health and rn_stats need
 * none, so they work at that limit too.  opts NULL means all defaults.  On
 * success *out owns the connection; free it with rn_close.  On failure *out
 * is untouched and rn_last_error(NULL) gives the reason in the calling
 * thread.  An endpoint whose socket file is missing or refuses connections
 * fails at once with RN_UNREACHABLE; a daemon that does not answer or
 * accepts no connections (stopped, hung) fails with RN_UNREACHABLE after
 * timeout_ms, which bounds the whole call.
 *
 * Whose socket: in a directory anyone may write to (/tmp, where the
 * fallback endpoint lies) anyone could have created the socket before the
 * daemon, so there it must be a socket of the caller's own or root's, in a
 * sticky directory (else RN_ENDPOINT, naming the path and the owner).
 *
 * Housekeeping: it also removes this user's shared-memory names left behind
 * by client processes that died without rn_close (see rn_buffer_alloc).
 */
RN_EXPORT int rn_connect(const rn_connect_opts *opts, rn_client **out);

/*
 * End the session if one is open (BYE, best effort: a dead daemon only
 * delays it by the timeout), unmap and unlink every buffer still allocated, and free c.
 * Pointers from rn_buffer_alloc are invalid afterwards.  NULL is fine.
 * A client whose calls ran in a CUDA context of the caller's own
 * (cuCtxCreate) keeps objects in it until rn_close: close the client before
 * that context is destroyed.
 */
RN_EXPORT void rn_close(rn_client *c);

/* The generic text and the symbolic name of a status code ("OUT_OF_BOUNDS").
 * Never NULL; static strings. */
RN_EXPORT const char *rn_strerror(int code);
RN_EXPORT const char *rn_err_name(int code);

/*
 * The one-line message of the last failed call on c: the daemon's message
 * when the daemon refused the request, else the library's.  "" if none.
 * c NULL: the last rn_connect failure of the calling thread.  The string
 * belongs to c (or to the thread) and changes with the next failing call.
 */
RN_EXPORT const char *rn_last_error(const rn_client *c);

/*
 * The endpoint a client uses when none is given: $RMSNORMD_ENDPOINT if set,
 * else ipc://$RUNTIME_DIRECTORY/rmsnormd.sock (its first entry when systemd
 * lists several, separated by ':'), else
 * ipc://$XDG_RUNTIME_DIR/rmsnormd.sock, else ipc:///tmp/rmsnormd-$UID.sock
 * (the daemon's defaults).  Writes into buf; returns buf, or NULL if len is
 * too small.
 */
RN_EXPORT const char *rn_default_endpoint(char *buf, size_t len);

/* ---- shared host buffers (CPU backend) --------------------------------------- */

/*
 * Allocate a buffer of `bytes` bytes (> 0) shared with the daemon: a POSIX
 * shared-memory object /rmsnormd.<pid>.<n>, mapped here and registered once
 * with the daemon.  *ptr is page aligned and zero filled.  The buffer belongs
 * to c: free it with rn_buffer_free, or rn_close frees it.
 *
 * The object is mode 0600 and the daemon gets it as a file descriptor on
 * its session channel, so it maps only what the caller could open itself;
 * the library keeps the descriptor while the buffer lives, to register it
 * again after a daemon restart (so each live buffer holds one descriptor of
 * the process).  Its name in /dev/shm is removed as soon as
 * the daemon has the descriptor, so a killed client leaves nothing behind.
 * Only with a daemon that has no session channel (an older rmsnormd) does
 * the name stay while the buffer lives, for that daemon opens it by name:
 * rn_buffer_free, rn_close and the library's exit handler unlink it, and the
 * next rn_connect of the same user removes names whose pid no longer exists.
 * The daemon releases its own mappings of a dead client's buffers by itself.
 */
RN_EXPORT int rn_buffer_alloc(rn_client *c, size_t bytes, void **ptr);

/* Unregister, unmap and unlink a buffer from rn_buffer_alloc (ptr must be the
 * pointer it returned).  NULL is fine.  RN_INVALID_ARGUMENT for any other
 * pointer.  The buffer is released here even when the daemon cannot be told. */
RN_EXPORT int rn_buffer_free(rn_client *c, void *ptr);

/* ---- RMSNorm backward ------------------------------------------------------------ */

/*
 * The arguments of one backward pass; the same fields and meaning as the
 * kernel's (kernels/rnk.h):
 *   xhat = x * rstd           g  = dy * (w + weight_offset)   (g = dy without w)
 *   c    = mean_j(xhat * g)   dx = rstd * (g - xhat * c) [+ dres]
 *   dw_j = sum_i dy_ij * xhat_ij  (fp32, deterministic order, rounded once)
 * x, dy, dx, dres are [m, n] with row strides in elements; w and dw are [n];
 * rstd is [m] fp32 or NULL (recomputed from x with eps).  A tensor is absent
 * when its dtype is RN_DTYPE_NONE (w, dres, dw); its pointer is then ignored.
 * dx may equal dy exactly (in place); no other output may overlap anything.
 */
typedef struct rn_bwd_args {
    size_t struct_size;                   /* sizeof(rn_bwd_args) or 0 (see ABI above) */
    int64_t m;                            /* rows, >= 0 (0: a no-op; outputs untouched) */
    int64_t n;                            /* columns, >= 1 */
    rn_dtype x_dtype, dy_dtype, dx_dtype; /* F32/F16/BF16 */
    rn_dtype w_dtype;                     /* NONE: no weight */
    rn_dtype dres_dtype;                  /* NONE: no dresidual_out */
    rn_dtype dw_dtype;                    /* NONE: dw not computed; else F32 or w_dtype */
    const void *x;
    int64_t x_stride;
    const void *dy;
    int64_t dy_stride;
    void *dx;
    int64_t dx_stride;
    const void *w;
    const float *rstd;
    const void *dres;
    int64_t dres_stride;
    void *dw;
    float eps;
    float weight_offset;
} rn_bwd_args;

/* rn_bwd_args a = RN_BWD_ARGS_INIT; then set the fields. */
#define RN_BWD_ARGS_INIT {.struct_size = sizeof(rn_bwd_args)}

/* Times of one request, nanoseconds. */
typedef struct rn_timing {
    uint64_t queue_ns;   /* daemon: receipt to start of compute */
    uint64_t compute_ns; /* daemon: the computation itself */
    uint64_t total_ns;   /* client: the whole call, round trip included */
} rn_timing;

/*
 * Run the backward pass in the daemon and wait for it (CPU backend).  Every
 * pointer must lie inside a buffer from rn_buffer_alloc of this client (else
 * RN_NOT_SHARED naming the field); the library turns each into (region,
 * offset) and the daemon checks bounds, alignment and aliasing.  On success
 * the outputs are written and *t (if not NULL) gets the times.
 *
 * After a daemon restart the call opens a new session, registers every live
 * buffer again and retries once; if that fails it returns the error
 * (RN_UNREACHABLE, RN_TIMEOUT, ...) and the next call tries again.  While
 * no daemon listens at the endpoint, a call waits for one (a restart) at
 * most the client's timeout, then fails with RN_UNREACHABLE; once a whole
 * timeout went by without one, calls fail at once until one listens again.
 * A call is run again only where that gives the same result: where no
 * output overlaps an input.  An in-place call (dx == dy) that the daemon
 * may have begun before it died (a crash or restart during the call) is not
 * run again: it returns RN_RESTARTED, and dx, dw and dy may be partly
 * written; restore the inputs and call again.
 * After RN_TIMEOUT the daemon may still run the request and write its
 * outputs later; treat them as undefined until a new call rewrites them
 * (and, for an in-place call, dy with them).
 */
RN_EXPORT int rn_rmsnorm_bwd_host(rn_client *c, const rn_bwd_args *a, rn_timing *t);

/*
 * The fast path's calls (RN_PATH_FAST; on the classic path they are plain
 * synchronous calls):
 * rn_rmsnorm_bwd_host_async publishes the call in the ring and returns
 * without waiting for it; calls run in the order they were made.  The
 * outputs are written once rn_sync has returned; until then the caller must
 * not write the inputs or read the outputs.  When the ring is full it
 * waits for the oldest call to finish.  Errors of the arguments the library
 * can check come back at once; the daemon's (validation, bounds, a failed
 * computation) are recorded in the call's slot and surface later: the next
 * call made after the failed one finished returns it (and is not run); a
 * synchronous call (rn_rmsnorm_bwd_host) returns the first error among the
 * calls up to its own (it ran, unless an earlier call's error was known
 * when it was made: then, as for the next call above, it returns that
 * error and is not run); rn_sync and rn_check return it too.  Each error
 * is reported once; rn_last_error names the call by its sequence
 * number ("call 7: bwd.dx: ..."), and where more calls failed or were lost
 * after it before it was reported, how many and the last of them ("call 7:
 * ... (and 2 errors after it; the last: calls 9..10: ...)"): the code
 * returned is the first one's.
 * rn_sync waits until every call made so far has finished and returns the
 * first error not yet reported (0: none); RN_TIMEOUT after the client's
 * timeout.  rn_check returns the same without waiting, for the calls that
 * have finished.  rn_client_path says which path the client uses
 * (RN_PATH_CLASSIC, RN_PATH_FAST or RN_PATH_AUTO).
 */
RN_EXPORT int rn_rmsnorm_bwd_host_async(rn_client *c, const rn_bwd_args *a);
RN_EXPORT int rn_sync(rn_client *c);
RN_EXPORT int rn_check(rn_client *c);
RN_EXPORT int rn_client_path(const rn_client *c);

/*
 * Stream-ordered variants on device pointers (CUDA backend): rn_rmsnorm_bwd
 * enqueues the work after everything already on cuda_stream (a cudaStream_t)
 * and returns without synchronising the host; later work on the stream sees
 * the results.  rn_rmsnorm_bwd_sync returns after completion, with times.
 * A library built without CUDA support returns RN_UNSUPPORTED.  On the
 * fast path a client's calls run in the order they were made, whatever
 * their streams: a call on another stream than the previous call's waits
 * on its stream for the previous call's inputs too (and a host-path call
 * waits for them on the host).  A client per stream avoids that coupling.
 * rn_close does not wait for the streams: memory a stream may still write
 * or wait on (a call whose producer has not finished) stays mapped until
 * the process exits; synchronise the streams first to have it freed.
 * CUDA graphs: rn_rmsnorm_bwd on a stream being captured joins the graph
 * on the fast path (every replay runs the call on the replay's inputs);
 * rn_rmsnorm_bwd_sync, and any call on the classic path, is refused there
 * (RN_UNSUPPORTED).  A graph with such calls may be instantiated once (no
 * second instantiation, clone or use as a child graph): its replays share
 * the call's slot, and CUDA orders the launches of one instantiation only
 * (proto/PROTOCOL.md 13.8).
 */
RN_EXPORT int rn_rmsnorm_bwd(rn_client *c, const rn_bwd_args *a, void *cuda_stream);
RN_EXPORT int rn_rmsnorm_bwd_sync(rn_client *c, const rn_bwd_args *a, void *cuda_stream,
                                  rn_timing *t);

/* ---- observation ------------------------------------------------------------------- */

/* One round trip to the daemon; *rtt_ns (may be NULL) gets its duration.
 * rn_ping, rn_health and rn_stats need no session. */
RN_EXPORT int rn_ping(rn_client *c, uint64_t *rtt_ns);

enum { RN_HEALTH_OK = 0, RN_HEALTH_DEGRADED = 1, RN_HEALTH_FAILING = 2 };

/* Reserved space at the end of the structs the library fills in (zero). */
#define RN_RESERVED_WORDS 8

typedef struct rn_health_info {
    size_t struct_size;        /* set by the library: bytes it filled in */
    int state;                 /* RN_HEALTH_OK, _DEGRADED or _FAILING */
    int mps;                   /* 1: the daemon runs as an MPS client */
    char backend[RN_NAME_LEN]; /* "cpu" or "cuda" */
    unsigned nreasons;         /* why it is not OK */
    char reasons[RN_MAX_REASONS][RN_REASON_LEN];
    uint64_t reserved[RN_RESERVED_WORDS];
} rn_health_info;

RN_EXPORT int rn_health(rn_client *c, rn_health_info *h);

typedef struct rn_stat {
    char name[RN_STAT_NAME_LEN]; /* "requests.bwd", "errors.OUT_OF_BOUNDS", ... */
    uint64_t value;
} rn_stat;

/* A latency histogram, nanoseconds ("queue", "compute", "total"). */
typedef struct rn_hist {
    char name[RN_STAT_NAME_LEN];
    uint64_t count, p50, p90, p99, max;
} rn_hist;

typedef struct rn_stats_info {
    size_t struct_size; /* set by the library: bytes it filled in */
    char backend[RN_NAME_LEN];
    char device[RN_NAME_LEN];
    unsigned nstats;
    rn_stat stats[RN_MAX_STATS];
    unsigned nhists;
    rn_hist hists[RN_MAX_HISTS];
    uint64_t reserved[RN_RESERVED_WORDS];
} rn_stats_info;

/* The daemon's counters and histograms, in the daemon's order. */
RN_EXPORT int rn_stats(rn_client *c, rn_stats_info *s);

/* One bucket of a latency histogram: `count` values v with
 * previous bucket's le_ns < v <= le_ns (the first bucket starts at 0). */
typedef struct rn_bucket {
    uint64_t le_ns;
    uint64_t count; /* this bucket's own count, not cumulative */
} rn_bucket;

/*
 * The buckets and the sum of one latency histogram, beside its rn_hist.
 *
 * Why a struct and a call of their own: rn_stats_info has a fixed size (it
 * ends in reserved space, see ABI above), and the buckets of RN_MAX_HISTS
 * histograms (8 KiB) do not fit its reserved words, while growing rn_hist
 * or rn_stats_info would make the library write past the struct of every
 * program built against 0.1.  So the buckets come in this separate struct,
 * which follows the same rules (fixed size, reserved space, struct_size set
 * by the library), from rn_stats_hist_buckets below, and rn_stats stays as
 * it was.
 */
typedef struct rn_hist_buckets {
    size_t struct_size;          /* set by the library: bytes it filled in */
    char name[RN_STAT_NAME_LEN]; /* the histogram's name, as in rn_hist */
    int present;                 /* 1: the daemon sent buckets and sum;
                                    0: it is older than 0.2 and sends neither */
    unsigned nbuckets;           /* 0 .. RN_MAX_BUCKETS */
    uint64_t count;              /* values in the histogram: the buckets' total */
    uint64_t sum_ns;             /* sum of the values (wraps past 2^64 - 1) */
    /* The non-empty buckets, le_ns strictly ascending.  They are the
     * daemon's log-scale buckets (2^3 per power of two); when more than
     * RN_MAX_BUCKETS are non-empty, the daemon merges aligned runs of them
     * (4, 2 or 1 per power of two), so a bound is always exact: cumulative
     * counts at every le_ns are exact. */
    rn_bucket buckets[RN_MAX_BUCKETS];
    uint64_t reserved[RN_RESERVED_WORDS];
} rn_hist_buckets;

/*
 * rn_stats, plus the buckets of each histogram, from the same STATS reply
 * (so counts agree): *s is filled as by rn_stats, and b[i] (for i < nb)
 * belongs to s->hists[i], with the same name; entries from s->nhists on are
 * zero but for struct_size.  b may be NULL when nb is 0; nb RN_MAX_HISTS
 * holds every histogram.
 */
RN_EXPORT int rn_stats_hist_buckets(rn_client *c, rn_stats_info *s, rn_hist_buckets *b,
                                    unsigned nb);

/* The value of counter `name` in s, or `dflt` when s has no such counter. */
RN_EXPORT uint64_t rn_stats_get(const rn_stats_info *s, const char *name, uint64_t dflt);

/*
 * What the daemon said in HELLO; opens the session if none is open yet
 * (RN_BUSY at the daemon's session limit).  The type is `struct
 * rn_server_info` (it shares its name with the function, so it has no
 * typedef).
 */
struct rn_server_info {
    size_t struct_size; /* set by the library: bytes it filled in */
    char endpoint[256]; /* where this client is connected */
    char daemon_version[RN_NAME_LEN];
    char backend[RN_NAME_LEN]; /* "cpu" or "cuda" */
    char device_name[RN_NAME_LEN];
    uint8_t device_uuid[RN_UUID_LEN]; /* zero for the CPU backend */
    unsigned sm_count;                /* CPU backend: worker threads */
    unsigned cc_major, cc_minor;      /* CPU backend: 0, 0 */
    int mps;                          /* 1: the daemon runs as an MPS client */
    unsigned protocol_version;
    /* The daemon's limits. */
    unsigned max_sessions, max_regions, max_inflight, max_inflight_total;
    uint64_t max_m;
    unsigned max_n, max_msg, event_slots;
    uint64_t reserved[RN_RESERVED_WORDS];
};

RN_EXPORT int rn_server_info(rn_client *c, struct rn_server_info *i);

/* The library's version, "MAJOR.MINOR.PATCH" (RN_VERSION_* above are the
 * header's: they differ when a program runs with a newer library). */
RN_EXPORT const char *rn_version(void);

#ifdef __cplusplus
}
#endif

#endif /* RMSNORM_CLIENT_H */
