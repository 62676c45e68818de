"""The driver's linker under pilot (tests/apps/linker.cu; shim/driver/drv_link.c,
daemon/ops/linker.py): two PTX inputs linked by pilotd's driver into one cubin, which the
program loads and launches; an undefined function refused with an error log."""

from __future__ import annotations

from typing import Any

from pilot.shim import driver_path

EXPECTED = [
    "linked: an image of some bytes: 1",
    "error log after a link that worked is empty: 1",
    "the linked kernel computed 2x+1: wrong 0",
    "a kernel calling an undefined function does not link: 1",
    "and the error log says something: 1",
    "no state is refused: 1",
]


def test_a_kernel_linked_from_two_ptx_inputs_runs(run_under_pilot: Any, shim_path: str,
                                                  daemon_log: Any) -> None:
    proc = run_under_pilot("linker", env={"LD_PRELOAD": f"{shim_path}:{driver_path()}"})
    assert proc.returncode == 0 and proc.stdout.splitlines() == EXPECTED, (
        f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}")
    assert "not supported" not in proc.stderr  # every call it makes is carried
