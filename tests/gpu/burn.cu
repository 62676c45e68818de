// A compute-bound kernel run back to back for a fixed wall-clock window, for compute shares
// (tests/gpu/share_check.py): prints the SM count the program sees and its kernels per second.
//
//   burn START_EPOCH SECONDS ITERS     (waits until START_EPOCH, then runs for SECONDS)
//
// The grid is fixed (16 full waves of 8 blocks of 256 threads per SM on a 132-SM H100), so every
// run does the same work whatever SM count it is given; many waves keep the tail short on a
// partition (66 waves on 32 SMs).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cuda_runtime.h>

__global__ void burn(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; ++i) { a = a * b + 1e-7f; b = b * a - 1e-7f; }
    if (a == 12345.f) out[0] = b;
}

static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: burn START_EPOCH SECONDS ITERS\n"); return 2; }
    double start = atof(argv[1]), seconds = atof(argv[2]);
    int iters = atoi(argv[3]), sms = 0, grid = 132 * 8 * 16;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float *out;
    cudaEvent_t ev[2];
    if (cudaMalloc(&out, 4) || cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming) ||
        cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming)) { printf("setup failed\n"); return 1; }
    burn<<<grid, 256>>>(out, iters);  // warm-up: module load, first launch
    cudaError_t err = cudaDeviceSynchronize();
    printf("ready sms %d warmup %s\n", sms, cudaGetErrorName(err));
    fflush(stdout);
    while (now() < start) std::this_thread::sleep_for(std::chrono::microseconds(200));
    double t0 = now(), end = t0 + seconds;
    long k = 0, done = 0;
    while (now() < end) {  // two kernels in flight: the GPU never waits for the host
        burn<<<grid, 256>>>(out, iters);
        cudaEventRecord(ev[k & 1], 0);
        if (k) {
            cudaError_t e = cudaEventSynchronize(ev[(k - 1) & 1]);
            if (e != cudaSuccess && err == cudaSuccess) err = e;
            ++done;
        }
        ++k;
    }
    cudaError_t last = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = last != cudaSuccess ? last : cudaGetLastError();
    done += k ? 1 : 0;
    double took = now() - t0;
    printf("sms %d kernels %ld seconds %.3f rate %.4f err %s\n", sms, done, took, done / took,
           cudaGetErrorName(err));
    return err != cudaSuccess;
}
