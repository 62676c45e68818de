"""AMFit (PILOT): kernels launch at once; the policy steps in when active memory overflows.

- Active memory: the movable memory running kernels use (each allocation their arguments point
  into, once), per owner, as the daemon observes it from launch footprints and kernel ends.
- Owners: each process, or with `per = "tenant"` each tenant.
- When the active memory of the owners not held exceeds the GPU's room (capacity less fixed
  allocations), the owner with the most active memory is held: its further launches wait, its
  idle movable memory (not used by its running kernels) is evicted to host memory, and, with
  `preempt_kernels` and `[priority] preempt`, its running kernels are stopped at their next block boundary
  (Controls.preempt; what is left of each waits on its stream, and runs at its resume). This
  repeats while the others still overflow and more than one owner is active. So that there are
  kernels to stop, the sessions on a GPU launch preemptible variants while an owner is held
  there and for `preemptible_for` after a hold (Controls.preemptible): programs that overflow
  the GPU once tend to again, and each preemptible launch costs a few microseconds, which a
  GPU that never overflows should not pay.
- A held owner resumes when enough capacity frees (what the others use plus what it used when
  held fits in the room), or after `resume_after` (so an owner is never starved; 0: only when
  capacity frees), oldest hold first.
- What yields memory: the policy sets the enforcer's eviction order to held owners first, then
  the owners by the most active memory each has had (its peak), largest first. So while a held
  owner runs again, the memory of the owners with less active memory stays on the GPU and the
  large one thrashes through its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import RUN, Decision, KernelView, LaunchView, SessionView
from .settings import Seconds
from .tracking import FootprintPolicy, check_owner, size_text


@dataclass(frozen=True, slots=True)
class AMFitSettings:
    resume_after: Seconds = 2.0  # a held owner resumes after this long at most; 0: no limit
    per: str = "process"  # what is held: each process, or a whole tenant ("tenant")
    preempt_kernels: bool = False  # stop a held owner's running kernels too ([priority] preempt)
    # after a hold on a GPU, its sessions launch preemptible variants this long; 0: never
    preemptible_for: Seconds = 10.0

    def __post_init__(self) -> None:
        if self.resume_after < 0:
            raise ValueError("resume_after must be 0 or more")
        if self.preemptible_for < 0:
            raise ValueError("preemptible_for must be 0 or more")
        check_owner(self.per)


@dataclass
class Hold:
    gpu: int
    since: float
    active: int  # the owner's active memory when held: what it needs to resume


class AMFit(FootprintPolicy):
    name = "amfit"
    summary = ("AMFit: launch at once; when active memory exceeds capacity, hold the process "
               "with the most active memory")
    Settings = AMFitSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.holds: dict[str, Hold] = {}
        self.released: dict[str, float] = {}  # owner -> when its last hold ended
        self.peak_active: dict[str, int] = {}  # owner -> the most active memory it has had
        self.last_hold: dict[int, float] = {}  # gpu -> when an owner was last held (or released)

    def session_started(self, s: SessionView) -> None:
        super().session_started(s)
        self._rerank(s.gpu)

    def session_ended(self, s: SessionView) -> None:
        super().session_ended(s)
        owner = self.holdings.owner(s.id, s.tenant)
        if not self.holdings.sessions_of(owner, s.gpu):
            self.peak_active.pop(owner, None)
        self._rebalance(s.gpu, rerank=True)

    def launch_requested(self, launch: LaunchView) -> Decision:
        self.now = max(self.now, launch.now)
        hold = self.holds.get(self.holdings.owner_of(launch))
        if hold is not None and hold.gpu == launch.gpu:
            return Decision.wait(f"held: most active memory ({size_text(hold.active)}) when the GPU "
                                 "overflowed")
        return RUN

    def launch_started(self, launch: LaunchView) -> None:
        self.running.started(launch)
        owner = self.holdings.owner_of(launch)
        n = self.running.owner_bytes(launch.gpu, owner)
        peak = n > self.peak_active.get(owner, 0)
        if peak:
            self.peak_active[owner] = n
        self._rebalance(launch.gpu, rerank=peak)

    def kernel_finished(self, k: KernelView) -> None:
        self.running.finished(k.launch)
        self.now = max(self.now, k.finished_at)
        self._rebalance(k.gpu)

    def tick(self, now: float) -> None:
        self.now = now
        for gpu in {h.gpu for h in self.holds.values()} | set(self.last_hold):
            self._rebalance(gpu)

    def _rerank(self, gpu: int) -> None:
        """Tell the enforcer the eviction order if it changed: held owners (oldest hold first),
        then by peak active memory, largest first (ties: the newer session first)."""
        first = self.holdings.owners_on(gpu)

        def key(owner: str) -> tuple[int, float, int, int]:
            hold = self.holds.get(owner)
            if hold is not None and hold.gpu == gpu:
                return 0, hold.since, 0, 0
            return 1, 0.0, -self.peak_active.get(owner, 0), -first[owner]
        self.set_order(gpu, sorted(first, key=key))

    def _rebalance(self, gpu: int, rerank: bool = False) -> None:
        room = self.controls.gpu(gpu).room
        used = self.running.gpu_bytes(gpu)
        if not self.holds and used <= room:
            self._arm(gpu)
            if rerank:  # nobody to hold or resume: only the order may change
                self._rerank(gpu)
            return
        h = self.holdings
        active = self.running.active_by(gpu)
        holds, released = len(self.holds), False
        # Resume: oldest hold first, when it fits beside the others, or when it waited enough.
        for owner, hold in sorted(self.holds.items(), key=lambda kv: kv[1].since):
            if hold.gpu != gpu:
                continue
            others = sum(b for t, b in active.items() if t != owner)
            waited = self.now - hold.since
            limit = self.settings.resume_after
            if others + hold.active <= room or (limit and waited >= limit):
                del self.holds[owner]
                released = True
                self.released[owner] = self.now
                self.controls.report("release", h.tenant_of_owner(owner))
                self.resume_owner(owner, gpu)
                self.last_hold[gpu] = self.now
        # Hold: the owner with the most active memory, while the unheld overflow. An owner
        # released within resume_after is not held again (it would never get to run).
        limit = self.settings.resume_after
        while True:
            unheld = {t: b for t, b in active.items() if b and t not in self.holds
                      and not (limit and self.now - self.released.get(t, -limit) < limit)}
            if len(unheld) < 2 or sum(unheld.values()) <= room:
                break
            owner = max(unheld, key=lambda t: (unheld[t], t))
            self.holds[owner] = Hold(gpu, self.now, unheld[owner])
            self.controls.report("hold", h.tenant_of_owner(owner))
            self.preempt_owner(owner, gpu)
            for session in h.sessions_of(owner, gpu):
                self.controls.evict(session, keep=self.running.pointers_of(session))
        if rerank or len(self.holds) != holds or released:
            self._rerank(gpu)
        self._arm(gpu)

    def _arm(self, gpu: int) -> None:
        """Preemptible launches while an owner is held on the GPU and preemptible_for after."""
        if any(h.gpu == gpu for h in self.holds.values()):
            self.last_hold[gpu] = self.now
        last = self.last_hold.get(gpu)
        on = last is not None and self.now - last < self.settings.preemptible_for
        if not on:
            self.last_hold.pop(gpu, None)
        self.set_preemptible(gpu, on)

    def session_status(self, session: int) -> tuple[str, str] | None:
        owner = self.holdings.owner_of_session(session)
        hold = self.holds.get(owner) if owner is not None else None
        if hold is None:
            return None
        return "held", (f"amfit: most active memory ({size_text(hold.active)}) when GPU {hold.gpu} "
                        "overflowed; resumes when it fits")

    def state(self) -> dict[str, Any]:
        return {"running": len(self.running.by_id),
                "held": {t: {"gpu": h.gpu, "active": h.active, "held_s": round(self.now - h.since, 3)}
                         for t, h in self.holds.items()}}
