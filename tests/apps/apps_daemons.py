"""The sim pilotds of tests/apps and what runs them: the pilot commands, a test's own daemon
(`OwnDaemon`), the sessions of a daemon. A module of its own, not conftest.py, so that test
modules import it by a name no other test folder has (each folder's conftest.py is a module
named `conftest`: which one an import finds depends on the order pytest collected them)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

APPS_DIR = Path(__file__).resolve().parent
GPU_DIR = APPS_DIR.parent / "gpu"
BENCH_DIR = APPS_DIR.parent.parent / "bench"
# Kernel emulations the sim daemons load.
SIM_KERNEL_FILES = (APPS_DIR / "sim_kernels.py", APPS_DIR / "sim_kernels_streams.py",
                    APPS_DIR / "sim_kernels_arrays.py", GPU_DIR / "sim_kernels.py",
                    BENCH_DIR / "policy_sim_kernels.py", BENCH_DIR / "salus_sim_kernels.py")
NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)
NATIVE = os.environ.get("PILOT_APPS_NATIVE") == "1"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def python_entry_point(module: str, func: str = "main") -> list[str]:
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def console_command(script: str, module: str) -> list[str]:
    """The console script `script` of this interpreter's environment, else the one on PATH, else
    its entry point (pyproject.toml's [project.scripts]) run by this interpreter."""
    beside = Path(sys.executable).parent / script
    if beside.exists():
        return [str(beside)]
    found = shutil.which(script)
    return [found] if found else python_entry_point(module)


PILOT = console_command("pilot", "pilot.cli.pilot")
PILOTD = console_command("pilotd", "pilot.daemon.main")
PILOTCTL = console_command("pilotctl", "pilot.cli.pilotctl")


def clean_env() -> dict[str, str]:
    """This process's environment without anything that would change how a program loads."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_DEBUG")}


def stop_process(proc: subprocess.Popen[str]) -> bool:
    """SIGTERM, wait, SIGKILL. True if it had to be killed."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]


def list_sessions(socket: str) -> list[dict[str, Any]]:
    """`pilot sessions --json` of the daemon on `socket`, parsed."""
    env = {**clean_env(), "PILOT_SOCKET": socket}
    proc = subprocess.run([*PILOT, "sessions", "--json"], env=env, capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        pytest.fail(f"`pilot sessions --json` failed (rc {proc.returncode}):\n{proc.stderr}",
                    pytrace=False)
    listed = json.loads(proc.stdout)
    assert isinstance(listed, list), f"sessions --json printed {proc.stdout!r}"
    return listed


# ---- a daemon of the test's own ----


def pilotd_command(workdir: str, *args: str) -> list[str]:
    """The command of a sim pilotd with its socket and state under `workdir`, serving
    SIM_KERNEL_FILES, with `args` appended."""
    return [*PILOTD, "--backend", "sim", "--socket", os.path.join(workdir, "pilot.sock"),
            "--state-dir", os.path.join(workdir, "state"), "--metrics-address", "",
            *(arg for path in SIM_KERNEL_FILES for arg in ("--sim-kernels", str(path))), *args]


class OwnDaemon:
    """A sim pilotd of one test; its output goes to `log_path`."""

    def __init__(self, *args: str, config: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="pilot-own-")  # short: unix socket paths max 107 bytes
        self.socket = os.path.join(self.dir, "pilot.sock")
        self.control_socket = os.path.join(self.dir, "control.sock")
        self.log_path = Path(self.dir) / "pilotd.log"
        if config is not None:
            config_path = Path(self.dir) / "pilotd.toml"
            config_path.write_text(config)
            args = ("--config", str(config_path), *args)
        self.command = pilotd_command(self.dir, *args)
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         env=clean_env())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "pilotd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"pilotd did not start (rc {self.proc.returncode})\n"
                            f"$ {' '.join(self.command)}\n{self.log()}", pytrace=False)
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def env(self) -> dict[str, str]:
        """Environment of a client of this daemon (no shim: add LD_PRELOAD to run a program)."""
        env = {k: v for k, v in clean_env().items() if not k.startswith("PILOT")}
        return {**env, "PILOT_SOCKET": self.socket}

    def ctl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """`pilotctl --control-socket <this daemon's> ARGS`."""
        proc = subprocess.run([*PILOTCTL, "--control-socket",
                               self.control_socket, *args], env=self.env(), capture_output=True,
                              text=True, timeout=30)
        if ok and proc.returncode != 0:
            pytest.fail(f"pilotctl {' '.join(args)}: rc {proc.returncode}\n{proc.stderr}\n"
                        f"pilotd log:\n{self.log_tail()}", pytrace=False)
        return proc

    def sessions(self) -> list[dict[str, Any]]:
        """`pilot sessions --json`, parsed."""
        return list_sessions(self.socket)

    def quota(self, tenant: str) -> dict[str, Any]:
        """`pilotctl quota get TENANT --json`, parsed."""
        doc = json.loads(self.ctl("quota", "get", tenant, "--json").stdout)
        assert isinstance(doc, dict), doc
        return doc

    def stop(self) -> int | None:
        """SIGTERM (then SIGKILL); the exit status, None if it had to be killed."""
        killed = stop_process(self.proc)
        return None if killed else self.proc.returncode

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


StartPilotd = Callable[..., OwnDaemon]
