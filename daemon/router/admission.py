"""How many connections the main and control sockets hold, per uid and in all.

pilotd's acceptor (router/acceptor.py) takes every connection to these sockets before libzmq
sees it, reads its peer credentials from the kernel (SO_PEERCRED) and the peer process's start
time from /proc, and asks `Admission.admit`: past `[limits] connections_per_uid` (that user's
connections to these sockets) or `[limits] connections` (all of them) the connection is closed
at once, and logged (rate-limited).

Descriptors: `raise_nofile()` lifts pilotd's soft RLIMIT_NOFILE to the hard one at start;
`connection_budget()` keeps every connection limit below it with room for pidfds, staging
files and the driver. The acceptor itself never lets libzmq's accept meet EMFILE (libzmq
aborts on it): libzmq accepts only the connections the acceptor made.

The endpoint servers accept in C with the same limits; `EndpointRefusals` logs what they refused.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from pilot.daemon.protocol import ffi, lib

log = logging.getLogger("pilot.admission")

# Descriptors kept for everything but connections: a pidfd per session, staging files, the
# driver's own, the vGPU threads' sockets and pipes.
RESERVED_FDS = 1024
LOG_EVERY = 10.0  # seconds between two log lines about refused connections of one uid
# Descriptors an admitted connection of the main or control socket costs: the client's, the
# acceptor's to libzmq, libzmq's (router/acceptor.py).
PROXIED_FDS = 3


def raise_nofile() -> int:
    """Lift the soft descriptor limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def connection_budget(wanted: int, sessions: int, nofile: int) -> int:
    """How many connections pilotd's main and control sockets (PROXIED_FDS descriptors each)
    and its endpoint servers (one each) may each hold: `wanted`, lowered so that both kinds
    together, a pidfd per session and RESERVED_FDS stay under `nofile`."""
    room = max(16, (nofile - RESERVED_FDS - sessions) // (PROXIED_FDS + 1))
    return min(wanted, room)


@dataclass(frozen=True)
class Peer:
    """A connection's other end, as the kernel told it when the connection was accepted."""

    uid: int
    gid: int
    pid: int
    start_time: int | None  # of that pid's process then (/proc/<pid>/stat), None: unreadable


class Admission:
    """The connections admitted to the main and control sockets, counted per uid and in all
    (owned by the acceptor thread, router/acceptor.py)."""

    def __init__(self, total: int, per_uid: int) -> None:
        self.total, self.per_uid = total, per_uid
        self._count = 0
        self._by_uid: dict[int, int] = {}
        self._logged: dict[int, float] = {}
        self.refused = 0

    def connections(self, uid: int | None = None) -> int:
        return self._count if uid is None else self._by_uid.get(uid, 0)

    def admit(self, peer: Peer) -> bool:
        """Count the connection in, or refuse it (False, logged at most every LOG_EVERY s per
        uid) past `per_uid` for its user or `total` in all."""
        held = self._by_uid.get(peer.uid, 0)
        if held >= self.per_uid or self._count >= self.total:
            why = "too many of this user's" if held >= self.per_uid else "too many connections"
            self.refuse(peer.uid, f"pid {peer.pid} uid {peer.uid}",
                        f"{why} ({held} connections of the uid, {self._count} in all; [limits] "
                        f"connections_per_uid = {self.per_uid}, connections = {self.total})")
            return False
        self._count += 1
        self._by_uid[peer.uid] = held + 1
        return True

    def refuse(self, uid: int, who: str, why: str) -> None:
        """A connection refused: counted, logged at most every LOG_EVERY s per uid (-1: unknown)."""
        self.refused += 1
        now = time.monotonic()
        if now - self._logged.get(uid, -LOG_EVERY) >= LOG_EVERY:
            self._logged[uid] = now
            log.warning("connection of %s refused: %s", who, why)

    def release(self, peer: Peer) -> None:
        """An admitted connection is gone."""
        self._count -= 1
        left = self._by_uid[peer.uid] - 1
        if left:
            self._by_uid[peer.uid] = left
        else:
            del self._by_uid[peer.uid]


class EndpointRefusals:
    """What the endpoint servers (the vGPUs' and the callbacks' sockets, accepted in C by
    daemon/native/vgpu_server.c under the same limits) refused: read from C by the router's loop
    and logged at most every LOG_EVERY s, with how many since the last line and whose was last."""

    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        """read: the count since the process started and the last uid (-1: unknown)."""
        self._read = read
        self._logged_count = 0
        self._logged_at = -LOG_EVERY

    def check(self, now: float | None = None) -> int:
        """The count now; logs the new refusals when LOG_EVERY s passed since the last line."""
        count, uid = self._read()
        now = time.monotonic() if now is None else now
        if count > self._logged_count and now - self._logged_at >= LOG_EVERY:
            who = f"uid {uid}" if uid >= 0 else "a process pilotd could not identify"
            log.warning("%d connection(s) to pilotd's endpoints (vGPUs, callbacks) refused, the last "
                        "of %s: past [limits] connections_per_uid or connections, or out of "
                        "descriptors", count - self._logged_count, who)
            self._logged_count, self._logged_at = count, now
        return count


def read_endpoint_refusals() -> tuple[int, int]:
    """pilot_srv_refusals: (count, last uid or -1)."""
    count, uid = ffi.new("uint64_t *"), ffi.new("uint32_t *")
    lib.pilot_srv_refusals(count, uid)
    return int(count[0]), -1 if uid[0] == 0xFFFFFFFF else int(uid[0])
