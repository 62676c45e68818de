"""The Salus iteration detector on scripted call streams of several shapes: boundaries found,
P and E within 10% of the script's truth; unrecognized jobs are one job with E = 0."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from pilot.policies.salus.detector import Boundary, IterationDetector

MIB = 1 << 20
Call = tuple[str, int]  # ("alloc" | "free" | "launch", bytes or 0)


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
    det = det or IterationDetector()
    found = []
    now = 0.0
    for what, size in calls:
        now += dt
        if what == "alloc":
            det.allocated(size)
        elif what == "launch":
            det.launched()
        else:
            b = det.freed(size, now)
            if b is not None:
                found.append(b)
    return det, found


def close(measured: int, truth: int) -> bool:
    return abs(measured - truth) <= 0.1 * truth


SHAPES = {
    # name: (state, scratch per iteration (cycled), free order), truth E = largest scratch sum
    "one-buffer": ([512 * MIB], [[256 * MIB]], "reverse"),
    "many-pieces": ([100 * MIB, 300 * MIB, 24 * MIB], [[64 * MIB, 128 * MIB, 32 * MIB]], "random"),
    "varying-e": ([1024 * MIB], [[100 * MIB], [400 * MIB, 100 * MIB], [50 * MIB]], "fifo"),
    "tiny-state": ([4 * MIB], [[700 * MIB, 300 * MIB]], "reverse"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_boundaries_p_and_e_of_each_shape(shape: str) -> None:
    state, scratch, order = SHAPES[shape]
    det, found = run(training(state, scratch, 20, order, seed=len(shape)))
    assert len(found) == 20 and [b.iteration for b in found] == list(range(1, 21))
    assert det.recognized and not det.in_iteration
    assert close(det.persistent, sum(state))
    assert close(det.ephemeral, max(sum(s) for s in scratch))
    assert found[-1].seconds == pytest.approx(found[-1 - len(scratch)].seconds)
    assert det.iteration_s is not None and det.iteration_s > 0


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
    assert not found and det.in_iteration  # the level is not reached
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
