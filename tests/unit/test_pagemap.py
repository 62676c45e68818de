"""resources/pagemap.py: bytes of a range in host RAM, from /proc/self/pagemap (the measure of
managed-memory residency that does not rely on pilot's model)."""

from __future__ import annotations

import mmap

import pytest

from pilot.daemon.resources import pagemap
from pilot.daemon.resources.pagemap import PAGE, host_resident

pytestmark = pytest.mark.skipif(not pagemap.os.path.exists("/proc/self/pagemap"), reason="no pagemap")


def _address(m: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def test_touched_pages_count_untouched_and_dropped_do_not() -> None:
    m = mmap.mmap(-1, 64 * PAGE)
    try:
        base = _address(m)
        assert host_resident([(base, 64 * PAGE)]) == 0  # nothing touched yet
        for i in (0, 5, 6, 63):
            m[i * PAGE] = 1
        assert host_resident([(base, 64 * PAGE)]) == 4 * PAGE
        assert host_resident([(base + 5 * PAGE, 2 * PAGE)]) == 2 * PAGE
        assert host_resident([(base + PAGE + 7, 10)]) == 0  # inside one untouched page
        assert host_resident([(base + 6 * PAGE - 1, 2)]) == 2 * PAGE  # spans pages 5 and 6
        assert host_resident([(base, PAGE), (base + 63 * PAGE, PAGE), (base, 0)]) == 2 * PAGE
        m.madvise(mmap.MADV_DONTNEED, 0, 64 * PAGE)  # the kernel drops them
        assert host_resident([(base, 64 * PAGE)]) == 0
    finally:
        m.close()


def test_the_count_without_numpy_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    m = mmap.mmap(-1, 2 * pagemap.CHUNK_PAGES * PAGE // 512)
    try:
        base, size = _address(m), len(m)
        for i in range(0, size // PAGE, 3):
            m[i * PAGE] = 1
        with_numpy = host_resident([(base, size)])
        monkeypatch.setattr(pagemap, "_np", None)
        assert host_resident([(base, size)]) == with_numpy == -(-(size // PAGE) // 3) * PAGE
    finally:
        m.close()
