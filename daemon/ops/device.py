"""Device management (CUDA runtime manual, chapter 6.2): device information, synchronize,
reset, limits, priorities, peer access."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    BackendError,
    DeviceInfo,
)
from pilot.daemon.ops.ipc import session_ends as ipc_session_ends
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.resources import limits
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.arrays import release_objects
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("device")
log = logging.getLogger("pilot.ops.device")
ATTR_MULTIPROCESSOR_COUNT = 16  # cudaDevAttrMultiProcessorCount

# Capabilities the GPU has that pilot does not carry, advertised as absent (0) in every device
# attribute a program reads (cudaDeviceGetAttribute, cuDeviceGetAttribute, cudaDeviceProp), so a
# program that looks before it leaps takes its other path instead of calling into a stub
# (llama.cpp's CUDA memory pool, for one, uses the virtual memory calls whenever attribute 102
# says so, and aborts when they fail). Attribute -> the call the capability needs (a stub of
# shim/tables/*.tsv: tests/unit/test_device_capabilities.py checks it), or None with why.
NOT_CARRIED: dict[int, tuple[str | None, str]] = {
    102: ("cuMemCreate", "virtual memory management (cuMemCreate, cuMemMap, ...)"),
    103: ("cuMemExportToShareableHandle", "POSIX file descriptor handles of cuMemCreate memory"),
    107: ("cuMemCreate", "compressible memory (cuMemCreate)"),
    110: ("cuMemCreate", "GPUDirect RDMA with cuMemCreate memory"),
    112: ("cudaArrayGetSparseProperties", "sparse CUDA arrays"),
    114: ("cudaImportExternalSemaphore", "external timeline semaphores"),
    119: ("cudaMemPoolExportToShareableHandle", "memory pools exported to other processes"),
    121: ("cuMemMapArrayAsync", "deferred mapping of CUDA arrays"),
    124: ("cuMemGetHandleForAddressRange", "dma_buf sharing"),
    128: ("cuMemExportToShareableHandle", "fabric handles"),
    132: ("cuMulticastCreate", "multicast objects"),
    136: ("cuMemBatchDecompressAsync", "memory decompression"),
    137: ("cuMemBatchDecompressAsync", "memory decompression"),
    141: ("cuMemCreate", "host NUMA memory through cuMemCreate"),
    142: (None, "host NUMA memory pools: cudaMemPoolCreate takes device locations only"),
    143: ("cuMemPoolExportToShareableHandle", "host NUMA IPC between nodes"),
    144: (None, "host memory pools: cudaMemPoolCreate takes device locations only"),
    145: ("cuMemCreate", "host memory through cuMemCreate"),
    146: ("cuMemGetHandleForAddressRange", "dma_buf sharing of pinned host memory"),
}


@OPS.handler(lib.PILOT_OP_DEVICE_INFO, "pilot_req_device")
def device_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_device_info")
    info = fill_device_info(vg, s, req.device, rep)  # count, capacity, peers
    rep.driver_version = info.driver_version
    name = info.name.encode()[: lib.PILOT_NAME_MAX - 1]
    ffi.memmove(rep.name, name, len(name))
    ffi.memmove(rep.uuid, info.uuid[:16], min(16, len(info.uuid)))
    for attr, value in info.attrs.items():
        if 0 <= attr < lib.PILOT_ATTR_COUNT and attr not in NOT_CARRIED:
            rep.attrs[attr] = value
    part = s if s.group is None else s.group.part(req.device)
    if part is not None and part.partition is not None:
        # A capped session sees its partition's SMs, as a program in a green context reads them
        # (cuCtxGetDevResource): grids sized by the SM count, and cooperative grids, then fit.
        rep.attrs[ATTR_MULTIPROCESSOR_COUNT] = part.partition.sm_count
    return rep

def fill_device_info(vg: VGpu, s: Session, ordinal: int, rep: Any) -> DeviceInfo:
    """Device count, capacity and peer mask of program device `ordinal` into rep; returns its
    DeviceInfo. Without a topology (a VGpu built alone, in tests) the vGPU's own device is the
    only one."""
    group, topo = s.group, vg.topology
    if topo is None or group is None:
        if ordinal != 0:
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"no device {ordinal}")
        rep.device_count = 1
        rep.total_mem = vg.memory_limits(s)[1]
        return vg.device_info()
    pos = group.position(ordinal)
    rep.device_count = len(group)
    rep.total_mem = topo.vgpus[pos][0].memory_limits(s)[1]
    mask = 0
    for q in range(len(group)):
        if q != ordinal and topo.peers[pos][group.position(q)]:
            mask |= 1 << q
    rep.peer_mask = mask
    return topo.infos[pos]

@OPS.handler(lib.PILOT_OP_DEVICE_SYNCHRONIZE, synchronizing=True)
def device_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    streams.synchronize_session(vg, s)

@OPS.handler(lib.PILOT_OP_DEVICE_QUERY)
def device_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Whether every stream of the session's part is idle: what the shim polls instead of a
    blocking cudaDeviceSynchronize (or cudaFree) while host callbacks are outstanding, so that
    neither its connection nor this vGPU thread waits for a callback."""
    backend = vg.backend
    if not all(backend.stream_query(st.obj) for st in list(s.streams.values())) or \
            not backend.stream_query(s.legacy or vg.stream):
        raise BackendError(CUDA_ERROR_NOT_READY)

@OPS.handler(lib.PILOT_OP_DEVICE_RESET, synchronizing=True)
def device_reset(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Frees the session's memory, streams and events; loaded modules stay (kernels relaunch).
    What it exported through CUDA IPC and others still hold is kept for them; what it opened
    is closed (ops/ipc.py)."""
    streams.synchronize_session(vg, s)
    ipc_session_ends(vg, s)
    backend = vg.backend
    # arrays, texture and surface objects
    for handle, charged in release_objects(s, backend, s.legacy or vg.stream):
        vg.broker.release(s, "array", charged, handle)
    for ptr in list(s.allocations):
        s.drop_shadow(ptr)
        s.free_memory(backend, ptr, s.legacy or vg.stream)
        kind = s.allocation_kind(ptr)
        vg.broker.release(s, kind, s.remove_allocation(ptr), ptr)
    for ev in s.events.values():
        backend.event_destroy(ev)
    with vg.preempt.streams_going(s) if vg.preempt is not None else nullcontext():
        for st in s.streams.values():
            if st.join_event is not None:
                backend.event_destroy(st.join_event)
            backend.stream_destroy(st.obj)
        s.streams.clear()
    s.events.clear()
    s.dirty_blocking.clear()
    s.deferred = 0

LIMIT_MAX = 6  # cudaLimitPersistingL2CacheSize, the last cudaLimit of CUDA 13.0
CUDA_ERROR_NOT_PERMITTED = 800

@OPS.handler(lib.PILOT_OP_DEVICE_SET_LIMIT, "pilot_req_limit")
def device_set_limit(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """The context is every tenant's: limits.py applies the largest request of any live session
    and the reply reports the effective value."""
    if req.limit > LIMIT_MAX:
        raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {req.limit}")
    table = limits.for_context(vg.backend, vg.device)
    if req.limit not in limits.CHARGED and not s.admin and req.value > table.default(req.limit):
        # the device runtime's launch queue and sync depth, L2 settings: every tenant's, and not
        # memory pilot can charge (issue 27, item 8); an operator may raise them
        log.warning("session %d: cudaDeviceSetLimit(%s, %d) refused: a limit every tenant shares "
                    "that only an admin may raise", s.id, limits.LIMIT_NAMES[req.limit], req.value,
                    extra={"session": s.id, "tenant": s.tenant})
        raise BackendError(CUDA_ERROR_NOT_PERMITTED, "limit raised by a non-admin")
    # Device memory the request takes beyond the context's default is the session's to pay for
    # (the heap, the printf FIFO, stacks for every thread the GPU can hold); charged before the
    # driver is asked, corrected if the driver refuses.
    old = s.limit_charges.get(req.limit, 0)
    new = limits.request_bytes(req.limit, req.value, table.default(req.limit), vg.device_info())
    vg.broker.adjust(s, "limit", old, new, "cudaDeviceSetLimit")
    try:
        value = table.request(s.id, req.limit, req.value)
    except BaseException:
        vg.broker.adjust(s, "limit", new, old)
        raise
    s.limit_charges[req.limit] = new
    s.limits = table  # Session.release drops the session's requests
    return u64(value)

@OPS.handler(lib.PILOT_OP_DEVICE_GET_LIMIT, "pilot_req_limit")
def device_get_limit(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.limit > LIMIT_MAX:
        raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {req.limit}")
    return u64(vg.backend.ctx_get_limit(req.limit))

@OPS.handler(lib.PILOT_OP_DEVICE_PRIORITY_RANGE)
def device_priority_range(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_priority_range")
    rep.least, rep.greatest = vg.backend.stream_priority_range()
    return rep

def backend_device(vg: VGpu, s: Session, ordinal: int) -> int:
    if vg.topology is None or s.group is None:
        if ordinal != 0:
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"no device {ordinal}")
        return vg.device
    return vg.topology.devices[s.group.position(ordinal)]

@OPS.handler(lib.PILOT_OP_PEER_ENABLE, "pilot_req_device")
def peer_enable(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Lets kernels of this device reach the peer's memory. The contexts are shared by every
    tenant, so access is enabled once per pair of GPUs and never disabled (it grants nothing
    the API does not already check); the shim keeps each program's own on/off state."""
    peer = backend_device(vg, s, req.device)
    if peer == vg.device:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE, "a device is not its own peer")
    vg.backend.enable_peer_access(vg.device, peer)
