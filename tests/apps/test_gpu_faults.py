"""A kernel fault under pilot (issue 12, fault handling; router/recovery.py): the faulting program
sees what it sees natively, a program beside it gets a clean error (never a hang or a wrong
result), the next program runs correctly on the same pilotd (same pid, restarted in place), and
the fault is named in the log and in `pilotctl status`.

The sim backend faults like the H100 (tests/gpu/fault_probe.py): after a kernel's illegal
address every call of the daemon's process fails with cudaErrorIllegalAddress.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import OwnDaemon  # pytest puts tests/apps on sys.path

StartPilotd = Callable[..., "OwnDaemon"]

FAULT_OUTPUT = """launch: cudaSuccess
synchronize: cudaErrorIllegalAddress
malloc after: cudaErrorIllegalAddress
last error: cudaErrorIllegalAddress
"""
CLEAN_ERRORS = ("cudaErrorIllegalAddress", "cudaErrorDevicesUnavailable")


def run(daemon: OwnDaemon, shim: str, exe: Path, *args: str, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], env={**daemon.env(), "LD_PRELOAD": shim},
                          capture_output=True, text=True, timeout=timeout)


def start(daemon: OwnDaemon, shim: str, exe: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(exe), *args], env={**daemon.env(), "LD_PRELOAD": shim},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_session(daemon: OwnDaemon, pid: int) -> None:
    deadline = time.monotonic() + 20
    while not any(r["pid"] == pid and r["calls"] > 5 for r in daemon.sessions()):
        assert time.monotonic() < deadline, f"no busy session of pid {pid}\n{daemon.log_tail()}"
        time.sleep(0.02)


def test_fault_beside_a_running_program_and_the_next_one(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd()
    exe = app_binaries["fault"]
    pid_before = json.loads(daemon.ctl("status", "--json").stdout)["pid"]
    beside = start(daemon, shim_path, exe, "steady", "60")
    wait_for_session(daemon, beside.pid)

    faulting = run(daemon, shim_path, exe, "fault")
    assert (faulting.returncode, faulting.stdout) == (0, FAULT_OUTPUT), faulting.stderr
    after = run(daemon, shim_path, exe, "work")  # right away: pilotd may still be restarting
    assert (after.returncode, after.stdout) == (0, "work: ok\n"), \
        f"{after.stderr}\n{daemon.log_tail()}"

    # the program beside it stops at a clean CUDA error long before its 60 s are up
    out, err = beside.communicate(timeout=30)
    first = out.splitlines()[0]
    assert first in tuple(f"steady: {e}" for e in CLEAN_ERRORS), f"{out}\n{err}"
    assert beside.returncode == 0

    # the same pilotd, restarted in place, names the fault and the faulting program
    status = json.loads(daemon.ctl("status", "--json").stdout)
    assert status["pid"] == pid_before and daemon.alive()
    (fault,) = status["faults"]
    assert fault["error"] == 700 and fault["restarted"] is not None
    assert any(s["pid"] == faulting_pid(daemon) for s in fault["suspects"]), fault
    assert "GPU faults: 1; last on GPU 0" in daemon.ctl("status").stdout
    log = daemon.log()
    assert re.search(r"context-fatal fault cudaErrorIllegalAddress \(700\)", log)
    assert "recovered from the GPU 0 fault" in log


def faulting_pid(daemon: OwnDaemon) -> int:
    """The pid of the `fault fault` program, from pilotd's session log line."""
    found = re.findall(r"pid (\d+) uid \d+ \([^)]*fault fault\)", daemon.log())
    assert found, daemon.log_tail()
    return int(found[-1])


def test_sessions_go_on_numbering_after_the_restart(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd()
    exe = app_binaries["fault"]
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n"
    assert run(daemon, shim_path, exe, "fault").stdout == FAULT_OUTPUT
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n"
    ids = [int(i) for i in re.findall(r"session (\d+): pid \d+", daemon.log())]
    assert ids == sorted(set(ids)) and len(ids) == 3, daemon.log_tail()


def test_fault_recovery_exit_stops_pilotd_with_status_3(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config='[daemon]\nfault_recovery = "exit"\n')
    assert run(daemon, shim_path, app_binaries["fault"], "fault").stdout == FAULT_OUTPUT
    try:
        daemon.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pilotd did not stop after the fault\n{daemon.log_tail()}")
    assert daemon.proc.returncode == 3, daemon.log_tail()
    assert not Path(daemon.socket).exists()


def test_fault_noticed_without_a_call(start_pilotd: StartPilotd, app_binaries: dict[str, Path],
                                      shim_path: str) -> None:
    """The fault watch notices a fault nobody calls into: the program launches the faulting
    kernel and makes no call for 3 s; pilotd restarts meanwhile, and the program's next call
    fails cleanly."""
    daemon = start_pilotd()
    quiet = run(daemon, shim_path, app_binaries["fault"], "quiet", "3")
    assert "seen by a fault watch" in daemon.log(), daemon.log_tail()
    assert "recovered from the GPU 0 fault" in daemon.log(), daemon.log_tail()
    lines = quiet.stdout.splitlines()
    assert lines[0] == "launch: cudaSuccess"
    assert lines[1] in tuple(f"synchronize: {e}" for e in CLEAN_ERRORS), quiet.stdout
