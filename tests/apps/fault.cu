// A kernel that faults, and what programs beside it and after it see (issue 12, fault handling).
//   fault          a kernel writes far outside every allocation (cudaErrorIllegalAddress); prints
//                  what the launch, the synchronize and the calls after it return
//   steady SECS    H2D copy, a kernel adding one, D2H copy, checked, in a loop for SECS seconds
//                  or until a call fails; prints "steady: ok" or "steady: <error>", then the
//                  number of iterations on a line of its own (not compared)
//   quiet SECS     the faulting kernel, then no CUDA call for SECS seconds, then a synchronize:
//                  prints what it returns (natively the fault's error)
//   work           one checked computation: "work: ok" or what failed
//   spin SECS      one-block kernels of ~1 ms each (2M clock cycles), a synchronize every 8,
//                  for SECS seconds: prints "spin: ok" or the error, then the kernels per
//                  second on a line of its own (not compared; what sharing the GPU costs)
// Natively each program has a GPU context of its own, so `steady` beside `fault` stays ok;
// under pilot the two share pilotd's context and `steady` gets the fault's error (the
// program's output says which).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N 4096

__global__ void poke(int *p, long long offset) { p[offset] = 1; }

__global__ void spin_kernel(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__global__ void add_one(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fault(double quiet)
{
    int *p;
    cudaError_t err = cudaMalloc(&p, 4096);
    if (err) {
        printf("malloc: %s\n", cudaGetErrorName(err));
        return 1;
    }
    poke<<<1, 1>>>(p, 1LL << 40); // 4 TiB past the allocation
    printf("launch: %s\n", cudaGetErrorName(cudaGetLastError()));
    fflush(stdout); /* tests/gpu/fault_check.py times the fault from this line */
    if (quiet > 0) {
        struct timespec ts = {(time_t)quiet, (long)((quiet - (time_t)quiet) * 1e9)};
        nanosleep(&ts, NULL);
    }
    printf("synchronize: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    int *q;
    printf("malloc after: %s\n", cudaGetErrorName(cudaMalloc(&q, 4096)));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    return 0;
}

// One round: n ints set to `base`, add one on the GPU, read back and check. cudaSuccess or the
// first error (a wrong value is reported as cudaErrorUnknown).
static cudaError_t round_trip(int *dev, int *host, int base)
{
    for (int i = 0; i < N; i++)
        host[i] = base + i;
    cudaError_t err = cudaMemcpy(dev, host, N * sizeof(int), cudaMemcpyHostToDevice);
    if (err)
        return err;
    add_one<<<N / 256, 256>>>(dev, N);
    if ((err = cudaGetLastError()))
        return err;
    if ((err = cudaMemcpy(host, dev, N * sizeof(int), cudaMemcpyDeviceToHost)))
        return err;
    for (int i = 0; i < N; i++)
        if (host[i] != base + i + 1)
            return cudaErrorUnknown;
    return cudaSuccess;
}

static int steady(double seconds)
{
    static int host[N];
    int *dev;
    cudaError_t err = cudaMalloc(&dev, N * sizeof(int));
    long iterations = 0;
    double end = now() + seconds;
    while (!err && now() < end) {
        err = round_trip(dev, host, (int)iterations);
        iterations += !err;
    }
    printf("steady: %s\n", err ? cudaGetErrorName(err) : "ok");
    printf("%ld iterations\n", iterations);
    return 0;
}

static int spin(double seconds)
{
    long kernels = 0;
    cudaError_t err = cudaSuccess;
    double t0 = now(), end = t0 + seconds;
    while (!err && now() < end) {
        for (int i = 0; i < 8; i++)
            spin_kernel<<<1, 32>>>(2000000LL);
        err = cudaDeviceSynchronize();
        kernels += err ? 0 : 8;
    }
    printf("spin: %s\n", err ? cudaGetErrorName(err) : "ok");
    printf("%.1f kernels/s\n", kernels / (now() - t0));
    return 0;
}

static int work(void)
{
    static int host[N];
    int *dev;
    cudaError_t err = cudaMalloc(&dev, N * sizeof(int));
    if (!err)
        err = round_trip(dev, host, 7);
    if (!err)
        err = cudaFree(dev);
    printf("work: %s\n", err ? cudaGetErrorName(err) : "ok");
    return err ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "work";
    if (!strcmp(mode, "fault"))
        return fault(0);
    if (!strcmp(mode, "quiet"))
        return fault(argc > 2 ? atof(argv[2]) : 2.0);
    if (!strcmp(mode, "steady"))
        return steady(argc > 2 ? atof(argv[2]) : 5.0);
    if (!strcmp(mode, "work"))
        return work();
    if (!strcmp(mode, "spin"))
        return spin(argc > 2 ? atof(argv[2]) : 5.0);
    fprintf(stderr, "usage: %s fault | quiet SECONDS | steady SECONDS | work\n", argv[0]);
    return 2;
}
