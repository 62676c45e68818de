"""The Salus iteration detector on scripted call streams of several shapes: boundaries found,
P and E within 10% of the script's truth; unrecognized jobs are one job with E = 0."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pilot.policies.salus.detector import Boundary, IterationDetector

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from salus_step_shapes import job, torch_like_peak, torch_like_step

MIB = 1 << 20
Call = tuple[str, int]  # ("alloc" | "free" | "launch", bytes or 0) or ("pause", milliseconds)


def training(state: list[int], scratch: list[list[int]], iterations: int,
             free_order: str = "reverse", launches: int = 3, seed: int = 0) -> Iterator[Call]:
    """A job that allocates `state` once, then per iteration allocates the i-th scratch shape
    (cycled) with launches between, and frees it in `free_order`."""
    rng = random.Random(seed)
    for size in state:
        yield ("alloc", size)
    for i in range(iterations):
        sizes = scratch[i % len(scratch)]
        for size in sizes:
            yield ("alloc", size)
            for _ in range(launches):
                yield ("launch", 0)
        order = list(sizes)
        if free_order == "reverse":
            order.reverse()
        elif free_order == "random":
            rng.shuffle(order)
        for size in order:
            yield ("free", size)


def run(calls: Iterator[Call], det: IterationDetector | None = None,
        dt: float = 0.01) -> tuple[IterationDetector, list[Boundary]]:
    """Feeds the calls one per `dt`; checks at every Boundary that P + E covers the most the
    job held since the one before (never an under-counted E), within the level's tolerance."""
    det = det or IterationDetector()
    found = []
    now = 0.0
    highest = det.live
    for what, size in calls:
        now += dt
        if what == "pause":  # the host, e.g. loss.item() waiting for the step
            now += size / 1000
        elif what == "alloc":
            det.allocated(size, now)
            highest = max(highest, det.live)
        elif what == "launch":
            det.launched(now)
        else:
            b = det.freed(size, now)
            if b is not None:
                found.append(b)
                slack = max(MIB, b.persistent // 50)
                assert b.persistent + b.ephemeral + slack >= highest, (b, highest)
                highest = det.live
    return det, found


def close(measured: int, truth: int) -> bool:
    return abs(measured - truth) <= 0.1 * truth


SHAPES = {
    # name: (state, scratch per iteration (cycled), free order), truth E = largest scratch sum
    "one-buffer": ([512 * MIB], [[256 * MIB]], "reverse"),
    "many-pieces": ([100 * MIB, 300 * MIB, 24 * MIB], [[64 * MIB, 128 * MIB, 32 * MIB]], "random"),
    "tiny-state": ([4 * MIB], [[700 * MIB, 300 * MIB]], "reverse"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_boundaries_p_and_e_of_each_shape(shape: str) -> None:
    state, scratch, order = SHAPES[shape]
    det, found = run(training(state, scratch, 20, order, seed=len(shape)))
    assert len(found) == 20 and [b.iteration for b in found] == list(range(1, 21))
    assert det.recognized and det.launches == 0
    assert close(det.persistent, sum(state))
    assert close(det.ephemeral, max(sum(s) for s in scratch))
    assert found[-1].seconds == pytest.approx(found[-1 - len(scratch)].seconds)
    assert det.iteration_s is not None and det.iteration_s > 0


def test_iterations_cycling_through_shapes_are_seen_as_one_iteration() -> None:
    """A job whose iterations cycle through 3 scratch shapes cannot be told from one whose
    iteration returns to its level 3 times: it is folded into iterations of 3 pieces, with
    the largest scratch as E (safe) and the count recounted."""
    scratch = [[100 * MIB], [400 * MIB, 100 * MIB], [50 * MIB]]
    det, found = run(training([1024 * MIB], scratch, 30, "fifo"))
    assert det.period == 3 and det.candidates == 30
    assert found[-1].iteration in (9, 10) and close(det.persistent, 1024 * MIB)
    assert close(det.ephemeral, 500 * MIB)


def test_until_recognized_the_job_is_all_persistent() -> None:
    det, found = run(training([512 * MIB], [[256 * MIB]], 1))
    assert len(found) == 1 and not det.recognized
    assert det.persistent == 768 * MIB and det.ephemeral == 0


def test_a_caching_allocator_is_never_recognized() -> None:
    """PyTorch's default allocator keeps freed blocks: allocations, launches, no frees."""
    def cached() -> Iterator[Call]:
        for _ in range(10):
            yield ("alloc", 64 * MIB)
        for _ in range(100):
            yield ("launch", 0)
    det, found = run(cached())
    assert not found and not det.recognized
    assert det.persistent == 640 * MIB and det.ephemeral == 0


def test_scratch_freed_in_pieces_in_the_first_iteration_moves_the_boundary_down() -> None:
    calls = [("alloc", 100 * MIB), ("alloc", 50 * MIB), ("alloc", 50 * MIB), ("launch", 0),
             ("free", 50 * MIB)]  # boundary? the level looks like 150 MiB
    det, found = run(iter(calls))
    assert len(found) == 1 and det.level == 150 * MIB
    run(iter([("free", 50 * MIB)]), det)  # no launch between: the same boundary, lower
    assert det.level == 100 * MIB and det.boundaries == 1
    _, more = run(training([], [[100 * MIB]], 3), det)
    assert len(more) == 3 and det.persistent == 100 * MIB and det.ephemeral == 100 * MIB


def test_a_job_that_frees_everything_at_its_end_keeps_its_p_and_e() -> None:
    """Its state freed at exit (no launch since its last boundary) is not its level moving
    down (P 0 and E its state, as pilotctl showed a job in its last moments)."""
    det, _ = run(training([512 * MIB], [[256 * MIB]], 5))
    run(iter([("free", 512 * MIB)]), det)
    assert det.persistent == 512 * MIB and det.ephemeral == 256 * MIB and det.live == 0


def test_state_made_in_the_first_step_is_persistent() -> None:
    """An optimizer that makes its state in the first step: P includes it."""
    calls: list[Call] = [("alloc", 200 * MIB), ("alloc", 80 * MIB), ("launch", 0),
                         ("alloc", 200 * MIB), ("launch", 0), ("free", 80 * MIB)]
    det, found = run(iter(calls + list(training([], [[80 * MIB]], 5))))
    assert len(found) == 6 and det.persistent == 400 * MIB and det.ephemeral == 80 * MIB


def test_a_level_that_rises_for_good_is_relearned() -> None:
    det, _ = run(training([100 * MIB], [[10 * MIB]], 5), IterationDetector(relearn=4))
    leak = [("alloc", 50 * MIB), ("launch", 0), ("alloc", 10 * MIB), ("launch", 0), ("free", 10 * MIB)]
    _, found = run(iter(leak), det)
    assert not found and det.launches > 0  # the level is not reached
    _, found = run(training([], [[10 * MIB]], 10), det)
    assert det.persistent == 150 * MIB and close(det.ephemeral, 10 * MIB)
    assert len(found) >= 5  # boundaries again, at the new level


def test_declared_sizes_parse_and_ignore_garbage(tmp_path: object) -> None:
    from pilot.policies.salus import declared
    d = declared.parse({"PILOT_SALUS_PERSISTENT": "2GiB", "PILOT_SALUS_EPHEMERAL": " 512MiB ",
                        "PILOT_SALUS_ITERATIONS": "300", "PILOT_SALUS_ITERATION_TIME": " 50ms"})
    assert d == declared.Declared(2 << 30, 512 * MIB, 300, 0.05)
    bad = declared.parse({"PILOT_SALUS_PERSISTENT": "2", "PILOT_SALUS_ITERATIONS": "-4",
                          "PILOT_SALUS_ITERATION_TIME": "fast"})
    assert bad == declared.NONE
    assert declared.read(2**22 + 12345) == declared.NONE  # no such process
    import os
    os.environ["PILOT_SALUS_ITERATIONS"] = "7"
    try:
        assert declared.read(os.getpid()).iterations is None  # environ is as the process started
    finally:
        del os.environ["PILOT_SALUS_ITERATIONS"]


# ---- folding: a step that returns to its level several times is one iteration ----

def step_of(period: int, unit: int = 8 * MIB, pause_ms: int = 50) -> list[Call]:
    """One step of `period` pieces, each back at the level: piece j allocates j + 1 buffers
    of (j + 1) x unit, launches, and frees them first-allocated first; then the host pauses
    (a step's end synchronizes)."""
    calls: list[Call] = []
    for j in range(period):
        sizes = [(j + 1) * unit] * (j + 1)
        calls += [("alloc", size) for size in sizes] + [("launch", 0)]
        calls += [("free", size) for size in sizes]
    return [*calls, ("pause", pause_ms)]


@pytest.mark.parametrize("period", [1, 2, 5, 10])
def test_a_step_of_several_pieces_is_one_iteration(period: int) -> None:
    """Once three periods matched, one Boundary per step, numbered by steps; P and E of the
    whole step (E the largest piece's); the iteration time is the step's."""
    steps = 40
    state = [256 * MIB, 64 * MIB]
    det, found = run(job(state, step_of(period), steps))
    assert det.period == period and det.candidates == steps * period
    folded = [b for b in found if b.seconds > 0][-10:]
    assert found[-1].iteration == steps
    assert [b.iteration for b in folded] == list(range(steps - 9, steps + 1))
    step_s = 0.01 * len(step_of(period)) + 0.05
    assert all(b.seconds == pytest.approx(step_s) for b in folded)
    assert det.iteration_s == pytest.approx(step_s)
    assert close(det.persistent, sum(state)) and close(det.ephemeral, period * period * 8 * MIB)
    assert len(found) <= steps + 3 * period  # pieces one by one only until the period is confirmed


def test_a_pytorch_like_step_is_one_iteration() -> None:
    """bench/salus_step_shapes.py's step (what bench/salus_torch_like.cu does on the GPU):
    layers of different sizes with temporaries alive at the dips, gradients freed out of
    order, an optimizer piece."""
    det, found = run(job([64 * MIB, 16 * MIB], torch_like_step(), 50))
    assert det.period == 6 and found[-1].iteration == 50
    assert close(det.persistent, 80 * MIB) and close(det.ephemeral, torch_like_peak())


def test_a_pattern_that_breaks_falls_back_then_folds_again() -> None:
    """Period 5 for 20 steps, then period 3: the first piece that does not match is reported
    (everything since the last Boundary as one iteration: P + E still cover it, `run`
    checks), pieces are reported one by one, and the new period is confirmed."""
    det, found = run(job([128 * MIB], step_of(5), 20))
    assert det.period == 5 and found[-1].iteration == 20
    _, more = run(iter(step_of(3) * 20), det)
    assert det.period == 3
    assert [b.iteration for b in more[:3]] == [21, 22, 23]  # reported at each candidate again
    assert 20 + 20 - 3 <= more[-1].iteration <= 20 + 20 + 3
    _, later = run(iter(step_of(3) * 10), det)
    assert close(det.ephemeral, 3 * 3 * 8 * MIB) and len(later) == 10  # E follows the new steps


def test_a_job_without_a_period_is_reported_at_every_candidate() -> None:
    """Pieces of random shapes: never folded, every candidate a Boundary (as before folding)."""
    rng = random.Random(30)
    calls: list[Call] = [("alloc", 100 * MIB)]
    for _ in range(200):
        sizes = [rng.randrange(1, 64) * MIB for _ in range(rng.randrange(1, 6))]
        calls += [("alloc", s) for s in sizes] + [("launch", 0)] + [("free", s) for s in sizes]
    det, found = run(iter(calls))
    assert det.period == 1 and len(found) == det.candidates == 200
    assert [b.iteration for b in found] == list(range(1, 201))


def test_a_near_period_that_breaks_early_is_not_folded_for_long() -> None:
    """A B A B A B then C: period 2 confirmed (three periods), C breaks it at once; what was
    folded is reported as one iteration, and the count never runs backwards after that."""
    a, b, c = step_of(1, 4 * MIB), step_of(1, 16 * MIB), step_of(1, 64 * MIB)
    det, found = run(iter([("alloc", 32 * MIB)] + (a + b) * 3 + c + a + c + b))
    assert det.period == 1
    numbers = [x.iteration for x in found]
    assert numbers[-3:] == sorted(numbers[-3:]) and numbers[-1] - numbers[-3] == 2


def test_without_a_pause_the_phase_is_the_lowest_level_then_the_biggest_piece_first() -> None:
    """No host pause stands out: the phase is the candidate with the lowest live bytes (here
    the step's end: a small buffer stays alive across the inner dip)."""
    piece_a = [("alloc", 32 * MIB), ("alloc", 256 << 10), ("launch", 0), ("free", 32 * MIB)]
    piece_b = [("alloc", 64 * MIB), ("launch", 0), ("free", 256 << 10), ("free", 64 * MIB)]
    det, found = run(job([512 * MIB], piece_a + piece_b, 30))
    assert det.period == 2 and found[-1].iteration == 30 and det.persistent == 512 * MIB
    assert close(det.ephemeral, 64 * MIB + (256 << 10))
    det, found = run(job([512 * MIB], step_of(2, pause_ms=0), 30))
    assert det.period == 2 and found[-1].iteration == 29  # phase before the larger piece (mid-step)


def test_a_pause_before_the_free_that_ends_the_step_marks_it_too() -> None:
    """A step that ends with loss.item() (the host waits for the step) before its last free
    that returns to the level (gradients freed after it, the input last): the pause comes
    before the candidate's free, not after it. Both candidates keep the input alive and the
    larger piece comes second, so neither the lowest level nor the largest piece finds the
    step's end (without the pause the phase is mid-step: 19 of 20 reported); the pause does."""
    def step(pause_ms: int) -> list[Call]:
        return [("alloc", 4 * MIB), ("launch", 0), ("alloc", 8 * MIB), ("launch", 0), ("free", 8 * MIB),
                ("alloc", 64 * MIB), ("launch", 0), ("pause", pause_ms), ("free", 64 * MIB),
                ("free", 4 * MIB)]
    det, found = run(job([1024 * MIB], step(40), 20), IterationDetector(tolerance_bytes=8 * MIB), dt=0.001)
    assert det.period == 2 and found[-1].iteration == 20
    assert [b.seconds for b in found[-3:]] == pytest.approx([0.050] * 3)
    det, found = run(job([1024 * MIB], step(0), 20), IterationDetector(tolerance_bytes=8 * MIB), dt=0.001)
    assert det.period == 2 and found[-1].iteration == 19


def test_a_held_boundary_does_not_make_a_phase_from_one_pause() -> None:
    """The phase stands out only at twice any other mean pause: one long pause mid-step in
    one period (a hold) against the step's end pauses of every period."""
    steps = [step_of(4) for _ in range(12)]
    steps[2] = [*steps[2][:3], ("pause", 60), *steps[2][3:]]  # mid-step, while it learns
    det, found = run(iter([("alloc", 256 * MIB)] + [c for s in steps for c in s]))
    assert det.period == 4 and found[-1].iteration == 12
    assert [b.seconds for b in found[-3:]] == pytest.approx([0.30] * 3)
