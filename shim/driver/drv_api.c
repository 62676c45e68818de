/* libpilot-cuda.so: modules and libraries, functions, launches, memory, streams, events and
 * pointer attributes. Each is the runtime shim's own path (driver_ops.h): a CUmodule or
 * CUlibrary is an image of registry.c (validated against its list), a CUfunction or CUkernel one
 * of its kernels (validated by pilot_kernel_from_handle), a CUstream or CUevent the runtime's
 * handle for the same daemon object (checked there against the session), a CUdeviceptr a device
 * pointer of the session's allocation mirror. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drv.h"

#define OPS pilot_drv_ops

/* ---- modules ---- */

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

/* The size of an image handed over by address only: a fatbin's header says it, a cubin's ELF
 * headers do (the furthest of its section headers, program headers and section contents), PTX
 * ends at its NUL. 0: an empty image. */
static size_t image_size(const void **image)
{
    const unsigned char *p = *image;
    uint32_t magic;
    memcpy(&magic, p, sizeof magic);
    if (magic == FATBIN_WRAPPER_MAGIC) { /* the __fatBinC_Wrapper_t nvcc embeds */
        const void *data;
        memcpy(&data, p + 8, sizeof data);
        *image = p = data;
        memcpy(&magic, p, sizeof magic);
    }
    if (magic == FATBIN_MAGIC) {
        uint16_t header;
        uint64_t fat;
        memcpy(&header, p + 6, sizeof header);
        memcpy(&fat, p + 8, sizeof fat);
        return header + fat;
    }
    if (memcmp(p, "\177ELF", 4) == 0 && p[4] == 2) {
        uint64_t phoff, shoff;
        uint16_t phentsize, phnum, shentsize, shnum;
        memcpy(&phoff, p + 32, 8);
        memcpy(&shoff, p + 40, 8);
        memcpy(&phentsize, p + 54, 2);
        memcpy(&phnum, p + 56, 2);
        memcpy(&shentsize, p + 58, 2);
        memcpy(&shnum, p + 60, 2);
        uint64_t end = 64;
        if (shoff + (uint64_t)shentsize * shnum > end)
            end = shoff + (uint64_t)shentsize * shnum;
        if (phoff + (uint64_t)phentsize * phnum > end)
            end = phoff + (uint64_t)phentsize * phnum;
        for (uint16_t i = 0; i < shnum && shentsize >= 64; i++) {
            const unsigned char *sh = p + shoff + (uint64_t)i * shentsize;
            uint32_t type;
            uint64_t offset, size;
            memcpy(&type, sh + 4, 4);
            memcpy(&offset, sh + 24, 8);
            memcpy(&size, sh + 32, 8);
            if (type != 8 /* SHT_NOBITS */ && offset + size > end)
                end = offset + size;
        }
        return end;
    }
    return strlen((const char *)p) + 1;
}

static CUresult load(const void *image, int dev, struct pilot_image **out)
{
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = image_size(&image);
    if (size <= 1)
        return CUDA_ERROR_INVALID_IMAGE;
    /* the daemon's driver (or the sim) answers CUDA_ERROR_INVALID_IMAGE, _INVALID_PTX,
     * _NO_BINARY_FOR_GPU as the program's own cuModuleLoadData would */
    return PILOT_DRV_RT(OPS->module_load_image(image, size, dev, out));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return load(image, pilot_drv_device(), (struct pilot_image **)module);
}

/* A module load's JIT report (pilot_drv_jit_report): the daemon's driver compiles, so the info
 * log is empty and the error log names the error. Options that tune the compilation have no
 * effect. */
static void jit_report(unsigned int n, const CUjit_option *options, void **values, CUresult r)
{
    char message[128] = "";
    if (r != CUDA_SUCCESS) {
        const char *err = NULL;
        cuGetErrorName(r, &err);
        snprintf(message, sizeof message, "pilot: the daemon's driver did not load the module (%s)",
                 err ? err : "unknown error");
    }
    pilot_drv_jit_report(n, options, values, r, message, strlen(message));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                                     unsigned int numOptions, CUjit_option *options,
                                                     void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuModuleLoadData(module, image);
    jit_report(numOptions, options, optionValues, r);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return cuModuleLoadData(module, fatCubin);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    FILE *f = fopen(fname, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *data = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 65536 + 1 > cap) {
            char *grown = realloc(data, cap = (len + 65536 + 1) * 2);
            if (!grown) {
                free(data);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            data = grown;
        }
        got = fread(data + len, 1, 65536, f);
        len += got;
    } while (got > 0);
    fclose(f);
    data[len] = '\0'; /* PTX text ends at its NUL */
    CUresult r = len ? load(data, pilot_drv_device(), (struct pilot_image **)module)
                     : CUDA_ERROR_INVALID_IMAGE;
    free(data);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    PILOT_DRV_ENTER(0);
    if (!OPS->module_valid((struct pilot_image *)hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->module_unload((struct pilot_image *)hmod));
}

/* The loading mode the daemon's driver uses does not show to the program: report what its own
 * driver would pick from the environment (lazy unless CUDA_MODULE_LOADING=EAGER). */
PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    const char *env = getenv("CUDA_MODULE_LOADING");
    *mode = env && strcmp(env, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

static CUresult get_function(struct pilot_image *img, const char *name, int dev,
                             struct pilot_kernel **out)
{
    if (!OPS->module_valid(img))
        return CUDA_ERROR_INVALID_HANDLE;
    cudaError_t err = OPS->module_function(img, name, dev, out);
    return err == cudaErrorInvalidDeviceFunction ? CUDA_ERROR_NOT_FOUND : pilot_drv_result(err);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod,
                                                      const char *name)
{
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return get_function((struct pilot_image *)hmod, name, pilot_drv_device(),
                        (struct pilot_kernel **)hfunc);
}

static CUresult get_global(struct pilot_image *img, const char *name, int dev, CUdeviceptr *dptr,
                           size_t *bytes)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!OPS->module_valid(img))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t ptr = 0, size = 0;
    CUresult r = PILOT_DRV_RT(OPS->module_global(img, name, dev, &ptr, &size));
    if (r == CUDA_SUCCESS) {
        if (dptr)
            *dptr = (CUdeviceptr)ptr;
        if (bytes)
            *bytes = (size_t)size;
    }
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes,
                                                       CUmodule hmod, const char *name)
{
    PILOT_DRV_ENTER(1);
    return get_global((struct pilot_image *)hmod, name, pilot_drv_device(), dptr, bytes);
}

/* Libraries are context-independent natively; here a library is a module of the session, loaded
 * on the current context's device (device 0 without one). */
PILOT_DRV_EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code,
                                                    CUjit_option *jitOptions,
                                                    void **jitOptionsValues,
                                                    unsigned int numJitOptions,
                                                    CUlibraryOption *libraryOptions,
                                                    void **libraryOptionValues,
                                                    unsigned int numLibraryOptions)
{
    (void)libraryOptionValues;
    if (!library || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < numLibraryOptions; i++) {
        /* the image is copied to the daemon at once: whether the program keeps it is moot */
        if (libraryOptions[i] != CU_LIBRARY_BINARY_IS_PRESERVED) {
            pilot_drv_log_unsupported("cuLibraryLoadData (a host function and data table)");
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    PILOT_DRV_ENTER(0);
    CUresult r = load(code, pilot_drv_device(), (struct pilot_image **)library);
    jit_report(numJitOptions, jitOptions, jitOptionsValues, r);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    return cuModuleUnload((CUmodule)library);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library,
                                                     const char *name)
{
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    return get_function((struct pilot_image *)library, name, pilot_drv_device(),
                        (struct pilot_kernel **)pKernel);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    if (!OPS->module_valid((struct pilot_image *)library))
        return CUDA_ERROR_INVALID_HANDLE;
    *pMod = (CUmodule)library;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes,
                                                     CUlibrary library, const char *name)
{
    PILOT_DRV_ENTER(0);
    return get_global((struct pilot_image *)library, name, pilot_drv_device(), dptr, bytes);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!OPS->kernel_from_handle(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    *pFunc = (CUfunction)kernel;
    return CUDA_SUCCESS;
}

/* ---- functions ---- */

static struct pilot_kernel *kernel(CUfunction f)
{
    return f ? OPS->kernel_from_handle(f) : NULL;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags)
{
    if (!numBlocks)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!kernel(func))
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize,
                                                                         CUfunction func,
                                                                         int numBlocks, int blockSize)
{
    if (!dynamicSmemSize)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!kernel(func))
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->available_smem(dynamicSmemSize, func, numBlocks, blockSize));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(
    int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                dynamicSMemSize, CU_OCCUPANCY_DEFAULT);
}

/* The block size with the most resident threads per SM, and the grid that fills the GPU at it:
 * every multiple of the warp size up to the limit, largest first, as CUDA's own
 * cudaOccupancyMaxPotentialBlockSizeVariableSMem (cuda_runtime.h) searches. */
PILOT_DRV_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(
    int *minGridSize, int *blockSize, CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
    size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    if (!minGridSize || !blockSize || blockSizeLimit < 0)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!kernel(func))
        return CUDA_ERROR_INVALID_HANDLE;
    int device, sms, warp, device_threads, sm_threads, func_threads;
    CUresult r = PILOT_DRV_RT(OPS->cudaGetDevice(&device));
    if (!r)
        r = PILOT_DRV_RT(OPS->cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (!r)
        r = PILOT_DRV_RT(OPS->cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, device));
    if (!r)
        r = PILOT_DRV_RT(OPS->cudaDeviceGetAttribute(&device_threads, cudaDevAttrMaxThreadsPerBlock,
                                                     device));
    if (!r)
        r = PILOT_DRV_RT(OPS->cudaDeviceGetAttribute(&sm_threads,
                                                     cudaDevAttrMaxThreadsPerMultiProcessor, device));
    if (r)
        return r;
    struct cudaFuncAttributes a;
    if ((r = PILOT_DRV_RT(OPS->cudaFuncGetAttributes(&a, func))))
        return r;
    func_threads = a.maxThreadsPerBlock;
    int limit = device_threads < func_threads ? device_threads : func_threads;
    if (blockSizeLimit > 0 && blockSizeLimit < limit)
        limit = blockSizeLimit;
    if (warp <= 0 || limit <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int best_blocks = 0, best_size = 0, best_threads = 0;
    for (int size = (limit + warp - 1) / warp * warp; size > 0; size -= warp) {
        int try_size = size > limit ? limit : size;
        size_t smem = blockSizeToDynamicSMemSize ? blockSizeToDynamicSMemSize(try_size)
                                                 : dynamicSMemSize;
        int blocks = 0;
        if ((r = PILOT_DRV_RT(OPS->occupancy(&blocks, func, try_size, smem, flags))))
            return r;
        if (blocks * try_size > best_threads) {
            best_blocks = blocks;
            best_size = try_size;
            best_threads = blocks * try_size;
        }
        if (best_threads == sm_threads)
            break;
    }
    *minGridSize = best_blocks * sms;
    *blockSize = best_size;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(
    int *minGridSize, int *blockSize, CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
    size_t dynamicSMemSize, int blockSizeLimit)
{
    return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func,
                                                     blockSizeToDynamicSMemSize, dynamicSMemSize,
                                                     blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib,
                                                     CUfunction hfunc)
{
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!kernel(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    struct cudaFuncAttributes a;
    CUresult r = PILOT_DRV_RT(OPS->cudaFuncGetAttributes(&a, hfunc));
    if (r != CUDA_SUCCESS)
        return r;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = a.maxThreadsPerBlock; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = (int)a.sharedSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = (int)a.constSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = (int)a.localSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = a.numRegs; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = a.ptxVersion; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = a.binaryVersion; break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = a.cacheModeCA; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = a.maxDynamicSharedSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = a.preferredShmemCarveout; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *pi = a.clusterDimMustBeSet; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *pi = a.requiredClusterWidth; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *pi = a.requiredClusterHeight; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *pi = a.requiredClusterDepth; break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        *pi = a.nonPortableClusterSizeAllowed;
        break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        *pi = a.clusterSchedulingPolicyPreference;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                                                     int value)
{
    PILOT_DRV_ENTER(1);
    if (!kernel(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    /* The runtime passes the attribute number to the daemon's cuFuncSetAttribute unchanged. */
    return PILOT_DRV_RT(OPS->cudaFuncSetAttribute(hfunc, (enum cudaFuncAttribute)attrib, value));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    PILOT_DRV_ENTER(1);
    if (!kernel(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    return (unsigned)config > CU_FUNC_CACHE_PREFER_EQUAL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- launches ---- */

static CUresult launch(CUfunction f, dim3 grid, dim3 block, unsigned shared, CUstream stream,
                       void **kernelParams, void **extra)
{
    PILOT_DRV_ENTER(1);
    struct pilot_kernel *k = kernel(f);
    if (!k)
        return CUDA_ERROR_INVALID_HANDLE;
    const void *packed = NULL;
    size_t packed_size = 0;
    int have_size = 0;
    if (extra) {
        if (kernelParams)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
                packed = extra[i + 1];
            } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
                memcpy(&packed_size, extra[i + 1], sizeof packed_size);
                have_size = 1;
            } else {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        if (!packed || !have_size)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return PILOT_DRV_RT(OPS->launch(k, grid, block, kernelParams, packed, packed_size, shared,
                                    (cudaStream_t)stream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                                 unsigned int gridDimY, unsigned int gridDimZ,
                                                 unsigned int blockDimX, unsigned int blockDimY,
                                                 unsigned int blockDimZ,
                                                 unsigned int sharedMemBytes, CUstream hStream,
                                                 void **kernelParams, void **extra)
{
    return launch(f, (dim3){gridDimX, gridDimY, gridDimZ}, (dim3){blockDimX, blockDimY, blockDimZ},
                  sharedMemBytes, hStream, kernelParams, extra);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                                   void **kernelParams, void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs) {
        pilot_drv_log_unsupported("cuLaunchKernelEx (launch attributes)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return launch(f, (dim3){config->gridDimX, config->gridDimY, config->gridDimZ},
                  (dim3){config->blockDimX, config->blockDimY, config->blockDimZ},
                  config->sharedMemBytes, config->hStream, kernelParams, extra);
}

/* ---- memory ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!dptr || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    void *p = NULL;
    CUresult r = PILOT_DRV_RT(OPS->cudaMalloc(&p, bytesize));
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaFree((void *)dptr));
}

/* CUDA IPC (shim/runtime/memory/api_ipc.c): CU_IPC_HANDLE_SIZE bytes either way. */
PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaIpcGetMemHandle((cudaIpcMemHandle_t *)pHandle, (void *)dptr));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                                        unsigned int Flags)
{
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    cudaIpcMemHandle_t h;
    memcpy(&h, &handle, sizeof h);
    void *p = NULL;
    CUresult r = PILOT_DRV_RT(OPS->cudaIpcOpenMemHandle(&p, h, Flags));
    *pdptr = (CUdeviceptr)p;
    return r;
}

#undef cuIpcOpenMemHandle /* cuda.h maps the name to _v2; the old export is its own symbol */
PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                                     unsigned int Flags);
PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                                     unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaIpcCloseMemHandle((void *)dptr));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaIpcGetEventHandle((cudaIpcEventHandle_t *)pHandle, (cudaEvent_t)event));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    cudaIpcEventHandle_t h;
    memcpy(&h, &handle, sizeof h);
    return PILOT_DRV_RT(OPS->cudaIpcOpenEventHandle((cudaEvent_t *)phEvent, h));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                                                     size_t WidthInBytes, size_t Height,
                                                     unsigned int ElementSizeBytes)
{
    if (!dptr || !pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    void *p = NULL;
    CUresult r = PILOT_DRV_RT(OPS->cudaMallocPitch(&p, pPitch, WidthInBytes, Height));
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                                                    unsigned int flags)
{
    if (!dptr || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    void *p = NULL;
    CUresult r = PILOT_DRV_RT(OPS->cudaMallocManaged(&p, bytesize, flags));
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaMallocHost(pp, bytesize));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaFreeHost(p));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaHostAlloc(pp, bytesize, Flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p,
                                                               unsigned int Flags)
{
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    void *d = NULL;
    CUresult r = PILOT_DRV_RT(OPS->cudaHostGetDevicePointer(&d, p, Flags));
    if (r == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr)d;
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaMemGetInfo(free, total));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                                          CUdeviceptr dptr)
{
    PILOT_DRV_ENTER(1);
    uint64_t base = 0, size = 0;
    if (OPS->alloc_range(dptr, &base, &size) < 0)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = (CUdeviceptr)base;
    if (psize)
        *psize = (size_t)size;
    return CUDA_SUCCESS;
}

static CUresult copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                     CUstream stream, int sync)
{
    PILOT_DRV_ENTER(1);
    return sync ? PILOT_DRV_RT(OPS->cudaMemcpy(dst, src, n, kind))
                : PILOT_DRV_RT(OPS->cudaMemcpyAsync(dst, src, n, kind, (cudaStream_t)stream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return copy((void *)dst, src, n, cudaMemcpyHostToDevice, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return copy(dst, (const void *)src, n, cudaMemcpyDeviceToHost, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy((void *)dst, (const void *)src, n, cudaMemcpyDeviceToDevice, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy((void *)dst, (const void *)src, n, cudaMemcpyDefault, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
                                                       CUstream hStream)
{
    return copy((void *)dst, src, n, cudaMemcpyHostToDevice, hStream, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n,
                                                       CUstream hStream)
{
    return copy(dst, (const void *)src, n, cudaMemcpyDeviceToHost, hStream, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                       CUstream hStream)
{
    return copy((void *)dst, (const void *)src, n, cudaMemcpyDeviceToDevice, hStream, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                CUstream hStream)
{
    return copy((void *)dst, (const void *)src, n, cudaMemcpyDefault, hStream, 0);
}

static CUresult set(CUdeviceptr p, uint32_t value, uint32_t elem, size_t n, CUstream stream,
                    int sync)
{
    PILOT_DRV_ENTER(1);
    if (elem == 1)
        return sync ? PILOT_DRV_RT(OPS->cudaMemset((void *)p, (int)value, n))
                    : PILOT_DRV_RT(OPS->cudaMemsetAsync((void *)p, (int)value, n,
                                                        (cudaStream_t)stream));
    if (p % elem)
        return CUDA_ERROR_INVALID_VALUE;
    return PILOT_DRV_RT(OPS->memset_wide(p, value, elem, n, (cudaStream_t)stream, sync));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr p, unsigned char uc, size_t N)
{
    return set(p, uc, 1, N, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr p, unsigned short us, size_t N)
{
    return set(p, us, 2, N, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr p, unsigned int ui, size_t N)
{
    return set(p, ui, 4, N, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr p, unsigned char uc, size_t N,
                                                  CUstream hStream)
{
    return set(p, uc, 1, N, hStream, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr p, unsigned short us, size_t N,
                                                   CUstream hStream)
{
    return set(p, us, 2, N, hStream, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr p, unsigned int ui, size_t N,
                                                   CUstream hStream)
{
    return set(p, ui, 4, N, hStream, 0);
}

/* ---- streams ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream,
                                                             unsigned int flags, int priority)
{
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamCreateWithPriority((cudaStream_t *)phStream, flags,
                                                          priority));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    PILOT_DRV_ENTER(1);
    if (!hStream)
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->cudaStreamDestroy((cudaStream_t)hStream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamSynchronize((cudaStream_t)hStream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamQuery((cudaStream_t)hStream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                                    unsigned int Flags)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamWaitEvent((cudaStream_t)hStream, (cudaEvent_t)hEvent, Flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamGetFlags((cudaStream_t)hStream, flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority)
{
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaStreamGetPriority((cudaStream_t)hStream, priority));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority,
                                                             int *greatestPriority)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaDeviceGetStreamPriorityRange(leastPriority, greatestPriority));
}

/* ---- events ---- */

/* An event call of the runtime on a CUevent (the same handle); NULL is no event. */
static CUresult on_event(CUevent event, cudaError_t (*call)(cudaEvent_t))
{
    PILOT_DRV_ENTER(1);
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(call((cudaEvent_t)event));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    /* CU_EVENT_* and cudaEvent* flags have the same values. */
    return PILOT_DRV_RT(OPS->cudaEventCreateWithFlags((cudaEvent_t *)phEvent, Flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    PILOT_DRV_ENTER(1);
    if (!hEvent)
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->cudaEventRecord((cudaEvent_t)hEvent, (cudaStream_t)hStream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    return on_event(hEvent, OPS->cudaEventSynchronize);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    return on_event(hEvent, OPS->cudaEventQuery);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart,
                                                        CUevent hEnd)
{
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (!hStart || !hEnd)
        return CUDA_ERROR_INVALID_HANDLE;
    return PILOT_DRV_RT(OPS->cudaEventElapsedTime(pMilliseconds, (cudaEvent_t)hStart,
                                                  (cudaEvent_t)hEnd));
}

#undef cuEventElapsedTime
PILOT_DRV_EXPORT CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart,
                                                     CUevent hEnd);
PILOT_DRV_EXPORT CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart,
                                                     CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    return on_event(hEvent, OPS->cudaEventDestroy);
}

/* ---- pointer attributes ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                                        CUdeviceptr ptr)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    struct cudaPointerAttributes a;
    CUresult r = PILOT_DRV_RT(OPS->cudaPointerGetAttributes(&a, (const void *)ptr));
    if (r != CUDA_SUCCESS)
        return r;
    if (a.type == cudaMemoryTypeUnregistered)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t base = 0, size = 0;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = pilot_drv_context_of(a.device);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = a.type == cudaMemoryTypeHost ? CU_MEMORYTYPE_HOST
                                                             : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!a.devicePointer)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = (CUdeviceptr)a.devicePointer;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!a.hostPointer)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = a.hostPointer;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = a.type == cudaMemoryTypeManaged;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a.device;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        if (OPS->alloc_range(ptr, &base, &size) < 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
            *(CUdeviceptr *)data = (CUdeviceptr)base;
        else
            *(size_t *)data = (size_t)size;
        return CUDA_SUCCESS;
    default:
        pilot_drv_log_unsupported("cuPointerGetAttribute (this attribute)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                         CUpointer_attribute *attributes,
                                                         void **data, CUdeviceptr ptr)
{
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; i++) {
        CUresult r = cuPointerGetAttribute(data[i], attributes[i], ptr);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}
