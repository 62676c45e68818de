"""Salus's iteration-boundary schedulers: which admitted jobs may be in an iteration now.

A job in an iteration is never stopped: it runs to its boundary. At a boundary the scheduler
picks who runs the next iteration; iterations of one lane never overlap (the lanes' rule),
different lanes run in parallel, each on its jobs' own streams.

- `fifo`: one job at a time, the oldest admitted, to completion (today's practice: a GPU per
  job, in arrival order).
- `srtf`: one job at a time, the one with the shortest estimated remaining time; a shorter job
  that arrives takes over at the running job's next boundary. Remaining time is the declared
  iteration count less the iterations done, times its mean iteration time (measured in its
  turns, the first iteration left out; not measured yet: its declared iteration time, else the
  mean of the GPU's measured jobs; none measured: 0, it runs until measured); without a
  declared count, the service it has had (least attained service, the usual stand-in for
  unknown sizes).
- `pack`: every lane runs; within a lane the oldest job runs to completion, then the next.
  As many lanes as the safety condition allows (admission tries every waiting job).
- `fair`: every lane runs; within a lane, at each boundary the job with the least service
  (seconds of iterations run) goes next, so jobs sharing a lane get equal GPU time. A job that
  joins a lane starts from its lane-mates' least service (virtual time, as CFS does): it
  shares from its arrival on instead of running alone until it has caught up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

SCHEDULERS = ("fifo", "srtf", "pack", "fair")
ONE_AT_A_TIME = ("fifo", "srtf")


@dataclass(frozen=True, slots=True)
class JobState:
    """What a scheduler sees of a job: its arrival order, its lane (None: not admitted),
    whether it is in an iteration, the seconds of iterations it has run and the estimated
    seconds it has left (math.inf: unknown)."""
    job: int
    arrival: int
    lane: int | None
    running: bool
    service: float = 0.0
    remaining: float = math.inf


def remaining_s(done: int, declared: int | None, iteration_s: float | None, service: float) -> float:
    """SRTF's estimate of a job's remaining seconds (see the module's docstring)."""
    if declared is None:
        return service
    if iteration_s is None:
        return 0.0
    return max(0, declared - done) * iteration_s


def _key(scheduler: str, j: JobState) -> tuple[float, int]:
    if scheduler == "srtf":
        return (j.remaining, j.arrival)
    if scheduler == "fair":
        return (j.service, j.arrival)
    return (0.0, j.arrival)


def runnable(scheduler: str, jobs: Iterable[JobState]) -> set[int]:
    """The admitted jobs that may be in an iteration now: the running ones, plus those that may
    start their next iteration."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, not {scheduler!r}")
    admitted = [j for j in jobs if j.lane is not None]
    running = {j.job for j in admitted if j.running}
    if scheduler in ONE_AT_A_TIME:
        if running or not admitted:
            return running
        return {min(admitted, key=lambda j: _key(scheduler, j)).job}
    by_lane: dict[int, list[JobState]] = {}
    for j in admitted:
        by_lane.setdefault(j.lane, []).append(j)  # type: ignore[arg-type]
    chosen = set(running)
    for lane_jobs in by_lane.values():
        if not any(j.running for j in lane_jobs):
            chosen.add(min(lane_jobs, key=lambda j: _key(scheduler, j)).job)
    return chosen


def admission_order(scheduler: str, waiting: Iterable[JobState]) -> list[JobState]:
    """The order waiting jobs are offered a lane: SRTF the shortest first, the others by
    arrival."""
    return sorted(waiting, key=lambda j: _key(scheduler, j) if scheduler == "srtf" else (0.0, j.arrival))


def strict_order(scheduler: str) -> bool:
    """True: admission stops at the first waiting job that does not fit (FIFO keeps arrival
    order); False: every waiting job is tried (as many lanes as the condition allows)."""
    return scheduler == "fifo"
