"""Driver-API programs beyond the core under pilot (tests/gpu/driver_compare.sh compares them with
native runs on a GPU):
- tests/apps/linker.cu (shim/driver/drv_link.c, daemon/ops/linker.py): two PTX inputs linked by
  pilotd's driver into one cubin, which the program loads and launches; an undefined function
  refused with an error log;
- tests/apps/driver_host.cu (shim/driver/drv_host.c): page-locking host memory, host functions in
  stream order, 2D copies with offsets."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.shim import driver_path

EXPECTED = {
    "linker": [
        "linked: an image of some bytes: 1",
        "error log after a link that worked is empty: 1",
        "the linked kernel computed 2x+1: wrong 0",
        "a kernel calling an undefined function does not link: 1",
        "and the error log says something: 1",
        "no state is refused: 1",
    ],
    "driver_host": [
        "registered memory copied: 1",
        "unregistering it twice fails: 1",
        "host functions ran in order: 1 2 3 (3)",
        "2D box copied through pitched memory: wrong 0",
        "a pitch narrower than the width fails: 1",
    ],
}


@pytest.mark.parametrize("program", sorted(EXPECTED))
def test_driver_program(program: str, run_under_pilot: Any, shim_path: str, daemon_log: Any) -> None:
    proc = run_under_pilot(program, env={"LD_PRELOAD": f"{shim_path}:{driver_path()}"})
    assert proc.returncode == 0 and proc.stdout.splitlines() == EXPECTED[program], (
        f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}")
    assert "not supported" not in proc.stderr  # every call it makes is carried
