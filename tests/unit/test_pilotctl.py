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
    # a policy's preemptions show without priorities too (drains in log2 buckets of us)
    replies["priority.list"]["preemption"] = {"policy_preemptions": 3, "policy_resumes": 2,
                                              "drain": [0] * 9 + [2, 1] + [0] * 5}
    assert run("priority", "list").output.splitlines()[-1] == \
        "policy preemptions: 3 made, 2 resumed; drains <524 us: 2, <1049 us: 1"


def test_priority_list_shows_loop_level_preemption(replies: dict[str, Any]) -> None:
    replies["priority.list"] = {
        "enabled": True, "gated_inflight": 2, "active_window_s": 0.1, "tenants": {}, "active": {},
        "preemption": {"chunk": 1, "parts": 4, "preemptible_kernels": 2, "modules": 1, "jit_seconds": 0.2,
                       "modules_without_variants": [], "kernels_not_preemptible": {}, "gpus": {},
                       "tenants": {"sim": {"preempted": 4, "blocks_deferred": 90, "blocks_abandoned": 7}},
                       "loop_tenants": ["sim"], "loop_programs": ["jacobi"],
                       "loop_level": {"smooth": "uniform", "gather": "none: no loop"}}}
    lines = run("priority", "list").output.splitlines()
    assert any(line.startswith("preemption: gated sessions' kernels run as preemptible variants "
                               "(chunk 1, up to 4 preemptible part(s) a launch)") for line in lines)
    assert "  sim: 4 preemption(s), 90 block(s) run after their retreat, 7 abandoned inside " \
           "and run again" in lines
    at = lines.index("  loop-level preemption (idempotent kernels only) for: tenant sim, program jacobi")
    assert lines[at + 1:at + 3] == ["    gather: none: no loop", "    smooth: uniform"]


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


SALUS_STATE = {"scheduler": "fair", "gpus": {"0": {
    "capacity": 12 << 30, "used": 9 << 30, "persistent": 2 << 30, "lane_bytes": 7 << 30,
    "lanes": [{"lane": 1, "size": 7 << 30, "jobs": [{"job": 3, "persistent": 1 << 30,
                                                     "ephemeral": 7 << 30}]}],
    "queue": [4],
    "jobs": [{"session": 3, "tenant": "user:a", "pid": 10, "lane": 1, "persistent": 1 << 30,
              "ephemeral": 7 << 30, "recognized": True, "iterations": 12, "iteration_s": 0.05,
              "service_s": 0.6, "running": True, "held": ""},
             {"session": 4, "tenant": "user:b", "pid": 11, "lane": None, "persistent": 8 << 30,
              "ephemeral": 0, "recognized": False, "iterations": 0, "iteration_s": None,
              "service_s": 0.0, "running": False, "held": "no lane fits"}]}}}


def test_lanes_shows_the_salus_state(replies: dict[str, Any]) -> None:
    replies["status"] = {"scheduling": {"name": "salus", "state": SALUS_STATE}}
    out = run("lanes")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "salus, scheduler fair"
    assert "sum(P) 2.0 GiB + sum(L) 7.0 GiB = 9.0 GiB of C 12.0 GiB" in lines[1]
    assert lines[2] == "  lane 1: size 7.0 GiB, jobs 3"
    assert "lane 1, P 1.0 GiB, E 7.0 GiB, 12 iterations of 50.0 ms, running" in lines[3]
    assert "queued, P 8.0 GiB, E 0 B (not recognized: all persistent)" in lines[4]
    assert lines[5] == "  queue: session 4"
    import json
    assert json.loads(run("lanes", "--json").output) == SALUS_STATE


def test_lanes_shows_srtf_s_estimate(replies: dict[str, Any]) -> None:
    jobs = [{**SALUS_STATE["gpus"]["0"]["jobs"][0], "remaining_s": 2.25, "waited_s": 0.5}]
    state = {"scheduler": "srtf", "gpus": {"0": {**SALUS_STATE["gpus"]["0"], "jobs": jobs}}}
    replies["status"] = {"scheduling": {"name": "salus", "state": state}}
    out = run("lanes")
    assert out.exit_code == 0, out.output
    assert "12 iterations of 50.0 ms, about 2.2 s left (SRTF's estimate), running" in out.output


def test_lanes_shows_a_refused_job(replies: dict[str, Any]) -> None:
    jobs = [{**SALUS_STATE["gpus"]["0"]["jobs"][1], "held": "",
             "refused": "salus: P 8.0 GiB + E 6.0 GiB is more than C (12.0 GiB): no lane fits"}]
    state = {"scheduler": "pack", "gpus": {"0": {**SALUS_STATE["gpus"]["0"], "jobs": jobs, "queue": []}}}
    replies["status"] = {"scheduling": {"name": "salus", "state": state}}
    out = run("lanes")
    assert out.exit_code == 0, out.output
    assert "session 4 (user:b, pid 11): refused, P 8.0 GiB" in out.output
    assert "(salus: P 8.0 GiB + E 6.0 GiB is more than C (12.0 GiB)" in out.output


def test_lanes_refuses_another_policy(replies: dict[str, Any]) -> None:
    replies["status"] = {"scheduling": {"name": "mfit", "state": {}}}
    out = run("lanes")
    assert out.exit_code == 1 and "not 'salus'" in out.output


def test_isolate_list_shows_a_tenant_without_mps(replies: dict[str, Any]) -> None:
    """A tenant whose kernel faulted under MPS (router/mps.py) runs in an engine without MPS."""
    replies["isolate.list"] = {
        "configured": ["all"], "engines": [
            {"tenant": "uid:2", "pid": 9, "socket": "/s", "capacity": 1 << 30, "confinement": "engine"}],
        "marked": {"uid:2": {"since": 0.0, "why": "its kernel faulted under MPS", "mps": False},
                   "uid:3": {"since": 0.0, "why": "pilotctl isolate set"}}}
    out = run("isolate", "list")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any(line.startswith("uid:2: isolated without MPS (its engine is no MPS client) since")
               for line in lines)
    assert any(line.startswith("uid:3: isolated since") for line in lines)
    assert any(line.startswith("uid:2: pilotd pid 9") and line.endswith(", engine") for line in lines)
