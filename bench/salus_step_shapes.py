"""Scripted call streams of training steps, as the salus detector sees them (allocations, frees,
launches; sizes in bytes): the detector's unit tests and bench/salus_policy_cost.py replay
them, bench/salus_torch_like.cu makes the same shape on a GPU (or the sim).

A **PyTorch-like step** (`torch_like_step`) returns to the persistent level several times
within one step, as a step with `backend:cudaMallocAsync` does: each layer allocates its
output and a temporary, launches, frees the temporary and the output in another order (back
to the level: a dip), then a backward piece allocates gradients of several sizes and frees
them out of order, and an optimizer piece allocates and frees one small buffer. One step is
`layers + 2` pieces of different shapes; what the detector should report is one boundary."""

from __future__ import annotations

from collections.abc import Iterator

MIB = 1 << 20
Call = tuple[str, int]  # ("alloc" | "free" | "launch", bytes or 0)


def torch_like_step(layers: int = 4, unit: int = 2 * MIB) -> Iterator[Call]:
    """One step: `layers` forward pieces, a backward piece and an optimizer piece; its peak
    above the level is the backward piece's (layers + 2) x unit."""
    for i in range(layers):
        out, tmp = unit * (1 + i % 2), unit // 2 + i * (unit // 8)
        yield ("alloc", out)
        yield ("alloc", tmp)
        yield ("launch", 0)
        yield ("launch", 0)
        yield ("free", out)  # not the last allocated first
        yield ("free", tmp)
    grads = [unit * (2 + i % 3) for i in range(layers)]
    for g in grads:
        yield ("alloc", g)
        yield ("launch", 0)
    for g in grads[1::2] + grads[0::2]:
        yield ("free", g)
    yield ("alloc", unit // 4)
    yield ("launch", 0)
    yield ("free", unit // 4)


def torch_like_peak(layers: int = 4, unit: int = 2 * MIB) -> int:
    """The largest bytes above the level within torch_like_step."""
    forward = max(unit * (1 + i % 2) + unit // 2 + i * (unit // 8) for i in range(layers))
    return max(forward, sum(unit * (2 + i % 3) for i in range(layers)))


def job(state: list[int], step: Iterator[Call] | list[Call], steps: int) -> Iterator[Call]:
    """A job: `state` allocated once (then one launch that sets it up), `steps` times `step`."""
    for size in state:
        yield ("alloc", size)
    calls = list(step)
    for _ in range(steps):
        yield from calls
