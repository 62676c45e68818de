"""The capacity enforcer (daemon/resources/residency.py) against a backend that records its
calls: extents, what launches and copies bring in, least-recently-used eviction within the room,
and the policies' requests (evict, advise to host, lift the advice). No GPU."""

from __future__ import annotations

import itertools
import random
import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from pilot.daemon.resources import residency
from pilot.daemon.resources.broker import GpuBudget
from pilot.daemon.resources.residency import (
    ADVISE_SET_ACCESSED_BY,
    ADVISE_SET_PREFERRED,
    ADVISE_UNSET_ACCESSED_BY,
    ADVISE_UNSET_PREFERRED,
    ALIGN,
    EXTENT_MAX,
    LOCATION_DEVICE,
    LOCATION_HOST,
    Residency,
    cut,
)

MiB = 1 << 20
DEVICE = 3  # the backend's device number of GPU 0
A, B, C, D = (0x7F00_0000_0000 + i * (1 << 32) for i in range(4))  # 2 MiB-aligned, far apart


class FakeBackend:
    """Records the calls the enforcer makes; streams and events are names."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.made = 0

    def _make(self, what: str) -> str:
        self.made += 1
        return f"{what}{self.made}"

    def managed_residency(self, device: int) -> tuple[int, int] | None:
        return None  # as the CUDA backend: not measurable

    def stream_create(self, flags: int, priority: int) -> str:
        self.calls.append(("stream_create", flags, priority))
        return self._make("pilot-stream")

    def event_create(self, flags: int) -> str:
        self.calls.append(("event_create", flags))
        return self._make("event")

    def event_record(self, event: Any, stream: Any) -> None:
        self.calls.append(("event_record", event, stream))

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.calls.append(("stream_wait_event", stream, event))

    def stream_synchronize(self, stream: Any) -> None:
        self.calls.append(("stream_synchronize", stream))

    def bind_thread(self, device: int) -> None:
        self.calls.append(("bind_thread", device))

    def mem_prefetch(self, ptr: int, count: int, location_type: int, location_id: int, flags: int,
                     stream: Any) -> None:
        self.calls.append(("mem_prefetch", ptr, count, location_type, location_id, flags, stream))

    def mem_advise(self, ptr: int, count: int, advice: int, location_type: int, location_id: int) -> None:
        self.calls.append(("mem_advise", ptr, count, advice, location_type, location_id))

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == name]

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


class Counts:
    def __init__(self) -> None:
        self.counts: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)

    def count(self, counter: str, labels: tuple[str, ...], n: float = 1) -> None:
        self.counts[(counter, labels)] += n


class Env:
    def __init__(self, capacity: int = 100 * MiB, enforced: bool = True, fixed: int = 0) -> None:
        self.budget = GpuBudget({0: capacity})
        if fixed:
            assert self.budget.reserve(0, fixed)
        self.backend = FakeBackend()
        self.metrics = Counts()
        self.res = Residency(self.backend, self.budget, self.metrics, {0: DEVICE}, enforced)  # type: ignore[arg-type]
        self.g = self.res.gpus[0]
        self.s = {sid: SimpleNamespace(id=sid, device=0, tenant=tenant)
                  for sid, tenant in ((1, "a"), (2, "b"), (3, "c"))}

    def track(self, sid: int, ptr: int, size: int) -> None:
        self.res.track(self.s[sid], ptr, size)  # type: ignore[arg-type]

    def launch(self, sid: int, *bases: int, stream: str = "user-stream") -> list[Any]:
        """A launch issued (its kernel running; no event known unless a test sets one)."""
        extents = self.res.before_launch(self.s[sid], list(bases), stream)  # type: ignore[arg-type]
        self.res.launched(self.s[sid], extents, None)  # type: ignore[arg-type]
        return extents

    def finish(self, sid: int, extents: list[Any]) -> None:
        self.res.finished(self.s[sid], extents)  # type: ignore[arg-type]

    def run(self, sid: int, *bases: int) -> None:
        """A launch that has finished."""
        self.finish(sid, self.launch(sid, *bases))

    def extents(self, base: int) -> list[tuple[int, int, bool, bool, int]]:
        """(offset MiB, size MiB, resident, advised, active) of each extent of an allocation."""
        return [((e.ptr - base) / MiB, e.size / MiB, e.resident, e.advised, e.active)
                for e in self.g.allocs[base]]

    def resident(self) -> int:
        """Resident bytes, counted from the extents; checks the running total agrees."""
        n = sum(e.size for exts in [*self.g.allocs.values(), *self.g.leaving.values()]
                for e in exts if e.resident)
        assert n == self.g.resident
        return n

    def room(self) -> int:
        return self.budget.capacity(0) - self.budget.used(0)

    def evicted(self) -> list[tuple[int, int]]:
        """(ptr, size) of the prefetches to host, in order (taking the backend's calls)."""
        return [(c[1], c[2]) for c in self.backend.take() if c[0] == "mem_prefetch" and c[3] == LOCATION_HOST]


def test_cut_extents() -> None:
    assert cut(A, 200 * MiB) == [(A, 64 * MiB), (A + 64 * MiB, 64 * MiB), (A + 128 * MiB, 64 * MiB),
                                 (A + 192 * MiB, 8 * MiB)]
    odd = A + MiB + 4096  # not aligned: the first extent ends at the next 64 MiB edge
    assert cut(odd, 130 * MiB) == [(odd, 63 * MiB - 4096), (A + 64 * MiB, 64 * MiB),
                                   (A + 128 * MiB, 3 * MiB + 4096)]
    assert cut(A + 12, 100) == [(A + 12, 100)]
    assert cut(A, 0) == []
    for ptr, size in ((A + 3 * MiB + 17, 777 * MiB + 5), (A, 64 * MiB), (A + 2 * MiB, 64 * MiB)):
        pieces = cut(ptr, size)
        assert pieces[0][0] == ptr and sum(n for _p, n in pieces) == size
        assert all(n <= EXTENT_MAX for _p, n in pieces)
        assert all(p % ALIGN == 0 for p, _n in pieces[1:])
        assert all(p + n == q for (p, n), (q, _m) in itertools.pairwise(pieces))


def test_track_and_untrack() -> None:
    env = Env()
    env.track(1, A, 100 * MiB)
    env.track(1, B, 10 * MiB)
    env.track(2, C, 20 * MiB)
    assert [n for _o, n, *_ in env.extents(A)] == [64, 36]
    assert env.res.describe(0)["movable"] == 130 * MiB
    assert env.res.is_movable(env.s[1], A) and not env.res.is_movable(env.s[1], A + 4096)  # type: ignore[arg-type]
    assert not env.res.is_movable(env.s[3], A)  # type: ignore[arg-type]
    assert env.res.session_bytes(1) == (110 * MiB, 0)
    assert env.g.allocation_at(A + 99 * MiB) == A and env.g.allocation_at(A + 100 * MiB) is None
    env.run(1, A)
    assert env.res.session_bytes(1) == (110 * MiB, 100 * MiB)
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]
    assert env.resident() == 0 and env.g.movable == 30 * MiB
    assert env.res.sessions[1] is env.g and env.res.tenants[1] == "a"
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]  # twice: nothing
    env.res.untrack(env.s[1], B)  # type: ignore[arg-type]
    assert 1 not in env.res.sessions and 1 not in env.res.tenants and 1 not in env.g.by_session
    assert env.res.session_bytes(1) == (0, 0) and env.g.bases == [C]
    env.track(1, 0, 0)  # cudaMalloc(0) served with managed memory: NULL, nothing to track
    env.track(1, D, 0)
    assert env.g.bases == [C] and 1 not in env.res.sessions
    env.res.quiesce(env.s[1])  # type: ignore[arg-type]
    assert env.backend.calls == []


def test_a_launch_that_fits_brings_its_allocations_in() -> None:
    env = Env()
    env.track(1, A, 40 * MiB)
    env.track(1, B, 100 * MiB)
    extents = env.launch(1, A)
    assert env.extents(A) == [(0, 40, True, False, 1)]
    assert [e.ptr for e in extents] == [A]
    assert env.extents(B) == [(0, 64, False, False, 0), (64, 36, False, False, 0)]
    env.finish(1, extents)
    assert env.extents(A) == [(0, 40, True, False, 0)]
    assert env.resident() == 40 * MiB and env.backend.calls == []  # no room to make
    assert env.launch(1, D) == [] and env.launch(1) == []  # not movable, or nothing


def test_eviction_is_least_recently_used_first_and_waits_on_pilots_stream() -> None:
    env = Env()
    env.track(1, A, 40 * MiB)
    env.track(2, B, 40 * MiB)
    env.track(1, C, 30 * MiB)
    env.run(1, A)
    env.run(2, B)
    env.res.written(env.s[1], A + MiB, 10, "copy-stream")  # type: ignore[arg-type]  # A used again
    env.launch(1, C, stream="user-stream")  # 80 + 30 > 100: B (least recently used) goes
    calls = env.backend.take()
    own = calls[0]
    assert own[0] == "stream_create"
    stream = "pilot-stream1"
    assert calls[1:] == [("event_create", 2), ("mem_prefetch", B, 40 * MiB, LOCATION_HOST, 0, 0, stream),
                         ("event_record", "event2", stream),
                         ("stream_wait_event", "user-stream", "event2")]
    assert env.resident() == 70 * MiB
    assert env.metrics.counts[("residency_evicted_bytes", ("0", "b", "capacity"))] == 40 * MiB
    # The next eviction reuses pilot's stream and event.
    env.track(2, D, 40 * MiB)
    env.launch(2, D, stream="s2")
    assert env.backend.take() == [("mem_prefetch", A, 40 * MiB, LOCATION_HOST, 0, 0, stream),
                                  ("event_record", "event2", stream), ("stream_wait_event", "s2", "event2")]


def test_idle_extents_go_before_active_ones_and_never_the_launchs_own() -> None:
    env = Env()
    env.track(1, A, 40 * MiB)
    env.track(2, B, 30 * MiB)
    env.track(3, C, 30 * MiB)
    env.track(3, D, 30 * MiB)
    running = env.launch(1, A)  # least recently used, but active
    env.run(2, B)
    env.run(3, C)  # 100 resident
    env.launch(3, D)  # 30 more: B, the idle one used least recently, goes
    assert env.evicted() == [(B, 30 * MiB)]
    env.launch(2, B, C)  # 30 more; C is the launch's own, D and A active: A (older) goes
    assert env.evicted() == [(A, 40 * MiB)]
    env.finish(1, running)
    assert env.resident() == 90 * MiB


def test_resident_stays_within_the_room() -> None:
    env = Env(capacity=256 * MiB, fixed=56 * MiB)  # room 200
    rng = random.Random(7)
    sizes = {A + i * (1 << 30): rng.choice((2, 10, 50, 70, 130)) * MiB for i in range(12)}
    for i, (base, size) in enumerate(sizes.items()):
        env.track(1 + i % 3, base, size)
    running: list[tuple[int, list[Any]]] = []
    for _ in range(300):
        sid = rng.randint(1, 3)
        mine = [b for b in env.g.by_session.get(sid, ())]
        picked = rng.sample(mine, rng.randint(1, min(3, len(mine))))
        if sum(sizes[b] for b in picked) > env.room():
            continue
        running.append((sid, env.launch(sid, *picked)))
        assert env.resident() <= env.room()
        for e in running[-1][1]:
            assert e.resident
        if rng.random() < 0.3:
            env.res.written(env.s[sid], rng.choice(mine) + MiB, 3 * MiB, "s")  # type: ignore[arg-type]
            assert env.resident() <= env.room()
        while len(running) > 2:
            env.finish(*running.pop(0))
    assert env.g.overflows == 0 and env.g.peak <= env.room()


def test_a_footprint_larger_than_the_room_overflows_and_runs() -> None:
    env = Env()
    env.track(1, A, 40 * MiB)
    env.track(2, B, 150 * MiB)
    env.run(1, A)
    extents = env.launch(2, B)
    assert env.evicted() == [(A, 40 * MiB)]
    assert all(e.resident for e in extents) and env.resident() == 150 * MiB
    d = env.res.describe(0)
    assert (d["overflows"], d["peak_resident"], d["resident"]) == (1, 150 * MiB, 150 * MiB)


def test_not_enforced_tracks_but_never_evicts() -> None:
    env = Env(enforced=False)
    env.track(1, A, 80 * MiB)
    env.track(2, B, 80 * MiB)
    env.run(1, A)
    env.run(2, B)
    assert env.resident() == 160 * MiB and env.backend.calls == []
    d = env.res.describe(0)
    assert (d["enforced"], d["overflows"], d["evicted_bytes"]) == (False, 0, 0)


def test_written_brings_in_the_extents_it_touches() -> None:
    env = Env(capacity=1 << 30)
    env.track(1, A, 200 * MiB)
    env.res.written(env.s[1], A + 70 * MiB, MiB, "s")  # type: ignore[arg-type]
    assert [r for _o, _n, r, _a, _c in env.extents(A)] == [False, True, False, False]
    env.res.written(env.s[1], A + 60 * MiB, 5 * MiB, "s")  # type: ignore[arg-type]  # across an edge
    assert [r for _o, _n, r, _a, _c in env.extents(A)] == [True, True, False, False]
    env.res.written(env.s[1], A + 200 * MiB, MiB, "s")  # type: ignore[arg-type]  # past its end
    env.res.written(env.s[2], A, MiB, "s")  # type: ignore[arg-type]  # another session: not tracked
    env.res.written(env.s[1], A + 190 * MiB, 0, "s")  # type: ignore[arg-type]
    assert env.resident() == 128 * MiB and env.backend.calls == []


def test_moved_to_host_counts_whole_extents_only() -> None:
    env = Env(capacity=1 << 30)
    env.track(1, A, 200 * MiB)
    env.run(1, A)
    env.res.moved_to_host(env.s[1], A + 64 * MiB, 64 * MiB)  # type: ignore[arg-type]
    assert env.resident() == 136 * MiB
    env.res.moved_to_host(env.s[1], A + 130 * MiB, 60 * MiB)  # type: ignore[arg-type]  # part of [128, 192)
    assert env.resident() == 136 * MiB
    env.res.moved_to_host(env.s[1], A + 128 * MiB, 72 * MiB)  # type: ignore[arg-type]
    assert env.resident() == 64 * MiB
    env.res.moved_to_host(env.s[1], A, 200 * MiB)  # type: ignore[arg-type]
    assert env.resident() == 0 and env.backend.calls == []  # the program's own prefetch


def advised_env() -> Env:
    """A 128 MiB allocation of session 1, resident, with [41 MiB, 128 MiB) advised to host;
    the room is 130 MiB."""
    env = Env(capacity=130 * MiB)
    env.track(1, A, 128 * MiB)
    env.run(1, A)
    assert env.res.advise_host(1, A + 41 * MiB, 87 * MiB) == 88 * MiB  # from the 2 MiB edge below
    return env


def test_advise_host_splits_advises_and_evicts() -> None:
    env = advised_env()
    assert env.extents(A) == [(0, 40, True, False, 0), (40, 24, False, True, 0), (64, 64, False, True, 0)]
    calls = env.backend.take()
    assert calls[0] == ("bind_thread", DEVICE)
    stream = "pilot-stream1"
    assert [c for c in calls if c[0] in ("mem_advise", "mem_prefetch")] == [
        ("mem_advise", A + 40 * MiB, 24 * MiB, ADVISE_SET_PREFERRED, LOCATION_HOST, 0),
        ("mem_advise", A + 40 * MiB, 24 * MiB, ADVISE_SET_ACCESSED_BY, LOCATION_DEVICE, DEVICE),
        ("mem_prefetch", A + 40 * MiB, 24 * MiB, LOCATION_HOST, 0, 0, stream),
        ("mem_advise", A + 64 * MiB, 64 * MiB, ADVISE_SET_PREFERRED, LOCATION_HOST, 0),
        ("mem_advise", A + 64 * MiB, 64 * MiB, ADVISE_SET_ACCESSED_BY, LOCATION_DEVICE, DEVICE),
        ("mem_prefetch", A + 64 * MiB, 64 * MiB, LOCATION_HOST, 0, 0, stream)]
    assert env.metrics.counts[("residency_evicted_bytes", ("0", "a", "policy"))] == 88 * MiB
    d = env.res.describe(0)
    assert (d["advised_to_host"], d["resident"], d["evicted_bytes"]) == (88 * MiB, 40 * MiB, 88 * MiB)
    # Again, or not the session's memory: nothing.
    assert env.res.advise_host(1, A + 64 * MiB, 64 * MiB) == 0
    assert env.res.advise_host(2, A, 10 * MiB) == 0 and env.res.advise_host(9, A, 10 * MiB) == 0
    assert env.res.advise_host(1, D, 10 * MiB) == 0
    assert env.backend.of("mem_advise") == []


def test_advised_extents_stay_on_the_host() -> None:
    env = advised_env()
    env.backend.take()
    extents = env.launch(1, A)
    env.res.written(env.s[1], A + 100 * MiB, MiB, "s")  # type: ignore[arg-type]
    assert env.resident() == 40 * MiB and all(e.active == 1 for e in extents)
    env.finish(1, extents)
    assert env.backend.calls == []


def test_unadvise_unsets_and_prefetches_after_making_room() -> None:
    env = advised_env()
    env.track(2, B, 50 * MiB)
    env.run(2, B)  # 90 resident: A's 88 do not fit beside it in 130
    env.backend.take()
    assert env.res.unadvise(1, A + 41 * MiB, 87 * MiB) == 88 * MiB
    stream = "pilot-stream1"
    assert env.backend.take() == [
        ("bind_thread", DEVICE),
        ("mem_advise", A + 40 * MiB, 24 * MiB, ADVISE_UNSET_PREFERRED, LOCATION_HOST, 0),
        ("mem_advise", A + 40 * MiB, 24 * MiB, ADVISE_UNSET_ACCESSED_BY, LOCATION_DEVICE, DEVICE),
        ("mem_advise", A + 64 * MiB, 64 * MiB, ADVISE_UNSET_PREFERRED, LOCATION_HOST, 0),
        ("mem_advise", A + 64 * MiB, 64 * MiB, ADVISE_UNSET_ACCESSED_BY, LOCATION_DEVICE, DEVICE),
        # room first (on pilot's stream, so no event to wait on): A's head is older than B
        ("mem_prefetch", A, 40 * MiB, LOCATION_HOST, 0, 0, stream),
        ("mem_prefetch", B, 50 * MiB, LOCATION_HOST, 0, 0, stream),
        ("mem_prefetch", A + 40 * MiB, 24 * MiB, LOCATION_DEVICE, DEVICE, 0, stream),
        ("mem_prefetch", A + 64 * MiB, 64 * MiB, LOCATION_DEVICE, DEVICE, 0, stream)]
    assert env.resident() == 88 * MiB
    assert env.metrics.counts[("residency_prefetched_bytes", ("0", "a"))] == 88 * MiB
    d = env.res.describe(0)
    assert (d["advised_to_host"], d["prefetched_bytes"]) == (0, 88 * MiB)
    assert env.res.unadvise(1, A + 41 * MiB, 87 * MiB) == 0  # nothing advised left


def test_unadvise_without_prefetch_leaves_it_on_the_host() -> None:
    env = advised_env()
    env.backend.take()
    assert env.res.unadvise(1, A + 64 * MiB, 64 * MiB, prefetch=False) == 64 * MiB
    assert env.backend.of("mem_prefetch") == [] and len(env.backend.of("mem_advise")) == 2
    assert env.extents(A)[2] == (64, 64, False, False, 0)
    env.run(1, A)  # a launch brings it in now
    assert env.resident() == 104 * MiB


def test_a_running_kernel_ends_on_extents_split_while_it_ran() -> None:
    env = Env(capacity=130 * MiB)
    env.track(1, A, 128 * MiB)
    env.track(2, B, 60 * MiB)
    running = env.launch(1, A)
    env.res.advise_host(1, A + 40 * MiB, 88 * MiB)  # splits the first extent the kernel uses
    env.finish(1, running)
    assert [active for *_x, active in env.extents(A)] == [0, 0, 0]
    env.res.unadvise(1, A + 40 * MiB, 88 * MiB)  # A: 128 resident, [40, 64) the most recent
    env.backend.take()
    env.launch(2, B)  # 128 + 60 > 130: idle extents go, least recently used first
    assert env.evicted() == [(A, 40 * MiB), (A + 40 * MiB, 24 * MiB)]


def test_a_kernel_ending_after_its_allocation_was_made_again_leaves_the_new_one() -> None:
    env = Env()
    env.track(1, A, 10 * MiB)
    old = env.launch(1, A)
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]
    env.track(1, A, 10 * MiB)  # the same address again, used by a new kernel
    new = env.launch(1, A)
    env.finish(1, old)
    assert env.extents(A) == [(0, 10, True, False, 1)]
    env.finish(1, new)
    assert env.extents(A) == [(0, 10, True, False, 0)]


def test_evict_session_keeps_what_is_asked() -> None:
    env = Env()
    env.track(1, A, 20 * MiB)
    env.track(1, B, 30 * MiB)
    env.track(2, C, 40 * MiB)
    for sid, base in ((1, A), (1, B), (2, C)):
        env.run(sid, base)
    env.backend.take()
    assert env.res.evict_session(1, keep=(A,)) == 30 * MiB
    calls = env.backend.take()
    assert calls[0] == ("bind_thread", DEVICE) and calls[1][0] == "stream_create"
    own = "pilot-stream1"
    assert calls[2:] == [("event_create", 2), ("mem_prefetch", B, 30 * MiB, LOCATION_HOST, 0, 0, own),
                         ("event_record", "event2", own)]
    assert env.res.session_bytes(1) == (50 * MiB, 20 * MiB)
    assert env.res.session_bytes(2) == (40 * MiB, 40 * MiB)
    assert env.metrics.counts[("residency_evicted_bytes", ("0", "a", "policy"))] == 30 * MiB
    assert env.res.evict_session(1) == 20 * MiB
    assert env.res.evict_session(1) == 0 and env.res.evict_session(9) == 0
    assert env.resident() == 40 * MiB


def test_quiesce_stops_tracking_then_waits_for_pilots_stream() -> None:
    env = Env()
    env.track(1, A, 20 * MiB)
    env.track(1, B, 20 * MiB)
    env.res.quiesce(env.s[2])  # type: ignore[arg-type]  # nothing tracked: nothing to wait for
    assert env.backend.calls == []
    env.run(1, A)
    env.res.evict_session(1)
    env.backend.take()
    env.res.quiesce(env.s[1], A)  # type: ignore[arg-type]  # one allocation is freed
    assert env.backend.take() == [("stream_synchronize", "pilot-stream1")]
    assert not env.res.is_movable(env.s[1], A) and env.res.is_movable(env.s[1], B)  # type: ignore[arg-type]
    assert env.res.evict_session(1) == 0  # nothing of A is queued any more
    env.res.quiesce(env.s[1])  # type: ignore[arg-type]  # the session ends: all of it
    assert env.res.session_bytes(1) == (0, 0)


def test_memory_being_freed_holds_its_room_until_the_free_is_done() -> None:
    """Between quiesce (before the free) and untrack (after it) the GPU still holds the pages:
    no move touches them, and no other launch counts on their room, or for a moment the GPU
    would hold more than C (seen on the sim: 70 MiB resident with C = 64 MiB)."""
    env = Env()
    env.track(1, A, 60 * MiB)
    env.track(2, B, 30 * MiB)
    env.track(2, C, 30 * MiB)
    env.run(1, A)
    env.run(2, B)  # 90 resident
    env.backend.take()
    env.res.quiesce(env.s[1], A)  # type: ignore[arg-type]
    assert env.resident() == 90 * MiB and env.g.movable == 120 * MiB
    assert not env.res.is_movable(env.s[1], A)  # type: ignore[arg-type]
    env.launch(2, C)  # 30 more: A is on its way out, so B (its own, idle) goes
    assert env.evicted() == [(B, 30 * MiB)]
    assert env.resident() == 90 * MiB and env.g.overflows == 0
    env.res.untrack(env.s[2], A)  # type: ignore[arg-type]  # not session 2's: nothing
    assert env.resident() == 90 * MiB
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]  # freed
    assert env.resident() == 30 * MiB and env.g.movable == 60 * MiB and not env.g.leaving
    env.launch(2, B)  # its room is free now: nothing evicted
    assert env.evicted() == [] and env.resident() == 60 * MiB


def test_a_launch_whose_room_is_being_freed_waits_for_the_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing else to evict: rather than overflow, the launch waits (briefly) for the memory
    being freed to be untracked; if the free never comes, it overflows as before."""
    env = Env()
    env.track(1, A, 80 * MiB)
    env.track(2, B, 40 * MiB)
    env.run(1, A)
    env.backend.take()
    env.res.quiesce(env.s[1], A)  # type: ignore[arg-type]
    freed = threading.Timer(0.1, env.res.untrack, args=(env.s[1], A))
    freed.start()
    env.launch(2, B)
    freed.join()
    assert env.g.overflows == 0 and env.evicted() == [] and env.resident() == 40 * MiB
    monkeypatch.setattr(residency, "LEAVING_WAIT_S", 0.05)
    env.track(1, C, 70 * MiB)
    env.run(1, C)  # 110 > 100: B (idle) goes
    assert env.evicted() == [(B, 40 * MiB)]
    env.res.quiesce(env.s[1], C)  # type: ignore[arg-type]  # and never freed
    env.launch(2, B)
    assert env.g.overflows == 1 and env.resident() == 110 * MiB


def test_a_small_allocation_counts_its_whole_range_on_the_gpu() -> None:
    """A managed allocation below 2 MiB gets a 2 MiB range of its own (ops/unified.py); a kernel
    touching it may bring all of it in, so residency counts the range, movable the bytes."""
    env = Env(capacity=10 * MiB)
    env.res.track(env.s[1], A, 8, span=2 * MiB)  # type: ignore[arg-type]
    env.track(2, B, 8 * MiB)
    assert env.g.movable == 8 * MiB + 8 and env.res.session_bytes(1) == (8, 0)
    env.run(1, A)
    assert env.resident() == 2 * MiB and env.res.session_bytes(1) == (8, 2 * MiB)
    env.launch(2, B)  # 8 + 2 fit in 10
    assert env.evicted() == []
    env.track(2, C, 2 * MiB)
    env.launch(2, C)  # 2 more: the small one's range goes, whole
    assert env.evicted() == [(A, 2 * MiB)]
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]
    assert env.g.movable == 10 * MiB and env.resident() == 10 * MiB


def test_evictions_on_a_sessions_own_stream_are_fenced_for_everyone() -> None:
    """The session's own active memory leaves on its stream (after its kernels); another
    session's launch counting on that room waits for pilot's event, so pilot's stream waits for
    those evictions first."""
    env = Env()
    env.track(1, A, 60 * MiB)
    env.track(1, B, 40 * MiB)
    env.track(2, C, 50 * MiB)
    running = env.launch(1, A, stream="s1")  # active
    env.launch(1, B, stream="s1")  # 100 resident, all of it session 1's and active
    env.backend.take()
    env.track(1, D, 30 * MiB)
    env.launch(1, D, stream="s1")  # 30 more: its own active A goes, on s1
    calls = env.backend.take()
    own, handoff, fence = "pilot-stream1", "event2", "event3"  # made while planning
    assert calls == [("stream_create", 1, 0), ("event_create", 2), ("event_create", 2),
                     ("mem_prefetch", A, 60 * MiB, LOCATION_HOST, 0, 0, "s1"),
                     ("event_record", handoff, "s1"), ("stream_wait_event", own, handoff),
                     ("event_record", fence, own), ("stream_wait_event", "s1", fence)]
    env.finish(1, running)
    env.launch(2, C, stream="s2")  # 50 more: B goes too; s2 waits for both evictions
    assert env.backend.take() == [("mem_prefetch", B, 40 * MiB, LOCATION_HOST, 0, 0, own),
                                  ("event_record", fence, own), ("stream_wait_event", "s2", fence)]


def test_describe_and_the_room_fixed_allocations_leave() -> None:
    env = Env(capacity=100 * MiB)
    env.track(1, A, 40 * MiB)
    env.track(2, B, 40 * MiB)
    env.run(1, A)
    env.run(2, B)
    assert env.evicted() == []
    assert env.budget.reserve(0, 30 * MiB)  # a cudaMalloc of 30: room 70
    env.run(2, B)  # nothing new to bring in: nothing evicted yet
    assert env.evicted() == []
    env.track(3, C, 10 * MiB)
    env.run(3, C)  # 80 + 10 > 70: A, the least recently used, goes
    assert env.evicted() == [(A, 40 * MiB)]
    assert env.res.describe(0) == {
        "enforced": True, "capacity": 100 * MiB, "room": 70 * MiB, "movable": 90 * MiB,
        "resident": 50 * MiB, "peak_resident": 80 * MiB, "advised_to_host": 0, "advised_bytes": 0,
        "measured": None,
        "evicted_bytes": 40 * MiB, "prefetched_bytes": 0, "overflows": 0}
    assert env.res.gpu_numbers(0) == (90 * MiB, 50 * MiB) and env.res.gpu_numbers(5) == (0, 0)
    assert env.res.describe(5) == {}
    env.budget.release(0, 30 * MiB)
    assert env.res.describe(0)["room"] == 100 * MiB
    assert env.budget.reserve(0, 100 * MiB)
    assert env.res.describe(0)["room"] == 0


@pytest.mark.parametrize("fixed", [0, 60 * MiB])
def test_launch_after_fixed_memory_grows(fixed: int) -> None:
    env = Env(capacity=100 * MiB, fixed=fixed)
    env.track(1, A, 30 * MiB)
    env.track(2, B, 30 * MiB)
    env.run(1, A)
    env.run(2, B)
    assert env.evicted() == ([] if not fixed else [(A, 30 * MiB)])
    assert env.resident() <= env.room()


def test_measure_reads_the_page_table_on_the_cuda_backend_only() -> None:
    """`status --measure`: movable bytes in host RAM (pagemap) and so at most how many can be on
    the GPU; here the "managed" memory is an mmap of this process, 3 of its 8 pages touched."""
    import ctypes
    import mmap

    from pilot.daemon.resources.pagemap import PAGE

    env = Env()
    m = mmap.mmap(-1, 8 * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    env.track(1, base, 8 * PAGE)
    for i in (0, 3, 7):
        m[i * PAGE] = 1
    assert env.res.measure(0) is None  # not the CUDA backend: the sim measures itself
    env.backend.name = "cuda"  # type: ignore[attr-defined]
    assert env.res.measure(0) == {"host_resident": 3 * PAGE, "gpu_at_most": 5 * PAGE}
    assert env.res.measure(7) is None


def test_without_enforcement_the_room_leaves_out_movable_memory_the_budget_holds() -> None:
    """Not enforced (madvise alone): managed memory is charged to the GPU's budget like fixed
    memory, so the room must not count it twice (once as used, once as movable)."""
    env = Env(capacity=100 * MiB, enforced=False)
    assert env.budget.reserve(0, 30 * MiB + 10 * MiB)  # 30 movable (below) + 10 fixed
    env.track(1, A, 30 * MiB)
    assert env.res.fixed_used(0) == 10 * MiB
    assert env.res.describe(0)["room"] == 90 * MiB
    enforced = Env(capacity=100 * MiB, fixed=10 * MiB)
    enforced.track(1, A, 30 * MiB)  # charged to the managed limit, not the budget
    assert enforced.res.fixed_used(0) == 10 * MiB and enforced.res.describe(0)["room"] == 90 * MiB


def test_another_sessions_active_extent_leaves_after_its_kernel() -> None:
    """Evicting what another session's running kernel uses would let that kernel fault it back
    (more than C on the GPU): pilot's stream first waits for the event recorded after that
    kernel, and the new launch waits for pilot's stream."""
    env = Env(capacity=100 * MiB)
    env.track(1, A, 60 * MiB)
    env.track(2, B, 60 * MiB)
    running = env.launch(1, A)
    env.res.launched(env.s[1], running, "event-after-a")  # type: ignore[arg-type]
    env.backend.take()
    env.launch(2, B)  # 60 more: only A is there, and it is busy
    calls = env.backend.take()
    own = next(c[1] for c in calls if c[0] == "stream_wait_event" and c[2] == "event-after-a")
    wait_at = calls.index(("stream_wait_event", own, "event-after-a"))
    evict_at = next(i for i, c in enumerate(calls) if c[0] == "mem_prefetch" and c[1] == A)
    assert wait_at < evict_at and calls[evict_at][-1] == own  # on pilot's stream, after the wait
    recorded = next(c for c in calls[evict_at:] if c[0] == "event_record")
    assert recorded[2] == own and ("stream_wait_event", "user-stream", recorded[1]) in calls  # launch waits
    env.finish(1, running)
    assert all(e.busy_until is None for e in env.g.allocs[A])  # its event may be recycled now


def test_a_preempted_sessions_running_memory_leaves_after_the_cut_and_comes_back_first() -> None:
    """A policy preempted session 1 (Controls.preempt): its kernel's rest waits for the resume,
    so waiting for the event after it would hold the new launch until then. Its memory leaves
    once the cut part has (the events after the first parts), before another session's busy
    memory; the resume brings it back (making room, on pilot's stream) before the rest runs."""
    env = Env(capacity=100 * MiB)
    env.track(1, A, 60 * MiB)
    env.track(2, B, 30 * MiB)
    env.track(3, C, 50 * MiB)
    cut_kernel = env.launch(1, A)
    env.res.launched(env.s[1], cut_kernel, "event-after-rest")  # type: ignore[arg-type]
    other = env.launch(2, B)
    env.res.launched(env.s[2], other, "event-after-b")  # type: ignore[arg-type]
    env.res.preempted_session(1, ["cut-1", "cut-2"])
    env.backend.take()
    env.launch(3, C)  # 50 more than the 10 free: A goes (idle now), not B (busy)
    calls = env.backend.take()
    own = next(c[1] for c in calls if c[0] == "stream_wait_event" and c[2] == "cut-1")
    assert ("stream_wait_event", own, "cut-2") in calls
    assert not any(c[0] == "stream_wait_event" and c[2] in ("event-after-rest", "event-after-b")
                   for c in calls)
    evicted = [c[1] for c in calls if c[0] == "mem_prefetch" and c[3] == LOCATION_HOST]
    assert evicted and all(A <= p < A + 60 * MiB for p in evicted)
    assert sum(e.size for e in env.g.allocs[B] if e.resident) == 30 * MiB
    stream = env.res.resumed_session(1)  # A comes back: busy memory of B and C makes room
    calls = env.backend.take()
    assert stream == own and 1 not in env.res.preempted
    brought = [c for c in calls if c[0] == "mem_prefetch" and c[3] == LOCATION_DEVICE]
    assert sum(c[2] for c in brought) == 60 * MiB and all(c[-1] == own for c in brought)
    assert all(e.resident for e in env.g.allocs[A]) and env.resident() <= env.room()
    assert env.res.resumed_session(1) is None  # nothing left to bring


def test_a_split_extent_keeps_the_event_of_the_kernel_that_uses_it() -> None:
    """advise_host splitting an extent while a kernel uses it: the tail too waits for that
    kernel before another session may evict it (it lost `busy_until` before)."""
    env = Env(capacity=130 * MiB)
    env.track(1, A, 64 * MiB)
    running = env.launch(1, A)
    env.res.launched(env.s[1], running, "event-after-a")  # type: ignore[arg-type]
    env.res.advise_host(1, A + 62 * MiB, 2 * MiB)  # splits [0, 64) at 62 MiB
    assert [e.busy_until for e in env.g.allocs[A]] == ["event-after-a"] * 2
    env.finish(1, running)
    assert [e.busy_until for e in env.g.allocs[A]] == [None, None]


def test_a_policys_eviction_order_goes_before_recency() -> None:
    """set_eviction_order: memory of the session ranked first goes first, however recently
    used (its idle memory, then, when it is the one needing the room, its active memory); a
    session's own idle memory goes before another's busy memory. () restores plain LRU."""
    env = Env(capacity=80 * MiB)
    env.track(1, A, 30 * MiB)  # session 1: the small program
    env.track(2, B, 30 * MiB)  # session 2: the big one, in pieces
    env.track(2, C, 30 * MiB)
    env.track(2, D, 30 * MiB)
    env.run(1, A)
    env.run(2, B)
    env.res.set_eviction_order(0, (2, 1))
    env.launch(2, D)  # 10 over: B (2's, idle) goes, not A (used less recently, ranked after)
    assert env.evicted() == [(B, 30 * MiB)]
    c_running = env.launch(2, C)  # 10 over: D (2's own, active: after its kernel) before A
    env.res.launched(env.s[2], c_running, "event-after-c")  # type: ignore[arg-type]
    assert env.evicted() == [(D, 30 * MiB)]
    assert env.res.session_resident(1) == 30 * MiB and env.res.session_resident(2) == 30 * MiB
    env.track(1, B + 128 * MiB, 40 * MiB)
    env.launch(1, B + 128 * MiB)  # 20 over: 1's idle A before C, which 2's kernel uses
    assert env.evicted() == [(A, 30 * MiB)]
    assert env.res.session_resident(1) == 40 * MiB and env.resident() == 70 * MiB
    env.res.set_eviction_order(0, ())
    assert env.g.evict_rank == {}


def test_session_resident_follows_every_move() -> None:
    env = Env(capacity=100 * MiB)
    env.track(1, A, 40 * MiB)
    env.track(2, B, 70 * MiB)
    env.run(1, A)
    assert env.res.session_resident(1) == 40 * MiB and env.res.session_resident(2) == 0
    env.run(2, B)  # A goes
    assert env.res.session_resident(1) == 0 and env.res.session_resident(2) == 70 * MiB
    env.res.moved_to_host(env.s[2], B, 70 * MiB)  # type: ignore[arg-type]
    assert env.res.session_resident(2) == 0
    env.run(1, A)
    env.res.untrack(env.s[1], A)  # type: ignore[arg-type]
    assert env.res.session_resident(1) == 0 and env.g.resident_by == {}
    assert env.res.session_resident(99) == 0


def test_prefetch_brings_what_is_not_resident_in_bulk_when_it_fits() -> None:
    """before_launch(prefetch=True) (Policy.prefetches_footprint): after making room, the part
    not resident is prefetched to the GPU on the launch's stream, adjacent extents in one call;
    what is resident already is not; a launch that does not fit prefetches nothing."""
    env = Env(capacity=200 * MiB)
    env.track(1, A, 100 * MiB)  # two extents: 64 + 36
    env.track(1, B, 10 * MiB)
    env.run(1, B)
    env.backend.take()
    env.res.before_launch(env.s[1], [A, B], "user-stream", prefetch=True)  # type: ignore[arg-type]
    assert env.backend.of("mem_prefetch") == [(A, 100 * MiB, LOCATION_DEVICE, DEVICE, 0, "user-stream")]
    assert env.g.prefetched == 100 * MiB
    assert env.metrics.counts[("residency_prefetched_bytes", ("0", "a"))] == 100 * MiB
    env.backend.take()
    env.res.before_launch(env.s[1], [A], "user-stream", prefetch=True)  # type: ignore[arg-type]
    assert env.backend.of("mem_prefetch") == []  # resident already
    env.track(3, A + 100 * MiB, 4 * MiB)  # right after A: adjacent, but another allocation
    env.backend.take()
    env.res.before_launch(env.s[3], [A, A + 100 * MiB], "s3", prefetch=True)  # type: ignore[arg-type]
    assert env.backend.of("mem_prefetch") == [(A + 100 * MiB, 4 * MiB, LOCATION_DEVICE, DEVICE, 0, "s3")]
    env.track(2, C, 300 * MiB)
    env.backend.take()
    env.res.before_launch(env.s[2], [C], "s2", prefetch=True)  # type: ignore[arg-type]
    assert not [c for c in env.backend.of("mem_prefetch") if c[2] == LOCATION_DEVICE]  # overflow
    env.track(3, D, 20 * MiB)
    env.backend.take()
    env.launch(3, D)  # without prefetch: room made (evictions), nothing brought in
    assert [c for c in env.backend.of("mem_prefetch") if c[2] == LOCATION_DEVICE] == []


def test_a_launch_not_yet_issued_keeps_its_memory_from_others() -> None:
    """Between before_launch and launched (the kernel is not on its stream yet, no event to wait
    for) another session's launch leaves the extents alone, and so does a policy's eviction;
    afterwards they are evictable again, after the kernel. A launch that failed frees them."""
    env = Env(capacity=100 * MiB)
    env.track(1, A, 60 * MiB)
    env.track(2, B, 60 * MiB)
    env.track(3, C, 60 * MiB)
    pending = env.res.before_launch(env.s[1], [A], "s1")  # type: ignore[arg-type]
    assert env.res.evict_session(1) == 0
    env.backend.take()
    env.launch(2, B)  # 20 over, but A is pending: nothing to evict, an overflow
    assert env.evicted() == [] and env.g.overflows == 1
    env.res.launched(env.s[1], pending, "event-after-a")  # type: ignore[arg-type]
    env.finish(2, env.g.allocs[B])
    env.launch(3, C)  # 80 over: B (idle now) first, then A, after its kernel
    calls = env.backend.take()
    evicted = [(c[1], c[2]) for c in calls if c[0] == "mem_prefetch" and c[3] == LOCATION_HOST]
    assert evicted == [(B, 60 * MiB), (A, 60 * MiB)]
    assert calls.index(("stream_wait_event", "pilot-stream1", "event-after-a")) < \
        calls.index(("mem_prefetch", A, 60 * MiB, LOCATION_HOST, 0, 0, "pilot-stream1"))
    failed = env.res.before_launch(env.s[2], [B], "s2")  # type: ignore[arg-type]
    env.res.not_launched(env.s[2], failed)  # type: ignore[arg-type]
    assert [(e.pending, e.active) for e in env.g.allocs[B]] == [(0, 0)]


def test_cold_memory_goes_first_whatever_the_policys_order() -> None:
    """Memory no kernel or copy used for COLD_S is evicted before the order a policy set: a
    program's allocation it no longer uses is nobody's to keep (MFit made pageDoS thrash
    through its own pieces while a buffer stream never touched stayed resident)."""
    from pilot.daemon.resources.residency import COLD_S

    env = Env(capacity=100 * MiB)
    env.track(1, A, 30 * MiB)  # the small program's buffer it used once
    env.track(1, B, 30 * MiB)  # and the one it keeps using
    env.track(2, C, 30 * MiB)
    env.track(2, D, 30 * MiB)
    env.run(1, A)
    env.run(1, B)
    env.run(2, C)
    env.res.set_eviction_order(0, (2, 1))
    for e in env.g.allocs[A]:
        e.used_s -= COLD_S + 0.1
    env.launch(2, D)  # 20 over: A (cold) goes, though session 2 ranks first
    assert env.evicted() == [(A, 30 * MiB)]


def test_pages_come_in_only_after_the_evictions_that_made_their_room() -> None:
    """A policy's eviction (on pilot's stream) makes room; a later launch of another session that
    brings pages into that room waits for it, or for a moment the GPU would hold more than C."""
    env = Env()
    env.track(1, A, 60 * MiB)
    env.track(2, B, 40 * MiB)
    env.run(1, A)
    env.backend.take()
    assert env.res.evict_session(1) == 60 * MiB
    env.backend.take()
    env.launch(2, B, stream="s2")  # 40 MiB fit without evicting: the room came from session 1
    assert env.backend.take() == [("stream_wait_event", "s2", "event2")]
    env.launch(2, B, stream="s2")  # resident now: nothing comes in, nothing to wait for
    assert env.backend.take() == []


def test_moves_are_issued_in_the_order_they_were_planned() -> None:
    """Planning is under the GPU's lock, issuing after it; a second planner's moves wait for the
    first's to be issued (its wait must not come before the record it counts on)."""
    env = Env()
    env.track(1, A, 60 * MiB)
    env.track(2, B, 60 * MiB)
    env.run(1, A)
    started, release = threading.Event(), threading.Event()
    issued: list[str] = []
    real = env.backend.mem_prefetch

    def slow_prefetch(*args: Any) -> None:
        started.set()
        release.wait(5)
        issued.append("evict")
        real(*args)

    env.backend.mem_prefetch = slow_prefetch  # type: ignore[method-assign]
    first = threading.Thread(target=env.res.evict_session, args=(1,))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=env.launch, args=(2, B), kwargs={"stream": "s2"})
    second.start()
    second.join(0.2)
    assert second.is_alive() and issued == []  # planned, but not issued before the eviction
    release.set()
    first.join(5)
    second.join(5)
    assert issued[0] == "evict"
    waits = [c for c in env.backend.calls if c[0] == "stream_wait_event"]
    assert waits and waits[-1][1] == "s2"
