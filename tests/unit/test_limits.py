"""daemon/limits.py: cudaDeviceSetLimit on a context every tenant shares. The effective value is
the largest of the context's default and the live sessions' requests; it goes back down when
the sessions that held it up end."""

from __future__ import annotations

import logging

import pytest

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.resources import limits
from pilot.daemon.sim_kernels import KernelRegistry

STACK, HEAP = 0, 2


class RecordingLimits:
    """The two backend calls ContextLimits makes, with a driver that rounds stacks to 16."""

    def __init__(self) -> None:
        self.values = {STACK: 1024, HEAP: 8 << 20}
        self.sets: list[tuple[int, int]] = []
        self.refuse: set[int] = set()

    def ctx_get_limit(self, limit: int) -> int:
        return self.values[limit]

    def ctx_set_limit(self, limit: int, value: int) -> None:
        if value in self.refuse:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"refused {value}")
        self.sets.append((limit, value))
        self.values[limit] = -(-value // 16) * 16 if limit == STACK else value


@pytest.fixture
def backend() -> RecordingLimits:
    return RecordingLimits()


@pytest.fixture
def table(backend: RecordingLimits) -> limits.ContextLimits:
    return limits.ContextLimits(backend)  # type: ignore[arg-type]


def test_largest_request_wins(table: limits.ContextLimits, backend: RecordingLimits) -> None:
    assert table.request(1, STACK, 4096) == 4096
    assert table.request(2, STACK, 2048) == 4096  # accepted, but others need more
    assert table.request(2, STACK, 8000) == 8000
    assert table.request(1, STACK, 1000) == 8000
    assert backend.sets == [(STACK, 4096), (STACK, 8000)]  # nothing set when nothing changes


def test_never_below_the_default(table: limits.ContextLimits, backend: RecordingLimits) -> None:
    assert table.request(1, STACK, 512) == 1024
    assert backend.sets == []
    assert table.request(1, STACK, 1000) == 1024


def test_driver_rounding_is_reported(table: limits.ContextLimits) -> None:
    assert table.request(1, STACK, 4100) == 4112


def test_a_session_lowers_its_own_request(table: limits.ContextLimits) -> None:
    assert table.request(1, HEAP, 64 << 20) == 64 << 20
    assert table.request(1, HEAP, 16 << 20) == 16 << 20  # its own earlier request is replaced


def test_release_goes_back_down(table: limits.ContextLimits, backend: RecordingLimits) -> None:
    table.request(1, STACK, 8192)
    table.request(2, STACK, 4096)
    table.request(2, HEAP, 32 << 20)
    table.release(1)
    assert backend.values[STACK] == 4096  # what session 2 still needs
    table.release(2)
    assert backend.values == {STACK: 1024, HEAP: 8 << 20}
    table.release(3)  # never asked: nothing happens
    assert backend.sets[-2:] == [(STACK, 1024), (HEAP, 8 << 20)]


def test_refused_request_is_not_recorded(table: limits.ContextLimits,
                                         backend: RecordingLimits) -> None:
    backend.refuse.add(1 << 40)
    with pytest.raises(BackendError) as info:
        table.request(1, HEAP, 1 << 40)
    assert info.value.code == CUDA_ERROR_INVALID_VALUE
    assert table.request(2, HEAP, 16 << 20) == 16 << 20
    table.release(2)
    assert backend.values[HEAP] == 8 << 20  # session 1's refused request holds nothing up


def test_failed_release_is_logged(table: limits.ContextLimits, backend: RecordingLimits,
                                  caplog: pytest.LogCaptureFixture) -> None:
    table.request(1, STACK, 4096)
    backend.refuse.add(1024)
    with caplog.at_level(logging.WARNING, logger="pilot.limits"):
        table.release(1)
    assert backend.values[STACK] == 4096
    assert "stack_size: cannot go back to 1024" in caplog.text


def test_one_table_per_backend_and_device() -> None:
    a, b = SimBackend(KernelRegistry()), SimBackend(KernelRegistry())
    assert limits.for_context(a, 0) is limits.for_context(a, 0)
    assert limits.for_context(a, 0) is not limits.for_context(a, 1)
    assert limits.for_context(a, 0) is not limits.for_context(b, 0)


def test_with_the_sim_backend() -> None:
    sim = SimBackend(KernelRegistry())
    sim.bind_thread(0)
    table = limits.ContextLimits(sim)
    assert table.request(7, STACK, 1000) == 1024
    assert table.request(7, STACK, 5000) == 5008  # 16-byte units, as the H100's driver
    table.release(7)
    assert sim.ctx_get_limit(STACK) == 1024
