/* 3D memory: cudaMalloc3D, cudaMemset3D, cudaMemcpy3D and cudaMemcpy3DPeer.
 *
 * Pitched 3D memory is pitched 2D memory of height x depth rows (cudaMalloc3D is
 * cudaMallocPitch of extent.height * extent.depth rows, as CUDA's is), so linear copies and
 * memsets go through the 2D paths (api_misc.c): one 2D operation when the slices follow each
 * other without a gap on both sides (ysize == extent.height), else one per slice. A copy with a
 * CUDA array endpoint is api_array.c's: positions and widths are converted from the runtime's
 * units (the array's elements; bytes for pointers) to bytes first. */
#include <string.h>

#include "log.h"
#include "shim.h"

PILOT_EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr,
                                      struct cudaExtent extent)
{
    if (!pitchedDevPtr)
        PILOT_RETURN(cudaErrorInvalidValue);
    size_t pitch = 0, rows;
    void *ptr = NULL;
    if (__builtin_mul_overflow(extent.height, extent.depth, &rows))
        PILOT_RETURN(cudaErrorMemoryAllocation);
    cudaError_t err = cudaMallocPitch(&ptr, &pitch, extent.width, rows);
    if (err == cudaSuccess)
        *pitchedDevPtr = (struct cudaPitchedPtr){ptr, pitch, extent.width, extent.height};
    PILOT_RETURN(err);
}

/* ---- memsets ---- */

static cudaError_t set_3d(struct cudaPitchedPtr p, int value, struct cudaExtent e, uint64_t stream,
                          int sync)
{
    if (!e.width || !e.height || !e.depth)
        return cudaSuccess;
    if (e.depth == 1 || p.ysize == e.height)
        return pilot_set_2d(p.ptr, p.pitch, value, e.width, e.height * e.depth, stream, sync);
    if (p.ysize < e.height)
        return cudaErrorInvalidValue;
    cudaError_t err = cudaSuccess;
    for (size_t z = 0; z < e.depth && err == cudaSuccess; z++)
        err = pilot_set_2d((char *)p.ptr + z * p.pitch * p.ysize, p.pitch, value, e.width,
                           e.height, stream, sync);
    return err;
}

PILOT_EXPORT cudaError_t cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value,
                                      struct cudaExtent extent)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(set_3d(pitchedDevPtr, value, extent, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr pitchedDevPtr, int value,
                                           struct cudaExtent extent)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(set_3d(pitchedDevPtr, value, extent, pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value,
                                           struct cudaExtent extent, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(set_3d(pitchedDevPtr, value, extent, pilot_stream_handle(stream), 0));
}

PILOT_EXPORT cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr pitchedDevPtr, int value,
                                                struct cudaExtent extent, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(set_3d(pitchedDevPtr, value, extent,
                        pilot_stream_handle(stream ? stream : cudaStreamPerThread), 0));
}

/* ---- copies ---- */

/* The first byte of a pitched pointer's box at pos (x in bytes). */
static char *box_start(struct cudaPitchedPtr p, struct cudaPos pos)
{
    return (char *)p.ptr + (pos.z * p.ysize + pos.y) * p.pitch + pos.x;
}

static cudaError_t copy_linear(const struct cudaMemcpy3DParms *p, uint64_t stream, int sync)
{
    const struct cudaExtent e = p->extent;
    if (!e.width || !e.height || !e.depth)
        return cudaSuccess;
    char *dst = box_start(p->dstPtr, p->dstPos);
    const char *src = box_start(p->srcPtr, p->srcPos);
    size_t dpitch = p->dstPtr.pitch, spitch = p->srcPtr.pitch;
    if (e.depth == 1 || (p->dstPtr.ysize == e.height && p->srcPtr.ysize == e.height))
        return pilot_copy_2d(dst, dpitch, src, spitch, e.width, e.height * e.depth, p->kind, stream,
                             sync);
    if (p->dstPtr.ysize < e.height || p->srcPtr.ysize < e.height)
        return cudaErrorInvalidValue;
    cudaError_t err = cudaSuccess;
    for (size_t z = 0; z < e.depth && err == cudaSuccess; z++)
        err = pilot_copy_2d(dst + z * dpitch * p->dstPtr.ysize, dpitch,
                            src + z * spitch * p->srcPtr.ysize, spitch, e.width, e.height, p->kind,
                            stream, sync);
    return err;
}

/* One side of a copy: an array (position x in its elements) or a pitched pointer. */
static cudaError_t side(struct pilot_copy_end *out, cudaArray_const_t array, struct cudaPos pos,
                        struct cudaPitchedPtr ptr, int host_side, int kind_default,
                        uint64_t height)
{
    cudaError_t err;
    if (array) {
        if ((err = pilot_copy_end_array(out, array)) != cudaSuccess)
            return err;
        out->x = pos.x * out->info.elem;
        out->y = pos.y;
        out->z = pos.z;
        return cudaSuccess;
    }
    size_t rows = ptr.ysize ? ptr.ysize : height;
    if ((err = pilot_copy_end_memory(out, ptr.ptr, ptr.pitch, rows, host_side, kind_default)))
        return err;
    if (out->type == PILOT_MEM_HOST) {
        out->host = (uint8_t *)box_start(ptr, pos);
    } else {
        out->x = pos.x;
        out->y = pos.y;
        out->z = pos.z;
    }
    return cudaSuccess;
}

static cudaError_t copy_3d(const struct cudaMemcpy3DParms *p, uint64_t stream, int sync)
{
    if (!p)
        return cudaErrorInvalidValue;
    /* One source and one destination, each an array or a pointer. */
    if (!p->srcArray == !p->srcPtr.ptr || !p->dstArray == !p->dstPtr.ptr)
        return cudaErrorInvalidValue;
    if ((unsigned)p->kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    if (!p->srcArray && !p->dstArray)
        return copy_linear(p, stream, sync);
    int dflt = p->kind == cudaMemcpyDefault;
    int src_host = p->kind == cudaMemcpyHostToHost || p->kind == cudaMemcpyHostToDevice;
    int dst_host = p->kind == cudaMemcpyHostToHost || p->kind == cudaMemcpyDeviceToHost;
    if ((p->srcArray && src_host) || (p->dstArray && dst_host))
        return cudaErrorInvalidMemcpyDirection;
    const struct cudaExtent e = p->extent;
    struct pilot_copy_end d, s;
    /* The array side first: with an array on one side, the H100 (driver 580) reads the pointer
     * side's x position in that array's elements too (srcPos.x = 4 beside a uchar4 array starts
     * 16 bytes into the host row), not in bytes as the manual's "unsigned char" suggests. */
    cudaError_t err = p->dstArray ? side(&d, p->dstArray, p->dstPos, p->dstPtr, dst_host, dflt, e.height)
                                  : side(&s, p->srcArray, p->srcPos, p->srcPtr, src_host, dflt, e.height);
    if (err)
        return err;
    uint32_t elem = p->dstArray ? d.info.elem : s.info.elem;
    struct cudaPos src_pos = p->srcPos, dst_pos = p->dstPos;
    if (!p->srcArray && __builtin_mul_overflow(src_pos.x, (size_t)elem, &src_pos.x))
        return cudaErrorInvalidValue;
    if (!p->dstArray && __builtin_mul_overflow(dst_pos.x, (size_t)elem, &dst_pos.x))
        return cudaErrorInvalidValue;
    err = p->dstArray ? side(&s, p->srcArray, src_pos, p->srcPtr, src_host, dflt, e.height)
                      : side(&d, p->dstArray, dst_pos, p->dstPtr, dst_host, dflt, e.height);
    if (err)
        return err;
    if (p->dstArray && p->srcArray && d.info.elem != s.info.elem)
        return cudaErrorInvalidValue; /* two arrays of different element sizes */
    uint64_t width;
    if (__builtin_mul_overflow((uint64_t)e.width, (uint64_t)elem, &width))
        return cudaErrorInvalidValue;
    return pilot_array_copy(&d, &s, width, e.height, e.depth, stream, sync);
}

PILOT_EXPORT cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d(p, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy3D_ptds(const struct cudaMemcpy3DParms *p)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d(p, pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d(p, pilot_stream_handle(stream), 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy3DAsync_ptsz(const struct cudaMemcpy3DParms *p,
                                                cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d(p, pilot_stream_handle(stream ? stream : cudaStreamPerThread), 0));
}

/* ---- peer copies ---- */

/* Between two devices' linear memory: row by row as peer copies. Arrays on different devices
 * are not carried. On one device it is cudaMemcpy3D with cudaMemcpyDefault. */
static cudaError_t copy_3d_peer(const struct cudaMemcpy3DPeerParms *p, uint64_t stream, int sync)
{
    if (!p)
        return cudaErrorInvalidValue;
    int n = pilot_device_count();
    if (p->srcDevice < 0 || p->srcDevice >= n || p->dstDevice < 0 || p->dstDevice >= n)
        return cudaErrorInvalidDevice;
    struct cudaMemcpy3DParms q = {.srcArray = p->srcArray, .srcPos = p->srcPos,
                                  .srcPtr = p->srcPtr, .dstArray = p->dstArray,
                                  .dstPos = p->dstPos, .dstPtr = p->dstPtr, .extent = p->extent,
                                  .kind = cudaMemcpyDefault};
    if (p->srcDevice == p->dstDevice)
        return copy_3d(&q, stream, sync);
    if (!q.srcArray == !q.srcPtr.ptr || !q.dstArray == !q.dstPtr.ptr)
        return cudaErrorInvalidValue;
    if (q.srcArray || q.dstArray) {
        pilot_log_unsupported("cudaMemcpy3DPeer (an array on another device)");
        return cudaErrorNotSupported;
    }
    const struct cudaExtent e = p->extent;
    cudaError_t err = cudaSuccess;
    for (size_t z = 0; z < e.depth && err == cudaSuccess; z++)
        for (size_t y = 0; y < e.height && err == cudaSuccess; y++) {
            struct cudaPos dp = {q.dstPos.x, q.dstPos.y + y, q.dstPos.z + z};
            struct cudaPos sp = {q.srcPos.x, q.srcPos.y + y, q.srcPos.z + z};
            err = pilot_memcpy_peer(box_start(q.dstPtr, dp), p->dstDevice,
                                    box_start(q.srcPtr, sp), p->srcDevice, e.width, stream, sync);
        }
    return err;
}

PILOT_EXPORT cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d_peer(p, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy3DPeer_ptds(const struct cudaMemcpy3DPeerParms *p)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d_peer(p, pilot_stream_handle(cudaStreamPerThread), 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p,
                                               cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d_peer(p, pilot_stream_handle(stream), 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy3DPeerAsync_ptsz(const struct cudaMemcpy3DPeerParms *p,
                                                    cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(copy_3d_peer(p, pilot_stream_handle(stream ? stream : cudaStreamPerThread), 0));
}
