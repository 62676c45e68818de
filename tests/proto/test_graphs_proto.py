"""CUDA graphs instantiated in pilotd (PILOT_OP_GRAPH_*, daemon/ops/graphs.py) in raw protocol,
on the sim: a recorded graph becomes one launch that does its work every time; a node outside
the session is refused at instantiation, not at launch; calls pilotd cannot hold in a graph are
answered with a reason (the shim then replays them); a free makes a graph check its nodes
again before it runs; malformed records are refused and lose nothing."""

from __future__ import annotations

import struct

from client import ProtoClient, body

from pilot.daemon.protocol import lib

MEMSET, LAUNCH, H2D = lib.PILOT_OP_MEMSET, lib.PILOT_OP_GRAPH_LAUNCH, lib.PILOT_OP_MEMCPY_H2D
INVALID_VALUE = 1


def _client(daemon) -> ProtoClient:
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    return c


def _stream(c: ProtoClient) -> int:
    rep = c.call(lib.PILOT_OP_STREAM_CREATE, body("pilot_req_stream_create", flags=1),
                 rep_type="pilot_rep_u64")
    assert rep.hdr.err == 0
    return int(rep.value)


def _record(op: int, req: bytes, payload: bytes = b"") -> bytes:
    pad = -(len(req) + len(payload)) % 8
    return struct.pack("<HHIII", op, 0, len(req), len(payload), 0) + req + payload + b"\0" * pad


def _memset(ptr: int, value: int, count: int, stream: int) -> bytes:
    return _record(MEMSET, body("pilot_req_memset", ptr=ptr, value=value, count=count, stream=stream))


def _instantiate(c: ProtoClient, exec_: int, stream: int, records: list[bytes]):
    return c.call(lib.PILOT_OP_GRAPH_INSTANTIATE,
                  body("pilot_req_graph", exec=exec_, stream=stream, count=len(records)),
                  b"".join(records), rep_type="pilot_rep_graph")


def _launch(c: ProtoClient, exec_: int, stream: int) -> None:
    c.send(LAUNCH, body("pilot_req_graph", exec=exec_, stream=stream), flags=lib.PILOT_F_NO_REPLY)


def _read(c: ProtoClient, ptr: int, count: int) -> bytes:
    rep = c.call(lib.PILOT_OP_MEMCPY_D2H, body("pilot_req_memcpy", src=ptr, count=count))
    assert rep.err == 0, rep.err
    return c.last_payload


def _write(c: ProtoClient, ptr: int, data: bytes) -> None:
    assert c.call(H2D, body("pilot_req_memcpy", dst=ptr, count=len(data)), data).err == 0


def _sync(c: ProtoClient) -> int:
    """cudaDeviceSynchronize's result: its own error, else a posted call's."""
    hdr = c.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"")
    return int(hdr.err or hdr.deferred)


def test_a_recorded_graph_is_one_launch_that_runs_every_time(daemon) -> None:
    c = _client(daemon)
    rec, run = _stream(c), _stream(c)
    a, b = c.malloc(4096), c.malloc(4096)
    rep = _instantiate(c, 0x1000, rec, [_memset(a, 0x11, 64, rec), _memset(a + 32, 0x22, 16, rec),
                                        _memset(b, 0x33, 8, rec)])
    assert (rep.hdr.err, rep.replay, rep.nodes) == (0, lib.PILOT_GRAPH_INSTANTIATED, 3)
    assert _read(c, a, 64) == b"\0" * 64  # instantiation ran nothing
    for _ in range(2):
        _write(c, a, b"\0" * 64)
        _launch(c, 0x1000, run)
        assert _sync(c) == 0
        assert _read(c, a, 64) == b"\x11" * 32 + b"\x22" * 16 + b"\x11" * 16
        assert _read(c, b, 8) == b"\x33" * 8
    c.close()


def test_a_node_outside_the_session_is_refused_at_instantiation(daemon) -> None:
    c = _client(daemon)
    rec = _stream(c)
    mine = c.malloc(4096)
    for bad in (mine + (1 << 30), mine + 4090):  # no memory of the session; past the end of it
        rep = _instantiate(c, 0x2000, rec, [_memset(mine, 1, 8, rec), _memset(bad, 0, 8, rec)])
        assert rep.hdr.err == INVALID_VALUE
    _launch(c, 0x2000, 0)  # nothing was kept: the launch fails (reported at the next sync)
    assert _sync(c) == INVALID_VALUE
    assert _read(c, mine, 8) == b"\0" * 8  # the capture ran nothing
    c.close()


def test_what_pilotd_cannot_hold_is_left_to_the_shim_with_a_reason(daemon) -> None:
    c = _client(daemon)
    rec = _stream(c)
    a = c.malloc(4096)
    h2d = _record(H2D, body("pilot_req_memcpy", dst=a, count=4, stream=rec), b"abcd")
    rep = _instantiate(c, 0x3000, rec, [_memset(a, 1, 8, rec), h2d])
    assert (rep.hdr.err, rep.replay) == (0, lib.PILOT_GRAPH_REPLAY_NODE)
    rep = _instantiate(c, 0x3001, 0, [_memset(a, 1, 8, 0)])  # recorded on the legacy stream
    assert (rep.hdr.err, rep.replay) == (0, lib.PILOT_GRAPH_REPLAY_NODE)
    assert _read(c, a, 8) == b"\0" * 8  # nothing ran
    c.close()


def test_a_free_makes_the_graph_check_its_nodes_again(daemon) -> None:
    c = _client(daemon)
    rec = _stream(c)
    a, b = c.malloc(4096), c.malloc(4096)
    assert _instantiate(c, 0x4000, rec, [_memset(b, 7, 8, rec)]).hdr.err == 0
    _launch(c, 0x4000, 0)
    assert _sync(c) == 0 and _read(c, b, 8) == b"\x07" * 8
    # freeing another allocation: captured again, still the session's memory, runs
    assert c.call(lib.PILOT_OP_FREE, body("pilot_req_free", ptr=a)).err == 0
    _write(c, b, b"\0" * 8)
    _launch(c, 0x4000, 0)
    assert _sync(c) == 0 and _read(c, b, 8) == b"\x07" * 8
    # freeing what the graph writes: the launch is refused, nothing written
    assert c.call(lib.PILOT_OP_FREE, body("pilot_req_free", ptr=b)).err == 0
    _launch(c, 0x4000, 0)
    assert _sync(c) == INVALID_VALUE
    c.close()


def test_malformed_records_are_refused_and_lose_nothing(daemon) -> None:
    c = _client(daemon)
    rec = _stream(c)
    a = c.malloc(4096)
    good = _memset(a, 5, 8, rec)
    for payload, count in ((good[:-4], 1), (good + b"\0" * 8, 1), (good, 2),
                           (struct.pack("<HHIII", MEMSET, 0, 1 << 30, 0, 0), 1)):
        rep = c.call(lib.PILOT_OP_GRAPH_INSTANTIATE,
                     body("pilot_req_graph", exec=0x5000, stream=rec, count=count), payload,
                     rep_type="pilot_rep_graph")
        assert rep.hdr.err == INVALID_VALUE
    short = _record(MEMSET, body("pilot_req_memset", ptr=a, count=8, stream=rec)[:8])
    assert _instantiate(c, 0x5000, rec, [short]).replay == lib.PILOT_GRAPH_REPLAY_NODE
    assert _instantiate(c, 0x5000, rec, [good]).hdr.err == 0  # the session goes on
    _launch(c, 0x5000, 0)
    assert _sync(c) == 0 and _read(c, a, 8) == b"\x05" * 8
    c.call(lib.PILOT_OP_GRAPH_DESTROY, body("pilot_req_graph", exec=0x5000), flags=0)
    _launch(c, 0x5000, 0)  # destroyed: refused
    assert _sync(c) == INVALID_VALUE
    c.close()
