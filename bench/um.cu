// um: Unified Memory workloads, timed whole (allocation to free). Prints `metric value` lines:
//   um_iter_s     (a) host initialises MiB of managed memory, ITERS kernels each followed by
//                 cudaDeviceSynchronize, the host reads every element for a checksum
//   um_sweep_s    (b) ROUNDS rounds of: a kernel adds 1 to every element, then the host reads and
//                 writes one int per 4 KiB page of the buffer
//   um_nohost_s   (c) host initialises, ITERS kernels with a sync each, the result leaves through
//                 a small cudaMemcpy: the host never touches managed memory after init
//   um_init_s     the host initialisation alone (first-touch cost), within (a)
//   um_readback_s the host checksum alone, within (a)
//   um_nohost_init_s, _first_s, _rest_s, _free_s: (c) in parts: allocation and host init, the
//                 first kernel (it moves the data to the GPU), the other kernels, the frees
// Usage: um [MiB (1024)] [ITERS (50)] [ROUNDS (10)]. Refuses to run when the GPU has less free
// memory than twice the buffer (never ask for more managed memory than the GPU has free).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"

__global__ void step(float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = x[i] * 0.999f + 1.0f;
}

__global__ void bump(int *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1;
}

__global__ void reduce(const float *x, size_t n, double *out)
{
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += x[i];
    atomicAdd(out, s);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const int GRID = 1024, BLOCK = 256;

static void iterative(size_t n, int iters, int quiet)
{
    double t0 = now_s();
    float *x;
    CHECK(cudaMallocManaged(&x, n * sizeof(float), cudaMemAttachGlobal));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i & 1023);
    double t1 = now_s();
    for (int it = 0; it < iters; it++) {
        step<<<GRID, BLOCK>>>(x, n);
        CHECK(cudaDeviceSynchronize());
    }
    double t2 = now_s(), sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    double t3 = now_s();
    CHECK(cudaFree(x));
    double t4 = now_s();
    if (quiet)
        return;
    printf("um_iter_s %.6f\num_init_s %.6f\num_readback_s %.6f\n", t4 - t0, t1 - t0, t3 - t2);
    fprintf(stderr, "iterative checksum %.6e\n", sum);
}

static void sweep(size_t n, int rounds)
{
    double t0 = now_s();
    int *x;
    CHECK(cudaMallocManaged(&x, n * sizeof(int), cudaMemAttachGlobal));
    long long check = 0;
    for (int r = 0; r < rounds; r++) {
        bump<<<GRID, BLOCK>>>(x, n);
        CHECK(cudaDeviceSynchronize());
        for (size_t i = 0; i < n; i += 1024) { // one int per 4 KiB page
            check += x[i];
            x[i] += 1;
        }
    }
    CHECK(cudaFree(x));
    printf("um_sweep_s %.6f\n", now_s() - t0);
    fprintf(stderr, "sweep check %lld\n", check);
}

static void nohost(size_t n, int iters)
{
    double t0 = now_s();
    float *x;
    double *d_sum, sum = 0;
    CHECK(cudaMallocManaged(&x, n * sizeof(float), cudaMemAttachGlobal));
    CHECK(cudaMalloc(&d_sum, sizeof(double)));
    CHECK(cudaMemset(d_sum, 0, sizeof(double)));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i & 1023);
    double t1 = now_s();
    step<<<GRID, BLOCK>>>(x, n);
    CHECK(cudaDeviceSynchronize());
    double t2 = now_s();
    for (int it = 1; it < iters; it++) {
        step<<<GRID, BLOCK>>>(x, n);
        CHECK(cudaDeviceSynchronize());
    }
    reduce<<<GRID, BLOCK>>>(x, n, d_sum);
    CHECK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    double t3 = now_s();
    CHECK(cudaFree(x));
    CHECK(cudaFree(d_sum));
    double t4 = now_s();
    printf("um_nohost_s %.6f\num_nohost_init_s %.6f\num_nohost_first_s %.6f\n"
           "um_nohost_rest_s %.6f\num_nohost_free_s %.6f\n",
           t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3);
    fprintf(stderr, "nohost checksum %.6e\n", sum);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 1024;
    int iters = argc > 2 ? atoi(argv[2]) : 50, rounds = argc > 3 ? atoi(argv[3]) : 10;
    size_t bytes = mib << 20, free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (free_b < 2 * bytes) {
        fprintf(stderr, "um: %zu MiB free on the GPU, %zu MiB needed; not running\n",
                free_b >> 20, 2 * mib);
        return 1;
    }
    // Warm-up: context, module, a small managed round trip.
    iterative(1 << 18, 2, 1);
    iterative(bytes / sizeof(float), iters, 0);
    sweep(bytes / sizeof(int), rounds);
    nohost(bytes / sizeof(float), iters);
    return 0;
}
