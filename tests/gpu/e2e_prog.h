/* SPDX-License-Identifier: MIT */
/*
 * e2e_prog.h - what the GPU client programs (prog_e2e_cuda, prog_fastpath_cuda,
 * prog_vmm_cuda) share: a CUDA check that ends the program, element sizes,
 * the layout of a call's tensors in one allocation, poisoning the outputs
 * and judging them against the fp64 reference.  Header-only.
 */
#ifndef RN_E2E_PROG_H
#define RN_E2E_PROG_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_client.h"
#include "rmsnormctl_verify.h"
#include "rnk_test.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static inline size_t esz(rn_dtype d)
{
    return d == RN_DTYPE_F32 ? 4 : d == RN_DTYPE_NONE ? 0 : 2;
}

/* Carve a's tensors out of one allocation from arena (NULL: only the size,
 * as a caching allocator would hand them out), 256-byte aligned, rstd only
 * when with_rstd; returns the bytes used. */
static inline size_t layout(rn_bwd_args *a, char *arena, bool with_rstd)
{
    size_t off = 0, mn = (size_t)(a->m * a->n);
#define TAKE(ptr, bytes)                                 \
    do {                                                 \
        ptr = arena ? (void *)(arena + off) : NULL;     \
        off += ((bytes) + 255) / 256 * 256;              \
    } while (0)
    TAKE(a->x, mn * esz(a->x_dtype));
    TAKE(a->dy, mn * esz(a->dy_dtype));
    TAKE(a->dx, mn * esz(a->dx_dtype));
    TAKE(a->w, (size_t)a->n * esz(a->w_dtype));
    TAKE(a->dw, (size_t)a->n * esz(a->dw_dtype));
    TAKE(a->dres, mn * esz(a->dres_dtype));
    if (with_rstd) {
        void *r;
        TAKE(r, (size_t)a->m * 4);
        a->rstd = r;
    } else {
        a->rstd = NULL;
    }
#undef TAKE
    /* Absent tensors have no pointer (the verifier checks for aliasing). */
    if (!a->w_dtype)
        a->w = NULL;
    if (!a->dw_dtype)
        a->dw = NULL;
    if (!a->dres_dtype)
        a->dres = NULL;
    return off;
}

/* All ones is NaN in every dtype: an unwritten element cannot pass. */
static inline void rne_poison_outputs(const rn_bwd_args *a, cudaStream_t st)
{
    CK(cudaMemsetAsync(a->dx, 0xff, (size_t)(a->m * a->dx_stride) * esz(a->dx_dtype), st));
    if (a->dw_dtype)
        CK(cudaMemsetAsync(a->dw, 0xff, (size_t)a->n * esz(a->dw_dtype), st));
}

/* Judge a's outputs on the GPU (after st's work) against the fp64
 * reference; false with a "FAIL what: ..." line when they do not pass. */
static inline bool rne_verify(const rn_bwd_args *a, cudaStream_t st, const char *what)
{
    rnk_bwd_args k = rnv_to_rnk(a);
    rnk_verdict v;
    char msg[200] = "";

    memset(&v, 0, sizeof v);
    if (rnk_cuda_verify(&k, st, &v, msg, sizeof msg) != 0) {
        printf("FAIL %s: verify: %s\n", what, msg);
        return false;
    }
    if (!v.ok) {
        printf("FAIL %s: %s\n", what, v.why);
        return false;
    }
    return true;
}

#endif
