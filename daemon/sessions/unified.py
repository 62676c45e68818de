"""The client's shadows of the session's managed ranges (unified memory), and the per-range
accounting the memory policies read. Mixed into Session."""

from __future__ import annotations

import bisect
import logging
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

log = logging.getLogger("pilot.session")
_POINTER = struct.Struct("<Q")


class UnifiedMemory:
    """Methods of Session (its fields are declared there)."""

    def add_shadow(self, shadow: Any) -> None:
        self.shadows[shadow.base] = shadow
        bisect.insort(self._shadow_bases, shadow.base)
        if self.fast_shadows is not None:
            self.fast_shadows.added(shadow)

    def add_shadow_segment(self, shadow: Any, lo: int, hi: int) -> None:
        """More managed memory inside one of the session's shadows (a __managed__ variable's
        range the client already maps)."""
        shadow.add_segment(lo, hi)
        if self.fast_shadows is not None:
            self.fast_shadows.added(shadow)

    def pop_shadow(self, base: int) -> Any:
        """The shadow mapped at base (removed), or None."""
        shadow = self.shadows.pop(base, None)
        if shadow is not None:
            del self._shadow_bases[bisect.bisect_left(self._shadow_bases, base)]
            if self.fast_shadows is not None:
                self.fast_shadows.removed(shadow)
        return shadow

    def pilot_prefetched(self, base: int) -> None:
        """pilotd prefetched the managed allocation at base to the GPU on its own."""
        self.auto_prefetched[base] = []

    def program_prefetched(self, ptr: int, count: int) -> None:
        """The program prefetched [ptr, ptr+count): for those pages the driver's last prefetch
        location is the program's own."""
        for base, end, lo, hi in self._auto_prefetched_in(ptr, count):
            done = self.auto_prefetched[base]
            done.append((lo, hi))
            if _covered(done, base, end):
                del self.auto_prefetched[base]

    def prefetch_hidden(self, ptr: int, count: int) -> bool:
        """Whether [ptr, ptr+count) holds pages only pilotd prefetched (a query of their last
        prefetch location answers as for pages never prefetched)."""
        return any(not _covered(self.auto_prefetched[base], lo, hi)
                   for base, _end, lo, hi in self._auto_prefetched_in(ptr, count))

    def _auto_prefetched_in(self, ptr: int, count: int) -> list[tuple[int, int, int, int]]:
        """(base, end, lo, hi) of each allocation pilotd prefetched that [ptr, ptr+count)
        overlaps, [lo, hi) the overlap: found through the sorted allocation bases, so a call
        costs the allocations it touches, not all the session's."""
        if not self.auto_prefetched:
            return []
        out = []
        i = max(bisect.bisect_right(self._bases, ptr) - 1, 0)
        while i < len(self._bases) and self._bases[i] < ptr + count:
            base = self._bases[i]
            end = base + self.allocations[base]
            lo, hi = max(ptr, base), min(ptr + count, end)
            if lo < hi and base in self.auto_prefetched:
                out.append((base, end, lo, hi))
            i += 1
        return out

    def drop_shadow(self, ptr: int) -> None:
        """The managed allocation at ptr is going away: forget the client's shadow of it."""
        shadow = self.shadow_of(ptr)
        if shadow is not None and shadow.kind == "allocation" and shadow.lo == ptr:
            self.pop_shadow(shadow.base)

    def note_managed_launch(self, args: memoryview) -> None:
        """Accounting for the memory policies: each managed range a launch passes a pointer to
        (any 8-byte-aligned argument word, struct members included) counts one launch."""
        seen: set[int] = set()
        for (word,) in _POINTER.iter_unpack(args[: len(args) - len(args) % 8]):
            shadow = self.shadow_of(word) if word else None
            if shadow is not None and shadow.base not in seen:
                seen.add(shadow.base)
                shadow.launches += 1

    def shadow_covering(self, ptr: int) -> Any:
        """The shadow whose mapping [base, base+length) holds ptr, or None."""
        i = bisect.bisect_right(self._shadow_bases, ptr) - 1
        if i < 0:
            return None
        shadow = self.shadows[self._shadow_bases[i]]
        return shadow if ptr < shadow.base + shadow.length else None

    def shadow_of(self, ptr: int) -> Any:
        """The shadow whose managed range holds ptr, or None."""
        i = bisect.bisect_right(self._shadow_bases, ptr) - 1
        if i < 0:
            return None
        shadow = self.shadows[self._shadow_bases[i]]
        return shadow if shadow.holds(ptr) else None


def _covered(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether the ranges together cover [lo, hi)."""
    at = lo
    for a, b in sorted(ranges):
        if a > at:
            break
        at = max(at, b)
        if at >= hi:
            return True
    return at >= hi
