"""Memory management (chapter 6.10): allocations, copies, memsets, 2D memory, staging areas,
peer copies."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_MEMCPY_DIRECTION,
    CUDA_ERROR_INVALID_PITCH_VALUE,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
)
from pilot.daemon.ops.device import backend_device
from pilot.daemon.ops.ipc import exporter_frees
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import need_payload, staging_slot, u64
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.devices import owns_range
from pilot.daemon.sessions.session import Session
from pilot.daemon.sessions.staging import SLOT_BYTES as STAGING_SLOT_BYTES
from pilot.daemon.sessions.staging import SLOTS as STAGING_SLOTS
from pilot.daemon.sessions.staging import Staging

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.ops")
OPS = OpTable("memory")
MANAGED_ATTACH_GLOBAL = 1


def note_write(vg: VGpu, s: Session, ptr: int, count: int, stream: Any) -> None:
    """[ptr, ptr+count) is written on the GPU: movable memory there comes onto the GPU (the
    capacity enforcer makes room first, on the same stream)."""
    res = vg.broker.residency
    if res is not None and s.id in res.sessions:
        res.written(s, ptr, count, stream)


def allocate_device(vg: VGpu, s: Session, size: int, stream: Any = None) -> int:
    """cudaMalloc's memory, charged and recorded. With `[gpu] managed_device_memory` (and an
    enforced capacity) it is managed, so the enforcer and the policies can move it; the program
    still sees device memory. Otherwise a zeroed block freed a moment ago, of this very size (or
    one the session freed on `stream`, a backend stream: quarantine.py), else the driver's."""
    backend = vg.backend
    movable = "device" in vg.broker.movable
    make = ((lambda: backend.mem_alloc_managed(size, MANAGED_ATTACH_GLOBAL)) if movable else
            (lambda: vg.quarantine.take(size, s.id if stream is not None else None, stream)
             or backend.mem_alloc(size)))
    ptr = vg.broker.allocate(s, "device", size, make)
    s.add_allocation(ptr, size, driver_zeroed=movable)
    return ptr

@OPS.handler(lib.PILOT_OP_MALLOC, "pilot_req_malloc")
def malloc(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    return u64(allocate_device(vg, s, req.size))

def check_allocation(s: Session, ptr: int) -> None:
    if ptr not in s.allocations:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not an allocation of this session")

def release_allocation(vg: VGpu, s: Session, ptr: int) -> None:
    """The allocation leaves the session (no later call of it may use ptr) and its charge goes
    back to the tenant; the policy hears of it (broker.release)."""
    kind = s.allocation_kind(ptr)
    vg.broker.release(s, kind, s.remove_allocation(ptr), ptr)

@OPS.handler(lib.PILOT_OP_FREE, "pilot_req_free")
def free(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    check_allocation(s, req.ptr)
    free_after_work(vg, s, req.ptr)

def free_after_work(vg: VGpu, s: Session, ptr: int) -> None:
    """cudaFree of one of the session's allocations: after every piece of work it issued."""
    s.drop_shadow(ptr)
    streams.synchronize_session(vg, s)  # cudaFree waits for the device; the zeroing must too
    if vg.broker.residency is not None:
        vg.broker.residency.quiesce(s, ptr)
    if exporter_frees(vg, s, ptr):  # other processes opened it through IPC: kept for them
        return
    size = s.allocations[ptr]
    if size and not s.holds_managed(ptr):
        # zeroed, then freed once that is done (quarantine.py)
        vg.quarantine.free_later(ptr, size, s.legacy or vg.stream)
    else:
        s.free_memory(vg.backend, ptr, s.legacy or vg.stream)
    release_allocation(vg, s, ptr)

@OPS.handler(lib.PILOT_OP_MEM_GET_INFO)
def mem_get_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    vg.quarantine.drain(behind_work=False)  # memory freed a moment ago is free
    return u64(*vg.memory_limits(s))

TEXTURE_ALIGNMENT_ATTR = 14  # cudaDevAttrTextureAlignment: cudaMallocPitch's pitch unit (512)

@OPS.handler(lib.PILOT_OP_MALLOC_PITCH, "pilot_req_malloc_pitch")
def malloc_pitch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Charged like cudaMalloc. The backend chooses the pitch (cuMemAllocPitch), so the broker
    first charges the expected size (width rounded up to the texture alignment) and then
    corrects by the difference, if any."""
    width, height = req.width, req.height
    if width == 0 or height == 0:
        return u64(0, 0)
    align = vg.device_info().attrs.get(TEXTURE_ALIGNMENT_ATTR) or 512
    expected = -(-width // align) * align * height
    broker = vg.broker
    ptr, pitch = broker.allocate(s, "pitch", expected, lambda: vg.backend.mem_alloc_pitch(width, height),
                                 ptr_of=lambda r: r[0])
    size = pitch * height
    try:
        broker.adjust(s, "pitch", expected, size, ptr=ptr)
    except BaseException:
        vg.backend.mem_free(ptr)
        broker.release(s, "pitch", expected, ptr)
        raise
    s.add_allocation(ptr, size, pitched=True)
    return u64(ptr, pitch)

def _new_staging(vg: VGpu, s: Session, slots: int) -> Staging:
    """A staging area (a spare pinned ahead when there is one: sessions/staging.py), charged to
    the tenant's pinned host memory (it is pinned) until the session ends (teardown closes it,
    release_session refunds it)."""
    def make() -> Staging:
        uid, gid = s.creds.uid, s.creds.gid
        spare = vg.staging_spares.take(slots, uid, gid) if vg.staging_spares else None
        return spare or Staging(vg.backend, s.id, uid, gid, slots=slots)
    return vg.broker.allocate(s, "staging", STAGING_SLOT_BYTES * slots, make, call="STAGING_OPEN")

@OPS.handler(lib.PILOT_OP_STAGING_OPEN, "pilot_req_staging_open")
def staging_open(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """The session's staging area, or (fault = 1) the unified-memory fault channel's: one slot,
    so a fetch never waits for a slot a copy on the main connection holds."""
    if req.fault:
        if s.fault_staging is None:
            s.fault_staging = _new_staging(vg, s, 1)
        area = s.fault_staging
    else:
        if s.staging is None:
            s.staging = _new_staging(vg, s, STAGING_SLOTS)
        area = s.staging
    rep = new("pilot_rep_staging")
    rep.slot_bytes = area.slot_bytes
    rep.slots = area.slots
    path = area.path.encode()
    ffi.memmove(rep.path, path, len(path))
    return rep

def _copy_stream(vg: VGpu, s: Session, req: Any) -> Any:
    return streams.stream_for_work(vg, s, req.stream)

def _printf_flush(vg: VGpu, stream: Any) -> None:
    """A blocking copy to the host is where the driver prints what kernels printed (natively
    cudaMemcpy does it; the asynchronous copy pilotd makes does not): a synchronization of the
    copy's stream, done by now, makes it print (vgpu/device_output.py takes it for the reply)."""
    if vg.device_output is not None:
        vg.backend.stream_synchronize(stream)

@OPS.handler(lib.PILOT_OP_MEMCPY_H2D, "pilot_req_memcpy", synchronizing=True)
def memcpy_h2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    need_payload(payload, req.count, "host-to-device data")
    s.check_range(req.dst, req.count)
    stream = _copy_stream(vg, s, req)
    note_write(vg, s, req.dst, req.count, stream)
    vg.backend.memcpy_htod(req.dst, payload, req.count, stream)
    vg.metrics.bytes_copied("h2d", req.count, s.tenant)

@OPS.handler(lib.PILOT_OP_MEMCPY_D2H, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2h(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.count > lib.PILOT_INLINE_MAX:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "inline device-to-host copy too large")
    s.check_range(req.src, req.count)
    out = bytearray(req.count)
    stream = _copy_stream(vg, s, req)
    vg.backend.memcpy_dtoh(out, req.src, req.count, stream)
    _printf_flush(vg, stream)
    vg.metrics.bytes_copied("d2h", req.count, s.tenant)
    return new("pilot_rep_status"), out

@OPS.handler(lib.PILOT_OP_MEMCPY_D2D, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.dst, req.count)
    s.check_range(req.src, req.count)
    stream = _copy_stream(vg, s, req)
    note_write(vg, s, req.dst, req.count, stream)
    vg.backend.memcpy_dtod(req.dst, req.src, req.count, stream)
    vg.metrics.bytes_copied("d2d", req.count, s.tenant)

@OPS.handler(lib.PILOT_OP_MEMCPY_H2D_STAGED, "pilot_req_memcpy", synchronizing=True)
def memcpy_h2d_staged(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.dst, req.count)
    stream = _copy_stream(vg, s, req)
    note_write(vg, s, req.dst, req.count, stream)
    # The backend returns once the slot may be refilled (it waits for the DMA from pinned memory).
    vg.backend.memcpy_htod(req.dst, staging_slot(s, req), req.count, stream)
    vg.metrics.bytes_copied("h2d", req.count, s.tenant)

@OPS.handler(lib.PILOT_OP_MEMCPY_D2H_STAGED, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2h_staged(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.src, req.count)
    stream = _copy_stream(vg, s, req)
    vg.backend.memcpy_dtoh(staging_slot(s, req), req.src, req.count, stream)
    if req.sync:
        _printf_flush(vg, stream)
    vg.metrics.bytes_copied("d2h", req.count, s.tenant)

@OPS.handler(lib.PILOT_OP_MEMSET, "pilot_req_memset")
def memset(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.ptr, req.count)
    stream = _copy_stream(vg, s, req)
    note_write(vg, s, req.ptr, req.count, stream)
    vg.backend.memset_d8(req.ptr, req.value & 0xFF, req.count, stream)
    if vg.fast is not None:  # the stream's next memsets may run in C
        if log.isEnabledFor(logging.DEBUG):
            log.debug("memset through Python: %s", vg.fast.why_python(s, req.stream, req.ptr, req.count),
                      extra={"session": s.id, "tenant": s.tenant})
        vg.fast.stream_used(s, req.stream)

@OPS.handler(lib.PILOT_OP_MEMSET_WIDE, "pilot_req_memset_wide")
def memset_wide(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cuMemsetD16/D32 (the driver API library): elements of 2 or 4 bytes."""
    if req.elem_size not in (2, 4):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"element size {req.elem_size}")
    count = req.count * req.elem_size
    s.check_range(req.ptr, count)
    stream = _copy_stream(vg, s, req)
    note_write(vg, s, req.ptr, count, stream)
    vg.backend.memset_wide(req.ptr, req.value, req.elem_size, req.count, stream)

def _rows_span(pitch: int, width: int, height: int) -> int:
    """Bytes from the first row's start to the last row's end; every row is inside the range
    [ptr, ptr + span) that Session.check_range then checks."""
    if height > 1 and width > pitch:
        raise BackendError(CUDA_ERROR_INVALID_PITCH_VALUE, f"width {width} > pitch {pitch}")
    return (height - 1) * pitch + width

@OPS.handler(lib.PILOT_OP_MEMCPY_2D, "pilot_req_memcpy_2d", synchronizing=True)
def memcpy_2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """H2D: the rows come packed in the payload; D2H: they go back packed (at most
    PILOT_INLINE_MAX bytes; the shim cuts larger copies); D2D: device to device."""
    width, height, kind = req.width, req.height, req.kind
    if width == 0 or height == 0:
        return None
    dpitch = req.dpitch if height > 1 else max(req.dpitch, width)
    spitch = req.spitch if height > 1 else max(req.spitch, width)
    backend, stream = vg.backend, None
    if kind == lib.PILOT_COPY_H2D:
        need_payload(payload, width * height, "host-to-device rows")
        s.check_range(req.dst, _rows_span(dpitch, width, height))
        stream = _copy_stream(vg, s, req)
        backend.memcpy_2d_htod(req.dst, dpitch, payload, width, width, height, stream)
        vg.metrics.bytes_copied("h2d", width * height, s.tenant)
        return None
    if kind == lib.PILOT_COPY_D2H:
        if width * height > lib.PILOT_INLINE_MAX:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, "inline device-to-host rows too large")
        s.check_range(req.src, _rows_span(spitch, width, height))
        out = bytearray(width * height)
        backend.memcpy_2d_dtoh(out, width, req.src, spitch, width, height, _copy_stream(vg, s, req))
        vg.metrics.bytes_copied("d2h", width * height, s.tenant)
        return new("pilot_rep_status"), out
    if kind == lib.PILOT_COPY_D2D:
        s.check_range(req.dst, _rows_span(dpitch, width, height))
        s.check_range(req.src, _rows_span(spitch, width, height))
        backend.memcpy_2d_dtod(req.dst, dpitch, req.src, spitch, width, height,
                               _copy_stream(vg, s, req))
        vg.metrics.bytes_copied("d2d", width * height, s.tenant)
        return None
    raise BackendError(CUDA_ERROR_INVALID_MEMCPY_DIRECTION, f"2D copy kind {kind}")

@OPS.handler(lib.PILOT_OP_MEMSET_2D, "pilot_req_memset_2d")
def memset_2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    width, height = req.width, req.height
    if width == 0 or height == 0:
        return
    pitch = req.pitch if height > 1 else max(req.pitch, width)
    s.check_range(req.ptr, _rows_span(pitch, width, height))
    vg.backend.memset_2d_d8(req.ptr, pitch, req.value & 0xFF, width, height,
                            _copy_stream(vg, s, req))

def _check_on(s: Session, ordinal: int, ptr: int, count: int) -> None:
    part = s if ordinal == s.ordinal else (s.group.part(ordinal) if s.group else None)
    ok = part is not None and (part.check_range(ptr, count) is None if part is s
                               else owns_range(part, ptr, count))
    if not ok:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"[{ptr:#x}, +{count}) is not memory of this session on device {ordinal}")

@OPS.handler(lib.PILOT_OP_MEMCPY_PEER, "pilot_req_memcpy_peer", synchronizing=True)
def memcpy_peer(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cudaMemcpyPeer(Async) and device-to-device copies between devices, issued on a stream of
    the device the call went to (the shim has already serialized a synchronous one with the
    other devices' work)."""
    if req.count == 0:
        return
    _check_on(s, req.dst_device, req.dst, req.count)
    _check_on(s, req.src_device, req.src, req.count)
    dst_dev = backend_device(vg, s, req.dst_device)
    src_dev = backend_device(vg, s, req.src_device)
    stream = streams.stream_for_work(vg, s, req.stream)
    vg.backend.memcpy_peer(req.dst, dst_dev, req.src, src_dev, req.count, stream)
    if req.sync:
        vg.backend.stream_synchronize(stream)
    vg.metrics.bytes_copied("d2d", req.count, s.tenant)
