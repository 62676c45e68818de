/* Unified memory entry points: cudaMallocManaged, advice, prefetch, range attributes, stream
 * attachment, pointer attributes. The shadows behind managed pointers and their coherence are
 * coherence.c's; this file sets them up and forwards the rest to the daemon, which holds the
 * real managed memory (so the driver's migration, advice and prefetch act for real). */
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) & ~(page - 1);
}

/* The fault handler and the fault channel, set up before the first shadow exists; and the
 * session's staging area, which the first flush needs (the first launch after host writes):
 * opening it means pinning it in pilotd, a cost taken here rather than in the first kernel. A
 * refusal of it (the tenant's pinned limit) is left to that flush to report. */
static cudaError_t um_prepare(void)
{
    if (pilot_um_install_handler() != 0) {
        LOG_ERROR("cannot install the unified-memory fault handler");
        return cudaErrorOperatingSystem;
    }
    cudaError_t err = pilot_fault_channel_open();
    if (err == cudaSuccess && pilot_staging_ready() != cudaSuccess)
        LOG_INFO("the staging area is not open yet: the first flush will ask again");
    return err;
}

PILOT_EXPORT cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags)
{
    if (!ptr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (size == 0) { /* a success with NULL, as natively on the H100 */
        *ptr = NULL;
        return cudaSuccess;
    }
    cudaError_t err = um_prepare();
    if (err)
        PILOT_RETURN(err);
    if (pilot_um_pack_wanted(size, flags)) /* a piece of a range the session holds (um_pack.c) */
        PILOT_RETURN(pilot_um_pack_alloc(size, ptr));
    uint64_t base;
    err = pilot_um_new_range(size, flags == cudaMemAttachHost ? PILOT_MANAGED_ATTACH_HOST
                                                              : PILOT_MANAGED_ATTACH_GLOBAL, &base);
    if (err)
        PILOT_RETURN(err);
    pilot_alloc_add_flags(base, size, PILOT_ALLOC_MANAGED);
    *ptr = (void *)(uintptr_t)base;
    return cudaSuccess;
}

/* Shadows of a module's __managed__ variables (registry.c calls this once the module is loaded):
 * each variable's range is mapped once, INVALID (the device holds the initial values), and the
 * program's host-side pointer to the variable is filled in. */
/* A loaded module's __managed__ variable (registry.c, through the hook): maps its shadow,
 * fills *host_ptr. */
static cudaError_t bind_variable(uint64_t module, const char *name, void **host_ptr)
{
    cudaError_t err = um_prepare();
    if (err)
        return err;
    pilot_req_symbol_get req = {.module = module};
    pilot_rep_managed_var rep;
    err = pilot_call(PILOT_OP_MANAGED_VAR, &req, sizeof req, name, strlen(name), &rep, sizeof rep,
                     NULL, 0, NULL);
    if (err)
        return err;
    /* Variables of one module may share pages: map only the pages no shadow covers yet (the
     * daemon adds this range to the shadows that already cover part of it). */
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t from = rep.range_base & ~(page - 1), to = page_round(rep.range_base + rep.range_size);
    while (from < to) {
        uint64_t gap_end, gap = pilot_um_next_gap(from, to, &gap_end);
        if (gap >= gap_end)
            break;
        int in_use;
        err = pilot_um_map_shadow(gap, gap_end - gap, 0, PILOT_UM_VARIABLE, &in_use);
        if (err) {
            LOG_ERROR("cannot map __managed__ variable %s at %#llx%s", name,
                      (unsigned long long)rep.address, in_use ? ": the address is in use here" : "");
            return err;
        }
        from = gap_end;
    }
    pilot_alloc_add_flags(rep.address, rep.size, PILOT_ALLOC_SYMBOL | PILOT_ALLOC_MANAGED);
    if (host_ptr)
        *host_ptr = (void *)(uintptr_t)rep.address;
    return cudaSuccess;
}

/* The range [ptr, ptr+count) inside one managed range of the session. */
static int managed_range(const void *ptr, size_t count)
{
    uint64_t base, size, p = (uintptr_t)ptr;
    int flags = pilot_alloc_flags(p, &base, &size);
    return flags >= 0 && (flags & PILOT_ALLOC_MANAGED) && count <= size - (p - base);
}

PILOT_EXPORT cudaError_t cudaMemAdvise(const void *ptr, size_t count, enum cudaMemoryAdvise advice,
                                       struct cudaMemLocation location)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr || !count || !managed_range(ptr, count))
        PILOT_RETURN(cudaErrorInvalidValue);
    pilot_req_mem_advise req = {.ptr = (uintptr_t)ptr, .count = count, .advice = (int32_t)advice,
                                .location_type = (int32_t)location.type,
                                .location_id = location.id};
    PILOT_RETURN(pilot_call(PILOT_OP_MEM_ADVISE, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL));
}

static cudaError_t prefetch(const void *ptr, size_t count, struct cudaMemLocation location,
                            unsigned int flags, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr || !count || !managed_range(ptr, count))
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = pilot_um_flush(); /* the device side must hold what the host wrote */
    if (err)
        PILOT_RETURN(err);
    pilot_req_mem_prefetch req = {.ptr = (uintptr_t)ptr, .count = count,
                                  .stream = pilot_stream_handle(stream),
                                  .location_type = (int32_t)location.type,
                                  .location_id = location.id, .flags = flags};
    PILOT_RETURN(pilot_post(PILOT_OP_MEM_PREFETCH, &req, sizeof req, NULL, 0));
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync(const void *ptr, size_t count,
                                              struct cudaMemLocation location, unsigned int flags,
                                              cudaStream_t stream)
{
    return prefetch(ptr, count, location, flags, stream);
}

PILOT_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void *ptr, size_t count,
                                                   struct cudaMemLocation location,
                                                   unsigned int flags, cudaStream_t stream)
{
    return prefetch(ptr, count, location, flags, stream);
}

static cudaError_t range_attribute(void *data, size_t size, enum cudaMemRangeAttribute attribute,
                                   const void *ptr, size_t count)
{
    if (!data || !size || !ptr || !count || !managed_range(ptr, count))
        return cudaErrorInvalidValue;
    pilot_req_mem_range_attr req = {.ptr = (uintptr_t)ptr, .count = count, .data_size = size,
                                    .attribute = (int32_t)attribute};
    pilot_rep_status rep;
    size_t got = 0;
    cudaError_t err = pilot_call(PILOT_OP_MEM_RANGE_ATTR, &req, sizeof req, NULL, 0, &rep,
                                 sizeof rep, data, size, &got);
    if (err == cudaSuccess && got != size)
        err = cudaErrorUnknown;
    return err;
}

PILOT_EXPORT cudaError_t cudaMemRangeGetAttribute(void *data, size_t size,
                                                  enum cudaMemRangeAttribute attribute,
                                                  const void *ptr, size_t count)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(range_attribute(data, size, attribute, ptr, count));
}

PILOT_EXPORT cudaError_t cudaMemRangeGetAttributes(void **data, size_t *sizes,
                                                   enum cudaMemRangeAttribute *attributes,
                                                   size_t n, const void *ptr, size_t count)
{
    PILOT_REQUIRE_SESSION();
    if (!data || !sizes || !attributes || !n)
        PILOT_RETURN(cudaErrorInvalidValue);
    for (size_t i = 0; i < n; i++) {
        cudaError_t err = range_attribute(data[i], sizes[i], attributes[i], ptr, count);
        if (err)
            PILOT_RETURN(err);
    }
    return cudaSuccess;
}

static cudaError_t attach(cudaStream_t stream, void *ptr, size_t length, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr || !managed_range(ptr, length ? length : 1) ||
        (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost &&
         flags != cudaMemAttachSingle))
        PILOT_RETURN(cudaErrorInvalidValue);
    /* A packed piece (um_pack.c): its range holds other allocations of the session, which an
     * attachment of the whole range would move too. Attachment restricts nothing on a GPU with
     * concurrent managed access (the H100's: its host and device may touch managed memory at
     * any time), so the piece is left attached globally, as the range is. */
    int flags_of = pilot_alloc_flags((uintptr_t)ptr, NULL, NULL);
    if (flags_of >= 0 && (flags_of & PILOT_ALLOC_PACKED))
        return cudaSuccess;
    pilot_req_stream_attach_mem req = {.stream = pilot_stream_handle(stream),
                                       .ptr = (uintptr_t)ptr, .length = length, .flags = flags};
    PILOT_RETURN(pilot_post(PILOT_OP_STREAM_ATTACH_MEM, &req, sizeof req, NULL, 0));
}

PILOT_EXPORT cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void *ptr, size_t length,
                                                  unsigned int flags)
{
    return attach(stream, ptr, length, flags);
}

PILOT_EXPORT cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void *ptr,
                                                       size_t length, unsigned int flags)
{
    return attach(stream, ptr, length, flags);
}

/* Answered from the shim's own table of the session's memory: no round trip. */
PILOT_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr,
                                                  const void *ptr)
{
    if (!attr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    memset(attr, 0, sizeof *attr);
    if (pilot_host_attributes(ptr, attr))
        return cudaSuccess;
    int flags = pilot_alloc_flags((uintptr_t)ptr, NULL, NULL);
    if (flags < 0) {
        /* Memory CUDA does not know: since CUDA 11 a success, typed unregistered. */
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2; /* cudaInvalidDeviceId */
        attr->hostPointer = (void *)ptr; /* as natively */
        return cudaSuccess;
    }
    int device = 0;
    cudaGetDevice(&device);
    attr->device = device;
    attr->devicePointer = (void *)ptr;
    if (flags & PILOT_ALLOC_MANAGED) {
        attr->type = cudaMemoryTypeManaged;
        attr->hostPointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeDevice;
    }
    return cudaSuccess;
}

PILOT_HOOK(api_managed, .on_managed_variable = bind_variable);
