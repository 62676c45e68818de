"""Iteration boundaries of one job, seen from its allocations, frees and launches only.

A training job allocates its state once, then repeats: allocate scratch, launch, free the
scratch. Its live bytes therefore return to one **persistent level** between iterations. The
detector finds that level without program changes:

- A **candidate** is a free after which the live bytes are back at the persistent level
  (within `tolerance`, the larger of 1 MiB and 2% of the level) with at least one launch
  since the last candidate. The first such free defines the level; a free going lower without
  a launch in between moves the same candidate down (an iteration that frees its scratch in
  pieces). What happened between two candidates is a **piece**.
- **Folding.** A step may return to the level several times (PyTorch with
  `backend:cudaMallocAsync`: between layers, after the backward pass, after the optimizer), so
  one step is several pieces of different shapes, repeating step after step. Each piece has a
  signature: its allocations, its frees and its peak above the level (peaks match within the
  larger of `tolerance_bytes` and 10%). When the last `confirm` periods of k pieces each match
  the period before them (k from 2 to `max_period`; the smallest such k), the job's
  **iteration is k pieces**: a Boundary is reported only at every k-th candidate, the
  **phase** being the candidate of the period around which the host pauses longest (just
  before its free or just after it; a step's end synchronizes: loss.item(), the data
  loader) if that pause stands out (PAUSE_S), else the one with the lowest live bytes (a
  step's end frees everything; its inner dips may keep a loss or a small buffer), ties to
  the one whose next piece has the largest peak (an iteration's biggest piece comes first),
  then the latest. The policy sees no synchronization or copy, only the time between the
  calls it sees. Its E is the largest peak of its pieces, its time their sum. When the
  period is confirmed the iteration count is recounted as the pieces since the start (or
  since the period last broke) divided by k, so a job is not counted k times its steps. A
  piece that does not match the one k before breaks the period: that candidate is reported
  (with everything since the last Boundary as one iteration) and every candidate is again a
  Boundary until a period is confirmed again. A job whose pieces all match (k = 1, a CUDA C
  iteration) and a job with no period are reported at every candidate, as without folding.
  `settled`: folded, or the last pieces alike; before, the count is of pieces (the policy
  trusts a declared count only once settled).
- **P** is the live bytes at the last boundary; **E** the largest peak above P within an
  iteration over the last `window` iterations (learned over the first ones, updated after),
  and within the iteration under way while folded.
- The job is **recognized** after `learn` boundaries. Until then (and for ever if it has no
  such structure) it is one job with E = 0 and P = all it has held (its peak), which is never
  unsafe: whatever it allocates is counted as persistent.
- The persistent level moves: if it rises for good (state made lazily, as PyTorch's optimizer
  does in its first step), no free reaches the old level; after `relearn` frees without a
  candidate the lowest level reached since the last one becomes the level.

Failure modes (docs/POLICIES.md, "salus"): a caching allocator (PyTorch's default) frees
nothing, so the job is never recognized (E = 0, P = its peak: safe but no packing); a job that
frees its scratch only every few iterations is seen with those iterations as one; a job whose
persistent memory shrinks at a boundary is followed (the level moves down with it); a job
whose iterations cycle through k different shapes is seen as iterations of k pieces (E is the
largest, safe; it is switched every k iterations); before a period is confirmed (the first
`confirm` + 1 periods) a folded job is seen in pieces, as it would be without folding.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MIB = 1 << 20
# A pause of the host marks a step's end (the phase) when it is at least twice any other pause
# around a candidate plus this much: a synchronization waits for the GPU (milliseconds), the
# calls within a step follow each other within tens of microseconds (a round trip to pilotd).
PAUSE_S = 0.0005


@dataclass(frozen=True, slots=True)
class Boundary:
    """An iteration just ended: its number (1 = the first), P, E and its duration."""
    iteration: int
    persistent: int
    ephemeral: int
    seconds: float


@dataclass(slots=True)
class Piece:
    """What a job did between two candidates: its signature (allocations, frees, peak above
    the level), the live bytes at the candidate that ended it, the seconds from the candidate
    before it to its first call (`gap`) and from its call before the free that ended it to
    that free (`before`): the host's pauses around its two ends."""
    allocations: int
    frees: int
    peak: int
    live: int
    gap: float
    before: float


class IterationDetector:
    """One job's boundaries from its call stream; feed it allocated/freed/launched in order."""

    def __init__(self, learn: int = 2, window: int = 8, relearn: int = 64,
                 tolerance: float = 0.02, tolerance_bytes: int = MIB,
                 max_period: int = 16, confirm: int = 2) -> None:
        self.learn = learn
        self.relearn = relearn
        self.tolerance = tolerance
        self.tolerance_bytes = tolerance_bytes
        self.max_period = max_period
        self.confirm = confirm
        self.live = 0
        self.peak = 0  # the most it has held, ever
        self.level: int | None = None  # the persistent level, once a candidate was seen
        self.boundaries = 0  # iterations reported (Boundary.iteration of the last)
        self.candidates = 0  # pieces ended
        self.period = 1  # pieces per iteration (1: not folded)
        # Changes whenever P, E or `recognized` may have changed (not with `live` or `peak`):
        # the policy reuses the sizes it counted while this and the peak stay as they were.
        self.version = 0
        self._peaks: deque[int] = deque(maxlen=window)  # peak above the level per iteration
        self._times: deque[float] = deque(maxlen=window)
        self._window_e = 0  # max(self._peaks), kept (the policy reads E at every allocation)
        self._pieces: deque[Piece] = deque(maxlen=(confirm + 1) * max_period)
        self._streak = [0] * (max_period + 1)  # per k: the latest pieces matching the one k before
        self._phase = 0  # folded: a Boundary at the candidates c with c % period == phase
        self._base = (0, 0)  # (boundaries, candidates) when reporting each candidate began
        self._fold_peak = 0  # the largest peak of the pieces since the last Boundary
        self._iter_peak = 0  # the highest live bytes since the last candidate
        self._launches = 0  # since the last candidate
        self._allocations = 0  # since the last candidate
        self._piece_frees = 0  # since the last candidate
        self._frees = 0  # since the last candidate's first launch
        self._lowest = 0  # the lowest live bytes after a free since the last candidate
        self._last_at: float | None = None  # when the last Boundary was reported
        self._candidate_at: float | None = None  # when the last candidate was seen
        self._gap: float | None = None  # seconds from it to the next call seen (None: none yet)
        self._call_at: float | None = None  # when the last call was seen (with a time)
        self._before = 0.0  # seconds between the call before the last free and that free
        self._reported = False  # the last candidate was a Boundary

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
        """E: the largest scratch of the recent iterations (and of the pieces of the one under
        way, while folded) when recognized, else 0."""
        return max(self._window_e, self._fold_peak) if self.recognized else 0

    @property
    def iteration_s(self) -> float | None:
        """The mean duration of the recent iterations, once two boundaries were seen."""
        return sum(self._times) / len(self._times) if self._times else None

    @property
    def settled(self) -> bool:
        """Its boundaries are its iterations as far as it can tell: folded, or its last
        `confirm` + 1 pieces alike (period 1). Not while a step of several pieces may still be
        learned: the policy's iteration count is then a count of pieces."""
        return self.period > 1 or self._streak[1] >= self.confirm

    @property
    def last_piece(self) -> Piece | None:
        """The piece the last candidate ended (for debug lines)."""
        return self._pieces[-1] if self._pieces else None

    @property
    def launches(self) -> int:
        """Launches made since the last candidate."""
        return self._launches

    # ---- events ----
    def allocated(self, size: int, now: float | None = None) -> None:
        if now is not None:
            if self._gap is None:
                self._gap = self._since_candidate(now)
            self._call_at = now
        self.live += size
        self._allocations += 1
        if self.live > self.peak:
            self.peak = self.live
        if self.live > self._iter_peak:
            self._iter_peak = self.live

    def quiet(self, allocations: int, frees: int, live: int, high: int, low: int) -> None:
        """Allocations and frees the policy did not hear one by one (pilotd kept them quiet:
        none of them could end a piece), after which the job held `live` bytes, having held at
        most `high` and, after a free, at least `low` in between. They count in the piece's
        signature and peak as if heard; their times are not known (a piece's `gap` and
        `before` are measured to the events heard, which matters only when a period is picked,
        and the policy asks for quiet only once the job has settled)."""
        self.live = max(0, live)
        self._allocations += allocations
        self._piece_frees += frees
        if high > self.peak:
            self.peak = high
        if high > self._iter_peak:
            self._iter_peak = high
        if frees and self._launches:
            self._lowest = min(self._lowest, low) if self._frees else low
            self._frees += frees

    def launched(self, now: float | None = None, count: int = 1) -> None:
        """`count` launches; `now`: when the last was made, if the caller saw it (launches
        counted by the daemon and read at the next memory event carry no time: the piece's gap
        is then measured to that event)."""
        if now is not None:
            if self._gap is None:
                self._gap = self._since_candidate(now)
            self._call_at = now
        self._launches += count

    def freed(self, size: int, now: float) -> Boundary | None:
        """A free; the Boundary it completes, if it completes one."""
        self.live = max(0, self.live - size)
        self._piece_frees += 1
        self._before = now - self._call_at if self._call_at is not None else 0.0
        self._call_at = now
        if self._gap is None and self._launches:
            self._gap = self._since_candidate(now)
        level = self.level
        if self.live == 0 and self._launches == 0:
            return None  # it freed everything: its end (P and E stay what they were)
        if level is not None and self._launches == 0 and self.live < level:
            self.version += 1
            self.level = self._iter_peak = self.live  # the same candidate, lower (freed in pieces)
            self._correct_last_peak(level)
            return None
        if self._launches == 0:
            return None
        self._frees += 1
        self._lowest = min(self._lowest, self.live) if self._frees > 1 else self.live
        if level is None or self.live <= level + self.tolerance_of(level):
            return self._candidate(now)
        if self._frees >= self.relearn:  # the level rose for good
            self.version += 1
            self.level = self._lowest
            self._frees = 0
        return None

    # ---- internals ----
    def _since_candidate(self, now: float) -> float:
        return now - self._candidate_at if self._candidate_at is not None else 0.0

    def tolerance_of(self, level: int) -> int:
        """How far above the level a free still returns to it (a candidate)."""
        return max(self.tolerance_bytes, int(level * self.tolerance))

    def _candidate(self, now: float) -> Boundary | None:
        """A piece ended: a Boundary unless the job is folded and this is not its phase."""
        self.version += 1
        piece = Piece(self._allocations, self._piece_frees, max(0, self._iter_peak - self.live), self.live,
                      self._gap or 0.0, self._before)
        self._candidate_at, self._gap = now, None
        self.level = self.live
        self._iter_peak = self.live
        self._launches = self._frees = self._allocations = self._piece_frees = 0
        self._fold_peak = max(self._fold_peak, piece.peak)
        self._pieces.append(piece)
        index = self.candidates
        self.candidates += 1
        pieces, streak, slack = self._pieces, self._streak, self.tolerance_bytes
        n = len(pieces)
        allocations, frees, peak = piece.allocations, piece.frees, piece.peak
        for k in range(1, min(n, self.max_period + 1)):
            # alike: the same allocations and frees, peaks within the larger of the slack and
            # 10% (inline: up to max_period comparisons per candidate)
            other = pieces[n - 1 - k]
            if other.allocations == allocations and other.frees == frees:
                b = other.peak
                alike = abs(peak - b) <= max(slack, (peak if peak > b else b) // 10)
            else:
                alike = False
            streak[k] = streak[k] + 1 if alike else 0
        if self.period > 1:
            if self._streak[self.period] == 0:  # the period broke: every candidate again
                self.period = 1
                return self._boundary(now, self.boundaries + 1, restart=True)
            if index % self.period != self._phase:
                self._reported = False
                return None
            return self._boundary(now, self.boundaries + 1)
        k = self._period()
        if k > 1:
            # folded from here: what was reported one candidate at a time is recounted
            done, since = self._base
            recounted = max(1, done + (self.candidates - since) // k)
            self.period = k
            self._phase = self._pick_phase(index, k)
            if index % k != self._phase:
                self.boundaries = recounted
                self._reported = False
                return None
            return self._boundary(now, recounted)
        return self._boundary(now, self.boundaries + 1)

    def _period(self) -> int:
        """The smallest k > 1 whose last `confirm` periods each matched the one before, if
        no smaller k (1 included: every piece alike) does; 1 if none."""
        for k in range(1, self.max_period + 1):
            if self._streak[k] >= self.confirm * k:
                return k
        return 1

    def _pick_phase(self, index: int, k: int) -> int:
        """The candidate of a period after which an iteration starts: the one with the longest
        pause of the host just before its free or just after it, averaged over the periods
        kept, if that stands out (PAUSE_S; a step's end synchronizes: loss.item(), the data
        loader), else the one with the lowest live bytes (a step's end frees everything; its
        inner dips may keep a loss or a small buffer), then the one whose next piece has the
        largest peak (the biggest piece first), then the latest."""
        pieces = list(self._pieces)
        n = len(pieces)
        last = pieces[n - k:]  # last[j] ended at candidate index - (k - 1) + j

        def pause(j: int) -> float:
            """The mean pause around candidate j over the periods kept: the longer of the one
            before its free (pieces[i]) and the one after it (the next piece's gap)."""
            around = [max(pieces[i].before, pieces[i + 1].gap)
                      for m in range(self.confirm + 1) for i in [n - k + j - m * k] if 0 <= i < n - 1]
            return sum(around) / len(around) if around else 0.0

        pauses = sorted(((pause(j), j) for j in range(k)), reverse=True)
        if pauses[0][0] >= 2 * pauses[1][0] + PAUSE_S:
            best = pauses[0][1]
        else:
            best = min(range(k), key=lambda j: (last[j].live, -last[(j + 1) % k].peak, -j))
        return (index - (k - 1) + best) % k

    def _boundary(self, now: float, iteration: int, restart: bool = False) -> Boundary:
        self._peaks.append(self._fold_peak)
        self._window_e = max(self._peaks)
        self._fold_peak = 0
        seconds = 0.0
        if self._last_at is not None:
            seconds = now - self._last_at
            self._times.append(seconds)
        self._last_at = now
        self._reported = True
        self.boundaries = iteration
        if restart:
            self._base = (self.boundaries, self.candidates)
        return Boundary(self.boundaries, self.persistent, self.ephemeral, seconds)

    def _correct_last_peak(self, old_level: int) -> None:
        """The last piece's scratch is measured from the new, lower level (its signature stays
        as it was at its candidate, so that the next period's pieces compare alike)."""
        if not self._pieces:
            return
        piece = self._pieces[-1]
        peak = piece.peak + piece.live - self.live
        if self._reported:  # it ended an iteration
            if self._peaks:
                self._peaks[-1] = max(self._peaks[-1], peak)
                self._window_e = max(self._peaks)
        else:  # it is part of the iteration under way
            self._fold_peak = max(self._fold_peak, peak)
