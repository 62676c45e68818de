"""Session placement (scheduling/placement.py): the least busy vGPU of an open GPU, or a new one
when that one already serves a session, up to the maximum."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pilot.daemon.scheduling.placement import place_part, place_session


def vgpu(index: int, gpu: int, sessions: int) -> Any:
    return SimpleNamespace(index=index, gpu=gpu, sessions=dict.fromkeys(range(sessions)))


def test_an_idle_vgpu_is_used_before_a_new_one() -> None:
    vgpus = [vgpu(0, 0, 1), vgpu(1, 0, 0)]
    grown: list[int] = []
    assert place_session(vgpus, set(), lambda g: grown.append(g)).index == 1  # type: ignore[func-returns-value]
    assert grown == []


def test_a_busy_gpu_grows_a_vgpu_for_the_new_session() -> None:
    vgpus = [vgpu(0, 0, 2), vgpu(1, 0, 1)]
    new = vgpu(2, 0, 0)
    assert place_session(vgpus, set(), lambda g: new if g == 0 else None) is new


def test_at_the_maximum_sessions_share_the_least_busy() -> None:
    vgpus = [vgpu(0, 0, 2), vgpu(1, 0, 1)]
    assert place_session(vgpus, set(), lambda g: None).index == 1
    assert place_session(vgpus, set()).index == 1  # no growth at all


def test_draining_gpus_get_no_new_sessions_and_do_not_grow() -> None:
    vgpus = [vgpu(0, 0, 0), vgpu(1, 1, 3)]
    asked: list[int] = []

    def grow(g: int) -> Any:
        asked.append(g)
        return None

    assert place_session(vgpus, {0}, grow).index == 1 and asked == [1]
    assert place_session(vgpus, {0, 1}, grow) is None


def test_a_part_on_another_gpu_grows_there_too() -> None:
    new = vgpu(5, 1, 0)
    assert place_part([vgpu(3, 1, 1)], lambda g: new if g == 1 else None) is new
    assert place_part([vgpu(3, 1, 0)], lambda g: new).index == 3


def _held_by(index: int, *tenants: str) -> Any:
    return SimpleNamespace(index=index, gpu=0,
                           sessions={i: SimpleNamespace(tenant=t) for i, t in enumerate(tenants)})


def test_a_tenant_at_its_share_of_vgpus_shares_its_own() -> None:
    """Issue 27 (5): sessions holding their threads (behind host callbacks) cannot take every
    vGPU: past `share` vGPUs a tenant's new session goes on the least busy of its own."""
    vgpus = [_held_by(0, "mallory"), _held_by(1, "mallory", "mallory"), _held_by(2, "alice")]
    grown: list[int] = []

    def grow(gpu: int) -> Any:
        grown.append(gpu)
        return _held_by(3)

    assert place_session(vgpus, set(), grow, "mallory", share=2).index == 0
    assert grown == []
    assert place_session(vgpus, set(), grow, "bob", share=2).index == 3  # others still grow
    assert place_session(vgpus, set(), grow, "mallory", share=3).index == 3  # below its share
