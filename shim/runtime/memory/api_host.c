/* Pinned and mapped host memory: cudaHostAlloc, cudaMallocHost, cudaFreeHost, cudaHostRegister,
 * cudaHostUnregister, cudaHostGetDevicePointer, cudaHostGetFlags, and the copies between such
 * memory and device memory.
 *
 * A pinned range is a memfd mapped here and in the daemon, which pins its view of it
 * (cuMemHostRegister, portable and device-mapped; daemon/pinned.py). Both mappings are the same
 * pages, so a kernel writing through the range's device pointer is seen by the program, and
 * copies between the range and device memory are DMA in the daemon, in stream order, never over
 * the socket (PILOT_OP_MEMCPY_PINNED).
 *
 * - cudaHostAlloc: the daemon maps the memfd and answers the device pointer of its view; the
 *   memfd is mapped here at that very address (MAP_FIXED_NOREPLACE), so the program's host
 *   pointer is its device pointer, as with UVA natively. If the address is taken here the shim
 *   keeps the range while asking for another (up to 8 times), then frees the rejected ones.
 *   If all are taken (the driver places them near each other, and a process with large
 *   libraries, such as PyTorch's, may cover them all), the memfd is mapped anywhere here and
 *   registered again under that address: the range works for copies and through
 *   cudaHostGetDevicePointer, but its host pointer is not its device pointer (said once).
 * - cudaHostRegister on the program's own memory: the whole pages covering the range are copied
 *   into a memfd that then replaces them at the same address (mremap over them, contents
 *   preserved), and the daemon registers it. While the pages are copied they are read-only; a
 *   thread that writes to them meanwhile waits in the fault handler (coherence.c) until the
 *   move is done. cudaHostUnregister moves private anonymous memory with the same contents back;
 *   so does a fork child (the memory was private to the program). Only private
 *   writable mappings (heap, anonymous memory, .data/.bss) are moved; anything else (shared or
 *   file mappings, stacks) is registered for the program's bookkeeping only: copies go the
 *   pageable way and it has no device pointer.
 *
 * Pages of one range are never shared with another: registering memory whose pages overlap a
 * registered range fails with cudaErrorHostMemoryAlreadyRegistered. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

#define HOST_ATTEMPTS 8     /* addresses tried before giving up on a cudaHostAlloc */

struct pinned {
    uint64_t base, len;  /* the mapping here: whole pages */
    uint64_t user, size; /* the program's range */
    uint64_t dev;        /* device pointer of `user`; 0 if the daemon does not hold it */
    unsigned int flags;  /* as the program gave them */
    int kind;            /* PILOT_HOST_ALLOC or PILOT_HOST_REGISTERED */
    int device;          /* the session part that holds it */
};

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct pinned *g_ranges; /* sorted by base; mappings never overlap */
static size_t g_count, g_cap;
static int g_any; /* g_count > 0, read without the lock on the copy path */

static uint64_t page_size(void)
{
    return (uint64_t)sysconf(_SC_PAGESIZE);
}

/* ---- the table ---- */

/* Index of the range whose mapping holds addr, or -1. */
static long find_locked(uint64_t addr)
{
    long i = pilot_find_le(g_ranges, g_count, sizeof *g_ranges, addr);
    return i >= 0 && addr - g_ranges[i].base < g_ranges[i].len ? i : -1;
}

static int overlaps_locked(uint64_t base, uint64_t len)
{
    for (size_t i = 0; i < g_count; i++)
        if (g_ranges[i].base < base + len && base < g_ranges[i].base + g_ranges[i].len)
            return 1;
    return 0;
}

static int add_locked(const struct pinned *r)
{
    if (g_count == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 16;
        struct pinned *nr = realloc(g_ranges, cap * sizeof *nr);
        if (!nr)
            return -1;
        g_ranges = nr;
        g_cap = cap;
    }
    size_t at = 0;
    while (at < g_count && g_ranges[at].base < r->base)
        at++;
    memmove(g_ranges + at + 1, g_ranges + at, (g_count - at) * sizeof *g_ranges);
    g_ranges[at] = *r;
    g_count++;
    __atomic_store_n(&g_any, 1, __ATOMIC_RELEASE);
    return 0;
}

static void remove_locked(size_t i)
{
    memmove(g_ranges + i, g_ranges + i + 1, (g_count - i - 1) * sizeof *g_ranges);
    g_count--;
    __atomic_store_n(&g_any, g_count > 0, __ATOMIC_RELEASE);
}

/* Takes the range the program knows by `user` (of `kind`) out of the table into *out. */
static int take(uint64_t user, int kind, struct pinned *out)
{
    int found = 0;
    pthread_rwlock_wrlock(&g_lock);
    long i = find_locked(user);
    if (i >= 0 && g_ranges[i].user == user && g_ranges[i].kind == kind) {
        *out = g_ranges[i];
        remove_locked((size_t)i);
        found = 1;
    }
    pthread_rwlock_unlock(&g_lock);
    return found;
}

/* The range whose program range holds ptr (copied into *out). */
static int lookup(uint64_t ptr, struct pinned *out)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return 0;
    pthread_rwlock_rdlock(&g_lock);
    long i = find_locked(ptr);
    int found = i >= 0 && ptr - g_ranges[i].user < g_ranges[i].size;
    if (found)
        *out = g_ranges[i];
    pthread_rwlock_unlock(&g_lock);
    return found;
}

int pilot_host_pinned(uint64_t ptr, uint64_t count)
{
    struct pinned r;
    return lookup(ptr, &r) && r.dev && count <= r.size - (ptr - r.user);
}

uint64_t pilot_host_unalias(uint64_t ptr)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return ptr;
    pthread_rwlock_rdlock(&g_lock);
    for (size_t i = 0; i < g_count; i++) {
        const struct pinned *r = &g_ranges[i];
        if (r->dev && r->dev != r->user && ptr - r->dev < r->size) {
            ptr = r->user + (ptr - r->dev);
            break;
        }
    }
    pthread_rwlock_unlock(&g_lock);
    return ptr;
}

int pilot_host_attributes(const void *ptr, struct cudaPointerAttributes *attr)
{
    uint64_t p = (uintptr_t)ptr, host = pilot_host_unalias(p);
    struct pinned r;
    if (!lookup(host, &r))
        return 0;
    attr->type = cudaMemoryTypeHost;
    attr->device = r.device;
    attr->hostPointer = (void *)(uintptr_t)host;
    attr->devicePointer = r.dev ? (void *)(uintptr_t)(r.dev + (host - r.user)) : NULL;
    return 1;
}

/* Private anonymous memory with the same contents at [base, base+len) again. */
static int privatize(uint64_t base, uint64_t len)
{
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return tmp == MAP_FAILED ? -1 : pilot_move_pages(base, len, tmp);
}

/* Whether [base, base+len) is private writable memory that is not a stack: every page in a
 * "rw-p" mapping of /proc/self/maps, none labelled [stack], and not the calling thread's stack. */
static int movable(uint64_t base, uint64_t len)
{
    volatile char here = 0;
    uint64_t sp = (uintptr_t)&here;
    if (sp + (1u << 20) >= base && sp < base + len + (1u << 20))
        return 0;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    uint64_t covered = base, end = base + len;
    int ok = 1;
    while (ok && covered < end && fgets(line, sizeof line, f)) {
        unsigned long long lo, hi;
        char perms[8];
        int name_at = 0;
        if (sscanf(line, "%llx-%llx %7s %*s %*s %*s %n", &lo, &hi, perms, &name_at) < 3)
            continue;
        if (hi <= covered || lo >= end)
            continue;
        if (lo > covered || strcmp(perms, "rw-p") != 0 ||
            (name_at && strncmp(line + name_at, "[stack", 6) == 0))
            ok = 0; /* a hole, or memory that must not be replaced */
        covered = hi;
    }
    fclose(f);
    return ok && covered >= end;
}

/* ---- the daemon's side ---- */

static cudaError_t daemon_register(const pilot_req_host_register *req, pilot_rep_u64 *rep)
{
    return pilot_call(PILOT_OP_HOST_REGISTER, req, sizeof *req, NULL, 0, rep, sizeof *rep, NULL, 0,
                      NULL);
}

static cudaError_t daemon_unregister(int device, uint64_t base)
{
    pilot_req_free req = {.ptr = base};
    cudaError_t err = pilot_callbacks_fence_device(device); /* it waits for the device */
    if (err == cudaSuccess)
        err = pilot_call_on(device, PILOT_OP_HOST_UNREGISTER, &req, sizeof req, NULL, 0, NULL, 0,
                            NULL, 0, NULL);
    return err;
}

static int new_memfd(uint64_t len)
{
    int fd = memfd_create("pilot-pinned", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        LOG_ERROR("cannot create a %llu-byte memfd for pinned memory: %s", (unsigned long long)len,
                  strerror(errno));
    return fd;
}

static cudaError_t record(const struct pinned *r)
{
    pthread_rwlock_wrlock(&g_lock);
    int rc = add_locked(r);
    pthread_rwlock_unlock(&g_lock);
    return rc ? cudaErrorMemoryAllocation : cudaSuccess;
}

/* ---- allocation ---- */

/* cudaHostAlloc's way out when every device pointer the daemon offered is taken here: the memfd
 * mapped anywhere, registered again under that address. */
static cudaError_t map_elsewhere(pilot_req_host_register *req, int fd, uint64_t len,
                                 uint64_t *base, uint64_t *dev)
{
    static int said;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    req->address = (uintptr_t)p;
    pilot_rep_u64 rep;
    cudaError_t err = daemon_register(req, &rep);
    req->address = 0;
    if (err) {
        munmap(p, len);
        return err;
    }
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        LOG_WARN("cudaHostAlloc: the device pointers offered were all taken in this process; the "
                 "range is at %p here and %#llx on the device (copies and "
                 "cudaHostGetDevicePointer work; a kernel must be given the device pointer)",
                 p, (unsigned long long)rep.value2);
    *base = (uintptr_t)p;
    *dev = rep.value2;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    if (!ptr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        PILOT_RETURN(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    const uint64_t page = page_size(), len = (size + page - 1) & ~(page - 1);
    int fd = new_memfd(len);
    if (fd < 0)
        PILOT_RETURN(cudaErrorMemoryAllocation);
    pilot_req_host_register req = {.length = len, .size = size, .fd = fd, .flags = flags,
                                   .kind = PILOT_HOST_ALLOC};
    uint64_t taken[HOST_ATTEMPTS], base = 0, dev = 0;
    int ntaken = 0, device = pilot_route_device();
    cudaError_t err;
    for (;;) {
        pilot_rep_u64 rep;
        err = daemon_register(&req, &rep);
        if (err)
            break;
        base = dev = rep.value2; /* the device pointer: the program's pointer too */
        void *want = (void *)(uintptr_t)base;
        void *p = base % page ? MAP_FAILED
                              : mmap(want, len, PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (p == want)
            break;
        if (p != MAP_FAILED)
            munmap(p, len);
        LOG_INFO("pinned range %#llx+%llu is taken in this process", (unsigned long long)base,
                 (unsigned long long)len);
        if (ntaken == HOST_ATTEMPTS) {
            daemon_unregister(device, base);
            err = map_elsewhere(&req, fd, len, &base, &dev);
            break;
        }
        taken[ntaken++] = base; /* kept while asking again, so the daemon maps elsewhere */
    }
    while (ntaken > 0)
        daemon_unregister(device, taken[--ntaken]);
    close(fd);
    if (err)
        PILOT_RETURN(err);
    struct pinned r = {.base = base, .len = len, .user = base, .size = size, .dev = dev,
                       .flags = flags, .kind = PILOT_HOST_ALLOC, .device = device};
    if ((err = record(&r)) != cudaSuccess) {
        daemon_unregister(device, base);
        munmap((void *)(uintptr_t)base, len);
        PILOT_RETURN(err);
    }
    *ptr = (void *)(uintptr_t)base;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

PILOT_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr)
        return cudaSuccess;
    struct pinned r;
    if (!take((uintptr_t)ptr, PILOT_HOST_ALLOC, &r))
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = daemon_unregister(r.device, r.base);
    munmap((void *)(uintptr_t)r.base, r.len);
    PILOT_RETURN(err);
}

/* ---- the program's own memory ---- */

PILOT_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    if (flags & cudaHostRegisterIoMemory) {
        LOG_WARN("cudaHostRegister: cudaHostRegisterIoMemory is not supported under pilot (I/O "
                 "memory cannot be shared with the daemon)");
        PILOT_RETURN(cudaErrorNotSupported);
    }
    if (!ptr || !size ||
        flags & ~(unsigned)(cudaHostRegisterPortable | cudaHostRegisterMapped |
                            cudaHostRegisterReadOnly))
        PILOT_RETURN(cudaErrorInvalidValue);
    const uint64_t page = page_size(), user = (uintptr_t)ptr;
    const uint64_t base = user & ~(page - 1), len = ((user + size + page - 1) & ~(page - 1)) - base;
    struct pinned r = {.base = base, .len = len, .user = user, .size = size, .flags = flags,
                       .kind = PILOT_HOST_REGISTERED, .device = pilot_route_device()};
    pthread_rwlock_rdlock(&g_lock);
    int overlap = overlaps_locked(base, len);
    pthread_rwlock_unlock(&g_lock);
    if (overlap)
        PILOT_RETURN(cudaErrorHostMemoryAlreadyRegistered);
    if (!movable(base, len)) {
        LOG_WARN("cudaHostRegister(%p, %zu): not private writable memory; registered for the "
                 "program's bookkeeping only (pageable copies, no device pointer)", ptr, size);
        PILOT_RETURN(record(&r));
    }
    if (pilot_um_install_handler() != 0) /* writers wait there while the pages move */
        PILOT_RETURN(cudaErrorOperatingSystem);
    int fd = new_memfd(len);
    if (fd < 0)
        PILOT_RETURN(cudaErrorMemoryAllocation);
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cudaError_t err = cudaErrorMemoryAllocation;
    if (tmp != MAP_FAILED && pilot_move_pages(base, len, tmp) == 0) {
        pilot_req_host_register req = {.address = base, .length = len, .offset = user - base,
                                       .size = size, .fd = fd, .flags = flags,
                                       .kind = PILOT_HOST_REGISTERED};
        pilot_rep_u64 rep;
        err = daemon_register(&req, &rep);
        if (err == cudaSuccess) {
            r.dev = rep.value2 + (user - base);
            if ((err = record(&r)) != cudaSuccess)
                daemon_unregister(r.device, base);
        }
        if (err)
            privatize(base, len);
    }
    close(fd);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    PILOT_REQUIRE_SESSION();
    if (!ptr)
        PILOT_RETURN(cudaErrorInvalidValue);
    struct pinned r;
    if (!take((uintptr_t)ptr, PILOT_HOST_REGISTERED, &r))
        PILOT_RETURN(cudaErrorHostMemoryNotRegistered);
    if (!r.dev)
        return cudaSuccess; /* bookkeeping only */
    cudaError_t err = daemon_unregister(r.device, r.base);
    if (privatize(r.base, r.len) != 0 && err == cudaSuccess)
        err = cudaErrorOperatingSystem;
    PILOT_RETURN(err);
}

/* ---- queries ---- */

PILOT_EXPORT cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (!pDevice || !pHost || flags)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    struct pinned r;
    uint64_t host = (uintptr_t)pHost;
    if (!lookup(host, &r))
        PILOT_RETURN(cudaErrorInvalidValue);
    if (!r.dev) {
        LOG_WARN("cudaHostGetDevicePointer(%p): the range could not be shared with the daemon "
                 "(see cudaHostRegister's warning)", pHost);
        PILOT_RETURN(cudaErrorNotSupported);
    }
    *pDevice = (void *)(uintptr_t)(r.dev + (host - r.user));
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    if (!pFlags || !pHost)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    struct pinned r;
    if (!lookup((uintptr_t)pHost, &r) || r.kind != PILOT_HOST_ALLOC)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* Every pinned allocation is mapped, as with unified addressing natively. */
    *pFlags = r.flags | cudaHostAllocMapped;
    return cudaSuccess;
}

/* ---- copies ---- */

cudaError_t pilot_pinned_copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                              uint64_t stream, int sync)
{
    pilot_req_memcpy_pinned req = {.dst = (uintptr_t)dst, .src = (uintptr_t)src, .count = count,
                                   .stream = stream,
                                   .kind = kind == cudaMemcpyHostToDevice ? PILOT_COPY_H2D
                                                                          : PILOT_COPY_D2H,
                                   .sync = (uint32_t)sync};
    if (!sync) /* stream-ordered: the daemon reads or writes the range when the stream gets there */
        return pilot_post(PILOT_OP_MEMCPY_PINNED, &req, sizeof req, NULL, 0);
    cudaError_t err = pilot_callbacks_fence(stream); /* the daemon waits for the copy */
    if (err == cudaSuccess)
        err = pilot_call(PILOT_OP_MEMCPY_PINNED, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    return err;
}

/* After fork the child has no session. Memory of cudaHostAlloc/cudaMallocHost stays shared
 * with the parent, as natively (the driver's pinned allocations are shared mappings: a child's
 * write reaches the parent on the H100); registered memory was the program's private memory,
 * so the child gets its own copy of it, as it would have without pilot. */
static void fork_child(void)
{
    pthread_rwlock_init(&g_lock, NULL);
    for (size_t i = 0; i < g_count; i++)
        if (g_ranges[i].dev && g_ranges[i].kind == PILOT_HOST_REGISTERED)
            privatize(g_ranges[i].base, g_ranges[i].len);
    g_count = 0;
    __atomic_store_n(&g_any, 0, __ATOMIC_RELEASE);
}

PILOT_HOOK(api_host, .on_fork_child = fork_child);
