/* SPDX-License-Identifier: MIT */
/*
 * device.c - which device the backend serves (an index or a UUID), UUIDs as
 * nvidia-smi prints them, which CUDA errors leave the context unusable, the
 * backend's failed state, and the one conversion of a failed call (an
 * rn_fault from rn_check.h) into the rnp_error a client gets.
 */
#include "cuda_int.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Errors after which the context cannot be used again. */
bool rnd_cuda_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsRpcFailure:
    case cudaErrorMpsServerNotReady:
    case cudaErrorMpsClientTerminated:
    case cudaErrorCudartUnloading:
        return true;
    default:
        return false;
    }
}

/*
 * Mark the backend failed; the loop gives every job not yet done its done
 * event and calls the fatal hook at its next check (rnd_cuda_run_fatal),
 * never from inside a call of the server's, which may be iterating over the
 * state that those events change.
 */
void rnd_cuda_mark_failed(rnd_cuda *b, const char *fmt, ...)
{
    va_list ap;

    if (b->failed)
        return;
    b->failed = true;
    b->fatal_pending = true;
    va_start(ap, fmt);
    vsnprintf(b->fail_msg, sizeof b->fail_msg, fmt, ap);
    va_end(ap);
    if (b->handles) /* before init finished there is no loop to wake */
        uv_async_send(&b->async);
}

/*
 * Turn a failed call into err as "what: file:line: call: error": RN_SYSTEM
 * (RN_NOMEM) for a pthread or system call, RN_NOMEM for a CUDA allocation,
 * RN_DEVICE_FAILING for a sticky CUDA error, which also marks the backend
 * failed, else RN_CUDA.  (RN_CUDA_GOTO cleared CUDA's last error already,
 * so the next call starts clean.)
 *
 * client: the call's input came from a client (an IPC handle).  Its failure
 * is then the client's unless the context itself is broken, which a query
 * of one of our own streams tells: a stale or forged handle can make the
 * driver answer cudaErrorUnknown, and that must not take the daemon down
 * for every client.
 */
int rnd_cuda_fault(rnd_cuda *b, const rn_fault *f, bool client, rnp_error *err, const char *what)
{
    char buf[RNP_MAX_ERRMSG];
    rn_fault g = *f;
    cudaError_t e = (cudaError_t)f->cuda;
    int code;

    if (!f->cuda)
        return rnp_fail(err, f->err == ENOMEM ? RN_NOMEM : RN_SYSTEM, "%s: %s", what,
                        rn_fault_format(f, buf, sizeof buf));
    code = e == cudaErrorMemoryAllocation ? RN_NOMEM : RN_CUDA;
    if (rnd_cuda_sticky(e) && client) {
        cudaError_t p = b->nstreams > 0 ? cudaStreamQuery(b->streams[0].st) : cudaSuccess;
        (void)cudaGetLastError();
        if (p == cudaSuccess || p == cudaErrorNotReady || !rnd_cuda_sticky(p))
            return rnp_fail(err, code, "%s: %s", what, rn_fault_format(f, buf, sizeof buf));
        /* The context is broken: say so, at the call that found it. */
        g.cuda = (int)p;
        g.why = cudaGetErrorString(p);
        e = p;
    }
    rn_fault_format(&g, buf, sizeof buf);
    if (rnd_cuda_sticky(e)) {
        code = RN_DEVICE_FAILING;
        rnd_cuda_mark_failed(b, "%s", buf);
    }
    return rnp_fail(err, code, "%s: %s", what, buf);
}

/* A request refused because the backend failed; op names the request. */
int rnd_cuda_failed_err(const rnd_cuda *b, rnp_error *err, const char *op)
{
    return rnp_fail(err, RN_DEVICE_FAILING, "%s: the GPU failed: %.150s", op, b->fail_msg);
}

static void uuid_str(const uint8_t u[RNP_UUID_BYTES], char out[41])
{
    static const int dash[] = {4, 6, 8, 10};
    char *p = out + sprintf(out, "GPU-");
    for (int i = 0, d = 0; i < RNP_UUID_BYTES; i++) {
        if (d < 4 && i == dash[d]) {
            *p++ = '-';
            d++;
        }
        p += sprintf(p, "%02x", u[i]);
    }
    *p = '\0';
}

/* 0 when uuid is the device's, else RN_WRONG_DEVICE naming field: "<field>:
 * <what> is on GPU-..., this daemon serves GPU-...". */
int rnd_cuda_same_device(const rnd_cuda *b, const uint8_t uuid[RNP_UUID_BYTES], const char *field,
                         const char *what, rnp_error *err)
{
    char theirs[41], ours[41];

    if (memcmp(uuid, b->prop.uuid.bytes, RNP_UUID_BYTES) == 0)
        return 0;
    uuid_str(uuid, theirs);
    uuid_str((const uint8_t *)b->prop.uuid.bytes, ours);
    return rnp_fail(err, RN_WRONG_DEVICE, "%s: %s on %s, this daemon serves %s", field, what,
                    theirs, ours);
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as nvidia-smi -L prints it). */
static bool parse_uuid(const char *s, uint8_t out[RNP_UUID_BYTES])
{
    int nib = 0;
    if (strncmp(s, "GPU-", 4) != 0)
        return false;
    memset(out, 0, RNP_UUID_BYTES);
    for (s += 4; *s; s++) {
        int v;
        if (*s == '-')
            continue;
        if (*s >= '0' && *s <= '9')
            v = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            v = *s - 'a' + 10;
        else if (*s >= 'A' && *s <= 'F')
            v = *s - 'A' + 10;
        else
            return false;
        if (nib >= 2 * RNP_UUID_BYTES)
            return false;
        out[nib / 2] |= (uint8_t)(nib % 2 ? v : v << 4);
        nib++;
    }
    return nib == 2 * RNP_UUID_BYTES;
}

static int pick_by_uuid(rnd_cuda *b, const char *spec, int n, rnp_error *err)
{
    uint8_t want[RNP_UUID_BYTES];

    if (!parse_uuid(spec, want))
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "device: '%.60s' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                        "xxxxxxxxxxxx)",
                        spec);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
            continue;
        if (memcmp(p.uuid.bytes, want, RNP_UUID_BYTES) == 0) {
            b->dev = i;
            b->prop = p;
            return 0;
        }
    }
    (void)cudaGetLastError();
    return rnp_fail(err, RN_INVALID_ARGUMENT,
                    "device: no visible CUDA device has UUID %.60s (%d devices; "
                    "CUDA_VISIBLE_DEVICES may hide it)",
                    spec, n);
}

/* Choose the device (an index, or a UUID; NULL or empty: 0) and read its
 * properties.  RN_NO_CUDA when there is no usable device at all, so that
 * --backend auto falls back quietly. */
int rnd_cuda_pick_device(rnd_cuda *b, const char *spec, rnp_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char *end;
    long idx;

    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* Without the driver's library cudart says "CUDA driver version is
         * insufficient for CUDA runtime version", which sends a user to
         * update a driver that is not there: say what it is. */
        if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
            void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
            if (drv == NULL)
                return rnp_fail(err, RN_NO_CUDA, "no NVIDIA driver (libcuda.so.1 not found)");
            dlclose(drv);
        }
        return rnp_fail(err, RN_NO_CUDA, "no usable CUDA device (cudaGetDeviceCount: %s)",
                        cudaGetErrorString(e));
    }
    if (n == 0)
        return rnp_fail(err, RN_NO_CUDA, "no CUDA device");
    if (!spec || !*spec)
        spec = "0";
    if (strncmp(spec, "GPU-", 4) == 0)
        return pick_by_uuid(b, spec, n, err);
    errno = 0;
    idx = strtol(spec, &end, 10);
    if (errno || *end || idx < 0)
        return rnp_fail(err, RN_INVALID_ARGUMENT,
                        "device: expected an index or a UUID, got '%.60s'", spec);
    if (idx >= n)
        return rnp_fail(err, RN_INVALID_ARGUMENT, "device: index %ld, but %d CUDA device%s visible",
                        idx, n, n == 1 ? " is" : "s are");
    b->dev = (int)idx;
    e = cudaGetDeviceProperties(&b->prop, b->dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return rnp_fail(err, RN_CUDA, "device %d: cudaGetDeviceProperties: %s", b->dev,
                        cudaGetErrorString(e));
    }
    return 0;
}
