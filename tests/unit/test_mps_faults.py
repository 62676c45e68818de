"""A fault under MPS ([isolation] mps, router/mps.py): the MPS server tears down every client, so
the top pilotd names the culprit from the MPS server's log and marks its tenant to run without
MPS; that tenant's engines are then processes without MPS. The log parser itself: test_mps.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot.daemon.config import Config
from pilot.daemon.resources.broker import GpuBudget
from pilot.daemon.router import isolation, mps
from pilot.daemon.router.isolation import Engine, Engines, IsolationList
from pilot.daemon.router.server import Daemon

ILLEGAL_ADDRESS = 700
OTHER_TENANT_SESSION = {"session": 4, "tenant": "user:v", "pid": 555, "cmdline": "./busy"}


@pytest.fixture(autouse=True)
def quick_log_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mps, "FAULT_LOG_WAIT", 0.0)


def engines_for(tmp_path: Path, marks: IsolationList, argv: list[str] | None = None) -> Engines:
    return Engines(str(tmp_path / "run" / "pilot.sock"), GpuBudget({0: 1 << 30}), [0], None,
                   argv=argv or ["pilotd"], mps=True, without_mps=marks.without_mps)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """Just what the top pilotd's fault path uses, in the confined mode."""
    d = Daemon.__new__(Daemon)
    d.config = Config(state_dir=str(tmp_path / "state"), isolation_tenants=("all",),
                      isolation_mps=True)
    d.faults = []
    d._watched = {}
    d.isolation = IsolationList(d.config.state_dir, d.config.isolation_tenants)
    d.engines = engines_for(tmp_path, d.isolation)
    d.engines._engines["user:a"] = Engine("user:a", 1153, "/a.sock", 0.0, 0, mps=True)
    d.engines._engines["user:v"] = Engine("user:v", 1118, "/v.sock", 0.0, 0, mps=True)
    d._mps_log_dir = str(tmp_path / "log")
    os.makedirs(d._mps_log_dir)
    Path(d._mps_log_dir, mps.SERVER_LOG).write_text(
        "[t] Client {PID: 1118, Context: 1} encountered a fatal GPU error.\n")  # before it started
    d._mps_log_offset = mps.server_log_size(d._mps_log_dir)
    r, w = os.pipe()
    d._fault_wake_w = w
    yield d
    os.close(r)
    os.close(w)


def server_logs(d: Daemon, pid: int) -> None:
    with open(os.path.join(d._mps_log_dir, mps.SERVER_LOG), "a") as f:
        f.write(f"[t] Client {{PID: {pid}, Context: 1}} encountered a fatal GPU error.\n"
                "[t] Server is handling a fatal GPU error.\n")


def notice(d: Daemon) -> None:
    """A fault as pilotd sees it: noticed (any thread; the router is woken at once), then
    attributed in the router thread before the restart (Daemon._after_fault)."""
    d._fault_noticed(0, ILLEGAL_ADDRESS, "watch")
    assert d.isolation.describe()["marked"] == {} and not d.faults[-1].known  # not yet
    d._mps_attribute(d.faults[-1])


def test_an_engines_fault_marks_its_tenant_without_mps(daemon: Daemon,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    server_logs(daemon, 1153)
    with caplog.at_level("WARNING"):
        notice(daemon)
    assert daemon.isolation.without_mps("user:a") and not daemon.isolation.without_mps("user:v")
    mark = daemon.isolation.describe()["marked"]["user:a"]
    assert mark["mps"] is False and "pid 1153 in the MPS server's log" in mark["why"]
    assert "tenant user:a's kernel faulted under MPS (pid 1153" in caplog.text
    stored = json.loads(Path(daemon.isolation.path).read_text())["tenants"]
    assert stored["user:a"]["mps"] is False  # persisted: the restarted process reads it


def test_this_processs_sessions_are_bystanders_of_an_engines_fault(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under MPS every client gets the error: a busy session here did not fault."""
    monkeypatch.setattr(daemon, "_fault_suspects", lambda gpu: [OTHER_TENANT_SESSION])
    server_logs(daemon, 1153)
    notice(daemon)
    fault = daemon.faults[-1]
    assert fault.suspects == [] and not fault.known and fault.tenant == "unknown"
    assert fault.bystander and fault.culprit == "user:a"  # counted apart, naming whose it was
    assert set(daemon.isolation.describe()["marked"]) == {"user:a"}


def test_a_bystander_is_a_teardown_in_the_metrics_not_a_fault(daemon: Daemon) -> None:
    from dataclasses import asdict

    from pilot.daemon.telemetry.metrics import PilotCollector
    server_logs(daemon, 1153)
    notice(daemon)
    own = {"gpu": 0, "error": ILLEGAL_ADDRESS, "tenant": "user:a"}  # user:a's engine, exported
    families = {m.name: m for m in PilotCollector._fault_families(
        [{**asdict(f), "tenant": f.tenant} for f in daemon.faults], [own])}
    faults = {tuple(s.labels.values()): s.value for s in families["pilot_gpu_faults"].samples}
    torn = {tuple(s.labels.values()): s.value for s in families["pilot_gpu_mps_teardowns"].samples}
    assert faults == {("0", str(ILLEGAL_ADDRESS), "user:a"): 1}  # one fault, the culprit's
    assert torn == {("0", "user:a"): 1}


def test_a_bystander_engine_records_no_fault_of_its_tenant(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H100 every client got error 700 (not 810): an engine torn down for another
    client's fault must not export one of its own tenant (the culprit's engine exports it)."""
    daemon.config = Config(state_dir=daemon.config.state_dir, isolation_tenants=("all",),
                           isolation_mps=True, isolated_tenant="user:v")
    os.makedirs(daemon.config.state_dir, exist_ok=True)
    server_logs(daemon, 1153)
    notice(daemon)
    assert not (Path(daemon.config.state_dir) / "engine-faults.jsonl").exists()
    server_logs(daemon, os.getpid())  # its own, next time: exported
    notice(daemon)
    lines = (Path(daemon.config.state_dir) / "engine-faults.jsonl").read_text().splitlines()
    assert [json.loads(line)["tenant"] for line in lines] == ["user:v"]


def test_its_own_fault_leaves_it_to_the_suspects(daemon: Daemon,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "_fault_suspects", lambda gpu: [OTHER_TENANT_SESSION])
    server_logs(daemon, os.getpid())
    notice(daemon)
    assert daemon.faults[-1].known
    marked = daemon.isolation.describe()["marked"]
    assert set(marked) == {"user:v"} and marked["user:v"]["mps"] is False  # it faulted under MPS


def test_no_line_marks_nobody(daemon: Daemon, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(daemon, "_fault_suspects", lambda gpu: [OTHER_TENANT_SESSION])
    with caplog.at_level("WARNING"):
        notice(daemon)
    assert daemon.isolation.describe()["marked"] == {}  # the line before its start is not this one
    assert "names no client with a fatal GPU error" in caplog.text
    assert daemon.faults[-1].suspects == []


def test_after_fault_off_marks_nobody(daemon: Daemon) -> None:
    daemon.config = Config(state_dir=daemon.config.state_dir, isolation_tenants=("all",),
                           isolation_mps=True, isolation_after_fault=False)
    server_logs(daemon, 1153)
    notice(daemon)
    assert daemon.isolation.describe()["marked"] == {}


def test_an_engine_tells_another_clients_fault_from_its_own(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine marks nobody, but its log no longer blames its busy tenant."""
    daemon.config = Config(state_dir=daemon.config.state_dir, isolation_tenants=("all",),
                           isolation_mps=True, isolated_tenant="user:v")
    monkeypatch.setattr(daemon, "_fault_suspects", lambda gpu: [OTHER_TENANT_SESSION])
    server_logs(daemon, 1153)
    notice(daemon)
    assert daemon.faults[-1].suspects == [] and daemon.isolation.describe()["marked"] == {}


def test_a_mark_keeps_its_mps_field(tmp_path: Path) -> None:
    marks = IsolationList(str(tmp_path), ())
    marks.mark("user:a", "its kernel faulted under MPS", mps=False)
    marks.mark("user:a", "pilotctl isolate set")  # an operator's mark does not bring MPS back
    marks.mark("user:b", "pilotctl isolate set")
    again = IsolationList(str(tmp_path), ())
    assert again.without_mps("user:a") and again.isolated("user:b")
    assert not again.without_mps("user:b") and not again.without_mps("user:c")
    assert "mps" not in again.describe()["marked"]["user:b"]
    assert again.clear("user:a") and not again.without_mps("user:a")


class FakePopen:
    started: list[tuple[list[str], dict[str, str]]] = []

    def __init__(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> None:
        FakePopen.started.append((cmd, env))
        self.pid = 4242 + len(FakePopen.started)


def test_an_engine_of_a_tenant_without_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation.subprocess, "Popen", FakePopen)
    FakePopen.started = []
    monkeypatch.setenv(mps.PIPE_ENV, str(tmp_path / "mps" / "pipe"))
    monkeypatch.setenv(mps.LOG_ENV, str(tmp_path / "mps" / "log"))
    marks = IsolationList(str(tmp_path), ("all",))
    marks.mark("user:a", "its kernel faulted under MPS", mps=False)
    engines = engines_for(tmp_path, marks, argv=["pilotd", "--config", "x.toml"])
    a = engines._start("user:a")
    v = engines._start("user:v")
    (a_cmd, a_env), (v_cmd, v_env) = FakePopen.started
    assert a_cmd[-3:] == ["--isolated-tenant", "user:a", "--without-mps"] and not a.mps
    assert a_env[mps.PIPE_ENV] == str(tmp_path / "mps" / mps.NO_MPS_DIR) and mps.LOG_ENV not in a_env
    assert v_cmd[-2:] == ["--isolated-tenant", "user:v"] and v.mps
    assert v_env[mps.PIPE_ENV] == str(tmp_path / "mps" / "pipe")
    confinements = {e["tenant"]: e["confinement"] for e in engines.describe()}
    assert confinements == {"user:a": "engine", "user:v": "confined"}
    assert {e["tenant"]: e["mps"] for e in engines.handover()} == {"user:a": False, "user:v": True}


def test_adopt_stops_an_mps_engine_of_a_tenant_leaving_mps(tmp_path: Path) -> None:
    """The top pilotd marked the tenant at the fault, then restarted in place: the new process
    stops the engine still an MPS client; the tenant's next program starts one without MPS."""
    marks = IsolationList(str(tmp_path), ("all",))
    marks.mark("user:a", "its kernel faulted under MPS", mps=False)
    a = subprocess.Popen(["sleep", "30"])
    v = subprocess.Popen(["sleep", "30"])
    try:
        engines = engines_for(tmp_path, marks)
        engines.adopt([{"tenant": "user:a", "pid": a.pid, "socket": "/a", "started": 0.0,
                        "capacity": 0, "withheld": 0, "mps": True},
                       {"tenant": "user:v", "pid": v.pid, "socket": "/v", "started": 0.0,
                        "capacity": 0, "withheld": 0}])  # no "mps": as this pilotd's engines
        assert [e["tenant"] for e in engines.describe()] == ["user:v"]
        assert engines.describe()[0]["confinement"] == "confined"
        assert not os.path.exists(f"/proc/{a.pid}")  # stopped and reaped
    finally:
        v.kill()
        v.wait()


def test_the_next_program_replaces_an_mps_engine_of_a_tenant_leaving_mps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Marked while its MPS engine runs (a SIGHUP re-read the marks): the tenant's next HELLO."""
    child = subprocess.Popen(["sleep", "30"])  # before Popen is the fake's
    monkeypatch.setattr(isolation.subprocess, "Popen", FakePopen)
    FakePopen.started = []
    monkeypatch.setenv(mps.PIPE_ENV, str(tmp_path / "mps" / "pipe"))
    marks = IsolationList(str(tmp_path), ("all",))
    engines = engines_for(tmp_path, marks)
    engines._engines["user:a"] = Engine("user:a", child.pid, "/a", 0.0, 0, mps=True)
    assert engines.socket_for("user:a") == "/a"  # not marked: kept
    marks.mark("user:a", "its kernel faulted under MPS", mps=False)
    path = engines.socket_for("user:a")
    assert path.endswith("pilot.sock") and not os.path.exists(f"/proc/{child.pid}")
    assert FakePopen.started[-1][0][-1] == "--without-mps"
