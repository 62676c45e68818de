"""A ZMTP/3.0 DEALER on a plain UNIX socket, for tests that must control the connection itself
(which process holds it, how large a frame is, whether a handshake ever comes)."""

from __future__ import annotations

import socket

GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
READY = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"


def frame(data: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if len(data) > 255:
        return bytes([flags | 0x02]) + len(data).to_bytes(8, "big") + data
    return bytes([flags, len(data)]) + data


def raw_connect(path: str, timeout: float = 5.0) -> socket.socket:
    """A connection to `path` that has sent nothing."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path.removeprefix("ipc://"))
    return s


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    """A connection to `path` that has sent its greeting and READY (not read the server's)."""
    s = raw_connect(path, timeout)
    s.sendall(GREETING + frame(READY, command=True))
    return s


def handshake(s: socket.socket) -> None:
    """Read the server's greeting and READY. A peer must not send a message before it has them:
    libzmq takes a message that comes before it has sent its own READY for a handshake command
    and closes the connection (ZMTP_UNEXPECTED_COMMAND), as the shim's transport knows."""
    if _exactly(s, 64)[0] != 0xFF:
        raise ConnectionError("not a ZMTP greeting")
    flags = _exactly(s, 1)[0]
    if not flags & 0x04 or not _body(s, flags).startswith(b"\x05READY"):
        raise ConnectionError("the server's first command is not READY")


def send(s: socket.socket, *parts: bytes) -> None:
    s.sendall(b"".join(frame(p, more=i < len(parts) - 1) for i, p in enumerate(parts)))


def _exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by pilotd")
        out += chunk
    return out


def _body(s: socket.socket, flags: int) -> bytes:
    """The rest of a frame whose flags byte was read: its size, then its bytes."""
    size = int.from_bytes(_exactly(s, 8), "big") if flags & 0x02 else _exactly(s, 1)[0]
    return _exactly(s, size)


def recv(s: socket.socket) -> list[bytes]:
    """The next message (the server's greeting and commands are skipped)."""
    parts: list[bytes] = []
    while True:
        flags = _exactly(s, 1)[0]
        if flags == 0xFF:  # the greeting's signature: the rest of its 64 bytes
            _exactly(s, 63)
            continue
        data = _body(s, flags)
        if flags & 0x04:
            continue
        parts.append(data)
        if not flags & 0x01:
            return parts
