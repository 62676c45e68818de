"""Fixtures for protocol tests: a real pilotd (sim backend) per test, and a raw protocol client."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from proto_daemon import RunningDaemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[RunningDaemon]:
    d = start_daemon(tmp_path)
    os.environ["PILOT_SOCKET"] = str(d.socket_path)
    try:
        yield d
    finally:
        os.environ.pop("PILOT_SOCKET", None)
        stop_daemon(d)


@pytest.fixture
def daemon_with(tmp_path: Path) -> Iterator:
    """daemon_with(*options): a daemon started with extra pilotd options, stopped after the test
    (PILOT_SOCKET points at it meanwhile)."""
    started: list[RunningDaemon] = []

    def start(*extra: str) -> RunningDaemon:
        d = start_daemon(Path(tempfile.mkdtemp(prefix="pilot-p-", dir=tmp_path.parent)), *extra)
        started.append(d)
        os.environ["PILOT_SOCKET"] = str(d.socket_path)
        return d

    try:
        yield start
    finally:
        os.environ.pop("PILOT_SOCKET", None)
        for d in started:
            stop_daemon(d)
