"""MFit (PILOT): a kernel is launched only when its memory footprint fits.

- A launch *fits* when the movable memory it points into, less what running kernels on its GPU
  already use, fits in the free room: the GPU's room (capacity less fixed allocations) less the
  movable memory the running kernels of *other* owners use (their active memory). Its owner's
  own running kernels do not count: they run in its stream order anyway, and the enforcer makes
  room among its own memory (counting them made a program wait for its own kernels). Fixed
  allocations (cudaMalloc without managed_device_memory, module globals) are always resident
  and already out of the room.
- A launch with no other owner's kernel running on its GPU starts at once, fit or not (nothing
  could make room for it).
- Launches that do not fit wait, in arrival order per GPU: a newer launch does not pass an
  older waiting one.
- When the oldest waiting launch has waited `preempt_after`, the owners (each process, or with
  `per = "tenant"` each tenant) running kernels on its GPU are preempted in descending order of
  the GPU memory they hold, until what they use would free enough. Until pilot can stop a
  running kernel, *preempt* means: the owner's further launches on that GPU wait (it is *held*)
  and its idle movable memory (not used by its running kernels) is evicted to host memory. Its
  running kernels finish; then the waiting launch fits
  and runs. The holds last while the waiting launch's session keeps the GPU busy, and are lifted
  once it has had no kernel running or waiting for `preempt_after` (a program launches kernel
  after kernel: releasing the others at its first launch would make each of its next launches
  wait again), when it ends, or when the launch gives up waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import RUN, Decision, KernelView, LaunchView, SessionView
from .settings import Seconds
from .tracking import FootprintPolicy, check_owner, need_bytes, size_text


@dataclass(frozen=True, slots=True)
class MFitSettings:
    preempt_after: Seconds = 2.0  # a launch waiting this long preempts others; 0: never
    per: str = "process"  # what is preempted: each process, or a whole tenant ("tenant")

    def __post_init__(self) -> None:
        if self.preempt_after < 0:
            raise ValueError("preempt_after must be 0 or more")
        check_owner(self.per)


class MFit(FootprintPolicy):
    name = "mfit"
    summary = "MFit: launch a kernel only when its memory footprint fits the GPU's free capacity"
    Settings = MFitSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.waiting: dict[int, dict[int, LaunchView]] = {}  # gpu -> launch id -> view, oldest first
        self.holds: dict[tuple[int, str], int] = {}  # (gpu, held owner) -> the session it yields to
        self.protected: dict[int, tuple[int, float]] = {}  # that session -> (gpu, last busy)
        self.preempted_for: set[int] = set()  # waiting launches that preempted others

    def session_ended(self, s: SessionView) -> None:
        super().session_ended(s)
        for queue in self.waiting.values():
            for launch_id in [i for i, lv in queue.items() if lv.session == s.id]:
                self.preempted_for.discard(queue.pop(launch_id).id)
        self._release(s.id)

    # -- launches --
    def launch_requested(self, launch: LaunchView) -> Decision:
        gpu = launch.gpu
        self._busy(launch.session, launch.now)
        queue = self.waiting.setdefault(gpu, {})
        held_for = self.holds.get((gpu, self.holdings.owner_of(launch)))
        if held_for is not None:
            queue.pop(launch.id, None)
            return Decision.wait(f"held: preempted for session {held_for}")
        ahead = next((i for i in queue if i < launch.id), None)
        me = self.holdings.owner_of(launch)
        if not self.running.owners_on(gpu) - {me}:
            if ahead is None:
                queue.pop(launch.id, None)
                return Decision.run("nothing else running") if launch.attempts > 1 else RUN
            queue.setdefault(launch.id, launch)
            return Decision.wait(f"behind launch {ahead}")
        need = need_bytes(launch, self.running.active(gpu))
        free = self.controls.gpu(gpu).room - self.running.active_others(gpu, me)
        if ahead is None and need <= free:
            queue.pop(launch.id, None)
            return RUN
        queue[launch.id] = launch
        if ahead is not None:
            return Decision.wait(f"behind launch {ahead}")
        if self.settings.preempt_after and launch.waited_s >= self.settings.preempt_after \
                and launch.id not in self.preempted_for:
            self._preempt(launch, need - free)
        return Decision.wait(f"needs {size_text(need)}, {size_text(max(0, free))} free")

    def _preempt(self, launch: LaunchView, short: int) -> None:
        """Hold the tenants running on the launch's GPU, most memory held first, until what
        their kernels use covers `short` bytes; evict their idle memory. The holds last while
        the launch's session keeps the GPU busy (see _release_idle)."""
        self.preempted_for.add(launch.id)
        gpu = launch.gpu
        self.protected[launch.session] = (gpu, launch.now)
        h = self.holdings
        owners = self.running.owners_on(gpu) - {h.owner_of(launch)}
        for owner in sorted(owners, key=lambda o: (-h.held(gpu, o), o)):
            if short <= 0:
                break
            if (gpu, owner) in self.holds:
                continue
            self.holds[(gpu, owner)] = launch.session
            self.controls.report("hold", h.tenant_of_owner(owner))
            for session in h.sessions_of(owner, gpu):
                self.controls.evict(session, keep=self.running.pointers_of(session))
            short -= sum(self.running.active(gpu, {owner}).values())

    def launch_started(self, launch: LaunchView) -> None:
        self.running.started(launch)
        self.preempted_for.discard(launch.id)
        self._busy(launch.session, launch.now)

    def launch_dropped(self, launch: LaunchView, why: str) -> None:
        self.waiting.get(launch.gpu, {}).pop(launch.id, None)
        if launch.id in self.preempted_for:  # it gave up: the others may go on
            self.preempted_for.discard(launch.id)
            self._release(launch.session)

    def kernel_finished(self, k: KernelView) -> None:
        self.running.finished(k.launch)
        self.now = max(self.now, k.finished_at)
        self._busy(k.session, k.finished_at)
        self._release_idle()

    def tick(self, now: float) -> None:
        self.now = now
        self._release_idle()

    def _busy(self, session: int, now: float) -> None:
        self.now = max(self.now, now)
        if session in self.protected:
            self.protected[session] = (self.protected[session][0], now)

    def _release_idle(self) -> None:
        """Lift the holds made for a session that has had no kernel running or waiting on the
        GPU for preempt_after: it no longer needs the room."""
        for session, (gpu, last) in list(self.protected.items()):
            busy = self.running.session_busy(session) or \
                any(lv.session == session for lv in self.waiting.get(gpu, {}).values())
            if not busy and self.now - last >= self.settings.preempt_after:
                self._release(session)

    def _release(self, session: int) -> None:
        self.protected.pop(session, None)
        for key in [k for k, s in self.holds.items() if s == session]:
            del self.holds[key]
            self.controls.report("release", self.holdings.tenant_of_owner(key[1]))

    # -- reports --
    def session_status(self, session: int) -> tuple[str, str] | None:
        s = self.holdings.sessions.get(session)
        held_for = self.holds.get((s.gpu, self.holdings.owner(s.id, s.tenant))) if s is not None else None
        if held_for is None:
            return None
        return "held", f"mfit: preempted so that session {held_for}'s launches fit"

    def state(self) -> dict[str, Any]:
        return {"running": len(self.running.by_id),
                "waiting": {str(g): list(q) for g, q in self.waiting.items() if q},
                "held": {f"{t}@{g}": s for (g, t), s in self.holds.items()}}
