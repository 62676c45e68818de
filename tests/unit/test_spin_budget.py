"""pilotd's spin budget (daemon/native/spin_budget.c) and the fast path's GPU waits that draw on
it (pilot_fast_sync in fast_launch.c), against a fake driver made of cffi callbacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pilot.daemon.config import Config, ConfigError, spin_limit
from pilot.daemon.protocol import ffi, lib

NOT_READY = 600
STREAM = 0x5000


@pytest.fixture(autouse=True)
def no_limit_after() -> Iterator[None]:
    """The budget is the process's: every test leaves it unlimited, with no token held."""
    yield
    lib.pilot_spin_set_limit(0)


def counts() -> tuple[int, int]:
    granted, refused = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    lib.pilot_spin_counts(granted, refused)
    return granted[0], refused[0]


def test_at_most_limit_tokens_are_out_at_once() -> None:
    lib.pilot_spin_set_limit(2)
    assert lib.pilot_spin_limit() == 2
    before = counts()
    assert [lib.pilot_spin_take() for _ in range(3)] == [1, 1, 0]
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    assert lib.pilot_spin_take() == 1  # the one given back
    assert lib.pilot_spin_take() == 0
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 2)


def test_no_limit_lets_everyone_spin() -> None:
    lib.pilot_spin_set_limit(-5)  # below 0 is no limit too
    assert lib.pilot_spin_limit() == 0
    before = counts()
    taken = [lib.pilot_spin_take() for _ in range(100)]
    assert all(taken)
    for t in taken:
        lib.pilot_spin_give(t)
    assert counts() == before  # no budget: nothing taken, nothing counted
    lib.pilot_spin_set_limit(1)  # and nothing left held when a limit comes
    assert lib.pilot_spin_take() == lib.PILOT_SPIN_TOKEN
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)


class FakeDriver:
    """cuStreamQuery answers NOT_READY `busy` times (forever with busy < 0, until an event is
    synchronized); events and contexts are numbers; every call is recorded."""

    def __init__(self, busy: int = 0, record_fails: bool = False) -> None:
        self.busy = busy
        self.record_fails = record_fails
        self.context = 0xC0
        self.calls: list[tuple[Any, ...]] = []
        self.done = False
        self._next_event = 0xE0
        fns = {
            "launch": ("int(*)(uint64_t)", lambda *a: 0),
            "copy": ("int(*)(uint64_t)", lambda *a: 0),
            "sync": ("int(*)(uint64_t)", self._sync),
            "query": ("int(*)(uint64_t)", self._query),
            "create": ("int(*)(uint64_t *, unsigned)", self._create),
            "record": ("int(*)(uint64_t, uint64_t)", self._record),
            "event_sync": ("int(*)(uint64_t)", self._event_sync),
            "destroy": ("int(*)(uint64_t)", self._destroy),
            "ctx": ("int(*)(uint64_t *)", self._ctx),
        }
        self._cbs = {k: ffi.callback(t, fn) for k, (t, fn) in fns.items()}
        ptr = {k: ffi.cast("void *", cb) for k, cb in self._cbs.items()}
        self.bounds = ffi.new("double[]", [1e-3])
        self.f = lib.pilot_fast_new(ptr["launch"], ptr["copy"], ptr["copy"], ptr["sync"],
                                    ffi.NULL, ffi.NULL, ffi.NULL, self.bounds, 1,
                                    lib.PILOT_PROTO_VERSION)
        assert self.f != ffi.NULL
        assert lib.pilot_fast_waits(self.f, ptr["query"], ptr["create"], ptr["record"],
                                    ptr["event_sync"], ptr["destroy"], ptr["ctx"]) == 0

    def _sync(self, stream: int) -> int:
        self.calls.append(("sync", stream))
        return 0

    def _query(self, stream: int) -> int:
        self.calls.append(("query", stream))
        if self.done or self.busy == 0:
            return 0
        self.busy -= 1 if self.busy > 0 else 0
        return NOT_READY

    def _create(self, out: Any, flags: int) -> int:
        self._next_event += 1
        out[0] = self._next_event
        self.calls.append(("create", self._next_event, flags, self.context))
        return 0

    def _record(self, event: int, stream: int) -> int:
        self.calls.append(("record", event, stream))
        return 1 if self.record_fails else 0

    def _event_sync(self, event: int) -> int:
        self.calls.append(("event_sync", event))
        self.done = True
        return 0

    def _destroy(self, event: int) -> int:
        self.calls.append(("destroy", event))
        return 0

    def _ctx(self, out: Any) -> int:
        out[0] = self.context
        return 0

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls if c[0] != "query"]

    def close(self) -> None:
        lib.pilot_fast_free(self.f)


def test_the_waits_need_every_driver_function() -> None:
    d = FakeDriver()
    fn = ffi.cast("void *", d._cbs["query"])
    assert lib.pilot_fast_waits(d.f, fn, fn, fn, fn, fn, ffi.NULL) == -1
    d.close()


def test_without_a_limit_a_wait_is_the_drivers_synchronization() -> None:
    lib.pilot_spin_set_limit(0)
    d = FakeDriver(busy=-1)
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    assert d.calls == [("sync", STREAM)]
    d.close()


def test_finished_work_is_one_query_and_the_synchronization() -> None:
    lib.pilot_spin_set_limit(4)
    d = FakeDriver(busy=0)
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    assert d.calls == [("query", STREAM), ("sync", STREAM)]
    d.close()


def test_with_a_token_a_short_wait_is_polled_without_an_event() -> None:
    lib.pilot_spin_set_limit(1)
    d = FakeDriver(busy=3)
    granted, refused = counts()
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    assert d.kinds() == ["sync"]
    assert [c for c in d.calls if c[0] == "query"] == [("query", STREAM)] * 4
    assert counts() == (granted + 1, refused)
    assert lib.pilot_spin_take() == 1  # the token came back
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    d.close()


def test_with_the_budget_spent_the_wait_sleeps_on_a_blocking_event() -> None:
    lib.pilot_spin_set_limit(1)
    assert lib.pilot_spin_take() == 1  # another thread spins
    d = FakeDriver(busy=-1)
    granted, refused = counts()
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    blocking_sync_no_timing = 0x1 | 0x2
    assert d.calls == [("query", STREAM), ("create", 0xE1, blocking_sync_no_timing, 0xC0),
                       ("record", 0xE1, STREAM), ("event_sync", 0xE1), ("sync", STREAM)]
    assert counts() == (granted, refused + 1)
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    d.close()
    assert d.calls[-1] == ("destroy", 0xE1)


def test_a_long_wait_with_a_token_ends_on_the_event_too() -> None:
    """Polling stops after PILOT_FAST_SPIN_WAIT_US (500 us): the rest of the wait sleeps."""
    lib.pilot_spin_set_limit(4)
    d = FakeDriver(busy=-1)
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    assert d.kinds() == ["create", "record", "event_sync", "sync"]
    assert sum(c[0] == "query" for c in d.calls) > 1
    d.close()


def test_one_event_per_context_made_once() -> None:
    lib.pilot_spin_set_limit(1)
    assert lib.pilot_spin_take() == 1
    d = FakeDriver(busy=-1)
    for context in (0xC0, 0xC1, 0xC0):
        d.context, d.done = context, False
        assert lib.pilot_fast_sync(d.f, STREAM) == 0
    created = [c for c in d.calls if c[0] == "create"]
    assert [(c[1], c[3]) for c in created] == [(0xE1, 0xC0), (0xE2, 0xC1)]
    assert [c[1] for c in d.calls if c[0] == "event_sync"] == [0xE1, 0xE2, 0xE1]
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    d.close()
    assert sorted(c[1] for c in d.calls if c[0] == "destroy") == [0xE1, 0xE2]


def test_an_event_the_driver_will_not_record_leaves_the_wait_to_the_synchronization() -> None:
    lib.pilot_spin_set_limit(1)
    assert lib.pilot_spin_take() == 1
    d = FakeDriver(busy=-1, record_fails=True)
    assert lib.pilot_fast_sync(d.f, STREAM) == 0
    assert d.kinds() == ["create", "record", "sync"]
    lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
    d.close()


@pytest.mark.parametrize(("value", "cores", "limit"), [
    ("auto", 16, 4), ("auto", 2, 2), ("auto", 64, 16), (0, 16, 0), (6, 16, 6), ("8", 16, 8)])
def test_the_configured_budget(value: object, cores: int, limit: int) -> None:
    config = Config(spinners=value)  # type: ignore[arg-type]
    assert spin_limit(config.spinners, cores) == limit


def test_no_limit_by_default() -> None:
    assert spin_limit(Config().spinners, 16) == 0


@pytest.mark.parametrize("value", ["many", -1, 5000, 2.5, True])
def test_a_bad_budget_is_refused_by_name(value: object) -> None:
    with pytest.raises(ConfigError, match="spinners"):
        Config(spinners=value)  # type: ignore[arg-type]
