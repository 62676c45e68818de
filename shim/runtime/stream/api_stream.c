/* Streams and events. The program's handles are daemon-side objects owned by its session; the
 * shim hands out the daemon's handle numbers as cudaStream_t / cudaEvent_t values, and each
 * handle names its device (bits PILOT_HANDLE_DEVICE_SHIFT..+7), so a call about a stream or an
 * event goes to that device's part of the session whatever the thread's current device.
 *
 * Special streams:
 * - 0 and cudaStreamLegacy: the legacy default stream of the device, which the daemon keeps
 *   with CUDA's implicit synchronization against blocking streams (daemon/streams.py);
 * - cudaStreamPerThread, and 0 in the _ptsz/_ptds entry points that `-default-stream
 *   per-thread` builds call (api_ptds.c): the calling thread's own default stream on its
 *   current device. It is an ordinary blocking stream of the session, created on first use and
 *   destroyed when the thread exits: it synchronizes with the legacy stream, never with other
 *   threads' per-thread streams, as in CUDA.
 * The handles themselves (which device, the thread's own objects) are stream_handles.c's. */
#include <pthread.h>
#include <string.h>

#include "shim.h"

/* The device of an event handle, or -1 for a value that cannot be one of ours. */
int pilot_event_device(cudaEvent_t event)
{
    int dev = pilot_handle_device((uintptr_t)event);
    return event && dev < pilot_device_count() ? dev : -1;
}

static cudaError_t handle_call(int device, uint16_t op, uint64_t handle)
{
    if (device < 0 || device >= pilot_device_count())
        return cudaErrorInvalidResourceHandle;
    pilot_req_handle req = {.handle = handle};
    return pilot_call_on(device, op, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
}

/* ---- streams ---- */

PILOT_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    if (!stream)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        PILOT_RETURN(cudaErrorInvalidValue);
    pilot_req_stream_create req = {.flags = flags, .priority = 0};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_STREAM_CREATE, &req, sizeof req, NULL, 0, &rep,
                                 sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        *stream = (cudaStream_t)(uintptr_t)rep.value;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

PILOT_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    uintptr_t v = (uintptr_t)stream;
    if (v == 0 || v == PILOT_STREAM_LEGACY || v == PILOT_STREAM_PER_THREAD)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_stream_forget(v); /* frees on it wait for pilotd's answer again */
    PILOT_RETURN(handle_call(pilot_handle_device(v), PILOT_OP_STREAM_DESTROY, v));
}

cudaError_t pilot_stream_sync(uint64_t h)
{
    int dev = pilot_handle_device(h);
    cudaError_t err = cudaSuccess;
    if (dev < pilot_device_count()) {
        int previous = pilot_route_begin(dev);
        err = pilot_callbacks_fence(h);
        pilot_route_end(previous);
    }
    return err ? err : handle_call(dev, PILOT_OP_STREAM_SYNCHRONIZE, h);
}

PILOT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    uint64_t h = pilot_stream_handle(stream);
    cudaError_t err = pilot_capture_check_sync(h, 0); /* a capturing stream: refused */
    PILOT_RETURN(err ? err : pilot_stream_sync(h));
}

PILOT_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    uint64_t h = pilot_stream_handle(stream);
    cudaError_t err = pilot_capture_check_sync(h, 0);
    if (err)
        PILOT_RETURN(err);
    PILOT_RETURN(handle_call(pilot_handle_device(h), PILOT_OP_STREAM_QUERY, h));
}

PILOT_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                             unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    int edev = pilot_event_device(event);
    if (edev < 0)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    /* The event may be another device's: the stream's part finds it (daemon/devices.py). Calls
     * posted to that device went over another connection, to another vGPU thread, so nothing
     * orders them before this one: a round trip to the event's part first makes sure its
     * cudaEventRecord has reached the device. */
    uint64_t h = pilot_stream_handle(stream);
    cudaError_t cerr = cudaSuccess; /* in a capture: a dependency, not a wait (graph_capture.c) */
    if (pilot_capture_wait(h, event, flags, &cerr))
        PILOT_RETURN(cerr);
    if (edev != pilot_handle_device(h)) {
        pilot_req_handle query = {.handle = (uintptr_t)event};
        cudaError_t err = pilot_call_on(edev, PILOT_OP_EVENT_QUERY, &query, sizeof query, NULL, 0,
                                        NULL, 0, NULL, 0, NULL);
        if (err != cudaSuccess && err != cudaErrorNotReady)
            PILOT_RETURN(err);
    }
    pilot_req_stream_wait_event req = {.stream = h, .event = (uintptr_t)event, .flags = flags};
    /* Stream-ordered, so it can go without waiting, like a launch. */
    PILOT_RETURN(pilot_post_on(pilot_handle_device(h), PILOT_OP_STREAM_WAIT_EVENT, &req, sizeof req,
                               NULL, 0));
}

PILOT_EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device)
{
    if (!device)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    uintptr_t v = (uintptr_t)stream;
    int dev = (v == 0 || v == PILOT_STREAM_LEGACY || v == PILOT_STREAM_PER_THREAD)
                  ? pilot_current_device()
                  : pilot_handle_device(v);
    if (dev >= pilot_device_count())
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    *device = dev;
    return cudaSuccess;
}

/* ---- events ---- */

PILOT_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))
        PILOT_RETURN(cudaErrorInvalidValue);
    pilot_req_event_create req = {.flags = flags};
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_EVENT_CREATE, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 NULL, 0, NULL);
    if (err == cudaSuccess)
        *event = (cudaEvent_t)(uintptr_t)rep.value;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t pilot_event_record(cudaEvent_t event, cudaStream_t stream)
{
    int dev = pilot_event_device(event);
    if (dev < 0)
        return cudaErrorInvalidResourceHandle;
    uint64_t h = pilot_stream_handle(stream);
    if (pilot_handle_device(h) != dev) /* "fails if event and stream are on different devices" */
        return cudaErrorInvalidResourceHandle;
    cudaError_t err = cudaSuccess;
    if (pilot_capture_record(h, event, 0, &err)) /* recorded in a capture (graph_capture.c) */
        return err;
    pilot_req_event_record req = {.event = (uintptr_t)event, .stream = h};
    return pilot_post_on(dev, PILOT_OP_EVENT_RECORD, &req, sizeof req, NULL, 0);
}

PILOT_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(pilot_event_record(event, stream));
}

PILOT_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    int dev = pilot_event_device(event);
    cudaError_t err = pilot_capture_check_event(event);
    if (err)
        PILOT_RETURN(err);
    err = dev >= 0 ? pilot_callbacks_fence_event(dev, (uintptr_t)event) : cudaSuccess;
    PILOT_RETURN(err ? err : handle_call(dev, PILOT_OP_EVENT_SYNCHRONIZE, (uintptr_t)event));
}

PILOT_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = pilot_capture_check_event(event);
    if (err)
        PILOT_RETURN(err);
    PILOT_RETURN(handle_call(pilot_event_device(event), PILOT_OP_EVENT_QUERY, (uintptr_t)event));
}

PILOT_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    int dev = pilot_event_device(start);
    if (dev < 0 || pilot_event_device(end) != dev) /* both of one device, as CUDA requires */
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_req_event_elapsed req = {.start = (uintptr_t)start, .end = (uintptr_t)end};
    pilot_rep_elapsed rep;
    cudaError_t err = pilot_call_on(dev, PILOT_OP_EVENT_ELAPSED, &req, sizeof req, NULL, 0, &rep,
                                    sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        *ms = rep.ms;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(handle_call(pilot_event_device(event), PILOT_OP_EVENT_DESTROY, (uintptr_t)event));
}
