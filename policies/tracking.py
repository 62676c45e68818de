"""Bookkeeping the memory policies share: which launches run on each GPU with which footprint,
and what each session and tenant holds. Plain data, fed from the policy events."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import AllocationView, LaunchView, Policy, SessionView


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

    def active(self, gpu: int, owners: set[str] | None = None,
               key: Callable[[LaunchView], str] = lambda lv: lv.tenant) -> dict[int, int]:
        """{allocation: size} of the movable memory running kernels on `gpu` use (of `owners`
        only, when given, by `key`): each allocation once, however many kernels use it."""
        out: dict[int, int] = {}
        for lv in self.by_id.values():
            if lv.gpu == gpu and (owners is None or key(lv) in owners):
                for r in lv.footprint:
                    if r.movable:
                        out[r.ptr] = r.size
        return out

    def active_by(self, gpu: int, key: Callable[[LaunchView], str] = lambda lv: lv.tenant) -> dict[str, int]:
        """Active movable bytes per owner (`key`: a launch's owner; default its tenant) on `gpu`."""
        per: dict[str, dict[int, int]] = defaultdict(dict)
        for lv in self.by_id.values():
            if lv.gpu == gpu:
                for r in lv.footprint:
                    if r.movable:
                        per[key(lv)][r.ptr] = r.size
        return {t: sum(d.values()) for t, d in per.items()}

    def pointers_of(self, session: int) -> tuple[int, ...]:
        """Allocations the session's running kernels use (what an eviction must keep)."""
        return tuple(sorted({r.ptr for lv in self.by_id.values() if lv.session == session
                             for r in lv.footprint}))


def need_bytes(launch: LaunchView, active: dict[int, int]) -> int:
    """Movable bytes the launch would bring in beyond what running kernels already use."""
    return sum(r.size for r in launch.footprint if r.movable and r.ptr not in active)


OWNERS = ("process", "tenant")
"""What a policy holds, throttles or budgets: each process (session), or each tenant."""


def check_owner(per: str) -> None:
    if per not in OWNERS:
        raise ValueError(f"per must be one of {', '.join(OWNERS)}, not {per!r}")


@dataclass
class Holdings:
    """Sessions (id -> view) and GPU memory held, from session and allocation events; pinned host
    memory does not count. `per` says what an owner is: "process" (a session, keyed "session
    N") or "tenant" (keyed by its name)."""
    per: str = "tenant"
    sessions: dict[int, SessionView] = field(default_factory=dict)
    by_owner: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))

    def owner(self, session: int, tenant: str) -> str:
        return tenant if self.per == "tenant" else f"session {session}"

    def owner_of(self, lv: LaunchView) -> str:
        return self.owner(lv.session, lv.tenant)

    def session_started(self, s: SessionView) -> None:
        self.sessions[s.id] = s

    def session_ended(self, s: SessionView) -> None:
        self.sessions.pop(s.id, None)

    def allocated(self, a: AllocationView) -> None:
        if a.kind != "pinned":
            self.by_owner[(a.gpu, self.owner(a.session, a.tenant))] += a.size

    def freed(self, a: AllocationView) -> None:
        if a.kind != "pinned":
            key = (a.gpu, self.owner(a.session, a.tenant))
            self.by_owner[key] = max(0, self.by_owner[key] - a.size)

    def held(self, gpu: int, owner: str) -> int:
        return self.by_owner.get((gpu, owner), 0)

    def sessions_of(self, owner: str, gpu: int) -> list[int]:
        return [s.id for s in self.sessions.values()
                if self.owner(s.id, s.tenant) == owner and s.gpu == gpu]

    def owner_of_session(self, session: int) -> str | None:
        s = self.sessions.get(session)
        return self.owner(s.id, s.tenant) if s is not None else None

    def tenant_of_owner(self, owner: str) -> str:
        """The tenant an owner belongs to (for metrics)."""
        if self.per == "tenant":
            return owner
        s = self.sessions.get(int(owner.split()[-1]))
        return s.tenant if s is not None else "?"


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class FootprintPolicy(Policy):
    """What MFit and AMFit share: they decide launches from footprints and kernel ends, and keep
    the running kernels and what each owner holds (Settings must have `per`). A subclass that
    overrides session_ended calls super() first."""

    decides_launches = True
    needs_footprint = True
    needs_kernel_end = True

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.running = RunningKernels()
        self.holdings = Holdings(self.settings.per)
        self.now = 0.0

    def session_started(self, s: SessionView) -> None:
        self.holdings.session_started(s)

    def session_ended(self, s: SessionView) -> None:
        self.holdings.session_ended(s)
        self.running.drop_session(s.id)

    def allocated(self, a: AllocationView) -> None:
        self.holdings.allocated(a)

    def freed(self, a: AllocationView) -> None:
        self.holdings.freed(a)
