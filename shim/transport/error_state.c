/* CUDA's error state, kept in the shim: a per-thread last error and a per-process sticky error.
 * Errors from asynchronous calls reach the shim with the next synchronizing reply (see
 * pilot_reply_hdr.deferred); those that corrupt a CUDA context natively are sticky here too. */
#include "log.h"
#include "shim.h"

static __thread cudaError_t t_last_error = cudaSuccess;
static cudaError_t g_sticky = cudaSuccess;

int pilot_error_is_sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorMpsClientTerminated: /* pilotd's MPS ended its process ([isolation] mps) */
    case cudaErrorDevicesUnavailable: /* pilot: the daemon went away mid-session */
        return 1;
    default:
        return 0;
    }
}

cudaError_t pilot_set_error(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady)
        t_last_error = err;
    if (pilot_error_is_sticky(err))
        __atomic_store_n(&g_sticky, err, __ATOMIC_RELEASE);
    return err;
}

cudaError_t pilot_last_error_swap(cudaError_t err)
{
    cudaError_t old = t_last_error;
    t_last_error = err;
    return old;
}

/* The driver API library's calls into the runtime (driver_ops.h): they leave the thread's last
 * error as it was, and do not count as the thread's use of the runtime, which (as the runtime's
 * primary context) makes the thread's current device its current driver context. */
static __thread int t_in_driver __attribute__((tls_model("initial-exec")));
static __thread int t_runtime_bound __attribute__((tls_model("initial-exec")));
static int g_runtime_used;

void pilot_runtime_call(void)
{
    if (!t_runtime_bound && !t_in_driver) {
        t_runtime_bound = 1;
        __atomic_store_n(&g_runtime_used, 1, __ATOMIC_RELEASE);
    }
}

int pilot_runtime_bound(void)
{
    return (t_runtime_bound ? 1 : 0) | (__atomic_load_n(&g_runtime_used, __ATOMIC_ACQUIRE) ? 2 : 0);
}

cudaError_t pilot_driver_begin(void)
{
    t_in_driver++;
    cudaError_t saved = t_last_error;
    t_last_error = cudaSuccess;
    return saved;
}

void pilot_driver_end(cudaError_t saved)
{
    t_in_driver--;
    t_last_error = saved;
}

cudaError_t pilot_sticky_error(void)
{
    return __atomic_load_n(&g_sticky, __ATOMIC_ACQUIRE);
}

void pilot_note_async_error(cudaError_t err)
{
    LOG_DEBUG("asynchronous error delivered: %d", (int)err);
    pilot_set_error(err);
}

PILOT_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t sticky = pilot_sticky_error();
    if (sticky != cudaSuccess)
        return sticky;
    cudaError_t err = t_last_error;
    t_last_error = cudaSuccess;
    return err;
}

PILOT_EXPORT cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t sticky = pilot_sticky_error();
    return sticky != cudaSuccess ? sticky : t_last_error;
}

PILOT_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    const char *name = pilot_error_name((int)error);
    return name ? name : "unrecognized error code";
}

PILOT_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    const char *str = pilot_error_string((int)error);
    return str ? str : "unrecognized error code";
}
