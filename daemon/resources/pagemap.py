"""Which bytes of a range of pilotd's own memory are in host RAM, from /proc/self/pagemap.

For managed memory this is a measure of residency that does not rely on pilot's model: the
driver unmaps a page from the CPU when it migrates it to the GPU, so a page that is present (or
swapped) in the CPU's page table is in host memory, and what a range holds on the GPU is at most
its size less that (pages never touched are in neither). Each page costs 8 bytes of pagemap to
read; a 6 GiB range is 12 MB.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable

PAGE = os.sysconf("SC_PAGE_SIZE")
ENTRY = 8
IN_RAM = 0b11 << 62  # bit 63: present, bit 62: swapped
CHUNK_PAGES = 1 << 18  # entries read at once (2 MiB of pagemap)

try:  # numpy counts a chunk in C; without it, array does (slower, same answer)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is in every environment pilot is tested in
    _np = None


def _count_in_ram(buf: bytes) -> int:
    if _np is not None:
        entries = _np.frombuffer(buf, dtype="<u8")
        return int(_np.count_nonzero(entries >> _np.uint64(62)))
    entries = array("Q")
    entries.frombytes(buf)
    return sum(1 for e in entries if e & IN_RAM)


def host_resident(ranges: Iterable[tuple[int, int]], path: str = "/proc/self/pagemap") -> int:
    """Bytes of the pages of [ptr, ptr+size) for each (ptr, size) that are in host RAM, whole
    pages counted (so up to a page more than the range at each end)."""
    total = 0
    with open(path, "rb", buffering=0) as f:
        for ptr, size in ranges:
            if size <= 0:
                continue
            first, end = ptr // PAGE, -(-(ptr + size) // PAGE)
            page = first
            while page < end:
                n = min(CHUNK_PAGES, end - page)
                buf = os.pread(f.fileno(), n * ENTRY, page * ENTRY)
                total += _count_in_ram(buf)
                page += n
    return total * PAGE
