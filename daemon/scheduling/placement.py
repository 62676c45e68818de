"""Where a session runs: the scheduling decision of the PILOT design that maps work to vGPUs.

HELLO places a new session on the vGPU with the fewest sessions among the GPUs that are not
draining; DEVICE_JOIN places a session's part on another GPU on that GPU's least busy vGPU (a
draining GPU too: the session already runs). When that vGPU already serves a session, the GPU
gets a new vGPU thread for it (`grow`), up to `max_vgpus_per_gpu`: the number of vGPUs follows
the sessions. Why: a vGPU thread serves one call at a time, and a synchronizing call
(cudaDeviceSynchronize, cudaEventSynchronize, a synchronous copy) holds it until the session's
work is done, so sessions sharing a thread would wait for each other's kernels (measured on the
H100 with PILOT Fig. 1: 8 processes on 2 vGPUs took 1.22x MPS's kernel time). Each session also
has its own default stream (vgpu/server.py gives it one at ATTACH), so sessions that do share a
vGPU past the maximum still overlap on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu


def least_busy(candidates: Iterable[VGpu]) -> VGpu | None:
    """The vGPU serving the fewest sessions (the first of equals), or None if there is none."""
    return min(candidates, key=lambda v: len(v.sessions), default=None)


def place_session(vgpus: Iterable[VGpu], draining: set[int],
                  grow: Callable[[int], VGpu | None] | None = None, tenant: str | None = None,
                  share: int = 0) -> VGpu | None:
    """The vGPU for a new session: the least busy one on a GPU that is not draining, or a new
    one on that GPU (`grow(gpu)`, None past the maximum) if the least busy is not idle. A
    `tenant` whose sessions are on `share` vGPUs already gets the least busy of those (issue 27:
    one tenant's sessions, each holding its thread, must not take every vGPU)."""
    candidates = [v for v in vgpus if v.gpu not in draining]
    if tenant is not None and share > 0:
        mine = [v for v in candidates if any(s.tenant == tenant for s in list(v.sessions.values()))]
        if len(mine) >= share:
            return least_busy(mine)
    return _or_new(least_busy(candidates), grow)


def place_part(vgpus: Iterable[VGpu], grow: Callable[[int], VGpu | None] | None = None) -> VGpu | None:
    """The vGPU for a session's part on another GPU (`vgpus`: that GPU's)."""
    return _or_new(least_busy(vgpus), grow)


def _or_new(vg: VGpu | None, grow: Callable[[int], VGpu | None] | None) -> VGpu | None:
    if vg is not None and vg.sessions and grow is not None:
        return grow(vg.gpu) or vg
    return vg
