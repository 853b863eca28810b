/* SPDX-License-Identifier: MIT */
/*
 * seqwords.h - what bench_seqwords.c (the modes, the client's side, the
 * table) and seqwords_daemon.c (the daemon's side of each mode) share:
 * the driver's stream memory operations, the words' places, the options,
 * the production kernel's job.
 */
#ifndef RN_BENCH_SEQWORDS_H
#define RN_BENCH_SEQWORDS_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/e2e_cuda.h"
#include "rnk.h"

#define CK(call) RNE_CK(call)

typedef CUresult (*pfn_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
typedef CUresult (*pfn_batch)(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,
                              unsigned flags);
extern pfn_value64 wait64, write64;
extern pfn_batch batch;
/* Resolve the three stream memory operations (exits without them). */
void resolve(void);
/* One stream memory operation, or exit. */
void value(pfn_value64 fn, cudaStream_t s, CUdeviceptr a, uint64_t v, unsigned flags);

enum mode { M_HOST, M_DEVICE, M_FAST, M_EVENT, M_RELAY, M_ARMED, M_COUNT };
extern const char *mode_name[M_COUNT];

/* The fast path's words (ready in shared host memory, done in the client's
 * device memory): its gpu ready mode and the two host relays. */
static inline bool fast_words(enum mode m)
{
    return m == M_FAST || m == M_RELAY || m == M_ARMED;
}

/* Words at byte 0 (ready) and 256 (done) of a shared area. */
#define W_READY 0
#define W_DONE  256
/* The armed relay's word of the daemon's own, when in the same page (512). */
#define W_GO    512

/* Whole messages over the processes' pipes, or exit. */
void xwrite(int fd, const void *p, size_t n);
void xread(int fd, void *p, size_t n);

/* --wide-us (0: off) and --wide-blocks; --rnk M,N (0: off), --like-daemon
 * (LD_* bits) and --ipc-inputs. */
extern uint64_t wide_ns;
extern unsigned wide_blocks;
extern int64_t rnk_m, rnk_n;
extern int like_daemon, ipc_inputs;
enum {
    LD_EVENTS = 1,
    LD_CANCEL = 2,
    LD_BATCH = 4,
    LD_ALL = 7,
    LD_UNTIMED = 8,
    LD_CANCEL_DEV = 16,
    LD_BLOCKING = 32
};

/* A kernel as wide as a real one, wide_ns long. */
void wide(const rne_kernels *k, cudaStream_t s);
/* Spans, not hops: a chain of kernels on each side (--wide-us, --rnk). */
int spans(void);

/* The production kernel on a problem in this process's memory. */
typedef struct kjob {
    rnk_device *dev;
    rnk_bwd_args a;
    void *ws;
    size_t wsb;
    unsigned *cancel_host; /* --like-daemon: the cancel word, pinned, 0 */
} kjob;

/* The problem in this process's memory, or (--ipc-inputs, daemon) the
 * client's, whose CUDA IPC handle comes over fd. */
void kjob_init(kjob *j, bool daemon, int fd);
void kjob_run(const kjob *j, cudaStream_t s);

/* seqwords_daemon.c: the daemon's side of mode m, n calls, in a child
 * process; stamps t1 into t1_shared; exits. */
void daemon_side(enum mode m, int n, int to_client, int from_client, uint8_t *host_words,
                 uint64_t *t1_shared);

#endif
