// cudaDeviceReset and what a program may do after it: every kind of object the reset destroys is
// made again and used (device memory, streams and the per-thread stream, events, arrays, texture
// objects, small and large managed memory), twice over. Under pilot each module drops its own
// record of the destroyed objects when the reset succeeds (shim/core/hooks.h); a record left over
// would make a new object collide with the old one or a handle name what is gone.
// Self-checking: prints "round <i> ok" per round and "reset ok" (exit status 0), the same
// natively and under pilot.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "self_check.h"

// The kernels of threads.cu and arrays.cu (the sim daemon has them by these names).
__global__ void scale_add(int *v, int n, int mul, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = v[i] * mul + add;
}

__global__ void tex_fetch_linear(cudaTextureObject_t tex, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex1Dfetch<int>(tex, i);
}

static int managed_round(int n)
{
    int *small, *large;
    CHECK(cudaMallocManaged(&small, 64 * sizeof(int)));       // packed with others under pilot
    CHECK(cudaMallocManaged(&large, (size_t)n * sizeof(int))); // a range of its own
    for (int i = 0; i < 64; i++)
        small[i] = i;
    for (int i = 0; i < n; i++)
        large[i] = 2 * i;
    scale_add<<<1, 64>>>(small, 64, 1, 1);
    scale_add<<<(n + 255) / 256, 256, 0, cudaStreamPerThread>>>(large, n, 1, 1);
    CHECK(cudaDeviceSynchronize());
    int ok = 1;
    for (int i = 0; i < 64; i++)
        ok &= small[i] == i + 1;
    for (int i = 0; i < n; i++)
        ok &= large[i] == 2 * i + 1;
    return ok; // left allocated: the reset frees them
}

static int objects_round(int n)
{
    int *d, host[256];
    cudaStream_t s;
    cudaEvent_t e;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&e));
    CHECK(cudaMemsetAsync(d, 0, n * sizeof(int), s));
    scale_add<<<(n + 255) / 256, 256, 0, s>>>(d, n, 1, 1);
    CHECK(cudaEventRecord(e, s));
    CHECK(cudaEventSynchronize(e));
    CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int i = 0; i < 256; i++)
        ok &= host[i] == 1;

    // an array and a texture object over linear memory, read by a kernel
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<int>();
    cudaArray_t array;
    CHECK(cudaMallocArray(&array, &desc, 256, 0, 0));
    int values[256], back[256];
    for (int i = 0; i < 256; i++)
        values[i] = 7 * i - 100;
    CHECK(cudaMemcpy2DToArray(array, 0, 0, values, sizeof values, sizeof values, 1,
                              cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(back, sizeof back, array, 0, 0, sizeof back, 1,
                                cudaMemcpyDeviceToHost));
    ok &= memcmp(values, back, sizeof values) == 0;
    int *lin, *out;
    CHECK(cudaMalloc(&lin, sizeof values));
    CHECK(cudaMalloc(&out, sizeof values));
    CHECK(cudaMemcpy(lin, values, sizeof values, cudaMemcpyHostToDevice));
    cudaResourceDesc res;
    memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = lin;
    res.res.linear.desc = desc;
    res.res.linear.sizeInBytes = sizeof values;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, NULL));
    tex_fetch_linear<<<1, 256>>>(tex, out, 256);
    CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
    ok &= memcmp(values, back, sizeof values) == 0;
    return ok; // all left for the reset to destroy
}

int main(void)
{
    for (int round = 0; round < 3; round++) {
        int ok = objects_round(1 << 16) & managed_round(1 << 18);
        char name[32];
        snprintf(name, sizeof name, "round %d", round);
        verdict(name, ok, "an object made after cudaDeviceReset did not work");
        CHECK(cudaDeviceReset());
    }
    verdict("reset", !g_failed, "a round failed");
    return g_failed;
}
