"""Sim-backend emulations of the bench/uvm programs' kernels, so that bench/policy_runner.py runs
end to end without a GPU (`policy_runner.py --backend sim`, which passes this file to the
daemon's --sim-kernels). Each emulation does what the kernel does to the whole range (a
grid-stride loop: any non-empty grid covers it all)."""

from __future__ import annotations

import struct

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel

PAGE_WORDS = 1024


def _array(k: SimLaunch, i: int, n: int, dtype: type) -> np.ndarray:
    """Parameter i as a pointer to n elements of dtype, writable."""
    return np.frombuffer(k.view(k.ptr(i), n * np.dtype(dtype).itemsize), dtype=dtype)


def _add_wrong(k: SimLaunch, i: int, count: int) -> None:
    """*(unsigned long long *)param_i += count (the check kernels' atomicAdd)."""
    (old,) = struct.unpack("<Q", k.read(k.ptr(i), 8))
    k.write(k.ptr(i), struct.pack("<Q", old + count))


def _n(k: SimLaunch, i: int) -> int:
    return k.arg(i, "<Q")[0]


def _pages(k: SimLaunch) -> np.ndarray:
    """pagedos: the first word of every page, a strided view of the buffer."""
    pages = _n(k, 1)
    return _array(k, 0, pages * PAGE_WORDS, np.uint32)[::PAGE_WORDS]


@sim_kernel("_Z10zero_pagesPjm")
def zero_pages(k: SimLaunch) -> None:
    _pages(k)[:] = 0


@sim_kernel("_Z11touch_pagesPjm")
def touch_pages(k: SimLaunch) -> None:
    _pages(k)[:] += np.uint32(1)


@sim_kernel("_Z11count_wrongPKjmjPy")
def count_wrong(k: SimLaunch) -> None:
    _add_wrong(k, 3, int(np.count_nonzero(_pages(k) != np.uint32(k.u32(2)))))


@sim_kernel("_Z4initPfS_S_m")
def stream_init(k: SimLaunch) -> None:
    n = _n(k, 3)
    _array(k, 0, n, np.float32)[:] = 0
    _array(k, 1, n, np.float32)[:] = 1
    _array(k, 2, n, np.float32)[:] = np.arange(n) % 8


@sim_kernel("_Z8fma_passPfPKfS1_m")
def stream_pass(k: SimLaunch) -> None:
    n = _n(k, 3)
    a = _array(k, 0, n, np.float32)
    a += _array(k, 1, n, np.float32) * _array(k, 2, n, np.float32)


@sim_kernel("_Z5checkPKfmfPy")
def stream_check(k: SimLaunch) -> None:
    n = _n(k, 1)
    expect = np.float32(k.f32(2)) * (np.arange(n) % 8).astype(np.float32)
    _add_wrong(k, 3, int(np.count_nonzero(_array(k, 0, n, np.float32) != expect)))


def _checkerboard(n: int, passes: int) -> np.ndarray:
    i, j = np.indices((n, n))
    return np.where((i + j + passes) & 1, np.float32(2), np.float32(4)).astype(np.float32)


@sim_kernel("_Z4initPfm")
def jacobi_init(k: SimLaunch) -> None:
    n = _n(k, 1)
    _array(k, 0, n * n, np.float32)[:] = _checkerboard(n, 0).ravel()


@sim_kernel("_Z5sweepPKfPfm")
def jacobi_sweep(k: SimLaunch) -> None:
    n = _n(k, 2)
    u = _array(k, 0, n * n, np.float32).reshape(n, n)
    s = np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1)
    _array(k, 1, n * n, np.float32)[:] = (np.float32(0.25) * s).ravel()


@sim_kernel("_Z5checkPKfmlPy")
def jacobi_check(k: SimLaunch) -> None:
    n, passes = _n(k, 1), k.arg(2, "<q")[0]
    u = _array(k, 0, n * n, np.float32)
    _add_wrong(k, 3, int(np.count_nonzero(u != _checkerboard(n, passes).ravel())))


@sim_kernel("_Z4initPjm")
def hist_init(k: SimLaunch) -> None:
    n = _n(k, 1)
    i = np.arange(n, dtype=np.uint64)
    x = ((i & 0xFFFFFFFF) * np.uint64(2654435761) & np.uint64(0xFFFFFFFF)) ^ (i >> np.uint64(32))
    x ^= x >> np.uint64(15)
    x = x * np.uint64(2246822519) & np.uint64(0xFFFFFFFF)
    _array(k, 0, n, np.uint32)[:] = (x ^ (x >> np.uint64(13))).astype(np.uint32)


@sim_kernel("_Z9histogramPKjmPy")
def hist_pass(k: SimLaunch) -> None:
    n = _n(k, 1)
    counts = np.bincount(_array(k, 0, n, np.uint32) & 255, minlength=256).astype(np.uint64)
    bins = _array(k, 2, 256, np.uint64)
    bins += counts


@sim_kernel("_Z4initPjPfS0_mmm")
def gather_init(k: SimLaunch) -> None:
    n, p, q = _n(k, 3), _n(k, 4), _n(k, 5)
    i = np.arange(n, dtype=np.uint64)
    _array(k, 0, n, np.uint32)[:] = ((i * np.uint64(p) + np.uint64(q)) % np.uint64(n))
    _array(k, 1, n, np.float32)[:] = np.arange(n) % 1024
    _array(k, 2, n, np.float32)[:] = 0


@sim_kernel("_Z6gatherPKjPKfPfm")
def gather_pass(k: SimLaunch) -> None:
    n = _n(k, 3)
    acc = _array(k, 2, n, np.float32)
    acc += _array(k, 1, n, np.float32)[_array(k, 0, n, np.uint32)]


@sim_kernel("_Z5checkPKjPKfmfPy")
def gather_check(k: SimLaunch) -> None:
    n = _n(k, 2)
    expect = np.float32(k.f32(3)) * (_array(k, 0, n, np.uint32) % 1024).astype(np.float32)
    _add_wrong(k, 4, int(np.count_nonzero(_array(k, 1, n, np.float32) != expect)))
