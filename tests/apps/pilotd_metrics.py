"""Run one program under a pilotd of its own and read the daemon's metrics afterwards."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from typing import Any


def start_scraped(start_pilotd: Any, config: str | None = None) -> tuple[Any, int]:
    """A new pilotd exporting metrics on a free local port: (the daemon, the port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return start_pilotd("--metrics-address", f"127.0.0.1:{port}", config=config), port


def scrape(port: int) -> dict[str, float]:
    """Every pilot_* sample the daemon on `port` exports now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("pilot_")}


def run_scraped(start_pilotd: Any, argv: list[str], shim_path: str, config: str | None,
                env: dict[str, str] | None = None) -> tuple[str, dict[str, float]]:
    """argv under the shim, against a new pilotd (config: its TOML, or None); the program's
    stdout (it must exit 0) and every pilot_* sample the daemon exports once it has ended."""
    daemon, port = start_scraped(start_pilotd, config)
    proc = subprocess.run(argv, env={**daemon.env(), **(env or {}), "LD_PRELOAD": shim_path},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon.log_tail()}"
    return proc.stdout, scrape(port)


def total(values: dict[str, float], name: str) -> float:
    """The sum of a labeled metric's samples."""
    return sum(v for k, v in values.items() if k.startswith(name + "{"))
