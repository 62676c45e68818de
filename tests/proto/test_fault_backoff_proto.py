"""A tenant whose engine faults again and again is refused at HELLO for longer and longer
(router/fault_backoff.py; the faults are written where an engine writes them, as the sim's
engines cannot fault the GPU)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

from client import ProtoClient
from proto_daemon import start_daemon, stop_daemon

from pilot.daemon.router.recovery import Fault, record_engine_fault

DEVICES_UNAVAILABLE = 46


def _hello(sock: str) -> int:
    c = ProtoClient(sock)
    try:
        return int(c.hello().hdr.err)
    finally:
        c.close()


def _ctl(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", *args], capture_output=True, text=True,
                          env={**os.environ, "PILOT_SOCKET": sock}, timeout=30)


def test_a_tenant_whose_engine_faulted_waits_longer_after_each_fault(tmp_path: Path) -> None:
    (tmp_path / "pilotd.toml").write_text('[isolation]\nfault_backoff = "1s"\nfault_backoff_max = "1m"\n')
    d = start_daemon(tmp_path, "--config", str(tmp_path / "pilotd.toml"))
    sock, state = str(d.socket_path), str(tmp_path / "state")
    tenant = "user:" + pwd.getpwuid(os.getuid()).pw_name
    try:
        assert _hello(sock) == 0
        now = time.time()
        record_engine_fault(state, Fault(gpu=0, error=700, detected=now - 0.3, via="watch"), tenant)
        assert _hello(sock) == 0  # one fault costs nothing
        for ago in (0.2, 0.1):  # two more faults of its engine: 2 s from the last
            record_engine_fault(state, Fault(gpu=0, error=700, detected=now - ago, via="watch"), tenant)
        for ago in (0.1, 0.0):
            record_engine_fault(state, Fault(gpu=0, error=700, detected=now - ago, via="watch"), "user:other")
        assert _hello(sock) == DEVICES_UNAVAILABLE
        assert f"tenant {tenant}'s engine faulted 3 time(s) in the last hour" in d.log()
        status = json.loads(_ctl(sock, "status", "--json").stdout)
        assert status["backing_off"][tenant]["faults"] == 3
        assert set(status["backing_off"]) == {tenant, "user:other"}
        assert "are refused for" in _ctl(sock, "status").stdout
        time.sleep(max(0.0, now - 0.1 + 1.0 - time.time()) + 0.2)  # past a 1 s wait: still refused
        assert _hello(sock) == DEVICES_UNAVAILABLE
        time.sleep(max(0.0, now - 0.1 + 2.0 - time.time()) + 0.2)
        assert _hello(sock) == 0

        record_engine_fault(state, Fault(gpu=0, error=700, detected=time.time(), via="watch"), tenant)
        assert _hello(sock) == DEVICES_UNAVAILABLE  # a fourth fault: 4 s
        cleared = _ctl(sock, "isolate", "clear", tenant)
        assert cleared.returncode == 0, cleared.stderr
        assert _hello(sock) == 0  # an operator forgave its faults
    finally:
        stop_daemon(d)
