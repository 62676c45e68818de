// multidev: several GPUs in one program. With two or more devices: two threads each on its own
// device (cudaSetDevice is per thread), memory, streams, kernels and __device__ variables per
// device, peer queries and peer access, cudaMemcpyPeer(Async) and cross-device cudaMemcpy, a
// stream of one device waiting for an event of the other, and the errors CUDA gives for mixing
// devices. With one device it checks what can be checked and says the rest was skipped.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__,       \
                   __LINE__, #call);                                                       \
            printf("FAIL\n");                                                              \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__device__ int device_value;

__global__ void stamp(int *p, int n, int base)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = base + i + device_value;
}

__global__ void bump(int by)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        device_value += by;
}

__global__ void gather(int *dst, const int *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = src[i] * 2;
}

static const int N = 4096;

static const char *yes(bool b)
{
    return b ? "yes" : "no";
}

static bool matches(const int *dev, int base)
{
    std::vector<int> host(N);
    CHECK(cudaMemcpy(host.data(), dev, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        if (host[i] != base + i)
            return false;
    return true;
}

// Thread on device `d`: its current device, memory, a stream and a kernel of its own.
static void on_device(int d, int **out, bool *ok)
{
    *ok = false;
    if (cudaSetDevice(d) != cudaSuccess)
        return;
    int current = -1, stream_device = -1;
    cudaStream_t s;
    int *buf;
    CHECK(cudaGetDevice(&current));
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamGetDevice(s, &stream_device));
    CHECK(cudaMalloc(&buf, N * sizeof(int)));
    int value = 0;
    CHECK(cudaMemcpyToSymbol(device_value, &value, sizeof value));
    stamp<<<N / 256, 256, 0, s>>>(buf, N, 1000 * (d + 1));
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total));
    *ok = current == d && stream_device == d && matches(buf, 1000 * (d + 1)) && free_bytes > 0;
    CHECK(cudaStreamDestroy(s));
    *out = buf;
}

static int one_device(void)
{
    int count = 0, current = -1, stream_device = -1;
    CHECK(cudaGetDeviceCount(&count));
    printf("set device %d: %s\n", count, cudaGetErrorName(cudaSetDevice(count)));
    cudaGetLastError();
    CHECK(cudaGetDevice(&current));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamGetDevice(s, &stream_device));
    printf("current device %d, stream device %d\n", current, stream_device);
    int can = -1;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 0));
    printf("can access peer 0 -> 0: %d\n", can);
    printf("enable peer access to itself: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(0, 0)));
    cudaGetLastError();
    int *a, *b;
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    stamp<<<N / 256, 256>>>(a, N, 5);
    CHECK(cudaMemcpyPeer(b, 0, a, 0, N * sizeof(int)));
    printf("peer copy within device 0: %s\n", yes(matches(b, 5)));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    printf("one device: multi-device checks skipped\nPASS\n");
    return 0;
}

int main()
{
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("two or more devices: %s\n", yes(count >= 2));
    if (count < 2)
        return one_device();
    int failed = 0;

    // Two threads, one per device.
    int *buf[2] = {NULL, NULL};
    bool ok[2] = {false, false};
    std::thread t0(on_device, 0, &buf[0], &ok[0]), t1(on_device, 1, &buf[1], &ok[1]);
    t0.join();
    t1.join();
    for (int d = 0; d < 2; d++)
        printf("thread on device %d: %s\n", d, ok[d] ? "ok" : "FAILED");
    failed |= !ok[0] || !ok[1];
    int current = -1;
    CHECK(cudaGetDevice(&current));
    printf("main thread's device is still %d\n", current);

    // Device facts.
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 1));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 1));
    printf("device 1 properties: %s\n", yes(prop.major > 0 && prop.multiProcessorCount == sms));
    printf("set device %d: %s\n", count, cudaGetErrorName(cudaSetDevice(count)));
    printf("properties of device %d: %s\n", count, cudaGetErrorName(cudaGetDeviceProperties(&prop, count)));
    cudaGetLastError();
    int can01 = -1, can10 = -1, can00 = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceCanAccessPeer(&can00, 0, 0));
    printf("can access peer: 0 -> 1 %d, 1 -> 0 %d, 0 -> 0 %d\n", can01, can10, can00);

    // Copies between devices (the current device is 0).
    int *copy0, *copy1;
    CHECK(cudaMalloc(&copy0, N * sizeof(int)));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&copy1, N * sizeof(int)));
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpyPeer(copy0, 0, buf[1], 1, N * sizeof(int)));
    bool peer = matches(copy0, 2000);
    CHECK(cudaMemcpy(copy1, buf[0], N * sizeof(int), cudaMemcpyDefault));
    bool deflt = matches(copy1, 1000);
    CHECK(cudaMemcpy(copy1, copy0, N * sizeof(int), cudaMemcpyDeviceToDevice));
    bool d2d = matches(copy1, 2000);
    printf("copies between devices: peer %s, default %s, device-to-device %s\n", yes(peer), yes(deflt), yes(d2d));
    failed |= !peer || !deflt || !d2d;
    printf("peer copy to device %d: %s\n", count,
           cudaGetErrorName(cudaMemcpyPeer(copy0, count, buf[1], 1, N * sizeof(int))));
    cudaGetLastError();

    // A stream of device 1 waits for an event of device 0, then copies what device 0 wrote.
    cudaStream_t s0, s1;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamCreate(&s0));
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaMemcpyToSymbol(device_value, &count, sizeof count)); // device 0's copy
    stamp<<<N / 256, 256, 0, s0>>>(copy0, N, 300);
    CHECK(cudaEventRecord(e0, s0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaStreamWaitEvent(s1, e0, 0));
    CHECK(cudaMemcpyPeerAsync(copy1, 1, copy0, 0, N * sizeof(int), s1));
    CHECK(cudaStreamSynchronize(s1));
    bool waited = matches(copy1, 300 + count);
    printf("stream of device 1 after an event of device 0: %s\n", yes(waited));
    failed |= !waited;

    // A launch on a stream of another device runs on the stream's device (current device 1):
    // device 0's copy of device_value is added, and device 0's memory is written.
    stamp<<<N / 256, 256, 0, s0>>>(copy0, N, 500);
    cudaError_t launched = cudaGetLastError();
    CHECK(cudaStreamSynchronize(s0));
    bool there = matches(copy0, 500 + count);
    printf("launch on another device's stream: %s, ran on its device: %s\n",
           cudaGetErrorName(launched), yes(there));
    failed |= launched != cudaSuccess || !there;

    // Mixing devices where CUDA does not allow it.
    printf("event of device 0 recorded on a stream of device 1 fails: %s\n",
           yes(cudaEventRecord(e0, s1) != cudaSuccess));
    CHECK(cudaEventRecord(e1, s1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    printf("elapsed time between devices' events fails: %s\n",
           yes(cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess));
    cudaGetLastError();
    printf("queries of another device's stream and event: %s %s\n",
           cudaGetErrorName(cudaStreamQuery(s0)), cudaGetErrorName(cudaEventQuery(e0)));

    // __device__ variables are per device.
    int v0 = 10, v1 = 20, r0 = -1, r1 = -1;
    CHECK(cudaMemcpyToSymbol(device_value, &v1, sizeof v1)); // device 1
    bump<<<1, 1>>>(1);
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpyToSymbol(device_value, &v0, sizeof v0));
    bump<<<1, 1>>>(2);
    CHECK(cudaMemcpyFromSymbol(&r0, device_value, sizeof r0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpyFromSymbol(&r1, device_value, sizeof r1));
    printf("__device__ variable per device: %d %d\n", r0, r1);
    failed |= r0 != 12 || r1 != 21;

    // Peer access: kernels of device 0 read device 1's memory.
    CHECK(cudaSetDevice(0));
    if (can01) {
        printf("enable peer access 0 -> 1: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(1, 0)));
        printf("again: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(1, 0)));
        cudaGetLastError();
        gather<<<N / 256, 256>>>(copy0, buf[1], N);
        CHECK(cudaDeviceSynchronize());
        std::vector<int> host(N);
        CHECK(cudaMemcpy(host.data(), copy0, N * sizeof(int), cudaMemcpyDeviceToHost));
        bool read = true;
        for (int i = 0; i < N; i++)
            read &= host[i] == 2 * (2000 + i);
        printf("kernel of device 0 read device 1's memory: %s\n", yes(read));
        failed |= !read;
        printf("disable: %s\n", cudaGetErrorName(cudaDeviceDisablePeerAccess(1)));
        printf("disable again: %s\n", cudaGetErrorName(cudaDeviceDisablePeerAccess(1)));
        cudaGetLastError();
    } else {
        printf("no peer access between devices 0 and 1\n");
    }
    printf("enable peer access to itself: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(0, 0)));
    cudaGetLastError();

    CHECK(cudaStreamDestroy(s0));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaFree(copy0));
    CHECK(cudaFree(buf[0]));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaFree(copy1));
    CHECK(cudaFree(buf[1]));
    CHECK(cudaDeviceSynchronize());
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
