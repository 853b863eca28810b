/* SPDX-License-Identifier: MIT */
/*
 * vmm.h - device pointers in CUDA virtual memory (cuMemCreate + cuMemMap,
 * as PyTorch's expandable segments allocate it), which has no CUDA IPC
 * handle: libclient shares the physical allocations behind a tensor's
 * bytes, one POSIX descriptor each, on the session channel (VMM_CHUNK ...
 * VMM_MAP, PROTOCOL.md section 12), and the daemon maps them as one
 * region that mirrors the client's layout.
 *
 *   vmm_walk.c   host-only logic, built everywhere and unit-tested: the
 *                chunks behind a byte range, a tensor's byte span
 *   vmm_cuda.c   the driver calls, the registration cache and the
 *                channel messages (built only with CUDA)
 */
#ifndef RN_CLIENT_VMM_H
#define RN_CLIENT_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_client.h"

/* One mapping of a physical allocation: [base, base + size). */
typedef struct rnc_vmm_piece {
    uintptr_t base;
    size_t size;
} rnc_vmm_piece;

/* The mapping that contains addr, into *out; 0, or nonzero where nothing
 * is mapped at addr. */
typedef int (*rnc_vmm_lookup)(void *ctx, uintptr_t addr, rnc_vmm_piece *out);

/* rnc_vmm_walk's failures. */
enum { RNC_VMM_HOLE = -1, RNC_VMM_TOO_MANY = -2, RNC_VMM_BAD_LOOKUP = -3 };

/*
 * The mappings that cover [lo, hi) (lo < hi), in address order, into out
 * (room for max): the one at lo, then the one at its end, and so on until
 * one reaches hi.  Returns how many, or RNC_VMM_HOLE (nothing mapped at
 * *at), RNC_VMM_TOO_MANY (more than max), RNC_VMM_BAD_LOOKUP (a mapping
 * that does not contain the address asked for, at *at).
 */
int rnc_vmm_walk(rnc_vmm_lookup look, void *ctx, uintptr_t lo, uintptr_t hi, rnc_vmm_piece *out,
                 size_t max, uintptr_t *at);

/*
 * The bytes from the first element of tensor field ("x", "dy", "dx", "w",
 * "rstd", "dres", "dw") of a to its last, row gaps included (1 for a
 * tensor with no rows: the byte at its pointer still names its memory).
 * Returns 0, or -1 for an unknown field or a span that overflows.
 */
int rnc_tensor_bytes(const rn_bwd_args *a, const char *field, uint64_t *bytes);

#endif
