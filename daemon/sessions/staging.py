"""A session's staging area: shared memory the daemon pins, through which large pageable copies
are pipelined (the shim fills one slot while the daemon DMAs another); and the spares pilotd
pins ahead of need, so that a session does not wait while its area is pinned."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import mmap
import os
import secrets
import threading
import time
from typing import Any

from pilot.daemon.backends.base import Backend
from pilot.daemon.telemetry.thread_names import NamedThread

log = logging.getLogger("pilot.staging")

# Small slots, many of them: a chunk the DMA engine just wrote is still in the host's last-level
# cache when the shim copies it out (and the reverse for uploads).
SLOT_BYTES = 2 << 20
SLOTS = 8
SHM_DIR = "/dev/shm"


def _given_to_client(uid: int) -> bool:
    """Whether an area is chowned to its client: pilotd runs as root and the client does not."""
    return os.geteuid() == 0 and uid != 0


class Staging:
    def __init__(self, backend: Backend, session_id: int | str, uid: int, gid: int,
                 slot_bytes: int = SLOT_BYTES, slots: int = SLOTS) -> None:
        self.slot_bytes, self.slots = slot_bytes, slots
        size = slot_bytes * slots
        self.path = os.path.join(SHM_DIR, f"pilot-{os.getpid()}-{session_id}-{secrets.token_hex(6)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            if _given_to_client(uid):
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

    def hand_to(self, uid: int, gid: int) -> None:
        """Give an area made for no one (a spare) to the user whose program maps it. The file is
        pilotd's own, made with O_EXCL in the sticky /dev/shm: no one else can have replaced it."""
        if _given_to_client(uid):
            os.chown(self.path, uid, gid, follow_symlinks=False)

    def slot(self, index: int, count: int) -> memoryview:
        if not 0 <= index < self.slots or not 0 < count <= self.slot_bytes:
            raise ValueError(f"staging slot {index} / {count} bytes out of range")
        start = index * self.slot_bytes
        return self.view[start:start + count]

    def close(self, backend: Backend) -> None:
        """Unpin, unmap and unlink; the memory is let go of even when unpinning fails (a
        context a kernel fault corrupted), and that failure is raised afterwards."""
        try:
            if self._registered:
                self._registered = False
                backend.host_unregister(self.address)
        finally:
            self.view.release()
            del self._anchor
            self.map.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # normally the client already did


SPARE_TAG = "spare"


class StagingSpares:
    """Staging areas pinned before a session asks (issue 28, the cold first touch): pinning an
    area took 4.6 ms on an H100, and a program's first cudaMallocManaged waited for two (its
    session's area and the unified-memory fault channel's one-slot area). `take` hands a spare
    of the size asked to one session, for good (it is closed with that session, never given to
    another), and the `staging-spares` thread pins its replacement once no spare was taken for
    `refill_delay` seconds: pinning holds the driver up (a vGPU thread's copies waited 4.6 ms
    behind it on an H100), so it is not done while a session that just started makes its first
    copies. Spares are pilotd's own
    pinned memory until taken (`per_kind` of each size: 18 MiB with the defaults); a taken one
    is charged to its tenant like an area made on demand. None left (a burst of new sessions):
    the caller makes one, as before."""

    def __init__(self, backend: Backend, kinds: tuple[int, ...] = (SLOTS, 1), per_kind: int = 1,
                 refill_delay: float = 1.0) -> None:
        self._backend = backend
        self._per_kind = per_kind
        self._refill_delay = refill_delay
        self._last_take = -refill_delay
        self._spares: dict[int, list[Staging]] = {k: [] for k in kinds}
        self._cond = threading.Condition()
        self._closing = False
        self._remove_leftovers()
        self._thread = NamedThread(target=self._run, name="staging-spares", daemon=True)
        if per_kind > 0:
            self._thread.start()

    @staticmethod
    def _remove_leftovers() -> None:
        """Spares of this pid's previous image (pilotd re-executes itself in place after a GPU
        fault, keeping its pid): never handed out, so nobody maps them."""
        for path in glob.glob(os.path.join(SHM_DIR, f"pilot-{os.getpid()}-{SPARE_TAG}-*")):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def take(self, slots: int, uid: int, gid: int) -> Staging | None:
        with self._cond:
            spares = self._spares.get(slots)
            area = spares.pop() if spares else None
            if area is not None:
                self._last_take = time.monotonic()
                self._cond.notify()
        if area is None:
            return None
        try:
            area.hand_to(uid, gid)
        except OSError:
            area.close(self._backend)
            raise
        return area

    def ready(self) -> dict[int, int]:
        """Spares pinned now, by slot count."""
        with self._cond:
            return {k: len(v) for k, v in self._spares.items()}

    def _missing(self) -> int | None:
        return next((k for k, v in self._spares.items() if len(v) < self._per_kind), None)

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._missing() is not None)
                while not self._closing:  # quiet since the last take
                    left = self._last_take + self._refill_delay - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(timeout=left)
                if self._closing:
                    return
                kind = self._missing()
            assert kind is not None
            try:
                area = Staging(self._backend, SPARE_TAG, 0, 0, slots=kind)
            except Exception as exc:  # no spare: sessions make their own
                failures += 1
                if failures == 1:
                    log.warning("cannot pin a spare staging area (%s); sessions pin their own", exc)
                with self._cond:  # try again later, not in a loop
                    self._cond.wait_for(lambda: self._closing, timeout=min(60.0, 2.0 ** failures))
                continue
            failures = 0
            with self._cond:
                if not self._closing:
                    self._spares[kind].append(area)
                    continue
            with contextlib.suppress(Exception):  # closing: close() may find a faulted context
                area.close(self._backend)
            return

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._cond:
            spares = [a for v in self._spares.values() for a in v]
            for v in self._spares.values():
                v.clear()
        for area in spares:
            try:
                area.close(self._backend)
            except Exception as exc:  # a faulted context cannot unpin: the process ends anyway
                log.debug("spare staging area %s: %s", area.path, exc)
