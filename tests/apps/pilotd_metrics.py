"""Run one program under a pilotd of its own and read the daemon's metrics afterwards."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from typing import Any


def run_scraped(start_pilotd: Any, argv: list[str], shim_path: str, config: str | None,
                env: dict[str, str] | None = None) -> tuple[str, dict[str, float]]:
    """argv under the shim, against a new pilotd (config: its TOML, or None); the program's
    stdout (it must exit 0) and every pilot_* sample the daemon exports once it has ended."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start_pilotd("--metrics-address", f"127.0.0.1:{port}", config=config)
    proc = subprocess.run(argv, env={**daemon.env(), **(env or {}), "LD_PRELOAD": shim_path},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon.log_tail()}"
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("pilot_")}
    return proc.stdout, values


def total(values: dict[str, float], name: str) -> float:
    """The sum of a labeled metric's samples."""
    return sum(v for k, v in values.items() if k.startswith(name + "{"))
