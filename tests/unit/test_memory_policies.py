"""The PILOT memory policies (policies/mfit.py, amfit.py, madvise.py): their decisions and their
Controls requests, from scripted event sequences. No daemon: a recording Controls stands in for
the daemon's, with a GPU whose capacity and fixed allocations each test sets."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from pilot.policies import (
    AllocationView,
    AMFit,
    Controls,
    Decision,
    GpuView,
    KernelView,
    LaunchView,
    MAdvise,
    MFit,
    Policy,
    PolicyConfigError,
    RangeView,
    SessionView,
    Verdict,
    create,
)

MiB = 1 << 20


class Recording(Controls):
    """A GPU of `capacity` bytes with `used` bytes of fixed allocations; every request recorded."""

    def __init__(self, capacity: int = 100 * MiB, used: int = 0) -> None:
        self.capacity, self.used = capacity, used
        self.calls: list[tuple[Any, ...]] = []
        self.kept: dict[int, int] = {}  # session -> resident bytes, as each test sets them
        self.orders: dict[int, tuple[int, ...]] = {}  # gpu -> the eviction order last set
        self.guaranteed: dict[str, int] = {}  # tenant -> provisioned bytes (every GPU)
        self.asked: list[tuple[Any, ...]] = []  # preemptible, preempt, resume, in order

    def gpu(self, gpu: int) -> GpuView:
        return GpuView(gpu, self.capacity, self.used, enforced=True)

    def resident(self, session: int) -> int:
        return self.kept.get(session, 0)

    def provisioned(self, tenant: str, gpu: int) -> int:
        return self.guaranteed.get(tenant, 0)

    def set_eviction_order(self, gpu: int, sessions: tuple[int, ...]) -> None:
        self.orders[gpu] = tuple(sessions)

    def evict(self, session: int, keep: tuple[int, ...] = ()) -> None:
        self.calls.append(("evict", session, tuple(keep)))

    def advise_host(self, session: int, ptr: int, size: int) -> None:
        self.calls.append(("advise_host", session, ptr, size))

    def unadvise(self, session: int, ptr: int, size: int, prefetch: bool = True) -> None:
        self.calls.append(("unadvise", session, ptr, size, prefetch))

    def report(self, action: str, tenant: str) -> None:
        self.calls.append(("report", action, tenant))

    # preemption: off unless a test turns it on (then recorded in `asked`, apart from `calls`)
    preempts = False

    def can_preempt(self) -> bool:
        return self.preempts

    def preemptible(self, session: int, on: bool = True) -> None:
        self.asked.append(("preemptible", session, on))

    def preempt(self, session: int) -> None:
        self.asked.append(("preempt", session))

    def resume(self, session: int) -> None:
        self.asked.append(("resume", session))

    def taken(self) -> list[tuple[Any, ...]]:
        """The preemption requests since the last call."""
        out, self.asked = self.asked, []
        return out

    def take(self) -> list[tuple[Any, ...]]:
        """The calls since the last take."""
        calls, self.calls = self.calls, []
        return calls


class World:
    """Drives a policy the way the daemon would: sessions, allocations (pointer `ptr`, all on
    one GPU unless told), launches with footprints of whole allocations, kernel ends."""

    def __init__(self, policy: Policy, capacity: int = 100 * MiB, used: int = 0) -> None:
        self.p = policy
        self.c = Recording(capacity, used)
        policy.controls = self.c
        self.sessions: dict[int, SessionView] = {}
        self.sizes: dict[int, int] = {}
        self.next_launch = 1

    def session(self, sid: int, tenant: str, gpu: int = 0) -> SessionView:
        s = SessionView(sid, tenant, 1000 + sid, gpu, 0)
        self.sessions[sid] = s
        self.p.session_started(s)
        return s

    def end(self, sid: int) -> None:
        self.p.session_ended(self.sessions.pop(sid))

    def _view(self, sid: int, ptr: int, size: int, movable: bool) -> AllocationView:
        s = self.sessions[sid]
        return AllocationView(sid, s.tenant, s.gpu, "managed" if movable else "device", ptr, size, movable)

    def alloc(self, sid: int, ptr: int, size: int, movable: bool = True) -> None:
        self.sizes[ptr] = size
        self.p.allocated(self._view(sid, ptr, size, movable))

    def allocs(self, *table: tuple[int, int, int]) -> None:
        """Movable allocations, each (session, ptr, size in MiB), in order."""
        for sid, ptr, mib in table:
            self.alloc(sid, ptr, mib * MiB)

    def free(self, sid: int, ptr: int, movable: bool = True) -> None:
        self.p.freed(self._view(sid, ptr, self.sizes.pop(ptr), movable))

    def launch(self, sid: int, *ptrs: int, at: float = 10.0, fixed: tuple[int, ...] = ()) -> LaunchView:
        """A new launch requested at `at` pointing into movable allocations `ptrs` (and fixed ones)."""
        s = self.sessions[sid]
        footprint = tuple(RangeView(p, self.sizes[p], "managed", True) for p in ptrs) + \
            tuple(RangeView(p, self.sizes[p], "device", False) for p in fixed)
        lid, self.next_launch = self.next_launch, self.next_launch + 1
        return LaunchView(id=lid, session=sid, tenant=s.tenant, pid=s.pid, gpu=s.gpu, vgpu=0,
                          kernel=f"k{lid}", grid=(1, 1, 1), block=(32, 1, 1), stream=0,
                          footprint=footprint, requested_at=at, now=at, attempts=0)

    def ask(self, launch: LaunchView, now: float | None = None) -> tuple[LaunchView, Decision]:
        """launch_requested again (attempts counts), at `now` (default: when it was requested)."""
        launch = dataclasses.replace(launch, now=launch.requested_at if now is None else now,
                                     attempts=launch.attempts + 1)
        return launch, self.p.launch_requested(launch)

    def run(self, launch: LaunchView, now: float | None = None) -> LaunchView:
        """Ask; it must run; start it."""
        launch, decision = self.ask(launch, now)
        assert decision.verdict is Verdict.RUN, decision
        self.p.launch_started(launch)
        return launch

    def finish(self, launch: LaunchView, at: float = 20.0) -> None:
        self.p.kernel_finished(KernelView(launch.id, launch.session, launch.tenant, launch.gpu,
                                          launch.kernel, launch.now, at))


def waits(decision: Decision, *words: str) -> None:
    assert decision.verdict is Verdict.WAIT, decision
    for word in words:
        assert word in decision.reason, decision.reason


def reports(calls: list[tuple[Any, ...]]) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in calls if c[0] == "report"]


def requests(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [c for c in calls if c[0] != "report"]


def check_reports(policy: Policy, sessions: range = range(0, 12)) -> None:
    """state() is JSON-able and session_status answers a (str, str) or None for every session."""
    json.dumps(policy.state())
    for sid in sessions:
        status = policy.session_status(sid)
        assert status is None or (isinstance(status[0], str) and isinstance(status[1], str))
    assert policy.session_status(999) is None


# ---- knobs ----

@pytest.mark.parametrize(("name", "table", "key"), [
    ("mfit", {"preempt_after": -1}, "preempt_after"),
    ("mfit", {"preempt_after": "-1s"}, "preempt_after"),
    ("amfit", {"resume_after": -0.5}, "resume_after"),
    ("madvise", {"per": "gpu"}, "per"),
    ("madvise", {"budget": 0}, "budget"),
    ("madvise", {"recheck": "soon"}, "recheck"),
    ("mfit", {"preempt": 1}, "preempt"),
    ("mfit", {"max_hold": -1}, "max_hold"),
])
def test_bad_knobs_are_refused(name: str, table: dict[str, Any], key: str) -> None:
    with pytest.raises(PolicyConfigError, match=key):
        create(name, table)


def test_knobs_parse_and_default() -> None:
    assert MFit.parse_settings({"preempt_after": "500ms"}).preempt_after == 0.5
    assert MFit().settings.preempt_after == 2.0 and AMFit().settings.resume_after == 2.0
    assert AMFit.parse_settings({"resume_after": 0}).resume_after == 0
    m = create("madvise", {"budget": "1GiB", "per": "tenant", "recheck": "250ms"})
    assert isinstance(m, MAdvise)
    assert (m.settings.budget, m.settings.per, m.settings.recheck) == (1 << 30, "tenant", 0.25)
    assert MAdvise().settings.budget is None and MAdvise().settings.per == "process"
    assert MFit.moves_memory is False and MAdvise.moves_memory is True
    assert MFit.decides_launches and MFit.needs_footprint and MFit.needs_kernel_end
    assert AMFit.decides_launches and AMFit.needs_footprint and AMFit.needs_kernel_end
    assert not MAdvise.decides_launches and MAdvise.needs_kernel_end


# ---- MFit ----

def mfit(preempt_after: float = 2.0, capacity: int = 100 * MiB, used: int = 0, per: str = "tenant",
         max_hold: float = 0.0, preempt_kernels: bool = False) -> World:
    w = World(MFit(MFit.parse_settings({"preempt_after": preempt_after, "per": per, "max_hold": max_hold,
                                        "preempt_kernels": preempt_kernels})), capacity, used)
    for sid, tenant in ((1, "a"), (2, "b"), (3, "c"), (4, "d")):
        w.session(sid, tenant)
    return w


def test_mfit_ranks_owners_by_memory_held_and_orders_eviction_so() -> None:
    w = mfit()
    w.allocs((1, 0xA000_00000, 60), (2, 0xB000_00000, 40), (3, 0xC000_00000, 10))
    w.alloc(3, 0xC100_00000, 200 * MiB, movable=False)  # fixed memory held counts too
    assert w.p.ranking(0) == ["c", "a", "b", "d"]  # c holds most: it yields first; d holds nothing
    assert w.c.orders[0] == (3, 1, 2, 4)
    w.free(3, 0xC100_00000, movable=False)
    w.allocs((2, 0xB100_00000, 30))  # b: 70
    assert w.p.ranking(0) == ["b", "a", "c", "d"] and w.c.orders[0] == (2, 1, 3, 4)
    w.session(5, "a")  # per tenant: a's second session goes with it
    assert w.c.orders[0] == (2, 1, 5, 3, 4)
    w.session(6, "e")
    w.session(7, "f")  # equal memory held (none): the older session ranks higher
    assert w.p.ranking(0)[-3:] == ["f", "e", "d"]
    assert w.c.calls == []
    check_reports(w.p)


def test_mfit_fit_counts_what_higher_ranked_owners_keep() -> None:
    w = mfit()
    w.allocs((1, 0xA000_00000, 60), (2, 0xB000_00000, 40), (3, 0xC000_00000, 10))
    w.c.kept = {1: 60 * MiB, 2: 40 * MiB, 3: 10 * MiB}
    w.run(w.launch(2, 0xB000_00000))
    _l, d = w.ask(w.launch(1, 0xA000_00000))  # above a: b 40 and c 10 kept
    waits(d, "needs 60.0 MiB", "50.0 MiB free")
    assert d.error == 2
    w.run(w.launch(3, 0xC000_00000))  # c ranks first: nothing above it
    w.run(w.launch(2, 0xB000_00000))  # above b: c's 10; 40 (its running kernel's) + 0 new
    w.c.kept[2] = 30 * MiB
    w.run(w.launch(1, 0xA000_00000))  # 60 <= 100 - 30 - 10
    assert w.c.calls == []


def test_mfit_fits_a_tenants_provisioned_memory_whatever_others_keep() -> None:
    """a holds the most (it ranks last), so b and c's 50 kept count against it: 60 do not fit in
    the 50 left, unless a is provisioned 60, which fits whatever those above keep."""
    w = mfit()
    w.allocs((1, 0xA000_00000, 60), (2, 0xB000_00000, 40), (3, 0xC000_00000, 10))
    w.c.kept = {2: 40 * MiB, 3: 10 * MiB}
    w.run(w.launch(2, 0xB000_00000))
    _l, d = w.ask(w.launch(1, 0xA000_00000))
    waits(d, "needs 60.0 MiB", "50.0 MiB free")
    w.c.guaranteed["a"] = 59 * MiB
    waits(w.ask(w.launch(1, 0xA000_00000))[1], "needs 60.0 MiB", "59.0 MiB free")
    w.c.guaranteed["a"] = 60 * MiB
    w.run(w.launch(1, 0xA000_00000))


def test_mfit_per_process_provisioned_counts_the_tenants_other_processes() -> None:
    """Per process, a's guarantee (80) is shared by its processes: session 5's 70 fit only once
    session 1 (a's too) keeps 10 or less; b's 40 kept above session 5 are not counted then."""
    w = mfit(per="process")
    w.session(5, "a")
    w.allocs((5, 0xA100_00000, 70), (1, 0xA000_00000, 20), (2, 0xB000_00000, 40))
    w.c.kept = {2: 40 * MiB, 1: 20 * MiB}
    w.run(w.launch(2, 0xB000_00000))
    waits(w.ask(w.launch(5, 0xA100_00000))[1], "needs 70.0 MiB", "40.0 MiB free")
    w.c.guaranteed["a"] = 80 * MiB
    waits(w.ask(w.launch(5, 0xA100_00000))[1], "needs 70.0 MiB", "60.0 MiB free")
    w.c.kept[1] = 10 * MiB
    w.run(w.launch(5, 0xA100_00000))


def test_mfit_counts_its_owners_running_kernels() -> None:
    """A program that holds more than it may keep runs its pieces only as far as they fit beside
    the smaller programs' memory: the enforcer then evicts its own pieces, not theirs."""
    w = mfit()
    w.allocs((2, 0xB000_00000, 20), (1, 0xA000_00000, 30), (1, 0xA100_00000, 30), (1, 0xA200_00000, 30))
    w.c.kept = {2: 20 * MiB}
    b = w.run(w.launch(2, 0xB000_00000))
    a1 = w.run(w.launch(1, 0xA000_00000))
    w.run(w.launch(1, 0xA100_00000))
    third, d = w.ask(w.launch(1, 0xA200_00000))
    waits(d, "needs 90.0 MiB", "80.0 MiB free")
    w.finish(a1)
    w.run(third)  # 60 now
    w.finish(b)
    _l, d = w.ask(w.launch(1, 0xA000_00000))  # b idle but keeping its 20: a's 90 still wait
    waits(d, "needs 90.0 MiB", "80.0 MiB free")


def test_mfit_fixed_allocations_take_room_and_launches_without_movable_memory_run() -> None:
    w = mfit(used=30 * MiB)  # room 70
    w.allocs((1, 0xA000_00000, 50), (2, 0xB000_00000, 20), (3, 0xC000_00000, 1))
    w.alloc(2, 0xD000_00000, 500 * MiB, movable=False)  # b holds most: it ranks last
    w.c.kept = {1: 50 * MiB, 3: 1 * MiB}
    w.run(w.launch(1, 0xA000_00000))
    _l, d = w.ask(w.launch(2, 0xB000_00000, fixed=(0xD000_00000,)))  # 20 vs 70 - 50 - 1
    waits(d, "needs 20.0 MiB", "19.0 MiB free")
    w.run(w.launch(2, fixed=(0xD000_00000,)))  # no movable memory: nothing to fit


def test_mfit_runs_alone_whatever_its_size() -> None:
    w = mfit()
    w.allocs((1, 0xA000_00000, 300), (2, 0xB000_00000, 80), (3, 0xC000_00000, 30))
    launch = w.run(w.launch(1, 0xA000_00000))
    assert w.p.state()["running"] == 1
    w.finish(launch)
    w.c.kept = {3: 30 * MiB}
    first = w.run(w.launch(3, 0xC000_00000))
    waiting, d = w.ask(w.launch(2, 0xB000_00000))  # above b: c's 30
    waits(d, "needs 80.0 MiB", "70.0 MiB free")
    w.finish(first)
    _l, d = w.ask(waiting)  # nothing running: it starts, the enforcer evicts what it must
    assert d.verdict is Verdict.RUN and d.reason == "nothing else running"


def test_mfit_a_launch_that_fits_is_not_held_behind_one_that_waits() -> None:
    w = mfit()
    w.allocs((3, 0xC000_00000, 10), (2, 0xB000_00000, 50), (1, 0xA000_00000, 60))
    w.c.kept = {3: 10 * MiB, 2: 50 * MiB}
    running = w.run(w.launch(2, 0xB000_00000))
    big, d = w.ask(w.launch(1, 0xA000_00000))
    waits(d, "needs 60.0 MiB", "40.0 MiB free")
    w.run(w.launch(3, 0xC000_00000))  # c fits at once, a's launch waiting or not
    assert w.p.state()["waiting"] == {"0": [big.id]}
    w.finish(running)
    w.c.kept[2] = 0
    w.run(big)
    assert w.p.state()["waiting"] == {}
    check_reports(w.p)


def test_mfit_queues_are_per_gpu() -> None:
    w = mfit()
    w.session(5, "e", gpu=1)
    w.allocs((1, 0xA000_00000, 60), (2, 0xB000_00000, 50), (5, 0xE000_00000, 90))
    w.c.kept = {2: 50 * MiB}
    w.run(w.launch(2, 0xB000_00000))
    _l, d = w.ask(w.launch(1, 0xA000_00000))
    waits(d, "needs 60.0 MiB")
    w.run(w.launch(5, 0xE000_00000))  # GPU 1: b's memory is not there
    assert w.c.orders[1] == (5,)


def preempt_world(preempt_after: float = 2.0, max_hold: float = 0.0,
                  preempt_kernels: bool = False) -> tuple[World, LaunchView]:
    """Held on GPU 0: b 70, a 40 (two sessions, 1 and 5), d 40, c 35: ranking b, d, a, c. a, b
    and c run a kernel each; a keeps 30, c 35, b 40. d's launch of 40 MiB waits: above it a
    and c keep 65, 35 MiB free, 5 short. Requested at 10.0."""
    w = mfit(preempt_after, max_hold=max_hold, preempt_kernels=preempt_kernels)
    w.session(5, "a")  # a second session of tenant a, idle
    w.allocs((1, 0xA000_00000, 30), (5, 0xA100_00000, 10), (2, 0xB000_00000, 10), (2, 0xB100_00000, 60),
             (3, 0xC000_00000, 35), (4, 0xD000_00000, 40))
    w.c.kept = {1: 30 * MiB, 2: 40 * MiB, 3: 35 * MiB}
    for sid, ptr in ((1, 0xA000_00000), (2, 0xB000_00000), (3, 0xC000_00000)):
        w.run(w.launch(sid, ptr))
    assert w.p.ranking(0) == ["b", "d", "a", "c"]
    head, d = w.ask(w.launch(4, 0xD000_00000, at=10.0))
    waits(d, "needs 40.0 MiB", "35.0 MiB free")
    return w, head


def test_mfit_preempts_those_above_most_memory_held_first_and_only_as_needed() -> None:
    w, head = preempt_world()
    head, d = w.ask(head, 11.9)
    waits(d, "needs 40.0 MiB")
    assert w.c.calls == []  # not waited long enough
    head, d = w.ask(head, 12.0)
    waits(d, "needs 40.0 MiB")
    # a (40 held, keeps 30) covers the 5 short; c (35) stays; b ranks below d: not in the way.
    assert w.c.take() == [("report", "hold", "a"), ("evict", 1, (0xA000_00000,)), ("evict", 5, ())]
    assert w.p.state()["held"] == {"a@0": head.session}
    assert w.p.ranking(0) == ["a", "b", "c", "d"] and w.c.orders[0] == (1, 5, 2, 3, 4)
    assert w.p.session_status(1) == ("held", f"mfit: preempted so that session {head.session}'s "
                                             "launches fit")
    assert w.p.session_status(5) is not None and w.p.session_status(2) is None
    for sid, ptr in ((1, 0xA000_00000), (5, 0xA100_00000)):  # held: they wait, even if they fit
        _l, d = w.ask(w.launch(sid, ptr, at=12.0))
        waits(d, "held", f"session {head.session}")
    w.run(head, 12.1)  # d ranks first now: nothing above it
    check_reports(w.p)


def test_mfit_holds_last_while_the_preempting_session_keeps_the_gpu_busy() -> None:
    w, head = preempt_world()
    head, _d = w.ask(head, 12.5)
    w.c.take()
    head = w.run(head, 12.6)
    w.finish(head, at=13.0)
    nxt = w.run(w.launch(4, 0xD000_00000, at=14.0))  # d again, within preempt_after: held on
    w.finish(nxt, at=14.5)
    w.p.tick(16.4)
    assert w.c.take() == [] and w.p.session_status(1) is not None
    w.p.tick(16.5)  # d idle for preempt_after (2 s): the holds are lifted
    assert reports(w.c.take()) == [("release", "a")]
    assert w.p.state()["held"] == {} and w.p.session_status(1) is None
    assert w.p.ranking(0) == ["b", "d", "a", "c"]
    _l, d = w.ask(w.launch(1, 0xA000_00000, at=17.0))  # a is asked again like anyone
    assert d.verdict is Verdict.RUN


def test_mfit_holds_last_at_most_max_hold_then_owners_take_turns() -> None:
    w, head = preempt_world(max_hold=5.0)
    head, _d = w.ask(head, 12.0)  # preempts at 12.0
    w.c.take()
    head = w.run(head, 12.1)
    busy = w.run(w.launch(4, 0xD000_00000, at=16.0))  # d keeps the GPU busy
    w.p.tick(16.9)
    assert w.p.state()["held"] != {}
    w.p.tick(17.0)  # max_hold: released though d is busy
    assert reports(w.c.take()) == [("release", "a")]
    assert w.p.ranking(0)[-1] == "c"
    waiting, d = w.ask(w.launch(4, 0xD000_00000, at=17.1))  # a and c above d again
    waits(d)
    waiting, d = w.ask(waiting, 18.9)
    assert w.c.calls == []  # d's launch must wait preempt_after again before preempting
    w.finish(busy, at=19.0)
    waiting, d = w.ask(waiting, 19.1)
    waits(d)
    assert reports(w.c.take()) == [("hold", "a")]


@pytest.mark.parametrize("how", ["timeout", "session_end", "refused", "session_ended"])
def test_mfit_holds_lift_when_the_preempting_launch_goes(how: str) -> None:
    w, head = preempt_world()
    head, _d = w.ask(head, 12.0)
    w.c.take()
    if how == "session_ended":
        w.end(4)
    else:
        w.p.launch_dropped(head, how)
    assert reports(w.c.take()) == [("release", "a")]
    assert w.p.state()["held"] == {} and w.p.state()["waiting"] == {}
    assert w.p.ranking(0)[:1] == ["b"]
    _l, d = w.ask(w.launch(5, 0xA100_00000, at=13.0))  # a is not held: 10 fits beside c's 35
    assert d.verdict is Verdict.RUN


@pytest.mark.parametrize(("preempts", "asked"), [(True, True), (False, True), (True, False)])
def test_mfit_stops_the_held_owners_kernels_and_resumes_them_with_its_holds(
        preempts: bool, asked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With pilotd able to cut kernels and preempt_kernels set, a launch that waits makes the
    GPU's sessions launch preemptible variants; a hold stops the held owner's kernels (both of
    a's sessions), its release resumes them, and with nothing waiting the sessions launch their
    originals again. Without either, nothing of it is asked."""
    monkeypatch.setattr(Recording, "preempts", preempts)
    w, head = preempt_world(preempt_kernels=asked)
    if not (preempts and asked):
        head, _d = w.ask(head, 12.0)
        w.p.launch_dropped(head, "timeout")
        assert w.c.taken() == []
        return
    assert w.c.taken() == [("preemptible", sid, True) for sid in (1, 2, 3, 4, 5)]
    w.session(6, "e")  # a session that comes while a launch waits is preemptible at once
    assert w.c.taken() == [("preemptible", 6, True)]
    head, _d = w.ask(head, 12.0)
    assert w.c.taken() == [("preempt", 1), ("preempt", 5)]
    head, _d = w.ask(head, 12.5)  # asked again: nothing preempted twice
    assert w.c.taken() == []
    w.p.launch_dropped(head, "timeout")
    assert w.c.taken() == [("resume", 1), ("resume", 5)] + \
        [("preemptible", sid, False) for sid in (1, 2, 3, 4, 5, 6)]


def test_mfit_never_preempts_with_preempt_after_0() -> None:
    w, head = preempt_world(preempt_after=0)
    for now in (12.0, 100.0, 10_000.0):
        head, d = w.ask(head, now)
        waits(d, "needs 40.0 MiB")
    assert w.c.calls == [] and w.p.state()["held"] == {}


def test_mfit_session_end_forgets_its_kernels_and_launches() -> None:
    w = mfit()
    w.allocs((1, 0xA000_00000, 20), (2, 0xB000_00000, 90), (3, 0xC000_00000, 10))
    w.c.kept = {1: 20 * MiB}
    w.run(w.launch(1, 0xA000_00000))
    _l, d = w.ask(w.launch(2, 0xB000_00000))
    waits(d)
    w.end(2)  # its waiting launch goes
    assert w.p.state()["waiting"] == {} and 2 not in w.c.orders[0]
    w.run(w.launch(3, 0xC000_00000))
    w.end(1)  # its kernel counts no more
    assert w.p.state()["running"] == 1


def test_mfit_per_process_ranks_processes_of_one_tenant() -> None:
    """The default, per = "process": two programs of one user are ranked and preempted one
    against the other (with per = "tenant" they are one owner, and the second's kernel runs)."""
    w = World(MFit(MFit.parse_settings({"preempt_after": 1.0})))
    for sid in (1, 2):
        w.session(sid, "same-user")
    w.allocs((1, 0xA000_00000, 40), (2, 0xB000_00000, 80))
    w.c.kept = {1: 40 * MiB}
    small = w.run(w.launch(1, 0xA000_00000))
    head, d = w.ask(w.launch(2, 0xB000_00000, at=10.0))
    waits(d, "needs 80.0 MiB", "60.0 MiB free")
    head, d = w.ask(head, 11.0)
    waits(d)
    assert w.c.take() == [("report", "hold", "same-user"), ("evict", 1, (0xA000_00000,))]
    assert w.p.session_status(1) is not None and w.p.session_status(2) is None
    _l, d = w.ask(w.launch(1, 0xA000_00000, at=11.5))  # the small one's next launch is held
    waits(d, "held", "session 2")
    w.finish(small, at=11.6)
    w.run(head, 11.7)
    tenant_wide = World(MFit(MFit.parse_settings({"preempt_after": 1.0, "per": "tenant"})))
    for sid in (1, 2):
        tenant_wide.session(sid, "same-user")
    tenant_wide.allocs((1, 0xA000_00000, 40), (2, 0xB000_00000, 50))
    tenant_wide.c.kept = {1: 40 * MiB}
    tenant_wide.run(tenant_wide.launch(1, 0xA000_00000))
    # one owner: 40 running + 50 new fit in 100
    tenant_wide.run(tenant_wide.launch(2, 0xB000_00000, at=10.0))
    assert tenant_wide.c.take() == []


# ---- AMFit ----

def amfit(resume_after: float = 2.0, capacity: int = 100 * MiB, per: str = "tenant",
          preempt_kernels: bool = False) -> World:
    w = World(AMFit(AMFit.parse_settings({"resume_after": resume_after, "per": per,
                                          "preempt_kernels": preempt_kernels})), capacity)
    for sid, tenant in ((1, "a"), (2, "b"), (3, "c")):
        w.session(sid, tenant)
    w.allocs((1, 0xA000_00000, 60), (1, 0xA100_00000, 5), (2, 0xB000_00000, 50), (3, 0xC000_00000, 10))
    return w


def overflow(w: World) -> tuple[LaunchView, LaunchView]:
    """a (60 active) then b (50 active) start at 10.0: 110 > 100, a is held."""
    la = w.run(w.launch(1, 0xA000_00000, at=10.0))
    assert w.c.calls == []
    lb = w.run(w.launch(2, 0xB000_00000, at=10.0))  # runs at once, overflow or not
    return la, lb


def test_amfit_holds_the_tenant_with_most_active_memory() -> None:
    w = amfit()
    overflow(w)
    assert w.c.take() == [("report", "hold", "a"), ("evict", 1, (0xA000_00000,))]
    _l, d = w.ask(w.launch(1, 0xA100_00000, at=10.5))
    waits(d, "held", "60.0 MiB")
    w.run(w.launch(2, 0xB000_00000, at=10.5))  # b is not held
    w.run(w.launch(3, 0xC000_00000, at=10.5))  # nor c: one hold is enough (b 50 + c 10 fit)
    assert w.c.calls == []
    status = w.p.session_status(1)
    assert status is not None and status[0] == "held" and "amfit" in status[1]
    assert w.p.session_status(2) is None
    assert w.p.state()["held"]["a"]["active"] == 60 * MiB
    check_reports(w.p)


def test_amfit_stops_the_held_owners_kernels_and_resumes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner held for an overflow has its kernels stopped, and resumed with the hold's end;
    from the hold on, and preemptible_for after it, the GPU's sessions launch preemptible
    variants (a GPU that never overflows does not pay for them)."""
    monkeypatch.setattr(Recording, "preempts", True)
    w = amfit(preempt_kernels=True)
    la = w.run(w.launch(1, 0xA000_00000, at=10.0))  # 60 of 100 active: no overflow, no variants
    assert w.c.taken() == []
    lb = w.run(w.launch(2, 0xB000_00000, at=10.0))  # 110 > 100: a held
    assert w.c.taken() == [("preempt", 1)] + [("preemptible", sid, True) for sid in (1, 2, 3)]
    w.finish(la, at=10.1)
    w.finish(lb, at=10.2)  # nothing active: a resumes; still preemptible (it may overflow again)
    assert w.c.taken() == [("resume", 1)]
    w.p.tick(20.1)
    assert w.c.taken() == []
    w.p.tick(20.2)  # 10 s (preemptible_for) after the hold ended: originals again
    assert w.c.taken() == [("preemptible", sid, False) for sid in (1, 2, 3)]


def test_amfit_eviction_order_held_first_then_most_active_memory_seen() -> None:
    w = amfit(resume_after=2.0)
    assert w.c.orders[0] == (3, 2, 1)  # nobody active yet: the newer session first
    w.run(w.launch(3, 0xC000_00000, at=9.0))
    assert w.c.orders[0] == (3, 2, 1)  # c: 10 active, the most so far
    la, lb = overflow(w)  # a held (60 active), b 50
    assert w.c.orders[0] == (1, 2, 3)
    w.finish(la, at=10.1)
    w.finish(lb, at=10.1)
    w.p.tick(12.0)  # a resumes: ranked by the most it had active, 60 > 50 > 10
    assert w.p.state()["held"] == {} and w.c.orders[0] == (1, 2, 3)
    w.end(1)
    assert w.c.orders[0] == (2, 3)


def test_amfit_holds_more_while_the_rest_overflow() -> None:
    w = amfit(capacity=40 * MiB)
    w.alloc(3, 0xC100_00000, 35 * MiB)
    w.run(w.launch(1, 0xA000_00000))
    w.run(w.launch(2, 0xB000_00000))  # a held (60); b alone is no overflow
    w.run(w.launch(3, 0xC100_00000))  # b 50 + c 35 > 40: b held too
    assert reports(w.c.take()) == [("hold", "a"), ("hold", "b")]


def test_amfit_never_holds_a_tenant_alone() -> None:
    w = amfit(capacity=10 * MiB)
    w.run(w.launch(1, 0xA000_00000))
    w.run(w.launch(1, 0xA100_00000))
    assert w.c.calls == [] and w.p.state()["held"] == {}


def test_amfit_resumes_when_it_fits_beside_the_others() -> None:
    w = amfit()
    la, lb = overflow(w)
    w.c.take()
    lc = w.run(w.launch(3, 0xC000_00000, at=10.2))
    w.finish(la, at=10.3)  # a's own kernel ends: others 60 + its 60 do not fit
    assert w.c.calls == []
    w.finish(lb, at=10.4)  # c 10 + a 60 fit
    assert w.c.take() == [("report", "release", "a")]
    w.run(w.launch(1, 0xA000_00000, at=10.5))
    assert w.p.session_status(1) is None
    w.finish(lc)
    assert w.c.calls == []


def test_amfit_resumes_at_the_fit_boundary() -> None:
    w = amfit()
    w.alloc(3, 0xC100_00000, 40 * MiB)
    _la, lb = overflow(w)
    w.run(w.launch(3, 0xC100_00000, at=10.1))
    w.c.take()
    w.finish(lb, at=10.2)  # c 40 + a 60 = 100: fits exactly
    assert w.c.take() == [("report", "release", "a")]


def test_amfit_resumes_after_resume_after_and_is_not_held_again_at_once() -> None:
    w = amfit(resume_after=2.0)
    overflow(w)  # held at 10.0
    w.c.take()
    w.p.tick(11.99)
    assert w.c.calls == []
    w.p.tick(12.0)
    assert w.c.take() == [("report", "release", "a")]
    w.run(w.launch(1, 0xA100_00000, at=12.1))  # a runs again, the GPU still overflowing
    assert w.c.calls == [] and w.p.state()["held"] == {}
    w.run(w.launch(3, 0xC000_00000, at=14.5))  # resume_after later a is fair game again
    assert w.c.take() == [("report", "hold", "a"), ("evict", 1, (0xA000_00000, 0xA100_00000))]


def test_amfit_resume_after_0_waits_for_room() -> None:
    w = amfit(resume_after=0)
    overflow(w)
    w.c.take()
    w.p.tick(1e6)
    assert w.c.calls == [] and "a" in w.p.state()["held"]
    check_reports(w.p)


def test_amfit_holds_per_gpu() -> None:
    w = amfit()
    w.session(4, "a", gpu=1)
    w.alloc(4, 0xE000_00000, 10 * MiB)
    overflow(w)
    w.run(w.launch(4, 0xE000_00000, at=10.5))  # a is held on GPU 0 only


# ---- MAdvise ----

def madvise(budget: int | None = None, per: str = "process", recheck: float = 0.1,
            capacity: int = 100 * MiB, used: int = 0) -> World:
    table: dict[str, Any] = {"per": per, "recheck": recheck}
    if budget is not None:
        table["budget"] = f"{budget}B"
    w = World(MAdvise(MAdvise.parse_settings(table)), capacity, used)
    for sid, tenant in ((1, "a"), (2, "b"), (3, "c"), (4, "d")):
        w.session(sid, tenant)
    return w


def owners(w: World) -> dict[str, tuple[int, int]]:
    return {k: (o["bytes"] // MiB, o["advised"] // MiB) for k, o in w.p.state()["owners"].items()}


def test_madvise_no_pressure_no_advice() -> None:
    w = madvise(budget=10 * MiB)
    w.alloc(1, 0xA000_00000, 40 * MiB)
    w.alloc(2, 0xB000_00000, 60 * MiB)  # 100: the room exactly
    w.alloc(2, 0xB100_00000, 500 * MiB, movable=False)  # fixed memory is not the policy's
    assert w.c.calls == []
    assert owners(w) == {"session:1": (40, 0), "session:2": (60, 0)}
    assert w.p.session_status(1) is None


def pressure(w: World) -> None:
    """Session 1 (tenant a): 3 x 20 MiB; session 2 (b): 50 MiB; 110 > 100."""
    for ptr in (0xA000_00000, 0xA100_00000, 0xA200_00000):
        w.alloc(1, ptr, 20 * MiB)
    w.alloc(2, 0xB000_00000, 50 * MiB)


def test_madvise_advises_the_largest_excess_first() -> None:
    w = madvise(budget=30 * MiB)
    pressure(w)  # excess: session 1 30, session 2 20; advising session 1's is enough
    assert w.c.take() == [("advise_host", 1, 0xA100_00000 + 10 * MiB, 10 * MiB),
                          ("advise_host", 1, 0xA200_00000, 20 * MiB), ("report", "throttle", "a")]
    assert owners(w) == {"session:1": (60, 30), "session:2": (50, 0)}
    assert w.p.session_status(1) == ("throttled", "madvise: 30.0 MiB of 60.0 MiB kept in host memory "
                                                  "(process over its budget)")
    assert w.p.session_status(2) is None
    # More pressure: session 1 has nothing more beyond its budget; session 2's excess goes.
    w.alloc(3, 0xC000_00000, 30 * MiB)
    assert w.c.take() == [("advise_host", 2, 0xB000_00000 + 30 * MiB, 20 * MiB), ("report", "throttle", "b")]
    check_reports(w.p)


def test_madvise_fair_share_budget() -> None:
    w = madvise(used=10 * MiB)  # room 90, three owners: 30 each
    w.alloc(1, 0xA000_00000, 60 * MiB)
    w.alloc(2, 0xB000_00000, 30 * MiB)
    assert w.c.calls == []
    w.alloc(3, 0xC000_00000, 30 * MiB)
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 30 * MiB, 30 * MiB)]


def test_madvise_shrinking_fair_share_advises_only_what_is_new() -> None:
    w = madvise(capacity=120 * MiB)
    w.alloc(1, 0xA000_00000, 120 * MiB)
    w.alloc(2, 0xB000_00000, 60 * MiB)  # budget 60: a's last 60 advised
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 60 * MiB, 60 * MiB)]
    w.alloc(3, 0xC000_00000, 30 * MiB)  # budget 40: a's 20 more, then b's last 20
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 40 * MiB, 20 * MiB),
                                    ("advise_host", 2, 0xB000_00000 + 40 * MiB, 20 * MiB)]
    assert owners(w) == {"session:1": (120, 80), "session:2": (60, 20), "session:3": (30, 0)}
    kept = sum(b - a for b, a in owners(w).values())
    assert kept <= 120


def test_madvise_per_tenant() -> None:
    w = madvise(budget=40 * MiB, per="tenant")
    w.session(5, "a")
    w.alloc(1, 0xA000_00000, 30 * MiB)
    w.alloc(5, 0xA100_00000, 30 * MiB)
    w.alloc(2, 0xB000_00000, 50 * MiB)  # tenant a 60 (20 over), b 50 (10 over): a's tail goes
    assert w.c.take() == [("advise_host", 5, 0xA100_00000 + 10 * MiB, 20 * MiB), ("report", "throttle", "a")]
    assert owners(w) == {"tenant:a": (60, 20), "tenant:b": (50, 0)}
    assert w.p.session_status(1) == w.p.session_status(5) == \
        ("throttled", "madvise: 20.0 MiB of 60.0 MiB kept in host memory (tenant over its budget)")
    w.free(5, 0xA100_00000)
    assert w.c.calls == [] and owners(w) == {"tenant:a": (30, 0), "tenant:b": (50, 0)}
    check_reports(w.p)


def test_madvise_budget_is_at_least_the_tenants_provisioned_memory() -> None:
    """Budget 30: a (60) and b (50) are both over it, a more; provisioned 60, a keeps all of
    its 60 and b's excess goes instead. Per process, a tenant's provisioned bytes are shared by
    its processes."""
    w = madvise(budget=30 * MiB)
    w.c.guaranteed["a"] = 60 * MiB
    pressure(w)
    assert w.c.take() == [("advise_host", 2, 0xB000_00000 + 30 * MiB, 20 * MiB), ("report", "throttle", "b")]
    assert owners(w) == {"session:1": (60, 0), "session:2": (50, 20)}
    w.session(5, "a")
    w.alloc(5, 0xA300_00000, 20 * MiB)  # a's 60 now 30 per process: session 1's last 30 go
    assert requests(w.c.take()) == [("advise_host", 1, 0xA100_00000 + 10 * MiB, 10 * MiB),
                                    ("advise_host", 1, 0xA200_00000, 20 * MiB)]


def test_madvise_unthrottles_when_memory_is_freed() -> None:
    w = madvise(budget=30 * MiB)
    pressure(w)
    w.c.take()
    w.alloc(3, 0xC000_00000, 20 * MiB)  # 80 + 20 = 100: no pressure, still no room for a's 30
    assert w.c.calls == []
    w.free(3, 0xC000_00000)  # 80 kept, 20 free: not enough for a's 30
    assert w.c.calls == []
    w.free(2, 0xB000_00000)  # 30 kept, 70 free
    assert w.c.take() == [("unadvise", 1, 0xA100_00000 + 10 * MiB, 10 * MiB, True),
                          ("unadvise", 1, 0xA200_00000, 20 * MiB, True), ("report", "unthrottle", "a")]
    assert w.p.session_status(1) is None and owners(w) == {"session:1": (60, 0)}


def test_madvise_unthrottles_when_room_grows() -> None:
    w = madvise(used=40 * MiB)  # room 60
    w.alloc(1, 0xA000_00000, 50 * MiB)
    w.alloc(2, 0xB000_00000, 30 * MiB)  # fair share 30: a's 20 over
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 30 * MiB, 20 * MiB)]
    w.c.used = 0  # fixed memory freed (no policy event for it)
    w.p.kernel_finished(KernelView(1, 2, "b", 0, "k", 1.0, 2.0))
    assert w.c.take() == [("unadvise", 1, 0xA000_00000 + 30 * MiB, 20 * MiB, True),
                          ("report", "unthrottle", "a")]


def two_throttled(w: World) -> None:
    """Budget 20: session 1 throttled at 1.0 (40 MiB advised), session 2 at 2.0 (20 MiB)."""
    w.alloc(1, 0xA000_00000, 60 * MiB)
    w.alloc(2, 0xB000_00000, 40 * MiB)
    w.p.kernel_finished(KernelView(1, 1, "a", 0, "k", 0.5, 1.0))
    w.alloc(3, 0xC000_00000, 10 * MiB)
    w.p.kernel_finished(KernelView(2, 1, "a", 0, "k", 1.5, 2.0))
    w.alloc(4, 0xD000_00000, 40 * MiB)
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 20 * MiB, 40 * MiB),
                                    ("advise_host", 2, 0xB000_00000 + 20 * MiB, 20 * MiB)]
    assert owners(w)["session:1"] == (60, 40) and owners(w)["session:2"] == (40, 20)


def test_madvise_unthrottles_the_longest_throttled_first() -> None:
    w = madvise(budget=20 * MiB)
    two_throttled(w)
    w.free(4, 0xD000_00000)  # 50 free: session 1's 40 first, then session 2's 20 does not fit
    assert requests(w.c.take()) == [("unadvise", 1, 0xA000_00000 + 20 * MiB, 40 * MiB, True)]
    assert w.p.session_status(1) is None and w.p.session_status(2) is not None


def test_madvise_unthrottles_one_whose_advice_fits() -> None:
    w = madvise(budget=20 * MiB)
    two_throttled(w)
    w.free(3, 0xC000_00000)  # 20 free: not session 1's 40, session 2's 20
    assert w.c.take() == [("unadvise", 2, 0xB000_00000 + 20 * MiB, 20 * MiB, True),
                          ("report", "unthrottle", "b")]


def test_madvise_tick_rechecks_at_most_every_recheck() -> None:
    w = madvise(budget=30 * MiB, recheck=0.5, used=10 * MiB)  # room 90
    w.alloc(1, 0xA000_00000, 60 * MiB)
    w.alloc(2, 0xB000_00000, 40 * MiB)
    assert requests(w.c.take()) == [("advise_host", 1, 0xA000_00000 + 30 * MiB, 30 * MiB)]
    w.p.tick(10.0)
    assert w.c.calls == []
    w.c.used = 0  # 70 kept, 30 free: a's 30 fit
    w.p.tick(10.2)
    w.p.tick(10.49)
    assert w.c.calls == []
    w.p.tick(10.5)
    assert requests(w.c.take()) == [("unadvise", 1, 0xA000_00000 + 30 * MiB, 30 * MiB, True)]
    w.p.tick(11.5)
    assert w.c.calls == []


def test_madvise_freeing_advised_memory_forgets_its_advice() -> None:
    w = madvise(budget=30 * MiB)
    pressure(w)
    w.alloc(3, 0xC000_00000, 20 * MiB)  # 100 kept: no room to unthrottle
    w.c.take()
    w.free(1, 0xA200_00000)  # a keeps 20 + 10 on the GPU, 10 advised; 100 kept
    assert owners(w)["session:1"] == (40, 10)
    w.free(1, 0xA100_00000)
    assert owners(w)["session:1"] == (20, 0) and w.p.session_status(1) is None
    assert w.c.calls == []
    w.free(1, 0xA000_00000)
    w.end(1)
    assert "session:1" not in owners(w)
    check_reports(w.p)


def test_amfit_per_process_holds_one_process_of_a_tenant() -> None:
    w = World(AMFit(AMFit.parse_settings({"resume_after": 2.0})))
    for sid in (1, 2):
        w.session(sid, "same-user")
    w.allocs((1, 0xA000_00000, 70), (2, 0xB000_00000, 40))
    w.run(w.launch(1, 0xA000_00000))
    w.run(w.launch(2, 0xB000_00000))  # 110 active > 100: the larger process is held
    assert w.c.take() == [("report", "hold", "same-user"), ("evict", 1, (0xA000_00000,))]
    _l, d = w.ask(w.launch(1, 0xA000_00000, at=11.0))
    waits(d, "held")
    _l, d = w.ask(w.launch(2, 0xB000_00000, at=11.0))
    assert d.verdict is Verdict.RUN


def test_running_kernels_counts_stay_right_through_shared_allocations() -> None:
    """RunningKernels keeps per-GPU and per-owner counts incrementally: an allocation stays
    active while any kernel using it runs, and everything is gone once they all finished."""
    from pilot.policies.tracking import RunningKernels

    w = World(Policy())
    for sid, tenant in ((1, "a"), (2, "b")):
        w.session(sid, tenant)
    w.allocs((1, 0xA000_00000, 10), (1, 0xA100_00000, 20), (2, 0xB000_00000, 30))
    rk = RunningKernels()
    for _ in range(2):  # kernels that use no movable memory, finishing one after the other
        lone = [w.launch(2), w.launch(2)]
        for k in lone:
            rk.started(k)
        for k in lone:
            rk.finished(k.id)
    assert rk.by_id == {} and rk.owners_on(0) == set()
    k1, k2 = w.launch(1, 0xA000_00000, 0xA100_00000), w.launch(1, 0xA000_00000)
    k3, bare, bare2 = w.launch(2, 0xB000_00000), w.launch(1), w.launch(1)  # bare: no movable memory
    for k in (bare, k1, k2, k3, bare2):
        rk.started(k)
    rk.finished(bare.id)
    rk.finished(bare2.id)
    rk.started(k1)  # twice: counted once
    assert rk.active(0) == {0xA000_00000: 10 * MiB, 0xA100_00000: 20 * MiB, 0xB000_00000: 30 * MiB}
    assert rk.active_by(0) == {"a": 30 * MiB, "b": 30 * MiB} and rk.owners_on(0) == {"a", "b"}
    assert rk.active_others(0, "a") == 30 * MiB and rk.active(0, {"b"}) == {0xB000_00000: 30 * MiB}
    assert (rk.gpu_bytes(0), rk.owner_bytes(0, "a"), rk.owner_bytes(0, "b")) == (60 * MiB, 30 * MiB, 30 * MiB)
    assert set(rk.owner_pointers(0, "a")) == {0xA000_00000, 0xA100_00000}
    rk.finished(k1.id)
    assert rk.active_by(0) == {"a": 10 * MiB, "b": 30 * MiB} and rk.session_busy(1)
    assert rk.gpu_bytes(0) == 40 * MiB and rk.owner_bytes(0, "a") == 10 * MiB
    rk.drop_session(1)
    assert rk.active_by(0) == {"b": 30 * MiB} and not rk.session_busy(1) and rk.owners_on(0) == {"b"}
    assert rk.finished(k2.id) is None
    rk.finished(k3.id)
    assert rk.active(0) == {} and rk.owners_on(0) == set() and rk.by_id == {}
    assert rk.gpu_bytes(0) == 0 and rk.owner_bytes(0, "b") == 0 and rk.owner_pointers(0, "a") == {}
