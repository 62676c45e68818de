"""A test policy (a plugin: `[policy] plugins = ["tests/gpu/preempt_probe_policy.py"]`, name
`preempt_probe`) that preempts every session that launched, every `period`, for `hold`, through
the preemption API (Controls.preemptible / preempt / resume), and logs each preemption's
outcome for tests/gpu/policy_preempt_check.py:

    preempt_probe: session 3 cut 1 latency_us 41.2

(`cut`: its preemptible launches on the GPU when its word went up; `latency_us`: from the
request to the last of them leaving the SMs, as pilotd saw it). Not for production: it parks
every tenant on a schedule."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pilot.policies import LaunchView, Policy, SessionView, register
from pilot.policies.settings import Seconds

log = logging.getLogger("pilot.policy.preempt_probe")
GIVE_UP_S = 2.0  # a preemption not drained by then is logged as such and resumed


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    period: Seconds = 0.05  # from a resume to the next preemption
    hold: Seconds = 0.01  # how long a drained session stays preempted


@dataclass
class Probe:
    next_at: float = 0.0
    since: float | None = None  # preempted at (None: running)
    latencies: list[float] = field(default_factory=list)


@register
class PreemptProbe(Policy):
    name = "preempt_probe"
    summary = "test only: preempts every session that launched, on a schedule"
    decides_launches = True  # every launch through Python, where the variants are launched
    preempts_kernels = True
    Settings = ProbeSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.probes: dict[int, Probe] = {}

    def session_started(self, s: SessionView) -> None:
        self.controls.preemptible(s.id, True)

    def session_ended(self, s: SessionView) -> None:
        self.probes.pop(s.id, None)

    def launch_started(self, launch: LaunchView) -> None:
        self.probes.setdefault(launch.session, Probe(next_at=launch.now + self.settings.period))

    def tick(self, now: float) -> None:
        for sid, p in self.probes.items():
            if p.since is None:
                if now >= p.next_at:
                    p.since = now
                    self.controls.preempt(sid)
                continue
            view = self.controls.preemption(sid)
            if view is None:
                continue  # still queued
            drained = view.drained_at is not None
            if (drained and now - p.since >= self.settings.hold) or now - p.since > GIVE_UP_S:
                if drained:
                    log.warning("preempt_probe: session %d cut %d latency_us %.1f inflight %d", sid,
                                view.cut, (view.latency_s or 0.0) * 1e6, view.inflight)
                else:
                    log.warning("preempt_probe: session %d cut %d not drained after %.1f s", sid,
                                view.cut, GIVE_UP_S)
                self.controls.resume(sid)
                p.since, p.next_at = None, now + self.settings.period

    def state(self) -> dict[str, Any]:
        return {"preempted": sorted(sid for sid, p in self.probes.items() if p.since is not None)}
