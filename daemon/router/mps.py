"""pilotd's own MPS control daemon (`[isolation] mps`): started, checked, kept across a restart
in place, stopped at exit.

Why MPS: under NVIDIA MPS (Volta and later) every client process has a GPU virtual address space
of its own, and the clients' kernels run at once. Engines (router/isolation.py) that are MPS
clients are therefore confined by the hardware: a kernel of one tenant that computes another
tenant's address faults in its own engine (or reads its own memory), whatever the kernel is
(PTX, SASS-only library kernels, graphs), without the time-slicing that separate processes
without MPS get.

Why a control daemon of pilotd's own: its pipe and log directories are private (0700, under
pilotd's state directory), never the system default /tmp/nvidia-mps, so an operator's own MPS is
untouched and no other user can reach this one.

CUDA reads CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY at cuInit, so `take_part` sets them
in pilotd's own environment before its backend initializes: the shared pilotd is a client too
(its tenants' kernels then run at once with the engines' rather than time-sliced against the
MPS server), and every engine it starts inherits them. The driver quietly runs a process without
MPS when it cannot reach the control daemon, so that is checked where it matters: the CUDA backend
refuses to start when MPS was asked and the device's contexts are not MPS clients
(CU_DEVICE_ATTRIBUTE_MPS_ENABLED, backends/cuda.py), and an engine refuses to start without the
pipe directory in its environment. Never silently unconfined.

Lifecycle: the top pilotd (not an engine) starts it once. A restart in place after a fault
(router/recovery.py: an exec of the same pid with the same environment) finds it answering in its
directory and keeps it, as does a pilotd started after one that was killed without its exit (the
directory is pilotd's alone, so whatever answers there is pilotd's). pilotd's exit stops it: a
detached helper (this module run as a program) waits for pilotd to be gone, since pilotd is a
client itself until then, sends `quit`, then SIGTERM and SIGKILL to the control daemon and its
servers if they outstay STOP_TIMEOUT. Under systemd the service's cgroup ends them in any case.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pilot.daemon.config import Config

log = logging.getLogger("pilot.mps")

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
PID_FILE = "nvidia-cuda-mps-control.pid"  # the control daemon writes it in its pipe directory
COMMAND_TIMEOUT = 10.0  # seconds a command to the control daemon may take
START_TIMEOUT = 15.0  # seconds from `-d` to a control daemon that answers
STOP_TIMEOUT = 5.0  # seconds after `quit` before the processes are signalled
# The control daemon's UNIX sockets go in the pipe directory (108 bytes for a socket path).
MAX_PIPE_DIR = 80


class MpsError(Exception):
    """MPS was asked for and cannot be had: pilotd does not start (it never runs unconfined)."""


def _running(pid: int) -> bool:
    """pid exists and is not a zombie (a control daemon that died unreaped still has a pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _private_dir(path: str) -> None:
    """`path` exists, is a real directory (no symlink) of this user, mode 0700."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise MpsError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise MpsError(f"{path} belongs to uid {st.st_uid}, not to pilotd's ({os.geteuid()})")
    os.chmod(path, 0o700)


@dataclass
class MpsControl:
    """One control daemon of this pilotd: its program and directories, its pid once known."""

    program: str  # the control program's path
    pipe_dir: str
    log_dir: str
    pid: int = 0
    servers_seen: set[int] = field(default_factory=set)  # MPS servers it listed

    @property
    def env(self) -> dict[str, str]:
        """What makes a process a client of this control daemon (read by CUDA at cuInit)."""
        return {PIPE_ENV: self.pipe_dir, LOG_ENV: self.log_dir}

    def command(self, text: str) -> subprocess.CompletedProcess[str]:
        """One command to the control daemon, through its program (`echo TEXT | program`)."""
        return subprocess.run([self.program], input=text + "\n", env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT)

    def read_pid(self) -> int:
        try:
            with open(os.path.join(self.pipe_dir, PID_FILE)) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 0

    def answers(self) -> bool:
        """The control daemon named by the pid file runs and answers a command."""
        pid = self.read_pid()
        if not pid or not _running(pid):
            return False
        try:
            self.servers()
        except (MpsError, OSError, subprocess.TimeoutExpired):
            return False
        self.pid = pid
        return True

    def servers(self) -> list[int]:
        """The MPS servers' pids (`get_server_list`; none until the first client connects)."""
        proc = self.command("get_server_list")
        if proc.returncode != 0:
            raise MpsError(f"get_server_list: rc {proc.returncode}: "
                           f"{(proc.stdout + proc.stderr).strip()[:300]}")
        pids = [int(w) for w in proc.stdout.split() if w.isdigit()]
        self.servers_seen.update(pids)
        return pids

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(os.path.join(self.log_dir, "control.log"), errors="replace") as f:
                return " | ".join(f.read().splitlines()[-lines:])
        except OSError:
            return "(no control.log)"

    def describe(self) -> dict[str, Any]:
        return {"control_pid": self.pid, "running": bool(self.pid) and _running(self.pid),
                "pipe_dir": self.pipe_dir, "log_dir": self.log_dir, "program": self.program}

    def stop(self) -> None:
        """End the control daemon and its servers once this pilotd has exited, from a detached
        helper (`quit_after`): pilotd is an MPS client itself until its exit, and `quit` makes
        the control daemon wait for its clients. The helper's account goes to pilotd-quit.log in
        the log directory."""
        with contextlib.suppress(MpsError, OSError, subprocess.TimeoutExpired):
            self.servers()
        pids = [p for p in (self.pid, *sorted(self.servers_seen)) if p]
        try:
            with open(os.path.join(self.log_dir, "pilotd-quit.log"), "a") as out:
                subprocess.Popen([sys.executable, "-m", __name__, self.program, str(os.getpid()),
                                  *map(str, pids)], env={**os.environ, **self.env},
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True)
        except OSError as exc:
            log.error("MPS control daemon %d: cannot start its quit (%s): it keeps running", self.pid, exc)
            return
        log.info("MPS control daemon %d: quit once this pilotd has exited", self.pid)


def _wait_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def quit_after(program: str, pilotd: int, pids: list[int]) -> None:
    """(The detached helper of MpsControl.stop.) Once pilotd has exited, `quit` to the control
    daemon; the control daemon and servers `pids` still running STOP_TIMEOUT later are sent
    SIGTERM, then SIGKILL."""
    def say(text: str) -> None:
        print(time.strftime("%Y-%m-%dT%H:%M:%S"), text, flush=True)

    if not _wait_gone([pilotd], 60):
        say(f"pilotd {pilotd} still runs after 60 s: quitting the MPS control daemon anyway")
    try:
        proc = subprocess.run([program], input="quit\n", capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT * 3)
        say(f"quit: rc {proc.returncode} {(proc.stdout + proc.stderr).strip()[:300]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"quit: {exc}")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if _wait_gone(pids, STOP_TIMEOUT):
            say(f"MPS processes {pids} gone")
            return
        for pid in pids:
            if _running(pid):
                say(f"MPS process {pid} still running: {sig.name}")
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
    say(f"MPS processes still running: {[p for p in pids if _running(p)]}")


def start(program: str, state_dir: str, restarted: bool = False) -> MpsControl:
    """The control daemon of pilotd's state directory: the one already answering there (kept
    across a restart in place), else a new one (`program -d`), checked to answer."""
    path = shutil.which(program)
    if path is None:
        raise MpsError(f"[isolation] mps: the MPS control program {program!r} was not found "
                       f"{'' if '/' in program else 'on PATH '}(it comes with the NVIDIA driver's "
                       "utilities; or set [isolation] mps_control to its path)")
    base = os.path.join(os.path.abspath(state_dir), "mps")
    control = MpsControl(path, os.path.join(base, "pipe"), os.path.join(base, "log"))
    if len(control.pipe_dir) > MAX_PIPE_DIR:
        raise MpsError(f"[isolation] mps: the state directory {state_dir} is too long for the MPS "
                       f"control daemon's sockets under it ({control.pipe_dir}: at most "
                       f"{MAX_PIPE_DIR} characters); choose a shorter state_dir")
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        for d in (base, control.pipe_dir, control.log_dir):
            _private_dir(d)
    except OSError as exc:
        raise MpsError(f"[isolation] mps: cannot make its private directory {base}: {exc}") from exc
    if control.answers():
        log.info("MPS control daemon %d %s (pipes %s)", control.pid,
                 "kept across the restart" if restarted else "left by an earlier pilotd: kept",
                 control.pipe_dir)
        return control
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(control.pipe_dir, PID_FILE))  # a dead one's
    try:
        proc = subprocess.run([path, "-d"], env={**os.environ, **control.env},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpsError(f"[isolation] mps: `{path} -d` failed: {exc}") from exc
    if proc.returncode != 0:
        raise MpsError(f"[isolation] mps: `{path} -d` failed (rc {proc.returncode}): "
                       f"{(proc.stdout + proc.stderr).strip()[:300]}; {control.log_tail()}")
    deadline = time.monotonic() + START_TIMEOUT
    while not control.answers():
        pid = control.read_pid()
        if pid and not _running(pid):
            raise MpsError(f"[isolation] mps: the MPS control daemon (pid {pid}) exited right "
                           f"after it started; {control.log_tail()}")
        if time.monotonic() > deadline:
            raise MpsError(f"[isolation] mps: the MPS control daemon does not answer "
                           f"{START_TIMEOUT:.0f} s after `{path} -d` (pipes {control.pipe_dir}); "
                           f"{control.log_tail()}")
        time.sleep(0.05)
    log.info("MPS control daemon %d started (pipes %s, logs %s): isolated tenants' pilotds and "
             "this one are its clients", control.pid, control.pipe_dir, control.log_dir)
    return control


def take_part(config: Config, restarted: bool = False) -> MpsControl | None:
    """This process's part in `[isolation] mps`, before its backend initializes CUDA: the top
    pilotd starts (or keeps) the control daemon and becomes its client (the environment); an
    engine checks it has the environment its parent gave it. None: nothing to stop at exit."""
    if not config.isolation_mps:
        return None
    if config.isolated_tenant is not None:
        if not os.environ.get(PIPE_ENV):
            raise MpsError(f"[isolation] mps: this isolated pilotd has no {PIPE_ENV}: it would "
                           "run without MPS (unconfined); it is started by pilotd, which sets it")
        return None
    control = start(config.isolation_mps_control, config.state_dir, restarted)
    os.environ.update(control.env)
    return control


if __name__ == "__main__":  # MpsControl.stop's helper: PROGRAM PILOTD_PID [PID...]
    quit_after(sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]])
