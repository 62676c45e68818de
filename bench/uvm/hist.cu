// hist: a 256-bin histogram of a managed array of 32-bit words (--bytes, default 2GiB; the words
// are a hash of their index, set by a kernel), one pass adds the counts of every word's low byte
// into managed bins (default 2500 passes; block-local bins in shared memory). The data is only
// read. Check: the bins sum to passes x words, and each bin is passes x its count after the first
// pass. Prints the uvm line (uvm.h).
#include "uvm.h"

#define BINS 256

__device__ unsigned hash32(size_t i)
{
    unsigned x = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32);
    x ^= x >> 15;
    x *= 2246822519u;
    return x ^ (x >> 13);
}

__global__ void init(unsigned *d, size_t n)
{
    FOR_EACH(i, n) d[i] = hash32(i);
}

__global__ void histogram(const unsigned *d, size_t n, unsigned long long *bins)
{
    __shared__ unsigned local[BINS];
    for (unsigned b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    FOR_EACH(i, n) atomicAdd(&local[d[i] & (BINS - 1)], 1u);
    __syncthreads();
    for (unsigned b = threadIdx.x; b < BINS; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], (unsigned long long)local[b]);
}

int main(int argc, char **argv)
{
    struct uvm_opts o = uvm_parse(argc, argv, "256-bin histogram of a managed word array of "
                                  "SIZE bytes", (size_t)2 << 30, 2500);
    size_t n = o.bytes / 4;
    const unsigned T = 512, B = uvm_blocks(n, T) < 4096 ? uvm_blocks(n, T) : 4096;
    double t_start = now_s();
    unsigned *d;
    unsigned long long *bins, first[BINS] = {0};
    CHECK(cudaMallocManaged(&d, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&bins, BINS * sizeof *bins, cudaMemAttachGlobal));
    memset(bins, 0, BINS * sizeof *bins);
    init<<<uvm_blocks(n, T), T>>>(d, n);
    CHECK(cudaDeviceSynchronize());
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0)) {
        histogram<<<B, T>>>(d, n, bins);
        CHECK(cudaDeviceSynchronize());
        if (passes++ == 0) memcpy(first, bins, sizeof first);
    }
    double kernel_s = now_s() - t0;
    unsigned long long total = 0, wrong = 0;
    for (int b = 0; b < BINS; b++) {
        total += bins[b];
        wrong += bins[b] != first[b] * (unsigned long long)passes;
    }
    int ok = passes > 0 && total == n * (unsigned long long)passes && wrong == 0;
    if (!ok) fprintf(stderr, "hist: total %llu (expected %zu x %ld), %llu bins wrong\n", total, n,
                     passes, wrong);
    CHECK(cudaFree(d));
    CHECK(cudaFree(bins));
    uvm_report("hist", n * 4, passes, t_start, kernel_s, "", ok);
    return ok ? 0 : 1;
}
