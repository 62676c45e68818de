"""Device attributes of capabilities pilot does not carry read 0 (daemon/ops/device.py
NOT_CARRIED), whatever the GPU says, and each names a call that is still a stub: implementing
the call without advertising the capability again (or the reverse) fails here."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pilot.daemon.backends.base import DeviceInfo
from pilot.daemon.ops import device
from pilot.daemon.protocol import lib

TABLES = Path(__file__).resolve().parents[2] / "shim" / "tables"


def _statuses() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("cudart_exports.tsv", "cuda_driver_exports.tsv"):
        with (TABLES / name).open() as f:
            rows = (r for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#"))
            for row in rows:
                out[row[0]] = row[-1]
    return out


def test_every_capability_left_out_names_a_stub() -> None:
    statuses = _statuses()
    for attr, (call, why) in device.NOT_CARRIED.items():
        assert 0 <= attr < lib.PILOT_ATTR_COUNT and why
        if call is not None:
            assert statuses.get(call) == "stub", (attr, call, statuses.get(call))


def test_device_info_reports_them_absent(monkeypatch: Any) -> None:
    """A GPU that has every capability (each attribute 1): DEVICE_INFO says 0 for those pilot
    does not carry and passes the rest on."""
    attrs = {a: 1 for a in range(lib.PILOT_ATTR_COUNT)}
    info = DeviceInfo(name="GPU", total_mem=1 << 30, attrs=attrs, uuid=b"u" * 16,
                      driver_version=13000)
    monkeypatch.setattr(device, "fill_device_info", lambda vg, s, ordinal, rep: info)
    session = SimpleNamespace(group=None, partition=None)
    rep = device.device_info(SimpleNamespace(), session, SimpleNamespace(device=0), memoryview(b""))
    for attr in range(lib.PILOT_ATTR_COUNT):
        assert rep.attrs[attr] == (0 if attr in device.NOT_CARRIED else 1), attr
