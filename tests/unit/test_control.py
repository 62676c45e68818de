"""pilotctl's rights, decided in daemon/control.py from the caller's kernel credentials: changes
need root or the admin group; reads show another tenant's sessions and quotas to admins only.
(The end-to-end tests run as root, so the non-admin side is checked here.)"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from pilot.daemon.resources.tenants import Quota
from pilot.daemon.router import control
from pilot.daemon.sessions.session import Credentials

USERS = ("root", "alice", "bob")
ADMIN = Credentials(uid=0, gid=0, pid=1)
ALICE = Credentials(uid=1001, gid=1001, pid=2)


@pytest.fixture(autouse=True)
def known_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """The users of these tests exist (NSS is faked, as in test_tenants.py)."""

    def getpwnam(name: str) -> Any:
        if name not in USERS:
            raise KeyError(name)
        return SimpleNamespace(pw_name=name)

    monkeypatch.setattr(control.pwd, "getpwnam", getpwnam)


class FakeQuotas:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, Quota]] = {"user:bob": {"0": Quota(hard=1 << 30)},
                                                  "user:alice": {"*": Quota(hard=2 << 30)}}

    def list(self) -> dict[str, dict[str, Quota]]:
        return self.data

    def get(self, tenant: str, gpu: int | None) -> Quota:
        per = self.data.get(tenant, {})
        return per.get(str(gpu)) or per.get("*") or Quota()

    def entry(self, tenant: str, gpu: int | None) -> Quota | None:
        return self.data.get(tenant, {}).get("*" if gpu is None else str(gpu))

    def provisioned_on(self, gpu: int) -> dict[str, int]:
        return {t: p for t in self.data if (p := self.get(t, gpu).provisioned)}

    def set(self, tenant: str, gpu: int | None, hard: int | None, provisioned: int | None) -> Quota:
        q = Quota(hard=hard, provisioned=provisioned)
        self.data.setdefault(tenant, {})["*" if gpu is None else str(gpu)] = q
        return q


def fake_daemon() -> Any:
    names = {0: "root", 1001: "alice"}
    resolver = SimpleNamespace(tenant_of=lambda uid, gid: f"user:{names[uid]}",
                               is_admin=lambda uid, gid, group: uid == 0)
    sessions = [{"session": 1, "tenant": "user:alice", "pid": 10},
                {"session": 2, "tenant": "user:bob", "pid": 11}]
    return SimpleNamespace(
        resolver=resolver, quotas=FakeQuotas(), gpus={0: 0},
        config=SimpleNamespace(admin_group="pilot-admin", tenants={}, policy="none"),
        broker=SimpleNamespace(tenant_usage=lambda tenant, gpus: {
            **{str(g): {"used": 5, "by_kind": {"device": 5}} for g in gpus},
            "host": {"used": 0, "by_kind": {}, "limit": None}},
            budget=SimpleNamespace(capacity=lambda g: 80 << 30), managed=None),
        session_summaries=lambda: sessions, preemption=None,
        draining=set(), end_session=lambda sid, why: sid == 1,
        engines=SimpleNamespace(reread_quotas=lambda: None, stop_tenant=lambda tenant: []))


def call(daemon: Any, creds: Credentials, cmd: str, **args: Any) -> dict[str, Any]:
    return json.loads(control.handle(daemon, creds, json.dumps({"cmd": cmd, "args": args}).encode()))


def test_changes_need_admin() -> None:
    d = fake_daemon()
    for cmd, args in [("quota.set", {"tenant": "user:alice", "hard": "1GiB"}),
                      ("quota.unset", {"tenant": "user:alice"}), ("kill", {"session": 1}),
                      ("drain", {"gpu": 0}), ("undrain", {"gpu": 0})]:
        reply = call(d, ALICE, cmd, **args)
        assert reply == {"ok": False, "error": f"{cmd} needs root or membership of group 'pilot-admin'"}
    assert d.quotas.get("user:alice", 0).hard == 2 << 30 and not d.draining
    assert call(d, ADMIN, "drain", gpu=0)["ok"] and d.draining == {0}
    assert call(d, ADMIN, "quota.set", tenant="user:alice", hard="1GiB", gpu=0)["ok"]
    assert d.quotas.get("user:alice", 0).hard == 1 << 30


def test_reads_show_other_tenants_to_admins_only() -> None:
    d = fake_daemon()
    assert [r["session"] for r in call(d, ALICE, "sessions")["result"]] == [1]
    assert [r["session"] for r in call(d, ADMIN, "sessions")["result"]] == [1, 2]
    assert set(call(d, ALICE, "quota.list")["result"]) == {"user:alice"}
    assert set(call(d, ADMIN, "quota.list")["result"]) == {"user:alice", "user:bob"}
    mine = call(d, ALICE, "quota.get")["result"]
    assert mine["tenant"] == "user:alice" and mine["gpus"]["0"]["hard"] == 2 << 30
    refused = call(d, ALICE, "quota.get", tenant="user:bob")
    assert refused == {"ok": False, "error": "only admins can read other tenants' quotas"}


def test_malformed_and_unknown_requests_get_one_line_errors() -> None:
    d = fake_daemon()
    for raw in (b"not json", b"[]", b'{"cmd": 5}', b'{"cmd": "status", "args": []}'):
        reply = json.loads(control.handle(d, ADMIN, raw))
        assert reply["ok"] is False and "\n" not in reply["error"]
    assert call(d, ADMIN, "reboot") == {"ok": False, "error": "unknown command 'reboot'"}
    assert call(d, ADMIN, "quota.set", tenant="user:alice", hard="lots")["ok"] is False
    assert call(d, ADMIN, "kill", session=99) == {"ok": False, "error": "no session 99"}
    assert call(d, ADMIN, "drain", gpu=3)["error"].startswith("no GPU 3")


def test_setting_one_limit_keeps_the_other() -> None:
    """`quota set T --provisioned X` alone keeps T's hard limit (it deleted it before); the word
    "none" lifts a limit explicitly."""
    d = fake_daemon()
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, provisioned="512MiB")
    assert reply["ok"] and (reply["result"]["hard"], reply["result"]["provisioned"]) == (1 << 30, 512 << 20)
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard="none")
    assert reply["ok"] and (reply["result"]["hard"], reply["result"]["provisioned"]) == (None, 512 << 20)
    assert not call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0)["ok"]  # nothing to set


def test_tenant_names_are_checked() -> None:
    d = fake_daemon()
    for name, why in (("user:no-such-user-here", "no user"), ("uid:abc", "takes a number"),
                      ("no-such-user-here", "unknown tenant")):
        reply = call(d, ADMIN, "quota.set", tenant=name, hard="1GiB")
        assert not reply["ok"] and why in reply["error"], reply
    assert call(d, ADMIN, "quota.set", tenant="user:alice", hard="1GiB")["ok"]
    assert call(d, ADMIN, "quota.set", tenant="uid:4242", hard="1GiB")["ok"]
    assert call(d, ADMIN, "quota.set", tenant="slurm:job_77", hard="1GiB")["ok"]
    reply = call(d, ADMIN, "quota.set", tenant="slurm:job_x", hard="1GiB")
    assert not reply["ok"] and "takes a job id" in reply["error"]


def test_kill_a_tenants_sessions() -> None:
    """What a Slurm epilog does: every session of the tenant ends (admins only)."""
    d = fake_daemon()
    ended: list[int] = []
    d.end_session = lambda sid, why: ended.append(sid) or True
    assert call(d, ALICE, "kill", tenant="user:alice")["ok"] is False
    reply = call(d, ADMIN, "kill", tenant="user:alice")
    assert reply["ok"] and reply["result"] == {"tenant": "user:alice", "sessions": [1]} and ended == [1]
    assert call(d, ADMIN, "kill", tenant="slurm:job_5")["result"]["sessions"] == []


def test_sizes_beyond_64_bits_are_refused() -> None:
    reply = call(fake_daemon(), ADMIN, "quota.set", tenant="user:bob", hard=f"{2**64}B")
    assert not reply["ok"] and "16 EiB" in reply["error"], reply


@pytest.mark.parametrize(("hard", "why"), [
    ("8", "'8' has no unit: write 8GiB, 8MiB"), ("8gb", "write GB for powers of 1000 or GiB"),
    ("512KiB", "524288 bytes is below the 1 MiB floor for a hard quota"),
    ("0", '0 bytes is below the 1 MiB floor for a hard quota (a missing or wrong unit?); "none" lifts'),
])
def test_quota_sizes_need_a_unit_and_the_floor(hard: str, why: str) -> None:
    d = fake_daemon()
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard=hard)
    assert not reply["ok"] and why in reply["error"], reply
    assert d.quotas.get("user:bob", 0).hard == 1 << 30
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard="8GB", provisioned="1MiB")
    assert reply["result"]["hard"] == 8 * 10**9 and reply["result"]["provisioned"] == 1 << 20
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, provisioned="0")  # 0: none
    assert reply["ok"] and reply["result"]["provisioned"] is None



def test_quota_limits_are_bounded_by_what_a_gpu_can_grant() -> None:
    d = fake_daemon()
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard="81GiB")
    assert not reply["ok"] and "more than GPU 0 can grant (85899345920 bytes" in reply["error"]
    assert call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard="80GiB")["ok"]
    d.broker.managed = SimpleNamespace(capacity=lambda g: 200 << 30)  # enforced: managed limit
    assert call(d, ADMIN, "quota.set", tenant="user:bob", hard="150GiB")["ok"]


def test_provisioned_quotas_cannot_add_up_past_a_gpus_capacity() -> None:
    """Provisioned memory is a guarantee (80 GiB GPU): bob's 50 and alice's 40 cannot both be;
    changing bob's own value replaces it rather than adding to it."""
    d = fake_daemon()
    assert call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, provisioned="1GiB")["ok"]
    reply = call(d, ADMIN, "quota.set", tenant="user:alice", hard="none", provisioned="79GiB")
    assert reply["ok"], reply
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, hard="none", provisioned="2GiB")
    assert not reply["ok"] and "provisioned to user:alice" in reply["error"] \
        and "more than its capacity" in reply["error"]
    assert d.quotas.get("user:bob", 0).provisioned == 1 << 30
    reply = call(d, ADMIN, "quota.set", tenant="user:bob", gpu=0, provisioned="1GiB")
    assert reply["ok"], reply


def test_priority_classes(tmp_path: Any) -> None:
    """pilotctl priority set/unset need admin, apply to the board at once, and a non-admin's
    list shows its own tenant's class only."""
    from pilot.daemon.resources.priorities import PriorityStore
    from pilot.daemon.scheduling.priority import PriorityBoard

    d = fake_daemon()
    d.priorities = PriorityBoard(PriorityStore(str(tmp_path), {"user:bob": "low"}), [])
    reply = call(d, ALICE, "priority.set", tenant="user:alice", level="high")
    assert reply == {"ok": False, "error": "priority.set needs root or membership of group 'pilot-admin'"}
    assert call(d, ADMIN, "priority.set", tenant="user:alice", level="High")["result"] == {
        "tenant": "user:alice", "priority": "high"}
    assert not call(d, ADMIN, "priority.set", tenant="user:alice", level="urgent")["ok"]
    listed = call(d, ADMIN, "priority.list")["result"]
    assert listed["enabled"] and set(listed["tenants"]) == {"user:alice", "user:bob"}
    assert set(call(d, ALICE, "priority.list")["result"]["tenants"]) == {"user:alice"}
    assert listed["preemption"] is None  # [priority] preempt off
    d.preemption = SimpleNamespace(describe=lambda: {"chunk": 1, "preemptible_kernels": 1,
                                                     "kernels_not_preemptible": {"k": "why"},
                                                     "kernel_choices": {"k (256 threads)": "chunk 8"},
                                                     "tenants": {"user:alice": {"preempted": 2},
                                                                 "user:bob": {"preempted": 3}}})
    assert call(d, ADMIN, "priority.list")["result"]["preemption"]["kernels_not_preemptible"] == {
        "k": "why"}  # kernel names are other tenants' business: admins only
    assert call(d, ALICE, "priority.list")["result"]["preemption"] == {
        "chunk": 1, "preemptible_kernels": 1, "tenants": {"user:alice": {"preempted": 2}}}
    assert set(call(d, ADMIN, "priority.list")["result"]["preemption"]["tenants"]) == {
        "user:alice", "user:bob"}
    d.preemption = None
    assert call(d, ADMIN, "priority.unset", tenant="user:alice")["result"]["priority"] == "normal"
    assert not call(d, ADMIN, "priority.unset", tenant="user:alice")["ok"]
    assert call(d, ADMIN, "priority.unset", tenant="user:bob")["error"] == \
        "user:bob has no priority set by pilotctl"
