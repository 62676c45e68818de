"""Sim-backend emulation of the kernel of bench/salus_job.cu and bench/salus_torch_like.cu
(bench/salus_kernel.cuh; the sim runs it at once: the jobs' HOST_MS argument stands in for its
time), so the salus tests and `salus_trace.py --backend sim` run without a GPU."""

from __future__ import annotations

import struct

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


@sim_kernel("_Z9iterationPyPjmy")
def iteration(k: SimLaunch) -> None:
    """scratch[i] = i for the first `touched` words the grid covers; state[0] += 1."""
    state, scratch = k.ptr(0), k.ptr(1)
    (touched,) = k.arg(2, "<Q")
    n = min(touched, k.grid[0] * k.block[0])
    if n:
        np.frombuffer(k.view(scratch, 4 * n), dtype=np.uint32)[:] = np.arange(n, dtype=np.uint32)
    (count,) = struct.unpack("<Q", k.read(state, 8))
    k.write(state, struct.pack("<Q", count + 1))
