/* SPDX-License-Identifier: MIT */
/*
 * rn_wire.h - the vocabulary shared by the wire protocol and the public client
 * API: status codes (one X-macro table), dtypes and operation codes.
 *
 * This header is self-contained (C11, <stdint.h> only) and depends on nothing
 * of ours.  The installed rmsnorm_client.h carries a copy of it, so a worker
 * includes exactly one header.  Numeric values are part of the wire protocol
 * (proto/PROTOCOL.md): never renumber, only append.
 */
#ifndef RN_WIRE_H
#define RN_WIRE_H

#include <stdint.h>

/*
 * The error table: X(code, NAME, "message").  Codes are grouped by whose
 * fault it is:
 *   1xx caller    - the request is well formed but its arguments are wrong
 *   2xx protocol  - the bytes are not a valid message of this protocol
 *   3xx busy      - a limit is reached; the same request may succeed later
 *   4xx system    - the operating system refused something (errno-like)
 *   5xx CUDA      - the GPU, the CUDA driver or a CUDA IPC object failed
 *   6xx internal  - a bug in rmsnormd or libclient
 * Every error reply carries the code and a one-line message naming the field;
 * the message below is the generic text for the code.
 */
#define RN_ERRORS(X)                                                                   \
    X(0,   OK,               "success")                                                \
    /* caller */                                                                       \
    X(100, INVALID_ARGUMENT, "invalid argument")                                       \
    X(101, OUT_OF_BOUNDS,    "tensor extends past the end of its region")              \
    X(102, MISALIGNED,       "offset or stride is not aligned to the element size")    \
    X(103, ALIASING,         "an output overlaps an input")                            \
    X(104, UNKNOWN_SESSION,  "unknown or expired session")                             \
    X(105, UNKNOWN_REGION,   "unknown region id")                                      \
    X(106, WRONG_DEVICE,     "memory or event belongs to another device")              \
    X(107, UNSUPPORTED,      "not supported by this daemon or backend")                \
    X(108, TOO_LARGE,        "shape exceeds the daemon's limits")                      \
    X(109, NO_EVENTS,        "events were not exchanged for this session")             \
    X(110, NOT_SHARED,       "pointer is not in memory that can be shared")            \
    X(111, SEQ_REUSED,       "seq already used in this session for another request")   \
    /* protocol */                                                                     \
    X(200, MALFORMED,        "malformed message")                                      \
    X(201, BAD_VERSION,      "unsupported protocol version")                           \
    X(202, UNKNOWN_OP,       "unknown operation")                                      \
    X(203, BAD_TYPE,         "field has the wrong type")                               \
    X(204, MISSING_FIELD,    "required field is missing")                              \
    X(205, DUPLICATE_FIELD,  "field appears twice")                                    \
    X(206, TOO_BIG,          "message, string or array exceeds its limit")             \
    X(207, TOO_DEEP,         "message nesting exceeds the depth limit")                \
    X(208, TRAILING_BYTES,   "bytes after the end of the message")                     \
    X(209, BAD_REPLY,        "reply does not match the request")                       \
    X(210, UNKNOWN_FIELD,    "field is not part of this message")                      \
    /* busy */                                                                         \
    X(300, BUSY,             "daemon is at a limit; retry later")                      \
    X(301, DRAINING,         "daemon is shutting down")                                \
    /* system */                                                                       \
    X(400, SYSTEM,           "system call failed")                                     \
    X(401, NOMEM,            "out of memory")                                          \
    X(402, UNREACHABLE,      "daemon is unreachable")                                  \
    X(403, TIMEOUT,          "timed out")                                              \
    X(404, ENDPOINT,         "invalid endpoint")                                       \
    X(405, PEER_DIED,        "peer process has exited")                                \
    X(406, RESTARTED,        "the daemon restarted during the call; outputs may be partly written") \
    /* CUDA */                                                                         \
    X(500, CUDA,             "CUDA call failed")                                       \
    X(501, NO_CUDA,          "CUDA is not available")                                  \
    X(502, DEVICE_FAILING,   "device is in a failed state")                            \
    /* internal */                                                                     \
    X(600, INTERNAL,         "internal error")

typedef enum rn_status {
#define RN_ERR_ENUM_(code, name, msg) RN_##name = code,
    RN_ERRORS(RN_ERR_ENUM_)
#undef RN_ERR_ENUM_
} rn_status;

/* The group of a status code (its hundreds digit). */
#define RN_STATUS_GROUP(code) ((code) / 100)

/* Element types.  Wire values. */
typedef enum rn_dtype {
    RN_DTYPE_NONE = 0, /* tensor absent (weight, dw, dresidual_out) */
    RN_DTYPE_F32 = 1,
    RN_DTYPE_F16 = 2,
    RN_DTYPE_BF16 = 3,
} rn_dtype;

/* Operations.  Wire values. */
#define RN_OPS(X)           \
    X(1, HELLO, "hello")       \
    X(2, REGISTER, "register") \
    X(3, UNREGISTER, "unregister") \
    X(4, EVENTS, "events")     \
    X(5, BWD, "bwd")           \
    X(6, PING, "ping")         \
    X(7, HEALTH, "health")     \
    X(8, STATS, "stats")       \
    X(9, BYE, "bye")           \
    X(10, RING_OPEN, "ring_open") \
    X(11, RING_CLOSE, "ring_close") \
    X(12, GRAPH_OPEN, "graph_open") \
    X(13, GRAPH_CLOSE, "graph_close")

typedef enum rn_op {
#define RN_OP_ENUM_(code, name, str) RN_OP_##name = code,
    RN_OPS(RN_OP_ENUM_)
#undef RN_OP_ENUM_
} rn_op;

#define RN_OP_MAX 13

#endif /* RN_WIRE_H */
