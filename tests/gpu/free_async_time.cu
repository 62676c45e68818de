// free_async_time: what cudaFreeAsync and a cudaMallocAsync after it cost the host while the
// stream still runs a ~100 ms kernel (tests/gpu/free_async_check.py runs it natively and under
// pilot). Natively both return in microseconds; a free that waited for its stream takes the
// kernel's time. Prints per round: "round R free_ms F malloc_ms M total_ms T", then "values ok"
// (every kernel wrote its block before the block was freed) or "values WRONG".
#include <cuda_runtime.h>

#include <chrono>
#include <stdio.h>

#define ROUNDS 5
#define BYTES (64 << 20)
#define SPIN_NS 100000000ull

__device__ unsigned long long now_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread spins for `ns` nanoseconds of the GPU's global timer, then writes *out.
__global__ void spin_then_write(unsigned long long ns, int *out, int value)
{
    unsigned long long t0 = now_ns();
    while (now_ns() - t0 < ns)
        ;
    *out = value;
}

static double ms_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            printf("%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_));     \
            return 2;                                                                         \
        }                                                                                     \
    } while (0)

int main(void)
{
    cudaStream_t s;
    int *a = NULL, *b = NULL, *seen = NULL, ok = 1;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMallocHost((void **)&seen, sizeof(int)));
    CHECK(cudaMallocAsync((void **)&a, BYTES, s)); /* warm-up: the pool and the module */
    spin_then_write<<<1, 1, 0, s>>>(1000, a, 0);
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaStreamSynchronize(s));
    for (int r = 0; r < ROUNDS; r++) {
        CHECK(cudaMallocAsync((void **)&a, BYTES, s));
        spin_then_write<<<1, 1, 0, s>>>(SPIN_NS, a, r + 1);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(seen, a, sizeof(int), cudaMemcpyDeviceToHost, s));
        auto t0 = std::chrono::steady_clock::now();
        CHECK(cudaFreeAsync(a, s));
        double free_ms = ms_since(t0);
        auto t1 = std::chrono::steady_clock::now();
        CHECK(cudaMallocAsync((void **)&b, BYTES, s));
        double malloc_ms = ms_since(t1);
        CHECK(cudaFreeAsync(b, s));
        CHECK(cudaStreamSynchronize(s));
        ok &= *seen == r + 1;
        printf("round %d free_ms %.3f malloc_ms %.3f total_ms %.1f\n", r, free_ms, malloc_ms, ms_since(t0));
    }
    printf("values %s\n", ok ? "ok" : "WRONG");
    cudaFreeHost(seen);
    cudaStreamDestroy(s);
    return ok ? 0 : 1;
}
