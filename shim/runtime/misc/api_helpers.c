/* Host-side helpers that need nothing of the daemon: cudaCreateChannelDesc (a plain function in
 * libcudart, which the channel_descriptor.h templates call), cudaChooseDevice (among the
 * devices the program sees, from the attributes the shim already holds) and the check of an L2
 * access policy window (streams' and graph kernel nodes' attributes). */
#include "shim.h"

PILOT_EXPORT struct cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w,
                                                                enum cudaChannelFormatKind f)
{
    struct cudaChannelFormatDesc desc = {.x = x, .y = y, .z = z, .w = w, .f = f};
    return desc;
}

/* The device closest to the compute capability asked for: the lowest capability at least as
 * high (the first such device), else the highest there is. */
PILOT_EXPORT cudaError_t cudaChooseDevice(int *device, const struct cudaDeviceProp *prop)
{
    if (!device || !prop)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    const int want = prop->major * 1000 + prop->minor;
    int best = -1, best_cc = 0, best_fits = 0;
    for (int d = 0; d < pilot_device_count(); d++) {
        const pilot_rep_device_info *info = pilot_device_info_of(d);
        if (!info)
            continue;
        int cc = info->attrs[cudaDevAttrComputeCapabilityMajor] * 1000 +
                 info->attrs[cudaDevAttrComputeCapabilityMinor];
        int fits = cc >= want;
        int better = fits ? !best_fits || cc < best_cc : !best_fits && cc > best_cc;
        if (best < 0 || better) {
            best = d;
            best_cc = cc;
            best_fits = fits;
        }
    }
    if (best < 0)
        PILOT_RETURN(cudaErrorNoDevice);
    *device = best;
    return cudaSuccess;
}

cudaError_t pilot_check_access_window(const struct cudaAccessPolicyWindow *w)
{
    const pilot_rep_device_info *info = pilot_device_info();
    int max = info ? info->attrs[cudaDevAttrMaxAccessPolicyWindowSize] : 0;
    if (max > 0 && w->num_bytes > (size_t)max)
        return cudaErrorInvalidValue;
    if (!(w->hitRatio >= 0.0f && w->hitRatio <= 1.0f))
        return cudaErrorInvalidValue;
    if ((unsigned)w->hitProp > cudaAccessPropertyPersisting ||
        (unsigned)w->missProp > cudaAccessPropertyPersisting)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}
