"""cudaDeviceReset through pilot: tests/apps/device_reset.cu under the sim daemon makes every kind
of object the reset destroys again after each reset and uses it (the reset hooks of
shim/core/hooks.h: each module forgets what the reset destroyed)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from scenario_output import check_output

RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]


def test_objects_made_after_a_reset_work(run_under_pilot: RunUnderPilot,
                                         daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("device_reset"),
                 ["round 0 ok", "round 1 ok", "round 2 ok", "reset ok"], daemon_log)
