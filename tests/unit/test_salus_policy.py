"""The `salus` policy on scripted training jobs, driven through its events as pilotd drives it
(allocate state, then per iteration: allocate scratch, launch, free), on a simulated clock.
Each scheduler's order; switches only at iteration boundaries; the safety condition throughout;
iterations of one lane never overlap."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pilot.policies import AllocationView, Controls, LaunchView, SessionView, Verdict, Watch, create
from pilot.policies.salus.declared import Declared
from pilot.policies.salus.policy import Salus
from pilot.policies.salus.schedulers import JobState, learned_count, remaining_s, runnable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from salus_step_shapes import torch_like_step

GIB = 1 << 30
MIB = 1 << 20
DT = 0.01
STEP = 0.1 + 2 * DT  # an iteration of 0.1 s and its allocation and free, one step each


@dataclass
class Script:
    arrival: float
    persistent: int
    ephemeral: int
    iterations: int
    iteration_s: float
    frees: bool = True  # False: a caching allocator (never frees, never recognized)
    uses: int = 0  # the scratch it really allocates per iteration (0: `ephemeral`)
    first_s: float = 0.0  # its first iteration's time, if longer (modules, libraries: warm-up)
    warm_s: tuple[float, ...] = ()  # the times of its next iterations, if longer (a framework's)
    pieces: int = 1  # scratch allocations, launches and frees per iteration (seen as iterations)
    declares_s: float | None = None  # the iteration time it declares (PILOT_SALUS_ITERATION_TIME)
    declares_n: int | None = None  # the iteration count it declares, if not `iterations`
    # its calls per iteration instead: alloc, free, launch (iteration_s each), pause (ms)
    step: tuple[tuple[str, int], ...] = ()
    # all its calls after its session starts, instead of the above ("end" is added)
    plan: tuple[tuple[str, int], ...] = ()


@dataclass
class Run:
    script: Script
    sid: int
    calls: list[tuple[str, int]] = field(default_factory=list)  # what it does next, in order
    started: bool = False
    busy_until: float = -1.0  # in a kernel until then
    live: int = 0
    attempts: int = 0
    finished: float = math.inf
    refused: bool = False  # an allocation was refused: it ended there, as a program would
    iterations: list[tuple[float, float, int | None]] = field(default_factory=list)  # start, end, lane

    def __post_init__(self) -> None:
        s = self.script
        if s.plan:
            self.calls = [*s.plan, ("end", 0)]
            return
        self.calls = [("alloc", s.persistent)]
        for _ in range(s.iterations if s.step else 0):
            self.calls += s.step
        for i in range(0 if s.step else s.iterations * s.pieces):
            scratch = s.uses or s.ephemeral
            if s.frees or i == 0:
                self.calls.append(("alloc", scratch))
            self.calls.append(("launch", 0))
            if s.frees:
                self.calls.append(("free", scratch))
        if s.frees:
            self.calls.append(("free", s.persistent))
        self.calls.append(("end", 0))


class Holds(Controls):
    """The daemon's hold_session as the simulation sees it: a held job makes no call."""

    def __init__(self) -> None:
        self.held: dict[int, str] = {}
        self.ever = 0

    def hold_session(self, session: int, reason: str) -> None:
        self.held[session] = reason
        self.ever += 1

    def release_session(self, session: int) -> None:
        self.held.pop(session, None)


def simulate(policy: Salus, scripts: list[Script], capacity: int, limit_s: float = 600.0,
             holds: bool = True, real_bound: bool = False) -> list[Run]:
    """Each step of DT, every job not held and not in a kernel makes its next call; a launch
    the policy answers WAIT is asked again next step. Checks the safety condition (and with
    `real_bound` that what the jobs really hold stays within C) at every step."""
    now = 0.0
    policy.clock = lambda: now
    controls = Holds() if holds else Controls()
    policy.controls = controls
    runs = [Run(s, i + 1) for i, s in enumerate(scripts)]
    launch_ids = iter(range(1, 10**9))
    while now < limit_s and any(r.calls for r in runs):
        for r in runs:
            if not r.calls or now < r.script.arrival or now < r.busy_until - 1e-9:
                continue
            sv = SessionView(r.sid, f"t{r.sid}", 1000 + r.sid, 0, 0)
            if not r.started:
                r.started = True
                policy.session_started(sv)
                continue
            if r.iterations and r.iterations[-1][1] == math.inf:
                start, _, lane = r.iterations[-1]
                r.iterations[-1] = (start, now, lane)
            if holds and r.sid in controls.held:
                continue
            what, size = r.calls[0]
            if what in ("alloc", "free"):
                a = AllocationView(r.sid, f"t{r.sid}", 0, "device", 0, size)
                verdict = policy.allocation_requested(a).verdict if what == "alloc" else Verdict.RUN
                if verdict is Verdict.WAIT:  # the daemon holds the session, asks again once released
                    if holds:
                        controls.held.setdefault(r.sid, "allocation")  # type: ignore[attr-defined]
                    continue
                if verdict is Verdict.REFUSE:
                    # cudaErrorMemoryAllocation: the program frees what it holds and exits
                    r.refused, r.calls = True, [("free", r.live)] if r.live else []
                    r.calls.append(("end", 0))
                    continue
                r.live += size if what == "alloc" else -size
                (policy.allocated if what == "alloc" else policy.freed)(a)
            elif what == "pause":  # the host waits (loss.item() synchronizing): no call
                r.busy_until = now + size / 1000
            elif what == "launch":
                r.attempts += 1
                view = LaunchView(next(launch_ids), r.sid, f"t{r.sid}", 1000 + r.sid, 0, 0, "k",
                                  (1, 1, 1), (1, 1, 1), 0, (), now, now, r.attempts)
                verdict = policy.launch_requested(view).verdict
                if verdict is Verdict.REFUSE:  # the launch fails: the program frees and exits
                    r.refused, r.calls = True, [("free", r.live)] if r.live else []
                    r.calls.append(("end", 0))
                    continue
                if verdict is not Verdict.RUN:
                    continue
                policy.launch_started(view)
                r.attempts = 0
                n = len(r.iterations)
                r.busy_until = now + (r.script.first_s if n == 0 and r.script.first_s
                                      else r.script.warm_s[n - 1] if 0 < n <= len(r.script.warm_s)
                                      else r.script.iteration_s)
                r.iterations.append((now, math.inf, policy.lanes[0].lane_of(r.sid)))
            else:
                policy.session_ended(sv)
                r.finished = now
            r.calls.pop(0)
        policy.tick(now)  # as the daemon's scheduler thread does every 10 ms
        lanes = policy.lanes.get(0)
        if lanes is not None:
            assert lanes.used <= capacity, f"safety condition broken at {now:.2f}s"
        if real_bound:
            assert sum(r.live for r in runs) <= capacity, f"over C at {now:.2f}s"
        now = round(now + DT, 6)
    assert not any(r.calls for r in runs), [r.calls[:2] for r in runs]
    return runs


def salus(scheduler: str, capacity: int = 12 * GIB) -> Salus:
    p = create("salus", {"scheduler": scheduler, "capacity": f"{capacity // GIB}GiB",
                         "declared": False})
    assert isinstance(p, Salus)
    return p


def declaring(p: Salus, scripts: list[Script], sizes: bool = True) -> Salus:
    """Each job declares its iteration count (and with `sizes` its P and E), as
    PILOT_SALUS_* in its environment would (the simulation's pids are 1000 + session)."""
    def read(pid: int) -> Declared:
        sc = scripts[pid - 1001]
        return Declared(sc.persistent if sizes else None, sc.ephemeral if sizes else None,
                        sc.declares_n or sc.iterations, sc.declares_s)
    p.read_declared = read  # type: ignore[method-assign]
    p.settings = dataclasses.replace(p.settings, declared=True)
    return p


def overlaps(a: tuple[float, float, int | None], b: tuple[float, float, int | None]) -> bool:
    return a[0] < b[1] - 1e-9 and b[0] < a[1] - 1e-9


def lanes_serialized(runs: list[Run]) -> None:
    """Iterations of one lane never overlap (each lane runs one iteration at a time)."""
    its = [(it, r.sid) for r in runs for it in r.iterations if it[2] is not None]
    for i, (a, ra) in enumerate(its):
        for b, rb in its[i + 1:]:
            if ra != rb and a[2] == b[2]:
                assert not overlaps(a, b), (ra, a, rb, b)


def any_overlap(runs: list[Run]) -> bool:
    return any(overlaps(a, b) for i, r in enumerate(runs) for s in runs[i + 1:]
               for a in r.iterations for b in s.iterations)


THREE = [Script(0.0, 1 * GIB, 1 * GIB, 10, 0.1), Script(0.05, 1 * GIB, 1 * GIB, 10, 0.1),
         Script(0.1, 1 * GIB, 1 * GIB, 10, 0.1)]


def test_fifo_runs_one_job_at_a_time_in_arrival_order() -> None:
    runs = simulate(salus("fifo"), THREE, 12 * GIB)
    assert [r.sid for r in sorted(runs, key=lambda r: r.finished)] == [1, 2, 3]
    assert not any_overlap(runs)
    assert runs[2].finished == pytest.approx(30 * STEP, abs=0.1)  # no time lost between jobs


def test_srtf_lets_a_short_job_in_at_the_next_boundary() -> None:
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 30, 0.1), Script(0.55, 1 * GIB, 1 * GIB, 3, 0.1)]
    runs = simulate(salus("srtf"), scripts, 12 * GIB)
    assert not any_overlap(runs)  # one at a time
    # Without a declared count, the least attained service goes first: the newcomer runs at the
    # long job's next boundary and finishes long before it.
    assert runs[1].finished < 1.2 and runs[0].finished == pytest.approx(33 * STEP, abs=0.1)
    long_starts = [it[0] for it in runs[0].iterations]
    assert all(not (0.55 < t < runs[1].finished - 1e-9) for t in long_starts)
    for it in runs[0].iterations:  # the long job was switched out only between iterations
        assert it[1] - it[0] == pytest.approx(0.1, abs=DT / 2)


def test_srtf_with_declared_counts_runs_the_shortest_remaining() -> None:
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 20, 0.1), Script(0.05, 1 * GIB, 1 * GIB, 8, 0.1),
               Script(0.1, 1 * GIB, 1 * GIB, 4, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert [r.sid for r in sorted(runs, key=lambda r: r.finished)] == [3, 2, 1]
    assert not any_overlap(runs)


def test_srtf_resumes_a_preempted_job_by_its_iteration_time_not_its_wait() -> None:
    """D (60 iterations) runs, A (20) takes over, the shorter B (6) preempts A, and C (18) comes
    meanwhile. After B, A has 17 left and goes before C: the time A waited at its boundary is not
    one long iteration of A (it used to be: after its next boundary A looked three times slower
    than D, which measured C too, and C preempted it)."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 60, 0.1), Script(0.25, 1 * GIB, 1 * GIB, 20, 0.1),
               Script(0.6, 1 * GIB, 1 * GIB, 6, 0.1), Script(0.75, 1 * GIB, 1 * GIB, 18, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert [r.sid for r in sorted(runs, key=lambda r: r.finished)] == [3, 2, 4, 1]
    assert not any_overlap(runs)


def test_srtf_does_not_count_a_first_iteration_s_warm_up_as_the_job_s_pace() -> None:
    """W's first iteration takes 1.5 s (modules, libraries), its others 0.1 s: when the shorter
    L asks during it, W (7 left) still goes before L (12) at its first boundary."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 60, 0.1), Script(0.05, 1 * GIB, 1 * GIB, 8, 0.1, first_s=1.5),
               Script(1.0, 1 * GIB, 1 * GIB, 12, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert [r.sid for r in sorted(runs, key=lambda r: r.finished)] == [2, 3, 1]
    assert not any_overlap(runs)


def test_srtf_does_not_hold_a_short_job_on_its_slow_second_iteration() -> None:
    """As a PyTorch job on the H200 (2026-11-28, the Salus trace): its second step took 186 ms
    (the optimizer's state, the backward's first kernels), the next ones 8-10 ms. W (12 left of
    0.01 s iterations) runs its first three beside a long L; were its pace the mean of its turns
    (0.07 s), its estimate (0.9 s) would be above L's and L would keep the GPU to its end while
    W waits with a stale estimate (it is measured only in its turns): 10 s of a 1 s job in the
    trace. The median of its turns (0.01 s) puts it ahead of L."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 8, 0.1),
               Script(0.02, 1 * GIB, 1 * GIB, 15, 0.01, warm_s=(0.2,), declares_s=0.01)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert [r.sid for r in sorted(runs, key=lambda r: r.finished)] == [2, 1]
    assert not any_overlap(runs)


@pytest.mark.parametrize("declares", [True, False])
def test_srtf_takes_a_declared_iteration_time_until_it_measures_one(declares: bool) -> None:
    """M (0.1 s iterations) runs; T (10 iterations of 0.01 s, 0.03 s with its allocation and
    free) and S (5 of 0.1 s) ask meanwhile. Declaring its time, T is seen as the shortest and
    goes first; without, it is guessed at M's pace (1.2 s) and goes after S."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 40, 0.1),
               Script(0.15, 1 * GIB, 1 * GIB, 10, 0.01, declares_s=0.03 if declares else None),
               Script(0.15, 1 * GIB, 1 * GIB, 5, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    order = [r.sid for r in sorted(runs, key=lambda r: r.finished)]
    assert order == ([2, 3, 1] if declares else [3, 2, 1])


def test_a_job_seen_in_pieces_keeps_its_turn_past_its_declared_count() -> None:
    """T frees its scratch twice per iteration (PyTorch does, in several places), so pilot sees
    20 boundaries for its 10 declared iterations. Past the 10th it is not at its end: it keeps
    running (it used to give its turn up at every later boundary and wait for M's next one;
    at the 10th it still does, once: pilot cannot tell a piece from an iteration). SRTF counts
    it to its learned count (20, the declared one doubled), not 0 and not the service it had."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 10, 0.05, pieces=2), Script(0.05, 1 * GIB, 1 * GIB, 20, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    alone = 20 * (0.05 + 2 * DT) + 2 * DT
    assert runs[0].finished < alone + 0.2
    # M ran once, at T's 10th boundary (T gave its turn up there), and not again until T's
    # last piece ended (at the 20th, the declared count doubled, T gives its turn up again, so
    # M starts while T frees and exits)
    assert sum(it[0] < runs[0].iterations[-1][1] for it in runs[1].iterations) == 1
    assert not any_overlap(runs)


def test_a_pytorch_like_job_gives_its_turn_up_at_its_last_step_not_at_its_count_of_pieces() -> None:
    """T's step is 6 pieces of different shapes (bench/salus_step_shapes.py) and a pause (its
    loss.item()), 12 steps declared; M arrives during T's first step (FIFO: after T). The
    detector folds T's pieces once it has seen three steps, but T's 12th piece comes in its
    second step: counted as its 12th iteration, T gave its turn up there and M ran first. Now
    the count is trusted only once the detector has settled, and T's iteration ends before its
    pause (the phase): M starts at T's last boundary, while T pauses, frees and exits."""
    step = (*torch_like_step(4, 256 << 20), ("pause", 30))
    scripts = [Script(0.0, 1 * GIB, 2 * GIB, 12, 0.01, step=step),
               Script(0.05, 1 * GIB, 1 * GIB, 5, 0.1)]
    runs = simulate(declaring(salus("fifo"), scripts), scripts, 12 * GIB)
    t, m = runs
    assert t.iterations[-1][1] <= m.iterations[0][0] <= t.iterations[-1][1] + 3 * DT
    assert not any_overlap(runs)


@pytest.mark.parametrize("scheduler", ["srtf", "fifo", "pack"])
def test_what_a_job_holds_at_a_boundary_within_the_tolerance_stays_within_c(scheduler: str) -> None:
    """A boundary is a return to the level within a tolerance (2% of 8 GiB here): T's first
    pieces end with a temporary of 128-160 MiB still allocated. Counted as T's scratch (its
    declared E), that went past C once its lane's scratch was M's (the sim's trace went 128
    KiB past C under SRTF). Now what a job holds between iterations counts as its P, and a
    boundary where that does not fit is no switch point: T's iteration goes on. What the jobs
    really hold never exceeds C (simulate's real_bound)."""
    step = (*torch_like_step(4, 256 << 20), ("pause", 30))
    scripts = [Script(0.0, 8 * GIB, 3 * GIB, 12, 0.01, step=step),
               Script(0.05, 1 * GIB, 3 * GIB, 20, 0.05)]
    runs = simulate(declaring(salus(scheduler), scripts), scripts, 12 * GIB, real_bound=True)
    assert all(not r.refused for r in runs)
    assert not any_overlap(runs)


def finish_order(runs: list[Run]) -> list[int]:
    return [r.sid for r in sorted(runs, key=lambda r: r.finished)]


def test_srtf_ranks_a_job_by_its_measured_iterations_not_its_declared_time() -> None:
    """L declares 30 iterations of 10 ms (0.3 s) but each takes 0.1 s (3 s: a PyTorch step
    under pilot took ~10x its declared time on the H100). S (8 of 0.1 s, declared honestly)
    comes once L has measured a few: L's estimate is its iterations left x its measured time
    (2.5 s), not x its declared one (0.25 s), so S goes first."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 30, 0.1, declares_s=0.01),
               Script(0.6, 1 * GIB, 1 * GIB, 8, 0.1, declares_s=0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert finish_order(runs) == [2, 1]
    assert runs[1].finished < 0.6 + 8 * STEP + 0.3
    assert not any_overlap(runs)


def test_srtf_a_job_past_its_declared_count_does_not_keep_the_gpu() -> None:
    """L declares 5 iterations and runs 60 (7 s). Counted 0 once past its 5th (as it was),
    it kept the GPU to its end and S1, S2 (10 iterations each) waited 7 s. Its learned count
    (10, 20, 40, 80: the declaration doubled) makes it look as long as it really is, so both
    short jobs finish within a few seconds, long before L."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 60, 0.1, declares_n=5),
               Script(0.3, 1 * GIB, 1 * GIB, 10, 0.1), Script(0.35, 1 * GIB, 1 * GIB, 10, 0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    assert finish_order(runs)[-1] == 1
    assert max(runs[1].finished, runs[2].finished) < 0.35 + 20 * STEP + 1.5
    assert not any_overlap(runs)


def test_remaining_time_counts_to_the_learned_count() -> None:
    assert [learned_count(done, 5) for done in (0, 4, 5, 9, 10, 19, 20)] == [5, 5, 10, 10, 20, 20, 40]
    assert remaining_s(3, 5, 0.1, 9.0) == pytest.approx(0.2)
    assert remaining_s(5, 5, 0.1, 9.0) == pytest.approx(0.5)  # past its count: to 10
    assert remaining_s(3, 5, None, 9.0) == 0.0  # no pace yet: it runs until measured
    assert remaining_s(3, None, 0.1, 9.0) == 9.0  # no count: the service it had


def test_a_job_past_its_declared_count_exits_without_waiting_for_a_turn() -> None:
    """T frees its scratch three times per iteration: 30 boundaries for 10 declared iterations,
    and its last (the 30th) is no learned count (10, 20, 40). Past its declared count pilot
    cannot tell its end: it is not held at those boundaries (its next launch or scratch waits
    for its turn instead), so when the shorter M, arriving during T's last piece, takes the
    turn at that boundary, T's exit (its last free) does not wait for M's iterations."""
    scripts = [Script(0.0, 1 * GIB, 1 * GIB, 10, 0.3, pieces=3),
               Script(9.45, 1 * GIB, 1 * GIB, 4, 0.1, declares_s=0.1)]
    runs = simulate(declaring(salus("srtf"), scripts, sizes=False), scripts, 12 * GIB)
    t, m = runs
    assert len(t.iterations) == 30 and t.iterations[-1][0] < 9.45 < t.iterations[-1][1]
    assert m.iterations[0][0] <= t.iterations[-1][1] + 3 * DT  # M took the turn at T's end
    assert t.finished - t.iterations[-1][1] <= 3 * DT  # T's free and end, no wait
    assert not any_overlap(runs)


def test_srtf_keeps_the_incumbent_on_near_equal_estimates() -> None:
    """Estimates are noisy: the job that ran last keeps its turn unless another's is shorter
    by more than 5% of its own; equal estimates go by arrival."""
    def pick(incumbent_left: float, other_left: float) -> set[int]:
        return runnable("srtf", [JobState(1, 2, 0, False, 1.0, incumbent_left, incumbent=True),
                                 JobState(2, 1, 0, False, 0.0, other_left)])
    assert pick(1.0, 0.97) == {1}
    assert pick(1.0, 0.9) == {2}
    assert runnable("srtf", [JobState(1, 2, 0, False, 0.0, 1.0), JobState(2, 1, 0, False, 0.0, 1.0)]) == {2}


@pytest.mark.parametrize("aging", [0.0, 0.5])
def test_srtf_aging_bounds_a_long_job_s_wait_behind_a_stream_of_short_ones(aging: float) -> None:
    """L (30 iterations, 3.6 s) and a short job (3 iterations, 0.36 s) arriving every 0.3 s for
    12 s: more work than the GPU does, so pure SRTF (aging 0) runs L after every short job. With
    aging each second L has waited takes `aging` s off its estimate: it runs once it has waited
    about (its remaining - a short job's) / aging longer than the oldest short job waiting."""
    scripts = [Script(0.0, GIB // 8, GIB // 8, 30, 0.1)] + [
        Script(0.2 + 0.3 * i, GIB // 8, GIB // 8, 3, 0.1) for i in range(40)]
    p = declaring(salus("srtf"), scripts, sizes=False)
    p.settings = dataclasses.replace(p.settings, aging=aging)
    runs = simulate(p, scripts, 12 * GIB, limit_s=60)
    last_short = max(r.finished for r in runs[1:])
    if aging == 0:
        assert finish_order(runs)[-1] == 1  # starved while short jobs came
    else:
        assert runs[0].finished < last_short - 2.0
        assert runs[0].finished < 0.2 + (3.6 - 0.36) / aging + 3.6 + 2.0


def test_the_fast_path_serves_a_running_job_whole() -> None:
    """watches_launches: a job that does not run is watched whole (its launch asks for its
    turn); a running one not at all (NONE: pilotd's fast path runs its launches in C), also
    right after a boundary that leaves it the turn; ALL again once another job gets it."""
    p = salus("fifo")
    now = 0.0
    p.clock = lambda: now
    p.controls = Holds()
    views = [SessionView(sid, f"t{sid}", 1000 + sid, 0, 0) for sid in (1, 2)]
    for v in views:
        p.session_started(v)
    def alloc(sid: int, size: int, free: bool = False) -> None:
        a = AllocationView(sid, f"t{sid}", 0, "device", 0, size)
        if free:
            p.freed(a)
        else:
            assert p.allocation_requested(a).verdict is Verdict.RUN
            p.allocated(a)
    def launch(sid: int) -> Verdict:
        view = LaunchView(sid, sid, f"t{sid}", 1000 + sid, 0, 0, "k", (1, 1, 1), (1, 1, 1), 0, (),
                          now, now, 1)
        verdict = p.launch_requested(view).verdict
        if verdict is Verdict.RUN:
            p.launch_started(view)
        return verdict
    alloc(1, GIB)
    assert p.watches_launches(1) is Watch.ALL  # not running: its first launch asks for a turn
    assert launch(1) is Verdict.RUN
    assert p.watches_launches(1) is Watch.NONE
    alloc(2, GIB)
    assert launch(2) is Verdict.WAIT and p.watches_launches(2) is Watch.ALL
    alloc(1, GIB)
    alloc(1, GIB, free=True)  # its first boundary; FIFO: it goes on
    assert p.watches_launches(1) is Watch.NONE
    assert launch(1) is Verdict.RUN and p.watches_launches(1) is Watch.NONE
    assert p.watches_launches(3) is Watch.ALL  # not a job it knows


def test_launches_counted_by_the_daemon_make_pieces_without_being_watched() -> None:
    """A running job's launches run in C, unseen by the policy: the detector learns that the
    job launched between two returns to its level from AllocationView.launches (pilotd's
    count), so its iterations are found as when each launch was watched; a free with no
    launch counted since the last return is no boundary."""
    p = salus("fifo")
    now = 0.0
    p.clock = lambda: now
    p.controls = Holds()
    p.session_started(SessionView(1, "t1", 1001, 0, 0))
    launches = 0

    def event(size: int, free: bool = False) -> None:
        a = AllocationView(1, "t1", 0, "device", 0, size, launches=launches)
        if free:
            p.freed(a)
        else:
            assert p.allocation_requested(a).verdict is Verdict.RUN
            p.allocated(a)

    event(GIB)  # its state
    first = LaunchView(1, 1, "t1", 1001, 0, 0, "k", (1, 1, 1), (1, 1, 1), 0, (), now, now, 1)
    assert p.launch_requested(first).verdict is Verdict.RUN  # the launch that asks for its turn
    p.launch_started(first)
    launches += 1
    det = p.jobs[1].detector
    for i in range(6):
        now += 0.01
        event(MIB << 6)
        launches += 20  # in C: the policy is not asked
        assert p.watches_launches(1) is Watch.NONE
        event(MIB << 6, free=True)
        assert det.boundaries == i + 1
    event(MIB << 6)
    event(MIB << 6, free=True)  # no launch since the last return: not a boundary
    assert det.boundaries == 6 and det.recognized
    assert det.persistent == GIB and det.ephemeral == MIB << 6


def test_pack_runs_lanes_in_parallel_and_beats_fifo() -> None:
    pack = simulate(salus("pack"), THREE, 12 * GIB)
    fifo = simulate(salus("fifo"), THREE, 12 * GIB)
    assert any_overlap(pack)
    lanes_serialized(pack)
    assert max(r.finished for r in pack) < 0.6 * max(r.finished for r in fifo)


def test_pack_keeps_the_deadlock_pair_in_one_lane() -> None:
    """The paper's example: C = 12, two jobs P = 1, E = 7: one lane, iterations alternate
    (or run one after the other), never together."""
    pair = [Script(0.0, 1 * GIB, 7 * GIB, 6, 0.1), Script(0.0, 1 * GIB, 7 * GIB, 6, 0.1)]
    runs = simulate(declaring(salus("pack"), pair), pair, 12 * GIB)
    lanes_serialized(runs)
    assert len({it[2] for r in runs for it in r.iterations}) == 1
    assert not any_overlap(runs)


def test_undeclared_pair_runs_one_after_the_other() -> None:
    """Not declared, each job is all persistent (P = 8) until measured: the second waits."""
    pair = [Script(0.0, 1 * GIB, 7 * GIB, 6, 0.1), Script(0.0, 1 * GIB, 7 * GIB, 6, 0.1)]
    runs = simulate(salus("pack"), pair, 12 * GIB)
    assert not any_overlap(runs) and runs[1].iterations[0][0] >= runs[0].finished


def test_fair_alternates_jobs_sharing_a_lane() -> None:
    pair = [Script(0.0, 1 * GIB, 7 * GIB, 12, 0.1), Script(0.5, 1 * GIB, 7 * GIB, 12, 0.1)]
    runs = simulate(declaring(salus("fair"), pair), pair, 12 * GIB)
    lanes_serialized(runs)
    # While both run, they take turns: job 1's iterations interleave with job 2's.
    both = sorted((it[0], r.sid) for r in runs for it in r.iterations
                  if runs[1].iterations[0][0] <= it[0] < runs[0].finished)
    switches = sum(1 for a, b in itertools.pairwise(both) if a[1] != b[1])
    assert switches >= len(both) // 2
    # From job 2's arrival, not after it has caught up on job 1's service (virtual time).
    assert {sid for _, sid in both[:4]} == {1, 2}
    assert abs(runs[0].finished - runs[1].finished) < 1.0


def test_a_job_that_never_frees_runs_as_one_job() -> None:
    """A caching allocator: never recognized, P = all it holds, E = 0, its own lane."""
    scripts = [Script(0.0, 1 * GIB, 2 * GIB, 5, 0.1, frees=False),
               Script(0.0, 1 * GIB, 1 * GIB, 5, 0.1)]
    p = salus("pack")
    seen: list[dict] = []
    original = p.launch_started

    def record(view: LaunchView) -> None:
        original(view)
        seen.append(p.state())
    p.launch_started = record  # type: ignore[method-assign]
    runs = simulate(p, scripts, 12 * GIB)
    job1 = [j for st in seen for j in st["gpus"]["0"]["jobs"] if j["session"] == 1]
    assert job1 and all(j["ephemeral"] == 0 and not j["recognized"] for j in job1)
    assert job1[-1]["persistent"] == 3 * GIB
    assert any_overlap(runs)


def test_a_job_that_does_not_fit_waits_for_memory() -> None:
    big = [Script(0.0, 6 * GIB, 4 * GIB, 5, 0.1), Script(0.0, 6 * GIB, 4 * GIB, 5, 0.1)]
    p = salus("pack")
    runs = simulate(p, big, 12 * GIB)
    assert not any_overlap(runs)  # 10 + 10 > 12: the second waits for the first to end
    assert p.session_status(2) is None


def test_state_and_session_status_while_held() -> None:
    p = salus("fifo")
    for sid in (1, 2):
        p.session_started(SessionView(sid, "t", 10 + sid, 0, 0))
        p.allocated(AllocationView(sid, "t", 0, "device", 0, GIB))
    views = [LaunchView(sid, sid, "t", 10 + sid, 0, 0, "k", (1, 1, 1), (1, 1, 1), 0, (), 0.0, 0.0, 1)
             for sid in (1, 2)]
    assert p.launch_requested(views[0]).verdict is Verdict.RUN
    d = p.launch_requested(views[1])
    assert d.verdict is Verdict.WAIT and "another job's turn" in d.reason
    assert p.session_status(2) == ("held", "salus fifo: another job's turn")
    st = p.state()
    assert st["scheduler"] == "fifo"
    gpu = st["gpus"]["0"]
    assert [[j["job"] for j in lane["jobs"]] for lane in gpu["lanes"]] == [[1, 2]]  # FIFO: one lane
    assert gpu["used"] == 2 * GIB and gpu["queue"] == []
    assert [j["running"] for j in gpu["jobs"]] == [True, False]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="scheduler"):
        create("salus", {"scheduler": "lifo"})
    with pytest.raises(ValueError, match="grow"):
        create("salus", {"grow": "biggest"})


@pytest.mark.parametrize("scheduler", ["fifo", "srtf", "pack", "fair"])
def test_declared_jobs_never_hold_more_than_c(scheduler: str) -> None:
    """A seeded trace of 12 declared jobs: with the daemon's holds, what the jobs really hold
    (not only the lanes' sum) stays within C at every step; a job is held at its boundary
    before it allocates the next scratch (seed 33: every scheduler holds someone there)."""
    import random
    rng = random.Random(33)
    scripts = [Script(round(rng.uniform(0, 2), 2), rng.randrange(1, 4) * GIB // 2,
                      rng.randrange(0, 8) * GIB // 2, rng.randrange(2, 12), 0.05) for _ in range(12)]
    p = declaring(salus(scheduler), scripts)
    runs = simulate(p, scripts, 12 * GIB, real_bound=True)
    assert isinstance(p.controls, Holds) and p.controls.ever > 0
    for r in runs:
        for it in r.iterations:  # every iteration ran whole: nothing was stopped within one
            assert it[1] - it[0] == pytest.approx(0.05, abs=DT / 2)
    lanes_serialized(runs)


def test_the_scratch_waits_for_its_turn_even_without_session_holds() -> None:
    """Session holds (at a boundary, at the start) used to be what kept a waiting job from
    allocating its next scratch: held only at its launch, the second job of the pair had its
    7 GiB when it waited, and the jobs really held 16 GiB > C. Now the scratch allocation itself
    (beyond the job's P) waits for the job's turn, so even a daemon that cannot hold sessions
    keeps what the jobs hold within C; the lanes still serialize the iterations."""
    pair = [Script(0.0, 1 * GIB, 7 * GIB, 4, 0.1), Script(0.0, 1 * GIB, 7 * GIB, 4, 0.1)]
    runs = simulate(declaring(salus("pack"), pair), pair, 12 * GIB, holds=False, real_bound=True)
    lanes_serialized(runs)


def test_set_up_runs_beside_the_running_job() -> None:
    """An admitted job sets itself up (its P) without taking the one-at-a-time turn: the
    second job's state is allocated while the first is in its iterations, and only its
    scratch waits for its turn (issue 30: a PyTorch job's seconds of set-up held FIFO's and
    SRTF's one turn on the H100)."""
    pair = [Script(0.0, 1 * GIB, 2 * GIB, 10, 0.1), Script(0.05, 1 * GIB, 2 * GIB, 2, 0.1)]
    p = declaring(salus("fifo"), pair)
    seen: list[tuple[int, bool]] = []
    allocated = p.allocated

    def spy(a: AllocationView) -> None:
        first = p.jobs.get(1)
        seen.append((a.session, first is not None and first.running))
        allocated(a)
    p.allocated = spy  # type: ignore[method-assign]
    runs = simulate(p, pair, 12 * GIB, real_bound=True)
    assert (2, True) in seen  # job 2 allocated (its P) while job 1 was in an iteration
    # FIFO: its iterations after job 1's; and job 1, done with its declared 10, gave its turn
    # up at its last boundary: job 2 ran while job 1 freed its state and ended
    assert runs[0].iterations[-1][1] <= runs[1].iterations[0][0] < runs[0].finished


def test_a_job_that_outgrows_its_declaration_is_refused_not_counted_past_c() -> None:
    """Issue 30 (the H100's PACK and FAIR went past C): a job admitted for what it declared
    (P 1 GiB, E 2 GiB) allocates 8 GiB of scratch while another lane holds 4 GiB. Counted
    after the fact (forced), the lanes' sum went to 14 GiB > C = 12 GiB and the jobs really
    held that much; now the allocation is asked for first and refused (the job fails as on a
    GPU of 12 GiB), and neither the sum nor what the jobs hold ever passes C."""
    scripts = [Script(0.0, 1 * GIB, 3 * GIB, 30, 0.1),  # a long job in its own lane
               Script(0.0, 1 * GIB, 2 * GIB, 4, 0.1, uses=8 * GIB),  # declares 2 GiB, uses 8
               Script(0.5, 1 * GIB, 2 * GIB, 4, 0.1)]  # comes later, declares the truth
    for scheduler in ("pack", "fair"):
        p = declaring(salus(scheduler), scripts)
        runs = simulate(p, scripts, 12 * GIB, real_bound=True)
        assert [r.refused for r in runs] == [False, True, False]
        assert [len(r.iterations) for r in runs] == [30, 0, 4]
        assert p.lanes[0].used == 0 and p.lanes[0].safe()


def test_a_job_that_leaves_its_lane_still_counts_what_it_holds() -> None:
    """A job re-measured at a boundary larger than its lane can grow leaves the lane, but still
    holds its P: counted outside the lanes, so no job is admitted into memory it holds."""
    from pilot.policies.salus.lanes import Lanes
    lanes = Lanes(12 * GIB)
    assert lanes.admit(1, 2 * GIB, 4 * GIB) and lanes.admit(2, 1 * GIB, 4 * GIB)
    assert not lanes.update(1, 3 * GIB, 8 * GIB)  # 3 + 1 + 8 + 4 > 12: it leaves
    assert 1 not in lanes and lanes.outside == {1: 3 * GIB} and lanes.used == 8 * GIB
    assert lanes.plan(3 * GIB, 6 * GIB) is None  # 8 + 3 + (6 - 4) > 12; without it: a grow
    assert lanes.safe()
    lanes.hold_outside(1, 0)
    assert lanes.used == lanes.persistent + lanes.lane_bytes and lanes.safe()


def test_launch_counts_of_a_session_s_parts_on_two_gpus_are_kept_apart() -> None:
    """AllocationView.launches is the count of the session's part on the event's GPU: launches
    made on its second GPU count at that GPU's events even when its first GPU's part has made
    more (one shared count would have taken them for old ones)."""
    p = salus("fifo")
    p.clock = lambda: 0.0
    p.controls = Holds()
    p.session_started(SessionView(1, "t1", 1001, 0, 0))
    job = p.jobs[1]
    job.launched_since(0, 10)
    assert job.detector.launches == 10
    job.launched_since(1, 3)  # 3 launches on GPU 1, fewer than GPU 0's 10: new all the same
    assert job.detector.launches == 13
    job.launched_since(1, 3)
    job.launched_since(0, 10)
    assert job.detector.launches == 13  # told once each
