// words [orphan]: the calls pilot may answer with a completion word the GPU writes into the
// connection's ring (issue 25; shim/transport/pilot_ring.h): synchronizations and small copies to
// the host, in many sizes and orders; a wait longer than the shim polls (a host function that
// sleeps); several threads sharing the device. Prints what it computed (the same natively).
// `orphan`: queues work behind a sleeping host function, then synchronizes; the test kills the
// process while it waits (pilotd must keep the ring's page until the GPU has written it).
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            printf("CUDA error %s at line %d: %s\n", cudaGetErrorName(err_), __LINE__, \
                   #call);                                                             \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

__global__ void fill(unsigned *p, unsigned value, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = value + (unsigned)i;
}

static void CUDART_CB nap(void *ms)
{
    usleep((useconds_t)(uintptr_t)ms * 1000u);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* fill on `s`, then the n values back (cudaMemcpy after a synchronization of s) */
static int round_trip(unsigned *dev, unsigned *host, cudaStream_t s, unsigned value, int n)
{
    fill<<<(n + 255) / 256, 256, 0, s>>>(dev, value, n);
    if (s)
        CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, dev, (size_t)n * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (host[i] != value + (unsigned)i)
            return 0;
    return 1;
}

struct worker {
    int id, ok;
};

static void *work(void *arg)
{
    struct worker *w = (struct worker *)arg;
    cudaStream_t s;
    unsigned *dev, host[64];
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&dev, sizeof host));
    w->ok = 1;
    for (int r = 0; r < 100; r++)
        w->ok &= round_trip(dev, host, s, (unsigned)(w->id * 100000 + r * 13), 64);
    CHECK(cudaFree(dev));
    CHECK(cudaStreamDestroy(s));
    return NULL;
}

int main(int argc, char **argv)
{
    const int big = 16384;
    unsigned *dev, *host = (unsigned *)malloc(big * sizeof(unsigned));
    CHECK(cudaMalloc(&dev, big * sizeof(unsigned)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    if (argc > 1 && strcmp(argv[1], "orphan") == 0) {
        CHECK(cudaLaunchHostFunc(s, nap, (void *)(uintptr_t)1500));
        fill<<<1, 32, 0, s>>>(dev, 7, 32);
        printf("waiting\n");
        fflush(stdout);
        CHECK(cudaStreamSynchronize(s)); /* killed meanwhile */
        printf("not killed\n");
        return 0;
    }

    /* sizes around the GPU page's 4032 bytes of data, and a single byte */
    const int sizes[] = {1, 1008, 1009, 4096, big};
    int ok = 1;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        ok &= round_trip(dev, host, 0, (unsigned)(k * 1000 + 1), sizes[k]);
    unsigned char byte = 0;
    CHECK(cudaMemcpy(&byte, (unsigned char *)dev + 5, 1, cudaMemcpyDeviceToHost));
    ok &= byte == (unsigned char)((4 * 1000 + 1 + 1) >> 8);
    printf("sizes %s\n", ok ? "ok" : "WRONG");

    /* many small rounds: a stale page would show an old value */
    ok = 1;
    for (int r = 0; r < 300; r++)
        ok &= round_trip(dev, host, 0, (unsigned)(r * 7), 1);
    printf("rounds %s\n", ok ? "ok" : "WRONG");

    /* a stream of its own; then work on two streams and one device synchronization */
    ok = 1;
    for (int r = 0; r < 50; r++)
        ok &= round_trip(dev, host, s, (unsigned)(r * 31), 256);
    fill<<<1, 256, 0, s>>>(dev, 11, 256);
    fill<<<1, 256>>>(dev + 256, 12, 256);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, dev, 512 * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; i++)
        ok &= host[i] == 11u + (unsigned)i && host[256 + i] == 12u + (unsigned)i;
    printf("streams %s\n", ok ? "ok" : "WRONG");

    /* work behind a host function that sleeps 300 ms: the synchronization waits for it */
    double t0 = now();
    CHECK(cudaLaunchHostFunc(s, nap, (void *)(uintptr_t)300));
    fill<<<4, 256, 0, s>>>(dev, 99, 1024);
    CHECK(cudaStreamSynchronize(s));
    double waited = now() - t0;
    CHECK(cudaMemcpy(host, dev, 1024 * sizeof(unsigned), cudaMemcpyDeviceToHost));
    ok = waited >= 0.29;
    for (int i = 0; i < 1024; i++)
        ok &= host[i] == 99u + (unsigned)i;
    printf("slow %s\n", ok ? "ok" : "WRONG");

    /* four threads, each its own stream, sharing the connection */
    struct worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i].id = i + 1;
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    ok = 1;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ok &= w[i].ok;
    }
    printf("threads %s\n", ok ? "ok" : "WRONG");
    CHECK(cudaFree(dev));
    return 0;
}
