"""sessions/quarantine.py: freed memory is zeroed on a stream, freed only once that is done, in
order; drained whole before an allocation is retried (vgpu/dispatch.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pilot.daemon.backends.base import CUDA_ERROR_MEMORY_ALLOCATION, BackendError
from pilot.daemon.sessions.quarantine import (
    KEEP_BLOCK_MAX,
    KEEP_BLOCKS,
    KEEP_IDLE_S,
    KEEP_MARGIN,
    Quarantine,
)


class FakeBackend:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.done: set[str] = set()
        self.made = 0

    def memset_d8(self, ptr: int, value: int, count: int, stream: Any) -> None:
        self.calls.append(("memset", ptr, value, count, stream))

    def event_create(self, flags: int) -> str:
        self.made += 1
        return f"ev{self.made}"

    def event_record(self, event: str, stream: Any) -> None:
        self.calls.append(("record", event, stream))
        self.done.discard(event)  # recorded again: not complete until its new work is

    def event_query(self, event: str) -> bool:
        return event in self.done

    def event_synchronize(self, event: str) -> None:
        self.calls.append(("sync", event))

    def event_destroy(self, event: str) -> None:
        self.calls.append(("destroy", event))

    def mem_free(self, ptr: int) -> None:
        self.calls.append(("free", ptr))


def test_freed_only_after_its_zeroing_and_in_order() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s")
    q.free_later(0x2000, 512, "s")
    assert b.calls == [("memset", 0x1000, 0, 256, "s"), ("record", "ev1", "s"),
                       ("memset", 0x2000, 0, 512, "s"), ("record", "ev2", "s")]
    assert q and q.bytes == 768
    b.calls.clear()
    q.poll()
    assert b.calls == []  # nothing zeroed yet: nothing freed
    b.done.add("ev2")  # cannot be: events of one stream complete in order; poll stops at ev1
    q.poll()
    assert b.calls == []
    b.done.add("ev1")
    q.poll()
    # zeroed now: kept for a cudaMalloc of the same size, not freed yet
    # (kept blocks keep it truthy: the vGPU thread polls to trim them)
    assert b.calls == [] and q and q.bytes == 0 and q.kept_bytes == 768
    assert q.take(512) == 0x2000 and q.take(512) is None and q.take(100) is None
    q.free_later(0x3000, 64, "s")  # events are reused
    assert b.made == 2
    b.calls.clear()
    assert q.take(64) == 0x3000  # still being zeroed: handed out only after waiting for it
    assert b.calls == [("sync", "ev2")]  # (the spare events are reused last first)


def test_what_is_kept_for_reuse_is_bounded() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    big = KEEP_BLOCK_MAX + 1
    q.free_later(0x100000000, big, "s")
    for i in range(KEEP_BLOCKS + 2):
        q.free_later(0x1000 * (i + 1), 4096, "s")
    b.done.update(f"ev{i}" for i in range(1, KEEP_BLOCKS + 10))
    b.calls.clear()
    q.poll()
    frees = [c[1] for c in b.calls if c[0] == "free"]
    # the large block at once, then the two oldest beyond the count limit
    assert frees == [0x100000000, 0x1000, 0x2000]
    assert q.kept_bytes == KEEP_BLOCKS * 4096
    q.drain()  # everything kept goes back to the driver
    assert q.kept_bytes == 0 and len([c for c in b.calls if c[0] == "free"]) == 3 + KEEP_BLOCKS


def test_drain_waits_for_every_zeroing() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s")
    q.free_later(0x2000, 256, "t")
    b.calls.clear()
    q.drain()
    assert b.calls == [("sync", "ev1"), ("free", 0x1000), ("sync", "ev2"), ("free", 0x2000)]
    q.close()
    assert ("destroy", "ev1") in b.calls and ("destroy", "ev2") in b.calls


def dispatch_over(b: FakeBackend) -> Any:
    from pilot.daemon.vgpu.dispatch import Dispatch

    vg = Dispatch()
    vg.quarantine = Quarantine(b)  # type: ignore[arg-type]
    return vg


def allocation_until_freed(b: FakeBackend, ptr: int) -> tuple[Any, list[list[Any]]]:
    """A handler whose allocation fails for want of memory until `ptr` is freed, and the
    backend's calls so far at each of its attempts."""
    attempts: list[list[Any]] = []

    def allocate(vg: Any, s: Any, req: Any, payload: Any) -> str:
        attempts.append(list(b.calls))
        if ("free", ptr) not in b.calls:
            raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION, "out of memory")
        return "ptr"

    return SimpleNamespace(fn=allocate), attempts


def test_an_allocation_short_of_memory_is_tried_again_after_a_drain() -> None:
    b = FakeBackend()
    vg = dispatch_over(b)
    vg.quarantine.free_later(0x1000, 256, "s")
    prepared, _ = allocation_until_freed(b, 0x1000)
    assert vg._after_drain(prepared, None, None, None) == ("ptr", 0)
    assert not vg.quarantine


def test_a_block_still_being_zeroed_is_waited_for_not_allocated_anew() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s")
    q.free_later(0x2000, 512, "s")
    assert q.take(1024) is None  # no block of that size: cuMemAlloc
    assert q.take(512) == 0x2000  # its memset is waited for, not the one before it
    assert b.calls[-1] == ("sync", "ev2")
    assert q.bytes == 256 and q.take(512) is None
    assert q.take(KEEP_BLOCK_MAX + 4096) is None  # never kept, never waited for
    b.done.add("ev1")
    q.poll()
    assert q.take(256) == 0x1000 and not q
    assert ("free", 0x1000) not in b.calls and ("free", 0x2000) not in b.calls


def test_blocks_of_other_streams_are_not_held_up_by_a_busy_one() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s", session=1)  # behind the program's long work on s
    q.free_later(0x2000, 256, "s", session=1)
    q.free_later(0x3000, 512, "t")
    b.done.add("ev3")
    b.calls.clear()
    q.poll()
    # s's first is under way, so its second is not asked; t's is done and kept
    assert q.bytes == 512 and q.kept_bytes == 512 and q.take(512) == 0x3000
    b.done.update(("ev1", "ev2"))
    q.poll()
    assert q.bytes == 0 and q.kept_bytes == 512


def test_blocks_behind_a_programs_work_are_never_waited_for_by_others() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s", session=1)
    b.calls.clear()
    assert q.take(256) is None  # cudaMalloc: cuMemAlloc rather than wait behind the program
    assert q.take(256, 2, "s") is None and q.take(256, 1, "t") is None
    assert b.calls == []
    assert q.take(256, 1, "s") == 0x1000  # its own stream: ordered after the zeroing already
    assert b.calls == [] and q.bytes == 0 and q  # its zeroing is watched until it ran
    b.done.add("ev1")
    q.poll()
    assert not q


def test_a_memory_report_drains_only_what_is_not_behind_a_programs_work() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s", session=1)
    q.free_later(0x2000, 256, "t")
    b.calls.clear()
    q.drain(behind_work=False)
    assert b.calls == [("sync", "ev2"), ("free", 0x2000)] and q.bytes == 256
    b.done.add("ev1")  # done by now: freed without a wait
    q.drain(behind_work=False)
    assert b.calls[-1] == ("free", 0x1000) and not q.holds_memory()


def test_an_allocation_short_of_memory_waits_for_blocks_behind_work_last() -> None:
    b = FakeBackend()
    vg = dispatch_over(b)
    vg.quarantine.free_later(0x1000, 256, "s", session=1)
    vg.quarantine.free_later(0x2000, 256, "t")
    prepared, attempts = allocation_until_freed(b, 0x1000)
    assert vg._after_drain(prepared, None, None, None) == ("ptr", 0)
    # first without waiting behind the program's work, then waiting for it too
    assert ("free", 0x2000) in attempts[0] and ("sync", "ev1") not in attempts[0]
    assert ("sync", "ev1") in attempts[1] and len(attempts) == 2


def test_a_block_taken_back_early_reaches_no_one_before_its_first_zeroing() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s", session=1)  # ev1, behind the program's work on s
    assert q.take(256, 1, "s") == 0x1000 and q  # its memset is still to run
    q.free_later(0x1000, 256, "t", session=1)  # freed again, on an idle stream: ev2
    b.done.add("ev2")
    q.poll()
    assert q.bytes == 256 and q.take(256) is None  # ev1 still pending: neither kept nor given
    b.done.add("ev1")
    q.poll()
    assert q.bytes == 0 and q.take(256) == 0x1000 and not q


def test_a_drain_never_waits_behind_a_sessions_host_callback() -> None:
    b = FakeBackend()
    q = Quarantine(b)  # type: ignore[arg-type]
    q.free_later(0x1000, 256, "s", session=1)  # session 1 has a gate shut
    q.free_later(0x2000, 256, "t", session=2)
    b.calls.clear()
    q.drain(may_wait=lambda sid: sid != 1)
    assert b.calls == [("sync", "ev2"), ("free", 0x2000)] and q.bytes == 256


def test_blocks_are_kept_only_while_the_gpu_has_room_to_spare() -> None:
    """Kept blocks are in no tenant's charge and only this vGPU retries after draining them:
    they are kept within the GPU's ungranted memory less KEEP_MARGIN, and trimmed (oldest
    first) at the next poll once that room shrinks."""
    b = FakeBackend()
    room = [KEEP_MARGIN + 4096]
    q = Quarantine(b, lambda: room[0])  # type: ignore[arg-type]
    q.free_later(0x1000, 4096, "s")
    q.free_later(0x2000, 4096, "s")
    b.done.update({"ev1", "ev2"})
    b.calls.clear()
    q.poll()
    assert [c[1] for c in b.calls if c[0] == "free"] == [0x1000]  # the older one: no room for two
    assert q.kept_bytes == 4096 and q.take(4096) == 0x2000
    q.free_later(0x3000, 4096, "s")
    b.done.update({"ev1", "ev2"})  # whichever spare event it reused
    q.poll()
    assert q.kept_bytes == 4096
    room[0] = KEEP_MARGIN  # another tenant took the rest
    b.calls.clear()
    q.poll()
    assert b.calls == [("free", 0x3000)] and q.kept_bytes == 0 and not q


def test_kept_blocks_go_back_to_the_driver_once_idle() -> None:
    """An idle vGPU does not hold zeroed blocks for ever (nor poll for ever)."""
    b = FakeBackend()
    now = [100.0]
    q = Quarantine(b, lambda: 64 << 30)  # type: ignore[arg-type]
    q.clock = lambda: now[0]
    q.free_later(0x1000, 4096, "s")
    b.done.add("ev1")
    q.poll()
    assert q.kept_bytes == 4096 and q
    now[0] += KEEP_IDLE_S / 2
    q.poll()
    assert q.kept_bytes == 4096
    now[0] += KEEP_IDLE_S
    b.calls.clear()
    q.poll()
    assert b.calls == [("free", 0x1000)] and q.kept_bytes == 0 and not q


def test_a_budget_that_cannot_say_keeps_nothing() -> None:
    b = FakeBackend()

    def room() -> int:
        raise KeyError(3)

    q = Quarantine(b, room)  # type: ignore[arg-type]
    q.free_later(0x1000, 4096, "s")
    b.done.add("ev1")
    b.calls.clear()
    q.poll()
    assert b.calls[-1] == ("free", 0x1000) and q.kept_bytes == 0
