"""The daemon's side of a unified-memory shadow.

A shadow is the client's private memory at a managed range's own address (shim/runtime/managed/coherence.c);
the daemon keeps its extent, the managed segments inside it and the accounting.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError

PAGE = mmap.PAGESIZE


@dataclass(eq=False)
class Shadow:
    """What the daemon knows of a client shadow mapped at `base` (page-aligned, `length` bytes)
    over managed memory: the segments [lo, hi) it may copy (one allocation, or the __managed__
    variables whose ranges fall inside it). The shadow's bytes are the client's private memory;
    they reach the daemon only through staging slots (daemon/managed.py)."""

    base: int
    length: int
    segments: list[tuple[int, int]]
    kind: str  # "allocation" or "variable"
    chunk: int  # the client's chunk size
    # accounting for the policies
    flushes: int = 0
    flushed_bytes: int = 0
    dirty_chunks: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    launches: int = 0  # launches that passed a pointer into the range as an argument

    @classmethod
    def attach(cls, base: int, length: int, segments: list[tuple[int, int]], kind: str,
               chunk: int) -> Shadow:
        if base % PAGE or length <= 0 or length % PAGE:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow {base:#x}+{length} is not whole pages")
        if chunk < PAGE or chunk & (chunk - 1):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow chunk size {chunk}")
        segments = sorted((max(lo, base), min(hi, base + length)) for lo, hi in segments)
        segments = [(lo, hi) for lo, hi in segments if lo < hi]
        if not segments:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no managed memory in {base:#x}+{length}")
        return cls(base, length, segments, kind, chunk)

    def add_segment(self, lo: int, hi: int) -> None:
        lo, hi = max(lo, self.base), min(hi, self.base + self.length)
        if lo < hi and (lo, hi) not in self.segments:
            self.segments = sorted([*self.segments, (lo, hi)])

    def covers(self, address: int, count: int) -> bool:
        return count > 0 and self.base <= address and address + count <= self.base + self.length

    def pieces(self, address: int, count: int) -> list[tuple[int, int]]:
        """(device address, bytes) of each part of [address, address+count), a range of the
        shadow, that lies in managed memory. Raises for a range outside the shadow."""
        if not self.covers(address, count):
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"{address:#x}+{count} outside shadow {self.base:#x}+{self.length}")
        end = address + count
        out = []
        for lo, hi in self.segments:
            a, b = max(address, lo), min(end, hi)
            if a < b:
                out.append((a, b - a))
        return out

    def chunks_starting_in(self, address: int, count: int) -> int:
        """How many of the client's chunks begin in [address, address+count): a flushed run of
        dirty chunks may come in pieces of any size, each chunk is counted by one of them."""
        off = address - self.base
        return (off + count - 1) // self.chunk + 1 - (off + self.chunk - 1) // self.chunk

    @property
    def lo(self) -> int:
        return self.segments[0][0]

    def holds(self, ptr: int) -> bool:
        return any(lo <= ptr < hi for lo, hi in self.segments)

    def summary(self) -> dict[str, int | str]:
        return {"base": self.lo, "bytes": sum(hi - lo for lo, hi in self.segments), "kind": self.kind,
                "flushes": self.flushes, "flushed_bytes": self.flushed_bytes,
                "host_dirty_chunks": self.dirty_chunks, "fetches": self.fetches,
                "fetched_bytes": self.fetched_bytes, "launches": self.launches}
