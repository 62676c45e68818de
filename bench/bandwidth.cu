// bandwidth: synchronous cudaMemcpy between pageable (malloc'd, touched) host memory and the
// device. Prints `metric value` lines (GB/s = 1e9 bytes per second):
//   h2d_pageable_gbps  median over RUNS host-to-device copies of SIZE MiB
//   d2h_pageable_gbps  median over RUNS device-to-host copies of SIZE MiB
// Usage: bandwidth [SIZE_MIB (256)] [RUNS (10)]. Checks that the data made the round trip;
// exits non-zero on any error.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), \
                    __FILE__, __LINE__, #call);                                  \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const int mib = argc > 1 ? atoi(argv[1]) : 256, runs = argc > 2 ? atoi(argv[2]) : 10;
    if (mib < 1 || runs < 1) {
        fprintf(stderr, "usage: %s [SIZE_MIB>0] [RUNS>0]\n", argv[0]);
        return 2;
    }
    const size_t size = (size_t)mib << 20;
    unsigned char *src = (unsigned char *)malloc(size), *dst = (unsigned char *)malloc(size);
    double *gbps = (double *)malloc((size_t)runs * sizeof(double));
    if (!src || !dst || !gbps) {
        fprintf(stderr, "host allocation of 2 x %d MiB failed\n", mib);
        return 1;
    }
    for (size_t i = 0; i < size; i++)  // touch every page, with a pattern to check
        src[i] = (unsigned char)(i * 131u + (i >> 20));
    memset(dst, 0, size);
    void *dev;
    CHECK(cudaMalloc(&dev, size));

    // Warm-up, and the check that the data makes the round trip.
    CHECK(cudaMemcpy(dev, src, size, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dst, dev, size, cudaMemcpyDeviceToHost));
    if (memcmp(src, dst, size) != 0) {
        fprintf(stderr, "bandwidth: data differs after the round trip\n");
        return 1;
    }

    for (int i = 0; i < runs; i++) {
        const double t0 = now_s();
        CHECK(cudaMemcpy(dev, src, size, cudaMemcpyHostToDevice));
        gbps[i] = (double)size / (now_s() - t0) * 1e-9;
    }
    printf("h2d_pageable_gbps %.3f\n", median(gbps, runs));
    for (int i = 0; i < runs; i++) {
        const double t0 = now_s();
        CHECK(cudaMemcpy(dst, dev, size, cudaMemcpyDeviceToHost));
        gbps[i] = (double)size / (now_s() - t0) * 1e-9;
    }
    printf("d2h_pageable_gbps %.3f\n", median(gbps, runs));

    CHECK(cudaFree(dev));
    free(src);
    free(dst);
    free(gbps);
    return 0;
}
