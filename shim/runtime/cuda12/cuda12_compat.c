/* The CUDA 12 ABI of libpilot12.so (SONAME libcudart.so.12): the exports whose libcudart.so.12
 * form differs from CUDA 13's, built over the shared sources' CUDA 13 implementation.
 *
 * This file is compiled only into the 12 build, which force-includes the generated
 * cudart12_renames.h everywhere: a CUDA 13 function whose 12.x ABI differs is compiled (and
 * declared by the CUDA 13 headers) as pilot13_<name>, local to the library, and the real name
 * is defined here with the 12.x ABI. Which names those are is shim/tables/cudart12_exports.tsv's
 * business: rows marked impl are the functions below.
 *
 * - cudaDeviceProp: 12.x layout (cuda12_abi.h), filled from the CUDA 13 one plus the fields 13
 *   removed, which come from the device attributes the daemon reported.
 * - Unified memory hints took an int device in 12.x; the _v2 forms took CUDA 13's location.
 * - The cudaThread* aliases of the device functions, and other 12.x-only names.
 * - Texture and surface objects: cudaResourceDesc and cudaResourceViewDesc grew in 13 (12.x's
 *   are their prefixes, cuda12_abi.h); cudaChooseDevice reads the 12.x cudaDeviceProp.
 * - Graph edges and capture dependencies: the 12.x forms lack the edge data CUDA 13 added (the
 *   _v2/_v3 forms have CUDA 13's ABI); cudaStreamGetCaptureInfo was the 3-argument query. */
#include <string.h>

#include "cuda12_abi.h"
#include "shim.h"

#if !defined(PILOT_CUDART_MAJOR) || PILOT_CUDART_MAJOR != 12
#error "cuda12_compat.c belongs to the CUDA 12 build (PILOT_CUDART_MAJOR=12, cudart12_renames.h)"
#endif

/* Defined below with their CUDA 12 ABI; the renamed CUDA 13 ones stay reachable as pilot13_*. */
#undef cudaGetDeviceProperties
#undef cudaMemAdvise
#undef cudaMemPrefetchAsync
#undef cudaMemPrefetchAsync_ptsz
#undef cudaPointerGetAttributes
#undef cudaRuntimeGetVersion
#undef cudaChooseDevice
#undef cudaCreateTextureObject
#undef cudaCreateSurfaceObject
#undef cudaGetTextureObjectResourceDesc
#undef cudaGetTextureObjectResourceViewDesc
#undef cudaGetSurfaceObjectResourceDesc
#undef cudaGraphAddDependencies
#undef cudaGraphAddNode
#undef cudaGraphRemoveDependencies
#undef cudaGraphGetEdges
#undef cudaGraphNodeGetDependencies
#undef cudaGraphNodeGetDependentNodes
#undef cudaStreamGetCaptureInfo
#undef cudaStreamGetCaptureInfo_ptsz
#undef cudaStreamUpdateCaptureDependencies
#undef cudaStreamUpdateCaptureDependencies_ptsz

/* CUDA 13 per-thread-stream entry points the CUDA 13 headers do not declare. */
cudaError_t pilot13_cudaMemPrefetchAsync_ptsz(const void *ptr, size_t count,
                                              struct cudaMemLocation location, unsigned int flags,
                                              cudaStream_t stream);
cudaError_t pilot13_cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                                  enum cudaStreamCaptureStatus *captureStatus_out,
                                                  unsigned long long *id_out, cudaGraph_t *graph_out,
                                                  const cudaGraphNode_t **dependencies_out,
                                                  const cudaGraphEdgeData **edgeData_out,
                                                  size_t *numDependencies_out);
cudaError_t pilot13_cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t stream,
                                                             cudaGraphNode_t *dependencies,
                                                             const cudaGraphEdgeData *dependencyData,
                                                             size_t numDependencies,
                                                             unsigned int flags);

/* ---- device properties ---- */

static void fill_prop12(struct pilot_cuda12_device_prop *p, const struct cudaDeviceProp *p13)
{
    memset(p, 0, sizeof *p);
#define COPY(type, name, dims)                                                                      \
    _Static_assert(sizeof p->name == sizeof p13->name, #name " changed size between 12 and 13");  \
    memcpy(&p->name, &p13->name, sizeof p->name);
#define SKIP(type, name, dims)
    PILOT_CUDA12_DEVICE_PROP_FIELDS(COPY, SKIP)
#undef COPY
#undef SKIP
    const int32_t *a = pilot_device_info()->attrs;
    p->clockRate = a[cudaDevAttrClockRate];
    p->deviceOverlap = a[cudaDevAttrGpuOverlap];
    p->kernelExecTimeoutEnabled = a[cudaDevAttrKernelExecTimeout];
    p->computeMode = a[cudaDevAttrComputeMode];
    p->maxTexture1DLinear = a[cudaDevAttrMaxTexture1DLinearWidth];
    p->memoryClockRate = a[cudaDevAttrMemoryClockRate];
    p->singleToDoublePrecisionPerfRatio = a[cudaDevAttrSingleToDoublePrecisionPerfRatio];
    p->cooperativeMultiDeviceLaunch = a[96]; /* cudaDevAttrCooperativeMultiDeviceLaunch in 12.x */
}

static cudaError_t get_prop12(struct pilot_cuda12_device_prop *prop, int device)
{
    if (!prop)
        PILOT_RETURN(cudaErrorInvalidValue);
    struct cudaDeviceProp p13;
    cudaError_t err = pilot13_cudaGetDeviceProperties(&p13, device); /* session, device checks */
    if (err == cudaSuccess)
        fill_prop12(prop, &p13);
    return err;
}

/* What programs built with 12.x headers call (cudaGetDeviceProperties is a macro for it). */
PILOT_EXPORT cudaError_t cudaGetDeviceProperties_v2(struct pilot_cuda12_device_prop *prop,
                                                    int device)
{
    return get_prop12(prop, device);
}

/* The symbol without _v2 is the CUDA 11 struct: the first 728 bytes of the 12.x one. */
PILOT_EXPORT cudaError_t cudaGetDeviceProperties(void *prop, int device)
{
    if (!prop)
        PILOT_RETURN(cudaErrorInvalidValue);
    struct pilot_cuda12_device_prop p;
    cudaError_t err = get_prop12(&p, device);
    if (err == cudaSuccess)
        memcpy(prop, &p, PILOT_CUDA11_DEVICE_PROP_SIZE);
    return err;
}

/* Only the compute capability counts (api_helpers.c), at the same place in 11.x's and 12.x's. */
PILOT_EXPORT cudaError_t cudaChooseDevice(int *device, const struct pilot_cuda12_device_prop *prop)
{
    if (!prop)
        return pilot13_cudaChooseDevice(device, NULL);
    struct cudaDeviceProp p13;
    memset(&p13, 0, sizeof p13);
    p13.major = prop->major;
    p13.minor = prop->minor;
    return pilot13_cudaChooseDevice(device, &p13);
}

PILOT_EXPORT cudaError_t cudaPointerGetAttributes(struct pilot_cuda12_pointer_attributes *attributes,
                                                  const void *ptr)
{
    struct cudaPointerAttributes a13;
    cudaError_t err = pilot13_cudaPointerGetAttributes(attributes ? &a13 : NULL, ptr);
    if (err == cudaSuccess && attributes) {
        attributes->type = a13.type;
        attributes->device = a13.device;
        attributes->devicePointer = a13.devicePointer;
        attributes->hostPointer = a13.hostPointer;
    }
    return err;
}

PILOT_EXPORT cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        PILOT_RETURN(cudaErrorInvalidValue);
    *version = PILOT_CUDART12_VERSION;
    return cudaSuccess;
}

/* ---- unified memory hints: CUDA 12's device numbers ---- */

/* A 12.x device argument as CUDA 13's location: cudaCpuDeviceId is the host, anything else a
 * device ordinal (an invalid one is refused by the CUDA 13 function, as 12.x refused it). */
static struct cudaMemLocation location_of(int device)
{
    struct cudaMemLocation loc = {.type = cudaMemLocationTypeDevice, .id = device};
    if (device == cudaCpuDeviceId)
        loc = (struct cudaMemLocation){.type = cudaMemLocationTypeHost, .id = 0};
    return loc;
}

PILOT_EXPORT cudaError_t cudaMemAdvise(const void *devPtr, size_t count,
                                       enum cudaMemoryAdvise advice, int device)
{
    return pilot13_cudaMemAdvise(devPtr, count, advice, location_of(device));
}

PILOT_EXPORT cudaError_t cudaMemAdvise_v2(const void *devPtr, size_t count,
                                          enum cudaMemoryAdvise advice,
                                          struct cudaMemLocation location)
{
    return pilot13_cudaMemAdvise(devPtr, count, advice, location);
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice,
                                              cudaStream_t stream)
{
    return pilot13_cudaMemPrefetchAsync(devPtr, count, location_of(dstDevice), 0, stream);
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count, int dstDevice,
                                                   cudaStream_t stream)
{
    return pilot13_cudaMemPrefetchAsync_ptsz(devPtr, count, location_of(dstDevice), 0, stream);
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync_v2(const void *devPtr, size_t count,
                                                 struct cudaMemLocation location,
                                                 unsigned int flags, cudaStream_t stream)
{
    return pilot13_cudaMemPrefetchAsync(devPtr, count, location, flags, stream);
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync_v2_ptsz(const void *devPtr, size_t count,
                                                      struct cudaMemLocation location,
                                                      unsigned int flags, cudaStream_t stream)
{
    return pilot13_cudaMemPrefetchAsync_ptsz(devPtr, count, location, flags, stream);
}

/* ---- names CUDA 13 removed ---- */

PILOT_EXPORT cudaError_t cudaThreadSynchronize(void)
{
    return cudaDeviceSynchronize();
}

PILOT_EXPORT cudaError_t cudaThreadExit(void)
{
    return cudaDeviceReset();
}

PILOT_EXPORT cudaError_t cudaThreadSetLimit(enum cudaLimit limit, size_t value)
{
    return cudaDeviceSetLimit(limit, value);
}

PILOT_EXPORT cudaError_t cudaThreadGetLimit(size_t *value, enum cudaLimit limit)
{
    return cudaDeviceGetLimit(value, limit);
}

PILOT_EXPORT cudaError_t cudaThreadSetCacheConfig(enum cudaFuncCache config)
{
    return cudaDeviceSetCacheConfig(config);
}

PILOT_EXPORT cudaError_t cudaThreadGetCacheConfig(enum cudaFuncCache *config)
{
    return cudaDeviceGetCacheConfig(config);
}

/* 12.8's name for the elapsed time of CUDA 13 (same arguments). */
PILOT_EXPORT cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    return cudaEventElapsedTime(ms, start, end);
}

/* Doubles are native on every GPU CUDA 12 supports: nothing to convert, as in 12.x. */
PILOT_EXPORT cudaError_t cudaSetDoubleForDevice(double *d)
{
    if (!d)
        PILOT_RETURN(cudaErrorInvalidValue);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaSetDoubleForHost(double *d)
{
    if (!d)
        PILOT_RETURN(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* ---- texture and surface objects ---- */

static const struct cudaResourceDesc *resource13(const struct pilot_cuda12_resource_desc *r,
                                                 struct cudaResourceDesc *out)
{
    if (!r)
        return NULL;
    memset(out, 0, sizeof *out); /* flags 0, as 12.x had none */
    out->resType = r->resType;
    memcpy(&out->res, &r->res, sizeof r->res);
    return out;
}

static void resource12(struct pilot_cuda12_resource_desc *r, const struct cudaResourceDesc *r13)
{
    r->resType = r13->resType;
    memcpy(&r->res, &r13->res, sizeof r->res);
}

PILOT_EXPORT cudaError_t cudaCreateTextureObject(cudaTextureObject_t *pTexObject,
                                                 const struct pilot_cuda12_resource_desc *pResDesc,
                                                 const struct cudaTextureDesc *pTexDesc,
                                                 const struct pilot_cuda12_resource_view_desc *view)
{
    struct cudaResourceDesc r13;
    struct cudaResourceViewDesc v13;
    if (view) {
        memset(&v13, 0, sizeof v13);
        memcpy(&v13, view, sizeof *view); /* the 13 struct's prefix */
    }
    return pilot13_cudaCreateTextureObject(pTexObject, resource13(pResDesc, &r13), pTexDesc,
                                           view ? &v13 : NULL);
}

PILOT_EXPORT cudaError_t cudaCreateSurfaceObject(cudaSurfaceObject_t *pSurfObject,
                                                 const struct pilot_cuda12_resource_desc *pResDesc)
{
    struct cudaResourceDesc r13;
    return pilot13_cudaCreateSurfaceObject(pSurfObject, resource13(pResDesc, &r13));
}

PILOT_EXPORT cudaError_t cudaGetTextureObjectResourceDesc(
    struct pilot_cuda12_resource_desc *pResDesc, cudaTextureObject_t texObject)
{
    struct cudaResourceDesc r13;
    cudaError_t err = pilot13_cudaGetTextureObjectResourceDesc(pResDesc ? &r13 : NULL, texObject);
    if (err == cudaSuccess)
        resource12(pResDesc, &r13);
    return err;
}

PILOT_EXPORT cudaError_t cudaGetSurfaceObjectResourceDesc(
    struct pilot_cuda12_resource_desc *pResDesc, cudaSurfaceObject_t surfObject)
{
    struct cudaResourceDesc r13;
    cudaError_t err = pilot13_cudaGetSurfaceObjectResourceDesc(pResDesc ? &r13 : NULL, surfObject);
    if (err == cudaSuccess)
        resource12(pResDesc, &r13);
    return err;
}

PILOT_EXPORT cudaError_t cudaGetTextureObjectResourceViewDesc(
    struct pilot_cuda12_resource_view_desc *pResViewDesc, cudaTextureObject_t texObject)
{
    struct cudaResourceViewDesc v13;
    cudaError_t err = pilot13_cudaGetTextureObjectResourceViewDesc(pResViewDesc ? &v13 : NULL,
                                                                   texObject);
    if (err == cudaSuccess)
        memcpy(pResViewDesc, &v13, sizeof *pResViewDesc);
    return err;
}

/* ---- graphs and stream capture: the forms without edge data ---- */

PILOT_EXPORT cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                                  const cudaGraphNode_t *to, size_t numDependencies)
{
    return pilot13_cudaGraphAddDependencies(graph, from, to, NULL, numDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphAddDependencies_v2(cudaGraph_t graph, const cudaGraphNode_t *from,
                                                     const cudaGraphNode_t *to,
                                                     const cudaGraphEdgeData *edgeData,
                                                     size_t numDependencies)
{
    return pilot13_cudaGraphAddDependencies(graph, from, to, edgeData, numDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphRemoveDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                                     const cudaGraphNode_t *to,
                                                     size_t numDependencies)
{
    return pilot13_cudaGraphRemoveDependencies(graph, from, to, NULL, numDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphRemoveDependencies_v2(cudaGraph_t graph,
                                                        const cudaGraphNode_t *from,
                                                        const cudaGraphNode_t *to,
                                                        const cudaGraphEdgeData *edgeData,
                                                        size_t numDependencies)
{
    return pilot13_cudaGraphRemoveDependencies(graph, from, to, edgeData, numDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphGetEdges(cudaGraph_t graph, cudaGraphNode_t *from,
                                           cudaGraphNode_t *to, size_t *numEdges)
{
    return pilot13_cudaGraphGetEdges(graph, from, to, NULL, numEdges);
}

PILOT_EXPORT cudaError_t cudaGraphGetEdges_v2(cudaGraph_t graph, cudaGraphNode_t *from,
                                              cudaGraphNode_t *to, cudaGraphEdgeData *edgeData,
                                              size_t *numEdges)
{
    return pilot13_cudaGraphGetEdges(graph, from, to, edgeData, numEdges);
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node,
                                                      cudaGraphNode_t *pDependencies,
                                                      size_t *pNumDependencies)
{
    return pilot13_cudaGraphNodeGetDependencies(node, pDependencies, NULL, pNumDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependencies_v2(cudaGraphNode_t node,
                                                         cudaGraphNode_t *pDependencies,
                                                         cudaGraphEdgeData *edgeData,
                                                         size_t *pNumDependencies)
{
    return pilot13_cudaGraphNodeGetDependencies(node, pDependencies, edgeData, pNumDependencies);
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node,
                                                        cudaGraphNode_t *pDependentNodes,
                                                        size_t *pNumDependentNodes)
{
    return pilot13_cudaGraphNodeGetDependentNodes(node, pDependentNodes, NULL, pNumDependentNodes);
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependentNodes_v2(cudaGraphNode_t node,
                                                           cudaGraphNode_t *pDependentNodes,
                                                           cudaGraphEdgeData *edgeData,
                                                           size_t *pNumDependentNodes)
{
    return pilot13_cudaGraphNodeGetDependentNodes(node, pDependentNodes, edgeData,
                                                  pNumDependentNodes);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                  enum cudaStreamCaptureStatus *captureStatus_out,
                                                  unsigned long long *id_out)
{
    return pilot13_cudaStreamGetCaptureInfo(stream, captureStatus_out, id_out, NULL, NULL, NULL,
                                            NULL);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                                       enum cudaStreamCaptureStatus *captureStatus_out,
                                                       unsigned long long *id_out)
{
    return pilot13_cudaStreamGetCaptureInfo_ptsz(stream, captureStatus_out, id_out, NULL, NULL,
                                                 NULL, NULL);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
                                                     enum cudaStreamCaptureStatus *captureStatus_out,
                                                     unsigned long long *id_out,
                                                     cudaGraph_t *graph_out,
                                                     const cudaGraphNode_t **dependencies_out,
                                                     size_t *numDependencies_out)
{
    return pilot13_cudaStreamGetCaptureInfo(stream, captureStatus_out, id_out, graph_out,
                                            dependencies_out, NULL, numDependencies_out);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_v2_ptsz(
    cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out, unsigned long long *id_out,
    cudaGraph_t *graph_out, const cudaGraphNode_t **dependencies_out, size_t *numDependencies_out)
{
    return pilot13_cudaStreamGetCaptureInfo_ptsz(stream, captureStatus_out, id_out, graph_out,
                                                 dependencies_out, NULL, numDependencies_out);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream,
                                                     enum cudaStreamCaptureStatus *captureStatus_out,
                                                     unsigned long long *id_out,
                                                     cudaGraph_t *graph_out,
                                                     const cudaGraphNode_t **dependencies_out,
                                                     const cudaGraphEdgeData **edgeData_out,
                                                     size_t *numDependencies_out)
{
    return pilot13_cudaStreamGetCaptureInfo(stream, captureStatus_out, id_out, graph_out,
                                            dependencies_out, edgeData_out, numDependencies_out);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_v3_ptsz(
    cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out, unsigned long long *id_out,
    cudaGraph_t *graph_out, const cudaGraphNode_t **dependencies_out,
    const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    return pilot13_cudaStreamGetCaptureInfo_ptsz(stream, captureStatus_out, id_out, graph_out,
                                                 dependencies_out, edgeData_out,
                                                 numDependencies_out);
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream,
                                                             cudaGraphNode_t *dependencies,
                                                             size_t numDependencies,
                                                             unsigned int flags)
{
    return pilot13_cudaStreamUpdateCaptureDependencies(stream, dependencies, NULL,
                                                       numDependencies, flags);
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t stream,
                                                                  cudaGraphNode_t *dependencies,
                                                                  size_t numDependencies,
                                                                  unsigned int flags)
{
    return pilot13_cudaStreamUpdateCaptureDependencies_ptsz(stream, dependencies, NULL,
                                                            numDependencies, flags);
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_v2(cudaStream_t stream,
                                                                cudaGraphNode_t *dependencies,
                                                                const cudaGraphEdgeData *dependencyData,
                                                                size_t numDependencies,
                                                                unsigned int flags)
{
    return pilot13_cudaStreamUpdateCaptureDependencies(stream, dependencies, dependencyData,
                                                       numDependencies, flags);
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_v2_ptsz(
    cudaStream_t stream, cudaGraphNode_t *dependencies, const cudaGraphEdgeData *dependencyData,
    size_t numDependencies, unsigned int flags)
{
    return pilot13_cudaStreamUpdateCaptureDependencies_ptsz(stream, dependencies, dependencyData,
                                                            numDependencies, flags);
}

/* The node parameters have CUDA 13's layout (cudaGraphNodeSetParams is as13). */
PILOT_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          size_t numDependencies,
                                          struct cudaGraphNodeParams *nodeParams)
{
    return pilot13_cudaGraphAddNode(pGraphNode, graph, pDependencies, NULL, numDependencies,
                                    nodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                             const cudaGraphNode_t *pDependencies,
                                             const cudaGraphEdgeData *dependencyData,
                                             size_t numDependencies,
                                             struct cudaGraphNodeParams *nodeParams)
{
    return pilot13_cudaGraphAddNode(pGraphNode, graph, pDependencies, dependencyData,
                                    numDependencies, nodeParams);
}
