"""Sim-backend emulation of bench/fig1_vector_add.cu's kernel, so bench/fig1.py's pilot mode runs
end to end without a GPU (`fig1.py --backend sim`, which passes this file to the daemon's
--sim-kernels). Parameter layout: a (0,8), b (8,8), c (16,8), n (24,8).
"""

from __future__ import annotations

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


@sim_kernel("_Z10vector_addPKfS0_Pfm")
def vector_add(k: SimLaunch) -> None:
    """c[i] = a[i] + b[i] for every i < n (a grid-stride loop: any non-empty grid covers all)."""
    a, b, c, n = k.ptr(0), k.ptr(1), k.ptr(2), k.arg(3, "<Q")[0]
    if n == 0 or k.grid[0] * k.block[0] == 0:
        return
    out = np.frombuffer(k.view(c, 4 * n), dtype=np.float32)
    np.add(np.frombuffer(k.view(a, 4 * n), dtype=np.float32),
           np.frombuffer(k.view(b, 4 * n), dtype=np.float32), out=out)
