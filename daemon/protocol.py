"""The wire protocol as the daemon sees it: structs and opcodes from shim/transport/pilot_proto.h via cffi.

Nothing here restates a layout: `pilot.shim._proto` is compiled from the same header the shim
compiles, so a struct that changes there changes here.
"""

from __future__ import annotations

from typing import Any

from pilot.shim._proto import ffi, lib

ENVELOPE_SIZE = ffi.sizeof("pilot_envelope")
REPLY_HDR_SIZE = ffi.sizeof("pilot_reply_hdr")


class ProtocolError(Exception):
    """A message that does not follow the protocol; logged and answered or dropped, never fatal."""


def parse(ctype: str, frame: Any) -> Any:
    """View a frame as a `ctype` struct (no copy). Rejects frames shorter than the struct."""
    size = ffi.sizeof(ctype)
    if len(frame) < size:
        raise ProtocolError(f"{ctype}: body of {len(frame)} bytes, expected {size}")
    return ffi.from_buffer(ctype + " *", frame)


def new(ctype: str) -> Any:
    """A zeroed reply struct."""
    return ffi.new(ctype + " *")


def to_bytes(cdata: Any) -> bytes:
    return ffi.buffer(cdata)[:]


def op_names() -> dict[int, str]:
    """Opcode number -> short name (PILOT_OP_MEMCPY_D2H -> memcpy_d2h), for logs and metrics."""
    return {
        getattr(lib, name): name[len("PILOT_OP_"):].lower()
        for name in dir(lib)
        if name.startswith("PILOT_OP_") and isinstance(getattr(lib, name), int)
    }


def socket_path(for_daemon: bool) -> str:
    """The default socket path rule, shared with the shim (shim/transport/socket_path.c)."""
    buf = ffi.new("char[]", 4096)
    if lib.pilot_socket_path(1 if for_daemon else 0, buf, 4096) != 0:
        raise ValueError("socket path too long")
    return ffi.string(buf).decode()


def ask_sessions(path: str, timeout_ms: int) -> list[dict[str, Any]] | None:
    """SESSIONS on the main socket at `path` (what `pilot sessions` shows): the rows, or None if
    no pilotd answered in time or it refused. The caller's peer credentials decide which rows."""
    import json

    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{path}")
        env = new("pilot_envelope")
        env.version, env.opcode, env.seq = lib.PILOT_PROTO_VERSION, lib.PILOT_OP_SESSIONS, 1
        sock.send_multipart([to_bytes(env), b""])
        if not sock.poll(timeout_ms):
            return None
        frames = sock.recv_multipart()
    except zmq.ZMQError:
        return None
    finally:
        sock.close(0)
    hdr = ffi.from_buffer("pilot_reply_hdr *", frames[1]) if len(frames) >= 2 else None
    if hdr is None or hdr.err or len(frames) < 3:
        return None
    try:
        rows = json.loads(frames[2])
    except ValueError:
        return None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None
