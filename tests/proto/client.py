"""A raw protocol client (pyzmq DEALER) built on the same cffi structs as the daemon, so tests
can send exactly the bytes they mean, malformed ones included."""

from __future__ import annotations

from typing import Any

import zmq

from pilot.daemon.protocol import ffi, lib, new, to_bytes

TIMEOUT_MS = 5000


# One context for every client, never collected: a context garbage-collected while its sockets
# are collected in the same pass waits in term() for them forever (a test that dropped a client
# without close() hung the whole suite in an unrelated test's garbage collection).
_CONTEXT = zmq.Context.instance()


class ProtoClient:
    def __init__(self, socket_path: str) -> None:
        self.ctx = _CONTEXT
        self._sockets: list[zmq.Socket] = []
        self.main = self._connect(socket_path)
        self.vgpu: zmq.Socket | None = None
        self.session = 0
        self.seq = 0

    def _connect(self, path: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        self._sockets.append(sock)
        sock.connect(f"ipc://{path}")
        return sock

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(0)
        self._sockets.clear()

    def envelope(self, op: int, flags: int = 0, session: int | None = None,
                 version: int | None = None) -> bytes:
        self.seq += 1
        env = new("pilot_envelope")
        env.version = lib.PILOT_PROTO_VERSION if version is None else version
        env.opcode, env.flags, env.seq = op, flags, self.seq
        env.session = self.session if session is None else session
        return to_bytes(env)

    @staticmethod
    def recv(sock: zmq.Socket) -> list[bytes]:
        if not sock.poll(TIMEOUT_MS):
            raise TimeoutError("no reply from pilotd")
        return sock.recv_multipart()

    def hello(self, visible: bytes | None = None, flags: int = 0, start_time: int = 0) -> Any:
        """HELLO; `visible`: the CUDA_VISIBLE_DEVICES it carries (None: unset); `start_time`:
        the start time it claims for its sender (0: none)."""
        req = new("pilot_req_hello")
        req.proto_version, req.cuda_abi, req.flags = lib.PILOT_PROTO_VERSION, 13000, flags
        req.start_time = start_time
        if visible is not None:
            req.flags |= lib.PILOT_HELLO_VISIBLE_SET
            ffi.memmove(req.visible_devices, visible, len(visible))
        self.main.send_multipart([self.envelope(lib.PILOT_OP_HELLO), to_bytes(req)])
        frames = self.recv(self.main)
        rep = ffi.new("pilot_rep_hello *")
        ffi.memmove(rep, frames[1], ffi.sizeof(rep[0]))
        return rep

    def open(self, visible: bytes | None = None, flags: int = 0) -> None:
        rep = self.hello(visible, flags)
        assert rep.hdr.err == 0
        self.session = rep.session
        self.vgpu = self._connect(ffi.string(rep.endpoint).decode())
        status = self.call(lib.PILOT_OP_ATTACH, b"")
        assert status.err == 0

    def send(self, op: int, body: bytes, payload: bytes | None = None, flags: int = 0,
             **env: Any) -> None:
        assert self.vgpu is not None
        parts = [self.envelope(op, flags, **env), body]
        if payload is not None:
            parts.append(payload)
        self.vgpu.send_multipart(parts)

    def call(self, op: int, body: bytes, payload: bytes | None = None, rep_type: str = "pilot_rep_status",
             **env: Any) -> Any:
        self.send(op, body, payload, **env)
        frames = self.recv(self.vgpu)  # type: ignore[arg-type]
        rep = ffi.new(rep_type + " *")
        ffi.memmove(rep, frames[1], min(len(frames[1]), ffi.sizeof(rep[0])))
        self.last_payload = frames[2] if len(frames) > 2 else b""
        return rep.hdr if rep_type == "pilot_rep_status" else rep

    def malloc(self, size: int) -> int:
        req = new("pilot_req_malloc")
        req.size = size
        rep = self.call(lib.PILOT_OP_MALLOC, to_bytes(req), rep_type="pilot_rep_u64")
        assert rep.hdr.err == 0, rep.hdr.err
        return int(rep.value)


def body(ctype: str, **fields: Any) -> bytes:
    obj = new(ctype)
    for k, v in fields.items():
        setattr(obj, k, v)
    return to_bytes(obj)
