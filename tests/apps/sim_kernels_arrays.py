"""Sim-backend emulations of the kernels of arrays.cu: texture fetches and surface writes
through the sim's texture and surface objects (SimLaunch.texture / .surface, point sampling
with CUDA's address modes, element-type reads).

Parameter layouts (offset, size):
  tex_sample        (0,8) (8,8) (16,8) (24,4)
  tex_sample_int    (0,8) (8,8) (16,8) (24,4)
  tex_fetch_linear  (0,8) (8,8) (16,4)
  surf_fill         (0,8) (8,4) (12,4) (16,4)
"""

from __future__ import annotations

import struct

from pilot.daemon.sim_kernels import SimLaunch, sim_kernel


def _covered(k: SimLaunch, n: int) -> int:
    """Elements i < n that `i = blockIdx.x * blockDim.x + threadIdx.x` reaches."""
    return max(0, min(n, k.grid[0] * k.block[0]))


def _sample(k: SimLaunch, fmt: str) -> None:
    """out[i] = tex2D<T>(tex, pts[i].x, pts[i].y) for i < n."""
    tex, pts, out, n = k.texture(0), k.ptr(1), k.ptr(2), k.i32(3)
    count = _covered(k, n)
    if count == 0:
        return
    points = struct.unpack(f"<{2 * count}f", k.read(pts, 8 * count))
    values = [tex.fetch(points[2 * i], points[2 * i + 1])[0] for i in range(count)]
    k.write(out, struct.pack(f"<{count}{fmt}", *values))


@sim_kernel("_Z10tex_sampleyPK6float2Pfi")
def tex_sample(k: SimLaunch) -> None:
    _sample(k, "f")


@sim_kernel("_Z14tex_sample_intyPK6float2Pii")
def tex_sample_int(k: SimLaunch) -> None:
    _sample(k, "i")


@sim_kernel("_Z16tex_fetch_linearyPii")
def tex_fetch_linear(k: SimLaunch) -> None:
    """out[i] = tex1Dfetch<int>(tex, i) for i < n."""
    tex, out, n = k.texture(0), k.ptr(1), k.i32(2)
    count = _covered(k, n)
    if count:
        k.write(out, struct.pack(f"<{count}i", *(tex.fetch_index(i)[0] for i in range(count))))


@sim_kernel("_Z9surf_fillyiij")
def surf_fill(k: SimLaunch) -> None:
    """surf2Dwrite(base + y * width + x, surf, x * 4, y) where (x + y) % 3 != 0, for the threads'
    (x, y) inside width x height."""
    surf, width, height, base = k.surface(0), k.i32(1), k.i32(2), k.u32(3)
    for y in range(min(height, k.grid[1] * k.block[1])):
        for x in range(min(width, k.grid[0] * k.block[0])):
            if (x + y) % 3:
                surf.write(((base + y * width + x) & 0xFFFFFFFF,), x * 4, y)
