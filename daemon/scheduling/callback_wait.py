"""Whether a call would wait, on its vGPU's thread, for a gate of its session's host callbacks.

Only asked while a gate of the session is shut (`Session.callback_gates`, callbacks.py). A call
that would wait is held in the session's backlog instead (waiting.py, `hold_for_callbacks`):
executed, it would block the vGPU thread and every other session of the vGPU for as long as the
client takes to answer its callback (issue 27, 5). A call that would not wait runs at once,
even while a gate is shut elsewhere: a callback may wait for another thread of its program
whose CUDA calls on other streams must go on, as natively (docs/ARCHITECTURE.md, "Waiting while
callbacks are outstanding"). What a call waits for is read from its request:
- a stream synchronize: that stream (stream 0: the session's legacy stream and its blocking
  streams; a blocking stream: the legacy stream too);
- an event synchronize: the event;
- a copy: its stream, if it is a synchronous one (`sync`); an asynchronous one waits for nothing;
- cudaFreeAsync: nothing, unless of managed memory (freed the synchronous way: every stream);
- anything else that waits (device synchronize, cudaFree, module unload...): every stream of
  the session.
It would wait unless everything it waits for is done now (the streams' and event's queries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import BackendError
from pilot.daemon.protocol import ffi, lib

if TYPE_CHECKING:
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

# WAITING_OPS and the `synchronizing` handlers (registry.py) are the calls asked about.
WAITING_OPS = frozenset((lib.PILOT_OP_FREE, lib.PILOT_OP_HOST_UNREGISTER, lib.PILOT_OP_ARRAY_DESTROY,
                         lib.PILOT_OP_SHADOW_FLUSH, lib.PILOT_OP_FREE_ASYNC, lib.PILOT_OP_IPC_MEM_CLOSE))
_FREE_ASYNC = lib.PILOT_OP_FREE_ASYNC
_STREAM_SYNCHRONIZE = lib.PILOT_OP_STREAM_SYNCHRONIZE
_EVENT_SYNCHRONIZE = lib.PILOT_OP_EVENT_SYNCHRONIZE


def fields_of(request: str | None) -> frozenset[str]:
    """The field names of a request struct (none without one)."""
    return frozenset(name for name, _ in ffi.typeof(request).fields) if request else frozenset()


def would_wait(vg: VGpu, s: Session, opcode: int, req: Any, fields: frozenset[str]) -> bool:
    backend = vg.backend
    try:
        if opcode == _EVENT_SYNCHRONIZE:
            return not backend.event_query(s.event(req.handle))
        if opcode == _FREE_ASYNC and not s.holds_managed(req.ptr):
            return False  # queued in stream order (ops/mempool.py): waits for nothing
        if opcode == _STREAM_SYNCHRONIZE:
            streams = _stream_and_joined(vg, s, req.handle)
        elif "stream" in fields and opcode != _FREE_ASYNC:  # managed cudaFreeAsync: every stream
            if "sync" in fields and not req.sync:
                return False
            streams = _stream_and_joined(vg, s, req.stream)
        else:
            streams = [st.obj for st in s.streams.values()] + [s.legacy or vg.stream]
        return not all(backend.stream_query(obj) for obj in streams)
    except BackendError:  # a bad handle: the handler answers it at once
        return False


def _stream_and_joined(vg: VGpu, s: Session, handle: int) -> list[Any]:
    legacy = s.legacy or vg.stream
    if handle == 0:
        return [legacy] + [st.obj for st in s.streams.values() if st.blocking]
    st = s.stream(handle)
    return [st.obj, legacy] if st.blocking else [st.obj]
