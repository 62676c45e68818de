"""CUDA IPC under pilot (tests/apps/ipc.cu; daemon/ops/ipc.py): two processes of one user share
a device allocation and an interprocess event; the exporter frees while the importer still
holds the memory; a process of another user cannot open the handle. The rules themselves, on
pilotd's handlers: tests/unit/test_ipc_handlers.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_apps import check_output

N = 1 << 20
SUM = sum(i % 1000 for i in range(N))
AFTER_CHILD = SUM - sum(i % 1000 for i in range(1024))  # the child zeroed the first 1024 ints

PARENT_FIRST = [
    "parent: a pointer inside the allocation gives its handle: 1",
    "parent: the driver API makes a handle too: 1",
    "parent: a handle of an event without cudaEventInterprocess fails: 1",
    "parent: opening its own handle fails: 1",
]
EXPECTED = [
    *PARENT_FIRST,
    "child: opened twice at one address: 1",
    "child: the driver API opens it at that address too: 1",
    "child: and closes it: 1",
    f"child: read the parent's data: sum {SUM}",
    "child: the range is device memory: 1",
    f"parent: sees the child's writes: sum {AFTER_CHILD}",
    f"child: after the parent's cudaFree it still reads: sum {AFTER_CHILD}",
    "child: cudaFree of the opened memory: cudaErrorInvalidValue",
    "child: closing it a third time: cudaErrorInvalidValue",
    "child: opening a made-up handle fails: 1",
    "parent: child exited 0",
]


def test_two_processes_of_one_user_share_memory_and_an_event(run_under_pilot: Any,
                                                             daemon_log: Any) -> None:
    check_output(run_under_pilot("ipc"), EXPECTED, daemon_log)


def test_the_memory_kept_for_the_importer_is_freed_and_refunded_once_it_lets_go(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    daemon = start_pilotd()
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    proc = subprocess.run([str(app_binaries["ipc"])], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines() == EXPECTED, proc.stdout + proc.stderr
    log = daemon.log()
    assert "kept for the processes that opened it through IPC" in log
    assert "exported through IPC: its last importer let go" in log
    status = daemon.ctl("status", "--json").stdout
    assert '"ipc"' in status and '"kept_bytes": 0' in status, status


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the child as another user")
def test_a_process_of_another_user_cannot_open_the_handle(start_pilotd: Any,
                                                          app_binaries: dict[str, Path],
                                                          shim_path: str) -> None:
    daemon = start_pilotd()
    os.chmod(daemon.dir, 0o755)  # the child, user nobody, reaches the socket
    binary = app_binaries["ipc"]  # the child forks from it and then drops to nobody
    env = {**daemon.env(), "LD_PRELOAD": shim_path}
    proc = subprocess.run([str(binary), "other-user"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.splitlines() == [
        *PARENT_FIRST, "child (another user): opening the handle fails: 1", "parent: child exited 0"], (
        proc.stdout + proc.stderr + daemon.log_tail())
    assert "tenant=user:nobody" in daemon.log() and "cudaIpcOpenMemHandle refused" in daemon.log()
