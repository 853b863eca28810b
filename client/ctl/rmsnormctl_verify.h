/* SPDX-License-Identifier: MIT */
/*
 * rmsnormctl_verify.h - build RMSNorm backward test cases in a shared buffer
 * and check the daemon's results against the CPU twin (bitwise) and the fp64
 * reference (within a tolerance).  Used by rmsnormctl's selftest and bench
 * and by the integration tests.  Internal names use the prefix rnv_.
 */
#ifndef RMSNORMCTL_VERIFY_H
#define RMSNORMCTL_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rmsnorm_client.h"

/* One case: a shape, dtypes and which optional tensors are present. */
typedef struct rnv_case {
    int64_t m, n;
    int64_t pad; /* extra elements per row (row stride = n + pad) */
    rn_dtype x, dy, dx;
    rn_dtype w;    /* NONE: no weight */
    rn_dtype dres; /* NONE: no dresidual_out */
    rn_dtype dw;   /* NONE: no dw */
    bool rstd;     /* pass rstd (else the daemon recomputes it) */
    bool inplace;  /* dx written over dy */
    float eps, weight_offset;
} rnv_case;

/* The kernel's arguments for the same call (same field names; absent
 * tensors as NULL). */
struct rnk_bwd_args;
struct rnk_bwd_args rnv_to_rnk(const rn_bwd_args *a);

/* Bytes of one buffer holding every tensor of the case. */
size_t rnv_bytes(const rnv_case *k);

/*
 * Lay the case out in base (rnv_bytes(k) bytes), fill the inputs with
 * pseudo-random values from seed (rstd, when passed, is the true one), poison
 * the outputs, and set *a to point into base.
 */
void rnv_setup(const rnv_case *k, void *base, uint64_t seed, rn_bwd_args *a);

/* Write a recognisable garbage pattern over a's outputs (dx, dw). */
void rnv_poison(const rn_bwd_args *a);

/* Expected results of a case, computed from its inputs before the call. */
typedef struct rnv_expect {
    void *dx_twin, *dw_twin;   /* CPU twin, in the output dtypes, packed [m, n] / [n] */
    double *dx_ref, *dw_ref;   /* fp64 reference */
    size_t dx_bytes, dw_bytes; /* dw_bytes 0: dw not checked (absent, or m == 0) */
    double dx_scale, dw_scale; /* magnitudes of the terms, for the fp64 tolerance */
} rnv_expect;

/* Compute the expectations (twin with nthreads threads, and fp64).  Returns 0
 * or -1 with a message. */
int rnv_expect_init(rnv_expect *e, const rn_bwd_args *a, int nthreads, char *msg, size_t len);
void rnv_expect_fini(rnv_expect *e);

/*
 * Compare a's outputs with e: bitwise against the twin when `bitwise`, and
 * against fp64 within a tolerance for the output dtype.  Returns 0 or -1
 * with a message naming the tensor, the element and the values.  *max_rel
 * (may be NULL) gets the largest error against fp64 relative to the
 * tensor's largest magnitude.
 */
int rnv_compare(const rn_bwd_args *a, const rnv_expect *e, bool bitwise, double *max_rel, char *msg,
                size_t len);

/* Quick check for the bench: outputs bitwise equal to the twin's. */
bool rnv_equal_twin(const rn_bwd_args *a, const rnv_expect *e);

/*
 * Where a case's tensors live (rmsnormctl_mem.c): a shared-memory buffer
 * for the CPU backend; for the CUDA backend a host copy, where the case is
 * laid out and checked, and device memory the daemon computes on.
 */
typedef struct rnv_mem {
    void *host;   /* rnv_setup lays the case out here; results are compared here */
    void *dev;    /* device copy (CUDA backend), else NULL */
    size_t bytes;
} rnv_mem;

/* Allocate bytes for a daemon on the CUDA backend (cuda) or the CPU backend.
 * Returns 0 or an rn_status with a message. */
int rnv_mem_alloc(rn_client *c, bool cuda, size_t bytes, rnv_mem *m, char *msg, size_t len);
void rnv_mem_free(rn_client *c, rnv_mem *m);

/* Run the backward of a (pointers into m->host) through the daemon, leaving
 * the outputs in m->host.  Returns 0 or an rn_status with a message. */
int rnv_mem_run(rn_client *c, rnv_mem *m, const rn_bwd_args *a, rn_timing *t, char *msg,
                size_t len);

/* "bf16", "f16", "f32", "none"; and back (-1 if unknown). */
const char *rnv_dtype_name(rn_dtype dt);
int rnv_parse_dtype(const char *s);

/* A one-line description of a case, for reports. */
void rnv_describe(const rnv_case *k, char *buf, size_t len);

#endif
