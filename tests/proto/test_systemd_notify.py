"""pilotd under systemd's Type=notify, checked against a NOTIFY_SOCKET this test creates:
READY=1 once it serves, WATCHDOG=1 at half WATCHDOG_USEC, STOPPING=1 on SIGTERM, then a clean
exit that removes its sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def test_pilotd_speaks_the_notify_protocol(tmp_path: Path) -> None:
    notify_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(20)
    sock = tmp_path / "pilot.sock"
    env = {**os.environ, "NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"}
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
                               str(sock), "--state-dir", str(tmp_path / "state"),
                               "--metrics-address", ""], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = listener.recv(4096).decode().split("\n")
        assert "READY=1" in first and any(s.startswith("STATUS=serving") for s in first)
        assert sock.exists()  # READY comes after the sockets are bound
        pings, deadline = 0, time.monotonic() + 5
        while pings < 3 and time.monotonic() < deadline:
            if listener.recv(4096).decode() == "WATCHDOG=1":
                pings += 1
        assert pings == 3, "no watchdog pings at half of WATCHDOG_USEC"
        daemon.send_signal(signal.SIGTERM)
        states: list[str] = []
        while "STOPPING=1" not in states:
            states = listener.recv(4096).decode().split("\n")
        assert daemon.wait(15) == 0
        assert not sock.exists() and not Path(f"{sock}.vgpu0").exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        listener.close()


def test_sighup_rereads_quotas_and_keeps_serving(tmp_path: Path) -> None:
    """SIGHUP no longer kills pilotd: it re-reads quotas.json (an operator's hand edit applies)
    and goes on serving; a file it cannot read keeps the current quotas."""
    sock = tmp_path / "pilot.sock"
    log_path = tmp_path / "pilotd.log"
    env = {**os.environ, "PILOT_SOCKET": str(sock)}
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
                                   str(sock), "--state-dir", str(tmp_path / "state"),
                                   "--metrics-address", ""], env=env, stdout=log, stderr=subprocess.STDOUT)
    ctl = [sys.executable, "-m", "pilot.cli.pilotctl"]
    try:
        deadline = time.monotonic() + 20
        while "pilotd ready" not in log_path.read_text():
            assert daemon.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        subprocess.run([*ctl, "quota", "set", "uid:4242", "1GiB"], env=env, check=True, capture_output=True)
        quotas = tmp_path / "state" / "quotas.json"
        quotas.write_text(quotas.read_text().replace(str(1 << 30), str(2 << 30)))  # a hand edit

        def hard() -> int:
            out = subprocess.run([*ctl, "quota", "get", "uid:4242", "--json"], env=env, check=True,
                                 capture_output=True, text=True).stdout
            return json.loads(out)["gpus"]["0"]["hard"]

        assert hard() == 1 << 30
        daemon.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while hard() != 2 << 30:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        quotas.write_text("{not json")
        daemon.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while "reload failed" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        assert daemon.poll() is None and hard() == 2 << 30
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(15)
