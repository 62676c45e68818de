// A program of the CUDA driver API (linked with -lcuda; the runtime only where it mixes them):
// modules from a cubin file and from an embedded fatbin, cuLaunchKernel with kernelParams and
// with the `extra` packed buffer, memory, streams, events, contexts, and the errors of bad
// arguments and handles. Prints exact results and error names only (compared byte for byte
// with the H100 by tests/gpu/driver_compare.sh). Usage: driver_api CUBIN_PATH
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" // cuDeviceComputeCapability

// The fatbin of driver_kernels.cu, embedded at build time (-DDRV_FATBIN=path).
#define STR2(x) #x
#define STR(x) STR2(x)
asm(".section .rodata\n.balign 16\n.global drv_fatbin\ndrv_fatbin:\n.incbin \"" STR(DRV_FATBIN)
    "\"\n.previous\n");
extern "C" const unsigned char drv_fatbin[];

static const char *name(CUresult r)
{
    const char *s = nullptr;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS ? s : "(unnamed)";
}

#define SHOW(label, call) std::printf("%s: %s\n", label, name(call))
#define MUST(call)                                                                          \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                            \
            std::printf("FAILED %s: %s (line %d)\n", #call, name(r_), __LINE__);             \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

struct Pair {
    int a;
    double b;
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s CUBIN\n", argv[0]);
        return 2;
    }
    int count = -1;
    SHOW("before cuInit: cuDeviceGetCount", cuDeviceGetCount(&count));
    SHOW("cuInit(1)", cuInit(1));
    MUST(cuInit(0));
    int version = 0;
    MUST(cuDriverGetVersion(&version));
    std::printf("driver version >= 13000: %d\n", version >= 13000);
    MUST(cuDeviceGetCount(&count));
    std::printf("devices >= 1: %d\n", count >= 1);
    CUdevice dev, bad;
    MUST(cuDeviceGet(&dev, 0));
    SHOW("cuDeviceGet(9999)", cuDeviceGet(&bad, 9999));
    int major = 0, minor = 0, warp = 0, sms = 0;
    MUST(cuDeviceComputeCapability(&major, &minor, dev));
    MUST(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    MUST(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    std::printf("compute capability %d.%d, warp %d, SMs > 0: %d\n", major, minor, warp, sms > 0);
    char dname[256] = {0};
    size_t total = 0;
    CUuuid uuid;
    MUST(cuDeviceGetName(dname, sizeof dname, dev));
    MUST(cuDeviceTotalMem(&total, dev));
    MUST(cuDeviceGetUuid(&uuid, dev));
    std::printf("name non-empty: %d, memory > 1 GiB: %d\n", dname[0] != 0, total > (1ull << 30));

    // Contexts: none current after cuInit; the primary context; cuCtxCreate is current.
    CUcontext cur = nullptr, primary = nullptr, ctx = nullptr, popped = nullptr;
    MUST(cuCtxGetCurrent(&cur));
    std::printf("current after cuInit: %s\n", cur ? "a context" : "none");
    CUdeviceptr none;
    SHOW("cuMemAlloc without a context", cuMemAlloc(&none, 64));
    MUST(cuDevicePrimaryCtxRetain(&primary, dev));
    unsigned flags = 99;
    int active = -1;
    MUST(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    std::printf("primary: flags %u active %d\n", flags, active);
    MUST(cuCtxSetCurrent(primary));
    MUST(cuCtxGetCurrent(&cur));
    std::printf("current is primary: %d\n", cur == primary);
    MUST(cuCtxPushCurrent(primary));
    MUST(cuCtxPopCurrent(&popped));
    std::printf("popped primary: %d\n", popped == primary);
    CUdevice cdev = -1;
    MUST(cuCtxGetDevice(&cdev));
    std::printf("context device %d\n", cdev);
    MUST(cuCtxCreate(&ctx, nullptr, 0, dev));
    MUST(cuCtxGetCurrent(&cur));
    std::printf("created context current: %d\n", cur == ctx);
    MUST(cuCtxDestroy(ctx));
    MUST(cuCtxGetCurrent(&cur));
    std::printf("after cuCtxDestroy, current is primary: %d\n", cur == primary);

    // Modules: from the cubin file and from the embedded fatbin.
    CUmodule cubin_mod, fat_mod, junk_mod;
    MUST(cuModuleLoad(&cubin_mod, argv[1]));
    MUST(cuModuleLoadData(&fat_mod, drv_fatbin));
    std::vector<unsigned char> junk(256, 0);
    std::memcpy(junk.data(), "\177ELF", 4);
    SHOW("cuModuleLoadData(broken ELF)", cuModuleLoadData(&junk_mod, junk.data()));
    SHOW("cuModuleLoad(missing file)", cuModuleLoad(&junk_mod, "/nonexistent/k.cubin"));
    // JIT options: the OUT sizes come back within the sizes given (under pilot the logs are
    // also NUL-terminated whatever was in them, and an unloadable image fills the error log).
    for (int broken = 0; broken < 2; broken++) {
        char info[256], error[256];
        std::memset(info, 'x', sizeof info);
        std::memset(error, 'x', sizeof error);
        CUjit_option jit[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *vals[] = {info, (void *)sizeof info, error, (void *)sizeof error};
        CUmodule jit_mod;
        CUresult r = cuModuleLoadDataEx(&jit_mod, broken ? (const void *)junk.data() : drv_fatbin,
                                        4, jit, vals);
        size_t info_out = (size_t)vals[1], error_out = (size_t)vals[3];
        std::printf("cuModuleLoadDataEx(%s, log buffers): %s, sizes within %d\n",
                    broken ? "broken ELF" : "fatbin", name(r),
                    info_out <= sizeof info && error_out <= sizeof error);
        // what the logs hold is the driver's business (stderr: not compared with the H100's)
        std::fprintf(stderr, "jit logs (%s): info terminated %d, error terminated %d, error "
                     "empty %d\n", broken ? "broken ELF" : "fatbin",
                     std::memchr(info, 0, sizeof info) != nullptr,
                     std::memchr(error, 0, sizeof error) != nullptr, error[0] == 0);
        if (r == CUDA_SUCCESS)
            MUST(cuModuleUnload(jit_mod));
    }
    CUfunction scale, axpb, pair, bump, missing;
    MUST(cuModuleGetFunction(&scale, cubin_mod, "drv_scale"));
    MUST(cuModuleGetFunction(&axpb, fat_mod, "drv_axpb"));
    MUST(cuModuleGetFunction(&pair, fat_mod, "drv_pair"));
    MUST(cuModuleGetFunction(&bump, cubin_mod, "drv_bump"));
    SHOW("cuModuleGetFunction(missing)", cuModuleGetFunction(&missing, cubin_mod, "nope"));
    SHOW("cuModuleGetFunction(null module)", cuModuleGetFunction(&missing, nullptr, "drv_scale"));
    int threads = 0;
    MUST(cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale));
    std::printf("drv_scale max threads %d\n", threads);
    int resident = 0, min_grid = 0, best = 0;
    MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&resident, scale, 256, 0));
    MUST(cuOccupancyMaxPotentialBlockSize(&min_grid, &best, scale, nullptr, 0, 0));
    std::printf("occupancy: 256-thread blocks per SM > 0: %d, best block a warp multiple: %d, "
                "grid a multiple of the SMs: %d\n", resident > 0, best > 0 && best % 32 == 0,
                min_grid > 0 && min_grid % sms == 0);
    size_t smem8 = 0;
    MUST(cuOccupancyAvailableDynamicSMemPerBlock(&smem8, scale, 8, 128));
    MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&resident, scale, 128, smem8));
    std::printf("available dynamic smem: 8 blocks of 128 fit with it: %d\n", resident >= 8);

    // Memory and a launch with kernelParams.
    const int n = 1000;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++)
        h[i] = (float)i * 0.5f;
    CUdeviceptr d;
    MUST(cuMemAlloc(&d, n * sizeof(float)));
    SHOW("cuMemAlloc(0 bytes)", cuMemAlloc(&none, 0));
    MUST(cuMemcpyHtoD(d, h.data(), n * sizeof(float)));
    float a = 3.0f;
    int nn = n;
    void *params[] = {&d, &a, &nn};
    MUST(cuLaunchKernel(scale, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
    SHOW("cuLaunchKernel(2048 threads)",
         cuLaunchKernel(scale, 1, 1, 1, 2048, 1, 1, 0, nullptr, params, nullptr));
    SHOW("cuLaunchKernel(null function)",
         cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    MUST(cuCtxSynchronize());
    MUST(cuMemcpyDtoH(h.data(), d, n * sizeof(float)));
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += h[i];
    std::printf("scale: h[1]=%.2f h[999]=%.2f sum=%.1f\n", h[1], h[999], sum);
    CUdeviceptr base = 0;
    size_t size = 0;
    MUST(cuMemGetAddressRange(&base, &size, d + 40));
    std::printf("address range: base ok %d size %zu\n", base == d, size);
    unsigned mtype = 0;
    int ordinal = -1;
    size_t rsize = 0;
    CUdeviceptr rstart = 0;
    MUST(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
    MUST(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 8));
    MUST(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 8));
    MUST(cuPointerGetAttribute(&rstart, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 8));
    std::printf("pointer: device memory %d ordinal %d range %zu start ok %d\n",
                mtype == CU_MEMORYTYPE_DEVICE, ordinal, rsize, rstart == d);
    // Small managed allocations (which the driver, and pilot, pack 512 bytes apart): each one's
    // own range, not its neighbour's.
    CUdeviceptr m1 = 0, m2 = 0;
    MUST(cuMemAllocManaged(&m1, 300, CU_MEM_ATTACH_GLOBAL));
    MUST(cuMemAllocManaged(&m2, 300, CU_MEM_ATTACH_GLOBAL));
    MUST(cuMemGetAddressRange(&base, &size, m2 + 10));
    rstart = 0;
    MUST(cuPointerGetAttribute(&rstart, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, m1 + 299));
    std::printf("small managed: base ok %d size ok %d start ok %d\n", base == m2,
                size >= 300 && size < 4096, rstart == m1);
    MUST(cuMemFree(m1));
    MUST(cuMemFree(m2));

    // Streams, events, the `extra` form, async copies and memsets.
    CUstream s;
    CUevent start, stop;
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    MUST(cuEventCreate(&start, CU_EVENT_DEFAULT));
    MUST(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    std::vector<int> hx(n), hy(n);
    for (int i = 0; i < n; i++)
        hx[i] = i - 500;
    CUdeviceptr dx, dy;
    MUST(cuMemAlloc(&dx, n * sizeof(int)));
    MUST(cuMemAlloc(&dy, n * sizeof(int)));
    MUST(cuEventRecord(start, s));
    MUST(cuMemcpyHtoDAsync(dx, hx.data(), n * sizeof(int), s));
    MUST(cuMemsetD32Async(dy, 0xdeadbeef, n, s));
    struct {
        CUdeviceptr x, y;
        int a, b, n;
    } packed = {dx, dy, 7, -3, n - 10};
    // the struct is padded to 32 bytes; the kernel's parameters take 28, and a larger buffer is
    // refused (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on the H100)
    size_t packed_size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &packed_size, CU_LAUNCH_PARAM_END};
    printf("cuLaunchKernel(extra of %zu bytes): %s\n", packed_size,
           name(cuLaunchKernel(axpb, 4, 1, 1, 256, 1, 1, 0, s, nullptr, extra)));
    packed_size = offsetof(decltype(packed), n) + sizeof packed.n;
    MUST(cuLaunchKernel(axpb, 4, 1, 1, 256, 1, 1, 0, s, nullptr, extra));
    MUST(cuEventRecord(stop, s));
    MUST(cuMemcpyDtoHAsync(hy.data(), dy, n * sizeof(int), s));
    MUST(cuStreamSynchronize(s));
    MUST(cuEventSynchronize(stop));
    float ms = -1;
    MUST(cuEventElapsedTime(&ms, start, stop));
    std::printf("axpb: y[0]=%d y[500]=%d y[989]=%d y[990]=%#x elapsed >= 0: %d\n", hy[0], hy[500],
                hy[989], (unsigned)hy[990], ms >= 0);
    SHOW("cuStreamQuery(idle)", cuStreamQuery(s));
    SHOW("cuEventQuery(done)", cuEventQuery(stop));

    // A struct parameter; a __device__ variable; D16 and D8 memsets; device-to-device.
    Pair p = {4, 2.75};
    char c = 5;
    CUdeviceptr dout;
    MUST(cuMemAlloc(&dout, 16));
    void *pair_params[] = {&p, &c, &dout};
    MUST(cuLaunchKernel(pair, 1, 1, 1, 32, 1, 1, 0, s, pair_params, nullptr));
    long long out = 0;
    MUST(cuStreamSynchronize(s));
    MUST(cuMemcpyDtoH(&out, dout, sizeof out));
    std::printf("pair: %lld\n", out);
    CUdeviceptr gcounter;
    size_t gbytes = 0;
    MUST(cuModuleGetGlobal(&gcounter, &gbytes, cubin_mod, "counter"));
    int bump_n = 35;
    void *bump_params[] = {&bump_n};
    MUST(cuLaunchKernel(bump, 1, 1, 1, 1, 1, 1, 0, nullptr, bump_params, nullptr));
    int counter = 0;
    MUST(cuMemcpyDtoH(&counter, gcounter, sizeof counter));
    std::printf("counter: %d (%zu bytes)\n", counter, gbytes);
    SHOW("cuModuleGetGlobal(missing)", cuModuleGetGlobal(&gcounter, &gbytes, cubin_mod, "nope"));
    unsigned short h16[4];
    unsigned char h8[4];
    MUST(cuMemsetD16(dout, 0xabcd, 4));
    MUST(cuMemcpyDtoH(h16, dout, sizeof h16));
    MUST(cuMemsetD8(dout, 0x5a, 3));
    MUST(cuMemcpyDtoH(h8, dout, sizeof h8));
    std::printf("memset: %#x %#x / %#x %#x %#x %#x\n", h16[0], h16[3], h8[0], h8[2], h8[3], h8[3]);
    MUST(cuMemcpyDtoD(dy, dx, n * sizeof(int)));
    MUST(cuMemcpyDtoH(hy.data(), dy, n * sizeof(int)));
    std::printf("dtod: %d %d\n", hy[0], hy[999]);
    MUST(cuMemsetD8(dy, 0, n * sizeof(int)));
    MUST(cuMemcpy(dy + 4, dx, 8));
    MUST(cuMemcpyDtoH(hy.data(), dy, 16));
    std::printf("cuMemcpy: %d %d %d %d\n", hy[0], hy[1], hy[2], hy[3]);

    // A library (context-independent modules) and cuLaunchKernelEx with its CUkernel.
    CUlibrary lib;
    CUkernel lk;
    MUST(cuLibraryLoadData(&lib, drv_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0));
    MUST(cuLibraryGetKernel(&lk, lib, "drv_axpb"));
    CUlaunchConfig config = {};
    config.gridDimX = 2;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 128;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = s;
    int la = -2, lb = 1, ln = 300;
    void *lparams[] = {&dx, &dy, &la, &lb, &ln};
    MUST(cuLaunchKernelEx(&config, (CUfunction)lk, lparams, nullptr));
    MUST(cuStreamSynchronize(s));
    MUST(cuMemcpyDtoH(hy.data(), dy, n * sizeof(int)));
    std::printf("library kernel: %d %d %d\n", hy[0], hy[255], hy[256]);
    MUST(cuLibraryUnload(lib));
    CUlibraryOption keep_opt[] = {CU_LIBRARY_BINARY_IS_PRESERVED};
    void *keep_val[] = {(void *)1};
    CUlibrary kept;
    CUresult kept_r = cuLibraryLoadData(&kept, drv_fatbin, nullptr, nullptr, 0, keep_opt, keep_val, 1);
    std::printf("cuLibraryLoadData(binary preserved): %s\n", name(kept_r));
    if (kept_r == CUDA_SUCCESS)
        MUST(cuLibraryUnload(kept));

    // The runtime and the driver share streams, events and memory.
    int *rt = nullptr;
    cudaMalloc(&rt, n * sizeof(int));
    MUST(cuMemcpyDtoDAsync((CUdeviceptr)rt, dx, n * sizeof(int), s));
    cudaEvent_t rt_event;
    cudaEventCreate(&rt_event);
    MUST(cuEventRecord((CUevent)rt_event, s));
    cudaStreamWaitEvent((cudaStream_t)s, rt_event, 0);
    std::vector<int> back(n);
    cudaMemcpyAsync(back.data(), rt, n * sizeof(int), cudaMemcpyDeviceToHost, (cudaStream_t)s);
    cudaError_t rt_err = cudaStreamSynchronize((cudaStream_t)s);
    std::printf("mixed: %s %d %d\n", cudaGetErrorName(rt_err), back[0], back[999]);
    SHOW("cuMemFree(runtime pointer)", cuMemFree((CUdeviceptr)rt));
    std::printf("runtime last error untouched: %s\n", cudaGetErrorName(cudaGetLastError()));
    SHOW("cuMemFree(bad pointer)", cuMemFree(d + 4));
    std::printf("runtime last error after a failed driver call: %s\n",
                cudaGetErrorName(cudaGetLastError()));

    // Error names, cuGetProcAddress, unloading.
    const char *str = nullptr;
    SHOW("cuGetErrorName(bogus)", cuGetErrorName((CUresult)123456, &str));
    std::printf("bogus name is null: %d\n", str == nullptr);
    void *fn = nullptr;
    CUdriverProcAddressQueryResult status;
    MUST(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    CUdeviceptr via = 0;
    MUST(((CUresult (*)(CUdeviceptr *, size_t))fn)(&via, 128));
    std::printf("cuGetProcAddress(cuMemAlloc): status %d allocates %d\n", (int)status, via != 0);
    SHOW("cuGetProcAddress(cuNoSuch)",
         cuGetProcAddress("cuNoSuchFunction", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    std::printf("status %d\n", (int)status);
    MUST(cuModuleUnload(fat_mod));
    MUST(cuStreamDestroy(s));
    MUST(cuEventDestroy(start));
    MUST(cuEventDestroy(stop));
    MUST(cuMemFree(d));
    MUST(cuMemFree(dx));
    MUST(cuMemFree(dy));
    MUST(cuMemFree(dout));
    MUST(cuMemFree(via));
    MUST(cuDevicePrimaryCtxRelease(dev));
    std::printf("done\n");
    return 0;
}
