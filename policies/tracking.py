"""Bookkeeping the memory policies share: which launches run on each GPU with which footprint,
and what each session and tenant holds. Plain data, fed from the policy events."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .api import AllocationView, LaunchView, SessionView


class RunningKernels:
    """Launches started and not yet finished (launch_started .. kernel_finished)."""

    def __init__(self) -> None:
        self.by_id: dict[int, LaunchView] = {}

    def started(self, launch: LaunchView) -> None:
        self.by_id[launch.id] = launch

    def finished(self, launch_id: int) -> LaunchView | None:
        return self.by_id.pop(launch_id, None)

    def drop_session(self, session: int) -> None:
        for launch_id in [i for i, lv in self.by_id.items() if lv.session == session]:
            del self.by_id[launch_id]

    def on_gpu(self, gpu: int) -> list[LaunchView]:
        return [lv for lv in self.by_id.values() if lv.gpu == gpu]

    def active(self, gpu: int, tenants: set[str] | None = None) -> dict[int, int]:
        """{allocation: size} of the movable memory running kernels on `gpu` use (of `tenants`
        only, when given): each allocation once, however many kernels use it."""
        out: dict[int, int] = {}
        for lv in self.by_id.values():
            if lv.gpu == gpu and (tenants is None or lv.tenant in tenants):
                for r in lv.footprint:
                    if r.movable:
                        out[r.ptr] = r.size
        return out

    def active_by_tenant(self, gpu: int) -> dict[str, int]:
        """Active movable bytes per tenant on `gpu`."""
        per: dict[str, dict[int, int]] = defaultdict(dict)
        for lv in self.by_id.values():
            if lv.gpu == gpu:
                for r in lv.footprint:
                    if r.movable:
                        per[lv.tenant][r.ptr] = r.size
        return {t: sum(d.values()) for t, d in per.items()}

    def pointers_of(self, session: int) -> tuple[int, ...]:
        """Allocations the session's running kernels use (what an eviction must keep)."""
        return tuple(sorted({r.ptr for lv in self.by_id.values() if lv.session == session
                             for r in lv.footprint}))


def need_bytes(launch: LaunchView, active: dict[int, int]) -> int:
    """Movable bytes the launch would bring in beyond what running kernels already use."""
    return sum(r.size for r in launch.footprint if r.movable and r.ptr not in active)


@dataclass
class Holdings:
    """Sessions (id -> view) and GPU memory held, from session and allocation events; pinned host
    memory does not count."""
    sessions: dict[int, SessionView] = field(default_factory=dict)
    by_tenant: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))

    def session_started(self, s: SessionView) -> None:
        self.sessions[s.id] = s

    def session_ended(self, s: SessionView) -> None:
        self.sessions.pop(s.id, None)

    def allocated(self, a: AllocationView) -> None:
        if a.kind != "pinned":
            self.by_tenant[(a.gpu, a.tenant)] += a.size

    def freed(self, a: AllocationView) -> None:
        if a.kind != "pinned":
            key = (a.gpu, a.tenant)
            self.by_tenant[key] = max(0, self.by_tenant[key] - a.size)

    def held(self, gpu: int, tenant: str) -> int:
        return self.by_tenant.get((gpu, tenant), 0)

    def sessions_of(self, tenant: str, gpu: int) -> list[int]:
        return [s.id for s in self.sessions.values() if s.tenant == tenant and s.gpu == gpu]

    def tenant_of(self, session: int) -> str | None:
        s = self.sessions.get(session)
        return s.tenant if s is not None else None


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
