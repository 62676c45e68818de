"""Sim-backend emulations of the kernels of graphs.cu.

Loaded by the tests' pilotd next to sim_kernels.py. Each computes what its kernel computes for
the launch shape it gets (threads past gridDim*blockDim do nothing), in int32 arithmetic with
wrap-around as on the GPU.
"""

from __future__ import annotations

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel

TABLE = 16


def _covered(k: SimLaunch, n: int) -> int:
    return max(0, min(n, k.grid[0] * k.block[0]))


def _i32(k: SimLaunch, addr: int, count: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * count), dtype=np.int32)


def _wrap(values: np.ndarray) -> np.ndarray:
    return (values & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


@sim_kernel("_Z10graph_axpbPiiii")
def graph_axpb(k: SimLaunch) -> None:
    """x[i] = x[i] * mul + add."""
    x, n, mul, add = k.ptr(0), k.i32(1), k.i32(2), k.i32(3)
    count = _covered(k, n)
    if count:
        out = _i32(k, x, count)
        out[:] = _wrap(out.astype(np.int64) * mul + add)


@sim_kernel("_Z9graph_addPiPKii")
def graph_add(k: SimLaunch) -> None:
    """dst[i] += src[i]."""
    dst, src, n = k.ptr(0), k.ptr(1), k.i32(2)
    count = _covered(k, n)
    if count:
        out = _i32(k, dst, count)
        out[:] = _wrap(out.astype(np.int64) + _i32(k, src, count))


@sim_kernel("_Z11graph_tablePii")
def graph_table(k: SimLaunch) -> None:
    """x[i] += g_table[i % 16]."""
    x, n = k.ptr(0), k.i32(1)
    count = _covered(k, n)
    if count:
        table = np.frombuffer(k.symbol_view("g_table"), dtype=np.int32)[:TABLE].astype(np.int64)
        out = _i32(k, x, count)
        out[:] = _wrap(out.astype(np.int64) + table[np.arange(count) % TABLE])
