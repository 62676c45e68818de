"""The verdict on a scenario program's run (managed.cu, pinned.cu): it exited 0 and printed
exactly the lines expected, else the test fails with its output and the daemon's."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest


def check_output(proc: subprocess.CompletedProcess[str], want: list[str],
                 daemon_log: Callable[[], str]) -> None:
    if proc.returncode == 0 and proc.stdout.splitlines() == want:
        return
    pytest.fail(f"{' '.join(map(str, proc.args))}: rc {proc.returncode}\nwant {want}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\npilotd log:\n{daemon_log()}",
                pytrace=False)
