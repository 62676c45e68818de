"""pilotctl's own side of the operator's surface (cli/pilotctl.py), against a scripted daemon:
negative numbers are named as such, empty lists say so, sizes are echoed back in binary units."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from pilot.cli import pilotctl
from pilot.cli.client import ControlClient


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """cmd -> the result the daemon answers; every call made is kept under "calls"."""
    table: dict[str, Any] = {"calls": []}

    def call(self: ControlClient, cmd: str, **args: Any) -> Any:
        table["calls"].append((cmd, args))
        return table[cmd]

    monkeypatch.setattr(ControlClient, "call", call)
    return table


def run(*args: str) -> Any:
    return CliRunner().invoke(pilotctl.main, ["--control-socket", "/nonexistent", *args])


@pytest.mark.parametrize("args", [("quota", "set", "alice", "-5GiB"), ("share", "set", "alice", "-25"),
                                  ("quota", "set", "alice", "8GiB", "--gpu", "-1"), ("kill", "-3"),
                                  ("quota", "set", "alice", "--provisioned", "-.5GiB")])
def test_negative_numbers_are_named(replies: dict[str, Any], args: tuple[str, ...]) -> None:
    out = run(*args)
    negative = next(a for a in args if a.startswith("-") and not a.startswith("--"))
    assert out.exit_code == 2 and f"{negative!r} is negative" in out.output, out.output
    assert replies["calls"] == []  # nothing reached the daemon


@pytest.mark.parametrize(("args", "cmd", "result", "line"), [
    (("quota", "list"), "quota.list", {}, "no quota is set"),
    (("share", "list"), "share.list", {"shares": {}, "gpus": {"0": {"sms": 132, "held": {}}}},
     "no compute share is set"),
    (("sessions",), "sessions", [], "no session"),
])
def test_empty_lists_say_so(replies: dict[str, Any], args: tuple[str, ...], cmd: str, result: Any,
                            line: str) -> None:
    replies[cmd] = result
    out = run(*args)
    assert out.exit_code == 0 and line in out.output.splitlines(), out.output


def test_a_list_with_entries_does_not_say_it_is_empty(replies: dict[str, Any]) -> None:
    replies["quota.list"] = {"user:alice": {"0": {"hard": 1 << 30, "provisioned": None}}}
    assert run("quota", "list").output == "user:alice on GPU 0: hard 1.0 GiB, provisioned -\n"


def test_quota_set_echoes_sizes_in_binary(replies: dict[str, Any]) -> None:
    """8GB is 8e9 bytes, 7.45 GiB: the echo says so exactly; whole binary sizes stay plain."""
    replies["quota.set"] = {"tenant": "user:alice", "gpu": 0, "hard": 8 * 10**9, "provisioned": 2 << 30}
    out = run("quota", "set", "alice", "8GB", "--provisioned", "2GiB", "--gpu", "0")
    assert out.exit_code == 0, out.output
    assert out.output == "user:alice on GPU 0: hard 7.45 GiB (8000000000 bytes), provisioned 2 GiB\n"
    assert replies["calls"] == [("quota.set", {"tenant": "alice", "hard": "8GB", "gpu": 0,
                                               "provisioned": "2GiB"})]


def test_priority_commands(replies: dict[str, Any]) -> None:
    replies["priority.set"] = {"tenant": "user:alice", "priority": "high"}
    out = run("priority", "set", "alice", "HIGH")
    assert out.exit_code == 0 and out.output == "user:alice: priority high\n", out.output
    assert replies["calls"][-1] == ("priority.set", {"tenant": "alice", "level": "high"})
    assert run("priority", "set", "alice", "urgent").exit_code == 2  # not a class
    replies["priority.list"] = {"enabled": True, "gated_inflight": 2, "active_window_s": 0.1,
                                "tenants": {"user:alice": {"priority": "high", "from": "pilotctl"}},
                                "active": {"0": "high", "1": None}}
    assert run("priority", "list").output.splitlines() == [
        "user:alice: high (pilotctl)",
        "gate: at most 2 pieces of GPU work in flight per gated session; active for 100 ms after a call",
        "GPU 0: highest class active: high", "GPU 1: highest class active: none"]
    replies["priority.list"] = {"enabled": False, "gated_inflight": 2, "active_window_s": 0.1,
                                "tenants": {}, "active": {}}
    assert run("priority", "list").output == "every tenant is normal: no priority gating\n"
    assert run("priority", "list", "--json").output.startswith('{"enabled": false')


def test_sessions_show_a_class_and_the_gate(replies: dict[str, Any]) -> None:
    row = {"session": 3, "tenant": "user:bob", "pid": 42, "device": 0, "device_bytes": 0,
           "managed_bytes": 0, "calls": 7, "state": "gated", "cmdline": "train", "priority": "low",
           "gated": True}
    replies["sessions"] = [row, {**row, "session": 4, "priority": "normal", "gated": False,
                                 "state": "active"}]
    lines = run("sessions").output.splitlines()
    assert lines[2].split() == ["priority", "low:", "gated", "(a", "higher", "class", "is", "active",
                                "on", "its", "GPU)"]
    assert len(lines) == 4 and "gated" in lines[1]  # the normal, ungated one has no such line
