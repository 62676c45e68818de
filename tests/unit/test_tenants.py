"""Tenants (daemon/tenants.py): who a uid/gid counts as, admin rights, persisted quotas, and the
ledger that keeps racing allocations within a hard limit. NSS is replaced by fake tables."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pilot.daemon.config import TenantDef
from pilot.daemon.resources import tenants
from pilot.daemon.resources.tenants import HOST, Ledger, Quota, QuotaFileError, QuotaStore, TenantResolver

USERS = {1000: "alice", 1001: "bob", 1002: "carol", 1003: "dave", 1004: "erin"}
GROUPS = {100: "users", 200: "ml", 300: "cv", 400: "pilot-admin", 500: "audio"}
MEMBERS = {"alice": [200], "bob": [300], "carol": [300, 200], "dave": [400], "erin": []}


@pytest.fixture
def nss(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Fake passwd/group databases; returns lookup counters."""
    calls = {"getpwuid": 0, "getgrouplist": 0}

    def getpwuid(uid: int) -> Any:
        calls["getpwuid"] += 1
        if uid == 0:
            return SimpleNamespace(pw_name="root")
        if uid not in USERS:
            raise KeyError(uid)
        return SimpleNamespace(pw_name=USERS[uid])

    def getgrgid(gid: int) -> Any:
        if gid not in GROUPS:
            raise KeyError(gid)
        return SimpleNamespace(gr_name=GROUPS[gid], gr_gid=gid)

    def getgrnam(name: str) -> Any:
        for gid, n in GROUPS.items():
            if n == name:
                return SimpleNamespace(gr_name=n, gr_gid=gid)
        raise KeyError(name)

    def getgrouplist(user: str, gid: int) -> list[int]:
        calls["getgrouplist"] += 1
        return [gid, *MEMBERS.get(user, [])]

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(grp, "getgrgid", getgrgid)
    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    monkeypatch.setattr(os, "getgrouplist", getgrouplist)
    return calls


TENANTS = {
    "research": TenantDef("research", users=("bob",), groups=("ml",)),
    "vision": TenantDef("vision", users=(), groups=("cv",)),
    "staff": TenantDef("staff", users=("erin",), groups=("audio",)),
}


# ---- resolver ----

def test_tenant_of(nss: dict[str, int]) -> None:
    r = TenantResolver(TENANTS)
    assert r.tenant_of(1000, 100) == "research"  # alice: supplementary group ml
    assert r.tenant_of(1001, 100) == "research"  # bob: by user name, beats his group cv
    assert r.tenant_of(1002, 100) == "research"  # carol: cv and ml -> first tenant by name
    assert r.tenant_of(1002, 300) == "vision"  # carol, primary group cv: primary beats the rest
    assert r.tenant_of(1003, 100) == "user:dave"  # no tenant lists dave or his groups
    assert r.tenant_of(1004, 200) == "staff"  # erin by name, although her primary group is ml
    assert r.tenant_of(4242, 200) == "research"  # no passwd entry, but the primary group counts
    assert r.tenant_of(4242, 100) == "uid:4242"
    assert r.tenant_of(0, 0) == "user:root"


def test_no_tenants_means_one_tenant_per_user(nss: dict[str, int]) -> None:
    r = TenantResolver({})
    assert r.tenant_of(1000, 200) == "user:alice"
    assert r.tenant_of(9, 9) == "uid:9"


def test_resolver_caches_until_cleared(nss: dict[str, int]) -> None:
    r = TenantResolver(TENANTS)
    assert r.tenant_of(1003, 100) == "user:dave"
    before = dict(nss)
    for _ in range(5):
        assert r.tenant_of(1003, 100) == "user:dave"
    assert nss == before  # answered from the cache
    MEMBERS["dave"].append(300)  # dave joins cv
    try:
        assert r.tenant_of(1003, 100) == "user:dave"  # still cached
        r.clear_cache()
        assert r.tenant_of(1003, 100) == "vision"
    finally:
        MEMBERS["dave"].remove(300)


def test_resolver_refuses_ambiguous_tenants() -> None:
    with pytest.raises(ValueError, match="user 'x' is in tenants 'a' and 'b'"):
        TenantResolver({"a": TenantDef("a", ("x",)), "b": TenantDef("b", ("x",))})


def test_is_admin(nss: dict[str, int]) -> None:
    r = TenantResolver({})
    assert r.is_admin(0, 0, "pilot-admin")  # root
    assert r.is_admin(0, 0, "no-such-group")
    assert r.is_admin(1003, 100, "pilot-admin")  # dave: supplementary member
    assert r.is_admin(1000, 400, "pilot-admin")  # alice with primary gid pilot-admin
    assert not r.is_admin(1000, 100, "pilot-admin")
    assert not r.is_admin(1003, 100, "no-such-group")
    assert not r.is_admin(4242, 100, "pilot-admin")  # no passwd entry, not in the group
    assert tenants.is_admin(1003, 100, "pilot-admin")


# ---- quotas ----

def test_quota_validation() -> None:
    assert Quota() == Quota(None, None)
    assert Quota(10, 10).provisioned == 10
    with pytest.raises(ValueError, match="provisioned"):
        Quota(hard=10, provisioned=11)
    for bad in (-1, True, 1.5, "1GiB"):
        with pytest.raises(ValueError):
            Quota(hard=bad)  # type: ignore[arg-type]


def test_quota_store_round_trip_and_wildcard(tmp_path: Path) -> None:
    state = tmp_path / "state" / "pilot"
    s = QuotaStore(str(state))
    assert s.get("research", 0) == Quota() and s.list() == {}
    assert s.set("research", None, hard=100, provisioned=60) == Quota(100, 60)
    s.set("research", 1, hard=None, provisioned=None)  # lifts the every-GPU limit on GPU 1
    s.set("user:alice", 0, hard=5, provisioned=None)
    assert s.get("research", 0) == Quota(100, 60)  # wildcard fallback
    assert s.get("research", 1) == Quota()
    assert s.get("research", None) == Quota(100, 60)
    assert s.get("user:alice", 1) == Quota()
    expected = {"research": {"*": Quota(100, 60), "1": Quota()}, "user:alice": {"0": Quota(5, None)}}
    assert s.list() == expected
    again = QuotaStore(str(state))  # persisted: a new daemon sees the same quotas
    assert again.list() == expected and again.get("research", 7) == Quota(100, 60)
    doc = json.loads((state / "quotas.json").read_text())
    assert doc == {"version": 1, "quotas": {
        "research": {"*": {"hard": 100, "provisioned": 60}, "1": {"hard": None, "provisioned": None}},
        "user:alice": {"0": {"hard": 5, "provisioned": None}}}}
    assert stat.S_IMODE(os.stat(state).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(state / "quotas.json").st_mode) == 0o600


def test_quota_store_set_replaces_and_validates(tmp_path: Path) -> None:
    s = QuotaStore(str(tmp_path))
    s.set("t", 0, hard=10, provisioned=5)
    assert s.set("t", 0, hard=20, provisioned=None) == Quota(20, None)
    assert s.get("t", 0) == Quota(20, None)
    for args in (("t", 0, 10, 11), ("t", -1, 1, None), ("", 0, 1, None), ("a b", 0, 1, None),
                 ("t", True, 1, None)):
        with pytest.raises(ValueError):
            s.set(*args)  # type: ignore[arg-type]
    assert QuotaStore(str(tmp_path)).list() == {"t": {"0": Quota(20, None)}}


def test_quota_store_unset(tmp_path: Path) -> None:
    s = QuotaStore(str(tmp_path))
    s.set("t", None, 10, None)
    s.set("t", 0, 5, None)
    s.set("t", 1, 6, None)
    s.set("u", 0, 7, None)
    assert s.unset("t", 1) is True
    assert s.unset("t", 1) is False
    assert s.unset("t", "*") is True  # only the every-GPU entry
    assert s.list()["t"] == {"0": Quota(5, None)}
    s.set("t", None, 10, None)
    assert s.unset("t") is True  # every entry
    assert s.unset("t") is False and s.unset("nobody", 0) is False
    assert s.get("t", 0) == Quota()
    assert QuotaStore(str(tmp_path)).list() == {"u": {"0": Quota(7, None)}}


def test_failed_write_keeps_file_and_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = QuotaStore(str(tmp_path))
    s.set("t", 0, 10, None)
    original = (tmp_path / "quotas.json").read_bytes()

    def broken_dump(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(json, "dump", broken_dump)
    with pytest.raises(RuntimeError, match="disk on fire"):
        s.set("t", 0, 20, None)
    with pytest.raises(RuntimeError):
        s.unset("t")
    assert (tmp_path / "quotas.json").read_bytes() == original
    assert s.get("t", 0) == Quota(10, None)  # memory and disk still agree
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quotas.json"]  # no temp files left


def test_writes_leave_no_temp_files(tmp_path: Path) -> None:
    s = QuotaStore(str(tmp_path))
    for i in range(5):
        s.set(f"t{i}", i, i, None)
    s.unset("t0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quotas.json"]


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ('{"quotas": {}}', "expected"),
    ('{"version": 2, "quotas": {}}', "version 2 is not supported"),
    ('{"version": 1}', "expected"),
    ('{"version": 1, "quotas": {}, "extra": 1}', "expected"),
    ('{"version": 1, "quotas": {"t": []}}', "quotas of 't'"),
    ('{"version": 1, "quotas": {"t": {"x": {"hard": 1}}}}', "'x' is not"),
    ('{"version": 1, "quotas": {"t": {"01": {"hard": 1}}}}', "'01' is not"),
    ('{"version": 1, "quotas": {"t": {"0": {"hard": -1}}}}', "quota of 't' on 0: hard must be"),
    ('{"version": 1, "quotas": {"t": {"0": {"hard": 1, "provisioned": 2}}}}', "above hard"),
    ('{"version": 1, "quotas": {"t": {"*": {"hrad": 1}}}}', "quota of 't' on *: expected"),
    ('{"version": 1, "quotas": {"": {}}}', "is not a tenant name"),
])
def test_corrupt_file_is_an_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "quotas.json").write_text(content)
    with pytest.raises(QuotaFileError) as info:
        QuotaStore(str(tmp_path))
    assert str(info.value).startswith(str(tmp_path / "quotas.json") + ": ")
    assert message in str(info.value)


def test_reload(tmp_path: Path) -> None:
    s = QuotaStore(str(tmp_path))
    s.set("t", 0, 10, None)
    other = QuotaStore(str(tmp_path))
    other.set("t", 0, 99, 9)
    assert s.get("t", 0) == Quota(10, None)
    s.reload()
    assert s.get("t", 0) == Quota(99, 9)
    (tmp_path / "quotas.json").write_text("garbage")
    with pytest.raises(QuotaFileError):
        s.reload()
    assert s.get("t", 0) == Quota(99, 9)  # a bad file never drops the quotas in force


# ---- ledger ----

def test_ledger_basics() -> None:
    led = Ledger()
    assert led.reserve("a", 0, 60, 100)
    assert not led.reserve("a", 0, 41, 100)
    assert led.reserve("a", 0, 30, 100)
    assert led.reserve("a", 1, 500, None)  # no limit
    assert not led.reserve("a", 0, 11, 100, kind="managed")  # the hard limit covers every kind
    assert led.reserve("a", 0, 10, 100, kind="managed")  # exactly the limit
    assert (led.usage("a", 0), led.usage("a", 1), led.usage("b", 0)) == (100, 500, 0)
    assert (led.usage("a", 0, kind="device"), led.usage("a", 0, kind="managed")) == (90, 10)
    assert led.breakdown("a", 0) == {"device": 90, "managed": 10}
    led.release("a", 0, 30)
    assert led.snapshot() == {("a", 0): 70, ("a", 1): 500}
    assert led.snapshot("managed") == {("a", 0): 10}
    led.release("a", 1, 600)  # more than held: logged, clamped at 0
    assert led.usage("a", 1) == 0 and ("a", 1) not in led.snapshot()
    assert led.reserve("a", HOST, 4096, None, kind="pinned")  # host memory, its own "GPU"
    assert led.snapshot() == {("a", 0): 70} and led.usage("a", HOST) == 4096
    with pytest.raises(ValueError):
        led.reserve("a", 0, -1, None)
    with pytest.raises(ValueError):
        led.reserve("a", 0, 1, None, kind="texture")


def test_ledger_concurrent_reservations_never_exceed_the_limit() -> None:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so that a race would show
    try:
        _race()
    finally:
        sys.setswitchinterval(old)


def _race() -> None:
    led, limit, size, threads, tries = Ledger(), 5000, 7, 16, 400
    granted = [0] * threads
    over: list[int] = []
    start = threading.Barrier(threads)

    def worker(i: int) -> None:
        start.wait()
        for n in range(tries):
            if led.reserve("t", 0, size, limit):
                granted[i] += 1
                used = led.usage("t", 0)
                if used > limit:
                    over.append(used)
                if n % 3 == 0:  # give some back, so that reservations keep racing
                    led.release("t", 0, size)
                    granted[i] -= 1

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not over
    assert led.usage("t", 0) == sum(granted) * size <= limit  # no update was lost
    while led.reserve("t", 0, size, limit):
        pass
    assert led.usage("t", 0) == limit // size * size
