// launch: kernel launch cost. Prints `metric value` lines:
//   launch_us       host time per launch of an empty kernel, N back-to-back launches timed
//                   from the first launch to the end of the cudaDeviceSynchronize after the last
//   launches_per_s  1e6 / launch_us
//   launch_sync_us  median of M single launches each followed by cudaDeviceSynchronize
// Usage: launch [N (100000)] [M (10000)]. Warms up first; exits non-zero on any CUDA error.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"

__global__ void empty_kernel() {}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
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

static int arg(int argc, char **argv, int i, int dflt)
{
    return argc > i ? atoi(argv[i]) : dflt;
}

int main(int argc, char **argv)
{
    const int n = arg(argc, argv, 1, 100000), m = arg(argc, argv, 2, 10000);
    if (n < 1 || m < 1) {
        fprintf(stderr, "usage: %s [LAUNCHES>0] [SYNCED_LAUNCHES>0]\n", argv[0]);
        return 2;
    }
    double *t = (double *)malloc((size_t)m * sizeof(double));
    if (!t)
        return 1;

    // Warm-up: context, module, launch path.
    for (int i = 0; i < 1000; i++)
        empty_kernel<<<1, 1>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    const double start = now_us();
    for (int i = 0; i < n; i++)
        empty_kernel<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    const double elapsed = now_us() - start;
    CHECK(cudaGetLastError());
    printf("launch_us %.4f\n", elapsed / n);
    printf("launches_per_s %.1f\n", n / (elapsed * 1e-6));

    for (int i = 0; i < m; i++) {
        const double t0 = now_us();
        empty_kernel<<<1, 1>>>();
        CHECK(cudaDeviceSynchronize());
        t[i] = now_us() - t0;
    }
    CHECK(cudaGetLastError());
    printf("launch_sync_us %.4f\n", median(t, m));
    free(t);
    return 0;
}
