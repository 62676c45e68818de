// Latency of "launch, then wait": a kernel that spins for T microseconds, launched alone or as
// a one-node CUDA graph, then cudaStreamSynchronize (or cudaDeviceSynchronize), median of 300
// calls per T. Natively and under pilot (bench/graph_latency.sh) it shows what a wait adds
// beyond the kernel's own time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

__global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    // idle streams besides the one used (PyTorch keeps pools of them): argv[1], default 0
    int idle = argc > 1 ? atoi(argv[1]) : 0;
    std::vector<cudaStream_t> pool(idle);
    for (auto &p : pool)
        cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking);
    printf("idle streams %d\n", idle);
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const int us_list[] = {0, 20, 100, 300};
    for (int us : us_list) {
        long long cycles = (long long)us * khz / 1000;
        cudaGraph_t g;
        cudaGraphExec_t exec;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        spin<<<1, 32, 0, s>>>(cycles);
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&exec, g, 0);
        for (int mode = 0; mode < 3; mode++) {
            std::vector<double> t;
            for (int i = 0; i < 330; i++) {
                auto t0 = std::chrono::steady_clock::now();
                if (mode == 1)
                    cudaGraphLaunch(exec, s);
                else
                    spin<<<1, 32, 0, s>>>(cycles);
                if (mode == 2)
                    cudaDeviceSynchronize();
                else
                    cudaStreamSynchronize(s);
                auto t1 = std::chrono::steady_clock::now();
                if (i >= 30)
                    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            }
            static const char *names[] = {"launch+streamsync", "graph+streamsync", "launch+devicesync"};
            printf("kernel %4d us  %-18s median %8.1f us\n", us, names[mode], median(t));
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
    }
    cudaError_t e = cudaGetLastError();
    printf("%s\n", cudaGetErrorName(e));
    return 0;
}
