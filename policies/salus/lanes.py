"""Salus lanes and their admission (Yu & Chowdhury, "Salus", Algorithm 1), as plain bookkeeping.

A job's memory is its persistent part P (alive across iterations) and its ephemeral part E (the
scratch of one iteration). Admitted jobs are placed in *lanes*: iterations are serialized within a
lane and run in parallel across lanes, so a lane needs room for the largest E of its jobs, its
size L. Admission keeps the **safety condition**

    sum(P_i of admitted jobs) + sum(L_j of lanes) <= C

at every moment, so no admitted iteration can run out of memory and no two lanes can deadlock
waiting for each other's scratch.

`Lanes.admit(job, P, E)` runs Algorithm 1, in this order:
1. **Wait** when P alone does not fit: sum(P) + P + sum(L) > C.
2. **Create** a lane of size E when it fits beside everything: sum(P) + P + sum(L) + E <= C
   (the most parallelism).
3. **Reuse** a lane whose size already covers E. The paper says "best match" without defining
   it; here it is the *smallest* such lane (least scratch wasted: a small job does not take a
   turn in the lane of a big one when a closer lane exists), ties: the fewest jobs, then the
   oldest lane.
4. **Grow** a lane smaller than E to E when sum(P) + P + sum(L) - L_j + E <= C. Which one: the
   paper grows "the smallest lane that can grow" (`grow="smallest"`, the default); `"closest"`
   grows the largest lane below E instead, which needs the least new memory. Any lane that can
   grow satisfies the same condition, so the choice changes only where the job runs.
5. Otherwise **wait** (`admit` returns None; the caller asks again when memory frees).

`shared=True` tries reuse and grow before create: for schedulers that run one job at a time
(FIFO, SRTF) extra lanes would only hold memory, while one lane as large as the largest E lets
the most jobs keep their P on the GPU (so a short job can be admitted and preempt a long one).

Lanes **shrink**: the paper leaves it open. Here a lane's size is always the largest E of its
jobs: when a job leaves (or is re-measured smaller), the lane shrinks at once, which can only
lower sum(L), so it is always safe; an empty lane is removed. A job re-measured larger
(`update`) keeps its place only if its lane can grow within the condition; otherwise it leaves
its lane and must be admitted again.

Memory held **outside** the lanes counts too: a job that left its lane still holds its P, and a
job not admitted yet may hold what it set itself up with (`hold_outside`). `used` is
sum(P) + sum(L) + what is held outside, and every admission and growth keeps *that* within C:
the bytes a job holds are counted from the moment it holds them to the moment it frees them,
whether it has a lane or not (a job that left its lane used to drop its P from the sum while it
still held it). `fits` says whether new sizes of an admitted job keep the condition, before
they are applied (the policy refuses an allocation that would not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GROW_CHOICES = ("smallest", "closest")
HOW = ("create", "reuse", "grow")


@dataclass(slots=True)
class Lane:
    """One lane: its size L (the largest E of its jobs) and its jobs in admission order."""
    id: int
    size: int
    jobs: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where Algorithm 1 puts a job: `how` in HOW, the lane, and the lane's size after."""
    how: str
    lane: int
    size: int


@dataclass(slots=True)
class _Member:
    persistent: int
    ephemeral: int
    lane: int


class Lanes:
    """The lanes of one GPU of capacity C (bytes). Not thread-safe (the policy lock serializes)."""

    def __init__(self, capacity: int, grow: str = "smallest", shared: bool = False) -> None:
        if capacity < 0:
            raise ValueError("capacity must be 0 or more")
        if grow not in GROW_CHOICES:
            raise ValueError(f"grow must be one of {GROW_CHOICES}, not {grow!r}")
        self.capacity = capacity
        self.grow = grow
        self.shared = shared
        self.lanes: dict[int, Lane] = {}
        self.members: dict[int, _Member] = {}  # admitted job -> its sizes and lane
        self._persistent = 0  # sum(P) of admitted jobs
        self._lane_sizes = 0  # sum(L)
        self.outside: dict[int, int] = {}  # job without a lane -> the bytes it holds
        self._outside = 0  # their sum
        self._next_lane = 1

    # ---- reading ----
    @property
    def used(self) -> int:
        """sum(P) + sum(L) + what jobs without a lane hold: what the safety condition keeps
        within the capacity."""
        return self._persistent + self._lane_sizes + self._outside

    @property
    def outside_bytes(self) -> int:
        return self._outside

    @property
    def persistent(self) -> int:
        return self._persistent

    @property
    def lane_bytes(self) -> int:
        return self._lane_sizes

    def lane_of(self, job: int) -> int | None:
        m = self.members.get(job)
        return m.lane if m is not None else None

    def __contains__(self, job: int) -> bool:
        return job in self.members

    def safe(self) -> bool:
        """The safety condition, recomputed from scratch (the tests' oracle)."""
        p = sum(m.persistent for m in self.members.values())
        sizes = sum(lane.size for lane in self.lanes.values())
        out = sum(self.outside.values())
        fits = all(self.members[j].ephemeral <= lane.size for lane in self.lanes.values()
                   for j in lane.jobs)
        return (p + sizes + out <= self.capacity and p == self._persistent and sizes == self._lane_sizes
                and out == self._outside and not self.outside.keys() & self.members.keys()
                and fits and all(lane.jobs for lane in self.lanes.values()))

    # ---- Algorithm 1 ----
    def plan(self, persistent: int, ephemeral: int, job: int | None = None) -> Placement | None:
        """Where a job of these sizes would go now, or None: it waits. Changes nothing. What
        `job` holds outside the lanes is replaced by its P once admitted."""
        if persistent < 0 or ephemeral < 0:
            raise ValueError("sizes must be 0 or more")
        base = self.used - self.outside.get(job, 0) + persistent  # type: ignore[arg-type]
        room = self.capacity - base
        if room < 0:
            return None
        if ephemeral <= room and not (self.shared and self.lanes):
            return Placement("create", 0, ephemeral)
        fitting = [lane for lane in self.lanes.values() if lane.size >= ephemeral]
        if fitting:
            best = min(fitting, key=lambda lane: (lane.size, len(lane.jobs), lane.id))
            return Placement("reuse", best.id, best.size)
        growable = [lane for lane in self.lanes.values() if ephemeral - lane.size <= room]
        if not growable:
            return Placement("create", 0, ephemeral) if ephemeral <= room else None
        if self.grow == "smallest":
            lane = min(growable, key=lambda lane: (lane.size, lane.id))
        else:
            lane = min(growable, key=lambda lane: (-lane.size, lane.id))
        return Placement("grow", lane.id, ephemeral)

    def admit(self, job: int, persistent: int, ephemeral: int) -> Placement | None:
        """Admit `job` (not admitted yet) by Algorithm 1; None: it must wait."""
        if job in self.members:
            raise ValueError(f"job {job} is already admitted")
        p = self.plan(persistent, ephemeral, job)
        if p is None:
            return None
        self._outside -= self.outside.pop(job, 0)
        if p.how == "create":
            lane = Lane(self._next_lane, ephemeral)
            self._next_lane += 1
            self.lanes[lane.id] = lane
            self._lane_sizes += ephemeral
            p = Placement("create", lane.id, ephemeral)
        else:
            lane = self.lanes[p.lane]
            self._lane_sizes += p.size - lane.size
            lane.size = p.size
        lane.jobs.append(job)
        self.members[job] = _Member(persistent, ephemeral, lane.id)
        self._persistent += persistent
        return p

    def hold_outside(self, job: int, held: int) -> None:
        """`job`, which has no lane, now holds `held` bytes (0: nothing, it is forgotten)."""
        if job in self.members:
            raise ValueError(f"job {job} is admitted: its bytes are counted in its lane")
        self._outside += held - self.outside.pop(job, 0)
        if held:
            self.outside[job] = held

    def remove(self, job: int, holding: int = 0) -> None:
        """The job ends (or gives its place back): its P leaves, its lane shrinks to the largest
        E of the jobs left, and a lane left empty is removed. `holding`: the bytes it still
        holds, counted outside the lanes until it frees them. Unknown jobs are forgotten."""
        m = self.members.pop(job, None)
        if m is None:
            self.hold_outside(job, holding)
            return
        self.hold_outside(job, holding)
        self._persistent -= m.persistent
        lane = self.lanes[m.lane]
        lane.jobs.remove(job)
        self._resize(lane)

    def update(self, job: int, persistent: int, ephemeral: int, force: bool = False) -> bool:
        """New sizes of an admitted job (re-measured at an iteration boundary). True: it keeps its
        lane (grown or shrunk to fit); False: the new sizes break the safety condition where it
        is, so it has left its lane (its P still counted, outside) and must be admitted again.
        With `force` it keeps its lane even so (memory it already holds, which the policy could
        not refuse): `used` then exceeds the capacity and nothing is admitted until it is back
        within."""
        m = self.members[job]
        lane = self.lanes[m.lane]
        if not force and not self.fits(job, persistent, ephemeral):
            self.remove(job, holding=persistent)  # at a boundary it holds its P
            return False
        self._persistent += persistent - m.persistent
        m.persistent, m.ephemeral = persistent, ephemeral
        self._resize(lane)
        return True

    def fits(self, job: int, persistent: int, ephemeral: int) -> bool:
        """Would these new sizes of admitted `job` keep the safety condition (its lane grown or
        shrunk to the largest E of its jobs)? Changes nothing."""
        m = self.members[job]
        lane = self.lanes[m.lane]
        others = max((self.members[j].ephemeral for j in lane.jobs if j != job), default=0)
        new_size = max(others, ephemeral)
        return self.used - m.persistent + persistent - lane.size + new_size <= self.capacity

    def _resize(self, lane: Lane) -> None:
        size = max((self.members[j].ephemeral for j in lane.jobs), default=0)
        self._lane_sizes += size - lane.size
        lane.size = size
        if not lane.jobs:
            del self.lanes[lane.id]

    # ---- reports ----
    def describe(self) -> list[dict[str, object]]:
        """The lanes for pilotctl: id, size, jobs with their P and E."""
        return [{"lane": lane.id, "size": lane.size,
                 "jobs": [{"job": j, "persistent": self.members[j].persistent,
                           "ephemeral": self.members[j].ephemeral} for j in lane.jobs]}
                for lane in sorted(self.lanes.values(), key=lambda lane: lane.id)]
