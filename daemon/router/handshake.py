"""The one change pilotd's acceptor (router/acceptor.py) makes to a client's bytes: the routing
id of its connection.

A ZMTP/3.0 peer opens with a 64-byte greeting, then a READY command whose properties may name
its `Identity`, which a ROUTER socket takes as the connection's routing id. The acceptor passes
the greeting on as it comes (libzmq sends its own greeting in two steps and waits between
them), then rewrites the client's READY so that its Identity is one pilotd chose: every message
on the main and control sockets then names, in its routing id, the connection it came on, and
pilotd looks up the peer credentials it read when it accepted that connection (the client's
own Identity, if any, is dropped: no one can claim another connection's).
"""

from __future__ import annotations

import struct

GREETING = 64
MAX_READY = 4096  # a READY larger than this is not a client's: the connection is closed
_COMMAND, _LONG = 0x04, 0x02


class HandshakeError(ValueError):
    pass


def ready_frame_size(data: bytes | bytearray) -> int | None:
    """The size of the command frame at the start of `data` (after the greeting), None if its
    header is not all there yet; HandshakeError if it is not a command or is too large."""
    if not data:
        return None
    flags = data[0]
    if not flags & _COMMAND or flags & ~(_COMMAND | _LONG):
        raise HandshakeError("the first frame after the greeting is not a command")
    if flags & _LONG:
        if len(data) < 9:
            return None
        size, header = int.from_bytes(data[1:9], "big"), 9
    else:
        if len(data) < 2:
            return None
        size, header = data[1], 2
    if size > MAX_READY:
        raise HandshakeError(f"a {size}-byte command before the handshake ended")
    return header + size


def rewrite_ready(frame: bytes | bytearray, identity: bytes) -> bytes:
    """The READY command `frame` with its Identity property replaced by `identity`."""
    header = 9 if frame[0] & _LONG else 2
    body = bytes(frame[header:])
    if body[:6] != b"\x05READY":
        raise HandshakeError("the first command is not READY (only the NULL mechanism is served)")
    props, pos = [], 6
    while pos < len(body):
        n = body[pos]
        name = body[pos + 1:pos + 1 + n]
        if pos + 1 + n + 4 > len(body):
            raise HandshakeError("a truncated READY property")
        (size,) = struct.unpack_from(">I", body, pos + 1 + n)
        start = pos + 1 + n + 4
        if start + size > len(body):
            raise HandshakeError("a truncated READY property")
        if name.lower() != b"identity":
            props.append(body[pos:start + size])
        pos = start + size
    props.append(bytes([8]) + b"Identity" + struct.pack(">I", len(identity)) + identity)
    new = b"\x05READY" + b"".join(props)
    if len(new) > 255:
        return bytes([_COMMAND | _LONG]) + len(new).to_bytes(8, "big") + new
    return bytes([_COMMAND, len(new)]) + new
