"""Freed device memory on its way back to the driver: zeroed by a stream-ordered memset, held
here until that memset is done, then freed.

Tenants share one CUDA context, whose allocator hands freed memory to the next allocation as it
was, so every freed allocation is zeroed before anyone can get it again (natively each process
has its own context). Waiting for the zeroing inside cudaFree put a memset, a stream
synchronization and cuMemFree on every free's critical path; now cudaFree answers once the
memset is queued, and the vGPU thread frees the memory when the event after it has completed
(checked between calls, `poll`). Until then the memory is in neither the tenant's hands nor the
driver's free pool, so no one can be given it before it is zero.

cudaFree's memset follows work pilotd has synchronized, so it is done in microseconds.
cudaFreeAsync's (ops/mempool.py) is queued on the program's stream after work that may still
run for long: such a block is *behind work* (`session` set). Nothing waits for it but `drain`;
only the session that freed it may take it back early, for an allocation on the very stream
its zeroing is queued on (`take` with that session and stream): everything the program issues
there afterwards runs after the memset, and no other tenant ever sees the block. Its memset is
still to run, so until it has, a later free of the block (on any stream) counts it too: the
block reaches no one else before every zeroing queued on it is done.

Zeroed blocks of up to 64 MiB are kept a while (at most 256 blocks, 1 GiB per vGPU) and a
cudaMalloc of exactly such a size takes one (`take`) instead of calling cuMemAlloc: a program
that allocates and frees in a loop then pays neither cuMemAlloc nor cuMemFree, as with the
driver's own caching. The bounds fit a training step's scratch: a PyTorch step with
backend:cudaMallocAsync frees and allocates again 29-49 blocks, up to some 256 MiB in all, more
than the 16 blocks and 128 MiB kept before (bench/RESULTS.md, fifteenth session). Kept blocks
are in no tenant's charge, and only this vGPU's own allocations retry after draining them; so
they are kept only while the GPU has room to spare (`room`: what it can still grant, more than
KEEP_MARGIN beyond them), trimmed as that room shrinks, and all freed once the vGPU has kept
nothing for KEEP_IDLE_S. A block given out is zero, whoever had it before. An allocation that
fails for want of memory while some is held or kept here is retried after `drain`
(vgpu/dispatch.py), and cudaMemGetInfo drains what is not behind work first, so holding it
never makes a program see less memory than the GPU would.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pilot.daemon.backends.base import EVENT_DISABLE_TIMING, Backend

log = logging.getLogger("pilot.session")

SPARE_EVENTS = 16
KEEP_BLOCKS = 256  # zeroed blocks kept for reuse, at most
KEEP_BYTES = 1 << 30
KEEP_BLOCK_MAX = 64 << 20  # larger ones are freed at once
KEEP_MARGIN = 2 << 30  # kept blocks only within the GPU's ungranted memory less this
KEEP_IDLE_S = 5.0  # kept blocks are freed once none was kept or taken for this long


@dataclass(slots=True)
class _Zeroing:
    """A freed block whose memset is queued on `stream`, followed by `event`; `earlier`: the
    events after its earlier zeroings, still queued when the block was taken back early."""

    ptr: int
    size: int
    event: Any
    stream: Any
    session: int | None  # freed in stream order (behind that session's work), else None
    earlier: tuple[Any, ...] = ()

    @property
    def events(self) -> tuple[Any, ...]:
        return (*self.earlier, self.event)

    def reusable_by(self, session: int, stream: Any) -> bool:
        """Whether `session`'s allocation on `stream` may take it before its zeroing is done."""
        return self.session == session and self.stream is stream


class Quarantine:
    """One vGPU thread's freed allocations whose zeroing is under way (oldest first)."""

    def __init__(self, backend: Backend, room: Callable[[], int] | None = None) -> None:
        self.backend = backend
        self.room = room  # bytes the GPU can still grant (its budget less what sessions hold)
        self.clock = time.monotonic  # tests replace it
        self._kept_at = 0.0  # when a block was last kept or taken from the kept ones
        self._held: deque[_Zeroing] = deque()
        self._spare: list[Any] = []
        self.bytes = 0  # held, being zeroed
        self._kept: dict[int, int] = {}  # zeroed blocks, ptr -> size, oldest first
        self._kept_by_size: dict[int, list[int]] = {}  # the same, by size (take: no scan)
        self.kept_bytes = 0
        # blocks taken back before their zeroing ran -> the events after those zeroings
        self._reused: dict[int, tuple[Any, ...]] = {}

    def __bool__(self) -> bool:
        """Something is being zeroed, or kept (the vGPU thread polls while it is)."""
        return bool(self._held or self._reused or self._kept)

    def holds_memory(self) -> bool:
        """Memory is held or kept here: a drain would give some back to the driver."""
        return bool(self._held or self._kept)

    def free_later(self, ptr: int, size: int, stream: Any, session: int | None = None) -> None:
        """Zero [ptr, ptr+size) on `stream` and free it once that is done. Without `session`,
        the work that used it is synchronized; with it, the block was freed in stream order by
        that session and its zeroing runs after what the program queued on `stream` before.
        The calling thread has the allocation's context current."""
        backend = self.backend
        backend.memset_d8(ptr, 0, size, stream)
        event = self._spare.pop() if self._spare else backend.event_create(EVENT_DISABLE_TIMING)
        backend.event_record(event, stream)
        self._held.append(_Zeroing(ptr, size, event, stream, session, self._reused.pop(ptr, ())))
        self.bytes += size

    def poll(self) -> None:
        """Keep or free what is zeroed by now, oldest first. Events of one stream complete in
        order, so after one still under way the later ones of its stream are not asked."""
        busy: set[int] = set()
        still: deque[_Zeroing] = deque()
        for z in self._held:
            if id(z.stream) in busy or not self._done(z):
                busy.add(id(z.stream))
                still.append(z)
            else:
                self._zeroed(z)
        self._held = still
        for ptr, events in list(self._reused.items()):
            if all(self._event_done(ptr, e) for e in events):
                del self._reused[ptr]
                self._release_events(events)
        if self._kept:
            self._trim(idle=self.clock() - self._kept_at > KEEP_IDLE_S)

    def take(self, size: int, session: int | None = None, stream: Any = None) -> int | None:
        """A block of exactly `size` bytes for a new allocation, or None: a zeroed one; else
        one `session` freed on `stream` whose zeroing is queued there (ordered before whatever
        the allocation is used for on that stream); else one whose zeroing follows finished
        work, waited for (its memset: at most 64 MiB, tens of microseconds) rather than calling
        cuMemAlloc, which costs as much or more: an allocate/free loop then reuses its block
        every time, whatever the timing. A block behind another stream's or session's work is
        never waited for here."""
        if self._held:
            self.poll()
        same = self._kept_by_size.get(size)
        if same:
            ptr = same.pop()  # the latest kept of this size
            if not same:
                del self._kept_by_size[size]
            del self._kept[ptr]
            self.kept_bytes -= size
            self._kept_at = self.clock()
            return ptr
        if session is not None:
            z = self._find(lambda z: z.size == size and z.reusable_by(session, stream))
            if z is not None:
                return self._hand_out(z)
        if size > KEEP_BLOCK_MAX:
            return None
        z = self._find(lambda z: z.size == size and z.session is None)
        if z is None:
            return None
        try:
            for event in z.events:  # `earlier` ones: of the synchronized session, done too
                self.backend.event_synchronize(event)
        except Exception as exc:  # a sticky context error: not this block, then
            log.error("zeroing freed memory at %#x failed: %s", z.ptr, exc)
            return None
        return self._hand_out(z)

    def drain(self, behind_work: bool = True, may_wait: Any = None) -> None:
        """Wait for every zeroing and free it all (before an allocation is retried, the
        thread's end). With `behind_work` False, blocks freed in stream order are only freed if
        their zeroing is done by now, never waited for (cudaMemGetInfo: natively a pool holds
        such memory until its stream gets there); with `may_wait`, only those of the sessions
        it accepts (an id) are waited for (none behind a host callback's gate)."""
        held = self._held
        self._held = deque()
        for z in held:
            waits = behind_work and (z.session is None or may_wait is None or may_wait(z.session))
            if (z.session is not None or z.earlier) and not waits and not self._done(z):
                self._held.append(z)
                continue
            for event in z.events:
                try:
                    self.backend.event_synchronize(event)
                except Exception as exc:
                    log.error("zeroing freed memory at %#x failed: %s", z.ptr, exc)
            self._release_events(z.events)
            self._free(z.ptr, z.size)
        while self._kept:
            ptr, size = self._pop_oldest_kept()
            self._free(ptr, size, held=False)

    def close(self) -> None:
        self.drain()
        for events in self._reused.values():  # the blocks went with their sessions
            self._release_events(events)
        self._reused.clear()
        for event in self._spare:
            try:
                self.backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
        self._spare.clear()

    def _done(self, z: _Zeroing) -> bool:
        return all(self._event_done(z.ptr, e) for e in z.events)

    def _event_done(self, ptr: int, event: Any) -> bool:
        try:
            return bool(self.backend.event_query(event))
        except Exception as exc:  # a sticky context error: the memory goes with the context
            log.error("zeroing freed memory at %#x failed: %s", ptr, exc)
            return True

    def _find(self, match: Any) -> _Zeroing | None:
        return next((z for z in self._held if match(z)), None)

    def _hand_out(self, z: _Zeroing) -> int:
        """The held block goes to a new allocation. Zeroed (waited for), its events go to the
        spares; taken back early, they are remembered until done (the block's next free counts
        them)."""
        self._held.remove(z)
        self.bytes -= z.size
        if z.session is not None and not self._done(z):
            self._reused[z.ptr] = z.events
        else:
            self._release_events(z.events)
        return z.ptr

    def _zeroed(self, z: _Zeroing) -> None:
        """Its zeroing is done: keep it for reuse (poll trims what is kept beyond the bounds
        once, after all of its zeroed blocks), or free it."""
        self._release_events(z.events)
        self.bytes -= z.size
        if z.size > KEEP_BLOCK_MAX:
            self._free(z.ptr, z.size, held=False)
            return
        self._kept[z.ptr] = z.size
        self._kept_by_size.setdefault(z.size, []).append(z.ptr)
        self.kept_bytes += z.size
        self._kept_at = self.clock()

    def _trim(self, idle: bool = False) -> None:
        """Free the oldest kept blocks beyond the bounds, all of them when `idle`."""
        limit = 0 if idle else self._keep_limit()
        while self._kept and (len(self._kept) > KEEP_BLOCKS or self.kept_bytes > limit):
            old, n = self._pop_oldest_kept()
            self._free(old, n, held=False)

    def _keep_limit(self) -> int:
        """How many bytes may be kept now: KEEP_BYTES, less as the GPU's room nears KEEP_MARGIN."""
        if self.room is None:
            return KEEP_BYTES
        try:
            room = self.room()
        except Exception as exc:  # the budget does not know the GPU: keep nothing
            log.debug("quarantine: no room to read (%s); nothing kept", exc)
            return 0
        return max(0, min(KEEP_BYTES, room - KEEP_MARGIN))

    def _pop_oldest_kept(self) -> tuple[int, int]:
        ptr, size = next(iter(self._kept.items()))
        del self._kept[ptr]
        same = self._kept_by_size[size]
        same.remove(ptr)
        if not same:
            del self._kept_by_size[size]
        self.kept_bytes -= size
        return ptr, size

    def _free(self, ptr: int, size: int, held: bool = True) -> None:
        if held:
            self.bytes -= size
        try:
            self.backend.mem_free(ptr)
        except Exception as exc:
            log.error("freeing %#x (%d bytes) after zeroing failed: %s", ptr, size, exc)

    def _release_events(self, events: tuple[Any, ...]) -> None:
        backend = self.backend
        for event in events:
            if len(self._spare) < SPARE_EVENTS:
                self._spare.append(event)
                continue
            try:
                backend.event_destroy(event)
            except Exception as exc:
                log.debug("event_destroy: %s", exc)
