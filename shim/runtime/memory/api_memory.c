/* Device memory: allocation, copies in all four directions, memsets.
 *
 * Copies to and from pinned host memory (api_host.c) are DMA in the daemon, in stream order.
 * Other copies up to PILOT_INLINE_MAX bytes travel inside the message. Larger pageable copies go
 * through the session's staging area, shared memory the daemon has pinned (cuMemHostRegister):
 * the transfer is cut into slot-sized chunks and pipelined, so the shim copies chunk i+1 into one
 * slot while the daemon DMAs chunk i from another. Like CUDA with pageable memory, such copies
 * return once the host buffer may be reused (H2D) or holds the data (D2H).
 *
 * With several devices, a copy or memset goes to the part of the session on the device of its
 * stream, or else of its device memory; each part has its own staging area. */
#include <pthread.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Host to device in messages of at most PILOT_INLINE_MAX bytes, none waited for: the daemon's
 * handler never waits for the stream, so this cannot block behind a host callback. */
static cudaError_t posted_h2d(uint64_t dst, const uint8_t *src, uint64_t count, uint64_t stream)
{
    for (uint64_t off = 0; off < count; off += PILOT_INLINE_MAX) {
        uint64_t len = min_u64(PILOT_INLINE_MAX, count - off);
        pilot_req_memcpy req = {.dst = dst + off, .src = (uintptr_t)(src + off), .count = len,
                                .stream = stream};
        cudaError_t err = pilot_post(PILOT_OP_MEMCPY_H2D, &req, sizeof req, src + off, len);
        if (err)
            return err;
    }
    return cudaSuccess;
}

/* A new allocation from pilotd: PILOT_OP_MALLOC, or PILOT_OP_MALLOC_ASYNC on *stream (a handle
 * of the route device) when stream is not NULL. */
static cudaError_t allocate(void **ptr, size_t size, const uint64_t *stream)
{
    pilot_rep_u64 rep;
    cudaError_t err;
    if (!stream) {
        pilot_req_malloc req = {.size = size};
        err = pilot_call(PILOT_OP_MALLOC, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    } else {
        pilot_req_malloc_async req = {.size = size, .stream = *stream};
        err = pilot_call(PILOT_OP_MALLOC_ASYNC, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0,
                         NULL);
    }
    if (err == cudaSuccess) {
        *ptr = (void *)(uintptr_t)rep.value;
        pilot_alloc_add(rep.value, size);
        if (stream)
            pilot_stream_accepted(*stream);
    }
    return err;
}

PILOT_EXPORT cudaError_t cudaMalloc(void **ptr, size_t size)
{
    if (!ptr)
        PILOT_RETURN(cudaErrorInvalidValue);
    *ptr = NULL;
    PILOT_REQUIRE_SESSION();
    cudaError_t err = pilot_capture_check_unsafe(); /* not during a capture (graph_capture.c) */
    if (err)
        PILOT_RETURN(err);
    if (size == 0)
        return cudaSuccess;
    PILOT_RETURN(allocate(ptr, size, NULL));
}

cudaError_t pilot_malloc_ordered(void **ptr, size_t size, uint64_t stream)
{
    *ptr = NULL;
    return size ? allocate(ptr, size, &stream) : cudaSuccess;
}

/* pilotd freed ptr: the shim's tables forget it. */
static void forget_freed(void *ptr)
{
    if (pilot_alloc_remove((uintptr_t)ptr) == 0 && pilot_um_contains((uintptr_t)ptr))
        pilot_um_remove((uintptr_t)ptr);
    pilot_hooks_memory_freed((uintptr_t)ptr); /* a stream-ordered allocation leaves its pool */
}

PILOT_EXPORT cudaError_t cudaFree(void *ptr)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr)
        return cudaSuccess;
    cudaError_t err = pilot_capture_check_unsafe(); /* it waits for the device */
    if (err)
        PILOT_RETURN(err);
    if (pilot_alloc_is_symbol((uintptr_t)ptr)) /* a module global, never an allocation */
        PILOT_RETURN(cudaErrorInvalidValue);
    if (pilot_hooks_memory_free(ptr, 0, NULL, &err)) /* memory a graph allocated (graph_mem.c) */
        PILOT_RETURN(err);
    uint64_t range;
    int flags = pilot_alloc_flags((uintptr_t)ptr, &range, NULL);
    if (flags >= 0 && (flags & PILOT_ALLOC_PACKED)) /* a small managed allocation (um_pack.c) */
        PILOT_RETURN(pilot_um_pack_free((uintptr_t)ptr, range));
    pilot_req_free req = {.ptr = (uintptr_t)ptr};
    int owner = pilot_alloc_owner((uintptr_t)ptr);
    err = pilot_callbacks_fence_device(owner); /* cudaFree waits for the device */
    if (err == cudaSuccess)
        err = pilot_call_on(owner, PILOT_OP_FREE, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    if (err == cudaSuccess)
        forget_freed(ptr);
    PILOT_RETURN(err);
}

int pilot_free_ordered(void *ptr, uint64_t stream, cudaError_t *err)
{
    if (pilot_alloc_is_symbol((uintptr_t)ptr)) { /* a module global, never an allocation */
        *err = cudaErrorInvalidValue;
        return 1;
    }
    int owner = pilot_alloc_owner((uintptr_t)ptr);
    if (pilot_alloc_is_managed((uintptr_t)ptr) || pilot_um_contains((uintptr_t)ptr) ||
        pilot_handle_device(stream) != owner)
        return 0;
    pilot_req_free_async req = {.ptr = (uintptr_t)ptr, .stream = stream};
    uint64_t base = 0;
    int flags = pilot_alloc_flags((uintptr_t)ptr, &base, NULL);
    if (flags >= 0 && base == (uintptr_t)ptr && !(flags & PILOT_ALLOC_IMPORTED) &&
        pilot_stream_known(stream)) {
        /* The start of one of its allocations, on a stream pilotd accepts: posted, as natively
         * cudaFreeAsync returns at once (a PyTorch step with backend:cudaMallocAsync makes
         * dozens); what pilotd could still refuse is reported as an asynchronous error. */
        *err = pilot_post_on(owner, PILOT_OP_FREE_ASYNC, &req, sizeof req, NULL, 0);
    } else { /* pilotd's answer at once: not an allocation's start, memory opened through IPC,
              * a stream it may not know */
        *err = pilot_call_on(owner, PILOT_OP_FREE_ASYNC, &req, sizeof req, NULL, 0, NULL, 0, NULL,
                             0, NULL);
    }
    if (*err == cudaSuccess)
        forget_freed(ptr);
    return 1;
}

PILOT_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    PILOT_REQUIRE_SESSION();
    pilot_rep_u64 rep;
    cudaError_t err =
        pilot_call(PILOT_OP_MEM_GET_INFO, NULL, 0, NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess) {
        if (free_bytes)
            *free_bytes = rep.value;
        if (total_bytes)
            *total_bytes = rep.value2;
    }
    PILOT_RETURN(err);
}

static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                        uint64_t stream, int sync);

/* Resolves cudaMemcpyDefault from the session's allocations; rejects unknown kinds. */
static cudaError_t resolve_kind(enum cudaMemcpyKind *kind, const void *dst, const void *src)
{
    if (*kind == cudaMemcpyDefault) {
        int d = pilot_alloc_is_device((uintptr_t)dst), s = pilot_alloc_is_device((uintptr_t)src);
        *kind = s ? (d ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                  : (d ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    }
    if ((unsigned)*kind > cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidMemcpyDirection;
    return cudaSuccess;
}

int pilot_memory_route(uint64_t stream, const void *a, const void *b)
{
    if (stream)
        return pilot_handle_device(stream);
    int dev = pilot_alloc_device((uintptr_t)a);
    if (dev < 0 && b)
        dev = pilot_alloc_device((uintptr_t)b);
    return dev >= 0 ? dev : pilot_current_device();
}

static cudaError_t memcpy_routed(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind, uint64_t stream, int sync);

cudaError_t pilot_memcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                         uint64_t stream, int sync)
{
    /* Stream capture: an async copy on a capturing stream is recorded; a synchronous one may be
     * forbidden (graph_capture.c). */
    if (pilot_capture_any()) {
        cudaError_t err = cudaSuccess;
        if (sync && (err = pilot_capture_check_sync(stream, 1)))
            return err;
        if (!sync && count && pilot_capture_copy(stream, dst, 0, src, 0, count, 1, kind, &err))
            return err;
    }
    /* A registered range's device pointer names its host pages (copies use the host address). */
    dst = (void *)(uintptr_t)pilot_host_unalias((uintptr_t)dst);
    src = (const void *)(uintptr_t)pilot_host_unalias((uintptr_t)src);
    /* Every managed range has a shadow, so a process without any skips both lookups. */
    int dst_managed = pilot_um_active() && pilot_alloc_is_managed((uintptr_t)dst);
    if (dst_managed || (pilot_um_active() && pilot_alloc_is_managed((uintptr_t)src))) {
        /* Managed memory is copied where it really lives, in the daemon, whatever kind the
         * program named (any kind is valid for it): host writes are flushed first, and the
         * shadow chunks the copy writes are fetched again when the host touches them. */
        if ((unsigned)kind > cudaMemcpyDefault)
            return cudaErrorInvalidMemcpyDirection;
        cudaError_t err = pilot_um_flush();
        if (err)
            return err;
        err = copy(dst, src, count, cudaMemcpyDefault, stream, sync);
        return dst_managed ? pilot_um_device_wrote((uintptr_t)dst, count, stream, sync, err) : err;
    }
    return copy(dst, src, count, kind, stream, sync);
}

/* A copy runs on the device of its stream, else of its device memory; one between two devices'
 * memory is a peer copy. */
static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                        uint64_t stream, int sync)
{
    int ddev = pilot_alloc_device((uintptr_t)dst), sdev = pilot_alloc_device((uintptr_t)src);
    if (ddev >= 0 && sdev >= 0 && ddev != sdev && count &&
        (kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDefault))
        return pilot_memcpy_peer(dst, ddev, src, sdev, count, stream, sync); /* across devices */
    int previous = pilot_route_begin(pilot_memory_route(stream, dst, src));
    cudaError_t err = memcpy_routed(dst, src, count, kind, stream, sync);
    pilot_route_end(previous);
    return err;
}

static cudaError_t memcpy_routed(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind, uint64_t stream, int sync)
{
    cudaError_t err = resolve_kind(&kind, dst, src);
    if (err)
        return err;
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    uint64_t d = (uintptr_t)dst, s = (uintptr_t)src;
    pilot_req_memcpy req = {.dst = d, .src = s, .count = count, .stream = stream, .sync = (uint32_t)sync};
    switch (kind) {
    case cudaMemcpyHostToHost:
        memmove(dst, src, count);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        if (!pilot_alloc_contains(d, count))
            return cudaErrorInvalidValue;
        if (pilot_host_pinned(s, count)) /* DMA from the daemon's view of it, in stream order */
            return pilot_pinned_copy(dst, src, count, kind, stream, sync);
        /* An asynchronous copy from pageable memory reads it when queued (CUDA copies it to a
         * staging buffer at once), even behind a host callback that has not run: the messages
         * hold the data, so the host buffer is free to reuse at once. */
        if (!sync && (count <= PILOT_INLINE_MAX || pilot_callbacks_outstanding()))
            return posted_h2d(d, src, count, stream);
        if ((err = pilot_callbacks_fence(stream))) /* CUDA: a stream sync before the copy */
            return err;
        if (count > PILOT_INLINE_MAX)
            return pilot_staged_h2d(PILOT_OP_MEMCPY_H2D_STAGED, d, src, count, stream, (uint32_t)sync);
        return pilot_call(PILOT_OP_MEMCPY_H2D, &req, sizeof req, src, count, NULL, 0, NULL, 0, NULL);
    case cudaMemcpyDeviceToHost: {
        if (!pilot_alloc_contains(s, count))
            return cudaErrorInvalidValue;
        if (pilot_host_pinned(d, count))
            return pilot_pinned_copy(dst, src, count, kind, stream, sync);
        if ((err = pilot_callbacks_fence(stream)))
            return err;
        if (count > PILOT_INLINE_MAX)
            return pilot_staged_d2h(dst, s, count, stream, (uint32_t)sync);
        pilot_rep_status rep;
        size_t got = 0;
        err = pilot_call(PILOT_OP_MEMCPY_D2H, &req, sizeof req, NULL, 0, &rep, sizeof rep, dst,
                         count, &got);
        if (err == cudaSuccess && got != count)
            err = cudaErrorUnknown;
        return err;
    }
    default: /* device to device */
        if (!pilot_alloc_contains(d, count) || !pilot_alloc_contains(s, count))
            return cudaErrorInvalidValue;
        if (!sync)
            return pilot_post(PILOT_OP_MEMCPY_D2D, &req, sizeof req, NULL, 0);
        return pilot_call(PILOT_OP_MEMCPY_D2D, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    }
}

PILOT_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                                    enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memcpy(dst, src, count, kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                         enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memcpy(dst, src, count, kind, pilot_stream_handle(stream), 0));
}

cudaError_t pilot_memset(void *ptr, int value, size_t count, uint64_t stream, int sync)
{
    return pilot_memset_elems(ptr, (uint32_t)value, 1, count, stream, sync);
}

cudaError_t pilot_memset_elems(void *ptr, uint32_t value, uint32_t elem_size, size_t count,
                               uint64_t stream, int sync)
{
    if (count == 0)
        return cudaSuccess;
    if (pilot_capture_any()) {
        cudaError_t err = cudaSuccess;
        if (sync && (err = pilot_capture_check_sync(stream, 1)))
            return err;
        /* a captured memset is a byte memset node; the driver's wider memsets are refused there */
        if (!sync && elem_size == 1 && pilot_capture_memset(stream, ptr, count, value, count, 1, &err))
            return err;
        if (!sync && elem_size != 1 && pilot_capture_refuse(stream, "cuMemsetD16/D32Async", &err))
            return err;
    }
    if (count > SIZE_MAX / elem_size || !pilot_alloc_contains((uintptr_t)ptr, count * elem_size))
        return cudaErrorInvalidValue;
    size_t bytes = count * elem_size;
    pilot_req_memset req = {.ptr = (uintptr_t)ptr, .count = count, .stream = stream,
                            .value = (int32_t)value, .sync = (uint32_t)sync};
    pilot_req_memset_wide wide = {.ptr = (uintptr_t)ptr, .count = count, .stream = stream,
                                  .value = value, .elem_size = elem_size, .sync = (uint32_t)sync};
    uint16_t op = elem_size == 1 ? PILOT_OP_MEMSET : PILOT_OP_MEMSET_WIDE;
    const void *body = elem_size == 1 ? (const void *)&req : (const void *)&wide;
    size_t body_len = elem_size == 1 ? sizeof req : sizeof wide;
    int managed = pilot_um_active() && pilot_alloc_is_managed((uintptr_t)ptr);
    cudaError_t err = managed ? pilot_um_flush() : cudaSuccess; /* partly written chunks */
    if (err)
        return err;
    int dev = pilot_memory_route(stream, ptr, NULL);
    if (!sync)
        err = pilot_post_on(dev, op, body, body_len, NULL, 0);
    else
        err = pilot_call_on(dev, op, body, body_len, NULL, 0, NULL, 0, NULL, 0, NULL);
    return managed ? pilot_um_device_wrote((uintptr_t)ptr, bytes, stream, sync, err) : err;
}

PILOT_EXPORT cudaError_t cudaMemset(void *ptr, int value, size_t count)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memset(ptr, value, count, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memset(ptr, value, count, pilot_stream_handle(stream), 0));
}
