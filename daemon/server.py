"""The daemon's front door: the main ROUTER socket and the thread that owns it (`pilot-router`).

It opens sessions (HELLO: the client's uid/gid/pid come from the kernel through libzmq's
SO_PEERCRED metadata, never from the message), places each on the vGPU with the fewest
sessions, answers control queries, and watches every client process through a pidfd so that a
client that exits or crashes has everything released within milliseconds.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import zmq

from .backend import CUDA_ERROR_INITIALIZATION, CUDA_ERROR_NOT_SUPPORTED, Backend
from .protocol import ENVELOPE_SIZE, ffi, lib, new, to_bytes
from .session import Credentials, Session, read_cmdline
from .vgpu import VGpu

log = logging.getLogger("pilot.server")

POLL_MS = 200


class DaemonError(Exception):
    """A start-up failure worth one clear line (socket in use, no GPU...)."""


@dataclass
class Watched:
    session: Session
    vgpu: VGpu
    pidfd: int | None  # None: pidfd_open unavailable, checked by polling /proc


def prepare_socket_path(path: str) -> None:
    """Create the socket's directory and remove a stale socket; refuse a live one."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                raise
            os.unlink(path)  # stale: nobody listens there
        else:
            raise DaemonError(f"another pilotd is already serving {path}")
        finally:
            probe.close()


class Daemon:
    def __init__(self, backend: Backend, socket_path: str, vgpus_per_gpu: int = 2,
                 devices: list[int] | None = None, capacity: int | None = None,
                 spin_us: int = 50) -> None:
        self.backend = backend
        self.socket_path = socket_path
        self.ctx = zmq.Context()
        devices = devices if devices is not None else list(range(backend.device_count()))
        if not devices:
            raise DaemonError("no GPU to serve")
        self.vgpus = [
            VGpu(i, dev, backend, f"{socket_path}.vgpu{i}", capacity, spin_us)
            for i, dev in enumerate(d for d in devices for _ in range(vgpus_per_gpu))
        ]
        self._stop = threading.Event()
        # Owned by the router thread.
        self._watched: dict[int, Watched] = {}
        self._next_session = 1

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Bind everything, then serve on the calling thread until request_stop()."""
        threading.current_thread().name = "pilot-router"
        prepare_socket_path(self.socket_path)
        for vg in self.vgpus:
            prepare_socket_path(vg.endpoint_path)
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"ipc://{self.socket_path}")
        try:
            for vg in self.vgpus:
                vg.start()
                os.chmod(vg.endpoint_path, 0o666)  # access is decided by peer credentials
            os.chmod(self.socket_path, 0o666)
            log.info("pilotd ready on %s with %d vGPU(s), backend %s", self.socket_path,
                     len(self.vgpus), self.backend.name)
            self._serve(router)
        finally:
            self._shutdown(router)

    def _serve(self, router: zmq.Socket) -> None:
        while not self._stop.is_set():
            poller = zmq.Poller()
            poller.register(router, zmq.POLLIN)
            by_fd: dict[int, int] = {}
            for sid, w in self._watched.items():
                if w.pidfd is not None:
                    poller.register(w.pidfd, zmq.POLLIN)
                    by_fd[w.pidfd] = sid
            ready = dict(poller.poll(POLL_MS))
            try:
                for fd, sid in by_fd.items():
                    if fd in ready:
                        self._end_session(sid, "process exited")
                self._reap_without_pidfd()
            except Exception:  # the front door stays open whatever one session does
                log.exception("router: session reaping failed")
            if router in ready:
                while True:
                    try:
                        frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        self._handle(router, frames)
                    except Exception:
                        log.exception("router: request failed; dropped")

    def _reap_without_pidfd(self) -> None:
        for sid, w in list(self._watched.items()):
            if w.pidfd is None and not os.path.exists(f"/proc/{w.session.creds.pid}"):
                self._end_session(sid, "process exited")

    def _handle(self, router: zmq.Socket, frames: list[zmq.Frame]) -> None:
        if len(frames) < 2 or len(frames[1]) < ENVELOPE_SIZE:
            log.warning("router: dropped a malformed message")
            return
        env = ffi.from_buffer("pilot_envelope *", frames[1].buffer)
        if env.flags & lib.PILOT_F_NO_REPLY:
            return
        if env.opcode == lib.PILOT_OP_HELLO:
            body = self._hello(frames)
            router.send_multipart([frames[0], frames[1], body])
        elif env.opcode == lib.PILOT_OP_SESSIONS:
            rep = new("pilot_rep_status")
            listing = json.dumps(self.sessions()).encode()
            router.send_multipart([frames[0], frames[1], to_bytes(rep), listing])
        else:
            rep = new("pilot_rep_status")
            rep.hdr.err = CUDA_ERROR_NOT_SUPPORTED
            router.send_multipart([frames[0], frames[1], to_bytes(rep)])

    def _hello(self, frames: list[zmq.Frame]) -> bytes:
        rep = new("pilot_rep_hello")
        try:
            creds = Credentials.from_peer_address(frames[1].get("Peer-Address"))
        except (ValueError, zmq.ZMQError) as exc:
            log.warning("router: HELLO refused: %s", exc)
            rep.hdr.err = CUDA_ERROR_INITIALIZATION
            return to_bytes(rep)
        # A pid that says HELLO again has exec'd a new program: its old session is dead.
        for sid, w in list(self._watched.items()):
            if w.session.creds.pid == creds.pid:
                self._end_session(sid, "process exec'd")
        vg = min(self.vgpus, key=lambda v: len(v.sessions))
        session = Session(id=self._next_session, creds=creds, vgpu=vg.index, device=vg.device,
                          cmdline=read_cmdline(creds.pid))
        self._next_session += 1
        try:
            pidfd: int | None = os.pidfd_open(creds.pid)
        except (AttributeError, OSError):
            pidfd = None
        vg.sessions[session.id] = session
        self._watched[session.id] = Watched(session, vg, pidfd)
        log.info("session %d: pid %d uid %d (%s) on vGPU %d", session.id, creds.pid, creds.uid,
                 session.cmdline[:80], vg.index)
        rep.session = session.id
        rep.vgpu = vg.index
        rep.device = 0
        endpoint = vg.endpoint_path.encode()
        ffi.memmove(rep.endpoint, endpoint, len(endpoint))
        return to_bytes(rep)

    def _end_session(self, sid: int, why: str) -> None:
        w = self._watched.pop(sid, None)
        if w is None:
            return
        if w.pidfd is not None:
            os.close(w.pidfd)
        log.info("session %d (pid %d): %s", sid, w.session.creds.pid, why)
        w.vgpu.send_control(b"R", sid)

    def sessions(self) -> list[dict[str, Any]]:
        return [w.session.summary() for w in list(self._watched.values())]

    def _shutdown(self, router: zmq.Socket) -> None:
        for vg in self.vgpus:
            vg.send_control(b"S")
        for vg in self.vgpus:
            vg.join(timeout=10)
        for w in self._watched.values():
            if w.pidfd is not None:
                os.close(w.pidfd)
        router.close(0)
        for path in [self.socket_path, *(vg.endpoint_path for vg in self.vgpus)]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.ctx.term()
        log.info("pilotd stopped")
