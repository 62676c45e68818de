/* Streams and events. The program's handles are daemon-side objects owned by its session; the
 * shim hands out the daemon's handle numbers as cudaStream_t / cudaEvent_t values. Stream 0,
 * cudaStreamLegacy and (until issue 3) cudaStreamPerThread mean the session's legacy default
 * stream, which the daemon keeps with CUDA's implicit synchronization against blocking streams. */
#include "shim.h"

uint64_t pilot_stream_handle(cudaStream_t stream)
{
    uintptr_t v = (uintptr_t)stream;
    return (v == 0 || v == PILOT_STREAM_LEGACY || v == PILOT_STREAM_PER_THREAD) ? 0 : v;
}

static cudaError_t handle_call(uint16_t op, uint64_t handle)
{
    pilot_req_handle req = {.handle = handle};
    return pilot_call(op, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
}

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
    uint64_t h = pilot_stream_handle(stream);
    if (!h)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    PILOT_RETURN(handle_call(PILOT_OP_STREAM_DESTROY, h));
}

PILOT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(handle_call(PILOT_OP_STREAM_SYNCHRONIZE, pilot_stream_handle(stream)));
}

PILOT_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(handle_call(PILOT_OP_STREAM_QUERY, pilot_stream_handle(stream)));
}

PILOT_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                             unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_req_stream_wait_event req = {.stream = pilot_stream_handle(stream),
                                       .event = (uintptr_t)event, .flags = flags};
    /* Stream-ordered, so it can go without waiting, like a launch. */
    PILOT_RETURN(pilot_post(PILOT_OP_STREAM_WAIT_EVENT, &req, sizeof req, NULL, 0));
}

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

PILOT_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_req_event_record req = {.event = (uintptr_t)event, .stream = pilot_stream_handle(stream)};
    PILOT_RETURN(pilot_post(PILOT_OP_EVENT_RECORD, &req, sizeof req, NULL, 0));
}

PILOT_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    PILOT_RETURN(handle_call(PILOT_OP_EVENT_SYNCHRONIZE, (uintptr_t)event));
}

PILOT_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    PILOT_RETURN(handle_call(PILOT_OP_EVENT_QUERY, (uintptr_t)event));
}

PILOT_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    if (!start || !end)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_req_event_elapsed req = {.start = (uintptr_t)start, .end = (uintptr_t)end};
    pilot_rep_elapsed rep;
    cudaError_t err = pilot_call(PILOT_OP_EVENT_ELAPSED, &req, sizeof req, NULL, 0, &rep,
                                 sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        *ms = rep.ms;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    PILOT_REQUIRE_SESSION();
    if (!event)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    PILOT_RETURN(handle_call(PILOT_OP_EVENT_DESTROY, (uintptr_t)event));
}
