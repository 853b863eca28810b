/*
 * client_int.h - libclient's internals shared by its source files.  Not
 * installed.  Internal non-static names use the prefix rnc_.
 */
#ifndef RN_CLIENT_INT_H
#define RN_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_client.h"
#include "rn_proto.h"

/* One shared buffer: a POSIX shm object mapped here and registered with the
 * daemon under `region` in the current session (0 while not registered). */
typedef struct rnc_buf {
    void *base;
    size_t size;
    uint32_t region;
    char name[64]; /* "/rmsnormd.<pid>.<n>.<pidns>" */
} rnc_buf;

struct rn_client {
    pthread_mutex_t mu; /* serialises every call */
    int sock;           /* nanomsg NN_REQ socket */
    int timeout_ms;     /* -1: forever */
    char endpoint[256];
    char name[RNP_MAX_NAME];

    bool have_session; /* false: the next call re-opens (HELLO) first */
    rnp_session session;
    rnp_hello_rep hello;
    uint64_t next_id, next_seq;

    rnc_buf *bufs;
    size_t nbufs, capbufs;

    char last_error[RN_ERRMSG_LEN];
    /* Scratch space for one exchange; the mutex makes it private to a call. */
    rnp_request req;
    rnp_reply rep;
    uint8_t tx[RNP_MAX_MSG];
};

/* Records a message for rn_last_error and returns code.  printf-style. */
int rnc_fail(rn_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Monotonic clock, nanoseconds. */
uint64_t rnc_now_ns(void);

/*
 * One request/reply exchange on c's socket: fills version and id, encodes,
 * sends, waits for the reply (timeout_ms) and checks its op and id.  Returns
 * 0 with c->rep filled, the daemon's error code (message kept), or a
 * transport error (RN_TIMEOUT, RN_SYSTEM, RN_BAD_REPLY).
 */
int rnc_transact(rn_client *c, int timeout_ms);

/*
 * Make sure c has a session: HELLO, then register every live buffer again
 * (region ids change).  No-op when c->have_session.
 */
int rnc_ensure_session(rn_client *c);

/*
 * End c's session with BYE, best effort: a dead daemon delays this by
 * BYE_TIMEOUT_MS at most.  Keeps c->last_error as it was.  The next call
 * opens a new session (rnc_ensure_session).
 */
void rnc_end_session(rn_client *c);

/* Register buffer b in the current session; sets b->region. */
int rnc_register(rn_client *c, rnc_buf *b);

/* Fill the fields of a BWD request that come from a (shape, dtypes, scalars),
 * with c's session and the next seq; the tensors are the caller's. */
void rnc_fill_bwd(rn_client *c, const rn_bwd_args *a, int mode, int32_t ready_slot,
                  rnp_bwd_req *b);

/* Check the arguments every backward call shares (shape, dtypes, strides);
 * the pointers are checked where they are mapped. */
int rnc_check_bwd_args(rn_client *c, const rn_bwd_args *a);

/* Remove this user's shm names of processes that no longer exist. */
void rnc_sweep_stale(void);

/* Unmap and unlink b (no daemon traffic) and forget it process-wide. */
void rnc_buf_release(rnc_buf *b);

#endif /* RN_CLIENT_INT_H */
