"""Whether the vGPU threads spin for their tenants' next calls (`[daemon] endpoint_spin`).

After serving a message a vGPU thread's endpoint polls `spin_us` (50 us) for the next before
it sleeps, so a tenant's next call finds it on a core. That is right while the host has cores
to spare. When it does not, a spinning vGPU thread takes the core that a tenant's own thread
(which posts calls, then polls its reply or completion word) or another vGPU thread with work
needs, and every hand-over waits for the scheduler. On an H200 host (16 cores), 16 graph-inference
tenants ran 21-22k steps/s with the spin and 55k without it; 8 tenants ran faster with it
(bench/RESULTS.md, thirteenth session). So with `auto` (the default) the router's loop counts the
busy sessions (sessions whose call count moved since its last look, at most every CHECK_S) and
lets the endpoints spin only while twice that (a tenant thread and a vGPU thread each) fits in
the CPUs pilotd may run on. `always` spins as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from pilot.daemon.protocol import lib

log = logging.getLogger("pilot.vgpu")

CHECK_S = 0.2  # how often the busy sessions are counted (the router's loop looks at least this often)


def usable_cpus() -> int:
    """The CPUs pilotd may run on (its affinity: a cpuset or systemd's CPUAffinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class EndpointSpin:
    """Decides, from the router's loop, whether the endpoints spin (spin_budget.h)."""

    def __init__(self, mode: str, sessions: Callable[[], Iterable[Any]], cpus: int | None = None,
                 set_allowed: Callable[[int], None] = lib.pilot_spin_set_endpoint) -> None:
        """sessions: every live session (each with a `calls` count), read without locks."""
        self.mode = mode
        self._sessions = sessions
        self.cpus = cpus or usable_cpus()
        self._set = set_allowed
        self._seen: dict[int, int] = {}  # id(session) -> its call count at the last look
        self._checked = -CHECK_S
        self.busy = 0
        self.allowed = True
        self._set(1)

    def check(self, now: float | None = None) -> bool:
        """Counts the busy sessions (at most every CHECK_S) and turns spinning on or off."""
        now = time.monotonic() if now is None else now
        if self.mode == "always" or now - self._checked < CHECK_S:
            return self.allowed
        self._checked = now
        seen, busy = {}, 0
        for s in list(self._sessions()):
            calls = s.calls
            seen[id(s)] = calls
            busy += self._seen.get(id(s), calls) != calls
        self._seen, self.busy = seen, busy
        allowed = 2 * busy <= self.cpus
        if allowed != self.allowed:
            self.allowed = allowed
            self._set(int(allowed))
            log.debug("endpoints %s spinning: %d busy session(s), %d CPUs",
                      "resume" if allowed else "stop", busy, self.cpus)
        return allowed
