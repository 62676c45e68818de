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
