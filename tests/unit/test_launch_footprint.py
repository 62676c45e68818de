"""A launch's memory footprint (pilot.daemon.scheduling.launch.footprint and allocation_at) on a
hand-built Session: which of the session's allocations (device, pitch, managed, pinned) the
pointer-sized words of a launch's arguments point into. Pure Python, no daemon, no GPU.
tests/apps/test_scheduler_core.py checks the same end to end, from real launches."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from pilot.daemon.backends.base import FunctionInfo
from pilot.daemon.scheduling.launch import Launch, allocation_at, footprint, make_view
from pilot.daemon.sessions.pinned import PinnedRange
from pilot.daemon.sessions.session import Credentials, Session
from pilot.policies import AllocationView, LaunchView, RangeView, create, load_plugin

RECORD_PLUGIN = Path(__file__).resolve().parents[1] / "policies_examples" / "record_launches.py"

DEV, DEV_SIZE = 0x7F00_0000_0000, 4096
DEV2, DEV2_SIZE = 0x7F00_0000_2000, 256  # right after a gap behind DEV
MANAGED, MANAGED_SIZE = 0x7F00_0020_0000, 8192
PITCH, PITCH_SIZE = 0x7F00_0040_0000, 1024 * 10
# A cudaHostAlloc range: the client maps it at its device pointer; 5000 of its 8192 bytes are the
# program's.
HOST, HOST_LEN, HOST_SIZE = 0x7E00_0000_0000, 8192, 5000
# A cudaHostRegister range: the program's 9000 bytes start 100 bytes into its first page; kernels
# reach it at the device pointer of the daemon's mapping (plus the same offset).
REG, REG_LEN, REG_OFF, REG_SIZE, REG_DEV = 0x6000_0000_0000, 3 * 4096, 100, 9000, 0x7D00_0000_0000


@pytest.fixture
def session() -> Session:
    s = Session(id=7, creds=Credentials(uid=1000, gid=1000, pid=4242), vgpu=0, device=0, tenant="t")
    s.add_allocation(DEV, DEV_SIZE)
    s.add_allocation(DEV2, DEV2_SIZE)
    s.add_allocation(MANAGED, MANAGED_SIZE, managed=True)
    s.add_allocation(PITCH, PITCH_SIZE, pitched=True)
    s.add_pinned(PinnedRange(HOST, HOST_LEN, 0x5555_0000_0000, 0, HOST_SIZE, 0, "alloc", HOST))
    s.add_pinned(PinnedRange(REG, REG_LEN, 0x5555_1000_0000, REG_OFF, REG_SIZE, 0, "registered",
                             REG_DEV))
    return s


def test_allocation_at(session: Session) -> None:
    dev, dev2 = RangeView(DEV, DEV_SIZE, "device"), RangeView(DEV2, DEV2_SIZE, "device")
    managed = RangeView(MANAGED, MANAGED_SIZE, "managed")
    pitch = RangeView(PITCH, PITCH_SIZE, "pitch")
    host = RangeView(HOST, HOST_SIZE, "pinned")
    reg = RangeView(REG + REG_OFF, REG_SIZE, "pinned")
    cases = {
        DEV: dev, DEV + 1: dev, DEV + DEV_SIZE - 1: dev,  # the base, interior pointers, the last byte
        DEV + DEV_SIZE: None,  # one past the end (the gap before DEV2)
        DEV2: dev2, DEV2 + DEV2_SIZE - 8: dev2, DEV2 + DEV2_SIZE: None,
        DEV - 1: None, 0: None, 1: None, 0xFFFF_FFFF_FFFF_FFFF: None,
        MANAGED: managed, MANAGED + 4000: managed, MANAGED + MANAGED_SIZE: None,
        PITCH: pitch, PITCH + PITCH_SIZE - 1: pitch, PITCH + PITCH_SIZE: None,
        HOST: host, HOST + HOST_SIZE - 1: host,
        HOST + HOST_SIZE: None,  # the rest of the range's last page is not the program's
        REG + REG_OFF: reg, REG + REG_OFF + 8999: reg,  # the program's address
        REG: None, REG + REG_OFF + REG_SIZE: None,  # outside the program's bytes
        REG_DEV + REG_OFF: reg, REG_DEV + REG_OFF + 50: reg,  # the device pointer of its bytes
        REG_DEV: None, REG_DEV + REG_OFF + REG_SIZE: None,
    }
    got = {hex(ptr): allocation_at(session, ptr) for ptr in cases}
    assert got == {hex(ptr): want for ptr, want in cases.items()}


def test_allocation_at_forgets_what_was_freed(session: Session) -> None:
    session.remove_allocation(DEV)
    session.pop_pinned(HOST)
    assert allocation_at(session, DEV) is None and allocation_at(session, DEV + 8) is None
    assert allocation_at(session, HOST) is None
    assert allocation_at(session, DEV2) == RangeView(DEV2, DEV2_SIZE, "device")


def test_allocation_at_empty_session() -> None:
    s = Session(id=1, creds=Credentials(0, 0, 1), vgpu=0, device=0)
    assert allocation_at(s, DEV) is None
    assert footprint(s, [(0, 8)], struct.pack("<Q", DEV)) == ()


def test_plain_pointer_arguments(session: Session) -> None:
    """kernel(int *dev, float *managed, char *pinned, int n): one RangeView per argument, in
    argument order, whole allocations whatever the pointer's offset in them."""
    params = [(0, 8), (8, 8), (16, 8), (24, 4)]
    args = struct.pack("<QQQi", DEV, MANAGED + 40, HOST + 10, 1000)
    assert footprint(session, params, args) == (
        RangeView(DEV, DEV_SIZE, "device"), RangeView(MANAGED, MANAGED_SIZE, "managed"),
        RangeView(HOST, HOST_SIZE, "pinned"))
    # Another order, the registered range by its device pointer, the pitched allocation.
    args = struct.pack("<QQQi", REG_DEV + REG_OFF + 8, PITCH + 1024, DEV2 + 4, 3)
    assert footprint(session, params, args) == (
        RangeView(REG + REG_OFF, REG_SIZE, "pinned"), RangeView(PITCH, PITCH_SIZE, "pitch"),
        RangeView(DEV2, DEV2_SIZE, "device"))


def test_one_range_per_allocation(session: Session) -> None:
    """Several pointers into one allocation (its base, interior ones) count it once."""
    params = [(0, 8), (8, 8), (16, 8), (24, 8)]
    args = struct.pack("<4Q", DEV + 100, MANAGED, DEV, DEV + 8)
    assert footprint(session, params, args) == (
        RangeView(DEV, DEV_SIZE, "device"), RangeView(MANAGED, MANAGED_SIZE, "managed"))


def test_pointers_to_nothing_of_the_session(session: Session) -> None:
    """NULL, small integers, doubles, addresses outside every allocation, one past the end."""
    params = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 8)]
    args = struct.pack("<QqdQQQ", 0, -1, 3.5, DEV + DEV_SIZE, 0x1234_5678, HOST + HOST_SIZE)
    assert footprint(session, params, args) == ()


def test_no_pointer_sized_parameters(session: Session) -> None:
    """Parameters under 8 bytes are never read as pointers, even when two of them together
    hold an allocation's address."""
    assert footprint(session, [], b"") == ()
    lo, hi = DEV & 0xFFFF_FFFF, DEV >> 32
    assert footprint(session, [(0, 4), (4, 4)], struct.pack("<II", lo, hi)) == ()
    assert footprint(session, [(0, 4), (4, 4)], struct.pack("<if", 6, 7.0)) == ()


def test_pointers_inside_structs(session: Session) -> None:
    """struct Pair {int *a; int n; double *b;} by value at offset 8 after an int: the words at
    its 8-aligned offsets are read (the int's word, with its padding, points nowhere)."""
    params = [(0, 4), (8, 24), (32, 4)]
    args = struct.pack("<i4xQi4xQi", 5, DEV2 + 16, 1000, PITCH + 8, 9)
    assert footprint(session, params, args) == (
        RangeView(DEV2, DEV2_SIZE, "device"), RangeView(PITCH, PITCH_SIZE, "pitch"))
    # A 104-byte struct holding pointers at offsets 8 and 96 among other fields.
    big = bytearray(104)
    struct.pack_into("<Q", big, 8, MANAGED + 8)
    struct.pack_into("<Q", big, 96, REG + REG_OFF)
    struct.pack_into("<d", big, 48, 1.5)
    args = struct.pack("<i4x", 1) + bytes(big)
    assert footprint(session, [(0, 4), (8, 104)], args) == (
        RangeView(MANAGED, MANAGED_SIZE, "managed"), RangeView(REG + REG_OFF, REG_SIZE, "pinned"))


def test_only_aligned_words_are_read(session: Session) -> None:
    """A parameter starting at a 4-byte offset is read from its first 8-aligned word on; a pointer
    at an unaligned offset (a packed struct) is not seen."""
    args = struct.pack("<iQ", 1, DEV)  # the pointer at offset 4
    assert footprint(session, [(0, 4), (4, 8)], args) == ()
    args = struct.pack("<i4xQ", 1, DEV)  # a 12-byte parameter at offset 4: its word at 8
    assert footprint(session, [(0, 4), (4, 12)], args) == (RangeView(DEV, DEV_SIZE, "device"),)


def _view(session: Session, needs_footprint: bool, args: bytes) -> LaunchView:
    host = SimpleNamespace(needs_footprint=needs_footprint, new_launch_id=lambda: 99)
    vg = SimpleNamespace(index=3, broker=SimpleNamespace(residency=None))
    info = FunctionInfo(handle=None, params=[(0, 8), (8, 8), (16, 4)], max_threads_per_block=1024,
                        static_shared_bytes=0, max_dynamic_shared_bytes=0, name="k")
    launch = Launch(function=0x10, grid=(2, 1, 1), block=(64, 1, 1), shared_bytes=0, stream=0,
                    args=args, info=info)
    return make_view(vg, session, launch, info, host)


def test_launch_view_footprint_only_when_asked(session: Session) -> None:
    args = struct.pack("<QQi", MANAGED, DEV, 4)
    view = _view(session, True, args)
    assert view.footprint == (RangeView(MANAGED, MANAGED_SIZE, "managed"), RangeView(DEV, DEV_SIZE, "device"))
    assert view.footprint_bytes == MANAGED_SIZE + DEV_SIZE
    assert view.managed_bytes == MANAGED_SIZE
    assert (view.id, view.session, view.tenant, view.pid, view.vgpu, view.kernel, view.attempts) == (
        99, 7, "t", 4242, 3, "k", 1)
    assert _view(session, False, args).footprint == ()


def test_record_launches_plugin(tmp_path: Path, session: Session, own_registry: None) -> None:
    """The recorder used end to end: one JSON line per ask, the footprint as [kind, size]."""
    assert load_plugin(str(RECORD_PLUGIN)) == ("record-launches",)
    path = tmp_path / "launches.jsonl"
    policy = create("record-launches", {"path": str(path)})
    assert policy.decides_launches and policy.needs_footprint
    view = _view(session, True, struct.pack("<QQi", MANAGED, DEV, 4))
    assert policy.launch_requested(view).verdict.value == "run"
    assert policy.launch_requested(view).verdict.value == "run"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"event": "launch", "kernel": "k", "grid": [2, 1, 1], "block": [64, 1, 1], "attempts": 1,
                      "session": 7, "footprint": [["managed", MANAGED_SIZE], ["device", DEV_SIZE]]}] * 2
    assert policy.state() == {"path": str(path), "recorded": 2}
    policy.allocated(AllocationView(7, "t", 0, "device", DEV, DEV_SIZE))  # not asked to record it
    assert policy.state()["recorded"] == 2
