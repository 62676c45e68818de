// bandwidth: synchronous cudaMemcpy between the device and pageable (malloc'd, touched) host
// memory, then pinned (cudaMallocHost) host memory. Prints `metric value` lines (GB/s = 1e9
// bytes per second):
//   h2d_pageable_gbps  median over RUNS host-to-device copies of SIZE MiB
//   d2h_pageable_gbps  median over RUNS device-to-host copies of SIZE MiB
//   h2d_pinned_gbps    the same from cudaMallocHost memory
//   d2h_pinned_gbps    the same into cudaMallocHost memory
// Usage: bandwidth [SIZE_MIB (256)] [RUNS (10)]. Checks that the data made the round trip;
// exits non-zero on any error.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

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

/* Warm-up and a checked round trip src -> dev -> dst, then the median GB/s of `runs` copies each
 * way, printed as h2d_<kind>_gbps and d2h_<kind>_gbps. 0 on success. */
static int measure(const char *kind, unsigned char *src, unsigned char *dst, void *dev, size_t size,
                   int runs, double *gbps)
{
    memset(dst, 0, size);
    CHECK(cudaMemcpy(dev, src, size, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dst, dev, size, cudaMemcpyDeviceToHost));
    if (memcmp(src, dst, size) != 0) {
        fprintf(stderr, "bandwidth: %s data differs after the round trip\n", kind);
        return 1;
    }
    for (int way = 0; way < 2; way++) {
        for (int i = 0; i < runs; i++) {
            const double t0 = now_s();
            if (way == 0)
                CHECK(cudaMemcpy(dev, src, size, cudaMemcpyHostToDevice));
            else
                CHECK(cudaMemcpy(dst, dev, size, cudaMemcpyDeviceToHost));
            gbps[i] = (double)size / (now_s() - t0) * 1e-9;
        }
        printf("%s_%s_gbps %.3f\n", way == 0 ? "h2d" : "d2h", kind, median(gbps, runs));
    }
    return 0;
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
    void *dev;
    CHECK(cudaMalloc(&dev, size));
    if (measure("pageable", src, dst, dev, size, runs, gbps) != 0)
        return 1;

    // Pinned: the same copies from and into cudaMallocHost memory.
    unsigned char *psrc, *pdst;
    CHECK(cudaMallocHost((void **)&psrc, size));
    CHECK(cudaMallocHost((void **)&pdst, size));
    memcpy(psrc, src, size);
    if (measure("pinned", psrc, pdst, dev, size, runs, gbps) != 0)
        return 1;

    CHECK(cudaFreeHost(psrc));
    CHECK(cudaFreeHost(pdst));
    CHECK(cudaFree(dev));
    free(src);
    free(dst);
    free(gbps);
    return 0;
}
