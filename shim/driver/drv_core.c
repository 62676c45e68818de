/* libpilot-cuda.so: initialization, devices, contexts, errors and cuGetProcAddress.
 *
 * Contexts. pilot has one context per device per session (the daemon's, shared by its
 * tenants), so a CUcontext is a token naming a device of the session: the primary context and
 * every context cuCtxCreate makes on a device are the same token, and the resources a program
 * creates through one are those of its session on that device. cuCtxDestroy therefore frees
 * nothing (they are freed when the process ends, or by cuDevicePrimaryCtxReset); it pops the
 * context if it is current. The calling thread's context stack is kept here; making a context
 * current makes its device the runtime's current device (cudaSetDevice), and a thread that set
 * no context through the driver sees the runtime's device as its current context once the
 * process has a session (the runtime's primary context), as with libcuda. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drv.h"
#include "ops_lookup.h"

#define CONTEXT_STACK 32

struct pilot_drv_context {
    int device;
};

const struct pilot_driver_ops *pilot_drv_ops;
static pthread_once_t g_ops_once = PTHREAD_ONCE_INIT;
static int g_initialized;
static struct pilot_drv_context g_contexts[PILOT_MAX_DEVICES];
static int g_primary_refs[PILOT_MAX_DEVICES];
static unsigned g_primary_flags[PILOT_MAX_DEVICES];
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread CUcontext t_stack[CONTEXT_STACK];
static __thread int t_depth;

/* Who keeps state per context and drops it when the primary context is reset (drv_export.c),
 * set from its constructor. */
static void (*g_context_reset)(CUcontext ctx);

void pilot_drv_on_context_reset(void (*fn)(CUcontext ctx))
{
    g_context_reset = fn;
}

static void find_ops(void)
{
    const struct pilot_driver_ops *ops = pilot_ops_find(
        "libpilot-cuda.so", "every CUDA driver call fails with CUDA_ERROR_NOT_INITIALIZED");
    if (!ops)
        return;
    for (int d = 0; d < PILOT_MAX_DEVICES; d++)
        g_contexts[d].device = d;
    pilot_drv_ops = ops;
}

static int have_ops(void)
{
    pthread_once(&g_ops_once, find_ops);
    return pilot_drv_ops != NULL;
}

void pilot_drv_log_unsupported(const char *name)
{
    if (have_ops())
        pilot_drv_ops->log_unsupported(name);
    else
        fprintf(stderr, "pilot: %s is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", name);
}

void pilot_drv_jit_report(unsigned int n, const CUjit_option *options, void **values, CUresult r,
                          const char *log, size_t len)
{
    size_t info_size = 0, error_size = 0, info_written = 0, error_written = 0;
    for (unsigned int i = 0; i < n; i++) {
        if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
            info_size = (size_t)(uintptr_t)values[i];
        else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            error_size = (size_t)(uintptr_t)values[i];
    }
    for (unsigned int i = 0; i < n; i++) {
        char *buf = values[i];
        int info = options[i] == CU_JIT_INFO_LOG_BUFFER && buf && info_size;
        int error = options[i] == CU_JIT_ERROR_LOG_BUFFER && buf && error_size;
        if (info || error) {
            size_t cap = info ? info_size : error_size;
            int mine = info ? r == CUDA_SUCCESS : r != CUDA_SUCCESS;
            size_t k = mine ? (len < cap - 1 ? len : cap - 1) : 0;
            memcpy(buf, log, k);
            buf[k] = '\0';
            *(info ? &info_written : &error_written) = k ? k + 1 : 0;
        } else if (options[i] == CU_JIT_WALL_TIME) {
            float ms = 0.0f;
            memcpy(&values[i], &ms, sizeof ms);
        }
    }
    for (unsigned int i = 0; i < n; i++) {
        if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
            values[i] = (void *)(uintptr_t)info_written;
        else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            values[i] = (void *)(uintptr_t)error_written;
    }
}

CUresult pilot_drv_result(cudaError_t err)
{
    switch ((int)err) {
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorMissingConfiguration:
        return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorInvalidSymbol:
        return CUDA_ERROR_NOT_FOUND;
    case cudaErrorInvalidDeviceFunction:
        return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorInsufficientDriver:
        return CUDA_ERROR_NOT_INITIALIZED;
    default: /* from 100 on, and the rest below, the runtime's codes are the driver's */
        return (CUresult)err;
    }
}

static CUcontext context_of(int device)
{
    return (CUcontext)&g_contexts[device];
}

CUcontext pilot_drv_context_of(int device)
{
    return context_of(device);
}

/* The context a token names, or NULL if it is none of ours. */
static struct pilot_drv_context *context(CUcontext ctx)
{
    uintptr_t p = (uintptr_t)ctx, base = (uintptr_t)g_contexts;
    if (p < base || p >= base + sizeof g_contexts || (p - base) % sizeof g_contexts[0])
        return NULL;
    return (struct pilot_drv_context *)ctx;
}

static CUcontext current_context(void)
{
    if (t_depth)
        return t_stack[t_depth - 1];
    int device;
    if ((pilot_drv_ops->runtime_bound() & 1) &&
        PILOT_DRV_RT(pilot_drv_ops->cudaGetDevice(&device)) == CUDA_SUCCESS)
        return context_of(device);
    return NULL;
}

CUresult pilot_drv_enter(int need_context)
{
    if (!have_ops())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE) && !(pilot_drv_ops->runtime_bound() & 2))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (need_context && !current_context())
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

int pilot_drv_device(void)
{
    CUcontext ctx = current_context();
    return ctx ? ((struct pilot_drv_context *)ctx)->device : 0;
}

/* ---- initialization, version ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!have_ops())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = pilot_drv_result(pilot_drv_ops->ensure_session());
    if (r == CUDA_SUCCESS)
        __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    if (!have_ops())
        return CUDA_ERROR_NOT_INITIALIZED;
    return PILOT_DRV_RT(pilot_drv_ops->cudaDriverGetVersion(driverVersion));
}

/* ---- devices ---- */

static CUresult check_device(CUdevice dev)
{
    int count = 0;
    CUresult r = PILOT_DRV_RT(pilot_drv_ops->cudaGetDeviceCount(&count));
    if (r != CUDA_SUCCESS)
        return r;
    return dev >= 0 && dev < count && dev < PILOT_MAX_DEVICES ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_DEVICE;
}

/* A device entry point's start: initialized, and dev one of the session's devices. */
static CUresult enter_device(CUdevice dev)
{
    CUresult r = pilot_drv_enter(0);
    return r != CUDA_SUCCESS ? r : check_device(dev);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    CUresult r = PILOT_DRV_RT(pilot_drv_ops->cudaGetDeviceCount(count));
    if (r == CUDA_ERROR_NO_DEVICE) {
        *count = 0;
        r = CUDA_SUCCESS;
    }
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = enter_device(ordinal);
    if (r == CUDA_SUCCESS)
        *device = ordinal;
    return r;
}

static CUresult properties(CUdevice dev, struct cudaDeviceProp *prop)
{
    CUresult r = enter_device(dev);
    return r ? r : PILOT_DRV_RT(pilot_drv_ops->cudaGetDeviceProperties(prop, dev));
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    struct cudaDeviceProp prop;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = properties(dev, &prop);
    if (r == CUDA_SUCCESS) {
        size_t n = strnlen(prop.name, sizeof prop.name);
        n = n < (size_t)len - 1 ? n : (size_t)len - 1;
        memcpy(name, prop.name, n);
        name[n] = '\0';
    }
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    struct cudaDeviceProp prop;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = properties(dev, &prop);
    if (r == CUDA_SUCCESS)
        memcpy(uuid->bytes, prop.uuid.bytes, sizeof uuid->bytes);
    return r;
}

/* The first versions of functions cuda.h maps to later ones: defined under their own names. */
#undef cuDeviceGetUuid
PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    struct cudaDeviceProp prop;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = properties(dev, &prop);
    if (r == CUDA_SUCCESS)
        *bytes = prop.totalGlobalMem;
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    struct cudaDeviceProp prop;
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = properties(dev, &prop);
    if (r == CUDA_SUCCESS) {
        *major = prop.major;
        *minor = prop.minor;
    }
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                                       CUdevice dev)
{
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = enter_device(dev);
    /* CUdevice_attribute and cudaDeviceAttr number the attributes alike. */
    return r ? r : PILOT_DRV_RT(pilot_drv_ops->cudaDeviceGetAttribute(pi, (enum cudaDeviceAttr)attrib,
                                                                       dev));
}

/* ---- contexts ---- */

static CUresult make_current(CUcontext ctx)
{
    struct pilot_drv_context *c = context(ctx);
    return c ? PILOT_DRV_RT(pilot_drv_ops->cudaSetDevice(c->device)) : CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_primary_lock);
    g_primary_refs[dev]++;
    pthread_mutex_unlock(&g_primary_lock);
    *pctx = context_of(dev);
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_primary_lock);
    if (g_primary_refs[dev] > 0)
        g_primary_refs[dev]--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    /* Everything the session holds on the device goes, as the primary context's resources do. */
    int previous = 0;
    PILOT_DRV_RT(pilot_drv_ops->cudaGetDevice(&previous));
    r = PILOT_DRV_RT(pilot_drv_ops->cudaSetDevice(dev));
    if (r == CUDA_SUCCESS)
        r = PILOT_DRV_RT(pilot_drv_ops->cudaDeviceReset());
    PILOT_DRV_RT(pilot_drv_ops->cudaSetDevice(previous));
    if (g_context_reset)
        g_context_reset(context_of(dev)); /* drv_export.c's context-local storage */
    pthread_mutex_lock(&g_primary_lock);
    g_primary_refs[dev] = 0;
    g_primary_flags[dev] = 0;
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
                                                             int *active)
{
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_primary_lock);
    *flags = g_primary_flags[dev];
    *active = g_primary_refs[dev] > 0;
    pthread_mutex_unlock(&g_primary_lock);
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (flags & ~(unsigned)(CU_CTX_SCHED_MASK | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_SYNC_MEMOPS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_primary_lock);
    g_primary_flags[dev] = flags; /* scheduling hints: kept for GetState, no shared effect */
    pthread_mutex_unlock(&g_primary_lock);
    return CUDA_SUCCESS;
}

static CUresult push(CUcontext ctx)
{
    if (t_depth >= CONTEXT_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = make_current(ctx);
    if (r == CUDA_SUCCESS)
        t_stack[t_depth++] = ctx;
    return r;
}

/* Pops the thread's current context; the one below it becomes current. */
static CUcontext pop(void)
{
    CUcontext popped = t_stack[--t_depth];
    if (t_depth)
        make_current(t_stack[t_depth - 1]);
    return popped;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = enter_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    (void)flags; /* scheduling hints: no shared effect */
    r = push(context_of(dev));
    if (r == CUDA_SUCCESS)
        *pctx = context_of(dev);
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params,
                                                 unsigned int flags, CUdevice dev)
{
    if (params && (params->numExecAffinityParams || params->cigParams)) {
        pilot_drv_log_unsupported("cuCtxCreate (execution affinity, CIG)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return cuCtxCreate_v2(pctx, flags, dev);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    PILOT_DRV_ENTER(0);
    if (!context(ctx))
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth && t_stack[t_depth - 1] == ctx)
        pop();
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    *pctx = current_context();
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    PILOT_DRV_ENTER(0);
    if (ctx && !context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = make_current(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (!t_depth)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    PILOT_DRV_ENTER(0);
    if (!context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push(ctx);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    PILOT_DRV_ENTER(0);
    if (!t_depth || !t_stack[t_depth - 1])
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext popped = pop();
    if (pctx)
        *pctx = popped;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    *device = pilot_drv_device();
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    if (!ctx)
        return cuCtxGetDevice(device);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(0);
    struct pilot_drv_context *c = context(ctx);
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->device;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
    PILOT_DRV_ENTER(1);
    return PILOT_DRV_RT(pilot_drv_ops->cudaDeviceSynchronize());
}

/* As cudaCtxResetPersistingL2Cache (shim/runtime/stream/api_stream_attr.c): no line of the program's persists. */
PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxResetPersistingL2Cache(void)
{
    PILOT_DRV_ENTER(1);
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    if (!ctx)
        return cuCtxSynchronize();
    PILOT_DRV_ENTER(0);
    struct pilot_drv_context *c = context(ctx);
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    int previous = 0;
    PILOT_DRV_RT(pilot_drv_ops->cudaGetDevice(&previous));
    CUresult r = PILOT_DRV_RT(pilot_drv_ops->cudaSetDevice(c->device));
    if (r == CUDA_SUCCESS)
        r = PILOT_DRV_RT(pilot_drv_ops->cudaDeviceSynchronize());
    PILOT_DRV_RT(pilot_drv_ops->cudaSetDevice(previous));
    return r;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(ctx == NULL);
    if (ctx && !context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020; /* the API of every context since cuCtxCreate_v2 */
    return CUDA_SUCCESS;
}

/* ---- errors ---- */

PILOT_DRV_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = pilot_drv_error_name((int)error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const char *name = pilot_drv_error_name((int)error);
    if (!name) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The runtime's text for the same code where it has one (its codes are the driver's from
     * 100 on), else the name. */
    const char *text = have_ops() ? pilot_drv_ops->cudaGetErrorString((cudaError_t)error) : NULL;
    *pStr = text && strcmp(text, "unrecognized error code") != 0 ? text : name;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

static int by_proc_name(const void *key, const void *item)
{
    return strcmp(key, ((const struct pilot_drv_proc *)item)->name);
}

static int by_alias_base(const void *key, const void *item)
{
    return strcmp(key, ((const struct pilot_drv_alias *)item)->base);
}

/* drv_gen.c's tables, handed over when the library loads (before any program code runs). */
static const struct pilot_drv_proc *g_procs;
static size_t g_proc_count;
static const struct pilot_drv_alias *g_aliases;
static size_t g_alias_count;

void pilot_drv_register_tables(const struct pilot_drv_proc *procs, size_t proc_count,
                               const struct pilot_drv_alias *aliases, size_t alias_count)
{
    g_procs = procs;
    g_proc_count = proc_count;
    g_aliases = aliases;
    g_alias_count = alias_count;
}

static void *find_proc(const char *name)
{
    const struct pilot_drv_proc *p = bsearch(name, g_procs, g_proc_count, sizeof *g_procs,
                                              by_proc_name);
    return p ? p->fn : NULL;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn,
                                                      int cudaVersion, cuuint64_t flags,
                                                      CUdriverProcAddressQueryResult *symbolStatus)
{
    (void)cudaVersion; /* every name resolves to the version this library's headers define */
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const struct pilot_drv_alias *a = bsearch(symbol, g_aliases, g_alias_count, sizeof *g_aliases,
                                              by_alias_base);
    void *fn = NULL;
    if (a && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && a->per_thread)
        fn = find_proc(a->per_thread);
    if (!fn && a && a->dflt)
        fn = find_proc(a->dflt);
    if (!fn)
        fn = find_proc(symbol);
    *pfn = fn;
    /* An unknown name with a status to report it in: CUDA_SUCCESS, the status saying
     * SYMBOL_NOT_FOUND and a NULL function (as the H100's driver 580 answers). */
    if (symbolStatus) {
        *symbolStatus = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_SUCCESS;
    }
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

#undef cuGetProcAddress
PILOT_DRV_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                                   cuuint64_t flags);
PILOT_DRV_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                                   cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
