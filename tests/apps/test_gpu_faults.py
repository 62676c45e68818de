"""A kernel fault under pilot (issue 12, fault handling; router/recovery.py): the faulting program
sees what it sees natively, a program beside it gets a clean error (never a hang or a wrong
result), the next program runs correctly on the same pilotd (same pid, restarted in place), and
the fault is named in the log and in `pilotctl status`.

The sim backend faults like the H100 (tests/gpu/fault_probe.py): after a kernel's illegal
address every call of the daemon's process fails with cudaErrorIllegalAddress.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from apps_daemons import OwnDaemon  # pytest puts tests/apps on sys.path

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
    daemon = start_pilotd(config="[isolation]\nafter_fault = false\n")
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


# ---- isolation (router/isolation.py) ----

NOBODY = 65534


def as_nobody() -> None:
    """preexec_fn: the program runs as user nobody (another tenant: user:nobody)."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def shared_copy(exe: Path) -> Path:
    """`exe` where another user can run it."""
    directory = Path(tempfile.mkdtemp(prefix="pilot-iso-", dir="/tmp"))
    directory.chmod(0o755)
    copy = directory / exe.name
    shutil.copy2(exe, copy)
    copy.chmod(0o755)
    return copy


def isolated_pids(daemon: OwnDaemon) -> list[int]:
    return [e["pid"] for e in json.loads(daemon.ctl("isolate", "list", "--json").stdout)["engines"]]


def test_isolated_tenant_runs_in_a_pilotd_of_its_own(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config='[isolation]\ntenants = ["all"]\n')
    exe = app_binaries["fault"]
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n"
    (engine,) = isolated_pids(daemon)
    assert engine != daemon.proc.pid
    # by default it grants the same capacity, withholding nothing: programs see the same GPU
    status = json.loads(daemon.ctl("status", "--json").stdout)
    (row,) = json.loads(daemon.ctl("isolate", "list", "--json").stdout)["engines"]
    assert (row["capacity"], row["withheld"]) == (status["gpus"][0]["capacity"], 0)
    # its fault restarts its own pilotd only
    assert run(daemon, shim_path, exe, "fault").stdout == FAULT_OUTPUT
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n"
    status = json.loads(daemon.ctl("status", "--json").stdout)
    assert status["faults"] == [] and status["pid"] == daemon.proc.pid
    # ...and this pilotd reports it: the engine's tenant, its error
    (fault,) = status["engine_faults"]
    assert fault["tenant"] == f"user:{pwd.getpwuid(os.getuid()).pw_name}" and fault["gpu"] == 0
    assert fault["name"] == "cudaErrorIllegalAddress" and fault["pid"] == engine
    assert "isolated tenants' GPU faults: 1; last of user:" in daemon.ctl("status").stdout
    assert isolated_pids(daemon) == [engine]  # restarted in place: same pid
    assert "serves tenant user:" in daemon.log() and "recovered from the GPU 0 fault" in daemon.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a program as a second user")
def test_fault_of_an_isolated_tenant_spares_the_others(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config='[isolation]\ntenants = ["user:nobody"]\n')
    Path(daemon.dir).chmod(0o755)
    exe = shared_copy(app_binaries["fault"])
    # the installed shim may sit where nobody cannot read it (CI installs under /root)
    env = {**daemon.env(), "LD_PRELOAD": str(shared_copy(Path(shim_path)))}
    beside = start(daemon, shim_path, exe, "steady", "4")  # root, in the shared pilotd
    wait_for_session(daemon, beside.pid)
    faulting = subprocess.run([str(exe), "fault"], env=env, capture_output=True, text=True,
                              timeout=60, preexec_fn=as_nobody)
    assert faulting.stdout == FAULT_OUTPUT, f"{faulting.stderr}\n{daemon.log_tail()}"
    after = subprocess.run([str(exe), "work"], env=env, capture_output=True, text=True,
                           timeout=60, preexec_fn=as_nobody)
    assert after.stdout == "work: ok\n", after.stderr
    out, err = beside.communicate(timeout=30)
    assert out.splitlines()[0] == "steady: ok", f"{out}\n{err}\n{daemon.log_tail()}"
    assert json.loads(daemon.ctl("status", "--json").stdout)["faults"] == []


def test_a_tenant_that_faulted_runs_isolated_until_cleared(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd()
    exe = app_binaries["fault"]
    assert run(daemon, shim_path, exe, "fault").stdout == FAULT_OUTPUT  # in the shared pilotd
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n"
    listing = json.loads(daemon.ctl("isolate", "list", "--json").stdout)
    (tenant,) = listing["marked"]
    assert "kernel faulted" in listing["marked"][tenant]["why"] and len(listing["engines"]) == 1
    assert f"of isolated tenant {tenant} sent to" in daemon.log()
    # the mark survives a restart of pilotd
    daemon.proc.send_signal(15)
    daemon.proc.wait(30)
    again = start_pilotd("--state-dir", f"{daemon.dir}/state")
    assert tenant in json.loads(again.ctl("isolate", "list", "--json").stdout)["marked"]
    again.ctl("isolate", "clear", tenant)
    assert run(again, shim_path, exe, "work").stdout == "work: ok\n"
    assert isolated_pids(again) == [] and "sent to" not in again.log()
    assert again.ctl("isolate", "clear", tenant, ok=False).returncode != 0


def test_isolated_tenant_keeps_its_quota_and_its_changes(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config='[isolation]\ntenants = ["all"]\n')
    tenant = json.loads(daemon.ctl("status", "--json").stdout)["you"]["tenant"]
    daemon.ctl("quota", "set", tenant, "1GiB")
    first = run(daemon, shim_path, app_binaries["alloc"], "512M", "1G").stdout.splitlines()
    assert first[:2] == ["malloc 512M: cudaSuccess", "malloc 1G: cudaErrorMemoryAllocation"], first
    assert isolated_pids(daemon), "the program did not run in an isolated pilotd"
    daemon.ctl("quota", "set", tenant, "2GiB")  # the isolated pilotd re-reads it (SIGHUP)
    deadline = time.monotonic() + 10
    while True:
        lines = run(daemon, shim_path, app_binaries["alloc"], "512M", "1G").stdout.splitlines()
        if lines[:2] == ["malloc 512M: cudaSuccess", "malloc 1G: cudaSuccess"]:
            break
        assert time.monotonic() < deadline, (lines, daemon.log_tail())
        time.sleep(0.1)


def test_isolated_sessions_are_listed_and_killed_with_their_tenant(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config='[isolation]\ntenants = ["all"]\n')
    tenant = json.loads(daemon.ctl("status", "--json").stdout)["you"]["tenant"]
    prog = start(daemon, shim_path, app_binaries["fault"], "steady", "60")
    wait_for_session(daemon, prog.pid)  # `pilot sessions` lists it, from the isolated pilotd
    (row,) = [r for r in daemon.sessions() if r["pid"] == prog.pid]
    assert row["isolated"] and row["tenant"] == tenant
    daemon.ctl("kill", "--tenant", tenant)  # ends its isolated pilotd, and so the session
    out, _ = prog.communicate(timeout=30)
    assert out.splitlines()[0] == "steady: cudaErrorDevicesUnavailable", out
    assert isolated_pids(daemon) == []
