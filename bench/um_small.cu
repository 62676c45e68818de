// um_small: many small managed allocations (per-object buffers, linked structures, tables), as
// issue 28 measured them. For each N in 1,000 / 10,000 / 100,000 and SIZE in 16 / 64 / 1024
// bytes: N cudaMallocManaged of SIZE bytes, each filled on the host; one kernel adds 1 to every
// byte through a managed pointer table (one thread per allocation), synchronized; every byte
// checked on the host; cudaFree of all. Prints `metric value` lines, per N and SIZE:
//   small_N_SIZE_alloc_ms   the allocations and their host fill (wall clock)
//   small_N_SIZE_kernel_ms  the kernel: launch to cudaDeviceSynchronize's return (wall clock)
//   small_N_SIZE_free_ms    cudaFree of all N (wall clock)
//   small_N_SIZE_mem_mib    device memory the allocations took: cudaMemGetInfo's free before
//                           the allocations less free after the kernel, in MiB
// A small warm-up (allocations, a kernel, frees) runs first, so the first touch of the process
// (um_first.cu) is not in these numbers.
// Usage: um_small [DIV (1)]: N divided by DIV (the names stay; for smoke tests). Exits non-zero
// on a CUDA error or a wrong byte.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

__global__ void small_touch(unsigned char **ptrs, int n, int size)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        for (int b = 0; b < size; b++)
            ptrs[i][b] += 1;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static size_t free_bytes(void)
{
    size_t f = 0, total = 0;
    CHECK(cudaMemGetInfo(&f, &total));
    return f;
}

// One N x SIZE round; prints its metrics when `name` is set (NULL: the warm-up).
static void round_of(int n, int size, const char *name)
{
    unsigned char **ptrs;
    CHECK(cudaMallocManaged((void **)&ptrs, (size_t)n * sizeof *ptrs, cudaMemAttachGlobal));
    memset(ptrs, 0, (size_t)n * sizeof *ptrs);
    const size_t before = free_bytes();
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        CHECK(cudaMallocManaged((void **)&ptrs[i], (size_t)size, cudaMemAttachGlobal));
        memset(ptrs[i], (unsigned char)i, (size_t)size);
    }
    double t1 = now_ms();
    small_touch<<<(n + 127) / 128, 128>>>(ptrs, n, size);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    double t2 = now_ms();
    const size_t after = free_bytes();
    for (int i = 0; i < n; i++)
        for (int b = 0; b < size; b++)
            if (ptrs[i][b] != (unsigned char)(i + 1)) {
                fprintf(stderr, "allocation %d byte %d: %d, want %d\n", i, b, ptrs[i][b],
                        (unsigned char)(i + 1));
                exit(1);
            }
    double t3 = now_ms();
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(ptrs[i]));
    double t4 = now_ms();
    CHECK(cudaFree(ptrs));
    if (name) {
        printf("%s_alloc_ms %.3f\n", name, t1 - t0);
        printf("%s_kernel_ms %.3f\n", name, t2 - t1);
        printf("%s_free_ms %.3f\n", name, t4 - t3);
        printf("%s_mem_mib %.1f\n", name, before > after ? (before - after) / 1048576.0 : 0.0);
    }
}

int main(int argc, char **argv)
{
    static const int counts[] = {1000, 10000, 100000}, sizes[] = {16, 64, 1024};
    const int div = argc > 1 ? atoi(argv[1]) : 1;
    if (div < 1) {
        fprintf(stderr, "usage: %s [DIV>0]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    round_of(100, 64, NULL); // warm-up: context, module, first managed launch
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            char name[64];
            snprintf(name, sizeof name, "small_%d_%d", counts[c], sizes[s]);
            round_of(counts[c] / div > 0 ? counts[c] / div : 1, sizes[s], name);
        }
    return 0;
}
