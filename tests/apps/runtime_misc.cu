// runtime_misc: the smaller runtime calls of issue 3, each with the exact answers CUDA 13.0
// gives on an H100 (driver 580): stream priorities and flags, cudaEventRecordWithFlags, device
// flags, limits, cache configurations, peer access, the profiler switches, function attributes,
// cudaFuncSetAttribute (and launches that use the raised dynamic shared memory), occupancy,
// cudaMallocPitch, cudaMemcpy2D/Async and cudaMemset2D/Async (results checked element by
// element, for rows narrower and wider than 64 KiB), and the errors of each.
// Prints only exact values and booleans, so its output is the same natively and under pilot.
#include <cuda_runtime.h>
#include <cuda_profiler_api.h>

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

static const char *name(cudaError_t err)
{
    cudaGetLastError(); // the test goes on after an expected error
    return cudaGetErrorName(err);
}

static int failed;

static void expect(int ok, const char *what)
{
    if (!ok) {
        printf("MISMATCH %s\n", what);
        failed = 1;
    }
}

// 1 KiB of static shared memory, at most 128 threads a block: t[i] = x[i]; x[i] = t[127 - i]
__global__ void __launch_bounds__(128) tiled(float *x)
{
    __shared__ float t[256];
    t[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = t[127 - threadIdx.x];
}

// x[i] += 1 for i < n covered by the grid
__global__ void plain(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1.0f;
}

// one block: x[i] = x[n - 1 - i] through dynamic shared memory
__global__ void dyn_reverse(int *x, int n)
{
    extern __shared__ int s[];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        x[i] = s[n - 1 - i];
}

// p[r * pitch + c] += r for a width x height byte image in pitched memory
__global__ void add_row(unsigned char *p, size_t pitch, int width, int height)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c < width && r < height)
        p[r * pitch + c] = (unsigned char)(p[r * pitch + c] + r);
}

static void streams_and_events(void)
{
    int least = 99, greatest = 99;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    printf("priority range [%d, %d]\n", least, greatest);
    CHECK(cudaDeviceGetStreamPriorityRange(NULL, &greatest));

    const struct { int priority; unsigned flags; } made[] = {
        {-10, cudaStreamNonBlocking}, {-3, cudaStreamDefault}, {3, cudaStreamNonBlocking}};
    cudaStream_t s[3];
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamCreateWithPriority(&s[i], made[i].flags, made[i].priority));
        int p = 99;
        unsigned f = 99;
        CHECK(cudaStreamGetPriority(s[i], &p));
        CHECK(cudaStreamGetFlags(s[i], &f));
        printf("stream priority %d flags %u -> priority %d flags %u\n", made[i].priority,
               made[i].flags, p, f);
    }
    const cudaStream_t specials[] = {0, cudaStreamLegacy, cudaStreamPerThread};
    for (int i = 0; i < 3; i++) {
        int p = 99;
        unsigned f = 99;
        CHECK(cudaStreamGetPriority(specials[i], &p));
        CHECK(cudaStreamGetFlags(specials[i], &f));
        printf("special stream %d: priority %d flags %u\n", i, p, f);
    }
    cudaStream_t bad;
    printf("create with flags 2: %s\n", name(cudaStreamCreateWithPriority(&bad, 2, 0)));
    printf("get flags into NULL: %s\n", name(cudaStreamGetFlags(s[0], NULL)));

    // work on every priority stream, then events recorded with flags
    const int n = 1000;
    float *x, h[1000];
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMemset(x, 0, n * sizeof(float)));
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamSynchronize(i ? s[i - 1] : 0));
        plain<<<(n + 255) / 256, 256, 0, s[i]>>>(x, n);
        CHECK(cudaGetLastError());
    }
    printf("record with flags 0: %s\n", name(cudaEventRecordWithFlags(ev, s[2], 0)));
    CHECK(cudaEventSynchronize(ev));
    printf("record external outside a capture: %s\n",
           name(cudaEventRecordWithFlags(ev, s[2], cudaEventRecordExternal)));
    printf("record with flags 2: %s\n", name(cudaEventRecordWithFlags(ev, s[2], 2)));
    printf("record NULL event: %s\n", name(cudaEventRecordWithFlags(NULL, s[2], 0)));
    CHECK(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += h[i] != 3.0f;
    printf("priority streams: %d wrong\n", wrong);
    expect(wrong == 0, "priority streams");
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaFree(x));
    for (int i = 0; i < 3; i++)
        CHECK(cudaStreamDestroy(s[i]));
}

static void device(void)
{
    unsigned flags = 99;
    CHECK(cudaGetDeviceFlags(&flags));
    printf("device flags %#x\n", flags);
    const unsigned tries[] = {cudaDeviceScheduleSpin | cudaDeviceScheduleBlockingSync,
                              cudaDeviceScheduleBlockingSync | cudaDeviceLmemResizeToMax |
                                  cudaDeviceSyncMemops,
                              0x20, 0x100, cudaDeviceScheduleAuto};
    for (unsigned t : tries) {
        cudaError_t err = cudaSetDeviceFlags(t);
        CHECK(cudaGetDeviceFlags(&flags));
        printf("set device flags %#x: %s -> %#x\n", t, name(err), flags);
    }
    printf("get device flags into NULL: %s\n", name(cudaGetDeviceFlags(NULL)));

    // Limits: only raised here (pilot keeps the largest request of any program: see
    // daemon/limits.py), so the values read back are the ones asked for.
    size_t v = 0;
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    printf("stack size %zu\n", v);
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    printf("stack size after setting 4096: %zu\n", v);
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 8000));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitStackSize));
    printf("stack size after setting 8000: %zu\n", v);
    CHECK(cudaDeviceGetLimit(&v, cudaLimitMallocHeapSize));
    printf("malloc heap %zu\n", v);
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16 << 20));
    CHECK(cudaDeviceGetLimit(&v, cudaLimitMallocHeapSize));
    printf("malloc heap after setting 16 MiB: %zu\n", v);
    CHECK(cudaDeviceGetLimit(&v, cudaLimitDevRuntimePendingLaunchCount));
    printf("pending launch count %zu\n", v);
    printf("sync depth: %s\n", name(cudaDeviceGetLimit(&v, cudaLimitDevRuntimeSyncDepth)));
    printf("get limit into NULL: %s\n", name(cudaDeviceGetLimit(NULL, cudaLimitStackSize)));

    cudaFuncCache cache = (cudaFuncCache)9;
    CHECK(cudaDeviceGetCacheConfig(&cache));
    printf("cache config %d\n", (int)cache);
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
    CHECK(cudaDeviceGetCacheConfig(&cache));
    printf("cache config after PreferShared: %d\n", (int)cache);
    printf("cache config 4: %s\n", name(cudaDeviceSetCacheConfig((cudaFuncCache)4)));
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferNone));

    int can = 7;
    cudaError_t err = cudaDeviceCanAccessPeer(&can, 0, 0);
    printf("can access peer 0 -> 0: %s %d\n", name(err), can);
    printf("can access peer 0 -> 1: %s\n", name(cudaDeviceCanAccessPeer(&can, 0, 1)));
    printf("can access peer into NULL: %s\n", name(cudaDeviceCanAccessPeer(NULL, 0, 0)));
    printf("profiler start %s stop %s\n", name(cudaProfilerStart()), name(cudaProfilerStop()));
}

static void print_attributes(const char *label, const void *func)
{
    cudaFuncAttributes a;
    CHECK(cudaFuncGetAttributes(&a, func));
    printf("%s: maxThreadsPerBlock %d sharedSizeBytes %zu localSizeBytes %zu "
           "maxDynamicSharedSizeBytes %d preferredShmemCarveout %d numRegs>0 %s "
           "binaryVersion>0 %s\n",
           label, a.maxThreadsPerBlock, a.sharedSizeBytes, a.localSizeBytes,
           a.maxDynamicSharedSizeBytes, a.preferredShmemCarveout, a.numRegs > 0 ? "yes" : "no",
           a.binaryVersion > 0 ? "yes" : "no");
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static cudaError_t set_bank_size(const void *func, int config)
{
    return cudaFuncSetSharedMemConfig(func, (cudaSharedMemConfig)config);
}
#pragma GCC diagnostic pop

static void functions(void)
{
    print_attributes("tiled", (const void *)tiled);
    print_attributes("plain", (const void *)plain);
    cudaFuncAttributes a;
    printf("attributes into NULL: %s\n", name(cudaFuncGetAttributes(NULL, (const void *)plain)));
    printf("attributes of NULL: %s\n", name(cudaFuncGetAttributes(&a, NULL)));
    printf("attributes of a host function: %s\n",
           name(cudaFuncGetAttributes(&a, (const void *)set_bank_size)));

    // More dynamic shared memory than the default 48 KiB, then launches that use it.
    const int big = 100000, n = 25000; // n ints fill the 100000 bytes
    printf("launch with %d bytes before opting in: ", big);
    dyn_reverse<<<1, 256, big>>>(NULL, 0);
    printf("%s\n", name(cudaGetLastError()));
    printf("set max dynamic shared %d: %s\n", big,
           name(cudaFuncSetAttribute((const void *)dyn_reverse,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, big)));
    print_attributes("dyn_reverse", (const void *)dyn_reverse);
    int *x, *h = (int *)malloc(n * sizeof(int));
    for (int i = 0; i < n; i++)
        h[i] = i * 7 - 3;
    CHECK(cudaMalloc(&x, n * sizeof(int)));
    CHECK(cudaMemcpy(x, h, n * sizeof(int), cudaMemcpyHostToDevice));
    dyn_reverse<<<1, 256, big>>>(x, n);
    printf("launch with %d bytes: %s\n", big, name(cudaGetLastError()));
    dyn_reverse<<<1, 256, big + 1>>>(x, n);
    printf("launch with %d bytes: %s\n", big + 1, name(cudaGetLastError()));
    CHECK(cudaMemcpy(h, x, n * sizeof(int), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += h[i] != (n - 1 - i) * 7 - 3;
    printf("reversed through dynamic shared memory: %d wrong\n", wrong);
    expect(wrong == 0, "dyn_reverse");
    CHECK(cudaFree(x));
    free(h);
    plain<<<1, 64, 49152>>>(NULL, 0);
    printf("plain with 49152 bytes: %s\n", name(cudaGetLastError()));
    plain<<<1, 64, 49153>>>(NULL, 0);
    printf("plain with 49153 bytes: %s\n", name(cudaGetLastError()));
    tiled<<<1, 64, 48129>>>(NULL);
    printf("tiled with 48129 bytes: %s\n", name(cudaGetLastError()));
    CHECK(cudaDeviceSynchronize());

    const void *fp = (const void *)plain;
    printf("max dynamic 232448: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448)));
    printf("max dynamic 232449: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449)));
    printf("tiled max dynamic 232448: %s\n",
           name(cudaFuncSetAttribute((const void *)tiled,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, 232448)));
    printf("max dynamic -1: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributeMaxDynamicSharedMemorySize, -1)));
    printf("carveout 50: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributePreferredSharedMemoryCarveout, 50)));
    printf("carveout 101: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributePreferredSharedMemoryCarveout, 101)));
    printf("cluster dim must be set: %s\n",
           name(cudaFuncSetAttribute(fp, cudaFuncAttributeClusterDimMustBeSet, 1)));
    printf("attribute of NULL: %s\n",
           name(cudaFuncSetAttribute(NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 1)));
    print_attributes("plain after setting", fp);
    CHECK(cudaFuncSetAttribute(fp, cudaFuncAttributePreferredSharedMemoryCarveout, -1));

    printf("function cache PreferL1: %s\n", name(cudaFuncSetCacheConfig(fp, cudaFuncCachePreferL1)));
    printf("function cache 4: %s\n", name(cudaFuncSetCacheConfig(fp, (cudaFuncCache)4)));
    printf("function cache of NULL: %s\n", name(cudaFuncSetCacheConfig(NULL, cudaFuncCachePreferL1)));
    printf("bank size eight bytes: %s\n", name(set_bank_size(fp, 2)));
    printf("bank size 3: %s\n", name(set_bank_size(fp, 3)));

    const struct { int block; size_t dyn; unsigned flags; } occ[] = {
        {128, 0, 0}, {64, 0, 0}, {256, 0, 0}, {128, 0, cudaOccupancyDisableCachingOverride},
        {1025, 0, 0}, {128, 300000, 0}};
    for (auto o : occ) {
        int blocks = -1;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, (const void *)tiled,
                                                                     o.block, o.dyn, o.flags));
        printf("occupancy tiled block %d dynamic %zu flags %u: %d\n", o.block, o.dyn, o.flags,
               blocks);
    }
    int blocks = -1;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)plain, 1024, 0));
    printf("occupancy plain block 1024: %d\n", blocks);
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)dyn_reverse, 256,
                                                        big));
    printf("occupancy dyn_reverse with %d bytes > 0: %s\n", big, blocks > 0 ? "yes" : "no");
    printf("occupancy block 0: %s\n",
           name(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fp, 0, 0)));
    printf("occupancy flags 2: %s\n",
           name(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, fp, 128, 0, 2)));
    printf("occupancy of NULL: %s\n",
           name(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, NULL, 128, 0)));
    printf("occupancy into NULL: %s\n",
           name(cudaOccupancyMaxActiveBlocksPerMultiprocessor(NULL, fp, 128, 0)));
    // The dynamic shared memory that lets 8 (16) blocks of 128 threads share an SM: 8 blocks fit
    // with it, 16 get less (the exact bytes are the driver's: not printed).
    size_t smem8 = 0, smem16 = 0;
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&smem8, (const void *)dyn_reverse, 8, 128));
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&smem16, (const void *)dyn_reverse, 16, 128));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)dyn_reverse, 128,
                                                        smem8));
    printf("available dynamic smem: 8 blocks fit with it: %s, 16 get less but some: %s\n",
           blocks >= 8 ? "yes" : "no", smem16 < smem8 && smem16 > 0 ? "yes" : "no");
}

static unsigned char pattern(size_t r, size_t c, int salt)
{
    return (unsigned char)(r * 31 + c * 7 + (size_t)salt * 13 + (c >> 8));
}

// Fills a host image (pitch hp) with pattern(salt); counts mismatches of a width x height
// window of `got` (pitch gp) against `want(r, c)`.
static void fill(unsigned char *p, size_t hp, size_t width, size_t height, int salt)
{
    for (size_t r = 0; r < height; r++)
        for (size_t c = 0; c < hp; c++)
            p[r * hp + c] = c < width ? pattern(r, c, salt) : 0xEE;
}

// H2D from a host image of pitch spitch, D2D into a second pitched image at column x0, row y0,
// a 2D memset of a window there, the add_row kernel, then D2H into a host image of pitch
// dpitch; every byte checked, the pitch padding of the host image too.
static void copy_case(size_t width, size_t height, size_t spitch, size_t dpitch, int async)
{
    const size_t x0 = 3, y0 = 2;
    unsigned char *a, *b;
    size_t pa, pb;
    CHECK(cudaMallocPitch((void **)&a, &pa, width, height));
    CHECK(cudaMallocPitch((void **)&b, &pb, width + x0, height + y0));
    unsigned char *src = (unsigned char *)malloc(spitch * height);
    unsigned char *dst = (unsigned char *)malloc(dpitch * height);
    fill(src, spitch, width, height, 1);
    memset(dst, 0xCD, dpitch * height);
    cudaStream_t s = 0;
    if (async)
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *bw = b + y0 * pb + x0;
    const size_t mw = width / 2, mh = height / 2; // memset window: rows 1.., columns 1..
    if (async) {
        CHECK(cudaMemset2DAsync(b, pb, 0, width + x0, height + y0, s));
        CHECK(cudaMemcpy2DAsync(a, pa, src, spitch, width, height, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemcpy2DAsync(bw, pb, a, pa, width, height, cudaMemcpyDeviceToDevice, s));
        CHECK(cudaMemset2DAsync(bw + pb + 1, pb, 0x1AB, mw, mh, s));
    } else {
        CHECK(cudaMemset2D(b, pb, 0, width + x0, height + y0));
        CHECK(cudaMemcpy2D(a, pa, src, spitch, width, height, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy2D(bw, pb, a, pa, width, height, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemset2D(bw + pb + 1, pb, 0x1AB, mw, mh));
    }
    dim3 grid((unsigned)((width + 255) / 256), (unsigned)height);
    add_row<<<grid, 256, 0, s>>>(bw, pb, (int)width, (int)height);
    CHECK(cudaGetLastError());
    if (async) {
        CHECK(cudaMemcpy2DAsync(dst, dpitch, bw, pb, width, height, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaStreamDestroy(s));
    } else {
        CHECK(cudaMemcpy2D(dst, dpitch, bw, pb, width, height, cudaMemcpyDefault));
    }
    size_t wrong = 0;
    for (size_t r = 0; r < height; r++)
        for (size_t c = 0; c < dpitch; c++) {
            unsigned char want = 0xCD;
            if (c < width) {
                int in_set = r >= 1 && r < 1 + mh && c >= 1 && c < 1 + mw;
                want = (unsigned char)((in_set ? 0xAB : pattern(r, c, 1)) + r);
            }
            wrong += dst[r * dpitch + c] != want;
        }
    // the margins of b the copies must not touch: row 0.. y0-1 and columns 0.. x0-1
    unsigned char *whole = (unsigned char *)malloc(pb * (height + y0));
    CHECK(cudaMemcpy(whole, b, pb * (height + y0), cudaMemcpyDeviceToHost));
    for (size_t r = 0; r < height + y0; r++)
        for (size_t c = 0; c < width + x0; c++)
            if (r < y0 || c < x0)
                wrong += whole[r * pb + c] != 0;
    printf("2D %s %zux%zu spitch %zu dpitch %zu: pitches %zu %zu, %zu wrong\n",
           async ? "async" : "sync", width, height, spitch, dpitch, pa, pb, wrong);
    expect(wrong == 0, "2D copy case");
    free(whole);
    free(src);
    free(dst);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

static void memory(void)
{
    const size_t widths[] = {1, 100, 512, 513, 4097, 100000};
    for (size_t w : widths) {
        void *p = NULL;
        size_t pitch = 0;
        CHECK(cudaMallocPitch(&p, &pitch, w, 3));
        printf("pitch of width %zu: %zu\n", w, pitch);
        CHECK(cudaFree(p));
    }
    void *p = (void *)1;
    size_t pitch = 7;
    CHECK(cudaMallocPitch(&p, &pitch, 0, 3));
    printf("width 0: pointer %s pitch %zu\n", p ? "set" : "NULL", pitch);
    printf("pitch into NULL: %s\n", name(cudaMallocPitch(&p, NULL, 100, 1)));

    copy_case(100, 37, 128, 120, 0);      // narrow rows, one message each way
    copy_case(1000, 300, 1024, 1000, 0);  // 300 KB: several messages of packed rows
    copy_case(1000, 300, 1000, 1003, 1);  // the same, asynchronous, other pitches
    copy_case(70000, 3, 70001, 70000, 0); // rows wider than 64 KiB
    copy_case(70000, 3, 70000, 70005, 1);

    unsigned char *d, h[4096];
    size_t dp;
    memset(h, 0x5A, sizeof h);
    CHECK(cudaMallocPitch((void **)&d, &dp, 100, 10));
    printf("width > dpitch: %s\n",
           name(cudaMemcpy2D(d, 50, h, 100, 100, 2, cudaMemcpyHostToDevice)));
    printf("width > spitch: %s\n",
           name(cudaMemcpy2D(d, dp, h, 50, 100, 2, cudaMemcpyHostToDevice)));
    printf("width > dpitch, one row: %s\n",
           name(cudaMemcpy2D(d, 50, h, 100, 100, 1, cudaMemcpyHostToDevice)));
    printf("async width > spitch: %s\n",
           name(cudaMemcpy2DAsync(d, dp, h, 50, 100, 2, cudaMemcpyHostToDevice, 0)));
    printf("height 0: %s\n", name(cudaMemcpy2D(d, dp, h, 100, 100, 0, cudaMemcpyHostToDevice)));
    printf("width 0, pitches 0: %s\n",
           name(cudaMemcpy2D(d, 0, h, 0, 0, 2, cudaMemcpyHostToDevice)));
    printf("past the allocation: %s\n",
           name(cudaMemcpy2D(d, dp, h, 100, 100, 11, cudaMemcpyHostToDevice)));
    printf("bad kind: %s\n", name(cudaMemcpy2D(d, dp, h, 100, 100, 2, (cudaMemcpyKind)7)));
    printf("NULL destination: %s\n",
           name(cudaMemcpy2D(NULL, dp, h, 100, 100, 1, cudaMemcpyHostToDevice)));
    printf("memset width > pitch: %s\n", name(cudaMemset2D(d, 50, 1, 100, 2)));
    printf("memset one row, width > pitch: %s\n", name(cudaMemset2D(d, 50, 1, 100, 1)));
    printf("memset past the allocation: %s\n", name(cudaMemset2D(d, dp, 1, 100, 11)));
    printf("memset of host memory: %s\n", name(cudaMemset2D(h, 100, 1, 100, 1)));
    printf("host to host: %s\n", name(cudaMemcpy2D(h + 2048, 100, h, 200, 50, 10,
                                                   cudaMemcpyHostToHost)));
    CHECK(cudaFree(d));
}

int main(void)
{
    streams_and_events();
    device();
    functions();
    memory();
    CHECK(cudaDeviceSynchronize());
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
