"""backends/cublas.py keeps the cuBLASLt descriptors it built per handle, the least recently
used dropped first (issue 25: a transformer's step uses hundreds of descriptor sets; a FIFO of 64
rebuilt each before its next use and kept every matmul off the C fast path)."""

from __future__ import annotations

from typing import Any

from pilot.daemon.backends.cublas import LT_CACHE_MAX, CudaLibraries, HandleState


class Builder:
    """Stands in for the library: counts descriptor sets built and destroyed."""

    def __init__(self) -> None:
        self.built = 0
        self.destroyed = 0
        self.applied: list[tuple[int, Any]] = []

    def _lt_build(self, call: Any, with_pref: bool) -> list[tuple[str, int]]:
        self.built += 1
        return [("cublasLtMatmulDescDestroy", self.built)]

    def _lt_destroy(self, made: list[tuple[str, int]]) -> None:
        self.destroyed += 1

    def _lt_pointers(self, desc: int, call: Any) -> None:
        self.applied.append((desc, call))


def objects(b: Builder, state: HandleState, key: bytes) -> Any:
    return CudaLibraries._lt_objects(b, state, None, key, False)  # type: ignore[arg-type]


def test_a_set_in_use_is_kept_while_others_come_and_go() -> None:
    b, state = Builder(), HandleState(library=2, device=0, ptr=1)
    hot = objects(b, state, b"hot")
    for i in range(3 * LT_CACHE_MAX):
        objects(b, state, i.to_bytes(4, "little"))
        assert objects(b, state, b"hot") is hot  # used between the others: never rebuilt
    assert len(state.lt_cache) == LT_CACHE_MAX
    assert b.destroyed == b.built - LT_CACHE_MAX
    assert b"hot" not in state.lt_evicted
    # what was dropped is named for the fast path to forget
    assert state.lt_evicted[0] == (0).to_bytes(4, "little")


def test_a_working_set_within_the_bound_is_built_once() -> None:
    b, state = Builder(), HandleState(library=2, device=0, ptr=1)
    keys = [i.to_bytes(4, "little") for i in range(300)]  # as many as a transformer's step used
    for _ in range(5):
        for k in keys:
            objects(b, state, k)
    assert b.built == 300 and b.destroyed == 0


def test_every_call_applies_its_own_pointers_to_the_cached_descriptors() -> None:
    """The set's key leaves the pointers out (lt_set_key): a cached descriptor holds another
    call's bias until this call's is set on it."""
    b, state = Builder(), HandleState(library=2, device=0, ptr=1)
    first = CudaLibraries._lt_objects(b, state, "call 1", b"set", False)  # type: ignore[arg-type]
    again = CudaLibraries._lt_objects(b, state, "call 2", b"set", False)  # type: ignore[arg-type]
    assert again is first and b.built == 1
    assert b.applied == [(first[0][1], "call 1"), (first[0][1], "call 2")]
