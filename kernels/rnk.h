/* SPDX-License-Identifier: MIT */
/*
 * rnk.h - RMSNorm backward behind a plain C ABI: the fused, deterministic CUDA
 * kernel and its CPU twin, as the daemon's backends and rmsnormctl's selftest
 * call them.  The tests' and benchmarks' helpers are in rnk_test.h.  No C++
 * and no CUDA headers here, so C code includes it freely.
 *
 * kernels/ depends on nothing of ours.  Internal names use the prefix rnk_.
 * What lives there:
 *   rnk_host.c      dtype sizes, argument checks, chunk geometry, bf16/fp16
 *                   conversions, the fp64 reference
 *   cpu_twin.c      the CPU backend (pthreads), same dw order as the GPU
 *   rnk_verify.c    issue 3's accuracy rules, shared by every test (rnk_test.h)
 *   cuda_bwd.cu     per-device init, workspace, the one-launch entry point
 *   bwd_s.cuh       the fast path of the interleaved order (bf16/fp16 rows of
 *                   129-8192 columns, large shapes): rows in registers
 *   bwd_kernel.cuh  the ring path (aligned rows, contiguous order) and the
 *                   general path (any rows, either order)
 *   bwd_common.cuh  the device code both share (row sums, claims, dw finish)
 *   cuda_launch.h   internal C++ glue between the .cu files
 *   cuda_variants.cu  benchmark-only variants (-DRNK_BENCH_VARIANTS=1; rnk_test.h)
 *   ref64.cu        GPU test helpers: fp64 reference, random fill, SM hog (rnk_test.h)
 *
 * Math, per row i (fp32 inside, inputs upcast once):
 *   xhat = x * rstd           g  = dy * (w + weight_offset)   (g = dy without w)
 *   c    = mean_j(xhat * g)   dx = rstd * (g - xhat * c) [+ dresidual_out]
 *   dw_j = sum_i dy_ij * xhat_ij        (fp32, fixed chunk order, rounded once)
 * rstd absent: rstd = 1 / sqrt(mean_j(x^2) + eps).
 */
#ifndef RNK_H
#define RNK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same numeric values as rn_dtype on the wire (proto/rn_wire.h). */
typedef enum rnk_dtype {
    RNK_NONE = 0,
    RNK_F32 = 1,
    RNK_F16 = 2,
    RNK_BF16 = 3,
} rnk_dtype;

/* Status codes: 0 success, else one of these. */
enum {
    RNK_OK = 0,
    RNK_EINVAL = 1,   /* arguments invalid (message says which) */
    RNK_ECUDA = 2,    /* a CUDA call failed (message has file:line and the CUDA error) */
    RNK_ENOMEM = 3,
};

typedef struct rnk_bwd_args {
    int64_t m;                     /* rows, >= 0 (0: no-op) */
    int64_t n;                     /* columns, >= 1 */
    rnk_dtype x_dtype, dy_dtype, dx_dtype;  /* F32/F16/BF16 */
    rnk_dtype w_dtype;             /* NONE: no weight */
    rnk_dtype dres_dtype;          /* NONE: no dresidual_out */
    rnk_dtype dw_dtype;            /* NONE: dw not computed; else F32 or w_dtype */
    const void *x;   int64_t x_stride;    /* elements between rows */
    const void *dy;  int64_t dy_stride;
    void *dx;        int64_t dx_stride;   /* may equal dy exactly (in place) */
    const void *w;                 /* [n] or NULL */
    const float *rstd;             /* [m] or NULL: recompute from x with eps */
    const void *dres; int64_t dres_stride; /* [m, n] or NULL */
    void *dw;                      /* [n] or NULL */
    float eps;
    float weight_offset;
    /* NULL, or a device address the kernel reads first, once per launch
     * (one block reads it and tells the others): non-zero, no block touches
     * any tensor (the caller cancelled the work: the memory may be gone).
     * Set after the read, the launch runs as usual.  Either way it ends
     * and leaves the workspace clean for the next one. */
    const unsigned *cancel;
    /* NULL, or a device address read with the cancel word, once per launch:
     * below gate_key, the launch does nothing at all: no tensor, and no done
     * words either (the daemon's armed calls, daemon/cuda/ring.c: a call
     * queued before its inputs were ready, which the daemon may take back
     * and run again later), also when the cancel word is set.  Bit 62 of
     * the word is left out of the compare (the daemon's own bit of the
     * ready word it gates on: PROTOCOL.md 13.3).  8-byte aligned. */
    const uint64_t *gate;
    uint64_t gate_key;
    /* NULL, or (with gate) two device words that keep a shut gate shut,
     * read with the cancel word: when latch[0] holds latch_epoch the launch
     * is gated whatever gate says, and a launch that finds gate below
     * gate_key (modulo 2^64) stores gate_key into latch[1], then
     * latch_epoch into latch[0] (the daemon's armed calls: once one call of
     * an epoch skipped, every later one of it does, so done never passes a
     * call that did not run, and latch[1] says which skipped first).
     * 8-byte aligned; latch_epoch nonzero. */
    uint64_t *latch;
    uint64_t latch_epoch;
    /* NULL, or where the launch tells a waiter that its work is over (the
     * fast path's done words, daemon/cuda/ring.c): the launch's last block,
     * after every other write of the launch, stores done_value into done[1]
     * when not NULL, released at the GPU's scope (for waiters on this GPU in
     * the default memory synchronization domain: a stream's wait, the
     * kernels after it), then into done[0], released at the system's (a host
     * may read it): done[1] may lead done[0], and done[0] at done_value
     * means done[1] was written; device
     * addresses (device memory, or host memory mapped for the device), 8-byte
     * aligned (else RNK_EINVAL, as for done[1] without done[0]).  The
     * caller's stream then needs no write after the kernel for them.  A
     * cancelled launch writes them too; m = 0 launches nothing and writes
     * nothing; rnk_cpu_bwd ignores them (CUDA launches only). */
    uint64_t *done[2];
    uint64_t done_value;
} rnk_bwd_args;

/* Bytes per element; 0 for NONE. */
size_t rnk_dtype_size(rnk_dtype dt);

/*
 * Check args for consistency (dtypes, n >= 1, strides >= n, pointers present
 * where dtypes say so).  Returns 0 or RNK_EINVAL with a message in msg.
 */
int rnk_check_args(const rnk_bwd_args *a, char *msg, size_t msglen);

/*
 * dw's row chunks.  dw is summed per chunk of rows into partials, then the
 * partials are added in a fixed order (groups of RNK_DW_GROUP chunks, below).
 * The chunks depend only on (m, n) and the rows' dtypes, never on pointers,
 * strides, the grid, the device, its SM count or the thread count.  Two
 * orders:
 *   interleaved, when rnk_chunk_interleaved(m, n, x, dy, dx): x, dy and dx
 *     all bf16 or all fp16, m >= n (m >= n / 2 for n > 4096), and 1024 < n
 *     <= 8192 with m * n >= 2^23, 512 < n <= 1024 with m * n >= 2^22, 256 <
 *     n <= 512 with m * n >= 2^21, or 128 < n <= 256 with m * n >= 2^20.
 *     P = 132 * k chunks (k = 4 for n <= 2048, 2 for n <= 4096, else 1),
 *     at most m / d (integer division; d = 32 for n <= 1024, else 16), or
 *     twice that where that is at most 132 * k; chunk c holds the rows c,
 *     c + P, c + 2P, ... below m;
 *     G = 8 stripes for n <= 256, 4 for n <= 512, 2 for n <= 1024, else 1.
 *   contiguous, everywhere else: C = rnk_chunk_rows(m, n) rows a chunk, P =
 *     ceil(m / C) chunks, chunk c holds rows c*C .. min((c+1)*C, m)-1;
 *     G = rnk_chunk_stripes(n) stripes.
 * rnk_chunking_of() gives the order, P, C and G of a call.
 */

/* The interleaved order's rows up to 1024 columns, as knobs for measuring
 * it (production: 2 and 1024).  For n <= RNK_S_RX_MAXN, RNK_S_RX times the
 * G of S's narrower blocks (4, 2, 1 at n <= 256, 512, 1024) and RNK_S_RX
 * times fewer chunks than theirs (132 * 8 / RNK_S_RX, at most m / (16 *
 * RNK_S_RX), or twice that where that is no more), which bwd_s.cuh's blocks
 * RNK_S_RX times wider run; the text above is production's.  RNK_S_RX = 1
 * was the order before (bench/RESULTS.md, 2026-12-07 15:14: 2 and 1024 are
 * 2-5 % faster at 8192-65536 x 512 and 8192 x 1024, 0.9 % over the grid).
 * RNK_S_RX_MAXN is one of S's row classes' widths (256, 512, 1024, 2048),
 * which is how bwd_s.cuh's s_rx() sees it.  Both backends must be built
 * with the same values. */
#ifndef RNK_S_RX
#define RNK_S_RX 2
#endif
#ifndef RNK_S_RX_MAXN
#define RNK_S_RX_MAXN 1024
#endif
#if RNK_S_RX_MAXN != 256 && RNK_S_RX_MAXN != 512 && RNK_S_RX_MAXN != 1024 && RNK_S_RX_MAXN != 2048
#error "RNK_S_RX_MAXN must be 256, 512, 1024 or 2048 (the host's n <= it and S's row classes agree only there)"
#endif

typedef struct rnk_chunking {
    int interleaved;   /* 1: the interleaved order, 0: the contiguous one */
    int stripes;       /* G */
    int64_t nchunks;   /* P */
    int64_t rows;      /* contiguous: C (the last chunk may have fewer); interleaved: 0 */
} rnk_chunking;

int rnk_chunk_interleaved(int64_t m, int64_t n, rnk_dtype x, rnk_dtype dy, rnk_dtype dx);
void rnk_chunking_of(int64_t m, int64_t n, rnk_dtype x, rnk_dtype dy, rnk_dtype dx,
                     rnk_chunking *c);

/* The contiguous order's rows per chunk C: with L = min(256, max(1,
 * 2^26 / (n * G))) (G = rnk_chunk_stripes(n)), c = ceil(m / L); c < 32: c =
 * min(m, 32); then c > 8: c rounded up to a multiple of 8.  1 for m <= 0. */
int64_t rnk_chunk_rows(int64_t m, int64_t n);

/* dw's step per row (see below): with RNK_DW_FMA = 1, acc = fma(dy, xhat,
 * acc), rounded once; else acc + (dy * xhat), each operation rounded.  Both
 * backends must be built with the same value. */
#ifndef RNK_DW_FMA
#define RNK_DW_FMA 0
#endif

/* Partials added per group in dw's two-level sum (see below). */
#define RNK_DW_GROUP 16

/*
 * Exact order of dw's fp32 sums, shared by every path of both backends, for
 * either order (P, G and chunk c's rows as above): chunk c's j-th row (j = 0,
 * 1, ... in row order) goes to stripe j % G.
 *   stripe s:  acc = +0.0f; for each row of the stripe, in row order:
 *              acc = acc + (dy * (x * rstd))      (each operation rounded once;
 *              with RNK_DW_FMA, acc = fma(dy, x * rstd, acc))
 *   partial c: p = +0.0f; for s = 0 .. G-1: p = p + stripe_s
 *   group q:   g = +0.0f; for c = q*RNK_DW_GROUP .. min((q+1)*RNK_DW_GROUP,
 *              P)-1: g = g + partial_c
 *   dw:        d = +0.0f; for q = 0, 1, ...: d = d + group_q;
 *              rounded once to dw's dtype.
 * x, dy and rstd are the stored values, upcast to fp32 exactly; rstd is the
 * given one, or the recomputed one (below).  Examples: bf16 rows, m = 100000,
 * n = 1024: interleaved, P = 528, G = 2, chunk 5 holds rows 5, 533, 1061,
 * 1589, ...: stripe 0 adds 5, 1061, ... and stripe 1 533, 1589, ... in that
 * order; the same shape in fp32: contiguous, C = 392, P = 256,
 * G = 8, chunk 5 = rows 1960 .. 2351, stripe 3 = rows 1963, 1971, ...
 * (Groups of 16 chunks cut the GPU's dependent chain of additions per column
 * from P to 16 + P/16; the order is still fixed.)
 * With rstd given, the CPU twin's dw is bitwise the GPU kernel's dw, whichever
 * GPU path ran and whatever the grid.  With rstd recomputed, and for dx
 * always, the per-row sums (sum of x^2, sum of xhat * g) are added in a
 * different order on each backend and path, so those results agree within
 * rounding, not bitwise.  NaN results are NaN on both backends, but not always
 * with the same bits (the CPU keeps sign and payload, CUDA returns its
 * canonical NaN).
 *
 * rnk_chunk_stripes: the contiguous order's G, the largest power of two g <=
 * 8 with g * n <= 8192 (8 up to n = 1024, 4 up to 2048, 2 up to 4095), and
 * 1 from n = 4096 on.
 */
int rnk_chunk_stripes(int64_t n);

/* ---- CPU twin ------------------------------------------------------------ */

/*
 * Run the backward pass on the CPU with nthreads threads (<= 0: one per
 * online CPU).  Results are bitwise independent of nthreads.  Returns 0 or an
 * RNK_ status with a message in msg (msg may be NULL).  Invalid arguments
 * write nothing; on RNK_ENOMEM dx may be partly written and dw is not.
 */
int rnk_cpu_bwd(const rnk_bwd_args *a, int nthreads, char *msg, size_t msglen);

/* ---- host helpers: rmsnormctl's selftest and the tests ------------------- */

/* Element i of an array of dtype dt, as float / stored from float with
 * round-to-nearest-even (bf16, fp16) - the same rounding the kernel uses. */
float rnk_load(rnk_dtype dt, const void *base, int64_t i);
void rnk_store(rnk_dtype dt, void *base, int64_t i, float v);

/*
 * fp64 reference of the same math (no chunking, plain double sums), written
 * to dx_ref [m*n, row stride n] and dw_ref [n] (dw_ref may be NULL).  Inputs
 * are read through a's pointers and strides; a's outputs are not touched.
 */
int rnk_ref64_bwd(const rnk_bwd_args *a, double *dx_ref, double *dw_ref);

/* ---- CUDA ----------------------------------------------------------------- */

/* Per-device state: SM count, shared-memory limits, occupancy. Opaque. */
typedef struct rnk_device rnk_device;

/* Initialise for the current device of the calling thread's CUDA context. */
int rnk_cuda_init(int device, rnk_device **out, char *msg, size_t msglen);
void rnk_cuda_fini(rnk_device *dev);            /* NULL is fine */

/*
 * Bytes of device workspace a launch of (m, n) needs, whatever its dtypes
 * (the larger of the two orders' partials where both may apply).  The workspace must be
 * zeroed once after allocation (rnk_cuda_workspace_init); every launch leaves
 * its coordination counters zeroed again, so no per-launch memset is needed
 * and launches can be captured in CUDA graphs.  One workspace must not be used
 * by two launches that may run concurrently (own one per stream).
 */
size_t rnk_cuda_workspace_size(const rnk_device *dev, int64_t m, int64_t n);
int rnk_cuda_workspace_init(void *ws, size_t bytes, void *stream, char *msg, size_t msglen);

/*
 * Launch the fused backward pass on stream (a cudaStream_t) with a
 * caller-owned workspace of at least rnk_cuda_workspace_size() bytes.
 * Exactly one kernel launch.  Returns 0 or RNK_EINVAL / RNK_ECUDA with msg.
 *
 * Determinism: the same inputs at the same addresses give the same dx and dw
 * bits on every run, whatever the grid and the device's SM count; with rstd
 * given, dw's bits are also the same on every path and on the CPU twin
 * (rnk.h's order above).  The 16-byte fast paths are chosen from the
 * tensors' alignment, and they reduce each row in another order than the
 * general path: moving a tensor to a differently aligned address can change
 * dx's last bits (and dw's when rstd is recomputed).  m == 0 writes nothing,
 * dw included.
 */
int rnk_cuda_bwd(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                 void *stream, char *msg, size_t msglen);
/* Whether rnk_cuda_bwd would take a with this workspace: everything it
 * checks before its launch (the arguments, the plan, the grid: occupancy
 * queries, cached), no launch.  Returns 0 or RNK_EINVAL / RNK_ECUDA with
 * msg. */
int rnk_cuda_check(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                   char *msg, size_t msglen);

/*
 * Debug/test knob: force the number of CTAs of the next launches (0 = auto).
 * dw's bits must not change with it.
 */
void rnk_cuda_force_grid(rnk_device *dev, int ctas);

/*
 * Debug/measurement: a one-thread kernel on stream that stores the GPU's
 * %globaltimer (ns, one clock for every process on the GPU) as a uint64_t
 * at dst (device-accessible memory).  The daemon's RMSNORMD_DEBUG_STAMPS.
 */
int rnk_cuda_stamp(void *dst, void *stream, char *msg, size_t msglen);


#ifdef __cplusplus
}
#endif

#endif /* RNK_H */
