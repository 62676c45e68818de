"""bench/salus_timeline.py: jobs' timelines from the salus policy's debug lines, the split of the
average JCT by what the GPU did, and the one-at-a-time ideal it is compared with."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("salus_timeline", BENCH / "salus_timeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["salus_timeline"] = module
    spec.loader.exec_module(module)
    return module


tl = load()


@dataclass
class Spec:
    name: str
    arrival: float
    iterations: int


@dataclass
class Result:
    spec: Spec
    pid: int
    started: float
    ended: float


T0 = 1000.0


def line(what: str, pid: int, at: float) -> str:
    return (f'ts=2026-11-27T22:00:00.000Z level=debug logger=pilot.policy.salus '
            f'msg="salus event {what} session {pid - 100} pid {pid} at {T0 + at:.6f}"')


def test_timelines_and_the_split_of_the_average_jct(tmp_path: Path) -> None:
    # A arrives at 0, sets up until 0.5, runs 1.1 s of iterations (its first 0.4 s), is
    # preempted by B at 1.0 (B: asks at 0.8, runs 1.0-1.2, ends 1.3), resumes 1.3-1.9, ends at 2.0.
    events = [("started", 101, 0.1), ("admitted", 101, 0.1), ("asks", 101, 0.5), ("turn", 101, 0.5),
              ("boundary", 101, 0.9), ("turn", 101, 0.9), ("boundary", 101, 1.0), ("held", 101, 1.0),
              ("started", 102, 0.7), ("admitted", 102, 0.7), ("asks", 102, 0.8), ("turn", 102, 1.0),
              ("boundary", 102, 1.2), ("last", 102, 1.2), ("ended", 102, 1.3),
              ("turn", 101, 1.3), ("boundary", 101, 1.9), ("last", 101, 1.9), ("ended", 101, 2.0)]
    log = tmp_path / "pilotd.log"
    log.write_text("\n".join(line(w, p, t) for w, p, t in events) + "\nunrelated line\n")
    results = [Result(Spec("a", 0.0, 3), 101, 0.0, 2.0), Result(Spec("b", 0.6, 1), 102, 0.6, 1.3)]
    rows = tl.timelines(results, tl.read_events(log), T0)
    a, b = rows
    assert (a.hello, a.asks, a.first_turn, a.last_boundary) == pytest.approx((0.1, 0.5, 0.5, 1.9))
    assert a.held == pytest.approx(0.3) and a.service == pytest.approx(1.1)
    assert b.service == pytest.approx(0.2) and b.held == 0.0
    parts = tl.breakdown(rows)
    # sum of JCTs (2.0 + 0.7) over 2 jobs, split: A's set-up 0-0.5 alone (set-up 0.5), its first
    # iteration 0.5-0.9 with B there from 0.6 (0.1 + 2 x 0.3), later iterations 0.9-1.0 (2 x 0.1),
    # B's first iteration 1.0-1.2 (2 x 0.2), the switch 1.2-1.3 (2 x 0.1: B finishing, A asking),
    # A's iterations 1.3-1.9 and its finish 1.9-2.0
    assert sum(parts.values()) == pytest.approx((2.0 + 0.7) / 2)
    assert parts["set-up"] == pytest.approx(0.5 / 2)
    assert parts["first iterations"] == pytest.approx((0.1 + 0.6 + 0.4) / 2)
    assert parts["iterations"] == pytest.approx((0.2 + 0.6) / 2)
    assert parts["switch"] == pytest.approx(0.2 / 2)
    assert parts["finish"] == pytest.approx(0.1 / 2)
    text = "\n".join(tl.report(rows, {"a": 0.5, "b": 0.2}, "srtf"))
    row = "| a | 0.00 | 0.10 | 0.00 | 0.40 | 0.00 | 0.40 | 3 / 3 | 0.30 | 1.10 (1.50) | 0.10 | 2.00 |"
    assert row in text
    assert "ideal srtf on the measured service (1.30 s)" in text
    # the best any one-at-a-time scheduler could do with these services, each job from its first
    # ask: FIFO A 0.5-1.6, B 1.6-1.8 (JCTs 1.6, 1.2); SRTF B takes A's boundary at 0.8: B 0.8-1.0,
    # A to 1.8 (JCTs 1.8, 0.4)
    best = tl.best_with_start_up(rows)
    assert best["fifo"] == pytest.approx(1.4) and best["srtf"] == pytest.approx(1.1)
    assert "SRTF/FIFO 1.27" in text


def test_one_at_a_time_fifo_and_srtf() -> None:
    arrivals, works = [0.0, 0.1, 0.2], [1.0, 0.5, 0.1]
    assert tl.one_at_a_time(arrivals, works, "fifo", 0.05) == pytest.approx([1.0, 1.5, 1.6])
    # SRTF: the 0.1 s job at its arrival's next boundary, then the 0.5 s one, then the rest
    assert tl.one_at_a_time(arrivals, works, "srtf", 0.05) == pytest.approx([1.6, 0.7, 0.3])
