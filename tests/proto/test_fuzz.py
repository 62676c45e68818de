"""Fuzzing pilotd's endpoints (issue 12): random calls of every opcode with random bodies and
payloads from an attached session, random frames to the main and control sockets and to a vGPU
endpoint before ATTACH. pilotd must answer each call that wants an answer, stay up, serve the
next program, and turn every bad input into a CUDA error, never an unhandled exception; a
well-behaved tenant allocating beside the fuzzing is never stalled (slowest call under 1 s).

Deterministic: the seed is PILOT_FUZZ_SEED (default fixed). A longer soak: PILOT_FUZZ_ROUNDS
(default 600 calls; e.g. 50000).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import zmq
from client import ProtoClient

from pilot.daemon.ops import handler_table
from pilot.daemon.protocol import ffi, lib

SEED = int(os.environ.get("PILOT_FUZZ_SEED", "20261123"))
ROUNDS = int(os.environ.get("PILOT_FUZZ_ROUNDS", "600"))
HERE = Path(__file__).parent
# Calls that end or re-make the session, or wait for a client that does not exist here; and
# RING_OPEN, which moves the connection into shared-memory rings (tests/proto/test_ring.py)
SKIP = {lib.PILOT_OP_BYE, lib.PILOT_OP_ATTACH, lib.PILOT_OP_DEVICE_RESET,
        lib.PILOT_OP_STREAM_CALLBACK, lib.PILOT_OP_RING_OPEN}


def _body(rng: random.Random, size: int, pointers: list[int]) -> bytes:
    """Random bytes, sometimes with words that are real pointers of the session (so a call gets
    past the first checks), zeros or sizes at the edges."""
    b = bytearray(rng.getrandbits(8) for _ in range(size))
    for at in range(0, size - 7, 8):
        r = rng.random()
        if r < 0.3 and pointers:
            word = rng.choice(pointers) + rng.choice((0, 0, 1, 8, 4095))
        elif r < 0.45:
            word = rng.choice((0, 1, 4096, (1 << 32) - 1, (1 << 63) - 1, (1 << 64) - 1))
        else:
            continue
        b[at:at + 8] = word.to_bytes(8, "little")
    return bytes(b)


def _tracebacks(daemon) -> list[str]:
    return [ln for ln in daemon.log_path.read_text(errors="replace").splitlines()
            if "Traceback" in ln or (" failed" in ln and "exc=" in ln)]


def test_random_calls_from_an_attached_session(daemon):
    rng = random.Random(SEED)
    table = {op: spec for op, spec in handler_table().items() if op not in SKIP}
    ops = sorted(table)
    probe = subprocess.Popen([sys.executable, str(HERE / "latency_probe.py"), str(daemon.socket_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    pointers = [c.malloc(4096), c.malloc(1 << 20)]
    for i in range(ROUNDS):
        op = rng.choice(ops)
        size = ffi.sizeof(table[op].request) if table[op].request else 0
        size = max(0, size + rng.choice((0, 0, 0, 0, -1, 8, -size)))
        payload = _body(rng, rng.choice((0, 0, 8, 100, 5000)), pointers) if rng.random() < 0.4 else None
        flags = lib.PILOT_F_NO_REPLY if rng.random() < 0.15 else 0
        c.send(op, _body(rng, size, pointers), payload, flags=flags)
        if not flags:
            try:
                frames = c.recv(c.vgpu)
            except TimeoutError:
                raise AssertionError(f"call {i}: no answer to opcode {op} (seed {SEED})") from None
            assert len(frames) >= 2, (i, op, frames)
    out, _ = probe.communicate("stop\n", timeout=30)  # the tenant that ran beside the fuzzing
    calls, slowest = out.split()
    assert int(calls) > 0 and float(slowest) < 1.0, out  # served all along, never stalled
    assert daemon.alive()
    assert c.malloc(256) != 0  # the session itself still works
    assert _tracebacks(daemon) == []
    c.close()
    _another_program_is_served(daemon)


def test_random_frames_on_every_socket(daemon):
    rng = random.Random(SEED + 1)
    ctx = zmq.Context()
    try:
        for path in (str(daemon.socket_path), str(daemon.socket_path.parent / "control.sock")):
            for _ in range(ROUNDS // 6):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(f"ipc://{path}")
                s.send_multipart([bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 1, 24, 40, 300))))
                                  for _ in range(rng.randint(1, 5))])
                s.poll(20)
                s.close()
        c = ProtoClient(str(daemon.socket_path))
        c.open()
        endpoint = c.vgpu.getsockopt_string(zmq.LAST_ENDPOINT).removeprefix("ipc://")
        for _ in range(ROUNDS // 6):  # raw bytes to the vGPU endpoint, with or without a greeting
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(endpoint)
            junk = bytes(rng.getrandbits(8) for _ in range(rng.choice((1, 10, 64, 200, 70000))))
            if rng.random() < 0.5:
                greeting = (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
                            + b"\0" * 32)
                ready = b"\x05READY"
                junk = greeting + bytes([0x04, len(ready)]) + ready + junk
            try:
                s.sendall(junk)
            except OSError:
                pass
            s.close()
        assert daemon.alive()
        assert c.malloc(256) != 0
        c.close()
    finally:
        ctx.destroy(0)
    assert _tracebacks(daemon) == []
    _another_program_is_served(daemon)


def _another_program_is_served(daemon) -> None:
    started = time.monotonic()
    peer = subprocess.run([sys.executable, str(HERE / "peer.py"), str(daemon.socket_path)], input="\n",
                          capture_output=True, text=True, timeout=30, cwd=HERE)
    assert peer.returncode == 0 and int(peer.stdout.split()[1]) != 0, peer.stderr
    assert time.monotonic() - started < 10
