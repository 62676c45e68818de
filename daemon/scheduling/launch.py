"""The one launch path: `<<<>>>`, cudaLaunchKernel, cudaLaunchKernelExC and cooperative launches
(LAUNCH and LAUNCH_EX) all come here.

    resolve the kernel -> check the arguments -> unified-memory accounting -> footprint
    -> ask the policy -> run it now | raise WaitForPolicy (the vGPU defers the call) | refuse

The footprint is the set of the session's allocations (device, managed, pinned) that the
launch's pointer-sized arguments point into: every 8-byte-aligned word of every parameter of 8
bytes or more, which covers plain pointer arguments and pointers inside structs passed by value,
read with the parameter layout the daemon already has (FunctionInfo.params). It is computed only
when the policy asks for it, so the default policy costs the launch nothing.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    CUDA_ERROR_INVALID_VALUE,
    EVENT_DISABLE_TIMING,
    BackendError,
    FunctionInfo,
    LaunchAttrs,
)
from pilot.daemon.scheduling import streams
from pilot.policies import KernelView, LaunchView, RangeView, Verdict, Watch

if TYPE_CHECKING:
    from pilot.daemon.scheduling.policy_host import PolicyHost
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

_WORD = struct.Struct("<Q")


@dataclass(slots=True)
class Launch:
    """One launch as the vGPU received it; the arguments are a copy, so the launch can wait."""

    function: int  # the session's function handle
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    stream: int  # the program's stream handle
    args: bytes | memoryview  # a view of the received message until the launch has to wait
    attrs: LaunchAttrs | None = None  # LAUNCH_EX's attributes
    info: FunctionInfo | None = None
    view: LaunchView | None = None


class WaitForPolicy(Exception):
    """The policy answered WAIT: the vGPU defers this call (and the session's later ones)."""

    def __init__(self, launch: Launch, error: int, reason: str) -> None:
        super().__init__(reason)
        self.launch, self.error, self.reason = launch, error, reason


def resolve(s: Session, function: int, args: bytes | memoryview) -> FunctionInfo:
    info = s.functions.get(function)
    if info is None:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION, f"no function {function:#x}")
    if len(args) != info.arg_bytes:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"kernel arguments: {len(args)} bytes, expected {info.arg_bytes}")
    return info


def footprint(s: Session, params: list[tuple[int, int]], args: bytes) -> tuple[RangeView, ...]:
    """The session's allocations the launch's pointer-sized argument words point into."""
    found: dict[int, RangeView] = {}
    for offset, size in params:
        if size < 8:
            continue
        start = -(-offset // 8) * 8
        for at in range(start, offset + size - 7, 8):
            (word,) = _WORD.unpack_from(args, at)
            if word and word not in found:
                r = allocation_at(s, word)
                if r is not None:
                    found.setdefault(r.ptr, r)
    return tuple(found.values())


def allocation_at(s: Session, ptr: int) -> RangeView | None:
    """The allocation of s (device, managed, or pinned host memory) holding ptr."""
    i = bisect.bisect_right(s._bases, ptr) - 1
    if i >= 0:
        base = s._bases[i]
        size = s.allocations[base]
        if ptr < base + size:
            return RangeView(base, size, s.allocation_kind(base))
    for r in s.pinned.values():
        for start in (r.user, r.device_pointer + r.offset):
            if start <= ptr < start + r.size:
                return RangeView(r.user, r.size, "pinned")
    return None


def movable_footprint(vg: VGpu, s: Session, launch: Launch) -> tuple[RangeView, ...]:
    """The launch's footprint with RangeView.movable set from the capacity enforcer."""
    assert launch.info is not None
    ranges = footprint(s, launch.info.params, launch.args)
    res = vg.broker.residency
    if res is None or s.id not in res.sessions:
        return ranges
    return tuple(RangeView(r.ptr, r.size, r.kind, True) if res.is_movable(s, r.ptr) else r
                 for r in ranges)


def launches_seen_one_by_one(vg: VGpu, per_session: bool = False) -> str:
    """Why every launch on this vGPU must come through Python, one by one ('' if none must): a
    policy that sees launches, or kernel timing. Neither C's fast path nor a CUDA graph in
    pilotd may then launch for it. `per_session` (the fast path): a policy that decides the
    launches of the sessions it watches only (Policy.watches_launches) does not count; C is
    then told per session (vgpu/fast.py). CUDA graphs in pilotd stay off under it: a graph
    made while a session was not watched would launch a whole iteration past the policy once
    it is."""
    host = vg.policy
    if host is not None and (host.needs_kernel_end or host.needs_footprint or (
            host.decides_launches and not (per_session and host.selective))):
        return f"policy {host.name} sees every launch"
    if vg.kernel_time:
        return "[metrics] kernel_time times every kernel"
    return ""


def make_view(vg: VGpu, s: Session, launch: Launch, info: FunctionInfo, host: PolicyHost) -> LaunchView:
    now = time.monotonic()
    return LaunchView(
        id=host.new_launch_id(), session=s.id, tenant=s.tenant, pid=s.creds.pid, gpu=s.device,
        vgpu=vg.index, kernel=info.name, grid=launch.grid, block=launch.block, stream=launch.stream,
        footprint=movable_footprint(vg, s, launch) if host.needs_footprint else (),
        requested_at=now, now=now, attempts=1)


Dim3 = tuple[int, int, int]


def submit(vg: VGpu, s: Session, function: int, grid: Dim3, block: Dim3, shared_bytes: int, stream: int,
           args: bytes | memoryview, attrs: LaunchAttrs | None = None) -> None:
    """A new launch: resolve, account, ask the policy; run it, or raise WaitForPolicy or the
    error of a refusal. This is every launch's hot path: with a policy that does not decide
    launches no view or footprint is built for it."""
    info = resolve(s, function, args)
    if s.shadows:
        s.note_managed_launch(memoryview(args))
    host = vg.policy
    launch = Launch(function, grid, block, shared_bytes, stream, args, attrs, info)
    if host is None or not host.decides_launches or (
            host.selective and host.watches_launches(s.id) is Watch.NONE):
        # a policy that watches sessions one by one and not this one now: as C's fast path
        # would, the launch runs unasked (it is counted in Session.kernels, which the policy
        # reads at the session's next memory event)
        issue(vg, s, launch)
        return
    launch.view = make_view(vg, s, launch, info, host)
    decide(vg, s, launch, host)


def decide(vg: VGpu, s: Session, launch: Launch, host: PolicyHost) -> None:
    """Ask the policy about launch.view; run, refuse, or raise WaitForPolicy."""
    view = launch.view
    assert view is not None
    decision = host.launch_requested(view)
    if decision.verdict is Verdict.RUN:
        issue(vg, s, launch)
        host.launch_started(view)
        return
    if decision.verdict is Verdict.REFUSE:
        raise BackendError(decision.error, f"refused by policy {host.name}: {decision.reason}")
    raise WaitForPolicy(launch, decision.error, decision.reason)


def retry(vg: VGpu, s: Session, launch: Launch) -> None:
    """A waiting launch, asked again (stream order is kept: the session's later calls are
    held behind it by the vGPU's wait queue)."""
    host = vg.policy
    assert host is not None and launch.view is not None
    launch.view = dataclasses.replace(launch.view, now=time.monotonic(), attempts=launch.view.attempts + 1)
    decide(vg, s, launch, host)


def issue(vg: VGpu, s: Session, launch: Launch) -> None:
    """Put the kernel on its stream."""
    info = launch.info
    assert info is not None
    if launch.stream == 0 and not s.dirty_blocking:  # the common case, inlined from stream_for_work
        s.legacy_gen += 1
        stream = s.legacy or streams.own_legacy(vg, s)
    else:
        stream = streams.stream_for_work(vg, s, launch.stream)
    res = vg.broker.residency
    if res is not None and s.id in res.sessions:  # movable memory: room on the GPU first
        host = vg.policy
        ranges = launch.view.footprint if launch.view is not None and host is not None and \
            host.needs_footprint else movable_footprint(vg, s, launch)
        # pending from here until the kernel watch knows the event after the kernel
        touched = res.before_launch(s, [r.ptr for r in ranges if r.movable], stream,
                                    prefetch=host is not None and host.prefetches_footprint)
        try:
            _launch_and_watch(vg, s, launch, info, stream, touched)
        except BaseException:
            res.not_launched(s, touched)
            raise
    else:
        _launch_and_watch(vg, s, launch, info, stream, None)
        fast = vg.fast
        if fast is not None:  # its next launches may run in C (vgpu/fast.py)
            fast.launched(s, launch, stream)


def _launch_and_watch(vg: VGpu, s: Session, launch: Launch, info: FunctionInfo, stream: Any,
                      touched: Any) -> None:
    watch = vg.kernel_watch
    start = watch.start_event(stream) if vg.kernel_time else None  # [metrics] kernel_time
    try:
        if launch.attrs is None:
            # a gated session's kernel (or one a policy made preemptible) as its preemptible
            # variant where it has one
            if not ((s.gated or s.preemptible) and vg.preempt is not None and vg.preempt.launch(
                    s, info, launch.grid, launch.block, launch.shared_bytes, stream, launch.args[:])):
                vg.backend.launch(info.handle, launch.grid, launch.block, launch.shared_bytes, stream,
                                  launch.args[:])
        else:
            vg.backend.launch_ex(info.handle, launch.grid, launch.block, launch.shared_bytes, stream,
                                 launch.args[:], launch.attrs)
    except BaseException:
        if start is not None:
            watch.unused(start)
        raise
    s.work_in_flight = True
    s.kernels += 1
    shard = vg.shard
    shard.kernels += 1
    key = ("tenant_launches", (s.tenant,))
    shard.labeled[key] = shard.labeled.get(key, 0) + 1
    host = vg.policy
    view = launch.view if host is not None and host.needs_kernel_end else None
    if view is not None or touched or start is not None:
        watch.started(s, view, stream, touched, start)


class KernelWatch:
    """Kernel completion, for policies that ask for it (needs_kernel_end), for the capacity
    enforcer (the extents a running kernel uses are active) and for `[metrics] kernel_time` (a
    timing event before the kernel too; at its end the tenant is charged the time between): an
    event recorded after each such launch, polled by the vGPU thread between calls. Kernels of
    one stream finish in order, so a poll queries only the oldest unfinished launch of each
    stream. Costs nothing otherwise."""

    def __init__(self, vg: VGpu) -> None:
        self.vg = vg
        # stream -> (end event, session, view, started, touched, start event or None), oldest first
        self._running: dict[Any, deque[tuple[Any, Session, LaunchView | None, float, Any, Any]]] = {}
        self._free_events: list[Any] = []  # without timing
        self._free_timed: list[Any] = []  # with timing ([metrics] kernel_time)

    def __bool__(self) -> bool:
        return bool(self._running)

    def _event(self, timed: bool) -> Any:
        pool = self._free_timed if timed else self._free_events
        return pool.pop() if pool else self.vg.backend.event_create(0 if timed else EVENT_DISABLE_TIMING)

    def start_event(self, stream: Any) -> Any:
        """A timing event recorded on `stream` now, before a kernel (pass it to started)."""
        ev = self._event(True)
        self.vg.backend.event_record(ev, stream)
        return ev

    def unused(self, event: Any) -> None:
        """A start event whose launch failed."""
        self._free_timed.append(event)

    def started(self, s: Session, view: LaunchView | None, stream: Any, touched: Any = None,
                start: Any = None) -> None:
        """`view`: tell the policy when it finishes; `touched`: the enforcer's extents; `start`:
        the timing event before the kernel (charge its time to the tenant)."""
        ev = self._event(start is not None)
        self.vg.backend.event_record(ev, stream)
        if touched:
            res = self.vg.broker.residency
            if res is not None:
                res.launched(s, touched, ev)
        queue = self._running.get(stream)
        if queue is None:
            queue = self._running[stream] = deque()
        queue.append((ev, s, view, time.monotonic(), touched, start))

    def poll(self) -> None:
        """Report the kernels that finished, in launch order per stream."""
        if not self._running:
            return
        backend = self.vg.backend
        for stream, queue in list(self._running.items()):
            while queue:
                entry = queue[0]
                try:
                    done = backend.event_query(entry[0])
                except BackendError:
                    done = True  # a failed kernel is finished too
                if not done:
                    break
                queue.popleft()
                self._finished(entry)
            if not queue:
                del self._running[stream]

    def _finished(self, entry: tuple[Any, Session, LaunchView | None, float, Any, Any]) -> None:
        ev, s, view, started, touched, start = entry
        if start is not None:
            try:
                seconds = self.vg.backend.event_elapsed_ms(start, ev) / 1e3
            except BackendError:
                seconds = 0.0  # a failed kernel, or one ended with its session: not charged
            if seconds > 0:
                shard = self.vg.shard
                key = ("tenant_kernel_seconds", (s.tenant,))
                shard.labeled[key] = shard.labeled.get(key, 0.0) + seconds
            self._free_timed += (start, ev)
        else:
            self._free_events.append(ev)
        if touched:
            res = self.vg.broker.residency
            if res is not None:
                res.finished(s, touched)
        host = self.vg.policy
        if host is not None and view is not None:
            host.kernel_finished(KernelView(view.id, view.session, view.tenant, view.gpu,
                                            view.kernel, started, time.monotonic()))

    def forget(self, session_id: int) -> None:
        """A session ends: its kernels count as finished now (they were synchronized)."""
        if not any(r[1].id == session_id for q in self._running.values() for r in q):
            return
        self.poll()
        for stream, queue in list(self._running.items()):
            for r in [r for r in queue if r[1].id == session_id]:
                self._finished(r)
            rest = deque(r for r in queue if r[1].id != session_id)
            if rest:
                self._running[stream] = rest
            else:
                del self._running[stream]

    def close(self) -> None:
        events = self._free_events + self._free_timed
        for queue in self._running.values():
            for r in queue:
                events += [r[0]] + ([r[5]] if r[5] is not None else [])
        for ev in events:
            try:
                self.vg.backend.event_destroy(ev)
            except Exception:
                pass
        self._free_events, self._free_timed, self._running = [], [], {}
