// errors: error scenarios, chosen by argv[1]. Each prints the error NAMES it observes (so that
// native and pilot runs can be compared line by line) and ends with PASS/FAIL; the program
// itself only checks what must hold everywhere (an error is an error, later valid calls work).
//   launch_config    invalid launch shapes, then a valid launch
//   use_after_free   copies, memset and a second free on a freed pointer
//   copy_oob         copies and memsets running past the end of an allocation
//   bad_free         cudaFree of an interior pointer, a host pointer, NULL
//   device_props     device count, properties, attributes, versions, memory info (booleans)
//   daemon_absent    one cudaMalloc, its error name (run under pilot without a daemon)
//   killed_mid_copy  256 MiB copies in a loop until killed (prints "copying" once)
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int failed;

// Prints "<label>: <error name>" and returns the error.
static cudaError_t show(const char *label, cudaError_t e)
{
    printf("%s: %s\n", label, cudaGetErrorName(e));
    return e;
}

static void expect(int ok, const char *what)
{
    if (!ok) {
        printf("check failed: %s\n", what);
        failed = 1;
    }
}

__global__ void touch(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = 3 * i + 1;
}

// Launches touch over 64 ints, copies back and checks them.
static void valid_launch_works(int *dev)
{
    int host[64];
    CHECK(cudaMemset(dev, 0, sizeof host));
    touch<<<2, 32>>>(dev, 64);
    expect(show("valid launch", cudaGetLastError()) == cudaSuccess, "valid launch");
    expect(show("synchronize", cudaDeviceSynchronize()) == cudaSuccess, "synchronize");
    CHECK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
    long sum = 0;
    for (int i = 0; i < 64; i++)
        sum += host[i];
    printf("valid launch sum %ld\n", sum);
    expect(sum == 3 * 2016 + 64, "valid launch result");
}

// A 4 KiB round trip through a fresh allocation.
static void valid_copy_works(void)
{
    unsigned char out[4096], in[4096];
    for (int i = 0; i < 4096; i++)
        out[i] = (unsigned char)(i * 13 + 5);
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, sizeof out));
    CHECK(cudaMemcpy(dev, out, sizeof out, cudaMemcpyHostToDevice));
    memset(in, 0, sizeof in);
    CHECK(cudaMemcpy(in, dev, sizeof in, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dev));
    int same = memcmp(in, out, sizeof in) == 0;
    printf("valid copy afterwards: %s\n", same ? "ok" : "WRONG");
    expect(same, "valid copy afterwards");
}

static void launch_config(void)
{
    int *dev;
    CHECK(cudaMalloc(&dev, 64 * sizeof(int)));

    // CUDA 13.0 with driver 580 reports cudaErrorInvalidValue for all of these (older
    // runtimes said cudaErrorInvalidConfiguration); the test compares the names.
    touch<<<1, 2048>>>(dev, 64);
    expect(show("block of 2048 threads", cudaGetLastError()) != cudaSuccess, "2048 threads");
    expect(show("last error again", cudaGetLastError()) == cudaSuccess, "error was cleared");

    touch<<<1, dim3(32, 32, 2)>>>(dev, 64);
    expect(show("block of 32x32x2 threads", cudaGetLastError()) != cudaSuccess, "32x32x2");
    touch<<<1, dim3(1, 1, 128)>>>(dev, 64);
    expect(show("block z of 128", cudaGetLastError()) != cudaSuccess, "block z 128");
    touch<<<0, 32>>>(dev, 64);
    expect(show("grid of 0 blocks", cudaGetLastError()) != cudaSuccess, "0 blocks");
    touch<<<dim3(1, 65536), 32>>>(dev, 64);
    expect(show("grid y of 65536", cudaGetLastError()) != cudaSuccess, "grid y 65536");
    expect(show("last error again", cudaGetLastError()) == cudaSuccess, "error was cleared");

    valid_launch_works(dev);
    CHECK(cudaFree(dev));
}

__global__ void __launch_bounds__(128) bounded(int *p)
{
    p[blockIdx.x * blockDim.x + threadIdx.x] = (int)threadIdx.x;
}

// A block larger than the kernel's __launch_bounds__ but within the device's limits.
static void launch_bounds(void)
{
    int *dev;
    CHECK(cudaMalloc(&dev, 256 * sizeof(int)));
    bounded<<<1, 256>>>(dev);
    expect(show("256 threads, bounds 128", cudaGetLastError()) != cudaSuccess, "over bounds");
    bounded<<<2, 128>>>(dev);
    expect(show("128 threads, bounds 128", cudaGetLastError()) == cudaSuccess, "within bounds");
    expect(show("synchronize", cudaDeviceSynchronize()) == cudaSuccess, "synchronize");
    int host[256];
    CHECK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
    long sum = 0;
    for (int i = 0; i < 256; i++)
        sum += host[i];
    printf("bounded sum %ld\n", sum);
    expect(sum == 2 * 127 * 128 / 2, "bounded result");
    CHECK(cudaFree(dev));
}

static void use_after_free(void)
{
    unsigned char host[16] = {0};
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, 4096));
    CHECK(cudaFree(dev));
    expect(show("memcpy D2H from freed", cudaMemcpy(host, dev, 16, cudaMemcpyDeviceToHost)) !=
               cudaSuccess, "memcpy D2H from freed pointer fails");
    expect(show("memcpy H2D to freed", cudaMemcpy(dev, host, 16, cudaMemcpyHostToDevice)) !=
               cudaSuccess, "memcpy H2D to freed pointer fails");
    expect(show("memset freed", cudaMemset(dev, 0, 16)) != cudaSuccess,
           "memset of freed pointer fails");
    expect(show("second free", cudaFree(dev)) != cudaSuccess, "second free fails");
    show("last error", cudaGetLastError());
    expect(show("last error again", cudaGetLastError()) == cudaSuccess, "error was cleared");
    valid_copy_works();
}

static void copy_oob(void)
{
    static unsigned char host[8192];
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, 4096));
    expect(show("H2D 8192 into 4096", cudaMemcpy(dev, host, 8192, cudaMemcpyHostToDevice)) !=
               cudaSuccess, "H2D past the end fails");
    expect(show("D2H 8192 from 4096", cudaMemcpy(host, dev, 8192, cudaMemcpyDeviceToHost)) !=
               cudaSuccess, "D2H past the end fails");
    expect(show("H2D 200 at offset 4000",
                cudaMemcpy(dev + 4000, host, 200, cudaMemcpyHostToDevice)) != cudaSuccess,
           "H2D straddling the end fails");
    expect(show("memset 8192 on 4096", cudaMemset(dev, 0, 8192)) != cudaSuccess,
           "memset past the end fails");
    show("last error", cudaGetLastError());
    expect(show("last error again", cudaGetLastError()) == cudaSuccess, "error was cleared");
    CHECK(cudaFree(dev));
    valid_copy_works();
}

static void bad_free(void)
{
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, 4096));
    void *host = malloc(64);
    expect(show("free interior pointer", cudaFree(dev + 16)) != cudaSuccess,
           "free of an interior pointer fails");
    expect(show("free host pointer", cudaFree(host)) != cudaSuccess,
           "free of a host pointer fails");
    expect(show("free NULL", cudaFree(NULL)) == cudaSuccess, "free of NULL succeeds");
    expect(show("free real pointer", cudaFree(dev)) == cudaSuccess,
           "the allocation itself still frees");
    free(host);
    valid_copy_works();
}

static const char *yes(int b)
{
    return b ? "yes" : "no";
}

static void device_props(void)
{
    int count = 0, dev = -1, attr = 0, driver = 0, runtime = 0;
    CHECK(cudaGetDeviceCount(&count));
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    CHECK(cudaGetDeviceProperties(&prop, dev));
    CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrMaxThreadsPerBlock, dev));
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));

    const int checks[] = {
        count >= 1,
        dev == 0,
        prop.name[0] != '\0' && memchr(prop.name, '\0', sizeof prop.name) != NULL,
        prop.major >= 1,
        prop.totalGlobalMem > 0,
        prop.warpSize == 32,
        prop.maxThreadsPerBlock == 1024,
        attr == 1024,
        runtime >= 13000,
        driver >= runtime,
        total_b > 0 && free_b <= total_b,
        total_b <= prop.totalGlobalMem,
    };
    const char *names[] = {
        "device count >= 1",
        "current device is 0",
        "name non-empty",
        "major >= 1",
        "totalGlobalMem > 0",
        "warpSize == 32",
        "maxThreadsPerBlock == 1024",
        "attribute MaxThreadsPerBlock == 1024",
        "runtime version >= 13000",
        "driver version >= runtime version",
        "0 < free <= total",
        "memory info total <= totalGlobalMem",
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        printf("%s: %s\n", names[i], yes(checks[i]));
        expect(checks[i], names[i]);
    }
}

static void daemon_absent(void)
{
    void *dev = NULL;
    show("cudaMalloc", cudaMalloc(&dev, 1 << 20));
}

static void killed_mid_copy(void)
{
    const size_t size = 256u << 20;
    unsigned char *host = (unsigned char *)malloc(size);
    if (!host) {
        printf("host allocation failed\n");
        failed = 1;
        return;
    }
    for (size_t i = 0; i < size; i++)
        host[i] = (unsigned char)i;
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, size));
    const time_t start = time(NULL);
    for (long iter = 0;; iter++) {
        CHECK(cudaMemcpy(dev, host, size, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(host, dev, size, cudaMemcpyDeviceToHost));
        if (iter == 0) {
            printf("copying\n");
            fflush(stdout);
        }
        if (time(NULL) - start > 300) {  // nobody killed us: don't run forever
            printf("not killed after 300 s\n");
            failed = 1;
            return;
        }
    }
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"launch_config", launch_config},
    {"launch_bounds", launch_bounds},
    {"use_after_free", use_after_free},
    {"copy_oob", copy_oob},
    {"bad_free", bad_free},
    {"device_props", device_props},
    {"daemon_absent", daemon_absent},
    {"killed_mid_copy", killed_mid_copy},
};

int main(int argc, char **argv)
{
    const size_t n = sizeof scenarios / sizeof scenarios[0];
    for (size_t i = 0; argc == 2 && i < n; i++) {
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].run();
            printf(failed ? "FAIL\n" : "PASS\n");
            return failed ? 1 : 0;
        }
    }
    printf("usage: %s SCENARIO, one of:", argv[0]);
    for (size_t i = 0; i < n; i++)
        printf(" %s", scenarios[i].name);
    printf("\n");
    return 2;
}
