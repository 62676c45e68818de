"""The shared-memory rings of a vGPU connection (issue 25 item 4; shim/transport/pilot_ring.h,
daemon/native/vgpu_server.c): RING_OPEN hands over a sealed memfd, calls then travel through the
rings (a message larger than a ring too), and a client that breaks them loses only its own
connection."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time
from pathlib import Path

import pytest
import rawzmtp
from client import ProtoClient, body
from proto_daemon import RunningDaemon
from ringclient import HEAD, RingClient

from pilot.daemon.protocol import ffi, lib

NOT_SUPPORTED = 801  # cudaErrorNotSupported
ROOT = Path(__file__).resolve().parents[2]


def status(frames: list[bytes]) -> int:
    return struct.unpack_from("<i", frames[1])[0]


def raw_session(daemon: RunningDaemon) -> tuple[ProtoClient, socket.socket]:
    """A session opened on the main socket, with its vGPU connection made by hand (not attached)."""
    client = ProtoClient(str(daemon.socket_path))
    rep = client.hello()
    assert rep.hdr.err == 0
    client.session = rep.session
    return client, rawzmtp.connect(ffi.string(rep.endpoint).decode())


def attach(client: ProtoClient, sock: socket.socket) -> None:
    rawzmtp.send(sock, client.envelope(lib.PILOT_OP_ATTACH), b"")
    assert status(rawzmtp.recv(sock)) == 0


def parse(data: bytes) -> list[bytes]:
    """The frames of one whole message at the start of data."""
    parts, at = [], 0
    while True:
        flags = data[at]
        if flags & 0x02:
            size, at = int.from_bytes(data[at + 1:at + 9], "big"), at + 9
        else:
            size, at = data[at + 1], at + 2
        parts.append(data[at:at + size])
        at += size
        if not flags & 0x01:
            return parts


def open_ring(client: ProtoClient, sock: socket.socket) -> RingClient:
    rawzmtp.send(sock, client.envelope(lib.PILOT_OP_RING_OPEN), b"")
    data, fds, _, _ = socket.recv_fds(sock, 4096, 1)
    assert status(parse(data)) == 0 and len(fds) == 1
    return RingClient(sock, fds[0])


def malloc_through(ring: RingClient, client: ProtoClient, size: int) -> tuple[int, int]:
    ring.send(client.envelope(lib.PILOT_OP_MALLOC), body("pilot_req_malloc", size=size))
    frames = ring.recv()
    rep = ffi.new("pilot_rep_u64 *")
    ffi.memmove(rep, frames[1], ffi.sizeof(rep[0]))
    return int(rep.hdr.err), int(rep.value)


def test_layout_matches_the_header() -> None:
    # ringclient's offsets are pilot_ring.h's: the sizes the C compiler gave pilotd's copy
    assert lib.PILOT_OP_RING_OPEN == 5
    from ringclient import HEADER, MAGIC, PAGE, SIDE
    header = (ROOT / "shim" / "transport" / "pilot_ring.h").read_text()
    assert "uint8_t pad[48];" in header and "uint8_t pad0[64 - 12];" in header
    assert "#define PILOT_RING_PAGE 4096u" in header and f"{MAGIC:#x}ull" in header.lower()
    assert "offsetof(struct pilot_ring_shm, gpu) == PILOT_RING_PAGE" in header
    assert HEADER == 64 and SIDE == 128 and PAGE == 4096


def test_ring_carries_calls_and_its_memfd_is_sealed(daemon: RunningDaemon) -> None:
    client, sock = raw_session(daemon)
    attach(client, sock)
    rawzmtp.send(sock, client.envelope(lib.PILOT_OP_RING_OPEN), b"")
    data, fds, _, _ = socket.recv_fds(sock, 4096, 1)
    assert status(parse(data)) == 0 and len(fds) == 1
    fd = fds[0]
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    for seal in (fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SEAL):
        assert seals & seal
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 4096)  # a client cannot make pilotd's mapping fault
    ring = RingClient(sock, fd)
    err, ptr = malloc_through(ring, client, 1 << 20)
    assert err == 0 and ptr != 0
    # a message larger than the request ring streams through it (pilotd makes room as it reads)
    image = b"\0" * (3 * ring.req_bytes + 12345)
    ring.send(client.envelope(lib.PILOT_OP_MODULE_LOAD),
              body("pilot_req_module_load", image_size=len(image)), image)
    assert status(ring.recv()) != 0  # not a fatbin: refused, with a reply
    err, ptr2 = malloc_through(ring, client, 4096)
    assert err == 0 and ptr2 not in (0, ptr)
    # a second RING_OPEN, now inside the rings, is refused there
    ring.send(client.envelope(lib.PILOT_OP_RING_OPEN), b"")
    assert status(ring.recv()) == NOT_SUPPORTED
    ring.close()
    sock.close()
    client.close()


def test_ring_open_before_attach_is_refused(daemon: RunningDaemon) -> None:
    client, sock = raw_session(daemon)
    rawzmtp.send(sock, client.envelope(lib.PILOT_OP_RING_OPEN), b"")
    assert status(rawzmtp.recv(sock)) == NOT_SUPPORTED
    attach(client, sock)  # still on its socket, still usable
    ring = open_ring(client, sock)
    assert malloc_through(ring, client, 4096)[0] == 0
    ring.close()
    sock.close()
    client.close()


def test_an_impossible_index_closes_only_that_connection(daemon: RunningDaemon) -> None:
    client, sock = raw_session(daemon)
    attach(client, sock)
    ring = open_ring(client, sock)
    ring.set_u64(ring.req_side + HEAD, 10 * ring.req_bytes)  # more than the ring holds
    sock.send(b"d")
    sock.settimeout(5)
    try:  # pilotd closed it: EOF, or a reset when it closed before reading our doorbell
        assert sock.recv(64) == b""
    except ConnectionResetError:
        pass
    ring.close()
    sock.close()
    other = ProtoClient(str(daemon.socket_path))
    other.open()
    assert other.malloc(4096) != 0  # and serves everyone else
    other.close()
    client.close()


def test_a_client_that_stops_reading_is_dropped_not_waited_for(daemon: RunningDaemon) -> None:
    """Replies that do not fit the reply ring are queued (1 MiB at most, as on the socket) while
    pilotd goes on serving others; past the limit the client's connection is closed."""
    client, sock = raw_session(daemon)
    attach(client, sock)
    ring = open_ring(client, sock)
    info = body("pilot_req_device", device=0)
    dropped = False
    for _ in range(1400):  # ~1 KB of reply each: 1.4 MB of replies never read
        try:
            ring.send(client.envelope(lib.PILOT_OP_DEVICE_INFO), info)
        except (BrokenPipeError, ConnectionResetError):
            dropped = True  # the doorbell found the connection closed
            break
    if not dropped:
        sock.settimeout(10)
        while sock.recv(64):  # doorbells, then the end: pilotd dropped the connection
            pass
    other = ProtoClient(str(daemon.socket_path))
    other.open()
    assert other.malloc(4096) != 0
    other.close()
    ring.close()
    sock.close()
    client.close()




def _word_reply(frames: list[bytes]) -> tuple[int, int, int, int]:
    """(envelope flags, err, value, value2) of a reply that may be PILOT_F_WORD_PENDING."""
    env = ffi.new("pilot_envelope *")
    ffi.memmove(env, frames[0], ffi.sizeof(env[0]))
    rep = ffi.new("pilot_rep_u64 *")
    ffi.memmove(rep, frames[1], min(len(frames[1]), ffi.sizeof(rep[0])))
    return int(env.flags), int(rep.hdr.err), int(rep.value), int(rep.value2)


def _word(ring: RingClient) -> int:
    from ringclient import PAGE
    return struct.unpack_from("<I", ring.map, PAGE)[0]


def test_completion_words_of_a_raw_client(daemon: RunningDaemon) -> None:
    """What a client that writes its rings itself meets (shim/transport/pilot_ring.h, "the
    completion word"): a small copy to the host asked with PILOT_F_GPU_WORD is answered pending,
    its bytes in the GPU page once the word reaches the value; a larger one and a flag the client
    sets in a request it should not (WORD_PENDING) change nothing; scribbling on its own page and
    leaving with a word due hurts nobody else."""
    client, sock = raw_session(daemon)
    attach(client, sock)
    ring = open_ring(client, sock)
    err, ptr = malloc_through(ring, client, 8192)
    assert err == 0
    data = bytes(range(256)) * 32
    ring.send(client.envelope(lib.PILOT_OP_MEMCPY_H2D),
              body("pilot_req_memcpy", dst=ptr, count=len(data), sync=1), data)
    assert status(ring.recv()) == 0
    from ringclient import PAGE
    for _ in range(3):
        ring.send(client.envelope(lib.PILOT_OP_MEMCPY_D2H, flags=lib.PILOT_F_GPU_WORD),
                  body("pilot_req_memcpy", src=ptr + 100, count=64, sync=1))
        frames = ring.recv()
        flags, err, target, nbytes = _word_reply(frames)
        assert err == 0
        if flags & lib.PILOT_F_WORD_PENDING:
            assert nbytes == 64 and len(frames) == 2
            for _ in range(1000):
                if (_word(ring) - target) % 2**32 < 2**31:
                    break
                time.sleep(0.001)
            assert (_word(ring) - target) % 2**32 < 2**31
            got = bytes(ring.map[PAGE + 64:PAGE + 128])  # the GPU page's data
        else:  # answered the usual way (the fast path does not know the session yet)
            got = frames[2]
        assert got == data[100:164]
    assert flags & lib.PILOT_F_WORD_PENDING  # by the last round C answers it
    # more than the page's data: the usual reply, bytes inline
    ring.send(client.envelope(lib.PILOT_OP_MEMCPY_D2H, flags=lib.PILOT_F_GPU_WORD),
              body("pilot_req_memcpy", src=ptr, count=4096, sync=1))
    frames = ring.recv()
    assert not _word_reply(frames)[0] & lib.PILOT_F_WORD_PENDING and frames[2] == data[:4096]
    # a client claiming PENDING in its request gets an ordinary answer
    ring.send(client.envelope(lib.PILOT_OP_MEMCPY_D2H, flags=lib.PILOT_F_WORD_PENDING),
              body("pilot_req_memcpy", src=ptr, count=16, sync=1))
    frames = ring.recv()
    assert status(frames) == 0 and frames[2] == data[:16]
    # its own page scribbled on, a synchronization asked with the word, then gone
    ring.map[PAGE:2 * PAGE] = b"\xff" * PAGE
    ring.send(client.envelope(lib.PILOT_OP_DEVICE_SYNCHRONIZE, flags=lib.PILOT_F_GPU_WORD), b"")
    assert status(ring.recv()) == 0
    ring.close()
    sock.close()
    client.close()
    other = ProtoClient(str(daemon.socket_path))
    assert other.hello().hdr.err == 0
    other.close()
