"""Pinned and mapped host memory (opcodes 430-449): cudaHostAlloc, cudaMallocHost and
cudaHostRegister ranges, and the copies between them and device memory.

A pinned range is a memfd of the client. The daemon opens it through /proc/<pid>/fd/<n> (the
checks of client_memfd.open_client_memfd), maps it, and registers its
view with the driver, portable and device-mapped (backend.map_host), so
- copies between device memory and the range are DMA from or to the daemon's view, in stream
  order, never over the socket (MEMCPY_PINNED);
- kernels reach it at its device pointer, which is where the client maps the memfd of a
  cudaHostAlloc (so the program's host pointer is the device pointer, as with UVA natively).
Both mappings are the same pages, so the host and the device see each other's writes as they
do natively: no coherence protocol.

A range is known by its address in the client (`base`); `address` is the daemon's view. A
session may only copy to and from its own ranges, which go when it ends. Pinned bytes are host
memory: they are counted per session (`pilot sessions --json`) and charged by the resource broker
against `[pinned] limit_per_tenant` and, over every tenant, `[pinned] limit` (default: half the
host's memory).
"""

from __future__ import annotations

import bisect
import logging
import os
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_MEMCPY_DIRECTION,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    BackendError,
)
from pilot.daemon.ops.memory import note_write
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import lib
from pilot.daemon.resources.client_memfd import open_client_memfd
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.pinned import PAGE, PinnedRange, _libc, _mmap
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("host_memory")

log = logging.getLogger("pilot.pinned")
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
# cudaHostAlloc flags (Portable, Mapped, WriteCombined) and cudaHostRegister flags (Portable,
# Mapped, IoMemory, ReadOnly). Every range is registered portable and device-mapped whatever
# was asked (as UVA makes every pinned allocation natively); the flags are kept for reports.
ALLOC_FLAGS = 0x7
REGISTER_FLAGS = 0xB  # IoMemory (0x4) is refused: a memfd is never I/O memory
KINDS = {lib.PILOT_HOST_ALLOC: "alloc", lib.PILOT_HOST_REGISTERED: "registered"}















def _check_request(req: Any) -> None:
    allowed = ALLOC_FLAGS if req.kind == lib.PILOT_HOST_ALLOC else REGISTER_FLAGS
    if req.kind not in KINDS or req.flags & ~allowed:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"pinned range kind {req.kind} flags {req.flags:#x}")
    if (req.length <= 0 or req.length % PAGE or req.address % PAGE or req.size <= 0
            or req.offset + req.size > req.length):
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"pinned range {req.address:#x}+{req.length} ({req.offset}+{req.size})")
    # A registered range names its address; an allocation names one only when the client could
    # not map it at the device pointers offered (shim/runtime/memory/api_host.c): then that is its address.
    if req.kind == lib.PILOT_HOST_REGISTERED and not req.address:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "a registered range names its address")


def _overlapping(s: Session, base: int, length: int) -> PinnedRange | None:
    i = bisect.bisect_left(s._pinned_bases, base + length) - 1
    r = s.pinned[s._pinned_bases[i]] if i >= 0 else None
    return r if r is not None and r.base + r.length > base else None


@OPS.handler(lib.PILOT_OP_HOST_REGISTER, "pilot_req_host_register")
def host_register(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Map the client's memfd, pin it (portable, device-mapped) and answer where: the daemon's
    view and its device pointer. An allocation's client address is that device pointer (the
    client maps the memfd there, or frees the range and asks again if it cannot)."""
    _check_request(req)
    if req.address and _overlapping(s, req.address, req.length) is not None:
        raise BackendError(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, f"{req.address:#x} is registered")
    call = "cudaHostAlloc" if req.kind == lib.PILOT_HOST_ALLOC else "cudaHostRegister"
    r = vg.broker.allocate(s, "pinned", req.length, lambda: _pin(vg, s, req), call, ptr_of=lambda r: r.base)
    s.add_pinned(r)
    address, device_pointer = r.address, r.device_pointer
    return u64(address, device_pointer)


def _pin(vg: VGpu, s: Session, req: Any) -> PinnedRange:
    """The client's memfd mapped here and registered with the driver, as a range of s (not yet
    added); undone if any step fails."""
    address = 0
    try:
        fd = open_client_memfd(s.creds.pid, s.creds.uid, req.fd, req.length)
        try:
            address = _mmap(fd, req.length, req.address)
        finally:
            os.close(fd)
        vg.backend.map_host(address, req.length)
    except BaseException:
        if address:
            _libc.munmap(address, req.length)
        raise
    device_pointer = vg.backend.host_device_pointer(address)
    r = PinnedRange(req.address or device_pointer, req.length, address, req.offset, req.size,
                    req.flags, KINDS[req.kind], device_pointer)
    if _overlapping(s, r.base, r.length) is not None:  # an allocation's address is in use already
        r.close(vg.backend)
        raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION, f"{r.base:#x} is registered already")
    return r


@OPS.handler(lib.PILOT_OP_HOST_UNREGISTER, "pilot_req_free")
def host_unregister(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cudaFreeHost / cudaHostUnregister: like natively, wait for the session's work first (an
    asynchronous copy may still be reading or writing the range)."""
    r = s.pinned.get(req.ptr)
    if r is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{req.ptr:#x} is no pinned range of this session")
    streams.synchronize_session(vg, s)
    r = s.pop_pinned(req.ptr)
    r.close(vg.backend)
    vg.broker.release(s, "pinned", r.length, r.base)


@OPS.handler(lib.PILOT_OP_MEMCPY_PINNED, "pilot_req_memcpy_pinned", synchronizing=True)
def memcpy_pinned(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """DMA between device memory and the session's pinned range, on the program's stream; a
    synchronous copy returns once it is done."""
    count = req.count
    if req.kind == lib.PILOT_COPY_H2D:
        host, device, direction = req.src, req.dst, "h2d"
    elif req.kind == lib.PILOT_COPY_D2H:
        host, device, direction = req.dst, req.src, "d2h"
    else:
        raise BackendError(CUDA_ERROR_INVALID_MEMCPY_DIRECTION, f"pinned copy kind {req.kind}")
    r, view = s.pinned_view(host, count)
    if r is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"[{host:#x}, +{count}) is no pinned memory of this session")
    s.check_range(device, count)
    stream = streams.stream_for_work(vg, s, req.stream)
    if direction == "h2d":
        note_write(vg, s, device, count, stream)
        vg.backend.memcpy_htod_async(device, view, count, stream)
    else:
        vg.backend.memcpy_dtoh_async(view, device, count, stream)
    if req.sync:
        vg.backend.stream_synchronize(stream)
    r.copies += 1
    r.copied_bytes += count
    vg.metrics.bytes_copied(direction, count, s.tenant)
