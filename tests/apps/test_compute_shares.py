"""Compute shares end to end against a sim pilotd: a tenant capped with `pilotctl share set`
runs its programs in an SM partition of its own (the sim fails a kernel launched outside the
context its module was loaded in, as the H100 does, so any stream, module or event the daemon
made in the wrong context shows here), sees the partition's SM count, and gives it back."""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path
from typing import Any

import pytest
from apps_daemons import RunUnderPilot  # pytest puts tests/apps on sys.path
from test_streams_devices import expected_launch_ex

if os.environ.get("PILOT_APPS_NATIVE") == "1":
    pytest.skip("needs pilot's sim daemon", allow_module_level=True)


def test_a_capped_tenant_runs_in_its_partition(run_under_pilot: RunUnderPilot, start_pilotd: Any,
                                               app_binaries: dict[str, Path]) -> None:
    daemon = start_pilotd()
    me = "user:" + pwd.getpwuid(os.getuid()).pw_name
    out = daemon.ctl("share", "set", me, "25", "--gpu", "0").stdout
    assert out.strip() == f"{me} on GPU 0: 25% (GPU 0: 32 of 132 SMs)"
    env = {"PILOT_SOCKET": daemon.socket}
    launch_ex = run_under_pilot("launch_ex", env=env)
    assert launch_ex.stdout.splitlines() == expected_launch_ex(), launch_ex.stdout + daemon.log_tail()
    vector_add = run_under_pilot("vector_add", env=env)
    assert vector_add.returncode == 0 and vector_add.stdout.splitlines()[-1:] == ["PASS"], \
        vector_add.stdout + daemon.log_tail()
    log = daemon.log()
    assert len(re.findall(rf"tenant {re.escape(me)} capped at 25%: 32 of 132 SMs", log)) == 2, log
    listing = json.loads(daemon.ctl("share", "list", "--json").stdout)
    assert listing["shares"] == {me: {"0": 25}}
    assert listing["gpus"]["0"]["held"] == {}  # both sessions ended: the partition is gone
