"""Freed device memory on its way back to the driver: zeroed by a stream-ordered memset, held
here until that memset is done, then freed.

Tenants share one CUDA context, whose allocator hands freed memory to the next allocation as it
was, so every freed allocation is zeroed before anyone can get it again (natively each process
has its own context). Waiting for the zeroing inside cudaFree put a memset, a stream
synchronization and cuMemFree on every free's critical path; now cudaFree answers once the
memset is queued, and the vGPU thread frees the memory when the event after it has completed
(checked between calls, `poll`). Until then the memory is in neither the tenant's hands nor the
driver's free pool, so no one can be given it before it is zero.

Zeroed blocks of up to 64 MiB are kept a while (at most 16 blocks, 128 MiB per vGPU) and a cudaMalloc of
exactly such a size takes one (`take`) instead of calling cuMemAlloc: a program that allocates
and frees in a loop then pays neither cuMemAlloc nor cuMemFree, as with the driver's own
caching. A block given out is zero, whoever had it before. An allocation that fails for want of
memory while some is held here is retried after `drain` (vgpu/dispatch.py), and cudaMemGetInfo
drains first, so holding it never makes a program see less memory.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from pilot.daemon.backends.base import Backend

log = logging.getLogger("pilot.session")

EVENT_DISABLE_TIMING = 2
SPARE_EVENTS = 16
KEEP_BLOCKS = 16  # zeroed blocks kept for reuse, at most
KEEP_BYTES = 128 << 20
KEEP_BLOCK_MAX = 64 << 20  # larger ones are freed at once


class Quarantine:
    """One vGPU thread's freed allocations whose zeroing is under way (oldest first)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._held: deque[tuple[int, int, Any]] = deque()  # (ptr, size, event after its zeroing)
        self._spare: list[Any] = []
        self.bytes = 0  # held, being zeroed
        self._kept: deque[tuple[int, int]] = deque()  # zeroed blocks (ptr, size), oldest first
        self.kept_bytes = 0

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
        """Keep or free what is zeroed by now, oldest first (stops at the first still under way:
        the rest is looked at next time)."""
        held, backend = self._held, self.backend
        while held:
            ptr, size, event = held[0]
            try:
                if not backend.event_query(event):
                    return
            except Exception as exc:  # a sticky context error: the memory goes with the context
                log.error("zeroing freed memory at %#x failed: %s", ptr, exc)
            held.popleft()
            self._zeroed(ptr, size, event)

    def take(self, size: int) -> int | None:
        """A zeroed block of exactly `size` bytes for a new allocation, or None. A block of that
        size still being zeroed is waited for (its memset: at most 64 MiB, tens of microseconds)
        rather than calling cuMemAlloc, which costs as much or more: an allocate/free loop then
        reuses its block every time, whatever the timing."""
        if self._held:
            self.poll()
        kept = self._kept
        for i, (ptr, n) in enumerate(kept):
            if n == size:
                del kept[i]
                self.kept_bytes -= n
                return ptr
        if size > KEEP_BLOCK_MAX:
            return None
        for i, (ptr, n, event) in enumerate(self._held):
            if n == size:
                try:
                    self.backend.event_synchronize(event)
                except Exception as exc:  # a sticky context error: not this block, then
                    log.error("zeroing freed memory at %#x failed: %s", ptr, exc)
                    return None
                del self._held[i]
                self._release_event(event)
                self.bytes -= n
                return ptr
        return None

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
            self._release_event(event)
            self._free(ptr, size)
        while self._kept:
            ptr, size = self._kept.popleft()
            self.kept_bytes -= size
            self._free(ptr, size, held=False)

    def close(self) -> None:
        self.drain()
        for event in self._spare:
            try:
                self.backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
        self._spare.clear()

    def _zeroed(self, ptr: int, size: int, event: Any) -> None:
        """Its zeroing is done: keep it for reuse, or free it (and the oldest kept beyond the
        limits)."""
        self._release_event(event)
        self.bytes -= size
        if size > KEEP_BLOCK_MAX:
            self._free(ptr, size, held=False)
            return
        self._kept.append((ptr, size))
        self.kept_bytes += size
        while len(self._kept) > KEEP_BLOCKS or self.kept_bytes > KEEP_BYTES:
            old, n = self._kept.popleft()
            self.kept_bytes -= n
            self._free(old, n, held=False)

    def _free(self, ptr: int, size: int, held: bool = True) -> None:
        if held:
            self.bytes -= size
        try:
            self.backend.mem_free(ptr)
        except Exception as exc:
            log.error("freeing %#x (%d bytes) after zeroing failed: %s", ptr, size, exc)

    def _release_event(self, event: Any) -> None:
        backend = self.backend
        if len(self._spare) < SPARE_EVENTS:
            self._spare.append(event)
        else:
            try:
                backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
