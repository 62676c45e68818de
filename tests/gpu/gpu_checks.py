"""What the GPU check scripts (ops_check.py, fault_check.py) share: PASS/FAIL/INFO lines, their
count, and stopping the pilotd a script started. Imported by name: the scripts run as
`python3 tests/gpu/<script>.py`, which puts this directory on sys.path."""

from __future__ import annotations

import signal
import subprocess

failures = 0


def check(ok: bool, what: str) -> None:
    global failures
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def info(what: str) -> None:
    print("INFO " + what, flush=True)


def stop_pilotd(daemon: subprocess.Popen) -> None:
    """SIGTERM, and a check that pilotd stopped cleanly within 30 s (else it is killed)."""
    daemon.send_signal(signal.SIGTERM)
    try:
        rc = daemon.wait(30)
        check(rc == 0, f"pilotd stopped cleanly on SIGTERM (rc {rc})")
    except subprocess.TimeoutExpired:
        daemon.kill()
        check(False, "pilotd stopped on SIGTERM")


def exit_status() -> int:
    return 1 if failures else 0
