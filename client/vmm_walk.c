/* SPDX-License-Identifier: MIT */
/*
 * vmm_walk.c - the host-only half of device pointers in CUDA virtual
 * memory (vmm.h): which mappings a tensor's bytes cover, and how many
 * bytes a tensor spans.  No CUDA here: the unit tests run it on a fake
 * address space.
 */
#include <string.h>

#include "vmm.h"

int rnc_vmm_walk(rnc_vmm_lookup look, void *ctx, uintptr_t lo, uintptr_t hi, rnc_vmm_piece *out,
                 size_t max, uintptr_t *at)
{
    uintptr_t addr = lo;
    size_t n = 0;

    while (addr < hi) {
        rnc_vmm_piece pc;
        *at = addr;
        if (look(ctx, addr, &pc) != 0)
            return RNC_VMM_HOLE;
        /* It must contain addr, and the first may start before lo; every
         * later one starts exactly where the one before ended. */
        if (pc.size == 0 || pc.base > addr || addr - pc.base >= pc.size ||
            (n > 0 && pc.base != addr))
            return RNC_VMM_BAD_LOOKUP;
        if (n == max)
            return RNC_VMM_TOO_MANY;
        out[n++] = pc;
        if (pc.size > UINTPTR_MAX - pc.base)
            return RNC_VMM_BAD_LOOKUP;
        addr = pc.base + pc.size;
    }
    return (int)n;
}

static uint64_t esize(rn_dtype dt)
{
    return dt == RN_DTYPE_F32 ? 4 : 2;
}

int rnc_tensor_bytes(const rn_bwd_args *a, const char *field, uint64_t *bytes)
{
    int64_t rows, stride, cols;
    rn_dtype dt;
    uint64_t elems;

    if (strcmp(field, "x") == 0)
        rows = a->m, stride = a->x_stride, cols = a->n, dt = a->x_dtype;
    else if (strcmp(field, "dy") == 0)
        rows = a->m, stride = a->dy_stride, cols = a->n, dt = a->dy_dtype;
    else if (strcmp(field, "dx") == 0)
        rows = a->m, stride = a->dx_stride, cols = a->n, dt = a->dx_dtype;
    else if (strcmp(field, "dres") == 0)
        rows = a->m, stride = a->dres_stride, cols = a->n, dt = a->dres_dtype;
    else if (strcmp(field, "w") == 0)
        rows = 1, stride = a->n, cols = a->n, dt = a->w_dtype;
    else if (strcmp(field, "dw") == 0)
        rows = 1, stride = a->n, cols = a->n, dt = a->dw_dtype;
    else if (strcmp(field, "rstd") == 0)
        rows = 1, stride = a->m, cols = a->m, dt = RN_DTYPE_F32;
    else
        return -1;
    if (rows <= 0 || cols <= 0) {
        *bytes = 1;
        return 0;
    }
    if (stride < cols)
        stride = cols; /* the daemon refuses it; the span is at least the row */
    if (__builtin_mul_overflow((uint64_t)(rows - 1), (uint64_t)stride, &elems) ||
        __builtin_add_overflow(elems, (uint64_t)cols, &elems) ||
        __builtin_mul_overflow(elems, esize(dt), bytes))
        return -1;
    return 0;
}
