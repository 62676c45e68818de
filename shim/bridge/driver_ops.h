/* The private interface between libpilot.so (the runtime shim, which owns the process's one
 * session with pilotd) and libpilot-cuda.so (the driver API, standing in for libcuda.so.1).
 *
 * libpilot.so exports one symbol beyond libcudart's, `pilot_driver_ops`, under the version node
 * PILOT_PRIVATE_1 (shim/build.py; hack/check_api_table.py allows exactly it): a table of the
 * runtime entry points and shim internals the driver library builds on. The driver library
 * finds it in the process (or loads the libpilot.so beside itself) on its first call, so both
 * libraries serve one session, one allocation mirror, one set of streams and events: a CUstream
 * is a cudaStream_t, a CUevent a cudaEvent_t, a CUdeviceptr a device pointer of either API.
 * Fields are only ever appended; `version` counts them. */
#ifndef PILOT_DRIVER_OPS_H
#define PILOT_DRIVER_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#define PILOT_DRIVER_OPS_VERSION 5
#define PILOT_DRIVER_OPS_SYMBOL "pilot_driver_ops"
#define PILOT_DRIVER_OPS_NODE "PILOT_PRIVATE_1"

/* Runtime entry points (CUDA 13's ABI) the driver functions are made of. */
#define PILOT_DRIVER_RUNTIME_CALLS(X)                                                         \
    X(cudaGetDeviceCount) X(cudaGetDevice) X(cudaSetDevice) X(cudaDeviceGetAttribute)           \
    X(cudaGetDeviceProperties) X(cudaDriverGetVersion) X(cudaDeviceSynchronize)                \
    X(cudaDeviceReset) X(cudaMalloc) X(cudaFree) X(cudaMallocPitch) X(cudaMallocManaged)        \
    X(cudaMallocHost) X(cudaFreeHost) X(cudaHostAlloc) X(cudaHostGetDevicePointer)              \
    X(cudaMemGetInfo) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemset) X(cudaMemsetAsync)         \
    X(cudaStreamCreateWithPriority) X(cudaStreamDestroy) X(cudaStreamSynchronize)               \
    X(cudaStreamQuery) X(cudaStreamWaitEvent) X(cudaStreamGetFlags) X(cudaStreamGetPriority)    \
    X(cudaEventCreateWithFlags) X(cudaEventRecord) X(cudaEventSynchronize) X(cudaEventQuery)    \
    X(cudaEventElapsedTime) X(cudaEventDestroy) X(cudaPointerGetAttributes)                     \
    X(cudaFuncGetAttributes) X(cudaFuncSetAttribute) X(cudaGetErrorString)                      \
    X(cudaDeviceGetStreamPriorityRange) X(cudaMemcpy2D) X(cudaMemcpy2DAsync)                   \
    X(cudaIpcGetMemHandle) X(cudaIpcOpenMemHandle) X(cudaIpcCloseMemHandle)                     \
    X(cudaIpcGetEventHandle) X(cudaIpcOpenEventHandle) X(cudaHostRegister) X(cudaHostUnregister)  \
    X(cudaLaunchHostFunc) X(cudaStreamAddCallback)

struct pilot_image;
struct pilot_kernel;

struct pilot_driver_ops {
    unsigned version;
#define PILOT_DRIVER_OPS_FIELD(name) __typeof__(&name) name;
    PILOT_DRIVER_RUNTIME_CALLS(PILOT_DRIVER_OPS_FIELD)
#undef PILOT_DRIVER_OPS_FIELD
    /* The session (opened on first use). */
    cudaError_t (*ensure_session)(void);
    /* Around each runtime call the driver library makes: cudaGetLastError stays as it was, and
     * the call is not the thread's use of the runtime. runtime_bound: 1 if this thread used the
     * runtime (its primary context is then current), 2 if any thread did (cuInit was implied). */
    cudaError_t (*driver_begin)(void);
    void (*driver_end)(cudaError_t saved);
    int (*runtime_bound)(void);
    void (*log_unsupported)(const char *name);
    /* Modules and functions (registry.c). */
    cudaError_t (*module_load_image)(const void *data, size_t size, int dev, struct pilot_image **out);
    int (*module_valid)(const struct pilot_image *img);
    cudaError_t (*module_unload)(struct pilot_image *img);
    cudaError_t (*module_function)(struct pilot_image *img, const char *name, int dev,
                                   struct pilot_kernel **out);
    cudaError_t (*module_global)(struct pilot_image *img, const char *name, int dev,
                                 uint64_t *ptr, uint64_t *size);
    struct pilot_kernel *(*kernel_from_handle)(const void *handle);
    struct pilot_image *(*kernel_image)(const struct pilot_kernel *k);
    /* A launch (api_launch.c): args per parameter, or packed/packed_size (the `extra` form). */
    cudaError_t (*launch)(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                          const void *packed, size_t packed_size, size_t shared,
                          cudaStream_t stream);
    /* The allocation holding ptr: its flags (PILOT_ALLOC_*), base and size; -1 if none. */
    int (*alloc_range)(uint64_t ptr, uint64_t *base, uint64_t *size);
    /* cudaMemsetD16/D32 (MEMSET_WIDE), checked against the allocation mirror. */
    cudaError_t (*memset_wide)(uint64_t ptr, uint32_t value, uint32_t elem_size, uint64_t count,
                               cudaStream_t stream, int sync);
    /* Version 2: the CUDA library stand-ins (libpilot-cublas.so, libpilot-cublasLt.so). */
    /* The daemon handle of a program's stream and the device it is on (the current one for the
     * legacy stream): api_stream.c's pilot_stream_handle and pilot_handle_device. */
    uint64_t (*stream_handle)(cudaStream_t stream);
    int (*handle_device)(uint64_t handle);
    /* Issue library work on `stream` (a daemon handle) of `device`'s part, as a launch is
     * issued: on a capturing stream a posted call (rep NULL) becomes a graph node and one the
     * host waits for is refused (cudaErrorNotSupported, `what` logged); unified memory is
     * flushed and invalidated first; then posted (rep NULL) or called (pilot_call_on). */
    cudaError_t (*library_call)(int device, uint64_t stream, const char *what, uint16_t op,
                                const void *req, size_t req_len, const void *payload,
                                size_t payload_len, void *rep, size_t rep_len, void *out,
                                size_t out_cap, size_t *out_len);
    /* A call to `device`'s part that issues no device work (create, destroy, queries). */
    cudaError_t (*call_on)(int device, uint16_t op, const void *req, size_t req_len,
                           const void *payload, size_t payload_len, void *rep, size_t rep_len,
                           void *out, size_t out_cap, size_t *out_len);
    /* Logging through the shim's log (level: 0 debug .. 3 error). */
    void (*log)(int level, const char *msg);
    /* Version 3: occupancy of a kernel (api_misc.c), for cuOccupancy*. */
    __typeof__(&cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) occupancy;
    /* Version 4: the dynamic shared memory that lets n blocks share an SM (api_misc.c). */
    __typeof__(&cudaOccupancyAvailableDynamicSMemPerBlock) available_smem;
};

#endif
