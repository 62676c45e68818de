/* CUDA arrays (cudaMallocArray, cudaMalloc3DArray) and copies to, from and between them.
 *
 * An array lives in the daemon (a CUarray); the program's cudaArray_t is the handle the
 * daemon gave it, a number of the session (with the device in bits 40..47, like stream
 * handles), never an address. The daemon maps it to its array and refuses handles that are not
 * the session's. The shim keeps each array's channel format, extent and flags, so
 * cudaArrayGetInfo and cudaGetChannelDesc need no message, and checks copies against them
 * (the daemon checks again).
 *
 * Every copy with an array endpoint is one generic message, MEMCPY_3D: a box of `width` bytes x
 * `height` rows x `depth` slices between two sides (host, linear device memory, array), with
 * positions in bytes. Host rows travel inside the messages, packed, at most PILOT_INLINE_MAX
 * bytes a message (a wider row goes in pieces), as 2D copies do (api_misc.c). The 1D forms
 * (cudaMemcpyToArray, ...) cover their byte count row after row from the offset, as CUDA's do. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

/* ---- the process's arrays ---- */

struct array_rec {
    uint64_t handle;
    struct cudaChannelFormatDesc desc;
    struct cudaExtent extent;
    unsigned int flags;
    uint32_t elem; /* bytes per element */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct array_rec *g_arrays;
static size_t g_count, g_cap;

static long find_locked(uint64_t handle)
{
    for (size_t i = 0; i < g_count; i++)
        if (g_arrays[i].handle == handle)
            return (long)i;
    return -1;
}

int pilot_array_info(const void *array, struct pilot_array_info *out)
{
    pthread_mutex_lock(&g_lock);
    long i = array ? find_locked((uintptr_t)array) : -1;
    if (i >= 0) {
        const struct array_rec *r = &g_arrays[i];
        out->handle = r->handle;
        out->device = pilot_handle_device(r->handle);
        out->elem = r->elem;
        out->width = r->extent.width;
        out->height = r->extent.height ? r->extent.height : 1;
        out->depth = r->extent.depth ? r->extent.depth : 1;
        out->flags = r->flags;
        out->desc = r->desc;
    }
    pthread_mutex_unlock(&g_lock);
    return i >= 0;
}

static int remember(const struct array_rec *rec)
{
    pthread_mutex_lock(&g_lock);
    if (g_count == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 16;
        struct array_rec *grown = realloc(g_arrays, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            return 0;
        }
        g_arrays = grown;
        g_cap = cap;
    }
    g_arrays[g_count++] = *rec;
    pthread_mutex_unlock(&g_lock);
    return 1;
}

static void forget(uint64_t handle)
{
    pthread_mutex_lock(&g_lock);
    long i = find_locked(handle);
    if (i >= 0)
        g_arrays[i] = g_arrays[--g_count];
    pthread_mutex_unlock(&g_lock);
}

static void clear_device(int device)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_count;)
        if (pilot_handle_device(g_arrays[i].handle) == device)
            g_arrays[i] = g_arrays[--g_count];
        else
            i++;
    pthread_mutex_unlock(&g_lock);
}

static void fork_child(void)
{
    g_count = 0; /* the parent's arrays are its session's */
    pthread_mutex_init(&g_lock, NULL);
}

/* ---- allocation ---- */

static cudaError_t array_create(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                struct cudaExtent extent, unsigned int flags)
{
    if (!array || !desc)
        return cudaErrorInvalidValue;
    *array = NULL;
    if (flags & (cudaArraySparse | cudaArrayDeferredMapping | cudaArrayColorAttachment)) {
        pilot_log_unsupported("cudaMallocArray/cudaMalloc3DArray (sparse, deferred-mapping or "
                              "color-attachment arrays)");
        return cudaErrorNotSupported;
    }
    pilot_req_array_create req = {
        .width = extent.width, .height = extent.height, .depth = extent.depth,
        .desc = {.x = desc->x, .y = desc->y, .z = desc->z, .w = desc->w, .f = (int32_t)desc->f},
        .flags = flags};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_ARRAY_CREATE, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 NULL, 0, NULL);
    if (err != cudaSuccess)
        return err;
    struct array_rec rec = {.handle = rep.value, .desc = *desc, .extent = extent, .flags = flags,
                            .elem = (uint32_t)rep.value2};
    if (!remember(&rec)) {
        pilot_req_handle free_req = {.handle = rep.value};
        pilot_call(PILOT_OP_ARRAY_DESTROY, &free_req, sizeof free_req, NULL, 0, NULL, 0, NULL, 0,
                   NULL);
        return cudaErrorMemoryAllocation;
    }
    *array = (cudaArray_t)(uintptr_t)rep.value;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaMallocArray(cudaArray_t *array,
                                         const struct cudaChannelFormatDesc *desc, size_t width,
                                         size_t height, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_create(array, desc, (struct cudaExtent){width, height, 0}, flags));
}

PILOT_EXPORT cudaError_t cudaMalloc3DArray(cudaArray_t *array,
                                           const struct cudaChannelFormatDesc *desc,
                                           struct cudaExtent extent, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_create(array, desc, extent, flags));
}

PILOT_EXPORT cudaError_t cudaFreeArray(cudaArray_t array)
{
    PILOT_REQUIRE_SESSION();
    if (!array)
        return cudaSuccess;
    /* Sent whatever the table says: the daemon is the authority on whose array it is. */
    uint64_t h = (uintptr_t)array;
    int dev = pilot_handle_device(h);
    if (dev >= pilot_device_count())
        PILOT_RETURN(cudaErrorInvalidResourceHandle); /* no handle the daemon gives */
    cudaError_t err = pilot_callbacks_fence_device(dev); /* it waits for the device, as natively */
    pilot_req_handle req = {.handle = h};
    if (err == cudaSuccess)
        err = pilot_call_on(dev, PILOT_OP_ARRAY_DESTROY, &req, sizeof req, NULL, 0, NULL, 0, NULL,
                            0, NULL);
    if (err == cudaSuccess)
        forget(h);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaArrayGetInfo(struct cudaChannelFormatDesc *desc,
                                          struct cudaExtent *extent, unsigned int *flags,
                                          cudaArray_t array)
{
    PILOT_REQUIRE_SESSION();
    pthread_mutex_lock(&g_lock);
    long i = array ? find_locked((uintptr_t)array) : -1;
    struct array_rec rec = i >= 0 ? g_arrays[i] : (struct array_rec){0};
    pthread_mutex_unlock(&g_lock);
    if (i < 0)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    if (desc)
        *desc = rec.desc;
    if (extent)
        *extent = rec.extent;
    if (flags)
        *flags = rec.flags;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGetChannelDesc(struct cudaChannelFormatDesc *desc,
                                            cudaArray_const_t array)
{
    if (!desc)
        PILOT_RETURN(cudaErrorInvalidValue);
    return cudaArrayGetInfo(desc, NULL, NULL, (cudaArray_t)array);
}

/* ---- copies ---- */

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* A box's first byte (offset from the base) and the bytes from it to its last, in memory of
 * `pitch` bytes a row and `rows` rows a slice; 0 if either overflows. */
static int box_bytes(uint64_t pitch, uint64_t rows, const struct pilot_copy_end *e, uint64_t width,
                     uint64_t height, uint64_t depth, uint64_t *first, uint64_t *span)
{
    unsigned __int128 f = ((unsigned __int128)e->z * rows + e->y) * pitch + e->x;
    unsigned __int128 s = ((unsigned __int128)(depth - 1) * rows + height - 1) * pitch + width;
    if (f > UINT64_MAX || s > UINT64_MAX)
        return 0;
    *first = (uint64_t)f;
    *span = (uint64_t)s;
    return 1;
}

/* 1 if the box lies inside what the shim knows of a side (the daemon checks again). */
static int side_fits(const struct pilot_copy_end *e, uint64_t width, uint64_t height,
                     uint64_t depth)
{
    if (e->type == PILOT_MEM_ARRAY) {
        const struct pilot_array_info *a = &e->info;
        return e->x <= a->width * a->elem && width <= a->width * a->elem - e->x &&
               e->y <= a->height && height <= a->height - e->y && e->z <= a->depth &&
               depth <= a->depth - e->z;
    }
    if (e->type == PILOT_MEM_DEVICE) {
        uint64_t first, span;
        if (width > e->pitch && (height > 1 || depth > 1))
            return 0;
        return box_bytes(e->pitch, e->rows ? e->rows : height, e, width, height, depth, &first,
                         &span) &&
               pilot_alloc_contains(e->ptr + first, span);
    }
    return 1;
}

static void to_wire(pilot_copy_side *w, const struct pilot_copy_end *e, uint64_t dx, uint64_t dy,
                    uint64_t dz)
{
    memset(w, 0, sizeof *w);
    w->type = (uint32_t)e->type;
    if (e->type == PILOT_MEM_HOST)
        return;
    w->ptr = e->ptr;
    w->array = e->type == PILOT_MEM_ARRAY ? e->info.handle : 0;
    w->pitch = e->pitch;
    w->rows = e->rows;
    w->x = e->x + dx;
    w->y = e->y + dy;
    w->z = e->z + dz;
}

/* The i-th row of a host side's box of `height` rows a slice, from row (y, z) on. */
static uint8_t *host_row(const struct pilot_copy_end *host, uint64_t height, uint64_t x,
                         uint64_t y, uint64_t z, uint64_t i)
{
    return host->host + ((z + i / height) * host->rows + y + i % height) * host->pitch + x;
}

/* Host rows to or from the device side, packed into messages of up to PILOT_INLINE_MAX bytes:
 * whole slices when they fit (several a message), else whole rows, else pieces of a row wider
 * than a message. Uploads are posted but a synchronous copy's last (its reply delivers the
 * others' errors); each download is a call. */
static cudaError_t host_rows(const struct pilot_copy_end *dst, const struct pilot_copy_end *src,
                             uint64_t width, uint64_t height, uint64_t depth, uint64_t stream,
                             int sync)
{
    const int up = src->type == PILOT_MEM_HOST;
    const struct pilot_copy_end *host = up ? src : dst;
    const uint64_t piece = min_size(width, PILOT_INLINE_MAX); /* bytes of a row per message */
    const uint64_t per_msg = width <= PILOT_INLINE_MAX ? PILOT_INLINE_MAX / width : 1; /* rows */
    const int slices = height <= per_msg; /* whole slices a message */
    uint8_t *pack = malloc(min_size(per_msg, height * depth) * piece);
    if (!pack)
        return cudaErrorMemoryAllocation;
    cudaError_t err = cudaSuccess;
    for (uint64_t z = 0, nz; z < depth && err == cudaSuccess; z += nz) {
        nz = slices ? min_size(per_msg / height, depth - z) : 1;
        for (uint64_t y = 0, n; y < height && err == cudaSuccess; y += n) {
            n = min_size(per_msg, height - y);
            const uint64_t nrows = n * nz; /* n == height when nz > 1 */
            for (uint64_t x = 0, w; x < width && err == cudaSuccess; x += w) {
                w = min_size(piece, width - x);
                pilot_req_memcpy_3d req = {.width = w, .height = n, .depth = nz, .stream = stream,
                                           .sync = (uint32_t)sync};
                to_wire(&req.dst, dst, up ? x : 0, up ? y : 0, up ? z : 0);
                to_wire(&req.src, src, up ? 0 : x, up ? 0 : y, up ? 0 : z);
                if (up) {
                    for (uint64_t i = 0; i < nrows; i++)
                        memcpy(pack + i * w, host_row(host, n, x, y, z, i), w);
                    int last = z + nz == depth && y + n == height && x + w == width;
                    err = sync && last ? pilot_call(PILOT_OP_MEMCPY_3D, &req, sizeof req, pack,
                                                    nrows * w, NULL, 0, NULL, 0, NULL)
                                       : pilot_post(PILOT_OP_MEMCPY_3D, &req, sizeof req, pack,
                                                    nrows * w);
                    continue;
                }
                pilot_rep_status rep;
                size_t got = 0;
                err = pilot_call(PILOT_OP_MEMCPY_3D, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 pack, nrows * w, &got);
                if (err == cudaSuccess && got != nrows * w)
                    err = cudaErrorUnknown;
                for (uint64_t i = 0; err == cudaSuccess && i < nrows; i++)
                    memcpy(host_row(host, n, x, y, z, i), pack + i * w, w);
            }
        }
    }
    free(pack);
    return err;
}

cudaError_t pilot_array_copy(const struct pilot_copy_end *dst, const struct pilot_copy_end *src,
                             uint64_t width, uint64_t height, uint64_t depth, uint64_t stream,
                             int sync)
{
    if (!width || !height || !depth)
        return cudaSuccess;
    if (dst->type == PILOT_MEM_HOST && src->type == PILOT_MEM_HOST)
        return cudaErrorInvalidMemcpyDirection; /* never called so: one side is an array */
    if (!side_fits(dst, width, height, depth) || !side_fits(src, width, height, depth))
        return cudaErrorInvalidValue;
    const struct pilot_copy_end *arr = dst->type == PILOT_MEM_ARRAY ? dst : src;
    int dev = stream ? pilot_handle_device(stream) : arr->info.device;
    int src_managed = src->type == PILOT_MEM_DEVICE && pilot_um_active() &&
                      pilot_alloc_is_managed(src->ptr);
    int dst_managed = dst->type == PILOT_MEM_DEVICE && pilot_um_active() &&
                      pilot_alloc_is_managed(dst->ptr);
    cudaError_t err = src_managed || dst_managed ? pilot_um_flush() : cudaSuccess;
    if (err)
        return err;
    int previous = pilot_route_begin(dev);
    if (src->type == PILOT_MEM_HOST || dst->type == PILOT_MEM_HOST)
        err = pilot_callbacks_fence(stream);
    if (err == cudaSuccess) {
        if (src->type == PILOT_MEM_HOST || dst->type == PILOT_MEM_HOST)
            err = host_rows(dst, src, width, height, depth, stream, sync);
        else {
            pilot_req_memcpy_3d req = {.width = width, .height = height, .depth = depth,
                                       .stream = stream, .sync = (uint32_t)sync};
            to_wire(&req.dst, dst, 0, 0, 0);
            to_wire(&req.src, src, 0, 0, 0);
            err = sync ? pilot_call(PILOT_OP_MEMCPY_3D, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0,
                                    NULL)
                       : pilot_post(PILOT_OP_MEMCPY_3D, &req, sizeof req, NULL, 0);
        }
    }
    pilot_route_end(previous);
    uint64_t first, span;
    if (dst_managed && box_bytes(dst->pitch, dst->rows ? dst->rows : height, dst, width, height,
                                 depth, &first, &span))
        err = pilot_um_device_wrote(dst->ptr + first, span, stream, sync, err);
    return err;
}

/* One side of a copy given as a pointer and a cudaMemcpyKind's half: host or device memory. */
cudaError_t pilot_copy_end_memory(struct pilot_copy_end *e, const void *ptr, size_t pitch,
                                  size_t rows, int host_side, int kind_default)
{
    memset(e, 0, sizeof *e);
    if (!ptr)
        return cudaErrorInvalidValue;
    ptr = (const void *)(uintptr_t)pilot_host_unalias((uintptr_t)ptr); /* registered memory */
    int device = pilot_alloc_is_device((uintptr_t)ptr);
    if (kind_default || (device && pilot_um_active() && pilot_alloc_is_managed((uintptr_t)ptr)))
        host_side = !device; /* managed memory is copied where it lives, whatever the kind */
    else if (host_side && device)
        return cudaErrorInvalidValue; /* the shim cannot read device memory as host memory */
    e->type = host_side ? PILOT_MEM_HOST : PILOT_MEM_DEVICE;
    e->host = (uint8_t *)(uintptr_t)ptr;
    e->ptr = (uintptr_t)ptr;
    e->pitch = pitch;
    e->rows = rows;
    return cudaSuccess;
}

cudaError_t pilot_copy_end_array(struct pilot_copy_end *e, const void *array)
{
    memset(e, 0, sizeof *e);
    e->type = PILOT_MEM_ARRAY;
    if (!array)
        return cudaErrorInvalidValue;
    if (!pilot_array_info(array, &e->info)) {
        /* Not one of this process's: the daemon decides (it refuses others' handles). */
        e->info.handle = (uintptr_t)array;
        e->info.device = pilot_handle_device(e->info.handle);
        if (e->info.device >= pilot_device_count())
            return cudaErrorInvalidResourceHandle;
        e->info.elem = 1;
        e->info.width = e->info.height = e->info.depth = UINT64_MAX;
    }
    return cudaSuccess;
}

/* Which sides of a copy are host memory, by cudaMemcpyKind: -1 for a bad kind. */
static int kind_sides(enum cudaMemcpyKind kind, int *src_host, int *dst_host)
{
    switch (kind) {
    case cudaMemcpyHostToHost: *src_host = 1; *dst_host = 1; return 0;
    case cudaMemcpyHostToDevice: *src_host = 1; *dst_host = 0; return 0;
    case cudaMemcpyDeviceToHost: *src_host = 0; *dst_host = 1; return 0;
    case cudaMemcpyDeviceToDevice: *src_host = 0; *dst_host = 0; return 0;
    case cudaMemcpyDefault: *src_host = 0; *dst_host = 0; return 1;
    default: return -1;
    }
}

/* A byte count from (wOffset, hOffset) on, row after row of the array: the rest of the first
 * row, whole rows, then the start of the last one. `lin` is the linear side. */
static cudaError_t linear_run(struct pilot_copy_end *arr, struct pilot_copy_end *lin, int to_array,
                              size_t wOffset, size_t hOffset, size_t count, uint64_t stream,
                              int sync)
{
    if (!count)
        return cudaSuccess;
    const uint64_t row = arr->info.width * arr->info.elem;
    if (arr->info.width == UINT64_MAX) /* unknown handle: one row, the daemon refuses it */
        return pilot_array_copy(to_array ? arr : lin, to_array ? lin : arr, count, 1, 1, stream,
                                sync);
    if (wOffset > row || hOffset >= arr->info.height ||
        count > (arr->info.height - hOffset) * row - wOffset)
        return cudaErrorInvalidValue;
    uint64_t done = 0, y = hOffset, x = wOffset;
    cudaError_t err = cudaSuccess;
    while (done < count && err == cudaSuccess) {
        uint64_t left = count - done, width, height;
        if (x != 0 || left < row) { /* part of one row */
            width = min_size(row - x, left);
            height = 1;
        } else {
            width = row;
            height = left / row;
        }
        arr->x = x;
        arr->y = y;
        struct pilot_copy_end l = *lin; /* the linear side's run is contiguous */
        l.host = lin->host + done;
        l.ptr = lin->ptr + done;
        l.pitch = width;
        l.rows = height;
        int last = done + width * height == count;
        err = pilot_array_copy(to_array ? arr : &l, to_array ? &l : arr, width, height, 1, stream,
                               sync && last);
        done += width * height;
        x = (x + width) % row;
        y += (x == 0) ? height : 0;
    }
    return err;
}

/* A copy between an array, at (wOffset, hOffset), and memory, `pitch` bytes a row: into the
 * array when to_array, else out of it. The 1D forms (one_d) copy `width` bytes row after row
 * (linear_run); pitch and height are then unused. */
static cudaError_t array_memory(int to_array, const void *array, size_t wOffset, size_t hOffset,
                                const void *mem, size_t pitch, size_t width, size_t height,
                                enum cudaMemcpyKind kind, uint64_t stream, int sync, int one_d)
{
    int src_host, dst_host, dflt = kind_sides(kind, &src_host, &dst_host);
    if (dflt < 0 || (!dflt && (to_array ? dst_host : src_host)))
        return cudaErrorInvalidMemcpyDirection;
    if (!one_d && (!width || !height))
        return cudaSuccess;
    if (!one_d && pitch < width)
        return cudaErrorInvalidPitchValue;
    struct pilot_copy_end a, m;
    cudaError_t err = pilot_copy_end_array(&a, array);
    if (err == cudaSuccess)
        err = pilot_copy_end_memory(&m, mem, one_d ? width : pitch, one_d ? 1 : height,
                                    to_array ? src_host : dst_host, dflt);
    if (err)
        return err;
    if (one_d)
        return linear_run(&a, &m, to_array, wOffset, hOffset, width, stream, sync);
    a.x = wOffset;
    a.y = hOffset;
    return pilot_array_copy(to_array ? &a : &m, to_array ? &m : &a, width, height, 1, stream, sync);
}

static cudaError_t array_to_array_2d(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                     cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                     size_t width, size_t height, enum cudaMemcpyKind kind,
                                     uint64_t stream, int sync)
{
    if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    struct pilot_copy_end d, s;
    cudaError_t err = pilot_copy_end_array(&d, dst);
    if (err == cudaSuccess)
        err = pilot_copy_end_array(&s, src);
    if (err)
        return err;
    d.x = wOffsetDst;
    d.y = hOffsetDst;
    s.x = wOffsetSrc;
    s.y = hOffsetSrc;
    return pilot_array_copy(&d, &s, width, height, 1, stream, sync);
}

/* cudaMemcpyArrayToArray: `count` bytes, each array's rows followed from its offset; cut where
 * either side's row ends. */
static cudaError_t array_to_array_1d(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                     cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                     size_t count, enum cudaMemcpyKind kind, uint64_t stream,
                                     int sync)
{
    if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    struct pilot_copy_end d, s;
    cudaError_t err = pilot_copy_end_array(&d, dst);
    if (err == cudaSuccess)
        err = pilot_copy_end_array(&s, src);
    if (err || !count)
        return err;
    if (d.info.width == UINT64_MAX || s.info.width == UINT64_MAX) {
        d.x = wOffsetDst, d.y = hOffsetDst, s.x = wOffsetSrc, s.y = hOffsetSrc;
        return pilot_array_copy(&d, &s, count, 1, 1, stream, sync); /* the daemon refuses it */
    }
    const uint64_t drow = d.info.width * d.info.elem, srow = s.info.width * s.info.elem;
    if (wOffsetDst > drow || hOffsetDst >= d.info.height ||
        count > (d.info.height - hOffsetDst) * drow - wOffsetDst || wOffsetSrc > srow ||
        hOffsetSrc >= s.info.height || count > (s.info.height - hOffsetSrc) * srow - wOffsetSrc)
        return cudaErrorInvalidValue;
    uint64_t dpos = hOffsetDst * drow + wOffsetDst, spos = hOffsetSrc * srow + wOffsetSrc;
    for (uint64_t done = 0; done < count && err == cudaSuccess;) {
        d.x = dpos % drow, d.y = dpos / drow, s.x = spos % srow, s.y = spos / srow;
        uint64_t n = min_size(min_size(drow - d.x, srow - s.x), count - done);
        err = pilot_array_copy(&d, &s, n, 1, 1, stream, sync && done + n == count);
        done += n, dpos += n, spos += n;
    }
    return err;
}

/* ---- entry points ---- */

#define PER_THREAD pilot_stream_handle(cudaStreamPerThread)
#define ASYNC_STREAM(s) pilot_stream_handle(s)
#define PTSZ_STREAM(s) pilot_stream_handle((s) ? (s) : cudaStreamPerThread)

PILOT_EXPORT cudaError_t cudaMemcpy2DToArray(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                             const void *src, size_t spitch, size_t width,
                                             size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, spitch, width, height, kind, 0, 1, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                                  const void *src, size_t spitch, size_t width,
                                                  size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, spitch, width, height, kind,
                              PER_THREAD, 1, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                                  const void *src, size_t spitch, size_t width,
                                                  size_t height, enum cudaMemcpyKind kind,
                                                  cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, spitch, width, height, kind,
                              ASYNC_STREAM(stream), 0, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset,
                                                       size_t hOffset, const void *src,
                                                       size_t spitch, size_t width, size_t height,
                                                       enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, spitch, width, height, kind,
                              PTSZ_STREAM(stream), 0, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DFromArray(void *dst, size_t dpitch, cudaArray_const_t src,
                                               size_t wOffset, size_t hOffset, size_t width,
                                               size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, dpitch, width, height, kind, 0, 1, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DFromArray_ptds(void *dst, size_t dpitch, cudaArray_const_t src,
                                                    size_t wOffset, size_t hOffset, size_t width,
                                                    size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, dpitch, width, height, kind,
                              PER_THREAD, 1, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DFromArrayAsync(void *dst, size_t dpitch, cudaArray_const_t src,
                                                    size_t wOffset, size_t hOffset, size_t width,
                                                    size_t height, enum cudaMemcpyKind kind,
                                                    cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, dpitch, width, height, kind,
                              ASYNC_STREAM(stream), 0, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void *dst, size_t dpitch,
                                                         cudaArray_const_t src, size_t wOffset,
                                                         size_t hOffset, size_t width,
                                                         size_t height, enum cudaMemcpyKind kind,
                                                         cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, dpitch, width, height, kind,
                              PTSZ_STREAM(stream), 0, 0));
}

PILOT_EXPORT cudaError_t cudaMemcpyToArray(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                           const void *src, size_t count, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, 0, count, 0, kind, 0, 1, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                                const void *src, size_t count,
                                                enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, 0, count, 0, kind, PER_THREAD, 1, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                                const void *src, size_t count,
                                                enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, 0, count, 0, kind,
                              ASYNC_STREAM(stream), 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset,
                                                     size_t hOffset, const void *src, size_t count,
                                                     enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(1, dst, wOffset, hOffset, src, 0, count, 0, kind,
                              PTSZ_STREAM(stream), 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromArray(void *dst, cudaArray_const_t src, size_t wOffset,
                                             size_t hOffset, size_t count, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, 0, count, 0, kind, 0, 1, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromArray_ptds(void *dst, cudaArray_const_t src, size_t wOffset,
                                                  size_t hOffset, size_t count,
                                                  enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, 0, count, 0, kind, PER_THREAD, 1, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromArrayAsync(void *dst, cudaArray_const_t src, size_t wOffset,
                                                  size_t hOffset, size_t count,
                                                  enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, 0, count, 0, kind,
                              ASYNC_STREAM(stream), 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromArrayAsync_ptsz(void *dst, cudaArray_const_t src,
                                                       size_t wOffset, size_t hOffset, size_t count,
                                                       enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_memory(0, src, wOffset, hOffset, dst, 0, count, 0, kind,
                              PTSZ_STREAM(stream), 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DArrayToArray(cudaArray_t dst, size_t wOffsetDst,
                                                  size_t hOffsetDst, cudaArray_const_t src,
                                                  size_t wOffsetSrc, size_t hOffsetSrc,
                                                  size_t width, size_t height,
                                                  enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width,
                                   height, kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst,
                                                       size_t hOffsetDst, cudaArray_const_t src,
                                                       size_t wOffsetSrc, size_t hOffsetSrc,
                                                       size_t width, size_t height,
                                                       enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width,
                                   height, kind, PER_THREAD, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyArrayToArray(cudaArray_t dst, size_t wOffsetDst,
                                                size_t hOffsetDst, cudaArray_const_t src,
                                                size_t wOffsetSrc, size_t hOffsetSrc, size_t count,
                                                enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_to_array_1d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count,
                                   kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst,
                                                     size_t hOffsetDst, cudaArray_const_t src,
                                                     size_t wOffsetSrc, size_t hOffsetSrc,
                                                     size_t count, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(array_to_array_1d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count,
                                   kind, PER_THREAD, 1));
}

PILOT_HOOK(api_array, .on_fork_child = fork_child,
           .on_device_reset = clear_device, .reset_rank = PILOT_RESET_ARRAYS);
