"""MFit (PILOT): a kernel is launched only when its memory footprint fits.

Owners are each process, or with `per = "tenant"` each tenant. On each GPU they are *ranked* by
the GPU memory they hold: the less an owner holds, the higher it ranks (ties: the older
session). An owner that preempted others ranks above everyone while its holds last; held owners
rank below everyone. The rank says who yields to whom:

- **Fit.** A launch fits when the movable memory it points into, together with what its own
  owner's running kernels use, fits in the GPU's room (capacity less fixed allocations) less the
  movable memory that the owners ranked above it keep resident, or in its tenant's provisioned
  bytes (`pilotctl quota set --provisioned`, a guarantee) less what the tenant's other owners
  keep, whichever is more. What owners ranked below it
  keep is not counted: the enforcer evicts it to make room (the policy sets its eviction order,
  lowest rank first), so a program that holds much memory cannot push out a smaller one, it can
  only thrash through its own memory.
- **Nothing running.** A launch with no kernel running on its GPU starts at once, fit or not.
- **Waiting.** Launches that do not fit wait; the daemon asks them again, oldest first, after
  every kernel end and tick. A launch that fits is not held behind one that does not (a small
  program must not wait behind a big one's piece): the wait limit guards the waiting one.
- **Preemption.** When a launch has waited `preempt_after`, the owners ranked above it that keep
  memory on the GPU are preempted, most memory held first, until what they keep would make it
  fit. *Preempt* means: the owner's further launches on that GPU wait (it is *held*), its idle
  movable memory (not used by its running kernels) is evicted to host memory, and, with
  `preempt_kernels` and `[priority] preempt`, its running kernels are stopped at their next block boundary
  (Controls.preempt: what is left of each waits on its stream; the enforcer may then evict the
  memory they used, and brings it back before they resume). So that there are kernels to stop,
  the sessions on a GPU launch preemptible variants while a launch waits there
  (Controls.preemptible). The holds last while the preempting session keeps the GPU busy (a
  kernel running or waiting within `preempt_after`), and at most `max_hold`, so that owners
  take turns instead of one starving; they are lifted (the owners resumed) when it ends or
  gives up waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import RUN, Decision, KernelView, LaunchView, SessionView
from .settings import Seconds
from .tracking import FootprintPolicy, check_owner, size_text


@dataclass(frozen=True, slots=True)
class MFitSettings:
    preempt_after: Seconds = 2.0  # a launch waiting this long preempts others; 0: never
    max_hold: Seconds = 10.0  # holds made for one session last at most this long; 0: no limit
    per: str = "process"  # what is ranked and preempted: each process, or a whole tenant ("tenant")
    preempt_kernels: bool = False  # stop a held owner's running kernels too ([priority] preempt)

    def __post_init__(self) -> None:
        if self.preempt_after < 0:
            raise ValueError("preempt_after must be 0 or more")
        if self.max_hold < 0:
            raise ValueError("max_hold must be 0 or more")
        check_owner(self.per)


@dataclass
class Protection:
    """A session that preempted others: its GPU, since when, when it was last busy."""
    gpu: int
    since: float
    busy: float


class MFit(FootprintPolicy):
    name = "mfit"
    summary = "MFit: launch a kernel only when its memory footprint fits the GPU's free capacity"
    Settings = MFitSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.waiting: dict[int, dict[int, LaunchView]] = {}  # gpu -> launch id -> view, oldest first
        self.holds: dict[tuple[int, str], int] = {}  # (gpu, held owner) -> the session it yields to
        self.protected: dict[int, Protection] = {}  # sessions that preempted others
        self.preempted_for: set[int] = set()  # waiting launches that preempted others
        self._ranks: dict[int, list[str]] = {}  # gpu -> ranking(), kept by _rerank
        self.released_at: dict[int, float] = {}  # session -> when its holds were last lifted

    # -- sessions and memory: the ranks change --
    def session_started(self, s: SessionView) -> None:
        super().session_started(s)
        self._rerank(s.gpu)

    def session_ended(self, s: SessionView) -> None:
        super().session_ended(s)
        for queue in self.waiting.values():
            for launch_id in [i for i, lv in queue.items() if lv.session == s.id]:
                self.preempted_for.discard(queue.pop(launch_id).id)
        self._release(s.id)
        self.released_at.pop(s.id, None)
        self._rerank(s.gpu)
        self._calm(s.gpu)

    def allocated(self, a: Any) -> None:
        super().allocated(a)
        self._rerank(a.gpu)

    def freed(self, a: Any) -> None:
        super().freed(a)
        self._rerank(a.gpu)

    def ranking(self, gpu: int) -> list[str]:
        """The owners with sessions on `gpu`, lowest rank (first to yield) first."""
        h = self.holdings
        first = h.owners_on(gpu)
        protected = {h.owner_of_session(sid) for sid, p in self.protected.items() if p.gpu == gpu}

        def key(owner: str) -> tuple[int, int, int]:
            band = 0 if (gpu, owner) in self.holds else 2 if owner in protected else 1
            return band, -h.held(gpu, owner), -first[owner]
        return sorted(first, key=key)

    def _rerank(self, gpu: int) -> None:
        """Recompute the GPU's ranking (after anything it depends on changed) and tell the
        enforcer the eviction order (lowest rank's sessions first) if it changed."""
        ranks = self._ranks[gpu] = self.ranking(gpu)
        self.set_order(gpu, ranks)

    def _above(self, gpu: int, owner: str) -> list[str]:
        ranking = self._ranks.get(gpu)
        if ranking is None:
            ranking = self._ranks[gpu] = self.ranking(gpu)
        return ranking[ranking.index(owner) + 1:] if owner in ranking else list(ranking)

    def _kept(self, gpu: int, owner: str) -> int:
        """Movable bytes the owner keeps resident on the GPU."""
        return sum(self.controls.resident(sid) for sid in self.holdings.sessions_of(owner, gpu))

    # -- launches --
    def launch_requested(self, launch: LaunchView) -> Decision:
        gpu = launch.gpu
        self._busy(launch.session, launch.now)
        queue = self.waiting.setdefault(gpu, {})
        me = self.holdings.owner_of(launch)
        held_for = self.holds.get((gpu, me))
        if held_for is not None:
            self._left(queue, launch)
            return Decision.wait(f"held: preempted for session {held_for}")
        if not self.running.owners_on(gpu):
            self._left(queue, launch)
            return Decision.run("nothing else running") if launch.attempts > 1 else RUN
        if not launch.movable_bytes:
            self._left(queue, launch)
            return RUN
        mine = self.running.owner_pointers(gpu, me)
        need = self.running.owner_bytes(gpu, me) + \
            sum(r.size for r in launch.footprint if r.movable and r.ptr not in mine)
        above = self._above(gpu, me)
        room = self.controls.gpu(gpu).room
        free = max(room - sum(self._kept(gpu, o) for o in above), self._guaranteed(launch, me, room))
        if need <= free:
            self._left(queue, launch)
            return RUN
        if not queue:
            self.set_preemptible(gpu, True)  # a launch waits here: a preemption may follow
        queue[launch.id] = launch
        waited = launch.now - max(launch.requested_at, self.released_at.get(launch.session, 0.0))
        if self.settings.preempt_after and waited >= self.settings.preempt_after \
                and launch.id not in self.preempted_for:
            self._preempt(launch, above, need - free)
        return Decision.wait(f"needs {size_text(need)}, {size_text(max(0, free))} free")

    def _left(self, queue: dict[int, LaunchView], launch: LaunchView) -> None:
        """The launch does not wait (any more); with none waiting, the GPU's sessions launch
        their originals again."""
        if queue.pop(launch.id, None) is not None and not queue:
            self._calm(launch.gpu)

    def _calm(self, gpu: int) -> None:
        if not self.waiting.get(gpu) and not any(g == gpu for g, _o in self.holds):
            self.set_preemptible(gpu, False)

    def _guaranteed(self, launch: LaunchView, me: str, room: int) -> int:
        """What the launch's tenant is provisioned on the GPU (at most the room), less what its
        other owners keep there: that much fits whatever the owners ranked above keep (the
        enforcer evicts theirs)."""
        provisioned = self.controls.provisioned(launch.tenant, launch.gpu)
        if not provisioned:
            return 0
        h = self.holdings
        peers = [o for o in h.owners_on(launch.gpu) if o != me and h.tenant_of_owner(o) == launch.tenant]
        return min(room, provisioned) - sum(self._kept(launch.gpu, o) for o in peers)

    def _preempt(self, launch: LaunchView, above: list[str], short: int) -> None:
        """Hold the owners ranked above the launch's that keep memory on its GPU, most memory
        held first, until what they keep covers `short` bytes; evict their idle memory."""
        self.preempted_for.add(launch.id)
        gpu = launch.gpu
        if launch.session not in self.protected:
            self.protected[launch.session] = Protection(gpu, launch.now, launch.now)
        h = self.holdings
        for owner in sorted(above, key=lambda o: (-h.held(gpu, o), o)):
            if short <= 0:
                break
            kept = self._kept(gpu, owner)
            if not kept or (gpu, owner) in self.holds:
                continue
            self.holds[(gpu, owner)] = launch.session
            self.controls.report("hold", h.tenant_of_owner(owner))
            self.preempt_owner(owner, gpu)
            for session in h.sessions_of(owner, gpu):
                self.controls.evict(session, keep=self.running.pointers_of(session))
            short -= kept
        self._rerank(gpu)

    def launch_started(self, launch: LaunchView) -> None:
        self.running.started(launch)
        self.preempted_for.discard(launch.id)
        self._busy(launch.session, launch.now)

    def launch_dropped(self, launch: LaunchView, why: str) -> None:
        self.waiting.get(launch.gpu, {}).pop(launch.id, None)
        if launch.id in self.preempted_for:  # it gave up: the others may go on
            self.preempted_for.discard(launch.id)
            self._release(launch.session)
            self._rerank(launch.gpu)
        self._calm(launch.gpu)

    def kernel_finished(self, k: KernelView) -> None:
        self.running.finished(k.launch)
        self.now = max(self.now, k.finished_at)
        self._busy(k.session, k.finished_at)
        if self.protected:
            self._release_idle()

    def tick(self, now: float) -> None:
        self.now = now
        if self.protected:
            self._release_idle()

    def _busy(self, session: int, now: float) -> None:
        self.now = max(self.now, now)
        p = self.protected.get(session)
        if p is not None:
            p.busy = now

    def _release_idle(self) -> None:
        """Lift the holds made for a session that has had no kernel running or waiting on the
        GPU for preempt_after (it no longer needs the room), or that has had them max_hold."""
        limit = self.settings.max_hold
        for session, p in list(self.protected.items()):
            busy = self.running.session_busy(session) or \
                any(lv.session == session for lv in self.waiting.get(p.gpu, {}).values())
            idle = not busy and self.now - p.busy >= self.settings.preempt_after
            if idle or (limit and self.now - p.since >= limit):
                self._release(session)
                self._rerank(p.gpu)

    def _release(self, session: int) -> None:
        """Lift the holds made for the session; its waiting launches may preempt again once
        they have waited preempt_after more (so that owners take turns)."""
        if self.protected.pop(session, None) is not None:
            self.released_at[session] = self.now
        for key in [k for k, s in self.holds.items() if s == session]:
            del self.holds[key]
            self.controls.report("release", self.holdings.tenant_of_owner(key[1]))
            self.resume_owner(key[1], key[0])
            self._calm(key[0])
        for queue in self.waiting.values():  # its waiting launches may preempt again later
            self.preempted_for.difference_update(i for i, lv in queue.items() if lv.session == session)

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
                "held": {f"{t}@{g}": s for (g, t), s in self.holds.items()},
                "ranking": {str(g): self.ranking(g) for g in sorted(self._ranks)}}
