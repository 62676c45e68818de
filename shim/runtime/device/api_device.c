/* Device management and versions. Device facts come from DEVICE_INFO replies cached once per
 * device, so attribute and property queries cost no round trip after the first. The program
 * sees the GPUs its CUDA_VISIBLE_DEVICES selects (sent in HELLO, resolved by pilotd), or every
 * GPU the daemon offers, numbered from the one its session started on (see
 * daemon/sessions/devices.py); as in CUDA, each host thread has its own current device. */
#include <stdio.h>
#include <string.h>

#include "hooks.h"
#include "shim.h"

PILOT_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        PILOT_RETURN(cudaErrorInvalidValue);
    *count = 0;
    PILOT_REQUIRE_SESSION();
    *count = pilot_device_count();
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaSetDevice(int device)
{
    PILOT_REQUIRE_SESSION();
    if (device < 0 || device >= pilot_device_count())
        PILOT_RETURN(cudaErrorInvalidDevice);
    /* CUDA 12+ initializes the device's context here; pilot joins the session's part on it, so
     * a device that cannot be served fails here, as natively. */
    cudaError_t err = pilot_ensure_device(device);
    if (err == cudaSuccess)
        pilot_set_current_device(device);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    *device = pilot_current_device();
    return cudaSuccess;
}

/* Device `device`'s information, or the error CUDA gives for the ordinal. */
static cudaError_t info_of(int device, const pilot_rep_device_info **out)
{
    if (device < 0 || device >= pilot_device_count())
        return cudaErrorInvalidDevice;
    *out = pilot_device_info_of(device);
    return *out ? cudaSuccess : cudaErrorDevicesUnavailable;
}

/* The session's device `device`, as a query of it needs it: the sticky or connection error,
 * else info_of's answer. */
static cudaError_t session_info_of(int device, const pilot_rep_device_info **out)
{
    cudaError_t err = pilot_sticky_error();
    if (err == cudaSuccess)
        err = pilot_ensure_session();
    return err ? err : info_of(device, out);
}

PILOT_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        PILOT_RETURN(cudaErrorInvalidValue);
    const pilot_rep_device_info *info;
    cudaError_t err = session_info_of(device, &info);
    if (err)
        PILOT_RETURN(err);
    pilot_fill_device_prop(prop, info);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        PILOT_RETURN(cudaErrorInvalidValue);
    const pilot_rep_device_info *info;
    cudaError_t err = session_info_of(device, &info);
    if (err)
        PILOT_RETURN(err);
    if ((int)attr <= 0 || (int)attr >= PILOT_ATTR_COUNT)
        PILOT_RETURN(cudaErrorInvalidValue);
    *value = info->attrs[attr];
    return cudaSuccess;
}

/* "dddd:bb:dd.f" as cuDeviceGetPCIBusId writes it: a 4-digit domain, upper-case hex (NCCL
 * lower-cases it itself), 12 characters and the NUL; cut to `len` with the NUL kept. */
PILOT_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    if (!pciBusId || len <= 0)
        PILOT_RETURN(cudaErrorInvalidValue);
    const pilot_rep_device_info *info;
    cudaError_t err = session_info_of(device, &info);
    if (err)
        PILOT_RETURN(err);
    char id[32];
    snprintf(id, sizeof id, "%04X:%02X:%02X.0", (unsigned)info->attrs[cudaDevAttrPciDomainId] & 0xFFFFu,
             (unsigned)info->attrs[cudaDevAttrPciBusId] & 0xFFu,
             (unsigned)info->attrs[cudaDevAttrPciDeviceId] & 0xFFu);
    size_t n = strlen(id) < (size_t)len - 1 ? strlen(id) : (size_t)len - 1;
    memcpy(pciBusId, id, n);
    pciBusId[n] = 0;
    return cudaSuccess;
}

/* The program ordinal of the device at "[domain:]bus:device[.function]" (hex, any case), among
 * the devices the program sees. */
PILOT_EXPORT cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
    if (!device || !pciBusId)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    unsigned domain = 0, bus = 0, dev = 0, function = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &dev, &function) < 3) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &dev, &function) < 2)
            PILOT_RETURN(cudaErrorInvalidValue);
    }
    for (int d = 0; d < pilot_device_count(); d++) {
        const pilot_rep_device_info *info;
        if (info_of(d, &info))
            continue;
        if ((unsigned)info->attrs[cudaDevAttrPciDomainId] == domain &&
            (unsigned)info->attrs[cudaDevAttrPciBusId] == bus &&
            (unsigned)info->attrs[cudaDevAttrPciDeviceId] == dev) {
            *device = d;
            return cudaSuccess;
        }
    }
    PILOT_RETURN(cudaErrorInvalidDevice);
}

PILOT_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = pilot_capture_check_device(pilot_current_device()); /* graph_capture.c */
    if (err)
        PILOT_RETURN(err);
    err = pilot_callbacks_fence_device(pilot_current_device());
    if (err)
        PILOT_RETURN(err);
    PILOT_RETURN(pilot_call(PILOT_OP_DEVICE_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL));
}

PILOT_EXPORT cudaError_t cudaDeviceReset(void)
{
    PILOT_REQUIRE_SESSION();
    const int dev = pilot_current_device();
    cudaError_t err = pilot_callbacks_fence_device(dev);
    if (err == cudaSuccess)
        err = pilot_call(PILOT_OP_DEVICE_RESET, NULL, 0, NULL, 0, NULL, 0, NULL, 0, NULL);
    if (err == cudaSuccess) {
        pilot_hooks_device_reset(dev); /* each module drops what the reset destroyed */
    }
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDriverGetVersion(int *version)
{
    if (!version)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* CUDA reports 0 (and success) when no driver is there; pilot does when no daemon is. */
    const pilot_rep_device_info *info =
        pilot_ensure_session() == cudaSuccess ? pilot_device_info_of(0) : NULL;
    *version = info ? info->driver_version : 0;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaRuntimeGetVersion(int *version)
{
    if (!version)
        PILOT_RETURN(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}
