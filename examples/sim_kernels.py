"""Emulation of examples/saxpy.cu's kernel, to try pilot without a GPU:
    pilotd --backend sim --sim-kernels examples/sim_kernels.py
"""

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


@sim_kernel("_Z5saxpyifPKfPf")
def saxpy(k: SimLaunch) -> None:
    n, a, x, y = k.i32(0), k.f32(1), k.ptr(2), k.ptr(3)
    count = min(n, k.grid[0] * k.block[0])
    xs = np.frombuffer(k.view(x, 4 * count), dtype=np.float32)
    ys = np.frombuffer(k.view(y, 4 * count), dtype=np.float32)
    ys[:] = np.float32(a) * xs + ys
