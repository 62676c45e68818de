/* The per-thread default stream forms that `nvcc -default-stream per-thread` builds call
 * (cuda_runtime_api.h maps cudaMemcpy to cudaMemcpy_ptds, cudaMemcpyAsync to
 * cudaMemcpyAsync_ptsz, ...): in them stream 0 means cudaStreamPerThread, the calling thread's
 * own default stream (api_stream.c); cudaStreamLegacy still means the legacy stream. The _ptds
 * forms of synchronous copies and memsets are ordered on the per-thread stream instead of the
 * legacy one. Launches, host callbacks and the _ptsz forms of launches with attributes are
 * next to their plain forms (api_launch.c, api_launch_ex.c, callbacks.c). */
#include "shim.h"

static cudaStream_t per_thread(cudaStream_t stream)
{
    return stream ? stream : cudaStreamPerThread;
}

/* ---- synchronous copies and memsets on the per-thread stream ---- */

PILOT_EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                         enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memcpy(dst, src, count, kind, pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memset(devPtr, value, count, pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
                                           size_t width, size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_copy_2d(dst, dpitch, src, spitch, width, height, kind,
                               pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
                                           size_t height)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_set_2d(devPtr, pitch, value, width, height,
                              pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyToSymbol_ptds(const void *symbol, const void *src, size_t count,
                                                 size_t offset, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_to_symbol(symbol, src, count, offset, kind,
                                 pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromSymbol_ptds(void *dst, const void *symbol, size_t count,
                                                   size_t offset, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_from_symbol(dst, symbol, count, offset, kind,
                                   pilot_stream_handle(cudaStreamPerThread), 1));
}

/* ---- stream-taking calls: 0 is the per-thread stream ---- */

PILOT_EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                              enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return cudaMemcpyAsync(dst, src, count, kind, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                              cudaStream_t stream)
{
    return cudaMemsetAsync(devPtr, value, count, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
                                                size_t spitch, size_t width, size_t height,
                                                enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value,
                                                size_t width, size_t height, cudaStream_t stream)
{
    return cudaMemset2DAsync(devPtr, pitch, value, width, height, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void *symbol, const void *src,
                                                      size_t count, size_t offset,
                                                      enum cudaMemcpyKind kind,
                                                      cudaStream_t stream)
{
    return cudaMemcpyToSymbolAsync(symbol, src, count, offset, kind, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void *dst, const void *symbol,
                                                        size_t count, size_t offset,
                                                        enum cudaMemcpyKind kind,
                                                        cudaStream_t stream)
{
    return cudaMemcpyFromSymbolAsync(dst, symbol, count, offset, kind, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    return cudaStreamSynchronize(per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
    return cudaStreamQuery(per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
                                                  unsigned int flags)
{
    return cudaStreamWaitEvent(per_thread(stream), event, flags);
}

PILOT_EXPORT cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t stream, unsigned int *flags)
{
    return cudaStreamGetFlags(per_thread(stream), flags);
}

PILOT_EXPORT cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t stream, int *priority)
{
    return cudaStreamGetPriority(per_thread(stream), priority);
}

PILOT_EXPORT cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t stream, int *device)
{
    return cudaStreamGetDevice(per_thread(stream), device);
}

PILOT_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
    return cudaEventRecord(event, per_thread(stream));
}

PILOT_EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                                       unsigned int flags)
{
    return cudaEventRecordWithFlags(event, per_thread(stream), flags);
}
