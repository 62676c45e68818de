// ptds: per-thread default streams. Built twice: as is, it names cudaStreamPerThread
// explicitly; with `nvcc -default-stream per-thread` it uses stream 0, and nvcc's headers turn
// its calls into the _ptsz/_ptds entry points (cudaMemcpy_ptds, cudaMemcpyAsync_ptsz,
// __cudaLaunchKernel_ptsz...). Both builds print the same lines:
// - threads work on their own default streams (copies, memsets, 2D copies, symbols, kernels,
//   events, host callbacks) and get their own results;
// - one thread's default stream does not wait for another's (a callback holding one thread's
//   stream does not keep another thread's stream from finishing);
// - the legacy stream waits for per-thread streams, and per-thread streams wait for the legacy
//   stream (both are blocking streams).
#include <cuda_runtime.h>

#include "host_gate.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#define DEF ((cudaStream_t)0) // the per-thread stream in this build
#else
#define DEF cudaStreamPerThread
#endif

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__,       \
                   __LINE__, #call);                                                       \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

__device__ int per_thread_value[4];

__global__ void mix(int *p, int n, int slot, int mul)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = p[i] * mul + per_thread_value[slot] + i;
}


static int g_callbacks;
static void CUDART_CB count(void *arg)
{
    (void)arg;
    __atomic_add_fetch(&g_callbacks, 1, __ATOMIC_RELAXED);
}

// One thread's work, all of it on its default stream. Returns 0 when every check held.
static int worker(int t, long *checksum)
{
    const int n = t % 2 ? 50000 : 500; // odd threads' copies take the staged path
    const int slot_value = 10 * (t + 1);
    std::vector<int> host(n), back(n);
    for (int i = 0; i < n; i++)
        host[i] = i % 97 + t;
    int *dev;
    CHECK(cudaMalloc(&dev, n * sizeof(int)));
    CHECK(cudaMemset(dev, 0xFF, n * sizeof(int))); // _ptds
    CHECK(cudaMemcpyToSymbol(per_thread_value, &slot_value, sizeof(int), t * sizeof(int))); // _ptds
    CHECK(cudaMemcpy(dev, host.data(), n * sizeof(int), cudaMemcpyHostToDevice)); // _ptds
    mix<<<(n + 255) / 256, 256, 0, DEF>>>(dev, n, t, 3); // __cudaLaunchKernel_ptsz
    CHECK(cudaGetLastError());
    int mul = 2, slot = t;
    int n_arg = n;
    void *args[] = {&dev, &n_arg, &slot, &mul};
    CHECK(cudaLaunchKernel((const void *)mix, dim3((n + 255) / 256), dim3(256), args, 0, DEF));
    cudaEvent_t done;
    CHECK(cudaEventCreate(&done));
    CHECK(cudaEventRecord(done, DEF));      // _ptsz
    CHECK(cudaStreamWaitEvent(DEF, done, 0)); // _ptsz
    CHECK(cudaLaunchHostFunc(DEF, count, NULL)); // _ptsz
    CHECK(cudaMemcpyAsync(back.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost, DEF)); // _ptsz
    CHECK(cudaStreamSynchronize(DEF)); // _ptsz
    CHECK(cudaEventSynchronize(done));
    CHECK(cudaStreamQuery(DEF)); // _ptsz
    for (int i = 0; i < n; i++) {
        int want = (host[i] * 3 + slot_value + i) * 2 + slot_value + i;
        if (back[i] != want) {
            printf("thread %d: element %d is %d, want %d\n", t, i, back[i], want);
            return 1;
        }
    }
    // 2D: rows of 16 ints out of a pitched allocation, a memset of a column band, back.
    int *pitched;
    size_t pitch;
    const int rows = 8, width = 16 * sizeof(int);
    CHECK(cudaMallocPitch((void **)&pitched, &pitch, width, rows));
    CHECK(cudaMemcpy2D(pitched, pitch, back.data(), width, width, rows, cudaMemcpyHostToDevice)); // _ptds
    CHECK(cudaMemset2D(pitched, pitch, 0, 4 * sizeof(int), rows)); // _ptds
    CHECK(cudaMemset2DAsync((char *)pitched + 12 * sizeof(int), pitch, 0, 4 * sizeof(int), rows, DEF));
    std::vector<int> grid(16 * rows);
    CHECK(cudaMemcpy2DAsync(grid.data(), width, pitched, pitch, width, rows, cudaMemcpyDeviceToHost, DEF));
    CHECK(cudaStreamSynchronize(DEF));
    long sum = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 16; c++) {
            int want = (c < 4 || c >= 12) ? 0 : back[r * 16 + c];
            if (grid[r * 16 + c] != want) {
                printf("thread %d: 2D element (%d, %d) is %d, want %d\n", t, r, c, grid[r * 16 + c], want);
                return 1;
            }
            sum += grid[r * 16 + c];
        }
    int readback = 0;
    CHECK(cudaMemcpyFromSymbol(&readback, per_thread_value, sizeof(int), t * sizeof(int))); // _ptds
    CHECK(cudaMemsetAsync(dev, 0, n * sizeof(int), DEF)); // _ptsz
    CHECK(cudaMemcpyFromSymbolAsync(&readback, per_thread_value, sizeof(int), t * sizeof(int),
                                    cudaMemcpyDeviceToHost, DEF)); // _ptsz
    CHECK(cudaStreamSynchronize(DEF));
    if (readback != slot_value) {
        printf("thread %d: symbol reads %d\n", t, readback);
        return 1;
    }
    for (int i = 0; i < n; i++)
        sum += back[i];
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(pitched));
    CHECK(cudaFree(dev));
    *checksum = sum;
    return 0;
}

int main()
{
    int failed = 0;
    const int nthreads = 4;
    std::vector<std::thread> threads;
    std::vector<int> rc(nthreads);
    std::vector<long> sums(nthreads);
    for (int t = 0; t < nthreads; t++)
        threads.emplace_back([t, &rc, &sums] { rc[t] = worker(t, &sums[t]); });
    for (int t = 0; t < nthreads; t++) {
        threads[t].join();
        failed |= rc[t];
        printf("thread %d: %s checksum %ld\n", t, rc[t] ? "FAILED" : "ok", sums[t]);
    }
    printf("callbacks on default streams: %d\n", g_callbacks);
    failed |= g_callbacks != nthreads;

    unsigned flags = 99;
    int priority = 99, device = 99;
    if (cudaStreamGetFlags(DEF, &flags) != cudaSuccess || cudaStreamGetPriority(DEF, &priority) != cudaSuccess ||
        cudaStreamGetDevice(DEF, &device) != cudaSuccess)
        failed = 1;
    printf("default stream: flags %u priority %d device %d\n", flags, priority, device);

    // One thread's default stream is held by a callback; another thread's finishes meanwhile.
    int *a, *b;
    CHECK(cudaMalloc(&a, 256 * sizeof(int)));
    CHECK(cudaMalloc(&b, 256 * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    Gate gate;
    cudaError_t other_sync = cudaErrorUnknown, held_query = cudaErrorUnknown;
    std::thread holder([&] {
        if (cudaLaunchHostFunc(DEF, hold, &gate) != cudaSuccess)
            failed = 1;
        if (cudaMemsetAsync(a, 1, 256 * sizeof(int), DEF) != cudaSuccess)
            failed = 1;
        if (cudaStreamSynchronize(DEF) != cudaSuccess) // returns once released
            failed = 1;
    });
    wait_started(&gate);
    std::thread other([&] {
        int mul = 1, slot = 0, n = 256;
        void *args[] = {&b, &n, &slot, &mul};
        if (cudaMemsetAsync(b, 0, 256 * sizeof(int), DEF) != cudaSuccess ||
            cudaLaunchKernel((const void *)mix, dim3(1), dim3(256), args, 0, DEF) != cudaSuccess)
            failed = 1;
        other_sync = cudaStreamSynchronize(DEF);
    });
    other.join();
    printf("another thread's default stream while one is held: %s\n", cudaGetErrorName(other_sync));
    failed |= other_sync != cudaSuccess;

    // The legacy stream waits for the held per-thread stream.
    cudaEvent_t on_legacy;
    CHECK(cudaEventCreateWithFlags(&on_legacy, cudaEventDisableTiming));
    CHECK(cudaEventRecord(on_legacy, cudaStreamLegacy));
    held_query = cudaEventQuery(on_legacy);
    printf("legacy stream behind a held per-thread stream: %s\n", cudaGetErrorName(held_query));
    failed |= held_query != cudaErrorNotReady;
    release(&gate);
    holder.join();
    CHECK(cudaEventSynchronize(on_legacy));
    printf("after the release: %s\n", cudaGetErrorName(cudaEventQuery(on_legacy)));

    // A per-thread stream waits for the legacy stream.
    Gate legacy_gate;
    CHECK(cudaLaunchHostFunc(cudaStreamLegacy, hold, &legacy_gate));
    wait_started(&legacy_gate);
    cudaError_t behind = cudaErrorUnknown;
    std::thread waiter([&] {
        cudaEvent_t e;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
            cudaMemsetAsync(b, 2, 256 * sizeof(int), DEF) != cudaSuccess ||
            cudaEventRecord(e, DEF) != cudaSuccess) {
            failed = 1;
            return;
        }
        behind = cudaEventQuery(e);
        release(&legacy_gate);
        if (cudaEventSynchronize(e) != cudaSuccess || cudaEventDestroy(e) != cudaSuccess)
            failed = 1;
    });
    waiter.join();
    printf("per-thread stream behind a held legacy stream: %s\n", cudaGetErrorName(behind));
    failed |= behind != cudaErrorNotReady;

    CHECK(cudaDeviceSynchronize());
    CHECK(cudaEventDestroy(on_legacy));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
