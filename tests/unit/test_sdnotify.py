"""sd_notify without libsystemd: real datagram sockets stand in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pilot.daemon.router import sdnotify
from pilot.daemon.router.sdnotify import Watchdog, notify, watchdog_interval


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sdnotify, "_warned", False)


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = str(tmp_path / "notify.sock")
    sock = _receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()


def test_unset_socket_is_a_quiet_no_op() -> None:
    assert notify("READY=1") is False


@pytest.mark.parametrize("states, datagram", [
    (("READY=1",), b"READY=1"),
    (("STOPPING=1",), b"STOPPING=1"),
    (("WATCHDOG=1",), b"WATCHDOG=1"),
    (("READY=1", "STATUS=serving 2 vGPU(s) on GPU 0"), b"READY=1\nSTATUS=serving 2 vGPU(s) on GPU 0"),
])
def test_states_arrive_as_one_datagram(path_socket: socket.socket, states: tuple[str, ...],
                                       datagram: bytes) -> None:
    assert notify(*states) is True
    assert path_socket.recv(4096) == datagram


def test_newline_in_a_state_cannot_forge_another(path_socket: socket.socket) -> None:
    assert notify("STATUS=line one\nREADY=1") is True
    assert path_socket.recv(4096) == b"STATUS=line one READY=1"


def test_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"pilot-test-notify-{os.getpid()}-{id(monkeypatch)}"
    sock = _receiver("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1", "STATUS=ok") is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
    finally:
        sock.close()


def test_send_failure_returns_false_and_logs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    with caplog.at_level(logging.WARNING, logger="pilot.sdnotify"):
        assert notify("WATCHDOG=1") is False
        assert notify("WATCHDOG=1") is False
    assert len([r for r in caplog.records if r.name == "pilot.sdnotify"]) == 1


def test_unsupported_address_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False


@pytest.mark.parametrize("usec, pid, expected", [
    (None, None, None),
    ("30000000", None, 15.0),
    ("30000000", "self", 15.0),
    ("30000000", "other", None),          # meant for another process (we inherited it)
    ("30000000", "garbage", None),
    ("1000", None, 0.0005),
    ("0", None, None),
    ("-5", None, None),
    ("thirty", None, None),
    ("", None, None),
])
def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None,
                           expected: float | None) -> None:
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        value = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(pid, pid)
        monkeypatch.setenv("WATCHDOG_PID", value)
    assert watchdog_interval() == expected


def test_watchdog_pings_at_most_once_per_interval() -> None:
    sent: list[str] = []
    wd = Watchdog(15.0, clock=lambda: 0.0, send=lambda *s: sent.extend(s) or True)
    assert wd.maybe_ping(100.0) is True           # the first call pings at once
    assert wd.maybe_ping(100.2) is False
    assert wd.maybe_ping(114.99) is False
    assert wd.maybe_ping(115.0) is True           # exactly one interval later
    assert wd.maybe_ping(129.0) is False
    assert wd.maybe_ping(131.0) is True
    assert sent == ["WATCHDOG=1"] * 3


def test_watchdog_uses_its_clock_and_really_sends(path_socket: socket.socket) -> None:
    now = [50.0]
    wd = Watchdog(1.0, clock=lambda: now[0])
    assert wd.maybe_ping() is True
    assert path_socket.recv(4096) == b"WATCHDOG=1"
    now[0] = 50.5
    assert wd.maybe_ping() is False
    now[0] = 51.0
    assert wd.maybe_ping() is True
    assert path_socket.recv(4096) == b"WATCHDOG=1"


def test_watchdog_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Watchdog.from_env() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    wd = Watchdog.from_env()
    assert wd is not None and wd.interval == 15.0


def test_watchdog_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        Watchdog(0)
