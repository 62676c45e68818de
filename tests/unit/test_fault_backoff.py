"""router/fault_backoff.py: how long a tenant whose engine faulted waits (the router's refusal
at HELLO: tests/proto/test_fault_backoff_proto.py)."""

from __future__ import annotations

import pytest

from pilot.daemon.router.fault_backoff import WINDOW_S, backoff_wait


def test_no_fault_no_wait() -> None:
    assert backoff_wait([], 100.0, 10.0, 600.0) == (0.0, 0)


def test_one_fault_costs_nothing() -> None:
    assert backoff_wait([99.0], 100.0, 10.0, 600.0) == (0.0, 1)


@pytest.mark.parametrize(("faults", "wait"), [(2, 10.0), (3, 20.0), (4, 40.0), (8, 600.0), (200, 600.0)])
def test_the_wait_doubles_with_each_fault_of_the_hour_up_to_the_most(faults: int, wait: float) -> None:
    now = 10_000.0
    times = [now - 1.0 - i for i in range(faults)]  # the last one a second ago
    assert backoff_wait(times, now, 10.0, 600.0) == (pytest.approx(wait - 1.0), faults)


def test_the_wait_runs_from_the_last_fault() -> None:
    assert backoff_wait([100.0, 150.0], 155.0, 10.0, 600.0) == (pytest.approx(5.0), 2)
    assert backoff_wait([100.0, 150.0], 161.0, 10.0, 600.0) == (0.0, 2)


def test_faults_older_than_the_window_or_forgiven_do_not_count() -> None:
    now = 2 * WINDOW_S
    old = [now - WINDOW_S - 5.0, now - WINDOW_S - 1.0]
    assert backoff_wait([*old, now - 3.0, now - 2.0], now, 10.0, 600.0) == (pytest.approx(8.0), 2)
    assert backoff_wait([*old, now - 2.0], now, 10.0, 600.0) == (0.0, 1)
    assert backoff_wait([now - 30.0, now - 2.0], now, 10.0, 600.0, cleared=now - 1.0) == (0.0, 0)


def test_off_when_the_base_is_zero() -> None:
    assert backoff_wait([98.0, 99.0], 100.0, 0.0, 600.0) == (0.0, 2)
