// symbols: __device__ and __constant__ variables through the runtime's symbol API.
//   - a __constant__ coefficient table written with cudaMemcpyToSymbol (in two halves, with an
//     offset) and read by a kernel;
//   - a __device__ counter bumped by kernels with atomicAdd, read with cudaMemcpyFromSymbol;
//   - an initialized __device__ int, a namespaced __device__ double and a static __device__ int,
//     read and written by a kernel and from the host (async variants on a stream);
//   - a 200000-byte __device__ array (copies larger than one message), reached both as a symbol
//     and through cudaGetSymbolAddress + cudaMemcpy/cudaMemset, and device-to-device copies;
//   - error cases: ranges past a variable's end, host pointers that are not symbols, copy
//     directions a symbol copy does not take.
// Prints exact values and error names only (native and pilot runs must match), then PASS.
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

#define N_POLY 1000
#define BIG_N 50000

__constant__ float coeffs[16];
__device__ int counter;
__device__ int initialized = 42;
namespace ns {
__device__ double value;
}
static __device__ int hidden;
__device__ unsigned int big[BIG_N];

static int failed;
static int not_a_symbol = 7; // a host variable nvcc never registered

static void expect(int ok, const char *what)
{
    if (!ok) {
        printf("check failed: %s\n", what);
        failed = 1;
    }
}

// Prints "<label>: <error name>" and the last error it left (cleared), returns the error.
static cudaError_t show(const char *label, cudaError_t e)
{
    cudaError_t last = cudaGetLastError();
    printf("%s: %s (last %s)\n", label, cudaGetErrorName(e), cudaGetErrorName(last));
    return e;
}

// y[i] = sum_j coeffs[j] * x[i]^j, by Horner's rule with one rounding per operation.
__global__ void poly(const float *x, float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float acc = 0.0f;
        for (int j = 15; j >= 0; --j)
            acc = __fadd_rn(__fmul_rn(acc, x[i]), coeffs[j]);
        y[i] = acc;
    }
}

// counter += number of i < n covered by the grid with i % m == 0.
__global__ void count_multiples(int n, int m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i % m == 0)
        atomicAdd(&counter, 1);
}

// One thread reads the scalars into out, then updates them.
__global__ void update_vars(int add, int *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = initialized;
        out[1] = hidden;
        initialized += add;
        hidden = hidden * 2 + add;
        ns::value = __dadd_rn(__dmul_rn(ns::value, 1.5), (double)add);
    }
}

// big[i] = big[i] * 3 + i over a grid-stride loop.
__global__ void big_update(void)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < BIG_N; i += gridDim.x * blockDim.x)
        big[i] = big[i] * 3u + (unsigned)i;
}

static unsigned long long sum_u32(const unsigned *v, int n)
{
    unsigned long long s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return s;
}

static void constant_table(void)
{
    size_t size = 0;
    CHECK(cudaGetSymbolSize(&size, coeffs));
    printf("coeffs size %zu\n", size);
    float c[16], back[16];
    for (int j = 0; j < 16; j++)
        c[j] = (float)((j % 2 ? -1 : 1) * (j + 1)) / 16.0f;
    CHECK(cudaMemcpyToSymbol(coeffs, c, 8 * sizeof(float)));
    CHECK(cudaMemcpyToSymbol(coeffs, c + 8, 8 * sizeof(float), 8 * sizeof(float),
                             cudaMemcpyHostToDevice));
    memset(back, 0, sizeof back);
    CHECK(cudaMemcpyFromSymbol(back, coeffs, 6 * sizeof(float), 10 * sizeof(float)));
    CHECK(cudaMemcpyFromSymbol(back + 6, coeffs, 10 * sizeof(float), 0,
                               cudaMemcpyDeviceToHost));
    printf("coeffs back [10] %g [15] %g [16] %g [25] %g\n", back[0], back[5], back[6], back[15]);
    expect(memcmp(back, c + 10, 6 * sizeof(float)) == 0 &&
               memcmp(back + 6, c, 10 * sizeof(float)) == 0,
           "coeffs read back");

    float hx[N_POLY], hy[N_POLY];
    for (int i = 0; i < N_POLY; i++)
        hx[i] = (float)(i % 200 - 100) / 128.0f;
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, sizeof hx));
    CHECK(cudaMalloc(&dy, sizeof hy));
    CHECK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    poly<<<(N_POLY + 255) / 256, 256>>>(dx, dy, N_POLY);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N_POLY; i++)
        sum += (double)hy[i];
    printf("poly y[0] %.9g y[150] %.9g y[999] %.9g sum %.17g\n", hy[0], hy[150], hy[999], sum);

    // A new table: the next launch must see it.
    for (int j = 0; j < 16; j++)
        c[j] = j == 1 ? 2.0f : 0.0f; // y = 2x
    CHECK(cudaMemcpyToSymbol(coeffs, c, sizeof c, 0, cudaMemcpyDefault));
    poly<<<(N_POLY + 255) / 256, 256>>>(dx, dy, N_POLY);
    CHECK(cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < N_POLY; i++)
        wrong += hy[i] != 2.0f * hx[i];
    printf("poly after rewrite: wrong %d\n", wrong);
    expect(wrong == 0, "poly sees the new table");
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
}

static void atomic_counter(void)
{
    int value = -1;
    CHECK(cudaMemcpyFromSymbol(&value, counter, sizeof value));
    printf("counter at start %d\n", value);
    count_multiples<<<8, 128>>>(N_POLY, 3);
    count_multiples<<<3, 100>>>(N_POLY, 7);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyFromSymbol(&value, counter, sizeof value));
    printf("counter %d\n", value);
    expect(value == 334 + 43, "counter");
    value = 1000;
    CHECK(cudaMemcpyToSymbol(counter, &value, sizeof value));
    count_multiples<<<1, 64>>>(64, 1);
    CHECK(cudaMemcpyFromSymbol(&value, counter, sizeof value, 0, cudaMemcpyDefault));
    printf("counter reset to 1000, +64: %d\n", value);
}

static void scalars(void)
{
    int init = 0, hid = -1;
    double v = -1;
    CHECK(cudaMemcpyFromSymbol(&init, initialized, sizeof init));
    CHECK(cudaMemcpyFromSymbol(&hid, hidden, sizeof hid));
    CHECK(cudaMemcpyFromSymbol(&v, ns::value, sizeof v));
    printf("initialized %d hidden %d ns::value %g\n", init, hid, v);

    size_t size = 0;
    CHECK(cudaGetSymbolSize(&size, ns::value));
    printf("ns::value size %zu\n", size);
    CHECK(cudaGetSymbolSize(&size, hidden));
    printf("hidden size %zu\n", size);

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int five = 5;
    double two_and_a_half = 2.5;
    int *dout;
    CHECK(cudaMalloc(&dout, 2 * sizeof(int)));
    CHECK(cudaMemcpyToSymbolAsync(hidden, &five, sizeof five, 0, cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyToSymbolAsync(ns::value, &two_and_a_half, sizeof(double), 0,
                                  cudaMemcpyHostToDevice, stream));
    update_vars<<<1, 32, 0, stream>>>(7, dout);
    update_vars<<<1, 32, 0, stream>>>(1, dout);
    int out[2] = {0, 0};
    CHECK(cudaMemcpyAsync(out, dout, sizeof out, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyFromSymbolAsync(&init, initialized, sizeof init, 0, cudaMemcpyDeviceToHost,
                                    stream));
    CHECK(cudaMemcpyFromSymbolAsync(&hid, hidden, sizeof hid, 0, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyFromSymbolAsync(&v, ns::value, sizeof v, 0, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("kernel saw initialized %d hidden %d\n", out[0], out[1]);
    printf("after two updates: initialized %d hidden %d ns::value %g\n", init, hid, v);
    expect(init == 50 && hid == 35 && v == 17.125, "scalars after updates");

    // Device-to-device: a symbol from device memory and back.
    int seven = 77;
    CHECK(cudaMemcpy(dout, &seven, sizeof seven, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(initialized, dout, sizeof(int), 0, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpyFromSymbolAsync(dout + 1, hidden, sizeof(int), 0, cudaMemcpyDeviceToDevice,
                                    stream));
    CHECK(cudaMemcpyToSymbolAsync(hidden, dout, sizeof(int), 0, cudaMemcpyDefault, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(&init, initialized, sizeof init));
    CHECK(cudaMemcpyFromSymbol(&hid, hidden, sizeof hid));
    printf("device-to-device: out %d %d initialized %d hidden %d\n", out[0], out[1], init, hid);
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dout));
}

static void big_array(void)
{
    static unsigned host[BIG_N], back[BIG_N];
    size_t size = 0;
    CHECK(cudaGetSymbolSize(&size, big));
    printf("big size %zu\n", size);
    for (int i = 0; i < BIG_N; i++)
        host[i] = (unsigned)i * 2654435761u;
    CHECK(cudaMemcpyToSymbol(big, host, sizeof host));
    big_update<<<20, 256>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyFromSymbol(back, big, sizeof back));
    printf("big sum %llu\n", sum_u32(back, BIG_N));
    int wrong = 0;
    for (int i = 0; i < BIG_N; i++)
        wrong += back[i] != host[i] * 3u + (unsigned)i;
    printf("big wrong %d\n", wrong);
    expect(wrong == 0, "big_update");

    void *addr = NULL, *addr2 = NULL;
    CHECK(cudaGetSymbolAddress(&addr, big));
    CHECK(cudaGetSymbolAddress(&addr2, big));
    expect(addr != NULL && addr == addr2, "one address per symbol");
    unsigned part[1000];
    CHECK(cudaMemcpy(part, (char *)addr + 4000, sizeof part, cudaMemcpyDeviceToHost));
    printf("through the address: match %d\n", memcmp(part, back + 1000, sizeof part) == 0);
    CHECK(cudaMemset((char *)addr + 400, 0, 400));
    CHECK(cudaMemcpyFromSymbol(part, big, 1000, 0));
    printf("memset through the address: [99] %d [100] %u [199] %u [200] %d\n",
           part[99] == back[99], part[100], part[199], part[200] == back[200]);
    CHECK(cudaMemcpy(back, addr, sizeof back, cudaMemcpyDefault));
    printf("big sum after memset %llu\n", sum_u32(back, BIG_N));
    CHECK(cudaMemcpyFromSymbol(part, big, sizeof part, 196000));
    printf("tail: match %d\n", memcmp(part, back + BIG_N - 1000, sizeof part) == 0);
    // A copy between two places of the same variable, through the address.
    CHECK(cudaMemcpy((char *)addr + 40000, addr, sizeof part, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpyFromSymbol(part, big, sizeof part, 40000));
    printf("copied within big: match %d\n", memcmp(part, back, sizeof part) == 0);
}

static void errors(void)
{
    float c[17] = {0};
    void *addr = NULL;
    size_t size = 0;
    show("to coeffs offset 64", cudaMemcpyToSymbol(coeffs, c, 4, 64));
    show("to coeffs 68 bytes", cudaMemcpyToSymbol(coeffs, c, 68));
    show("to coeffs 4 bytes at 61", cudaMemcpyToSymbol(coeffs, c, 4, 61));
    show("from counter 8 bytes", cudaMemcpyFromSymbol(c, counter, 8));
    show("from big past end", cudaMemcpyFromSymbol(c, big, 8, sizeof(unsigned) * BIG_N - 4));
    show("async to counter past end",
         cudaMemcpyToSymbolAsync(counter, c, 4, 4, cudaMemcpyHostToDevice, 0));
    show("to a host variable", cudaMemcpyToSymbol(not_a_symbol, c, 4));
    show("from a host variable", cudaMemcpyFromSymbol(c, not_a_symbol, 4));
    show("async from a host variable",
         cudaMemcpyFromSymbolAsync(c, not_a_symbol, 4, 0, cudaMemcpyDeviceToHost, 0));
    show("address of a host variable", cudaGetSymbolAddress(&addr, not_a_symbol));
    show("size of a host variable", cudaGetSymbolSize(&size, not_a_symbol));
    show("to coeffs as device-to-host",
         cudaMemcpyToSymbol(coeffs, c, 4, 0, cudaMemcpyDeviceToHost));
    show("from coeffs as host-to-device",
         cudaMemcpyFromSymbol(c, coeffs, 4, 0, cudaMemcpyHostToDevice));
    show("to the middle of coeffs", cudaMemcpyToSymbol(*((const char *)&coeffs + 4), c, 4));
    show("to a NULL symbol", cudaMemcpyToSymbol((const void *)NULL, c, 4));
    show("nothing to a host variable", cudaMemcpyToSymbol(not_a_symbol, c, 0));
    show("nothing past the end of counter", cudaMemcpyToSymbol(counter, c, 0, 8));
    show("to coeffs as host-to-host", cudaMemcpyToSymbol(coeffs, c, 4, 0, cudaMemcpyHostToHost));
    show("to coeffs past the end as device-to-host",
         cudaMemcpyToSymbol(coeffs, c, 4, 64, cudaMemcpyDeviceToHost));
    show("to a host variable as device-to-host",
         cudaMemcpyToSymbol(not_a_symbol, c, 4, 0, cudaMemcpyDeviceToHost));
    show("to coeffs device-to-device from a host buffer",
         cudaMemcpyToSymbol(coeffs, c, 4, 0, cudaMemcpyDeviceToDevice));
    CHECK(cudaGetSymbolAddress(&addr, counter));
    show("free a symbol's address", cudaFree(addr));
    int value = 0;
    CHECK(cudaMemcpyFromSymbol(&value, counter, sizeof value));
    printf("counter unchanged %d\n", value);
    show("after the errors", cudaDeviceSynchronize());
}

int main(void)
{
    constant_table();
    atomic_counter();
    scalars();
    big_array();
    errors();
    printf("%s\n", failed ? "FAIL" : "PASS");
    return failed;
}
