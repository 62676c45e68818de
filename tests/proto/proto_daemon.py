"""A real pilotd (sim backend) for the protocol tests: started, waited for, stopped. Apart from
conftest.py so that a test module can import it by a name no other test folder uses."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


class RunningDaemon:
    def __init__(self, proc: subprocess.Popen[str], socket_path: Path, log_path: Path) -> None:
        self.proc, self.socket_path, self.log_path = proc, socket_path, log_path

    def log(self) -> str:
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None


def start_daemon(tmp_path: Path, *extra: str, prefix: tuple[str, ...] = ()) -> RunningDaemon:
    """`prefix`: a command the daemon runs under (e.g. taskset)."""
    sock = tmp_path / "pilot.sock"
    log_path = tmp_path / "pilotd.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket", str(sock),
         "--state-dir", str(tmp_path / "state"), "--metrics-address", "", *extra],
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 20
    while "pilotd ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"pilotd did not start:\n{log_path.read_text()}")
        time.sleep(0.02)
    return RunningDaemon(proc, sock, log_path)


def stop_daemon(d: RunningDaemon) -> None:
    if d.alive():
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(10)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
