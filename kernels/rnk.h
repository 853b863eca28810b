/*
 * rnk.h - RMSNorm backward behind a plain C ABI: the fused, deterministic CUDA
 * kernel and its CPU twin.  Used by the daemon's backends, the tests and the
 * benchmarks.  No C++ and no CUDA headers here, so C code includes it freely.
 *
 * kernels/ depends on nothing of ours.  Internal names use the prefix rnk_.
 * What lives there:
 *   rnk_host.c      dtype sizes, argument checks, chunk geometry, bf16/fp16
 *                   conversions, the fp64 reference
 *   cpu_twin.c      the CPU backend (pthreads), same dw order as the GPU
 *   rnk_verify.c    issue 3's accuracy rules, shared by every test
 *   cuda_bwd.cu     per-device init, workspace, the one-launch entry point
 *   bwd_kernel.cuh  the device code (fast and general paths, the finish)
 *   cuda_launch.h   internal C++ glue between the .cu files
 *   cuda_variants.cu  benchmark-only variants (-DRNK_BENCH_VARIANTS=1)
 *   ref64.cu        GPU test helpers: fp64 reference, random fill, SM hog
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
} rnk_bwd_args;

/* Bytes per element; 0 for NONE. */
size_t rnk_dtype_size(rnk_dtype dt);

/*
 * Check args for consistency (dtypes, n >= 1, strides >= n, pointers present
 * where dtypes say so).  Returns 0 or RNK_EINVAL with a message in msg.
 */
int rnk_check_args(const rnk_bwd_args *a, char *msg, size_t msglen);

/*
 * The deterministic row-chunk size for dw's partial sums.  Depends only on
 * (m, n), never on the grid, the SM count or the thread count: the CPU twin
 * and the GPU kernel both sum rows [k*C, (k+1)*C) into partial k, then add the
 * partials in a fixed order (groups of RNK_DW_GROUP chunks, below).
 */
int64_t rnk_chunk_rows(int64_t m, int64_t n);

/* Partials added per group in dw's two-level sum (see below). */
#define RNK_DW_GROUP 16

/*
 * Inside a chunk, rows are dealt round-robin to G = rnk_chunk_stripes(n)
 * stripes (row r of the chunk goes to stripe r % G, so a GPU block works on G
 * rows at once).  Exact order of dw's fp32 sums, shared by both backends:
 *   stripe s:  acc = +0.0f; for each row of the stripe, in row order:
 *              acc = acc + (dy * (x * rstd))      (each operation rounded once)
 *   partial k: p = +0.0f; for s = 0 .. G-1: p = p + stripe_s
 *   group q:   g = +0.0f; for k = q*RNK_DW_GROUP .. min((q+1)*RNK_DW_GROUP,
 *              nchunks)-1: g = g + partial_k
 *   dw:        d = +0.0f; for q = 0, 1, ...: d = d + group_q;
 *              rounded once to dw's dtype.
 * (Groups of 16 chunks cut the GPU's dependent chain of additions per column
 * from nchunks to 16 + nchunks/16; the order is still fixed.)
 * With rstd given, the CPU twin's dw is bitwise the GPU kernel's dw.  With
 * rstd recomputed, and for dx always, the per-row sums (sum of x^2, sum of
 * xhat * g) are added in a different order on each backend, so those results
 * agree within rounding, not bitwise.  NaN results are NaN on both backends,
 * but not always with the same bits (the CPU keeps sign and payload, CUDA
 * returns its canonical NaN).
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

/* ---- host helpers for tests, the CLI's selftest and the benchmarks ------- */

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

/*
 * Judge a's outputs (dx, and dw when requested) against the fp64 reference
 * with issue 3's tolerances:
 *   dx bf16/fp16: within 1 ulp of the correctly rounded reference for
 *                 >= 99.99 % of the elements, within 2 ulp for all;
 *   dx fp32:      ||dx - ref|| / ||ref|| <= 1e-5;
 *   dw fp32:      relative norm error <= 1e-5; dw bf16/fp16: as dx bf16/fp16.
 * A non-finite output where the reference is finite (an unwritten, poisoned
 * element) always fails.  The ulp bounds are relaxed only for elements whose
 * value cancels below fp32's own forward error: no fp32 implementation can
 * hold 2 ulp there, so an element also passes when its error is within
 * 64 * 2^-24 * rstd * (|g| + |xhat| * (|c| + mean|xhat*g|)) + |dres|'s share
 * (dw: a chain-length multiple of 2^-24 * sum|dy * xhat|); the relative norm
 * errors likewise count only the error beyond that floor.  dx_ref is [m*n],
 * row stride n; dw_ref may be NULL when dw is not wanted.  The inputs are
 * read through a: after an in-place run (dx == dy) pass args whose dy points
 * at a copy of the original dy.
 */
typedef struct rnk_verdict {
    int ok;                /* 1: every tolerance holds */
    int64_t dx_count;      /* elements compared */
    int64_t dx_nonfinite;  /* finite where the reference is not, or the other way,
                            * or a different NaN/infinity class */
    int64_t dx_over1;      /* 16-bit dx beyond 1 ulp (and the cancellation floor) */
    int64_t dx_over2;      /* ... beyond 2 ulp */
    double dx_max_ulp;     /* largest ulp distance seen (16-bit dx) */
    double dx_rel;         /* relative norm error of dx */
    int64_t dw_nonfinite, dw_over1, dw_over2;
    double dw_rel;         /* relative norm error of dw */
    char why[200];         /* first failed tolerance, or "" */
} rnk_verdict;

int rnk_verify(const rnk_bwd_args *a, const double *dx_ref, const double *dw_ref,
               rnk_verdict *v);

/*
 * The verdict step on its own, for callers that count dx's errors elsewhere
 * (rnk_cuda_verify counts them on the GPU): v's dx fields are filled in;
 * this sets v->ok and v->why from them and judges dw (host copy dw, fp64
 * reference dw_ref and sum |dy * xhat| per column dw_abs; dw NULL: no dw).
 */
void rnk_judge(const rnk_bwd_args *a, rnk_verdict *v, const void *dw, const double *dw_ref,
               const double *dw_abs);

/* Round v correctly (to nearest, ties to even) to a 16-bit dtype and return
 * the bits; and the ulp distance between two 16-bit values of dtype dt. */
uint16_t rnk_round16(rnk_dtype dt, double v);
int64_t rnk_ulp_dist16(rnk_dtype dt, uint16_t a, uint16_t b);

/* ---- GPU test helpers (kernels/ref64.cu): an fp64 reference written
 * separately from the production kernel, for shapes the CPU is too slow for.
 * All pointers in a, dx_ref and dw_ref are device pointers. */

/* dx_ref [m*n] and dw_ref [n] (either may be NULL), synchronously. */
int rnk_cuda_ref64(const rnk_bwd_args *a, double *dx_ref, double *dw_ref, void *stream,
                   char *msg, size_t msglen);
/* Judge a's device outputs exactly as rnk_verify does, synchronously. */
int rnk_cuda_verify(const rnk_bwd_args *a, void *stream, rnk_verdict *v, char *msg,
                    size_t msglen);

/* Fill rows x cols (row stride in elements) with hashed pseudo-random values
 * around bias (never all zeros), asynchronously on stream. */
int rnk_cuda_fill(rnk_dtype dt, void *p, int64_t rows, int64_t cols, int64_t stride,
                  uint64_t seed, float scale, float bias, void *stream, char *msg, size_t msglen);
/* rstd of each row of x, from an fp64 sum, rounded to fp32, asynchronously. */
int rnk_cuda_rstd(rnk_dtype dt, const void *x, int64_t m, int64_t n, int64_t stride, float eps,
                  float *out_rstd, void *stream, char *msg, size_t msglen);
/* Occupy `blocks` SMs (one block each, holding all of an SM's shared memory)
 * until *stop (host-mapped memory) becomes non-zero or timeout_ms passes;
 * *started (host-mapped) becomes 1 once the first block runs. */
int rnk_cuda_hog(int blocks, const int *stop, int *started, unsigned timeout_ms, void *stream,
                 char *msg, size_t msglen);

/* ---- CUDA ----------------------------------------------------------------- */

/* Per-device state: SM count, shared-memory limits, occupancy. Opaque. */
typedef struct rnk_device rnk_device;

/* Initialise for the current device of the calling thread's CUDA context. */
int rnk_cuda_init(int device, rnk_device **out, char *msg, size_t msglen);
void rnk_cuda_fini(rnk_device *dev);            /* NULL is fine */
int rnk_cuda_sm_count(const rnk_device *dev);

/*
 * Bytes of device workspace a launch of (m, n) needs.  The workspace must be
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
 * bits on every run, whatever the grid.  The 16-byte fast path is chosen from
 * the tensors' alignment, and it reduces each row in another order than the
 * general path: moving a tensor to a differently aligned address can change
 * dx's last bits (and dw's when rstd is recomputed).  m == 0 writes nothing,
 * dw included.
 */
int rnk_cuda_bwd(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                 void *stream, char *msg, size_t msglen);

/*
 * Debug/test knob: force the number of CTAs of the next launches (0 = auto).
 * dw's bits must not change with it.
 */
void rnk_cuda_force_grid(rnk_device *dev, int ctas);

/*
 * One line describing the launch rnk_cuda_bwd would make for a: path (fast
 * with its vector count, or general), block size, grid, chunk geometry.
 */
int rnk_cuda_describe(rnk_device *dev, const rnk_bwd_args *a, char *buf, size_t len);

/* ---- benchmark-only variants (kernels/cuda_variants.cu) ------------------
 * Compiled only with NVCCFLAGS=-DRNK_BENCH_VARIANTS=1 (bench/run_kernel.sh
 * does this); otherwise rnk_cuda_bwd_variant returns RNK_EINVAL.  Fast path
 * shapes with bf16 rows only.
 *   SEPARATE: the same kernel writes partials, a second kernel finishes dw;
 *   ATOMIC:   dw finished with fp32 atomics (non-deterministic).
 */
enum { RNK_VARIANT_FUSED = 0, RNK_VARIANT_SEPARATE = 1, RNK_VARIANT_ATOMIC = 2 };
int rnk_cuda_bwd_variant(rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                         int variant, void *stream, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif

#endif /* RNK_H */
