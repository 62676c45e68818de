"""A session's staging area: shared memory the daemon pins, through which large pageable copies
are pipelined (the shim fills one slot while the daemon DMAs another)."""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
from typing import Any

from pilot.daemon.backends.base import Backend

# Small slots, many of them: a chunk the DMA engine just wrote is still in the host's last-level
# cache when the shim copies it out (and the reverse for uploads).
SLOT_BYTES = 2 << 20
SLOTS = 8
SHM_DIR = "/dev/shm"


class Staging:
    def __init__(self, backend: Backend, session_id: int, uid: int, gid: int,
                 slot_bytes: int = SLOT_BYTES, slots: int = SLOTS) -> None:
        self.slot_bytes, self.slots = slot_bytes, slots
        size = slot_bytes * slots
        self.path = os.path.join(SHM_DIR, f"pilot-{os.getpid()}-{session_id}-{secrets.token_hex(6)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            if os.geteuid() == 0 and uid != 0:
                os.fchown(fd, uid, gid)  # the client maps it and then unlinks it
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self._anchor: Any = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self._anchor)
        self.view = memoryview(self.map)
        backend.host_register(self.address, size)
        self._registered = True

    def slot(self, index: int, count: int) -> memoryview:
        if not 0 <= index < self.slots or not 0 < count <= self.slot_bytes:
            raise ValueError(f"staging slot {index} / {count} bytes out of range")
        start = index * self.slot_bytes
        return self.view[start:start + count]

    def close(self, backend: Backend) -> None:
        if self._registered:
            backend.host_unregister(self.address)
            self._registered = False
        self.view.release()
        del self._anchor
        self.map.close()
        try:
            os.unlink(self.path)  # normally the client already did
        except FileNotFoundError:
            pass
