/* Several devices: peer queries, peer access, and copies between devices' memory.
 *
 * Peer facts come from DEVICE_INFO (peer_mask: cuDeviceCanAccessPeer between the GPUs behind
 * the program's ordinals). Peer access is enabled in the daemon once per pair of GPUs for the
 * shared contexts and never disabled there (daemon/devices.py); what cudaDeviceEnablePeerAccess
 * and cudaDeviceDisablePeerAccess report is kept per process here, so a program sees CUDA's
 * answers (already enabled, not enabled).
 *
 * A peer copy runs on a stream of the device the call goes to: the stream's for
 * cudaMemcpyPeerAsync, the current device's legacy stream otherwise. cudaMemcpyPeer is ordered
 * after all pending work of the current, source and destination devices and before their later
 * work: pilot synchronizes the source and destination devices first and returns once the copy
 * is done (CUDA may return earlier; the order is the same). */
#include "shim.h"

static unsigned g_enabled[PILOT_MAX_DEVICES]; /* bit p of [d]: d's kernels may reach p's memory */

static int valid_device(int device)
{
    return device >= 0 && device < pilot_device_count();
}

PILOT_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    if (!canAccessPeer)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    /* A device that does not exist: cudaErrorInvalidDevice, *canAccessPeer left alone (H100).
     * A device and itself: success and 0, as natively. */
    if (!valid_device(device) || !valid_device(peerDevice))
        PILOT_RETURN(cudaErrorInvalidDevice);
    const pilot_rep_device_info *info = pilot_device_info_of(device);
    if (!info)
        PILOT_RETURN(cudaErrorDevicesUnavailable);
    *canAccessPeer = device != peerDevice && (info->peer_mask >> peerDevice & 1u);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    const int dev = pilot_current_device();
    if (flags)
        PILOT_RETURN(cudaErrorInvalidValue);
    if (!valid_device(peerDevice))
        PILOT_RETURN(cudaErrorInvalidDevice);
    if (peerDevice == dev) /* a device is never its own peer (cudaDeviceCanAccessPeer: 0), H100 */
        PILOT_RETURN(cudaErrorPeerAccessUnsupported);
    const pilot_rep_device_info *info = pilot_device_info_of(dev);
    if (!info)
        PILOT_RETURN(cudaErrorDevicesUnavailable);
    if (!(info->peer_mask >> peerDevice & 1u))
        PILOT_RETURN(cudaErrorPeerAccessUnsupported);
    if (__atomic_load_n(&g_enabled[dev], __ATOMIC_ACQUIRE) >> peerDevice & 1u)
        PILOT_RETURN(cudaErrorPeerAccessAlreadyEnabled);
    pilot_req_device req = {.device = peerDevice};
    cudaError_t err = pilot_call_on(dev, PILOT_OP_PEER_ENABLE, &req, sizeof req, NULL, 0, NULL, 0,
                                    NULL, 0, NULL);
    if (err == cudaSuccess)
        __atomic_or_fetch(&g_enabled[dev], 1u << peerDevice, __ATOMIC_RELEASE);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
    PILOT_REQUIRE_SESSION();
    const int dev = pilot_current_device();
    if (!valid_device(peerDevice))
        PILOT_RETURN(cudaErrorInvalidDevice);
    unsigned bit = 1u << peerDevice;
    if (!(__atomic_fetch_and(&g_enabled[dev], ~bit, __ATOMIC_ACQ_REL) & bit))
        PILOT_RETURN(cudaErrorPeerAccessNotEnabled);
    return cudaSuccess;
}

/* Whether [ptr, ptr+count) is memory of `device` in the allocation mirror. */
static int on_device(const void *ptr, size_t count, int device)
{
    return pilot_alloc_contains((uintptr_t)ptr, count) && pilot_alloc_device((uintptr_t)ptr) == device;
}

cudaError_t pilot_memcpy_peer(void *dst, int dst_device, const void *src, int src_device,
                              size_t count, uint64_t stream, int sync)
{
    if (!valid_device(dst_device) || !valid_device(src_device))
        return cudaErrorInvalidDevice;
    if (count == 0)
        return cudaSuccess;
    if (!on_device(dst, count, dst_device) || !on_device(src, count, src_device))
        return cudaErrorInvalidValue;
    const int exec = pilot_handle_device(stream); /* the current device for stream 0 */
    cudaError_t err = cudaSuccess;
    if (sync) /* after every device's pending work; the call's own reply orders what follows */
        for (int i = 0; i < 2 && err == cudaSuccess; i++) {
            int d = i ? dst_device : src_device;
            if (d != exec && (i == 0 || dst_device != src_device)) {
                err = pilot_callbacks_fence_device(d);
                if (err == cudaSuccess)
                    err = pilot_call_on(d, PILOT_OP_DEVICE_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0,
                                        NULL, 0, NULL);
            }
        }
    if (sync && err == cudaSuccess) {
        int previous = pilot_route_begin(exec);
        err = pilot_callbacks_fence(stream);
        pilot_route_end(previous);
    }
    if (err)
        return err;
    pilot_req_memcpy_peer req = {.dst = (uintptr_t)dst, .src = (uintptr_t)src, .count = count,
                                 .stream = stream, .dst_device = dst_device,
                                 .src_device = src_device, .sync = (uint32_t)sync};
    if (!sync)
        return pilot_post_on(exec, PILOT_OP_MEMCPY_PEER, &req, sizeof req, NULL, 0);
    return pilot_call_on(exec, PILOT_OP_MEMCPY_PEER, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0,
                         NULL);
}

PILOT_EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                        size_t count)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_memcpy_peer(dst, dstDevice, src, srcDevice, count, 0, 1));
}

PILOT_EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
                                             int srcDevice, size_t count, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = cudaSuccess;
    if (pilot_capture_any() &&
        pilot_capture_refuse(pilot_stream_handle(stream), "cudaMemcpyPeerAsync", &err))
        PILOT_RETURN(err);
    PILOT_RETURN(pilot_memcpy_peer(dst, dstDevice, src, srcDevice, count,
                                   pilot_stream_handle(stream), 0));
}
