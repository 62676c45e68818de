"""Emulations of tests/gpu/confine_probe.cu's kernels, so that tests/gpu/confine_check.py can be
tried without a GPU (`--backend sim`, with a stand-in MPS control program): the script's steps,
users and files, not the hardware's address spaces. In the sim as on the GPU, a read outside
every allocation of the process faults (cudaErrorIllegalAddress)."""

from __future__ import annotations

import time

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


def _words(k: SimLaunch, addr: int, n: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 8 * n), dtype=np.uint64)


@sim_kernel("_Z4fillPymy")
def fill(k: SimLaunch) -> None:
    (n,), (pattern,) = k.arg(1, "<Q"), k.arg(2, "<Q")
    _words(k, k.ptr(0), n)[:] = np.uint64(pattern)


@sim_kernel("_Z4scanymyPy")
def scan(k: SimLaunch) -> None:
    (addr,), (n,), (pattern,) = k.arg(0, "<Q"), k.arg(1, "<Q"), k.arg(2, "<Q")
    found = int(np.count_nonzero(_words(k, addr, n) == np.uint64(pattern)))
    count = _words(k, k.ptr(3), 1)
    count[0] += np.uint64(found)


@sim_kernel("_Z4spinx")
def spin(k: SimLaunch) -> None:
    (cycles,) = k.arg(0, "<q")
    time.sleep(cycles / 1.7e9)
