/* SPDX-License-Identifier: MIT */
/*
 * prog_hog.c - occupies the GPU from another process for the no-deadlock
 * test: launches a kernel holding `blocks` SMs (default: all), prints "ready"
 * once it runs, and stops it when a line or EOF arrives on stdin (or after a
 * 60 s safety timeout).  Usage: prog_hog [blocks]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rnk.h"
#include "rnk_test.h"

int main(int argc, char **argv)
{
    int sms = 0, *stop = NULL, *started = NULL, *stop_d = NULL, *started_d = NULL;
    char msg[256];
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaSetDeviceFlags(cudaDeviceMapHost) != cudaSuccess ||
        cudaHostAlloc((void **)&stop, 2 * sizeof(int), cudaHostAllocMapped) != cudaSuccess) {
        fprintf(stderr, "prog_hog: CUDA setup failed\n");
        return 2;
    }
    started = stop + 1;
    *stop = 0;
    *started = 0;
    if (cudaHostGetDevicePointer((void **)&stop_d, stop, 0) != cudaSuccess) {
        fprintf(stderr, "prog_hog: no device pointer for mapped memory\n");
        return 2;
    }
    started_d = stop_d + 1;
    int blocks = argc > 1 ? atoi(argv[1]) : sms;
    if (rnk_cuda_hog(blocks, stop_d, started_d, 60000, NULL, msg, sizeof msg) != 0) {
        fprintf(stderr, "prog_hog: %s\n", msg);
        return 2;
    }
    /* The kernel announces itself through mapped memory; wait for it (a
     * bounded poll of a flag, not a guess at how long a start takes). */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!*(volatile int *)started) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) {
            fprintf(stderr, "prog_hog: kernel did not start\n");
            return 2;
        }
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    printf("ready %d\n", blocks);
    fflush(stdout);
    char line[16];
    (void)!fgets(line, sizeof line, stdin);
    *(volatile int *)stop = 1;
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "prog_hog: %s\n", cudaGetErrorString(e));
        return 2;
    }
    return 0;
}
