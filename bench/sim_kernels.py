"""Sim-backend emulations of the kernels in bench/*.cu, so bench.py can be smoke-tested without a GPU.

Loaded by `pilotd --backend sim --sim-kernels bench/sim_kernels.py` (bench.py passes it when it
starts a sim daemon itself). Only launch.cu launches a kernel, and that kernel does nothing.
"""

from __future__ import annotations

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


@sim_kernel("_Z12empty_kernelv")
def empty_kernel(k: SimLaunch) -> None:
    """launch.cu: `__global__ void empty_kernel() {}`."""
