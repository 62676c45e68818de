"""Two Unix users against one pilotd (CI runs as root: the second user is `nobody`, reached by a
root process that drops its uid and gid before it connects, since the kernel's peer credentials
are taken at connect time)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from proto_daemon import RunningDaemon, start_daemon, stop_daemon

from pilot.cli.client import query_sessions

HERE = Path(__file__).resolve().parent
NOBODY = 65534
INITIALIZATION = 3

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")

_AS_NOBODY = """
import json, os, sys
from client import ProtoClient
from pilot.cli.client import query_sessions
socket, mode = sys.argv[1], sys.argv[2]
first = None
if mode == "hello-then-drop":
    first = ProtoClient(socket)
    first.open()  # a session of root under this pid
    print(json.dumps({"first": first.session}), flush=True)
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
c = ProtoClient(socket)
if mode == "list":
    c.open()
    print(json.dumps({"session": c.session, "listing": query_sessions(socket)}), flush=True)
else:
    print(json.dumps({"err": int(c.hello().hdr.err)}), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def shared_daemon() -> Iterator[RunningDaemon]:
    """A daemon whose socket directory another user can reach."""
    work = Path(tempfile.mkdtemp(prefix="pilot-2u-", dir="/tmp"))
    work.chmod(0o755)
    d = start_daemon(work)
    try:
        yield d
    finally:
        stop_daemon(d)
        shutil.rmtree(work, ignore_errors=True)


def _child(d: RunningDaemon, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-c", _AS_NOBODY, str(d.socket_path), mode], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _root_session(d: RunningDaemon) -> tuple[subprocess.Popen[str], int]:
    peer = subprocess.Popen([sys.executable, str(HERE / "peer.py"), str(d.socket_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peer.stdout is not None
    return peer, int(peer.stdout.readline().split()[0])


def test_pilot_sessions_shows_other_tenants_to_admins_only(shared_daemon: RunningDaemon) -> None:
    peer, root_session = _root_session(shared_daemon)
    child = _child(shared_daemon, "list")
    try:
        assert child.stdout is not None
        seen = json.loads(child.stdout.readline())
        tenants = {r["tenant"] for r in seen["listing"]}
        assert tenants == {"user:nobody"}, seen["listing"]  # its own session, not root's
        assert [r["session"] for r in seen["listing"]] == [seen["session"]]
        everyone = {r["session"] for r in query_sessions(str(shared_daemon.socket_path))}
        assert {root_session, seen["session"]} <= everyone  # root is an admin
    finally:
        for p in (child, peer):
            p.kill()
            p.wait()


def test_a_hello_under_another_uid_does_not_end_a_live_session(shared_daemon: RunningDaemon) -> None:
    """The same pid says HELLO as another user while its first session's process lives: refused
    (cudaErrorInitializationError), and the first session stays."""
    child = _child(shared_daemon, "hello-then-drop")
    try:
        assert child.stdout is not None
        first = json.loads(child.stdout.readline())["first"]
        assert json.loads(child.stdout.readline())["err"] == 3
        assert first in {r["session"] for r in query_sessions(str(shared_daemon.socket_path))}
        assert "tried" not in shared_daemon.log() and "refused: the pid holds session" in shared_daemon.log()
    finally:
        child.kill()
        child.wait()


# Issue 27 (6): a process of nobody connects, forks, and exits; its child keeps the connection
# (whose SO_PEERCRED pid is the exited parent's) and sends HELLO, claiming the largest start time,
# once the pid is another user's process.
_HOLDS_A_DEAD_PIDS_CONNECTION = """
import os, sys
sys.path.insert(0, sys.argv[2])
import rawzmtp
from pilot.daemon.protocol import ffi, lib, new, to_bytes
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
conn = rawzmtp.connect(sys.argv[1])
if os.fork():
    print(os.getpid(), flush=True)
    os._exit(0)
sys.stdin.readline()
rawzmtp.handshake(conn)
req = new("pilot_req_hello")
req.proto_version, req.cuda_abi, req.start_time = lib.PILOT_PROTO_VERSION, 13000, 2**64 - 1
env = new("pilot_envelope")
env.version, env.opcode, env.seq = lib.PILOT_PROTO_VERSION, lib.PILOT_OP_HELLO, 1
rawzmtp.send(conn, to_bytes(env), to_bytes(req))
reply = rawzmtp.recv(conn)
rep = ffi.new("pilot_rep_hello *")
ffi.memmove(rep, reply[1], ffi.sizeof(rep[0]))
print(int(rep.hdr.err), flush=True)
"""

_HELLO_ON_A_LINE = """
import sys
sys.path.insert(0, sys.argv[2])
from client import ProtoClient
sys.stdin.readline()
print(int(ProtoClient(sys.argv[1]).hello().hdr.err), flush=True)
sys.stdin.readline()
"""


def _process_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[str] | None:
    """argv started as pid `pid` (root may set ns_last_pid), or None if another process took it."""
    try:
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    except OSError:
        pytest.skip("cannot set /proc/sys/kernel/ns_last_pid")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.pid == pid:
        return proc
    proc.kill()
    proc.wait()
    return None


def test_a_dead_senders_hello_cannot_take_the_pid_of_another_users_process(
        shared_daemon: RunningDaemon) -> None:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    sock = str(shared_daemon.socket_path)
    attacker = subprocess.Popen([sys.executable, "-c", _HOLDS_A_DEAD_PIDS_CONNECTION, sock, str(HERE)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    victim = None
    try:
        assert attacker.stdout is not None and attacker.stdin is not None
        dead_pid = int(attacker.stdout.readline())
        attacker.wait(10)  # the parent exited; its child holds the connection
        for _ in range(20):
            victim = _process_with_pid(dead_pid, [sys.executable, "-c", _HELLO_ON_A_LINE, sock, str(HERE)])
            if victim is not None:
                break
        if victim is None:
            pytest.skip("the pid was taken by another process every time")
        assert victim.stdin is not None and victim.stdout is not None
        attacker.stdin.write("\n")
        attacker.stdin.flush()
        assert int(attacker.stdout.readline()) == INITIALIZATION  # the pid is root's process now
        assert "that pid is now another process" in shared_daemon.log()
        victim.stdin.write("\n")
        victim.stdin.flush()
        assert int(victim.stdout.readline()) == 0  # its own HELLO still gets a session
    finally:
        for p in (attacker, victim):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


# Issue 27 (1): user `daemon` (uid 1) makes nobody's /tmp/pilot-65534/ first and listens there.
_SQUATTER = """
import os, socket, sys
os.setgroups([])
os.setresgid(1, 1, 1)
os.setresuid(1, 1, 1)
os.mkdir(sys.argv[1], 0o755)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1] + "/pilot.sock")
os.chmod(sys.argv[1] + "/pilot.sock", 0o777)
s.listen(8)
s.settimeout(float(sys.argv[2]))
print("listening", flush=True)
try:
    s.accept()
    print("connected", flush=True)
except OSError:
    print("nobody came", flush=True)
"""

# nobody, without XDG_RUNTIME_DIR, makes a CUDA call through the shim
_VICTIM = """
import ctypes, os, sys
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
n = ctypes.c_int()
print(ctypes.CDLL(sys.argv[1]).cudaGetDeviceCount(ctypes.byref(n)), flush=True)
"""


def test_a_socket_directory_another_user_made_first_is_not_trusted() -> None:
    from pilot.shim import shim_path

    squat = Path("/tmp/pilot-65534")
    if squat.exists():
        pytest.skip(f"{squat} exists already")
    squatter = subprocess.Popen([sys.executable, "-c", _SQUATTER, str(squat), "20"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "listening"
        env = {k: v for k, v in os.environ.items()
               if k not in ("XDG_RUNTIME_DIR", "PILOT_SOCKET", "LD_PRELOAD")}
        # a copy nobody can read (the installed one may sit under root's 0700 home)
        readable = Path(tempfile.mkdtemp(prefix="pilot-shim-", dir="/tmp"))
        readable.chmod(0o755)
        shim = readable / "libpilot.so"
        shutil.copyfile(shim_path(), shim)
        shim.chmod(0o755)
        try:
            victim = subprocess.run([sys.executable, "-c", _VICTIM, str(shim)], capture_output=True,
                                    text=True, timeout=30, env={**env, "PILOT_CONNECT_TIMEOUT": "2"})
        finally:
            shutil.rmtree(readable, ignore_errors=True)
        assert victim.returncode == 0, victim.stderr
        assert int(victim.stdout) != 0  # the CUDA call fails...
        assert "owned by another user" in victim.stderr and str(squat) in victim.stderr  # ...saying why
        squatter.kill()  # it must not have been reached
        out = squatter.communicate(timeout=10)[0]
        assert "connected" not in out
    finally:
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait()
        shutil.rmtree(squat, ignore_errors=True)
