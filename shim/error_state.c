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
