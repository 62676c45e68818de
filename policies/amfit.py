"""AMFit (PILOT): kernels launch at once; the policy steps in when active memory overflows.

- Active memory: the movable memory running kernels use (each allocation their arguments point
  into, once), per tenant, as the daemon observes it from launch footprints and kernel ends.
- When the active memory of the tenants not held exceeds the GPU's room (capacity less fixed
  allocations), the tenant with the most active memory is held: its further launches wait, and
  its idle movable memory (not used by its running kernels) is evicted to host memory. This
  repeats while the others still overflow and more than one tenant is active.
- A held tenant resumes when enough capacity frees (what the others use plus what it used when
  held fits in the room), or after `resume_after` (so a tenant is never starved; 0: only when
  capacity frees), oldest hold first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import RUN, Decision, KernelView, LaunchView, Policy, SessionView
from .settings import Seconds
from .tracking import Holdings, RunningKernels, size_text


@dataclass(frozen=True, slots=True)
class AMFitSettings:
    resume_after: Seconds = 2.0  # a held tenant resumes after this long at most; 0: no limit

    def __post_init__(self) -> None:
        if self.resume_after < 0:
            raise ValueError("resume_after must be 0 or more")


@dataclass
class Hold:
    gpu: int
    since: float
    active: int  # the tenant's active memory when held: what it needs to resume


class AMFit(Policy):
    name = "amfit"
    summary = ("AMFit: launch at once; when active memory exceeds capacity, hold the tenant "
               "with the most active memory")
    decides_launches = True
    needs_footprint = True
    needs_kernel_end = True
    Settings = AMFitSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.running = RunningKernels()
        self.holdings = Holdings()
        self.holds: dict[str, Hold] = {}
        self.released: dict[str, float] = {}  # tenant -> when its last hold ended
        self.now = 0.0

    def session_started(self, s: SessionView) -> None:
        self.holdings.session_started(s)

    def session_ended(self, s: SessionView) -> None:
        self.holdings.session_ended(s)
        self.running.drop_session(s.id)
        self._rebalance(s.gpu)

    def allocated(self, a: Any) -> None:
        self.holdings.allocated(a)

    def freed(self, a: Any) -> None:
        self.holdings.freed(a)

    def launch_requested(self, launch: LaunchView) -> Decision:
        self.now = max(self.now, launch.now)
        hold = self.holds.get(launch.tenant)
        if hold is not None and hold.gpu == launch.gpu:
            return Decision.wait(f"held: most active memory ({size_text(hold.active)}) when the GPU "
                                 "overflowed")
        return RUN

    def launch_started(self, launch: LaunchView) -> None:
        self.running.started(launch)
        self._rebalance(launch.gpu)

    def kernel_finished(self, k: KernelView) -> None:
        self.running.finished(k.launch)
        self.now = max(self.now, k.finished_at)
        self._rebalance(k.gpu)

    def tick(self, now: float) -> None:
        self.now = now
        for gpu in {h.gpu for h in self.holds.values()}:
            self._rebalance(gpu)

    def _rebalance(self, gpu: int) -> None:
        room = self.controls.gpu(gpu).room
        active = self.running.active_by_tenant(gpu)
        # Resume: oldest hold first, when it fits beside the others, or when it waited enough.
        for tenant, hold in sorted(self.holds.items(), key=lambda kv: kv[1].since):
            if hold.gpu != gpu:
                continue
            others = sum(b for t, b in active.items() if t != tenant)
            waited = self.now - hold.since
            limit = self.settings.resume_after
            if others + hold.active <= room or (limit and waited >= limit):
                del self.holds[tenant]
                self.released[tenant] = self.now
                self.controls.report("release", tenant)
        # Hold: the tenant with the most active memory, while the unheld overflow. A tenant
        # released within resume_after is not held again (it would never get to run).
        limit = self.settings.resume_after
        while True:
            unheld = {t: b for t, b in active.items() if b and t not in self.holds
                      and not (limit and self.now - self.released.get(t, -limit) < limit)}
            if len(unheld) < 2 or sum(unheld.values()) <= room:
                return
            tenant = max(unheld, key=lambda t: (unheld[t], t))
            self.holds[tenant] = Hold(gpu, self.now, unheld[tenant])
            self.controls.report("hold", tenant)
            for session in self.holdings.sessions_of(tenant, gpu):
                self.controls.evict(session, keep=self.running.pointers_of(session))

    def session_status(self, session: int) -> tuple[str, str] | None:
        tenant = self.holdings.tenant_of(session)
        hold = self.holds.get(tenant) if tenant is not None else None
        if hold is None:
            return None
        return "held", (f"amfit: most active memory ({size_text(hold.active)}) when GPU {hold.gpu} "
                        "overflowed; resumes when it fits")

    def state(self) -> dict[str, Any]:
        return {"running": len(self.running.by_id),
                "held": {t: {"gpu": h.gpu, "active": h.active, "held_s": round(self.now - h.since, 3)}
                         for t, h in self.holds.items()}}
