/* The driver's per-thread default stream forms (_ptsz, _ptds): what cuda.h names the calls in a
 * program built with `--default-stream per-thread` (CUDA_API_PER_THREAD_DEFAULT_STREAM), and what
 * cuGetProcAddress hands out for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. In them stream 0
 * means the calling thread's default stream (CU_STREAM_PER_THREAD), which the runtime carries as
 * cudaStreamPerThread; a synchronous (_ptds) copy or memset is its asynchronous form on that
 * stream followed by that stream's synchronization, so it waits for what the thread queued there
 * and for nothing of other streams. Each is one call of the legacy form in drv_api.c or
 * drv_host.c. The table marks these rows impl; the others stay stubs, and cuGetProcAddress
 * gives the legacy form for those (gen_shim_tables.py). */
#include "drv.h"

#define PER_THREAD(s) ((s) ? (s) : CU_STREAM_PER_THREAD)

static CUresult then_sync(CUresult r)
{
    return r != CUDA_SUCCESS ? r : cuStreamSynchronize(CU_STREAM_PER_THREAD);
}

/* ---- stream 0 is the thread's stream (_ptsz) ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                      unsigned int gz, unsigned int bx,
                                                      unsigned int by, unsigned int bz,
                                                      unsigned int shared, CUstream s,
                                                      void **params, void **extra)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, PER_THREAD(s), params, extra);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                                        void **params, void **extra)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    CUlaunchConfig c = *config;
    c.hStream = PER_THREAD(c.hStream);
    return cuLaunchKernelEx(&c, f, params, extra);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
    return cuLaunchHostFunc(PER_THREAD(s), fn, data);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback cb,
                                                           void *data, unsigned int flags)
{
    return cuStreamAddCallback(PER_THREAD(s), cb, data, flags);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s)
{
    return cuEventRecord(e, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s)
{
    return cuStreamSynchronize(PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s)
{
    return cuStreamQuery(PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags)
{
    return cuStreamWaitEvent(PER_THREAD(s), e, flags);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream s, unsigned int *flags)
{
    return cuStreamGetFlags(PER_THREAD(s), flags);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream s, int *priority)
{
    return cuStreamGetPriority(PER_THREAD(s), priority);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                     CUstream s)
{
    return cuMemcpyAsync(dst, src, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src,
                                                            size_t n, CUstream s)
{
    return cuMemcpyHtoDAsync_v2(dst, src, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n,
                                                            CUstream s)
{
    return cuMemcpyDtoHAsync_v2(dst, src, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src,
                                                            size_t n, CUstream s)
{
    return cuMemcpyDtoDAsync_v2(dst, src, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *p, CUstream s)
{
    return cuMemcpy2DAsync_v2(p, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n,
                                                       CUstream s)
{
    return cuMemsetD8Async(p, v, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr p, unsigned short v, size_t n,
                                                        CUstream s)
{
    return cuMemsetD16Async(p, v, n, PER_THREAD(s));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr p, unsigned int v, size_t n,
                                                        CUstream s)
{
    return cuMemsetD32Async(p, v, n, PER_THREAD(s));
}

/* ---- synchronous, on the thread's stream (_ptds) ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return then_sync(cuMemcpyAsync(dst, src, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    return then_sync(cuMemcpyHtoDAsync_v2(dst, src, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    return then_sync(cuMemcpyDtoHAsync_v2(dst, src, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return then_sync(cuMemcpyDtoDAsync_v2(dst, src, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *p)
{
    return then_sync(cuMemcpy2DAsync_v2(p, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *p)
{
    return then_sync(cuMemcpy2DAsync_v2(p, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr p, unsigned char v, size_t n)
{
    return then_sync(cuMemsetD8Async(p, v, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr p, unsigned short v, size_t n)
{
    return then_sync(cuMemsetD16Async(p, v, n, CU_STREAM_PER_THREAD));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr p, unsigned int v, size_t n)
{
    return then_sync(cuMemsetD32Async(p, v, n, CU_STREAM_PER_THREAD));
}

/* ---- cuGetProcAddress as a per-thread program names it ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn,
                                                           int cudaVersion, cuuint64_t flags,
                                                           CUdriverProcAddressQueryResult *status)
{
    /* CU_GET_PROC_ADDRESS_DEFAULT in a per-thread program means its streams' semantics */
    if (!(flags & (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        flags |= CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
}
