// roundtrip: small synchronous copies. Prints `metric value` lines:
//   d2h_4b_us      median of N cudaMemcpy of 4 bytes device-to-host (pageable destination)
//   d2h_4b_p99_us  99th percentile of the same
//   h2d_4b_us      median of N cudaMemcpy of 4 bytes host-to-device
// Usage: roundtrip [N (10000)]. Checks the values copied; exits non-zero on any error.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"

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

// Sorts v; the q-quantile (nearest rank).
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 10000;
    if (n < 1) {
        fprintf(stderr, "usage: %s [COPIES>0]\n", argv[0]);
        return 2;
    }
    double *t = (double *)malloc((size_t)n * sizeof(double));
    if (!t)
        return 1;
    unsigned *dev;
    CHECK(cudaMalloc(&dev, sizeof(unsigned)));
    unsigned host = 0;

    for (int i = 0; i < 100; i++) {  // warm-up
        CHECK(cudaMemcpy(dev, &i, sizeof(unsigned), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(&host, dev, sizeof(unsigned), cudaMemcpyDeviceToHost));
    }
    const unsigned magic = 0xC0FFEE42u;
    CHECK(cudaMemcpy(dev, &magic, sizeof magic, cudaMemcpyHostToDevice));

    int wrong = 0;
    for (int i = 0; i < n; i++) {
        host = 0;
        const double t0 = now_us();
        CHECK(cudaMemcpy(&host, dev, sizeof host, cudaMemcpyDeviceToHost));
        t[i] = now_us() - t0;
        wrong += host != magic;
    }
    printf("d2h_4b_us %.4f\n", quantile(t, n, 0.5));
    printf("d2h_4b_p99_us %.4f\n", quantile(t, n, 0.99));

    for (int i = 0; i < n; i++) {
        const unsigned v = (unsigned)i;
        const double t0 = now_us();
        CHECK(cudaMemcpy(dev, &v, sizeof v, cudaMemcpyHostToDevice));
        t[i] = now_us() - t0;
    }
    printf("h2d_4b_us %.4f\n", quantile(t, n, 0.5));
    CHECK(cudaMemcpy(&host, dev, sizeof host, cudaMemcpyDeviceToHost));
    wrong += host != (unsigned)(n - 1);

    CHECK(cudaFree(dev));
    free(t);
    if (wrong) {
        fprintf(stderr, "roundtrip: %d copies returned the wrong value\n", wrong);
        return 1;
    }
    return 0;
}
