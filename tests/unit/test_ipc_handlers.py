"""CUDA IPC in pilotd (daemon/ops/ipc.py, daemon/resources/ipc.py) on the sim backend: who may
open a handle, what an opened range allows, and the exporter's free while importers hold the
memory: the allocation leaves the exporter at once, but the memory stays (its data intact, the
tenant still charged) until the last importer lets go, which zeroes and frees it once."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from broker_fakes import Quotas

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
)
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.ops import device, events, ipc, memory, mempool
from pilot.daemon.protocol import ffi, new
from pilot.daemon.resources.broker import GpuBudget, ResourceBroker
from pilot.daemon.resources.ipc import HANDLE_BYTES
from pilot.daemon.resources.tenants import Ledger
from pilot.daemon.sessions.quarantine import Quarantine
from pilot.daemon.sessions.session import Credentials, Session, StreamState
from pilot.daemon.sim_kernels import KernelRegistry
from pilot.daemon.telemetry.metrics import Metrics
from pilot.policies import RUN

MiB = 1 << 20
STREAM = 0x10
INVALID_CONTEXT = 201
EVENT_INTERPROCESS_NO_TIMING = 0x6


class Heard:
    def __init__(self) -> None:
        self.freed_ptrs: list[int] = []

    def allocation_requested(self, s: Any, kind: str, nbytes: int, movable: bool) -> Any:
        return RUN

    def allocated(self, s: Any, kind: str, ptr: int, nbytes: int, movable: bool = False) -> None:
        pass

    def freed(self, s: Any, kind: str, ptr: int, nbytes: int, movable: bool = False) -> None:
        self.freed_ptrs.append(ptr)


class CountingSim(SimBackend):
    """The sim, counting what pilotd gives back to the driver."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mem_frees: list[int] = []
        self.events_destroyed: list[Any] = []

    def mem_free(self, ptr: int) -> None:
        self.mem_frees.append(ptr)
        super().mem_free(ptr)

    def event_destroy(self, ev: Any) -> None:
        self.events_destroyed.append(ev)
        super().event_destroy(ev)


def req(ctype: str, **fields: Any) -> Any:
    obj = new(ctype)
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


def make_vgpu(broker: ResourceBroker | None = None, device: int = 0) -> Any:
    sim = CountingSim(KernelRegistry(), total_mem=128 * MiB)
    sim.bind_thread(0)
    if broker is None:
        broker = ResourceBroker(Quotas(64 * MiB), Ledger(), GpuBudget({0: 128 * MiB, 1: 128 * MiB}),  # type: ignore[arg-type]
                                Metrics())
        broker.policy = Heard()  # type: ignore[assignment]
    return SimpleNamespace(backend=sim, broker=broker, preempt=None, quarantine=Quarantine(sim),
                           device=device, stream=sim.stream_create(1, 0))


@pytest.fixture
def vg() -> Any:
    return make_vgpu()


def session(vg: Any, sid: int, tenant: str = "user:a", pid: int | None = None) -> Session:
    s = Session(id=sid, creds=Credentials(1000, 1000, pid if pid is not None else 100 + sid), vgpu=0,
                device=0, tenant=tenant)
    s.streams[STREAM] = StreamState(vg.backend.stream_create(1, 0), blocking=False)
    return s


def malloc(vg: Any, s: Session, size: int) -> int:
    return int(memory.malloc(vg, s, req("pilot_req_malloc", size=size), memoryview(b"")).value)


def free(vg: Any, s: Session, ptr: int) -> None:
    memory.free(vg, s, req("pilot_req_free", ptr=ptr), memoryview(b""))


def export(vg: Any, s: Session, ptr: int) -> bytes:
    rep = ipc.mem_export(vg, s, req("pilot_req_free", ptr=ptr), memoryview(b""))
    return bytes(ffi.buffer(rep.handle))


def open_handle(vg: Any, s: Session, handle: bytes, flags: int = 1) -> tuple[int, int]:
    request = req("pilot_req_ipc_open", flags=flags)
    ffi.memmove(request.handle, handle, HANDLE_BYTES)
    rep = ipc.mem_open(vg, s, request, memoryview(b""))
    return int(rep.value), int(rep.value2)


def close(vg: Any, s: Session, ptr: int) -> int:
    return int(ipc.mem_close(vg, s, req("pilot_req_free", ptr=ptr), memoryview(b"")).value)


def write(vg: Any, ptr: int, data: bytes) -> None:
    vg.backend.memcpy_htod(ptr, data, len(data), vg.stream)
    vg.backend.stream_synchronize(vg.stream)


def read(vg: Any, ptr: int, count: int) -> bytes:
    out = bytearray(count)
    vg.backend.memcpy_dtoh(out, ptr, count, vg.stream)
    vg.backend.stream_synchronize(vg.stream)
    return bytes(out)


def usage(vg: Any, tenant: str = "user:a") -> int:
    return vg.broker.ledger.usage(tenant, 0)


def refused(code: int, fn: Any, *args: Any) -> None:
    with pytest.raises(BackendError) as info:
        fn(*args)
    assert info.value.code == code, info.value


def test_a_process_of_the_tenant_opens_the_allocation_and_uses_it(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    ptr = malloc(vg, a, MiB)
    write(vg, ptr, b"exported")
    handle = export(vg, a, ptr)
    assert export(vg, a, ptr + 4096) == handle  # the allocation's handle, from any pointer in it
    assert handle.startswith(b"pilotIPC") and len(handle) == HANDLE_BYTES
    refused(CUDA_ERROR_INVALID_VALUE, b.check_range, ptr, 8)  # not before it is opened
    assert open_handle(vg, b, handle) == (ptr, MiB)
    b.check_range(ptr + 100, 4096)  # now memory of b for every check
    refused(CUDA_ERROR_INVALID_VALUE, b.check_range, ptr + MiB - 4, 8)  # not past its end
    assert read(vg, ptr, 8) == b"exported"
    refused(CUDA_ERROR_INVALID_VALUE, free, vg, b, ptr)  # never b's allocation to free
    assert close(vg, b, ptr) == 0
    refused(CUDA_ERROR_INVALID_VALUE, b.check_range, ptr, 8)
    refused(CUDA_ERROR_INVALID_VALUE, close, vg, b, ptr)  # closed already
    assert usage(vg) == MiB and ptr in a.allocations  # the exporter's, untouched


def test_who_may_not_open_a_handle(vg: Any) -> None:
    a = session(vg, 1)
    ptr = malloc(vg, a, MiB)
    handle = export(vg, a, ptr)
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, session(vg, 2, tenant="user:b"), handle)
    refused(INVALID_CONTEXT, open_handle, vg, session(vg, 3, pid=a.creds.pid), handle)  # same process
    other_gpu = make_vgpu(vg.broker, device=1)
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, other_gpu, session(other_gpu, 4), handle)
    made_up = bytearray(handle)
    made_up[10] ^= 1
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, session(vg, 5), bytes(made_up))
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, session(vg, 6), bytes(HANDLE_BYTES))
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, session(vg, 7), handle, 2)  # unknown flag
    # and what cannot be exported: memory that is not one of the session's device allocations
    refused(CUDA_ERROR_INVALID_VALUE, export, vg, a, ptr + MiB)
    refused(CUDA_ERROR_INVALID_VALUE, export, vg, session(vg, 8), ptr)
    managed = int(memory_managed(vg, a, MiB))
    refused(CUDA_ERROR_INVALID_VALUE, export, vg, a, managed)


def memory_managed(vg: Any, s: Session, size: int) -> int:
    """A managed allocation in the session's tables, as cudaMallocManaged leaves it."""
    ptr = vg.backend.mem_alloc_managed(size, 1)
    s.add_allocation(ptr, size, managed=True)
    return ptr


def test_opened_twice_is_one_grant_counted(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    ptr = malloc(vg, a, MiB)
    handle = export(vg, a, ptr)
    assert open_handle(vg, b, handle) == open_handle(vg, b, handle)
    assert close(vg, b, ptr) == 1
    b.check_range(ptr, MiB)
    assert close(vg, b, ptr) == 0
    refused(CUDA_ERROR_INVALID_VALUE, b.check_range, ptr, 1)


def test_the_exporters_free_waits_for_its_importers_and_keeps_the_charge(vg: Any) -> None:
    a, b, c = session(vg, 1), session(vg, 2), session(vg, 3)
    ptr = malloc(vg, a, 2 * MiB)
    write(vg, ptr, b"still here")
    handle = export(vg, a, ptr)
    open_handle(vg, b, handle)
    open_handle(vg, c, handle)
    free(vg, a, ptr)
    assert ptr not in a.allocations and a.charged.get("device", 0) == 0
    refused(CUDA_ERROR_INVALID_VALUE, a.check_range, ptr, 1)
    assert vg.broker.policy.freed_ptrs == [ptr]  # the policy: gone from the exporter's session
    assert usage(vg) == 2 * MiB  # the tenant: still charged
    assert vg.backend.mem_frees == [] and vg.quarantine.bytes == 0
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, session(vg, 4), handle)  # no new opens
    assert close(vg, b, ptr) == 0
    assert read(vg, ptr, 10) == b"still here" and usage(vg) == 2 * MiB  # c holds it still
    assert close(vg, c, ptr) == 0
    assert usage(vg) == 0 and vg.broker.budget.used(0) == 0
    vg.quarantine.drain(behind_work=False)
    assert vg.backend.mem_frees == [ptr]  # zeroed, then freed once
    assert vg.broker.ipc.counts() == {"memory_exports": 0, "grants": 0, "kept_bytes": 0,
                                      "event_exports": 0}


def test_without_importers_the_free_is_as_usual_and_the_handle_dies(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    ptr = malloc(vg, a, MiB)
    handle = export(vg, a, ptr)
    open_handle(vg, b, handle)
    close(vg, b, ptr)
    free(vg, a, ptr)
    assert usage(vg) == 0
    refused(CUDA_ERROR_INVALID_VALUE, open_handle, vg, b, handle)
    assert vg.broker.ipc.counts()["memory_exports"] == 0


def test_a_stream_ordered_free_of_an_imported_allocation_is_deferred_too(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    ptr = malloc(vg, a, MiB)
    open_handle(vg, b, export(vg, a, ptr))
    mempool.free_async(vg, a, req("pilot_req_free_async", ptr=ptr, stream=STREAM),
                       memoryview(b""))
    assert ptr not in a.allocations and usage(vg) == MiB and vg.quarantine.bytes == 0
    close(vg, b, ptr)
    assert usage(vg) == 0


def test_sessions_that_end_let_go_in_either_order(vg: Any) -> None:
    for exporter_first in (True, False):
        a, b = session(vg, 1), session(vg, 2)
        ptr = malloc(vg, a, MiB)
        open_handle(vg, b, export(vg, a, ptr))
        first, second = (a, b) if exporter_first else (b, a)
        for s in (first, second):
            ipc.session_ends(vg, s)
            held = s.held_allocations()
            s.release(vg.backend, vg.stream)
            vg.broker.release_session(s, held)
            if s is first:
                assert usage(vg) == MiB
        vg.quarantine.drain(behind_work=False)
        assert usage(vg) == 0 and vg.backend.mem_frees.count(ptr) == 1
        vg.backend.mem_frees.clear()


def test_cuda_device_reset_lets_go_like_the_end_of_the_session(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    ptr = malloc(vg, a, MiB)
    write(vg, ptr, b"kept")
    handle = export(vg, a, ptr)
    open_handle(vg, b, handle)
    flags = EVENT_INTERPROCESS_NO_TIMING
    ev = int(events.event_create(vg, a, req("pilot_req_event_create", flags=flags), memoryview(b"")).value)
    rep = ipc.event_export(vg, a, req("pilot_req_handle", handle=ev), memoryview(b""))
    request = req("pilot_req_ipc_open", flags=0)
    ffi.memmove(request.handle, bytes(ffi.buffer(rep.handle)), HANDLE_BYTES)
    theirs = int(ipc.event_open(vg, b, request, memoryview(b"")).value)
    device.device_reset(vg, a, None, memoryview(b""))  # the exporter resets: b keeps both
    assert not a.allocations and usage(vg) == MiB and read(vg, ptr, 4) == b"kept"
    assert vg.backend.events_destroyed == [] and theirs in b.events
    device.device_reset(vg, b, None, memoryview(b""))  # the importer resets: its grants end
    vg.quarantine.drain(behind_work=False)
    assert not b.imports and usage(vg) == 0 and vg.backend.mem_frees == [ptr]
    assert len(vg.backend.events_destroyed) == 1
    assert vg.broker.ipc.counts() == {"memory_exports": 0, "grants": 0, "kept_bytes": 0,
                                      "event_exports": 0}


def test_an_interprocess_event_is_shared_until_its_last_handle_goes(vg: Any) -> None:
    a, b = session(vg, 1), session(vg, 2)
    mk = events.event_create
    plain = int(mk(vg, a, req("pilot_req_event_create", flags=0), memoryview(b"")).value)
    shared = int(mk(vg, a, req("pilot_req_event_create", flags=EVENT_INTERPROCESS_NO_TIMING),
                    memoryview(b"")).value)
    refused(CUDA_ERROR_INVALID_RESOURCE_HANDLE, ipc.event_export, vg, a,
            req("pilot_req_handle", handle=plain), memoryview(b""))
    rep = ipc.event_export(vg, a, req("pilot_req_handle", handle=shared), memoryview(b""))
    handle = bytes(ffi.buffer(rep.handle))
    request = req("pilot_req_ipc_open", flags=0)
    ffi.memmove(request.handle, handle, HANDLE_BYTES)
    refused(INVALID_CONTEXT, ipc.event_open, vg, session(vg, 3, pid=a.creds.pid), request,
            memoryview(b""))
    refused(CUDA_ERROR_INVALID_VALUE, ipc.event_open, vg, session(vg, 4, tenant="user:b"), request,
            memoryview(b""))
    theirs = int(ipc.event_open(vg, b, request, memoryview(b"")).value)
    assert b.event(theirs) is a.event(shared)
    events.event_destroy(vg, a, req("pilot_req_handle", handle=shared), memoryview(b""))
    assert vg.backend.events_destroyed == []  # b's handle still names it
    vg.backend.event_record(b.event(theirs), vg.stream)
    ipc.session_ends(vg, b)  # b's end drops its handle: the last
    assert len(vg.backend.events_destroyed) == 1 and theirs not in b.events


def test_random_opens_closes_and_frees_free_each_allocation_once_and_settle_every_charge() -> None:
    rng = random.Random(27)
    vg = make_vgpu()
    sessions = [session(vg, i) for i in range(1, 6)]
    live: dict[int, tuple[Session, bytes]] = {}  # ptr -> exporter, handle
    opened: dict[tuple[int, int], int] = {}  # (session id, ptr) -> opens
    freed_by_exporter: set[int] = set()
    for _ in range(3000):
        s = rng.choice(sessions)
        act = rng.random()
        if act < 0.2:
            ptr = malloc(vg, s, rng.choice((1, 2, 3)) * MiB)
            live[ptr] = (s, export(vg, s, ptr))
        elif act < 0.5 and live:
            ptr = rng.choice(list(live))
            exporter, handle = live[ptr]
            if s is not exporter:
                open_handle(vg, s, handle)
                opened[(s.id, ptr)] = opened.get((s.id, ptr), 0) + 1
        elif act < 0.8 and opened:
            sid, ptr = rng.choice(list(opened))
            holder = next(x for x in sessions if x.id == sid)
            left = close(vg, holder, ptr)
            opened[(sid, ptr)] -= 1
            assert left == opened[(sid, ptr)]
            if not left:
                del opened[(sid, ptr)]
        elif live:
            ptr = rng.choice(list(live))
            exporter, _ = live.pop(ptr)
            free(vg, exporter, ptr)
            freed_by_exporter.add(ptr)
        held = sum(sum(x.allocations.values()) for x in sessions)
        kept = vg.broker.ipc.counts()["kept_bytes"]
        assert usage(vg) == held + kept  # every byte charged once: held or kept for importers
    for x in sessions:
        ipc.session_ends(vg, x)
        held_list = x.held_allocations()
        x.release(vg.backend, vg.stream)
        vg.broker.release_session(x, held_list)
    vg.quarantine.drain(behind_work=False)
    assert usage(vg) == 0 and vg.broker.budget.used(0) == 0
    free_bytes, total = vg.backend.mem_get_info(0)
    assert free_bytes == total  # every allocation went back to the driver (the sim refuses a double free)
    assert freed_by_exporter <= set(vg.backend.mem_frees)
