"""Who is connected to the main and control sockets, and how many (router thread).

libzmq accepts every connection its ROUTER sockets' listeners see, and before ATTACH a local
user could open connections until pilotd runs out of descriptors (libzmq then aborts). So each
socket is monitored: on ACCEPTED the router thread reads the new connection's peer credentials
from the kernel (SO_PEERCRED on the descriptor) and the peer process's start time from /proc,
keeps them by descriptor, and shuts down at once a connection past `[limits]
connections_per_uid` (that user's connections to these sockets) or `[limits] connections` (all
of them); DISCONNECTED forgets it. A message's descriptor is libzmq's ZMQ_SRCFD, so HELLO takes
its sender's identity from this record, read by pilotd when the connection was accepted, never
from anything the client sent (issue 27, item 6).

Descriptors: `raise_nofile()` lifts pilotd's soft RLIMIT_NOFILE to the hard one at start;
`connection_budget()` keeps every connection limit below it with room for pidfds, staging
files and the driver, so that pilotd refuses connections (and logs) instead of aborting on EMFILE.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import struct
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from pilot.daemon.sessions.session import process_start_time

log = logging.getLogger("pilot.admission")

# Descriptors kept for everything but connections: a pidfd per session, staging files, the
# driver's own, the vGPU threads' sockets and pipes.
RESERVED_FDS = 1024
LOG_EVERY = 10.0  # seconds between two log lines about refused connections of one uid
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


def raise_nofile() -> int:
    """Lift the soft descriptor limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_budget(wanted: int, sessions: int, nofile: int) -> int:
    """How many connections pilotd's libzmq sockets and its endpoint servers may each hold:
    `wanted`, lowered so that both kinds together, a pidfd per session and RESERVED_FDS stay
    under `nofile`."""
    room = max(16, (nofile - RESERVED_FDS - sessions) // 2)
    return min(wanted, room)


@dataclass(frozen=True)
class Peer:
    """A connection's other end, as the kernel told it when the connection was accepted."""

    uid: int
    gid: int
    pid: int
    start_time: int | None  # of that pid's process then (/proc/<pid>/stat), None: unreadable


def _socket_on(fd: int, path: str) -> socket.socket | None:
    """A socket object on a duplicate of `fd` if it is still a connection accepted on `path`,
    else None: by the time the event is read libzmq may have closed the connection and the
    number be another descriptor (an eventfd, another tenant's connection), which must be
    neither leaked nor shut."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        if sock.family == socket.AF_UNIX and sock.getsockname() == path:
            return sock
    except OSError:
        pass
    sock.close()
    return None


def peer_of(fd: int, path: str) -> Peer | None:
    """SO_PEERCRED of a connection accepted on `path` (and its process's start time), None if
    gone."""
    sock = _socket_on(fd, path)
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        sock.close()
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(uid, gid, pid, process_start_time(pid))


def shut(fd: int, path: str) -> None:
    """End a connection libzmq accepted on `path` without closing its descriptor under it:
    libzmq sees the peer gone and closes it itself."""
    sock = _socket_on(fd, path)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class Admission:
    """The connections of the sockets `watch`ed, counted per uid and in total (router thread)."""

    def __init__(self, total: int, per_uid: int) -> None:
        self.total, self.per_uid = total, per_uid
        self.monitors: list[zmq.Socket] = []
        # (socket path, descriptor) -> peer, connections admitted; by path too, as the sockets'
        # monitors are read one after the other and a number closed on one may be reused on another
        self._peers: dict[tuple[str, int], Peer] = {}
        self._by_uid: dict[int, int] = {}
        self._logged: dict[int, float] = {}
        self.refused = 0

    def watch(self, sock: zmq.Socket) -> zmq.Socket:
        """Monitor `sock`'s connections; returns the monitor socket to poll."""
        # not get_monitor_socket(): its pipe holds 1,000 events and drops the rest under a flood
        address = f"inproc://pilot-admission-{id(sock):x}"
        sock.monitor(address, _EVENTS)
        monitor = sock.context.socket(zmq.PAIR)
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        self.monitors.append(monitor)
        return monitor

    def connections(self, uid: int | None = None) -> int:
        return len(self._peers) if uid is None else self._by_uid.get(uid, 0)

    def drain(self) -> None:
        """Take every pending event of every monitor (before the sockets' messages are read, so
        a message's connection is known by then)."""
        for monitor in self.monitors:
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                fd = int(event["value"])
                path = event["endpoint"].decode(errors="replace").removeprefix("ipc://")
                if event["event"] == zmq.EVENT_ACCEPTED:
                    self._accepted(fd, path)
                else:
                    self._gone(fd, path)

    def _accepted(self, fd: int, path: str) -> None:
        self._gone(fd, path)  # a descriptor number seen before is a new connection now
        peer = peer_of(fd, path)
        if peer is None:  # gone already
            return
        held = self._by_uid.get(peer.uid, 0)
        if held >= self.per_uid or len(self._peers) >= self.total:
            self.refused += 1
            shut(fd, path)
            now = time.monotonic()
            if now - self._logged.get(peer.uid, 0.0) >= LOG_EVERY:
                self._logged[peer.uid] = now
                log.warning("connection of pid %d uid %d refused: %s (%d connections of the uid, %d "
                            "in all; [limits] connections_per_uid = %d, connections = %d)", peer.pid,
                            peer.uid, "too many of this user's" if held >= self.per_uid else
                            "too many connections", held, len(self._peers), self.per_uid, self.total)
            return
        self._peers[path, fd] = peer
        self._by_uid[peer.uid] = held + 1

    def _gone(self, fd: int, path: str) -> None:
        peer = self._peers.pop((path, fd), None)
        if peer is not None:
            left = self._by_uid[peer.uid] - 1
            if left:
                self._by_uid[peer.uid] = left
            else:
                del self._by_uid[peer.uid]

    def peer(self, frame: zmq.Frame, path: str, pid: int | None = None) -> Peer | None:
        """The kernel's record of the connection `frame` came on, to the socket at `path` (None:
        not admitted, or gone). `pid`: the process the connection's credentials name now; a
        record of another process is an earlier connection that had the descriptor number,
        whose DISCONNECTED (and this one's ACCEPTED) event is still queued."""
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:
            return None
        peer = self._peers.get((path, fd))
        if peer is None or (pid is not None and peer.pid != pid):
            self.drain()  # accepted while the router read this batch: its event is queued
            peer = self._peers.get((path, fd))
        return peer

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close(0)
        self.monitors.clear()
