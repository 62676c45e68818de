"""Salus lanes: Algorithm 1, shrinking, and the safety condition under random arrivals and ends."""

from __future__ import annotations

import random

import pytest

from pilot.policies.salus.lanes import Lanes

GB = 10**9
N_EVENTS = 100_000


def test_create_then_reuse_then_grow_then_wait() -> None:
    lanes = Lanes(10 * GB)
    assert lanes.admit(1, 1 * GB, 3 * GB).how == "create"      # used 4
    assert lanes.admit(2, 1 * GB, 2 * GB).how == "create"      # used 7
    p = lanes.admit(3, 1 * GB, GB // 2)                         # room 2 >= 0.5: a lane of its own
    assert p is not None and p.how == "create"                  # used 8.5
    p = lanes.admit(4, GB // 2, 2 * GB)                         # room 1 < 2: the closest lane, 2
    assert p is not None and p.how == "reuse" and p.lane == lanes.lane_of(2)
    assert lanes.used == 9 * GB
    p = lanes.admit(5, 0, 4 * GB)                               # room 1: only 3 -> 4 can grow
    assert p is not None and p.how == "grow" and p.lane == lanes.lane_of(1)
    assert lanes.used == 10 * GB and lanes.lanes[p.lane].size == 4 * GB
    assert lanes.admit(6, 1, 0) is None                         # P alone does not fit
    assert lanes.safe()


@pytest.mark.parametrize(("grow", "expected"), [("smallest", 1), ("closest", 2)])
def test_grow_picks_the_smallest_or_the_closest_lane(grow: str, expected: int) -> None:
    lanes = Lanes(10 * GB, grow=grow)
    lanes.admit(1, 3 * GB, 1 * GB)
    lanes.admit(2, 5 * GB // 2, 2 * GB)  # used 8.5, room 1.5
    p = lanes.admit(3, 0, 5 * GB // 2)   # both lanes can grow to 2.5
    assert p is not None and p.how == "grow" and p.lane == lanes.lane_of(expected)
    assert lanes.used <= 10 * GB and lanes.safe()


def test_shared_lanes_reuse_or_grow_before_creating() -> None:
    """For one-job-at-a-time schedulers: one lane, as large as the largest E."""
    lanes = Lanes(12 * GB, shared=True)
    assert lanes.admit(1, 1 * GB, 2 * GB).how == "create"
    assert lanes.admit(2, 1 * GB, 1 * GB).how == "reuse"
    p = lanes.admit(3, 1 * GB, 4 * GB)
    assert p is not None and p.how == "grow" and len(lanes.lanes) == 1
    assert lanes.used == 3 * GB + 4 * GB
    assert lanes.admit(4, 6 * GB, 0) is None  # P alone does not fit
    plain = Lanes(12 * GB)
    for job, (p_, e) in enumerate([(1, 2), (1, 1), (1, 4)]):
        plain.admit(job, p_ * GB, e * GB)
    assert len(plain.lanes) == 3 and plain.used == 10 * GB  # the same jobs, three lanes


def test_the_papers_deadlock_example_shares_one_lane() -> None:
    lanes = Lanes(12 * GB)
    assert lanes.admit(1, 1 * GB, 7 * GB).how == "create"
    p = lanes.admit(2, 1 * GB, 7 * GB)
    assert p is not None and p.how == "reuse" and lanes.lane_of(1) == lanes.lane_of(2)
    assert lanes.used == 9 * GB and len(lanes.lanes) == 1


def test_lanes_shrink_and_vanish_when_jobs_leave() -> None:
    lanes = Lanes(13 * GB)
    lanes.admit(1, 1 * GB, 7 * GB)
    lanes.admit(2, 1 * GB, 3 * GB)  # used 12
    lanes.admit(3, 1 * GB, 6 * GB)  # room 0: the lane of 7
    lane = lanes.lane_of(3)
    assert lane == lanes.lane_of(1)
    lanes.remove(1)
    assert lanes.lanes[lane].size == 6 * GB and lanes.used == 11 * GB  # the largest E left
    lanes.remove(3)
    assert lane not in lanes.lanes and lanes.used == 1 * GB + 3 * GB
    lanes.remove(3)  # again: ignored
    assert lanes.safe()


def test_update_keeps_or_releases_the_job() -> None:
    lanes = Lanes(10 * GB)
    lanes.admit(1, 2 * GB, 2 * GB)
    lanes.admit(2, 2 * GB, 2 * GB)  # used 8
    assert lanes.update(1, 2 * GB, 4 * GB)  # grows its lane: 10
    assert lanes.used == 10 * GB
    assert not lanes.update(2, 3 * GB, 2 * GB)  # would be 11: leaves
    # its 3 GB are still held (it is at a boundary): counted outside the lanes
    assert 2 not in lanes and lanes.used == 9 * GB and lanes.outside == {2: 3 * GB}
    assert lanes.update(1, 1 * GB, 1 * GB) and lanes.used == 5 * GB  # shrinks
    assert lanes.safe()
    lanes.remove(2)  # it ended: nothing of it is counted
    assert lanes.used == 2 * GB and lanes.safe()


def test_zero_e_jobs_get_their_own_lane_of_size_zero() -> None:
    lanes = Lanes(4 * GB)
    lanes.admit(1, 1 * GB, 3 * GB)
    p = lanes.admit(2, 0, 0)
    assert p is not None and p.how == "create" and p.size == 0
    assert lanes.lane_of(2) != lanes.lane_of(1)


def test_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Lanes(1, grow="largest")
    lanes = Lanes(GB)
    with pytest.raises(ValueError):
        lanes.plan(-1, 0)
    lanes.admit(1, 0, 0)
    with pytest.raises(ValueError):
        lanes.admit(1, 0, 0)


@pytest.mark.parametrize(("grow", "shared", "events"), [("smallest", False, N_EVENTS),
                                                        ("closest", False, N_EVENTS // 4),
                                                        ("smallest", True, N_EVENTS // 4)])
def test_safety_holds_over_random_arrivals_and_finishes(grow: str, shared: bool, events: int) -> None:
    """10^5 random events (arrival, finish, re-measure) on C = 12 GB with the paper's deadlock
    pair mixed in: the condition holds after each, and no two (P = 1 GB, E = 7 GB) jobs ever sit
    in separate lanes."""
    rng = random.Random(30 + len(grow) + shared)
    C = 12 * GB
    lanes = Lanes(C, grow, shared)
    waiting: list[tuple[int, int, int]] = []  # FIFO: (job, P, E)
    pair: set[int] = set()
    next_job = 0
    admitted_somewhere = shared = 0
    for _ in range(events):
        r = rng.random()
        if r < 0.45:
            next_job += 1
            if rng.random() < 0.2:
                size = (1 * GB, 7 * GB)
                pair.add(next_job)
            else:
                size = (rng.randrange(0, 4 * GB), rng.randrange(0, 8 * GB))
            waiting.append((next_job, *size))
        elif r < 0.9 and lanes.members:
            job = rng.choice(list(lanes.members))
            lanes.remove(job)
            pair.discard(job)
        elif lanes.members:
            job = rng.choice(list(lanes.members))
            pair.discard(job)  # no longer of the pair's sizes
            if not lanes.update(job, rng.randrange(0, 4 * GB), rng.randrange(0, 8 * GB)):
                # it left its lane, still holding its P (counted outside); here it frees it and
                # asks again with new sizes
                assert job in lanes.outside
                lanes.hold_outside(job, 0)
                waiting.append((job, rng.randrange(0, 2 * GB), rng.randrange(0, 4 * GB)))
        still = []
        for job, p, e in waiting:  # ask the waiting again, oldest first
            if lanes.admit(job, p, e) is None:
                still.append((job, p, e))
            else:
                admitted_somewhere += 1
        waiting = still[-20:]  # jobs that never fit give up after a while
        assert lanes.used <= C
        pair_in = [lanes.lane_of(j) for j in pair if j in lanes]
        assert len(set(pair_in)) <= 1
        shared += len(pair_in) > 1
    assert lanes.safe()
    assert admitted_somewhere > events // 5 and shared > events // 100  # the pair did meet
