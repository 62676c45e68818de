"""The daemon's side of a unified-memory shadow: the client's memfd, mapped here.

The client maps its memfd at the managed range's own address; the daemon maps the same memfd
anywhere and copies between this view and the real managed memory (flush: view -> device,
fetch: device -> view). The fd is taken from the client through /proc/<pid>/fd/<n>, where the
pid comes from the connection's peer credentials. A client must not be able to make the daemon
(often root) open a file the client could not write itself, so the file must be a shared-memory
file (tmpfs: memfd_create) owned by the client's uid; anything else is refused.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

from .backend import CUDA_ERROR_INVALID_VALUE, Backend, BackendError

log = logging.getLogger("pilot.shadow")
TMPFS_MAGIC = 0x01021994
CLOSE_LATER_BYTES = 64 << 20  # shadows this large are closed on a helper thread
PAGE = mmap.PAGESIZE


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.POINTER(_Statfs)]


def _fs_type(fd: int) -> int:
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return buf.f_type & 0xFFFFFFFF


def open_client_memfd(pid: int, uid: int, fd: int, length: int) -> int:
    """An fd of the client's shared-memory file `fd`, checked; raises BackendError."""
    if fd < 0:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad shadow fd {fd}")
    try:
        ours = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"cannot open the client's fd {fd}: {exc}") from None
    try:
        st = os.fstat(ours)
        if not stat.S_ISREG(st.st_mode) or _fs_type(ours) != TMPFS_MAGIC:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"client fd {fd} is not shared memory")
        if st.st_uid != uid:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"client fd {fd} belongs to uid {st.st_uid}, not the client's {uid}")
        if st.st_size < length:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"client fd {fd} holds {st.st_size} bytes, {length} needed")
    except BaseException:
        os.close(ours)
        raise
    return ours


# When a shadow is pinned (cuMemHostRegister) so flushes and fetches are DMA at pinned speed:
#   attach  when the client attaches it (pins, and so populates, memory the host may never touch)
#   async   the same, on a helper thread, overlapping the client's first host writes
#   first   at its first flush or fetch: memory the host never touches is never pinned
#   off     never: the driver stages pageable copies
PIN_MODES = ("attach", "async", "first", "off")


@dataclass(eq=False)
class Shadow:
    """A client shadow mapped at `base` (page-aligned, `length` bytes; view offset 0 is `base`)
    over managed memory: the segments [lo, hi) it may copy (one allocation, or the __managed__
    variables whose ranges fall inside it)."""

    base: int
    length: int
    segments: list[tuple[int, int]]
    map: mmap.mmap
    address: int  # of the view in the daemon
    kind: str  # "allocation" or "variable"
    # accounting for the policies
    flushes: int = 0
    flushed_bytes: int = 0
    dirty_chunks: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    launches: int = 0  # launches that passed a pointer into the range as an argument
    pin_mode: str = "off"
    registered: bool = False
    _pinning: threading.Thread | None = field(default=None, repr=False)
    _anchor: Any = field(default=None, repr=False)

    @classmethod
    def attach(cls, backend: Backend, device: int, pid: int, uid: int, fd: int, base: int,
               length: int, segments: list[tuple[int, int]], kind: str, pin_mode: str) -> Shadow:
        if base % PAGE or length <= 0 or length % PAGE:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow {base:#x}+{length} is not whole pages")
        segments = sorted((max(lo, base), min(hi, base + length)) for lo, hi in segments)
        segments = [(lo, hi) for lo, hi in segments if lo < hi]
        if not segments:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no managed memory in {base:#x}+{length}")
        ours = open_client_memfd(pid, uid, fd, length)
        try:
            view = mmap.mmap(ours, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(ours)
        anchor = ctypes.c_char.from_buffer(view)
        shadow = cls(base, length, segments, view, ctypes.addressof(anchor), kind,
                     pin_mode=pin_mode, _anchor=anchor)
        if pin_mode == "attach":
            shadow._pin(backend, device)
        elif pin_mode == "async":
            shadow._pinning = threading.Thread(target=shadow._pin, args=(backend, device),
                                               name="shadow-pin", daemon=True)
            shadow._pinning.start()
        return shadow

    def _pin(self, backend: Backend, device: int) -> None:
        try:
            if threading.current_thread() is not threading.main_thread():
                backend.bind_thread(device)
            backend.host_register(self.address, self.length)
            self.registered = True
        except BackendError:
            pass  # pageable copies still work, only slower

    def ready(self, backend: Backend, device: int) -> None:
        """Before a flush or fetch: the pinning this shadow's mode asks for is done."""
        if self._pinning is not None:
            self._pinning.join()
            self._pinning = None
        elif self.pin_mode == "first" and not self.registered:
            self.pin_mode = "attach"  # one attempt
            self._pin(backend, device)

    def add_segment(self, lo: int, hi: int) -> None:
        lo, hi = max(lo, self.base), min(hi, self.base + self.length)
        if lo < hi and (lo, hi) not in self.segments:
            self.segments = sorted([*self.segments, (lo, hi)])

    def pieces(self, offset: int, length: int) -> list[tuple[int, int]]:
        """(device address, bytes) of each part of the shadow run [offset, offset+length) that
        lies in managed memory. Raises for a run outside the shadow."""
        if offset < 0 or length < 0 or offset + length > self.length:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"run {offset}+{length} outside shadow {self.base:#x}+{self.length}")
        start, end = self.base + offset, self.base + offset + length
        out = []
        for lo, hi in self.segments:
            a, b = max(start, lo), min(end, hi)
            if a < b:
                out.append((a, b - a))
        return out

    @property
    def lo(self) -> int:
        return self.segments[0][0]

    def holds(self, ptr: int) -> bool:
        return any(lo <= ptr < hi for lo, hi in self.segments)

    def view(self, device_address: int, count: int) -> memoryview:
        off = device_address - self.base
        return memoryview(self.map)[off:off + count]

    def close(self, backend: Backend) -> None:
        if self._pinning is not None:
            self._pinning.join()
            self._pinning = None
        if self.registered:
            backend.host_unregister(self.address)
            self.registered = False
        self._anchor = None
        self.map.close()

    def close_later(self, backend: Backend, device: int) -> None:
        """close() on a helper thread: unpinning and unmapping a large shadow takes ~0.2 s per
        GiB (H100 host), which cudaFree would otherwise wait for. Nothing else uses the shadow
        once its managed memory is freed."""
        def run() -> None:
            backend.bind_thread(device)
            try:
                self.close(backend)
            except Exception as exc:  # a helper thread: log, never die silently
                log.warning("closing the shadow at %#x failed: %s", self.base, exc)

        if self.length < CLOSE_LATER_BYTES:
            self.close(backend)
        else:
            threading.Thread(target=run, name="shadow-close", daemon=True).start()

    def summary(self) -> dict[str, int | str]:
        return {"base": self.lo, "bytes": sum(hi - lo for lo, hi in self.segments), "kind": self.kind,
                "pinned": int(self.registered), "flushes": self.flushes,
                "flushed_bytes": self.flushed_bytes, "host_dirty_chunks": self.dirty_chunks,
                "fetches": self.fetches, "fetched_bytes": self.fetched_bytes,
                "launches": self.launches}
