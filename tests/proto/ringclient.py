"""A client end of a vGPU connection's shared-memory rings (shim/transport/pilot_ring.h), in
Python, for tests that must write the rings themselves: what the shim does, and what a hostile
client could do instead. The layout below is pilot_ring.h's; test_ring.py checks it against the
C compiler's through the header's sizes."""

from __future__ import annotations

import mmap
import os
import socket
import struct
import time

from rawzmtp import frame

HEADER = 64          # magic, req_bytes, rep_bytes, padding
SIDE = 128           # struct pilot_ring_side: the producer's cache line, then the consumer's
HEAD, PRODUCER_WAITING, TAIL, CONSUMER_SLEEPING = 0, 8, 64, 72
PAGE = 4096          # the control page, then the GPU page (the completion word), then the data
MAGIC = 0x32676E69522D5450


class RingClient:
    """The rings of one connection, mapped from the memfd pilotd sent with RING_OPEN."""

    def __init__(self, sock: socket.socket, fd: int) -> None:
        self.sock = sock
        size = os.fstat(fd).st_size
        self.map = mmap.mmap(fd, size)
        os.close(fd)
        magic, self.req_bytes, self.rep_bytes = struct.unpack_from("<QII", self.map, 0)
        assert magic == MAGIC
        self.req_side = HEADER
        self.rep_side = HEADER + SIDE
        self.req_data = 2 * PAGE
        self.rep_data = self.req_data + self.req_bytes
        self.head = 0  # our request index
        self.tail = 0  # our reply index
        self.pending = b""

    def u64(self, at: int) -> int:
        return struct.unpack_from("<Q", self.map, at)[0]

    def set_u64(self, at: int, value: int) -> None:
        struct.pack_into("<Q", self.map, at, value)

    def write(self, data: bytes, timeout: float = 5.0) -> None:
        """Puts data into the request ring, waiting for pilotd to make room; rings the doorbell
        after every piece (pilotd may sleep)."""
        deadline = time.monotonic() + timeout
        while data:
            room = self.req_bytes - (self.head - self.u64(self.req_side + TAIL))
            if room == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("pilotd took nothing from the request ring")
                time.sleep(0.0005)
                continue
            piece, data = data[:room], data[room:]
            at = self.head % self.req_bytes
            first = min(len(piece), self.req_bytes - at)
            self.map[self.req_data + at:self.req_data + at + first] = piece[:first]
            rest = piece[first:]
            self.map[self.req_data:self.req_data + len(rest)] = rest
            self.head += len(piece)
            self.set_u64(self.req_side + HEAD, self.head)
            self.sock.send(b"d")

    def send(self, *parts: bytes) -> None:
        self.write(b"".join(frame(p, more=i < len(parts) - 1) for i, p in enumerate(parts)))

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self.pending) < n:
            avail = self.u64(self.rep_side + HEAD) - self.tail
            if avail == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("no reply in the reply ring")
                time.sleep(0.0005)
                continue
            at = self.tail % self.rep_bytes
            first = min(avail, self.rep_bytes - at)
            self.pending += self.map[self.rep_data + at:self.rep_data + at + first]
            self.tail += first
            self.set_u64(self.rep_side + TAIL, self.tail)
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def recv(self, timeout: float = 5.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        parts: list[bytes] = []
        while True:
            flags = self._take(1, deadline)[0]
            size = (int.from_bytes(self._take(8, deadline), "big") if flags & 0x02
                    else self._take(1, deadline)[0])
            parts.append(self._take(size, deadline))
            if not flags & 0x01:
                return parts

    def close(self) -> None:
        self.map.close()
