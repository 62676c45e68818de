"""Unified-memory shadow traffic in raw protocol: flushes and fetches move bytes only through the
session's staging slots, only inside the session's own shadows of its own managed memory."""

from __future__ import annotations

import mmap
import os

from client import ProtoClient, body
from test_protocol import start_peer

from pilot.daemon.protocol import ffi, lib

INVALID_VALUE = 1
MIB = 1 << 20


def _managed(c: ProtoClient, size: int) -> int:
    rep = c.call(lib.PILOT_OP_MALLOC_MANAGED,
                 body("pilot_req_malloc_managed", size=size, flags=lib.PILOT_MANAGED_ATTACH_GLOBAL),
                 rep_type="pilot_rep_u64")
    assert rep.hdr.err == 0
    return int(rep.value)


def _attach(c: ProtoClient, base: int, length: int) -> int:
    return c.call(lib.PILOT_OP_SHADOW_ATTACH,
                  body("pilot_req_shadow_attach", base=base, length=length, chunk=2 * MIB)).err


def _staging(c: ProtoClient, fault: int) -> mmap.mmap:
    rep = c.call(lib.PILOT_OP_STAGING_OPEN, body("pilot_req_staging_open", fault=fault),
                 rep_type="pilot_rep_staging")
    assert rep.hdr.err == 0
    path = ffi.string(rep.path).decode()
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, rep.slot_bytes * rep.slots)
    finally:
        os.close(fd)
        os.unlink(path)


def _copy(c: ProtoClient, op: int, address: int, count: int, slot: int = 0) -> int:
    field = "dst" if op == lib.PILOT_OP_SHADOW_FLUSH else "src"
    return c.call(op, body("pilot_req_memcpy", count=count, slot=slot, sync=1, **{field: address})).err


def test_flush_then_fetch_round_trips_through_the_staging_slots(daemon):
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    ptr = _managed(c, 3 * MIB)
    assert _attach(c, ptr, 3 * MIB) == 0
    upload = _staging(c, fault=0)
    upload[:4096] = bytes(range(256)) * 16
    assert _copy(c, lib.PILOT_OP_SHADOW_FLUSH, ptr + MIB, 4096) == 0
    # A fetch needs the fault channel's own area; then it brings back what was flushed.
    assert _copy(c, lib.PILOT_OP_SHADOW_FETCH, ptr + MIB, 4096) == INVALID_VALUE
    fetched = _staging(c, fault=1)
    assert _copy(c, lib.PILOT_OP_SHADOW_FETCH, ptr + MIB, 4096) == 0
    assert fetched[:4096] == bytes(range(256)) * 16
    # Fresh managed memory reads as zero; the fault area has one slot.
    assert _copy(c, lib.PILOT_OP_SHADOW_FETCH, ptr, 4096) == 0
    assert fetched[:4096] == bytes(4096)
    assert _copy(c, lib.PILOT_OP_SHADOW_FETCH, ptr, 4096, slot=1) == INVALID_VALUE
    c.close()


def test_shadow_traffic_stays_inside_the_sessions_shadows(daemon):
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    ptr = _managed(c, 2 * MIB)
    device = c.malloc(MIB)
    _staging(c, fault=0)
    _staging(c, fault=1)
    # No shadow yet, a range running past the shadow, device memory that is not managed.
    assert _copy(c, lib.PILOT_OP_SHADOW_FLUSH, ptr, 4096) == INVALID_VALUE
    assert _attach(c, ptr, 2 * MIB) == 0
    assert _attach(c, ptr, 2 * MIB) == INVALID_VALUE  # covered already
    assert _copy(c, lib.PILOT_OP_SHADOW_FLUSH, ptr + 2 * MIB - 100, 4096) == INVALID_VALUE
    assert _attach(c, device, MIB) == INVALID_VALUE
    # Another tenant's shadowed managed memory: no shadow of ours over it, no bytes in or out.
    peer, _, theirs, _ = start_peer(daemon, "managed")
    try:
        assert _attach(c, theirs, 2 * MIB) == INVALID_VALUE
        assert _copy(c, lib.PILOT_OP_SHADOW_FLUSH, theirs, 4096) == INVALID_VALUE
        assert _copy(c, lib.PILOT_OP_SHADOW_FETCH, theirs, 4096) == INVALID_VALUE
        assert daemon.alive()
        c.close()
    finally:
        peer.communicate("\n", timeout=10)
