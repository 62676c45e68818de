"""router/recovery.py: the fault monitor, the handover across the restart, the config keys and
the fault metrics (the end-to-end behaviour is tests/apps/test_gpu_faults.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from pilot.daemon.backends.base import STICKY_ERRORS, BackendError
from pilot.daemon.config import ConfigError, load_config
from pilot.daemon.router import recovery
from pilot.daemon.router.recovery import Fault, FaultMonitor, Handover, handover_from_environment
from pilot.daemon.telemetry.metrics import PilotCollector


class FakeBackend:
    def __init__(self) -> None:
        self.errors: dict[int, Any] = {}
        self.queries = 0

    def context_error(self, device: int) -> int:
        self.queries += 1
        err = self.errors.get(device, 0)
        if isinstance(err, Exception):
            raise err
        return err


def monitor(backend: FakeBackend, interval: float = 0.0) -> tuple[FaultMonitor, list[tuple]]:
    seen: list[tuple] = []
    m = FaultMonitor(backend, {3: 0, 5: 1}, interval, lambda *a: seen.append(a))  # type: ignore[arg-type]
    return m, seen


def wait_until(done: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not within 5 s"
        time.sleep(0.005)


def test_report_fires_once_for_sticky_errors_only() -> None:
    m, seen = monitor(FakeBackend())
    m.report(0, 2)  # out of memory: not context-fatal
    m.report(1, 1)
    assert seen == [] and not m.fired
    m.report(1, 700)
    m.report(0, 719)
    assert seen == [(5, 700, "call")] and m.fired  # host index of backend device 1


def test_reports_race_to_one_fault() -> None:
    m, seen = monitor(FakeBackend())
    threads = [threading.Thread(target=m.report, args=(0, 700)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1


def test_watch_notices_a_fault_nobody_calls_into() -> None:
    backend = FakeBackend()
    m, seen = monitor(backend, interval=0.005)
    m.start()
    try:
        time.sleep(0.05)
        assert seen == [] and backend.queries > 2
        backend.errors[1] = 716
        wait_until(lambda: bool(seen))
    finally:
        m.stop()
    assert seen == [(5, 716, "watch")]


def test_watch_takes_a_failing_query_as_the_fault() -> None:
    backend = FakeBackend()
    backend.errors[0] = BackendError(700, "cuCtxPushCurrent")
    m, seen = monitor(backend, interval=0.005)
    m.start()
    try:
        wait_until(lambda: bool(seen))
    finally:
        m.stop()
    assert seen == [(3, 700, "watch")]


def test_watch_off_at_interval_zero() -> None:
    backend = FakeBackend()
    m, _ = monitor(backend, interval=0)
    m.start()
    time.sleep(0.02)
    m.stop()
    assert backend.queries == 0


def test_handover_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    fault = Fault(gpu=1, error=700, detected=123.5, via="watch",
                  suspects=[{"session": 4, "tenant": "user:a", "pid": 9, "cmdline": "x"}], known=True)
    sent = Handover(fds={"main": 7, "control": 8}, faults=[fault], next_session=12)
    monkeypatch.setenv(recovery.RECOVERY_ENV, json.dumps(asdict(sent)))
    got = handover_from_environment()
    assert got == sent and recovery.RECOVERY_ENV not in os.environ
    assert got.faults[0].tenant == "user:a" and got.faults[0].name == "cudaErrorIllegalAddress"
    assert handover_from_environment() == Handover()  # gone once read


@pytest.mark.parametrize("raw", ["not json", "[1]", '{"faults": [{"nope": 1}]}', '{"fds": 3}'])
def test_malformed_handover_is_ignored(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(recovery.RECOVERY_ENV, raw)
    assert handover_from_environment() == Handover()


def test_close_on_exec_all_but_keeps_only_what_is_asked() -> None:
    import fcntl

    a, b = os.pipe()
    os.set_inheritable(a, True)
    os.set_inheritable(b, True)
    try:
        recovery._close_on_exec_all_but({b})
        assert fcntl.fcntl(a, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert not fcntl.fcntl(b, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(a)
        os.close(b)


def test_config_keys(tmp_path: Any) -> None:
    path = tmp_path / "pilotd.toml"
    path.write_text('[daemon]\nfault_recovery = "exit"\nfault_poll_interval = "5ms"\n')
    config = load_config(str(path), {})
    assert (config.fault_recovery, config.fault_poll_interval) == ("exit", 0.005)
    assert load_config(None, {}).fault_recovery == "restart"
    for bad in ('fault_recovery = "reboot"', 'fault_poll_interval = "2s"',
                'fault_poll_interval = "-1ms"'):
        path.write_text(f"[daemon]\n{bad}\n")
        with pytest.raises(ConfigError, match=r"daemon\.fault_"):
            load_config(str(path), {})


def test_fault_metrics() -> None:
    known = Fault(gpu=0, error=700, detected=10.0, via="call", restarted=11.25, known=True,
                  suspects=[{"session": 1, "tenant": "user:bob", "pid": 2, "cmdline": ""}])
    unknown = Fault(gpu=0, error=719, detected=20.0, via="watch", suspects=[])
    two = Fault(gpu=1, error=700, detected=30.0, via="call", suspects=[
        {"session": 1, "tenant": "user:bob", "pid": 2, "cmdline": ""},
        {"session": 3, "tenant": "user:bob", "pid": 4, "cmdline": ""}])
    assert two.tenant == "user:bob" and unknown.tenant == "unknown"
    families = {f.name: f for f in PilotCollector._fault_families(
        [{**asdict(f), "tenant": f.tenant} for f in (known, unknown, two)])}
    samples = {tuple(s.labels.values()): s.value for s in families["pilot_gpu_faults"].samples
               if s.name.endswith("_total")}
    assert samples == {("0", "700", "user:bob"): 1, ("0", "719", "unknown"): 1,
                       ("1", "700", "user:bob"): 1}
    (recovered,) = families["pilot_gpu_fault_recovery_seconds"].samples
    assert recovered.value == pytest.approx(1.25)


def _suspect(tenant: str, session: int = 1) -> dict[str, Any]:
    return {"session": session, "tenant": tenant, "pid": session, "cmdline": ""}


def test_who_a_fault_isolates() -> None:
    known = Fault(gpu=0, error=700, detected=100.0, via="call", suspects=[_suspect("user:a")])
    assert list(recovery.repeat_suspects([known])) == ["user:a"]
    # two tenants in flight: nobody at the first fault...
    first = Fault(gpu=0, error=700, detected=100.0, via="call",
                  suspects=[_suspect("user:a"), _suspect("user:b", 2)])
    assert recovery.repeat_suspects([first]) == {}
    # ...but whoever is in flight again at the next one within the hour
    second = Fault(gpu=0, error=700, detected=200.0, via="call",
                   suspects=[_suspect("user:a"), _suspect("user:c", 3)])
    assert list(recovery.repeat_suspects([first, second])) == ["user:a"]
    late = Fault(gpu=0, error=700, detected=100.0 + recovery.SUSPECT_WINDOW + 1, via="call",
                 suspects=[_suspect("user:b"), _suspect("user:d", 4)])
    assert recovery.repeat_suspects([first, late]) == {}
    assert recovery.repeat_suspects([Fault(gpu=0, error=700, detected=1.0, via="watch")]) == {}


def test_an_mps_termination_isolates_nobody() -> None:
    """Under [isolation] mps the MPS server ends a client that had work running at another
    client's fault (cudaErrorMpsClientTerminated): this process restarts like after a fault of
    its own, but its tenant in flight did nothing wrong."""
    ended = Fault(gpu=0, error=810, detected=100.0, via="watch", suspects=[_suspect("user:a")])
    assert 810 in STICKY_ERRORS and ended.name == "cudaErrorMpsClientTerminated"
    assert recovery.repeat_suspects([ended]) == {}
    assert recovery.repeat_suspects([Fault(gpu=0, error=700, detected=50.0, via="call",
                                           suspects=[_suspect("user:a"), _suspect("user:b", 2)]),
                                     ended]) == {}


def test_engine_faults_recorded_for_the_pilotd_that_started_them(tmp_path: Any) -> None:
    """An isolated tenant's pilotd appends its faults to the state directory; the pilotd that
    started it reads them (metrics, status). An MPS termination (another client's fault) is not
    the engine's own and is left out; a line that is not a fault's is skipped."""
    state = str(tmp_path)
    assert recovery.read_engine_faults(state) == []
    recovery.record_engine_fault(state, Fault(gpu=0, error=700, detected=10.0, via="call"), "user:a")
    recovery.record_engine_fault(state, Fault(gpu=0, error=810, detected=11.0, via="watch"), "user:b")
    with open(tmp_path / recovery.ENGINE_FAULTS_FILE, "a") as f:
        f.write("not json\n{\"gpu\": 1}\n")
    recovery.record_engine_fault(state, Fault(gpu=1, error=719, detected=12.0, via="watch"), "user:c")
    faults = recovery.read_engine_faults(state)
    assert [(f["gpu"], f["error"], f["tenant"], f["name"]) for f in faults] == [
        (0, 700, "user:a", "cudaErrorIllegalAddress"), (1, 719, "user:c", "cudaErrorLaunchFailure")]
    assert oct((tmp_path / recovery.ENGINE_FAULTS_FILE).stat().st_mode & 0o777) == "0o600"
    families = {f.name: f for f in PilotCollector._fault_families([], faults)}
    samples = {tuple(s.labels.values()): s.value for s in families["pilot_gpu_faults"].samples
               if s.name.endswith("_total")}
    assert samples == {("0", "700", "user:a"): 1, ("1", "719", "user:c"): 1}


def test_engine_faults_read_only_from_the_end(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "ENGINE_FAULTS_READ", 300)
    for i in range(20):
        recovery.record_engine_fault(str(tmp_path), Fault(gpu=0, error=700, detected=float(i),
                                                          via="call"), "user:a")
    faults = recovery.read_engine_faults(str(tmp_path))
    assert 1 <= len(faults) < 20 and faults[-1]["detected"] == 19.0
    assert [f["detected"] for f in faults] == sorted(f["detected"] for f in faults)


def test_engine_faults_file_is_cut_back(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant faulting its engine over and over: the file stays below twice what is read, in
    whole lines, the newest last, still private."""
    monkeypatch.setattr(recovery, "ENGINE_FAULTS_READ", 1000)
    path = tmp_path / recovery.ENGINE_FAULTS_FILE
    for i in range(200):
        recovery.record_engine_fault(str(tmp_path), Fault(gpu=0, error=700, detected=float(i),
                                                          via="call"), "user:a")
        assert path.stat().st_size <= 2 * 1000 + 200
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(line.startswith(b"{") for line in lines[:-1])
    faults = recovery.read_engine_faults(str(tmp_path))
    assert faults[-1]["detected"] == 199.0 and len(faults) >= 5
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == [recovery.ENGINE_FAULTS_FILE]
