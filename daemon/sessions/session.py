"""A session: one client process, its identity from the kernel, and everything it owns.

A session's state belongs to the vGPU thread that serves it; other threads only read
counters for reports. Device pointers, streams, events, modules and functions are reachable
only through their owner's tables, which is what keeps tenants apart at the API level.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    STICKY_ERRORS,
    BackendError,
    FunctionInfo,
)
from pilot.daemon.config import PRIORITIES
from pilot.daemon.sessions.memory import MemoryTables
from pilot.daemon.sessions.teardown import Teardown
from pilot.daemon.sessions.unified import UnifiedMemory

log = logging.getLogger("pilot.session")

FIRST_HANDLE = 0x10


@dataclass
class Credentials:
    uid: int
    gid: int
    pid: int


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat from field 3 on (state, ppid, ...), None if unreadable (gone, or no
    /proc). The command name before them may hold spaces and ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (/proc/<pid>/stat field 22), None if
    it cannot be read."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None  # field 22; fields[0] is field 3
    except (IndexError, ValueError):
        return None


@dataclass
class StreamState:
    """A program stream; `blocking` streams synchronize with the legacy default stream."""

    obj: Any
    blocking: bool
    seen_legacy_gen: int = 0  # legacy-stream generation this stream already waits for
    join_event: Any = None


@dataclass
class Session(MemoryTables, UnifiedMemory, Teardown):
    id: int
    creds: Credentials
    vgpu: int
    device: int
    tenant: str = ""
    cmdline: str = ""
    admin: bool = False  # root or [daemon] admin_group: may raise the limits nobody is charged for
    started: float = field(default_factory=time.time)
    identity: int | None = None  # the vGPU endpoint connection attached to this session
    fault_identity: int | None = None  # its unified-memory fault channel, once opened
    ordinal: int = 0  # the program's number for this part's device (devices.py)
    group: Any = None  # devices.SessionGroup: the session's parts on every device it uses
    # Its SM partition (resources/shares.py), None for the whole GPU; fixed for its life, since
    # its streams and modules are created in it.
    partition: Any = None

    # Owned by the vGPU thread.
    allocations: dict[int, int] = field(default_factory=dict)
    pitched: set[int] = field(default_factory=set)  # allocations of cudaMallocPitch
    # device allocations served with managed memory (`[gpu] managed_device_memory`): the driver
    # zeroes their pages when it populates them, so a free does not (a memset would bring every
    # page onto the GPU, past what the capacity enforcer counts)
    driver_zeroed: set[int] = field(default_factory=set)
    # Bytes the resource broker charged to this session, by kind (resources/broker.py).
    charged: dict[str, int] = field(default_factory=dict)
    _bases: list[int] = field(default_factory=list)
    # Device memory of another process of the tenant, opened through CUDA IPC: base -> size
    # (resources/ipc.py keeps the counts). Checked like allocations; never freed by the session.
    imports: dict[int, int] = field(default_factory=dict)
    _import_bases: list[int] = field(default_factory=list)
    ipc_events: set[int] = field(default_factory=set)  # handles made with cudaEventInterprocess
    link_output: bytes = b""  # the last cuLinkComplete's cubin and log, read in pieces (ops/linker.py)
    streams: dict[int, StreamState] = field(default_factory=dict)
    events: dict[int, Any] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    module_variables: dict[int, tuple[str, ...]] = field(default_factory=dict)  # handle -> names
    module_charges: dict[int, int] = field(default_factory=dict)  # handle -> bytes charged
    # Module globals (__device__/__constant__ variables) the session looked up: address -> size,
    # and address -> module handle. Copies may use them like allocations; they go with their module.
    symbols: dict[int, int] = field(default_factory=dict)
    _symbol_modules: dict[int, int] = field(default_factory=dict)
    _symbol_bases: list[int] = field(default_factory=list)
    functions: dict[int, FunctionInfo] = field(default_factory=dict)
    staging: Any = None
    fault_staging: Any = None  # the unified-memory fault channel's own staging area
    deferred: int = 0  # first error of an asynchronous call, until a synchronizing call
    # (ptr, size) -> None, told of each device allocation made (size 0: freed) while the vGPU's
    # fast path may copy the session's memory (vgpu/fast.py)
    fast_ranges: Any = None
    # told of each shadow made, changed (.added) or dropped (.removed) while the fast path knows
    # the session (vgpu/fast.py ShadowsInC)
    fast_shadows: Any = None
    # Kernels launched since the last synchronizing call succeeded: named when the GPU faults.
    work_in_flight: bool = False
    sticky: int = 0
    legacy_gen: int = 0
    legacy_event: Any = None
    legacy: Any = None  # the legacy stream when the session has one of its own (callbacks.py)
    limits: Any = None  # limits.ContextLimits holding this session's cudaDeviceSetLimit requests
    limit_charges: dict[int, int] = field(default_factory=dict)  # limit -> bytes charged for it
    # Blocking streams with work issued since the legacy stream last joined them.
    dirty_blocking: dict[int, StreamState] = field(default_factory=dict)
    calls: int = 0
    # Kernels and graphs it launched, through Python or C (folded): what a policy reads in
    # AllocationView.launches instead of watching each launch (policies/salus).
    kernels: int = 0
    # A launch the policy made wait (scheduling/waiting.py), and the calls held behind it.
    waiting: Any = None
    backlog: deque[Any] = field(default_factory=deque)
    # Why the policy holds the session's next call (Controls.hold_session), None: it does not.
    # Written by the policy's thread, read by the vGPU's (one attribute: atomic under the GIL).
    policy_hold: str | None = None
    backlog_bytes: int = 0
    # Gates of its host callbacks armed on its streams and not yet opened (scheduling/
    # callbacks.py, under the hub's lock): while any is, a call that waits for its streams is
    # held in its backlog instead of blocking its vGPU's thread (scheduling/waiting.py).
    callback_gates: int = 0
    # Priority classes (scheduling/priority.py): the tenant's class level, whether its calls
    # make its GPU's lower sessions wait (`signals`), when it last made one, whether it is gated
    # now, since when its calls are held at the gate (0.0: not held), and the events after its
    # admitted work while gated. Owned by its vGPU thread (last_call is read by the others).
    priority: int = 1
    signals: bool = False
    last_call: float = 0.0
    gated: bool = False
    gate_held: float = 0.0
    gate_events: deque[Any] = field(default_factory=deque)
    # Preemption (scheduling/preempt.py): the retreat words its launches raise (0: none), and
    # its variants and counters (a SessionVariants, once it may be gated and loads a module).
    preempt_raises: int = 0
    preempt: Any = None
    # A policy's preemption (Controls.preemptible / preempt): whether its kernels launch as
    # preemptible variants whatever its class, and its preemption in progress (a
    # preempt.SessionPreemption; None: its own retreat word is down). Written by the policy's
    # scheduler thread, read by its vGPU's (one attribute each: atomic under the GIL).
    preemptible: bool = False
    preemption: Any = None
    device_bytes: int = 0
    # Unified memory (daemon/managed.py): managed allocations, the client's shadows of managed
    # ranges by base, and the ranges holding the session's __managed__ variables.
    managed_bytes: int = 0
    managed: set[int] = field(default_factory=set)
    packed_ranges: set[int] = field(default_factory=set)  # managed ranges the client packs into
    # managed allocations pilotd prefetched to the GPU itself -> the ranges of them the program
    # prefetched since (ops/unified.py malloc_managed)
    auto_prefetched: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    shadows: dict[int, Any] = field(default_factory=dict)  # base -> shadow.Shadow
    _shadow_bases: list[int] = field(default_factory=list)
    managed_vars: dict[int, tuple[int, int]] = field(default_factory=dict)  # base -> (size, module)
    # Pinned host memory (daemon/pinned.py): ranges by their address in the client.
    pinned: dict[int, Any] = field(default_factory=dict)  # base -> pinned.PinnedRange
    _pinned_bases: list[int] = field(default_factory=list)
    pinned_bytes: int = 0
    # CUDA arrays by handle (sessions/arrays.ArrayRecord), texture and surface objects by their
    # driver value -> the resource they read (ops/arrays.py).
    arrays: dict[int, Any] = field(default_factory=dict)
    textures: dict[int, Any] = field(default_factory=dict)
    surfaces: dict[int, Any] = field(default_factory=dict)
    # CUDA math library handles (ops/libraries.py): handle -> LibraryHandle {library, obj}.
    libraries: dict[int, Any] = field(default_factory=dict)
    # cuDNN backend descriptors by the number pilotd gave out (ops/dnn.py DnnDescriptor).
    dnn_descriptors: dict[int, Any] = field(default_factory=dict)
    # Executable graphs pilotd instantiated for the program (ops/graphs.py RemoteGraph) by the
    # shim's handle, the bytes of their records, and what makes them stale when memory is freed.
    graphs: dict[int, Any] = field(default_factory=dict)
    graph_bytes: int = 0
    graphs_stale: Any = None
    _next_handle: int = FIRST_HANDLE

    def holds_managed(self, ptr: int) -> bool:
        """Managed memory, or device memory served with it (driver_zeroed): the driver zeroes the
        pages it populates, and the capacity enforcer may be moving it, counting it as resident
        until it is freed; so it is freed at once, after the session's work, not zeroed."""
        return ptr in self.managed or ptr in self.driver_zeroed

    # ---- handles ----
    def new_handle(self) -> int:
        h = self._next_handle
        self._next_handle += 1
        return h

    def stream(self, handle: int) -> StreamState:
        try:
            return self.streams[handle]
        except KeyError:
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no stream {handle:#x}") from None

    def event(self, handle: int) -> Any:
        try:
            return self.events[handle]
        except KeyError:
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no event {handle:#x}") from None

    # ---- unified-memory shadows ----



    # ---- module variables ----


    # ---- errors ----
    def note_async_error(self, code: int) -> None:
        if code in STICKY_ERRORS:
            self.sticky = self.sticky or code
        elif not self.deferred:
            self.deferred = code

    def take_deferred(self) -> int:
        if self.sticky:
            return self.sticky
        code, self.deferred = self.deferred, 0
        return code

    # ---- teardown ----


    def summary(self) -> dict[str, Any]:
        return {
            "session": self.id,
            "tenant": self.tenant,
            "pid": self.creds.pid,
            "uid": self.creds.uid,
            "gid": self.creds.gid,
            "vgpu": self.vgpu,
            "device": self.device,
            "gpu": self.device,
            "cmdline": self.cmdline,
            "started": self.started,
            "device_bytes": self.device_bytes,
            "managed_bytes": self.managed_bytes,
            "packed_ranges": len(self.packed_ranges),
            "managed": [sh.summary() for sh in list(self.shadows.values())],
            "pinned_bytes": self.pinned_bytes,
            "pinned": [r.summary() for r in list(self.pinned.values())],
            "charged": dict(self.charged),
            "allocations": len(self.allocations),
            # another process's device memory opened through CUDA IPC (charged to its exporter)
            "ipc_opened_bytes": sum(list(self.imports.values())),
            "arrays": len(self.arrays),
            "textures": len(self.textures) + len(self.surfaces),
            "streams": len(self.streams),
            "events": len(self.events),
            "modules": len(self.modules),
            "library_handles": len(self.libraries),  # cuBLAS/cuBLASLt/cuDNN handles in pilotd
            "dnn_descriptors": len(self.dnn_descriptors),  # cuDNN backend descriptors
            "graphs": len(self.graphs),  # executable graphs pilotd instantiated as CUDA graphs
            "calls": self.calls,
            "state": "error" if self.sticky else "waiting" if self.waiting is not None else
                     "gated" if self.gate_held else "active",
            "priority": PRIORITIES[self.priority],
            "gated": self.gated,
            "waiting": None if self.waiting is None else {
                "kernel": self.waiting.launch.info.name
                if self.waiting.launch is not None and self.waiting.launch.info else "",
                "reason": self.waiting.reason, "since": self.waiting.since,
                "held_calls": len(self.backlog)},
            "alive": os.path.exists(f"/proc/{self.creds.pid}"),
        }
