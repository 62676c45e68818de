"""Sim-backend emulations of the kernels of callbacks.cu, ptds.cu, multidev.cu, launch_ex.cu,
launch_order.cu and graphs.cu.

Loaded by the tests' pilotd next to sim_kernels.py. Each computes what its kernel computes for
the launch shape it gets (threads past gridDim*blockDim do nothing), in int32 arithmetic with
wrap-around as on the GPU.
"""

from __future__ import annotations

import struct

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


def _covered(k: SimLaunch, n: int) -> int:
    """Elements i < n that `i = blockIdx.x * blockDim.x + threadIdx.x` reaches."""
    return max(0, min(n, k.grid[0] * k.block[0]))


def _i32(k: SimLaunch, addr: int, count: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * count), dtype=np.int32)


def _wrap(values: np.ndarray) -> np.ndarray:
    """int64 results as the GPU's int32 arithmetic leaves them (wrapped)."""
    return (values & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def _symbol_i32(k: SimLaunch, name: str, index: int = 0) -> int:
    return struct.unpack_from("<i", k.symbol_view(name), 4 * index)[0]


# ---- callbacks.cu ----

@sim_kernel("_Z4fillPiii")
def fill(k: SimLaunch) -> None:
    """p[i] = base + i."""
    p, n, base = k.ptr(0), k.i32(1), k.i32(2)
    count = _covered(k, n)
    if count:
        _i32(k, p, count)[:] = _wrap(np.arange(count, dtype=np.int64) + base)


@sim_kernel("_Z3addPiii")
def add(k: SimLaunch) -> None:
    """p[i] += v."""
    p, n, v = k.ptr(0), k.i32(1), k.i32(2)
    count = _covered(k, n)
    if count:
        out = _i32(k, p, count)
        np.add(out, np.int32(v), out=out)


# ---- ptds.cu ----

@sim_kernel("_Z3mixPiiii")
def mix(k: SimLaunch) -> None:
    """p[i] = p[i] * mul + per_thread_value[slot] + i."""
    p, n, slot, mul = k.ptr(0), k.i32(1), k.i32(2), k.i32(3)
    count = _covered(k, n)
    if count:
        value = _symbol_i32(k, "per_thread_value", slot)
        out = _i32(k, p, count)
        out[:] = _wrap(out.astype(np.int64) * mul + value + np.arange(count, dtype=np.int64))


# ---- multidev.cu ----

@sim_kernel("_Z5stampPiii")
def stamp(k: SimLaunch) -> None:
    """p[i] = base + i + device_value (this device's copy of the variable)."""
    p, n, base = k.ptr(0), k.i32(1), k.i32(2)
    count = _covered(k, n)
    if count:
        value = _symbol_i32(k, "device_value")
        _i32(k, p, count)[:] = _wrap(np.arange(count, dtype=np.int64) + base + value)


@sim_kernel("_Z4bumpi")
def bump(k: SimLaunch) -> None:
    """Thread (0, 0): device_value += by."""
    if k.grid[0] * k.block[0] == 0:
        return
    view = k.symbol_view("device_value")
    struct.pack_into("<i", view, 0, _symbol_i32(k, "device_value") + k.i32(0))


@sim_kernel("_Z6gatherPiPKii")
def gather(k: SimLaunch) -> None:
    """dst[i] = src[i] * 2 (src may be another device's memory, through peer access)."""
    dst, src, n = k.ptr(0), k.ptr(1), k.i32(2)
    count = _covered(k, n)
    if count:
        out = _i32(k, dst, count)
        np.multiply(_i32(k, src, count), np.int32(2), out=out)


# ---- launch_ex.cu ----

@sim_kernel("_Z10coop_shiftPiS_i")
def coop_shift(k: SimLaunch) -> None:
    """Grid-stride a[j] = 3j + 1; grid.sync(); b[j] = a[(j + 1) % n], for every j < n."""
    a, b, n = k.ptr(0), k.ptr(1), k.i32(2)
    if n <= 0 or k.grid[0] * k.block[0] == 0:
        return
    av = _i32(k, a, n)
    av[:] = 3 * np.arange(n, dtype=np.int32) + 1
    _i32(k, b, n)[:] = np.roll(av, -1)


@sim_kernel("_Z12stamp_blocksPii")
def stamp_blocks(k: SimLaunch) -> None:
    """p[blockIdx.x * blockDim.x + threadIdx.x] = base + blockIdx.x over the whole 1D grid."""
    p, base = k.ptr(0), k.i32(1)
    blocks, threads = k.grid[0], k.block[0]
    if blocks * threads:
        _i32(k, p, blocks * threads)[:] = np.repeat(np.arange(blocks, dtype=np.int32) + base, threads)


# ---- launch_order.cu ----

def _u32(k: SimLaunch, addr: int, n: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * n), dtype=np.uint32)


@sim_kernel("_Z4stepPjij")
def step(k: SimLaunch) -> None:
    """x[i] = x[i] * 3 + k + i (uint32 wrap-around) for i < n covered by the grid."""
    x, n, add = k.ptr(0), k.i32(1), k.u32(2)
    count = _covered(k, n)
    if count:
        v = _u32(k, x, count)
        v[:] = v * np.uint32(3) + np.uint32(add) + np.arange(count, dtype=np.uint32)


@sim_kernel("_Z9step_pairPji4Pairm")
def step_pair(k: SimLaunch) -> None:
    """x[i] = (x[i] ^ p.a) * 5 + p.b + (uint32)shift for i < n covered by the grid."""
    x, n = k.ptr(0), k.i32(1)
    a, b = k.arg(2, "<II")
    (shift,) = k.arg(3, "<Q")
    count = _covered(k, n)
    if count:
        v = _u32(k, x, count)
        v[:] = (v ^ np.uint32(a)) * np.uint32(5) + np.uint32(b) + np.uint32(shift & 0xFFFFFFFF)


@sim_kernel("_Z6noargsv")
def noargs(k: SimLaunch) -> None:
    """Does nothing."""


# ---- func_info.cu (never launched: only asked about) ----

@sim_kernel("_Z13params_kernel5MixedcPds")
def params_kernel(k: SimLaunch) -> None:
    """Does nothing."""


@sim_kernel("plain_c_kernel")
def plain_c_kernel(k: SimLaunch) -> None:
    """Does nothing."""


# ---- graphs.cu ----

GRAPH_TABLE = 16


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
        table = np.frombuffer(k.symbol_view("g_table"), dtype=np.int32)[:GRAPH_TABLE].astype(np.int64)
        out = _i32(k, x, count)
        out[:] = _wrap(out.astype(np.int64) + table[np.arange(count) % GRAPH_TABLE])
