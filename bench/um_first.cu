// um_first: the first kernel of a fresh process that touches host-written managed memory (issue
// 28: about 8 ms under pilot against 0.4 ms natively). The context is made first (cudaFree(0)),
// then BYTES of managed memory are allocated and written on the host, then one kernel adds 1 to
// every int, timed from its launch to cudaDeviceSynchronize's return; then a second allocation
// the same way, for comparison. Prints `metric value` lines:
//   um_first_kernel_ms   the first managed kernel of the process
//   um_second_kernel_ms  the same kernel on a second, fresh allocation
//   um_first_alloc_ms    the first cudaMallocManaged and its host fill
// Each run is one fresh process (bench.py reports the median over its runs).
// Usage: um_first [BYTES (1048576)]. Exits non-zero on a CUDA error or a wrong value.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"

__global__ void first_touch(int *x, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Allocates and fills n ints; returns the kernel's time (the allocation's in *alloc_ms).
static double one(size_t n, double *alloc_ms)
{
    int *x;
    double t0 = now_ms();
    CHECK(cudaMallocManaged((void **)&x, n * sizeof *x, cudaMemAttachGlobal));
    for (size_t i = 0; i < n; i++)
        x[i] = (int)i;
    double t1 = now_ms();
    first_touch<<<(unsigned)((n + 255) / 256), 256>>>(x, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    double t2 = now_ms();
    for (size_t i = 0; i < n; i++)
        if (x[i] != (int)i + 1) {
            fprintf(stderr, "x[%zu] = %d, want %d\n", i, x[i], (int)i + 1);
            exit(1);
        }
    CHECK(cudaFree(x));
    if (alloc_ms)
        *alloc_ms = t1 - t0;
    return t2 - t1;
}

int main(int argc, char **argv)
{
    const long bytes = argc > 1 ? atol(argv[1]) : 1 << 20;
    if (bytes < 4) {
        fprintf(stderr, "usage: %s [BYTES>=4]\n", argv[0]);
        return 2;
    }
    CHECK(cudaFree(0)); // the context (under pilot: the session), outside the measurement
    double alloc_ms = 0, first = one((size_t)bytes / 4, &alloc_ms), second = one((size_t)bytes / 4, NULL);
    printf("um_first_kernel_ms %.3f\n", first);
    printf("um_second_kernel_ms %.3f\n", second);
    printf("um_first_alloc_ms %.3f\n", alloc_ms);
    return 0;
}
