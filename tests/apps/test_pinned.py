"""Pinned and mapped host memory through pilot: tests/apps/pinned.cu under the sim daemon.

Each scenario checks itself and prints "<scenario> ok" after the lines below, which are what the
program prints natively too (tests/gpu/run_compare.sh compares them on the H100). The sim gives
registered memory a device pointer other than its host address, as the lab H100 reports
(cudaDevAttrCanUseHostPointerForRegisteredMem 0), so both kinds of device pointer are exercised.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scenario_output import check_output

RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]
LINES = {
    "malloc_host": [],
    "mapped": ["mapped devptr_is_hostptr=1", "mapped flags_mapped=1 flags_wc=0",
               "mapped wc_flags_portable=1 flags_wc=1"],
    "registered": ["registered again=cudaErrorHostMemoryAlreadyRegistered",
                   "registered unregister_again=cudaErrorHostMemoryNotRegistered",
                   "registered after type=0"],
    "registered_large": [],
    "moving": [],
    "forked": [],
    "errors": ["errors freehost_plain=cudaErrorInvalidValue",
               "errors freehost_twice=cudaErrorInvalidValue",
               "errors devptr_plain=cudaErrorInvalidValue",
               "errors flags_plain=cudaErrorInvalidValue",
               "errors unregister_plain=cudaErrorHostMemoryNotRegistered",
               "errors freehost_null=cudaSuccess"],
    "crowded": [],
}


def expected(scenario: str) -> list[str]:
    return [*LINES[scenario], f"{scenario} ok"]


@pytest.mark.parametrize("scenario", list(LINES))
def test_scenario(scenario: str, run_under_pilot: RunUnderPilot, daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("pinned", scenario), expected(scenario), daemon_log)


def test_all_scenarios_in_one_process(run_under_pilot: RunUnderPilot,
                                      daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("pinned"), [line for s in LINES for line in expected(s)], daemon_log)


def test_crowded_address_space_falls_back_to_another_address(
        run_under_pilot: RunUnderPilot, daemon_log: Callable[[], str]) -> None:
    """The device pointers the daemon offers after a freed range are all taken in the program
    (it maps 256 MiB there): cudaHostAlloc maps the range elsewhere instead of failing, says so
    once, and copies and kernels through cudaHostGetDevicePointer's pointer work."""
    proc = run_under_pilot("pinned", "crowded")
    check_output(proc, expected("crowded"), daemon_log)
    assert proc.stderr.count("device pointers offered were all taken") == 1, proc.stderr


def _mine(pilot_sessions: Callable[[], list[dict[str, Any]]], pid: int) -> list[dict[str, Any]]:
    return [s for s in pilot_sessions() if s["pid"] == pid]


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_accounting_and_release(ending: str, app_binaries: dict[str, Path],
                                pilot_client_env: dict[str, str],
                                pilot_sessions: Callable[[], list[dict[str, Any]]]) -> None:
    """The session reports its pinned bytes and the copies that went by DMA from them; they go
    when the program frees them, and when it dies holding them."""
    proc = subprocess.Popen([str(app_binaries["pinned"]), "hold"], env=pilot_client_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "hold ready"
        [mine] = _mine(pilot_sessions, proc.pid)
        assert mine["pinned_bytes"] == 8 << 20
        [rng] = mine["pinned"]
        assert rng["kind"] == "alloc" and rng["bytes"] == 8 << 20
        assert rng["copies"] == 1 and rng["copied_bytes"] == 8 << 20  # not over the socket
        if ending == "exit":
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "hold ok"
            assert proc.wait(30) == 0
        else:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        deadline = time.monotonic() + 10
        while _mine(pilot_sessions, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _mine(pilot_sessions, proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
