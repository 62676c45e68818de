/* The stream-ordered allocator (cudaMallocAsync, cudaFreeAsync, memory pools) on top of pilot's
 * ordinary allocations. On a capturing stream cudaMallocAsync and cudaFreeAsync become graph
 * allocation and free nodes (graph_mem.c); cudaMallocFromPoolAsync is refused there.
 *
 * Semantics kept: an allocation is usable by work ordered after cudaMallocAsync on its stream (it
 * is made at once, which is earlier, so it is). cudaFreeAsync of device memory returns at once:
 * pilotd (daemon/ops/mempool.py) takes the memory from the session, gives its charge back, and
 * zeroes it on the stream after the work issued there before the free; it is freed, or reused,
 * once that is done. A cudaMallocAsync on the same stream may get the block back at once (stream
 * order makes that safe), like a pool's reuse; other allocations only get it zeroed. Not kept:
 * each allocation is a round trip to pilotd. Managed memory and a stream of another device than
 * the memory's are freed the synchronous way (the stream synchronized, then cudaFree). Pools are
 * handles of this process: a default pool per device and the ones cudaMemPoolCreate makes; their
 * attributes are kept (release threshold, reuse flags) and their used/reserved bytes counted
 * (freed memory leaves the pool at the free, so reserved = used). Pools cannot be exported or
 * imported (IPC). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

#define MAX_POOLS 64

struct pool {
    int live;
    int device;
    int reuse[4];               /* cudaMemPoolReuse* attributes 1..3 (index = attribute) */
    unsigned long long release; /* cudaMemPoolAttrReleaseThreshold */
    unsigned long long used, used_high;
};

/* Pools 0..PILOT_MAX_DEVICES-1 are the devices' default pools; the handle is the slot's address. */
static struct pool g_pools[MAX_POOLS];
static int g_current[PILOT_MAX_DEVICES]; /* each device's current pool (cudaDeviceSetMemPool) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Which pool each stream-ordered allocation came from: ptr -> pool slot and size. */
struct owned {
    uint64_t ptr;
    uint64_t size;
    int pool;
};
static struct owned *g_owned;
static size_t g_owned_count, g_owned_cap;

static void reset(void)
{
    memset(g_pools, 0, sizeof g_pools);
    for (int d = 0; d < PILOT_MAX_DEVICES; d++) {
        g_pools[d] = (struct pool){.live = 1, .device = d, .reuse = {0, 1, 1, 1}};
        g_current[d] = d;
    }
    free(g_owned);
    g_owned = NULL;
    g_owned_count = g_owned_cap = 0;
}

static void fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    reset();
}

__attribute__((constructor)) static void mempool_init(void)
{
    reset();
}

PILOT_HOOK(api_mempool, .on_fork_child = fork_child, .on_memory_freed = pilot_mempool_forget);

/* The slot of a pool handle, or -1 (caller holds g_lock). */
static int slot_of(cudaMemPool_t pool)
{
    uintptr_t p = (uintptr_t)pool, base = (uintptr_t)g_pools;
    if (p < base || p >= base + sizeof g_pools || (p - base) % sizeof g_pools[0])
        return -1;
    int i = (int)((p - base) / sizeof g_pools[0]);
    return g_pools[i].live ? i : -1;
}

/* The device of a pool handle, or -1 if it names no live pool. */
static int pool_device(cudaMemPool_t pool)
{
    pthread_mutex_lock(&g_lock);
    int slot = slot_of(pool);
    int device = slot >= 0 ? g_pools[slot].device : -1;
    pthread_mutex_unlock(&g_lock);
    return device;
}

static cudaMemPool_t handle_of(int slot)
{
    return (cudaMemPool_t)(void *)&g_pools[slot];
}

static int valid_device(int device)
{
    return device >= 0 && device < pilot_device_count() && device < PILOT_MAX_DEVICES;
}

/* ---- allocation and free ---- */

static void note_owned(uint64_t ptr, uint64_t size, int slot)
{
    pthread_mutex_lock(&g_lock);
    if (g_owned_count == g_owned_cap) {
        size_t cap = g_owned_cap ? g_owned_cap * 2 : 64;
        struct owned *grown = realloc(g_owned, cap * sizeof *grown);
        if (!grown) { /* the pool's counters miss it: nothing else depends on them */
            pthread_mutex_unlock(&g_lock);
            return;
        }
        g_owned = grown;
        g_owned_cap = cap;
    }
    g_owned[g_owned_count++] = (struct owned){ptr, size, slot};
    struct pool *p = &g_pools[slot];
    p->used += size;
    if (p->used > p->used_high)
        p->used_high = p->used;
    pthread_mutex_unlock(&g_lock);
}

void pilot_mempool_forget(uint64_t ptr)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = g_owned_count; i-- > 0;) { /* the newest first: frees often follow allocations */
        if (g_owned[i].ptr == ptr) {
            struct pool *p = &g_pools[g_owned[i].pool];
            p->used = p->used >= g_owned[i].size ? p->used - g_owned[i].size : 0;
            g_owned[i] = g_owned[--g_owned_count];
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* An allocation on `device` (the calling thread's device kept): with `stream` (a handle, or NULL
 * for none) a stream-ordered one when the stream is of that device. */
static cudaError_t malloc_on(int device, size_t size, const uint64_t *stream, void **ptr)
{
    *ptr = NULL;
    int previous = pilot_current_device();
    cudaError_t err = cudaSuccess;
    if (device != previous)
        err = cudaSetDevice(device); /* the pool's device holds the memory */
    if (err == cudaSuccess && stream && pilot_handle_device(*stream) == device) {
        err = pilot_malloc_ordered(ptr, size, *stream);
    } else if (err == cudaSuccess) {
        /* stream-ordered, so capture-safe: not the unsafe cudaMalloc a capture refuses */
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&mode);
        err = cudaMalloc(ptr, size);
        cudaThreadExchangeStreamCaptureMode(&mode);
    }
    if (device != previous)
        cudaSetDevice(previous);
    return err;
}

cudaError_t pilot_malloc_on(int device, size_t size, void **ptr)
{
    return malloc_on(device, size, NULL, ptr);
}

cudaError_t pilot_free_relaxed(void *ptr)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaFree(ptr);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
}

static cudaError_t alloc_from(void **ptr, size_t size, int slot, int device, cudaStream_t stream)
{
    if (!ptr)
        return cudaErrorInvalidValue;
    uint64_t handle = pilot_stream_handle(stream);
    cudaError_t err = malloc_on(device, size, &handle, ptr);
    if (err == cudaSuccess && *ptr)
        note_owned((uint64_t)(uintptr_t)*ptr, size, slot);
    return err;
}

/* What a capturing stream cannot take: allocation from an explicit pool (pilot's graph
 * allocations come from the device's graph memory), a free of memory no graph allocated. */
static cudaError_t refuse_capture(cudaStream_t stream, const char *what)
{
    cudaError_t err = cudaSuccess;
    if (pilot_capture_any())
        pilot_capture_refuse(pilot_stream_handle(stream), what, &err);
    return err;
}

PILOT_EXPORT cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    /* made now, so usable by everything ordered after this call */
    PILOT_REQUIRE_SESSION();
    int device = pilot_current_device();
    cudaError_t err = cudaSuccess;
    /* on a capturing stream: an allocation node (graph_capture.c) */
    if (pilot_capture_any() && pilot_capture_mem_alloc(pilot_stream_handle(stream), ptr, size,
                                                       device, &err))
        PILOT_RETURN(err);
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    pthread_mutex_lock(&g_lock);
    int slot = g_current[device];
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(alloc_from(ptr, size, slot, device, stream));
}

PILOT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                                 cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = refuse_capture(stream, "cudaMallocFromPoolAsync");
    if (err)
        PILOT_RETURN(err);
    int device = pool_device(memPool);
    if (device < 0)
        PILOT_RETURN(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int slot = slot_of(memPool);
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(alloc_from(ptr, size, slot, device, stream));
}

PILOT_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    if (!devPtr)
        return cudaSuccess;
    cudaError_t err = cudaSuccess;
    /* on a capturing stream, memory a graph allocated: a free node (graph_capture.c) */
    if (pilot_capture_any() && pilot_capture_mem_free(pilot_stream_handle(stream), devPtr, &err))
        PILOT_RETURN(err);
    if ((err = refuse_capture(stream, "cudaFreeAsync")))
        PILOT_RETURN(err);
    if (pilot_hooks_memory_free(devPtr, 1, stream, &err)) /* a graph allocation (graph_mem.c) */
        PILOT_RETURN(err);
    /* device memory: pilotd frees it in stream order, no wait (forgotten in its pool too) */
    if (pilot_free_ordered(devPtr, pilot_stream_handle(stream), &err))
        PILOT_RETURN(err);
    /* managed memory, or a stream of another device: after the work issued to the stream
     * before this call, which may still use it, the synchronous way */
    err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess)
        err = pilot_free_relaxed(devPtr);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream)
{
    return cudaMallocAsync(ptr, size, stream ? stream : cudaStreamPerThread);
}

PILOT_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                      cudaStream_t stream)
{
    return cudaMallocFromPoolAsync(ptr, size, memPool, stream ? stream : cudaStreamPerThread);
}

PILOT_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream)
{
    return cudaFreeAsync(devPtr, stream ? stream : cudaStreamPerThread);
}

/* ---- pools ---- */

PILOT_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    PILOT_REQUIRE_SESSION();
    if (!memPool)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    *memPool = handle_of(device);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    PILOT_REQUIRE_SESSION();
    if (!memPool)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    pthread_mutex_lock(&g_lock);
    *memPool = handle_of(g_current[device]);
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    PILOT_REQUIRE_SESSION();
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    pthread_mutex_lock(&g_lock);
    int slot = slot_of(memPool);
    cudaError_t err = slot < 0 || g_pools[slot].device != device ? cudaErrorInvalidValue : cudaSuccess;
    if (err == cudaSuccess)
        g_current[device] = slot;
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

/* The pool of a cudaMemLocation of a device with pinned (device) allocations: the CUDA 13 forms. */
static cudaError_t device_of_location(const struct cudaMemLocation *location,
                                      enum cudaMemAllocationType type, int *device)
{
    if (!location || type != cudaMemAllocationTypePinned)
        return cudaErrorInvalidValue;
    if (location->type != cudaMemLocationTypeDevice)
        return cudaErrorNotSupported; /* host pools: not served */
    if (!valid_device(location->id))
        return cudaErrorInvalidDevice;
    *device = location->id;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t *memPool,
                                                  struct cudaMemLocation *location,
                                                  enum cudaMemAllocationType type)
{
    PILOT_REQUIRE_SESSION();
    int device;
    cudaError_t err = device_of_location(location, type, &device);
    if (err)
        PILOT_RETURN(err);
    return cudaDeviceGetDefaultMemPool(memPool, device);
}

PILOT_EXPORT cudaError_t cudaMemGetMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
                                           enum cudaMemAllocationType type)
{
    PILOT_REQUIRE_SESSION();
    int device;
    cudaError_t err = device_of_location(location, type, &device);
    if (err)
        PILOT_RETURN(err);
    return cudaDeviceGetMemPool(memPool, device);
}

PILOT_EXPORT cudaError_t cudaMemSetMemPool(struct cudaMemLocation *location,
                                           enum cudaMemAllocationType type, cudaMemPool_t memPool)
{
    PILOT_REQUIRE_SESSION();
    int device;
    cudaError_t err = device_of_location(location, type, &device);
    if (err)
        PILOT_RETURN(err);
    return cudaDeviceSetMemPool(device, memPool);
}

PILOT_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool,
                                           const struct cudaMemPoolProps *poolProps)
{
    PILOT_REQUIRE_SESSION();
    if (!memPool || !poolProps || poolProps->allocType != cudaMemAllocationTypePinned)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (poolProps->location.type != cudaMemLocationTypeDevice)
        PILOT_RETURN(cudaErrorNotSupported);
    if (!valid_device(poolProps->location.id))
        PILOT_RETURN(cudaErrorInvalidValue); /* not InvalidDevice: as the H100 answers */
    if (poolProps->handleTypes != cudaMemHandleTypeNone)
        PILOT_RETURN(cudaErrorNotSupported); /* exportable pools (IPC) */
    cudaError_t err = cudaErrorMemoryAllocation;
    pthread_mutex_lock(&g_lock);
    for (int i = PILOT_MAX_DEVICES; i < MAX_POOLS; i++) {
        if (!g_pools[i].live) {
            g_pools[i] = (struct pool){.live = 1, .device = poolProps->location.id,
                                       .reuse = {0, 1, 1, 1}};
            *memPool = handle_of(i);
            err = cudaSuccess;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    PILOT_REQUIRE_SESSION();
    pthread_mutex_lock(&g_lock);
    int slot = slot_of(memPool);
    cudaError_t err = slot < PILOT_MAX_DEVICES ? cudaErrorInvalidValue : cudaSuccess;
    if (err == cudaSuccess) {
        /* natively its memory stays allocated until freed; pilot's allocations are ordinary */
        for (int d = 0; d < PILOT_MAX_DEVICES; d++)
            if (g_current[d] == slot)
                g_current[d] = d;
        for (size_t i = 0; i < g_owned_count; i++)
            if (g_owned[i].pool == slot)
                g_owned[i].pool = g_pools[slot].device;
        g_pools[slot].live = 0;
    }
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

/* cudaMemPoolSetAttribute (set) and cudaMemPoolGetAttribute: int reuse flags, 64-bit amounts. */
static cudaError_t pool_attribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value,
                                  int set)
{
    if (!value)
        return cudaErrorInvalidValue;
    cudaError_t err = cudaSuccess;
    unsigned long long *amount = value;
    pthread_mutex_lock(&g_lock);
    int slot = slot_of(memPool);
    struct pool *p = slot >= 0 ? &g_pools[slot] : NULL;
    if (!p) {
        err = cudaErrorInvalidValue;
    } else if (attr >= cudaMemPoolReuseFollowEventDependencies &&
               attr <= cudaMemPoolReuseAllowInternalDependencies) {
        if (set)
            p->reuse[attr] = *(int *)value != 0;
        else
            *(int *)value = p->reuse[attr];
    } else if (attr == cudaMemPoolAttrReleaseThreshold) {
        if (set)
            p->release = *amount;
        else
            *amount = p->release;
    } else if (attr == cudaMemPoolAttrReservedMemHigh || attr == cudaMemPoolAttrUsedMemHigh) {
        if (!set)
            *amount = p->used_high;
        else if (*amount != 0) /* only a reset to 0 is allowed */
            err = cudaErrorInvalidValue;
        else
            p->used_high = p->used;
    } else if (attr == cudaMemPoolAttrReservedMemCurrent || attr == cudaMemPoolAttrUsedMemCurrent) {
        if (set)
            err = cudaErrorInvalidValue; /* read-only */
        else
            *amount = p->used; /* released at once: reserved = used */
    } else {
        err = cudaErrorInvalidValue;
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

PILOT_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                                 void *value)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pool_attribute(memPool, attr, value, 1));
}

PILOT_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                                 void *value)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pool_attribute(memPool, attr, value, 0));
}

PILOT_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    (void)minBytesToKeep; /* nothing is kept: freed memory goes back at once */
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pool_device(memPool) < 0 ? cudaErrorInvalidValue : cudaSuccess);
}

PILOT_EXPORT cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool,
                                              const struct cudaMemAccessDesc *descList, size_t count)
{
    PILOT_REQUIRE_SESSION();
    int device = pool_device(memPool);
    if (device < 0 || (count && !descList))
        PILOT_RETURN(cudaErrorInvalidValue);
    for (size_t i = 0; i < count; i++) {
        const struct cudaMemAccessDesc *d = &descList[i];
        if (d->location.type != cudaMemLocationTypeDevice || !valid_device(d->location.id))
            PILOT_RETURN(cudaErrorInvalidDevice);
        if (d->location.id == device && d->flags != cudaMemAccessFlagsProtReadWrite)
            PILOT_RETURN(cudaErrorInvalidDevice); /* the pool's own device keeps read-write */
        if (d->location.id != device && d->flags != cudaMemAccessFlagsProtNone) {
            int can = 0; /* other devices reach it as peers */
            cudaError_t err = cudaDeviceCanAccessPeer(&can, d->location.id, device);
            if (err || !can)
                PILOT_RETURN(err ? err : cudaErrorInvalidDevice);
        }
    }
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t memPool,
                                              struct cudaMemLocation *location)
{
    PILOT_REQUIRE_SESSION();
    if (!flags || !location)
        PILOT_RETURN(cudaErrorInvalidValue);
    int device = pool_device(memPool);
    if (device < 0 || location->type != cudaMemLocationTypeDevice || !valid_device(location->id))
        PILOT_RETURN(cudaErrorInvalidValue);
    *flags = location->id == device ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
    return cudaSuccess;
}

