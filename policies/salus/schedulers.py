"""Salus's iteration-boundary schedulers: which admitted jobs may be in an iteration now.

A job in an iteration is never stopped: it runs to its boundary. At a boundary the scheduler
picks who runs the next iteration; iterations of one lane never overlap (the lanes' rule),
different lanes run in parallel, each on its jobs' own streams.

- `fifo`: one job at a time, the oldest admitted, to completion (today's practice: a GPU per
  job, in arrival order).
- `srtf`: one job at a time, the one with the shortest estimated remaining time; a shorter job
  that arrives takes over at the running job's next boundary (`remaining_s`: iterations left x
  the job's own measured iteration time as soon as it has one). Two rules keep it from
  misbehaving on estimates: the job that ran last keeps its turn unless another's estimate is
  shorter by more than SWITCH_MARGIN of its own (estimates are noisy; equal jobs would swap at
  every boundary), and with `aging` (the policy's knob) each second a job has waited for its
  turn takes `aging` seconds off its estimate, so a long job waits at most about
  (its remaining - a newcomer's) / aging behind a stream of shorter ones, never for ever.
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
    whether it is in an iteration, the seconds of iterations it has run, the estimated seconds
    it has left (math.inf: unknown; for SRTF already less its aging credit) and whether it is
    the job that ran last (SRTF's incumbent)."""
    job: int
    arrival: int
    lane: int | None
    running: bool
    service: float = 0.0
    remaining: float = math.inf
    incumbent: bool = False


# SRTF: a waiting job takes the turn from the one that ran last only if its estimate is shorter
# by more than this fraction of the incumbent's.
SWITCH_MARGIN = 0.05


def remaining_s(done: int, declared: int | None, iteration_s: float | None, service: float) -> float:
    """SRTF's estimate of a job's remaining seconds: iterations left x `iteration_s` (the job's
    own measured pace once it has one, else its declared one, else the GPU's typical one: the
    policy picks; none: 0, it runs until measured, which costs one iteration).

    The iterations left are counted to its declared count or, once it has run that many and
    goes on, to a **learned count**: the declared one doubled as often as needed to exceed what
    it has done (pilot sees an iteration that frees in two places as two boundaries, and a job
    may simply declare too few). So a job that lies about its size is not counted 0 and kept on
    the GPU for ever: past its declaration its estimate grows with what it has run (at each
    doubling, about as much again), and it can delay others by at most about its declared
    work again before it has to wait behind them. Without a declared count: the service it has
    had (least attained service, the usual stand-in for an unknown size)."""
    if declared is None:
        return service
    if iteration_s is None:
        return 0.0
    return (learned_count(done, declared) - done) * iteration_s


def learned_count(done: int, declared: int) -> int:
    """The declared iteration count, doubled until it is more than `done` (remaining_s)."""
    count = max(1, declared)
    while count <= done:
        count *= 2
    return count


def _key(scheduler: str, j: JobState) -> tuple[float, int]:
    if scheduler == "srtf":
        return (j.remaining, j.arrival)
    if scheduler == "fair":
        return (j.service, j.arrival)
    return (0.0, j.arrival)


def _srtf_pick(candidates: list[JobState]) -> JobState:
    """The shortest estimate, ties by arrival; the incumbent keeps its turn unless beaten by
    more than SWITCH_MARGIN."""
    best = min(candidates, key=lambda j: _key("srtf", j))
    incumbent = next((j for j in candidates if j.incumbent), None)
    if incumbent is None or incumbent is best:
        return best
    if best.remaining >= incumbent.remaining - SWITCH_MARGIN * abs(incumbent.remaining):
        return incumbent
    return best


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
        if scheduler == "srtf":
            return {_srtf_pick(admitted).job}
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
