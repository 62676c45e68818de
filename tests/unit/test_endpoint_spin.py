"""When the vGPU threads poll for calls (daemon/vgpu/endpoint_spin.py): only while twice the busy
sessions fit in the CPUs under `auto`; always under `always`; and what C is told."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.daemon.protocol import lib
from pilot.daemon.vgpu.endpoint_spin import CHECK_S, EndpointSpin


@dataclass(eq=False)
class _Session:
    calls: int = 0


def _spin(mode: str, sessions: list[_Session], cpus: int) -> tuple[EndpointSpin, list[int]]:
    told: list[int] = []
    return EndpointSpin(mode, lambda: sessions, cpus=cpus, set_allowed=told.append), told


def test_spinning_stops_while_busy_sessions_crowd_the_cpus_and_resumes_after():
    sessions = [_Session() for _ in range(5)]
    spin, told = _spin("auto", sessions, cpus=8)
    assert spin.check(now=0.0)  # the first look sees no one moving
    for s in sessions:
        s.calls += 3
    assert not spin.check(now=CHECK_S)  # 5 busy: 10 threads on 8 CPUs
    assert spin.busy == 5
    for s in sessions[:4]:
        s.calls += 1
    assert spin.check(now=2 * CHECK_S)  # 4 busy: 8 threads fit
    assert told == [1, 0, 1]


def test_idle_sessions_do_not_count_and_looks_are_rate_limited():
    sessions = [_Session() for _ in range(64)]
    spin, told = _spin("auto", sessions, cpus=4)
    assert spin.check(now=0.0) and spin.check(now=CHECK_S)  # 64 sessions, none making calls
    sessions[0].calls = sessions[1].calls = sessions[2].calls = 1
    assert spin.check(now=CHECK_S + CHECK_S / 2)  # too soon to look again
    assert not spin.check(now=2 * CHECK_S)
    assert told == [1, 0]


def test_always_spins_whatever_the_load():
    sessions = [_Session() for _ in range(32)]
    spin, told = _spin("always", sessions, cpus=2)
    for t in range(5):
        for s in sessions:
            s.calls += 1
        assert spin.check(now=t * CHECK_S)
    assert told == [1]


def test_c_reads_what_it_is_told():
    try:
        lib.pilot_spin_set_endpoint(0)
        assert lib.pilot_spin_endpoint() == 0
    finally:
        lib.pilot_spin_set_endpoint(1)
    assert lib.pilot_spin_endpoint() == 1
