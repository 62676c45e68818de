"""graph_mem.cu under pilot: graph memory nodes, explicit and captured from cudaMallocAsync /
cudaFreeAsync (shim/runtime/graph/graph_mem.c). Values are computed here; the error names are CUDA 13's for
the
same calls: tests/gpu/graphs_compare.sh diffs the program natively and under pilot on a GPU
(H100, 2026-11-27: identical, after three error names were corrected from the native run)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

N = 4096
BYTES = 4 * N


def _launch(what: str, k: int, mul: int, add: int) -> str:
    """The pipeline's output for input h_in[i] = i*k + 7: mul * h_in + add."""
    out = [mul * (i * k + 7) + add for i in range(N)]
    return f"{what} launch {k} sum {sum(out)} first {out[0]} last {out[-1]}"


def expected() -> list[str]:
    return [
        f"reuse after_free 1 unordered_distinct 1 bytes {BYTES // 2}",
        f"explicit type_alloc 10 type_free 11 bytes {BYTES} same_ptr 1 free_ptr 1 device 0",
        "getparams_wrong_type cudaErrorInvalidValue cudaErrorInvalidValue",
        "explicit nodes 14 alloc 4 free 4 kernel 2 memcpy 2 memset 2",
        *(_launch("explicit", k, 3, 1) for k in (1, 2, 3)),
        "clone cudaErrorNotSupported",
        "child cudaErrorNotSupported",
        "instantiate_twice cudaErrorNotSupported",
        "update cudaSuccess result 0",  # from the graph it was made from
        "remove_edge cudaErrorNotSupported",
        "destroy_node cudaErrorNotSupported",
        "free_unknown cudaErrorInvalidValue",
        "free_twice cudaErrorInvalidValue",
        "alloc_zero cudaErrorInvalidValue",
        "alloc_bad_device cudaErrorInvalidValue",
        "alloc_host cudaErrorNotSupported",
        "escape outside 11",
        "relaunch_live cudaErrorInvalidValue",
        "user_free cudaSuccess",
        "double_free cudaErrorInvalidValue",
        "relaunch_after_free cudaSuccess value 5",
        "free_async cudaSuccess",
        "free_graph add cudaSuccess",
        "free_graph launch cudaSuccess",
        "relaunch_after_free_graph cudaSuccess",
        "free_after_destroy cudaSuccess",
        "autofree launch cudaSuccess cudaSuccess value 9",
        "autofree user_free cudaSuccess",
        "captured distinct 1 reuse 1",
        "captured nodes 12 alloc 3 free 3 kernel 2 memcpy 2 memset 2",
        *(_launch("captured", k, 5, -3) for k in (4, 5)),
        f"captured_kept value {0x03030303}",
        "captured_kept free cudaSuccess",
        "mem high_at_least_two_buffers 1",
        "mem reset_high cudaSuccess",
        "mem set_high_nonzero cudaErrorInvalidValue",
        "mem set_current cudaErrorInvalidValue",
        "mem trim cudaSuccess bad_device cudaErrorInvalidDevice",
        "mem after_cleanup used 0 reserved 0",
        "done",
    ]


def test_graph_memory_nodes(run_under_pilot: Callable[..., subprocess.CompletedProcess[str]],
                            daemon_log: Callable[[], str]) -> None:
    proc = run_under_pilot("graph_mem")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout.splitlines() == expected()
    assert "not supported by pilot" not in proc.stderr


def test_memory_nodes_in_a_moved_child_graph(
        run_under_pilot: Callable[..., subprocess.CompletedProcess[str]],
        daemon_log: Callable[[], str]) -> None:
    """A child graph moved into its parent may hold memory nodes (CUDA's documented rule); the
    parent then follows the rules of a graph with memory nodes. Not yet compared on a GPU:
    graphs_compare.sh runs graph_mem without this argument."""
    proc = run_under_pilot("graph_mem", "moved")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout.splitlines() == [
        f"moved launch 1 sum {7 * N}",
        f"moved launch 2 sum {7 * N}",
        "moved instantiate_twice cudaErrorNotSupported clone cudaErrorNotSupported",
        "moved after_cleanup used 0",
    ]
