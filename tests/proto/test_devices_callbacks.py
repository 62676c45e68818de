"""Sessions across devices and host-callback gates, spoken to in raw protocol: DEVICE_JOIN, the
callback socket (CALLBACK_ATTACH / RUN / DONE), and what ending a session does to its gates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import zmq
from client import ProtoClient, body

from pilot.daemon.protocol import ffi, lib, new, to_bytes

HERE = Path(__file__).parent

INITIALIZATION, INVALID_DEVICE, NOT_READY = 3, 101, 600
SHIFT = lib.PILOT_HANDLE_DEVICE_SHIFT


def _open(c: ProtoClient) -> tuple[bytes, bytes]:
    """Like ProtoClient.open, also returning the HELLO reply's endpoint and callback socket."""
    rep = c.hello()
    assert rep.hdr.err == 0
    c.session = rep.session
    endpoint, callbacks = ffi.string(rep.endpoint), ffi.string(rep.callbacks)
    c.vgpu = c._connect(endpoint.decode())
    assert c.call(lib.PILOT_OP_ATTACH, b"").err == 0
    return endpoint, callbacks


def _join(c: ProtoClient, device: int) -> object:
    c.main.send_multipart([c.envelope(lib.PILOT_OP_DEVICE_JOIN), body("pilot_req_device", device=device)])
    rep = ffi.new("pilot_rep_hello *")
    ffi.memmove(rep, c.recv(c.main)[1], ffi.sizeof("pilot_rep_hello"))
    return rep


def _on(c: ProtoClient, sock: zmq.Socket, op: int, req: bytes, rep_type: str = "pilot_rep_status"):
    """One call on another of the client's sockets (a device part's connection)."""
    sock.send_multipart([c.envelope(op), req])
    frames = c.recv(sock)
    rep = ffi.new(rep_type + " *")
    ffi.memmove(rep, frames[1], min(len(frames[1]), ffi.sizeof(rep[0])))
    return rep


def test_a_session_spans_two_gpus(daemon_with):
    daemon = daemon_with("--sim-devices", "2")
    c = ProtoClient(str(daemon.socket_path))
    _open(c)
    info = c.call(lib.PILOT_OP_DEVICE_INFO, body("pilot_req_device", device=1),
                  rep_type="pilot_rep_device_info")
    assert (info.hdr.err, info.device_count, info.peer_mask) == (0, 2, 0b1)
    assert c.call(lib.PILOT_OP_DEVICE_INFO, body("pilot_req_device", device=2),
                  rep_type="pilot_rep_device_info").hdr.err == INVALID_DEVICE

    rep = _join(c, 1)
    assert rep.hdr.err == 0 and rep.device == 1
    part = c._connect(ffi.string(rep.endpoint).decode())
    assert _on(c, part, lib.PILOT_OP_ATTACH, b"").hdr.err == 0
    stream = _on(c, part, lib.PILOT_OP_STREAM_CREATE, body("pilot_req_stream_create"), "pilot_rep_u64")
    assert stream.hdr.err == 0 and stream.value >> SHIFT == 1  # the handle names its device
    ptr1 = _on(c, part, lib.PILOT_OP_MALLOC, body("pilot_req_malloc", size=4096), "pilot_rep_u64").value
    ptr0 = c.malloc(4096)

    # A peer copy from device 1's memory into device 0's, issued on device 0's part.
    assert _on(c, part, lib.PILOT_OP_MEMSET, body("pilot_req_memset", ptr=ptr1, count=4096,
                                                  value=0x5A, sync=1)).hdr.err == 0
    assert c.call(lib.PILOT_OP_MEMCPY_PEER, body("pilot_req_memcpy_peer", dst=ptr0, src=ptr1, count=4096,
                                                 dst_device=0, src_device=1, sync=1)).err == 0
    assert c.call(lib.PILOT_OP_MEMCPY_D2H, body("pilot_req_memcpy", src=ptr0, count=16, sync=1)).err == 0
    assert c.last_payload == b"\x5a" * 16
    # Memory named on the wrong device is refused.
    assert c.call(lib.PILOT_OP_MEMCPY_PEER, body("pilot_req_memcpy_peer", dst=ptr0, src=ptr1, count=16,
                                                 dst_device=1, src_device=1, sync=1)).err == 1

    # One part per device: a second join is refused, and so is a device the daemon lacks.
    assert _join(c, 1).hdr.err == INVALID_DEVICE
    assert _join(c, 5).hdr.err == INVALID_DEVICE
    out = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "sessions", "--json"],
                         capture_output=True, text=True, check=True)
    [row] = [r for r in json.loads(out.stdout) if r["session"] == c.session]
    assert row["gpus"] == [0, 1] and row["device_bytes"] == 8192 and row["pid"] == os.getpid()
    c.close()


def _callback_client(daemon) -> tuple[ProtoClient, zmq.Socket]:
    c = ProtoClient(str(daemon.socket_path))
    _, callbacks = _open(c)
    cb = c._connect(callbacks.decode())
    cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_ATTACH), b""])
    assert int.from_bytes(c.recv(cb)[1][:4], "little") == 0
    return c, cb


def _stream_and_event(c: ProtoClient) -> tuple[int, int]:
    stream = c.call(lib.PILOT_OP_STREAM_CREATE, body("pilot_req_stream_create", flags=1),
                    rep_type="pilot_rep_u64").value
    event = c.call(lib.PILOT_OP_EVENT_CREATE, body("pilot_req_event_create", flags=2),
                   rep_type="pilot_rep_u64").value
    return stream, event


def _arm(c: ProtoClient, stream: int, ident: int) -> int:
    return c.call(lib.PILOT_OP_STREAM_CALLBACK, body("pilot_req_stream_callback", stream=stream, id=ident,
                                                     kind=lib.PILOT_CALLBACK_HOST_FUNC)).err


def _run_message(c: ProtoClient, cb: zmq.Socket) -> object:
    frames = c.recv(cb)
    env = ffi.new("pilot_envelope *")
    ffi.memmove(env, frames[0], ffi.sizeof(env[0]))
    assert env.opcode == lib.PILOT_OP_CALLBACK_RUN
    msg = ffi.new("pilot_msg_callback *")
    ffi.memmove(msg, frames[1], ffi.sizeof(msg[0]))
    return msg


def test_a_gate_holds_its_stream_until_the_callback_is_done(daemon):
    c, cb = _callback_client(daemon)
    stream, event = _stream_and_event(c)
    assert _arm(c, stream, 7) == 0
    run = _run_message(c, cb)  # the stream reached the callback
    assert (run.id, run.status, run.flags) == (7, 0, 0)
    c.send(lib.PILOT_OP_EVENT_RECORD, body("pilot_req_event_record", event=event, stream=stream),
           flags=lib.PILOT_F_NO_REPLY)
    query = body("pilot_req_handle", handle=event)
    assert c.call(lib.PILOT_OP_EVENT_QUERY, query).err == NOT_READY
    assert c.call(lib.PILOT_OP_STREAM_QUERY, body("pilot_req_handle", handle=stream)).err == NOT_READY
    assert c.call(lib.PILOT_OP_DEVICE_QUERY, b"").err == NOT_READY
    done = new("pilot_msg_callback")
    done.id = 7
    cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_DONE, flags=lib.PILOT_F_NO_REPLY), to_bytes(done)])
    assert c.call(lib.PILOT_OP_STREAM_SYNCHRONIZE, body("pilot_req_handle", handle=stream)).err == 0
    assert c.call(lib.PILOT_OP_EVENT_QUERY, query).err == 0
    assert c.call(lib.PILOT_OP_DEVICE_QUERY, b"").err == 0
    c.close()


def _attach_callbacks(c: ProtoClient, path: bytes, session: int) -> tuple[int, zmq.Socket]:
    cb = c._connect(path.decode())
    cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_ATTACH, session=session), b""])
    return int.from_bytes(c.recv(cb)[1][:4], "little"), cb


def test_one_callback_connection_per_session(daemon):
    c = ProtoClient(str(daemon.socket_path))
    _, callbacks = _open(c)
    stream, _ = _stream_and_event(c)
    assert _arm(c, stream, 1) == INITIALIZATION  # no callback connection yet
    assert _attach_callbacks(c, callbacks, c.session + 1000)[0] == INITIALIZATION  # no such session
    err, cb = _attach_callbacks(c, callbacks, c.session)
    assert err == 0
    assert _attach_callbacks(c, callbacks, c.session)[0] == INITIALIZATION  # taken
    assert _arm(c, stream, 1) == 0
    assert _run_message(c, cb).id == 1
    assert _arm(c, stream, 1) == 1  # the number is pending still: cudaErrorInvalidValue
    c.close()


def test_ending_a_session_opens_its_gates_for_the_vgpu(daemon_with):
    """A client holds a gate and its vGPU's one thread waits behind it (a synchronize whose
    reply it never reads); pilotctl kill ends the session: the gate opens, the vGPU serves the
    next tenant."""
    daemon = daemon_with("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1")
    c, cb = _callback_client(daemon)
    stream, _ = _stream_and_event(c)
    assert _arm(c, stream, 1) == 0
    _run_message(c, cb)
    c.send(lib.PILOT_OP_STREAM_SYNCHRONIZE, body("pilot_req_handle", handle=stream))  # blocks the vGPU
    killed = subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "kill", str(c.session)],
                            capture_output=True, text=True, timeout=30)
    assert killed.returncode == 0, killed.stderr
    other = ProtoClient(str(daemon.socket_path))
    other.open()  # on the same vGPU
    assert other.malloc(256) != 0
    assert other.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"").err == 0
    assert daemon.alive()
    other.close()
    c.close()


def test_a_callback_left_unanswered_ends_its_session_not_the_vgpu(daemon_with):
    """Attack 1 of issue 12: a client arms a host callback, never answers CALLBACK_DONE and
    synchronizes the stream. Its synchronize waits (in its own backlog: the vGPU thread serves
    the next tenant, another process, meanwhile); after `--callback-timeout` the session is
    ended and the synchronize answered."""
    daemon = daemon_with("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1", "--callback-timeout", "1s")
    c, cb = _callback_client(daemon)
    stream, _ = _stream_and_event(c)
    assert _arm(c, stream, 1) == 0
    _run_message(c, cb)  # asked to run it; it never answers
    started = time.monotonic()
    c.send(lib.PILOT_OP_STREAM_SYNCHRONIZE, body("pilot_req_handle", handle=stream))  # blocks the vGPU
    time.sleep(0.3)  # the vGPU has taken the synchronize
    peer = subprocess.Popen([sys.executable, str(HERE / "peer.py"), str(daemon.socket_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    try:
        line = peer.stdout.readline()  # attached and allocated: served
        assert line.split() and int(line.split()[1]) != 0, line
        assert c.vgpu.poll(5000)  # the synchronize is answered too (the gate opened)
        assert 0.9 < time.monotonic() - started < 5  # at the timeout, not for ever
        sessions = {s["session"] for s in _sessions()}
        assert c.session not in sessions and int(line.split()[0]) in sessions
        assert "a host callback unanswered for 1 s" in daemon.log_path.read_text()
    finally:
        peer.communicate("\n", timeout=10)
    c.close()


def test_other_sessions_never_wait_behind_a_tenants_host_callback(daemon_with):
    """Issue 27 (5): a synchronize behind a gate used to block its vGPU's thread, so every other
    session of the vGPU waited as long as the client took to answer (up to callback_hold_total),
    with no limit of its own. The synchronize now waits in its own session's backlog: another
    tenant on the one vGPU is served at once; the holder's synchronize and the calls it sent
    after it are answered in order once its callback is, each executed once."""
    daemon = daemon_with("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1", "--callback-timeout", "20s")
    c, cb = _callback_client(daemon)
    stream, event = _stream_and_event(c)
    assert _arm(c, stream, 1) == 0
    _run_message(c, cb)  # asked to run it; answered only at the end
    handle = body("pilot_req_handle", handle=stream)
    c.send(lib.PILOT_OP_STREAM_SYNCHRONIZE, handle)
    c.send(lib.PILOT_OP_EVENT_RECORD, body("pilot_req_event_record", event=event, stream=stream),
           flags=lib.PILOT_F_NO_REPLY)
    c.send(lib.PILOT_OP_EVENT_QUERY, body("pilot_req_handle", handle=event))
    started = time.monotonic()
    peer = subprocess.Popen([sys.executable, str(HERE / "peer.py"), str(daemon.socket_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    try:
        line = peer.stdout.readline()  # attached and allocated on the same vGPU
        assert line.split() and int(line.split()[1]) != 0, line
        assert time.monotonic() - started < 5  # not behind the callback (20 s)
        assert not c.vgpu.poll(200)  # the holder's own synchronize still waits for its callback
        done = new("pilot_msg_callback")
        done.id = 1
        cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_DONE, flags=lib.PILOT_F_NO_REPLY),
                           to_bytes(done)])
        replies = [c.recv(c.vgpu) for _ in range(2)]
        assert [ffi.cast("pilot_envelope *", ffi.from_buffer(r[0])).opcode for r in replies] == \
            [lib.PILOT_OP_STREAM_SYNCHRONIZE, lib.PILOT_OP_EVENT_QUERY]
        assert [int.from_bytes(r[1][:4], "little") for r in replies] == [0, 0]
        assert not c.vgpu.poll(200)  # nothing twice
        assert c.call(lib.PILOT_OP_STREAM_SYNCHRONIZE, handle).err == 0
    finally:
        peer.communicate("\n", timeout=10)
    assert daemon.alive()
    c.close()


def test_calls_that_wait_for_nothing_behind_a_gate_run_at_once(daemon_with):
    """A callback may wait for another thread of its program, whose calls on other streams must
    go on meanwhile (as natively): with a gate shut on one stream, a synchronize of another
    stream, of an event recorded there, and an asynchronous copy on the gated stream are
    answered at once."""
    daemon = daemon_with("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1", "--callback-timeout", "20s")
    c, cb = _callback_client(daemon)
    gated, event = _stream_and_event(c)
    other, _ = _stream_and_event(c)
    assert _arm(c, gated, 1) == 0
    _run_message(c, cb)
    c.send(lib.PILOT_OP_EVENT_RECORD, body("pilot_req_event_record", event=event, stream=other),
           flags=lib.PILOT_F_NO_REPLY)
    assert c.call(lib.PILOT_OP_STREAM_SYNCHRONIZE, body("pilot_req_handle", handle=other)).err == 0
    assert c.call(lib.PILOT_OP_EVENT_SYNCHRONIZE, body("pilot_req_handle", handle=event)).err == 0
    ptr = c.malloc(4096)
    copy = body("pilot_req_memcpy", dst=ptr, count=16, stream=gated, sync=0)
    assert c.call(lib.PILOT_OP_MEMCPY_H2D, copy, payload=b"x" * 16).err == 0
    assert c.call(lib.PILOT_OP_STREAM_QUERY, body("pilot_req_handle", handle=gated)).err == NOT_READY
    done = new("pilot_msg_callback")
    done.id = 1
    cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_DONE, flags=lib.PILOT_F_NO_REPLY), to_bytes(done)])
    assert c.call(lib.PILOT_OP_STREAM_SYNCHRONIZE, body("pilot_req_handle", handle=gated)).err == 0
    c.close()


def _sessions() -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "sessions", "--json"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_callbacks_answered_just_in_time_hold_the_stream_for_a_bounded_total(daemon_with, tmp_path):
    """Issue 27 (5): each callback answered just inside `callback_timeout` used to hold the
    session's stream (and its vGPU) for ever; `callback_hold_total` bounds them added up."""
    config = tmp_path / "pilotd.toml"
    config.write_text('[daemon]\ncallback_timeout = "1s"\ncallback_hold_total = "2s"\n')
    daemon = daemon_with("--config", str(config))
    c, cb = _callback_client(daemon)
    stream, _ = _stream_and_event(c)
    answered = 0
    for ident in range(1, 10):
        if _arm(c, stream, ident) != 0:
            break
        try:
            _run_message(c, cb)
        except TimeoutError:
            break
        time.sleep(0.7)  # inside the timeout
        done = new("pilot_msg_callback")
        done.id = ident
        cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_DONE, flags=lib.PILOT_F_NO_REPLY),
                           to_bytes(done)])
        answered += 1
        if "callback_hold_total" in daemon.log_path.read_text():
            break
    assert 2 <= answered <= 4, answered
    deadline = time.monotonic() + 5
    while "callback_hold_total" not in daemon.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "held its streams" in daemon.log_path.read_text()
    assert c.session not in {s["session"] for s in _sessions()}
    c.close()
