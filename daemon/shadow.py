"""The daemon's side of a unified-memory shadow, and taking a client's shared-memory file.

A shadow is the client's private memory at a managed range's own address (shim/coherence.c);
the daemon keeps its extent, the managed segments inside it and the accounting.

`open_client_memfd` takes a file descriptor from a client through /proc/<pid>/fd/<n>, where the
pid comes from the connection's peer credentials. A client must not be able to make the daemon
(often root) open a file the client could not write itself, so the file must be a shared-memory
file (tmpfs: memfd_create) owned by the client's uid; anything else is refused.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from dataclasses import dataclass

from .backend import CUDA_ERROR_INVALID_VALUE, BackendError

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
    """What the daemon knows of a client shadow mapped at `base` (page-aligned, `length` bytes)
    over managed memory: the segments [lo, hi) it may copy (one allocation, or the __managed__
    variables whose ranges fall inside it). The shadow's bytes are the client's private memory;
    they reach the daemon only through staging slots (daemon/managed.py)."""

    base: int
    length: int
    segments: list[tuple[int, int]]
    kind: str  # "allocation" or "variable"
    chunk: int  # the client's chunk size
    # accounting for the policies
    flushes: int = 0
    flushed_bytes: int = 0
    dirty_chunks: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    launches: int = 0  # launches that passed a pointer into the range as an argument

    @classmethod
    def attach(cls, base: int, length: int, segments: list[tuple[int, int]], kind: str,
               chunk: int) -> Shadow:
        if base % PAGE or length <= 0 or length % PAGE:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow {base:#x}+{length} is not whole pages")
        if chunk < PAGE or chunk & (chunk - 1):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"shadow chunk size {chunk}")
        segments = sorted((max(lo, base), min(hi, base + length)) for lo, hi in segments)
        segments = [(lo, hi) for lo, hi in segments if lo < hi]
        if not segments:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no managed memory in {base:#x}+{length}")
        return cls(base, length, segments, kind, chunk)

    def add_segment(self, lo: int, hi: int) -> None:
        lo, hi = max(lo, self.base), min(hi, self.base + self.length)
        if lo < hi and (lo, hi) not in self.segments:
            self.segments = sorted([*self.segments, (lo, hi)])

    def covers(self, address: int, count: int) -> bool:
        return count > 0 and self.base <= address and address + count <= self.base + self.length

    def pieces(self, address: int, count: int) -> list[tuple[int, int]]:
        """(device address, bytes) of each part of [address, address+count), a range of the
        shadow, that lies in managed memory. Raises for a range outside the shadow."""
        if not self.covers(address, count):
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"{address:#x}+{count} outside shadow {self.base:#x}+{self.length}")
        end = address + count
        out = []
        for lo, hi in self.segments:
            a, b = max(address, lo), min(end, hi)
            if a < b:
                out.append((a, b - a))
        return out

    @property
    def lo(self) -> int:
        return self.segments[0][0]

    def holds(self, ptr: int) -> bool:
        return any(lo <= ptr < hi for lo, hi in self.segments)

    def summary(self) -> dict[str, int | str]:
        return {"base": self.lo, "bytes": sum(hi - lo for lo, hi in self.segments), "kind": self.kind,
                "flushes": self.flushes, "flushed_bytes": self.flushed_bytes,
                "host_dirty_chunks": self.dirty_chunks, "fetches": self.fetches,
                "fetched_bytes": self.fetched_bytes, "launches": self.launches}
