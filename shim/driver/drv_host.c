/* The driver API's host-side calls that are the runtime's under other names: page-locking host
 * memory (cuMemHostRegister, cuMemHostUnregister), host functions in stream order
 * (cuLaunchHostFunc, cuStreamAddCallback) and 2D copies (cuMemcpy2D, cuMemcpy2DAsync,
 * cuMemcpy2DUnaligned). Numba's pinned and mapped arrays, stream callbacks and the CUDA samples'
 * driver programs use them. Each is one runtime call through libpilot.so (driver_ops.h). */
#include "drv.h"

#define OPS pilot_drv_ops

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    if (!p || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    /* CU_MEMHOSTREGISTER_* and cudaHostRegister* flags have the same values */
    return PILOT_DRV_RT(OPS->cudaHostRegister(p, bytesize, Flags));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaHostUnregister(p));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(OPS->cudaLaunchHostFunc((cudaStream_t)hStream, (cudaHostFn_t)fn, userData));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
                                                      void *userData, unsigned int flags)
{
    if (!callback || flags)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    /* void (*)(CUstream, CUresult, void *) and the runtime's callback have one ABI */
    return PILOT_DRV_RT(OPS->cudaStreamAddCallback((cudaStream_t)hStream,
                                                   (cudaStreamCallback_t)(void (*)(void))callback,
                                                   userData, 0));
}

/* One end of a 2D copy: its first byte and whether it is host memory (-1: not carried). */
static int endpoint(CUmemorytype type, const void *host, CUdeviceptr device, size_t x, size_t y,
                    size_t pitch, const char **at)
{
    if (type == CU_MEMORYTYPE_HOST && host)
        *at = (const char *)host + y * pitch + x;
    else if ((type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED) && device)
        *at = (const char *)(uintptr_t)device + y * pitch + x;
    else
        return -1;
    return type == CU_MEMORYTYPE_HOST ? 1 : type == CU_MEMORYTYPE_UNIFIED ? 2 : 0;
}

static CUresult copy_2d(const CUDA_MEMCPY2D *p, CUstream stream, int sync)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        pilot_drv_log_unsupported("cuMemcpy2D with a CUDA array");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const char *src, *dst;
    int s = endpoint(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY,
                     p->srcPitch, &src);
    int d = endpoint(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY,
                     p->dstPitch, &dst);
    if (s < 0 || d < 0)
        return CUDA_ERROR_INVALID_VALUE;
    enum cudaMemcpyKind kind = s == 2 || d == 2 ? cudaMemcpyDefault
                               : s ? (d ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                   : (d ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    if (sync)
        return PILOT_DRV_RT(OPS->cudaMemcpy2D((void *)dst, p->dstPitch, src, p->srcPitch,
                                              p->WidthInBytes, p->Height, kind));
    return PILOT_DRV_RT(OPS->cudaMemcpy2DAsync((void *)dst, p->dstPitch, src, p->srcPitch,
                                               p->WidthInBytes, p->Height, kind, (cudaStream_t)stream));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)
{
    return copy_2d(pCopy, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy)
{
    return copy_2d(pCopy, NULL, 1);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    return copy_2d(pCopy, hStream, 0);
}
