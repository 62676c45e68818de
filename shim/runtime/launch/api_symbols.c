/* __device__ and __constant__ variables: their registration by nvcc's constructors and the
 * runtime's symbol API (cudaMemcpyToSymbol/FromSymbol and their Async forms,
 * cudaGetSymbolAddress, cudaGetSymbolSize).
 *
 * A symbol is the address of the host shadow variable nvcc passes to __cudaRegisterVar, with
 * the image it belongs to and its exact ELF name. On first use on a device the image is loaded
 * there (registry.c, the same path kernels take, so both see one module) and the daemon reports
 * the variable's device address and size (SYMBOL_GET); each device has its own copy. The range then joins the allocation mirror, flagged so
 * that cudaFree refuses it, and a symbol copy is a plain copy at address + offset.
 *
 * Order of checks, as CUDA 13 reports them natively on the H100: nothing to copy is success
 * (even for a pointer that is no symbol); then an unknown symbol is cudaErrorInvalidSymbol; then
 * offset + count past the variable's end is cudaErrorInvalidValue; then a direction the call
 * does not take is cudaErrorInvalidMemcpyDirection. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

#define BUCKETS 256u

struct pilot_symbol {
    const void *host_var;
    struct pilot_image *image;
    char *name;
    size_t host_size; /* as nvcc registered it; the daemon's size is the one used */
    int resolved[PILOT_MAX_DEVICES];
    uint64_t address[PILOT_MAX_DEVICES], size[PILOT_MAX_DEVICES];
    struct pilot_symbol *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;         /* the table */
static pthread_mutex_t g_resolve_lock = PTHREAD_MUTEX_INITIALIZER; /* SYMBOL_GET, one at a time */
static struct pilot_symbol *g_table[BUCKETS];

static unsigned bucket(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return (unsigned)(x >> 40) % BUCKETS;
}

PILOT_EXPORT void __cudaRegisterVar(void **handle, char *host_var, char *device_address,
                                    const char *device_name, int ext, size_t size, int constant,
                                    int global)
{
    (void)device_address, (void)ext, (void)constant, (void)global;
    if (!handle || !host_var || !device_name)
        return;
    struct pilot_symbol *s = calloc(1, sizeof *s);
    if (!s)
        return;
    s->name = strdup(device_name);
    if (!s->name) {
        free(s);
        return;
    }
    s->host_var = host_var;
    s->image = (struct pilot_image *)handle;
    s->host_size = size;
    pthread_mutex_lock(&g_lock);
    unsigned b = bucket(host_var);
    s->next = g_table[b]; /* in front: a later library's variable at a reused address wins */
    g_table[b] = s;
    pthread_mutex_unlock(&g_lock);
}

static void forget_image(struct pilot_image *img)
{
    /* The library is being unloaded: its shadow addresses may be reused by the next one. The
     * records are leaked on purpose (another thread may hold one), as registry.c does. */
    pthread_mutex_lock(&g_lock);
    for (unsigned b = 0; b < BUCKETS; b++) {
        struct pilot_symbol **pp = &g_table[b];
        while (*pp) {
            if ((*pp)->image == img)
                *pp = (*pp)->next;
            else
                pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* After fork: nothing is resolved in the child's session, and the ranges are gone. */
static void fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_resolve_lock, NULL);
    for (unsigned b = 0; b < BUCKETS; b++)
        for (struct pilot_symbol *s = g_table[b]; s; s = s->next) {
            memset(s->resolved, 0, sizeof s->resolved);
            memset(s->address, 0, sizeof s->address);
            memset(s->size, 0, sizeof s->size);
        }
    pilot_alloc_clear_symbols();
}

PILOT_HOOK(api_symbols, .on_fork_child = fork_child, .on_image_unregister = forget_image);

static struct pilot_symbol *lookup(const void *symbol)
{
    if (!symbol)
        return NULL;
    pthread_mutex_lock(&g_lock);
    struct pilot_symbol *s = g_table[bucket(symbol)];
    while (s && s->host_var != symbol)
        s = s->next;
    pthread_mutex_unlock(&g_lock);
    return s;
}

static cudaError_t resolve(struct pilot_symbol *s, int dev)
{
    if (__atomic_load_n(&s->resolved[dev], __ATOMIC_ACQUIRE))
        return cudaSuccess;
    pthread_mutex_lock(&g_resolve_lock);
    cudaError_t err = cudaSuccess;
    if (!s->resolved[dev]) {
        uint64_t module = 0;
        err = pilot_image_module(s->image, &module);
        if (err == cudaSuccess) {
            pilot_req_symbol_get req = {.module = module};
            pilot_rep_u64 rep;
            err = pilot_call(PILOT_OP_SYMBOL_GET, &req, sizeof req, s->name, strlen(s->name), &rep,
                             sizeof rep, NULL, 0, NULL);
            if (err == cudaSuccess && rep.value == 0)
                err = cudaErrorInvalidSymbol;
            if (err == cudaSuccess) {
                if (rep.value2 != s->host_size)
                    LOG_WARN("variable %s: %llu bytes in the module, %zu registered", s->name,
                             (unsigned long long)rep.value2, s->host_size);
                s->address[dev] = rep.value;
                s->size[dev] = rep.value2;
                pilot_alloc_add_symbol(rep.value, rep.value2);
                __atomic_store_n(&s->resolved[dev], 1, __ATOMIC_RELEASE);
            }
        }
        if (err != cudaSuccess)
            LOG_WARN("variable %s: cannot resolve in pilotd (%s)", s->name, cudaGetErrorName(err));
    }
    pthread_mutex_unlock(&g_resolve_lock);
    return err;
}

/* The symbol's address and size on the route device (resolved there), or CUDA's error. */
static cudaError_t find(const void *symbol, uint64_t *address, uint64_t *size)
{
    struct pilot_symbol *s = lookup(symbol);
    if (!s)
        return cudaErrorInvalidSymbol;
    const int dev = pilot_route_device();
    cudaError_t err = resolve(s, dev);
    if (err == cudaSuccess) {
        *address = s->address[dev];
        *size = s->size[dev];
    }
    return err;
}

/* Device address of [offset, offset+count) inside the variable `symbol`. */
static cudaError_t symbol_range(const void *symbol, size_t offset, size_t count, uint64_t *addr)
{
    uint64_t base = 0, size = 0;
    cudaError_t err = find(symbol, &base, &size);
    if (err)
        return err;
    if (offset > size || count > size - offset)
        return cudaErrorInvalidValue;
    *addr = base + offset;
    return cudaSuccess;
}

cudaError_t pilot_to_symbol(const void *symbol, const void *src, size_t count, size_t offset,
                             enum cudaMemcpyKind kind, uint64_t stream, int sync)
{
    if (count == 0)
        return cudaSuccess;
    uint64_t addr = 0;
    cudaError_t err = symbol_range(symbol, offset, count, &addr);
    if (err)
        return err;
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    return pilot_memcpy((void *)(uintptr_t)addr, src, count, kind, stream, sync);
}

cudaError_t pilot_from_symbol(void *dst, const void *symbol, size_t count, size_t offset,
                               enum cudaMemcpyKind kind, uint64_t stream, int sync)
{
    if (count == 0)
        return cudaSuccess;
    uint64_t addr = 0;
    cudaError_t err = symbol_range(symbol, offset, count, &addr);
    if (err)
        return err;
    if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    return pilot_memcpy(dst, (const void *)(uintptr_t)addr, count, kind, stream, sync);
}

PILOT_EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
                                            size_t offset, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_to_symbol(symbol, src, count, offset, kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
                                                 size_t offset, enum cudaMemcpyKind kind,
                                                 cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_to_symbol(symbol, src, count, offset, kind, pilot_stream_handle(stream), 0));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
                                              size_t offset, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_from_symbol(dst, symbol, count, offset, kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
                                                   size_t offset, enum cudaMemcpyKind kind,
                                                   cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_from_symbol(dst, symbol, count, offset, kind, pilot_stream_handle(stream), 0));
}

PILOT_EXPORT cudaError_t cudaGetSymbolAddress(void **dev_ptr, const void *symbol)
{
    PILOT_REQUIRE_SESSION();
    if (!dev_ptr) /* CUDA itself crashes here */
        PILOT_RETURN(cudaErrorInvalidValue);
    uint64_t address = 0, size = 0;
    cudaError_t err = find(symbol, &address, &size);
    if (err == cudaSuccess)
        *dev_ptr = (void *)(uintptr_t)address;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
    PILOT_REQUIRE_SESSION();
    if (!size) /* CUDA itself crashes here */
        PILOT_RETURN(cudaErrorInvalidValue);
    uint64_t address = 0, bytes = 0;
    cudaError_t err = find(symbol, &address, &bytes);
    if (err == cudaSuccess)
        *size = (size_t)bytes;
    PILOT_RETURN(err);
}
