/* libpilot.so's side of the private interface to the driver API library (driver_ops.h): the
 * one table libpilot-cuda.so reaches the process's session through. Exported as
 * pilot_driver_ops@PILOT_PRIVATE_1 (shim/build.py's version script), nothing else. */
#include <stddef.h>

#include "driver_ops.h"
#include "log.h"
#include "shim.h"

static cudaError_t launch(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                          const void *packed, size_t packed_size, size_t shared,
                          cudaStream_t stream)
{
    return pilot_launch_packed(kernel, grid, block, args, packed, packed_size, shared, stream, NULL);
}

/* The allocation holding ptr; a small managed allocation is its own piece of a packed range
 * (um_pack.c), as the driver answers for its packed ones. */
static int alloc_range(uint64_t ptr, uint64_t *base, uint64_t *size)
{
    uint64_t b = 0, n = 0;
    int flags = pilot_alloc_flags(ptr, &b, &n);
    if (flags >= 0 && (flags & PILOT_ALLOC_PACKED) && pilot_um_pack_piece(ptr, b, &b, &n) != 0)
        return -1;
    if (flags >= 0 && base)
        *base = b;
    if (flags >= 0 && size)
        *size = n;
    return flags;
}

static cudaError_t memset_wide(uint64_t ptr, uint32_t value, uint32_t elem_size, uint64_t count,
                               cudaStream_t stream, int sync)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memset_elems((void *)(uintptr_t)ptr, value, elem_size, count,
                                    pilot_stream_handle(stream), sync));
}

/* Every posted library request keeps its stream handle here (after the library handle). */
#define LIBRARY_STREAM_OFFSET 8
_Static_assert(offsetof(pilot_req_blas_gemm, stream) == LIBRARY_STREAM_OFFSET, "stream offset");
_Static_assert(offsetof(pilot_req_blaslt_matmul, stream) == LIBRARY_STREAM_OFFSET, "stream offset");
_Static_assert(offsetof(pilot_req_blas_call, stream) == LIBRARY_STREAM_OFFSET, "stream offset");
_Static_assert(offsetof(pilot_req_dnn_execute, stream) == LIBRARY_STREAM_OFFSET, "stream offset");
_Static_assert(offsetof(pilot_req_dnn_bn, stream) == LIBRARY_STREAM_OFFSET, "stream offset");

/* Library work is issued like a launch (api_launch.c): a capturing stream refuses it (pilot
 * cannot record a library's kernels into a graph), and managed memory is flushed first and
 * fetched again afterwards, since the library's kernels may read or write any of it. The
 * thread's cudaGetLastError is left as it was: the library reports its own status. */
static cudaError_t library_call(int device, uint64_t stream, const char *what, uint16_t op,
                                const void *req, size_t req_len, const void *payload,
                                size_t payload_len, void *rep, size_t rep_len, void *out,
                                size_t out_cap, size_t *out_len)
{
    cudaError_t err = pilot_ensure_session();
    if (err)
        return err;
    if (pilot_capture_any()) {
        /* On a capturing stream a posted call becomes a graph node that re-posts it; one the
         * host waits for (a result to the host) cannot be captured, as natively. */
        if (rep ? pilot_capture_refuse(stream, what, &err)
                : pilot_capture_library(stream, op, device, LIBRARY_STREAM_OFFSET, req, req_len,
                                        payload, payload_len, &err))
            return err;
    }
    if ((err = pilot_ensure_device(device)) || (err = pilot_um_before_launch()))
        return err;
    if (!rep)
        return pilot_post_on(device, op, req, req_len, payload, payload_len);
    return pilot_call_on(device, op, req, req_len, payload, payload_len, rep, rep_len, out,
                         out_cap, out_len);
}

static cudaError_t call_on(int device, uint16_t op, const void *req, size_t req_len,
                           const void *payload, size_t payload_len, void *rep, size_t rep_len,
                           void *out, size_t out_cap, size_t *out_len)
{
    cudaError_t err = pilot_ensure_session();
    if (err || (err = pilot_ensure_device(device)))
        return err;
    return pilot_call_on(device, op, req, req_len, payload, payload_len, rep, rep_len, out,
                         out_cap, out_len);
}

static void log_line(int level, const char *msg)
{
    PILOT_LOG(level, "%s", msg);
}

#define PILOT_DRIVER_OPS_ENTRY(name) .name = name,
PILOT_EXPORT const struct pilot_driver_ops pilot_driver_ops = {
    .version = PILOT_DRIVER_OPS_VERSION,
    PILOT_DRIVER_RUNTIME_CALLS(PILOT_DRIVER_OPS_ENTRY)
    .ensure_session = pilot_ensure_session,
    .driver_begin = pilot_driver_begin,
    .driver_end = pilot_driver_end,
    .runtime_bound = pilot_runtime_bound,
    .log_unsupported = pilot_log_unsupported_driver,
    .module_load_image = pilot_module_load_image,
    .module_valid = pilot_module_valid,
    .module_unload = pilot_module_unload,
    .module_function = pilot_module_function,
    .module_global = pilot_module_global,
    .kernel_from_handle = pilot_kernel_from_handle,
    .kernel_image = pilot_kernel_image,
    .launch = launch,
    .alloc_range = alloc_range,
    .memset_wide = memset_wide,
    .stream_handle = pilot_stream_handle,
    .handle_device = pilot_handle_device,
    .library_call = library_call,
    .call_on = call_on,
    .log = log_line,
    .occupancy = cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    .available_smem = cudaOccupancyAvailableDynamicSMemPerBlock,
};
