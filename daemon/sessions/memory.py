"""What memory a session holds, as tables a vGPU thread checks every pointer against: its
allocations (by base, sorted), its module variables, and its pinned host ranges. Mixed into
Session."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError

if TYPE_CHECKING:
    pass

log = logging.getLogger("pilot.session")


def _within(bases: list[int], sizes: dict[int, int], ptr: int, count: int) -> bool:
    """Whether [ptr, ptr+count) lies inside one of the ranges base..base+sizes[base]; `bases` is
    the sorted list of sizes' keys."""
    i = bisect.bisect_right(bases, ptr) - 1
    return i >= 0 and ptr + count <= bases[i] + sizes[bases[i]]


class MemoryTables:
    """Methods of Session (its fields are declared there)."""

    def add_allocation(self, ptr: int, size: int, managed: bool = False, pitched: bool = False,
                       driver_zeroed: bool = False) -> None:
        self.allocations[ptr] = size
        if driver_zeroed:
            self.driver_zeroed.add(ptr)
        bisect.insort(self._bases, ptr)
        if self.fast_ranges is not None and not managed:
            self.fast_ranges(ptr, size)
        if pitched:
            self.pitched.add(ptr)
        if managed:
            self.managed.add(ptr)
            self.managed_bytes += size
        else:
            self.device_bytes += size

    def allocation_kind(self, ptr: int) -> str:
        """The broker's kind of one of the session's allocations."""
        return "managed" if ptr in self.managed else "pitch" if ptr in self.pitched else "device"

    def remove_allocation(self, ptr: int) -> int:
        size = self.allocations.pop(ptr, None)
        if size is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not an allocation of this session")
        del self._bases[bisect.bisect_left(self._bases, ptr)]
        if self.fast_ranges is not None:
            self.fast_ranges(ptr, 0)
        if self.graphs:  # their checks are checked again before they run (ops/graphs.py)
            self.graphs_stale()
        self.pitched.discard(ptr)
        self.driver_zeroed.discard(ptr)
        if ptr in self.managed:
            self.managed.discard(ptr)
            self.auto_prefetched.pop(ptr, None)
            self.managed_bytes -= size
        else:
            self.device_bytes -= size
        return size

    def add_import(self, base: int, size: int) -> None:
        """Another process's allocation, opened through CUDA IPC: memory of this session for
        every check, never one of its allocations (its cudaFree is refused)."""
        self.imports[base] = size
        bisect.insort(self._import_bases, base)
        if self.fast_ranges is not None:
            self.fast_ranges(base, size)

    def remove_import(self, base: int) -> None:
        del self.imports[base]
        del self._import_bases[bisect.bisect_left(self._import_bases, base)]
        if self.fast_ranges is not None:
            self.fast_ranges(base, 0)
        if self.graphs:
            self.graphs_stale()

    def held_allocations(self) -> list[tuple[str, int, int]]:
        """(kind, ptr, size) of every allocation, array (ptr: its handle) and pinned range the
        session holds."""
        held = [(self.allocation_kind(p), p, n) for p, n in list(self.allocations.items())]
        held += [("array", h, rec.charged) for h, rec in list(self.arrays.items())]
        return held + [("pinned", r.base, r.length) for r in list(self.pinned.values())]

    def check_range(self, ptr: int, count: int) -> None:
        """Raise unless [ptr, ptr+count) lies inside one allocation, one module variable or one
        range opened through CUDA IPC of this session."""
        if _within(self._bases, self.allocations, ptr, count) or (
                self.symbols and _within(self._symbol_bases, self.symbols, ptr, count)) or (
                self.imports and _within(self._import_bases, self.imports, ptr, count)):
            return
        if self.group is not None and self.group.owns(ptr, count, self):
            return  # memory of the session on another device (devices.py)
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"[{ptr:#x}, +{count}) is not memory of this session")

    def owns_allocation_range(self, ptr: int, count: int) -> bool:
        """[ptr, ptr+count) lies inside one of this session's own device allocations."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return False
        base = self._bases[i]
        return ptr + count <= base + self.allocations[base] and base not in self.managed

    def add_symbol(self, module: int, ptr: int, size: int) -> None:
        """Record a variable of the session's module `module` (a handle) as its memory."""
        if ptr in self.symbols:
            return
        self.symbols[ptr] = size
        self._symbol_modules[ptr] = module
        bisect.insort(self._symbol_bases, ptr)

    def forget_module_symbols(self, module: int) -> None:
        """The module is going away: its variables are no memory of the session any more."""
        if self.graphs:
            self.graphs_stale()
        for ptr in [p for p, mod in self._symbol_modules.items() if mod == module]:
            del self.symbols[ptr]
            del self._symbol_modules[ptr]
            del self._symbol_bases[bisect.bisect_left(self._symbol_bases, ptr)]

    def add_pinned(self, r: Any) -> None:
        self.pinned[r.base] = r
        bisect.insort(self._pinned_bases, r.base)
        self.pinned_bytes += r.length

    def pop_pinned(self, base: int) -> Any:
        r = self.pinned.pop(base)
        del self._pinned_bases[bisect.bisect_left(self._pinned_bases, base)]
        self.pinned_bytes -= r.length
        return r

    def pinned_view(self, ptr: int, count: int) -> tuple[Any, int]:
        """(range, the daemon's address of the client's [ptr, ptr+count)) for a pinned range of
        this session, on any of its devices, that holds it; (None, 0) if none does."""
        parts = list(self.group.parts.values()) if self.group is not None else [self]
        for part in [self, *(p for p in parts if p is not self)]:
            bases = list(part._pinned_bases)  # another part's table may change meanwhile
            i = bisect.bisect_right(bases, ptr) - 1
            r = part.pinned.get(bases[i]) if i >= 0 else None
            address = r.host(ptr, count) if r is not None else None
            if address is not None:
                return r, address
        return None, 0
