/* cudaStreamGetFlags and cudaStreamGetPriority: what pilotd keeps of a stream (its flags and
 * priority are the session's, api_misc.c), below stream capture, which checks a stream handle
 * with cudaStreamGetFlags. */
#include "shim.h"

static cudaError_t stream_info(cudaStream_t stream, pilot_rep_stream_info *info)
{
    uint64_t h = (uintptr_t)stream == PILOT_STREAM_PER_THREAD ? 0 : pilot_stream_handle(stream);
    if (!h) { /* stream 0, cudaStreamLegacy, cudaStreamPerThread: as seen natively */
        info->flags = cudaStreamDefault;
        info->priority = 0;
        return cudaSuccess;
    }
    pilot_req_handle req = {.handle = h};
    return pilot_call_on(pilot_handle_device(h), PILOT_OP_STREAM_GET_INFO, &req, sizeof req, NULL,
                         0, info, sizeof *info, NULL, 0, NULL);
}

PILOT_EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags)
{
    if (!flags)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    pilot_rep_stream_info info;
    cudaError_t err = stream_info(stream, &info);
    if (err == cudaSuccess)
        *flags = info.flags;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority)
{
    if (!priority)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    pilot_rep_stream_info info;
    cudaError_t err = stream_info(stream, &info);
    if (err == cudaSuccess)
        *priority = info.priority;
    PILOT_RETURN(err);
}
