"""Pinned host memory as a session holds it: the client's memfd mapped into the daemon and
registered with the driver (ops/host_memory.py serves the calls; the resource broker charges the
bytes)."""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

from pilot.daemon.backends.base import CUDA_ERROR_MEMORY_ALLOCATION, Backend, BackendError

PAGE = mmap.PAGESIZE
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED_NOREPLACE = 0x100000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value



def _mmap(fd: int, length: int, want: int) -> int:
    """Map the memfd at `want` if that address is free here (MAP_FIXED_NOREPLACE; kernels before
    4.17 take it as a hint), else anywhere."""
    if want:
        got = _libc.mmap(want, length, _PROT_RW, mmap.MAP_SHARED | _MAP_FIXED_NOREPLACE, fd, 0)
        if got == want:
            return want
        if got not in (None, _MAP_FAILED):
            _libc.munmap(got, length)
    got = _libc.mmap(None, length, _PROT_RW, mmap.MAP_SHARED, fd, 0)
    if got in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION, f"mmap of {length} bytes: {os.strerror(err)}")
    return int(got)



@dataclass(eq=False)
class PinnedRange:
    """The client's memfd mapped at `base` there and at `address` here, `length` bytes (whole
    pages), pinned; the program's range is [base + offset, + size)."""

    base: int
    length: int
    address: int
    offset: int
    size: int
    flags: int
    kind: str  # "alloc" or "registered"
    device_pointer: int  # of `address`
    copies: int = 0
    copied_bytes: int = 0
    _registered: bool = True

    @property
    def user(self) -> int:
        return self.base + self.offset

    def host(self, ptr: int, count: int) -> int | None:
        """The daemon's address of the client's [ptr, ptr+count) if the program's range holds it."""
        off = ptr - self.user
        if 0 <= off and count >= 0 and off + count <= self.size:
            return self.address + self.offset + off
        return None

    def close(self, backend: Backend) -> None:
        if self._registered:
            self._registered = False
            try:
                backend.host_unregister(self.address)
            finally:
                _libc.munmap(self.address, self.length)

    def summary(self) -> dict[str, int | str]:
        return {"base": self.user, "bytes": self.size, "pinned_bytes": self.length,
                "kind": self.kind, "flags": self.flags, "copies": self.copies,
                "copied_bytes": self.copied_bytes}
