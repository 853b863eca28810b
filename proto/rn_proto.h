/* SPDX-License-Identifier: MIT */
/*
 * rn_proto.h - rmsnormd's wire protocol: message structs, pure encode/decode
 * (bytes in, struct or error out; no I/O, no logging, no global state) and the
 * validation helpers the daemon applies to a decoded BWD request; the error
 * table as text; and the endpoint helpers that the daemon and libclient share
 * (rnp_default_endpoint is the one function here that reads the environment).
 *
 * proto/ depends on msgpack-c and on nothing else of ours except rn_wire.h.
 * The specification is proto/PROTOCOL.md; where this header and it differ,
 * one of them is wrong.
 *
 * Internal (non-static) names in proto/ use the prefix rnp_.
 */
#ifndef RN_PROTO_H
#define RN_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rn_wire.h"

#define RNP_VERSION 1u           /* protocol version this code speaks */
#define RNP_MAX_MSG (64u * 1024) /* largest valid message body, bytes (SP header not counted) */
/* The longest message body the daemon's transport delivers to the decoder
 * (its NN_RCVMAXSIZE is this plus nanomsg's 4-byte SP request-id header):
 * a body of RNP_MAX_MSG + 1 ... RNP_MAX_RECV bytes is answered RN_TOO_BIG;
 * nanomsg drops a longer one, and its connection, without a reply. */
#define RNP_MAX_RECV (2u * RNP_MAX_MSG)
#define RNP_SEQ_WINDOW_MIN 128u  /* smallest duplicate window: max(2 x max_inflight, this) */
#define RNP_MAX_DEPTH 4          /* nesting limit of maps/arrays */
#define RNP_MAX_NAME 64          /* client name, device name, backend: bytes incl. NUL */
#define RNP_MAX_SHM_NAME 250     /* POSIX shm name incl. leading '/', excl. NUL */
#define RNP_MAX_ERRMSG 200       /* error message bytes incl. NUL */
#define RNP_IPC_HANDLE_BYTES 64  /* cudaIpcMemHandle_t / cudaIpcEventHandle_t */
#define RNP_UUID_BYTES 16
#define RNP_SESSION_BYTES 16     /* 128-bit session capability */
#define RNP_MAX_EVENTS 16        /* ready/done event ring size limit */
#define RNP_MAX_STATS 96         /* counters in a STATS reply */
#define RNP_MAX_HISTS 8          /* histograms in a STATS reply */
#define RNP_MAX_BUCKETS 64       /* buckets of one histogram in a STATS reply */
#define RNP_BUCKET_BYTES 16      /* one bucket on the wire: upper bound, count (u64 LE each) */
#define RNP_MAX_REASONS 8        /* HEALTH reasons */
#define RNP_STAT_NAME 48         /* counter/histogram name bytes incl. NUL */
#define RNP_REASON_LEN 120       /* HEALTH reason bytes incl. NUL */

/* An error with a one-line message that names the field, e.g.
 * code RN_BAD_TYPE, msg "bwd.n: expected unsigned integer". */
typedef struct rnp_error {
    int code;                  /* rn_status */
    char msg[RNP_MAX_ERRMSG];
} rnp_error;

/* Sets err (if not NULL) and returns code.  printf-style. */
int rnp_fail(rnp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The error table (rn_wire.h's RN_ERRORS) as text: the one place that makes
 * names and messages of status codes.  libclient's rn_strerror and
 * rn_err_name return exactly these.  Never NULL, and static: a code that is
 * not in the table (a newer peer's, or garbage) gives "unknown error" and
 * "UNKNOWN", so a caller may print the result without checking it.
 */
const char *rnp_strerror(int code);  /* RN_OUT_OF_BOUNDS: "tensor extends past ..." */
const char *rnp_err_name(int code);  /* RN_OUT_OF_BOUNDS: "OUT_OF_BOUNDS"; else "UNKNOWN" */
/* The small name tables, likewise static and never NULL. */
const char *rnp_op_name(int op);     /* "bwd"; "unknown" */
const char *rnp_dtype_name(int dt);  /* "bf16"; "none"; "invalid" */
size_t rnp_dtype_size(int dt);       /* bytes per element; 0 for NONE/invalid */
/* Whether a request (request true) or a success reply of op has a body:
 * HELLO, REGISTER, EVENTS, BWD both; UNREGISTER, BYE requests only; PING,
 * HEALTH, STATS replies only; an unknown op neither. */
bool rnp_op_has_body(uint32_t op, bool request);

/* Typed ids on the wire. */
typedef struct rnp_session { uint8_t b[RNP_SESSION_BYTES]; } rnp_session;
typedef struct rnp_region_id { uint32_t id; } rnp_region_id;  /* 0 is never valid */

/* ---- requests ----------------------------------------------------------- */

typedef struct rnp_hello_req {
    char client_name[RNP_MAX_NAME];
    uint32_t pid;                  /* client's pid, watched by the daemon */
} rnp_hello_req;

typedef enum rnp_region_kind {
    RNP_REGION_SHM = 1,            /* POSIX shared memory object */
    RNP_REGION_CUDA_IPC = 2,       /* cudaIpcMemHandle_t of a cudaMalloc allocation */
} rnp_region_kind;

typedef struct rnp_register_req {
    rnp_session session;
    uint32_t kind;                 /* rnp_region_kind */
    uint64_t size;                 /* bytes the client claims the region has */
    char shm_name[RNP_MAX_SHM_NAME + 1];                 /* kind == SHM */
    uint8_t ipc_handle[RNP_IPC_HANDLE_BYTES];            /* kind == CUDA_IPC */
    uint8_t device_uuid[RNP_UUID_BYTES];                 /* kind == CUDA_IPC */
} rnp_register_req;

typedef struct rnp_unregister_req {
    rnp_session session;
    rnp_region_id region;
} rnp_unregister_req;

typedef struct rnp_events_req {
    rnp_session session;
    uint32_t n;                    /* 1..RNP_MAX_EVENTS */
    uint8_t ready[RNP_MAX_EVENTS][RNP_IPC_HANDLE_BYTES];  /* cudaIpcEventHandle_t */
    uint8_t device_uuid[RNP_UUID_BYTES];
} rnp_events_req;

/* One tensor: a region, a byte offset into it, and a row stride in elements. */
typedef struct rnp_tensor {
    rnp_region_id region;
    uint64_t offset;               /* bytes from the start of the region */
    uint64_t stride;               /* elements between rows; >= N (ignored for 1-D) */
} rnp_tensor;

typedef enum rnp_mode { RNP_MODE_ASYNC = 0, RNP_MODE_SYNC = 1 } rnp_mode;
typedef enum rnp_ordering { RNP_ORDER_EVENTS = 0 } rnp_ordering;  /* room for stream-memops */

typedef struct rnp_bwd_req {
    rnp_session session;
    uint64_t seq;                  /* per session, increasing; dedupes REQ re-sends */
    uint64_t m;                    /* rows, >= 0 */
    uint32_t n;                    /* columns, >= 1 */
    uint8_t x_dtype, dy_dtype, dx_dtype;          /* F32/F16/BF16 */
    uint8_t w_dtype;                              /* NONE when no weight */
    uint8_t dres_dtype;                           /* NONE when no dresidual_out */
    uint8_t dw_dtype;                             /* NONE when dw not wanted */
    rnp_tensor x, dy, dx;          /* [m, n] with row strides */
    bool has_w, has_rstd, has_dres, has_dw;
    rnp_tensor w;                  /* [n] */
    rnp_tensor rstd;               /* [m] fp32; absent: recomputed from x with eps */
    rnp_tensor dres;               /* [m, n] with row stride */
    rnp_tensor dw;                 /* [n] */
    float eps;
    float weight_offset;
    int32_t ready_slot;            /* -1: no event to wait on (CPU backend) */
    uint32_t mode;                 /* rnp_mode */
    uint32_t ordering;             /* rnp_ordering */
} rnp_bwd_req;

/* RING_OPEN: the fast path's ring (rn_ring.h) at offset bytes into region. */
typedef struct rnp_ring_open_req {
    rnp_session session;
    rnp_region_id region;
    uint64_t offset;               /* a multiple of RNP_RING_ALIGN */
    uint32_t slots;                /* a power of two, 1 .. RNP_RING_MAX_SLOTS */
    /* Optional (region 0: none): a u64 at done_offset in a device region
     * of the session that the daemon writes done to as well, for the
     * client's streams to wait on (PROTOCOL.md 13.2). */
    rnp_region_id done_region;
    uint64_t done_offset;
    /* Optional (false: absent): the client's stream writes the ring's go
     * word after ready at every call and orders its calls on several
     * streams by go (rn_ring.h's RNP_RING_O_GO; PROTOCOL.md 13.3), so that
     * the daemon may queue a call's kernel before ready and end its wait
     * with its own bit of ready (--ring-ready=armed). */
    bool go;
} rnp_ring_open_req;

typedef struct rnp_ring_close_req {
    rnp_session session;
    uint32_t ring;                 /* from RING_OPEN's reply */
} rnp_ring_close_req;

/* GRAPH_OPEN: a graph slot (rn_ring.h, PROTOCOL.md 13.8) of the open ring,
 * at offset bytes into the ring's region; GRAPH_CLOSE gives it back. */
typedef struct rnp_graph_open_req {
    rnp_session session;
    uint32_t ring;                 /* from RING_OPEN's reply */
    uint64_t offset;               /* a multiple of RNP_RING_ALIGN, outside the ring */
} rnp_graph_open_req;

typedef struct rnp_graph_close_req {
    rnp_session session;
    uint32_t ring;
    uint32_t graph;                /* from GRAPH_OPEN's reply */
} rnp_graph_close_req;

typedef struct rnp_request {
    uint32_t version;              /* envelope "v" */
    uint32_t op;                   /* rn_op */
    uint64_t id;                   /* request id, echoed in the reply */
    union {
        rnp_hello_req hello;
        rnp_register_req reg;
        rnp_unregister_req unreg;
        rnp_events_req events;
        rnp_bwd_req bwd;
        rnp_session bye;           /* BYE: the session to end */
        rnp_ring_open_req ring_open;
        rnp_ring_close_req ring_close;
        rnp_graph_open_req graph_open;
        rnp_graph_close_req graph_close;
        /* PING, HEALTH, STATS: no body */
    } u;
} rnp_request;

/* ---- replies ------------------------------------------------------------ */

typedef struct rnp_limits {
    uint32_t max_sessions;
    uint32_t max_regions;          /* per session */
    uint32_t max_inflight;         /* per session */
    uint32_t max_inflight_total;
    uint64_t max_m;
    uint32_t max_n;
    uint32_t max_msg;              /* bytes */
    uint32_t event_slots;          /* max ready/done ring size */
    uint32_t seq_window;           /* BWD results remembered per session for re-sent
                                      copies; 0: not reported (a 0.1.0 daemon) */
} rnp_limits;

typedef struct rnp_hello_rep {
    rnp_session session;
    char daemon_version[RNP_MAX_NAME];
    char backend[RNP_MAX_NAME];    /* "cpu" or "cuda" */
    char device_name[RNP_MAX_NAME];
    uint8_t device_uuid[RNP_UUID_BYTES];   /* zero for the CPU backend */
    uint32_t sm_count;             /* CPU backend: worker threads */
    uint32_t cc_major, cc_minor;   /* CPU backend: 0, 0 */
    bool mps;                      /* daemon is an MPS client */
    rnp_limits limits;
    bool channel;                  /* the daemon serves the session channel
                                      (PROTOCOL.md section 12); false from a
                                      daemon that does not send the key */
    uint32_t paths;                /* RNP_PATH_* the daemon offers; 0 from a daemon
                                      that does not send the key: classic only */
} rnp_hello_rep;

/* HELLO's paths: how BWD work may be submitted. */
#define RNP_PATH_CLASSIC 1u        /* BWD over nanomsg */
#define RNP_PATH_FAST 2u           /* the ring (RING_OPEN, rn_ring.h) */

typedef struct rnp_ring_open_rep { uint32_t ring; } rnp_ring_open_rep;
typedef struct rnp_graph_open_rep { uint32_t graph; } rnp_graph_open_rep;

typedef struct rnp_register_rep { rnp_region_id region; } rnp_register_rep;

typedef struct rnp_events_rep {
    uint32_t n;
    uint8_t done[RNP_MAX_EVENTS][RNP_IPC_HANDLE_BYTES];
} rnp_events_rep;

typedef struct rnp_bwd_rep {
    uint64_t seq;
    int32_t done_slot;             /* -1 for the CPU backend / sync mode */
    uint64_t queue_ns;             /* receipt to start of compute */
    uint64_t compute_ns;           /* sync/CPU: kernel or twin time; async: 0 */
} rnp_bwd_rep;

typedef enum rnp_health_state {
    RNP_HEALTH_OK = 0, RNP_HEALTH_DEGRADED = 1, RNP_HEALTH_FAILING = 2,
} rnp_health_state;

typedef struct rnp_health_rep {
    uint32_t state;                /* rnp_health_state */
    bool mps;
    char backend[RNP_MAX_NAME];
    uint32_t nreasons;
    char reasons[RNP_MAX_REASONS][RNP_REASON_LEN];
} rnp_health_rep;

typedef struct rnp_stat { char name[RNP_STAT_NAME]; uint64_t value; } rnp_stat;

/* One bucket of a histogram: count values v with previous bucket's
 * upper bound < v <= upper (the first bucket starts at 0). */
typedef struct rnp_bucket { uint64_t upper, count; } rnp_bucket;

/* A latency histogram summarised from log-scale buckets, nanoseconds.  The
 * buckets and the sum are optional on the wire (a daemon before 0.2 sends
 * neither): has_buckets says whether they came.  When it is true the upper
 * bounds ascend strictly and the counts add up to count. */
typedef struct rnp_hist {
    char name[RNP_STAT_NAME];
    uint64_t count, p50, p90, p99, max;
    bool has_buckets;
    uint64_t sum;                  /* of all values; wraps past 2^64 - 1 */
    uint32_t nbuckets;             /* non-empty buckets, 0..RNP_MAX_BUCKETS */
    rnp_bucket buckets[RNP_MAX_BUCKETS];
} rnp_hist;

typedef struct rnp_stats_rep {
    char backend[RNP_MAX_NAME];
    char device[RNP_MAX_NAME];
    uint32_t nstats;
    rnp_stat stats[RNP_MAX_STATS];   /* e.g. "requests.bwd", "errors.OUT_OF_BOUNDS" */
    uint32_t nhists;
    rnp_hist hists[RNP_MAX_HISTS];   /* "queue", "compute", "total" */
} rnp_stats_rep;

typedef struct rnp_ping_rep { uint64_t daemon_time_ns; } rnp_ping_rep;

typedef struct rnp_reply {
    uint32_t version;
    uint32_t op;                   /* the request's op */
    uint64_t id;                   /* the request's id */
    int32_t status;                /* rn_status; 0 = success */
    char error[RNP_MAX_ERRMSG];    /* one line naming the field, when status != 0 */
    union {
        rnp_hello_rep hello;
        rnp_register_rep reg;
        rnp_events_rep events;
        rnp_bwd_rep bwd;
        rnp_health_rep health;
        rnp_stats_rep stats;
        rnp_ping_rep ping;
        rnp_ring_open_rep ring_open;
        rnp_graph_open_rep graph_open;
        /* UNREGISTER, BYE, RING_CLOSE, GRAPH_CLOSE: no body */
    } u;
} rnp_reply;

/* ---- encode / decode ---------------------------------------------------- */

/*
 * Encode into buf (capacity cap).  On success returns 0 and sets *len.
 * Returns RN_TOO_BIG if cap is too small, RN_INVALID_ARGUMENT for a struct
 * that cannot be encoded (unknown op, over a limit, a string not terminated
 * inside its array).  Nothing is allocated.  Values are not range-checked, so
 * tests can encode requests that the daemon must reject.  Optional bwd
 * fields at their defaults (see rnp_decode_request) are left out; an error
 * reply (status != 0) carries "error" and no body.
 */
int rnp_encode_request(const rnp_request *req, void *buf, size_t cap, size_t *len,
                       rnp_error *err);
int rnp_encode_reply(const rnp_reply *rep, void *buf, size_t cap, size_t *len,
                     rnp_error *err);

/*
 * Decode untrusted bytes.  Returns 0 and fills *out, or an rn_status with err
 * naming the field.  Never allocates anything; requires exactly one msgpack
 * object and no trailing bytes.  *out is written only on success... except
 * that on failure out->op and out->id are always set: to the message's
 * top-level "op" and "id" when they could be read as unsigned integers, else
 * to 0, so the daemon can address its error reply (also for RN_TOO_BIG:
 * the daemon hands over bodies up to RNP_MAX_RECV bytes).  out and err may
 * be NULL.  err->msg is one line of printable ASCII: names taken from the
 * wire appear in it with every other byte as '?'.
 *
 * The order of checks is PROTOCOL.md's (sections 2 and 3): len against
 * RNP_MAX_MSG before anything else ("message: N bytes, limit 65536"), the
 * structure, then a request's version before any other envelope field.
 * Requests are strict (unknown keys: RN_UNKNOWN_FIELD; a key twice, known
 * or not: RN_DUPLICATE_FIELD); replies skip unknown keys.  A decoded bwd request has ready_slot -1, weight_offset 0, mode and
 * ordering 0 where the keys were absent, and has_X false with X and X_dtype
 * zero for each absent optional tensor.  Range checks of enumerations (dtype
 * 0..3, region kind, mode, ready slot) happen here; shapes, strides, regions
 * and the consistency of dtypes are rnp_validate_bwd's.
 */
int rnp_decode_request(const void *buf, size_t len, rnp_request *out, rnp_error *err);
int rnp_decode_reply(const void *buf, size_t len, rnp_reply *out, rnp_error *err);

/* Fill a reply header for req with an error.  Convenience for the daemon. */
void rnp_reply_error(rnp_reply *rep, const rnp_request *req, int code, const char *msg);

/*
 * A 64-bit digest of a decoded BWD request: FNV-1a over every field of the
 * body, one by one (never over the struct's memory), so that the daemon can
 * tell a re-sent copy of (session, seq) from another request that reuses the
 * seq (RN_SEQ_REUSED).  Covered: session, seq, m, n; for each tensor in the
 * order x, dy, dx, w, rstd, dres, dw whether it is present and, if it is,
 * its region, offset, dtype (none for rstd) and stride (2-D tensors only);
 * eps and weight_offset (float32 bits, -0.0 as 0.0), ready, mode, ordering.
 * Not covered: the envelope (v, op, the message id).  Fields are taken as
 * decoded, so an optional field left out and the same field at its default
 * give the same digest, and so do a float 64 and a float 32 of one value.
 * Returns 0 for b NULL.
 */
uint64_t rnp_bwd_digest(const rnp_bwd_req *b);

/* ---- endpoint ------------------------------------------------------------ */

#define RNP_SUN_PATH_MAX 108   /* sizeof sockaddr_un.sun_path: path plus NUL */

/*
 * The endpoint when none is configured: ipc://DIR/rmsnormd.sock with DIR the
 * first entry of RUNTIME_DIRECTORY (systemd lists several separated by ':'),
 * else XDG_RUNTIME_DIR; else ipc:///tmp/rmsnormd-$UID.sock.  An unset or
 * empty variable (or an empty first entry) counts as absent.  Returns 0, or
 * RN_ENDPOINT with err when it does not fit outlen (out NULL fits nothing);
 * out is written only on success.  Reads no other variable
 * (RMSNORMD_ENDPOINT is libclient's override, applied before calling this).
 * The result is not checked: pass it to rnp_check_endpoint like any other.
 */
int rnp_default_endpoint(char *out, size_t outlen, rnp_error *err);

/*
 * Check an endpoint: ipc:// only, a non-empty socket path shorter than
 * RNP_SUN_PATH_MAX.  On success *path (if path is not NULL) points at the
 * path inside ep.  Returns 0 or RN_ENDPOINT with err (ep NULL included).
 * Nothing is opened: whether a daemon listens is the caller's to find out.
 */
int rnp_check_endpoint(const char *ep, const char **path, rnp_error *err);

/* ---- the session channel (PROTOCOL.md section 12) ------------------------ */

/*
 * A SOCK_SEQPACKET Unix socket at the nanomsg socket's path plus ".chan".
 * Every datagram is one message of a fixed size: an 8-byte header (magic
 * u32, version u16, type u16) and a body, all integers little-endian.  The
 * daemon and libclient read and write them with rnp_chan_parse and
 * rnp_chan_encode (proto/chan.c), field by field, never by casting a struct
 * over the bytes.
 */
#define RNP_CHAN_SUFFIX ".chan"

/* What a daemon at its connection limit (--max-connections) writes on a new
 * connection before it closes it, in place of nanomsg's 8-byte SP header
 * (PROTOCOL.md, "Connections"). */
#define RNP_CONN_REFUSED "\0RN\0FULL"
#define RNP_CONN_REFUSED_LEN 8
#define RNP_CHAN_MAGIC 0x68636e72u     /* the bytes "rnch" */
#define RNP_CHAN_VERSION 1
#define RNP_CHAN_HDR 8

enum rnp_chan_type {
    RNP_CHAN_AUTH = 1,                 /* capability[16]                    -> AUTH_OK */
    RNP_CHAN_REGISTER_FD = 2,          /* size u64, one descriptor attached -> REGION_OK */
    RNP_CHAN_VMM_CHUNK = 3,            /* offset u64, size u64, index u32, reserved u32 (0);
                                        * one descriptor attached        -> VMM_CHUNK_OK */
    RNP_CHAN_VMM_MAP = 4,              /* total u64, count u32, reserved u32 (0),
                                        * device_uuid[16]                 -> REGION_OK */
    RNP_CHAN_AUTH_OK = 0x81,           /* pid u32, uid u32 (the verified peer) */
    RNP_CHAN_REGION_OK = 0x82,         /* region u32, reserved u32 (0) */
    RNP_CHAN_VMM_CHUNK_OK = 0x83,      /* index u32, reserved u32 (0) */
    RNP_CHAN_ERROR = 0xff,             /* code u32, message[116] (NUL-terminated) */
};

/* Each message's whole length, header included. */
#define RNP_CHAN_AUTH_LEN (RNP_CHAN_HDR + RNP_SESSION_BYTES)
#define RNP_CHAN_REGISTER_FD_LEN (RNP_CHAN_HDR + 8)
#define RNP_CHAN_AUTH_OK_LEN (RNP_CHAN_HDR + 8)
#define RNP_CHAN_REGION_OK_LEN (RNP_CHAN_HDR + 8)
#define RNP_CHAN_VMM_CHUNK_LEN (RNP_CHAN_HDR + 24)
#define RNP_CHAN_VMM_MAP_LEN (RNP_CHAN_HDR + 16 + RNP_UUID_BYTES)
#define RNP_CHAN_VMM_CHUNK_OK_LEN (RNP_CHAN_HDR + 8)
#define RNP_CHAN_ERROR_MSG 116
#define RNP_CHAN_ERROR_LEN (RNP_CHAN_HDR + 4 + RNP_CHAN_ERROR_MSG)
#define RNP_CHAN_MAX RNP_CHAN_ERROR_LEN   /* the longest message */

static inline void rnp_le16_put(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static inline void rnp_le32_put(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void rnp_le64_put(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t rnp_le16_get(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t rnp_le32_get(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t rnp_le64_get(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
/* The header of a message of type t into p (RNP_CHAN_HDR bytes). */
static inline void rnp_chan_hdr(uint8_t *p, uint16_t t)
{
    rnp_le32_put(p, RNP_CHAN_MAGIC);
    rnp_le16_put(p + 4, RNP_CHAN_VERSION);
    rnp_le16_put(p + 6, t);
}

/* Descriptors one message may carry: a receiver takes in at most this many
 * (a well-behaved client sends one, with REGISTER_FD), and more make the
 * message too big. */
#define RNP_CHAN_MAX_FDS 16

/* rnp_chan_msg.type before a valid header was seen (no type on the wire,
 * where 0 is merely an unknown type). */
#define RNP_CHAN_NONE (-1)

/* One message of the channel, parsed or to be encoded. */
typedef struct rnp_chan_msg {
    int type;                          /* enum rnp_chan_type, the wire's value of an
                                        * unknown type, or RNP_CHAN_NONE */
    union {
        struct { rnp_session session; } auth;           /* the capability from HELLO */
        struct { uint64_t size; } register_fd;
        struct {
            uint64_t offset, size;                      /* in the range; the allocation's */
            uint32_t index;                             /* 0, 1, ... within the range */
        } vmm_chunk;
        struct {
            uint64_t total;                             /* bytes of the range */
            uint32_t count;                             /* chunks sent for it */
            uint8_t device_uuid[RNP_UUID_BYTES];
        } vmm_map;
        struct { uint32_t index; } vmm_chunk_ok;
        struct { uint32_t pid, uid; } auth_ok;
        struct { uint32_t region; } region_ok;          /* reserved: written 0, not read */
        struct {
            uint32_t code;                              /* an rn_status, as sent */
            char msg[RNP_CHAN_ERROR_MSG];               /* NUL-terminated */
        } error;
    } u;
} rnp_chan_msg;

/* The whole length of a message of type t, header included; 0 for a type
 * that is not the channel's. */
size_t rnp_chan_len(int t);

/*
 * Parse one datagram of len bytes (m may be NULL when len is 0), received
 * with nfds descriptors; truncated: the receiver saw it cut (MSG_TRUNC,
 * MSG_CTRUNC).  Checks, in this order (PROTOCOL.md section 12): truncated
 * or more than RNP_CHAN_MAX_FDS descriptors (RN_TOO_BIG, "message"), shorter
 * than the header (RN_MALFORMED, "message"), the magic (RN_MALFORMED,
 * "message.magic"), the version (RN_BAD_VERSION, "message.version"), the
 * type (RN_UNKNOWN_OP, "message.type"), the descriptors (REGISTER_FD and
 * VMM_CHUNK exactly one, every other type none: RN_INVALID_ARGUMENT, naming the
 * type: "auth: carries no descriptors, got 1"), the type's exact length
 * (RN_MALFORMED, "auth: 23 bytes, expected 24").  Requests and replies
 * alike: which ones a side accepts is its own business.  Field values are
 * not judged (a size of 0, a region of 0, an unknown error code), and
 * REGION_OK's reserved field is not read.
 *
 * *msg is zeroed first; its type is set as soon as the header is valid,
 * so a caller can count a message that fails later.  An ERROR's message is
 * NUL-terminated whatever the bytes (cut at its last byte) and zero-filled
 * after its NUL.  Returns 0, or an rn_status with err (which may be NULL).
 */
int rnp_chan_parse(const uint8_t *m, size_t len, bool truncated, unsigned nfds,
                   rnp_chan_msg *msg, rnp_error *err);

/*
 * Encode msg into buf (RNP_CHAN_MAX bytes at least): the header, the body,
 * zeros in reserved bytes and after an ERROR's message (cut to
 * RNP_CHAN_ERROR_MSG - 1 bytes; it need not be terminated).  Returns the
 * message's length, or 0 (nothing written) for a type that is not the
 * channel's.
 */
size_t rnp_chan_encode(const rnp_chan_msg *msg, uint8_t *buf);

/* Descriptors on the channel (SCM_RIGHTS), for both ends.  Attach fd to
 * mh, whose control buffer is cbuf of cblen bytes (aligned for a cmsghdr,
 * at least CMSG_SPACE(sizeof(int))). */
struct msghdr;
void rnp_chan_attach_fd(struct msghdr *mh, void *cbuf, size_t cblen, int fd);
/* Encode msg and send it on sock (SOCK_SEQPACKET: all of it or nothing)
 * without waiting and without SIGPIPE, with descriptor fd attached unless
 * it is -1, again after EINTR.  Returns 0, or an errno value (EAGAIN or
 * EWOULDBLOCK: no room, nothing sent; EMSGSIZE for a short send). */
int rnp_chan_send(int sock, const rnp_chan_msg *msg, int fd);
/* The descriptors a received mh brought, in order: the first max into fds,
 * the others closed.  Returns how many were stored. */
unsigned rnp_chan_take_fds(struct msghdr *mh, int *fds, unsigned max);

/*
 * CUDA virtual memory ranges (VMM_CHUNK ... VMM_MAP, PROTOCOL.md section
 * 12): the layout rules, as pure functions of the numbers, so that the
 * daemon's checks run (and are tested) without a GPU.  A range is
 * registered as chunks 0, 1, ... count - 1, each one whole physical
 * allocation, that tile [0, total) in order without gaps.
 */
#define RNP_VMM_MAX_CHUNKS 16384u          /* chunks of one range, at most */
#define RNP_VMM_MAX_RANGE (1ull << 48)     /* bytes of one range, at most */

/* A VMM_CHUNK of index, offset and size after npending chunks of the same
 * range that end at end bytes.  Checks, in this order: index below
 * RNP_VMM_MAX_CHUNKS (RN_TOO_LARGE, "vmm_chunk.index"), index == npending
 * ("vmm_chunk.index"), size >= 1 ("vmm_chunk.size"), offset == end
 * ("vmm_chunk.offset"), offset + size at most RNP_VMM_MAX_RANGE
 * (RN_TOO_LARGE, "vmm_chunk.size"); RN_INVALID_ARGUMENT unless said. */
int rnp_vmm_chunk_check(uint32_t npending, uint64_t end, uint32_t index, uint64_t offset,
                        uint64_t size, rnp_error *err);
/* A chunk against its allocation's granularity gran (bytes, >= 1): offset
 * ("vmm_chunk.offset") and size ("vmm_chunk.size") multiples of it
 * (RN_INVALID_ARGUMENT). */
int rnp_vmm_gran_check(uint64_t offset, uint64_t size, uint64_t gran, rnp_error *err);
/* A VMM_MAP of count and total after npending chunks that end at end
 * bytes: count >= 1 and == npending ("vmm_map.count"), total == end
 * ("vmm_map.total"); RN_INVALID_ARGUMENT. */
int rnp_vmm_map_check(uint32_t npending, uint64_t end, uint32_t count, uint64_t total,
                      rnp_error *err);

/* ---- validation --------------------------------------------------------- */

/* The byte range a tensor of a BWD request occupies inside its region. */
typedef struct rnp_span {
    uint32_t region;
    uint64_t begin, end;           /* [begin, end) bytes; begin == end for an empty tensor */
} rnp_span;

/* Per-tensor spans of a validated BWD request, indexed by rnp_tensor_index. */
enum rnp_tensor_index { RNP_T_X, RNP_T_DY, RNP_T_DX, RNP_T_W, RNP_T_RSTD, RNP_T_DRES,
                        RNP_T_DW, RNP_T_COUNT };
typedef struct rnp_bwd_plan {
    bool present[RNP_T_COUNT];
    rnp_span span[RNP_T_COUNT];
    uint64_t bytes;                /* bytes the kernel reads and writes (for stats) */
} rnp_bwd_plan;

/* The tensor t (enum rnp_tensor_index) of a BWD request, or NULL when the
 * request does not carry it (w, rstd, dres, dw are optional).  NULL too for q
 * NULL or t out of range.  The pointer is into q. */
const rnp_tensor *rnp_bwd_tensor(const rnp_bwd_req *q, int t);

/* A region_size entry for a tensor whose region the session does not have.
 * It is also the one size no region can have: registered sizes are real
 * mappings, far below 2^64 - 1 bytes. */
#define RNP_NO_REGION UINT64_MAX

/*
 * Validate a decoded BWD request against the daemon's limits and the
 * session's regions.  region_size[t]: the size in bytes of the region that
 * tensor t names, looked up by the caller in the requesting session;
 * RNP_NO_REGION when that session has no such region (or the id is 0).
 * Entries of absent tensors are ignored.  The caller fills the array with
 * rnp_bwd_tensor, so each region is looked up once for validation and
 * pinning alike:
 *
 *     uint64_t size[RNP_T_COUNT];
 *     for (int t = 0; t < RNP_T_COUNT; t++) {
 *         const rnp_tensor *x = rnp_bwd_tensor(q, t);
 *         size[t] = x ? size_of(session, x->region.id) : RNP_NO_REGION;
 *     }
 *
 * Checks: dtypes, shape limits, strides (>= n), every tensor's
 * extent inside its region with overflow-checked arithmetic, alignment of
 * offsets and strides to the element size, and aliasing (dx may alias dy
 * exactly; no other output may overlap any input or output).  Returns 0 and
 * fills *plan, or an rn_status with err naming the field.
 *
 * Rules in detail (PROTOCOL.md, "BWD validation", is the specification):
 *  - x, dy, dx: f32/f16/bf16.  w, dres, dw: present exactly when their dtype
 *    is not NONE (has_X), then f32/f16/bf16.  dw needs w, and is f32 or
 *    w_dtype.  rstd is always f32.                          RN_INVALID_ARGUMENT
 *  - 1 <= n (RN_INVALID_ARGUMENT); n <= lim->max_n, m <= lim->max_m
 *    (RN_TOO_LARGE; a limit of 0 means no limit).  m == 0 is a valid no-op,
 *    but its regions and offsets are still checked.
 *  - x, dy, dx, dres: stride >= n (elements).               RN_INVALID_ARGUMENT
 *  - region id 0 or region_size[t] == RNP_NO_REGION:       RN_UNKNOWN_REGION
 *  - offset a multiple of the element size (the stride, in elements, needs
 *    no check):                                             RN_MISALIGNED
 *  - offset + ((rows-1)*stride + len) * elemsize <= region size, with every
 *    step overflow-checked (1-D: w, dw [n]; rstd [m]):      RN_OUT_OF_BOUNDS
 *  - outputs dx and dw overlap no other tensor of the request (same region,
 *    intersecting [begin, end) hulls), except that dx may equal dy exactly
 *    (region, offset, stride, dtype).                        RN_ALIASING
 * plan->bytes is the logical bytes read plus written (saturating).
 * Rules are checked in this order (region, offset and bounds tensor by
 * tensor, in enum order), and the first failure is the answer.  A NULL
 * q, lim, region_size or plan is RN_INVALID_ARGUMENT.  *plan is written only
 * on success.
 */
int rnp_validate_bwd(const rnp_bwd_req *q, const rnp_limits *lim,
                     const uint64_t region_size[RNP_T_COUNT], rnp_bwd_plan *plan, rnp_error *err);

#endif /* RN_PROTO_H */
