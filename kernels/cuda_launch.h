/* SPDX-License-Identifier: MIT */
/*
 * cuda_launch.h - internal glue between the CUDA entry points (cuda_bwd.cu)
 * and the benchmark-only variants (cuda_variants.cu): the launch plan, the
 * CUDA check macro and the helpers both use.  C++ only; not part of rnk.h.
 */
#ifndef RNK_CUDA_LAUNCH_H
#define RNK_CUDA_LAUNCH_H

#include <cuda_runtime.h>
#include <new>

#include "bwd_kernel.cuh"
#include "bwd_s.cuh"

namespace rnk {

/* The three paths (cuda_bwd.cu's plan picks one): S, the aligned rows of
 * rnk.h's interleaved order through registers (bwd_s.cuh); RING, the
 * aligned rows of one dtype of the contiguous order through a shared-memory
 * ring (bwd_kernel.cuh); GENERAL, anything else, under either order. */
enum Path { PATH_GENERAL = 0, PATH_RING = 1, PATH_S = 2 };

/* What one call will launch: parameters, path, block shape, shared memory. */
struct Plan {
    Params p;
    int path;       /* Path */
    bool il;        /* rnk.h's interleaved order (else the contiguous one) */
    int nv;         /* ring path: 16-byte vectors per thread per row */
    int threads;    /* block size: G stripes of tpr threads */
    size_t smem;    /* dynamic shared memory */
    bool few;       /* S: RNK_S_FEW's instance (bwd_s.cuh) */
};

/* Returns RNK_OK, or RNK_ECUDA with "file:line: what: error" in msg after
 * clearing CUDA's last-error state. */
int ck(cudaError_t e, const char *file, int line, const char *what, char *msg, size_t msglen);

/* Check a CUDA call in a function with msg/msglen in scope; return on error. */
#define CK(call)                                                                   \
    do {                                                                           \
        int ck_rc_ = rnk::ck((call), __FILE__, __LINE__, #call, msg, msglen);      \
        if (ck_rc_)                                                                \
            return ck_rc_;                                                         \
    } while (0)

size_t ws_bytes(int64_t m, int64_t n);
/* S path: the kernel for rows of n columns (s_tpr(n) threads a row, s_nv(n)
 * vectors a thread; the interleaved order's n > 256 gives 64 threads a row or
 * more), in MODE (production: MODE_FUSED). */
template <class T, int MODE>
inline const void *s_fn(int64_t n, bool few = false)
{
#if RNK_S_FEW
    if (few)
        switch (s_tpr(n) * s_nv(n)) {
        case 32: return (const void *)s_kernel<T, 32, MODE, 1, RNK_S_FEW>;
        case 64: return (const void *)s_kernel<T, 64, MODE, 1, RNK_S_FEW>;
        case 128: return (const void *)s_kernel<T, 128, MODE, 1, RNK_S_FEW>;
        case 256:
            if (RNK_S_NV2K == 1)
                return (const void *)s_kernel<T, 256, MODE, 1, RNK_S_FEW>;
            break;
        default: break;
        }
#else
    (void)few;
#endif
    switch (s_tpr(n) * s_nv(n)) {
    case 32: return (const void *)s_kernel<T, 32, MODE>;
    case 64: return (const void *)s_kernel<T, 64, MODE>;
    case 128: return (const void *)s_kernel<T, 128, MODE>;
    case 256: return (const void *)s_kernel<T, 256 / RNK_S_NV2K, MODE, RNK_S_NV2K>;
    case 512: return (const void *)s_kernel<T, 512 / RNK_S_NV4K, MODE, RNK_S_NV4K>;
    default: return (const void *)s_kernel<T, 1024 / RNK_S_NV8K, MODE, RNK_S_NV8K>;
    }
}
/* Ring path: bytes of the row ring (bwd_kernel.cuh: ring_slots per thread). */
inline size_t ring_bytes(const Plan &pl)
{
    return (size_t)pl.threads * (size_t)ring_slots(pl.nv) * 16;
}
/* Ring path: the dynamic shared memory, w + weight_offset (p.wsp floats,
 * none when it is held in registers) and then the ring, which `reuse` bytes
 * (the stripe combine, the finish's tile) share. */
inline size_t fast_smem(const Plan &pl, size_t reuse)
{
    size_t ring = ring_bytes(pl);
    return (size_t)pl.p.wsp * 4 + (reuse > ring ? reuse : ring);
}
int plan(const rnk_device *dev, const rnk_bwd_args *a, void *ws, size_t wsb, Plan *pl,
         char *msg, size_t msglen);
int grid_for(rnk_device *dev, const void *fn, const Plan &pl, char *msg, size_t msglen,
             int *grid);
/* a's production plan against a stand-in workspace and its grid (0 when m =
 * 0): for the benchmark's and the tests' questions about a launch. */
int plan_grid(rnk_device *dev, const rnk_bwd_args *a, Plan *pl, int *grid, char *msg,
              size_t msglen);
const void *production_fn(const Plan &pl);
int launch(rnk_device *dev, const void *fn, Plan &pl, cudaStream_t st, char *msg,
           size_t msglen);

} /* namespace rnk */

#endif
