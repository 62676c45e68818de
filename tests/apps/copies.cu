// copies: cudaMemcpy and cudaMemcpyAsync in every direction (H2D, D2D, D2H, H2H), each with
// its explicit kind and with cudaMemcpyDefault, into and out of the middle of allocations whose
// guard bytes must survive. Sizes come from argv (bytes), or the default list below.
// Prints one line per size and PASS/FAIL.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define OFF 37           // copies start this far into each buffer (unaligned on purpose)
#define DEV_GUARD 0x5a   // device guard bytes, set once per size with cudaMemset
#define HOST_GUARD 0xc3  // host guard bytes

static const size_t default_sizes[] = {
    1, 3, 4096, 65535, 65536, 65537, (1u << 20) + 7, 16u << 20, (64u << 20) + 1, 256u << 20,
};

// Pattern of round r for a copy of `size` bytes; 131 is odd, so it has period 256.
static void fill_pattern(unsigned char *p, size_t size, int r)
{
    unsigned char v = (unsigned char)((size + 7u * (unsigned)r) & 0xff);
    for (size_t i = 0; i < size; i++) {
        p[i] = v;
        v = (unsigned char)(v + 131);
    }
}

static int check_bytes(const char *what, size_t size, const unsigned char *got,
                       const unsigned char *want, size_t n)
{
    if (memcmp(got, want, n) == 0)
        return 0;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    printf("size %zu: %s differs at byte %zu: got %d want %d\n", size, what, i, got[i], want[i]);
    return 1;
}

static int check_fill(const char *what, size_t size, const unsigned char *got, int value,
                      size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (got[i] != value) {
            printf("size %zu: %s guard byte %zu is %d, want %d\n", size, what, i, got[i], value);
            return 1;
        }
    }
    return 0;
}

// Device guards: the OFF bytes before and after [OFF, OFF+size) must still be DEV_GUARD.
static int check_dev_guards(const char *what, size_t size, const unsigned char *dev)
{
    unsigned char head[OFF], tail[OFF];
    CHECK(cudaMemcpy(head, dev, OFF, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(tail, dev + OFF + size, OFF, cudaMemcpyDeviceToHost));
    return check_fill(what, size, head, DEV_GUARD, OFF) |
           check_fill(what, size, tail, DEV_GUARD, OFF);
}

static unsigned long long pattern_sum(const unsigned char *p, size_t size)
{
    unsigned long long sum = 0;
    for (size_t i = 0; i < size; i++)
        sum += p[i];
    return sum;
}

// One size: four rounds (explicit kinds / cudaMemcpyDefault, synchronous / async on a stream),
// each H2D into the middle of dev_a, D2D into the middle of dev_b, D2H into the middle of a
// guarded host buffer, then H2H into the middle of another guarded host buffer.
static int run_size(size_t size, cudaStream_t stream)
{
    const size_t total = size + 2 * OFF;
    unsigned char *src = (unsigned char *)malloc(size);
    unsigned char *dst = (unsigned char *)malloc(total);
    unsigned char *dst2 = (unsigned char *)malloc(total);
    if (!src || !dst || !dst2) {
        printf("size %zu: host allocation failed\n", size);
        free(src);
        free(dst);
        free(dst2);
        return 1;
    }
    unsigned char *dev_a, *dev_b;
    CHECK(cudaMalloc(&dev_a, total));
    CHECK(cudaMalloc(&dev_b, total));
    CHECK(cudaMemset(dev_a, DEV_GUARD, total));
    CHECK(cudaMemset(dev_b, DEV_GUARD, total));

    int bad = 0;
    for (int r = 0; r < 4 && !bad; r++) {
        const int use_default = r & 1, use_async = r >> 1;
        const cudaMemcpyKind h2d = use_default ? cudaMemcpyDefault : cudaMemcpyHostToDevice;
        const cudaMemcpyKind d2d = use_default ? cudaMemcpyDefault : cudaMemcpyDeviceToDevice;
        const cudaMemcpyKind d2h = use_default ? cudaMemcpyDefault : cudaMemcpyDeviceToHost;
        const cudaMemcpyKind h2h = use_default ? cudaMemcpyDefault : cudaMemcpyHostToHost;
        char what[64];
        snprintf(what, sizeof what, "round %d (%s, %s)", r, use_default ? "default" : "explicit",
                 use_async ? "async" : "sync");

        fill_pattern(src, size, r);
        memset(dst, HOST_GUARD, total);
        memset(dst2, HOST_GUARD, total);
        if (use_async) {
            CHECK(cudaMemcpyAsync(dev_a + OFF, src, size, h2d, stream));
            CHECK(cudaMemcpyAsync(dev_b + OFF, dev_a + OFF, size, d2d, stream));
            CHECK(cudaMemcpyAsync(dst + OFF, dev_b + OFF, size, d2h, stream));
            CHECK(cudaMemcpyAsync(dst2 + OFF, dst + OFF, size, h2h, stream));
            CHECK(cudaStreamSynchronize(stream));
        } else {
            CHECK(cudaMemcpy(dev_a + OFF, src, size, h2d));
            CHECK(cudaMemcpy(dev_b + OFF, dev_a + OFF, size, d2d));
            CHECK(cudaMemcpy(dst + OFF, dev_b + OFF, size, d2h));
            CHECK(cudaMemcpy(dst2 + OFF, dst + OFF, size, h2h));
        }
        char step[96];
        snprintf(step, sizeof step, "%s d2h", what);
        bad |= check_bytes(step, size, dst + OFF, src, size);
        bad |= check_fill(step, size, dst, HOST_GUARD, OFF);
        bad |= check_fill(step, size, dst + OFF + size, HOST_GUARD, OFF);
        snprintf(step, sizeof step, "%s h2h", what);
        bad |= check_bytes(step, size, dst2 + OFF, src, size);
        bad |= check_fill(step, size, dst2, HOST_GUARD, OFF);
        bad |= check_fill(step, size, dst2 + OFF + size, HOST_GUARD, OFF);
        snprintf(step, sizeof step, "%s device a", what);
        bad |= check_dev_guards(step, size, dev_a);
        snprintf(step, sizeof step, "%s device b", what);
        bad |= check_dev_guards(step, size, dev_b);
    }
    if (!bad)
        printf("size %zu: ok sum %llu\n", size, pattern_sum(dst2 + OFF, size));

    CHECK(cudaFree(dev_a));
    CHECK(cudaFree(dev_b));
    free(src);
    free(dst);
    free(dst2);
    return bad;
}

int main(int argc, char **argv)
{
    size_t sizes[64];
    int nsizes = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && nsizes < 64; i++) {
            char *end;
            unsigned long long v = strtoull(argv[i], &end, 0);
            if (*end != '\0' || v == 0) {
                printf("bad size '%s' (want a byte count > 0)\nFAIL\n", argv[i]);
                return 2;
            }
            sizes[nsizes++] = (size_t)v;
        }
    } else {
        for (size_t i = 0; i < sizeof default_sizes / sizeof default_sizes[0]; i++)
            sizes[nsizes++] = default_sizes[i];
    }

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    int failed = 0;
    for (int i = 0; i < nsizes; i++) {
        failed |= run_size(sizes[i], stream);
        fflush(stdout);
    }
    CHECK(cudaStreamDestroy(stream));
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
