"""`hold-file`: an example policy plugin, and the lever of the end-to-end policy tests.

Every launch waits while the file at `path` exists and runs once it is gone; a launch still
waiting after `[policy] max_wait` fails with `error` (default 2, cudaErrorMemoryAllocation).

    [policy]
    name = "hold-file"
    plugins = ["/path/to/tests/policies_examples/hold_file.py"]
    [policy.hold-file]
    path = "/tmp/hold"      # touch it to hold launches, remove it to release them
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pilot.policies import RUN, Decision, LaunchView, Policy, register


@register
class HoldFile(Policy):
    name = "hold-file"
    summary = "example: every launch waits while a file exists"
    decides_launches = True  # without it the daemon never asks

    @dataclass(frozen=True, slots=True)
    class Settings:
        path: str
        error: int = 2

    def launch_requested(self, launch: LaunchView) -> Decision:
        if os.path.exists(self.settings.path):
            return Decision.wait(f"{self.settings.path} exists", error=self.settings.error)
        return RUN

    def state(self) -> dict[str, Any]:
        return {"path": self.settings.path, "holding": os.path.exists(self.settings.path)}
