"""The resource broker's accounting (charge, refund, adjust, session release, refusals) and the
policy host's guarantees (a failing policy never fails a launch; decisions are counted once;
events reach the policy in order), without a daemon."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from broker_fakes import Quotas, session

from pilot.daemon.backends.base import BackendError
from pilot.daemon.resources.broker import GpuBudget, ResourceBroker
from pilot.daemon.resources.tenants import HOST, Ledger, QuotaStore
from pilot.daemon.scheduling.policy_host import PolicyHost
from pilot.daemon.telemetry.metrics import Metrics
from pilot.policies import RUN, Decision, LaunchView, Policy, Verdict, Watch

MiB = 1 << 20


class Recorder(Policy):
    name = "recorder-test"
    decides_launches = True

    def __init__(self, answer: Any = RUN) -> None:
        super().__init__()
        self.answer = answer
        self.events: list[tuple[str, Any]] = []

    def allocated(self, a: Any) -> None:
        self.events.append(("allocated", (a.kind, a.size)))

    def freed(self, a: Any) -> None:
        self.events.append(("freed", (a.kind, a.size)))

    def session_ended(self, s: Any) -> None:
        self.events.append(("ended", s.id))

    def launch_requested(self, launch: LaunchView) -> Decision:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def broker(hard: int | None = None, capacity: int = 100 * MiB, pinned: int | None = None,
           pinned_per_tenant: int | None = None) -> tuple[ResourceBroker, Metrics]:
    metrics = Metrics()
    return ResourceBroker(Quotas(hard), Ledger(), GpuBudget({0: capacity}), metrics, pinned,
                          pinned_per_tenant), metrics


def refusals(metrics: Metrics) -> dict[tuple[str, ...], float]:
    return {labels: n for (key, labels), n in metrics.snapshot().labeled.items()
            if key == "allocation_refusals"}


def test_every_gpu_kind_counts_against_one_hard_quota() -> None:
    b, metrics = broker(hard=10 * MiB)
    s = session()
    for kind in ("device", "pitch", "managed", "module"):
        b.charge(s, kind, 2 * MiB)
    with pytest.raises(BackendError) as info:
        b.charge(s, "limit", 3 * MiB)
    assert info.value.code == 2  # cudaErrorMemoryAllocation
    b.charge(s, "limit", 2 * MiB)  # exactly the quota
    assert b.ledger.usage("user:a", 0) == 10 * MiB and b.budget.used(0) == 10 * MiB
    assert s.charged == dict.fromkeys(("device", "pitch", "managed", "module", "limit"), 2 * MiB)
    assert refusals(metrics) == {("user:a", "limit", "quota"): 1}


def test_capacity_refusal_gives_the_ledger_back() -> None:
    b, metrics = broker(capacity=4 * MiB)
    s = session()
    with pytest.raises(BackendError):
        b.charge(s, "device", 5 * MiB)
    assert b.ledger.usage("user:a", 0) == 0 and s.charged == {}
    assert refusals(metrics) == {("user:a", "device", "capacity"): 1}


def test_pinned_memory_has_limits_of_its_own() -> None:
    b, _ = broker(hard=1 * MiB, pinned=8 * MiB, pinned_per_tenant=5 * MiB)
    a, c = session(1, "user:a"), session(2, "user:c")
    b.charge(a, "pinned", 4 * MiB)  # not against the 1 MiB GPU quota
    with pytest.raises(BackendError):
        b.charge(a, "pinned", 2 * MiB)  # per tenant
    b.charge(c, "pinned", 4 * MiB)
    with pytest.raises(BackendError):
        b.charge(c, "pinned", 1)  # every tenant together
    assert b.ledger.usage("user:a", HOST) == 4 * MiB and b.ledger.usage("user:a", 0) == 0


def test_a_failed_allocation_is_refunded_and_not_reported() -> None:
    b, _ = broker()
    policy = Recorder()
    b.policy = PolicyHost(policy, Metrics())
    s = session()

    def fail() -> int:
        raise BackendError(2, "out of memory")

    with pytest.raises(BackendError):
        b.allocate(s, "device", 3 * MiB, fail)
    assert b.budget.used(0) == 0 and s.charged == {} and policy.events == []
    assert b.allocate(s, "device", 3 * MiB, lambda: 0x1000) == 0x1000
    assert policy.events == [("allocated", ("device", 3 * MiB))]


def test_adjust_and_session_release_keep_the_policy_and_the_ledger_in_step() -> None:
    b, _ = broker()
    policy = Recorder()
    host = PolicyHost(policy, Metrics())
    b.policy = host
    s = session()
    b.allocate(s, "device", 1 * MiB, lambda: 0x1000)
    b.adjust(s, "limit", 0, 4 * MiB)
    b.adjust(s, "limit", 4 * MiB, 3 * MiB)
    b.allocate(s, "module", 2 * MiB, object, ptr_of=lambda _module: 0)  # a module load
    released = b.release_session(s, [("device", 0x1000, 1 * MiB)])
    host.session_ended(s)
    assert released == {"device": 1 * MiB, "limit": 3 * MiB, "module": 2 * MiB}
    assert b.ledger.usage("user:a", 0) == 0 and b.budget.used(0) == 0 and s.charged == {}
    heard: dict[str, int] = {}
    for event, (kind, size) in [e for e in policy.events if e[0] != "ended"]:
        heard[kind] = heard.get(kind, 0) + (size if event == "allocated" else -size)
    assert heard == {"device": 0, "limit": 0, "module": 0}  # every byte heard allocated and freed
    assert policy.events[-1] == ("ended", 1)


def view(attempts: int = 1) -> LaunchView:
    return LaunchView(id=1, session=1, tenant="user:a", pid=101, gpu=0, vgpu=0, kernel="k",
                      grid=(1, 1, 1), block=(1, 1, 1), stream=0, footprint=(), requested_at=0.0,
                      now=0.0, attempts=attempts)


def test_a_policy_that_raises_or_answers_nonsense_lets_the_launch_run(caplog: Any) -> None:
    for answer in (RuntimeError("bug"), "yes"):
        host = PolicyHost(Recorder(answer), Metrics())
        assert host.launch_requested(view()).verdict is Verdict.RUN
    assert "launch_requested" in caplog.text


class Watcher(Recorder):
    """Decides launches of the sessions it watches only (Policy.watches_launches)."""

    def __init__(self, watch: Any) -> None:
        super().__init__()
        self.watch = watch

    def watches_launches(self, session: int) -> Watch:
        if isinstance(self.watch, Exception):
            raise self.watch
        return self.watch


def test_a_policy_watches_sessions_one_by_one_only_if_it_says_so(caplog: Any) -> None:
    assert not PolicyHost(Recorder(), Metrics()).selective  # the default: every launch seen
    assert PolicyHost(Recorder(), Metrics()).watches_launches(1) is Watch.ALL
    assert PolicyHost(Watcher(Watch.NONE), Metrics()).selective
    assert PolicyHost(Watcher(Watch.NEXT), Metrics()).watches_launches(1) is Watch.NEXT
    # a policy that fails or answers nonsense sees every launch of the session
    for answer in (RuntimeError("bug"), True):
        assert PolicyHost(Watcher(answer), Metrics()).watches_launches(1) is Watch.ALL
    assert "watches_launches" in caplog.text


def test_decisions_are_counted_once_per_launch() -> None:
    metrics = Metrics()
    host = PolicyHost(Recorder(Decision.wait("full")), metrics)
    for attempt in (1, 2, 3):
        assert host.launch_requested(view(attempt)).verdict is Verdict.WAIT
    counted = {labels: n for (key, labels), n in metrics.snapshot().labeled.items()
               if key == "policy_decisions"}
    assert counted == {("recorder-test", "user:a", "wait"): 1}


def test_describe_lists_the_policy_and_every_name() -> None:
    doc = PolicyHost(Recorder(), Metrics(), max_wait=5).describe()
    assert doc["name"] == "recorder-test" and doc["max_wait_s"] == 5
    assert doc["available"]["none"]["implemented"] and doc["available"]["salus"]["implemented"]


def test_calls_held_behind_a_waiting_launch_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that keeps posting while its launch waits cannot grow pilotd without end: past
    MAX_HELD_BYTES the queue refuses (and the vGPU then ends the session); replay frees room."""
    from collections import deque

    from pilot.daemon.protocol import ffi
    from pilot.daemon.scheduling import waiting

    monkeypatch.setattr(waiting, "MAX_HELD_BYTES", 1000)
    frames = [bytearray(b"e" * 40), bytearray(b"b" * 60), bytearray(b"p" * 300)]
    msg = SimpleNamespace(conn=7, nframes=3, frame=[ffi.from_buffer(f) for f in frames],
                          len=[len(f) for f in frames])
    handled: list[bytes] = []
    vg = SimpleNamespace(sessions={1: None}, handle=lambda m: handled.append(bytes(m._bufs[2])))
    q = waiting.WaitQueue(vg)  # type: ignore[arg-type]
    s = SimpleNamespace(id=1, tenant="user:a", waiting=object(), backlog=deque(), backlog_bytes=0,
                        gate_held=0.0)
    assert q.hold(s, msg) and q.hold(s, msg)  # 400 bytes each
    assert not q.hold(s, msg) and len(s.backlog) == 2 and s.backlog_bytes == 800
    frames[2][:] = b"q" * 300  # the held copies do not change with the receive buffer
    s.waiting = None
    q.replay(s)
    assert handled == [b"p" * 300] * 2 and s.backlog_bytes == 0 and not s.backlog


def test_provisioned_memory_is_withheld_from_other_tenants(tmp_path: Any) -> None:
    """b is provisioned 60 MiB of a 100 MiB GPU: a gets at most the other 40 while b holds
    nothing, more as b's own allocations use its guarantee up; b always gets its 60. What a's
    cudaMemGetInfo reports leaves b's unused guarantee out too."""
    quotas = QuotaStore(str(tmp_path))
    quotas.set("user:b", 0, hard=None, provisioned=60 * MiB)
    metrics = Metrics()
    b = ResourceBroker(quotas, Ledger(), GpuBudget({0: 100 * MiB}), metrics)
    a_s, b_s = session(1, "user:a"), session(2, "user:b")
    b.charge(a_s, "device", 30 * MiB)
    assert b.memory_limits(a_s, 1 << 40) == (10 * MiB, 100 * MiB)
    with pytest.raises(BackendError):
        b.charge(a_s, "managed", 20 * MiB)  # 50 would eat into b's 60
    assert refusals(metrics) == {("user:a", "managed", "provisioned"): 1}
    b.charge(a_s, "device", 10 * MiB)  # 40: exactly what is not provisioned
    b.charge(b_s, "device", 60 * MiB)  # b's guarantee, all of it, although a came first
    assert b.budget.used(0) == 100 * MiB
    b.refund(b_s, "device", 20 * MiB)  # b's unused 20 are b's again, not a's
    with pytest.raises(BackendError):
        b.charge(a_s, "device", 1 * MiB)
    b.charge(b_s, "device", 20 * MiB)
    quotas.set("user:b", 0, hard=None, provisioned=None)
    b.refund(b_s, "device", 60 * MiB)
    b.charge(a_s, "device", 60 * MiB)  # no guarantee left: a may take the whole GPU


def test_a_managed_limit_refusal_names_the_limit_and_how_to_raise_it(caplog: Any) -> None:
    metrics = Metrics()
    b = ResourceBroker(Quotas(), Ledger(), GpuBudget({0: 100 * MiB}), metrics,
                       movable=frozenset({"managed"}), managed_limits={0: 8 * MiB})
    s = session()
    b.charge(s, "managed", 6 * MiB)
    with pytest.raises(BackendError) as info:
        b.charge(s, "managed", 4 * MiB)
    assert "managed memory limit 8388608" in str(info.value) and "[gpu] managed_limit" in str(info.value)
    assert "raise it" in caplog.text and refusals(metrics) == {("user:a", "managed", "capacity"): 1}
    with pytest.raises(BackendError) as info:  # the GPU's capacity: no word of the managed limit
        b.charge(s, "device", 101 * MiB)
    assert "managed_limit" not in str(info.value)


def test_packed_managed_ranges_are_reported_until_released() -> None:
    b, _ = broker()
    s = session()
    for ptr in (0x1000000, 0x1200000):
        b.allocate(s, "managed", 2 * MiB, lambda p=ptr: p)
        b.packed_range(s, ptr, 2 * MiB)
    b.allocate(s, "managed", 3 * MiB, lambda: 0x2000000)  # a range of its own
    usage = b.tenant_usage("user:a", [0])["0"]
    assert usage["packed_managed"] == 4 * MiB and usage["by_kind"] == {"managed": 7 * MiB}
    b.release(s, "managed", 2 * MiB, 0x1000000)
    b.release(s, "managed", 3 * MiB, 0x2000000)
    assert b.tenant_usage("user:a", [0])["0"]["packed_managed"] == 2 * MiB
    b.release_session(s, [("managed", 0x1200000, 2 * MiB)])
    usage = b.tenant_usage("user:a", [0])["0"]
    assert (usage["packed_managed"], usage["used"], s.packed_ranges) == (0, 0, set())


class Gatekeeper(Recorder):
    """Answers allocation_requested with `allocation` (a Decision, or an exception to raise)."""

    def __init__(self, allocation: Any) -> None:
        super().__init__()
        self.allocation = allocation

    def allocation_requested(self, a: Any) -> Decision:
        self.events.append(("requested", (a.kind, a.size, a.ptr)))
        if isinstance(self.allocation, Exception):
            raise self.allocation
        return self.allocation


def test_a_policy_is_asked_before_an_allocation_is_charged() -> None:
    """Issue 30: the salus policy keeps its lanes within C by construction only if it can say
    no before memory is taken. REFUSE: cudaErrorMemoryAllocation, nothing charged, reason
    "policy"; WAIT: HoldForPolicy (the vGPU holds the call), nothing charged, the session
    held; a failing policy lets the allocation be made."""
    from pilot.daemon.resources.broker import HoldForPolicy
    b, metrics = broker()
    s = session()
    s.policy_hold = None
    policy = Gatekeeper(Decision.refuse("salus: past C"))
    b.policy = PolicyHost(policy, Metrics())
    with pytest.raises(BackendError) as info:
        b.allocate(s, "device", 4 * MiB, lambda: 0x1000)
    assert info.value.code == 2 and b.budget.used(0) == 0 and s.charged == {}
    assert refusals(metrics) == {("user:a", "device", "policy"): 1}
    assert policy.events == [("requested", ("device", 4 * MiB, 0))]  # never "allocated"
    policy.allocation = Decision.wait("no room yet")
    with pytest.raises(HoldForPolicy):
        b.allocate(s, "device", 4 * MiB, lambda: 0x1000)
    assert b.budget.used(0) == 0 and s.policy_hold == "no room yet"
    s.policy_hold = None
    policy.allocation = RuntimeError("a bug")
    assert b.allocate(s, "device", 4 * MiB, lambda: 0x1000) == 0x1000
    policy.allocation = RUN
    assert b.allocate(s, "device", 4 * MiB, lambda: 0x2000) == 0x2000
    assert b.budget.used(0) == 8 * MiB and policy.events[-1] == ("allocated", ("device", 4 * MiB))


def test_a_policy_that_does_not_ask_costs_no_lock() -> None:
    host = PolicyHost(Recorder(), Metrics())
    host._lock = None  # type: ignore[assignment]  # would raise if taken
    assert host.allocation_requested(session(), "device", MiB) is RUN


def test_a_vgpu_thread_hears_its_memory_events_after_the_reply_but_before_any_question() -> None:
    """A vGPU thread defers allocated and freed (they run once the reply is sent); every
    question the policy is asked on that thread (an allocation, a launch) first runs them, in
    order, so no decision sees stale state. Other threads are not deferred."""
    import threading

    b, _ = broker()
    s = session()
    s.policy_hold = None
    policy = Gatekeeper(RUN)
    host = b.policy = PolicyHost(policy, Metrics())
    woken: list[int] = []
    host.wake = lambda: woken.append(1)
    seen: list[Any] = []

    def vgpu() -> None:
        host.defer_memory_events()
        b.allocate(s, "device", 4 * MiB, lambda: 0x1000)
        b.release(s, "device", 4 * MiB, 0x1000)
        seen.append(list(policy.events))  # the reply would be sent here
        b.allocate(s, "device", 2 * MiB, lambda: 0x2000)  # asks first: both events run before
        seen.append(list(policy.events))
        host.run_deferred()
        seen.append(list(policy.events))

    t = threading.Thread(target=vgpu)
    t.start()
    t.join()
    asked = ("requested", ("device", 4 * MiB, 0))
    assert seen[0] == [asked]
    assert seen[1] == [asked, ("allocated", ("device", 4 * MiB)), ("freed", ("device", 4 * MiB)),
                       ("requested", ("device", 2 * MiB, 0))]
    assert seen[2] == seen[1] + [("allocated", ("device", 2 * MiB))]
    assert woken  # a freed event wakes waiting launches, deferred or not
    b.release(s, "device", 2 * MiB, 0x2000)  # this thread does not defer: heard at once
    assert policy.events[-1] == ("freed", ("device", 2 * MiB))


def test_memory_events_a_policy_does_not_override_cost_nothing() -> None:
    """`none` (no allocated/freed of its own): no view, no lock; a free still wakes waiting
    launches."""
    host = PolicyHost(Policy(), Metrics())
    host._lock = None  # type: ignore[assignment]  # would raise if taken
    woken: list[int] = []
    host.wake = lambda: woken.append(1)
    host.allocated(session(), "device", 0x1000, MiB)
    host.freed(session(), "device", 0x1000, MiB)
    assert woken == [1]
