"""Issue 27 in the router: where pilotd serves (router/server.py) and how many connections it
keeps (router/admission.py)."""

from __future__ import annotations

import os

import pytest


def test_pilotd_serves_only_from_a_directory_no_one_else_controls(tmp_path) -> None:
    """Issue 27 (1), pilotd's side: a directory another user could write (or owns) is refused."""
    from pilot.daemon.router.server import DaemonError, prepare_socket_path

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DaemonError, match="writable by other users"):
        prepare_socket_path(str(shared / "pilot.sock"))
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 1, 1)
        with pytest.raises(DaemonError, match="owned by another user"):
            prepare_socket_path(str(theirs / "pilot.sock"))
    prepare_socket_path(str(tmp_path / "mine" / "pilot.sock"))  # made here: fine


def test_connection_budget_leaves_room_for_everything_else() -> None:
    from pilot.daemon.router.admission import PROXIED_FDS, RESERVED_FDS, connection_budget

    assert connection_budget(16384, 2048, 131072) == 16384
    low = connection_budget(16384, 100, 4096)
    assert (PROXIED_FDS + 1) * low + 100 + RESERVED_FDS <= 4096


def test_the_acceptor_names_each_connection_itself() -> None:
    """The client's READY reaches libzmq with pilotd's Identity in place of its own, whatever
    the client claimed (router/handshake.py), so a routing id always names the connection."""
    import struct

    from pilot.daemon.router.handshake import HandshakeError, ready_frame_size, rewrite_ready

    def prop(name: bytes, value: bytes) -> bytes:
        return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value

    body = b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", b"P" + bytes(8))
    frame = bytes([0x04, len(body)]) + body
    assert ready_frame_size(frame[:1]) is None
    assert ready_frame_size(frame) == len(frame)
    out = rewrite_ready(frame, b"Pmine")
    assert out[2:] == b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", b"Pmine")
    with pytest.raises(HandshakeError):
        ready_frame_size(bytes([0x00, 5]))  # a message before the handshake ended
    with pytest.raises(HandshakeError):
        ready_frame_size(bytes([0x06]) + (1 << 30).to_bytes(8, "big"))  # a 1 GiB command
    with pytest.raises(HandshakeError):
        rewrite_ready(bytes([0x04, 6]) + b"\x05HELLO", b"P")


def test_endpoint_refusals_are_logged_at_most_every_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    """What the endpoint servers refused in C: one line per LOG_EVERY s with the new count and
    the last uid; nothing when nothing new was refused."""
    from pilot.daemon.router.admission import LOG_EVERY, EndpointRefusals
    reading = [(0, -1)]
    refusals = EndpointRefusals(lambda: reading[0])
    with caplog.at_level("WARNING", logger="pilot.admission"):
        assert refusals.check(now=100.0) == 0
        reading[0] = (5, 65534)
        assert refusals.check(now=101.0) == 5
        reading[0] = (9, 1000)
        assert refusals.check(now=102.0) == 9  # counted, not logged yet
        assert refusals.check(now=101.0 + LOG_EVERY) == 9
        reading[0] = (10, -1)
        assert refusals.check(now=200.0) == 10
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("5 connection(s)") and "the last of uid 65534" in lines[0]
    assert lines[1].startswith("4 connection(s)") and "uid 1000" in lines[1]
    assert lines[2].startswith("1 connection(s)") and "could not identify" in lines[2]


def test_the_endpoints_count_is_read_from_c() -> None:
    from pilot.daemon.router.admission import read_endpoint_refusals
    count, uid = read_endpoint_refusals()
    assert count >= 0 and uid >= -1
