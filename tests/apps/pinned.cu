// Pinned and mapped host memory: cudaMallocHost, cudaHostAlloc, cudaHostRegister and the copies
// and kernels that use them. Usage: pinned [scenario]   (no argument runs them all; "hold" waits
// for a line on stdin holding pinned memory, for the accounting test). Self-checking: every
// scenario prints "<name> ok" or "<name> FAIL ..." and the program exits non-zero on any
// failure; the output is the same natively and under pilot.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "self_check.h"

__global__ void pinned_fill(unsigned *p, unsigned n, unsigned seed)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = seed + i * 3u;
}

__global__ void pinned_scale(unsigned *p, unsigned n, unsigned k)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] *= k;
}

static void fill(unsigned *p, unsigned n, unsigned seed)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = seed + i * 3u;
}

/* The first index where p differs from seed + 3i times k, or n. */
static unsigned mismatch(const unsigned *p, unsigned n, unsigned seed, unsigned k)
{
    for (unsigned i = 0; i < n; i++)
        if (p[i] != (seed + i * 3u) * k)
            return i;
    return n;
}

static unsigned blocks(unsigned n)
{
    return (n + 255) / 256;
}

/* cudaMallocHost: synchronous and stream-ordered copies both ways, cudaMemcpyDefault. */
static void malloc_host(void)
{
    const unsigned n = 1u << 20; /* 4 MiB: past the inline and staging sizes */
    unsigned *h, *h2, *d;
    CHECK(cudaMallocHost((void **)&h, n * 4));
    CHECK(cudaMallocHost((void **)&h2, n * 4));
    CHECK(cudaMalloc((void **)&d, n * 4));
    fill(h, n, 11);
    CHECK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    memset(h, 0, n * 4);
    CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    int ok = mismatch(h, n, 11, 1) == n;

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    fill(h, n, 23);
    memset(h2, 0, n * 4);
    CHECK(cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, s));
    pinned_scale<<<blocks(n), 256, 0, s>>>(d, n, 3);
    CHECK(cudaMemcpyAsync(h2, d, n * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    ok &= mismatch(h2, n, 23, 3) == n;

    fill(h, 4096, 5); /* small copies, direction from the pointers */
    CHECK(cudaMemcpy(d, h, 4096 * 4, cudaMemcpyDefault));
    memset(h2, 0, 4096 * 4);
    CHECK(cudaMemcpyAsync(h2, d, 4096 * 4, cudaMemcpyDefault, s));
    CHECK(cudaStreamSynchronize(s));
    ok &= mismatch(h2, 4096, 5, 1) == 4096;

    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, h + 7));
    ok &= a.type == cudaMemoryTypeHost && a.hostPointer == h + 7 && a.devicePointer == h + 7;
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(h));
    CHECK(cudaFreeHost(h2));
    verdict("malloc_host", ok, "copies or attributes differ");
}

/* cudaHostAlloc(Mapped): kernels write through the host pointer itself and through
 * cudaHostGetDevicePointer's; the host sees it after a synchronize. */
static void mapped(void)
{
    const unsigned n = 10000;
    unsigned *h, *dp, *wc;
    CHECK(cudaHostAlloc((void **)&h, n * 4, cudaHostAllocMapped));
    pinned_fill<<<blocks(n), 256>>>(h, n, 7);
    CHECK(cudaDeviceSynchronize());
    int ok = mismatch(h, n, 7, 1) == n;
    CHECK(cudaHostGetDevicePointer((void **)&dp, h, 0));
    printf("mapped devptr_is_hostptr=%d\n", dp == h);
    pinned_scale<<<blocks(n), 256>>>(dp, n, 3);
    CHECK(cudaDeviceSynchronize());
    ok &= mismatch(h, n, 7, 3) == n;
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, h + 100));
    printf("mapped flags_mapped=%d flags_wc=%d\n", !!(flags & cudaHostAllocMapped),
           !!(flags & cudaHostAllocWriteCombined));
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, h));
    ok &= a.type == cudaMemoryTypeHost && a.hostPointer == h && a.devicePointer == dp;

    /* Portable and write-combined: the host writes, a copy reads it. */
    CHECK(cudaHostAlloc((void **)&wc, n * 4, cudaHostAllocPortable | cudaHostAllocWriteCombined));
    CHECK(cudaHostGetFlags(&flags, wc));
    printf("mapped wc_flags_portable=%d flags_wc=%d\n", !!(flags & cudaHostAllocPortable),
           !!(flags & cudaHostAllocWriteCombined));
    fill(wc, n, 99);
    unsigned *d;
    CHECK(cudaMalloc((void **)&d, n * 4));
    CHECK(cudaMemcpy(d, wc, n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    ok &= mismatch(h, n, 99, 1) == n;
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(wc));
    CHECK(cudaFreeHost(h));
    verdict("mapped", ok, "kernel writes through mapped memory not seen");
}

/* cudaHostAlloc in a crowded address space: the region after a freed pinned range is taken by
 * the program (as a process with large libraries may have it taken), so the addresses a
 * driver would hand out next may be in use. Whatever the address, copies both ways, a kernel
 * through cudaHostGetDevicePointer's pointer and cudaFreeHost work. */
static void crowded(void)
{
    const unsigned n = 1u << 16;
    const size_t reserve = (size_t)256 << 20;
    unsigned *first, *h[4], *d, *dp;
    CHECK(cudaHostAlloc((void **)&first, n * 4, cudaHostAllocMapped));
    CHECK(cudaFreeHost(first));
    void *taken = mmap(first, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                       MAP_FIXED_NOREPLACE, -1, 0);
    if (taken != MAP_FAILED && taken != (void *)first) { /* an old kernel's hint: not ours */
        munmap(taken, reserve);
        taken = MAP_FAILED;
    }
    CHECK(cudaMalloc((void **)&d, n * 4));
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        CHECK(cudaHostAlloc((void **)&h[k], n * 4, cudaHostAllocMapped));
        fill(h[k], n, 40 + k);
        CHECK(cudaMemcpy(d, h[k], n * 4, cudaMemcpyHostToDevice));
        pinned_scale<<<blocks(n), 256>>>(d, n, 2);
        memset(h[k], 0, n * 4);
        CHECK(cudaMemcpy(h[k], d, n * 4, cudaMemcpyDeviceToHost));
        ok &= mismatch(h[k], n, 40 + k, 2) == n;
        CHECK(cudaHostGetDevicePointer((void **)&dp, h[k], 0));
        pinned_scale<<<blocks(n), 256>>>(dp, n, 3);
        CHECK(cudaDeviceSynchronize());
        ok &= mismatch(h[k], n, 40 + k, 6) == n;
    }
    for (int k = 0; k < 4; k++)
        CHECK(cudaFreeHost(h[k]));
    CHECK(cudaFree(d));
    if (taken != MAP_FAILED)
        munmap(taken, reserve);
    verdict("crowded", ok, "copies or kernels through the device pointer differ");
}

/* cudaHostRegister on malloc'd memory that starts inside a page: the contents and the bytes
 * around it survive, copies work, a kernel reaches it through its device pointer; after
 * cudaHostUnregister it is ordinary memory with the same contents. */
static void registered(void)
{
    const unsigned n = 50000;
    unsigned char *buf = (unsigned char *)malloc(n * 4 + 64);
    unsigned *p = (unsigned *)(buf + 12);
    memset(buf, 0xA5, 12);
    memset(buf + 12 + n * 4, 0x5A, 52);
    fill(p, n, 3);
    CHECK(cudaHostRegister(p, n * 4, cudaHostRegisterMapped));
    int ok = mismatch(p, n, 3, 1) == n && buf[0] == 0xA5 && buf[11] == 0xA5 &&
             buf[12 + n * 4] == 0x5A && buf[n * 4 + 63] == 0x5A;
    printf("registered again=%s\n", cudaGetErrorName(cudaHostRegister(p, n * 4, 0)));

    unsigned *d, *dp;
    CHECK(cudaMalloc((void **)&d, n * 4));
    CHECK(cudaMemcpy(d, p, n * 4, cudaMemcpyHostToDevice));
    memset(p, 0, n * 4);
    CHECK(cudaMemcpy(p, d, n * 4, cudaMemcpyDeviceToHost));
    ok &= mismatch(p, n, 3, 1) == n;
    CHECK(cudaHostGetDevicePointer((void **)&dp, p, 0));
    pinned_scale<<<blocks(n), 256>>>(dp, n, 5);
    CHECK(cudaDeviceSynchronize());
    ok &= mismatch(p, n, 3, 5) == n;
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p));
    ok &= a.type == cudaMemoryTypeHost && a.hostPointer == p && a.devicePointer == dp;

    CHECK(cudaHostUnregister(p));
    ok &= mismatch(p, n, 3, 5) == n && buf[0] == 0xA5 && buf[12 + n * 4] == 0x5A;
    p[0] = 1234; /* still ordinary writable memory */
    ok &= p[0] == 1234;
    printf("registered unregister_again=%s\n", cudaGetErrorName(cudaHostUnregister(p)));
    CHECK(cudaPointerGetAttributes(&a, p));
    printf("registered after type=%d\n", (int)a.type);
    CHECK(cudaFree(d));
    free(buf);
    verdict("registered", ok, "contents, copies or kernel access differ");
}

/* A large page-aligned buffer registered with default flags: stream-ordered copies both ways,
 * and a copy that only partly lies in the registered range. */
static void registered_large(void)
{
    const unsigned n = 4u << 20; /* 16 MiB */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned *p;
    if (posix_memalign((void **)&p, page, n * 4 + 2 * page) != 0)
        exit(2);
    unsigned *reg = p + page / 4; /* registered: [reg, reg + n) */
    fill(p, n + page / 2, 17);
    CHECK(cudaHostRegister(reg, n * 4, cudaHostRegisterDefault));
    unsigned *d;
    CHECK(cudaMalloc((void **)&d, n * 4 + 2 * page));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(d, reg, n * 4, cudaMemcpyHostToDevice, s));
    pinned_scale<<<blocks(n), 256, 0, s>>>(d, n, 2);
    CHECK(cudaMemcpyAsync(reg, d, n * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    int ok = 1;
    for (unsigned i = 0; i < n && ok; i++)
        ok = reg[i] == (17 + (i + (unsigned)page / 4) * 3u) * 2;
    /* Partly registered: from the page before the range into it, both ways. */
    fill(p, 2 * (unsigned)page / 4, 40);
    CHECK(cudaMemcpy(d, p, 2 * page, cudaMemcpyHostToDevice));
    memset(p, 0, 2 * page);
    CHECK(cudaMemcpy(p, d, 2 * page, cudaMemcpyDeviceToHost));
    ok &= mismatch(p, 2 * (unsigned)page / 4, 40, 1) == 2 * (unsigned)page / 4;
    CHECK(cudaHostUnregister(reg));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    free(p);
    verdict("registered_large", ok, "stream-ordered or partly registered copies differ");
}

static void errors(void)
{
    unsigned *h;
    void *dp;
    unsigned flags;
    char *plain = (char *)malloc(4096);
    printf("errors freehost_plain=%s\n", cudaGetErrorName(cudaFreeHost(plain)));
    CHECK(cudaMallocHost((void **)&h, 4096));
    CHECK(cudaFreeHost(h));
    printf("errors freehost_twice=%s\n", cudaGetErrorName(cudaFreeHost(h)));
    printf("errors devptr_plain=%s\n", cudaGetErrorName(cudaHostGetDevicePointer(&dp, plain, 0)));
    printf("errors flags_plain=%s\n", cudaGetErrorName(cudaHostGetFlags(&flags, plain)));
    printf("errors unregister_plain=%s\n", cudaGetErrorName(cudaHostUnregister(plain)));
    printf("errors freehost_null=%s\n", cudaGetErrorName(cudaFreeHost(NULL)));
    cudaGetLastError();
    free(plain);
    verdict("errors", 1, "");
}

struct Writer {
    volatile unsigned *word;
    volatile int stop;
    unsigned written;
};

static void *writer(void *arg)
{
    Writer *w = (Writer *)arg;
    while (!w->stop)
        *w->word = ++w->written;
    return NULL;
}

/* Another thread keeps writing to a word in the same page as a buffer that is registered and
 * unregistered again and again: no write is lost and none faults the program. */
static void moving(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned *block;
    if (posix_memalign((void **)&block, page, 2 * page) != 0)
        exit(2);
    Writer w = {block, 0, 0};
    unsigned *buf = block + 16; /* the rest of the two pages */
    const unsigned n = 2 * (unsigned)page / 4 - 16;
    fill(buf, n, 8);
    pthread_t t;
    pthread_create(&t, NULL, writer, &w);
    int ok = 1;
    for (int i = 0; i < 50 && ok; i++) {
        CHECK(cudaHostRegister(buf, n * 4, cudaHostRegisterMapped));
        CHECK(cudaHostUnregister(buf));
        ok = mismatch(buf, n, 8, 1) == n;
    }
    w.stop = 1;
    pthread_join(t, NULL);
    ok &= *w.word == w.written;
    free(block);
    verdict("moving", ok, "a write or the buffer's contents were lost");
}

/* After fork, cudaMallocHost memory is shared with the child, as natively (the H100 driver's
 * pinned allocations are shared mappings), and registered memory is the child's own copy, as
 * the program's malloc'd memory would be. */
static void forked(void)
{
    unsigned *h, *reg = (unsigned *)aligned_alloc(4096, 4096);
    CHECK(cudaMallocHost((void **)&h, 4096));
    CHECK(cudaHostRegister(reg, 4096, cudaHostRegisterDefault));
    h[0] = 1;
    reg[0] = 1;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        h[0] = 2;
        reg[0] = 2;
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    int ok = h[0] == 2 && reg[0] == 1;
    CHECK(cudaHostUnregister(reg));
    CHECK(cudaFreeHost(h));
    free(reg);
    verdict("forked", ok, "the child's writes reached the parent differently from native");
}

/* Holds 8 MiB of cudaMallocHost memory, copied to the device once, until a line arrives on
 * stdin. */
static void hold(void)
{
    void *h, *d;
    CHECK(cudaMallocHost(&h, 8 << 20));
    CHECK(cudaMalloc(&d, 8 << 20));
    CHECK(cudaMemcpy(d, h, 8 << 20, cudaMemcpyHostToDevice));
    printf("hold ready\n");
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        exit(3);
    CHECK(cudaFreeHost(h));
    CHECK(cudaFree(d));
    printf("hold ok\n");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"malloc_host", malloc_host}, {"mapped", mapped}, {"registered", registered},
                     {"registered_large", registered_large}, {"moving", moving},
                     {"forked", forked}, {"errors", errors}, {"crowded", crowded},
                     {"hold", hold}};
    setvbuf(stdout, NULL, _IONBF, 0);
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
        if (argc < 2 ? scenarios[i].fn != hold : strcmp(argv[1], scenarios[i].name) == 0)
            scenarios[i].fn();
    return g_failed;
}
