// device_printf: kernels that call printf, between host prints, flushed by each kind of call the
// driver flushes the printf FIFO at (a device synchronize, a stream synchronize, a blocking copy,
// an event synchronize). The device lines must reach this program's stdout in the same place as
// natively, where pilotd's driver prints them (daemon/vgpu/device_output.py). One thread prints
// at a time, so the order is the same on every run. stdout is unbuffered: the device lines and
// the host lines then come out in program order however the driver writes them. Usage:
// device_printf [buffered] (buffered: stdout as the C library sets it up, to compare how the
// driver's writes mix with a buffered stdout natively and under pilot).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) {                                                        \
            printf("CUDA error %s at line %d: %s\n", cudaGetErrorName(err_), __LINE__, #call); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

__global__ void printf_greet(int n, float f)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        printf("hello from the GPU: n=%d f=%.3f hex=%x s=%s c=%c %%\n", n, f, 0xbeef, "text", 'z');
}

__global__ void printf_turns(int round)
{
    for (int i = 0; i < (int)blockDim.x; i++) {
        if ((int)threadIdx.x == i)
            printf("thread %d of %d, round %d\n", (int)threadIdx.x, (int)blockDim.x, round);
        __syncthreads();
    }
}

__global__ void printf_fill(int *out, int v)
{
    out[threadIdx.x] = v + (int)threadIdx.x;
    if (threadIdx.x == 0)
        printf("fill %d\n", v);
}

int main(int argc, char **argv)
{
    (void)argv;
    if (argc < 2)
        setvbuf(stdout, NULL, _IONBF, 0);
    printf("host: start\n");
    printf_greet<<<2, 32>>>(42, 1.5f);
    CHECK(cudaDeviceSynchronize());
    printf("host: after the device synchronize\n");

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf_turns<<<1, 4, 0, s>>>(1);
    CHECK(cudaStreamSynchronize(s));
    printf("host: after the stream synchronize\n");

    int *d, h[64];
    CHECK(cudaMalloc(&d, sizeof h));
    printf_fill<<<1, 64>>>(d, 100);
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    printf("host: copied %d %d\n", h[0], h[63]);

    cudaEvent_t e;
    CHECK(cudaEventCreate(&e));
    printf_turns<<<1, 2>>>(2);
    CHECK(cudaEventRecord(e, 0));
    CHECK(cudaEventSynchronize(e));
    printf("host: after the event synchronize\n");

    CHECK(cudaEventDestroy(e));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    printf("done\n");
    return 0;
}
