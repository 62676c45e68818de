// Several host threads using CUDA at once, each with its own stream: small and staged (> 64 KiB)
// copies, kernels and synchronizations interleave on the one connection a process has.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__,       \
                   __LINE__, #call);                                                       \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

__global__ void scale_add(int *v, int n, int mul, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = v[i] * mul + add;
}

static int worker(int id, long *checksum)
{
    const int n = (id % 2) ? 100000 : 1000; // odd threads use staged copies (400 KB)
    std::vector<int> host(n), back(n);
    cudaStream_t s;
    int *dev;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&dev, n * sizeof(int)));
    long sum = 0;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < n; i++)
            host[i] = i + id * 7 + round;
        CHECK(cudaMemcpyAsync(dev, host.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
        scale_add<<<(n + 255) / 256, 256, 0, s>>>(dev, n, id + 2, round);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(back.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) {
            if (back[i] != host[i] * (id + 2) + round) {
                printf("thread %d round %d: element %d is %d\n", id, round, i, back[i]);
                return 1;
            }
            sum += back[i];
        }
    }
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
    *checksum = sum;
    return 0;
}

int main()
{
    const int nthreads = 6;
    std::vector<std::thread> threads;
    std::vector<int> rc(nthreads);
    std::vector<long> sums(nthreads);
    for (int t = 0; t < nthreads; t++)
        threads.emplace_back([t, &rc, &sums] { rc[t] = worker(t, &sums[t]); });
    int failed = 0;
    for (int t = 0; t < nthreads; t++) {
        threads[t].join();
        failed |= rc[t];
        printf("thread %d: %s checksum %ld\n", t, rc[t] ? "FAILED" : "ok", sums[t]);
    }
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
