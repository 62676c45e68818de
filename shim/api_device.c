/* Device management and versions. Device facts come from the DEVICE_INFO reply cached at
 * connect time, so attribute and property queries cost no round trip. A session runs on one GPU,
 * which the program sees as device 0 (several GPUs per client: issue 3). */
#include <string.h>

#include "shim.h"

static __thread int t_device;

PILOT_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        PILOT_RETURN(cudaErrorInvalidValue);
    *count = 0;
    PILOT_REQUIRE_SESSION();
    *count = 1;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaSetDevice(int device)
{
    PILOT_REQUIRE_SESSION();
    if (device != 0)
        PILOT_RETURN(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    *device = t_device;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (device != 0)
        PILOT_RETURN(cudaErrorInvalidDevice);
    pilot_fill_device_prop(prop, pilot_device_info());
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (device != 0)
        PILOT_RETURN(cudaErrorInvalidDevice);
    if ((int)attr <= 0 || (int)attr >= PILOT_ATTR_COUNT)
        PILOT_RETURN(cudaErrorInvalidValue);
    *value = pilot_device_info()->attrs[attr];
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_call(PILOT_OP_DEVICE_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL));
}

PILOT_EXPORT cudaError_t cudaDeviceReset(void)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err =
        pilot_call(PILOT_OP_DEVICE_RESET, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL);
    if (err == cudaSuccess) {
        pilot_alloc_clear();
        pilot_um_remove_allocations();
    }
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* CUDA reports 0 (and success) when no driver is there; pilot does when no daemon is. */
    *version = pilot_ensure_session() == cudaSuccess ? pilot_device_info()->driver_version : 0;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        PILOT_RETURN(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}
