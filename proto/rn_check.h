/* SPDX-License-Identifier: MIT */
/*
 * rn_check.h - the one set of check macros of the project: system calls,
 * pthread calls, the CUDA runtime and the CUDA driver API.
 *
 * The library forms never log (only the daemon logs, once, where it decides
 * what a failure means).  They record where and why a call failed in an
 * rn_fault and jump to a cleanup label; the code there turns the fault into
 * its layer's error (an rnp_error in proto/daemon, the last error of a
 * libclient handle) with rn_fault_format:
 *
 *     rn_fault f;
 *     RN_SYS_GOTO(fd = open(path, O_RDONLY), &f, fail);
 *     RN_PT_GOTO(pthread_create(&t, NULL, fn, arg), &f, fail_close);
 *     ...
 *   fail_close:
 *     close(fd);
 *   fail:
 *     return rnp_fail(err, RN_SYSTEM, "region.name: %s", rn_fault_format(&f, buf, sizeof buf));
 *
 * The CUDA forms exist where the including file included cuda_runtime_api.h
 * (RN_CUDA_GOTO: also clears CUDA's last-error state, so the next call starts
 * clean) or cuda.h (RN_CU_GOTO, for driver entry points).  rn_fault.cuda holds
 * the error code for the caller's classification (sticky or not).
 *
 * Test and benchmark programs use the _DIE forms: print file:line, the call
 * and the reason on stderr and exit(1).  Never in libraries or the daemon.
 *
 * Header-only, C11 and C++ (nvcc), depends on nothing of ours: every folder
 * of the project may include it.
 */
#ifndef RN_CHECK_H
#define RN_CHECK_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rn_fault {
    const char *file;   /* __FILE__ of the check */
    int line;
    const char *expr;   /* the call, as written */
    int err;            /* errno or the pthread result; 0 for CUDA */
    int cuda;           /* cudaError_t or CUresult; 0 for the system forms */
    const char *why;    /* CUDA's own text (a static string); NULL: strerror(err) */
} rn_fault;

static inline void rn_fault_set(rn_fault *f, const char *file, int line, const char *expr, int err,
                                int cuda, const char *why)
{
    const char *s = strrchr(file, '/');
    f->file = s ? s + 1 : file;
    f->line = line;
    f->expr = expr;
    f->err = err;
    f->cuda = cuda;
    f->why = why;
}

/* "file:line: call: reason" into buf; returns buf. */
static inline const char *rn_fault_format(const rn_fault *f, char *buf, size_t n)
{
    char sys[128];
    const char *why = f->why;
    if (!why) {
        /* The GNU strerror_r returns its text, which may not be sys. */
        why = strerror_r(f->err, sys, sizeof sys);
    }
    snprintf(buf, n, "%s:%d: %s: %s", f->file, f->line, f->expr, why);
    return buf;
}

/* A system call that returns < 0 and sets errno on failure. */
#define RN_SYS_GOTO(call, f, label)                                                        \
    do {                                                                                   \
        if ((call) < 0) {                                                                  \
            rn_fault_set((f), __FILE__, __LINE__, #call, errno, 0, NULL);                  \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)

/* A pthread call: 0 or an error number. */
#define RN_PT_GOTO(call, f, label)                                                         \
    do {                                                                                   \
        int rn_pt_e_ = (call);                                                             \
        if (rn_pt_e_ != 0) {                                                               \
            rn_fault_set((f), __FILE__, __LINE__, #call, rn_pt_e_, 0, NULL);               \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)

#define RN_DIE_(file, line, expr, why)                                                     \
    do {                                                                                   \
        fprintf(stderr, "%s:%d: %s: %s\n", file, line, expr, why);                         \
        exit(1);                                                                           \
    } while (0)

#define RN_SYS_DIE(call)                                                                   \
    do {                                                                                   \
        if ((call) < 0)                                                                    \
            RN_DIE_(__FILE__, __LINE__, #call, strerror(errno));                           \
    } while (0)

#define RN_PT_DIE(call)                                                                    \
    do {                                                                                   \
        int rn_pt_e_ = (call);                                                             \
        if (rn_pt_e_ != 0)                                                                 \
            RN_DIE_(__FILE__, __LINE__, #call, strerror(rn_pt_e_));                        \
    } while (0)

#if defined(__CUDA_RUNTIME_API_H__)
/* A CUDA runtime call.  Clears the last-error state on failure. */
#define RN_CUDA_GOTO(call, f, label)                                                       \
    do {                                                                                   \
        cudaError_t rn_cu_e_ = (call);                                                     \
        if (rn_cu_e_ != cudaSuccess) {                                                     \
            (void)cudaGetLastError();                                                      \
            rn_fault_set((f), __FILE__, __LINE__, #call, 0, (int)rn_cu_e_,                 \
                         cudaGetErrorString(rn_cu_e_));                                    \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)

#define RN_CUDA_DIE(call)                                                                  \
    do {                                                                                   \
        cudaError_t rn_cu_e_ = (call);                                                     \
        if (rn_cu_e_ != cudaSuccess)                                                       \
            RN_DIE_(__FILE__, __LINE__, #call, cudaGetErrorString(rn_cu_e_));              \
    } while (0)
#endif

#if defined(__CUDA_RUNTIME_API_H__)
/* The driver's function `name` (as of the CUDA 12.0 ABI) through the
 * runtime, so that nothing links libcuda itself; NULL (and CUDA's error
 * state cleared) when the driver has none. */
static inline void *rn_cuda_entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);

    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}

/* rn_cuda_entry into *fn; whether the driver has it. */
static inline bool rn_cuda_entry_to(const char *name, void **fn)
{
    return (*fn = rn_cuda_entry(name)) != NULL;
}
#endif

#if defined(__cuda_cuda_h__)
/* A CUDA driver call (reached through an entry point): the driver's code in
 * rn_fault.cuda, and "CUDA driver error N" as the reason. */
#define RN_CU_GOTO(call, f, label)                                                         \
    do {                                                                                   \
        CUresult rn_drv_e_ = (call);                                                       \
        if (rn_drv_e_ != CUDA_SUCCESS) {                                                   \
            rn_fault_set((f), __FILE__, __LINE__, #call, 0, (int)rn_drv_e_,                \
                         "CUDA driver error");                                             \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)
#endif

#endif
