"""Freed device memory on its way back to the driver: zeroed by a stream-ordered memset, held
here until that memset is done, then freed.

Tenants share one CUDA context, whose allocator hands freed memory to the next allocation as it
was, so every freed allocation is zeroed before anyone can get it again (natively each process
has its own context). Waiting for the zeroing inside cudaFree put a memset, a stream
synchronization and cuMemFree on every free's critical path; now cudaFree answers once the
memset is queued, and the vGPU thread frees the memory when the event after it has completed
(checked between calls, `poll`). Until then the memory is in neither the tenant's hands nor the
driver's free pool, so no one can be given it before it is zero. An allocation that fails for
want of memory while some is held here is retried after `drain` (vgpu/dispatch.py), and
cudaMemGetInfo drains first, so holding it never makes a program see less memory.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from pilot.daemon.backends.base import Backend

log = logging.getLogger("pilot.session")

EVENT_DISABLE_TIMING = 2
SPARE_EVENTS = 16


class Quarantine:
    """One vGPU thread's freed allocations whose zeroing is under way (oldest first)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._held: deque[tuple[int, int, Any]] = deque()  # (ptr, size, event after its zeroing)
        self._spare: list[Any] = []
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self._held)

    def free_later(self, ptr: int, size: int, stream: Any) -> None:
        """Zero [ptr, ptr+size) on `stream` (after the work the caller synchronized) and free it
        once that is done. The calling thread has the allocation's context current."""
        backend = self.backend
        backend.memset_d8(ptr, 0, size, stream)
        event = self._spare.pop() if self._spare else backend.event_create(EVENT_DISABLE_TIMING)
        backend.event_record(event, stream)
        self._held.append((ptr, size, event))
        self.bytes += size

    def poll(self) -> None:
        """Free what is zeroed by now (events complete in stream order: stop at the first that
        is not)."""
        held, backend = self._held, self.backend
        while held:
            ptr, size, event = held[0]
            try:
                if not backend.event_query(event):
                    return
            except Exception as exc:  # a sticky context error: the memory goes with the context
                log.error("zeroing freed memory at %#x failed: %s", ptr, exc)
            held.popleft()
            self._free(ptr, size, event)

    def drain(self) -> None:
        """Wait for every zeroing and free it all (before an allocation is retried, a memory
        report, the thread's end)."""
        held, backend = self._held, self.backend
        while held:
            ptr, size, event = held.popleft()
            try:
                backend.event_synchronize(event)
            except Exception as exc:
                log.error("zeroing freed memory at %#x failed: %s", ptr, exc)
            self._free(ptr, size, event)

    def close(self) -> None:
        self.drain()
        for event in self._spare:
            try:
                self.backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
        self._spare.clear()

    def _free(self, ptr: int, size: int, event: Any) -> None:
        backend = self.backend
        self.bytes -= size
        try:
            backend.mem_free(ptr)
        except Exception as exc:
            log.error("freeing %#x (%d bytes) after zeroing failed: %s", ptr, size, exc)
        if len(self._spare) < SPARE_EVENTS:
            self._spare.append(event)
        else:
            try:
                backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
