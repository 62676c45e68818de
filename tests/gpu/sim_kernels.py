"""Emulations of the kernels of tests/gpu/matmul_tiled.cu, tests/gpu/multistream.cu and
tests/gpu/free_async_time.cu, so that CI runs those programs under pilotd --backend sim (on the
H100 they run for real; the sim does not spin: it has no time to spend).

matmul: inputs are multiples of 1/8 small enough that every float32 sum is exact, so any
summation order (here float64, then rounded) gives the kernel's result bit for bit.
multistream: x -> a*x + b (mod 2^32) applied `it` times is one affine map, composed here.
"""

from __future__ import annotations

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel

LCG_A, LCG_B = 1664525, 1013904223


def _f32(k: SimLaunch, addr: int, n: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * n), dtype=np.float32)


def _u32(k: SimLaunch, addr: int, n: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * n), dtype=np.uint32)


def _gemm(k: SimLaunch, tile: int) -> None:
    a_ptr, b_ptr, c_ptr, m, n, kk = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3), k.i32(4), k.i32(5)
    if k.grid[0] * tile < n or k.grid[1] * tile < m:
        raise ValueError("grid does not cover the output")
    a = _f32(k, a_ptr, m * kk).reshape(m, kk).astype(np.float64)
    b = _f32(k, b_ptr, kk * n).reshape(kk, n).astype(np.float64)
    _f32(k, c_ptr, m * n)[:] = (a @ b).astype(np.float32).ravel()


@sim_kernel("_Z7sgemm16PKfS0_Pfiii")
def sgemm16(k: SimLaunch) -> None:
    _gemm(k, 16)


@sim_kernel("_Z7sgemm32PKfS0_Pfiii")
def sgemm32(k: SimLaunch) -> None:
    if k.shared_bytes != 2 * 32 * 33 * 4:
        raise ValueError(f"dynamic shared memory {k.shared_bytes}")
    _gemm(k, 32)


def _lcg_power(n: int) -> tuple[np.uint32, np.uint32]:
    """(a, b) such that applying x -> A*x + B n times is x -> a*x + b (mod 2^32)."""
    ra, rb, ba, bb = 1, 0, LCG_A, LCG_B
    while n:
        if n & 1:
            ra, rb = (ba * ra) % 2**32, (ba * rb + bb) % 2**32
        ba, bb = (ba * ba) % 2**32, (ba * bb + bb) % 2**32
        n >>= 1
    return np.uint32(ra), np.uint32(rb)


@sim_kernel("_Z9lcg_stepsPKjPjiij")
def lcg_steps(k: SimLaunch) -> None:
    src, dst, n, it, salt = k.ptr(0), k.ptr(1), k.i32(2), k.i32(3), k.u32(4)
    a, b = _lcg_power(it)
    _u32(k, dst, n)[:] = (_u32(k, src, n) ^ np.uint32(salt)) * a + b


@sim_kernel("_Z8lcg_fillPjiij")
def lcg_fill(k: SimLaunch) -> None:
    dst, n, it, seed = k.ptr(0), k.i32(1), k.i32(2), k.u32(3)
    a, b = _lcg_power(it)
    x = np.arange(n, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(seed)
    _u32(k, dst, n)[:] = x * a + b


@sim_kernel("_Z7combinePKjS0_Pji")
def combine(k: SimLaunch) -> None:
    a, b, dst, n = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3)
    bb = _u32(k, b, n)
    _u32(k, dst, n)[:] = _u32(k, a, n) ^ ((bb << np.uint32(7)) | (bb >> np.uint32(25)))


@sim_kernel("_Z15spin_then_writeyPii")
def spin_then_write(k: SimLaunch) -> None:
    """*out = value (the GPU spins for `ns` first)."""
    np.frombuffer(k.view(k.ptr(1), 4), dtype=np.int32)[0] = k.i32(2)
