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
import mmap
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from .backend import CUDA_ERROR_INVALID_VALUE, Backend, BackendError

TMPFS_MAGIC = 0x01021994
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


@dataclass(eq=False)
class Shadow:
    """A client shadow of the managed range [lo, hi): its mapping there starts at `base`
    (page-aligned, `length` bytes); view offset 0 is `base`."""

    base: int
    length: int
    lo: int
    hi: int
    map: mmap.mmap
    address: int  # of the view in the daemon
    registered: bool
    kind: str  # "allocation" or "variable"
    # accounting for the policies
    flushes: int = 0
    flushed_bytes: int = 0
    dirty_chunks: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    launches: int = 0  # launches that passed a pointer into the range as an argument
    _anchor: Any = field(default=None, repr=False)

    @classmethod
    def attach(cls, backend: Backend, pid: int, uid: int, fd: int, base: int, length: int,
               lo: int, hi: int, kind: str, pin: bool) -> Shadow:
        if base % PAGE or length <= 0 or length % PAGE:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow {base:#x}+{length} is not whole pages")
        if not (base <= lo < hi <= base + length):
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"shadow {base:#x}+{length} does not cover {lo:#x}..{hi:#x}")
        ours = open_client_memfd(pid, uid, fd, length)
        try:
            view = mmap.mmap(ours, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(ours)
        anchor = ctypes.c_char.from_buffer(view)
        address = ctypes.addressof(anchor)
        registered = False
        if pin:
            try:
                backend.host_register(address, length)
                registered = True
            except BackendError:
                pass  # pageable copies still work, only slower
        return cls(base, length, lo, hi, view, address, registered, kind, _anchor=anchor)

    def clamp(self, offset: int, length: int) -> tuple[int, int]:
        """(device address, bytes) of the shadow run [offset, offset+length) that lies inside the
        managed range; (0, 0) if none does. Raises for a run outside the shadow."""
        if offset < 0 or length < 0 or offset + length > self.length:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"run {offset}+{length} outside shadow {self.base:#x}+{self.length}")
        start = max(self.base + offset, self.lo)
        end = min(self.base + offset + length, self.hi)
        return (start, end - start) if end > start else (0, 0)

    def view(self, device_address: int, count: int) -> memoryview:
        off = device_address - self.base
        return memoryview(self.map)[off:off + count]

    def close(self, backend: Backend) -> None:
        if self.registered:
            backend.host_unregister(self.address)
            self.registered = False
        self._anchor = None
        self.map.close()

    def summary(self) -> dict[str, int | str]:
        return {"base": self.lo, "bytes": self.hi - self.lo, "kind": self.kind,
                "pinned": int(self.registered), "flushes": self.flushes,
                "flushed_bytes": self.flushed_bytes, "host_dirty_chunks": self.dirty_chunks,
                "fetches": self.fetches, "fetched_bytes": self.fetched_bytes,
                "launches": self.launches}
