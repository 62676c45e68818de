/* Internal interface of libpilot-cuda.so (shim/driver/drv_*.c), the driver API library: it stands in
 * for libcuda.so.1 and serves every call through libpilot.so's session (driver_ops.h). Nothing
 * here is exported (-fvisibility=hidden); the entry points are the CUresult functions of
 * drv_*.c and the generated stubs (drv_gen.c), exactly shim/tables/cuda_driver_exports.tsv. */
#ifndef PILOT_DRV_H
#define PILOT_DRV_H

#include <cuda.h>

#include "driver_ops.h"
#include "pilot_proto.h"

#define PILOT_DRV_EXPORT __attribute__((visibility("default")))

#include "drv_tables.h"

/* ---- drv_core.c ---- */
/* The runtime shim's table (NULL until the first call found it). */
extern const struct pilot_driver_ops *pilot_drv_ops;
/* Every entry point starts here: finds libpilot.so's table, fails with
 * CUDA_ERROR_NOT_INITIALIZED before cuInit (unless the runtime has initialized the process),
 * and with need_context, CUDA_ERROR_INVALID_CONTEXT without a current context. */
CUresult pilot_drv_enter(int need_context);
/* The device of the calling thread's current context (after pilot_drv_enter(1)). */
int pilot_drv_device(void);
CUcontext pilot_drv_context_of(int device);
/* A runtime error as the driver reports it. */
CUresult pilot_drv_result(cudaError_t err);
/* A runtime call that leaves the thread's runtime last error (cudaGetLastError) as it was. */
#define PILOT_DRV_RT(call)                                                                  \
    ({                                                                                       \
        cudaError_t saved_ = pilot_drv_ops->driver_begin();                                 \
        cudaError_t e_ = (call);                                                             \
        pilot_drv_ops->driver_end(saved_);                                                   \
        pilot_drv_result(e_);                                                                \
    })
#define PILOT_DRV_ENTER(need_context)                                                      \
    do {                                                                                     \
        CUresult r_ = pilot_drv_enter(need_context);                                         \
        if (r_ != CUDA_SUCCESS)                                                              \
            return r_;                                                                       \
    } while (0)
void pilot_drv_log_unsupported(const char *name);
/* What a JIT (a module load, cuLinkComplete) that returned r reports through its options: `log`
 * (len bytes, not NUL-terminated) in the info log buffer when it worked, in the error log buffer
 * when it failed, the other one empty; the OUT sizes the bytes written with the NUL (0 for an
 * empty log); the wall time 0 (the daemon's driver compiled). Other options are left alone. */
void pilot_drv_jit_report(unsigned int n, const CUjit_option *options, void **values, CUresult r,
                          const char *log, size_t len);

/* ---- drv_export.c ---- */
/* drv_core.c calls fn(ctx) when the primary context ctx is reset (drv_export.c registers). */
void pilot_drv_on_context_reset(void (*fn)(CUcontext ctx));

#endif
