"""Host callbacks, per-thread default streams, launches with attributes and several GPUs
(callbacks.cu, ptds.cu built twice, launch_ex.cu, multidev.cu), under pilot against sim
daemons: the session's daemon (one GPU), and daemons of this module with two GPUs
(`--sim-devices 2`) or one vGPU.

Every expected line is what the programs print natively (they print only results, error names
and yes/no); `PILOT_APPS_NATIVE=1 pytest tests/apps` checks them against real CUDA, where
multidev.cu adapts to the GPUs the machine has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_apps import check_output  # pytest puts tests/apps on sys.path

RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]
DaemonLog = Callable[[], str]
NATIVE = os.environ.get("PILOT_APPS_NATIVE") == "1"
APPS_DIR = Path(__file__).resolve().parent
SIM_KERNELS = (APPS_DIR / "sim_kernels.py", APPS_DIR / "sim_kernels_streams.py",
               APPS_DIR.parent / "gpu" / "sim_kernels.py")
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_DEBUG")}


# ---- daemons of this module ----

class SimDaemon:
    """A sim pilotd with extra options (two GPUs, one vGPU), for this module."""

    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="pilot-sd-")  # short: unix socket paths
        self.socket = os.path.join(self.dir, "pilot.sock")
        self.log_path = Path(self.dir) / "pilotd.log"
        cmd = [sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket", self.socket,
               "--state-dir", os.path.join(self.dir, "state"), "--metrics-address", "", *extra,
               *(arg for path in SIM_KERNELS for arg in ("--sim-kernels", str(path)))]
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=CLEAN_ENV)
        deadline = time.monotonic() + 30
        while "pilotd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"pilotd did not start:\n{self.log()}", pytrace=False)
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def sessions(self) -> list[dict[str, Any]]:
        proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "sessions", "--json"],
                              capture_output=True, text=True,
                              env={**CLEAN_ENV, "PILOT_SOCKET": self.socket}, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[SimDaemon | None]:
    """A daemon presenting two simulated GPUs (None natively: the machine's GPUs are used)."""
    if NATIVE:
        yield None
        return
    daemon = SimDaemon("--sim-devices", "2")
    try:
        yield daemon
    finally:
        daemon.stop()


def _env_of(daemon: SimDaemon | None) -> dict[str, str]:
    return {"PILOT_SOCKET": daemon.socket} if daemon is not None else {}


# ---- callbacks.cu ----

def expected_callbacks() -> list[str]:
    return [
        "order: callbacks saw the kernels before them: yes yes",
        "held: event after the callback cudaErrorNotReady, its stream cudaErrorNotReady",
        "held: another stream meanwhile cudaSuccess, data yes",
        "released: event cudaSuccess, kernel after the callback ran: yes",
        "async copies read pageable memory when queued: small yes, large yes",
        "stream callback: stream yes, status cudaSuccess, data yes",
        "stream callback with flags 1: cudaErrorInvalidValue",
        "legacy and per-thread stream callbacks: 3",
        "callbacks of each stream in order: yes",
        "device synchronize waited for the callback: yes",
        "PASS",
    ]


def test_callbacks(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """Callbacks run in stream order, hold back only their stream, see the work before them,
    and what they write is seen by the copies after them."""
    check_output(run_under_pilot("callbacks"), expected_callbacks(), daemon_log)


def test_callbacks_of_two_programs_at_once(run_under_pilot: RunUnderPilot,
                                          two_gpus: SimDaemon | None) -> None:
    """Two tenants' callbacks at the same time, on a daemon that places them on two GPUs: each
    program's callbacks gate only its own streams."""
    env = _env_of(two_gpus)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(run_under_pilot, "callbacks", env=env) for _ in range(2)]
        for run in runs:
            check_output(run.result(), expected_callbacks(),
                         lambda: two_gpus.log() if two_gpus else "")


@pytest.mark.skipif(NATIVE, reason="pilot only")
def test_client_killed_in_a_callback_leaves_nothing_blocked(
        app_binaries: dict[str, Path], pilot_client_env: dict[str, str]) -> None:
    """A client whose callback never returns, killed while its main thread waits for that
    stream: the daemon opens the gate, releases the session, and its one vGPU serves the next
    tenant (vector_add) as before."""
    daemon = SimDaemon("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1")
    try:
        env = {**pilot_client_env, "PILOT_SOCKET": daemon.socket}
        proc = subprocess.Popen([str(app_binaries["callbacks"]), "hang"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "hanging", daemon.log()
        assert [s["pid"] for s in daemon.sessions()] == [proc.pid]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + 20  # a liveness bound, not a timing assertion
        while daemon.sessions():
            assert time.monotonic() < deadline, f"session not released:\n{daemon.log()}"
            time.sleep(0.05)
        after = subprocess.run([str(app_binaries["vector_add"])], env=env, capture_output=True,
                               text=True, timeout=120)
        assert after.returncode == 0 and after.stdout.splitlines()[-1] == "PASS", \
            after.stdout + after.stderr + daemon.log()
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()


# ---- ptds.cu ----

def expected_ptds() -> list[str]:
    """Each thread: n ints (500, or 50000 to take the staged path), host[i] = i % 97 + t,
    through two `mix` launches (x3 then x2, + the thread's __device__ slot 10(t+1) + i), then
    8 rows of 16 of the result with columns 0-3 and 12-15 cleared by 2D memsets."""
    lines = []
    for t in range(4):
        n = 50000 if t % 2 else 500
        slot = 10 * (t + 1)
        i = np.arange(n, dtype=np.int64)
        back = ((i % 97 + t) * 3 + slot + i) * 2 + slot + i
        grid = back[:128].reshape(8, 16).copy()
        grid[:, :4] = grid[:, 12:] = 0
        lines.append(f"thread {t}: ok checksum {int(grid.sum() + back.sum())}")
    return [*lines,
            "callbacks on default streams: 4",
            "default stream: flags 0 priority 0 device 0",
            "another thread's default stream while one is held: cudaSuccess",
            "legacy stream behind a held per-thread stream: cudaErrorNotReady",
            "after the release: cudaSuccess",
            "per-thread stream behind a held legacy stream: cudaErrorNotReady",
            "PASS"]


def test_expected_ptds_match_native_h100_values() -> None:
    assert expected_ptds()[:2] == ["thread 0: ok checksum 558744", "thread 1: ok checksum 3767649468"]


@pytest.mark.parametrize("program", ["ptds", "ptds_per_thread"])
def test_per_thread_default_streams(program: str, run_under_pilot: RunUnderPilot,
                                    daemon_log: DaemonLog) -> None:
    """cudaStreamPerThread named explicitly, and stream 0 in a `-default-stream per-thread`
    build: the same behaviour, the same output."""
    check_output(run_under_pilot(program), expected_ptds(), daemon_log)


def test_per_thread_build_calls_the_ptsz_entry_points(app_binaries: dict[str, Path]) -> None:
    """What `-default-stream per-thread` makes a program call (and the plain build does not)."""
    def imports(prog: str) -> set[str]:
        nm = subprocess.run(["nm", "-D", "--undefined-only", str(app_binaries[prog])],
                            capture_output=True, text=True, check=True)
        return {line.split()[-1].split("@")[0] for line in nm.stdout.splitlines() if line.strip()}

    per_thread, plain = imports("ptds_per_thread"), imports("ptds")
    want = {"__cudaLaunchKernel_ptsz", "cudaLaunchKernel_ptsz", "cudaMemcpy_ptds", "cudaMemset_ptds",
            "cudaMemcpy2D_ptds", "cudaMemset2D_ptds", "cudaMemcpyToSymbol_ptds",
            "cudaMemcpyFromSymbol_ptds", "cudaMemcpyAsync_ptsz", "cudaMemsetAsync_ptsz",
            "cudaMemcpy2DAsync_ptsz", "cudaMemset2DAsync_ptsz", "cudaMemcpyFromSymbolAsync_ptsz",
            "cudaStreamSynchronize_ptsz", "cudaStreamQuery_ptsz", "cudaStreamWaitEvent_ptsz",
            "cudaEventRecord_ptsz", "cudaLaunchHostFunc_ptsz", "cudaStreamGetFlags_ptsz",
            "cudaStreamGetPriority_ptsz", "cudaStreamGetDevice_ptsz"}
    assert want <= per_thread, sorted(want - per_thread)
    assert not {s for s in plain if s.endswith(("_ptsz", "_ptds"))}


# ---- launch_ex.cu ----

def expected_launch_ex() -> list[str]:
    return [
        "cooperative launch supported: yes",
        "cooperative launch: cudaSuccess, grid barrier held: yes",
        "cudaLaunchKernelEx cooperative: cudaSuccess, grid barrier held: yes",
        "cooperative grid of 1000000 blocks: cudaErrorCooperativeLaunchTooLarge",
        "last error: cudaErrorCooperativeLaunchTooLarge, then cudaSuccess",
        "clusters of 2: cudaSuccess, every block ran: yes",
        "clusters of 2 over 63 blocks refused: yes",
        "clusters of 16 without opting in refused: yes",
        "launch with priority: cudaSuccess, ran: yes",
        "programmatic dependent launch: cudaSuccess, ran: yes",
        "access policy window and sync domain: cudaSuccess, ran: yes",
        "PASS",
    ]


def test_launch_with_attributes(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("launch_ex"), expected_launch_ex(), daemon_log)


UNSUPPORTED_LAUNCH_LINES = [
    "launch completion event: cudaErrorNotSupported (last cudaErrorNotSupported)",
    "hit ratio 2: cudaErrorInvalidValue (last cudaErrorInvalidValue)",
    "next launch: yes", "PASS"]


@pytest.mark.skipif(NATIVE, reason="pilot only: CUDA itself supports the attribute")
def test_unsupported_launch_attribute_is_refused(run_under_pilot: RunUnderPilot,
                                                 daemon_log: DaemonLog) -> None:
    proc = run_under_pilot("launch_ex", "unsupported")
    check_output(proc, UNSUPPORTED_LAUNCH_LINES, daemon_log)
    assert "cudaLaunchAttributeLaunchCompletionEvent (12) is not supported" in proc.stderr


def test_gpu_compare_expects_what_the_unsupported_case_prints() -> None:
    """tests/gpu/run_compare.sh checks `launch_ex unsupported` on the GPU against its own copy
    of these lines (it runs without pytest); a stale copy failed there once."""
    script = (Path(__file__).resolve().parents[1] / "gpu" / "run_compare.sh").read_text()
    found = re.search(r'pilot_only launch_ex unsupported "([^"]*)"', script)
    assert found, "run_compare.sh no longer checks `launch_ex unsupported`"
    assert found.group(1).split("\n") == UNSUPPORTED_LAUNCH_LINES


# ---- multidev.cu ----

def expected_multidev(count: int) -> list[str]:
    if count < 2:
        return ["two or more devices: no",
                f"set device {count}: cudaErrorInvalidDevice",
                "current device 0, stream device 0",
                "can access peer 0 -> 0: 0",
                "enable peer access to itself: cudaErrorPeerAccessUnsupported",
                "peer copy within device 0: yes",
                "one device: multi-device checks skipped",
                "PASS"]
    return ["two or more devices: yes",
            "thread on device 0: ok",
            "thread on device 1: ok",
            "main thread's device is still 0",
            "device 1 properties: yes",
            f"set device {count}: cudaErrorInvalidDevice",
            f"properties of device {count}: cudaErrorInvalidDevice",
            "can access peer: 0 -> 1 1, 1 -> 0 1, 0 -> 0 0",
            "copies between devices: peer yes, default yes, device-to-device yes",
            f"peer copy to device {count}: cudaErrorInvalidDevice",
            "stream of device 1 after an event of device 0: yes",
            "launch on another device's stream: cudaSuccess, ran on its device: yes",
            "event of device 0 recorded on a stream of device 1 fails: yes",
            "elapsed time between devices' events fails: yes",
            "queries of another device's stream and event: cudaSuccess cudaSuccess",
            "__device__ variable per device: 12 21",
            "enable peer access 0 -> 1: cudaSuccess",
            "again: cudaErrorPeerAccessAlreadyEnabled",
            "kernel of device 0 read device 1's memory: yes",
            "disable: cudaSuccess",
            "disable again: cudaErrorPeerAccessNotEnabled",
            "enable peer access to itself: cudaErrorPeerAccessUnsupported",
            "PASS"]


def _device_count(proc: subprocess.CompletedProcess[str], default: int) -> int:
    """Natively, the machine's GPU count, from the `set device N` line the program prints."""
    if not NATIVE:
        return default
    for line in proc.stdout.splitlines():
        if line.startswith("set device "):
            return int(line.split()[2].rstrip(":"))
    return default


def test_one_gpu(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """On a one-GPU daemon the program sees one device and says what it skipped."""
    proc = run_under_pilot("multidev")
    check_output(proc, expected_multidev(_device_count(proc, 1)), daemon_log)


def test_two_gpus(run_under_pilot: RunUnderPilot, two_gpus: SimDaemon | None) -> None:
    """Two threads on two devices, memory, streams, events and variables per device, peer
    copies and access, and CUDA's errors for mixing devices."""
    proc = run_under_pilot("multidev", env=_env_of(two_gpus))
    check_output(proc, expected_multidev(_device_count(proc, 2)),
                 lambda: two_gpus.log() if two_gpus else "")
