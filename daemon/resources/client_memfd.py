"""Taking a shared-memory file from a client (pinned host memory, daemon/pinned.py).

`open_client_memfd` takes a file descriptor from a client through /proc/<pid>/fd/<n>, where the
pid comes from the connection's peer credentials. A client must not be able to make the daemon
(often root) open a file the client could not write itself, so the file must be a shared-memory
file (tmpfs: memfd_create) owned by the client's uid; anything else is refused.
"""

from __future__ import annotations

import ctypes
import os
import stat

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError

TMPFS_MAGIC = 0x01021994


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
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad client fd {fd}")
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
