"""Several GPUs per session: the daemon's device order, a session's parts, peer copies.

CUDA gives each host thread a current device (cudaSetDevice), and allocations, streams, events
and modules belong to one device. A session therefore has one *part* per device it uses: a
Session object on a vGPU of that device, reached over its own connection from the shim, served
by that vGPU's thread. The parts share the session's id, credentials and tenant; the router
creates part 0 at HELLO and the others at DEVICE_JOIN, when the program first uses the device.

Program ordinals map to the daemon's GPUs through the session's `positions`. A program whose
environment sets CUDA_VISIBLE_DEVICES sees the GPUs it selects, in its order (visible.py; the
shim sends the selection in HELLO, and the router resolves it against the GPUs pilotd serves,
so it can only narrow). Without one, ordinals are relative to the session's first GPU: device 0
is the GPU the router placed the session on (the least busy one), device i the i-th next GPU in
host order, wrapping. So single-GPU programs still spread over the server's GPUs, and every
program sees all of them. A tenant with a GPU allow-list (a Slurm job: resources/gpu_access.py)
sees only its allowed GPUs, both ways: as if the host had no others.

Handles carry their device: a part numbers its streams, events, modules and functions from
`ordinal << PILOT_HANDLE_DEVICE_SHIFT`, so the shim routes a call naming a handle to the right
connection without asking. Device pointers need no such tag: every device's memory lives in
one address space (unified addressing), and the shim keeps which device each range is on.

Cross-device operations are few and read a sibling part's tables from another vGPU thread:
range checks of peer copies, and events of another device that a stream waits for. Each read
is one dict or list operation (atomic under the GIL) on state the sibling only changes on its
own thread; a program that frees memory or destroys an event while another thread uses it on
another device gets an error or a stale answer, never a crash of the daemon.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    BackendError,
    DeviceInfo,
)
from pilot.daemon.protocol import lib
from pilot.daemon.sessions.session import FIRST_HANDLE, Session
from pilot.daemon.sessions.visible import GpuIdentity, identities

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

HANDLE_SHIFT = lib.PILOT_HANDLE_DEVICE_SHIFT
MAX_DEVICES = lib.PILOT_MAX_DEVICES


def handle_device(handle: int) -> int:
    """The program ordinal a stream/event handle belongs to."""
    return (handle >> HANDLE_SHIFT) & 0xFF


@dataclass
class Topology:
    """The GPUs the daemon serves, in host order: position p is host GPU `gpus[p]`, backend
    device `devices[p]`, served by `vgpus[p]`. Built once by the Daemon; read-only after."""

    gpus: list[int]
    devices: list[int]
    infos: list[DeviceInfo]
    peers: list[list[bool]]  # peers[p][q]: GPU p can access GPU q's memory
    vgpus: list[list[VGpu]] = field(default_factory=list)
    ids: list[GpuIdentity] = field(default_factory=list)  # UUIDs, PCI bus ids and orders

    def __post_init__(self) -> None:
        if not self.ids:
            self.ids = identities(self.gpus, self.infos)

    def __len__(self) -> int:
        return min(len(self.gpus), MAX_DEVICES)

    def position(self, gpu: int) -> int:
        return self.gpus.index(gpu)


class SessionGroup:
    """One client process across devices: its parts by program ordinal.

    Owned by the router thread (it adds parts); parts are read from vGPU threads, which only
    use `part()` and the helpers below."""

    def __init__(self, first: Session, base: int, topology: Topology | None,
                 selected: list[int] | None = None, allowed: list[int] | None = None) -> None:
        """`base`: the topology position of device 0's GPU when the program selected none;
        `selected`: the positions its CUDA_VISIBLE_DEVICES selected, as program ordinals;
        `allowed`: the positions its tenant may use (None: all; resources/gpu_access.py)."""
        self.id = first.id
        self.topology = topology
        pool = allowed if allowed is not None else list(range(len(topology) if topology is not None else 1))
        start = pool.index(base) if base in pool else 0
        self.positions: list[int] = (list(selected)[:MAX_DEVICES] if selected is not None
                                     else (pool[start:] + pool[:start])[:MAX_DEVICES])
        self.parts: dict[int, Session] = {0: first}
        first.group = self

    def __len__(self) -> int:
        return len(self.positions)

    def position(self, ordinal: int) -> int:
        """The topology position of program device `ordinal`."""
        n = len(self)
        if not 0 <= ordinal < n:
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"no device {ordinal} (of {n})")
        return self.positions[ordinal]

    def part(self, ordinal: int) -> Session | None:
        return self.parts.get(ordinal)

    def add_part(self, ordinal: int, vgpu: VGpu) -> Session:
        first = self.parts[0]
        part = Session(id=self.id, creds=first.creds, vgpu=vgpu.index, device=vgpu.gpu,
                       tenant=first.tenant, cmdline=first.cmdline, admin=first.admin)
        part.ordinal = ordinal
        part._next_handle = FIRST_HANDLE | ordinal << HANDLE_SHIFT
        part.group = self
        self.parts[ordinal] = part
        return part

    # ---- reads of sibling parts (any vGPU thread) ----
    def owns(self, ptr: int, count: int, asking: Session) -> bool:
        """Whether [ptr, ptr+count) is memory of another part of this session."""
        return any(p is not asking and owns_range(p, ptr, count) for p in list(self.parts.values()))

    def event(self, handle: int) -> Any:
        part = self.parts.get(handle_device(handle))
        ev = part.events.get(handle) if part is not None else None
        if ev is None:
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no event {handle:#x}")
        return ev

    def summary(self) -> dict[str, Any]:
        """The session as `pilot sessions` lists it: part 0's row, totals over every part."""
        rows = [p.summary() for p in list(self.parts.values())]
        row = dict(rows[0])
        for key in ("device_bytes", "pinned_bytes", "allocations", "streams", "events", "modules", "calls",
                    "ipc_opened_bytes"):
            row[key] = sum(int(r[key]) for r in rows)
        row["gpus"] = sorted({r["gpu"] for r in rows})
        waiting = next((r for r in rows if r["state"] == "waiting"), None)
        if any(r["state"] == "error" for r in rows):
            row["state"] = "error"
        elif waiting is not None:
            row["state"], row["waiting"] = "waiting", waiting["waiting"]
        elif any(r["state"] == "gated" for r in rows):
            row["state"] = "gated"
        row["gated"] = any(r["gated"] for r in rows)
        return row


def owns_range(s: Session, ptr: int, count: int) -> bool:
    """Session.check_range's test as a yes/no that is safe from another thread: each sorted base
    list is copied in one step, and a base freed meanwhile simply is not found."""
    for bases, sizes in ((list(s._bases), s.allocations), (list(s._symbol_bases), s.symbols),
                         (list(s._import_bases), s.imports)):
        i = bisect.bisect_right(bases, ptr) - 1
        size = sizes.get(bases[i]) if i >= 0 else None
        if size is not None and ptr + count <= bases[i] + size:
            return True
    return False


def any_event(s: Session, handle: int) -> Any:
    """An event of the session on any device (cudaStreamWaitEvent may name another device's)."""
    ev = s.events.get(handle)
    if ev is not None:
        return ev
    if s.group is None:
        return s.event(handle)  # raises the usual error
    return s.group.event(handle)


# ---- DEVICE_INFO ----


# ---- peer access and peer copies (shim/runtime/device/api_peer.c) ----


