// cuda12: a CUDA 12 program (12.x runtime headers, linked with libcudart.so.12), run under
// libpilot12.so. Built twice by tests/apps/test_cuda12.py: as CUDA 12.0-12.3 did (<<<>>> calls
// cudaLaunchKernel with the host stub: -D__NV_LEGACY_LAUNCH) and as 12.4+ does (__cudaGetKernel
// and __cudaLaunchKernel). Exercises what differs from CUDA 13: the 12.x cudaDeviceProp
// (cudaGetDeviceProperties_v2), the cudaThread* aliases, int-device unified memory hints and the
// 12.x cudaPointerAttributes, and the 12.x forms of graph calls that CUDA 13 changed (the capture
// query that cudaStreamGetCaptureInfo_v2 was, edge queries without edge data). Prints lines the
// test recomputes, then PASS.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUDART_VERSION >= 13000 || CUDART_VERSION < 12000
#error "build with the CUDA 12 runtime headers"
#endif

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

__global__ void axpy12(int *y, const int *x, int a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

static long long sum(const int *v, int n)
{
    long long s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return s;
}

int main(void)
{
    int version = 0;
    CHECK(cudaRuntimeGetVersion(&version));
    printf("runtime %d\n", version);

    // 12.x headers turn this into cudaGetDeviceProperties_v2 with the 1032-byte 12.x struct.
    // A canary behind it catches a shim that writes CUDA 13's layout (or more) into it.
    struct {
        cudaDeviceProp p;
        unsigned char canary[64];
    } prop;
    memset(prop.canary, 0xA5, sizeof prop.canary);
    CHECK(cudaGetDeviceProperties(&prop.p, 0));
    const cudaDeviceProp &p = prop.p;
    printf("name %s\n", p.name);
    printf("sm %d.%d multiProcessorCount %d warpSize %d maxThreadsPerBlock %d\n", p.major, p.minor,
           p.multiProcessorCount, p.warpSize, p.maxThreadsPerBlock);
    printf("clockRate %d memoryClockRate %d memoryBusWidth %d l2CacheSize %d\n", p.clockRate,
           p.memoryClockRate, p.memoryBusWidth, p.l2CacheSize);
    printf("deviceOverlap %d kernelExecTimeoutEnabled %d computeMode %d maxTexture1DLinear %d\n",
           p.deviceOverlap, p.kernelExecTimeoutEnabled, p.computeMode, p.maxTexture1DLinear);
    printf("singleToDoublePrecisionPerfRatio %d cooperativeMultiDeviceLaunch %d\n",
           p.singleToDoublePrecisionPerfRatio, p.cooperativeMultiDeviceLaunch);
    printf("sharedMemPerBlockOptin %zu clusterLaunch %d unifiedFunctionPointers %d\n",
           p.sharedMemPerBlockOptin, p.clusterLaunch, p.unifiedFunctionPointers);
    int canary_ok = 1;
    for (size_t i = 0; i < sizeof prop.canary; i++)
        canary_ok &= prop.canary[i] == 0xA5;
    printf("properties canary %s\n", canary_ok ? "intact" : "OVERWRITTEN");
    int clock = 0;
    CHECK(cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, 0));
    printf("attribute clockRate %d\n", clock);

    const int n = 1000;
    int *hx = (int *)malloc(n * sizeof(int)), *hy = (int *)malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) {
        hx[i] = i;
        hy[i] = 3 * i - 7;
    }
    int *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(int)));
    CHECK(cudaMalloc(&dy, n * sizeof(int)));
    CHECK(cudaMemcpy(dx, hx, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, hy, n * sizeof(int), cudaMemcpyHostToDevice));

    axpy12<<<(n + 127) / 128, 128>>>(dy, dx, 2, n);  // y = 2x + y
    CHECK(cudaGetLastError());
    CHECK(cudaThreadSynchronize());
    CHECK(cudaMemcpy(hy, dy, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("<<<>>> sum %lld\n", sum(hy, n));

    int a = 5, m = 600;  // the runtime API with the host stub, as 12.0-12.3's <<<>>> did
    void *args[] = {&dy, &dx, &a, &m};
    CHECK(cudaLaunchKernel((const void *)axpy12, dim3(5), dim3(128), args, 0, 0));
    CHECK(cudaThreadSynchronize());
    CHECK(cudaMemcpy(hy, dy, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("cudaLaunchKernel sum %lld\n", sum(hy, n));

    size_t heap = 0;
    CHECK(cudaThreadSetLimit(cudaLimitMallocHeapSize, 32u << 20));
    CHECK(cudaThreadGetLimit(&heap, cudaLimitMallocHeapSize));
    printf("cudaThreadGetLimit heap %zu MiB\n", heap >> 20);
    cudaFuncCache cache = cudaFuncCachePreferNone;
    CHECK(cudaThreadSetCacheConfig(cudaFuncCachePreferShared));
    CHECK(cudaThreadGetCacheConfig(&cache));
    printf("cudaThreadGetCacheConfig %d\n", (int)cache);

    // a captured graph, queried with the 12.x forms (no edge data), launched twice: y += 4x
    cudaStream_t cs;
    CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    axpy12<<<(n + 127) / 128, 128, 0, cs>>>(dy, dx, 1, n);
    axpy12<<<(n + 127) / 128, 128, 0, cs>>>(dy, dx, 1, n);
    cudaStreamCaptureStatus status;
    unsigned long long capture_id = 0;
    cudaGraph_t building = NULL;
    const cudaGraphNode_t *capture_deps = NULL;
    size_t ncapture_deps = 0;
    CHECK(cudaStreamGetCaptureInfo(cs, &status, &capture_id, &building, &capture_deps,
                                   &ncapture_deps));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(cs, &graph));
    size_t edges = 0, nnodes = 2, deps0 = 0, deps1 = 0;
    cudaGraphNode_t nodes[2];
    CHECK(cudaGraphGetEdges(graph, NULL, NULL, &edges));
    CHECK(cudaGraphGetNodes(graph, nodes, &nnodes));
    CHECK(cudaGraphNodeGetDependencies(nodes[0], NULL, &deps0));
    CHECK(cudaGraphNodeGetDependencies(nodes[1], NULL, &deps1));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, cs));
    CHECK(cudaGraphLaunch(exec, cs));
    CHECK(cudaStreamSynchronize(cs));
    CHECK(cudaMemcpy(hy, dy, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("graph capture status %d deps %zu nodes %zu edges %zu deps %zu sum %lld\n", (int)status,
           ncapture_deps, nnodes, edges, deps0 + deps1, sum(hy, n));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(cs));

    // int-device hints and their _v2 forms must reach the same CUDA 13 function.
    cudaMemLocation dev0 = {cudaMemLocationTypeDevice, 0};
    cudaError_t advise = cudaMemAdvise(dy, n * sizeof(int), cudaMemAdviseSetPreferredLocation, 0);
    cudaError_t advise2 = cudaMemAdvise_v2(dy, n * sizeof(int), cudaMemAdviseSetPreferredLocation,
                                           dev0);
    cudaError_t prefetch = cudaMemPrefetchAsync(dy, n * sizeof(int), 0, 0);
    cudaError_t prefetch2 = cudaMemPrefetchAsync_v2(dy, n * sizeof(int), dev0, 0, 0);
    printf("cudaMemAdvise int == _v2: %s\n", advise == advise2 ? "yes" : "no");
    printf("cudaMemPrefetchAsync int == _v2: %s\n", prefetch == prefetch2 ? "yes" : "no");
    struct {
        cudaPointerAttributes a;
        unsigned char canary[64];
    } attrs;
    memset(attrs.canary, 0xA5, sizeof attrs.canary);
    cudaError_t pa = cudaPointerGetAttributes(&attrs.a, dy);
    canary_ok = 1;
    for (size_t i = 0; i < sizeof attrs.canary; i++)
        canary_ok &= attrs.canary[i] == 0xA5;
    printf("pointer attributes canary %s\n", canary_ok ? "intact" : "OVERWRITTEN");
    if (pa == cudaSuccess && attrs.a.devicePointer != dy)
        printf("pointer attributes: devicePointer %p, want %p\n", attrs.a.devicePointer, dy);
    cudaGetLastError();  // whatever the hints returned is not this program's concern

    // Texture objects take and give 12.x's cudaResourceDesc / cudaResourceViewDesc (smaller than
    // 13's): a pitch2D texture over dy, its descriptors read back into structs with canaries.
    struct {
        cudaResourceDesc r;
        unsigned char canary[64];
    } rd;
    memset(&rd, 0, sizeof rd.r);
    memset(rd.canary, 0xA5, sizeof rd.canary);
    rd.r.resType = cudaResourceTypePitch2D;
    rd.r.res.pitch2D.devPtr = dy;
    rd.r.res.pitch2D.desc = cudaCreateChannelDesc<int>();
    rd.r.res.pitch2D.width = 25;
    rd.r.res.pitch2D.height = 7;
    rd.r.res.pitch2D.pitchInBytes = 512;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    struct {
        cudaResourceViewDesc v;
        unsigned char canary[64];
    } vd;
    memset(&vd, 0, sizeof vd.v);
    memset(vd.canary, 0xA5, sizeof vd.canary);
    vd.v.format = cudaResViewFormatSignedInt1;
    vd.v.width = 25;
    vd.v.height = 7;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &rd.r, &td, &vd.v));
    memset(&rd.r, 0, sizeof rd.r);
    memset(&vd.v, 0, sizeof vd.v);
    CHECK(cudaGetTextureObjectResourceDesc(&rd.r, tex));
    CHECK(cudaGetTextureObjectResourceViewDesc(&vd.v, tex));
    canary_ok = 1;
    for (size_t i = 0; i < sizeof rd.canary; i++)
        canary_ok &= rd.canary[i] == 0xA5 && vd.canary[i] == 0xA5;
    printf("texture descs canary %s type %d %zux%zu pitch %zu view %d %zux%zu\n",
           canary_ok ? "intact" : "OVERWRITTEN", (int)rd.r.resType, rd.r.res.pitch2D.width,
           rd.r.res.pitch2D.height, rd.r.res.pitch2D.pitchInBytes, (int)vd.v.format, vd.v.width,
           vd.v.height);
    CHECK(cudaDestroyTextureObject(tex));
    cudaDeviceProp want;
    memset(&want, 0, sizeof want);
    want.major = 9;
    int chosen = -1;
    CHECK(cudaChooseDevice(&chosen, &want));
    printf("cudaChooseDevice sm 9.0: %d\n", chosen);

    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaThreadExit());
    free(hx);
    free(hy);
    printf("PASS\n");
    return 0;
}
