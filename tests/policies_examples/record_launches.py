"""`record-launches`: an example policy plugin that records what the daemon tells it about launches.

Every launch runs at once; each ask (`launch_requested`) appends one JSON line to the file at
`path`: the kernel's name, its grid and block, the ask's number, and its memory footprint (the
allocations its arguments point into) as [kind, size] pairs in the order the daemon found them.
With `allocations = true` each `allocated` and `freed` event adds a line too.
tests/apps/test_scheduler_core.py checks the footprints and the allocation events with it.

    [policy]
    name = "record-launches"
    plugins = ["/path/to/tests/policies_examples/record_launches.py"]
    [policy.record-launches]
    path = "/tmp/launches.jsonl"
    allocations = false     # also record allocated/freed events
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pilot.policies import RUN, AllocationView, Decision, LaunchView, Policy, register


@register
class RecordLaunches(Policy):
    name = "record-launches"
    summary = "example: runs every launch and records its footprint in a file"
    decides_launches = True  # launch_requested is called
    needs_footprint = True  # LaunchView.footprint is filled

    @dataclass(frozen=True, slots=True)
    class Settings:
        path: str
        allocations: bool = False

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.recorded = 0

    def _record(self, record: dict[str, Any]) -> None:
        with open(self.settings.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.recorded += 1

    def launch_requested(self, launch: LaunchView) -> Decision:
        self._record({"event": "launch", "kernel": launch.kernel, "grid": list(launch.grid),
                      "block": list(launch.block), "attempts": launch.attempts,
                      "session": launch.session,
                      "footprint": [[r.kind, r.size] for r in launch.footprint]})
        return RUN

    def allocated(self, a: AllocationView) -> None:
        if self.settings.allocations:
            self._record({"event": "allocated", "kind": a.kind, "size": a.size, "session": a.session})

    def freed(self, a: AllocationView) -> None:
        if self.settings.allocations:
            self._record({"event": "freed", "kind": a.kind, "size": a.size, "session": a.session})

    def state(self) -> dict[str, Any]:
        return {"path": self.settings.path, "recorded": self.recorded}
