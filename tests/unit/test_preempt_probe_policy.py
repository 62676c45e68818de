"""tests/gpu/preempt_probe_policy.py (the GPU check's test policy) as a plugin, driven with a
recording Controls: it makes every session preemptible, preempts one that launched every
`period`, resumes it `hold` after pilotd saw it drained, and gives up on a drain after 2 s."""

from __future__ import annotations

from pathlib import Path

import test_memory_policies

from pilot.policies import LaunchView, PreemptionView, SessionView, create, load_plugin

PLUGIN = Path(__file__).resolve().parents[1] / "gpu" / "preempt_probe_policy.py"


class Recording(test_memory_policies.Recording):
    """The memory policies' recording Controls (preemption requests in `asked`), able to
    preempt, with the views a test sets (a resume drops the session's)."""

    preempts = True

    def __init__(self) -> None:
        super().__init__()
        self.views: dict[int, PreemptionView] = {}

    def resume(self, session: int) -> None:
        super().resume(session)
        self.views.pop(session, None)

    def preemption(self, session: int) -> PreemptionView | None:
        return self.views.get(session)


def _launch(session: int, now: float) -> LaunchView:
    return LaunchView(1, session, "t", 1, 0, 0, "k", (1, 1, 1), (32, 1, 1), 0, (), now, now, 1)


def test_the_probe_preempts_on_its_schedule_and_resumes_once_drained(own_registry: None) -> None:
    assert "preempt_probe" in load_plugin(str(PLUGIN))
    p = create("preempt_probe", {"period": "50ms", "hold": "10ms"})
    c = p.controls = Recording()
    assert p.preempts_kernels and p.decides_launches
    p.session_started(SessionView(7, "t", 1, 0, 0))
    assert c.asked == [("preemptible", 7, True)]
    p.launch_started(_launch(7, 1.0))
    p.tick(1.04)
    assert c.asked[1:] == []  # not yet its period
    p.tick(1.05)
    assert c.asked[1:] == [("preempt", 7)]
    p.tick(1.07)  # the request is still queued (no view): nothing
    c.views[7] = PreemptionView(7, 1.05, 1, None, 2)
    p.tick(1.08)  # not drained
    assert c.asked[2:] == []
    c.views[7] = PreemptionView(7, 1.05, 1, 1.0505, 2)
    p.tick(1.09)  # drained, held 40 ms >= hold: resumed
    assert c.asked[2:] == [("resume", 7)]
    assert p.state() == {"preempted": []}
    p.tick(1.13)
    assert c.asked[3:] == []  # the next one a period after the resume
    p.tick(1.15)
    assert c.asked[3:] == [("preempt", 7)]
    c.views[7] = PreemptionView(7, 1.15, 1, None, 1)
    p.tick(3.16)  # never drained: given up after 2 s, resumed
    assert c.asked[4:] == [("resume", 7)]
    p.session_ended(SessionView(7, "t", 1, 0, 0))
    p.tick(10.0)
    assert c.asked[5:] == []
