"""MAdvise (PILOT): each process (or tenant) keeps a budget of movable memory on the GPU; under
pressure the rest of its movable memory is advised to stay in host memory.

- Owners: each process (session), or each tenant with `per = "tenant"`. An owner's movable
  memory is taken in allocation order; what lies beyond its `budget` is its excess.
- Pressure: the movable memory the owners keep on the GPU (all of it, less what is advised to
  host) is more than the GPU's room (capacity less fixed allocations). Then owners are
  *throttled*, the largest excess first, until the rest fits: their excess is advised to host
  memory (preferred location the CPU, accessed by the GPU: kernels read it remotely instead of
  migrating it) and moved there. Without pressure nothing is advised, so MAdvise costs nothing
  on a GPU that is not oversubscribed.
- When capacity frees (a kernel finishes, memory is freed, a session ends, and on the tick), the
  most deserving throttled owner, the one throttled longest whose advised memory fits in the
  room left, is unthrottled: the advice is lifted and its memory prefetched to the GPU (on the
  H100, unsetting the advice alone leaves the pages on the host).
- `budget` unset: a fair share, the room divided by the number of owners with movable memory on
  the GPU.
- Provisioned memory (`pilotctl quota set --provisioned`) is a guarantee: an owner's budget is
  at least its tenant's provisioned bytes on the GPU (with `per = "process"`, divided among the
  tenant's owners there), so no throttling advises that memory to host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .api import AllocationView, KernelView, Policy, SessionView
from .settings import Bytes, Seconds
from .tracking import check_owner, size_text


@dataclass(frozen=True, slots=True)
class MAdviseSettings:
    budget: Bytes | None = None  # movable bytes each owner keeps on the GPU; unset: a fair share
    per: str = "process"  # "process" (each session) or "tenant"
    recheck: Seconds = 0.1  # how often the tick looks for capacity that freed

    def __post_init__(self) -> None:
        check_owner(self.per)
        if self.budget is not None and self.budget <= 0:
            raise ValueError("budget must be above 0 (leave it out for a fair share)")


@dataclass
class Owner:
    key: str
    gpu: int
    allocations: list[tuple[int, int, int]] = field(default_factory=list)  # (session, ptr, size)
    advised: list[tuple[int, int, int]] = field(default_factory=list)  # (session, ptr, size)
    throttled_since: float | None = None

    @property
    def total(self) -> int:
        return sum(size for _s, _p, size in self.allocations)

    @property
    def advised_bytes(self) -> int:
        return sum(size for _s, _p, size in self.advised)


class MAdvise(Policy):
    name = "madvise"
    summary = ("MAdvise: keep each process within a device-memory budget and advise the rest "
               "to host memory")
    needs_kernel_end = True
    moves_memory = True
    Settings = MAdviseSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.owners: dict[str, Owner] = {}
        self.sessions: dict[int, SessionView] = {}
        self.now = 0.0
        self.last_check = 0.0

    def _key(self, session: int, tenant: str) -> str:
        return f"tenant:{tenant}" if self.settings.per == "tenant" else f"session:{session}"

    # -- events --
    def session_started(self, s: SessionView) -> None:
        self.sessions[s.id] = s

    def session_ended(self, s: SessionView) -> None:
        self.sessions.pop(s.id, None)
        self._rebalance(s.gpu)

    def allocated(self, a: AllocationView) -> None:
        if not a.movable:
            return
        key = self._key(a.session, a.tenant)
        owner = self.owners.setdefault(key, Owner(key, a.gpu))
        owner.allocations.append((a.session, a.ptr, a.size))
        self._rebalance(a.gpu)

    def freed(self, a: AllocationView) -> None:
        if not a.movable:
            return
        owner = self.owners.get(self._key(a.session, a.tenant))
        if owner is None:
            return
        owner.allocations = [x for x in owner.allocations if x[1] != a.ptr]
        owner.advised = [x for x in owner.advised if not a.ptr <= x[1] < a.ptr + a.size]
        if not owner.advised:
            owner.throttled_since = None
        if not owner.allocations:
            del self.owners[owner.key]
        self._rebalance(a.gpu)

    def kernel_finished(self, k: KernelView) -> None:
        self.now = max(self.now, k.finished_at)
        self._rebalance(k.gpu)

    def tick(self, now: float) -> None:
        self.now = now
        if now - self.last_check >= self.settings.recheck:
            self.last_check = now
            for gpu in {o.gpu for o in self.owners.values() if o.advised}:
                self._rebalance(gpu)

    # -- the policy --
    def budget(self, gpu: int, room: int) -> int:
        if self.settings.budget is not None:
            return self.settings.budget
        owners = sum(1 for o in self.owners.values() if o.gpu == gpu)
        return room // max(1, owners)

    def owner_budget(self, o: Owner, budget: int) -> int:
        """`budget`, or o's share of its tenant's provisioned bytes on the GPU when larger."""
        tenant = self._tenant(o)
        provisioned = self.controls.provisioned(tenant, o.gpu)
        if not provisioned:
            return budget
        peers = sum(1 for p in self.owners.values() if p.gpu == o.gpu and self._tenant(p) == tenant)
        return max(budget, provisioned // max(1, peers))

    def _rebalance(self, gpu: int) -> None:
        room = self.controls.gpu(gpu).room
        owners = [o for o in self.owners.values() if o.gpu == gpu]
        kept = sum(o.total - o.advised_bytes for o in owners)
        if kept > room:
            common = self.budget(gpu, room)
            budgets = {o.key: self.owner_budget(o, common) for o in owners}
            for o in sorted(owners, key=lambda o: (-(o.total - budgets[o.key]), o.key)):
                if kept <= room:
                    break
                kept -= self._throttle(o, budgets[o.key])
            return
        free = room - kept
        for o in sorted((o for o in owners if o.advised), key=lambda o: (o.throttled_since or 0, o.key)):
            if o.advised_bytes <= free:
                free -= o.advised_bytes
                self._unthrottle(o)

    def _throttle(self, o: Owner, budget: int) -> int:
        """Advise o's memory beyond `budget` (not yet advised) to host; returns the bytes."""
        done, offset = 0, 0
        for session, ptr, size in o.allocations:
            start = max(0, budget - offset)
            offset += size
            if start >= size:
                continue
            # What is advised of an allocation is a tail of it; a smaller budget (a fair share
            # shrinks as owners come) adds only the part in front of that tail.
            end = min((p for _s, p, _n in o.advised if ptr <= p < ptr + size), default=ptr + size)
            if ptr + start >= end:
                continue
            piece = (ptr + start, end - ptr - start)
            self.controls.advise_host(session, *piece)
            o.advised.append((session, *piece))
            done += piece[1]
        if done and o.throttled_since is None:
            o.throttled_since = self.now
            self.controls.report("throttle", self._tenant(o))
        return done

    def _unthrottle(self, o: Owner) -> None:
        for session, ptr, size in o.advised:
            self.controls.unadvise(session, ptr, size, prefetch=True)
        o.advised = []
        o.throttled_since = None
        self.controls.report("unthrottle", self._tenant(o))

    def _tenant(self, o: Owner) -> str:
        if o.key.startswith("tenant:"):
            return o.key[len("tenant:"):]
        s = self.sessions.get(int(o.key.split(":", 1)[1]))
        return s.tenant if s is not None else "?"

    # -- reports --
    def session_status(self, session: int) -> tuple[str, str] | None:
        s = self.sessions.get(session)
        owner = self.owners.get(self._key(session, s.tenant)) if s is not None else None
        if owner is None or not owner.advised:
            return None
        return "throttled", (f"madvise: {size_text(owner.advised_bytes)} of {size_text(owner.total)} "
                             f"kept in host memory ({self.settings.per} over its budget)")

    def state(self) -> dict[str, Any]:
        return {"owners": {o.key: {"gpu": o.gpu, "bytes": o.total, "advised": o.advised_bytes}
                           for o in self.owners.values()}}
