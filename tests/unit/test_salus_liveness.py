"""The `salus` policy never stalls: seeded random traces of jobs (declared or not, P and E that
grow after a few iterations, E that varies, scratch beyond the lane, caching allocators, jobs
that end early), driven through the policy's events by test_salus_policy's simulation, under
each scheduler. Every job finishes (or is refused, as a GPU of capacity C would refuse it)
within a bound of simulated time; the safety condition holds at every step (simulate checks
it); and whenever a job waits, the trace moves: some job makes a call within a bounded time.
A stall (a job outside the lanes waiting for admission to memory it holds itself, issue 30)
fails it at once."""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_salus_policy import DT, GIB, Holds, Script, salus, simulate

from pilot.policies.salus.declared import NONE, Declared
from pilot.policies.salus.policy import Salus

C = 12 * GIB
UNIT = GIB // 4
SEEDS = range(150)
ITERATION_S = 0.05
STALL_S = 3.0  # no call by any job for this long while calls remain: nothing can move


class Stalled(AssertionError):
    pass


def job(rng: random.Random, arrival: float) -> tuple[Script, Declared]:
    """A random job and what it declares."""
    big = rng.random() < 0.15  # P + E may pass C: refused as a GPU of capacity C would
    p, e = rng.randrange(1, 33 if big else 12) * UNIT, rng.randrange(0, 33 if big else 16) * UNIT
    n = rng.randrange(2, 9)
    grows_at = rng.randrange(1, n + 1)  # from this iteration on: more state, more scratch
    dp, de = rng.choice([0, 0, UNIT, 4 * UNIT]), rng.choice([0, UNIT, 8 * UNIT])
    kind = rng.choice(["frees", "frees", "frees", "caching", "quits"])
    plan: list[tuple[str, int]] = [("alloc", p)]
    if rng.random() < 0.3:  # set-up that allocates and frees before the first launch
        setup = rng.randrange(1, 17) * UNIT
        plan += [("alloc", setup), ("free", setup)]
    held = [p]
    for i in range(n):
        if i == grows_at and dp:
            plan.append(("alloc", dp))
            held.append(dp)
        scratch = rng.choice([e, e, max(0, e - UNIT)]) + (de if i >= grows_at else 0)
        if kind == "caching":
            if i == 0 and scratch:
                plan.append(("alloc", scratch))
                held.append(scratch)
            plan.append(("launch", 0))
            continue
        if scratch:
            plan.append(("alloc", scratch))
        plan.append(("launch", 0))
        if scratch:
            plan.append(("free", scratch))
        if kind == "quits" and i == grows_at:
            break
    plan += [("free", b) for b in held]
    declared = rng.choice([
        NONE,
        Declared(p, e, n, None),
        Declared(p, max(0, e - 2 * UNIT), n, None),  # declares too little scratch
        Declared(None, None, n, ITERATION_S),
    ])
    return Script(arrival, p, e, n, ITERATION_S, plan=tuple(plan)), declared


def trace(seed: int) -> tuple[list[Script], list[Declared]]:
    rng = random.Random(seed)
    jobs = [job(rng, round(rng.uniform(0, 1.5), 2)) for _ in range(rng.randrange(3, 8))]
    return [s for s, _ in jobs], [d for _, d in jobs]


def watch_progress(p: Salus) -> None:
    """Fail once no job has made a call for STALL_S while one waits (the policy's tick runs
    every step of the simulation: the watch rides on it)."""
    last: dict[str, float] = {"at": 0.0}
    calls = {"n": 0}
    for name in ("allocation_requested", "freed", "launch_started", "session_started", "session_ended"):
        original = getattr(p, name)

        def counted(*args, _original=original):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            return _original(*args)
        setattr(p, name, counted)
    tick, seen = p.tick, {"n": -1}

    def watched(now: float) -> None:
        tick(now)
        held = p.controls.held if isinstance(p.controls, Holds) else {}
        lanes = p.lanes.get(0)
        if lanes is None:
            return
        waiting = [j for j in p.jobs.values()
                   if j.session.id in held or j.waits_for or j.held
                   or (j.wants_lane and j.session.id not in lanes)]
        # whenever one waits, one runs, or makes calls (sets itself up, exits), or fits now
        moves = any(j.running or j not in waiting for j in p.jobs.values()) or any(
            j.session.id not in lanes and lanes.plan(*j.sizes(), j.session.id) is not None
            for j in waiting)
        if calls["n"] != seen["n"]:
            seen["n"], last["at"] = calls["n"], now
        elif waiting and (not moves or now - last["at"] > STALL_S):
            raise Stalled(f"stalled at {now:.2f}s: {[j.session.id for j in waiting]} wait; "
                          f"counted {lanes.used} of {lanes.capacity}, "
                          f"outside {lanes.outside}, lanes {lanes.describe()}, "
                          f"running {[j.session.id for j in p.jobs.values() if j.running]}")
    p.tick = watched  # type: ignore[method-assign]


def run_trace(scheduler: str, seed: int) -> None:
    scripts, declared = trace(seed)
    p = salus(scheduler, C)
    p.read_declared = lambda pid: declared[pid - 1001]  # type: ignore[method-assign]
    p.settings = dataclasses.replace(p.settings, declared=True)
    watch_progress(p)
    work = sum(len(s.plan) for s in scripts) * (ITERATION_S + 2 * DT)
    runs = simulate(p, scripts, C, limit_s=max(s.arrival for s in scripts) + 2 * work + 5)
    assert all(r.finished < float("inf") for r in runs)
    lanes = p.lanes[0]
    assert lanes.used == 0 and lanes.safe() and not p.jobs


@pytest.mark.parametrize("scheduler", ["fifo", "srtf", "pack", "fair"])
def test_no_trace_stalls(scheduler: str) -> None:
    failures = []
    for seed in SEEDS:
        try:
            run_trace(scheduler, seed)
        except AssertionError as e:
            failures.append(f"seed {seed}: {str(e)[:600]}")
    assert not failures, f"{len(failures)} of {len(SEEDS)} traces:\n" + "\n".join(failures[:5])


# Two undeclared jobs whose set-up peaks (all they held, their P until recognized) each fit
# only without what the other holds: each waits at its first launch for memory the other holds.
SET_UP_PEAKS = [
    Script(0.0, 9 * GIB, 0, 1, ITERATION_S, plan=(
        ("alloc", 9 * GIB), ("free", 5 * GIB), ("pause", 100), ("alloc", GIB), ("launch", 0),
        ("free", 5 * GIB))),
    Script(0.0, 8 * GIB, 0, 1, ITERATION_S, plan=(
        ("pause", 30), ("alloc", 8 * GIB), ("free", 4 * GIB), ("pause", 100), ("launch", 0),
        ("free", 4 * GIB))),
]


@pytest.mark.parametrize("scheduler", ["fifo", "srtf", "pack", "fair"])
def test_jobs_outside_the_lanes_waiting_for_each_other_do_not_stall(scheduler: str) -> None:
    """Neither can ever be admitted beside what the other holds, and nothing else can free:
    the younger fails (as on a GPU of capacity C) and the older runs."""
    p = salus(scheduler, C)
    watch_progress(p)
    runs = simulate(p, SET_UP_PEAKS, C, limit_s=20)
    assert [r.refused for r in runs] == [False, True]
    assert len(runs[0].iterations) == 1 and p.lanes[0].used == 0


def test_fifo_offers_a_lane_to_a_job_holding_memory_behind_one_that_waits_for_it() -> None:
    """FIFO admits in arrival order, but a job that does not fit (2 + 6 GiB beside the 5 GiB
    the third job set itself up with) does not block a later one holding memory outside the
    lanes: that one is admitted, runs and frees it, then the first. Blocked, the two waited
    for each other once the running job ended, and the later one had to fail."""
    scripts = [
        Script(0.0, 6 * GIB, 0, 10, ITERATION_S, plan=(("alloc", 6 * GIB), *[("launch", 0)] * 10,
                                                       ("free", 6 * GIB))),
        Script(0.05, 2 * GIB, 6 * GIB, 2, ITERATION_S, plan=(
            ("alloc", 2 * GIB), *[("alloc", 6 * GIB), ("launch", 0), ("free", 6 * GIB)] * 2,
            ("free", 2 * GIB))),
        Script(0.1, 5 * GIB, 0, 1, ITERATION_S, plan=(("alloc", 5 * GIB), ("launch", 0), ("free", 5 * GIB))),
    ]
    declared = [NONE, Declared(2 * GIB, 6 * GIB, 2, None), NONE]
    p = salus("fifo", C)
    p.read_declared = lambda pid: declared[pid - 1001]  # type: ignore[method-assign]
    p.settings = dataclasses.replace(p.settings, declared=True)
    watch_progress(p)
    runs = simulate(p, scripts, C, limit_s=20, real_bound=True)
    assert not any(r.refused for r in runs)
    assert runs[0].finished < runs[2].finished < runs[1].iterations[0][0]


def test_a_declared_job_larger_than_c_is_refused_at_its_first_call_not_held() -> None:
    """It declares P 8 GiB + E 6 GiB > C: it used to be held at its start for ever. Now its
    first allocation fails, pilotctl says why, and the job beside it runs."""
    scripts = [Script(0.0, 8 * GIB, 6 * GIB, 2, ITERATION_S), Script(0.0, 1 * GIB, 1 * GIB, 2, ITERATION_S)]
    declared = [Declared(8 * GIB, 6 * GIB, 2, None), NONE]
    p = salus("pack", C)
    p.read_declared = lambda pid: declared[pid - 1001]  # type: ignore[method-assign]
    p.settings = dataclasses.replace(p.settings, declared=True)
    seen: list[tuple[str, str] | None] = []
    allocation_requested = p.allocation_requested

    def spy(a):  # type: ignore[no-untyped-def]
        seen.append(p.session_status(1))
        return allocation_requested(a)
    p.allocation_requested = spy  # type: ignore[method-assign]
    runs = simulate(p, scripts, C, limit_s=5)
    assert [r.refused for r in runs] == [True, False] and runs[0].iterations == []
    assert seen[0] is not None and seen[0][0] == "refused" and "more than C" in seen[0][1]
    assert len(runs[1].iterations) == 2


def test_a_job_that_leaves_its_lane_between_iterations_does_not_stall() -> None:
    """A running job's boundary that does not fit is no switch point (policy.py), so a job
    leaves its lane only between iterations: here one that declared P 4 GiB frees half its
    state after its last iteration; the level drops, its last scratch is re-measured from
    there (3 GiB), its P stays the declared floor, and beside the full lane of the other job
    that does not fit. It leaves its lane (what it holds counted outside), goes on freeing and
    ends; the other job runs to its end, and C is never passed."""
    n = 4
    it = [("alloc", GIB), ("launch", 0), ("free", GIB)]
    scripts = [
        Script(0.0, 4 * GIB, GIB, n, ITERATION_S, plan=(
            ("alloc", 2 * GIB), ("alloc", 2 * GIB), *it * n, ("free", 2 * GIB), ("pause", 200),
            ("free", 2 * GIB))),
        Script(0.0, GIB, 6 * GIB, 30, ITERATION_S, plan=(
            ("alloc", GIB), *[("alloc", 6 * GIB), ("launch", 0), ("free", 6 * GIB)] * 30, ("free", GIB))),
    ]
    declared = [Declared(4 * GIB, GIB, n, None), Declared(GIB, 6 * GIB, 30, None)]
    p = salus("pack", C)
    p.read_declared = lambda pid: declared[pid - 1001]  # type: ignore[method-assign]
    p.settings = dataclasses.replace(p.settings, declared=True)
    outside: list[int] = []
    freed = p.freed

    def spy(a):  # type: ignore[no-untyped-def]
        freed(a)
        outside.extend(p.lanes[0].outside)
    p.freed = spy  # type: ignore[method-assign]
    watch_progress(p)
    runs = simulate(p, scripts, C, limit_s=20, real_bound=True)
    assert 1 in outside  # it left its lane
    assert [r.refused for r in runs] == [False, False] and [len(r.iterations) for r in runs] == [n, 30]
