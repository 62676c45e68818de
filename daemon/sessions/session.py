"""A session: one client process, its identity from the kernel, and everything it owns.

A session's state belongs to the vGPU thread that serves it; other threads only read
counters for reports. Device pointers, streams, events, modules and functions are reachable
only through their owner's tables, which is what keeps tenants apart at the API level.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    STICKY_ERRORS,
    Backend,
    BackendError,
    FunctionInfo,
)

log = logging.getLogger("pilot.session")

FIRST_HANDLE = 0x10
_POINTER = struct.Struct("<Q")  # 0, 1 and 2 are CUDA's default, legacy and per-thread streams


@dataclass
class Credentials:
    uid: int
    gid: int
    pid: int

    @classmethod
    def from_peer_address(cls, peer: str | None) -> Credentials:
        """libzmq appends ':uid:gid:pid' (SO_PEERCRED) to an IPC peer's address."""
        if not peer:
            raise ValueError("no peer credentials on the connection")
        parts = peer.rsplit(":", 3)
        if len(parts) != 4:
            raise ValueError(f"no peer credentials in {peer!r}")
        return cls(uid=int(parts[1]), gid=int(parts[2]), pid=int(parts[3]))


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _within(bases: list[int], sizes: dict[int, int], ptr: int, count: int) -> bool:
    """Whether [ptr, ptr+count) lies inside one of the ranges base..base+sizes[base]; `bases` is
    the sorted list of sizes' keys."""
    i = bisect.bisect_right(bases, ptr) - 1
    return i >= 0 and ptr + count <= bases[i] + sizes[bases[i]]


@dataclass
class StreamState:
    """A program stream; `blocking` streams synchronize with the legacy default stream."""

    obj: Any
    blocking: bool
    seen_legacy_gen: int = 0  # legacy-stream generation this stream already waits for
    join_event: Any = None


@dataclass
class Session:
    id: int
    creds: Credentials
    vgpu: int
    device: int
    tenant: str = ""
    cmdline: str = ""
    started: float = field(default_factory=time.time)
    identity: int | None = None  # the vGPU endpoint connection attached to this session
    fault_identity: int | None = None  # its unified-memory fault channel, once opened
    ordinal: int = 0  # the program's number for this part's device (devices.py)
    group: Any = None  # devices.SessionGroup: the session's parts on every device it uses

    # Owned by the vGPU thread.
    allocations: dict[int, int] = field(default_factory=dict)
    pitched: set[int] = field(default_factory=set)  # allocations of cudaMallocPitch
    # Bytes the resource broker charged to this session, by kind (resources/broker.py).
    charged: dict[str, int] = field(default_factory=dict)
    _bases: list[int] = field(default_factory=list)
    streams: dict[int, StreamState] = field(default_factory=dict)
    events: dict[int, Any] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    # Module globals (__device__/__constant__ variables) the session looked up: address -> size,
    # and address -> module handle. Copies may use them like allocations; they go with their module.
    symbols: dict[int, int] = field(default_factory=dict)
    _symbol_modules: dict[int, int] = field(default_factory=dict)
    _symbol_bases: list[int] = field(default_factory=list)
    functions: dict[int, FunctionInfo] = field(default_factory=dict)
    staging: Any = None
    fault_staging: Any = None  # the unified-memory fault channel's own staging area
    deferred: int = 0  # first error of an asynchronous call, until a synchronizing call
    sticky: int = 0
    legacy_gen: int = 0
    legacy_event: Any = None
    legacy: Any = None  # the legacy stream when the session has one of its own (callbacks.py)
    limits: Any = None  # limits.ContextLimits holding this session's cudaDeviceSetLimit requests
    limit_charges: dict[int, int] = field(default_factory=dict)  # limit -> bytes charged for it
    # Blocking streams with work issued since the legacy stream last joined them.
    dirty_blocking: dict[int, StreamState] = field(default_factory=dict)
    calls: int = 0
    # A launch the policy made wait (scheduling/waiting.py), and the calls held behind it.
    waiting: Any = None
    backlog: deque[Any] = field(default_factory=deque)
    device_bytes: int = 0
    # Unified memory (daemon/managed.py): managed allocations, the client's shadows of managed
    # ranges by base, and the ranges holding the session's __managed__ variables.
    managed_bytes: int = 0
    managed: set[int] = field(default_factory=set)
    shadows: dict[int, Any] = field(default_factory=dict)  # base -> shadow.Shadow
    _shadow_bases: list[int] = field(default_factory=list)
    managed_vars: dict[int, tuple[int, int]] = field(default_factory=dict)  # base -> (size, module)
    # Pinned host memory (daemon/pinned.py): ranges by their address in the client.
    pinned: dict[int, Any] = field(default_factory=dict)  # base -> pinned.PinnedRange
    _pinned_bases: list[int] = field(default_factory=list)
    pinned_bytes: int = 0
    _next_handle: int = FIRST_HANDLE

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

    # ---- memory ----
    def add_allocation(self, ptr: int, size: int, managed: bool = False, pitched: bool = False) -> None:
        self.allocations[ptr] = size
        bisect.insort(self._bases, ptr)
        if pitched:
            self.pitched.add(ptr)
        if managed:
            self.managed.add(ptr)
            self.managed_bytes += size
        else:
            self.device_bytes += size

    def allocation_kind(self, ptr: int) -> str:
        """The broker's kind of one of the session's allocations."""
        return "managed" if ptr in self.managed else "pitch" if ptr in self.pitched else "device"

    def remove_allocation(self, ptr: int) -> int:
        size = self.allocations.pop(ptr, None)
        if size is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not an allocation of this session")
        del self._bases[bisect.bisect_left(self._bases, ptr)]
        self.pitched.discard(ptr)
        if ptr in self.managed:
            self.managed.discard(ptr)
            self.managed_bytes -= size
        else:
            self.device_bytes -= size
        return size

    def held_allocations(self) -> list[tuple[str, int, int]]:
        """(kind, ptr, size) of every allocation and pinned range the session holds."""
        held = [(self.allocation_kind(p), p, n) for p, n in list(self.allocations.items())]
        return held + [("pinned", r.base, r.length) for r in list(self.pinned.values())]

    # ---- unified-memory shadows ----
    def add_shadow(self, shadow: Any) -> None:
        self.shadows[shadow.base] = shadow
        bisect.insort(self._shadow_bases, shadow.base)

    def pop_shadow(self, base: int) -> Any:
        """The shadow mapped at base (removed), or None."""
        shadow = self.shadows.pop(base, None)
        if shadow is not None:
            del self._shadow_bases[bisect.bisect_left(self._shadow_bases, base)]
        return shadow

    def drop_shadow(self, ptr: int) -> None:
        """The managed allocation at ptr is going away: forget the client's shadow of it."""
        shadow = self.shadow_of(ptr)
        if shadow is not None and shadow.kind == "allocation" and shadow.lo == ptr:
            self.pop_shadow(shadow.base)

    # ---- pinned host memory ----
    def add_pinned(self, r: Any) -> None:
        self.pinned[r.base] = r
        bisect.insort(self._pinned_bases, r.base)
        self.pinned_bytes += r.length

    def pop_pinned(self, base: int) -> Any:
        r = self.pinned.pop(base)
        del self._pinned_bases[bisect.bisect_left(self._pinned_bases, base)]
        self.pinned_bytes -= r.length
        return r

    def pinned_view(self, ptr: int, count: int) -> tuple[Any, int]:
        """(range, the daemon's address of the client's [ptr, ptr+count)) for a pinned range of
        this session, on any of its devices, that holds it; (None, 0) if none does."""
        parts = list(self.group.parts.values()) if self.group is not None else [self]
        for part in [self, *(p for p in parts if p is not self)]:
            bases = list(part._pinned_bases)  # another part's table may change meanwhile
            i = bisect.bisect_right(bases, ptr) - 1
            r = part.pinned.get(bases[i]) if i >= 0 else None
            address = r.host(ptr, count) if r is not None else None
            if address is not None:
                return r, address
        return None, 0

    def note_managed_launch(self, args: memoryview) -> None:
        """Accounting for the memory policies: each managed range a launch passes a pointer to
        (any 8-byte-aligned argument word, struct members included) counts one launch."""
        seen: set[int] = set()
        for (word,) in _POINTER.iter_unpack(args[: len(args) - len(args) % 8]):
            shadow = self.shadow_of(word) if word else None
            if shadow is not None and shadow.base not in seen:
                seen.add(shadow.base)
                shadow.launches += 1

    def shadow_covering(self, ptr: int) -> Any:
        """The shadow whose mapping [base, base+length) holds ptr, or None."""
        i = bisect.bisect_right(self._shadow_bases, ptr) - 1
        if i < 0:
            return None
        shadow = self.shadows[self._shadow_bases[i]]
        return shadow if ptr < shadow.base + shadow.length else None

    def shadow_of(self, ptr: int) -> Any:
        """The shadow whose managed range holds ptr, or None."""
        i = bisect.bisect_right(self._shadow_bases, ptr) - 1
        if i < 0:
            return None
        shadow = self.shadows[self._shadow_bases[i]]
        return shadow if shadow.holds(ptr) else None

    def check_range(self, ptr: int, count: int) -> None:
        """Raise unless [ptr, ptr+count) lies inside one allocation or one module variable of
        this session."""
        if _within(self._bases, self.allocations, ptr, count) or (
                self.symbols and _within(self._symbol_bases, self.symbols, ptr, count)):
            return
        if self.group is not None and self.group.owns(ptr, count, self):
            return  # memory of the session on another device (devices.py)
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"[{ptr:#x}, +{count}) is not memory of this session")

    # ---- module variables ----
    def add_symbol(self, module: int, ptr: int, size: int) -> None:
        """Record a variable of the session's module `module` (a handle) as its memory."""
        if ptr in self.symbols:
            return
        self.symbols[ptr] = size
        self._symbol_modules[ptr] = module
        bisect.insort(self._symbol_bases, ptr)

    def forget_module_symbols(self, module: int) -> None:
        """The module is going away: its variables are no memory of the session any more."""
        for ptr in [p for p, mod in self._symbol_modules.items() if mod == module]:
            del self.symbols[ptr]
            del self._symbol_modules[ptr]
            del self._symbol_bases[bisect.bisect_left(self._symbol_bases, ptr)]

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
    def free_memory(self, backend: Backend, ptr: int, stream: Any) -> None:
        """Frees one of the session's allocations, device memory zeroed first: tenants share one
        CUDA context, whose allocator hands freed memory to the next allocation as it was, so a
        tenant could otherwise read what another freed (natively each process has its own
        context and gets scrubbed memory). Managed memory needs no zeroing: the driver zeroes
        the pages it populates. The caller has synchronized the work that may still use ptr;
        the zeroing goes on `stream` and is waited for (cuMemFree waits for it anyway)."""
        size = self.allocations.get(ptr, 0)
        if size and ptr not in self.managed:
            backend.memset_d8(ptr, 0, size, stream)
            backend.stream_synchronize(stream)
        backend.mem_free(ptr)

    def release(self, backend: Backend, stream: Any) -> None:
        """Free everything the session owns (`stream`: the vGPU's, for zeroing freed memory).
        Best effort: one failure does not stop the rest."""

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:
                log.warning("session %d: releasing %s failed: %s", self.id, what, exc)

        for st in self.streams.values():
            attempt("stream sync", backend.stream_synchronize, st.obj)
        if self.legacy is not None:
            attempt("stream sync", backend.stream_synchronize, self.legacy)
        self.shadows.clear()
        self._shadow_bases.clear()
        for base in list(self.pinned):
            attempt("pinned memory", self.pop_pinned(base).close, backend)
        for ptr in list(self.allocations):
            attempt("memory", self.free_memory, backend, ptr, self.legacy or stream)
            self.remove_allocation(ptr)
        for ev in self.events.values():
            attempt("event", backend.event_destroy, ev)
        for st in self.streams.values():
            if st.join_event is not None:
                attempt("event", backend.event_destroy, st.join_event)
            attempt("stream", backend.stream_destroy, st.obj)
        if self.legacy_event is not None:
            attempt("event", backend.event_destroy, self.legacy_event)
        self.managed_vars.clear()
        if self.legacy is not None:
            attempt("stream", backend.stream_destroy, self.legacy)
            self.legacy = None
        for handle, mod in self.modules.items():
            self.forget_module_symbols(handle)
            attempt("module", backend.module_unload, mod)
        for area in (self.staging, self.fault_staging):
            if area is not None:
                attempt("staging", area.close, backend)
        if self.limits is not None:
            attempt("limits", self.limits.release, self.id)
            self.limits = None
        self.events.clear()
        self.streams.clear()
        self.modules.clear()
        self.functions.clear()
        self.staging = self.fault_staging = None

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
            "managed": [sh.summary() for sh in list(self.shadows.values())],
            "pinned_bytes": self.pinned_bytes,
            "pinned": [r.summary() for r in list(self.pinned.values())],
            "charged": dict(self.charged),
            "allocations": len(self.allocations),
            "streams": len(self.streams),
            "events": len(self.events),
            "modules": len(self.modules),
            "calls": self.calls,
            "state": "error" if self.sticky else "waiting" if self.waiting is not None else "active",
            "waiting": None if self.waiting is None else {
                "kernel": self.waiting.launch.info.name if self.waiting.launch.info else "",
                "reason": self.waiting.reason, "since": self.waiting.since,
                "held_calls": len(self.backlog)},
            "alive": os.path.exists(f"/proc/{self.creds.pid}"),
        }
