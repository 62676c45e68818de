"""Where a session runs: the scheduling decision of the PILOT design that maps work to vGPUs.

HELLO places a new session on the vGPU with the fewest sessions among the GPUs that are not
draining; DEVICE_JOIN places a session's part on another GPU on that GPU's least busy vGPU (a
draining GPU too: the session already runs). Each session has its own default stream
(vgpu/server.py gives it one at ATTACH), so sessions that share a vGPU still overlap on the GPU;
the vGPU thread only serializes their calls' host-side work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu


def least_busy(candidates: Iterable[VGpu]) -> VGpu | None:
    """The vGPU serving the fewest sessions (the first of equals), or None if there is none."""
    return min(candidates, key=lambda v: len(v.sessions), default=None)


def place_session(vgpus: Iterable[VGpu], draining: set[int]) -> VGpu | None:
    """The vGPU for a new session: the least busy one on a GPU that is not draining."""
    return least_busy(v for v in vgpus if v.gpu not in draining)
