"""A small client of the daemon's main socket, for the command-line tools."""

from __future__ import annotations

import json
from typing import Any

import zmq

from pilot.daemon.protocol import ffi, lib, new, socket_path, to_bytes


class DaemonUnreachable(Exception):
    pass


def query_sessions(path: str | None = None, timeout_ms: int = 3000) -> list[dict[str, Any]]:
    """The daemon's session list (PILOT_OP_SESSIONS)."""
    path = path or socket_path(for_daemon=False)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{path}")
        env = new("pilot_envelope")
        env.version, env.opcode, env.seq = lib.PILOT_PROTO_VERSION, lib.PILOT_OP_SESSIONS, 1
        sock.send_multipart([to_bytes(env), b""])
        if not sock.poll(timeout_ms):
            raise DaemonUnreachable(f"no answer from pilotd at {path}")
        frames = sock.recv_multipart()
    finally:
        sock.close(0)
    hdr = ffi.from_buffer("pilot_reply_hdr *", frames[1])
    if hdr.err or len(frames) < 3:
        raise DaemonUnreachable(f"pilotd at {path} refused the query (error {hdr.err})")
    return json.loads(frames[2])
