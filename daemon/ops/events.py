"""Event management (chapter 6.6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_NOT_READY,
    EVENT_INTERPROCESS,
    BackendError,
)
from pilot.daemon.ops.ipc import destroy_event
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import lib, new
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("events")


@OPS.handler(lib.PILOT_OP_EVENT_CREATE, "pilot_req_event_create")
def event_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    handle = s.new_handle()
    s.events[handle] = vg.backend.event_create(req.flags)
    if req.flags & EVENT_INTERPROCESS:
        s.ipc_events.add(handle)  # cudaIpcGetEventHandle may name it (ops/ipc.py)
    return u64(handle)

@OPS.handler(lib.PILOT_OP_EVENT_RECORD, "pilot_req_event_record")
def event_record(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = s.event(req.event)
    vg.backend.event_record(ev, streams.stream_for_work(vg, s, req.stream))

@OPS.handler(lib.PILOT_OP_EVENT_SYNCHRONIZE, "pilot_req_handle", synchronizing=True)
def event_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    vg.backend.event_synchronize(s.event(req.handle))

@OPS.handler(lib.PILOT_OP_EVENT_QUERY, "pilot_req_handle")
def event_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    if not vg.backend.event_query(s.event(req.handle)):
        raise BackendError(CUDA_ERROR_NOT_READY)

@OPS.handler(lib.PILOT_OP_EVENT_ELAPSED, "pilot_req_event_elapsed")
def event_elapsed(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_elapsed")
    rep.ms = vg.backend.event_elapsed_ms(s.event(req.start), s.event(req.end))
    return rep

@OPS.handler(lib.PILOT_OP_EVENT_DESTROY, "pilot_req_handle")
def event_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.event(req.handle)  # raises for an unknown handle
    destroy_event(vg, s, req.handle)
