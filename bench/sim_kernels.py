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


@sim_kernel("_Z11touch_pagesPKfPKiiPf")
def touch_pages(k: SimLaunch) -> None:
    """um_touch.cu: out[i] = x[order[i] * 1024] for i < pages."""
    x, order_ptr = k.ptr(0), k.ptr(1)
    (pages,) = k.arg(2, "<i")
    out_ptr = k.ptr(3)
    if pages <= 0:
        return
    order = np.frombuffer(k.view(order_ptr, 4 * pages), dtype=np.int32)
    out = np.frombuffer(k.view(out_ptr, 4 * pages), dtype=np.float32)
    last = int(order.max())
    x_all = np.frombuffer(k.view(x, 4 * (last * 1024 + 1)), dtype=np.float32)
    out[:] = x_all[order.astype(np.int64) * 1024]


def _floats(k: SimLaunch, index: int, n: int) -> np.ndarray:
    return np.frombuffer(k.view(k.ptr(index), 4 * n), dtype=np.float32)


@sim_kernel("_Z7st_copyPKfPfm")
def st_copy(k: SimLaunch) -> None:
    """um_stream.cu: c = a."""
    (n,) = k.arg(2, "<Q")
    _floats(k, 1, n)[:] = _floats(k, 0, n)


@sim_kernel("_Z6st_mulPfPKffm")
def st_mul(k: SimLaunch) -> None:
    """um_stream.cu: b = s c."""
    (s,), (n,) = k.arg(2, "<f"), k.arg(3, "<Q")
    np.multiply(_floats(k, 1, n), np.float32(s), out=_floats(k, 0, n))


@sim_kernel("_Z6st_addPKfS0_Pfm")
def st_add(k: SimLaunch) -> None:
    """um_stream.cu: c = a + b."""
    (n,) = k.arg(3, "<Q")
    np.add(_floats(k, 0, n), _floats(k, 1, n), out=_floats(k, 2, n))


@sim_kernel("_Z8st_triadPfPKfS1_fm")
def st_triad(k: SimLaunch) -> None:
    """um_stream.cu: a = b + s c."""
    (s,), (n,) = k.arg(3, "<f"), k.arg(4, "<Q")
    np.add(_floats(k, 1, n), np.multiply(_floats(k, 2, n), np.float32(s)), out=_floats(k, 0, n))


@sim_kernel("_Z6st_dotPKfS0_mPd")
def st_dot(k: SimLaunch) -> None:
    """um_stream.cu: *sum += sum(a b) (the kernel's atomicAdd of every thread's part)."""
    (n,) = k.arg(2, "<Q")
    total = np.frombuffer(k.view(k.ptr(3), 8), dtype=np.float64)
    total[0] += float(np.dot(_floats(k, 0, n).astype(np.float64), _floats(k, 1, n).astype(np.float64)))


@sim_kernel("_Z11small_touchPPhii")
def small_touch(k: SimLaunch) -> None:
    """um_small.cu: ptrs[i][b] += 1 for b < size, i < n covered by the grid."""
    n, size = min(k.i32(1), k.grid[0] * k.block[0]), k.i32(2)
    if n <= 0 or size <= 0:
        return
    for (target,) in struct.iter_unpack("<Q", k.read(k.ptr(0), 8 * n)):
        v = np.frombuffer(k.view(target, size), dtype=np.uint8)
        v += np.uint8(1)


@sim_kernel("_Z11first_touchPim")
def first_touch(k: SimLaunch) -> None:
    """um_first.cu: x[i] += 1 for i < n covered by the grid."""
    x, n = k.ptr(0), min(k.arg(1, "<Q")[0], k.grid[0] * k.block[0])
    if n > 0:
        v = np.frombuffer(k.view(x, 4 * n), dtype=np.int32)
        v += np.int32(1)
