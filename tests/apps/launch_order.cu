// launch_order: long runs of launches of one kernel whose results depend on their order
// (x = x * 3 + k, k the launch's number), on the legacy stream, a non-blocking stream, blocking
// streams interleaved with the legacy one (whose implicit ordering CUDA guarantees), a stream
// destroyed and made again, and several kernels with different argument sizes, then rounds each
// ended by a synchronization. These are the launches, copies and synchronizations pilotd may do
// in C (daemon/vgpu/fast.py): any lost, repeated or
// reordered launch changes a printed value. Expected lines are computed in
// tests/apps/test_launch_order.py.
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess) {                                                       \
            printf("CUDA error %s at line %d: %s\n", cudaGetErrorName(err_), __LINE__, #call); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define N 256

__global__ void step(uint32_t *x, int n, uint32_t k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * 3u + k + (uint32_t)i;
}

struct Pair {
    uint32_t a, b;
};

__global__ void step_pair(uint32_t *x, int n, Pair p, uint64_t shift)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = (x[i] ^ p.a) * 5u + p.b + (uint32_t)shift;
}

__global__ void noargs(void) {}

static uint32_t digest(const uint32_t *v, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = (h ^ v[i]) * 16777619u;
    return h;
}

static void show(const char *what, const uint32_t *dev)
{
    uint32_t host[N];
    CHECK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
    printf("%s %08x %u %u\n", what, digest(host, N), host[0], host[N - 1]);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    uint32_t *a, *b, *c;
    CHECK(cudaMalloc(&a, N * sizeof(uint32_t)));
    CHECK(cudaMalloc(&b, N * sizeof(uint32_t)));
    CHECK(cudaMalloc(&c, N * sizeof(uint32_t)));
    CHECK(cudaMemset(a, 0, N * sizeof(uint32_t)));
    CHECK(cudaMemset(b, 0, N * sizeof(uint32_t)));
    CHECK(cudaMemset(c, 0, N * sizeof(uint32_t)));

    // 1. the legacy stream
    for (int k = 0; k < rounds; k++)
        step<<<2, 128>>>(a, N, (uint32_t)k);
    CHECK(cudaGetLastError());
    show("legacy", a);

    // 2. a non-blocking stream, then the legacy stream reading what it wrote after a sync
    cudaStream_t nb;
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    for (int k = 0; k < rounds; k++)
        step<<<2, 128, 0, nb>>>(b, N, (uint32_t)(k + 7));
    CHECK(cudaStreamSynchronize(nb));
    show("nonblocking", b);

    // 3. blocking streams interleaved with the legacy stream: CUDA orders each launch on the
    // legacy stream after the blocking streams' work and theirs after it
    cudaStream_t bl[2];
    CHECK(cudaStreamCreate(&bl[0]));
    CHECK(cudaStreamCreate(&bl[1]));
    for (int k = 0; k < rounds / 4; k++) {
        step<<<1, 256, 0, bl[k & 1]>>>(c, N, (uint32_t)k);
        step<<<1, 256>>>(c, N, (uint32_t)(k * 2 + 1));
        step<<<1, 256>>>(c, N, (uint32_t)(k * 3 + 2));
    }
    CHECK(cudaDeviceSynchronize());
    show("interleaved", c);

    // 4. a stream destroyed and another made: launches go to the new one only
    CHECK(cudaStreamDestroy(nb));
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    for (int k = 0; k < rounds / 2; k++)
        step<<<2, 128, 0, nb>>>(a, N, (uint32_t)(k ^ 0x55));
    CHECK(cudaStreamSynchronize(nb));
    show("recreated", a);

    // 5. kernels with other argument layouts, and one without arguments, on one stream
    Pair p = {0x9e3779b9u, 12345u};
    for (int k = 0; k < rounds / 2; k++) {
        p.b += (uint32_t)k;
        step_pair<<<2, 128, 0, nb>>>(b, N, p, (uint64_t)k << 33 | (uint64_t)k);
        noargs<<<1, 1, 0, nb>>>();
        step<<<2, 128, 0, nb>>>(b, N, (uint32_t)k);
    }
    CHECK(cudaStreamSynchronize(nb));
    show("mixed", b);

    // 6. a launch the device refuses (too many threads) among accepted ones: it is reported by
    // the launch, and the launches around it still run in order
    step<<<1, 128>>>(a, N, 1u);
    step<<<1, 4096>>>(a, N, 2u);
    printf("refused %s\n", cudaGetErrorName(cudaGetLastError()));
    step<<<2, 128>>>(a, N, 3u);
    CHECK(cudaDeviceSynchronize());
    show("after_refused", a);

    // 7. small synchronous copies both ways between launches: each read sees every write and
    // launch before it
    uint64_t sum = 0;
    for (int k = 0; k < rounds / 4; k++) {
        uint32_t v = (uint32_t)k * 2654435761u;
        CHECK(cudaMemcpy(c + (k % N), &v, sizeof v, cudaMemcpyHostToDevice));
        step<<<1, 256>>>(c, N, (uint32_t)k);
        uint32_t back[2];
        CHECK(cudaMemcpy(back, c + ((k * 7) % (N - 1)), sizeof back, cudaMemcpyDeviceToHost));
        sum = sum * 31 + back[0] + back[1];
    }
    printf("copies %016llx\n", (unsigned long long)sum);
    show("after_copies", c);

    // 8. launches on two non-blocking streams and the legacy one, each round ended by a
    // synchronization (of the device, or of each stream), then read with cudaMemcpyAsync and a
    // host-side wait: a synchronization that returned early would show a stale value
    cudaStream_t s2;
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    uint64_t seen = 0;
    for (int k = 0; k < rounds / 4; k++) {
        step<<<2, 128, 0, nb>>>(a, N, (uint32_t)k);
        step<<<2, 128, 0, s2>>>(b, N, (uint32_t)(k + 1));
        step<<<2, 128>>>(c, N, (uint32_t)(k + 2));
        if (k % 3 == 0) {
            CHECK(cudaDeviceSynchronize());
        } else {
            CHECK(cudaStreamSynchronize(nb));
            CHECK(cudaStreamSynchronize(s2));
            CHECK(cudaStreamSynchronize(0));
        }
        uint32_t va, vb, vc;
        CHECK(cudaMemcpy(&va, a + (k % N), sizeof va, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&vb, b + (k % N), sizeof vb, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&vc, c + (k % N), sizeof vc, cudaMemcpyDeviceToHost));
        seen = seen * 31 + va + vb + vc;
    }
    printf("synced %016llx\n", (unsigned long long)seen);
    CHECK(cudaStreamDestroy(s2));

    CHECK(cudaStreamDestroy(nb));
    CHECK(cudaStreamDestroy(bl[0]));
    CHECK(cudaStreamDestroy(bl[1]));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    printf("done\n");
    return 0;
}
