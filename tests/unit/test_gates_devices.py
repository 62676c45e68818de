"""Host-callback gates in the sim backend and in daemon/native/gates.c, a session's own legacy stream,
and the pieces of a session that spans devices (daemon/devices.py)."""

from __future__ import annotations

import os
import struct
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_DEVICE, BackendError, Gate
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.backends.sim_device import h100_like_info
from pilot.daemon.config import ConfigError, load_config
from pilot.daemon.ops.device import fill_device_info
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions import devices
from pilot.daemon.sessions.session import Credentials, Session
from pilot.daemon.sim_kernels import KernelRegistry

TOKEN = struct.Struct("<Q")


class Slot:
    """A pilot_gate with a pipe to read its tokens from, as the callback hub sets one up."""

    def __init__(self, token: int = 5, target: int = 1) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.gate = ffi.new("pilot_gate *")
        self.gate.fd, self.gate.token, self.gate.target = self.write_fd, token, target
        self.address = int(ffi.cast("uintptr_t", self.gate))

    def spec(self, stream_callback: bool = False) -> Gate:
        return Gate(self.address, self.address, int(self.gate.target), stream_callback)

    def tokens(self) -> list[int]:
        os.set_blocking(self.read_fd, False)
        try:
            data = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return []
        return [t for (t,) in TOKEN.iter_unpack(data)]

    def open(self) -> None:
        lib.pilot_gate_open(self.gate, self.gate.target)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


@pytest.fixture
def sim() -> SimBackend:
    be = SimBackend(KernelRegistry(), device_count=2)
    be.bind_thread(0)
    return be


@pytest.fixture
def slot() -> Any:
    s = Slot()
    yield s
    s.close()


def _read(be: SimBackend, ptr: int, n: int = 4) -> bytes:
    out = bytearray(n)
    be.memcpy_dtoh(out, ptr, n, None)
    return bytes(out)


def test_a_closed_gate_holds_back_only_its_stream(sim: SimBackend, slot: Slot) -> None:
    s, other = sim.stream_create(1, 0), sim.stream_create(1, 0)
    ptr = sim.mem_alloc(64)
    ev = sim.event_create(2)
    sim.gate(s, slot.spec())
    assert slot.tokens() == [5]  # the stream reached the gate at once
    sim.memset_d8(ptr, 7, 4, s)
    sim.memcpy_htod(ptr + 8, bytearray(b"abcd"), 4, s)  # queued with a copy of its data
    sim.event_record(ev, s)
    assert not sim.stream_query(s) and not sim.event_query(ev)
    assert _read(sim, ptr) == b"\0" * 4  # nothing ran yet
    sim.memset_d8(ptr + 16, 9, 4, other)  # another stream is not held
    assert sim.stream_query(other) and _read(sim, ptr + 16) == b"\x09" * 4
    slot.open()
    sim.kick()
    assert sim.stream_query(s) and sim.event_query(ev)
    assert _read(sim, ptr) == b"\x07" * 4 and _read(sim, ptr + 8) == b"abcd"


def test_waits_for_a_pending_event_hold_the_waiting_stream(sim: SimBackend, slot: Slot) -> None:
    s, legacy = sim.stream_create(1, 0), sim.stream_create(1, 0)
    ptr = sim.mem_alloc(64)
    ev = sim.event_create(2)
    sim.gate(s, slot.spec())
    sim.event_record(ev, s)
    sim.stream_wait_event(legacy, ev)  # what streams.py does to join a blocking stream
    sim.memset_d8(ptr, 3, 4, legacy)
    assert not sim.stream_query(legacy)
    slot.open()
    sim.kick()
    assert sim.stream_query(legacy) and _read(sim, ptr) == b"\x03" * 4


def test_a_reused_slot_does_not_hold_an_earlier_wait(sim: SimBackend, slot: Slot) -> None:
    """The hold compares the word with the target it was enqueued with: the hub may open the
    gate, take the slot again and raise its target before the held stream is run."""
    s = sim.stream_create(1, 0)
    ptr = sim.mem_alloc(64)
    sim.gate(s, slot.spec())
    sim.memset_d8(ptr, 1, 4, s)
    slot.open()  # word = 1
    slot.gate.target = 2  # armed again for another callback
    sim.kick()
    assert sim.stream_query(s) and _read(sim, ptr) == b"\x01" * 4


def test_reads_and_synchronizes_wait_for_the_gate(sim: SimBackend, slot: Slot) -> None:
    s = sim.stream_create(1, 0)
    ptr = sim.mem_alloc(64)
    sim.gate(s, slot.spec())
    sim.memset_d8(ptr, 4, 4, s)
    out = bytearray(4)
    reader = threading.Thread(target=sim.memcpy_dtoh, args=(out, ptr, 4, s))
    syncer = threading.Thread(target=sim.stream_synchronize, args=(s,))
    reader.start()
    syncer.start()
    reader.join(0.2)
    assert reader.is_alive() and syncer.is_alive()  # both wait (however long we looked)
    slot.open()
    sim.kick()
    reader.join(10)
    syncer.join(10)
    assert not reader.is_alive() and bytes(out) == b"\x04" * 4


def test_a_stream_callback_gate_reports_its_status(sim: SimBackend, slot: Slot) -> None:
    s = sim.stream_create(1, 0)
    slot.gate.status = 77
    sim.gate(s, slot.spec(stream_callback=True))
    assert slot.tokens() == [5] and slot.gate.status == 0  # the sim's streams have no errors


def test_the_host_function_waits_itself_without_stream_memory_operations(slot: Slot) -> None:
    slot.gate.wait = 1
    fired = threading.Thread(target=lib.pilot_gate_fire, args=(slot.gate,))
    fired.start()
    fired.join(0.2)
    assert fired.is_alive() and slot.tokens() == [5]
    slot.open()
    fired.join(10)
    assert not fired.is_alive()


# ---- a session's own legacy stream (streams.own_legacy) ----

class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def stream_create(self, flags: int, priority: int) -> str:
        self.calls.append(("create", flags, priority))
        return "own"

    def event_create(self, flags: int) -> str:
        return "ev"

    def event_record(self, event: Any, stream: Any) -> None:
        self.calls.append(("record", event, stream))

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.calls.append(("wait", stream, event))


def test_own_legacy_stream_follows_the_shared_one_once() -> None:
    rec = Recorder()
    vg = SimpleNamespace(backend=rec, stream="shared")
    s = Session(id=1, creds=Credentials(0, 0, 1), vgpu=0, device=0)
    assert streams.stream_for_work(vg, s, 0) == "shared"
    assert streams.own_legacy(vg, s) == "own"
    assert rec.calls == [("create", 1, 0), ("record", "ev", "shared"), ("wait", "own", "ev")]
    assert streams.own_legacy(vg, s) == "own" and len(rec.calls) == 3
    assert streams.stream_for_work(vg, s, 0) == "own"


# ---- sessions across devices ----

def _session(ordinal: int = 0) -> Session:
    s = Session(id=9, creds=Credentials(1000, 1000, 4242), vgpu=0, device=0)
    s.ordinal = ordinal
    return s


def test_parts_see_each_others_memory_and_events() -> None:
    first = _session()
    group = devices.SessionGroup(first, base=0, topology=None)
    vg1 = SimpleNamespace(index=3, gpu=1)
    part = group.add_part(1, vg1)  # type: ignore[arg-type]
    assert part.id == first.id and part.creds == first.creds and part.group is group
    assert part.new_handle() >> devices.HANDLE_SHIFT == 1
    part.add_allocation(0x10000, 4096)
    first.check_range(0x10000 + 100, 100)  # memory of the session on device 1
    with pytest.raises(BackendError):
        first.check_range(0x10000 + 4000, 200)
    assert not devices.owns_range(first, 0x10000, 1)
    handle = part.new_handle()
    part.events[handle] = "ev1"
    assert devices.any_event(first, handle) == "ev1"
    with pytest.raises(BackendError):
        devices.any_event(first, handle + 1)
    row = group.summary()
    assert row["gpus"] == [0, 1] and row["device_bytes"] == 4096 and row["allocations"] == 1


def test_device_ordinals_start_at_the_session_gpu() -> None:
    infos = [h100_like_info(1 << 30, i) for i in range(3)]
    topo = devices.Topology(gpus=[0, 1, 2], devices=[0, 1, 2], infos=infos,
                            peers=[[True, True, False], [True, True, True], [False, True, True]])
    vgpus = [SimpleNamespace(memory_limits=lambda s, cap=c: (cap, cap)) for c in (10, 20, 30)]
    topo.vgpus = [[v] for v in vgpus]  # type: ignore[list-item]
    first = _session()
    devices.SessionGroup(first, base=1, topology=topo)  # placed on GPU 1
    vg = SimpleNamespace(topology=topo)
    rep = SimpleNamespace()
    assert fill_device_info(vg, first, 0, rep) is infos[1]  # type: ignore[arg-type]
    assert (rep.device_count, rep.total_mem, rep.peer_mask) == (3, 20, 0b110)
    assert fill_device_info(vg, first, 2, rep) is infos[0]  # type: ignore[arg-type]
    assert (rep.total_mem, rep.peer_mask) == (10, 0b001)  # GPU 0 reaches GPU 1 only: ordinal 0
    with pytest.raises(BackendError) as err:
        fill_device_info(vg, first, 3, rep)  # type: ignore[arg-type]
    assert err.value.code == CUDA_ERROR_INVALID_DEVICE


def test_sim_devices_setting() -> None:
    assert load_config(None, {"sim_devices": 4}).sim_devices == 4
    with pytest.raises(ConfigError, match="sim-devices"):
        load_config(None, {"sim_devices": 0})


def test_sim_peers_and_peer_copies(sim: SimBackend) -> None:
    assert sim.can_access_peer(0, 1) and not sim.can_access_peer(1, 1)
    src = sim.mem_alloc(16)
    sim.bind_thread(1)
    dst = sim.mem_alloc(16)
    sim.memcpy_htod(src, b"0123456789abcdef", 16, None)
    sim.memcpy_peer(dst, 1, src, 0, 16, None)
    assert _read(sim, dst, 16) == b"0123456789abcdef"
    with pytest.raises(BackendError):
        sim.memcpy_peer(dst, 0, src, 0, 16, None)  # dst is not on device 0
