"""Pinned host memory in raw protocol (daemon/pinned.py): HOST_REGISTER's checks on the client's
memfd, copies between pinned and device memory, tenant isolation, the pinned-memory limit, and
what the end of a session frees."""

from __future__ import annotations

import glob
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from client import ProtoClient, body
from proto_daemon import start_daemon, stop_daemon

from pilot.daemon.protocol import ffi, lib

INVALID_VALUE, MEMORY_ALLOCATION, ALREADY_REGISTERED = 1, 2, 712
PAGE = mmap.PAGESIZE


def _client(daemon) -> ProtoClient:
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    return c


def _register(c: ProtoClient, fd: int, length: int, address: int = 0, size: int | None = None,
              kind: int = lib.PILOT_HOST_ALLOC, flags: int = 0):
    req = body("pilot_req_host_register", address=address, length=length, offset=0,
               size=length if size is None else size, fd=fd, flags=flags, kind=kind)
    return c.call(lib.PILOT_OP_HOST_REGISTER, req, rep_type="pilot_rep_u64")


def _memfd(length: int) -> int:
    fd = os.memfd_create("pilot-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, length)
    return fd


def _copy(c: ProtoClient, dst: int, src: int, count: int, kind: int) -> int:
    req = body("pilot_req_memcpy_pinned", dst=dst, src=src, count=count, stream=0, kind=kind, sync=1)
    return c.call(lib.PILOT_OP_MEMCPY_PINNED, req).err


def _read_device(c: ProtoClient, ptr: int, count: int) -> bytes:
    req = body("pilot_req_memcpy", dst=0, src=ptr, count=count, stream=0, slot=0, sync=1)
    assert c.call(lib.PILOT_OP_MEMCPY_D2H, req).err == 0
    return c.last_payload


def test_copies_between_pinned_and_device_memory(daemon):
    c = _client(daemon)
    fd = _memfd(2 * PAGE)
    rep = _register(c, fd, 2 * PAGE)
    assert rep.hdr.err == 0
    base = rep.value2  # an allocation is known by its device pointer
    view = mmap.mmap(fd, 2 * PAGE)
    os.close(fd)
    view[:PAGE] = bytes(range(256)) * (PAGE // 256)
    dev = c.malloc(2 * PAGE)
    assert _copy(c, dev, base, PAGE, lib.PILOT_COPY_H2D) == 0
    assert _read_device(c, dev, PAGE) == bytes(view[:PAGE])
    assert _copy(c, base + PAGE, dev, PAGE, lib.PILOT_COPY_D2H) == 0
    assert view[PAGE:] == view[:PAGE]
    # outside the range, or device memory the session does not have
    assert _copy(c, dev, base + PAGE, PAGE + 1, lib.PILOT_COPY_H2D) == INVALID_VALUE
    assert _copy(c, dev + 2 * PAGE, base, 16, lib.PILOT_COPY_H2D) == INVALID_VALUE
    assert _copy(c, dev, base, 16, lib.PILOT_COPY_D2D) == 21  # cudaErrorInvalidMemcpyDirection
    free = body("pilot_req_free", ptr=base)
    assert c.call(lib.PILOT_OP_HOST_UNREGISTER, free).err == 0
    assert c.call(lib.PILOT_OP_HOST_UNREGISTER, free).err == INVALID_VALUE
    assert _copy(c, dev, base, 16, lib.PILOT_COPY_H2D) == INVALID_VALUE
    view.close()
    c.close()


def test_the_fd_must_be_the_clients_own_shared_memory(daemon):
    c = _client(daemon)
    assert _register(c, -1, PAGE).hdr.err == INVALID_VALUE
    assert _register(c, 987654, PAGE).hdr.err == INVALID_VALUE  # not open in the client
    r, w = os.pipe()
    assert _register(c, r, PAGE).hdr.err == INVALID_VALUE  # not a regular file
    os.close(r)
    os.close(w)
    small = _memfd(PAGE)
    assert _register(c, small, 2 * PAGE).hdr.err == INVALID_VALUE  # shorter than asked
    assert _register(c, small, PAGE + 1).hdr.err == INVALID_VALUE  # not whole pages
    assert _register(c, small, PAGE, flags=0x80).hdr.err == INVALID_VALUE  # unknown flags
    os.close(small)
    if not _on_tmpfs(Path(__file__)):  # a file on disk: not shared memory
        path = Path(__file__).with_name(".pinned-test-file")
        path.write_bytes(b"\0" * PAGE)
        try:
            fd = os.open(path, os.O_RDWR)
            assert _register(c, fd, PAGE).hdr.err == INVALID_VALUE
            os.close(fd)
        finally:
            path.unlink()
    c.close()


def _on_tmpfs(path: Path) -> bool:
    best = ""
    fstype = ""
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if str(path).startswith(fields[1]) and len(fields[1]) > len(best):
                best, fstype = fields[1], fields[2]
    return fstype == "tmpfs"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a memfd to another uid")
def test_a_memfd_of_another_uid_is_refused(daemon):
    c = _client(daemon)
    fd = _memfd(PAGE)
    os.fchown(fd, 4242, 4242)
    assert _register(c, fd, PAGE).hdr.err == INVALID_VALUE
    os.close(fd)
    c.close()


HOLDER = """
import mmap, os, sys, time
sys.path.insert(0, {tests!r})
from client import ProtoClient, body
from pilot.daemon.protocol import lib
c = ProtoClient({sock!r}); c.open()
fd = os.memfd_create("holder"); os.ftruncate(fd, {length})
req = body("pilot_req_host_register", address=0, length={length}, offset=0, size={length}, fd=fd,
           flags=0, kind=lib.PILOT_HOST_ALLOC)
rep = c.call(lib.PILOT_OP_HOST_REGISTER, req, rep_type="pilot_rep_u64")
print(rep.hdr.err, rep.value2, flush=True)
time.sleep(60)
"""


def _holder(socket_path: Path, length: int) -> tuple[subprocess.Popen[str], int, int]:
    """Another process (so another session) holding `length` pinned bytes: (process, err, base)."""
    script = HOLDER.format(tests=str(Path(__file__).parent), sock=str(socket_path), length=length)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    err, base = proc.stdout.readline().split()
    return proc, int(err), int(base)


def test_sessions_cannot_use_each_others_pinned_memory(daemon):
    holder, err, base = _holder(daemon.socket_path, PAGE)
    try:
        assert err == 0
        c = _client(daemon)
        dev = c.malloc(PAGE)
        assert _copy(c, dev, base, 64, lib.PILOT_COPY_H2D) == INVALID_VALUE
        assert _copy(c, base, dev, 64, lib.PILOT_COPY_D2H) == INVALID_VALUE
        free = body("pilot_req_free", ptr=base)
        assert c.call(lib.PILOT_OP_HOST_UNREGISTER, free).err == INVALID_VALUE
        c.close()
    finally:
        holder.kill()
        holder.wait()


def test_registered_ranges_do_not_overlap(daemon):
    c = _client(daemon)
    fd = _memfd(2 * PAGE)
    at = 0x3F00_0000_0000  # an address the client names for its own pages
    kind = lib.PILOT_HOST_REGISTERED
    assert _register(c, fd, 2 * PAGE, address=at, kind=kind).hdr.err == 0
    assert _register(c, fd, PAGE, address=at + PAGE, kind=kind).hdr.err == ALREADY_REGISTERED
    assert _register(c, fd, PAGE, address=0, kind=kind).hdr.err == INVALID_VALUE  # must name it
    os.close(fd)
    c.close()



@pytest.mark.parametrize("key", ["limit", "limit_per_tenant"])
def test_the_limit_and_a_dying_client_giving_its_pinned_memory_back(daemon_with, tmp_path, key):
    """`[pinned] limit` (every tenant) and `limit_per_tenant` cap pinned bytes; a refusal names
    the path; a client killed while holding them gives them back (the next one can pin as much
    again)."""
    config = tmp_path / "pilotd.toml"
    fraction = "tenant_fraction = 1.0\n" if key == "limit" else ""  # the tenant may take it all
    config.write_text(f"[pinned]\n{key} = \"{4 * PAGE}B\"\n{fraction}")
    d = daemon_with("--config", str(config))
    holder, err, _base = _holder(d.socket_path, 4 * PAGE)
    try:
        assert err == 0
        c = _client(d)
        fd = _memfd(PAGE)
        assert _register(c, fd, PAGE).hdr.err == MEMORY_ALLOCATION  # the holder has it all
        assert "pinned refused" in d.log()
        assert ("quota:" if key == "limit_per_tenant" else "capacity:") in d.log()
        holder.kill()
        holder.wait(10)
        deadline = time.monotonic() + 10
        while "released" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        rep = _register(c, fd, PAGE)
        assert rep.hdr.err == 0
        os.close(fd)
        c.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()



def test_one_tenant_cannot_take_every_tenants_pinned_memory(daemon_with, tmp_path):
    """Issue 27 (7): by default a tenant may pin a fraction of the daemon-wide limit (a quarter),
    not all of it, so that the others' cudaMallocHost still succeeds."""
    config = tmp_path / "pilotd.toml"
    config.write_text(f"[pinned]\nlimit = \"{8 * PAGE}B\"\n")
    d = daemon_with("--config", str(config))
    c = _client(d)
    fd = _memfd(4 * PAGE)
    assert _register(c, fd, 4 * PAGE).hdr.err == MEMORY_ALLOCATION  # half the pool: refused
    assert "quota:" in d.log()
    assert _register(c, fd, 2 * PAGE).hdr.err == 0  # its quarter
    os.close(fd)
    c.close()


def _staging_open(c: ProtoClient) -> int:
    return int(c.call(lib.PILOT_OP_STAGING_OPEN, body("pilot_req_staging_open", fault=0)).err)


def test_staging_areas_are_charged_to_the_tenant_and_given_back(daemon_with, tmp_path):
    """Issue 27 (2): a session's staging area (16 MiB of pinned shared memory) is charged to its
    tenant's pinned limit, and given back when the session ends."""
    config = tmp_path / "pilotd.toml"
    config.write_text('[pinned]\nlimit_per_tenant = "20MiB"\n')
    d = daemon_with("--config", str(config))
    first = _client(d)
    assert _staging_open(first) == 0
    # a second session of the same tenant would hold 32 MiB: refused
    holder = subprocess.Popen([sys.executable, "-c", STAGING_OPENER.format(
        tests=str(Path(__file__).parent), sock=str(d.socket_path))], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert int(holder.stdout.readline()) == MEMORY_ALLOCATION
    holder.wait(10)
    assert "-byte staging refused" in d.log()
    # a HELLO again from this pid ends the first session (an exec): its area is given back
    second = _client(d)
    assert _staging_open(second) == 0
    first.close()
    second.close()


STAGING_OPENER = """
import sys
sys.path.insert(0, {tests!r})
from client import ProtoClient, body
from pilot.daemon.protocol import lib
c = ProtoClient({sock!r})
c.open()
print(int(c.call(lib.PILOT_OP_STAGING_OPEN, body("pilot_req_staging_open", fault=0)).err), flush=True)
"""


def _spares_of(d) -> list[str]:
    return glob.glob(f"/dev/shm/pilot-{d.proc.pid}-spare-*")


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _open_area(c: ProtoClient, fault: int) -> tuple[int, str, int]:
    rep = c.call(lib.PILOT_OP_STAGING_OPEN, body("pilot_req_staging_open", fault=fault),
                 rep_type="pilot_rep_staging")
    return int(rep.hdr.err), ffi.string(rep.path).decode(), int(rep.slots)


def test_sessions_get_staging_areas_pinned_ahead(daemon):
    """Issue 28 (2): pilotd pins one staging area of each size before any session asks, hands
    it to the first session that does (for good: never to another) and pins its replacement;
    the area is unwritten (zeros) and pilotd's alone to hand out (0600)."""
    assert _wait_for(lambda: len(_spares_of(daemon)) == 2), _spares_of(daemon)
    c = _client(daemon)
    taken = []
    for fault, slots in ((0, 8), (1, 1)):
        err, path, got_slots = _open_area(c, fault)
        assert (err, got_slots) == (0, slots)
        assert "-spare-" in path
        assert os.stat(path).st_mode & 0o777 == 0o600
        with open(path, "rb") as f:
            assert f.read(1 << 20).count(0) == 1 << 20
        taken.append(path)
    # both were replaced, by new files: what one session holds is never handed to another
    assert _wait_for(lambda: len(set(_spares_of(daemon)) - set(taken)) == 2), _spares_of(daemon)
    second = _client(daemon)
    err, path, _ = _open_area(second, 0)
    assert err == 0 and path not in taken
    c.close()
    second.close()


def test_no_spares_when_switched_off_and_none_left_behind(daemon_with, tmp_path):
    config = tmp_path / "spares.toml"
    config.write_text("[daemon]\nstaging_spares = 0\n")
    d = daemon_with("--config", str(config))
    c = _client(d)
    err, path, _ = _open_area(c, 0)
    assert err == 0 and "-spare-" not in path
    assert _spares_of(d) == []
    c.close()


def test_spares_are_removed_when_pilotd_stops(tmp_path):
    d = start_daemon(tmp_path)
    try:
        assert _wait_for(lambda: len(_spares_of(d)) == 2)
    finally:
        pid = d.proc.pid
        stop_daemon(d)
    assert glob.glob(f"/dev/shm/pilot-{pid}-spare-*") == []
