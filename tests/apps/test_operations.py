"""The operator's path against a running daemon: pilotctl round-trips every command, a quota is
enforced on a live CUDA program (and survives a daemon restart), kill ends a session, drain
turns new sessions away. Programs are real nvcc builds run under the shim (sim backend)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

APPS_DIR = Path(__file__).resolve().parent
MiB = 1 << 20

pytestmark = pytest.mark.skipif(os.environ.get("PILOT_APPS_NATIVE") == "1", reason="pilot only")


class OpsDaemon:
    def __init__(self, state_dir: Path, *extra: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pilot-ops-"))  # short: socket paths
        self.socket = str(self.dir / "pilot.sock")
        self.log_path = self.dir / "pilotd.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket", self.socket,
                 "--state-dir", str(state_dir), "--metrics-address", "",
                 "--sim-kernels", str(APPS_DIR / "sim_kernels.py"), *extra],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "pilotd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"pilotd did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PILOT", "LD_PRELOAD"))}
        return {**env, "PILOT_SOCKET": self.socket}

    def ctl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", *args], env=self.env(),
                             capture_output=True, text=True, timeout=30)
        if ok:
            assert out.returncode == 0, f"pilotctl {' '.join(args)}: {out.stderr}"
        return out

    def run(self, exe: Path, *args: str, shim: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), *args], env={**self.env(), "LD_PRELOAD": shim},
                              capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[OpsDaemon]:
    d = OpsDaemon(tmp_path / "state")
    try:
        yield d
    finally:
        d.stop()


def test_status_and_sessions_round_trip(ops: OpsDaemon) -> None:
    doc = json.loads(ops.ctl("status", "--json").stdout)
    assert doc["backend"] == "sim" and doc["sessions"] == 0
    assert [g["index"] for g in doc["gpus"]] == [0] and doc["gpus"][0]["capacity"] > 0
    assert doc["you"]["admin"] is True  # the tests run as root
    assert json.loads(ops.ctl("sessions", "--json").stdout) == []
    human = ops.ctl("status").stdout
    assert "GPU 0: capacity" in human
    sched = doc["scheduling"]  # the policy in force and every name known, implemented or planned
    assert sched["name"] == "none" and sched["max_wait_s"] == 30
    assert {n for n, p in sched["available"].items() if p["implemented"]} >= {"none"}
    assert {n for n, p in sched["available"].items() if p["implemented"]} >= {"mfit", "amfit", "madvise",
                                                                               "salus"}
    assert "policy none" in human and "planned: " not in human
    assert "policies available: amfit, madvise, mfit, none, salus" in human


def test_quota_is_enforced_on_a_live_program_and_survives_restart(
        ops: OpsDaemon, app_binaries: dict[str, Path], shim_path: str, tmp_path: Path) -> None:
    me = "user:" + __import__("pwd").getpwuid(os.getuid()).pw_name
    out = ops.ctl("quota", "set", me, "3MiB", "--gpu", "0").stdout
    assert "hard 3 MiB" in out
    run = ops.run(app_binaries["alloc"], "1M", "4M", "1M", "2M", shim=shim_path)
    lines = run.stdout.splitlines()
    assert lines[:4] == ["malloc 1M: cudaSuccess", "malloc 4M: cudaErrorMemoryAllocation",
                         "malloc 1M: cudaSuccess", "malloc 2M: cudaErrorMemoryAllocation"], run.stdout
    # cudaMemGetInfo shows the tenant's quota as the device's size, and what is left of it.
    assert lines[5] == f"meminfo: cudaSuccess free {1 * MiB} total {3 * MiB}", run.stdout
    assert lines[6] == "copy after: ok"  # a refused allocation breaks nothing else
    assert "quota: " + me in ops.log() and "refused" in ops.log()
    got = json.loads(ops.ctl("quota", "get", me, "--json").stdout)
    assert got["gpus"]["0"]["hard"] == 3 * MiB and got["gpus"]["0"]["used"] == 0  # program ended

    # Persisted: a new daemon on the same state directory enforces it too.
    ops.stop()
    again = OpsDaemon(tmp_path / "state")
    try:
        listing = json.loads(again.ctl("quota", "list", "--json").stdout)
        assert listing[me]["0"]["hard"] == 3 * MiB
        run = again.run(app_binaries["alloc"], "4M", shim=shim_path)
        assert run.stdout.splitlines()[0] == "malloc 4M: cudaErrorMemoryAllocation"
        again.ctl("quota", "unset", me)
        run = again.run(app_binaries["alloc"], "4M", shim=shim_path)
        assert run.stdout.splitlines()[0] == "malloc 4M: cudaSuccess"
    finally:
        again.stop()


def test_quota_change_applies_to_a_running_session(
        ops: OpsDaemon, app_binaries: dict[str, Path], shim_path: str) -> None:
    me = "user:" + __import__("pwd").getpwuid(os.getuid()).pw_name
    proc = subprocess.Popen([str(app_binaries["errors"]), "killed_mid_copy"],
                            env={**ops.env(), "LD_PRELOAD": shim_path}, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "copying"
        # The running program holds 256 MiB; a quota below that refuses its next allocation
        # (seen in the ledger) without touching what it has.
        ops.ctl("quota", "set", me, "100MiB")
        got = json.loads(ops.ctl("quota", "get", me, "--json").stdout)
        assert got["gpus"]["0"]["used"] == 256 * MiB
        run = ops.run(app_binaries["alloc"], "1M", shim=shim_path)
        assert run.stdout.splitlines()[0] == "malloc 1M: cudaErrorMemoryAllocation"
        assert proc.poll() is None  # the running program is unaffected
    finally:
        proc.kill()
        proc.wait()


def test_kill_ends_a_session_and_its_program_gets_errors(
        ops: OpsDaemon, app_binaries: dict[str, Path], shim_path: str) -> None:
    proc = subprocess.Popen([str(app_binaries["errors"]), "killed_mid_copy"],
                            env={**ops.env(), "LD_PRELOAD": shim_path}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "copying"
        rows = json.loads(ops.ctl("sessions", "--json").stdout)
        (mine,) = [r for r in rows if r["pid"] == proc.pid]
        assert mine["device_bytes"] >= 256 * MiB and mine["tenant"].startswith("user:")
        assert "ended" in ops.ctl("kill", str(mine["session"])).stdout
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 1 and "lost connection to pilotd" in err, err
        assert json.loads(ops.ctl("sessions", "--json").stdout) == []
        failed = ops.ctl("kill", str(mine["session"]), ok=False)
        assert failed.returncode == 1 and f"no session {mine['session']}" in failed.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_drain_turns_new_sessions_away(ops: OpsDaemon, app_binaries: dict[str, Path],
                                       shim_path: str) -> None:
    ops.ctl("drain", "0")
    assert json.loads(ops.ctl("status", "--json").stdout)["gpus"][0]["draining"] is True
    run = ops.run(app_binaries["alloc"], "1M", shim=shim_path)
    assert run.stdout.splitlines()[0] != "malloc 1M: cudaSuccess"
    assert "refused the session" in run.stderr
    ops.ctl("undrain", "0")
    run = ops.run(app_binaries["alloc"], "1M", shim=shim_path)
    assert run.stdout.splitlines()[0] == "malloc 1M: cudaSuccess"


def test_errors_are_one_line_and_exit_1(ops: OpsDaemon) -> None:
    out = ops.ctl("quota", "set", "no-such-tenant-xyz", "1GiB", ok=False)
    assert out.returncode == 1 and out.stderr.strip().count("\n") == 0
    assert "unknown tenant" in out.stderr
    out = ops.ctl("quota", "set", "root", "lots", ok=False)
    assert out.returncode == 1 and "lots" in out.stderr
    # at most what a GPU can grant (issue 15: size bounds)
    out = ops.ctl("quota", "set", "root", "100TiB", "--gpu", "0", ok=False)
    assert out.returncode == 1 and "more than GPU 0 can grant" in out.stderr, out.stderr
    out = ops.ctl("quota", "set", "root", "1GiB", "--provisioned", "100TiB", ok=False)
    assert out.returncode == 1 and "provisioned limit" in out.stderr and "any GPU" in out.stderr
    out = ops.ctl("drain", "7", ok=False)
    assert out.returncode == 1 and "no GPU 7" in out.stderr
    gone = subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "--control-socket",
                           "/nonexistent/control.sock", "status"], capture_output=True, text=True)
    assert gone.returncode == 1 and "is pilotd running" in gone.stderr
