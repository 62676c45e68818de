"""Stream management (chapter 6.5): streams, waits on events, host callbacks."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_SUPPORTED,
    BackendError,
)
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import lib, new
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.callbacks import HOST_FUNC, STREAM_CALLBACK
from pilot.daemon.scheduling.streams import STREAM_NON_BLOCKING
from pilot.daemon.sessions.devices import any_event
from pilot.daemon.sessions.session import Session, StreamState

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("streams")




@OPS.handler(lib.PILOT_OP_STREAM_CREATE, "pilot_req_stream_create")
def stream_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    # Every daemon stream is non-blocking towards CUDA's real null stream, which no tenant uses;
    # the program's blocking semantics are kept by streams.py.
    obj = streams.session_stream(vg, s, STREAM_NON_BLOCKING, req.priority)
    handle = s.new_handle()
    s.streams[handle] = StreamState(obj, blocking=not (req.flags & STREAM_NON_BLOCKING))
    return u64(handle)

@OPS.handler(lib.PILOT_OP_STREAM_DESTROY, "pilot_req_handle")
def stream_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    st = s.stream(req.handle)
    with vg.preempt.streams_going(s) if vg.preempt is not None else nullcontext():
        del s.streams[req.handle]
        s.dirty_blocking.pop(req.handle, None)
        if vg.fast is not None:
            vg.fast.stream_gone(s, req.handle)
        if st.join_event is not None:
            vg.backend.event_destroy(st.join_event)
        vg.backend.stream_destroy(st.obj)

@OPS.handler(lib.PILOT_OP_STREAM_SYNCHRONIZE, "pilot_req_handle", synchronizing=True)
def stream_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    if req.handle == 0:
        streams.join_blocking_into_legacy(vg, s)
        vg.backend.stream_synchronize(s.legacy or vg.stream)
    else:
        st = s.stream(req.handle)
        vg.backend.stream_synchronize(st.obj)

@OPS.handler(lib.PILOT_OP_STREAM_QUERY, "pilot_req_handle")
def stream_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    obj = (s.legacy or vg.stream) if req.handle == 0 else s.stream(req.handle).obj
    if not vg.backend.stream_query(obj):
        raise BackendError(CUDA_ERROR_NOT_READY)

@OPS.handler(lib.PILOT_OP_STREAM_WAIT_EVENT, "pilot_req_stream_wait_event")
def stream_wait_event(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = any_event(s, req.event)  # may be another device's
    vg.backend.stream_wait_event(streams.stream_for_work(vg, s, req.stream), ev)

@OPS.handler(lib.PILOT_OP_STREAM_GET_INFO, "pilot_req_handle")
def stream_get_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Flags as the program created the stream (every daemon stream is non-blocking towards
    CUDA's null stream; `blocking` is what the program asked for); priority as clamped."""
    st = s.stream(req.handle)
    rep = new("pilot_rep_stream_info")
    rep.flags = 0 if st.blocking else STREAM_NON_BLOCKING
    rep.priority = vg.backend.stream_priority(st.obj)
    return rep

@OPS.handler(lib.PILOT_OP_STREAM_CALLBACK, "pilot_req_stream_callback")
def stream_callback(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cudaLaunchHostFunc / cudaStreamAddCallback: a gate on the program's stream."""
    hub = vg.callbacks
    if hub is None:
        raise BackendError(CUDA_ERROR_NOT_SUPPORTED, "host callbacks need the callback hub")
    if req.kind not in (HOST_FUNC, STREAM_CALLBACK):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"callback kind {req.kind}")
    if req.stream == 0:
        streams.own_legacy(vg, s)
    hub.arm(vg, s, req.id, req.kind, streams.stream_for_work(vg, s, req.stream))
