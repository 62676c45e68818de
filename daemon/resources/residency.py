"""The capacity enforcer: pilot keeps the movable memory resident on each GPU within its
capacity C, so a GPU can be shared as if it were a smaller one (`[gpu] enforce_capacity`).

Movable memory is managed memory (cudaMallocManaged), and cudaMalloc when `[gpu]
managed_device_memory` serves it with managed memory. The driver would keep it on the card
until the card (80 GB on an H100) is full; pilot instead evicts, with cudaMemPrefetchAsync to
host memory, the least recently used idle ranges whenever something is about to bring more onto
the GPU than the room left: room = C less the fixed allocations (device memory, module globals,
limits), which are charged to the GPU's budget as before.

Residency is a model, kept at extent granularity (an allocation is cut into extents of at most
EXTENT_MAX bytes, on 2 MiB boundaries): an extent becomes resident when a launch's arguments
point into its allocation (the whole allocation counts: the kernel may touch any of it), when
the program copies or prefetches into it, or when a policy prefetches it; it stops being
resident when pilot evicts it or the program prefetches it to the CPU. The model over-counts
(a kernel may touch less than its allocations), so what is really on the GPU stays at or below
it; bench/RESULTS.md compares it with what the driver reports.

Extents a running kernel uses are *active* (their launches are watched to completion) and are
evicted only when no idle extent is left; `overflows` counts the times even that was not enough
(one launch's footprint larger than the room), in which case the kernel runs anyway: pilot
emulates a smaller GPU, it does not refuse what a smaller GPU would thrash through.

Policies act through the same object (Controls: evict a session's idle ranges, keep a range in
host memory, lift that); those requests run on the scheduler thread, on a stream of the GPU's
own. Thread-safe: one lock per GPU, held only to update the model and plan the moves
(`Moves`); the moves themselves are issued after it is released, by the thread that needs
them. cuMemPrefetchAsync does its work on the calling thread (H100: about 110 ms per GiB to
the host, 23 ms to the device; bench/prefetch_cost.py), and under the lock every other
session's launch on the GPU waited for it.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import EVENT_DISABLE_TIMING
from pilot.daemon.resources import pagemap

if TYPE_CHECKING:
    from pilot.daemon.backends.base import Backend
    from pilot.daemon.resources.broker import GpuBudget
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.telemetry.metrics import Metrics

log = logging.getLogger("pilot.residency")

EXTENT_MAX = 64 << 20
COLD_S = 1.0  # memory no kernel or copy used for this long goes first, whatever a policy's order
LEAVING_WAIT_S = 0.5  # how long a launch waits for memory being freed when only its room is left
ALIGN = 2 << 20  # the driver migrates managed memory in 2 MiB blocks at most
LOCATION_DEVICE, LOCATION_HOST = 1, 2  # CUmemLocationType
ADVISE_SET_PREFERRED, ADVISE_UNSET_PREFERRED = 3, 4  # CUmem_advise
ADVISE_SET_ACCESSED_BY, ADVISE_UNSET_ACCESSED_BY = 5, 6
STREAM_NON_BLOCKING = 1


@dataclass(eq=False, slots=True)
class Extent:
    ptr: int
    size: int
    alloc: int  # the allocation's base
    session: int
    tenant: str
    resident: bool = False
    advised: bool = False  # kept in host memory by a policy (advise_host)
    active: int = 0  # running kernels that use it
    pending: int = 0  # launches that made room for it and whose kernel is not issued yet
    used_at: int = 0  # recency: the GPU's clock when it was last brought in or used
    used_s: float = 0.0  # time.monotonic() then
    busy_until: Any = None  # while active: an event recorded after its last kernel


@dataclass(eq=False)
class GpuResidency:
    """One GPU's movable memory. `device` is the backend's device number."""
    gpu: int
    device: int
    allocs: dict[int, list[Extent]] = field(default_factory=dict)
    charged: dict[int, int] = field(default_factory=dict)  # base -> bytes charged (movable)
    # (session, base) -> extents of an allocation being freed: no longer moved, but still counted
    # where they are until the free is done (Residency.quiesce, untrack)
    leaving: dict[tuple[int, int], list[Extent]] = field(default_factory=dict)
    bases: list[int] = field(default_factory=list)  # sorted allocation bases
    by_session: dict[int, set[int]] = field(default_factory=dict)  # session -> allocation bases
    resident: int = 0
    resident_by: dict[int, int] = field(default_factory=dict)  # session -> resident bytes
    # session -> rank: a policy's eviction order (Residency.set_eviction_order); replaced whole,
    # never changed in place, so it is read without the lock
    evict_rank: dict[int, int] = field(default_factory=dict)
    peak: int = 0
    movable: int = 0
    evicted: int = 0
    prefetched: int = 0
    advised: int = 0  # bytes advise_host ever advised (pilotctl, tests)
    overflows: int = 0
    clock: int = 0
    stream: Any = None  # pilot's own stream on this GPU: every eviction and policy move
    event: Any = None  # recorded on `stream` after evictions, waited for by the launch's stream
    handoff: Any = None  # recorded on a session's stream after evictions on it; `stream` waits
    # Held only to update the model and plan moves (Moves), never across a backend call that
    # migrates memory; a launch's extents are kept from others by Extent.pending instead.
    lock: threading.RLock = field(default_factory=threading.RLock)
    freed: threading.Condition = field(init=False)  # on `lock`: memory `leaving` is gone
    # Taken under `lock` by a planner with moves and held while they are issued: moves are
    # issued in the order they were planned, so a launch's wait for `event` comes after the
    # record of the evictions it counted on (Residency._issue).
    issuing: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.freed = threading.Condition(self.lock)

    def allocation_at(self, ptr: int) -> int | None:
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0:
            base = self.bases[i]
            last = self.allocs[base][-1]
            if ptr < last.ptr + last.size:
                return base
        return None

    def set_resident(self, e: Extent, resident: bool) -> None:
        """Count e on the GPU or off it (the GPU's and its session's totals)."""
        if e.resident == resident:
            return
        e.resident = resident
        delta = e.size if resident else -e.size
        self.resident += delta
        n = self.resident_by.get(e.session, 0) + delta
        if n:
            self.resident_by[e.session] = n
        else:
            self.resident_by.pop(e.session, None)

    def overlapping(self, ptr: int, count: int) -> list[Extent]:
        """Extents of one allocation that [ptr, ptr+count) overlaps."""
        base = self.allocation_at(ptr)
        if base is None or count <= 0:
            return []
        end = ptr + count
        return [e for e in self.allocs[base] if e.ptr < end and ptr < e.ptr + e.size]


def cut(ptr: int, size: int) -> list[tuple[int, int]]:
    """[ptr, ptr+size) in extents of at most EXTENT_MAX bytes whose inner edges are ALIGNed."""
    out, at, end = [], ptr, ptr + size
    while at < end:
        nxt = min(end, (at // ALIGN) * ALIGN + EXTENT_MAX)
        out.append((at, nxt - at))
        at = nxt
    return out


class Moves:
    """Backend calls planned under a GPU's lock and issued after it, in order, by `run`."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple[Any, ...]]] = []

    def __bool__(self) -> bool:
        return bool(self.ops)

    def prefetch(self, ptr: int, size: int, location: int, device: int, stream: Any) -> None:
        self.ops.append(("mem_prefetch", (ptr, size, location, device, 0, stream)))

    def wait(self, stream: Any, event: Any) -> None:
        self.ops.append(("stream_wait_event", (stream, event)))

    def record(self, event: Any, stream: Any) -> None:
        self.ops.append(("event_record", (event, stream)))

    def advise(self, ptr: int, size: int, advice: int, location: int, device: int) -> None:
        self.ops.append(("mem_advise", (ptr, size, advice, location, device)))

    def run(self, backend: Backend, gpu: int) -> None:
        """Issue the calls. One that fails (the range was freed meanwhile: the free waited
        for what was queued on pilot's stream, not for what was still planned) is logged and
        the rest go on: a move is an optimisation, never the program's correctness."""
        for name, args in self.ops:
            try:
                getattr(backend, name)(*args)
            except Exception as exc:  # BackendError, or a sticky context error
                log.warning("GPU %d: %s%s failed: %s", gpu, name, args[:2], exc)
        self.ops = []


def _current(g: GpuResidency, extents: list[Extent]) -> Iterator[Extent]:
    """The extents, as they are now, of the allocations a launch used. `extents` holds every
    extent of each allocation, the first one of each first; advise_host may have split them
    since (a tail copies the head's state), and an allocation may have been freed and made
    again at the same address (then its first extent is another object): skipped."""
    for e in extents:
        now = g.allocs.get(e.alloc)
        if now is not None and now[0] is e:
            yield from now


class Residency:
    """Every GPU's movable memory; `enforced` False: tracked (for the policies and pilotctl)
    but never evicted to keep a capacity."""

    def __init__(self, backend: Backend, budget: GpuBudget, metrics: Metrics,
                 devices: dict[int, int], enforced: bool) -> None:
        self.backend = backend
        self.budget = budget
        self.metrics = metrics
        self.enforced = enforced
        self.gpus = {g: GpuResidency(g, d) for g, d in devices.items()}
        self.sessions: dict[int, GpuResidency] = {}  # session id -> its GPU's (tracked memory only)
        self.tenants: dict[int, str] = {}  # session id -> tenant, for metrics of requests
        # Sessions a policy preempted (Controls.preempt) -> the events after their cut launches'
        # first parts. Their running kernels' extents count as idle and leave after those events,
        # not after their last kernel, which waits for the resume (scheduling/preempt.py).
        # Replaced whole, never changed in place (read without a lock).
        self.preempted: dict[int, tuple[Any, ...]] = {}

    # ---- allocations (broker) ----
    def track(self, s: Session, ptr: int, size: int, span: int = 0) -> None:
        """A movable allocation of `size` bytes (charged) at `ptr`; `span` (when larger): the
        bytes of address range the backend gave it, all of which the GPU may hold once a kernel
        touches it (a small managed allocation has a 2 MiB range of its own: ops/unified.py).
        Nothing (NULL, 0 bytes) is not tracked."""
        if not ptr or max(size, span) <= 0:
            return
        g = self.gpus[s.device]
        with g.lock:
            g.allocs[ptr] = [Extent(p, n, ptr, s.id, s.tenant) for p, n in cut(ptr, max(size, span))]
            g.charged[ptr] = size
            bisect.insort(g.bases, ptr)
            g.by_session.setdefault(s.id, set()).add(ptr)
            g.movable += size
        self.sessions[s.id] = g
        self.tenants[s.id] = s.tenant

    def _stop_tracking(self, g: GpuResidency, s: Session, ptr: int) -> list[Extent] | None:
        """Under g.lock: take the session's allocation at `ptr` out of what is moved."""
        extents = g.allocs.get(ptr)
        if extents is None or extents[0].session != s.id:
            return None
        del g.allocs[ptr]
        del g.bases[bisect.bisect_left(g.bases, ptr)]
        bases = g.by_session.get(s.id)
        if bases is not None:
            bases.discard(ptr)
            if not bases:
                del g.by_session[s.id]
                self.sessions.pop(s.id, None)
                self.tenants.pop(s.id, None)
                self._not_preempted(s.id)
        return extents

    def untrack(self, s: Session, ptr: int) -> None:
        """The allocation is freed: its bytes leave the GPU's counts."""
        g = self.gpus[s.device]
        with g.lock:
            extents = g.leaving.pop((s.id, ptr), None) or self._stop_tracking(g, s, ptr)
            if extents is None:
                return
            g.movable -= g.charged.pop(ptr, 0)
            for e in extents:
                g.set_resident(e, False)
            g.freed.notify_all()

    def is_movable(self, s: Session, ptr: int) -> bool:
        g = self.sessions.get(s.id)
        return g is not None and ptr in g.allocs

    # ---- what brings memory onto the GPU (vGPU threads) ----
    def before_launch(self, s: Session, allocations: Iterable[int], stream: Any,
                      prefetch: bool = False) -> list[Extent]:
        """A launch whose arguments point into these allocations (bases) is about to be issued
        on `stream`: make room for the part not resident (evictions go on `stream`, ahead of
        the kernel), count it resident and active. With `prefetch` (the policy asks for it,
        Policy.prefetches_footprint) that part is also moved onto the GPU on `stream`, ahead of
        the kernel, in bulk, instead of the kernel faulting it in page by page while it holds
        its SMs; not when it does not fit in the room (the GPU would hold more than C). Returns
        the extents to pass to `launched` (or `not_launched`) and `finished`. Until `launched`
        they are *pending*: no other session evicts them (it could not wait for a kernel that
        is not issued yet)."""
        g = self.sessions.get(s.id)
        if g is None:
            return []
        moves = Moves()
        with g.lock:
            extents = [e for base in allocations for e in g.allocs.get(base, ())]
            if not extents:
                return []
            incoming = self._bring_in(g, extents, stream, moves)
            if prefetch and incoming and self.enforced:
                self._prefetch_in(g, incoming, stream, moves)
            for e in extents:
                e.active += 1
                e.pending += 1
            self._take_turn(g, moves)
        self._issue(g, moves)
        return extents

    def not_launched(self, s: Session, extents: list[Extent]) -> None:
        """The launch before_launch made room for failed: its extents are neither pending nor
        active for it."""
        g = self.sessions.get(s.id)
        if g is None or not extents:
            return
        with g.lock:
            for x in _current(g, extents):
                x.pending = max(0, x.pending - 1)
                x.active = max(0, x.active - 1)

    def finished(self, s: Session, extents: list[Extent]) -> None:
        """The kernel that used these extents finished."""
        g = self.sessions.get(s.id) or self.gpus.get(s.device)
        if g is None or not extents:
            return
        with g.lock:
            for x in _current(g, extents):
                x.active = max(0, x.active - 1)
                if not x.active:
                    x.busy_until = None  # its event is recycled after this

    def launched(self, s: Session, extents: list[Extent], event: Any) -> None:
        """The kernel using these extents was issued and `event` recorded after it (KernelWatch):
        evicting them for someone else waits for it (see _make_room)."""
        g = self.sessions.get(s.id)
        if g is None or not extents:
            return
        with g.lock:
            for x in _current(g, extents):
                x.busy_until = event
                x.pending = max(0, x.pending - 1)

    def written(self, s: Session, ptr: int, count: int, stream: Any) -> None:
        """The program copies, sets or prefetches [ptr, ptr+count) on the GPU (on `stream`):
        those extents come onto the GPU."""
        g = self.sessions.get(s.id)
        if g is None:
            return
        moves = Moves()
        with g.lock:
            extents = g.overlapping(ptr, count)
            if extents:
                self._bring_in(g, extents, stream, moves)
            self._take_turn(g, moves)
        self._issue(g, moves)

    def moved_to_host(self, s: Session, ptr: int, count: int) -> None:
        """The program prefetched [ptr, ptr+count) to the CPU: whole extents leave the GPU (a
        partly covered one is still counted resident)."""
        g = self.sessions.get(s.id)
        if g is None:
            return
        with g.lock:
            end = ptr + count
            for e in g.overlapping(ptr, count):
                if e.resident and ptr <= e.ptr and e.ptr + e.size <= end:
                    g.set_resident(e, False)

    def quiesce(self, s: Session, ptr: int | None = None) -> None:
        """Before the session frees movable memory (the allocation at `ptr`, or all of it): stop
        moving it, so that no move of it is queued any more, then wait for the moves queued on
        pilot's stream (a prefetch of memory freed meanwhile would fail someone's stream). Its
        bytes stay counted where they are until `untrack` (after the free): the room it leaves
        is not handed to another launch while the GPU still holds it."""
        g = self.sessions.get(s.id)
        if g is None:
            return
        with g.lock:
            for base in ([ptr] if ptr is not None else sorted(g.by_session.get(s.id, ()))):
                extents = self._stop_tracking(g, s, base)
                if extents is not None:
                    g.leaving[(s.id, base)] = extents
        if g.stream is not None:
            try:
                self.backend.stream_synchronize(g.stream)
            except Exception as exc:  # a sticky context error: the free must still go on
                log.error("GPU %d: waiting for pilot's moves before a free failed: %s", g.gpu, exc)

    def fixed_used(self, gpu: int) -> int:
        """Bytes of fixed allocations granted on the GPU. Enforced, movable memory is charged
        apart (to the managed limit); otherwise the budget holds it too and it is taken out."""
        used = self.budget.used(gpu)
        g = self.gpus.get(gpu)
        return used if self.enforced or g is None else max(0, used - g.movable)

    def _room(self, g: GpuResidency) -> int:
        return max(0, self.budget.capacity(g.gpu) - self.fixed_used(g.gpu))

    @staticmethod
    def _evictable(g: GpuResidency, spare: set[int], session: int) -> list[Extent]:
        """What _make_room may evict for `session`: resident extents but those in `spare` (ids)
        and other sessions' pending ones."""
        return [e for exts in g.allocs.values() for e in exts if e.resident and id(e) not in spare
                and not (e.pending and e.session != session)]

    def _await_leaving(self, g: GpuResidency, extents: list[Extent], moves: Moves) -> None:
        """Under g.lock, before planning: when the extents' room can come only from memory being
        freed (quiesced; untracked once the free is done, a moment later, on another thread),
        wait for it (at most LEAVING_WAIT_S) rather than overflow. Not once moves are planned:
        while the lock is released another planner could issue before them."""
        if not g.leaving or moves:
            return
        deadline = time.monotonic() + LEAVING_WAIT_S
        while g.leaving:
            need = sum(e.size for e in extents if not e.resident and not e.advised)
            over = g.resident + need - self._room(g)
            if over <= 0 or over <= sum(e.size for e in self._evictable(
                    g, set(map(id, extents)), extents[0].session)):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            g.freed.wait(left)

    def _bring_in(self, g: GpuResidency, extents: list[Extent], stream: Any, moves: Moves) -> list[Extent]:
        """Count the extents resident, making room first; returns those that were not and now
        fit (none when they did not fit in the room)."""
        if self.enforced:
            self._await_leaving(g, extents, moves)
        g.clock += 1
        now = time.monotonic()
        incoming = []
        for e in extents:
            e.used_at, e.used_s = g.clock, now
            if not e.resident and not e.advised:
                incoming.append(e)
        fits = True
        if incoming and self.enforced:
            need = sum(e.size for e in incoming)
            fits = self._make_room(g, need, set(map(id, extents)), stream, extents[0].session, moves)
            waited = ("stream_wait_event", (stream, g.event))
            if g.event is not None and stream is not g.stream and waited not in moves.ops:
                # The room may come from evictions planned earlier and still under way on pilot's
                # stream: the pages come in only after they left, or the GPU would hold more than C.
                moves.wait(stream, g.event)
        for e in extents:
            if not e.advised:
                g.set_resident(e, True)
        g.peak = max(g.peak, g.resident)
        return incoming if fits else []

    def _prefetch_in(self, g: GpuResidency, extents: list[Extent], stream: Any, moves: Moves) -> None:
        """Move the extents onto the GPU on `stream`, adjacent ones of an allocation in one call."""
        runs: list[list[int]] = []  # [ptr, size, allocation] of contiguous runs
        for e in sorted(extents, key=lambda x: x.ptr):
            # never across allocations, even adjacent ones: one prefetch may not span two
            # (cudaErrorInvalidValue on the H100)
            if runs and runs[-1][0] + runs[-1][1] == e.ptr and runs[-1][2] == e.alloc:
                runs[-1][1] += e.size
            else:
                runs.append([e.ptr, e.size, e.alloc])
            self.metrics.count("residency_prefetched_bytes", (str(g.gpu), e.tenant), e.size)
        for ptr, size, _alloc in runs:
            moves.prefetch(ptr, size, LOCATION_DEVICE, g.device, stream)
            g.prefetched += size

    def _make_room(self, g: GpuResidency, need: int, spare: set[int], stream: Any, session: int,
                   moves: Moves) -> bool:
        """Evict until `need` more bytes fit: idle extents, least recently used first, then active
        ones; never those in `spare` (ids). With a policy's eviction order (set_eviction_order):
        idle extents unused for COLD_S first (memory nobody uses is no one's to keep), then
        session by session in that order, idle extents first, then (for `session` itself) active
        ones; other sessions' active extents last of all. Evictions go on pilot's stream of the
        GPU, and `stream` (the work of `session` that needs the room) waits for it; but the
        session's own active extents go on `stream` itself, so that they leave after its kernels
        queued before, not under them, and another session's active extents leave after its kernel
        (pilot's stream waits for the event recorded after it, `busy_until`): so what is resident
        stays within the room, at the price of the new work waiting for that kernel. Another
        session's pending extents (its launch is between before_launch and launched) are not
        touched. The moves are planned into `moves`. Returns whether `need` fits now."""
        over = g.resident + need - self._room(g)
        if over <= 0:
            return True
        resident = self._evictable(g, spare, session)
        rank = g.evict_rank
        preempted = self.preempted

        def busy(e: Extent) -> bool:  # a kernel running uses it (a preempted one is not running)
            return e.active > 0 and e.session not in preempted

        if rank:  # cold memory, then a policy's order: idle memory by rank, then the session's own,
            last = len(rank)  # then others' busy
            cold = time.monotonic() - COLD_S
            candidates = sorted(resident, key=lambda e: (
                busy(e) and e.session != session, busy(e) or e.used_s > cold,
                rank.get(e.session, last), busy(e), e.used_at))
        else:
            candidates = sorted(resident, key=lambda e: (busy(e), e.used_at))
        own, on_stream = None, False
        for e in candidates:
            if over <= 0:
                break
            if e.active and e.session == session:
                self._evict(g, e, stream, "capacity", moves)
                on_stream = True
            else:
                own = own or self._stream(g)
                cut = preempted.get(e.session) if e.active else None
                if cut is not None:
                    # its kernels were preempted: it leaves once they have left the SMs (their
                    # rests wait for the resume, which brings it back first)
                    for done in cut:
                        moves.wait(own, done)
                elif e.active and e.busy_until is not None:
                    # Another session's kernel uses it: move it only once that kernel is done,
                    # or the kernel would fault it back and the GPU would hold more than C.
                    moves.wait(own, e.busy_until)
                self._evict(g, e, own, "capacity", moves)
            over -= e.size
        if on_stream and stream is not g.stream:
            # Evictions on the session's stream: pilot's stream waits for them, so that whoever
            # waits for g.event (the room it counts on) waits for these too.
            own = own or self._stream(g)
            if g.handoff is None:
                g.handoff = self.backend.event_create(EVENT_DISABLE_TIMING)
            moves.record(g.handoff, stream)
            moves.wait(own, g.handoff)
        if own is not None and own is not stream:
            self._fence(g, own, moves)
            moves.wait(stream, g.event)
        if over > 0:
            g.overflows += 1
            log.warning("GPU %d: %d bytes over capacity: one launch needs more than the room left "
                        "(%d bytes); it runs anyway", g.gpu, over, self._room(g))
            return False
        return True

    def _fence(self, g: GpuResidency, own: Any, moves: Moves) -> None:
        """Record the GPU's event on pilot's stream after the evictions planned on it."""
        if g.event is None:
            g.event = self.backend.event_create(EVENT_DISABLE_TIMING)
        moves.record(g.event, own)

    @staticmethod
    def _take_turn(g: GpuResidency, moves: Moves) -> None:
        """Under g.lock, with moves planned: queue to issue them in planning order."""
        if moves:
            g.issuing.acquire()

    def _issue(self, g: GpuResidency, moves: Moves) -> None:
        """After g.lock: issue the moves _take_turn queued, then let the next planner issue."""
        if not moves:
            return
        try:
            moves.run(self.backend, g.gpu)
        finally:
            g.issuing.release()

    def _evict(self, g: GpuResidency, e: Extent, stream: Any, reason: str, moves: Moves) -> None:
        moves.prefetch(e.ptr, e.size, LOCATION_HOST, 0, stream)
        g.set_resident(e, False)
        g.evicted += e.size
        self.metrics.count("residency_evicted_bytes", (str(g.gpu), e.tenant, reason), e.size)

    def _stream(self, g: GpuResidency) -> Any:
        """Pilot's stream on the GPU (the calling thread has the GPU's context current)."""
        if g.stream is None:
            g.stream = self.backend.stream_create(STREAM_NON_BLOCKING, 0)
        return g.stream

    # ---- policy requests (the scheduler thread) ----
    def set_eviction_order(self, gpu: int, sessions: tuple[int, ...]) -> None:
        """When making room on `gpu`, evict the idle memory of `sessions` in this order (the
        first loses its memory first), then of sessions not named; () restores plain LRU.
        Any thread; no lock (the rank table is replaced whole)."""
        g = self.gpus.get(gpu)
        if g is not None:
            g.evict_rank = {s: i for i, s in enumerate(sessions)}

    def session_resident(self, session: int) -> int:
        """Bytes of the session's movable memory counted on the GPU, without the lock."""
        g = self.sessions.get(session)
        return g.resident_by.get(session, 0) if g is not None else 0

    def _own_stream(self, g: GpuResidency) -> Any:
        self.backend.bind_thread(g.device)
        return self._stream(g)

    def preempted_session(self, session: int, cut: list[Any]) -> None:
        """A policy preempted the session; `cut`: the events after its cut launches' first parts
        (scheduling/preempt.py). Until resumed_session, its running kernels' extents count as
        idle, and leave after those events."""
        self.preempted = {**self.preempted, session: tuple(cut)}

    def _not_preempted(self, session: int) -> None:
        """The session's entry out of `preempted` (replaced whole: read without a lock)."""
        if session in self.preempted:
            self.preempted = {k: v for k, v in self.preempted.items() if k != session}

    def resumed_session(self, session: int) -> Any:
        """The session is resumed: the extents of its preempted kernels that were evicted come
        back in (making room as a launch would), on pilot's stream of its GPU. Returns that
        stream, for the resume to go behind the moves (its rests then find their memory on the
        GPU, counted); None: nothing moved."""
        self._not_preempted(session)
        g = self.sessions.get(session)
        if g is None:
            return None
        moves = Moves()
        with g.lock:
            extents = [e for base in sorted(g.by_session.get(session, ())) for e in g.allocs[base]
                       if e.active and not e.resident and not e.advised]
            if not extents:
                return None
            stream = self._own_stream(g)
            incoming = self._bring_in(g, extents, stream, moves)
            if incoming and self.enforced:
                self._prefetch_in(g, incoming, stream, moves)
            self._take_turn(g, moves)
        self._issue(g, moves)
        return stream

    def evict_session(self, session: int, keep: tuple[int, ...] = ()) -> int:
        """Move the session's resident movable memory to host, but the allocations in `keep`;
        returns the bytes moved."""
        g = self.sessions.get(session)
        if g is None:
            return 0
        moves = Moves()
        with g.lock:
            stream = self._own_stream(g)
            moved = 0
            for base in sorted(g.by_session.get(session, ())):
                if base in keep:
                    continue
                for e in g.allocs[base]:
                    if e.resident and not e.pending:
                        self._evict(g, e, stream, "policy", moves)
                        moved += e.size
            if moved:
                self._fence(g, stream, moves)
            self._take_turn(g, moves)
        self._issue(g, moves)
        return moved

    def _split_at(self, g: GpuResidency, at: int) -> None:
        """Make `at` an extent edge (rounded down to ALIGN) within its allocation."""
        base = g.allocation_at(at)
        if base is None:
            return
        extents = g.allocs[base]
        at = max(base, (at // ALIGN) * ALIGN)
        for i, e in enumerate(extents):
            if e.ptr < at < e.ptr + e.size:
                tail = replace(e, ptr=at, size=e.ptr + e.size - at)  # the head's state, all of it
                e.size = at - e.ptr
                extents.insert(i + 1, tail)
                return

    def _range(self, g: GpuResidency, session: int, ptr: int, size: int) -> list[Extent]:
        base = g.allocation_at(ptr)
        if base is None or base not in g.by_session.get(session, ()):
            return []
        self._split_at(g, ptr)
        self._split_at(g, ptr + size)
        end = ptr + size
        return [e for e in g.allocs[base] if e.ptr < end and ptr < e.ptr + e.size]

    def advise_host(self, session: int, ptr: int, size: int) -> int:
        """Keep the session's [ptr, ptr+size) in host memory, read remotely by kernels; returns
        the bytes advised (0: not the session's movable memory)."""
        return self._advice(session, ptr, size, True, True)

    def unadvise(self, session: int, ptr: int, size: int, prefetch: bool = True) -> int:
        """Lift advise_host on the session's [ptr, ptr+size); with `prefetch`, bring it onto
        the GPU (making room as a launch would). Returns the bytes lifted."""
        return self._advice(session, ptr, size, False, prefetch)

    def _advice(self, session: int, ptr: int, size: int, to_host: bool, move: bool) -> int:
        """Set (to_host) or lift the host advice on the extents of the range not yet so; `move`:
        evict them (set) or prefetch them back (lift)."""
        g = self.sessions.get(session)
        if g is None:
            return 0
        preferred, accessed_by = ((ADVISE_SET_PREFERRED, ADVISE_SET_ACCESSED_BY) if to_host
                                  else (ADVISE_UNSET_PREFERRED, ADVISE_UNSET_ACCESSED_BY))
        moves = Moves()
        with g.lock:
            extents = [e for e in self._range(g, session, ptr, size) if e.advised != to_host]
            if not extents:
                return 0
            stream = self._own_stream(g)
            for e in extents:
                moves.advise(e.ptr, e.size, preferred, LOCATION_HOST, 0)
                moves.advise(e.ptr, e.size, accessed_by, LOCATION_DEVICE, g.device)
                e.advised = to_host
                if to_host:
                    g.advised += e.size
                    if e.resident and move:
                        self._evict(g, e, stream, "policy", moves)
            if move and not to_host:
                self._bring_in(g, extents, stream, moves)
                for e in extents:
                    moves.prefetch(e.ptr, e.size, LOCATION_DEVICE, g.device, stream)
                    g.prefetched += e.size
                    self.metrics.count("residency_prefetched_bytes", (str(g.gpu), e.tenant), e.size)
            if to_host and move:
                self._fence(g, stream, moves)
            advised = sum(e.size for e in extents)
            self._take_turn(g, moves)
        self._issue(g, moves)
        return advised

    # ---- reports ----
    def describe(self, gpu: int) -> dict[str, Any]:
        g = self.gpus.get(gpu)
        if g is None:
            return {}
        with g.lock:
            advised = sum(e.size for exts in g.allocs.values() for e in exts if e.advised)
            measured = self.backend.managed_residency(g.device)
            return {"measured": None if measured is None else
                    {"resident": measured[0], "peak_resident": measured[1]},
                    "enforced": self.enforced, "capacity": self.budget.capacity(gpu),
                    "room": self._room(g), "movable": g.movable, "resident": g.resident,
                    "peak_resident": g.peak, "advised_to_host": advised,
                    "evicted_bytes": g.evicted, "prefetched_bytes": g.prefetched,
                    "advised_bytes": g.advised,
                    "overflows": g.overflows}

    def measure(self, gpu: int) -> dict[str, int] | None:
        """Residency as the CPU's page table sees it (resources/pagemap.py), on the CUDA backend:
        movable bytes in host RAM, and so at most how many can be on the GPU. None elsewhere (the
        sim keeps its memory in host RAM; it measures its own residency)."""
        g = self.gpus.get(gpu)
        if g is None or getattr(self.backend, "name", "") != "cuda":
            return None
        with g.lock:
            ranges = [(e.ptr, e.size) for exts in [*g.allocs.values(), *g.leaving.values()] for e in exts]
        span = sum(n for _p, n in ranges)  # address ranges, a small allocation's whole 2 MiB too
        in_ram = min(span, pagemap.host_resident(ranges))
        return {"host_resident": in_ram, "gpu_at_most": span - in_ram}

    def session_bytes(self, session: int) -> tuple[int, int]:
        """(movable, resident) bytes of a session."""
        g = self.sessions.get(session)
        if g is None:
            return 0, 0
        with g.lock:
            bases = g.by_session.get(session, ())
            extents = [e for base in bases for e in g.allocs[base]]
            return sum(g.charged[base] for base in bases), sum(e.size for e in extents if e.resident)

    def gpu_numbers(self, gpu: int) -> tuple[int, int]:
        """(movable, resident) bytes on a GPU, without taking its lock (a policy's read)."""
        g = self.gpus.get(gpu)
        return (g.movable, g.resident) if g is not None else (0, 0)

