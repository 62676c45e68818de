"""Priority classes end to end (scheduling/priority.py): a pilotd whose config makes root's
tenant `high`, and a session of `nobody` (normal) beside a session of root. While root's session
makes calls, nobody's is gated (pilotctl sessions says so); once root is idle for the active
window, it is not. (CI runs as root: nobody is reached by a process that drops its ids before
it connects, as in test_two_users.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client import ProtoClient
from proto_daemon import RunningDaemon, start_daemon, stop_daemon

from pilot.cli.client import query_sessions

HERE = Path(__file__).resolve().parent
WINDOW_S = 0.3

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")

_AS_NOBODY = """
import os, sys
from client import ProtoClient
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
c = ProtoClient(sys.argv[1])
c.open()
print(c.session, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def daemon() -> Iterator[RunningDaemon]:
    work = Path(tempfile.mkdtemp(prefix="pilot-prio-", dir="/tmp"))
    work.chmod(0o755)
    (work / "pilotd.toml").write_text(
        f'[tenants.infer]\nusers = ["root"]\npriority = "high"\n'
        f'[priority]\nactive_window = "{int(WINDOW_S * 1000)}ms"\n')
    d = start_daemon(work, "--config", str(work / "pilotd.toml"), "--vgpus-per-gpu", "2")
    try:
        yield d
    finally:
        stop_daemon(d)
        shutil.rmtree(work, ignore_errors=True)


def _row(d: RunningDaemon, session: int) -> dict:
    return next(r for r in query_sessions(str(d.socket_path)) if r["session"] == session)


def _until(check: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_lower_session_is_gated_while_a_higher_one_is_active(daemon: RunningDaemon) -> None:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, "-c", _AS_NOBODY, str(daemon.socket_path)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    root = ProtoClient(str(daemon.socket_path))
    try:
        assert child.stdout is not None
        low = int(child.stdout.readline())
        row = _row(daemon, low)
        assert (row["tenant"], row["priority"], row["gated"]) == ("user:nobody", "normal", False)
        root.open()
        assert _row(daemon, root.session)["priority"] == "high"
        root.malloc(1 << 20)  # root's tenant is active: nobody's session is gated at once
        assert _until(lambda: _row(daemon, low)["gated"]), _row(daemon, low)
        assert not _row(daemon, root.session)["gated"]
        time.sleep(WINDOW_S)  # root idle: the gate opens within a look of the vGPU (10 ms)
        assert _until(lambda: not _row(daemon, low)["gated"]), _row(daemon, low)
    finally:
        root.close()
        child.kill()
        child.wait()
