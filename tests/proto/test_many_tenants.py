"""64 tenants at once on the sim (issue 25): each a process of its own with mixed calls (memory,
copies, posted memsets on a stream of its own, a graph pilotd instantiates and launches, device
synchronizations), every result checked; pilotd's thread count does not grow with the calls made
and its memory stays bounded, and every session is released when its process ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from proto_daemon import start_daemon, stop_daemon

HERE = Path(__file__).parent
TENANTS = 64

_WORKER = """
import struct, sys
from client import ProtoClient, body
from pilot.daemon.protocol import lib

def record(op, req):
    pad = -len(req) % 8
    return struct.pack("<HHIII", op, 0, len(req), 0, 0) + req + b"\\0" * pad

c = ProtoClient(sys.argv[1])
c.open()
calls = errors = 0
for r in range(int(sys.argv[2])):
    ptr = c.malloc(65536)
    st = c.call(lib.PILOT_OP_STREAM_CREATE, body("pilot_req_stream_create", flags=1),
                rep_type="pilot_rep_u64").value
    data = bytes([(r * 7 + i) % 251 for i in range(256)]) * 16
    errors += c.call(lib.PILOT_OP_MEMCPY_H2D, body("pilot_req_memcpy", dst=ptr, count=4096), data).err != 0
    c.send(lib.PILOT_OP_MEMSET, body("pilot_req_memset", ptr=ptr + 4096, value=r + 1, count=4096,
                                     stream=st), flags=lib.PILOT_F_NO_REPLY)
    recs = [record(lib.PILOT_OP_MEMSET, body("pilot_req_memset", ptr=ptr + 8192 + 512 * k,
                                             value=k + 3, count=512, stream=st)) for k in range(4)]
    exec_ = 0x100 + r
    rep = c.call(lib.PILOT_OP_GRAPH_INSTANTIATE, body("pilot_req_graph", exec=exec_, stream=st,
                 count=len(recs)), b"".join(recs), rep_type="pilot_rep_graph")
    errors += rep.hdr.err != 0 or rep.replay != 0
    c.send(lib.PILOT_OP_GRAPH_LAUNCH, body("pilot_req_graph", exec=exec_, stream=0),
           flags=lib.PILOT_F_NO_REPLY)
    hdr = c.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"")
    errors += hdr.err != 0 or hdr.deferred != 0
    hdr = c.call(lib.PILOT_OP_MEMCPY_D2H, body("pilot_req_memcpy", src=ptr, count=10240))
    want = data + bytes([r + 1]) * 4096 + b"".join(bytes([k + 3]) * 512 for k in range(4))
    errors += hdr.err != 0 or c.last_payload != want
    c.send(lib.PILOT_OP_GRAPH_DESTROY, body("pilot_req_graph", exec=exec_), flags=lib.PILOT_F_NO_REPLY)
    errors += c.call(lib.PILOT_OP_STREAM_DESTROY, body("pilot_req_handle", handle=st)).err != 0
    errors += c.call(lib.PILOT_OP_FREE, body("pilot_req_free", ptr=ptr)).err != 0
    calls += 11
print(calls, errors, flush=True)
"""


def _status(pid: int) -> tuple[int, int]:
    """(threads, RSS in KiB) of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def _wave(sock: str, rounds: int) -> list[tuple[int, int]]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # all at once: connections closing and opening together reuse descriptor numbers before
    # the router has read their events (router/admission.py), which must refuse no one
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, sock, str(rounds)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(TENANTS)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0 and stdout.split(), stderr[-2000:]
        out.append(tuple(map(int, stdout.split())))
    return out


def _sessions_gone(d, sessions: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        log = d.log()
        if log.count(") released") >= sessions:
            return
        time.sleep(0.2)
    raise AssertionError(f"sessions not released; log tail:\n{d.log()[-3000:]}")


def test_64_tenants_of_mixed_calls_lose_nothing_and_grow_nothing(tmp_path: Path) -> None:
    # vGPU threads are started as sessions come, up to max_vgpus_per_gpu: 64 sessions reach it
    (tmp_path / "pilotd.toml").write_text("[daemon]\nmax_vgpus_per_gpu = 8\n"
                                          "[limits]\nsessions_per_uid = 256\n")
    d = start_daemon(tmp_path, "--config", str(tmp_path / "pilotd.toml"))
    try:
        sock = str(d.socket_path)
        threads0, _ = _status(d.proc.pid)
        first = _wave(sock, 2)  # warms every code path and table, and places 64 sessions
        _sessions_gone(d, TENANTS)
        threads1, rss1 = _status(d.proc.pid)
        second = _wave(sock, 12)  # six times the calls
        _sessions_gone(d, 2 * TENANTS)
        threads2, rss2 = _status(d.proc.pid)
        assert d.alive()
        for calls, errors in (*first, *second):
            assert errors == 0 and calls > 0, (first, second)
        # vGPU threads come with sessions, up to the bound (2 at start, 8 at most), never with calls
        assert threads2 == threads1 <= threads0 + 6, (threads0, threads1, threads2)
        # pilotd's heap after six times the calls: within 32 MiB of after the warm-up wave
        assert rss2 - rss1 < 32 << 10, (rss1, rss2)
        print(f"\n{TENANTS} tenants: {sum(c for c, _ in first + second)} calls, pilotd threads "
              f"{threads0} -> {threads1} -> {threads2}, RSS {rss1 // 1024} -> {rss2 // 1024} MiB")
    finally:
        stop_daemon(d)
