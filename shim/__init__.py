"""The shim (libpilot.so) and the protocol module built from shim/pilot_proto.h."""

from __future__ import annotations

from pathlib import Path


def shim_path() -> Path:
    """Absolute path of the installed libpilot.so."""
    path = Path(__file__).resolve().parent / "libpilot.so"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall pilot (pip install .)")
    return path
