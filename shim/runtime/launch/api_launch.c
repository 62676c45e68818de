/* Kernel launches: the <<<>>> machinery (push/pop of the call configuration, __cudaGetKernel,
 * __cudaLaunchKernel) and cudaLaunchKernel. Arguments are packed into one buffer with the
 * parameter offsets and sizes the daemon reported for the kernel (cuFuncGetParamInfo), so
 * structs, chars and doubles arrive byte for byte. A launch is posted without waiting: errors
 * the shim can see (launch configuration) return at once, as in CUDA; the rest surface at the
 * next synchronizing call. A kernel runs on the device of its stream: the calling thread's
 * current device for the default streams, the stream's own device otherwise (as CUDA does when
 * the current device is another: seen on two H200s). Launches with attributes: api_launch_ex.c. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"

#define CONFIG_STACK 16

struct call_config {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};

static __thread struct call_config t_configs[CONFIG_STACK];
static __thread int t_depth;

PILOT_EXPORT unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                                  struct CUstream_st *stream)
{
    if (t_depth >= CONFIG_STACK)
        return 1;
    t_configs[t_depth++] = (struct call_config){grid, block, shared, (cudaStream_t)stream};
    return 0;
}

PILOT_EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                    void *stream)
{
    if (t_depth <= 0)
        return cudaErrorMissingConfiguration;
    const struct call_config *c = &t_configs[--t_depth];
    *grid = c->grid;
    *block = c->block;
    *shared = c->shared;
    *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* A device attribute from the daemon's answer (info may be NULL), else the fallback. */
static int attr(const pilot_rep_device_info *info, int index, int fallback)
{
    int v = info ? info->attrs[index] : 0;
    return v > 0 ? v : fallback;
}

/* The checks CUDA makes before a launch reaches the device (info: the launch device's). CUDA
 * 13's runtime reports a launch shape no kernel could run as cudaErrorInvalidValue (seen
 * natively on the H100), not cudaErrorInvalidConfiguration as older runtimes did. */
static cudaError_t check_config(dim3 grid, dim3 block, const struct pilot_kernel_launch_info *k,
                                const pilot_rep_device_info *info)
{
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        return cudaErrorInvalidValue;
    if (grid.x > (unsigned)attr(info, cudaDevAttrMaxGridDimX, 0x7fffffff) ||
        grid.y > (unsigned)attr(info, cudaDevAttrMaxGridDimY, 65535) ||
        grid.z > (unsigned)attr(info, cudaDevAttrMaxGridDimZ, 65535))
        return cudaErrorInvalidValue;
    if (block.x > (unsigned)attr(info, cudaDevAttrMaxBlockDimX, 1024) ||
        block.y > (unsigned)attr(info, cudaDevAttrMaxBlockDimY, 1024) ||
        block.z > (unsigned)attr(info, cudaDevAttrMaxBlockDimZ, 64))
        return cudaErrorInvalidValue;
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads > (uint64_t)attr(info, cudaDevAttrMaxThreadsPerBlock, 1024))
        return cudaErrorInvalidValue;
    if (k->max_threads_per_block > 0 && threads > (uint64_t)k->max_threads_per_block)
        return cudaErrorInvalidValue; /* past __launch_bounds__: also InvalidValue natively */
    return cudaSuccess;
}

cudaError_t pilot_launch(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                         size_t shared, cudaStream_t stream, const struct pilot_launch_ex *ex)
{
    return pilot_launch_packed(kernel, grid, block, args, NULL, 0, shared, stream, ex);
}

cudaError_t pilot_launch_packed(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                                const void *packed, size_t packed_size, size_t shared,
                                cudaStream_t stream, const struct pilot_launch_ex *ex)
{
    PILOT_REQUIRE_SESSION();
    if (!kernel)
        PILOT_RETURN(cudaErrorInvalidDeviceFunction);
    /* The launch device, looked up once and passed down: every lookup reads thread-local
     * variables, each a call to __tls_get_addr in a shared library, and this is the hottest
     * path of the shim (the sum of them had made an async launch measurably slower). */
    uint64_t stream_handle = pilot_stream_handle(stream);
    const int dev = stream_handle ? pilot_handle_device(stream_handle) : pilot_current_device();
    cudaError_t err = pilot_kernel_resolve(kernel, dev);
    if (err)
        PILOT_RETURN(err);
    struct pilot_kernel_launch_info k;
    pilot_kernel_info(kernel, dev, &k);
    if ((err = check_config(grid, block, &k, pilot_device_info_of(dev))))
        PILOT_RETURN(err);
    /* Past the kernel's dynamic shared memory limit (48 KiB less its static shared memory until
     * cudaFuncSetAttribute raises it): cudaErrorInvalidValue at the launch, as on the H100. */
    if (k.max_dynamic_shared_bytes >= 0 && shared > (size_t)k.max_dynamic_shared_bytes)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (shared > UINT32_MAX)
        PILOT_RETURN(cudaErrorInvalidValue);

    unsigned char stack_buf[4096];
    unsigned char *buf = k.arg_bytes <= sizeof stack_buf ? stack_buf : malloc(k.arg_bytes);
    if (!buf)
        PILOT_RETURN(cudaErrorMemoryAllocation);
    /* The arguments: one pointer per parameter, or (cuLaunchKernel's `extra`) a buffer packed
     * by the program, which must hold the kernel's whole parameter layout. */
    if (packed ? packed_size < k.arg_bytes : (k.nparams && !args)) {
        if (buf != stack_buf)
            free(buf);
        PILOT_RETURN(cudaErrorInvalidValue);
    }
    /* A packed buffer larger than the kernel's parameters: the H100 (driver 580) refuses it with
     * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (a struct padded to 32 bytes for 28 of parameters). */
    if (packed && packed_size > k.arg_bytes) {
        if (buf != stack_buf)
            free(buf);
        PILOT_RETURN(cudaErrorLaunchOutOfResources);
    }
    memset(buf, 0, k.arg_bytes);
    if (packed)
        memcpy(buf, packed, k.arg_bytes);
    for (uint32_t i = 0; !packed && i < k.nparams; i++)
        memcpy(buf + k.params[i].offset, args[i], k.params[i].size);

    pilot_req_launch req = {
        .function = k.function,
        .stream = stream_handle,
        .grid = {grid.x, grid.y, grid.z},
        .block = {block.x, block.y, block.z},
        .shared_bytes = (uint32_t)shared,
        .arg_bytes = k.arg_bytes,
    };
    /* On a capturing stream the launch becomes a node of the capture's graph (graph_capture.c);
     * pilot cannot record cooperative or cluster launches. */
    if (pilot_capture_any()) {
        int taken = ex && (ex->cooperative || ex->cluster[0])
                        ? pilot_capture_refuse(stream_handle, "a cooperative or cluster launch", &err)
                        : pilot_capture_launch(stream_handle, kernel, grid, block, (unsigned)shared,
                                               &k, buf, &err);
        if (taken) {
            if (buf != stack_buf)
                free(buf);
            PILOT_RETURN(err);
        }
    }
    /* Host writes to managed memory reach the device first; afterwards the kernel may have
     * written any of it, so the host fetches again (coherence.c). */
    err = pilot_um_before_launch();
    if (err == cudaSuccess && !ex) {
        err = pilot_post_on(dev, PILOT_OP_LAUNCH, &req, sizeof req, buf, k.arg_bytes);
    } else if (err == cudaSuccess) {
        pilot_req_launch_ex rex = {.launch = req, .cooperative = ex->cooperative,
                                   .priority = ex->priority, .has_priority = ex->has_priority,
                                   .cluster = {ex->cluster[0], ex->cluster[1], ex->cluster[2]},
                                   .cluster_policy = ex->cluster_policy};
        /* Cooperative and cluster launches can fail in the device's own checks: wait for them. */
        if (ex->cooperative || ex->cluster[0])
            err = pilot_call_on(dev, PILOT_OP_LAUNCH_EX, &rex, sizeof rex, buf, k.arg_bytes, NULL,
                                0, NULL, 0, NULL);
        else
            err = pilot_post_on(dev, PILOT_OP_LAUNCH_EX, &rex, sizeof rex, buf, k.arg_bytes);
    }
    if (buf != stack_buf)
        free(buf);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                            size_t shared, cudaStream_t stream)
{
    return pilot_launch((struct pilot_kernel *)kernel, grid, block, args, shared, stream, NULL);
}

PILOT_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block,
                                                 void **args, size_t shared, cudaStream_t stream)
{
    /* -default-stream per-thread: stream 0 is the thread's own default stream. */
    return pilot_launch((struct pilot_kernel *)kernel, grid, block, args, shared,
                        stream ? stream : cudaStreamPerThread, NULL);
}

PILOT_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                          size_t shared, cudaStream_t stream)
{
    /* func is a host stub (the usual case) or a cudaKernel_t this shim handed out. */
    struct pilot_kernel *k = pilot_kernel_from_host(func);
    if (!k)
        k = pilot_kernel_from_handle(func);
    return pilot_launch(k, grid, block, args, shared, stream, NULL);
}

PILOT_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block,
                                               void **args, size_t shared, cudaStream_t stream)
{
    return cudaLaunchKernel(func, grid, block, args, shared, stream ? stream : cudaStreamPerThread);
}
