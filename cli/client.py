"""A small client of the daemon's main socket, for the command-line tools."""

from __future__ import annotations

import json
import os
from typing import Any

import zmq

from pilot.daemon.protocol import ask_sessions, socket_path


class DaemonUnreachable(Exception):
    pass


def query_sessions(path: str | None = None, timeout_ms: int = 3000) -> list[dict[str, Any]]:
    """The daemon's session list (PILOT_OP_SESSIONS)."""
    path = path or socket_path(for_daemon=False)
    rows = ask_sessions(path, timeout_ms)
    if rows is None:
        raise DaemonUnreachable(f"no answer from pilotd at {path} (or it refused the query)")
    return rows


def control_socket_path(main_socket: str | None = None) -> str:
    """The control socket: $PILOT_CONTROL_SOCKET, else control.sock beside the main socket."""
    env = os.environ.get("PILOT_CONTROL_SOCKET")
    if env:
        return env
    return os.path.join(os.path.dirname(main_socket or socket_path(for_daemon=False)), "control.sock")


class ControlClient:
    """Sends one JSON command to pilotd's control socket and returns its result."""

    def __init__(self, path: str, timeout_ms: int = 5000) -> None:
        self.path, self.timeout_ms = path, timeout_ms

    def call(self, cmd: str, **args: Any) -> Any:
        if not os.path.exists(self.path):
            raise DaemonUnreachable(f"no pilotd control socket at {self.path}: is pilotd running?")
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(f"ipc://{self.path}")
            sock.send(json.dumps({"cmd": cmd, "args": args}).encode())
            if not sock.poll(self.timeout_ms):
                raise DaemonUnreachable(f"no answer from pilotd at {self.path}")
            reply = json.loads(sock.recv())
        finally:
            sock.close(0)
        if not reply.get("ok"):
            raise CommandFailed(reply.get("error", "pilotd refused the command"))
        return reply.get("result")


class CommandFailed(Exception):
    pass
