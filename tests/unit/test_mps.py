"""pilotd's part in MPS (router/mps.py) that needs no control daemon: which process starts one,
an engine without the environment, where sessions run, the private directory's limits. The
control daemon's lifecycle with a stand-in program: tests/apps/test_mps_confine.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pilot.daemon.config import Config
from pilot.daemon.router import mps
from pilot.daemon.router.isolation import confinement


@pytest.fixture(autouse=True)
def no_mps_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (mps.PIPE_ENV, mps.LOG_ENV):
        monkeypatch.delenv(name, raising=False)


def test_where_sessions_run() -> None:
    assert confinement(Config()) == "shared"
    assert confinement(Config(isolation_mps=True, isolation_tenants=("all",))) == "shared"
    assert confinement(Config(isolated_tenant="user:a")) == "engine"
    assert confinement(Config(isolated_tenant="user:a", isolation_mps=True)) == "confined"


def test_only_the_top_pilotd_starts_a_control_daemon(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    started: list[str] = []
    monkeypatch.setattr(mps, "start", lambda program, state, restarted=False: started.append(state))
    assert mps.take_part(Config(state_dir=str(tmp_path))) is None  # mps off: nothing
    engine = Config(state_dir=str(tmp_path), isolation_mps=True, isolated_tenant="user:a")
    with pytest.raises(mps.MpsError, match="would run without MPS"):
        mps.take_part(engine)
    monkeypatch.setenv(mps.PIPE_ENV, str(tmp_path / "pipe"))  # as its parent pilotd sets it
    assert mps.take_part(engine) is None and started == []


def test_the_top_pilotd_becomes_a_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    control = mps.MpsControl("/bin/true", str(tmp_path / "pipe"), str(tmp_path / "log"), pid=7)
    monkeypatch.setattr(mps, "start", lambda program, state, restarted=False: control)
    assert mps.take_part(Config(state_dir=str(tmp_path), isolation_mps=True)) is control
    assert os.environ[mps.PIPE_ENV] == control.pipe_dir  # before the backend's cuInit
    assert os.environ[mps.LOG_ENV] == control.log_dir


def test_a_missing_program_or_a_long_state_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(mps.MpsError, match="was not found on PATH"):
        mps.start("no-such-mps-control-program", str(tmp_path))
    with pytest.raises(mps.MpsError, match="was not found \\("):
        mps.start(str(tmp_path / "absent"), str(tmp_path))
    deep = tmp_path / ("d" * (mps.MAX_PIPE_DIR - len(str(tmp_path))))
    with pytest.raises(mps.MpsError, match="too long"):
        mps.start("/bin/true", str(deep))
    assert not deep.exists()


def test_the_directories_are_private(tmp_path: Path) -> None:
    (tmp_path / "mps").mkdir(mode=0o755)
    (tmp_path / "target").mkdir()
    (tmp_path / "mps" / "pipe").symlink_to(tmp_path / "target")
    with pytest.raises(mps.MpsError, match="is not a directory"):
        mps.start("/bin/true", str(tmp_path))
    assert oct((tmp_path / "mps").stat().st_mode & 0o777) == "0o700"


# ---- a fault under MPS: the MPS server's log names the faulting client ---------------------

# What the H100's MPS server logged on 2026-11-28 (tests/gpu/confine_check.py), client 1153 at fault
H100_LOG = """\
[2026-11-28 04:09:40.101 Other 1060] Client {PID: 1153, Context: 1} encountered a fatal GPU error.
[2026-11-28 04:09:40.101 Other 1060] Server is handling a fatal GPU error.
[2026-11-28 04:09:40.102 Other 1060] Client {PID: 1073, Context ID: 1} on device 0 to be torn down
[2026-11-28 04:09:40.102 Other 1060] Client {PID: 1153, Context ID: 1} on device 0 to be torn down
[2026-11-28 04:09:40.102 Other 1060] Client {PID: 1118, Context ID: 1} on device 0 to be torn down
[2026-11-28 04:09:40.102 Other 1060] All clients belonging to error trigging process 1073 will be torn down
[2026-11-28 04:09:40.300 Other 1060] The following devices will be reset:
[2026-11-28 04:09:40.300 Other 1060] 0
[2026-11-28 04:09:40.300 Other 1060] The following client process have a sticky error set:
[2026-11-28 04:09:40.300 Other 1060] 1073
[2026-11-28 04:09:40.300 Other 1060] 1153
[2026-11-28 04:09:40.300 Other 1060] 1118
"""


def test_the_faulting_client_from_the_server_log(tmp_path: Path) -> None:
    (tmp_path / mps.SERVER_LOG).write_text(H100_LOG)
    assert mps.faulting_clients(str(tmp_path), 0, wait=0) == [1153]  # not the torn-down ones


def test_only_lines_after_the_offset_count(tmp_path: Path) -> None:
    log = tmp_path / mps.SERVER_LOG
    log.write_text(H100_LOG)
    offset = mps.server_log_size(str(tmp_path))
    assert offset == len(H100_LOG)
    assert mps.faulting_clients(str(tmp_path), offset, wait=0) == []  # an earlier process's fault
    with log.open("a") as f:
        f.write("[x] Client {PID: 77, Context: 2} encountered a fatal GPU error.\n"
                "[x] Client {PID: 78, Context: 1} encountered a fatal GPU error.\n"
                "[x] Client {PID: 77, Context: 3} encountered a fatal GPU error.\n")
    assert mps.faulting_clients(str(tmp_path), offset, wait=0) == [77, 78]


def test_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / mps.SERVER_LOG
    log.write_text("[x] Client {PID: 9, Context: 1} encountered a fatal GPU err")
    assert mps.faulting_clients(str(tmp_path), 0, wait=0) == []
    with log.open("a") as f:
        f.write("or.\n")
    assert mps.faulting_clients(str(tmp_path), 0, wait=0) == [9]


def test_no_log_names_nobody(tmp_path: Path) -> None:
    assert mps.server_log_size(str(tmp_path)) == 0
    assert mps.faulting_clients(str(tmp_path), 0, wait=0.05) == []
    assert mps.faulting_clients(str(tmp_path / "absent"), 0, wait=0) == []


def test_an_environment_without_mps(tmp_path: Path) -> None:
    """Not merely unset: the driver would then try the default /tmp/nvidia-mps (an operator's)."""
    env = {"PATH": "/bin", mps.PIPE_ENV: str(tmp_path / "mps" / "pipe"),
           mps.LOG_ENV: str(tmp_path / "mps" / "log")}
    out = mps.without_env(env)
    assert out == {"PATH": "/bin", mps.PIPE_ENV: str(tmp_path / "mps" / mps.NO_MPS_DIR)}
    none = tmp_path / "mps" / mps.NO_MPS_DIR
    assert none.is_dir() and list(none.iterdir()) == [] and none.stat().st_mode & 0o777 == 0o700
    assert mps.without_env({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_an_engine_without_mps_takes_no_part(tmp_path: Path) -> None:
    """`--without-mps` (its config: [isolation] mps off): no environment needed, not confined."""
    engine = Config(state_dir=str(tmp_path), isolation_mps=False, isolated_tenant="user:a",
                    isolation_tenants=("all",))
    assert mps.take_part(engine) is None
    assert confinement(engine) == "engine"


def test_the_hidden_flag_turns_mps_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from pilot.daemon import main as pilotd

    seen: list[dict[str, object]] = []

    def load(path: str | None, overrides: dict[str, object]) -> Config:
        seen.append(overrides)
        raise ValueError("stop here")
    monkeypatch.setattr(pilotd, "load_config", load)
    runner = CliRunner()
    runner.invoke(pilotd.main, ["--isolated-tenant", "user:a", "--without-mps"])
    runner.invoke(pilotd.main, ["--isolated-tenant", "user:a"])
    assert seen[0]["isolation_mps"] is False and seen[1]["isolation_mps"] is None
    assert "--without-mps" not in runner.invoke(pilotd.main, ["--help"]).output
