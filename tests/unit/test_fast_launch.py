"""daemon/native/fast_launch.c through cffi: which messages it launches, with what, and which it leaves
to Python (FAST_PYTHON) or to Python first, to learn from (FAST_LEARN)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pilot.daemon.protocol import ffi, lib

FAST_PYTHON, FAST_DONE, FAST_LEARN = 0, 1, 2
CONN, SESSION, LEGACY = 7, 42, 0x5000


class Harness:
    def __init__(self, fail_with: int = 0) -> None:
        self.launched: list[tuple[Any, ...]] = []
        self.fail_with = fail_with
        self.cb = ffi.callback("pilot_fast_launch_fn", self._launch)
        self.copy_cb = ffi.callback("pilot_fast_copy_fn", lambda *a: 0)
        self.synced: list[int] = []
        self.sync_cb = ffi.callback("pilot_fast_sync_fn", lambda st: self.synced.append(st) or 0)
        self.bounds = ffi.new("double[]", [1e-6, 1e-3])
        self.f = lib.pilot_fast_new(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, self.cb, self.copy_cb,
                                    self.sync_cb, self.bounds, 2, lib.PILOT_PROTO_VERSION)
        self.keep: list[Any] = []

    def _launch(self, function: int, grid: Any, block: Any, shm: int, stream: int, args: Any,
                nbytes: int) -> int:
        self.launched.append((function, tuple(grid[0:3]), tuple(block[0:3]), shm, stream,
                              bytes(ffi.buffer(args, nbytes)) if nbytes else b""))
        return self.fail_with

    def msg(self, function: int, stream: int = 0, args: bytes = b"\x01" * 12, *, opcode: int | None = None,
            flags: int | None = None, session: int = SESSION, conn: int = CONN) -> Any:
        env = ffi.new("pilot_envelope *")
        env.version = lib.PILOT_PROTO_VERSION
        env.opcode = lib.PILOT_OP_LAUNCH if opcode is None else opcode
        env.flags = lib.PILOT_F_NO_REPLY if flags is None else flags
        env.session = session
        req = ffi.new("pilot_req_launch *")
        req.function, req.stream, req.shared_bytes, req.arg_bytes = function, stream, 16, len(args)
        req.grid = [2, 1, 1]
        req.block = [128, 1, 1]
        payload = ffi.new("uint8_t[]", args or b"\0")
        self.keep += [env, req, payload]
        m = ffi.new("pilot_srv_msg *")
        m.conn, m.nframes = conn, 3 if args else 2
        m.frame[0], m.len[0] = ffi.cast("uint8_t *", env), ffi.sizeof("pilot_envelope")
        m.frame[1], m.len[1] = ffi.cast("uint8_t *", req), ffi.sizeof("pilot_req_launch")
        m.frame[2], m.len[2] = payload, len(args)
        self.keep.append(m)
        return m

    def close(self) -> None:
        lib.pilot_fast_free(self.f)


@pytest.fixture
def h() -> Any:
    harness = Harness()
    assert lib.pilot_fast_session(harness.f, CONN, SESSION, 1, LEGACY, 0, 0, 0) == 0
    yield harness
    harness.close()


def test_a_known_kernel_on_the_legacy_stream_runs_here(h: Harness) -> None:
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_LEARN  # kernel not known yet
    assert lib.pilot_fast_function(h.f, CONN, 0x10, 0xF00, 12) == 0
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_DONE
    assert h.launched == [(0xF00, (2, 1, 1), (128, 1, 1), 16, LEGACY, b"\x01" * 12)]
    counts = ffi.new("pilot_fast_count[]", 4)
    assert lib.pilot_fast_take(h.f, counts, 4) == 1
    assert (counts[0].conn, counts[0].launches, counts[0].legacy) == (CONN, 1, 1)
    assert lib.pilot_fast_take(h.f, counts, 4) == 0  # taken


def test_streams_known_unknown_slow_and_gone(h: Harness) -> None:
    lib.pilot_fast_function(h.f, CONN, 0x10, 0xF00, 12)
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, stream=3)) == FAST_LEARN
    lib.pilot_fast_stream(h.f, CONN, 3, 0xAAA, 0)
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, stream=3)) == FAST_DONE
    assert h.launched[-1][4] == 0xAAA
    lib.pilot_fast_stream(h.f, CONN, 4, 0xBBB, 1)  # blocking: Python's
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, stream=4)) == FAST_PYTHON
    lib.pilot_fast_stream(h.f, CONN, 3, 0, 0)  # destroyed
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, stream=3)) == FAST_LEARN
    assert len(h.launched) == 1


def test_what_always_goes_to_python(h: Harness) -> None:
    lib.pilot_fast_function(h.f, CONN, 0x10, 0xF00, 12)
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=b"\x01" * 8)) == FAST_PYTHON  # wrong size
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, flags=0)) == FAST_PYTHON  # a call, not a post
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, opcode=lib.PILOT_OP_LAUNCH_EX)) == FAST_PYTHON
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, session=SESSION + 1)) == FAST_PYTHON
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, conn=CONN + 1)) == FAST_PYTHON  # unknown connection
    lib.pilot_fast_context(h.f, 99)  # another partition is current on the thread
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_PYTHON
    lib.pilot_fast_context(h.f, 0)
    lib.pilot_fast_session(h.f, CONN, SESSION, 1, LEGACY, 1, 0, 0)  # blocking streams have work
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_PYTHON
    lib.pilot_fast_session(h.f, CONN, SESSION, 0, LEGACY, 0, 0, 0)  # session no longer qualifies
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_PYTHON
    lib.pilot_fast_session(h.f, CONN, SESSION, 1, 0, 0, 0, 0)  # no legacy stream yet
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_LEARN
    assert h.launched == []


def test_a_launch_the_driver_refuses_goes_to_python() -> None:
    h = Harness(fail_with=1)
    try:
        lib.pilot_fast_session(h.f, CONN, SESSION, 1, LEGACY, 0, 0, 0)
        lib.pilot_fast_function(h.f, CONN, 0x10, 0xF00, 12)
        assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10)) == FAST_PYTHON  # Python calls again, reports
        counts = ffi.new("pilot_fast_count[]", 4)
        assert lib.pilot_fast_take(h.f, counts, 4) == 0
    finally:
        h.close()


def test_many_kernels_and_a_new_session_on_the_connection(h: Harness) -> None:
    for token in range(1, 3000):
        assert lib.pilot_fast_function(h.f, CONN, token, 0x100000 + token, 4) == 0
    for token in range(1, 3000, 2):  # forget half (tombstones), then look all up
        lib.pilot_fast_function(h.f, CONN, token, 0, 0)
    results = {lib.pilot_fast_try(h.f, ffi.NULL, h.msg(t, args=struct.pack("<I", t)))
               for t in range(1, 3000, 2)}
    assert results == {FAST_LEARN}
    for t in range(2, 3000, 2):
        assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(t, args=struct.pack("<I", t))) == FAST_DONE
    assert [x[0] for x in h.launched] == [0x100000 + t for t in range(2, 3000, 2)]
    lib.pilot_fast_session(h.f, CONN, SESSION + 1, 1, LEGACY, 0, 0, 0)  # nothing carries over
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(2, args=b"\0" * 4, session=SESSION + 1)) == FAST_LEARN
    lib.pilot_fast_forget(h.f, CONN)
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(2, args=b"\0" * 4, session=SESSION + 1)) == FAST_PYTHON


def test_ranges_the_session_may_copy() -> None:
    """pilot_fast_range keeps the session's device allocations sorted; a copy outside them, a
    copy while an error waits to be reported, or one with no endpoint to answer on goes to Python."""
    h = Harness()
    try:
        lib.pilot_fast_session(h.f, CONN, SESSION, 1, LEGACY, 0, 0, 0)
        for base in (0x3000, 0x1000, 0x2000):
            assert lib.pilot_fast_range(h.f, CONN, base, 0x100) == 0
        assert lib.pilot_fast_range(h.f, CONN, 0x2000, 0) == 0  # freed
        assert lib.pilot_fast_range(h.f, CONN + 1, 0x2000, 0x10) == -1  # unknown connection
        env = ffi.new("pilot_envelope *", {"version": lib.PILOT_PROTO_VERSION,
                                            "opcode": lib.PILOT_OP_MEMCPY_D2H, "session": SESSION})
        req = ffi.new("pilot_req_memcpy *", {"src": 0x1000, "count": 16})
        m = ffi.new("pilot_srv_msg *")
        m.conn, m.nframes = CONN, 2
        m.frame[0], m.len[0] = ffi.cast("uint8_t *", env), ffi.sizeof("pilot_envelope")
        m.frame[1], m.len[1] = ffi.cast("uint8_t *", req), ffi.sizeof("pilot_req_memcpy")
        # no endpoint to answer on (NULL): Python's, even for the session's own memory
        assert lib.pilot_fast_try(h.f, ffi.NULL, m) == FAST_PYTHON
    finally:
        h.close()


def test_synchronizations_need_the_session_streams_and_an_endpoint(h: Harness) -> None:
    """Without the list of the session's streams (Python withholds it while work waits in
    Python) a synchronization goes to Python; C answers one only through an endpoint (the
    reply), so without one it never synchronizes anything."""
    streams = ffi.new("uint64_t[]", [LEGACY, 0x6000])
    assert lib.pilot_fast_sync_streams(h.f, CONN + 1, streams, 2) == -1  # unknown connection
    for opcode in (lib.PILOT_OP_DEVICE_SYNCHRONIZE, lib.PILOT_OP_STREAM_SYNCHRONIZE):
        m = h.msg(0, opcode=opcode, flags=0)
        assert lib.pilot_fast_try(h.f, ffi.NULL, m) == FAST_PYTHON
        assert lib.pilot_fast_sync_streams(h.f, CONN, streams, 2) == 0
        assert lib.pilot_fast_try(h.f, ffi.NULL, m) == FAST_PYTHON
        assert lib.pilot_fast_sync_streams(h.f, CONN, streams, 0) == 0
    assert h.synced == []


def _ptrs(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *words)


def test_launches_count_per_shadow_they_reach(h: Harness) -> None:
    """Each launch C runs counts once for every shadow one of its 8-byte-aligned argument words
    points into (a segment of it), as Session.note_managed_launch does in Python."""
    left = ffi.new("pilot_fast_shadow_count *")
    assert lib.pilot_fast_shadow(h.f, CONN + 1, 0x10000, 0x4000, 0x1000, left) == -1  # unknown conn
    assert lib.pilot_fast_shadow(h.f, CONN, 0x10000, 0x4000, 0x1000, left) == 0
    assert lib.pilot_fast_segment(h.f, CONN, 0x10000, 0x14000) == 0
    assert lib.pilot_fast_shadow(h.f, CONN, 0x20000, 0x3000, 0x1000, ffi.NULL) == 0  # variables
    assert lib.pilot_fast_segment(h.f, CONN, 0x20100, 0x20200) == 0
    assert lib.pilot_fast_segment(h.f, CONN, 0x22000, 0x22010) == 0
    assert lib.pilot_fast_segment(h.f, CONN, 0x23000, 0x23010) == -1  # outside every shadow
    lib.pilot_fast_function(h.f, CONN, 0x10, 0xF00, 32)
    both = _ptrs(0x10010, 0x13ff8, 0x20100, 7)  # two words in the first, one in a segment
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=both)) == FAST_DONE
    gap = _ptrs(0x20200, 0x14000, 0x22008, 0)  # between segments, one past the end, in one
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=gap)) == FAST_DONE
    unaligned = b"\0" * 4 + _ptrs(0x10010, 0x10010, 0x10010) + b"\0" * 4  # no aligned word hits
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=unaligned)) == FAST_DONE
    counts = ffi.new("pilot_fast_count[]", 2)
    assert lib.pilot_fast_take(h.f, counts, 2) == 1 and counts[0].shadows_touched
    taken = ffi.new("pilot_fast_shadow_count[]", 4)
    assert lib.pilot_fast_take_shadows(h.f, CONN, taken, 4) == 2
    assert {(taken[i].base, taken[i].launches) for i in range(2)} == {(0x10000, 1), (0x20000, 2)}
    assert lib.pilot_fast_take_shadows(h.f, CONN, taken, 4) == 0  # taken
    # a shadow dropped hands back what was not taken yet, and takes its segments with it
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=both)) == FAST_DONE
    assert lib.pilot_fast_shadow(h.f, CONN, 0x20000, 0, 0, left) == 0
    assert (left.base, left.launches) == (0x20000, 1)
    assert lib.pilot_fast_try(h.f, ffi.NULL, h.msg(0x10, args=gap)) == FAST_DONE
    assert lib.pilot_fast_take_shadows(h.f, CONN, taken, 4) == 1
    assert (taken[0].base, taken[0].launches) == (0x10000, 1)


def _flush(dst: int, count: int, slot: int = 0, flags: int = 0) -> tuple[Any, list[Any]]:
    env = ffi.new("pilot_envelope *", {"version": lib.PILOT_PROTO_VERSION, "flags": flags,
                                        "opcode": lib.PILOT_OP_SHADOW_FLUSH, "session": SESSION})
    req = ffi.new("pilot_req_memcpy *", {"dst": dst, "count": count, "slot": slot})
    m = ffi.new("pilot_srv_msg *")
    m.conn, m.nframes = CONN, 2
    m.frame[0], m.len[0] = ffi.cast("uint8_t *", env), ffi.sizeof("pilot_envelope")
    m.frame[1], m.len[1] = ffi.cast("uint8_t *", req), ffi.sizeof("pilot_req_memcpy")
    return m, [env, req]


def test_a_flush_with_no_endpoint_to_answer_on_goes_to_python(h: Harness) -> None:
    """C does a flush only when it can answer it (tests/apps/test_managed.py shows flushes done
    in C through the endpoint); without one, nothing is copied or synchronized here."""
    area = ffi.new("uint8_t[]", 4 * 0x1000)
    lib.pilot_fast_shadow(h.f, CONN, 0x10000, 0x4000, 0x1000, ffi.NULL)
    lib.pilot_fast_segment(h.f, CONN, 0x10000, 0x14000)
    assert lib.pilot_fast_staging(h.f, CONN + 1, area, 0x1000, 4) == -1  # unknown connection
    assert lib.pilot_fast_staging(h.f, CONN, area, 0x1000, 4) == 0
    lib.pilot_fast_coherence(h.f, 0x7000)
    m, _keep = _flush(0x10000, 0x1000)
    assert lib.pilot_fast_try(h.f, ffi.NULL, m) == FAST_PYTHON
    assert h.synced == []
