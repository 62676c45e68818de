"""Small managed allocations, packed into ranges of the session's own (shim/runtime/managed/um_pack.c):
tests/apps/small_managed.cu under the sim daemon.

Two tenants allocating at the same time never get bytes on one 4 KiB page; bytes a session freed
are never readable by another; 100,000 allocations are correct, charged as docs/ARCHITECTURE.md
says (each packed range in full) and all returned at exit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from apps_daemons import RunUnderPilot  # pytest puts tests/apps on sys.path
from scenario_output import check_output
from test_gpu_faults import as_nobody, shared_copy
from test_policies_over_capacity import CONFIG, Sampler, _residency, _run_beside_pagedos

MIB = 1 << 20
RANGE = 2 * MIB  # PILOT_UM_PACK_RANGE
PIECE = 512  # PILOT_UM_PACK_ALIGN


def _pages(lines: list[str]) -> set[int]:
    return {int(line.split()[1], 16) for line in lines if line.startswith("page ")}


def _session(sessions: list[dict[str, Any]], pid: int) -> dict[str, Any]:
    [mine] = [s for s in sessions if s["pid"] == pid]
    return mine


def _ranges(session: dict[str, Any]) -> list[tuple[int, int]]:
    return [(r["base"], r["base"] + r["bytes"]) for r in session["managed"] if r["kind"] == "allocation"]


def _inside(page: int, ranges: list[tuple[int, int]]) -> bool:
    return any(lo <= page and page + 4096 <= hi for lo, hi in ranges)


def _free_all(proc: subprocess.Popen[str]) -> None:
    """The program, held at "ready", frees its allocations and stops at "freed"."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "freed\n"


def _exit(proc: subprocess.Popen[str], want: str) -> None:
    """The program, held at "freed", ends printing `want`."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.close()
    assert proc.stdout.read() == want
    assert proc.wait(timeout=60) == 0


def _start(argv: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _until_ready(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        if line == "ready\n":
            return lines
        lines.append(line)
    raise AssertionError(f"no ready: {lines[-5:]} {proc.stderr.read() if proc.stderr else ''}")


def test_many_small_allocations_are_correct_charged_in_ranges_and_returned(
        app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
        pilot_sessions: Callable[[], list[dict[str, Any]]]) -> None:
    """100,000 allocations of 16 bytes: each a 512-byte piece, 4096 to a 2 MiB range; the
    session is charged its ranges in full and the pointer table at its size."""
    n, table = 100_000, 100_000 * 8
    proc = _start([str(app_binaries["small_managed"]), "many", str(n), "16", "hold"], pilot_client_env)
    try:
        pages = _pages(_until_ready(proc))
        assert len(pages) == n * PIECE // 4096
        mine = _session(pilot_sessions(), proc.pid)
        ranges = -(-n * PIECE // RANGE)
        assert mine["packed_ranges"] == ranges
        assert mine["managed_bytes"] == ranges * RANGE + table
        assert mine["charged"]["managed"] == ranges * RANGE + table
        assert all(_inside(p, _ranges(mine)) for p in pages)
        _free_all(proc)
        mine = _session(pilot_sessions(), proc.pid)  # one empty range is kept for what comes next
        assert (mine["packed_ranges"], mine["managed_bytes"]) == (1, RANGE)
        _exit(proc, "many ok\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while any(s["pid"] == proc.pid for s in pilot_sessions()):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_reused_pieces_read_zero_and_bad_frees_are_refused(run_under_pilot: RunUnderPilot,
                                                            daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("small_managed", "reuse"),
                 ["reuse inner=cudaErrorInvalidValue twice=cudaErrorInvalidValue",
                  "reuse reused_zero=yes", "reuse ok"],
                 daemon_log)


def test_all_scenarios_as_the_gpu_comparison_runs_them(run_under_pilot: RunUnderPilot,
                                                        daemon_log: Callable[[], str]) -> None:
    """No argument (tests/gpu/run_compare.sh): 10,000 x 64 B, the frees refused, fresh memory
    reading zero, four threads allocating and freeing at once, and the managed API (advice,
    prefetch, attributes, attachment) on one small allocation among others."""
    check_output(run_under_pilot("small_managed"),
                 ["zero ok", "many ok", "reuse inner=cudaErrorInvalidValue twice=cudaErrorInvalidValue",
                  "reuse ok", "threads ok", "api ok"], daemon_log)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a program as a second user")
def test_two_tenants_allocating_at_once_never_share_a_page(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    """root and nobody allocate 3,000 small buffers each at the same time: no 4 KiB page holds
    bytes of both, and each one's pages lie in managed ranges the daemon holds for its session
    only; `pilotctl quota get` tells each tenant's packed ranges."""
    daemon = start_pilotd()
    Path(daemon.dir).chmod(0o755)
    exe = shared_copy(app_binaries["small_managed"])
    env = {**daemon.env(), "LD_PRELOAD": str(shared_copy(Path(shim_path)))}
    argv = [str(exe), "many", "3000", "64", "hold"]
    procs = [_start(argv, env), _start(argv, env, preexec_fn=as_nobody)]
    try:
        pages = [_pages(_until_ready(p)) for p in procs]
        assert pages[0] and pages[1] and not pages[0] & pages[1]
        sessions = json.loads(daemon.ctl("sessions", "--json").stdout)
        mine = [_session(sessions, p.pid) for p in procs]
        assert {m["tenant"] for m in mine} == {"user:root", "user:nobody"}
        ranges = [_ranges(m) for m in mine]
        for page_set, own, other in ((pages[0], ranges[0], ranges[1]), (pages[1], ranges[1], ranges[0])):
            assert all(_inside(p, own) and not _inside(p, other) for p in page_set)
        quota = json.loads(daemon.ctl("quota", "get", "user:nobody", "--json").stdout)
        assert quota["gpus"]["0"]["packed_managed"] == mine[1]["packed_ranges"] * RANGE > 0
        text = daemon.ctl("quota", "get", "user:nobody").stdout
        assert "in ranges small managed allocations are packed into" in text, text
        for p in procs:
            _free_all(p)
            _exit(p, "many ok\n")
        deadline = time.monotonic() + 5  # all returned at exit: nothing charged any more
        while json.loads(daemon.ctl("sessions", "--json").stdout):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        quota = json.loads(daemon.ctl("quota", "get", "user:nobody", "--json").stdout)["gpus"]["0"]
        assert (quota["used"], quota["packed_managed"]) == (0, 0), quota
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_bytes_a_session_freed_are_never_readable_by_another(
        app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
        run_under_pilot: RunUnderPilot, daemon_log: Callable[[], str]) -> None:
    """A session fills 3,000 buffers and frees them (its ranges go back to pilotd, but one); a
    second session's as many fresh buffers read zero on the host and on the device, before and
    after the first one exits."""
    writer = _start([str(app_binaries["small_managed"]), "many", "3000", "700", "hold"],
                    pilot_client_env)
    try:
        _until_ready(writer)
        _free_all(writer)
        check_output(run_under_pilot("small_managed", "zero", "3000", "700"), ["zero ok"], daemon_log)
        _exit(writer, "many ok\n")
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    check_output(run_under_pilot("small_managed", "zero", "3000", "700"), ["zero ok"], daemon_log)


@pytest.mark.parametrize("policy", ["none", "mfit", "amfit", "madvise"])
def test_the_enforcer_and_the_memory_policies_move_packed_ranges(
        policy: str, start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    """20,000 small buffers (about 20 MiB of packed ranges) beside 48 MiB of pageDoS within a
    capacity of 64 MiB: the program's results are right, its ranges were movable memory the
    enforcer tracked, and everything is given back at exit."""
    daemon = start_pilotd("--enforce-capacity", "--capacity", f"{64 * MIB}B", "--policy", policy,
                          config=CONFIG)
    sampler = Sampler(daemon)
    sampler.start()
    try:
        dos, small = _run_beside_pagedos(
            daemon, shim_path, app_binaries,
            ["pagedos", "--bytes", "48MiB", "--chunk", "16MiB", "--seconds", "60"],
            ["small_managed", "many", "20000", "700"])
    finally:
        sampler.stop.set()
        sampler.join()
    assert dos.returncode == 0 and " ok=1" in dos.stdout, (dos.stdout, dos.stderr, daemon.log_tail())
    assert small.returncode == 0 and small.stdout == "many ok\n", (small.stdout, small.stderr,
                                                                     daemon.log_tail())
    final = _residency(daemon)
    assert final["enforced"] and final["movable"] == 0 and final["resident"] == 0, final
    assert final["peak_resident"] <= final["room"], final
    # the packed ranges (20,000 x 1 KiB: 10 ranges, made one by one while the program allocates)
    # were movable memory beside pageDoS's 48 MiB (sampled every 20 ms: not necessarily at the peak)
    assert max(x["movable"] for x in sampler.samples) >= 48 * MIB + 2 * RANGE, sampler.samples[-1]
    assert "Traceback" not in daemon.log(), daemon.log_tail()
