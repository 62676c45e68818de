"""pilotd's own MPS control daemon ([isolation] mps, router/mps.py), without a GPU: a stand-in
`nvidia-cuda-mps-control` (fake_mps_control.py, first on pilotd's PATH) records how it is run.
Checked: it is started once, with pipe and log directories private to pilotd's state directory;
pilotd and its engines get the two variables CUDA reads at cuInit; sessions show whether they are
confined; it is kept over a restart in place after a fault and quit at pilotd's exit; a tenant
whose kernel faulted under MPS (the MPS server's log, written here by the test) runs without MPS
from then on; a missing
program, one that fails and a control daemon that dies stop pilotd's start with a clear error.
That the driver then really gives each engine its own address space is tests/gpu/confine_check.py's
part, on the GPU."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from apps_daemons import OwnDaemon, StartPilotd  # pytest puts tests/apps on sys.path

FAKE = Path(__file__).resolve().parent / "fake_mps_control.py"
CONFINED = '[isolation]\ntenants = "all"\nmps = true\n'
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


class FakeMps:
    """The stand-in on PATH and what it recorded."""

    def __init__(self, directory: Path) -> None:
        self.record = directory / "record.jsonl"
        program = directory / "bin" / "nvidia-cuda-mps-control"
        program.parent.mkdir()
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
        program.chmod(0o755)
        self.bin = program.parent

    def runs(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def starts(self) -> list[dict[str, Any]]:
        return [r for r in self.runs() if r["argv"] == ["-d"] and "event" not in r]

    def commands(self) -> list[str]:
        return [r["command"] for r in self.runs() if r.get("event") == "command"]

    def daemon_pids(self) -> list[int]:
        return [r["pid"] for r in self.runs() if r.get("event") == "daemon up"]


@pytest.fixture
def fake_mps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeMps:
    fake = FakeMps(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(fake.record))
    for name in (PIPE_ENV, LOG_ENV, "FAKE_MPS_DIES", "FAKE_MPS_START_FAILS"):
        monkeypatch.delenv(name, raising=False)
    return fake


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)


def wait_for(what: Callable[[], bool], message: Callable[[], str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, message()
        time.sleep(0.02)


def quit_once(fake: FakeMps, control_pid: int) -> None:
    """pilotd's exit has the control daemon quit (a detached helper, once pilotd is gone)."""
    wait_for(lambda: "quit" in fake.commands() and not running(control_pid),
             lambda: f"the control daemon was not quit: {fake.runs()}")
    assert fake.commands().count("quit") == 1


def run(daemon: OwnDaemon, shim: str, exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], env={**daemon.env(), "LD_PRELOAD": shim},
                          capture_output=True, text=True, timeout=60)


def status(daemon: OwnDaemon) -> dict[str, Any]:
    doc = json.loads(daemon.ctl("status", "--json").stdout)
    assert isinstance(doc, dict)
    return doc


def test_confined_mode_runs_engines_as_clients_of_a_private_mps(
        start_pilotd: StartPilotd, fake_mps: FakeMps, app_binaries: dict[str, Path],
        shim_path: str) -> None:
    daemon = start_pilotd(config=CONFINED)
    state = Path(daemon.dir) / "state"
    pipe, logs = state / "mps" / "pipe", state / "mps" / "log"
    (started,) = fake_mps.starts()
    assert (started["pipe"], started["log"]) == (str(pipe), str(logs))
    for d in (state / "mps", pipe, logs):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    (control_pid,) = fake_mps.daemon_pids()
    assert running(control_pid)
    iso = status(daemon)["isolation"]
    assert iso["confined"] and iso["mps"]
    assert iso["mps_control"]["control_pid"] == control_pid
    assert iso["mps_control"]["pipe_dir"] == str(pipe)
    assert "confined" in daemon.ctl("status").stdout

    steady = subprocess.Popen([str(app_binaries["fault"]), "steady", "30"],
                              env={**daemon.env(), "LD_PRELOAD": shim_path},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(r["pid"] == steady.pid and r["calls"] > 5 for r in daemon.sessions()),
                 lambda: f"no session of pid {steady.pid}\n{daemon.log_tail()}")
        (row,) = [r for r in daemon.sessions() if r["pid"] == steady.pid]
        assert row["isolated"] and row["confinement"] == "confined", row
        ctl_rows = json.loads(daemon.ctl("sessions", "--json").stdout)
        assert [r["confinement"] for r in ctl_rows if r["pid"] == steady.pid] == ["confined"]
        assert "confined" in daemon.ctl("sessions").stdout
        (engine,) = json.loads(daemon.ctl("isolate", "list", "--json").stdout)["engines"]
        assert engine["confinement"] == "confined"
        env = environ_of(engine["pid"])  # what CUDA reads at the engine's cuInit
        assert (env.get(PIPE_ENV), env.get(LOG_ENV)) == (str(pipe), str(logs))
    finally:
        steady.kill()
        steady.wait()

    assert daemon.stop() == 0, daemon.log_tail()
    quit_once(fake_mps, control_pid)
    assert len(fake_mps.starts()) == 1


def test_restart_in_place_keeps_the_control_daemon(
        start_pilotd: StartPilotd, fake_mps: FakeMps, app_binaries: dict[str, Path],
        shim_path: str) -> None:
    """The shared pilotd is an MPS client too; its restart after a fault (an exec, same pid)
    keeps the one control daemon, and the new process has the variables from its start."""
    daemon = start_pilotd(config="[isolation]\nafter_fault = false\nmps = true\n")
    exe = app_binaries["fault"]
    (control_pid,) = fake_mps.daemon_pids()
    assert run(daemon, shim_path, exe, "fault").returncode == 0
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n", daemon.log_tail()
    assert "recovered from the GPU 0 fault" in daemon.log()
    assert "kept across the restart" in daemon.log(), daemon.log_tail()
    assert len(fake_mps.starts()) == 1 and running(control_pid)
    assert "quit" not in fake_mps.commands()
    env = environ_of(daemon.proc.pid)  # the environment of the exec: the restarted pilotd's
    assert env.get(PIPE_ENV) == str(Path(daemon.dir) / "state" / "mps" / "pipe")
    rows = daemon.sessions()
    assert all(r["confinement"] == "shared" for r in rows), rows
    assert status(daemon)["isolation"]["confined"] is False  # mps without tenants = "all"
    assert daemon.stop() == 0
    quit_once(fake_mps, control_pid)


def test_a_tenant_whose_kernel_faulted_under_mps_leaves_mps(
        start_pilotd: StartPilotd, fake_mps: FakeMps, app_binaries: dict[str, Path],
        shim_path: str) -> None:
    """The MPS server's log names the faulting client (here pilotd itself: the stand-in has no
    server, so the test writes the line): its tenant is marked to run without MPS, and its next
    program runs in an engine outside MPS (an empty pipe directory, no log directory)."""
    daemon = start_pilotd(config="[isolation]\nmps = true\n")
    state = Path(daemon.dir) / "state"
    (control_pid,) = fake_mps.daemon_pids()
    with (state / "mps" / "log" / "server.log").open("a") as f:  # as the MPS server at the fault
        f.write(f"[fake] Client {{PID: {daemon.proc.pid}, Context: 1}} encountered a fatal GPU error.\n")
    exe = app_binaries["fault"]
    assert run(daemon, shim_path, exe, "fault").returncode == 0
    assert run(daemon, shim_path, exe, "work").stdout == "work: ok\n", daemon.log_tail()
    assert f"the fault was this process's (pid {daemon.proc.pid} in the MPS server's log)" in daemon.log()
    listing = json.loads(daemon.ctl("isolate", "list", "--json").stdout)
    (tenant,) = listing["marked"]
    assert listing["marked"][tenant]["mps"] is False, listing
    (engine,) = listing["engines"]
    assert engine["confinement"] == "engine"
    assert "isolated without MPS" in daemon.ctl("isolate", "list").stdout
    env = environ_of(engine["pid"])
    assert env.get(PIPE_ENV) == str(state / "mps" / "none") and LOG_ENV not in env
    assert "--without-mps" in Path(f"/proc/{engine['pid']}/cmdline").read_text().split("\0")
    assert daemon.stop() == 0, daemon.log_tail()
    quit_once(fake_mps, control_pid)


def test_a_control_daemon_left_behind_is_kept_not_doubled(
        start_pilotd: StartPilotd, fake_mps: FakeMps) -> None:
    """A pilotd killed without its exit leaves its control daemon: the next one of the same
    state directory keeps it (the directory is pilotd's alone) instead of starting a second."""
    first = start_pilotd(config=CONFINED)
    (control_pid,) = fake_mps.daemon_pids()
    first.proc.kill()
    first.proc.wait()
    again = start_pilotd("--state-dir", f"{first.dir}/state", config=CONFINED)
    assert "left by an earlier pilotd: kept" in again.log(), again.log_tail()
    assert len(fake_mps.starts()) == 1 and running(control_pid)
    assert again.stop() == 0
    quit_once(fake_mps, control_pid)


def start_fails(config: str, *args: str) -> subprocess.CompletedProcess[str]:
    """pilotd with this config: it must not start; its exit status and output."""
    workdir = tempfile.mkdtemp(prefix="pilot-mps-")
    path = Path(workdir) / "pilotd.toml"
    path.write_text(config)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", PIPE_ENV, LOG_ENV)}
    command = [sys.executable, "-m", "pilot.daemon", "--config", str(path), "--backend", "sim",
               "--socket", f"{workdir}/pilot.sock", "--state-dir", f"{workdir}/state",
               "--metrics-address", "", *args]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "pilotd ready" not in proc.stdout + proc.stderr, proc
    return proc


@pytest.mark.parametrize("case, expected", [
    ("missing", "was not found"),
    ("start fails", "failed (rc 1): An instance of this daemon is already running"),
    ("dies", "exited right after it started; [fake] Control"),
])
def test_no_mps_no_start(fake_mps: FakeMps, monkeypatch: pytest.MonkeyPatch, case: str,
                         expected: str) -> None:
    """Confinement asked and not to be had: pilotd says why and does not start (never runs
    unconfined); nothing is left running."""
    config = CONFINED
    if case == "missing":
        config += 'mps_control = "nvidia-cuda-mps-control-absent"\n'
    else:
        monkeypatch.setenv("FAKE_MPS_START_FAILS" if case == "start fails" else "FAKE_MPS_DIES", "1")
    proc = start_fails(config)
    assert expected in proc.stderr, proc.stderr
    assert "[isolation] mps" in proc.stderr
    assert not any(running(pid) for pid in fake_mps.daemon_pids())


def test_an_engine_without_the_mps_environment_refuses_to_start(fake_mps: FakeMps) -> None:
    proc = start_fails(CONFINED, "--isolated-tenant", "user:x")
    assert "has no CUDA_MPS_PIPE_DIRECTORY" in proc.stderr, proc.stderr
    assert fake_mps.runs() == []  # an engine never starts a control daemon of its own
