"""Issue 27 in the router: where pilotd serves (router/server.py) and how many connections it
keeps (router/admission.py)."""

from __future__ import annotations

import os

import pytest


def test_pilotd_serves_only_from_a_directory_no_one_else_controls(tmp_path) -> None:
    """Issue 27 (1), pilotd's side: a directory another user could write (or owns) is refused."""
    from pilot.daemon.router.server import DaemonError, prepare_socket_path

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DaemonError, match="writable by other users"):
        prepare_socket_path(str(shared / "pilot.sock"))
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 1, 1)
        with pytest.raises(DaemonError, match="owned by another user"):
            prepare_socket_path(str(theirs / "pilot.sock"))
    prepare_socket_path(str(tmp_path / "mine" / "pilot.sock"))  # made here: fine


def test_connection_budget_leaves_room_for_everything_else() -> None:
    from pilot.daemon.router.admission import RESERVED_FDS, connection_budget

    assert connection_budget(16384, 2048, 65536) == 16384
    low = connection_budget(16384, 100, 4096)
    assert 2 * low + 100 + RESERVED_FDS <= 4096
