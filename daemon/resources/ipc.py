"""CUDA IPC between the processes of one tenant: who exported what, who opened it.

Every tenant's memory lives in pilotd's one context per GPU, so an exported allocation already
has one device address valid for every session on that GPU: opening a handle maps nothing, it
grants the range to the importing session (its checks then accept it). The handle is pilotd's:
"pilotIPC", a random token naming the export here, zeros; the program sees 64 opaque bytes.

Rules (docs/design/ipc.md):
- only a session of the exporter's tenant (from its peer credentials), on the same physical
  GPU and SM partition, in another process, may open a handle; an unknown token and another
  tenant's look alike (cudaErrorInvalidValue: nothing tells that the handle exists);
- one export per allocation (the same handle each time, as natively); opening it again in one
  session gives the same base and counts; the last close ends the grant;
- the exporter's free (cudaFree, cudaFreeAsync, its exit) while importers hold the memory is
  deferred: the allocation leaves the exporter's session at once, but the memory is neither
  zeroed nor freed, and its charge stays with the tenant, until the last importer lets go, on
  its own vGPU thread (`Released`), which zeroes and frees it and settles the charge.
  Otherwise the driver could hand the memory to the next allocation, maybe another tenant's,
  while an importer's kernels can still reach it; and export, open, free, repeat would be a way
  around the quota;
- an exported event (cudaEventInterprocess) is one driver event shared by handles of several
  sessions, destroyed when the last of them is.

Each vGPU thread touches only its own sessions; the registry's lock orders the exporter's free
against the importers' opens and closes, which run on other vGPU threads.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"pilotIPC"
HANDLE_BYTES = 64
TOKEN_BYTES = 16


class IpcRefused(Exception):
    """An open the rules refuse; `same_process` tells the case CUDA answers differently."""

    def __init__(self, why: str, same_process: bool = False) -> None:
        super().__init__(why)
        self.same_process = same_process


def handle_bytes(token: bytes) -> bytes:
    return (MAGIC + token).ljust(HANDLE_BYTES, b"\0")


def token_of(handle: bytes) -> bytes | None:
    """The token in a handle's bytes, None when they are not a handle pilotd made."""
    handle = bytes(handle)
    if len(handle) != HANDLE_BYTES or not handle.startswith(MAGIC):
        return None
    if any(handle[len(MAGIC) + TOKEN_BYTES:]):
        return None
    return handle[len(MAGIC):len(MAGIC) + TOKEN_BYTES]


@dataclass(frozen=True)
class Owner:
    """Who may open an export: the exporter's tenant, GPU, SM partition and process."""

    tenant: str
    gpu: int
    partition: Any
    pid: int


@dataclass(frozen=True)
class Charge:
    """A charge the broker keeps for memory no session holds any more (ResourceBroker.settle)."""

    tenant: str
    gpu: int
    kind: str
    nbytes: int


@dataclass(eq=False)
class MemExport:
    token: bytes
    owner: Owner
    exporter: int  # session id
    base: int
    size: int
    importers: dict[int, int] = field(default_factory=dict)  # session id -> opens
    released: bool = False  # the exporter let go while importers held it
    zero: bool = True  # zeroed before it is freed (not memory the driver zeroes itself)
    charge: Charge | None = None  # kept by the broker since the exporter let go


@dataclass(frozen=True)
class Released:
    """Memory the last importer let go of after its exporter had: the caller zeroes and frees
    it, and settles its charge."""

    base: int
    size: int
    zero: bool
    charge: Charge | None


@dataclass(eq=False)
class EventExport:
    token: bytes
    owner: Owner
    event: Any  # the backend's event
    holders: int = 1  # session handles naming it (the exporter's first)


class IpcRegistry:
    """pilotd's exports, by token; shared by every vGPU thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mem: dict[bytes, MemExport] = {}
        self._mem_by_alloc: dict[tuple[int, int], MemExport] = {}  # (exporter session, base)
        self._mem_by_grant: dict[tuple[int, int], MemExport] = {}  # (importer session, base)
        self._events: dict[bytes, EventExport] = {}
        self._events_by_handle: dict[tuple[int, int], EventExport] = {}  # (session, handle)

    # ---- memory ----
    def export_memory(self, session: int, owner: Owner, base: int, size: int, zero: bool) -> bytes:
        """The handle of the session's allocation at `base` (made on first use)."""
        with self._lock:
            e = self._mem_by_alloc.get((session, base))
            if e is None:
                e = MemExport(secrets.token_bytes(TOKEN_BYTES), owner, session, base, size, zero=zero)
                self._mem[e.token] = e
                self._mem_by_alloc[(session, base)] = e
            return handle_bytes(e.token)

    def open_memory(self, session: int, who: Owner, handle: bytes) -> tuple[int, int, bool]:
        """Grant the export named by `handle` to `session`: (base, size, first open of it by
        the session); IpcRefused when the rules say no."""
        token = token_of(handle)
        with self._lock:
            e = self._mem.get(token) if token is not None else None
            if e is None or e.released or e.owner.tenant != who.tenant:
                raise IpcRefused("no such handle for this tenant")
            self._check_place(e.owner, who)
            opens = e.importers.get(session, 0)
            e.importers[session] = opens + 1
            self._mem_by_grant[(session, e.base)] = e
            return e.base, e.size, opens == 0

    def close_memory(self, session: int, base: int) -> tuple[int, Released | None]:
        """One close of the session's grant of `base`: (opens left, memory to free now or None);
        KeyError when the session holds no grant there."""
        with self._lock:
            e = self._mem_by_grant[(session, base)]
            left = e.importers[session] - 1
            if left:
                e.importers[session] = left
                return left, None
            del e.importers[session]
            del self._mem_by_grant[(session, base)]
            return 0, self._after_last_importer(e)

    def drop_importer(self, session: int) -> list[Released]:
        """The session ended: every grant it held ends; returns the memory to free now."""
        out = []
        with self._lock:
            for key in [k for k in self._mem_by_grant if k[0] == session]:
                e = self._mem_by_grant.pop(key)
                del e.importers[session]
                released = self._after_last_importer(e)
                if released is not None:
                    out.append(released)
        return out

    def exporter_lets_go(self, session: int, base: int, charge: Charge | None) -> bool:
        """The exporter frees the allocation at `base` (or ends). True: importers hold it, so
        the free is deferred (the caller keeps the memory and hands its charge, `charge`, to the
        broker's keeping); False: free it as usual (no export, or no importer; the handle
        stops working either way)."""
        with self._lock:
            e = self._mem_by_alloc.pop((session, base), None)
            if e is None:
                return False
            if not e.importers:
                del self._mem[e.token]
                return False
            e.released = True
            e.charge = charge
            return True

    def opens(self, session: int, base: int) -> int:
        """How many times the session holds the grant of `base` open."""
        with self._lock:
            e = self._mem_by_grant.get((session, base))
            return e.importers[session] if e is not None else 0

    def is_exported(self, session: int, base: int) -> bool:
        with self._lock:
            return (session, base) in self._mem_by_alloc

    def exported_bases(self, session: int) -> list[int]:
        with self._lock:
            return [base for (s, base) in self._mem_by_alloc if s == session]

    def _after_last_importer(self, e: MemExport) -> Released | None:
        if e.importers or not e.released:
            return None
        del self._mem[e.token]
        return Released(e.base, e.size, e.zero, e.charge)

    @staticmethod
    def _check_place(owner: Owner, who: Owner) -> None:
        if who.pid == owner.pid:
            raise IpcRefused("the handle was made by this process", same_process=True)
        if who.gpu != owner.gpu or who.partition is not owner.partition:
            raise IpcRefused("the handle's memory is on another GPU or SM partition")

    # ---- events ----
    def export_event(self, session: int, handle: int, owner: Owner, event: Any) -> bytes:
        with self._lock:
            e = self._events_by_handle.get((session, handle))
            if e is None:
                e = EventExport(secrets.token_bytes(TOKEN_BYTES), owner, event)
                self._events[e.token] = e
                self._events_by_handle[(session, handle)] = e
            return handle_bytes(e.token)

    def open_event(self, session: int, handle: int, who: Owner, ipc_handle: bytes) -> Any:
        """The shared event named by `ipc_handle`, now also the session's `handle`."""
        token = token_of(ipc_handle)
        with self._lock:
            e = self._events.get(token) if token is not None else None
            if e is None or e.owner.tenant != who.tenant:
                raise IpcRefused("no such handle for this tenant")
            self._check_place(e.owner, who)
            e.holders += 1
            self._events_by_handle[(session, handle)] = e
            return e.event

    def is_shared_event(self, session: int, handle: int) -> bool:
        with self._lock:
            return (session, handle) in self._events_by_handle

    def release_event(self, session: int, handle: int) -> bool:
        """The session's handle of a shared event is destroyed. True: it was the last, the
        caller destroys the driver's event."""
        with self._lock:
            e = self._events_by_handle.pop((session, handle))
            e.holders -= 1
            if e.holders:
                return False
            self._events.pop(e.token, None)
            return True

    def shared_event_handles(self, session: int) -> list[int]:
        with self._lock:
            return [h for (s, h) in self._events_by_handle if s == session]

    def counts(self) -> dict[str, int]:
        """For pilotctl and the metrics: exports, grants, memory kept for importers."""
        with self._lock:
            return {"memory_exports": len(self._mem),
                    "grants": sum(len(e.importers) for e in self._mem.values()),
                    "kept_bytes": sum(e.size for e in self._mem.values() if e.released),
                    "event_exports": len(self._events)}
