"""What the benchmark scripts (bench.py, fig1.py) share: a pilotd they start (the command's output
pumped to a log file and kept as a tail, `pilotd ready` awaited, SIGTERM then SIGKILL to stop),
and finding nvcc."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

STOP_TIMEOUT_S = 15.0


class PilotdProcess:
    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str],
                 say: Callable[[str], None] = print) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self._say = say
        self._log_file: IO[str] = log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self._ready = threading.Event()
        self._tail: list[str] = []
        self._reader = threading.Thread(target=self._pump, name="pilotd-log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log_file.write(line)
            self._log_file.flush()
            self._tail = [*self._tail[-199:], line]
            if "pilotd ready" in line:
                self._ready.set()

    def tail(self, lines: int = 40) -> str:
        return "".join(self._tail[-lines:])

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise RuntimeError(f"pilotd exited with {self.proc.returncode} before it was ready\n"
                                   f"$ {shlex.join(self.cmd)}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pilotd printed no 'pilotd ready' within {timeout:.0f} s\n"
                                   f"$ {shlex.join(self.cmd)}\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._say(f"pilotd ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s: killing it")
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        self._log_file.close()
        self._say(f"pilotd exited with {self.proc.returncode}; its log: {self.log_path}")


def find_nvcc() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if Path(p).exists():
            return p
    raise RuntimeError("nvcc not found (PATH, /usr/local/cuda/bin)")
