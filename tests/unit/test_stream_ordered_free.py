"""cudaFreeAsync and cudaMallocAsync in pilotd (daemon/ops/mempool.py) on the sim backend: the
free waits for nothing, takes the allocation from the session and gives its charge back at once
(the policy hears of it then, as of cudaFree), and zeroes the block on the program's stream
after the work queued there before; only the same session's allocation on the same stream gets
the block back before that zeroing ran. A host-callback gate holds the stream, so the program's
work is still to run when the handlers return; a backend that refuses to wait proves they did
not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from broker_fakes import Quotas

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
    Gate,
)
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.ops import memory, mempool
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.resources.broker import GpuBudget, ResourceBroker
from pilot.daemon.resources.tenants import Ledger
from pilot.daemon.sessions.quarantine import Quarantine
from pilot.daemon.sessions.session import Credentials, Session, StreamState
from pilot.daemon.sim_kernels import KernelRegistry
from pilot.daemon.telemetry.metrics import Metrics
from pilot.policies import RUN

MiB = 1 << 20
STREAM = 0x10  # the program's stream handle in these tests
STREAM_NON_BLOCKING = 1


class NoWaitSim(SimBackend):
    """The sim, failing any wait for the GPU while `waits_allowed` is False."""

    waits_allowed = True

    def _waited(self, what: str) -> None:
        if not self.waits_allowed:
            raise AssertionError(f"{what}: a stream-ordered call waited for the GPU")

    def stream_synchronize(self, stream: Any) -> None:
        self._waited("stream_synchronize")
        super().stream_synchronize(stream)

    def event_synchronize(self, event: Any) -> None:
        self._waited("event_synchronize")
        super().event_synchronize(event)


class Heard:
    """What the policy hears of allocations (the broker's PolicyHost calls)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int, int]] = []

    def allocation_requested(self, s: Any, kind: str, nbytes: int, movable: bool) -> Any:
        return RUN

    def allocated(self, s: Any, kind: str, ptr: int, nbytes: int, movable: bool = False) -> None:
        self.events.append(("allocated", kind, ptr, nbytes))

    def freed(self, s: Any, kind: str, ptr: int, nbytes: int, movable: bool = False) -> None:
        self.events.append(("freed", kind, ptr, nbytes))


class HeldStream:
    """A closed host-callback gate on a stream: what is queued after it waits until open()."""

    def __init__(self, sim: SimBackend, stream: Any) -> None:
        self.sim = sim
        self.read_fd, self.write_fd = os.pipe()
        self.gate = ffi.new("pilot_gate *")
        self.gate.fd, self.gate.token, self.gate.target = self.write_fd, 1, 1
        address = int(ffi.cast("uintptr_t", self.gate))
        sim.gate(stream, Gate(address, address, 1, False))

    def open(self) -> None:
        lib.pilot_gate_open(self.gate, 1)
        self.sim.kick()
        os.close(self.read_fd)
        os.close(self.write_fd)


@pytest.fixture
def vg() -> Iterator[Any]:
    sim = NoWaitSim(KernelRegistry(), total_mem=64 * MiB)
    sim.bind_thread(0)
    broker = ResourceBroker(Quotas(8 * MiB), Ledger(), GpuBudget({0: 64 * MiB}), Metrics())  # type: ignore[arg-type]
    broker.policy = Heard()  # type: ignore[assignment]
    yield SimpleNamespace(backend=sim, broker=broker, quarantine=Quarantine(sim),
                          stream=sim.stream_create(STREAM_NON_BLOCKING, 0))


def session(vg: Any, sid: int) -> Session:
    s = Session(id=sid, creds=Credentials(1000, 1000, 100 + sid), vgpu=0, device=0, tenant="user:a")
    s.streams[STREAM] = StreamState(vg.backend.stream_create(STREAM_NON_BLOCKING, 0), blocking=False)
    return s


def malloc_async(vg: Any, s: Session, size: int, stream: int = STREAM) -> int:
    req = new("pilot_req_malloc_async")
    req.size, req.stream = size, stream
    return int(mempool.malloc_async(vg, s, req, memoryview(b"")).value)


def free_async(vg: Any, s: Session, ptr: int, stream: int = STREAM) -> None:
    req = new("pilot_req_free_async")
    req.ptr, req.stream = ptr, stream
    mempool.free_async(vg, s, req, memoryview(b""))


def read(vg: Any, ptr: int, count: int) -> bytes:
    out = bytearray(count)
    vg.backend.memcpy_dtoh(out, ptr, count, vg.stream)
    return bytes(out)


def test_the_free_waits_for_nothing_and_zeroes_after_the_work_before_it(vg: Any) -> None:
    s = session(vg, 1)
    stream = s.streams[STREAM].obj
    ptr = malloc_async(vg, s, MiB)
    held = HeldStream(vg.backend, stream)
    vg.backend.memset_d8(ptr, 0x77, MiB, stream)  # the program's work, still to run
    vg.backend.waits_allowed = False
    free_async(vg, s, ptr)
    # gone from the session at once: no call of it may use the pointer, its charge is back
    assert ptr not in s.allocations
    with pytest.raises(BackendError):
        s.check_range(ptr, 1)
    assert vg.broker.ledger.usage("user:a", 0) == 0 and s.charged.get("device", 0) == 0
    assert vg.broker.policy.events[-1] == ("freed", "device", ptr, MiB)
    # but held, not freed, until the stream ran the work and the zeroing
    assert vg.quarantine.bytes == MiB
    vg.quarantine.poll()
    assert vg.quarantine.bytes == MiB
    other = session(vg, 2)
    assert malloc_async(vg, other, MiB, 0) != ptr  # another tenant never waits for it, nor gets it
    vg.backend.waits_allowed = True
    held.open()
    vg.quarantine.poll()
    assert vg.quarantine.bytes == 0 and vg.quarantine.kept_bytes == MiB
    assert read(vg, ptr, MiB) == bytes(MiB)  # the program's 0x77 ran first, then the zeroing


def test_the_same_session_takes_the_block_back_on_the_same_stream_only(vg: Any) -> None:
    s, other = session(vg, 1), session(vg, 2)
    stream = s.streams[STREAM].obj
    ptr = malloc_async(vg, s, MiB)
    held = HeldStream(vg.backend, stream)
    vg.backend.waits_allowed = False
    free_async(vg, s, ptr)
    assert malloc_async(vg, other, MiB) != ptr  # the other session's stream of that handle
    assert malloc_async(vg, s, MiB, 0) != ptr  # the legacy stream: not ordered after it
    again = malloc_async(vg, s, MiB)
    assert again == ptr and vg.quarantine.bytes == 0  # taken back before its zeroing ran
    assert s.allocations[ptr] == MiB and s.charged["device"] == 2 * MiB  # with the legacy one
    vg.backend.memset_d8(ptr, 0x55, MiB, stream)  # the new owner's work, after the zeroing
    vg.backend.waits_allowed = True
    held.open()
    assert read(vg, ptr, MiB) == b"\x55" * MiB


def test_a_block_taken_back_and_freed_elsewhere_waits_for_its_first_zeroing(vg: Any) -> None:
    """Taken back on its stream, then freed on another (idle) stream of the session: another
    tenant gets it only once the first stream ran the program's work and the first zeroing,
    which would otherwise land in that tenant's data."""
    s, other = session(vg, 1), session(vg, 2)
    s.streams[STREAM + 1] = StreamState(vg.backend.stream_create(STREAM_NON_BLOCKING, 0), False)
    stream = s.streams[STREAM].obj
    ptr = malloc_async(vg, s, MiB)
    held = HeldStream(vg.backend, stream)
    vg.backend.memset_d8(ptr, 0x77, MiB, stream)
    vg.backend.waits_allowed = False
    free_async(vg, s, ptr)
    assert malloc_async(vg, s, MiB) == ptr
    free_async(vg, s, ptr, STREAM + 1)
    vg.quarantine.poll()
    assert vg.quarantine.bytes == MiB and malloc_async(vg, other, MiB, 0) != ptr
    vg.backend.waits_allowed = True
    held.open()
    vg.quarantine.poll()
    assert vg.quarantine.bytes == 0 and malloc_async(vg, other, MiB, 0) == ptr
    assert read(vg, ptr, MiB) == bytes(MiB)


def test_blocks_freed_on_the_shared_legacy_stream_stay_with_their_session(vg: Any) -> None:
    s, other = session(vg, 1), session(vg, 2)
    ptr = malloc_async(vg, s, MiB, 0)
    held = HeldStream(vg.backend, vg.stream)  # both sessions' legacy stream is the vGPU's
    vg.backend.waits_allowed = False
    free_async(vg, s, ptr, 0)
    assert malloc_async(vg, other, MiB, 0) != ptr
    assert malloc_async(vg, s, MiB, 0) == ptr
    vg.backend.waits_allowed = True
    held.open()


def test_what_is_not_the_sessions_is_refused_and_nothing_changes(vg: Any) -> None:
    s, other = session(vg, 1), session(vg, 2)
    ptr = malloc_async(vg, s, MiB)
    charged = dict(s.charged)
    for who, p, stream, code in ((s, ptr + 8, STREAM, CUDA_ERROR_INVALID_VALUE),
                                 (other, ptr, STREAM, CUDA_ERROR_INVALID_VALUE),
                                 (s, 0x1234, STREAM, CUDA_ERROR_INVALID_VALUE),
                                 (s, ptr, 0x99, CUDA_ERROR_INVALID_RESOURCE_HANDLE)):
        with pytest.raises(BackendError) as info:
            free_async(vg, who, p, stream)
        assert info.value.code == code
    assert s.allocations == {ptr: MiB} and s.charged == charged and not vg.quarantine.bytes
    with pytest.raises(BackendError) as info:
        malloc_async(vg, s, MiB, 0x99)
    assert info.value.code == CUDA_ERROR_INVALID_RESOURCE_HANDLE and s.charged == charged


def test_the_policy_hears_the_same_of_both_frees(vg: Any) -> None:
    """What Salus's detector learns from (policies/salus/detector.py): the same events, at the
    call, whichever free the program used."""
    s = session(vg, 1)
    heard = vg.broker.policy.events
    req = new("pilot_req_malloc")
    req.size = MiB
    ptr = int(memory.malloc(vg, s, req, memoryview(b"")).value)
    free = new("pilot_req_free")
    free.ptr = ptr
    memory.free(vg, s, free, memoryview(b""))
    by_free = [e[:2] + e[3:] for e in heard]
    heard.clear()
    free_async(vg, s, malloc_async(vg, s, MiB))
    assert [e[:2] + e[3:] for e in heard] == by_free == [("allocated", "device", MiB),
                                                          ("freed", "device", MiB)]


def test_managed_device_memory_is_freed_the_synchronous_way(vg: Any) -> None:
    """Device memory served with managed memory (`[gpu] managed_device_memory`): the driver
    zeroes it, the enforcer counts it resident until it is freed; freed at once, after the
    session's work (as cudaFree)."""
    s = session(vg, 1)
    ptr = vg.backend.mem_alloc(MiB)
    s.add_allocation(ptr, MiB, driver_zeroed=True)
    free_async(vg, s, ptr)
    assert ptr not in s.allocations and not vg.quarantine.bytes
    with pytest.raises(BackendError):
        vg.backend.mem_address_range(ptr)  # gone from the device already
