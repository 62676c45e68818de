// Small managed allocations (pilot packs them into ranges of the session's own, shim/runtime/managed/um_pack.c).
// Usage (no argument: zero 3000 700, many 10000 64, reuse, threads and api):
//   small_managed many N SIZE [hold]  N allocations of SIZE bytes, each filled on the host, every
//                                     byte incremented by one kernel through a managed pointer
//                                     table, checked; with `hold`, prints its addresses'
//                                     pages ("page 0x...") and "ready" before and "freed" after
//                                     freeing them all, waiting for a line on stdin each time
//   small_managed reuse               cudaFree of an address that is not the start of a live
//                                     allocation is refused; prints whether allocations made
//                                     after frees read zero (under pilot they do; not printed
//                                     when all scenarios run: CUDA does not promise it)
//   small_managed zero N SIZE         N fresh allocations read zero on the host and the device
//   small_managed threads             4 threads allocating, filling, freeing and allocating
//                                     again at once: no piece given twice
//   small_managed api                 advice, prefetch, range and pointer attributes, stream
//                                     attachment on one small allocation among others
// Self-checking: prints "<scenario> ok" or "<scenario> FAIL ..." (exit status 1); the output is
// the same natively and under pilot.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "self_check.h"

// ptrs[i][b] += add for every byte b < size of every allocation i < n
__global__ void touch_table(unsigned char **ptrs, int n, int size, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        for (int b = 0; b < size; b++)
            ptrs[i][b] += (unsigned char)add;
}

// *sum = the sum of every byte of every allocation (one thread)
__global__ void sum_table(unsigned char **ptrs, int n, int size, unsigned long long *sum)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long s = 0;
        for (int i = 0; i < n; i++)
            for (int b = 0; b < size; b++)
                s += ptrs[i][b];
        *sum = s;
    }
}

static unsigned char pattern(int i, int b)
{
    return (unsigned char)(i * 7 + b * 3 + 1);
}

static void wait_line(void)
{
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

static void many(int n, int size, int hold)
{
    unsigned char **ptrs;
    CHECK(cudaMallocManaged((void **)&ptrs, (size_t)n * sizeof *ptrs, cudaMemAttachGlobal));
    for (int i = 0; i < n; i++) {
        CHECK(cudaMallocManaged((void **)&ptrs[i], (size_t)size, cudaMemAttachGlobal));
        for (int b = 0; b < size; b++)
            ptrs[i][b] = pattern(i, b);
    }
    touch_table<<<(n + 255) / 256, 256>>>(ptrs, n, size, 5);
    CHECK(cudaDeviceSynchronize());
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        for (int b = 0; b < size; b++)
            ok &= ptrs[i][b] == (unsigned char)(pattern(i, b) + 5);
    if (hold) {
        unsigned long long last = ~0ull;
        for (int i = 0; i < n; i++) {
            unsigned long long page = (unsigned long long)(uintptr_t)ptrs[i] >> 12;
            unsigned long long end = ((unsigned long long)(uintptr_t)ptrs[i] + size - 1) >> 12;
            for (; page <= end; page++)
                if (page != last)
                    printf("page %#llx\n", page << 12);
            last = end;
        }
        printf("ready\n");
        wait_line();
    }
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(ptrs[i]));
    CHECK(cudaFree(ptrs));
    if (hold) {
        printf("freed\n");
        wait_line();
    }
    verdict("many", ok, "wrong contents");
}

static void reuse(int tell_zero)
{
    enum { N = 64, SIZE = 700 };
    unsigned char *p[N];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        CHECK(cudaMallocManaged((void **)&p[i], SIZE, cudaMemAttachGlobal));
        memset(p[i], 0xa5, SIZE);
    }
    // not the start of an allocation, then a double free: refused, the allocation untouched
    cudaError_t inner = cudaFree(p[3] + 16);
    cudaGetLastError();
    CHECK(cudaFree(p[3]));
    cudaError_t twice = cudaFree(p[3]);
    cudaGetLastError();
    printf("reuse inner=%s twice=%s\n", cudaGetErrorName(inner), cudaGetErrorName(twice));
    ok &= p[4][0] == 0xa5;
    for (int i = 0; i < N; i += 2)
        if (i != 2)
            CHECK(cudaFree(p[i]));
    // allocated again: under pilot whatever they reuse reads zero (printed apart: CUDA does not
    // promise it within a process, only fresh pages read zero)
    int zero = 1;
    for (int i = 0; i < N; i += 2) {
        CHECK(cudaMallocManaged((void **)&p[i], SIZE, cudaMemAttachGlobal));
        for (int b = 0; b < SIZE; b++)
            zero &= p[i][b] == 0;
    }
    CHECK(cudaMallocManaged((void **)&p[3], SIZE, cudaMemAttachGlobal));
    for (int b = 0; b < SIZE; b++)
        zero &= p[3][b] == 0;
    for (int i = 1; i < N; i += 2)
        ok &= i == 3 || p[i][SIZE - 1] == 0xa5; // the others untouched
    for (int i = 0; i < N; i++)
        CHECK(cudaFree(p[i]));
    if (tell_zero)
        printf("reuse reused_zero=%s\n", zero ? "yes" : "no");
    verdict("reuse", ok, "wrong contents");
}

static void zero(int n, int size)
{
    unsigned char **ptrs;
    unsigned long long *sum;
    CHECK(cudaMallocManaged((void **)&ptrs, (size_t)n * sizeof *ptrs, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged((void **)&sum, sizeof *sum, cudaMemAttachGlobal));
    unsigned long long host = 0;
    for (int i = 0; i < n; i++) {
        CHECK(cudaMallocManaged((void **)&ptrs[i], (size_t)size, cudaMemAttachGlobal));
        for (int b = 0; b < size; b++)
            host += ptrs[i][b];
    }
    sum_table<<<1, 1>>>(ptrs, n, size, sum);
    CHECK(cudaDeviceSynchronize());
    verdict("zero", host == 0 && *sum == 0, "nonzero");
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(ptrs[i]));
    CHECK(cudaFree(ptrs));
    CHECK(cudaFree(sum));
}

// The managed API on small allocations: advice, prefetch both ways, range attributes, stream
// attachment and pointer attributes of one allocation, then a kernel and the host on it.
static void api(void)
{
    enum { N = 8, SIZE = 300 };
    unsigned char *p[N], **table;
    struct cudaMemLocation gpu = {cudaMemLocationTypeDevice, 0};
    struct cudaMemLocation host = {cudaMemLocationTypeHost, 0};
    CHECK(cudaMallocManaged((void **)&table, sizeof p, cudaMemAttachGlobal));
    for (int i = 0; i < N; i++) {
        CHECK(cudaMallocManaged((void **)&p[i], SIZE, cudaMemAttachGlobal));
        memset(p[i], i, SIZE);
        table[i] = p[i];
    }
    int v = -9, ok = 1;
    unsigned char *m = p[3];
    CHECK(cudaMemAdvise(m, SIZE, cudaMemAdviseSetReadMostly, gpu));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeReadMostly, m, SIZE));
    ok &= v == 1;
    CHECK(cudaMemAdvise(m, SIZE, cudaMemAdviseUnsetReadMostly, gpu));
    CHECK(cudaMemAdvise(m, SIZE, cudaMemAdviseSetPreferredLocation, gpu));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributePreferredLocation, m, SIZE));
    ok &= v == 0;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemPrefetchAsync(m, SIZE, gpu, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, SIZE));
    ok &= v == 0;
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle));
    touch_table<<<1, N, 0, s>>>(table, N, SIZE, 2);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachGlobal));
    CHECK(cudaMemPrefetchAsync(m, SIZE, host, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, SIZE));
    ok &= v == cudaCpuDeviceId;
    CHECK(cudaStreamDestroy(s));
    struct cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, m + 10));
    ok &= a.type == cudaMemoryTypeManaged && a.devicePointer == m + 10 && a.hostPointer == m + 10;
    for (int i = 0; i < N; i++)
        for (int b = 0; b < SIZE; b++)
            ok &= p[i][b] == i + 2;
    for (int i = 0; i < N; i++)
        CHECK(cudaFree(p[i]));
    CHECK(cudaFree(table));
    verdict("api", ok, "wrong attribute or value");
}

enum { THREADS = 4, PER_THREAD = 3000, THREAD_SIZE = 100 };

static void *thread_body(void *arg)
{
    const int t = (int)(intptr_t)arg;
    static unsigned char *p[THREADS][PER_THREAD];
    int ok = 1;
    for (int round = 0; round < 2; round++) {
        for (int i = round; i < PER_THREAD; i += 1 + round) { // all, then every other one again
            CHECK(cudaMallocManaged((void **)&p[t][i], THREAD_SIZE, cudaMemAttachGlobal));
            memset(p[t][i], 16 * t + round + 1, THREAD_SIZE);
        }
        for (int i = 1; round == 0 && i < PER_THREAD; i += 2)
            CHECK(cudaFree(p[t][i]));
    }
    for (int i = 0; i < PER_THREAD; i++) {
        for (int b = 0; b < THREAD_SIZE; b++)
            ok &= p[t][i][b] == 16 * t + 1 + (i % 2);
        CHECK(cudaFree(p[t][i]));
    }
    return (void *)(intptr_t)ok;
}

static void threads(void)
{
    pthread_t tid[THREADS];
    int ok = 1;
    for (int t = 0; t < THREADS; t++)
        pthread_create(&tid[t], NULL, thread_body, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(tid[t], &r);
        ok &= r != NULL;
    }
    verdict("threads", ok, "wrong contents");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 4 && strcmp(argv[1], "many") == 0)
        many(atoi(argv[2]), atoi(argv[3]), argc > 4 && strcmp(argv[4], "hold") == 0);
    else if (argc >= 2 && strcmp(argv[1], "threads") == 0)
        threads();
    else if (argc >= 2 && strcmp(argv[1], "api") == 0)
        api();
    else if (argc >= 2 && strcmp(argv[1], "reuse") == 0)
        reuse(1);
    else if (argc >= 4 && strcmp(argv[1], "zero") == 0)
        zero(atoi(argv[2]), atoi(argv[3]));
    else if (argc == 1) { // all of them, as tests/gpu/run_compare.sh runs it; zero first, while
                          // the process has freed nothing (natively a reused piece keeps its bytes)
        zero(3000, 700);
        many(10000, 64, 0);
        reuse(0);
        threads();
        api();
    } else {
        fprintf(stderr, "usage: small_managed many N SIZE [hold] | reuse | zero N SIZE | threads | api\n");
        return 2;
    }
    return g_failed ? 1 : 0;
}
