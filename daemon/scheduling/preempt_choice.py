"""How a gated kernel runs, chosen from measured times (issue 29 item 2; docs/design/preemption.md).

A preemptible variant costs what the original does not: a claim per chunk of logical blocks (an
atomic on one address), a persistent grid that may fit the kernel worse, and the launch that
runs the rest. On the H200 (bench/RESULTS.md, seventeenth session) chunk 1 cost 1.25x on a grid
of 32,768 short blocks that chunk 8 ran in 0.61x, and chunk 8 cost 1.83x where chunk 1 did not:
no rule fitted to a few points predicts it, so pilotd measures.

For each kernel of a module image, at a block size, dynamic shared memory and grid size class
(blocks, rounded up to a power of two), the first gated launches alternate the CANDIDATES: the
original, and the variant claiming 1 and 8 logical blocks at a time, each between two timing
events on its stream (a variant's four steps, the rest included). A sample counts only if its
class's retreat word was down when the launch was queued and no word went up on its GPU before
the launch was seen done (else its time holds a retreat and a wait). Once every candidate has
SAMPLES, the variant of the least median time is kept, or the original when that median is
more than TOLERANCE times the original's (such a kernel is then not preemptible: the gate alone
applies, as for kernels the rewrite refuses). After MAX_TRIES measured launches without enough
samples (a higher class that keeps the words up), the best variant measured is kept, else chunk
1: a kernel the policy may need to preempt is not left unpreemptible for want of a measurement.

Choices are kept per image in the daemon (ModuleVariants), so every session running the same
binary shares them; at most MAX_CHOICES per image (beyond, the variant at chunk 1 runs unmeasured).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

ORIGINAL = 0  # the candidate that is not a variant
CANDIDATES = (ORIGINAL, 1, 8)  # the original, then variants by chunk
SAMPLES = 3  # per candidate
TOLERANCE = 1.05  # a variant's median over the original's beyond which the original is kept
MAX_TRIES = 48  # measured launches of a key before it is decided with what it has
MAX_CHOICES = 4096  # keys per module image
FALLBACK_CHUNK = 1


def key(kernel: str, threads: int, shared: int, blocks: int) -> tuple[str, int, int, int]:
    """What a choice depends on: the kernel, its block size, its dynamic shared memory, and its
    grid's size class (the number of blocks rounded up to a power of two)."""
    return kernel, threads, shared, max(blocks - 1, 0).bit_length()


@dataclass
class Choice:
    """One key's measurements and, once made, its decision (a chunk, or ORIGINAL)."""

    samples: dict[int, list[float]] = field(default_factory=lambda: {c: [] for c in CANDIDATES})
    decided: int | None = None
    tries: int = 0

    def next(self) -> int:
        """The candidate to measure at this launch: the one with the fewest samples."""
        self.tries += 1
        return min(CANDIDATES, key=lambda c: (len(self.samples[c]), c))

    def add(self, candidate: int, seconds: float) -> None:
        if self.decided is not None:
            return
        self.samples[candidate].append(seconds)
        if all(len(v) >= SAMPLES for v in self.samples.values()):
            self.decided = decide(self.samples)

    def expire(self) -> None:
        """Decide with what was measured once MAX_TRIES launches went by."""
        if self.decided is None and self.tries >= MAX_TRIES:
            self.decided = decide(self.samples)

    def describe(self) -> str:
        if self.decided is None:
            return "measuring"
        return "original" if self.decided == ORIGINAL else f"chunk {self.decided}"


def decide(samples: dict[int, list[float]]) -> int:
    """The chunk of the fastest variant, or ORIGINAL when it costs more than TOLERANCE times
    the original; without variant samples FALLBACK_CHUNK, without the original's the fastest
    variant."""
    medians = {c: statistics.median(v) for c, v in samples.items() if v}
    variants = {c: m for c, m in medians.items() if c != ORIGINAL}
    if not variants:
        return FALLBACK_CHUNK
    best = min(variants, key=lambda c: (variants[c], c))
    original = medians.get(ORIGINAL)
    if original is not None and variants[best] > TOLERANCE * original:
        return ORIGINAL
    return best


@dataclass
class Timing:
    """A measured launch waiting for its end event."""

    choice: Choice
    candidate: int
    start: Any
    end: Any
    raises: int  # the GPU's raise count when it was queued
