"""Issue 27, items 2 and 3: a local user cannot take pilotd down or lock others out with
connections, sessions or huge frames (sim backend; the second user is `nobody`, reached by a
process that drops root's uid before it connects, as in test_two_users.py)."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import rawzmtp
from client import ProtoClient
from proto_daemon import RunningDaemon, start_daemon, stop_daemon

from pilot.daemon.protocol import ffi, lib

HERE = Path(__file__).resolve().parent
DEVICES_UNAVAILABLE = 46
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator:
    """limited(toml): a daemon with that configuration whose directory `nobody` can reach."""
    started: list[RunningDaemon] = []

    def start(toml: str, *extra: str) -> RunningDaemon:
        work = Path(tempfile.mkdtemp(prefix="pilot-h-", dir="/tmp"))  # reachable by nobody
        work.chmod(0o755)
        (work / "pilotd.toml").write_text(toml)
        d = start_daemon(work, "--config", str(work / "pilotd.toml"), *extra)
        started.append(d)
        return d

    try:
        yield start
    finally:
        for d in started:
            stop_daemon(d)
            shutil.rmtree(d.socket_path.parent, ignore_errors=True)


def _closed_by_pilotd(s: socket.socket, within: float = 5.0) -> bool:
    """Whether pilotd closes the connection (EOF or reset) within `within` seconds."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("name", ["pilot.sock", "control.sock"])
def test_a_huge_frame_before_any_handshake_closes_the_connection(limited, name: str) -> None:
    """A frame announcing 1 GiB is refused from its header: pilotd does not buffer it."""
    d = limited("")
    s = rawzmtp.connect(str(d.socket_path.parent / name))
    try:
        s.sendall(bytes([0x02]) + (1 << 30).to_bytes(8, "big") + b"\0" * (1 << 20))
    except OSError:
        pass  # closed while we sent: what we want
    assert _closed_by_pilotd(s)
    s.close()
    assert d.alive()
    c = ProtoClient(str(d.socket_path))
    c.open()
    c.close()


def _as_nobody(script: str, *args: str) -> subprocess.Popen[str]:
    # everything imported first: root's Python may be unreadable to nobody
    prefix = (f"import os, socket, sys, time\nsys.path.insert(0, {str(HERE)!r})\nimport rawzmtp\n"
              "from client import ProtoClient\nos.setgroups([])\n"
              "os.setresgid(65534, 65534, 65534)\nos.setresuid(65534, 65534, 65534)\n")
    return subprocess.Popen([sys.executable, "-c", prefix + script, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


# Opens N connections to a socket and holds them; prints how many pilotd left open after a while.
_FLOOD = """
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for _ in range(n):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(5)
    try:
        c.connect(path)
        c.sendall(rawzmtp.GREETING)
    except OSError:  # refused already
        pass
    conns.append(c)
time.sleep(3.0)
open_ = 0
for c in conns:
    c.setblocking(False)
    try:
        while c.recv(1 << 16):  # pilotd's greeting, then EOF if it closed the connection
            pass
    except BlockingIOError:
        open_ += 1
    except OSError:
        pass
print(len(conns), open_, flush=True)
sys.stdin.read()
"""


@needs_root
@pytest.mark.parametrize("target", ["pilot.sock", "control.sock", "pilot.sock.callbacks", "pilot.sock.vgpu0"])
def test_one_users_idle_connections_are_capped_and_others_still_served(limited, target: str) -> None:
    """nobody opens 4,200 idle connections (more than an endpoint's 4,096): pilotd keeps
    `connections_per_uid` of them open on each socket and root's program still gets a session,
    its host-callback connection and its calls."""
    d = limited("[limits]\nconnections_per_uid = 50\n")
    flood = _as_nobody(_FLOOD, str(d.socket_path.parent / target), "4200")
    try:
        assert flood.stdout is not None
        made, still_open = map(int, flood.stdout.readline().split())
        assert made >= 4100 and still_open <= 50
        c = ProtoClient(str(d.socket_path))
        rep = c.hello()
        assert rep.hdr.err == 0
        c.session = rep.session
        c.vgpu = c._connect(ffi.string(rep.endpoint).decode())
        assert c.call(lib.PILOT_OP_ATTACH, b"").err == 0
        cb = c._connect(ffi.string(rep.callbacks).decode())
        cb.send_multipart([c.envelope(lib.PILOT_OP_CALLBACK_ATTACH), b""])
        assert int.from_bytes(c.recv(cb)[1][:4], "little") == 0
        assert c.malloc(4096) != 0
        c.close()
        assert d.alive()
    finally:
        flood.kill()
        flood.wait()


_SESSIONS = """
for _ in range(2):  # three processes (the same pid saying HELLO again would end its session)
    if os.fork() == 0:
        break
print(int(ProtoClient(sys.argv[1]).hello().hdr.err), flush=True)
time.sleep(5)
"""


@needs_root
def test_sessions_per_user_are_capped(limited) -> None:
    d = limited("[limits]\nsessions_per_uid = 2\n")
    p = _as_nobody(_SESSIONS, str(d.socket_path))
    try:
        assert p.stdout is not None
        errs = sorted(int(p.stdout.readline()) for _ in range(3))
        assert errs == [0, 0, DEVICES_UNAVAILABLE]
        assert "sessions_per_uid" in d.log()
        c = ProtoClient(str(d.socket_path))  # another user is not held back
        c.open()
        c.close()
    finally:
        p.kill()
        p.wait()


def test_pilotd_refuses_connections_instead_of_running_out_of_descriptors(tmp_path: Path) -> None:
    """With 400 descriptors and 2,000 connections held open, pilotd stays up (it used to abort
    in libzmq on EMFILE) and serves a program once they are gone."""
    def low_nofile() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))

    sock, log_path = tmp_path / "pilot.sock", tmp_path / "pilotd.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
                                 str(sock), "--state-dir", str(tmp_path / "state"), "--metrics-address",
                                 ""], stdout=log, stderr=subprocess.STDOUT, preexec_fn=low_nofile)
    d = RunningDaemon(proc, sock, log_path)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 20
        while "pilotd ready" not in d.log():
            assert proc.poll() is None and time.monotonic() < deadline, d.log()
            time.sleep(0.05)
        conns = []
        for _ in range(2000):
            try:
                conns.append(rawzmtp.connect(str(sock), timeout=1))
            except OSError:
                break
        time.sleep(1)
        assert d.alive(), d.log()[-2000:]
        assert "refused" in d.log()
        for c in conns:
            c.close()
        time.sleep(0.5)
        c = ProtoClient(str(sock))
        c.open()
        assert c.malloc(4096) != 0
        c.close()
    finally:
        stop_daemon(d)


_RAISE_LIMIT = """
from pilot.daemon.protocol import lib
from client import body
c = ProtoClient(sys.argv[1])
c.open()
req = body("pilot_req_limit", limit=4, value=1 << 30)  # cudaLimitDevRuntimePendingLaunchCount
print(int(c.call(lib.PILOT_OP_DEVICE_SET_LIMIT, req, rep_type="pilot_rep_u64").hdr.err), flush=True)
sys.stdin.read()
"""


@needs_root
def test_a_tenant_cannot_raise_a_limit_every_tenant_shares(limited) -> None:
    """Issue 27 (8): the device runtime's pending launch count (and the other limits pilot does
    not charge) is one value for every tenant of the context: a non-admin's raise is refused
    and the others still read the default."""
    from client import body

    d = limited("")
    root = ProtoClient(str(d.socket_path))
    root.open()
    get = body("pilot_req_limit", limit=4)
    before = root.call(lib.PILOT_OP_DEVICE_GET_LIMIT, get, rep_type="pilot_rep_u64").value
    p = _as_nobody("from pilot.daemon.protocol import lib\n" + _RAISE_LIMIT, str(d.socket_path))
    try:
        assert p.stdout is not None
        assert int(p.stdout.readline()) == 800  # cudaErrorNotPermitted
        assert root.call(lib.PILOT_OP_DEVICE_GET_LIMIT, get, rep_type="pilot_rep_u64").value == before
        # an admin (root) may
        rep = root.call(lib.PILOT_OP_DEVICE_SET_LIMIT, body("pilot_req_limit", limit=4, value=before * 2),
                        rep_type="pilot_rep_u64")
        assert rep.hdr.err == 0
    finally:
        p.kill()
        p.wait()
        root.close()
