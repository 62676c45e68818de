"""Compute shares (resources/shares.py): the store, the planner's partitions over the sim's
H100 geometry, and the control commands."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.resources.shares import (
    ComputeShares,
    ShareFileError,
    ShareStore,
    SmPlanner,
    units_for,
)
from pilot.daemon.router import control
from pilot.daemon.sessions.session import Credentials
from pilot.daemon.sim_kernels import KernelRegistry

ADMIN = Credentials(uid=0, gid=0, pid=1)
ALICE = Credentials(uid=1001, gid=1001, pid=2)


@pytest.fixture()
def sim() -> SimBackend:
    return SimBackend(KernelRegistry(), device_count=2)


def test_store_falls_back_from_gpu_to_every_gpu_to_config(tmp_path: Any) -> None:
    store = ShareStore(str(tmp_path), {"ml": 50})
    assert store.get("ml", 0) == 50 and store.get("user:bob", 0) is None
    store.set("ml", None, 25)
    store.set("ml", 1, 10)
    assert (store.get("ml", 0), store.get("ml", 1)) == (25, 10)
    store.set("user:bob", 0, 100)  # 100%: no cap
    assert store.get("user:bob", 0) is None
    again = ShareStore(str(tmp_path), {"ml": 50})  # persisted
    assert again.list() == {"ml": {"*": 25, "1": 10}, "user:bob": {"0": 100}}
    assert again.unset("ml", 1) and not again.unset("ml", 1)
    assert again.get("ml", 1) == 25
    assert again.unset("ml") and again.get("ml", 1) == 50  # the config's default again


@pytest.mark.parametrize("bad", [0, 101, -5, 2.5, True, "25"])
def test_store_refuses_what_is_not_a_percentage(tmp_path: Any, bad: Any) -> None:
    with pytest.raises(ValueError, match="percentage"):
        ShareStore(str(tmp_path)).set("ml", 0, bad)
    assert ShareStore(str(tmp_path)).list() == {}


def test_store_refuses_a_broken_file(tmp_path: Any) -> None:
    (tmp_path / "shares.json").write_text('{"version": 1, "shares": {"ml": {"0": 300}}}')
    with pytest.raises(ShareFileError, match="percentage"):
        ShareStore(str(tmp_path))


def test_units_round_down_to_at_least_one(sim: SimBackend) -> None:
    lay = sim.sm_layout(0)
    assert lay is not None
    assert [units_for(p, lay) for p in (1, 6, 25, 30, 50, 99)] == [1, 1, 4, 4, 8, 15]


def test_planner_gives_capped_tenants_their_units_and_the_rest_to_others(sim: SimBackend) -> None:
    planner = SmPlanner(sim, 0, sim.sm_layout(0))
    assert planner.acquire("user:bob", None) is None  # nobody capped: the whole GPU
    ml = planner.acquire("ml", 25)
    assert ml.sm_count == 32 and ml.units == (0, 1, 2, 3)
    assert planner.acquire("ml", 25) is ml  # the tenant's sessions share its partition
    rest = planner.acquire("user:bob", None)
    assert rest.sm_count == 100 and rest.units == tuple(range(4, 15))
    assert planner.acquire("user:carol", None) is rest
    assert planner.held() == {"ml": 32}
    other = planner.acquire("cv", 10)  # 13 SMs -> one unit, a free one
    assert other.units == (4,)
    assert planner.acquire("user:dan", None).units == tuple(range(5, 15))
    for _ in range(2):
        planner.release(ml)
    assert not ml.alive and planner.held() == {"cv": 8}
    assert rest.alive  # still used by two sessions


def test_overcommitted_shares_share_the_least_used_units(sim: SimBackend) -> None:
    planner = SmPlanner(sim, 0, sim.sm_layout(0))
    a = planner.acquire("a", 90)  # 14 units
    b = planner.acquire("b", 25)  # 4 units: the last free one and 3 of a's
    assert len(a.units) == 14 and 14 in b.units and len(b.units) == 4


def test_no_layout_means_no_partitions(sim: SimBackend) -> None:
    planner = SmPlanner(sim, 0, None)
    assert planner.acquire("ml", 25) is None


def test_compute_shares_places_and_releases_sessions(sim: SimBackend, tmp_path: Any) -> None:
    store = ShareStore(str(tmp_path))
    store.set("ml", 1, 25)
    shares = ComputeShares(store, sim, {0: 0, 1: 1})
    on0 = SimpleNamespace(tenant="ml", device=0, partition=None)
    on1 = SimpleNamespace(tenant="ml", device=1, partition=None)
    shares.place(on0)
    shares.place(on1)
    assert on0.partition is None and on1.partition.sm_count == 32
    assert shares.report()[1]["held"] == {"ml": 32}
    part = on1.partition
    shares.release(on1)
    assert on1.partition is None and not part.alive and shares.report()[1]["held"] == {}


def fake_daemon(sim: SimBackend, tmp_path: Any) -> Any:
    names = {0: "root", 1001: "alice"}
    return SimpleNamespace(
        resolver=SimpleNamespace(tenant_of=lambda uid, gid: f"user:{names[uid]}",
                                 is_admin=lambda uid, gid, group: uid == 0),
        gpus={0: 0}, config=SimpleNamespace(admin_group="pilot-admin", tenants={"ml": None}),
        shares=ComputeShares(ShareStore(str(tmp_path)), sim, {0: 0}))


def call(daemon: Any, creds: Credentials, cmd: str, **args: Any) -> dict[str, Any]:
    return json.loads(control.handle(daemon, creds, json.dumps({"cmd": cmd, "args": args}).encode()))


def test_control_sets_lists_and_unsets_shares(sim: SimBackend, tmp_path: Any) -> None:
    d = fake_daemon(sim, tmp_path)
    refused = call(d, ALICE, "share.set", tenant="ml", percent=25)
    assert refused["ok"] is False and "needs root" in refused["error"]
    r = call(d, ADMIN, "share.set", tenant="ml", percent="25%", gpu=0)
    assert r == {"ok": True, "result": {"tenant": "ml", "gpu": 0, "percent": 25,
                                        "sms": {"0": [32, 132]}}}
    assert call(d, ADMIN, "share.set", tenant="ml", percent=0)["ok"] is False
    assert call(d, ADMIN, "share.set", tenant="ml", percent=25, gpu=7)["error"].startswith("no GPU 7")
    listing = call(d, ADMIN, "share.list")["result"]
    assert listing["shares"] == {"ml": {"0": 25}} and listing["gpus"]["0"]["sms"] == 132
    assert call(d, ALICE, "share.list")["result"]["shares"] == {}  # not alice's
    assert call(d, ADMIN, "share.unset", tenant="ml")["ok"]
    assert call(d, ADMIN, "share.unset", tenant="ml")["ok"] is False


def test_a_vgpu_thread_switches_context_only_between_partitions() -> None:
    """Dispatch.enter: the vGPU thread makes a session's partition current before its calls,
    and calls the backend only when the partition changes (the hot path pays one test)."""
    from pilot.daemon.vgpu.dispatch import Dispatch

    calls: list[Any] = []
    vg = Dispatch()
    vg.backend = SimpleNamespace(use_partition=lambda device, part: calls.append((device, part)))
    vg.device, vg._partition = 3, None
    capped, other = SimpleNamespace(partition="P"), SimpleNamespace(partition=None)
    for s in (other, capped, capped, other, other, capped):
        vg.enter(s)  # type: ignore[arg-type]
    assert calls == [(3, "P"), (3, None), (3, "P")] and vg._partition == "P"


def test_shares_over_100_percent_of_a_gpu_are_refused(sim: SimBackend, tmp_path: Any) -> None:
    """ml 60% and cv 30% fit a GPU; 20% more for root does not, naming who holds the rest; a
    tenant's new value replaces its old; 100 (no cap) is never refused."""
    d = fake_daemon(sim, tmp_path)
    d.config.tenants["cv"] = None
    assert call(d, ADMIN, "share.set", tenant="ml", percent=60)["ok"]
    assert call(d, ADMIN, "share.set", tenant="cv", percent=30, gpu=0)["ok"]
    r = call(d, ADMIN, "share.set", tenant="root", percent=20, gpu=0)
    assert r["ok"] is False and r["error"] == ("shares on GPU 0 would add up to 110% (user:root 20%, "
                                               "cv 30%, ml 60%): at most 100%; lower or unset one")
    assert call(d, ADMIN, "share.set", tenant="ml", percent=70)["ok"]  # 70 + 30
    assert call(d, ADMIN, "share.set", tenant="ml", percent=71)["ok"] is False
    assert call(d, ADMIN, "share.set", tenant="root", percent=100)["ok"]
    assert d.shares.store.get("ml", 0) == 70
