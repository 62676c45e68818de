// What graphs.cu and graph_mem.cu share: their kernels (the sim emulates them by these names,
// tests/apps/sim_kernels_streams.py) and the check that stops a program on a failed call.
#ifndef GRAPH_KERNELS_CUH
#define GRAPH_KERNELS_CUH

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

__global__ void graph_axpb(int *x, int n, int mul, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * mul + add;
}

__global__ void graph_add(int *dst, const int *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] += src[i];
}

static const char *name(cudaError_t e) { return cudaGetErrorName(e); }

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #call, name(e_));       \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#endif
