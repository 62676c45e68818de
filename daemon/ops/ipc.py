"""CUDA IPC (chapter 6.11's cudaIpc* calls) between the processes of one tenant: the handlers,
and what a session's free and end do to the memory and events it exported or opened. The
registry and its rules: resources/ipc.py."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
)
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.resources.ipc import IpcRefused, Owner, Released
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.launch import allocation_at
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.ipc")
OPS = OpTable("ipc")

# What CUDA answers for a handle opened in the process that made it: CUDA_ERROR_INVALID_CONTEXT,
# which the runtime reports as cudaErrorDeviceUninitialized (both 201).
CUDA_ERROR_INVALID_CONTEXT = 201
LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess, the one flag cudaIpcOpenMemHandle takes


def _owner(vg: VGpu, s: Session) -> Owner:
    return Owner(s.tenant, vg.device, s.partition, s.creds.pid)


def _handle_reply(handle: bytes) -> Any:
    rep = new("pilot_rep_ipc_handle")
    ffi.memmove(rep.handle, handle, len(handle))
    return rep


def _refused(exc: IpcRefused, s: Session, what: str) -> BackendError:
    log.info("session %d: %s refused: %s", s.id, what, exc)
    return BackendError(CUDA_ERROR_INVALID_CONTEXT if exc.same_process else CUDA_ERROR_INVALID_VALUE,
                        f"{what}: {exc}")


@OPS.handler(lib.PILOT_OP_IPC_MEM_EXPORT, "pilot_req_free")
def mem_export(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """cudaIpcGetMemHandle: the handle of the device allocation holding ptr (its base's)."""
    r = allocation_at(s, req.ptr)
    if r is None or r.kind not in ("device", "pitch"):  # not managed memory, nor pinned host memory
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{req.ptr:#x} is not in a device allocation "
                           "of this session")
    handle = vg.broker.ipc.export_memory(s.id, _owner(vg, s), r.ptr, r.size,
                                         zero=not s.holds_managed(r.ptr))
    return _handle_reply(handle)


@OPS.handler(lib.PILOT_OP_IPC_MEM_OPEN, "pilot_req_ipc_open")
def mem_open(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """cudaIpcOpenMemHandle: the exported allocation's base and size; the range becomes memory
    of this session for every check."""
    if req.flags & ~LAZY_ENABLE_PEER_ACCESS:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"cudaIpcOpenMemHandle flags {req.flags:#x}")
    try:
        base, size, first = vg.broker.ipc.open_memory(s.id, _owner(vg, s), ffi.buffer(req.handle)[:])
    except IpcRefused as exc:
        raise _refused(exc, s, "cudaIpcOpenMemHandle") from None
    if first:
        s.add_import(base, size)
    return u64(base, size)


@OPS.handler(lib.PILOT_OP_IPC_MEM_CLOSE, "pilot_req_free")
def mem_close(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """cudaIpcCloseMemHandle: one open of the range ends; the last one waits for the session's
    work (which may still use it), and frees the memory if its exporter already let go."""
    if req.ptr not in s.imports:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{req.ptr:#x} was not opened through IPC")
    ipc = vg.broker.ipc
    if ipc.opens(s.id, req.ptr) == 1:
        streams.synchronize_session(vg, s)
    left, released = ipc.close_memory(s.id, req.ptr)
    if not left:
        s.remove_import(req.ptr)
    if released is not None:
        _free_released(vg, released)
    return u64(left)


@OPS.handler(lib.PILOT_OP_IPC_EVENT_EXPORT, "pilot_req_handle")
def event_export(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """cudaIpcGetEventHandle: only for an event made with cudaEventInterprocess."""
    ev = s.event(req.handle)
    if req.handle not in s.ipc_events:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE,
                           "the event was not created with cudaEventInterprocess")
    return _handle_reply(vg.broker.ipc.export_event(s.id, req.handle, _owner(vg, s), ev))


@OPS.handler(lib.PILOT_OP_IPC_EVENT_OPEN, "pilot_req_ipc_open")
def event_open(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """cudaIpcOpenEventHandle: a new event handle of this session naming the exporter's event."""
    handle = s.new_handle()
    try:
        ev = vg.broker.ipc.open_event(s.id, handle, _owner(vg, s), ffi.buffer(req.handle)[:])
    except IpcRefused as exc:
        raise _refused(exc, s, "cudaIpcOpenEventHandle") from None
    s.events[handle] = ev
    s.ipc_events.add(handle)
    return u64(handle)


def destroy_event(vg: VGpu, s: Session, handle: int) -> None:
    """cudaEventDestroy of one of the session's events (known to exist): the driver's event goes
    with the last handle naming it."""
    ev = s.events.pop(handle)
    s.ipc_events.discard(handle)
    ipc = vg.broker.ipc
    if not ipc.is_shared_event(s.id, handle) or ipc.release_event(s.id, handle):
        vg.backend.event_destroy(ev)


def exporter_frees(vg: VGpu, s: Session, ptr: int) -> bool:
    """The session frees its allocation at ptr, its work done. True: importers still hold the
    memory, so the allocation has left the session (refunded to it, charged to the tenant until
    the last importer lets go) and the caller frees nothing."""
    ipc = vg.broker.ipc
    kind, size = s.allocation_kind(ptr), s.allocations[ptr]
    charge = vg.broker.held_charge(s, kind, size)
    if not ipc.exporter_lets_go(s.id, ptr, charge):
        return False
    s.drop_shadow(ptr)
    s.remove_allocation(ptr)
    vg.broker.keep_for_importers(s, charge, ptr)
    log.info("session %d: freed %#x (%d bytes), kept for the processes that opened it through IPC",
             s.id, ptr, size, extra={"session": s.id, "tenant": s.tenant})
    return True


def session_ends(vg: VGpu, s: Session) -> None:
    """Before the session's release (VGpu._release): its exports with importers are kept for
    them, the grants it held end (freeing what their exporters let go of), and its handles of
    shared events are dropped. Its work is waited for first, as its release would."""
    ipc = vg.broker.ipc
    exported, shared = ipc.exported_bases(s.id), ipc.shared_event_handles(s.id)
    if not (exported or s.imports or shared):
        return
    try:
        streams.synchronize_session(vg, s)
    except BackendError as exc:  # a faulted context: nothing runs any more either way
        log.warning("session %d: waiting for its work before IPC release: %s", s.id, exc)
    for base in exported:
        if base in s.allocations:
            exporter_frees(vg, s, base)
    for base in list(s.imports):
        s.remove_import(base)
    for released in ipc.drop_importer(s.id):
        _free_released(vg, released)
    for handle in shared:
        if handle in s.events:
            destroy_event(vg, s, handle)


def _free_released(vg: VGpu, r: Released) -> None:
    """Memory whose exporter and importers have all let go: zeroed, freed, its charge ended.
    Every session that used it has finished its work with it."""
    try:
        if r.zero and r.size:
            vg.quarantine.free_later(r.base, r.size, vg.stream)
        else:
            vg.backend.mem_free(r.base)
    finally:
        if r.charge is not None:
            vg.broker.settle(r.charge)
    log.info("freed %#x (%d bytes) exported through IPC: its last importer let go", r.base, r.size)
