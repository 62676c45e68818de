"""Kernels preempted at random moments (`[priority] preempt_chaos`, scheduling/preempt.py), end to
end on the sim: vector_add.cu under the shim against a pilotd that runs every session gated, its
kernels as preemptible variants (its first gated launch waits for them, under chaos), and raises
the retreat words at random. A launch runs as up to CHAOS_PARTS parts over a random persistent
grid, so a raise cuts it after its first wave, or before it starts, and a later part runs the
rest once the word is down (and may be cut again). Output must be the native one every time;
pilotd's log at each session's end gives the GPU's tally (the sim's emulation of it), read by
the GPU runs' own tests/gpu/chaos_tallies.py, and some runs must have been cut. ptds.cu too: a
gated session whose stream waits behind its own host callback, which waits for what the
program's other threads do next, must not have those calls held at the priority gate (it
deadlocked until the callback timed out)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from apps_daemons import GPU_DIR, NATIVE, StartPilotd
from test_apps import expected_vector_add
from test_streams_devices import expected_ptds

if NATIVE:
    pytest.skip("needs pilot's sim daemon", allow_module_level=True)

CONFIG = '[daemon]\nlog_level = "info"\n[priority]\npreempt_chaos = "1ms"\n'
MAX_RUNS = 25


def _chaos_tallies() -> ModuleType:
    """tests/gpu/chaos_tallies.py, which reads pilotd's session lines for the GPU runs."""
    spec = importlib.util.spec_from_file_location("chaos_tallies", GPU_DIR / "chaos_tallies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vector_add_is_exact_while_its_kernels_are_cut_at_random(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd(config=CONFIG)
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    want = expected_vector_add()
    read = _chaos_tallies().tallies
    # [sessions, preemptible launches, preemptions, blocks deferred, retreats]
    row = [0, 0, 0, 0, 0]
    for run in range(MAX_RUNS):
        proc = subprocess.run([str(app_binaries["vector_add"])], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.splitlines() == want, (
            f"run {run}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{daemon.log_tail()}")
        row = read([str(daemon.log_path)]).get("vector_add", row)
        if row[2] >= 2:
            break
    assert "raising the retreat words at random" in daemon.log()
    assert row[1] > 0, daemon.log_tail()  # launched as variants
    assert row[2] >= 2, (row, daemon.log_tail())  # cut and resumed
    assert row[3] > 0
    assert row[4] >= row[2]  # each preempted one retreated
    assert daemon.alive()


def test_a_host_callback_that_waits_for_other_threads_does_not_deadlock_the_gate(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    # a deadlock ends the session when its callback times out: after 10 s, not 60
    daemon = start_pilotd(config=CONFIG.replace("[daemon]\n", '[daemon]\ncallback_timeout = "10s"\n'))
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    for program in ("ptds", "ptds_per_thread"):
        proc = subprocess.run([str(app_binaries[program])], env=env, capture_output=True, text=True,
                              timeout=90)
        assert proc.returncode == 0 and proc.stdout.splitlines() == expected_ptds(), (
            f"{program}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{daemon.log_tail()}")
    assert "unanswered" not in daemon.log()


def test_managed_variables_keep_their_kernels_original_under_chaos(
        start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str) -> None:
    """managed.cu: its kernels run as variants (the first gated launch waits for them under
    chaos), but um_counter, which updates __managed__ variables, has none: a variant would
    update the variants' module's own copy (the GPU run of the twenty-first session printed
    `variables FAIL 5 5 40 300`; the sim faults on it)."""
    daemon = start_pilotd(config=CONFIG.replace('"1ms"', '"300us"'))
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    for run in range(2):
        proc = subprocess.run([str(app_binaries["managed"])], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and "FAIL" not in proc.stdout, (
            f"run {run}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{daemon.log_tail()}")
    row = _chaos_tallies().tallies([str(daemon.log_path)]).get("managed", [0] * 5)
    assert row[0] >= 1 and row[1] > 0, (row, daemon.log_tail())  # launched as variants
    assert "context-fatal" not in daemon.log()
