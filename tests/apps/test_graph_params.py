"""graph_params.cu under pilot: the parameters of memcpy, host and event nodes read back and set,
in a graph and in its executable graph (shim/runtime/graph/api_graph.c node_params and its table
of node kinds). The lines are what CUDA 13 gives for the same calls (tests/gpu/graphs_compare.sh
diffs the program natively and under pilot on a GPU)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

N = 256
WIDTH = N * 4  # bytes

EXPECTED = [
    f"memcpy dst_a 1 src_h 1 width {WIDTH}",
    "host fn 1 data 0 1",
    "events record e1 1 wait e2 1",
    f"set dst_b 1 src_h 1 width {WIDTH} data 1 1 record e2 1 wait e1 1",
    "graph keeps dst_b 1 data 1 1 record e2 1",
    "exec ran: a 1 b 0 calls 1 0 e1 cudaSuccess",
    "graph ran: b 1 calls 1 1 e2 cudaSuccess",
    "done",
]


def test_graph_node_parameters(run_under_pilot: Callable[..., subprocess.CompletedProcess[str]],
                               daemon_log: Callable[[], str]) -> None:
    proc = run_under_pilot("graph_params")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout.splitlines() == EXPECTED
    assert "not supported" not in proc.stderr
