"""Priority gating: a session is *gated* while a tenant of a higher priority class
(resources/priorities.py) is active on its GPU; a gated session has at most `[priority]
gated_inflight` pieces of GPU work in flight.

- **Active**: a session of a class above `low` made a call within `[priority] active_window`
  (100 ms). Its calls are noted as they come: in Python by the vGPU's dispatch, in C by the fold
  of what the fast path did (at most 10 ms late). A session that becomes active after an idle
  spell kicks every vGPU of its GPU at once (control command `P`), so lower sessions there are
  gated before their next piece of work.
- **Work**: every call that puts kernels on the GPU: launches (LAUNCH, LAUNCH_EX: `<<<>>>`,
  cudaLaunchKernel[Ex], cooperative), cuBLAS / cuBLASLt / cuDNN calls, memsets, and launches of
  executable graphs pilotd instantiated (ops/graphs.py: a whole graph is one piece); a graph the
  shim replays reaches pilotd as those posted calls, so it is gated node by node.
  Copies use the copy engines, not SMs, and are not gated.
- **The gate**: a gated session's work goes to Python (the vGPU tells C the session does not
  qualify for the fast path: `FastLaunches.update`, pilot_fast_session's `enabled` 0). Each
  piece of work is admitted while fewer than `gated_inflight` of the session's earlier pieces
  are unfinished (an event recorded after each admitted piece, on its stream, queried); else the
  call is held, and so are the session's later calls (in order, as behind a waiting launch:
  scheduling/waiting.py), until one finishes or the session is no longer gated. A helper thread
  of the vGPU (`gate-N`, GateWaker) waits for the oldest unfinished piece of the first held
  session and wakes the vGPU (control command `P`) when it ends; the vGPU also looks every
  GATE_WAKE_MS while a session is held. What a higher tenant waits for is therefore at
  most `gated_inflight` kernels of each lower session: with kernels of at most D seconds, about
  gated_inflight x D once the gate applies.
- A session of the highest class active on its GPU is never gated and never held by the gate:
  its launches go to the GPU as they come (the fast path stays on for it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import EVENT_DISABLE_TIMING, BackendError
from pilot.daemon.protocol import lib
from pilot.daemon.resources.priorities import LEVELS, NAMES, PriorityStore
from pilot.daemon.telemetry.thread_names import NamedThread

if TYPE_CHECKING:
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.scheduling")

GATE_WAKE_MS = 1  # how often a vGPU with calls held at the gate looks again
TOP_CACHE_S = 0.001  # how long a GPU's highest active class is reused
LOW, NORMAL, HIGH = LEVELS["low"], LEVELS["normal"], LEVELS["high"]


def _stream(req: Any) -> int:
    return req.stream


# The calls that put kernels on the GPU, and where each names its (program) stream.
GATED_OPS: dict[int, Callable[[Any], int]] = {
    lib.PILOT_OP_LAUNCH: _stream,
    lib.PILOT_OP_LAUNCH_EX: lambda req: req.launch.stream,
    lib.PILOT_OP_BLAS_GEMM: _stream,
    lib.PILOT_OP_BLASLT_MATMUL: _stream,
    lib.PILOT_OP_BLAS_CALL: _stream,
    lib.PILOT_OP_DNN_EXECUTE: _stream,
    lib.PILOT_OP_DNN_BATCHNORM: _stream,
    lib.PILOT_OP_MEMSET: _stream,
    lib.PILOT_OP_MEMSET_WIDE: _stream,
    lib.PILOT_OP_MEMSET_2D: _stream,
    lib.PILOT_OP_GRAPH_LAUNCH: _stream,
}


class PriorityBoard:
    """One per daemon, read by every vGPU thread: which class is active on each GPU."""

    def __init__(self, store: PriorityStore | None, vgpus: list[Any], active_window: float = 0.1,
                 inflight: int = 2, force: bool = False) -> None:
        """store None: every session is normal, no gate (a vGPU before the Daemon gives it
        the daemon's board). force: every session below high is gated ([priority]
        preempt_chaos, a test setting)."""
        self.store = store
        self.vgpus = vgpus  # the daemon's list (it grows with new vGPUs)
        self.active_window = active_window
        self.inflight = inflight
        self.force = force
        self.enabled = force or (store is not None and not store.uniform())
        self._top: dict[int, tuple[float, int]] = {}  # gpu -> (when computed, class level)

    def place(self, s: Session) -> None:
        """A new session (part): its class (router thread, before the client attaches)."""
        s.priority = self.store.level(s.tenant) if self.store is not None else NORMAL
        s.signals = self.enabled and s.priority > LOW

    def refresh(self) -> None:
        """The classes changed (pilotctl, SIGHUP): every live session's class again, and every
        vGPU looks at its gates."""
        self.enabled = self.force or (self.store is not None and not self.store.uniform())
        for vg in list(self.vgpus):
            for s in list(vg.sessions.values()):
                self.place(s)
        self._top.clear()
        for vg in list(self.vgpus):
            _kick(vg)

    def top_active(self, gpu: int, now: float) -> int:
        """The highest class of a session active on `gpu` now (-1: none)."""
        cached = self._top.get(gpu)
        if cached is not None and now - cached[0] < TOP_CACHE_S:
            return cached[1]
        since = now - self.active_window
        top = -1
        for vg in list(self.vgpus):
            if vg.gpu == gpu:
                for s in list(vg.sessions.values()):
                    if s.priority > top and s.last_call >= since:
                        top = s.priority
        self._top[gpu] = (now, top)
        return top

    def gated(self, s: Session, now: float) -> bool:
        if self.force and s.priority < HIGH:
            return True
        return self.enabled and s.priority < self.top_active(s.device, now)

    def touched(self, s: Session, now: float) -> None:
        """A session of a class above low made a call (any vGPU thread). After an idle spell,
        and above what its GPU had active, the GPU's vGPUs look at their gates at once."""
        idle = now - s.last_call > self.active_window
        s.last_call = now
        if idle:
            cached = self._top.get(s.device)
            if cached is None or cached[1] < s.priority:
                self._top.pop(s.device, None)
                for vg in list(self.vgpus):
                    if vg.gpu == s.device:
                        _kick(vg)

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        gpus = sorted({vg.gpu for vg in list(self.vgpus)})
        return {"enabled": self.enabled, "forced": self.force, "gated_inflight": self.inflight,
                "active_window_s": self.active_window,
                "tenants": self.store.list() if self.store is not None else {},
                "active": {str(g): NAMES.get(self.top_active(g, now)) for g in gpus}}


def _kick(vg: Any) -> None:
    try:
        vg.send_control(b"P")
    except (BlockingIOError, OSError):  # the pipe is full of wake-ups already, or closed
        pass


class GateWaker:
    """A vGPU's helper thread (`gate-N`, started at the first hold): it synchronizes the event
    the vGPU names (`watch`) and then wakes the vGPU, so a held session goes on within tens of
    microseconds of its piece's end rather than at the vGPU's next look. It makes no other
    call; an event recorded again meanwhile only makes it late (the vGPU still looks)."""

    def __init__(self, vg: VGpu) -> None:
        self.vg = vg
        self._cond = threading.Condition()
        self._event: Any = None
        self._stop = False
        self._thread: threading.Thread | None = None

    def watch(self, event: Any) -> None:
        with self._cond:
            if self._stop or event is self._event:
                return
            self._event = event
            self._cond.notify()
            if self._thread is None:
                self._thread = NamedThread(target=self._run, name=f"gate-{self.vg.index}",
                                           daemon=True)
                self._thread.start()

    def _run(self) -> None:
        vg = self.vg
        try:
            vg.backend.bind_thread(vg.device)
        except Exception:
            log.exception("gate-%d: cannot bind to the device; the vGPU's looks remain", vg.index)
            return
        while True:
            with self._cond:
                while self._event is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                event = self._event
            try:
                vg.backend.event_synchronize(event)  # the GIL is released meanwhile
            except Exception:
                pass  # a failed kernel's event, or one destroyed: the vGPU looks anyway
            with self._cond:
                if self._event is event:
                    self._event = None
            _kick(vg)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(1)


class SessionGate:
    """One per vGPU, owned by its thread: the gated sessions' work in flight and held calls."""

    def __init__(self, vg: VGpu, board: PriorityBoard) -> None:
        self.vg = vg
        self.board = board
        self.waker = GateWaker(vg)
        self.held: list[Session] = []  # sessions with calls held at the gate
        self.gated = 0  # sessions of this vGPU gated now
        # recorded events no longer in flight, by SM partition (an event is recorded only on
        # streams of its own context): id(partition), 0 for the whole GPU
        self._free: dict[int, list[Any]] = {}

    def admit(self, s: Session) -> bool:
        """Whether one more piece of s's work may go to the GPU now. Always while one of s's
        host callbacks is pending: its unfinished pieces may be queued behind that callback,
        which may wait for what the program's other threads do next (as native CUDA never
        makes an asynchronous call wait for the GPU, holding those calls could deadlock the
        program; seen with ptds.cu under preempt_chaos). The bound is off until the callback
        returned; a lower tenant's kernels still retreat under [priority] preempt."""
        events = s.gate_events
        query = self.vg.backend.event_query
        while events:
            try:
                done = query(events[0])
            except BackendError:
                done = True  # a failed kernel is finished too
            if not done:
                break
            self._pool(s).append(events.popleft())
        return len(events) < self.board.inflight or s.callback_gates > 0

    def issued(self, s: Session, opcode: int, req: Any) -> None:
        """An admitted piece of work went to its stream: an event after it."""
        token = GATED_OPS[opcode](req)
        st = s.streams.get(token) if token else None
        self._record(s, st.obj if st is not None else s.legacy or self.vg.stream)

    def _mark(self, s: Session) -> None:
        """The session has just become gated: what it already has on each of its streams
        counts as one piece of work in flight there (in C, the fast path did not count it)."""
        self._record(s, s.legacy or self.vg.stream)
        for st in list(s.streams.values()):
            self._record(s, st.obj)

    def _record(self, s: Session, stream: Any) -> None:
        backend = self.vg.backend
        pool = self._pool(s)
        ev = pool.pop() if pool else backend.event_create(EVENT_DISABLE_TIMING)
        try:
            backend.event_record(ev, stream)
        except BackendError:
            pool.append(ev)
            return
        s.gate_events.append(ev)

    def _pool(self, s: Session) -> list[Any]:
        key = 0 if s.partition is None else id(s.partition)
        pool = self._free.get(key)
        if pool is None:
            pool = self._free[key] = []
        return pool

    def hold(self, s: Session, msg: Any, held_before: bool) -> bool:
        """Hold a gated piece of work (and, from now on, the session's later calls). A call
        replayed from the backlog goes back to its front. False: the session held too much."""
        if held_before:
            s.backlog.appendleft(msg)
            s.backlog_bytes += msg.size
        elif not self.vg.waits.hold(s, msg):
            return False
        if not s.gate_held:
            s.gate_held = time.monotonic()
            self.held.append(s)
            self.vg.metrics.count("priority_gate_holds", (s.tenant, NAMES[s.priority]))
        self._watch()
        return True

    def _watch(self) -> None:
        """The waker waits for the oldest unfinished piece of the first held session."""
        for s in self.held:
            if s.gate_events:
                self.waker.watch(s.gate_events[0])
                return

    def poll(self) -> None:
        """Every session's gate again; release held sessions that may go on (vGPU thread)."""
        board = self.board
        now = time.monotonic()
        fast = self.vg.fast
        preempt = self.vg.preempt
        gated = 0
        changed = False
        for s in list(self.vg.sessions.values()):
            g = board.gated(s, now)
            gated += g
            if preempt is not None:  # whether its launches raise lower classes' retreat words
                preempt.update(s, fast)
            if g != s.gated:
                s.gated = g
                changed = True
                if g:
                    self.vg.enter(s)  # its events go in its SM partition's context
                    self._mark(s)
                if fast is not None:
                    fast.update(s)
        if changed and preempt is not None:
            preempt.arm()  # the retreat words this vGPU's gated sessions need armed
        self.gated = gated
        for s in list(self.held):
            if s.gated and not self.admit(s):
                continue
            self.held.remove(s)
            waited, s.gate_held = now - s.gate_held, 0.0
            self.vg.metrics.count("priority_gate_wait_seconds", (s.tenant, NAMES[s.priority]), waited)
            self.vg.waits.replay(s)
            if s.gate_held and s not in self.held:
                self.held.append(s)
        if self.held:
            self._watch()

    def forget(self, s: Session) -> None:
        """The session ends (its work was synchronized): its events back to the pool."""
        if s in self.held:
            self.held.remove(s)
        s.gate_held = 0.0
        if s.partition is None:
            self._pool(s).extend(s.gate_events)
        else:  # its partition may go with it
            self._destroy([*s.gate_events, *self._free.pop(id(s.partition), [])])
        s.gate_events.clear()

    def close(self) -> None:
        self.waker.close()
        self._destroy([ev for pool in self._free.values() for ev in pool])
        self._free = {}

    def _destroy(self, events: list[Any]) -> None:
        for ev in events:
            try:
                self.vg.backend.event_destroy(ev)
            except Exception:
                pass


def new_events() -> deque[Any]:
    return deque()
