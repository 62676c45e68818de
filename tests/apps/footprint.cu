// footprint: kernels whose arguments point into device, managed, pitched and pinned (mapped host)
// memory, launched through each entry point: <<<>>>, cudaLaunchKernelExC (with a priority
// attribute, and interior pointers), cudaLaunchKernel (a struct holding two pointers, passed by
// value), and a kernel with no pointer arguments (it writes a __device__ variable).
// tests/apps/test_scheduler_core.py runs it under a policy that records each launch's memory
// footprint. Self-checking: every launch prints "<name> ok" or "<name> FAIL ..." and the
// program exits non-zero on any failure; the output is the same natively and under pilot.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "self_check.h"

struct Pair {
    int *a;
    int n;
    double *b;
};

__device__ int g_product;

// dev[i] = dev[i] * 3 + i; managed[i] *= 2; pinned[i] += 1, for i < n covered by the grid.
__global__ void fp_mixed(int *dev, float *managed, char *pinned, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dev[i] = dev[i] * 3 + i;
        managed[i] = managed[i] * 2.0f;
        pinned[i] = (char)(pinned[i] + 1);
    }
}

// p.b[i] = p.a[i] * 0.5 for i < p.n covered by the grid.
__global__ void fp_struct(Pair p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n)
        p.b[i] = p.a[i] * 0.5;
}

// Thread (0,0): g_product = a * b + 7.
__global__ void fp_none(int a, int b)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        g_product = a * b + 7;
}

static const int N = 1000;
static const int SKIP = 10; // the cudaLaunchKernelExC launch starts at element SKIP

static int blocks(int n)
{
    return (n + 255) / 256;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int *dev, *host_i = (int *)malloc(N * sizeof(int));
    float *managed;
    char *pinned;
    CHECK(cudaMalloc((void **)&dev, N * sizeof(int)));
    CHECK(cudaMallocManaged((void **)&managed, N * sizeof(float), cudaMemAttachGlobal));
    CHECK(cudaHostAlloc((void **)&pinned, N, cudaHostAllocMapped));
    for (int i = 0; i < N; i++) {
        host_i[i] = i;
        managed[i] = (float)i * 0.25f;
        pinned[i] = (char)(i % 100);
    }
    CHECK(cudaMemcpy(dev, host_i, N * sizeof(int), cudaMemcpyHostToDevice));

    // 1. <<<>>>
    fp_mixed<<<blocks(N), 256>>>(dev, managed, pinned, N);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host_i, dev, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += host_i[i] != 4 * i || managed[i] != (float)i * 0.5f || pinned[i] != (char)(i % 100 + 1);
    verdict("mixed <<<>>>", bad == 0, "wrong values");

    // 2. cudaLaunchKernelExC, a priority attribute, pointers into the middle of each allocation.
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributePriority;
    attr[0].val.priority = greatest;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks(N - SKIP));
    cfg.blockDim = dim3(256);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int *dev_mid = dev + SKIP, n_mid = N - SKIP;
    float *managed_mid = managed + SKIP;
    char *pinned_mid = pinned + SKIP;
    void *args[] = {&dev_mid, &managed_mid, &pinned_mid, &n_mid};
    CHECK(cudaLaunchKernelExC(&cfg, (const void *)fp_mixed, args));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host_i, dev, N * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < N; i++) {
        int mid = i >= SKIP;
        bad += host_i[i] != (mid ? 13 * i - SKIP : 4 * i);
        bad += managed[i] != (mid ? (float)i : (float)i * 0.5f);
        bad += pinned[i] != (char)(i % 100 + (mid ? 2 : 1));
    }
    verdict("mixed cudaLaunchKernelExC", bad == 0, "wrong values");

    // 3. cudaLaunchKernel, a struct by value: a device allocation and a pitched one.
    double *rows, *host_d = (double *)malloc(N * sizeof(double));
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&rows, &pitch, N * sizeof(double), 2));
    Pair p = {dev, N, rows};
    void *sargs[] = {&p};
    CHECK(cudaLaunchKernel((const void *)fp_struct, dim3(blocks(N)), dim3(256), sargs, 0, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host_i, dev, N * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(host_d, rows, N * sizeof(double), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += host_d[i] != host_i[i] * 0.5;
    verdict("struct cudaLaunchKernel", bad == 0, "wrong values");

    // 4. No pointer arguments.
    fp_none<<<1, 32>>>(6, 7);
    CHECK(cudaGetLastError());
    int product = 0;
    CHECK(cudaMemcpyFromSymbol(&product, g_product, sizeof product));
    verdict("no pointers", product == 49, "wrong product");

    CHECK(cudaFree(rows));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(managed));
    CHECK(cudaFree(dev));
    free(host_d);
    free(host_i);
    printf(g_failed ? "FAIL\n" : "PASS\n");
    return g_failed;
}
