"""A ZMTP client that sends its first message (HELLO) right behind its greeting and READY, before
it has read pilotd's: libzmq alone drops such a connection when the message arrives before it
sent its own READY (ZMTP_UNEXPECTED_COMMAND: 39 of 40 connections here before the fix), so the
acceptor (daemon/router/acceptor.py) holds those bytes until libzmq's READY went by. The shim and
libzmq's own clients wait; other ZMTP implementations need not."""

from __future__ import annotations

import rawzmtp
from proto_daemon import RunningDaemon

from pilot.daemon.protocol import ffi, lib, new, to_bytes

ROUNDS = 30


def _hello_bytes() -> tuple[bytes, bytes]:
    env = new("pilot_envelope")
    env.version, env.opcode, env.seq = lib.PILOT_PROTO_VERSION, lib.PILOT_OP_HELLO, 1
    req = new("pilot_req_hello")
    req.proto_version, req.cuda_abi = lib.PILOT_PROTO_VERSION, 13000
    return to_bytes(env), to_bytes(req)


def _pipelined_hello(d: RunningDaemon) -> int:
    """The session pilotd opens for a HELLO sent before reading anything."""
    s = rawzmtp.connect(str(d.socket_path))  # greeting and READY sent, nothing read
    try:
        rawzmtp.send(s, *_hello_bytes())
        parts = rawzmtp.recv(s)
    finally:
        s.close()
    rep = ffi.new("pilot_rep_hello *")
    ffi.memmove(rep, parts[1], min(len(parts[1]), ffi.sizeof(rep[0])))
    assert rep.hdr.err == 0, rep.hdr.err
    return int(rep.session)


def test_a_hello_pipelined_behind_the_handshake_is_answered(daemon: RunningDaemon) -> None:
    sessions = [_pipelined_hello(daemon) for _ in range(ROUNDS)]
    assert len(set(sessions)) == ROUNDS and all(sessions)
    assert daemon.alive()


def test_bytes_split_at_every_point_of_the_handshake_still_arrive(daemon: RunningDaemon) -> None:
    """The greeting, READY and HELLO in one buffer, written in two pieces cut at each place."""
    env, req = _hello_bytes()
    stream = rawzmtp.GREETING + rawzmtp.frame(rawzmtp.READY, command=True) + \
        rawzmtp.frame(env, more=True) + rawzmtp.frame(req)
    for cut in range(1, len(stream), 7):
        s = rawzmtp.raw_connect(str(daemon.socket_path))
        try:
            s.sendall(stream[:cut])
            s.sendall(stream[cut:])
            parts = rawzmtp.recv(s)
        finally:
            s.close()
        assert len(parts) >= 2, cut
