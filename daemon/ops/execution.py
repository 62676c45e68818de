"""Launches with attributes: cudaLaunchKernelExC and cudaLaunchCooperativeKernel (shim/api_launch_ex.c).

The shim has parsed the program's attributes and refused those pilot does not carry; what
arrives is cooperative or not, an optional cluster shape and scheduling preference, and an
optional priority. Cooperative and cluster launches come as calls, not posts, because only the
device knows whether it can run them (cudaErrorCooperativeLaunchTooLarge and the cluster errors
are returned by the launch itself, natively too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
    LaunchAttrs,
)
from pilot.daemon.ops.handlers import handler
from pilot.daemon.protocol import lib
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu


@handler(lib.PILOT_OP_LAUNCH_EX, "pilot_req_launch_ex")
def launch_ex(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    base = req.launch
    info = s.functions.get(base.function)
    if info is None:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION, f"no function {base.function:#x}")
    if len(payload) != info.arg_bytes:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"kernel arguments: {len(payload)} bytes, expected {info.arg_bytes}")
    cluster = tuple(req.cluster)
    attrs = LaunchAttrs(cooperative=bool(req.cooperative),
                        cluster=(cluster[0], cluster[1], cluster[2]) if any(cluster) else None,
                        cluster_policy=req.cluster_policy,
                        priority=req.priority if req.has_priority else None)
    g, b = base.grid, base.block
    vg.backend.launch_ex(info.handle, (g[0], g[1], g[2]), (b[0], b[1], b[2]), base.shared_bytes,
                         streams.stream_for_work(vg, s, base.stream), payload[:], attrs)
    vg.shard.kernels += 1
