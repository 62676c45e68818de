/* Smaller parts of the runtime API (issue 3): streams with a priority (their flags and
 * priorities are read in api_stream_info.c), device flags, limits,
 * cache configurations, the profiler switches, function attributes, occupancy, and pitched (2D)
 * memory (peer queries: api_peer.c).
 *
 * Where each setting lives. The daemon's CUDA context is shared by every tenant of a GPU, so
 * nothing a program sets may change what other programs get:
 * - kept in the shim, per process (a process is one session), validated as CUDA 13 validates
 *   them and reported back, with no effect on the device: device flags (the shim's own waits
 *   spin briefly, then sleep, whatever the scheduling flag), the device cache configuration, and
 *   functions' cache and shared-memory-bank configurations (hints that Hopper ignores anyway);
 * - in the daemon, per session: stream flags and priorities (streams are the session's own),
 *   function attributes (each session loads its own module, so its CUfunctions are its own);
 * - in the daemon, shared: limits (cudaDeviceSetLimit). The context has one value per limit,
 *   so pilotd applies the largest value any live session asked for (never less than the
 *   context's own default) and reports the effective value; a session asking for less than
 *   that gets success and reads back the larger value (daemon/limits.py).
 *
 * 2D copies go row by row but not message by message: rows are packed into inline messages of
 * up to PILOT_INLINE_MAX bytes which the daemon scatters (H2D) or gathers (D2H) with one 2D
 * copy each; rows wider than that take the ordinary large-copy path (the staging area) one by
 * one. Device-to-device copies and memsets are one daemon-side 2D operation. Every range is
 * checked here against the allocation mirror and again by the daemon. */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* ---- streams and events ---- */

PILOT_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags,
                                                      int priority)
{
    if (!stream)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* Out-of-range priorities are clamped to the device's range, by the driver (cuda backend)
     * or the sim, as CUDA does; cudaStreamGetPriority reports the clamped value. */
    pilot_req_stream_create req = {.flags = flags, .priority = priority};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_STREAM_CREATE, &req, sizeof req, NULL, 0, &rep,
                                 sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        *stream = (cudaStream_t)(uintptr_t)rep.value;
    PILOT_RETURN(err);
}

static struct {
    int known; /* set (release) once least/greatest hold the daemon's answer */
    int least, greatest;
} g_priorities;

PILOT_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    PILOT_REQUIRE_SESSION();
    if (!__atomic_load_n(&g_priorities.known, __ATOMIC_ACQUIRE)) {
        pilot_rep_priority_range rep;
        cudaError_t err = pilot_call(PILOT_OP_DEVICE_PRIORITY_RANGE, NULL, 0, NULL, 0, &rep,
                                     sizeof rep, NULL, 0, NULL);
        if (err != cudaSuccess)
            PILOT_RETURN(err);
        g_priorities.least = rep.least;
        g_priorities.greatest = rep.greatest;
        __atomic_store_n(&g_priorities.known, 1, __ATOMIC_RELEASE);
    }
    if (least) /* either pointer may be NULL, as in CUDA */
        *least = g_priorities.least;
    if (greatest)
        *greatest = g_priorities.greatest;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                  unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    if (flags & ~(unsigned)cudaEventRecordExternal)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* cudaEventRecordExternal makes an event record node in a capture (graph_capture.c);
     * outside a capture CUDA 13 answers this (seen on the H100). */
    if (flags & cudaEventRecordExternal) {
        cudaError_t err = cudaSuccess;
        if (pilot_capture_record(pilot_stream_handle(stream), event, 1, &err))
            PILOT_RETURN(err);
        PILOT_RETURN(cudaErrorIllegalState);
    }
    PILOT_RETURN(pilot_event_record(event, stream));
}

/* ---- device ---- */

/* cudaGetDeviceFlags always includes cudaDeviceMapHost; of what cudaSetDeviceFlags accepts, the
 * schedule, local-memory and sync-memops bits are kept and the two unnamed bits (0x20, 0x40)
 * are dropped (all seen on the H100). */
#define DEVICE_FLAGS_KEPT (cudaDeviceScheduleMask | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops)
static unsigned g_device_flags = cudaDeviceMapHost;
static int g_cache_config = cudaFuncCachePreferNone;

PILOT_EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    unsigned schedule = flags & cudaDeviceScheduleMask;
    if ((flags & ~(unsigned)cudaDeviceMask) || (schedule & (schedule - 1)))
        PILOT_RETURN(cudaErrorInvalidValue); /* unknown bits, or two scheduling policies */
    __atomic_store_n(&g_device_flags, (flags & DEVICE_FLAGS_KEPT) | cudaDeviceMapHost,
                     __ATOMIC_RELAXED);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    *flags = __atomic_load_n(&g_device_flags, __ATOMIC_RELAXED);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    PILOT_REQUIRE_SESSION();
    pilot_req_limit req = {.limit = (uint32_t)limit, .value = value};
    pilot_rep_u64 rep;
    PILOT_RETURN(pilot_call(PILOT_OP_DEVICE_SET_LIMIT, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                            NULL, 0, NULL));
}

PILOT_EXPORT cudaError_t cudaDeviceGetLimit(size_t *value, enum cudaLimit limit)
{
    if (!value)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    pilot_req_limit req = {.limit = (uint32_t)limit};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_DEVICE_GET_LIMIT, &req, sizeof req, NULL, 0, &rep,
                                 sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        *value = rep.value;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache config)
{
    PILOT_REQUIRE_SESSION();
    if ((unsigned)config > cudaFuncCachePreferEqual)
        PILOT_RETURN(cudaErrorInvalidValue);
    __atomic_store_n(&g_cache_config, (int)config, __ATOMIC_RELAXED);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *config)
{
    if (!config)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    *config = (enum cudaFuncCache)__atomic_load_n(&g_cache_config, __ATOMIC_RELAXED);
    return cudaSuccess;
}

/* The profiler switches only matter to a profiler attached to the process; none can see the
 * daemon's work from here, so they succeed and do nothing. */
/* Shared-memory bank size: fixed on Hopper (four bytes); the setting is accepted and changes
 * nothing, as on the GPU. */
PILOT_EXPORT cudaError_t cudaDeviceGetSharedMemConfig(enum cudaSharedMemConfig *config)
{
    PILOT_REQUIRE_SESSION();
    if (!config)
        PILOT_RETURN(cudaErrorInvalidValue);
    *config = cudaSharedMemBankSizeFourByte;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceSetSharedMemConfig(enum cudaSharedMemConfig config)
{
    PILOT_REQUIRE_SESSION();
    if ((unsigned)config > cudaSharedMemBankSizeEightByte)
        PILOT_RETURN(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* Initializes a device's context early: pilotd's contexts exist already, so this validates the
 * device (and the flags: deviceFlags are applied only by cudaSetDeviceFlags). */
PILOT_EXPORT cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    (void)deviceFlags;
    PILOT_REQUIRE_SESSION();
    if (device < 0 || device >= pilot_device_count())
        PILOT_RETURN(cudaErrorInvalidDevice);
    if (flags & ~(unsigned)cudaInitDeviceFlagsAreValid)
        PILOT_RETURN(cudaErrorInvalidValue);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaProfilerStart(void)
{
    PILOT_REQUIRE_SESSION();
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaProfilerStop(void)
{
    PILOT_REQUIRE_SESSION();
    return cudaSuccess;
}

/* ---- functions ---- */

/* A host stub or a cudaKernel_t we handed out, as launches take them. CUDA 13 answers NULL with
 * cudaErrorInvalidDeviceFunction and any other pointer that is no kernel with
 * cudaErrorInvalidResourceHandle (seen on the H100 for cudaFuncGetAttributes(&a, main)). */
static cudaError_t find_kernel(const void *func, struct pilot_kernel **out)
{
    if (!func)
        return cudaErrorInvalidDeviceFunction;
    struct pilot_kernel *k = pilot_kernel_from_host(func);
    if (!k)
        k = pilot_kernel_from_handle(func);
    if (!k)
        return cudaErrorInvalidResourceHandle;
    *out = k;
    return cudaSuccess;
}

/* What the daemon reported of the kernel on the calling thread's device (its function handle,
 * parameter layout), loading its image on first use. */
static cudaError_t kernel_info(struct pilot_kernel *k, struct pilot_kernel_launch_info *info)
{
    const int dev = pilot_route_device();
    cudaError_t err = pilot_kernel_resolve(k, dev);
    if (err == cudaSuccess)
        pilot_kernel_info(k, dev, info);
    return err;
}

/* The kernel's daemon function handle. */
static cudaError_t kernel_function(struct pilot_kernel *k, uint64_t *function)
{
    struct pilot_kernel_launch_info info;
    cudaError_t err = kernel_info(k, &info);
    if (err == cudaSuccess)
        *function = info.function;
    return err;
}

static cudaError_t find_function(const void *func, struct pilot_kernel **kp, uint64_t *function)
{
    cudaError_t err = find_kernel(func, kp);
    return err != cudaSuccess ? err : kernel_function(*kp, function);
}

/* Indexes of pilot_rep_func_attrs.values: CUfunction_attribute. */
enum {
    FA_MAX_THREADS = 0, FA_SHARED = 1, FA_CONST = 2, FA_LOCAL = 3, FA_REGS = 4, FA_PTX = 5,
    FA_BINARY = 6, FA_CACHE_MODE_CA = 7, FA_MAX_DYNAMIC_SHARED = 8, FA_CARVEOUT = 9,
    FA_CLUSTER_MUST_BE_SET = 10, FA_CLUSTER_W = 11, FA_CLUSTER_H = 12, FA_CLUSTER_D = 13,
    FA_NON_PORTABLE_CLUSTER = 14, FA_CLUSTER_POLICY = 15,
};

static void fill_attributes(struct cudaFuncAttributes *a, const int32_t *v)
{
    memset(a, 0, sizeof *a);
    a->sharedSizeBytes = (size_t)(uint32_t)v[FA_SHARED];
    a->constSizeBytes = (size_t)(uint32_t)v[FA_CONST];
    a->localSizeBytes = (size_t)(uint32_t)v[FA_LOCAL];
    a->maxThreadsPerBlock = v[FA_MAX_THREADS];
    a->numRegs = v[FA_REGS];
    a->ptxVersion = v[FA_PTX];
    a->binaryVersion = v[FA_BINARY];
    a->cacheModeCA = v[FA_CACHE_MODE_CA];
    a->maxDynamicSharedSizeBytes = v[FA_MAX_DYNAMIC_SHARED];
    a->preferredShmemCarveout = v[FA_CARVEOUT];
    a->clusterDimMustBeSet = v[FA_CLUSTER_MUST_BE_SET];
    a->requiredClusterWidth = v[FA_CLUSTER_W];
    a->requiredClusterHeight = v[FA_CLUSTER_H];
    a->requiredClusterDepth = v[FA_CLUSTER_D];
    a->clusterSchedulingPolicyPreference = v[FA_CLUSTER_POLICY];
    a->nonPortableClusterSizeAllowed = v[FA_NON_PORTABLE_CLUSTER];
}

PILOT_EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    if (!attr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    struct pilot_kernel *k;
    uint64_t function;
    cudaError_t err = find_function(func, &k, &function);
    if (err != cudaSuccess)
        PILOT_RETURN(err);
    pilot_req_handle req = {.handle = function};
    pilot_rep_func_attrs rep;
    err = pilot_call(PILOT_OP_FUNC_GET_ATTRIBUTES, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                     NULL, 0, NULL);
    if (err == cudaSuccess) {
        fill_attributes(attr, rep.values);
        pilot_kernel_set_max_dynamic_shared(k, rep.values[FA_MAX_DYNAMIC_SHARED]);
    }
    PILOT_RETURN(err);
}

/* The kernel's name as its image has it (the mangled name, like the driver's cuFuncGetName);
 * answered in the shim, which registered it. */
PILOT_EXPORT cudaError_t cudaFuncGetName(const char **name, const void *func)
{
    if (!name)
        PILOT_RETURN(cudaErrorInvalidValue);
    struct pilot_kernel *k;
    cudaError_t err = find_kernel(func, &k);
    if (err == cudaSuccess)
        *name = pilot_kernel_name(k);
    PILOT_RETURN(err);
}

/* Offset and size of parameter paramIndex, from the layout the daemon reported when it loaded
 * the kernel (cuFuncGetParamInfo there); an index past the last parameter is
 * cudaErrorInvalidValue, as CUDA says. */
PILOT_EXPORT cudaError_t cudaFuncGetParamInfo(const void *func, size_t paramIndex,
                                              size_t *paramOffset, size_t *paramSize)
{
    if (!paramOffset && !paramSize)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    struct pilot_kernel *k;
    struct pilot_kernel_launch_info info;
    cudaError_t err = find_kernel(func, &k);
    if (err == cudaSuccess)
        err = kernel_info(k, &info);
    if (err != cudaSuccess)
        PILOT_RETURN(err);
    if (paramIndex >= info.nparams)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (paramOffset)
        *paramOffset = info.params[paramIndex].offset;
    if (paramSize)
        *paramSize = info.params[paramIndex].size;
    PILOT_RETURN(cudaSuccess);
}

PILOT_EXPORT cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                              int value)
{
    PILOT_REQUIRE_SESSION();
    struct pilot_kernel *k;
    uint64_t function;
    cudaError_t err = find_function(func, &k, &function);
    if (err != cudaSuccess)
        PILOT_RETURN(err);
    /* The daemon sets it on the session's own CUfunction (the driver validates the value) and
     * answers with every attribute after the change; launches then allow the new maximum of
     * dynamic shared memory. */
    if (pilot_kernel_attr_is(k, function, (int)attr, value))
        PILOT_RETURN(cudaSuccess); /* already so: the same call would change nothing */
    pilot_req_func_attr req = {.function = function, .attr = (int32_t)attr, .value = value};
    pilot_rep_func_attrs rep;
    err = pilot_call(PILOT_OP_FUNC_SET_ATTRIBUTE, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL,
                     0, NULL);
    if (err == cudaSuccess) {
        pilot_kernel_set_max_dynamic_shared(k, rep.values[FA_MAX_DYNAMIC_SHARED]);
        pilot_kernel_attr_set(k, function, (int)attr, value);
    }
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache config)
{
    PILOT_REQUIRE_SESSION();
    struct pilot_kernel *k;
    cudaError_t err = find_kernel(func, &k);
    if (err == cudaSuccess && (unsigned)config > cudaFuncCachePreferEqual)
        err = cudaErrorInvalidValue;
    PILOT_RETURN(err); /* accepted: a hint with no effect on the shared context */
}

PILOT_EXPORT cudaError_t cudaFuncSetSharedMemConfig(const void *func, enum cudaSharedMemConfig config)
{
    PILOT_REQUIRE_SESSION();
    struct pilot_kernel *k;
    cudaError_t err = find_kernel(func, &k);
    if (err == cudaSuccess && (unsigned)config > cudaSharedMemBankSizeEightByte)
        err = cudaErrorInvalidValue;
    PILOT_RETURN(err); /* accepted: Hopper has no configurable bank size */
}

/* The daemon's occupancy call for `func` (what `value` and `flags` mean: pilot_req_occupancy);
 * `valid`: the caller's own checks of its arguments, reported after the function's. */
static cudaError_t occupancy_call(const void *func, int valid, int block_size, uint64_t value,
                                  uint32_t flags, uint64_t *out)
{
    struct pilot_kernel *k;
    cudaError_t err = find_kernel(func, &k);
    if (err != cudaSuccess)
        return err;
    if (!valid)
        return cudaErrorInvalidValue;
    uint64_t function;
    if ((err = kernel_function(k, &function)) != cudaSuccess)
        return err;
    if (pilot_kernel_occupancy(k, function, block_size, value, flags, out))
        return cudaSuccess;
    pilot_req_occupancy req = {.function = function, .dynamic_smem = value,
                               .block_size = block_size, .flags = flags};
    pilot_rep_u64 rep;
    err = pilot_call(PILOT_OP_OCCUPANCY, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess) {
        *out = rep.value;
        pilot_kernel_occupancy_answer(k, function, block_size, value, flags, rep.value);
    }
    return err;
}

PILOT_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize, unsigned int flags)
{
    if (!numBlocks)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    uint64_t blocks = 0;
    int valid = blockSize > 0 && !(flags & ~(unsigned)cudaOccupancyDisableCachingOverride);
    cudaError_t err = occupancy_call(func, valid, blockSize, dynamicSMemSize, flags, &blocks);
    if (err == cudaSuccess)
        *numBlocks = (int)blocks;
    PILOT_RETURN(err);
}

/* Asked of the daemon's driver (cuOccupancyAvailableDynamicSMemPerBlock) through the occupancy
 * call, flagged PILOT_OCCUPANCY_AVAILABLE_SMEM. */
PILOT_EXPORT cudaError_t cudaOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize,
                                                                   const void *func, int numBlocks,
                                                                   int blockSize)
{
    if (!dynamicSmemSize)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    uint64_t bytes = 0;
    cudaError_t err = occupancy_call(func, numBlocks > 0 && blockSize > 0, blockSize,
                                     (uint64_t)(numBlocks > 0 ? numBlocks : 0),
                                     PILOT_OCCUPANCY_AVAILABLE_SMEM, &bytes);
    if (err == cudaSuccess)
        *dynamicSmemSize = (size_t)bytes;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks,
                                                                       const void *func,
                                                                       int blockSize,
                                                                       size_t dynamicSMemSize)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                  dynamicSMemSize,
                                                                  cudaOccupancyDefault);
}

/* ---- pitched memory ---- */

PILOT_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        PILOT_RETURN(cudaErrorInvalidValue);
    *devPtr = NULL;
    PILOT_REQUIRE_SESSION();
    if (!width || !height) { /* success with NULL and pitch 0, as natively */
        *pitch = 0;
        return cudaSuccess;
    }
    pilot_req_malloc_pitch req = {.width = width, .height = height};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_MALLOC_PITCH, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 NULL, 0, NULL);
    if (err == cudaSuccess) {
        *devPtr = (void *)(uintptr_t)rep.value;
        *pitch = rep.value2;
        pilot_alloc_add(rep.value, rep.value2 * height);
    }
    PILOT_RETURN(err);
}

/* Bytes from the first row's start to the last row's end; 0 if that overflows. */
static uint64_t span_2d(uint64_t pitch, uint64_t width, uint64_t height)
{
    uint64_t span;
    if (__builtin_mul_overflow(height - 1, pitch, &span) || __builtin_add_overflow(span, width, &span))
        return 0;
    return span;
}

static int device_rows(const void *ptr, uint64_t pitch, uint64_t width, uint64_t height)
{
    uint64_t span = span_2d(pitch, width, height);
    return span && pilot_alloc_contains((uintptr_t)ptr, span);
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static cudaError_t h2d_rows(uint8_t *dst, size_t dpitch, const uint8_t *src, size_t spitch,
                            size_t width, size_t height, uint64_t stream, int sync)
{
    cudaError_t err = pilot_callbacks_fence(stream);
    if (err)
        return err;
    if (width > PILOT_INLINE_MAX) { /* each row is a large copy of its own */
        for (size_t r = 0; r < height && err == cudaSuccess; r++)
            err = pilot_memcpy(dst + r * dpitch, src + r * spitch, width, cudaMemcpyHostToDevice,
                               stream, sync);
        return err;
    }
    const size_t per_msg = PILOT_INLINE_MAX / width;
    uint8_t *pack = spitch == width ? NULL : malloc(min_size(per_msg, height) * width);
    if (spitch != width && !pack)
        return cudaErrorMemoryAllocation;
    for (size_t r = 0, n; r < height && err == cudaSuccess; r += n) {
        n = min_size(per_msg, height - r);
        const uint8_t *payload = src + r * spitch;
        if (pack) {
            for (size_t i = 0; i < n; i++)
                memcpy(pack + i * width, src + (r + i) * spitch, width);
            payload = pack;
        }
        pilot_req_memcpy_2d req = {.dst = (uintptr_t)(dst + r * dpitch), .dpitch = dpitch,
                                   .spitch = width, .width = width, .height = n, .stream = stream,
                                   .kind = PILOT_COPY_H2D, .sync = (uint32_t)sync};
        /* Every message holds its data, so all but a synchronous copy's last are posted; the
         * last one's reply delivers any error of the others. */
        if (sync && r + n == height)
            err = pilot_call(PILOT_OP_MEMCPY_2D, &req, sizeof req, payload, n * width, NULL, 0,
                             NULL, 0, NULL);
        else
            err = pilot_post(PILOT_OP_MEMCPY_2D, &req, sizeof req, payload, n * width);
    }
    free(pack);
    return err;
}

static cudaError_t d2h_rows(uint8_t *dst, size_t dpitch, const uint8_t *src, size_t spitch,
                            size_t width, size_t height, uint64_t stream, int sync)
{
    cudaError_t err = pilot_callbacks_fence(stream);
    if (err)
        return err;
    if (width > PILOT_INLINE_MAX) {
        for (size_t r = 0; r < height && err == cudaSuccess; r++)
            err = pilot_memcpy(dst + r * dpitch, src + r * spitch, width, cudaMemcpyDeviceToHost,
                               stream, sync);
        return err;
    }
    const size_t per_msg = PILOT_INLINE_MAX / width;
    uint8_t *pack = dpitch == width ? NULL : malloc(min_size(per_msg, height) * width);
    if (dpitch != width && !pack)
        return cudaErrorMemoryAllocation;
    for (size_t r = 0, n; r < height && err == cudaSuccess; r += n) {
        n = min_size(per_msg, height - r);
        uint8_t *out = pack ? pack : dst + r * dpitch;
        pilot_req_memcpy_2d req = {.src = (uintptr_t)(src + r * spitch), .spitch = spitch,
                                   .dpitch = width, .width = width, .height = n, .stream = stream,
                                   .kind = PILOT_COPY_D2H, .sync = (uint32_t)sync};
        pilot_rep_status rep;
        size_t got = 0;
        err = pilot_call(PILOT_OP_MEMCPY_2D, &req, sizeof req, NULL, 0, &rep, sizeof rep, out,
                         n * width, &got);
        if (err == cudaSuccess && got != n * width)
            err = cudaErrorUnknown;
        if (err == cudaSuccess && pack)
            for (size_t i = 0; i < n; i++)
                memcpy(dst + (r + i) * dpitch, pack + i * width, width);
    }
    free(pack);
    return err;
}

static cudaError_t copy_2d_routed(void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t height, enum cudaMemcpyKind kind,
                                  uint64_t stream, int sync);

/* 2D copies and memsets go to the stream's device, else to the device memory's. */
cudaError_t pilot_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, enum cudaMemcpyKind kind, uint64_t stream, int sync)
{
    if (pilot_capture_any()) { /* graph_capture.c */
        cudaError_t err = cudaSuccess;
        if (sync && (err = pilot_capture_check_sync(stream, 1)))
            return err;
        if (!sync && pilot_capture_copy(stream, dst, dpitch, src, spitch, width, height, kind, &err))
            return err;
    }
    /* Managed memory is copied where it really lives, as in pilot_memcpy: host writes are
     * flushed first, and the shadow chunks the copy writes are fetched again when touched. */
    int dst_managed = pilot_um_active() && pilot_alloc_is_managed((uintptr_t)dst);
    int managed = dst_managed || (pilot_um_active() && pilot_alloc_is_managed((uintptr_t)src));
    if (managed) {
        if ((unsigned)kind > cudaMemcpyDefault)
            return cudaErrorInvalidMemcpyDirection;
        cudaError_t err = pilot_um_flush();
        if (err)
            return err;
        kind = cudaMemcpyDefault;
    }
    int previous = pilot_route_begin(pilot_memory_route(stream, dst, src));
    cudaError_t err = copy_2d_routed(dst, dpitch, src, spitch, width, height, kind, stream, sync);
    pilot_route_end(previous);
    if (dst_managed && width && height)
        err = pilot_um_device_wrote((uintptr_t)dst, (height - 1) * dpitch + width, stream, sync,
                                    err);
    return err;
}

static cudaError_t copy_2d_routed(void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t height, enum cudaMemcpyKind kind,
                                  uint64_t stream, int sync)
{
    if (!width || !height)
        return cudaSuccess;
    if (kind == cudaMemcpyDefault) {
        int d = pilot_alloc_is_device((uintptr_t)dst), s = pilot_alloc_is_device((uintptr_t)src);
        kind = s ? (d ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                 : (d ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    }
    if ((unsigned)kind > cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidMemcpyDirection;
    /* A row wider than its pitch: cudaErrorInvalidPitchValue, or cudaErrorInvalidValue for a
     * single row (both seen on the H100). */
    if (width > dpitch || width > spitch)
        return height > 1 ? cudaErrorInvalidPitchValue : cudaErrorInvalidValue;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    uint8_t *d = dst;
    const uint8_t *s = src;
    switch (kind) {
    case cudaMemcpyHostToHost:
        for (size_t r = 0; r < height; r++)
            memmove(d + r * dpitch, s + r * spitch, width);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        if (!device_rows(dst, dpitch, width, height))
            return cudaErrorInvalidValue;
        return h2d_rows(d, dpitch, s, spitch, width, height, stream, sync);
    case cudaMemcpyDeviceToHost:
        if (!device_rows(src, spitch, width, height))
            return cudaErrorInvalidValue;
        return d2h_rows(d, dpitch, s, spitch, width, height, stream, sync);
    default: {
        if (!device_rows(dst, dpitch, width, height) || !device_rows(src, spitch, width, height))
            return cudaErrorInvalidValue;
        pilot_req_memcpy_2d req = {.dst = (uintptr_t)dst, .dpitch = dpitch, .src = (uintptr_t)src,
                                   .spitch = spitch, .width = width, .height = height,
                                   .stream = stream, .kind = PILOT_COPY_D2D,
                                   .sync = (uint32_t)sync};
        if (!sync)
            return pilot_post(PILOT_OP_MEMCPY_2D, &req, sizeof req, NULL, 0);
        return pilot_call(PILOT_OP_MEMCPY_2D, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    }
    }
}

PILOT_EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t height, enum cudaMemcpyKind kind)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_copy_2d(dst, dpitch, src, spitch, width, height, kind, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
                                           size_t spitch, size_t width, size_t height,
                                           enum cudaMemcpyKind kind, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_copy_2d(dst, dpitch, src, spitch, width, height, kind,
                               pilot_stream_handle(stream), 0));
}

cudaError_t pilot_set_2d(void *ptr, size_t pitch, int value, size_t width, size_t height,
                         uint64_t stream, int sync)
{
    if (!width || !height)
        return cudaSuccess;
    if (height > 1 && width > pitch)
        return cudaErrorInvalidValue; /* as seen on the H100; one row ignores its pitch */
    if (pilot_capture_any()) { /* graph_capture.c */
        cudaError_t err = cudaSuccess;
        if (sync && (err = pilot_capture_check_sync(stream, 1)))
            return err;
        if (!sync && pilot_capture_memset(stream, ptr, pitch, value, width, height, &err))
            return err;
    }
    if (height == 1)
        pitch = width;
    if (!device_rows(ptr, pitch, width, height))
        return cudaErrorInvalidValue;
    int managed = pilot_um_active() && pilot_alloc_is_managed((uintptr_t)ptr);
    cudaError_t err = managed ? pilot_um_flush() : cudaSuccess; /* partly written chunks */
    if (err)
        return err;
    pilot_req_memset_2d req = {.ptr = (uintptr_t)ptr, .pitch = pitch, .width = width,
                               .height = height, .stream = stream, .value = value,
                               .sync = (uint32_t)sync};
    int dev = pilot_memory_route(stream, ptr, NULL);
    if (!sync)
        err = pilot_post_on(dev, PILOT_OP_MEMSET_2D, &req, sizeof req, NULL, 0);
    else
        err = pilot_call_on(dev, PILOT_OP_MEMSET_2D, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0,
                            NULL);
    if (managed)
        err = pilot_um_device_wrote((uintptr_t)ptr, (height - 1) * pitch + width, stream, sync, err);
    return err;
}

PILOT_EXPORT cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width,
                                      size_t height)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_set_2d(devPtr, pitch, value, width, height, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
                                           size_t height, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_set_2d(devPtr, pitch, value, width, height, pilot_stream_handle(stream), 0));
}
