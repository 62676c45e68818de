// alloc: device allocation cost. Prints `metric value` lines:
//   malloc_free_1mib_us  median over N pairs of cudaMalloc(1 MiB) + cudaFree, timed per pair
//   malloc_1mib_us       median of the cudaMalloc part alone
// Usage: alloc [N (2000)]. Exits non-zero on any error.
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

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 2000;
    if (n < 1) {
        fprintf(stderr, "usage: %s [PAIRS>0]\n", argv[0]);
        return 2;
    }
    const size_t size = 1u << 20;
    double *pair = (double *)malloc((size_t)n * sizeof(double));
    double *alloc = (double *)malloc((size_t)n * sizeof(double));
    if (!pair || !alloc)
        return 1;
    void *p;
    for (int i = 0; i < 100; i++) {  // warm-up
        CHECK(cudaMalloc(&p, size));
        CHECK(cudaFree(p));
    }
    for (int i = 0; i < n; i++) {
        const double t0 = now_us();
        CHECK(cudaMalloc(&p, size));
        const double t1 = now_us();
        CHECK(cudaFree(p));
        const double t2 = now_us();
        pair[i] = t2 - t0;
        alloc[i] = t1 - t0;
    }
    printf("malloc_free_1mib_us %.4f\n", median(pair, n));
    printf("malloc_1mib_us %.4f\n", median(alloc, n));
    free(pair);
    free(alloc);
    return 0;
}
