// What bench/salus_job.cu and bench/salus_torch_like.cu share: their kernel (it spins spin_ns,
// writes the first scratch_words words of scratch and advances state[0]; the sim emulates it,
// bench/salus_sim_kernels.py) and a monotonic clock.
#pragma once
#include <cuda_runtime.h>

#include <time.h>

__global__ void iteration(unsigned long long *state, unsigned int *scratch, size_t scratch_words,
                          unsigned long long spin_ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < spin_ns);
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < scratch_words)
        scratch[i] = (unsigned int)i;
    if (i == 0)
        state[0] += 1;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
