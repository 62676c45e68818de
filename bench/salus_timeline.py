"""Where a salus trace's average JCT goes: each job's timeline and the GPU's idle time, from the
policy's debug lines (`salus event WHAT session S pid P at T`, pilotd --log-level debug) and the
trace runner's spawn and exit times (bench/salus_trace.py --timeline).

Per job: arrival, HELLO (its session started), admitted (a lane), asks (its first launch or
scratch: it wants the GPU), first turn, time held at boundaries, last boundary, end of the
process. For the whole run: the sum of all JCTs is the integral over time of the number of jobs
present (arrived, not ended), so the average JCT splits exactly by what the GPU was doing at
each moment (`breakdown`):

- `iterations`: some job is in an iteration (between a turn and its boundary) after its first;
- `first iterations`: only jobs in their first iteration are (which also loads their modules
  and starts their libraries: a warm-up that holds a one-at-a-time GPU);
- `switch`: none is, but a job has asked and waits for its turn (the scheduler's latency);
- `set-up`: none is and none asks: jobs are starting (process, CUDA, model) with the GPU idle;
- `finish`: only jobs past their last boundary are left (read-back, frees, exit).

A one-at-a-time scheduler (FIFO, SRTF) loses against the trace's ideal exactly in the last
three, plus iterations that take longer than declared and its order.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT = re.compile(r"salus event (\w+) session (\d+) pid (\d+) at ([\d.]+)")
KINDS = ("iterations", "first iterations", "switch", "set-up", "finish")


@dataclass
class Timeline:
    """One job's times, seconds from the trace's start (None: never seen)."""
    name: str
    arrival: float
    spawned: float
    ended: float
    iterations: int
    hello: float | None = None
    admitted: float | None = None
    asks: float | None = None
    first_turn: float | None = None
    last_boundary: float | None = None
    busy: list[tuple[float, float]] = field(default_factory=list)  # turn -> boundary
    held: float = 0.0  # seconds between a hold at a boundary and the next turn
    boundaries: int = 0  # seen by pilot (more than its iterations: a step cut into pieces)

    @property
    def service(self) -> float:
        return sum(b - a for a, b in self.busy)


def one_at_a_time(arrivals: list[float], works: list[float], policy: str, boundary_s: float = 0.05
                  ) -> list[float]:
    """Each job's end on a GPU that runs one job at a time, switched only at `boundary_s`
    iteration boundaries, with no memory limit and no start-up cost: FIFO (arrival order) or
    SRTF (least work left, known exactly)."""
    left, ends, t, cur = dict(enumerate(works)), [0.0] * len(works), 0.0, None
    while left:
        ready = [i for i in left if arrivals[i] <= t + 1e-9]
        if not ready:
            t = min(arrivals[i] for i in left)
            continue
        if policy == "srtf" or cur not in left:
            cur = min(ready, key=lambda i: (left[i] if policy == "srtf" else 0.0, arrivals[i], i))
        step = min(boundary_s, left[cur])
        t += step
        left[cur] -= step
        if left[cur] <= 1e-9:
            del left[cur]
            ends[cur] = t
    return ends


def read_events(log: Path) -> dict[int, list[tuple[str, float]]]:
    """pid -> its salus events (what, monotonic time), in order."""
    out: dict[int, list[tuple[str, float]]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = EVENT.search(line)
        if m:
            out.setdefault(int(m[3]), []).append((m[1], float(m[4])))
    return out


def timelines(results: Iterable[Any], events: dict[int, list[tuple[str, float]]],
              t0: float) -> list[Timeline]:
    """A Timeline per trace Result (salus_bench.Result) from its pid's events; t0 the runner's
    monotonic start."""
    rows = []
    for r in results:
        tl = Timeline(r.spec.name, r.spec.arrival, r.started, r.ended, r.spec.iterations)
        turn = held = None
        for what, at in events.get(r.pid, []):
            t = at - t0
            if what == "started" and tl.hello is None:
                tl.hello = t
            elif what == "admitted" and tl.admitted is None:
                tl.admitted = t
            elif what == "asks" and tl.asks is None:
                tl.asks = t
            elif what == "turn":
                tl.first_turn = t if tl.first_turn is None else tl.first_turn
                turn = t
                if held is not None:
                    tl.held += t - held
                    held = None
            elif what == "held":
                held = t
            elif what in ("boundary", "last"):
                tl.boundaries += what == "boundary"
                if turn is not None and what == "boundary":
                    tl.busy.append((turn, t))
                    turn = None
                tl.last_boundary = t
        if turn is not None:  # a job whose last iteration ended without a boundary seen
            tl.busy.append((turn, tl.ended))
        rows.append(tl)
    return rows


def breakdown(rows: list[Timeline]) -> dict[str, float]:
    """The average JCT split by what the GPU did (module docstring): seconds per kind, summing
    to the average JCT."""
    cuts = sorted({t for tl in rows for t in (tl.arrival, tl.ended, *(x for iv in tl.busy for x in iv),
                                              *(t for t in (tl.asks, tl.last_boundary) if t is not None))})
    total = dict.fromkeys(KINDS, 0.0)
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        present = [tl for tl in rows if tl.arrival <= mid < tl.ended]
        if not present:
            continue
        busy = [n for tl in rows for n, (x, y) in enumerate(tl.busy) if x <= mid < y]
        if busy:
            kind = "iterations" if any(busy) else "first iterations"
        elif any(tl.asks is not None and tl.asks <= mid
                 and (tl.last_boundary is None or mid < tl.last_boundary) for tl in present):
            kind = "switch"
        elif all(tl.last_boundary is not None and tl.last_boundary <= mid for tl in present):
            kind = "finish"
        else:
            kind = "set-up"
        total[kind] += (b - a) * len(present)
    return {k: v / len(rows) for k, v in total.items()}


def report(rows: list[Timeline], iter_s: dict[str, float], policy: str) -> list[str]:
    """The per-job table and the breakdown, as lines. iter_s: each job's declared iteration
    seconds (its GPU work is iterations x that); policy: for FIFO and SRTF, what the same
    scheduler would reach on the jobs' declared work and on the service they really had
    (their iterations as long as they ran): the gap between the two is slower iterations, the
    rest of the gap to the average JCT is the scheduler's (order, switches, set-up, finish)."""
    lines = ["| job | arrival | spawn->HELLO | HELLO->admitted | ->asks | asks->turn | 1st iteration "
             "| boundaries / iterations | held | service (work) | last boundary->end | JCT |",
             "|---" * 12 + "|"]
    def gap(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{b - a:.2f}"
    for tl in sorted(rows, key=lambda t: t.arrival):
        lines.append(f"| {tl.name} | {tl.arrival:.2f} | {gap(tl.spawned, tl.hello)} | "
                     f"{gap(tl.hello, tl.admitted)} | {gap(tl.admitted, tl.asks)} | "
                     f"{gap(tl.asks, tl.first_turn)} | {gap(*tl.busy[0]) if tl.busy else '-'} | "
                     f"{tl.boundaries} / {tl.iterations} | {tl.held:.2f} | {tl.service:.2f} "
                     f"({tl.iterations * iter_s.get(tl.name, 0.0):.2f}) | "
                     f"{gap(tl.last_boundary, tl.ended)} | "
                     f"{tl.ended - tl.arrival:.2f} |")
    parts = breakdown(rows)
    lines.append("average JCT " + f"{sum(parts.values()):.2f} s = " + " + ".join(
        f"{k} {v:.2f}" for k, v in parts.items()))
    if policy in ("fifo", "srtf"):
        arrivals = [tl.arrival for tl in rows]
        for what, works in (("declared work", [tl.iterations * iter_s.get(tl.name, 0.0) for tl in rows]),
                            ("measured service", [tl.service for tl in rows])):
            ends = one_at_a_time(arrivals, works, policy)
            avg = sum(e - a for e, a in zip(ends, arrivals, strict=True)) / len(rows)
            lines.append(f"ideal {policy} on the {what} ({sum(works):.2f} s): average JCT {avg:.2f} s")
    best = best_with_start_up(rows)
    lines.append(f"best possible on this run's service and start-up (each job from its first ask): "
                 f"FIFO {best['fifo']:.2f} s, SRTF {best['srtf']:.2f} s, SRTF/FIFO "
                 f"{best['fifo'] / best['srtf']:.2f}")
    return lines


def best_with_start_up(rows: list[Timeline]) -> dict[str, float]:
    """Average JCT (from arrival) of FIFO and SRTF one job at a time on the service each job
    really had, each job available only from its first ask (its start-up, which no scheduler
    can shorten: process, CUDA, framework, model): the best any one-at-a-time scheduler could
    do with what this run's jobs cost. A job never seen asking is available at its arrival."""
    arrivals = [tl.arrival for tl in rows]
    ready = [max(tl.arrival, tl.asks) if tl.asks is not None else tl.arrival for tl in rows]
    works = [tl.service for tl in rows]
    return {policy: sum(e - a for e, a in zip(one_at_a_time(ready, works, policy), arrivals, strict=True))
            / len(rows) for policy in ("fifo", "srtf")}
