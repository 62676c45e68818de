"""The stream-ordered allocator (chapter 6.12; shim/runtime/memory/api_mempool.c): cudaMallocAsync
and cudaFreeAsync, which never wait for the GPU.

A free in stream order takes the allocation from the session at once (no later call of it may
use the pointer; the tenant's charge goes back and the policy hears of it, as with cudaFree)
and queues its zeroing on the program's stream, after the work issued there before the free;
the memory goes back to the driver, or to the next allocation, once the zeroing is done
(sessions/quarantine.py). As natively, work the program did not order before the free (another
stream, unsynchronized) is a use after free: device code is not confined (docs/SECURITY.md).
An allocation on the same stream may take such a block back at once. Managed memory is freed
the synchronous way (ops/memory.py `free`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.ops.memory import (
    allocate_device,
    check_allocation,
    free_after_work,
    release_allocation,
)
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import u64
from pilot.daemon.protocol import lib
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("mempool")


def _backend_stream(vg: VGpu, s: Session, handle: int) -> Any:
    """The backend stream a program stream handle issues on now, with no ordering work: only to
    recognize blocks whose zeroing is queued there (raises for an unknown handle)."""
    return s.legacy or vg.stream if handle == 0 else s.stream(handle).obj

@OPS.handler(lib.PILOT_OP_MALLOC_ASYNC, "pilot_req_malloc_async")
def malloc_async(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    stream = _backend_stream(vg, s, req.stream)
    return u64(allocate_device(vg, s, req.size, stream))

@OPS.handler(lib.PILOT_OP_FREE_ASYNC, "pilot_req_free_async")
def free_async(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ptr = req.ptr
    check_allocation(s, ptr)
    if s.holds_managed(ptr) or vg.broker.ipc.is_exported(s.id, ptr):  # IPC: ops/ipc.py
        if req.stream:
            s.stream(req.stream)  # an unknown stream is refused before anything changes
        free_after_work(vg, s, ptr)
        return
    stream = streams.stream_for_work(vg, s, req.stream)  # raises for an unknown stream
    size = s.allocations[ptr]
    if size:
        vg.quarantine.free_later(ptr, size, stream, s.id)
    else:
        vg.backend.mem_free(ptr)
    release_allocation(vg, s, ptr)
