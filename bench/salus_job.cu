// salus_job: a CUDA C "training" job for the salus policy (bench/salus_trace.py, the tests):
// it allocates its model state once (P), then per iteration allocates scratch (E), launches
// LAUNCHES kernels that together spin for ITER_MS on BLOCKS blocks (touching state and
// scratch; a framework's step is many kernels), and frees
// the scratch (cudaFree synchronizes: the iteration ends there). At the end it reads back a
// counter the kernels advanced and prints `iterations N ok` (or `iterations N wrong M`), then
// `jct_s SECONDS` (from its start to its last free).
//
// Usage: salus_job P_MiB E_MiB ITER_MS ITERATIONS [BLOCKS (8)] [HOST_MS (0)] [LAUNCHES (1)]
//   HOST_MS: the host also sleeps that long per iteration before the free (the sim backend
//   runs kernels at once: this stands in for their time there).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "salus_kernel.cuh"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s P_MiB E_MiB ITER_MS ITERATIONS [BLOCKS] [HOST_MS] [LAUNCHES]\n",
                argv[0]);
        return 2;
    }
    size_t p = strtoull(argv[1], NULL, 10) << 20, e = strtoull(argv[2], NULL, 10) << 20;
    double iter_ms = atof(argv[3]);
    long iterations = atol(argv[4]);
    int blocks = argc > 5 ? atoi(argv[5]) : 8;
    double host_ms = argc > 6 ? atof(argv[6]) : 0.0;
    long launches = argc > 7 ? atol(argv[7]) : 1;
    if (p < sizeof(unsigned long long) || iterations < 1 || blocks < 1 || launches < 1) {
        fprintf(stderr, "P must be at least 1 MiB, ITERATIONS, BLOCKS and LAUNCHES at least 1\n");
        return 2;
    }
    double t0 = seconds();
    unsigned long long *state;
    CHECK(cudaMalloc(&state, p));
    CHECK(cudaMemset(state, 0, p));
    for (long it = 0; it < iterations; it++) {
        unsigned int *scratch = NULL;
        if (e)
            CHECK(cudaMalloc(&scratch, e));
        size_t words = e / sizeof(unsigned int);
        size_t touched = words < (size_t)blocks * 128 ? words : (size_t)blocks * 128;
        for (long k = 0; k < launches; k++) {
            iteration<<<blocks, 128>>>(state, scratch, touched, (unsigned long long)(iter_ms * 1e6 / launches));
            CHECK(cudaGetLastError());
        }
        if (host_ms > 0) {
            struct timespec ts = {(time_t)(host_ms / 1e3), (long)((host_ms - 1e3 * (long)(host_ms / 1e3)) * 1e6)};
            nanosleep(&ts, NULL);
        }
        if (e)
            CHECK(cudaFree(scratch));
        else
            CHECK(cudaDeviceSynchronize());
    }
    unsigned long long count = 0;
    CHECK(cudaMemcpy(&count, state, sizeof count, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(state));
    double jct = seconds() - t0;
    if (count == (unsigned long long)(iterations * launches))
        printf("iterations %ld ok\n", iterations);
    else
        printf("iterations %ld wrong %llu\n", iterations, count);
    printf("jct_s %.3f\n", jct);
    return count == (unsigned long long)(iterations * launches) ? 0 : 1;
}
