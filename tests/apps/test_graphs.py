"""graphs.cu under pilot: CUDA graphs built explicitly and by stream capture, kept and replayed
by the shim (shim/runtime/graph/api_graph.c, shim/runtime/graph/graph_capture.c). The values are computed here
independently; the structure lines and error names are what CUDA 13 gives for the same calls
(tests/gpu/graphs_compare.sh diffs the program natively and under pilot on a GPU)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest
from pilotd_metrics import run_scraped, total

N = 1024
THREADS = 256
TABLE = [j * j - 5 for j in range(16)]
H_IN = [3 * i + 1 for i in range(N)]
MASK = 0xFFFFFFFF


def _i32(v: int) -> int:
    v &= MASK
    return v - (1 << 32) if v & 0x80000000 else v


def _show(what: str, x: list[int]) -> str:
    h = 2166136261
    for v in x:
        h = ((h ^ (v & MASK)) * 16777619) & MASK
    return f"{what} {h:08x} {x[0]} {x[N - 1]}"


def _explicit(mul: int, add: int, memset: int | None) -> list[int]:
    """The explicit graph: a = h*mul + add (+ the memset value if the add node runs) + table."""
    return [_i32(h * mul + add + (memset or 0) + TABLE[i % 16]) for i, h in enumerate(H_IN)]


def expected() -> list[str]:
    launch3 = _explicit(3, 5, 7)
    loop = list(H_IN)
    for k in range(20):
        loop = [_i32(v * (2 if k % 2 else 1) + k) for v in loop]
    forkjoin = [_i32(10 + 2 * h) for h in H_IN]
    return [
        "explicit nodes 8 roots 2 edges 7",
        "types 2 1 0 0 4 1 3 5",  # memset memcpy kernel kernel graph memcpy host empty
        "deps 2 dependents 1 found 1 child_nodes 2",
        "instantiate result 0 flags 0",
        _show("launch3", launch3),
        f"host calls 3 sum {sum(launch3)}",
        _show("exec_set", _explicit(5, -2, 0x00010002)),
        "graph keeps mul 3 add 5 grid 4 memset 7 elem 4",
        "enabled 0",
        _show("disabled", _explicit(5, -2, None)),
        "update cudaSuccess result 0",
        _show("updated", _explicit(2, 1, 3)),
        "update_other cudaErrorGraphExecUpdateFailure result 2",  # TopologyChanged
        "host calls 6",
        "dot 1",
        "remove_edge edges 6 again cudaErrorInvalidValue",
        "after_destroy nodes 7 roots 2 edges 6",
        "capture status 1 id 1 graph 1 deps 0",
        "after_copy deps 1 type 1",
        "ended status 0",
        "loop nodes 22 roots 1 edges 21",
        _show("loop", loop),
        "captured_launch cudaErrorStreamCaptureUnsupported end cudaErrorStreamCaptureInvalidated"
        " graph 0 status 0",
        "long_chain nodes 3000",
        _show("long_chain", [h + 3000 if i < THREADS else h for i, h in enumerate(H_IN)]),
        "fork s2 status 1 same_id 1",
        "joined s2 status 0",
        "forkjoin nodes 6 roots 1 edges 6",
        _show("forkjoin", forkjoin),
        "unjoined cudaErrorStreamCaptureUnjoined graph 0 s2 status 0",
        "sync_in_capture cudaErrorStreamCaptureUnsupported status 2",
        "launch_after cudaErrorStreamCaptureInvalidated end cudaErrorStreamCaptureInvalidated "
        "graph 0 status 0",
        "legacy_capture cudaErrorStreamCaptureUnsupported",
        "end_not_capturing cudaErrorIllegalState",
        "begin_twice cudaErrorIllegalState",
        "legacy_query cudaErrorStreamCaptureImplicit end cudaSuccess",
        "sync_copy cudaErrorStreamCaptureImplicit end cudaErrorStreamCaptureInvalidated",
        "device_sync cudaErrorStreamCaptureUnsupported end cudaErrorStreamCaptureInvalidated",
        "event_query cudaErrorCapturedEvent end cudaErrorStreamCaptureInvalidated",
        "malloc_in_capture cudaErrorStreamCaptureUnsupported",
        "relaxed_copy cudaSuccess nodes 0",
        _show("relaxed", forkjoin),
        "generic nodes 3 roots 1 edges 2",
        "generic values 17 21 18 wrong_type cudaErrorInvalidValue",
        "null instantiate cudaErrorInvalidValue",
        "null add cudaErrorInvalidValue",
        "null type cudaErrorInvalidValue",
        "null destroy cudaErrorInvalidValue",
        "null create cudaErrorInvalidValue",
        "null launch cudaErrorInvalidValue",
        "window base 1 bytes 4096 hit 50 props 2 1",
        "sync_policy 2",
        "copied bytes 4096",
        "priority 0",
        "stream ids differ 1",
        "fresh node window bytes 0",
        "node window base 1 bytes 4096 hit 50",
        "node priority is the greatest 1",
        "copied node window bytes 4096",
        "graph with node attributes ran: 1",
        "done",
    ]


def test_expected_values_are_pinned() -> None:
    """The generator against values worked out by hand."""
    assert _explicit(3, 5, 7)[0] == 3 * 1 + 5 + 7 - 5
    assert _explicit(2, 1, None)[17] == 2 * 52 + 1 + (1 - 5)
    assert _i32(0x80000000) == -(1 << 31)


def test_graphs(run_under_pilot: Callable[..., subprocess.CompletedProcess[str]],
                daemon_log: Callable[[], str]) -> None:
    proc = run_under_pilot("graphs")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout.splitlines() == expected()
    assert "not supported" not in proc.stderr  # nothing of it fell back to a stub


def test_graphs_garbage_handles(run_under_pilot: Callable[..., subprocess.CompletedProcess[str]],
                                daemon_log: Callable[[], str]) -> None:
    """Destroyed and made-up handles are refused (natively these calls would crash)."""
    if os.environ.get("PILOT_APPS_NATIVE") == "1":
        pytest.skip("natively, CUDA dereferences such handles")
    proc = run_under_pilot("graphs", "garbage")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    lines = proc.stdout.splitlines()
    assert lines[-1] == "garbage done"
    assert len(lines) == 13
    assert all(line.endswith(" cudaErrorInvalidValue") for line in lines[:-1]), lines


def _launch_expected() -> list[str]:
    a = [3 * i - 1000 for i in range(4096)]

    def show(what: str, x: list[int]) -> str:
        h = 0
        for v in x:
            h = (h * 31 + (v & MASK)) & MASK
        return f"{what} {h:08x} {x[0]} {x[-1]}"

    plus50 = [v + 50 for v in a]
    return [show("captured", plus50), show("after_free", plus50), show("exec_then_other", plus50),
            show("updated", [3 * v + 49 for v in a]), show("explicit", [2 * v + 8 for v in a]),
            show("exec_set", [5 * v + 8 for v in a]), show("disabled", [v + 1 for v in a]),
            show("relaunched", [5 * v + 8 for v in a]), "done"]


def test_graphs_of_device_work_are_one_launch_in_pilotd(start_pilotd, app_binaries, shim_path) -> None:
    """Graphs of kernels, device copies and memsets become CUDA graphs pilotd instantiates
    (daemon/ops/graphs.py): launches, changes to an exec, a free between launches and a whole
    graph update give CUDA's results; with `fast_launch = false` Python launches them, and the
    same program prints the same."""
    argv = [str(app_binaries["graph_launch"])]
    fast_out, fast = run_scraped(start_pilotd, argv, shim_path, None)
    slow_out, slow = run_scraped(start_pilotd, argv, shim_path, "[daemon]\nfast_launch = false\n")
    assert fast_out.splitlines() == slow_out.splitlines() == _launch_expected()
    for values in (fast, slow):
        outcomes = {k: v for k, v in values.items() if k.startswith("pilot_graph_instantiations_total")}
        assert outcomes and all('outcome="instantiated"' in k for k in outcomes), outcomes
        assert total(values, "pilot_graph_instantiations_total") >= 5  # each change instantiates again
    assert total(fast, "pilot_fast_graph_launches_total") > 100
    assert total(slow, "pilot_fast_graph_launches_total") == 0


def test_graphs_with_host_work_are_replayed(start_pilotd, app_binaries, shim_path) -> None:
    """graphs.cu has host nodes, copies from host memory and events: those graphs stay with the
    shim (outcome replay_node) and still print what CUDA prints."""
    out, values = run_scraped(start_pilotd, [str(app_binaries["graphs"])], shim_path, None)
    assert out.splitlines() == expected()
    assert values.get('pilot_graph_instantiations_total{outcome="replay_node",tenant="all"}', 0) > 0
