"""CUDA's legacy default stream rebuilt with events (daemon/streams.py), checked against a
backend that records what it is asked to do: the sim backend runs everything at once, so only
the issued waits can show that the ordering is right."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Credentials, Session, StreamState


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []
        self.n = 0

    def event_create(self, flags: int) -> str:
        self.n += 1
        return f"ev{self.n}"

    def event_record(self, event: Any, stream: Any) -> None:
        self.calls.append(("record", event, stream))

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.calls.append(("wait", stream, event))

    def stream_synchronize(self, stream: Any) -> None:
        self.calls.append(("sync", stream, None))


def setup() -> tuple[Any, Session, Recorder]:
    rec = Recorder()
    vg = SimpleNamespace(backend=rec, stream="legacy")
    s = Session(id=1, creds=Credentials(0, 0, 1), vgpu=0, device=0)
    s.streams[0x10] = StreamState("blocking", blocking=True)
    s.streams[0x11] = StreamState("nonblocking", blocking=False)
    return vg, s, rec


def test_blocking_stream_waits_for_earlier_legacy_work():
    vg, s, rec = setup()
    assert streams.stream_for_work(vg, s, 0) == "legacy"
    assert streams.stream_for_work(vg, s, 0x10) == "blocking"
    record = [c for c in rec.calls if c[0] == "record"]
    assert record and record[-1][2] == "legacy"
    assert ("wait", "blocking", record[-1][1]) in rec.calls


def test_legacy_work_waits_for_earlier_blocking_work_once():
    vg, s, rec = setup()
    streams.stream_for_work(vg, s, 0x10)  # work on the blocking stream
    rec.calls.clear()
    streams.stream_for_work(vg, s, 0)  # legacy work must wait for it
    assert rec.calls[0][0] == "record" and rec.calls[0][2] == "blocking"
    assert rec.calls[1] == ("wait", "legacy", rec.calls[0][1])
    rec.calls.clear()
    streams.stream_for_work(vg, s, 0)  # nothing new on the blocking stream: no second join
    assert rec.calls == []


def test_non_blocking_streams_never_synchronize_with_legacy():
    vg, s, rec = setup()
    streams.stream_for_work(vg, s, 0)
    streams.stream_for_work(vg, s, 0x11)
    streams.stream_for_work(vg, s, 0)
    assert rec.calls == []


def test_blocking_stream_joins_only_after_new_legacy_work():
    vg, s, rec = setup()
    streams.stream_for_work(vg, s, 0)
    streams.stream_for_work(vg, s, 0x10)
    rec.calls.clear()
    streams.stream_for_work(vg, s, 0x10)  # no legacy work in between
    assert rec.calls == []


def test_device_synchronize_covers_every_stream_and_clears_joins():
    vg, s, rec = setup()
    streams.stream_for_work(vg, s, 0x10)
    rec.calls.clear()
    streams.synchronize_session(vg, s)
    synced = {c[1] for c in rec.calls if c[0] == "sync"}
    assert synced == {"blocking", "nonblocking", "legacy"}
    assert not s.dirty_blocking


def test_every_call_that_waits_for_streams_is_held_behind_callback_gates() -> None:
    """A handler that synchronizes (itself or through the ops module's helpers) blocks its vGPU
    thread if a gate of the session's callbacks is shut: it must be `synchronizing` or in
    callback_wait.WAITING_OPS, so that the vGPU holds it instead (issue 27, 5)."""
    import inspect
    import re

    from pilot.daemon.ops import handler_table
    from pilot.daemon.scheduling.callback_wait import WAITING_OPS

    waits = re.compile(r"stream_synchronize|event_synchronize|synchronize_session|_printf_flush")
    missing = [spec.fn.__name__ for op, spec in handler_table().items()
               if waits.search(inspect.getsource(spec.fn))
               and not (spec.synchronizing or op in WAITING_OPS)]
    assert missing == []
