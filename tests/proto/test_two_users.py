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
