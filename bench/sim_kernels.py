"""Sim-backend emulations of the kernels in bench/*.cu, so bench.py can be smoke-tested without a GPU.

Loaded by `pilotd --backend sim --sim-kernels bench/sim_kernels.py` (bench.py passes it when it
starts a sim daemon itself): launch.cu's empty kernel and um.cu's grid-stride kernels.
"""

from __future__ import annotations

import struct

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


@sim_kernel("_Z12empty_kernelv")
def empty_kernel(k: SimLaunch) -> None:
    """launch.cu: `__global__ void empty_kernel() {}`."""


@sim_kernel("_Z4stepPfm")
def step(k: SimLaunch) -> None:
    """um.cu: x[i] = x[i] * 0.999f + 1.0f for every i < n (grid-stride loop)."""
    x, n = k.ptr(0), k.arg(1, "<Q")[0]
    if n and k.grid[0] * k.block[0]:
        v = np.frombuffer(k.view(x, 4 * n), dtype=np.float32)
        np.add(np.multiply(v, np.float32(0.999), dtype=np.float32), np.float32(1.0), out=v)


@sim_kernel("_Z4bumpPim")
def bump(k: SimLaunch) -> None:
    """um.cu: x[i] += 1 for every i < n (grid-stride loop)."""
    x, n = k.ptr(0), k.arg(1, "<Q")[0]
    if n and k.grid[0] * k.block[0]:
        v = np.frombuffer(k.view(x, 4 * n), dtype=np.int32)
        v += np.int32(1)


@sim_kernel("_Z6reducePKfmPd")
def reduce(k: SimLaunch) -> None:
    """um.cu: *out += sum of x[0..n) (in double; the order differs from the GPU's)."""
    x, n, out = k.ptr(0), k.arg(1, "<Q")[0], k.ptr(2)
    if n and k.grid[0] * k.block[0]:
        total = float(np.frombuffer(k.view(x, 4 * n), dtype=np.float32).sum(dtype=np.float64))
        (old,) = struct.unpack("<d", k.read(out, 8))
        k.write(out, struct.pack("<d", old + total))
