// Unified memory through pilot: cudaMallocManaged, __managed__ variables, host/device coherence.
// Usage: managed [scenario]   (no argument runs them all). Self-checking: every scenario prints
// "<name> ok" or "<name> FAIL ..." and the program exits non-zero on any failure; the output is
// the same natively and under pilot.
#include <cuda_runtime.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "self_check.h"

__managed__ int counter = 5;
__managed__ int marr[64];

struct Pair {
    const int *in;
    int *out;
};

__global__ void um_scale(float *x, int n, float a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __fadd_rn(__fmul_rn(x[i], a), 1.0f);
}

__global__ void um_pair(Pair p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p.out[i] = p.in[i] * 2;
}

__global__ void um_gather(int **ptrs, int nptrs, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        for (int j = 0; j < nptrs; j++)
            ptrs[j][i] += j + 1;
}

__global__ void um_counter(void)
{
    if (threadIdx.x == 0)
        counter += 1;
    marr[threadIdx.x] += (int)threadIdx.x;
}

__global__ void um_fill(int *x, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = v + i;
}

// Host initialises, kernels iterate with a sync each time, host reads (and checks) every value.
static void iterative(void)
{
    const int n = 3 << 20; // 12 MiB: several chunks, last one partial
    float *x;
    CHECK(cudaMallocManaged(&x, n * sizeof(float), cudaMemAttachGlobal));
    for (int i = 0; i < n; i++)
        x[i] = (float)(i % 1000);
    for (int it = 0; it < 5; it++) {
        um_scale<<<(n + 255) / 256, 256>>>(x, n, 0.5f);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        float v = (float)(i % 1000);
        for (int it = 0; it < 5; it++)
            v = v * 0.5f + 1.0f;
        if (x[i] != v)
            bad = i;
    }
    char detail[96];
    snprintf(detail, sizeof detail, "at %d: %g", bad, bad >= 0 ? x[bad] : 0.0);
    verdict("iterative", bad < 0, detail);
    CHECK(cudaFree(x));
}

// Fresh managed memory reads as zero, on the host and on the device.
static void zeroed(void)
{
    const int n = 1 << 20;
    int *a, *b;
    CHECK(cudaMallocManaged(&a, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&b, n * sizeof(int), cudaMemAttachHost));
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += a[i] + b[i];
    Pair p = {a, b};
    um_pair<<<(n + 255) / 256, 256>>>(p, n); // b = 2 * a = 0
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++)
        sum += b[i];
    verdict("zeroed", sum == 0, "nonzero");
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

// Managed pointers inside a struct argument and inside a managed array of pointers.
static void pointers(void)
{
    const int n = 5000, np = 3;
    int *in, *out, **ptrs;
    CHECK(cudaMallocManaged(&in, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&out, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&ptrs, np * sizeof(int *), cudaMemAttachGlobal));
    for (int i = 0; i < n; i++)
        in[i] = i - 7;
    Pair p = {in, out};
    um_pair<<<(n + 127) / 128, 128>>>(p, n);
    ptrs[0] = in;
    ptrs[1] = out;
    ptrs[2] = in;
    um_gather<<<(n + 127) / 128, 128>>>(ptrs, np, n); // in += 1 + 3, out += 2
    CHECK(cudaDeviceSynchronize());
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok &= in[i] == i - 7 + 4 && out[i] == 2 * (i - 7) + 2;
    verdict("pointers", ok, "wrong values");
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
    CHECK(cudaFree(ptrs));
}

// __managed__ variables: initial value, kernel updates, host updates, kernel again.
static void variables(void)
{
    int first = counter;
    for (int i = 0; i < 64; i++)
        marr[i] = 100 * i;
    um_counter<<<1, 64>>>();
    CHECK(cudaDeviceSynchronize());
    int after = counter;
    counter = 40;
    um_counter<<<1, 64>>>();
    CHECK(cudaDeviceSynchronize());
    int ok = first == 5 && after == 6 && counter == 41;
    for (int i = 0; i < 64; i++)
        ok &= marr[i] == 100 * i + 2 * i;
    char detail[64];
    snprintf(detail, sizeof detail, "%d %d %d %d", first, after, counter, marr[3]);
    verdict("variables", ok, detail);
}

// cudaMemset and cudaMemcpy on managed memory, in every direction, with host writes between.
static void copies(void)
{
    const int n = 1 << 19;
    int *m, *m2, *d, *h = (int *)malloc(n * sizeof(int));
    CHECK(cudaMallocManaged(&m, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&m2, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemset(m, 0x01, n * sizeof(int)));
    int ok = m[0] == 0x01010101 && m[n - 1] == 0x01010101;
    for (int i = 0; i < n; i++)
        m[i] = i; // host writes, then copies must see them
    CHECK(cudaMemcpy(d, m, n * sizeof(int), cudaMemcpyDefault));
    CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        ok &= h[i] == i;
    m[5] = -5;
    CHECK(cudaMemcpy(m2, m, n * sizeof(int), cudaMemcpyDefault)); // managed to managed
    ok &= m2[5] == -5 && m2[n - 1] == n - 1;
    for (int i = 0; i < n; i++)
        h[i] = 3 * i;
    CHECK(cudaMemcpy(m, h, n * sizeof(int), cudaMemcpyHostToDevice)); // host to managed
    ok &= m[7] == 21 && m[n - 1] == 3 * (n - 1);
    CHECK(cudaMemset(m + 10, 0, 4 * sizeof(int)));
    ok &= m[9] == 27 && m[10] == 0 && m[13] == 0 && m[14] == 42;
    CHECK(cudaMemcpy(h, m, 16 * sizeof(int), cudaMemcpyDeviceToHost)); // small, inline path
    ok &= h[9] == 27 && h[12] == 0 && h[15] == 45;
    // 2D copies and memsets on managed memory: rows of 8 ints, 16 apart. The host write must
    // reach the copy, and the host must see what the copy and the memset wrote.
    const size_t pitch = 16 * sizeof(int);
    m[16 * 3 + 1] = -1;
    CHECK(cudaMemcpy2D(m2, pitch, m, pitch, 8 * sizeof(int), 4, cudaMemcpyDefault));
    ok &= m2[16 * 3 + 1] == -1 && m2[16 * 3 + 7] == 3 * 55 && m2[16 * 3 + 8] == 56;
    CHECK(cudaMemset2D(m2, pitch, 0, 4 * sizeof(int), 2));
    ok &= m2[0] == 0 && m2[3] == 0 && m2[4] == 12 && m2[19] == 0 && m2[20] == 60 && m2[32] == 96;
    verdict("copies", ok, "wrong values");
    CHECK(cudaFree(m));
    CHECK(cudaFree(m2));
    CHECK(cudaFree(d));
    free(h);
}

// Host writes between launches with no synchronization in between (different buffers).
static void no_sync_writes(void)
{
    const int n = 1 << 16;
    int *a, *b;
    CHECK(cudaMallocManaged(&a, n * sizeof(int), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&b, n * sizeof(int), cudaMemAttachGlobal));
    um_fill<<<(n + 255) / 256, 256>>>(a, n, 10);
    for (int i = 0; i < n; i++)
        b[i] = 7 * i; // while the first kernel may still run
    Pair p = {b, b};
    um_pair<<<(n + 255) / 256, 256>>>(p, n); // b *= 2
    CHECK(cudaDeviceSynchronize());
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok &= a[i] == 10 + i && b[i] == 14 * i;
    verdict("no_sync_writes", ok, "wrong values");
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

static sigjmp_buf g_jump;
static volatile sig_atomic_t g_caught;
static void own_handler(int sig, siginfo_t *info, void *uctx)
{
    (void)sig, (void)info, (void)uctx;
    g_caught++;
    siglongjmp(g_jump, 1);
}

// The program's own SIGSEGV handler, installed after managed memory exists, still gets its own
// faults, and managed memory keeps working.
static void own_sigsegv(void)
{
    int *m;
    CHECK(cudaMallocManaged(&m, 4096 * sizeof(int), cudaMemAttachGlobal));
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old);
    struct sigaction now;
    sigaction(SIGSEGV, NULL, &now);
    int reported = now.sa_sigaction == own_handler;
    char *guard = (char *)mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sigsetjmp(g_jump, 1) == 0)
        guard[10] = 1; // a genuine fault: the program's handler must see it
    for (int i = 0; i < 4096; i++)
        m[i] = i;
    um_fill<<<16, 256>>>(m, 4096, 1);
    CHECK(cudaDeviceSynchronize());
    int ok = reported && g_caught == 1 && m[4095] == 4096;
    if (sigsetjmp(g_jump, 1) == 0)
        guard[20] = 1;
    ok &= g_caught == 2;
    sigaction(SIGSEGV, &old, NULL);
    munmap(guard, 4096);
    verdict("own_sigsegv", ok, "handler not chained");
    CHECK(cudaFree(m));
}

static void own_plain(int sig)
{
    (void)sig;
    g_caught++;
    siglongjmp(g_jump, 1);
}

// The same with the System V and BSD spellings (sigset, bsd_signal) and a plain handler.
extern "C" __sighandler_t bsd_signal(int sig, __sighandler_t handler); // glibc's; no header has it
static void own_sigset(void)
{
    int *m;
    CHECK(cudaMallocManaged(&m, 4096 * sizeof(int), cudaMemAttachGlobal));
    g_caught = 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" // sigset: what some programs still call
    __sighandler_t before = sigset(SIGSEGV, own_plain);
#pragma GCC diagnostic pop
    char *guard = (char *)mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sigsetjmp(g_jump, 1) == 0)
        guard[10] = 1; // the program's handler must see its own fault
    for (int i = 0; i < 4096; i++)
        m[i] = i;
    um_fill<<<16, 256>>>(m, 4096, 1);
    CHECK(cudaDeviceSynchronize());
    int ok = before != SIG_ERR && g_caught == 1 && m[4095] == 4096;
    ok &= bsd_signal(SIGSEGV, before) == own_plain;
    munmap(guard, 4096);
    verdict("own_sigset", ok, "handler not chained");
    CHECK(cudaFree(m));
}

struct half {
    int *m;
    int from, to;
    long sum;
};

static void *writer(void *arg)
{
    struct half *h = (struct half *)arg;
    for (int i = h->from; i < h->to; i++)
        h->m[i] = i;
    return NULL;
}

static void *reader(void *arg)
{
    struct half *h = (struct half *)arg;
    for (int i = h->from; i < h->to; i++)
        h->sum += h->m[i];
    return NULL;
}

// Two threads write halves, a kernel transforms, two threads read halves.
static void threads(void)
{
    const int n = 1 << 22;
    int *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(int), cudaMemAttachGlobal));
    struct half h[2] = {{m, 0, n / 2 + 3, 0}, {m, n / 2 + 3, n, 0}};
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&t[k], NULL, writer, &h[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    Pair p = {m, m};
    um_pair<<<(n + 255) / 256, 256>>>(p, n);
    CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < 2; k++)
        pthread_create(&t[k], NULL, reader, &h[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    long want = (long)n * (n - 1); // 2 * sum(0..n-1)
    verdict("threads", h[0].sum + h[1].sum == want, "wrong sum");
    CHECK(cudaFree(m));
}

// Advice, prefetch, range attributes, stream attachment, pointer attributes, argument errors.
static void api(void)
{
    const size_t bytes = 8 << 20;
    char *m;
    int *d, stack_var = 0;
    CHECK(cudaMallocManaged((void **)&m, bytes, cudaMemAttachGlobal));
    CHECK(cudaMalloc(&d, 4096));
    struct cudaMemLocation gpu = {cudaMemLocationTypeDevice, 0};
    struct cudaMemLocation host = {cudaMemLocationTypeHost, 0};
    int v = -9, ok = 1;
    // never prefetched by the program (pilotd's own prefetch of a new allocation must not show)
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, bytes));
    ok &= v == cudaInvalidDeviceId;
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocationType, m, bytes));
    ok &= v == cudaMemLocationTypeInvalid;
    {
        cudaStream_t half;
        CHECK(cudaStreamCreate(&half));
        CHECK(cudaMemPrefetchAsync(m, bytes / 2, gpu, 0, half));
        CHECK(cudaStreamSynchronize(half));
        CHECK(cudaStreamDestroy(half));
    }
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, bytes));
    ok &= v == cudaInvalidDeviceId; // half of it never prefetched
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, bytes / 2));
    ok &= v == 0;
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetReadMostly, gpu));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeReadMostly, m, bytes));
    ok &= v == 1;
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseUnsetReadMostly, gpu));
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetPreferredLocation, gpu));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributePreferredLocation, m, bytes));
    ok &= v == 0;
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetAccessedBy, gpu));
    int by[2] = {-9, -9};
    CHECK(cudaMemRangeGetAttribute(by, sizeof by, cudaMemRangeAttributeAccessedBy, m, bytes));
    ok &= by[0] == 0 && by[1] == -2;
    for (size_t i = 0; i < bytes; i += 4096)
        m[i] = (char)(i >> 12);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemPrefetchAsync(m, bytes, gpu, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, bytes));
    ok &= v == 0;
    CHECK(cudaMemPrefetchAsync(m, bytes, host, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, m, bytes));
    ok &= v == cudaCpuDeviceId;
    ok &= m[4096 * 7] == 7; // the data survived both prefetches
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachGlobal));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));

    struct cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, m + 100));
    ok &= a.type == cudaMemoryTypeManaged && a.devicePointer == m + 100 && a.hostPointer == m + 100;
    CHECK(cudaPointerGetAttributes(&a, d));
    ok &= a.type == cudaMemoryTypeDevice && a.devicePointer == d && a.hostPointer == NULL;
    CHECK(cudaPointerGetAttributes(&a, &stack_var));
    ok &= a.type == cudaMemoryTypeUnregistered;
    printf("api unregistered device=%d devptr=%d hostptr=%d\n", a.device, a.devicePointer != NULL,
           a.hostPointer == &stack_var);
    CHECK(cudaPointerGetAttributes(&a, &counter));
    ok &= a.type == cudaMemoryTypeManaged;

    void *p = NULL;
    printf("api size0=%s flags9=%s advise_device=%s\n",
           cudaGetErrorName(cudaMallocManaged(&p, 0, cudaMemAttachGlobal)),
           cudaGetErrorName(cudaMallocManaged(&p, 64, 9)),
           cudaGetErrorName(cudaMemAdvise(d, 4096, cudaMemAdviseSetReadMostly, gpu)));
    cudaGetLastError();
    verdict("api", ok, "wrong attribute");
    CHECK(cudaFree(m));
    CHECK(cudaFree(d));
}

// The address the daemon picks for a managed allocation is taken in this process: the
// allocation must land elsewhere and leave the program's mapping alone. (Under the sim daemon the
// next address is predictable: right after the previous allocation's 2 MiB; natively this only
// checks that allocating next to a mapping of the program works.)
static void collision(void)
{
    const size_t two_mib = 2u << 20, size = 128u << 10; // above what pilot packs (um_pack.c)
    char *a, *b;
    CHECK(cudaMallocManaged((void **)&a, size, cudaMemAttachGlobal));
    // pilotd gives a managed allocation of this size a 2 MiB range of its own; the sim daemon
    // puts the next one right after it, as the driver does (natively: no collision, that is fine)
    char *want = a + two_mib;
    char *mine = (char *)mmap(want, two_mib, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (mine != MAP_FAILED)
        memset(mine, 0x5a, two_mib);
    CHECK(cudaMallocManaged((void **)&b, size, cudaMemAttachGlobal));
    int ok = b != want || mine == MAP_FAILED;
    b[0] = 1;
    um_fill<<<1, 32>>>((int *)b, 32, 3);
    CHECK(cudaDeviceSynchronize());
    ok &= ((int *)b)[31] == 34;
    if (mine != MAP_FAILED) {
        ok &= mine[0] == 0x5a && mine[two_mib - 1] == 0x5a;
        munmap(mine, two_mib);
    }
    verdict("collision", ok, "mapping replaced");
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

// Small managed allocations, which the driver packs 512 bytes apart (the H100 returned addresses
// such as 0x...3a00): each written on the host, incremented by a kernel, read back, and one
// freed and allocated again between the others.
static void small(void)
{
    static const int sizes[] = {2, 25, 128, 750, 1024, 4000, 5000, 70000};
    enum { N = sizeof sizes / sizeof *sizes };
    int *p[N];
    int ok = 1;
    for (int k = 0; k < N; k++) {
        CHECK(cudaMallocManaged((void **)&p[k], sizes[k] * sizeof(int), cudaMemAttachGlobal));
        for (int i = 0; i < sizes[k]; i++)
            p[k][i] = k * 1000 + i;
    }
    CHECK(cudaFree(p[3]));
    CHECK(cudaMallocManaged((void **)&p[3], sizes[3] * sizeof(int), cudaMemAttachGlobal));
    for (int i = 0; i < sizes[3]; i++)
        p[3][i] = 3000 + i;
    for (int k = 0; k < N; k++) {
        um_fill<<<(sizes[k] + 255) / 256, 256>>>(p[k], sizes[k], k * 7);
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < sizes[k]; i++)
            ok &= p[k][i] == k * 7 + i;
        p[k][0] = -1;  // a host write after the kernel, seen by the next one
    }
    um_fill<<<1, 1>>>(p[N - 1] + 1, 1, 5);
    CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < N; k++)
        ok &= p[k][0] == -1;
    ok &= p[N - 1][1] == 5;
    for (int k = 0; k < N; k++)
        CHECK(cudaFree(p[k]));
    verdict("small", ok, "wrong values");
}

// For the accounting test: one managed buffer written, used by two launches, read back; then
// waits for a line on stdin so the daemon's session can be inspected.
static void hold(void)
{
    const int n = 1 << 20;
    int *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(int), cudaMemAttachGlobal));
    for (int i = 0; i < n; i++)
        m[i] = i;
    Pair p = {m, m};
    um_pair<<<(n + 255) / 256, 256>>>(p, n);
    um_fill<<<1, 1>>>(m, 1, 5);
    CHECK(cudaDeviceSynchronize());
    verdict("hold", m[0] == 5 && m[n - 1] == 2 * (n - 1), "wrong values");
    printf("ready\n");
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return;
    CHECK(cudaFree(m));
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"iterative", iterative}, {"zeroed", zeroed},     {"pointers", pointers},
                     {"variables", variables}, {"copies", copies},     {"no_sync_writes", no_sync_writes},
                     {"own_sigsegv", own_sigsegv}, {"own_sigset", own_sigset},
                     {"threads", threads}, {"api", api},
                     {"collision", collision}, {"small", small}, {"hold", hold}};
    setvbuf(stdout, NULL, _IONBF, 0);
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
        if (argc < 2 ? scenarios[i].fn != hold : strcmp(argv[1], scenarios[i].name) == 0)
            scenarios[i].fn();
    return g_failed;
}
