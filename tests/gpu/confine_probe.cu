// The attack of issue 27 item 10, for tests/gpu/confine_check.py: a kernel given another tenant's
// device address as an integer (computed, so no pointer check of pilot's sees it) reads that
// tenant's memory when both share a CUDA context, and cannot when each has an address space of
// its own (pilotd's confined mode: an engine per tenant over MPS).
//
//   victim ADDR_FILE PATTERN STOP_FILE  64 MiB (cudaMalloc) filled with the 64-bit PATTERN (hex);
//                                       its device address written to ADDR_FILE; then idle until
//                                       STOP_FILE exists (at most 300 s); then the buffer is read
//                                       back and a kernel sums it: prints "victim: ready 0x..",
//                                       then "victim: intact" or "victim: changed <words>" or
//                                       "victim: <error>", then "victim: kernel ok" or the error
//   scan ADDR PATTERN                   a kernel counting the 8-byte words equal to PATTERN in
//                                       [ADDR, ADDR + 64 MiB) into its one allocation (a
//                                       counter): prints "scan: own 0x<counter>" then
//                                       "scan: <error> <bytes>" (bytes in matching words; "-"
//                                       when the kernel failed). Where each tenant has its own
//                                       address space, that range is mostly unmapped for it.
//   busy SECONDS                        ~20 ms one-block kernels back to back: "busy: ok <n>" or
//                                       "busy: <error> after <s> s (<n> kernels)"
//   work                                a small kernel, its result checked: "work: ok" or the error
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const size_t BYTES = 64u << 20;
static const size_t WORDS = BYTES / 8;

__global__ void fill(unsigned long long *p, size_t n, unsigned long long pattern)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern;
}

// `addr` is an integer: to pilot it is a number, not a pointer of the session
__global__ void scan(unsigned long long addr, size_t n, unsigned long long pattern,
                     unsigned long long *count)
{
    const volatile unsigned long long *p = (const volatile unsigned long long *)addr;
    unsigned long long found = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        found += p[i] == pattern;
    atomicAdd(count, found);
}

__global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int victim(const char *addr_file, unsigned long long pattern, const char *stop_file)
{
    unsigned long long *buf = NULL;
    cudaError_t err = cudaMalloc(&buf, BYTES);
    if (!err) {
        fill<<<256, 256>>>(buf, WORDS, pattern);
        err = cudaDeviceSynchronize();
    }
    if (err) {
        printf("victim: %s\n", cudaGetErrorName(err));
        return 0;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", addr_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "0x%llx\n", (unsigned long long)buf) < 0 || fclose(f) || rename(tmp, addr_file)) {
        perror(addr_file);
        return 1;
    }
    printf("victim: ready 0x%llx\n", (unsigned long long)buf);
    fflush(stdout);
    struct stat st;
    for (double t0 = now(); stat(stop_file, &st) != 0 && now() - t0 < 300;)
        usleep(20000);
    unsigned long long *host = (unsigned long long *)malloc(BYTES);
    err = cudaMemcpy(host, buf, BYTES, cudaMemcpyDeviceToHost);
    if (err) {
        printf("victim: %s\n", cudaGetErrorName(err));
    } else {
        size_t changed = 0;
        for (size_t i = 0; i < WORDS; i++)
            changed += host[i] != pattern;
        if (changed)
            printf("victim: changed %zu\n", changed);
        else
            printf("victim: intact\n");
    }
    unsigned long long *count = NULL, got = 0;
    err = cudaMalloc(&count, sizeof *count);
    if (!err)
        err = cudaMemset(count, 0, sizeof *count);
    if (!err) {
        scan<<<128, 256>>>((unsigned long long)buf, WORDS, pattern, count);
        err = cudaMemcpy(&got, count, sizeof got, cudaMemcpyDeviceToHost);
    }
    if (!err && got != WORDS)
        printf("victim: kernel counted %llu of %zu\n", got, WORDS);
    else
        printf("victim: kernel %s\n", err ? cudaGetErrorName(err) : "ok");
    free(host);
    return 0;
}

static int scan_other(unsigned long long addr, unsigned long long pattern)
{
    unsigned long long *count = NULL, got = 0;
    cudaError_t err = cudaMalloc(&count, sizeof *count);  // its only allocation
    if (!err)
        err = cudaMemset(count, 0, sizeof *count);
    printf("scan: own 0x%llx\n", (unsigned long long)count);
    fflush(stdout);
    if (!err) {
        scan<<<128, 256>>>(addr, WORDS, pattern, count);
        err = cudaDeviceSynchronize();
    }
    if (!err)
        err = cudaMemcpy(&got, count, sizeof got, cudaMemcpyDeviceToHost);
    if (err)
        printf("scan: %s -\n", cudaGetErrorName(err));
    else
        printf("scan: cudaSuccess %llu\n", got * 8);
    return 0;
}

static int busy(double seconds)
{
    enum { KEPT = 4096 };
    static double ended[KEPT];  // when each kernel's synchronization returned (s after t0)
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    double t0 = now();
    long n = 0;
    cudaError_t err = cudaSuccess;
    while (!err && now() - t0 < seconds) {
        spin<<<1, 32>>>(34000000LL);  // ~20 ms at 1.7 GHz
        err = cudaDeviceSynchronize();
        if (!err && n < KEPT)
            ended[n] = now() - t0;
        n += !err;
    }
    if (err)
        printf("busy: %s after %.3f s (%ld kernels)\n", cudaGetErrorName(err), now() - t0, n);
    else
        printf("busy: ok %ld\n", n);
    // when it ran slow (issue 27: beside another tenant's fault): each kernel longer than 40 ms,
    // as "start+duration" in seconds from its start (wall clock at its start given)
    printf("busy: started %.3f; kernels over 40 ms:", (double)wall.tv_sec + wall.tv_nsec * 1e-9);
    for (long i = 0; i < n && i < KEPT; i++) {
        double begin = i ? ended[i - 1] : 0.0, took = ended[i] - begin;
        if (took > 0.04)
            printf(" %.3f+%.3f", begin, took);
    }
    printf("\n");
    return 0;
}

static int work(void)
{
    unsigned long long *buf = NULL, *count = NULL, got = 0;
    cudaError_t err = cudaMalloc(&buf, 1 << 20);
    if (!err)
        err = cudaMalloc(&count, sizeof *count);
    if (!err)
        err = cudaMemset(count, 0, sizeof *count);
    if (!err) {
        fill<<<16, 256>>>(buf, (1 << 20) / 8, 42);
        scan<<<16, 256>>>((unsigned long long)buf, (1 << 20) / 8, 42, count);
        err = cudaMemcpy(&got, count, sizeof got, cudaMemcpyDeviceToHost);
    }
    if (err)
        printf("work: %s\n", cudaGetErrorName(err));
    else
        printf("work: %s\n", got == (1 << 20) / 8 ? "ok" : "wrong");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "work";
    if (!strcmp(mode, "victim") && argc == 5)
        return victim(argv[2], strtoull(argv[3], NULL, 16), argv[4]);
    if (!strcmp(mode, "scan") && argc == 4)
        return scan_other(strtoull(argv[2], NULL, 16), strtoull(argv[3], NULL, 16));
    if (!strcmp(mode, "busy") && argc == 3)
        return busy(atof(argv[2]));
    if (!strcmp(mode, "work"))
        return work();
    fprintf(stderr, "usage: %s victim ADDR_FILE PATTERN STOP_FILE | scan ADDR PATTERN | busy SECONDS | work\n",
            argv[0]);
    return 2;
}
