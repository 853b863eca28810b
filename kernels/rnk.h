/*
 * rnk.h - RMSNorm backward behind a plain C ABI: the fused, deterministic CUDA
 * kernel and its CPU twin.  Used by the daemon's backends, the tests and the
 * benchmarks.  No C++ and no CUDA headers here, so C code includes it freely.
 *
 * kernels/ depends on nothing of ours.  Internal names use the prefix rnk_.
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
 * partials in order k = 0, 1, ... .
 */
int64_t rnk_chunk_rows(int64_t m, int64_t n);

/* ---- CPU twin ------------------------------------------------------------ */

/*
 * Run the backward pass on the CPU with nthreads threads (<= 0: one per
 * online CPU).  Results are bitwise independent of nthreads.  Returns 0 or an
 * RNK_ status with a message in msg (msg may be NULL).
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
 */
int rnk_cuda_bwd(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t ws_bytes,
                 void *stream, char *msg, size_t msglen);

/*
 * Debug/test knob: force the number of CTAs of the next launches (0 = auto).
 * dw's bits must not change with it.
 */
void rnk_cuda_force_grid(rnk_device *dev, int ctas);

#ifdef __cplusplus
}
#endif

#endif /* RNK_H */
