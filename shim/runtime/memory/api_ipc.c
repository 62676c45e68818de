/* CUDA IPC: device memory and events shared with another process of the same tenant.
 *
 * pilotd makes the handles (64 opaque bytes naming an export it keeps: daemon/resources/ipc.py)
 * and decides who may open them: a process of the exporter's tenant, on the same GPU, other than
 * the exporter. Every tenant's memory is in pilotd's one context, so an opened handle maps
 * nothing: the allocation's own address becomes memory of this session for pilotd's checks, and
 * joins this shim's table of device ranges (cudaMemcpyDefault, cudaPointerGetAttributes) until
 * its last cudaIpcCloseMemHandle. An exporter's cudaFree while others hold the memory is safe:
 * pilotd keeps it until they let go. */
#include <string.h>

#include "shim.h"

PILOT_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (!handle || !devPtr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    pilot_req_free req = {.ptr = (uintptr_t)devPtr};
    pilot_rep_ipc_handle rep;
    cudaError_t err = pilot_call_on(pilot_alloc_owner((uintptr_t)devPtr), PILOT_OP_IPC_MEM_EXPORT,
                                    &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        memcpy(handle->reserved, rep.handle, sizeof handle->reserved);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                                              unsigned int flags)
{
    if (!devPtr)
        PILOT_RETURN(cudaErrorInvalidValue);
    *devPtr = NULL;
    PILOT_REQUIRE_SESSION();
    pilot_req_ipc_open req = {.flags = flags};
    memcpy(req.handle, handle.reserved, sizeof req.handle);
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_IPC_MEM_OPEN, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 NULL, 0, NULL);
    if (err != cudaSuccess)
        PILOT_RETURN(err);
    uint64_t base = 0;
    if (pilot_alloc_flags(rep.value, &base, NULL) < 0 || base != rep.value)
        pilot_alloc_add_flags(rep.value, rep.value2, /* opened before: already in the table */
                              PILOT_ALLOC_IMPORTED);
    *devPtr = (void *)(uintptr_t)rep.value;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    if (!devPtr)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    int dev = pilot_alloc_owner((uintptr_t)devPtr);
    cudaError_t err = pilot_callbacks_fence_device(dev); /* the last close waits for the device */
    if (err)
        PILOT_RETURN(err);
    pilot_req_free req = {.ptr = (uintptr_t)devPtr};
    pilot_rep_u64 rep;
    err = pilot_call_on(dev, PILOT_OP_IPC_MEM_CLOSE, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                        NULL, 0, NULL);
    if (err == cudaSuccess && rep.value == 0)
        pilot_alloc_remove((uintptr_t)devPtr);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    if (!handle)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    int dev = pilot_event_device(event);
    if (dev < 0)
        PILOT_RETURN(cudaErrorInvalidResourceHandle);
    pilot_req_handle req = {.handle = (uintptr_t)event};
    pilot_rep_ipc_handle rep;
    cudaError_t err = pilot_call_on(dev, PILOT_OP_IPC_EVENT_EXPORT, &req, sizeof req, NULL, 0, &rep,
                                    sizeof rep, NULL, 0, NULL);
    if (err == cudaSuccess)
        memcpy(handle->reserved, rep.handle, sizeof handle->reserved);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    if (!event)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    pilot_req_ipc_open req = {.flags = 0};
    memcpy(req.handle, handle.reserved, sizeof req.handle);
    pilot_rep_u64 rep;
    cudaError_t err = pilot_call(PILOT_OP_IPC_EVENT_OPEN, &req, sizeof req, NULL, 0, &rep, sizeof rep,
                                 NULL, 0, NULL);
    if (err == cudaSuccess)
        *event = (cudaEvent_t)(uintptr_t)rep.value;
    PILOT_RETURN(err);
}
