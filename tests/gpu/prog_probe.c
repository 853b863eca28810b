/* SPDX-License-Identifier: MIT */
/*
 * prog_probe.c - exits 0 when a usable CUDA device exists (compute capability
 * 8.0 or newer, which the kernels are built for), else prints one line saying
 * why not and exits 1.  tests/run.sh runs the gpu suite only after it says yes.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
    int count = 0;
    /* Without the driver library cudart reports "driver version is
     * insufficient", which reads like a version mismatch: say what it is. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv) {
        printf("no NVIDIA driver on this host (libcuda.so.1 not found)\n");
        return 1;
    }
    dlclose(drv);
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        printf("no usable CUDA device: %s\n", cudaGetErrorString(e));
        return 1;
    }
    if (count == 0) {
        printf("no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        printf("CUDA device 0 unreadable: %s\n", cudaGetErrorString(e));
        return 1;
    }
    if (p.major < 8) {
        printf("CUDA device 0 (%s) is sm_%d%d; the kernels need sm_80 or newer\n", p.name, p.major,
               p.minor);
        return 1;
    }
    printf("CUDA device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor,
           p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30));
    return 0;
}
