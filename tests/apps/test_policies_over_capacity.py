"""The capacity enforcer and the memory policies end to end on the sim backend: PILOT's pageDoS
and a streaming Unified Memory program (bench/uvm, real nvcc builds under the shim) whose
managed memory together exceeds the capacity C both finish with correct results under each
policy, and what the sim backend measures resident on its GPU (it tracks every 2 MiB page a
launch, copy or prefetch brings in) never exceeds the room C leaves for managed memory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from apps_daemons import OwnDaemon

MiB = 1 << 20
C = 64 * MiB
CONFIG = """
[policy.mfit]
preempt_after = "200ms"
[policy.amfit]
resume_after = "300ms"
[policy.madvise]
budget = "24MiB"
recheck = "20ms"
"""


def _residency(daemon: OwnDaemon) -> dict[str, Any]:
    doc = json.loads(daemon.ctl("status", "--json").stdout)
    res = doc["gpus"][0]["residency"]
    assert res is not None, doc["gpus"][0]
    return res


class Sampler(threading.Thread):
    """Reads the daemon's residency every 20 ms while the programs run."""

    def __init__(self, daemon: OwnDaemon) -> None:
        super().__init__(daemon=True)
        self.daemon_ = daemon
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(_residency(self.daemon_))
            time.sleep(0.02)


def _run_pair(daemon: OwnDaemon, shim: str, binaries: dict[str, Path],
              commands: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    env = {**daemon.env(), "LD_PRELOAD": shim}
    procs = [subprocess.Popen([str(binaries[c[0]]), *c[1:]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    out = []
    for c, p in zip(commands, procs, strict=True):
        try:
            stdout, stderr = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            pytest.fail(f"{c[0]} did not finish\n{stderr}\npilotd log:\n{daemon.log_tail()}",
                        pytrace=False)
        out.append(subprocess.CompletedProcess(c, p.returncode, stdout, stderr))
    return out


def _run_beside_pagedos(daemon: OwnDaemon, shim: str, binaries: dict[str, Path], dos: list[str],
                        program: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """pageDoS until it has its memory ("uvm ready"), then the program to its end while pageDoS
    goes on, then pageDoS is told to stop (SIGTERM: it finishes its pass, checks, exits 0)."""
    env = {**daemon.env(), "LD_PRELOAD": shim}
    hog = subprocess.Popen([str(binaries[dos[0]]), *dos[1:]], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None
        ready = hog.stdout.readline()
        assert ready.strip() == "uvm ready", (ready, hog.poll(), daemon.log_tail())
        [done] = _run_pair(daemon, shim, binaries, [program])
    finally:
        hog.send_signal(signal.SIGTERM)
        out, err = hog.communicate(timeout=60)
    return [subprocess.CompletedProcess(dos, hog.returncode, ready + out, err), done]


@pytest.mark.parametrize("policy", ["none", "mfit", "amfit", "madvise"])
def test_two_programs_over_capacity_finish_within_it(
        policy: str, start_pilotd: Callable[..., OwnDaemon], app_binaries: dict[str, Path],
        shim_path: str) -> None:
    daemon = start_pilotd("--enforce-capacity", "--capacity", f"{C}B", "--policy", policy,
                          config=CONFIG)
    sampler = Sampler(daemon)
    sampler.start()
    try:
        # 48 MiB of pageDoS in 16 MiB pieces, and while it runs 36 MiB of stream: 84 MiB > C
        results = _run_beside_pagedos(daemon, shim_path, app_binaries,
                                      ["pagedos", "--bytes", "48MiB", "--chunk", "16MiB", "--seconds", "60"],
                                      ["uvm_stream", "--bytes", "36MiB", "--passes", "6"])
    finally:
        sampler.stop.set()
        sampler.join()
    for r in results:
        assert r.returncode == 0 and " ok=1" in r.stdout, (
            f"{r.args[0]} rc {r.returncode}\n{r.stdout}\n{r.stderr}\npilotd log:\n{daemon.log_tail()}")
    final = _residency(daemon)
    samples = [*sampler.samples, final]
    assert final["enforced"] and final["capacity"] == C
    room = final["room"]
    assert 0 < room <= C
    # what the sim measured on its GPU (every page a launch, copy or prefetch brought in)
    measured_peak = final["measured"]["peak_resident"]
    assert 40 * MiB <= measured_peak <= room, (measured_peak, room, final, daemon.log_tail())
    # pilot's own model agrees it stayed within the room
    assert final["peak_resident"] <= room
    assert max(s["resident"] for s in samples) <= room
    # the enforcer had to act: 84 MiB cannot all be resident in 64 MiB
    assert final["evicted_bytes"] + final["advised_bytes"] > 0, final
    if policy == "madvise":  # pressure: someone's memory beyond its budget was kept on the host
        assert final["advised_bytes"] > 0, final
    # everything given back at exit
    assert final["movable"] == 0 and final["resident"] == 0


def test_without_enforcement_managed_memory_counts_against_capacity(
        start_pilotd: Callable[..., OwnDaemon], app_binaries: dict[str, Path], shim_path: str) -> None:
    """The default: no enforcer, and managed memory beyond the capacity is refused as before."""
    daemon = start_pilotd("--capacity", f"{C}B")
    [r] = _run_pair(daemon, shim_path, app_binaries, [["pagedos", "--bytes", "80MiB", "--passes", "1"]])
    assert r.returncode != 0 and "cudaErrorMemoryAllocation" in r.stderr, (r.stdout, r.stderr)
    doc = json.loads(daemon.ctl("status", "--json").stdout)
    assert doc["gpus"][0]["residency"] is None


def test_managed_device_memory_serves_cudamalloc_movably(
        start_pilotd: Callable[..., OwnDaemon], run_under_pilot: Any,
        app_binaries: dict[str, Path], shim_path: str) -> None:
    """`--managed-device-memory`: cudaMalloc'd memory is movable (tracked, and beyond the
    capacity when enforced) while the program still sees device memory and gets correct results."""
    daemon = start_pilotd("--enforce-capacity", "--managed-device-memory", "--capacity", f"{C}B")
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    proc = subprocess.run([str(app_binaries["vector_add"])], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout or "ok" in proc.stdout.lower(), proc.stdout
    final = _residency(daemon)
    assert final["peak_resident"] > 0 and final["movable"] == 0, final
    # freed without a memset (the driver zeroes managed pages it populates): nothing was brought
    # onto the GPU past the model, and nothing stays there once the program is gone
    assert final["measured"]["resident"] == 0, final
    assert final["measured"]["peak_resident"] <= final["peak_resident"], final
