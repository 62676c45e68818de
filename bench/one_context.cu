// What one CUDA context costs many submitters (issue 25, graph inference at N=16): T host
// threads of one process, each on its own non-blocking stream, each repeating a "step" (a
// captured graph of KERNELS tiny kernels, one more kernel, a stream synchronization), as
// pilotd's vGPU threads issue N tenants' graph calls into its one context. Run with T threads
// in one process and with T processes of one thread (natively time-sliced, or under MPS) to see
// whether the driver serializes submissions within a context.
//
// PLACE says where each thread submits: `primary` (the process's one context, the default),
// `green` (a green context of its own over all SMs, as pilotd's compute shares make: memory
// is the primary context's, allocated before the threads start) or `ctx` (a context of its own
// from cuCtxCreate, with memory of its own: the bound of contexts that share nothing).
//
//   one_context THREADS SECONDS [KERNELS] [PLACE]
//
// Prints one line: threads, steps/s summed over threads, and the median and p99 step in us.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cstring>

#include <cuda.h>
#include <cuda_runtime.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

__global__ void tiny(float *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = v[i] * 0.5f + 1.0f;
}

#define CU_CHECK(call)                                                                \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                     \
            const char *name_ = "?";                                                  \
            cuGetErrorName(r_, &name_);                                               \
            fprintf(stderr, "%s: %s (line %d)\n", #call, name_, __LINE__);            \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

using Clock = std::chrono::steady_clock;

enum Place { PRIMARY, GREEN, OWN_CONTEXT };

// The calling thread's context for PLACE (PRIMARY: the runtime's, already current).
static void enter(Place place)
{
    CUdevice dev;
    CU_CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    if (place == GREEN) {
        CUdevResource sms;
        CU_CHECK(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
        CUdevResourceDesc desc;
        CU_CHECK(cuDevResourceGenerateDesc(&desc, &sms, 1));
        CUgreenCtx green;
        CU_CHECK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CU_CHECK(cuCtxFromGreenCtx(&ctx, green));
        CU_CHECK(cuCtxSetCurrent(ctx));
    } else if (place == OWN_CONTEXT) {
        CUctxCreateParams params;
        memset(&params, 0, sizeof params);
        CU_CHECK(cuCtxCreate(&ctx, &params, 0, dev));
    }
}

static const int N = 4096;

static void worker(int kernels, double seconds, std::atomic<int> *ready, int threads,
                   std::vector<double> *steps_us, Place place, float *shared)
{
    const int n = N;
    cudaStream_t s;
    float *v = shared;
    enter(place);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!v)
        CHECK(cudaMalloc(&v, n * sizeof(float)));
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < kernels; k++)
        tiny<<<n / 256, 256, 0, s>>>(v, n);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int w = 0; w < 50; w++) {  // warm-up
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
    }
    ready->fetch_add(1);
    while (ready->load() < threads)
        std::this_thread::yield();
    auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
        auto t0 = Clock::now();
        CHECK(cudaGraphLaunch(exec, s));
        tiny<<<n / 256, 256, 0, s>>>(v, n);
        CHECK(cudaStreamSynchronize(s));
        steps_us->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    if (v != shared)
        CHECK(cudaFree(v));
    CHECK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS SECONDS [KERNELS] [primary|green|ctx]\n", argv[0]);
        return 2;
    }
    int threads = std::atoi(argv[1]);
    double seconds = std::atof(argv[2]);
    int kernels = argc > 3 ? std::atoi(argv[3]) : 8;
    const char *where = argc > 4 ? argv[4] : "primary";
    Place place = !strcmp(where, "green") ? GREEN : !strcmp(where, "ctx") ? OWN_CONTEXT : PRIMARY;
    CHECK(cudaFree(nullptr));
    // green: each thread's memory is the primary context's, as a tenant's is in pilotd
    std::vector<float *> memory(threads, nullptr);
    if (place != OWN_CONTEXT)
        for (auto &m : memory) {
            CHECK(cudaMalloc(&m, N * sizeof(float)));
            CHECK(cudaMemset(m, 0, N * sizeof(float)));
        }
    std::atomic<int> ready{0};
    std::vector<std::vector<double>> steps(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back(worker, kernels, seconds, &ready, threads, &steps[t], place, memory[t]);
    for (auto &t : pool)
        t.join();
    std::vector<double> all;
    for (auto &s : steps)
        all.insert(all.end(), s.begin(), s.end());
    std::sort(all.begin(), all.end());
    double median = all.empty() ? 0 : all[all.size() / 2];
    double p99 = all.empty() ? 0 : all[all.size() * 99 / 100];
    // the last step's kernel ran on the memory it was given: v = v/2 + 1 converges to 2
    if (place != OWN_CONTEXT) {
        CHECK(cudaSetDevice(0));
        CUcontext primary;
        CU_CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
        CU_CHECK(cuCtxSetCurrent(primary));
        float h;
        CHECK(cudaMemcpy(&h, memory[0], sizeof h, cudaMemcpyDeviceToHost));
        if (h < 1.9f || h > 2.1f) {
            fprintf(stderr, "%s: the kernels did not run on the memory given (%f)\n", where, h);
            return 1;
        }
    }
    printf("threads %d steps/s %.0f median_us %.1f p99_us %.1f\n", threads, all.size() / seconds,
           median, p99);
    return 0;
}
