"""pilotd's acceptor: the `pilot-acceptor` thread takes every connection to the main and control
sockets before libzmq does (issue 27, 2).

Why: libzmq's listener accepts whatever comes and aborts the whole process when accept() fails
with EMFILE (src/ipc_listener.cpp asserts on it). Counting connections after libzmq accepted
them (its socket monitor) cannot keep up with a burst: one user's thousands of connections made
pilotd abort, ending every tenant's work. libzmq cannot adopt a connection accepted elsewhere
(ZMQ_USE_FD takes a listening socket only), so:

- pilotd owns the public listening sockets; this thread accepts on them, reads the peer's
  SO_PEERCRED and start time, and admits the connection or closes it at once (router/
  admission.py: `[limits] connections_per_uid`, `connections`; refusals logged, rate-limited).
  Out of descriptors (EMFILE, ENFILE), it closes a spare descriptor kept for that, accepts and
  closes the connection, and takes the spare again: refused, never a busy loop, never an abort.
- libzmq listens on a private socket: bound in a fresh 0700 directory, whose path and
  directory are removed at once; the acceptor reaches it through an O_PATH descriptor of it
  (/proc/self/fd/N), no one else can. Each admitted connection gets one connection to it, made
  by this thread, so libzmq accepts only what the acceptor admitted, bounded by the limits.
- the thread copies bytes both ways (epoll, non-blocking, at most BUFFER bytes queued a way).
  It rewrites one thing, the client's ZMTP READY (router/handshake.py): its Identity, so that
  the routing id of every message names the connection it came on, and `peer(routing_id)`
  gives the credentials read when it was accepted. HELLO, DEVICE_JOIN, SESSIONS and pilotctl
  commands take the caller's identity from there (libzmq's Peer-Address would name pilotd).
  And it holds a client's first messages, when they come before the client could have read
  libzmq's READY, until that READY went by: libzmq would drop such a connection.

The copy costs a hop on the main and control sockets only: they carry HELLO, DEVICE_JOIN,
liveness pings, session listings and pilotctl commands; every CUDA call goes to the vGPU
endpoints (daemon/native/vgpu_server.c, which accept for themselves with the same limits).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import selectors
import socket
import struct
import tempfile
from dataclasses import dataclass, field

from pilot.daemon.router.admission import Admission, Peer
from pilot.daemon.router.handshake import GREETING, HandshakeError, ready_frame_size, rewrite_ready
from pilot.daemon.sessions.session import process_start_time
from pilot.daemon.telemetry.thread_names import NamedThread

log = logging.getLogger("pilot.acceptor")

BUFFER = 256 << 10  # bytes queued one way before the other side stops being read
PRIVATE_BACKLOG = 4096
ACCEPT_BATCH = 32  # connections taken per wake-up of a listening socket
_UCRED = struct.Struct("3i")
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


@dataclass(eq=False)
class _Pair:
    """An admitted connection and the acceptor's connection to libzmq for it."""

    client: socket.socket
    upstream: socket.socket
    identity: bytes
    peer: Peer
    greeting_left: int = GREETING
    ready: bytearray | None = field(default_factory=bytearray)  # None: the READY went through
    # libzmq's side of the handshake as it passes to the client: its greeting, then its READY
    # (None once both went by). Until then the client's bytes after its READY are `held`.
    server_greeting_left: int = GREETING
    server_ready: bytearray | None = field(default_factory=bytearray)
    held: bytearray = field(default_factory=bytearray)
    to_upstream: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    closed: bool = False


@dataclass(eq=False)
class _Listener:
    public: socket.socket
    private_path: str  # /proc/self/fd/N of the private socket


class Acceptor:
    """The `pilot-acceptor` thread and the public listening sockets it serves."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self._peers: dict[bytes, Peer] = {}  # routing id -> peer (read by the router thread)
        self._ids = itertools.count(1)
        self._listeners: list[_Listener] = []
        self._opaths: list[int] = []
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._spare: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._stop = False
        self._thread = NamedThread(target=self._run, name="pilot-acceptor", daemon=True)

    # ---- router thread ----
    def listen(self, public_fd: int) -> tuple[int, str]:
        """Serve the listening socket `public_fd` (pilotd keeps it: it outlives a restart in
        place); returns the private listening descriptor and endpoint to give libzmq
        (ZMQ_USE_FD)."""
        public = socket.socket(fileno=public_fd)
        public.setblocking(False)
        work = tempfile.mkdtemp(prefix="pilotd-")  # 0700
        path = os.path.join(work, "s")
        private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            private.bind(path)
            private.listen(PRIVATE_BACKLOG)
            opath = os.open(path, os.O_PATH | os.O_CLOEXEC)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.rmdir(work)
        self._opaths.append(opath)
        self._listeners.append(_Listener(public, f"/proc/self/fd/{opath}"))
        return private.detach(), f"ipc://{path}"

    def start(self) -> None:
        for listener in self._listeners:
            self._sel.register(listener.public, _READ, listener)
        self._sel.register(self._wake_r, _READ, None)
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread and every connection it copies; the public sockets stay open (the
        Daemon closes them, or hands them to the next process)."""
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(5)

    def close_listeners(self) -> None:
        for listener in self._listeners:
            listener.public.close()

    def peer(self, routing_id: bytes) -> Peer | None:
        """The credentials of the connection whose messages carry `routing_id`, read by the
        kernel when it was accepted; None: gone, or not one the acceptor made."""
        return self._peers.get(routing_id)

    # ---- the acceptor thread ----
    def _run(self) -> None:
        try:
            while not self._stop:
                for key, events in self._sel.select():
                    data = key.data
                    if isinstance(data, _Listener):
                        self._accept_all(data)
                    elif isinstance(data, tuple):
                        pair, is_client = data
                        if not pair.closed:
                            self._pump(pair, is_client, events)
        except Exception:
            log.exception("acceptor: failed; new connections to the main and control sockets wait")
        finally:
            for key in list(self._sel.get_map().values()):
                if isinstance(key.data, tuple) and not key.data[0].closed:
                    self._close(key.data[0])
            self._sel.close()
            for fd in (self._wake_r, self._wake_w, *self._opaths):
                os.close(fd)
            if self._spare is not None:
                os.close(self._spare)

    def _accept_all(self, listener: _Listener) -> None:
        """At most ACCEPT_BATCH connections, then the connections' bytes get their turn: a
        flood of connections must not starve the programs already connected."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = listener.public.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    if self._refuse_one(listener):
                        continue
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EINTR, errno.EPROTO):
                    continue
                raise
            self._admit(listener, conn)

    def _refuse_one(self, listener: _Listener) -> bool:
        """Out of descriptors: the spare one makes room to take the connection off the queue and
        close it (else it would stay readable and this thread spin). False: not even a spare
        (the connection waits in the queue)."""
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        try:
            conn, _ = listener.public.accept()
            conn.close()
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.admission.refuse(-1, "a process", "pilotd is out of descriptors (LimitNOFILE)")
        return self._spare is not None

    def _admit(self, listener: _Listener, conn: socket.socket) -> None:
        try:
            pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          _UCRED.size))
        except OSError:
            conn.close()
            return
        peer = Peer(uid, gid, pid, None)
        if not self.admission.admit(peer):
            conn.close()
            return
        peer = Peer(uid, gid, pid, process_start_time(pid))  # read for admitted ones only
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            upstream.connect(listener.private_path)
        except OSError as exc:  # libzmq's backlog is full (it is that far behind): refused
            upstream.close()
            conn.close()
            self.admission.release(peer)
            self.admission.refuse(uid, f"pid {pid} uid {uid}", f"pilotd is busy ({exc})")
            return
        conn.setblocking(False)
        identity = b"P" + next(self._ids).to_bytes(8, "big")
        pair = _Pair(conn, upstream, identity, peer)
        self._peers[identity] = peer
        self._sel.register(conn, _READ, (pair, True))
        self._sel.register(upstream, _READ, (pair, False))

    def _pump(self, pair: _Pair, is_client: bool, events: int) -> None:
        source = pair.client if is_client else pair.upstream
        try:
            if events & _WRITE:
                self._flush(pair, not is_client)  # this socket's own queue, written to it
            if events & _READ:
                data = source.recv(65536)
                if not data:
                    self._close(pair)
                    return
                if is_client:
                    self._from_client(pair, data)
                else:
                    pair.to_client += data
                    if pair.server_ready is not None:
                        self._from_server(pair, data)
                self._flush(pair, is_client)  # to the other side
        except (OSError, HandshakeError) as exc:
            if isinstance(exc, HandshakeError):
                log.debug("acceptor: pid %d: %s; connection closed", pair.peer.pid, exc)
            self._close(pair)
            return
        self._interest(pair)

    def _from_client(self, pair: _Pair, data: bytes) -> None:
        if pair.greeting_left:  # the greeting goes on as it comes
            n = min(len(data), pair.greeting_left)
            pair.to_upstream += data[:n]
            pair.greeting_left -= n
            data = data[n:]
        if pair.ready is None:
            self._after_ready(pair, data)
            return
        pair.ready += data
        if pair.greeting_left:
            return
        size = ready_frame_size(pair.ready)
        if size is None or len(pair.ready) < size:
            return
        pair.to_upstream += rewrite_ready(pair.ready[:size], pair.identity)
        rest, pair.ready = pair.ready[size:], None
        self._after_ready(pair, rest)

    @staticmethod
    def _after_ready(pair: _Pair, data: bytes | bytearray) -> None:
        """The client's messages. A client may send its first one (HELLO) before it has read
        libzmq's READY; libzmq takes a message that comes before it sent its READY for a second
        handshake command and drops the connection (ZMTP_UNEXPECTED_COMMAND), so such bytes wait
        here until libzmq's READY went by (_from_server)."""
        if pair.server_ready is None:
            pair.to_upstream += data
        else:
            pair.held += data

    def _from_server(self, pair: _Pair, data: bytes) -> None:
        """Follows libzmq's greeting and READY; once both went by, the held bytes go on."""
        assert pair.server_ready is not None
        if pair.server_greeting_left:
            n = min(len(data), pair.server_greeting_left)
            pair.server_greeting_left -= n
            data = data[n:]
            if pair.server_greeting_left:
                return
        pair.server_ready += data
        size = ready_frame_size(pair.server_ready)
        if size is None or len(pair.server_ready) < size:
            return
        pair.server_ready = None
        pair.to_upstream += pair.held
        pair.held = bytearray()
        self._flush(pair, True)

    def _flush(self, pair: _Pair, to_upstream: bool) -> None:
        queue, sock = (pair.to_upstream, pair.upstream) if to_upstream else (pair.to_client, pair.client)
        while queue:
            try:
                sent = sock.send(queue)
            except BlockingIOError:
                return
            del queue[:sent]

    def _interest(self, pair: _Pair) -> None:
        """Read a side while the other's queue has room; write a side while its queue is not empty."""
        client = ((_READ if len(pair.to_upstream) + len(pair.held) < BUFFER else 0)
                  | (_WRITE if pair.to_client else 0))
        upstream = (_READ if len(pair.to_client) < BUFFER else 0) | (_WRITE if pair.to_upstream else 0)
        for sock, mask, is_client in ((pair.client, client, True), (pair.upstream, upstream, False)):
            key = self._sel.get_map().get(sock.fileno())
            if mask == 0:
                if key is not None:
                    self._sel.unregister(sock)
            elif key is None:
                self._sel.register(sock, mask, (pair, is_client))
            elif key.events != mask:
                self._sel.modify(sock, mask, (pair, is_client))

    def _close(self, pair: _Pair) -> None:
        pair.closed = True
        for sock in (pair.client, pair.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()
        self._peers.pop(pair.identity, None)
        self.admission.release(pair.peer)
