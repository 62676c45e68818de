"""Unified memory through pilot: tests/apps/managed.cu under the sim daemon.

Each scenario checks itself (host init then kernel then host read, iterative kernels, pointers in
structs and arrays, __managed__ variables, memset/memcpy, zeroed memory, host writes between
launches, the program's own SIGSEGV handler, two threads, the managed API) and prints
"<scenario> ok". The same program runs natively on the H100 (tests/gpu/run_all.sh) with the same
output.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scenario_output import check_output

RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]
SCENARIOS = ("iterative", "zeroed", "pointers", "variables", "copies", "no_sync_writes",
             "own_sigsegv", "own_sigset", "threads", "api", "collision", "small")
# What api prints besides its verdict: natively on the H100 (CUDA 13.0, driver 580) too.
API_LINES = [
    "api unregistered device=-2 devptr=0 hostptr=1",
    "api size0=cudaSuccess flags9=cudaErrorInvalidValue advise_device=cudaErrorInvalidValue",
]


def expected(scenario: str) -> list[str]:
    return (API_LINES if scenario == "api" else []) + [f"{scenario} ok"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str, run_under_pilot: RunUnderPilot, daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("managed", scenario), expected(scenario), daemon_log)


@pytest.mark.parametrize("chunk", ["4096", "64K", "1M"])
def test_all_scenarios_in_one_process_at_other_chunk_sizes(
        chunk: str, run_under_pilot: RunUnderPilot, daemon_log: Callable[[], str]) -> None:
    """Small chunks: many runs per flush, partial last chunks, faults per page."""
    proc = run_under_pilot("managed", env={"PILOT_UM_CHUNK": chunk}, timeout=120)
    check_output(proc, [line for s in SCENARIOS for line in expected(s)], daemon_log)


def test_address_taken_in_the_client_is_retried(run_under_pilot: RunUnderPilot,
                                                 daemon_log: Callable[[], str]) -> None:
    """The sim daemon's next managed address is mapped by the program first: the shim sees it
    taken, keeps it allocated while asking for another, and frees it afterwards."""
    proc = run_under_pilot("managed", "collision", env={"PILOT_LOG": "info"})
    check_output(proc, expected("collision"), daemon_log)
    assert "is taken in this process" in proc.stderr, proc.stderr


def test_accounting(app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
                    pilot_sessions: Callable[[], list[dict[str, Any]]]) -> None:
    """The session reports its managed bytes, and for each managed range the host-written
    chunks it flushed, the chunks it fetched and the launches that referenced it."""
    proc = subprocess.Popen([str(app_binaries["managed"]), "hold"], env=pilot_client_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "hold ok"
        assert proc.stdout.readline().strip() == "ready"
        [mine] = [s for s in pilot_sessions() if s["pid"] == proc.pid]
        assert mine["managed_bytes"] == 4 << 20 and mine["device_bytes"] == 0
        # the allocation, and the range of the module's __managed__ variables (bound at load)
        [rng] = [r for r in mine["managed"] if r["kind"] == "allocation"]
        [var] = [r for r in mine["managed"] if r["kind"] == "variable"]
        assert rng["bytes"] == 4 << 20 and var["bytes"] >= 4 + 64 * 4
        assert rng["host_dirty_chunks"] == 2 and rng["flushed_bytes"] == 4 << 20  # 2 MiB chunks
        assert rng["launches"] == 2  # um_pair (pointers in a struct) and um_fill
        assert rng["fetches"] == 2  # m[0] and m[n-1]: the first and the last chunk
        proc.stdin.write("done\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_launches_and_flushes_in_c_give_the_same_results(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    """Every scenario once with pilotd's fast path (launches of sessions with unified memory and
    the shadow flushes run in C) and once without: the same output, the same bytes copied; with
    it, most launches and every flush are C's."""
    from pilotd_metrics import run_scraped, total

    want = "".join(line + "\n" for s in SCENARIOS for line in expected(s))
    argv = [str(app_binaries["managed"])]
    fast_out, fast = run_scraped(start_pilotd, argv, shim_path, None)
    slow_out, slow = run_scraped(start_pilotd, argv, shim_path, "[daemon]\nfast_launch = false\n")
    assert fast_out == slow_out == want
    flushes = fast['pilot_calls_total{function="shadow_flush"}']
    assert total(fast, "pilot_fast_flushes_total") == flushes == \
        slow['pilot_calls_total{function="shadow_flush"}'] > 0
    assert total(slow, "pilot_fast_flushes_total") == total(slow, "pilot_fast_launches_total") == 0
    launched = total(fast, "pilot_tenant_launches_total")
    assert launched == total(slow, "pilot_tenant_launches_total")
    assert launched / 2 < total(fast, "pilot_fast_launches_total") < launched
    copied = "pilot_tenant_copied_bytes_total{"
    assert {k: v for k, v in fast.items() if k.startswith(copied)} == \
        {k: v for k, v in slow.items() if k.startswith(copied)}
