"""`[daemon] endpoint_spin = "auto"` in a running pilotd (daemon/vgpu/endpoint_spin.py): pinned to
one CPU, one session making calls is already a crowd (its thread and a vGPU thread), so the
router turns the endpoints' polling off, and on again once the calls stop; `always` never does."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from client import ProtoClient
from proto_daemon import RunningDaemon, start_daemon, stop_daemon

from pilot.daemon.protocol import lib

pytestmark = pytest.mark.skipif(shutil.which("taskset") is None, reason="no taskset")


def _start_on_one_cpu(tmp_path: Path, *extra: str) -> RunningDaemon:
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    return start_daemon(tmp_path, "--log-level", "debug", *extra, prefix=("taskset", "-c", cpu))


def _busy_then_idle(d: RunningDaemon, seconds: float = 1.0) -> None:
    client = ProtoClient(str(d.socket_path))
    try:
        client.open()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert client.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"").err == 0
        time.sleep(0.8)  # idle: the next looks see no call
    finally:
        client.close()


def _wait_for(d: RunningDaemon, text: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in d.log_path.read_text():
            return True
        time.sleep(0.05)
    return False


def test_a_busy_session_on_one_cpu_stops_the_polling_and_idleness_resumes_it(tmp_path):
    d = _start_on_one_cpu(tmp_path)
    try:
        _busy_then_idle(d)
        tail = d.log_path.read_text()[-3000:]
        assert _wait_for(d, "endpoints stop spinning: 1 busy session(s), 1 CPUs"), tail
        assert _wait_for(d, "endpoints resume spinning: 0 busy session(s), 1 CPUs"), tail
    finally:
        stop_daemon(d)


def test_always_polls_whatever_the_load(tmp_path):
    d = _start_on_one_cpu(tmp_path, "--endpoint-spin", "always")
    try:
        _busy_then_idle(d)
        text = d.log_path.read_text()
        assert "session 1: pid" in text  # it served a session
        assert "endpoints stop spinning" not in text
    finally:
        stop_daemon(d)
