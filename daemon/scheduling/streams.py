"""CUDA's legacy default stream, kept per session on top of non-blocking daemon streams.

The daemon never uses CUDA's real null stream (it is shared by the whole context, so every
tenant would wait on every other). Instead stream 0 of a session is its vGPU's stream, and the
implicit ordering of the legacy stream is rebuilt with events:
- work on stream 0 first waits for the work already issued on the session's blocking streams;
- work on a blocking stream first waits for the work already issued on stream 0.
Each join costs an event record and a stream wait, and only happens when work alternates.

A session whose legacy stream carries a host callback gets a legacy stream of its own
(`own_legacy`), so that the gate behind its callback (callbacks.py) never holds up other
tenants' work on the shared vGPU stream. A session of the high priority class (priority.py)
gets its legacy stream at the device's greatest stream priority: when SMs free up, the GPU
starts its pending blocks before those of other tenants' streams (it preempts nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import EVENT_DISABLE_TIMING
from pilot.daemon.config import PRIORITIES
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

STREAM_NON_BLOCKING = 1
HIGH = PRIORITIES.index("high")


def session_stream(vg: VGpu, s: Session, flags: int, priority: int) -> Any:
    """A new stream of the session: in its SM partition when it has one (compute shares)."""
    if s.partition is None:
        return vg.backend.stream_create(flags, priority)
    return vg.backend.partition_stream_create(s.partition, flags, priority)


def own_legacy(vg: VGpu, s: Session) -> Any:
    """Give the session a legacy stream of its own (once), ordered after the work it already
    issued on the shared one."""
    if s.legacy is None:
        backend = vg.backend
        priority = backend.stream_priority_range()[1] if s.priority >= HIGH else 0
        own = session_stream(vg, s, STREAM_NON_BLOCKING, priority)
        if s.partition is not None:
            # Its stream is in its SM partition's context (made at attach, before any work, so
            # nothing on the vGPU stream to order after); no event of its crosses contexts.
            s.legacy = own
            return own
        if s.legacy_event is None:
            s.legacy_event = backend.event_create(EVENT_DISABLE_TIMING)
        backend.event_record(s.legacy_event, vg.stream)
        backend.stream_wait_event(own, s.legacy_event)
        s.legacy = own
    return s.legacy


def join_blocking_into_legacy(vg: VGpu, s: Session) -> None:
    if not s.dirty_blocking:
        return
    backend = vg.backend
    for st in s.dirty_blocking.values():
        if st.join_event is None:
            st.join_event = backend.event_create(EVENT_DISABLE_TIMING)
        backend.event_record(st.join_event, st.obj)
        backend.stream_wait_event(s.legacy or vg.stream, st.join_event)
    s.dirty_blocking.clear()


def stream_for_work(vg: VGpu, s: Session, handle: int) -> Any:
    """The backend stream on which to issue work for a program stream handle."""
    if handle == 0:
        if s.dirty_blocking:
            join_blocking_into_legacy(vg, s)
        s.legacy_gen += 1
        return s.legacy or vg.stream
    st = s.stream(handle)
    if st.blocking:
        if st.seen_legacy_gen != s.legacy_gen:
            backend = vg.backend
            if s.legacy_event is None:
                s.legacy_event = backend.event_create(EVENT_DISABLE_TIMING)
            backend.event_record(s.legacy_event, s.legacy or vg.stream)
            backend.stream_wait_event(st.obj, s.legacy_event)
            st.seen_legacy_gen = s.legacy_gen
        s.dirty_blocking[handle] = st
    return st.obj


def synchronize_session(vg: VGpu, s: Session) -> None:
    """cudaDeviceSynchronize for one session: its streams and its vGPU's stream, not the GPU."""
    for st in s.streams.values():
        vg.backend.stream_synchronize(st.obj)
    s.dirty_blocking.clear()
    vg.backend.stream_synchronize(s.legacy or vg.stream)
