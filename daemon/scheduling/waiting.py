"""Calls that wait: a launch the policy answered WAIT, deferred without blocking the vGPU.

The vGPU thread goes on serving every other session. The waiting session is *held*: its later
calls on its main connection are copied into its backlog in arrival order (its unified-memory
fault channel is never held), so stream order, and program order, are kept. A waiting launch
ends when
- the policy answers RUN: the launch is issued, a caller waiting for a reply gets it, and the
  backlog is replayed until it is empty or another launch waits;
- the policy answers REFUSE, or `[policy] max_wait` passes: the Decision's error becomes the
  launch's error (a posted launch's error is delivered by the next synchronizing call, as
  CUDA's asynchronous errors are), then the backlog is replayed;
- the session ends (process exit, pilotctl kill): the launch and the backlog are dropped with
  the session, which frees everything as any session end does.

The vGPU asks again on every tick of the scheduler thread, after every batch of calls it
served, and whenever the policy host says something was freed or finished.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import BackendError
from pilot.daemon.protocol import ffi
from pilot.daemon.scheduling import launch as launches
from pilot.daemon.scheduling.launch import Launch, WaitForPolicy

if TYPE_CHECKING:
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.scheduling")
MAX_HELD_BYTES = 256 << 20  # per session: calls held behind a waiting launch


class HeldMessage:
    """A copy of a received message (pilot_srv_msg's fields) that outlives the receive buffers."""

    __slots__ = ("_bufs", "conn", "frame", "len", "nframes")

    def __init__(self, msg: Any) -> None:
        self.conn = msg.conn
        self.nframes = min(msg.nframes, 3)
        self._bufs = [bytearray(ffi.buffer(msg.frame[i], msg.len[i])) for i in range(self.nframes)]
        self.frame = [ffi.from_buffer(b) for b in self._bufs]
        self.len = [len(b) for b in self._bufs]

    @property
    def size(self) -> int:
        return sum(self.len)


@dataclass(eq=False)
class Waiting:
    session: Session
    launch: Launch | None  # None: a hold of the policy (Controls.hold_session), no launch
    reply_to: HeldMessage | None  # None: a posted launch (no reply)
    error: int
    reason: str
    since: float = field(default_factory=time.monotonic)
    deadline: float = math.inf
    callbacks: bool = False  # held until the session's callback gates are open, not by the policy


class WaitQueue:
    """The waiting launches of one vGPU, oldest first. Owned by the vGPU thread."""

    def __init__(self, vg: VGpu) -> None:
        self.vg = vg
        self.entries: list[Waiting] = []

    def __bool__(self) -> bool:
        return bool(self.entries)

    def defer(self, s: Session, exc: WaitForPolicy, msg: Any, posted: bool) -> None:
        host = self.vg.policy
        max_wait = host.max_wait if host is not None else 0.0
        exc.launch.args = bytes(exc.launch.args)  # the receive buffer is reused after this call
        w = Waiting(s, exc.launch, None if posted else HeldMessage(msg), exc.error, exc.reason)
        if max_wait > 0:
            w.deadline = w.since + max_wait
        s.waiting = w
        self.entries.append(w)
        self.vg.metrics.admission_wait(s.tenant)

    def gate(self, s: Session, msg: Any) -> bool:
        """The policy holds s (Controls.hold_session): this call, and the later ones, wait in
        its backlog until the policy releases it; no deadline ([policy] max_wait is for
        launches). False as for hold."""
        if not self.hold(s, msg):
            return False
        w = Waiting(s, None, None, 0, s.policy_hold or "held by the policy")
        s.waiting = w
        self.entries.append(w)
        self.vg.metrics.admission_wait(s.tenant)
        return True

    def hold_for_callbacks(self, s: Session, msg: Any) -> bool:
        """A call that waits for s's streams while one of its host callbacks' gates is still
        shut: executed now it would block the vGPU thread, and every other session behind it,
        for as long as the client takes to answer. It waits in s's backlog instead (a replayed
        one at its head, where it came from) and is asked again on every tick and whenever a
        gate of s opens (scheduling/callback_wait.py); nothing of it ran yet. Only s waits, as
        natively its thread would. False as for hold."""
        if isinstance(msg, HeldMessage):  # replayed and held again: it stays first
            s.backlog.appendleft(msg)
            s.backlog_bytes += msg.size
        elif not self.hold(s, msg):
            return False
        w = Waiting(s, None, None, 0, "behind its host callback", callbacks=True)
        s.waiting = w
        self.entries.append(w)
        return True

    def hold(self, s: Session, msg: Any) -> bool:
        """Queue one of s's calls behind its waiting launch; False (and a log line) once s's held
        calls would take more than MAX_HELD_BYTES of the daemon's memory: a client posting
        without end while it waits must not exhaust pilotd (its session is then ended)."""
        held = HeldMessage(msg)
        if s.backlog_bytes + held.size > MAX_HELD_BYTES:
            log.error("session %d (%s): %d calls (%d bytes) held behind a waiting launch: the "
                      "session is ended", s.id, s.tenant, len(s.backlog), s.backlog_bytes,
                      extra={"session": s.id, "tenant": s.tenant})
            return False
        s.backlog.append(held)
        s.backlog_bytes += held.size
        return True

    def poll(self) -> None:
        """Ask the policy again about every waiting launch: higher priority classes first
        (scheduling/priority.py), oldest first within a class."""
        for w in sorted(self.entries, key=lambda w: -w.session.priority):
            if w.session.waiting is not w:  # released meanwhile
                self._remove(w)
                continue
            if w.callbacks:  # its first held call is held again if it would still wait
                self._remove(w)
                w.session.waiting = None
                self.replay(w.session)
                continue
            if w.launch is None:  # a hold of the policy
                if w.session.policy_hold is None:
                    self._finish(w, 0, "ran")
                continue
            err, outcome = 0, "ran"
            try:
                if time.monotonic() >= w.deadline:
                    err, outcome = w.error, "timeout"
                else:
                    self.vg.enter(w.session)
                    launches.retry(self.vg, w.session, w.launch)
            except WaitForPolicy as again:
                w.error, w.reason = again.error, again.reason
                continue
            except BackendError as exc:
                err, outcome = exc.code, "refused"
            if err and self.vg.policy is not None and w.launch.view is not None:
                self.vg.policy.launch_dropped(w.launch.view, outcome)
            self._finish(w, err, outcome)

    def _finish(self, w: Waiting, err: int, outcome: str) -> None:
        vg, s = self.vg, w.session
        self._remove(w)
        s.waiting = None
        waited = time.monotonic() - w.since
        vg.metrics.count("launch_waits", (self._policy_name(), s.tenant, outcome))
        vg.metrics.count("launch_wait_seconds", (self._policy_name(), s.tenant), waited)
        if w.reply_to is None:
            if err:
                s.note_async_error(err)
        else:
            vg.reply_status(w.reply_to, err, s.sticky)
        self.replay(s)

    def replay(self, s: Session) -> None:
        """Serve the session's held calls in order, until none is left or one waits again."""
        while s.backlog and s.waiting is None and not s.gate_held and s.id in self.vg.sessions:
            held = s.backlog.popleft()
            s.backlog_bytes -= held.size
            self.vg.handle(held)

    def drop(self, s: Session) -> None:
        """The session ends: forget its waiting launch and held calls."""
        w = s.waiting
        if w is not None:
            s.waiting = None
            self._remove(w)
            self.vg.metrics.count("launch_waits", (self._policy_name(), s.tenant, "session_end"))
            if self.vg.policy is not None and w.launch is not None and w.launch.view is not None:
                self.vg.policy.launch_dropped(w.launch.view, "session_end")
        s.backlog.clear()
        s.backlog_bytes = 0

    def _policy_name(self) -> str:
        """The `policy` label of the wait metrics."""
        return self.vg.policy.name if self.vg.policy is not None else "none"

    def _remove(self, w: Waiting) -> None:
        try:
            self.entries.remove(w)
        except ValueError:
            pass

    def describe(self, s: Session) -> dict[str, Any] | None:
        w = s.waiting
        if w is None:
            return None
        kernel = w.launch.info.name if w.launch is not None and w.launch.info else ""
        return {"kernel": kernel, "reason": w.reason,
                "waiting_s": round(time.monotonic() - w.since, 3), "held_calls": len(s.backlog)}


def new_backlog() -> deque[Any]:
    return deque()
