// multistream: four streams pipelining chunked copies and kernels, with cross-stream event
// dependencies and the legacy default stream's implicit ordering against blocking streams.
//   s0, s1  cudaStreamCreate (blocking: ordered with the legacy stream)
//   s2, s3  cudaStreamCreateWithFlags(cudaStreamNonBlocking)
// Phase 1: each stream copies its part of a pageable host buffer in chunks H2D, runs a kernel on
//   each chunk, copies it back D2H and records an event per chunk. s3 waits for s1's last event
//   and combines s1's output with its own; s0 waits for s2's last event and does the same with
//   s2's output. Nothing synchronizes the host in between.
// Phase 2 (legacy stream, no explicit synchronization in any step):
//   a) slow kernel on s0 writes; cudaMemcpy (legacy stream) reads it back
//   b) slow kernel on the legacy stream writes; a kernel on s1 reads it; async copy on s1
//   c) slow kernel on s1 writes; a kernel on the legacy stream reads it; cudaMemcpy reads that
//   d) cudaMemset on the legacy stream after a slow write by s0; a kernel on s0 reads it
// "Slow" kernels run thousands of dependent integer steps per element (about a millisecond),
// so a missing dependency shows up as stale data. All arithmetic is integer (mod 2^32) and the
// host recomputes every expected value in closed form, so the output is the same on every run.
// Prints checksums per stream and step, then PASS/FAIL.
#include <cuda_runtime.h>

#include <stdint.h>
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

#define NSTREAMS 4
#define CHUNKS 4
#define PER_STREAM (1 << 20)  // uint32 elements per stream
#define CHUNK (PER_STREAM / CHUNKS)
#define LIGHT_ITERS 64
#define HEAVY_ITERS 20000
#define LCG_A 1664525u
#define LCG_B 1013904223u
#define THREADS 256

// out[i] = lcg^iters(in[i] ^ salt): `iters` dependent steps of x = A*x + B (mod 2^32).
__global__ void lcg_steps(const uint32_t *in, uint32_t *out, int n, int iters, uint32_t salt)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t x = in[i] ^ salt;
        for (int s = 0; s < iters; s++)
            x = x * LCG_A + LCG_B;
        out[i] = x;
    }
}

// out[i] = lcg^iters(i * 2654435761 + seed): writes without reading anything.
__global__ void lcg_fill(uint32_t *out, int n, int iters, uint32_t seed)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u + seed;
        for (int s = 0; s < iters; s++)
            x = x * LCG_A + LCG_B;
        out[i] = x;
    }
}

// out[i] = a[i] ^ (b[i] << 7 | b[i] >> 25)
__global__ void combine(const uint32_t *a, const uint32_t *b, uint32_t *out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = a[i] ^ ((b[i] << 7) | (b[i] >> 25));
}

// ---- host side: the same functions in closed form ----

typedef struct {
    uint32_t a, b;  // x -> a*x + b
} Affine;

// f after g: x -> f.a * (g.a * x + g.b) + f.b
static Affine compose(Affine f, Affine g)
{
    Affine r;
    r.a = f.a * g.a;
    r.b = f.a * g.b + f.b;
    return r;
}

// lcg applied n times, by repeated squaring of the affine map.
static Affine lcg_power(int n)
{
    Affine result = {1u, 0u}, base = {LCG_A, LCG_B};
    while (n > 0) {
        if (n & 1)
            result = compose(base, result);
        base = compose(base, base);
        n >>= 1;
    }
    return result;
}

static uint32_t apply(Affine f, uint32_t x)
{
    return f.a * x + f.b;
}

static uint32_t rot7(uint32_t b)
{
    return (b << 7) | (b >> 25);
}

static uint32_t input_value(size_t i)
{
    uint32_t x = (uint32_t)i * 0x9e3779b1u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return x;
}

static unsigned long long sum32(const uint32_t *p, size_t n)
{
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

static int failed;

// Compares got[] with want[], prints "<label>: checksum <sum> wrong <count>".
static void report(const char *label, const uint32_t *got, const uint32_t *want, size_t n)
{
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && wrong++ == 0)
            first = i;
    printf("%s: checksum %llu wrong %zu", label, sum32(got, n), wrong);
    if (wrong)
        printf(" (first at %zu: got %u want %u)", first, got[first], want[first]);
    printf("\n");
    if (wrong)
        failed = 1;
}

static uint32_t *host_alloc(size_t n)
{
    uint32_t *p = (uint32_t *)malloc(n * sizeof(uint32_t));
    if (!p) {
        printf("host allocation failed\nFAIL\n");
        exit(1);
    }
    memset(p, 0, n * sizeof(uint32_t));  // touched: pageable memory that is really there
    return p;
}

static int blocks_for(int n)
{
    int b = (n + THREADS - 1) / THREADS;
    return b > 1024 ? 1024 : b;
}

int main(void)
{
    const size_t total = (size_t)NSTREAMS * PER_STREAM;
    const size_t bytes = PER_STREAM * sizeof(uint32_t);
    cudaStream_t s[NSTREAMS];
    CHECK(cudaStreamCreate(&s[0]));
    CHECK(cudaStreamCreate(&s[1]));
    CHECK(cudaStreamCreateWithFlags(&s[2], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s[3], cudaStreamNonBlocking));
    const unsigned flags[NSTREAMS] = {cudaStreamDefault, cudaStreamDefault, cudaStreamNonBlocking,
                                      cudaStreamNonBlocking};

    cudaEvent_t ev[NSTREAMS][CHUNKS];
    for (int i = 0; i < NSTREAMS; i++)
        for (int c = 0; c < CHUNKS; c++)
            CHECK(cudaEventCreateWithFlags(&ev[i][c], cudaEventDisableTiming));

    uint32_t *h_in = host_alloc(total), *h_out = host_alloc(total);
    uint32_t *h_cross3 = host_alloc(PER_STREAM), *h_cross0 = host_alloc(PER_STREAM);
    uint32_t *want = host_alloc(total), *want_x = host_alloc(PER_STREAM);
    for (size_t i = 0; i < total; i++)
        h_in[i] = input_value(i);

    uint32_t *d_in[NSTREAMS], *d_out[NSTREAMS], *d_cross3, *d_cross0;
    for (int i = 0; i < NSTREAMS; i++) {
        CHECK(cudaMalloc(&d_in[i], bytes));
        CHECK(cudaMalloc(&d_out[i], bytes));
    }
    CHECK(cudaMalloc(&d_cross3, bytes));
    CHECK(cudaMalloc(&d_cross0, bytes));

    // ---- phase 1: chunked pipelines, streams interleaved chunk by chunk ----
    // Stream 1 runs heavy kernels so that s3's wait on it matters; the others light ones.
    for (int c = 0; c < CHUNKS; c++) {
        for (int i = 0; i < NSTREAMS; i++) {
            const size_t off = (size_t)c * CHUNK;
            const int iters = i == 1 ? HEAVY_ITERS : LIGHT_ITERS;
            CHECK(cudaMemcpyAsync(d_in[i] + off, h_in + (size_t)i * PER_STREAM + off,
                                  CHUNK * sizeof(uint32_t), cudaMemcpyHostToDevice, s[i]));
            lcg_steps<<<blocks_for(CHUNK), THREADS, 0, s[i]>>>(d_in[i] + off, d_out[i] + off,
                                                               CHUNK, iters, (uint32_t)i);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpyAsync(h_out + (size_t)i * PER_STREAM + off, d_out[i] + off,
                                  CHUNK * sizeof(uint32_t), cudaMemcpyDeviceToHost, s[i]));
            CHECK(cudaEventRecord(ev[i][c], s[i]));
        }
    }
    // s3 (non-blocking) needs all of s1's output; s0 (blocking) all of s2's.
    CHECK(cudaStreamWaitEvent(s[3], ev[1][CHUNKS - 1], 0));
    combine<<<blocks_for(PER_STREAM), THREADS, 0, s[3]>>>(d_out[1], d_out[3], d_cross3,
                                                          PER_STREAM);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_cross3, d_cross3, bytes, cudaMemcpyDeviceToHost, s[3]));
    CHECK(cudaStreamWaitEvent(s[0], ev[2][CHUNKS - 1], 0));
    combine<<<blocks_for(PER_STREAM), THREADS, 0, s[0]>>>(d_out[2], d_out[0], d_cross0,
                                                          PER_STREAM);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_cross0, d_cross0, bytes, cudaMemcpyDeviceToHost, s[0]));
    for (int i = 0; i < NSTREAMS; i++)
        CHECK(cudaStreamSynchronize(s[i]));
    for (int i = 0; i < NSTREAMS; i++)
        printf("stream %d query after sync: %s\n", i, cudaGetErrorName(cudaStreamQuery(s[i])));
    printf("last chunk event query: %s\n", cudaGetErrorName(cudaEventQuery(ev[1][CHUNKS - 1])));

    const Affine light = lcg_power(LIGHT_ITERS), heavy = lcg_power(HEAVY_ITERS);
    for (int i = 0; i < NSTREAMS; i++) {
        const Affine f = i == 1 ? heavy : light;
        for (size_t j = 0; j < PER_STREAM; j++) {
            const size_t g = (size_t)i * PER_STREAM + j;
            want[g] = apply(f, h_in[g] ^ (uint32_t)i);
        }
        char label[64];
        snprintf(label, sizeof label, "phase1 stream %d (%s)", i,
                 flags[i] & cudaStreamNonBlocking ? "non-blocking" : "blocking");
        report(label, h_out + (size_t)i * PER_STREAM, want + (size_t)i * PER_STREAM, PER_STREAM);
    }
    for (size_t j = 0; j < PER_STREAM; j++)
        want_x[j] = want[1 * PER_STREAM + j] ^ rot7(want[3 * PER_STREAM + j]);
    report("phase1 s3 after s1's event", h_cross3, want_x, PER_STREAM);
    for (size_t j = 0; j < PER_STREAM; j++)
        want_x[j] = want[2 * PER_STREAM + j] ^ rot7(want[0 * PER_STREAM + j]);
    report("phase1 s0 after s2's event", h_cross0, want_x, PER_STREAM);

    // ---- phase 2: the legacy stream against blocking streams, no explicit synchronization ----
    const int n = PER_STREAM;
    uint32_t *d_a = d_in[0], *d_b = d_in[1], *d_c = d_in[2], *d_d = d_in[3];
    uint32_t *h = h_out;  // reused: phase 1 is checked
    const uint32_t *h_a = h, *h_b = h + n, *h_c = h + 2 * (size_t)n, *h_d = h + 3 * (size_t)n;
    memset(h, 0, total * sizeof(uint32_t));

    // a) blocking stream writes, legacy cudaMemcpy reads
    lcg_fill<<<blocks_for(n), THREADS, 0, s[0]>>>(d_a, n, HEAVY_ITERS, 11u);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h + 0, d_a, bytes, cudaMemcpyDeviceToHost));

    // b) legacy stream writes, blocking stream s1 reads, async copy on s1
    lcg_fill<<<blocks_for(n), THREADS>>>(d_out[0], n, HEAVY_ITERS, 22u);
    CHECK(cudaGetLastError());
    lcg_steps<<<blocks_for(n), THREADS, 0, s[1]>>>(d_out[0], d_b, n, LIGHT_ITERS, 5u);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h + n, d_b, bytes, cudaMemcpyDeviceToHost, s[1]));
    CHECK(cudaStreamSynchronize(s[1]));

    // c) blocking stream s1 writes, legacy kernel reads, legacy cudaMemcpy reads that
    lcg_fill<<<blocks_for(n), THREADS, 0, s[1]>>>(d_out[1], n, HEAVY_ITERS, 33u);
    CHECK(cudaGetLastError());
    lcg_steps<<<blocks_for(n), THREADS, 0, 0>>>(d_out[1], d_c, n, LIGHT_ITERS, 6u);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h + 2 * (size_t)n, d_c, bytes, cudaMemcpyDeviceToHost));

    // d) blocking s0 writes slowly, legacy cudaMemset overwrites the first half, s0 reads all
    lcg_fill<<<blocks_for(n), THREADS, 0, s[0]>>>(d_out[2], n, HEAVY_ITERS, 44u);
    CHECK(cudaGetLastError());
    CHECK(cudaMemset(d_out[2], 0x3c, bytes / 2));
    lcg_steps<<<blocks_for(n), THREADS, 0, s[0]>>>(d_out[2], d_d, n, LIGHT_ITERS, 7u);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h + 3 * (size_t)n, d_d, bytes, cudaMemcpyDeviceToHost, s[0]));
    CHECK(cudaStreamSynchronize(s[0]));

    for (int j = 0; j < n; j++)
        want_x[j] = apply(heavy, (uint32_t)j * 2654435761u + 11u);
    report("phase2a s0 kernel -> legacy cudaMemcpy", h_a, want_x, n);
    for (int j = 0; j < n; j++)
        want_x[j] = apply(light, apply(heavy, (uint32_t)j * 2654435761u + 22u) ^ 5u);
    report("phase2b legacy kernel -> s1 kernel", h_b, want_x, n);
    for (int j = 0; j < n; j++)
        want_x[j] = apply(light, apply(heavy, (uint32_t)j * 2654435761u + 33u) ^ 6u);
    report("phase2c s1 kernel -> legacy kernel -> cudaMemcpy", h_c, want_x, n);
    for (int j = 0; j < n; j++) {
        const uint32_t v = j < n / 2 ? 0x3c3c3c3cu : apply(heavy, (uint32_t)j * 2654435761u + 44u);
        want_x[j] = apply(light, v ^ 7u);
    }
    report("phase2d s0 kernel -> legacy memset -> s0 kernel", h_d, want_x, n);

    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < NSTREAMS; i++) {
        for (int c = 0; c < CHUNKS; c++)
            CHECK(cudaEventDestroy(ev[i][c]));
        CHECK(cudaStreamDestroy(s[i]));
        CHECK(cudaFree(d_in[i]));
        CHECK(cudaFree(d_out[i]));
    }
    CHECK(cudaFree(d_cross3));
    CHECK(cudaFree(d_cross0));
    free(h_in);
    free(h_out);
    free(h_cross3);
    free(h_cross0);
    free(want);
    free(want_x);
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
