"""The systemd notify protocol (sd_notify(3)) without libsystemd.

Under `Type=notify` systemd starts pilotd with $NOTIFY_SOCKET naming a datagram socket; pilotd
sends `READY=1` once its sockets accept clients (so `systemctl start` returns only then, and units
ordered after pilotd find it serving), `STOPPING=1` when it begins to stop, `STATUS=...` for
`systemctl status`, and `WATCHDOG=1` regularly when the unit has `WatchdogSec=`: if the router
loop hangs, the pings stop and systemd kills and restarts the daemon (`Restart=on-failure`).

The protocol is one AF_UNIX datagram of newline-separated `KEY=VALUE` lines; a leading '@' in
the address means Linux's abstract namespace. Speaking it directly keeps pilotd free of a C
dependency, and outside systemd (NOTIFY_SOCKET unset) every call is a cheap no-op. A failed send
never stops the daemon: it is logged once and reported by the return value.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger("pilot.sdnotify")

_warned = False  # log a failing NOTIFY_SOCKET once, not on every watchdog ping


def _address(raw: str) -> str | None:
    """The sockaddr path of a NOTIFY_SOCKET value, or None for a kind we do not speak (vsock)."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None


def _warn_once(text: str, *args: object) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(text, *args)


def notify(*states: str) -> bool:
    """Send `states` ("READY=1", "STOPPING=1", "WATCHDOG=1", "STATUS=...") as one datagram to
    $NOTIFY_SOCKET. True when it was sent; False when NOTIFY_SOCKET is unset (not under systemd),
    unusable, or the send failed. Never raises on those. A newline inside a state would start a
    new assignment, so it becomes a space."""
    raw = os.environ.get("NOTIFY_SOCKET")
    if not raw or not states:
        return False
    address = _address(raw)
    if address is None:
        _warn_once("sd_notify: unsupported NOTIFY_SOCKET %r; systemd will not hear from pilotd", raw)
        return False
    data = "\n".join(s.replace("\n", " ") for s in states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(data, address)
    except OSError as exc:
        _warn_once("sd_notify: cannot send to NOTIFY_SOCKET %r: %s", raw, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings that systemd expects, or None when the watchdog is off.

    systemd sets WATCHDOG_USEC to the unit's WatchdogSec= and WATCHDOG_PID to the process it is
    meant for (a child that inherited the environment must not ping). sd_watchdog_enabled(3)
    recommends pinging at half the timeout, which is what this returns."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    try:
        timeout_us = int(usec)
    except ValueError:
        return None
    if timeout_us <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return timeout_us / 2 / 1_000_000


class Watchdog:
    """Sends WATCHDOG=1 at most once per `interval` seconds.

    The router loop calls `maybe_ping()` on every turn (about every 0.2 s): most calls only
    compare two floats. The first call pings at once. Pinging from the router loop, not from a
    timer thread, is the point: a ping proves the loop that serves HELLO and control still turns.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic,
                 send: Callable[..., bool] = notify) -> None:
        if not interval > 0:
            raise ValueError(f"watchdog interval must be positive, not {interval!r}")
        self.interval = interval
        self._clock = clock
        self._send = send
        self._last: float | None = None

    @classmethod
    def from_env(cls) -> Watchdog | None:
        """A Watchdog at systemd's requested rate, or None when the unit has no WatchdogSec."""
        interval = watchdog_interval()
        return None if interval is None else cls(interval)

    def maybe_ping(self, now: float | None = None) -> bool:
        """Ping if at least `interval` seconds passed since the last ping; True if it pinged."""
        if now is None:
            now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        self._last = now
        self._send("WATCHDOG=1")
        return True
