// callbacks: host callbacks (cudaLaunchHostFunc, cudaStreamAddCallback) run in stream order.
// A callback starts after the work queued before it; the work queued after it waits until it
// returned (a callback that blocks holds its stream, and only its stream); an asynchronous copy
// from pageable memory reads it when queued, even behind a held callback; callbacks of one stream run in
// order; cudaDeviceSynchronize waits for callbacks. Everything printed is deterministic.
//
// `callbacks hang` (pilot's tests only): a callback that never returns, then a synchronize on
// its stream; the test kills the process there and checks pilotd released it.
#include <cuda_runtime.h>

#include "host_gate.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
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

__global__ void fill(int *p, int n, int base)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = base + i;
}

__global__ void add(int *p, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += v;
}

static int blocks(int n)
{
    return (n + 255) / 256;
}


// ---- callbacks that look at host memory ----
struct Seen {
    const int *host;
    int n, base;
    int ok;
};

static void CUDART_CB check_host(void *arg)
{
    Seen *s = (Seen *)arg;
    s->ok = 1;
    for (int i = 0; i < s->n; i++)
        if (s->host[i] != s->base + i)
            s->ok = 0;
}

struct Writer {
    int *host;
    int n;
};

static void CUDART_CB write_host(void *arg)
{
    Writer *w = (Writer *)arg;
    for (int i = 0; i < w->n; i++)
        w->host[i] = 7 * i + 3;
}

struct Log {
    std::mutex m;
    std::vector<int> ids;
};
struct LogEntry {
    Log *log;
    int id;
};

static void CUDART_CB append(void *arg)
{
    LogEntry *e = (LogEntry *)arg;
    std::lock_guard<std::mutex> lock(e->log->m);
    e->log->ids.push_back(e->id);
}

static int g_counter;
static void CUDART_CB count(void *arg)
{
    (void)arg;
    __atomic_add_fetch(&g_counter, 1, __ATOMIC_RELAXED);
}

struct StreamSeen {
    cudaStream_t stream;
    cudaError_t status;
    void *data;
};
static StreamSeen g_stream_seen;
static void CUDART_CB stream_callback(cudaStream_t stream, cudaError_t status, void *data)
{
    g_stream_seen.stream = stream;
    g_stream_seen.status = status;
    g_stream_seen.data = data;
}

static int g_slept;
static void CUDART_CB sleeper(void *arg)
{
    (void)arg;
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    __atomic_store_n(&g_slept, 1, __ATOMIC_RELEASE);
}

static const char *yes(bool b)
{
    return b ? "yes" : "no";
}

// An asynchronous copy from pageable memory reads it when it is queued (CUDA copies pageable
// memory to a staging buffer at once), even while a callback queued before it is held: the
// device gets what the host buffer held then, and the callback's later writes stay on the host.
static bool copy_reads_when_queued(cudaStream_t s, int n)
{
    std::vector<int> host(n, 1), back(n, -1);
    int *dev;
    CHECK(cudaMalloc(&dev, n * sizeof(int)));
    Gate gate;
    Writer w = {host.data(), n};
    CHECK(cudaLaunchHostFunc(s, hold, &gate));
    CHECK(cudaLaunchHostFunc(s, write_host, &w));
    CHECK(cudaMemcpyAsync(dev, host.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    release(&gate);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(back.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dev));
    for (int i = 0; i < n; i++)
        if (back[i] != 1 || host[i] != 7 * i + 3)
            return false;
    return true;
}

static int hang(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    Gate g; // never released
    CHECK(cudaLaunchHostFunc(s, hold, &g));
    wait_started(&g);
    printf("hanging\n");
    fflush(stdout);
    CHECK(cudaStreamSynchronize(s)); // never returns: the test kills the process here
    printf("FAIL\n");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "hang") == 0)
        return hang();
    int failed = 0;
    const int n = 1000;
    cudaStream_t s, other;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    int *x;
    CHECK(cudaMalloc(&x, n * sizeof(int)));
    std::vector<int> hx(n);

    // 1. A callback runs after the work queued before it.
    fill<<<blocks(n), 256, 0, s>>>(x, n, 100);
    CHECK(cudaMemcpyAsync(hx.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    Seen first = {hx.data(), n, 100, 0};
    CHECK(cudaLaunchHostFunc(s, check_host, &first));
    CHECK(cudaStreamSynchronize(s));
    add<<<blocks(n), 256, 0, s>>>(x, n, 1);
    CHECK(cudaMemcpyAsync(hx.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    Seen second = {hx.data(), n, 101, 0};
    CHECK(cudaLaunchHostFunc(s, check_host, &second));
    CHECK(cudaStreamSynchronize(s));
    printf("order: callbacks saw the kernels before them: %s %s\n", yes(first.ok), yes(second.ok));
    failed |= !first.ok || !second.ok;

    // 2. Work after a callback waits for it; other streams do not.
    Gate gate;
    cudaEvent_t after;
    CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    CHECK(cudaLaunchHostFunc(s, hold, &gate));
    fill<<<blocks(n), 256, 0, s>>>(x, n, 5000);
    CHECK(cudaEventRecord(after, s));
    wait_started(&gate);
    cudaError_t ev_held = cudaEventQuery(after), stream_held = cudaStreamQuery(s);
    printf("held: event after the callback %s, its stream %s\n", cudaGetErrorName(ev_held),
           cudaGetErrorName(stream_held));
    int *z;
    std::vector<int> hz(n, 0);
    CHECK(cudaMalloc(&z, n * sizeof(int)));
    CHECK(cudaMemsetAsync(z, 1, n * sizeof(int), other));
    CHECK(cudaMemcpyAsync(hz.data(), z, n * sizeof(int), cudaMemcpyDeviceToHost, other));
    cudaError_t other_sync = cudaStreamSynchronize(other);
    printf("held: another stream meanwhile %s, data %s\n", cudaGetErrorName(other_sync),
           yes(hz[0] == 0x01010101 && hz[n - 1] == 0x01010101));
    failed |= ev_held != cudaErrorNotReady || stream_held != cudaErrorNotReady;
    failed |= other_sync != cudaSuccess || hz[0] != 0x01010101;
    release(&gate);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(hx.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool filled = hx[0] == 5000 && hx[n - 1] == 5000 + n - 1;
    printf("released: event %s, kernel after the callback ran: %s\n",
           cudaGetErrorName(cudaEventQuery(after)), yes(filled));
    failed |= !filled;

    // 3. Asynchronous copies from pageable memory read it when queued, not when the stream
    //    reaches them (small ones travel in one message, large ones in several).
    bool inline_ok = copy_reads_when_queued(s, 1000), staged_ok = copy_reads_when_queued(s, 100000);
    printf("async copies read pageable memory when queued: small %s, large %s\n", yes(inline_ok),
           yes(staged_ok));
    failed |= !inline_ok || !staged_ok;

    // 4. A stream callback receives its stream, the status and its data.
    int token = 0;
    CHECK(cudaStreamAddCallback(s, stream_callback, &token, 0));
    CHECK(cudaStreamSynchronize(s));
    printf("stream callback: stream %s, status %s, data %s\n", yes(g_stream_seen.stream == s),
           cudaGetErrorName(g_stream_seen.status), yes(g_stream_seen.data == &token));
    failed |= g_stream_seen.stream != s || g_stream_seen.status != cudaSuccess;
    cudaError_t bad_flags = cudaStreamAddCallback(s, stream_callback, &token, 1);
    printf("stream callback with flags 1: %s\n", cudaGetErrorName(bad_flags));
    cudaGetLastError();

    // 5. The legacy stream and the per-thread stream take callbacks too.
    fill<<<blocks(n), 256>>>(x, n, 9);
    CHECK(cudaLaunchHostFunc(0, count, NULL));
    CHECK(cudaLaunchHostFunc(cudaStreamPerThread, count, NULL));
    CHECK(cudaLaunchHostFunc(cudaStreamLegacy, count, NULL));
    CHECK(cudaDeviceSynchronize());
    printf("legacy and per-thread stream callbacks: %d\n", __atomic_load_n(&g_counter, __ATOMIC_RELAXED));
    failed |= g_counter != 3;

    // 6. Callbacks of one stream run in the order they were queued.
    const int per_stream = 40;
    Log log_a, log_b;
    std::vector<LogEntry> entries_a(per_stream), entries_b(per_stream);
    for (int i = 0; i < per_stream; i++) {
        entries_a[i] = {&log_a, i};
        entries_b[i] = {&log_b, i};
        CHECK(cudaLaunchHostFunc(s, append, &entries_a[i]));
        add<<<1, 32, 0, other>>>(z, 32, 1);
        CHECK(cudaLaunchHostFunc(other, append, &entries_b[i]));
    }
    CHECK(cudaDeviceSynchronize());
    bool in_order = (int)log_a.ids.size() == per_stream && (int)log_b.ids.size() == per_stream;
    for (int i = 0; in_order && i < per_stream; i++)
        in_order = log_a.ids[i] == i && log_b.ids[i] == i;
    printf("callbacks of each stream in order: %s\n", yes(in_order));
    failed |= !in_order;

    // 7. cudaDeviceSynchronize and cudaStreamSynchronize wait for callbacks.
    CHECK(cudaLaunchHostFunc(s, sleeper, NULL));
    CHECK(cudaDeviceSynchronize());
    printf("device synchronize waited for the callback: %s\n", yes(__atomic_load_n(&g_slept, __ATOMIC_ACQUIRE)));
    failed |= !g_slept;

    CHECK(cudaEventDestroy(after));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(other));
    CHECK(cudaFree(x));
    CHECK(cudaFree(z));
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
