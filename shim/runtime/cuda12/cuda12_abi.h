/* The libcudart.so.12 ABI where it differs from CUDA 13's: what shim/runtime/cuda12/cuda12_compat.c needs to
 * serve programs built with CUDA 12 headers. The layouts are those of CUDA 12.9 (the newest 12.x,
 * whose libcudart.so.12 is the one the 12 build stands in for); tests/unit/test_cuda12.py checks
 * every offset against the real 12.x headers when they are installed (PyPI's
 * nvidia-cuda-runtime-cu12, a test dependency). Included only by the CUDA 12 build. */
#ifndef PILOT_CUDA12_ABI_H
#define PILOT_CUDA12_ABI_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* cudaRuntimeGetVersion of the runtime the 12 build stands in for. */
#define PILOT_CUDART12_VERSION 12090

/* struct cudaDeviceProp of CUDA 12.x, field by field in declaration order (1032 bytes).
 * C(type, name, dims): also in CUDA 13's cudaDeviceProp, same type: copied from it.
 * O(type, name, dims): only in 12.x (13 removed it): filled from device attributes. */
#define PILOT_CUDA12_DEVICE_PROP_FIELDS(C, O) \
    C(char, name, [256]) C(cudaUUID_t, uuid, ) C(char, luid, [8])                                  \
    C(unsigned int, luidDeviceNodeMask, ) C(size_t, totalGlobalMem, )                              \
    C(size_t, sharedMemPerBlock, ) C(int, regsPerBlock, ) C(int, warpSize, ) C(size_t, memPitch, ) \
    C(int, maxThreadsPerBlock, ) C(int, maxThreadsDim, [3]) C(int, maxGridSize, [3])               \
    O(int, clockRate, )                                                                            \
    C(size_t, totalConstMem, ) C(int, major, ) C(int, minor, ) C(size_t, textureAlignment, )       \
    C(size_t, texturePitchAlignment, )                                                             \
    O(int, deviceOverlap, )                                                                        \
    C(int, multiProcessorCount, )                                                                  \
    O(int, kernelExecTimeoutEnabled, )                                                             \
    C(int, integrated, ) C(int, canMapHostMemory, )                                                \
    O(int, computeMode, )                                                                          \
    C(int, maxTexture1D, ) C(int, maxTexture1DMipmap, )                                            \
    O(int, maxTexture1DLinear, )                                                                   \
    C(int, maxTexture2D, [2]) C(int, maxTexture2DMipmap, [2]) C(int, maxTexture2DLinear, [3])      \
    C(int, maxTexture2DGather, [2]) C(int, maxTexture3D, [3]) C(int, maxTexture3DAlt, [3])         \
    C(int, maxTextureCubemap, ) C(int, maxTexture1DLayered, [2]) C(int, maxTexture2DLayered, [3])  \
    C(int, maxTextureCubemapLayered, [2]) C(int, maxSurface1D, ) C(int, maxSurface2D, [2])         \
    C(int, maxSurface3D, [3]) C(int, maxSurface1DLayered, [2]) C(int, maxSurface2DLayered, [3])    \
    C(int, maxSurfaceCubemap, ) C(int, maxSurfaceCubemapLayered, [2])                              \
    C(size_t, surfaceAlignment, ) C(int, concurrentKernels, ) C(int, ECCEnabled, )                 \
    C(int, pciBusID, ) C(int, pciDeviceID, ) C(int, pciDomainID, ) C(int, tccDriver, )             \
    C(int, asyncEngineCount, ) C(int, unifiedAddressing, )                                         \
    O(int, memoryClockRate, )                                                                      \
    C(int, memoryBusWidth, ) C(int, l2CacheSize, ) C(int, persistingL2CacheMaxSize, )              \
    C(int, maxThreadsPerMultiProcessor, ) C(int, streamPrioritiesSupported, )                      \
    C(int, globalL1CacheSupported, ) C(int, localL1CacheSupported, )                               \
    C(size_t, sharedMemPerMultiprocessor, ) C(int, regsPerMultiprocessor, )                        \
    C(int, managedMemory, ) C(int, isMultiGpuBoard, ) C(int, multiGpuBoardGroupID, )               \
    C(int, hostNativeAtomicSupported, )                                                            \
    O(int, singleToDoublePrecisionPerfRatio, )                                                     \
    C(int, pageableMemoryAccess, ) C(int, concurrentManagedAccess, )                               \
    C(int, computePreemptionSupported, ) C(int, canUseHostPointerForRegisteredMem, )               \
    C(int, cooperativeLaunch, )                                                                    \
    O(int, cooperativeMultiDeviceLaunch, )                                                         \
    C(size_t, sharedMemPerBlockOptin, ) C(int, pageableMemoryAccessUsesHostPageTables, )           \
    C(int, directManagedMemAccessFromHost, ) C(int, maxBlocksPerMultiProcessor, )                  \
    C(int, accessPolicyMaxWindowSize, ) C(size_t, reservedSharedMemPerBlock, )                     \
    C(int, hostRegisterSupported, ) C(int, sparseCudaArraySupported, )                             \
    C(int, hostRegisterReadOnlySupported, ) C(int, timelineSemaphoreInteropSupported, )            \
    C(int, memoryPoolsSupported, ) C(int, gpuDirectRDMASupported, )                                \
    C(unsigned int, gpuDirectRDMAFlushWritesOptions, ) C(int, gpuDirectRDMAWritesOrdering, )       \
    C(unsigned int, memoryPoolSupportedHandleTypes, ) C(int, deferredMappingCudaArraySupported, )  \
    C(int, ipcEventSupported, ) C(int, clusterLaunch, ) C(int, unifiedFunctionPointers, )          \
    O(int, reserved, [63])

#define PILOT_CUDA12_FIELD(type, name, dims) type name dims;
struct pilot_cuda12_device_prop {
    PILOT_CUDA12_DEVICE_PROP_FIELDS(PILOT_CUDA12_FIELD, PILOT_CUDA12_FIELD)
};
#undef PILOT_CUDA12_FIELD
_Static_assert(sizeof(struct pilot_cuda12_device_prop) == 1032, "cudaDeviceProp of CUDA 12.9");
_Static_assert(offsetof(struct pilot_cuda12_device_prop, clockRate) == 348, "12.x clockRate");
_Static_assert(offsetof(struct pilot_cuda12_device_prop, multiProcessorCount) == 388,
               "12.x multiProcessorCount");
/* cudaGetDeviceProperties (no _v2) of libcudart.so.12 fills CUDA 11's struct: the first 728
 * bytes of the 12.x one, up to reservedSharedMemPerBlock. */
#define PILOT_CUDA11_DEVICE_PROP_SIZE                                                               \
    (offsetof(struct pilot_cuda12_device_prop, reservedSharedMemPerBlock) + sizeof(size_t))
_Static_assert(PILOT_CUDA11_DEVICE_PROP_SIZE == 728, "cudaDeviceProp of CUDA 11.x");

/* struct cudaPointerAttributes of CUDA 12.x: CUDA 13's without its trailing reserved words. */
struct pilot_cuda12_pointer_attributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};
_Static_assert(sizeof(struct pilot_cuda12_pointer_attributes) == 24, "12.x cudaPointerAttributes");

/* struct cudaResourceDesc of CUDA 12.x: CUDA 13 added a 128-byte member to the union and `flags`
 * after it, so the 12.x one is the 13 one's resType and the start of its union. */
struct pilot_cuda12_resource_desc {
    enum cudaResourceType resType;
    union {
        struct {
            cudaArray_t array;
        } array;
        struct {
            cudaMipmappedArray_t mipmap;
        } mipmap;
        struct {
            void *devPtr;
            struct cudaChannelFormatDesc desc;
            size_t sizeInBytes;
        } linear;
        struct {
            void *devPtr;
            struct cudaChannelFormatDesc desc;
            size_t width;
            size_t height;
            size_t pitchInBytes;
        } pitch2D;
    } res;
};
_Static_assert(sizeof(struct pilot_cuda12_resource_desc) == 64, "12.x cudaResourceDesc");

/* struct cudaResourceViewDesc of CUDA 12.x: CUDA 13's without its trailing reserved words. */
struct pilot_cuda12_resource_view_desc {
    enum cudaResourceViewFormat format;
    size_t width;
    size_t height;
    size_t depth;
    unsigned int firstMipmapLevel;
    unsigned int lastMipmapLevel;
    unsigned int firstLayer;
    unsigned int lastLayer;
};
_Static_assert(sizeof(struct pilot_cuda12_resource_view_desc) == 48, "12.x cudaResourceViewDesc");

#endif
