"""The daemon's side of the policy interface (pilot.policies): it loads the configured policy,
turns daemon state into the policy's plain views, calls its events one at a time under one
lock, logs and counts its decisions, and tells the vGPUs when waiting launches should be asked
again.

The policy itself never sees a daemon object and never blocks a vGPU: a WAIT answer is carried
out by the vGPU's wait queue (scheduling/waiting.py), which asks again on every tick and after
every event that may have freed something.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pilot import policies
from pilot.daemon.resources.tenants import GPU_KINDS
from pilot.daemon.telemetry.thread_names import NamedThread
from pilot.policies import (
    RUN,
    AllocationView,
    Controls,
    Decision,
    GpuView,
    KernelView,
    LaunchView,
    NvmlView,
    Policy,
    PreemptionView,
    SessionView,
    Verdict,
    Watch,
)

if TYPE_CHECKING:
    from pilot.daemon.config import Config
    from pilot.daemon.resources.broker import ResourceBroker
    from pilot.daemon.resources.residency import Residency
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.telemetry.metrics import Metrics

log = logging.getLogger("pilot.policy")
TICK_S = 0.01


@dataclasses.dataclass(slots=True)
class MemoryCount:
    """A session part's memory of GPU kinds as pilotd counts it for the policy (every
    allocation and free, heard by the policy or not: AllocationView.live and the counts after
    it), and the quiet band the policy set (Controls.quiet_memory)."""
    live: int = 0
    allocations: int = 0
    frees: int = 0
    high: int = 0  # since the last event the policy heard
    low: int = -1  # since then, after a free (-1: none yet)
    quiet: tuple[int, int, int] | None = None  # ceiling, floor, limit
    run: int = 0  # events in a row the policy did not hear

    def hides_allocation(self, live: int) -> bool:
        """Whether an allocation that leaves `live` bytes stays quiet (within the band, and not
        yet `limit` quiet events in a row)."""
        quiet = self.quiet
        return quiet is not None and live <= quiet[0] and self.run < quiet[2]

    def hides_free(self) -> bool:
        """Whether the free just counted stays quiet (its bytes left above the floor)."""
        quiet = self.quiet
        return quiet is not None and self.live > quiet[1] and self.run < quiet[2]


class PolicyStartError(Exception):
    """The configured policy cannot be used (unknown, not implemented, bad knobs, bad plugin)."""


def load_policy(config: Config) -> Policy:
    """The policy `[policy] name` names, with its knobs, after loading `[policy] plugins`.
    Raises PolicyStartError with a message naming what is wrong."""
    try:
        for plugin in config.policy_plugins:
            policies.load_plugin(plugin)
        for name in config.policy_settings:
            if name not in policies.available():
                raise policies.UnknownPolicy(f"[policy.{name}]: no policy {name!r} "
                                             f"(available: {', '.join(policies.available())})")
        return policies.create(config.policy, config.policy_settings.get(config.policy))
    except policies.PolicyConfigError as exc:
        raise PolicyStartError(f"policy.name = {config.policy!r}: {exc}") from None


def session_view(s: Session) -> SessionView:
    return SessionView(id=s.id, tenant=s.tenant, pid=s.creds.pid, gpu=s.device, vgpu=s.vgpu)


class DaemonControls(Controls):
    """The policy's Controls: reads of the broker and the enforcer; requests queued (under the
    policy lock) and carried out by the scheduler thread once the event that made them returns
    (`run_pending`), so a policy never waits for the GPU."""

    def __init__(self, host: PolicyHost) -> None:
        self.host = host
        self.broker: ResourceBroker | None = None  # set by the Daemon
        # the vGPUs (a session's preemption is its vGPU's), and whether pilotd can cut kernels
        # ([priority] preempt and Policy.preempts_kernels); set by the Daemon
        self.vgpus: list[Any] = []
        self.preempts = False
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        self._pending_lock = threading.Lock()

    def gpu(self, gpu: int) -> GpuView:
        broker = self.broker
        if broker is None:
            return GpuView(gpu, 0, 0)
        budget = broker.budget
        res = broker.residency
        movable, resident = res.gpu_numbers(gpu) if res is not None else (0, 0)
        used = res.fixed_used(gpu) if res is not None else budget.used(gpu)
        return GpuView(gpu, budget.capacity(gpu), used, movable, resident,
                       bool(res is not None and res.enforced))

    def capacity(self, gpu: int) -> int:
        broker = self.broker
        return broker.budget.capacity(gpu) if broker is not None else 0

    def _residency(self) -> Residency | None:
        broker = self.broker
        return broker.residency if broker is not None else None

    def resident(self, session: int) -> int:
        res = self._residency()
        return res.session_resident(session) if res is not None else 0

    def provisioned(self, tenant: str, gpu: int) -> int:
        broker = self.broker
        return (broker.quotas.get(tenant, gpu).provisioned or 0) if broker is not None else 0

    def set_eviction_order(self, gpu: int, sessions: tuple[int, ...]) -> None:
        res = self._residency()
        if res is not None:
            res.set_eviction_order(gpu, tuple(sessions))

    def _queue(self, what: str, *args: Any) -> None:
        with self._pending_lock:
            self.pending.append((what, args))
        self.host.kick()

    def evict(self, session: int, keep: tuple[int, ...] = ()) -> None:
        self._queue("evict", session, tuple(keep))

    def advise_host(self, session: int, ptr: int, size: int) -> None:
        self._queue("advise_host", session, ptr, size)

    def unadvise(self, session: int, ptr: int, size: int, prefetch: bool = True) -> None:
        self._queue("unadvise", session, ptr, size, prefetch)

    def quiet_memory(self, session: int, gpu: int, ceiling: int = 0, floor: int = 0,
                     limit: int = 0) -> None:
        if session not in self.host.sessions:
            return  # ended (or never started): nothing to count, and no entry left behind
        count = self.host.memory_count(session, gpu)
        count.quiet = (ceiling, floor, limit) if limit > 0 else None
        if log.isEnabledFor(logging.DEBUG):  # at every change of the job's level: built only if read
            log.debug("policy %s: session %d on GPU %d: %s", self.host.name, session, gpu,
                      f"allocations up to {ceiling} bytes and frees above {floor} quiet (at most "
                      f"{limit} in a row)" if limit > 0 else "every memory event heard")

    def hold_session(self, session: int, reason: str) -> None:
        s = self.host.sessions.get(session)
        if s is not None:
            s.policy_hold = reason or "held by the policy"

    def release_session(self, session: int) -> None:
        s = self.host.sessions.get(session)
        if s is not None:
            s.policy_hold = None
            self.host.wake()

    def report(self, action: str, tenant: str) -> None:
        self.host.metrics.count("policy_actions", (self.host.name, tenant, action))

    # ---- preemption (scheduling/preempt.py) ----
    def can_preempt(self) -> bool:
        return self.preempts

    def preemptible(self, session: int, on: bool = True) -> None:
        s = self.host.sessions.get(session)
        if s is not None and self.preempts:
            s.preemptible = bool(on)

    def preempt(self, session: int) -> None:
        self._queue("preempt", session, time.monotonic())

    def resume(self, session: int) -> None:
        self._queue("resume", session)

    def preemption(self, session: int) -> PreemptionView | None:
        s = self.host.sessions.get(session)
        p = s.preemption if s is not None else None
        if p is None:
            return None
        return PreemptionView(session, p.requested_at, p.cut, p.drained_at, p.inflight)

    def _preemption(self, what: str, args: tuple[Any, ...]) -> None:
        """Carry out a preempt or resume (scheduler thread)."""
        s = self.host.sessions.get(args[0])
        vg = self.vgpus[s.vgpu] if s is not None and 0 <= s.vgpu < len(self.vgpus) else None
        preempt = vg.preempt if vg is not None and self.preempts else None
        if s is None or preempt is None:
            return
        res = self._residency()
        if what == "preempt":
            p = preempt.preempt(s, args[1])
            if res is not None:  # its cut kernels' memory may be evicted once they have left
                res.preempted_session(s.id, list(p.waiting))
            preempt.daemon.policy_counts[0] += 1
            self.host.metrics.count("policy_actions", (self.host.name, s.tenant, "preempt"))
        else:
            # the memory evicted from under its cut kernels comes back before their rests
            stream = res.resumed_session(s.id) if res is not None else None
            preempt.resume(s, stream)
            preempt.daemon.policy_counts[1] += 1
            self.host.metrics.count("policy_actions", (self.host.name, s.tenant, "resume"))

    def run_pending(self) -> None:
        """Carry out the queued requests (scheduler thread). One that fails is logged."""
        with self._pending_lock:
            pending, self.pending = self.pending, []
        res = self._residency()
        for what, args in pending:
            if what in ("preempt", "resume"):
                try:
                    self._preemption(what, args)
                except Exception:
                    log.exception("policy %s: %s%r failed", self.host.name, what, args)
                continue
            if res is None:
                continue
            try:
                tenant = res.tenants.get(args[0], "?")
                moved = getattr(res, "evict_session" if what == "evict" else what)(*args)
                if moved:
                    self.host.metrics.count("policy_actions", (self.host.name, tenant, what))
                log.debug("policy %s: %s%r: %d bytes", self.host.name, what, args, moved)
            except Exception:
                log.exception("policy %s: %s%r failed", self.host.name, what, args)


class PolicyHost:
    """One per daemon; thread-safe. `wake` (set by the Daemon) asks every vGPU that has waiting
    launches to ask the policy again."""

    def __init__(self, policy: Policy, metrics: Metrics, max_wait: float = 0.0) -> None:
        self.policy = policy
        self.name = policy.name
        self.metrics = metrics
        self.max_wait = max_wait  # seconds a launch may wait; 0: no limit
        self.decides_launches = policy.decides_launches
        # it decides launches of the sessions it watches only (Policy.watches_launches): the
        # fast path serves the others
        self.selective = policy.decides_launches and \
            type(policy).watches_launches is not Policy.watches_launches
        self.needs_footprint = policy.needs_footprint
        self.needs_kernel_end = policy.needs_kernel_end
        self.prefetches_footprint = policy.prefetches_footprint
        self.moves_memory = policy.moves_memory
        self.wake: Callable[[], None] = lambda: None
        # The NVML poller's latest readings (set by the Daemon); new ones go to the policy.
        self.readings: Callable[[], dict[int, Any]] | None = None
        self._seen_readings: dict[int, float] = {}
        self._lock = threading.Lock()
        self._launch_ids = itertools.count(1)
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self.controls = DaemonControls(self)
        policy.controls = self.controls
        self.sessions: dict[int, Session] = {}  # for hold_session (dict operations: GIL-atomic)
        # The memory events it overrides (the others cost no lock and no view).
        self.hears_allocated = type(policy).allocated is not Policy.allocated
        self.hears_freed = type(policy).freed is not Policy.freed
        # A vGPU thread's allocated and freed events wait here until its reply is sent
        # (defer_memory_events); any question to the policy on that thread runs them first.
        self._local = threading.local()
        # (session, gpu) -> its memory as counted for the policy, while the policy hears memory
        # events (vGPU threads only; a session part is served by one vGPU thread)
        self.counts: dict[tuple[int, int], MemoryCount] = {}
        self.counts_memory = self.hears_allocated and self.hears_freed

    # ---- the scheduler thread: ticks ----
    def start(self) -> None:
        self._thread = NamedThread(target=self._run, name="pilot-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(2)

    def kick(self) -> None:
        """The policy asked for something: the scheduler thread carries it out now."""
        self._kick.set()

    def _run(self) -> None:
        next_tick = time.monotonic() + TICK_S
        while not self._stop.is_set():
            self._kick.wait(max(0.0, next_tick - time.monotonic()))
            self._kick.clear()
            if self._stop.is_set():
                return
            self.controls.run_pending()
            now = time.monotonic()
            if now < next_tick:
                continue
            next_tick = now + TICK_S
            try:
                self._forward_readings()
                self._call(self.policy.tick, now)
                self.controls.run_pending()
                self.wake()
            except Exception:
                log.exception("policy %s: tick failed", self.name)

    def _forward_readings(self) -> None:
        if self.readings is None:
            return
        for gpu, r in self.readings().items():
            if r is not None and self._seen_readings.get(gpu) != r.timestamp:
                self._seen_readings[gpu] = r.timestamp
                util = None if r.utilization_gpu != r.utilization_gpu else int(r.utilization_gpu)  # NaN
                self.nvml_reading(gpu, r.memory_total, r.memory_used, util)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.run_deferred()
        with self._lock:
            return fn(*args)

    # ---- memory events after the reply (vGPU threads) ----
    def defer_memory_events(self) -> None:
        """From now on this thread's allocated and freed events wait until run_deferred: a vGPU
        thread runs them once it has sent the call's reply, so the client does not wait for the
        policy's bookkeeping (the detector, lane sizes), only for its decision. Nothing is
        decided on stale state: every question this thread asks the policy (an allocation, a
        launch, a session starting or ending) runs the waiting events first, in order."""
        self._local.deferred = []

    def run_deferred(self) -> None:
        """The events this thread deferred, in order, under one hold of the lock."""
        deferred = getattr(self._local, "deferred", None)
        if not deferred:
            return
        events = deferred.copy()
        deferred.clear()
        wake = False
        with self._lock:
            for fn, view, wakes in events:
                try:
                    fn(view)
                except Exception:
                    log.exception("policy %s: %s failed", self.name, getattr(fn, "__name__", fn))
                wake = wake or wakes
        if wake:
            self.wake()

    def _memory_event(self, fn: Callable[[AllocationView], None], view: AllocationView,
                      wakes: bool) -> bool:
        """Deferred (True) on a thread that defers; else the caller runs it now. `wakes`: waiting
        launches are asked again once it has run (a free)."""
        deferred = getattr(self._local, "deferred", None)
        if deferred is None:
            return False
        deferred.append((fn, view, wakes))
        return True

    def _event(self, fn: Callable[..., Any], *args: Any) -> None:
        """An event whose failure must not fail the CUDA call that caused it."""
        self.run_deferred()
        try:
            with self._lock:
                fn(*args)
        except Exception:
            log.exception("policy %s: %s failed", self.name, getattr(fn, "__name__", fn))

    # ---- sessions and memory (vGPU and router threads) ----
    def session_started(self, s: Session) -> None:
        self.sessions[s.id] = s
        self._event(self.policy.session_started, session_view(s))

    def session_ended(self, s: Session) -> None:
        self.sessions.pop(s.id, None)
        self.counts.pop((s.id, s.device), None)
        self._event(self.policy.session_ended, session_view(s))
        self.wake()

    def allocation_requested(self, s: Session, kind: str, size: int, movable: bool = False) -> Decision:
        """The policy's answer before an allocation is charged and made: RUN, REFUSE, or WAIT,
        for which the session is held (Session.policy_hold) until the policy releases it, and
        the call is then asked again. A policy that fails lets it be made (logged)."""
        if type(self.policy).allocation_requested is Policy.allocation_requested:
            return RUN  # the policy does not ask: no lock on the allocation path
        self.run_deferred()
        count = self.counts.get((s.id, s.device))
        if count is not None and kind in GPU_KINDS and count.hides_allocation(count.live + size):
            return RUN  # within the quiet band the policy set: it would answer RUN
        view = AllocationView(s.id, s.tenant, s.device, kind, 0, size, movable)
        try:
            with self._lock:
                decision = self.policy.allocation_requested(view)
                if isinstance(decision, Decision) and decision.verdict is Verdict.WAIT \
                        and s.policy_hold is None:
                    s.policy_hold = decision.reason or "held by the policy"
        except Exception:
            log.exception("policy %s: allocation_requested failed; the allocation is made", self.name)
            return RUN
        if not isinstance(decision, Decision):
            log.error("policy %s: allocation_requested returned %r, not a Decision; the allocation "
                      "is made", self.name, decision)
            return RUN
        if decision.verdict is not Verdict.RUN:
            log.info("policy %s: session %d (%s) %d-byte %s allocation: %s (%s)", self.name, s.id,
                     s.tenant, size, kind, decision.verdict.value, decision.reason,
                     extra={"session": s.id, "tenant": s.tenant})
        return decision

    def memory_count(self, session: int, gpu: int) -> MemoryCount:
        count = self.counts.get((session, gpu))
        if count is None:
            count = self.counts[(session, gpu)] = MemoryCount()
        return count

    def allocated(self, s: Session, kind: str, ptr: int, size: int, movable: bool = False) -> None:
        if not self.hears_allocated:
            return
        if self.counts_memory and kind in GPU_KINDS:
            count = self.memory_count(s.id, s.device)
            count.live += size
            count.allocations += 1
            if count.live > count.high:
                count.high = count.live
            if count.quiet is not None:
                self.run_deferred()  # the band as the events before this one left it
                if count.hides_allocation(count.live):
                    self._kept_quiet(s, count)
                    return
            view = self._heard(s, kind, ptr, size, movable, count)
        else:
            view = self._view(s, kind, ptr, size, movable)
        if not self._memory_event(self.policy.allocated, view, False):
            self._event(self.policy.allocated, view)

    def freed(self, s: Session, kind: str, ptr: int, size: int, movable: bool = False) -> None:
        if not self.hears_freed:
            self.wake()  # memory came back: waiting launches may fit now
            return
        if self.counts_memory and kind in GPU_KINDS:
            count = self.memory_count(s.id, s.device)
            count.live = max(0, count.live - size)
            count.frees += 1
            if count.low < 0 or count.live < count.low:
                count.low = count.live
            if count.quiet is not None:
                self.run_deferred()
                if count.hides_free():
                    self._kept_quiet(s, count)
                    return  # nothing the policy would act on: nor do waiting launches
            view = self._heard(s, kind, ptr, size, movable, count)
        else:
            view = self._view(s, kind, ptr, size, movable)
        if not self._memory_event(self.policy.freed, view, True):
            self._event(self.policy.freed, view)
            self.wake()

    def _kept_quiet(self, s: Session, count: MemoryCount) -> None:
        count.run += 1
        self.metrics.count("policy_memory_events", (self.name, s.tenant, "quiet"))

    def _view(self, s: Session, kind: str, ptr: int, size: int, movable: bool) -> AllocationView:
        """A view of host memory (or of a policy that does not count): its GPU kinds' counts
        as they stand."""
        count = self.counts.get((s.id, s.device))
        if count is None:
            return AllocationView(s.id, s.tenant, s.device, kind, ptr, size, movable, s.kernels)
        return AllocationView(s.id, s.tenant, s.device, kind, ptr, size, movable, s.kernels,
                              count.live, count.allocations, count.frees, count.live, count.live)

    def _heard(self, s: Session, kind: str, ptr: int, size: int, movable: bool,
               count: MemoryCount) -> AllocationView:
        """The view of an event the policy hears, with the counts; they start again from it."""
        self.metrics.count("policy_memory_events", (self.name, s.tenant, "heard"))
        view = AllocationView(s.id, s.tenant, s.device, kind, ptr, size, movable, s.kernels,
                              count.live, count.allocations, count.frees, count.high,
                              count.low if count.low >= 0 else count.live)
        count.high = count.live
        count.low = -1
        count.run = 0
        return view

    def nvml_reading(self, gpu: int, total: int, used: int, utilization: int | None) -> None:
        self._event(self.policy.nvml_reading, NvmlView(gpu, total, used, utilization))

    # ---- launches (vGPU threads) ----
    def new_launch_id(self) -> int:
        return next(self._launch_ids)  # atomic under the GIL: no lock on every launch

    def launch_requested(self, view: LaunchView) -> Decision:
        """The policy's decision, logged and counted. A policy that fails answers RUN (the
        program must not fail because a policy has a bug), and the failure is logged."""
        self.run_deferred()
        try:
            with self._lock:
                decision = self.policy.launch_requested(view)
        except Exception:
            log.exception("policy %s: launch_requested failed; the launch runs", self.name)
            decision = RUN
        if not isinstance(decision, Decision):
            log.error("policy %s: launch_requested returned %r, not a Decision; the launch runs",
                      self.name, decision)
            decision = RUN
        verdict = decision.verdict
        if verdict is not Verdict.WAIT or view.attempts == 1:  # a wait is counted once
            self.metrics.count("policy_decisions", (self.name, view.tenant, verdict.value))
        # Every decision is logged: a first WAIT, REFUSE and a RUN after a wait at info; a plain
        # RUN and a waiting launch asked again (every tick) at debug, or the log would drown.
        first = view.attempts == 1
        level = (logging.INFO if (verdict is Verdict.WAIT and first) or verdict is Verdict.REFUSE
                 or (verdict is Verdict.RUN and not first) else logging.DEBUG)
        if log.isEnabledFor(level):
            log.log(level, "policy %s: session %d (%s) kernel %s: %s%s", self.name, view.session,
                    view.tenant, view.kernel, verdict.value,
                    f" ({decision.reason})" if decision.reason else "",
                    extra={"session": view.session, "tenant": view.tenant})
        return decision

    def launch_started(self, view: LaunchView) -> None:
        self._event(self.policy.launch_started, view)

    def watches_launches(self, session: int) -> Watch:
        """How much of the session's launches must reach the policy now (a policy that fails
        or answers something else: ALL, every launch through Python, logged)."""
        self.run_deferred()
        try:
            with self._lock:
                watch = self.policy.watches_launches(session)
        except Exception:
            log.exception("policy %s: watches_launches failed; the session's launches go to it",
                          self.name)
            return Watch.ALL
        if not isinstance(watch, Watch):
            log.error("policy %s: watches_launches returned %r, not a Watch; the session's "
                      "launches go to it", self.name, watch)
            return Watch.ALL
        return watch

    def launch_dropped(self, view: LaunchView, why: str) -> None:
        self._event(self.policy.launch_dropped, view, why)
        log.info("policy %s: session %d kernel %s dropped after %.3f s: %s", self.name, view.session,
                 view.kernel, view.waited_s, why, extra={"session": view.session, "tenant": view.tenant})

    def kernel_finished(self, view: KernelView) -> None:
        self._event(self.policy.kernel_finished, view)
        self.wake()

    # ---- reports ----
    def session_status(self, session: int) -> tuple[str, str] | None:
        """What the policy does to a session (pilotctl sessions), or None."""
        try:
            with self._lock:
                status = self.policy.session_status(session)
        except Exception:
            log.exception("policy %s: session_status failed", self.name)
            return None
        if status is None:
            return None
        state, why = status
        return str(state), str(why)

    def state(self) -> dict[str, Any]:
        """The policy's state() (empty if it fails: a scrape must not fail for it)."""
        try:
            with self._lock:
                return self.policy.state()
        except Exception:
            log.exception("policy %s: state failed", self.name)
            return {}

    def describe(self) -> dict[str, Any]:
        """For pilotctl status: the policy in force, its knobs and state, and every name known."""
        try:
            with self._lock:
                state = self.policy.state()
        except Exception as exc:
            state = {"error": str(exc)}
        settings = self.policy.settings
        knobs = dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else {}
        return {"name": self.name, "summary": self.policy.summary, "max_wait_s": self.max_wait,
                "settings": knobs, "state": state,
                "available": {name: {"summary": cls.summary, "implemented": cls.implemented}
                              for name, cls in policies.available().items()}}
