"""Session.prefetch_hidden: pilotd prefetches small new managed allocations itself
(ops/unified.py malloc_managed); a query of the last prefetch location answers as for pages never
prefetched unless the program's own prefetches cover the whole queried range."""

from __future__ import annotations

from pilot.daemon.sessions.session import Credentials, Session

MIB = 1 << 20
A, B = 0x7F0000000000, 0x7F0000400000  # two managed allocations of 2 MiB


def _session() -> Session:
    s = Session(id=1, creds=Credentials(uid=0, gid=0, pid=0), vgpu=0, device=0)
    for base in (A, B):
        s.add_allocation(base, 2 * MIB, managed=True)
        s.pilot_prefetched(base)
    return s


def test_pages_only_pilotd_prefetched_are_hidden() -> None:
    s = _session()
    assert s.prefetch_hidden(A, 2 * MIB) and s.prefetch_hidden(A + 4096, 1)
    assert not s.prefetch_hidden(A + 2 * MIB, 4096)  # between the allocations: none of them


def test_the_programs_prefetches_uncover_what_they_cover() -> None:
    s = _session()
    s.program_prefetched(A, MIB)
    assert not s.prefetch_hidden(A, MIB) and not s.prefetch_hidden(A + 100, 200)
    assert s.prefetch_hidden(A, 2 * MIB)  # half of it only pilotd prefetched
    s.program_prefetched(A + MIB + 4096, MIB - 4096)
    assert s.prefetch_hidden(A + MIB, 4096)  # the gap left
    s.program_prefetched(A + MIB - 4096, 2 * 4096)  # overlapping pieces close it
    assert not s.prefetch_hidden(A, 2 * MIB) and A not in s.auto_prefetched
    assert s.prefetch_hidden(B, 4096)  # the other allocation is untouched


def test_a_prefetch_spanning_allocations_counts_for_each_and_a_free_forgets() -> None:
    s = _session()
    s.program_prefetched(A + MIB, B - A)  # the end of A, the gap, the first half of B
    assert not s.prefetch_hidden(A + MIB, MIB) and not s.prefetch_hidden(B, MIB)
    assert s.prefetch_hidden(A, 4096) and s.prefetch_hidden(B + MIB, 4096)
    s.remove_allocation(B)
    assert B not in s.auto_prefetched and s.prefetch_hidden(A, 4096)
