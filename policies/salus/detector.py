"""Iteration boundaries of one job, seen from its allocations, frees and launches only.

A training job allocates its state once, then repeats: allocate scratch, launch, free the
scratch. Its live bytes therefore return to one **persistent level** between iterations. The
detector finds that level without program changes:

- A **boundary** is a free after which the live bytes are back at the persistent level (within
  `tolerance`, the larger of 1 MiB and 2% of the level) with at least one launch since the last
  boundary. The first such free defines the level; a free going lower without a launch in
  between moves the same boundary down (an iteration that frees its scratch in pieces).
- **P** is the live bytes at the last boundary; **E** the largest peak above P within an
  iteration over the last `window` iterations (learned over the first ones, updated after).
- The job is **recognized** after `learn` boundaries. Until then (and for ever if it has no
  such structure) it is one job with E = 0 and P = all it has held (its peak), which is never
  unsafe: whatever it allocates is counted as persistent.
- The persistent level moves: if it rises for good (state made lazily, as PyTorch's optimizer
  does in its first step), no free reaches the old level; after `relearn` frees without a
  boundary the lowest level reached since the last boundary becomes the level.

Failure modes (docs/POLICIES.md, "salus"): a caching allocator (PyTorch's default) frees
nothing, so the job is never recognized (E = 0, P = its peak: safe but no packing); a job that
frees its scratch only every few iterations is seen with those iterations as one; a job whose
persistent memory shrinks at a boundary is followed (the level moves down with it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Boundary:
    """An iteration just ended: its number (1 = the first), P, E and its duration."""
    iteration: int
    persistent: int
    ephemeral: int
    seconds: float


class IterationDetector:
    """One job's boundaries from its call stream; feed it allocated/freed/launched in order."""

    def __init__(self, learn: int = 2, window: int = 8, relearn: int = 64,
                 tolerance: float = 0.02, tolerance_bytes: int = MIB) -> None:
        self.learn = learn
        self.relearn = relearn
        self.tolerance = tolerance
        self.tolerance_bytes = tolerance_bytes
        self.live = 0
        self.peak = 0  # the most it has held, ever
        self.level: int | None = None  # the persistent level, once a boundary was seen
        self.boundaries = 0
        self._peaks: deque[int] = deque(maxlen=window)  # peak above the level per iteration
        self._times: deque[float] = deque(maxlen=window)
        self._iter_peak = 0  # the highest live bytes since the last boundary
        self._launches = 0  # since the last boundary
        self._frees = 0  # since the last boundary
        self._lowest = 0  # the lowest live bytes after a free since the last boundary
        self._last_at: float | None = None  # when the last boundary was seen

    # ---- what the policy reads ----
    @property
    def recognized(self) -> bool:
        return self.boundaries >= self.learn

    @property
    def persistent(self) -> int:
        """P: the level when recognized, else everything it has held."""
        return self.level if self.recognized and self.level is not None else self.peak

    @property
    def ephemeral(self) -> int:
        """E: the largest scratch of the recent iterations when recognized, else 0."""
        return max(self._peaks, default=0) if self.recognized else 0

    @property
    def iteration_s(self) -> float | None:
        """The mean duration of the recent iterations, once two boundaries were seen."""
        return sum(self._times) / len(self._times) if self._times else None

    @property
    def in_iteration(self) -> bool:
        """Launches were made since the last boundary."""
        return self._launches > 0

    # ---- events ----
    def allocated(self, size: int) -> None:
        self.live += size
        self.peak = max(self.peak, self.live)
        self._iter_peak = max(self._iter_peak, self.live)

    def launched(self) -> None:
        self._launches += 1

    def freed(self, size: int, now: float) -> Boundary | None:
        """A free; the Boundary it completes, if it completes one."""
        self.live = max(0, self.live - size)
        level = self.level
        if level is not None and self._launches == 0 and self.live < level:
            self.level = self._iter_peak = self.live  # the same boundary, lower (freed in pieces)
            self._correct_last_peak(level)
            return None
        if self._launches == 0:
            return None
        self._frees += 1
        self._lowest = min(self._lowest, self.live) if self._frees > 1 else self.live
        if level is None or self.live <= level + self._tolerance(level):
            return self._boundary(now)
        if self._frees >= self.relearn:  # the level rose for good
            self.level = self._lowest
            self._frees = 0
        return None

    # ---- internals ----
    def _tolerance(self, level: int) -> int:
        return max(self.tolerance_bytes, int(level * self.tolerance))

    def _boundary(self, now: float) -> Boundary:
        self.level = self.live
        self._peaks.append(max(0, self._iter_peak - self.live))
        seconds = 0.0
        if self._last_at is not None:
            seconds = now - self._last_at
            self._times.append(seconds)
        self._last_at = now
        self.boundaries += 1
        self._iter_peak = self.live
        self._launches = self._frees = 0
        return Boundary(self.boundaries, self.persistent, self.ephemeral, seconds)

    def _correct_last_peak(self, old_level: int) -> None:
        """The last iteration's scratch is measured from the new, lower level."""
        if self._peaks:
            self._peaks[-1] += old_level - self.live
