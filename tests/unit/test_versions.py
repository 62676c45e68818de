"""Every command says its version (operators and bug reports need it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pilot import __version__


@pytest.mark.parametrize(("module", "name"), [("pilot.daemon", "pilotd"), ("pilot.cli.pilotctl", "pilotctl"),
                                              ("pilot.cli.pilot", "pilot")])
def test_version(module: str, name: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{name} {__version__}", out
