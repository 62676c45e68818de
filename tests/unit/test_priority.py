"""Priority classes (resources/priorities.py) and the priority gate (scheduling/priority.py) on
scripted tenants: a vGPU (not started) over the sim backend, whose dispatch is given posted
calls as the endpoint would hand them over. A host-callback gate on a stream stands for a long
kernel: what the stream has behind it is in flight."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot.daemon.backends.base import Gate
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.config import ConfigError, load_config
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.resources.broker import GpuBudget, ResourceBroker
from pilot.daemon.resources.priorities import PriorityFileError, PriorityStore
from pilot.daemon.resources.tenants import Ledger, QuotaStore
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.priority import PriorityBoard
from pilot.daemon.sessions.session import Credentials, Session
from pilot.daemon.sim_kernels import KernelRegistry
from pilot.daemon.telemetry.metrics import Metrics
from pilot.daemon.vgpu.fast import FastLaunches
from pilot.daemon.vgpu.server import VGpu

WINDOW = 0.2  # [priority] active_window of these tests


# ---- the store and the config ----

def test_store_defaults_pilotctl_entries_and_reload(tmp_path: Path) -> None:
    store = PriorityStore(str(tmp_path), {"infer": "high"})
    assert (store.name("infer"), store.name("train"), store.level("infer")) == ("high", "normal", 2)
    assert not store.uniform()
    store.set("train", "LOW")
    assert store.name("train") == "low"
    assert store.list() == {"infer": {"priority": "high", "from": "config"},
                            "train": {"priority": "low", "from": "pilotctl"}}
    again = PriorityStore(str(tmp_path))  # persisted
    assert again.name("train") == "low" and again.name("infer") == "normal"
    assert store.unset("train") and not store.unset("train")
    again.reload()
    assert again.name("train") == "normal" and again.uniform()
    with pytest.raises(ValueError, match="one of low, normal, high"):
        store.set("train", "urgent")


def test_store_refuses_a_bad_file(tmp_path: Path) -> None:
    (tmp_path / "priorities.json").write_text(json.dumps({"version": 1, "priorities": {"a": "top"}}))
    with pytest.raises(PriorityFileError, match="not 'top'"):
        PriorityStore(str(tmp_path))


def test_config_priority_of_a_tenant(tmp_path: Path) -> None:
    path = tmp_path / "pilotd.toml"
    path.write_text('[tenants.infer]\nusers = ["alice"]\npriority = "High"\n'
                    '[priority]\ngated_inflight = 1\nactive_window = "50ms"\npreempt = true\n'
                    'preempt_chunk = 4\n')
    config = load_config(str(path))
    assert config.tenants["infer"].priority == "high"
    assert config.priority_gated_inflight == 1 and config.priority_active_window == 0.05
    assert (config.priority_preempt, config.priority_preempt_chunk) == (True, 4)
    (tmp_path / "empty.toml").write_text("")
    assert not load_config(str(tmp_path / "empty.toml")).priority_preempt  # off by default
    path.write_text('[tenants.infer]\nusers = ["alice"]\npriority = "urgent"\n')
    with pytest.raises(ConfigError, match=r"tenants\.infer\.priority"):
        load_config(str(path))
    path.write_text('[priority]\ngated_inflight = 0\n')
    with pytest.raises(ConfigError, match="gated_inflight"):
        load_config(str(path))


# ---- scripted tenants on one vGPU ----

class Slot:
    """A closed host-callback gate: the stream it is put on stops there until open()."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.gate = ffi.new("pilot_gate *")
        self.gate.fd, self.gate.token, self.gate.target = self.write_fd, 1, 1

    def spec(self) -> Gate:
        address = int(ffi.cast("uintptr_t", self.gate))
        return Gate(address, address, 1, False)

    def open(self) -> None:
        lib.pilot_gate_open(self.gate, 1)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


class Msg:
    """A received message as pilot_srv_wait hands it to the vGPU (posted: no reply)."""

    def __init__(self, conn: int, session: int, opcode: int, body: Any) -> None:
        env = ffi.new("pilot_envelope *")
        env.version, env.opcode, env.session = lib.PILOT_PROTO_VERSION, opcode, session
        env.flags = lib.PILOT_F_NO_REPLY
        self._keep = (env, body)
        self.conn, self.nframes = conn, 2
        self.frame = [ffi.cast("void *", env), ffi.cast("void *", body)]
        self.len = [ffi.sizeof("pilot_envelope"), ffi.sizeof(body[0])]


class Harness:
    def __init__(self, tmp: Path, classes: dict[str, str], inflight: int = 2) -> None:
        self.be = SimBackend(KernelRegistry())
        self.be.bind_thread(0)
        metrics = Metrics()
        broker = ResourceBroker(QuotaStore(str(tmp / "q")), Ledger(), GpuBudget({0: 1 << 34}), metrics)
        self.vg = VGpu(0, 0, self.be, str(tmp / "ep"), broker)
        self.vg.stream = self.be.stream_create(1, 0)
        self.vg.shard = metrics.shard()
        self.metrics = metrics
        self.board = PriorityBoard(PriorityStore(str(tmp / "state"), classes), [self.vg], WINDOW,
                                   inflight)
        self.vg.gate.board = self.board
        self.buffer = self.be.mem_alloc(1 << 20)

    def session(self, sid: int, tenant: str) -> Session:
        s = Session(id=sid, creds=Credentials(0, 0, os.getpid()), vgpu=0, device=0, tenant=tenant)
        self.board.place(s)
        s.identity = 100 + sid
        self.vg.sessions[sid] = s
        self.vg._by_conn[s.identity] = s
        streams.own_legacy(self.vg, s)
        s.add_allocation(self.buffer + sid * 4096, 4096)
        return s

    def memset(self, s: Session, offset: int, value: int) -> None:
        req = ffi.new("pilot_req_memset *")
        req.ptr, req.value, req.count, req.stream = self.buffer + s.id * 4096 + offset, value, 4, 0
        self.vg.handle(Msg(s.identity, s.id, lib.PILOT_OP_MEMSET, req))  # type: ignore[arg-type]
        self.vg.gate.poll()  # as the vGPU's loop does after each batch

    def read(self, s: Session, offset: int) -> int:
        out = bytearray(4)
        self.be.memcpy_dtoh(out, self.buffer + s.id * 4096 + offset, 4, None)
        return struct.unpack("<I", out)[0] & 0xFF

    def control(self) -> bytes:
        """The control commands sent to the vGPU since the last read."""
        try:
            return os.read(self.vg._control_r, 4096)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        self.vg.gate.close()

    def counter(self, key: str, tenant: str, priority: str) -> float:
        return self.metrics.snapshot().labeled.get((key, (tenant, priority)), 0)


def _until(check: Any, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def slot() -> Iterator[Slot]:
    s = Slot()
    yield s
    s.close()


def test_a_low_tenant_is_gated_only_while_a_higher_one_is_active(tmp_path: Path, slot: Slot) -> None:
    h = Harness(tmp_path, {"infer": "high", "train": "low"}, inflight=2)
    hi, lo = h.session(1, "infer"), h.session(2, "train")
    assert (hi.priority, lo.priority, hi.signals, lo.signals) == (2, 0, True, False)
    # the high session's legacy stream goes first when SMs free up
    greatest = h.be.stream_priority_range()[1]
    assert (h.be.stream_priority(hi.legacy), h.be.stream_priority(lo.legacy)) == (greatest, 0) != (0, 0)
    h.be.gate(lo.legacy, slot.spec())  # a long kernel of train's
    for i in range(4):  # alone on the GPU: never gated, all of it goes to the GPU
        h.memset(lo, 0, 10 + i)
    assert not lo.gated and not lo.gate_held and not lo.backlog
    h.memset(hi, 0, 1)  # infer becomes active
    assert h.read(hi, 0) == 1  # its work ran at once
    assert lo.gated and len(lo.gate_events) == 1  # what train had queued counts as one piece
    h.memset(lo, 0, 20)  # admitted: 2 pieces in flight
    h.memset(lo, 0, 21)  # held at the gate
    h.memset(lo, 0, 22)  # held behind it, in order
    assert lo.gate_held and len(lo.backlog) == 2 and len(lo.gate_events) == 2
    for i in range(3):  # infer is never held, train's backlog notwithstanding
        h.memset(hi, 4, 30 + i)
        assert h.read(hi, 4) == 30 + i and not hi.gate_held
    assert h.read(lo, 0) == 0  # nothing of train's ran: its stream is still busy
    assert h.counter("priority_gate_holds", "train", "low") == 1
    h.control()  # what was said so far (infer's first call woke the vGPU)
    slot.open()
    h.be.kick()  # the long kernel ends; train's queue drains
    assert _until(lambda: b"P" in h.control())  # the gate's waker woke the vGPU
    h.vg.gate.poll()
    assert not lo.backlog and not lo.gate_held and lo.gated  # replayed, still gated
    assert h.read(lo, 0) == 22  # every memset ran, the last one last
    assert h.counter("priority_gate_wait_seconds", "train", "low") > 0
    time.sleep(WINDOW * 1.5)  # infer idle
    h.vg.gate.poll()
    assert not lo.gated and h.vg.gate.gated == 0
    h.close()


def test_equal_classes_do_not_gate_each_other(tmp_path: Path, slot: Slot) -> None:
    h = Harness(tmp_path, {"a": "high", "b": "high", "c": "low"}, inflight=1)
    a, b = h.session(1, "a"), h.session(2, "b")
    h.be.gate(b.legacy, slot.spec())
    for i in range(3):
        h.memset(a, 0, 1 + i)
        h.memset(b, 0, 1 + i)
    assert not a.gated and not b.gated and not b.backlog
    slot.open()
    h.be.kick()


def test_uniform_classes_switch_the_gate_off(tmp_path: Path) -> None:
    h = Harness(tmp_path, {}, inflight=1)
    a = h.session(1, "a")
    assert not h.board.enabled and not a.signals
    h.memset(a, 0, 5)
    assert h.read(a, 0) == 5 and h.vg.gate.gated == 0


def test_pilotctl_change_applies_to_live_sessions(tmp_path: Path, slot: Slot) -> None:
    h = Harness(tmp_path, {}, inflight=1)
    a, b = h.session(1, "a"), h.session(2, "b")
    h.board.store.set("a", "high")  # type: ignore[union-attr]
    h.board.refresh()
    assert h.board.enabled and a.signals and a.priority == 2 and b.priority == 1
    h.be.gate(b.legacy, slot.spec())
    h.memset(a, 0, 1)
    assert b.gated
    h.memset(b, 0, 2)  # its queued work is one piece already: held
    assert b.gate_held
    h.board.store.unset("a")  # type: ignore[union-attr]
    h.board.refresh()
    h.vg.gate.poll()  # the vGPU looks at once (control command P)
    assert not b.gated and not b.gate_held and not b.backlog
    slot.open()
    h.be.kick()
    assert h.read(b, 0) == 2


def test_a_gated_session_is_off_the_fast_path(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"infer": "high", "train": "low"})
    fast = FastLaunches(h.vg, None)
    try:
        h.vg.fast = fast
        hi, lo = h.session(1, "infer"), h.session(2, "train")
        fast.update(lo)
        assert fast._states[lo.id][1] == lib.PILOT_FAST_ALL
        h.memset(hi, 0, 1)  # the gate's poll tells C
        assert lo.gated and fast._states[lo.id][1] == 0
        fast.update(hi)  # as the vGPU does for the sessions it served
        assert fast._states[hi.id][1] == lib.PILOT_FAST_ALL
    finally:
        h.vg.fast = None
        fast.close()
