"""Bookkeeping the memory policies share: which launches run on each GPU with which footprint,
and what each session and tenant holds. Plain data, fed from the policy events."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .api import AllocationView, LaunchView, Policy, SessionView


class RunningKernels:
    """Launches started and not yet finished (launch_started .. kernel_finished), with the
    movable memory they use counted incrementally: per GPU and per owner (`key`: a launch's
    owner, default its tenant), each allocation with how many running kernels use it. So the
    queries a policy makes on every launch cost the number of allocations, not of launches (a
    program may have thousands of kernels queued)."""

    def __init__(self, key: Callable[[LaunchView], str] = lambda lv: lv.tenant) -> None:
        self.key = key
        self.by_id: dict[int, LaunchView] = {}
        self._gpu: dict[int, dict[int, list[int]]] = {}  # gpu -> ptr -> [kernels, size]
        self._owner: dict[tuple[int, str], dict[int, int]] = {}  # (gpu, owner) -> ptr -> kernels
        self._launches: dict[tuple[int, str], int] = {}  # (gpu, owner) -> running launches
        self._sessions: dict[int, int] = {}  # session -> running launches
        self._bytes: dict[tuple[int, str], int] = {}  # (gpu, owner) -> its active bytes
        self._gpu_bytes: dict[int, int] = {}  # gpu -> active bytes (each allocation once)

    def started(self, launch: LaunchView) -> None:
        if launch.id in self.by_id:
            return
        self.by_id[launch.id] = launch
        owner = (launch.gpu, self.key(launch))
        self._launches[owner] = self._launches.get(owner, 0) + 1
        self._sessions[launch.session] = self._sessions.get(launch.session, 0) + 1
        movable = self._movable(launch)
        if not movable:
            return
        refs, mine = self._gpu.setdefault(launch.gpu, {}), self._owner.setdefault(owner, {})
        for ptr, size in movable.items():
            ref = refs.setdefault(ptr, [0, size])
            if not ref[0]:
                self._gpu_bytes[launch.gpu] = self._gpu_bytes.get(launch.gpu, 0) + size
            ref[0] += 1
            n = mine.get(ptr, 0)
            if not n:
                self._bytes[owner] = self._bytes.get(owner, 0) + size
            mine[ptr] = n + 1

    def finished(self, launch_id: int) -> LaunchView | None:
        launch = self.by_id.pop(launch_id, None)
        if launch is None:
            return None
        owner = (launch.gpu, self.key(launch))
        self._drop(self._launches, owner)
        self._drop(self._sessions, launch.session)
        movable = self._movable(launch)
        if not movable:
            return launch
        refs, mine = self._gpu[launch.gpu], self._owner[owner]
        for ptr in movable:
            ref = refs[ptr]
            ref[0] -= 1
            if not ref[0]:
                del refs[ptr]
                self._drop_bytes(self._gpu_bytes, launch.gpu, ref[1])
            if mine[ptr] == 1:
                self._drop_bytes(self._bytes, owner, ref[1])
            self._drop(mine, ptr)
        if not mine:
            del self._owner[owner]
        return launch

    @staticmethod
    def _drop_bytes(totals: dict[Any, int], key: Any, size: int) -> None:
        n = totals[key] - size
        if n:
            totals[key] = n
        else:
            del totals[key]

    @staticmethod
    def _movable(launch: LaunchView) -> dict[int, int]:
        return {r.ptr: r.size for r in launch.footprint if r.movable}

    @staticmethod
    def _drop(counts: dict[Any, int], key: Any) -> None:
        n = counts[key] - 1
        if n:
            counts[key] = n
        else:
            del counts[key]

    def drop_session(self, session: int) -> None:
        for launch_id in [i for i, lv in self.by_id.items() if lv.session == session]:
            self.finished(launch_id)

    def owners_on(self, gpu: int) -> set[str]:
        """Owners with kernels running on `gpu`."""
        return {o for (g, o) in self._launches if g == gpu}

    def session_busy(self, session: int) -> bool:
        return session in self._sessions

    def active(self, gpu: int, owners: set[str] | None = None) -> dict[int, int]:
        """{allocation: size} of the movable memory running kernels on `gpu` use (of `owners`
        only, when given): each allocation once, however many kernels use it."""
        refs = self._gpu.get(gpu, {})
        if owners is None:
            return {ptr: size for ptr, (_n, size) in refs.items()}
        return {ptr: refs[ptr][1] for o in owners for ptr in self._owner.get((gpu, o), ())}

    def owner_bytes(self, gpu: int, owner: str) -> int:
        """Active movable bytes of `owner` on `gpu` (kept as kernels start and end)."""
        return self._bytes.get((gpu, owner), 0)

    def owner_pointers(self, gpu: int, owner: str) -> Mapping[int, int]:
        """The allocations `owner`'s running kernels on `gpu` use (a live view: do not keep)."""
        return self._owner.get((gpu, owner), {})

    def gpu_bytes(self, gpu: int) -> int:
        """Active movable bytes on `gpu`, each allocation once."""
        return self._gpu_bytes.get(gpu, 0)

    def active_others(self, gpu: int, owner: str) -> int:
        """Bytes of movable memory kernels of owners other than `owner` use on `gpu`."""
        mine = self._owner.get((gpu, owner), {})
        return sum(size for ptr, (n, size) in self._gpu.get(gpu, {}).items() if n > mine.get(ptr, 0))

    def active_by(self, gpu: int) -> dict[str, int]:
        """Active movable bytes per owner on `gpu`."""
        return {o: n for (g, o), n in self._bytes.items() if g == gpu}

    def pointers_of(self, session: int) -> tuple[int, ...]:
        """Allocations the session's running kernels use (what an eviction must keep)."""
        return tuple(sorted({r.ptr for lv in self.by_id.values() if lv.session == session
                             for r in lv.footprint}))


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

    def owners_on(self, gpu: int) -> dict[str, int]:
        """The owners with sessions on `gpu`, each with the id of its oldest session."""
        first: dict[str, int] = {}
        for s in self.sessions.values():
            if s.gpu == gpu:
                owner = self.owner(s.id, s.tenant)
                first[owner] = min(first.get(owner, s.id), s.id)
        return first

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
    # What they admit comes in before the kernel: a program thrashing through its own memory
    # then copies it in bulk instead of faulting page by page with its kernel on the SMs
    # (measured: bench/RESULTS.md).
    prefetches_footprint = True

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        # With `preempt_kernels` (and `[priority] preempt`), a held owner's running kernels are
        # preempted too (Controls.preempt), as PILOT stops the kernels of the process it
        # preempts. Off by default: on the H200 it gained nothing clear, and gather under AMFit
        # at 1.5x C was killed at 15 s in two runs of four (bench/RESULTS.md, nineteenth session).
        self.preempts_kernels = bool(getattr(self.settings, "preempt_kernels", False))
        self.holdings = Holdings(self.settings.per)
        self.running = RunningKernels(self.holdings.owner_of)
        self.now = 0.0
        self._orders: dict[int, tuple[int, ...]] = {}  # gpu -> the eviction order last set
        self._preemptible: dict[int, bool] = {}  # gpu -> its sessions launch preemptible variants
        self.preempted: set[int] = set()  # sessions preempted (Controls.preempt), not resumed

    def _cuts_kernels(self) -> bool:
        """preempt_kernels is set and pilotd can stop kernels for this policy."""
        return self.preempts_kernels and self.controls.can_preempt()

    def set_preemptible(self, gpu: int, on: bool) -> None:
        """The sessions on `gpu` launch their kernels as preemptible variants (on: a preemption
        may come soon), or as they are, if that changed (Controls.preemptible)."""
        if self._preemptible.get(gpu, False) == on or not self._cuts_kernels():
            return
        self._preemptible[gpu] = on
        for s in self.holdings.sessions.values():
            if s.gpu == gpu:
                self.controls.preemptible(s.id, on)

    def preempt_owner(self, owner: str, gpu: int) -> None:
        """Stop the owner's running kernels on `gpu` where pilotd can (Controls.preempt)."""
        if not self._cuts_kernels():
            return
        for sid in self.holdings.sessions_of(owner, gpu):
            if sid not in self.preempted:
                self.preempted.add(sid)
                self.controls.preempt(sid)

    def resume_owner(self, owner: str, gpu: int) -> None:
        for sid in self.holdings.sessions_of(owner, gpu):
            if sid in self.preempted:
                self.preempted.discard(sid)
                self.controls.resume(sid)

    def set_order(self, gpu: int, owners: list[str]) -> None:
        """Give the enforcer these owners' sessions as its eviction order on `gpu` (the first
        owner's memory goes first), if it changed."""
        order = tuple(sid for owner in owners for sid in sorted(self.holdings.sessions_of(owner, gpu)))
        if self._orders.get(gpu) != order:
            self._orders[gpu] = order
            self.controls.set_eviction_order(gpu, order)

    def session_started(self, s: SessionView) -> None:
        self.holdings.session_started(s)
        if self._preemptible.get(s.gpu):
            self.controls.preemptible(s.id, True)

    def session_ended(self, s: SessionView) -> None:
        self.holdings.session_ended(s)
        self.running.drop_session(s.id)
        self.preempted.discard(s.id)  # pilotd lowers its word as it ends

    def allocated(self, a: AllocationView) -> None:
        self.holdings.allocated(a)

    def freed(self, a: AllocationView) -> None:
        self.holdings.freed(a)
