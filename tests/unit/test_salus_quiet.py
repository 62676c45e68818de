"""Quiet memory events (Controls.quiet_memory, issue 30): pilotd's policy host keeps quiet the
allocations and frees a policy asked it not to report, counts them, and hands the counts over
with the next event the policy hears. Salus, driven through the real policy host and broker,
asks for quiet while a job runs its settled iterations, learns the same boundaries, P, E and
lanes as when it hears every event, and never lets an allocation past what its lane counts."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from pilot.daemon.resources.broker import GpuBudget, HoldForPolicy, ResourceBroker
from pilot.daemon.resources.tenants import Ledger
from pilot.daemon.scheduling.policy_host import PolicyHost
from pilot.daemon.telemetry.metrics import Metrics
from pilot.policies import RUN, Decision, LaunchView, Policy, Watch
from pilot.policies.salus.policy import Salus, SalusSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from broker_fakes import Quotas, session
from salus_step_shapes import job, torch_like_step

MIB = 1 << 20
GIB = 1 << 30


class Counting(Policy):
    """Records the memory events it hears and answers RUN."""
    name = "counting-test"

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[Any] = []
        self.asked = 0

    def allocation_requested(self, a: Any) -> Decision:
        self.asked += 1
        return RUN

    def allocated(self, a: Any) -> None:
        self.heard.append(("allocated", a))

    def freed(self, a: Any) -> None:
        self.heard.append(("freed", a))


def test_quiet_events_are_counted_and_handed_over_with_the_next_one_heard() -> None:
    policy = Counting()
    metrics = Metrics()
    host = PolicyHost(policy, metrics)
    b = ResourceBroker(Quotas(), Ledger(), GpuBudget({0: GIB}), Metrics())
    b.policy = host
    s = session(1, "user:1")
    host.session_started(s)
    b.allocate(s, "device", 10 * MIB, lambda: 0x1000)  # heard: no band yet
    # allocations up to 30 MiB and frees above 12 MiB quiet, at most 3 in a row
    policy.controls.quiet_memory(1, 0, 30 * MIB, 12 * MIB, 3)
    b.allocate(s, "device", 8 * MIB, lambda: 0x2000)   # 18: quiet, not asked
    b.allocate(s, "device", 4 * MIB, lambda: 0x3000)   # 22: quiet
    b.release(s, "device", 8 * MIB, 0x2000)            # 14: quiet (above the floor)
    assert [e for e, _ in policy.heard] == ["allocated"] and policy.asked == 1
    b.allocate(s, "device", 2 * MIB, lambda: 0x4000)   # 16: the fourth in a row: heard
    assert policy.asked == 2
    what, a = policy.heard[-1]
    assert what == "allocated" and (a.live, a.allocations, a.frees, a.high, a.low) == \
        (16 * MIB, 4, 1, 22 * MIB, 14 * MIB)
    b.allocate(s, "device", 20 * MIB, lambda: 0x5000)  # 36: past the ceiling: asked and heard
    assert policy.asked == 3 and policy.heard[-1][1].live == 36 * MIB
    b.release(s, "device", 20 * MIB, 0x5000)           # 16: quiet
    b.release(s, "device", 4 * MIB, 0x3000)            # 12: at the floor: heard
    what, a = policy.heard[-1]
    assert what == "freed" and (a.live, a.frees, a.high, a.low) == (12 * MIB, 3, 36 * MIB, 12 * MIB)
    policy.controls.quiet_memory(1, 0)                  # limit 0: every event heard again
    b.release(s, "device", 2 * MIB, 0x4000)
    assert policy.heard[-1][1].live == 10 * MIB and len(policy.heard) == 5
    b.allocate(s, "pinned", MIB, lambda: 0x6000)       # host memory: not in the counts
    assert policy.heard[-1][1].live == 10 * MIB
    events = {labels[2]: n for (key, labels), n in metrics.snapshot().labeled.items()
              if key == "policy_memory_events"}
    assert events == {"heard": 5, "quiet": 4}  # pinned memory is not counted
    host.session_ended(s)
    assert host.counts == {}
    policy.controls.quiet_memory(1, 0, 30 * MIB, 12 * MIB, 3)  # too late: nothing is kept for it
    assert host.counts == {}


def play(host: PolicyHost, b: ResourceBroker, s: Any, call: tuple[str, int],
         held: dict[int, list[int]], addresses: Any) -> None:
    """One call of a scripted job (bench/salus_step_shapes.py) through pilotd's broker and policy
    host, as a vGPU serves it: a launch is counted, and asked about only while the policy
    watches the session (as C's fast path does)."""
    what, size = call
    if what == "alloc":
        ptr = next(addresses)
        try:
            b.allocate(s, "device", size, lambda: ptr)
        except HoldForPolicy:
            pytest.fail("an allocation was held: the lanes should fit every job")
        held.setdefault(size, []).append(ptr)
    elif what == "free":
        b.release(s, "device", size, held[size].pop())
    else:
        s.kernels += 1
        if host.watches_launches(s.id) is not Watch.NONE:
            view = LaunchView(host.new_launch_id(), s.id, s.tenant, s.creds.pid, s.device, 0, "k",
                              (1, 1, 1), (1, 1, 1), 0, (), 0.0, 0.0, 1)
            assert host.launch_requested(view) is RUN
            host.launch_started(view)


def replay(quiet: bool, jobs: int = 2, steps: int = 40) -> dict[str, Any]:
    """PyTorch-like jobs (bench/salus_step_shapes.py) under salus through pilotd's policy host
    and broker, one call of each job in turn; with `quiet` off, every event is heard."""
    capacity = 8 * GIB
    policy = Salus(SalusSettings(scheduler="pack", capacity=capacity))
    now = [0.0]  # each call of the jobs 0.1 ms after the one before
    policy.clock = lambda: now[0]
    host = PolicyHost(policy, Metrics())
    b = ResourceBroker(Quotas(), Ledger(), GpuBudget({0: 64 * GIB}), Metrics())
    b.policy = host
    if not quiet:
        host.controls.quiet_memory = lambda *args, **kwargs: None  # type: ignore[method-assign]
    heard = {"allocated": 0, "freed": 0}
    for name in heard:
        event = getattr(policy, name)

        def hear(a: Any, event: Any = event, name: str = name) -> None:
            heard[name] += 1
            event(a)
        setattr(policy, name, hear)
    addresses = itertools.count(0x10000, 0x10000)
    streams = []
    for sid in range(1, jobs + 1):
        s = session(sid, f"user:{sid}")
        host.session_started(s)
        streams.append((s, job([64 * MIB, 16 * MIB], torch_like_step(), steps), {}))
    live = list(streams)
    while live:
        for entry in list(live):
            s, calls, held = entry
            call = next(calls, None)
            if call is None:
                live.remove(entry)
                continue
            now[0] += 1e-4
            play(host, b, s, call, held, addresses)
            lanes = policy.lanes[0] if policy.lanes else None
            assert lanes is None or lanes.used <= capacity
            j = policy.jobs[s.id]
            m = lanes.members.get(s.id) if lanes is not None else None
            if j.running and m is not None:  # nothing it holds is past what its lane counts
                assert j.detector.live <= m.persistent + m.ephemeral
    found = {sid: (j.detector.boundaries, j.detector.candidates, j.detector.period,
                   j.detector.persistent, j.detector.ephemeral, j.detector.live, j.detector.peak)
             for sid, j in policy.jobs.items()}
    return {"jobs": found, "state": policy.state(), "heard": heard}


def test_salus_learns_the_same_with_quiet_events_and_hears_far_fewer() -> None:
    loud, quiet = replay(quiet=False), replay(quiet=True)
    assert quiet["jobs"] == loud["jobs"]
    assert quiet["state"] == loud["state"]
    boundaries = [b for b, *_ in loud["jobs"].values()]
    assert all(b >= 30 for b in boundaries), boundaries  # one a step, once folded
    per_job = 2 + 40 * 13  # its state, then 13 allocations a step (and as many frees)
    assert loud["heard"]["allocated"] == 2 * per_job
    # a settled job's allocations are within its lane: heard only while it is learned
    assert quiet["heard"]["allocated"] < loud["heard"]["allocated"] / 4
    # this step's frees return to (or below) its level at 9 of its 13 (a PyTorch step: at
    # about 11 of 30-50): those are heard, and so are all of them while the job is learned
    assert quiet["heard"]["freed"] < loud["heard"]["freed"] * 0.8


def test_a_job_on_a_second_gpu_is_heard_in_full_on_both() -> None:
    """The detector counts a job's bytes over all its GPUs; a band is per GPU. Once the job
    uses a second GPU, the band of the first is lifted."""
    policy = Salus(SalusSettings(scheduler="pack", capacity=8 * GIB))
    now = [0.0]
    policy.clock = lambda: now[0]
    host = PolicyHost(policy, Metrics())
    b = ResourceBroker(Quotas(), Ledger(), GpuBudget({0: 64 * GIB, 1: 64 * GIB}), Metrics())
    b.policy = host
    s = session(1, "user:1")
    host.session_started(s)
    held: dict[int, list[int]] = {}
    addresses = itertools.count(0x10000, 0x10000)
    for call in job([64 * MIB, 16 * MIB], torch_like_step(), 20):
        now[0] += 1e-4
        play(host, b, s, call, held, addresses)
    assert host.counts[(1, 0)].quiet is not None  # settled, running, one GPU: quiet
    second = session(1, "user:1")
    second.device = 1
    b.allocate(second, "device", MIB, lambda: 0x900000)
    assert host.counts[(1, 0)].quiet is None and host.counts[(1, 1)].quiet is None
