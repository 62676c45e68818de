// streams_events: a producer kernel on a blocking stream, an event recorded after it, and a
// consumer kernel on a non-blocking stream that waits for the event and reads the producer's
// output. Checks event/stream queries and synchronization, elapsed time between timing events,
// the error for elapsed time on a cudaEventDisableTiming event, and destroys everything.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_),       \
                   __FILE__, __LINE__, #call);                                   \
            printf("FAIL\n");                                                    \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

// x[i] = i * 0.1f + 1, each operation rounded on its own (no FMA contraction)
__global__ void produce(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __fadd_rn(__fmul_rn((float)i, 0.1f), 1.0f);
}

// y[i] = x[i] * 3.3f - 0.7f, each operation rounded on its own; grid-stride loop
__global__ void consume(const float *x, float *y, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = __fsub_rn(__fmul_rn(x[i], 3.3f), 0.7f);
}

int main(void)
{
    const int n = 300000;
    const size_t bytes = (size_t)n * sizeof(float);
    int failed = 0;

    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t start, produced, stop, untimed;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&produced));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));

    float *x, *y;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMemset(y, 0, bytes));
    CHECK(cudaDeviceSynchronize());

    CHECK(cudaEventRecord(start, s1));
    produce<<<(n + 127) / 128, 128, 0, s1>>>(x, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(produced, s1));
    CHECK(cudaStreamWaitEvent(s2, produced, 0));
    consume<<<40, 96, 0, s2>>>(x, y, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop, s2));
    CHECK(cudaEventRecord(untimed, s2));

    CHECK(cudaEventSynchronize(stop));
    printf("event query after sync: %s\n", cudaGetErrorName(cudaEventQuery(stop)));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaStreamSynchronize(s2));
    printf("stream query s1: %s\n", cudaGetErrorName(cudaStreamQuery(s1)));
    printf("stream query s2: %s\n", cudaGetErrorName(cudaStreamQuery(s2)));
    CHECK(cudaEventSynchronize(untimed));
    printf("event query untimed: %s\n", cudaGetErrorName(cudaEventQuery(untimed)));

    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("elapsed start->stop >= 0: %s\n", ms >= 0.0f ? "yes" : "no");
    CHECK(cudaEventElapsedTime(&ms, start, produced));
    printf("elapsed start->produced >= 0: %s\n", ms >= 0.0f ? "yes" : "no");
    cudaError_t e = cudaEventElapsedTime(&ms, start, untimed);
    printf("elapsed with disable-timing event: %s\n", cudaGetErrorName(e));
    printf("last error after that: %s\n", cudaGetErrorName(cudaGetLastError()));

    float *hy = (float *)malloc(bytes);
    if (!hy) {
        printf("host allocation failed\nFAIL\n");
        return 1;
    }
    CHECK(cudaMemcpy(hy, y, bytes, cudaMemcpyDeviceToHost));
    long wrong = 0;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        // volatile keeps the host compiler from fusing multiply and add (the kernels don't)
        volatile float prod = (float)i * 0.1f;
        float xi = prod + 1.0f;
        volatile float prod3 = xi * 3.3f;
        float want = prod3 - 0.7f;
        if (hy[i] != want)
            wrong++;
        sum += (double)hy[i];
    }
    printf("y[0] %.9g y[n-1] %.9g\n", (double)hy[0], (double)hy[n - 1]);
    printf("wrong %ld\n", wrong);
    printf("checksum %.17g\n", sum);
    failed |= wrong != 0;
    failed |= e != cudaErrorInvalidResourceHandle;

    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(produced));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(untimed));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaDeviceSynchronize());
    printf("destroyed\n");
    free(hy);
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
