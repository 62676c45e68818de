"""Choosing how a gated kernel runs from measured times (scheduling/preempt_choice.py): the
fastest variant, the original when every variant costs more than 5%, decisions with what was
measured once the tries run out, and keys by grid size class."""

from __future__ import annotations

import pytest

from pilot.daemon.scheduling import preempt_choice as pc


def measured(times: dict[int, float], rounds: int = pc.SAMPLES) -> pc.Choice:
    choice = pc.Choice()
    for _ in range(rounds * len(pc.CANDIDATES)):
        candidate = choice.next()
        choice.add(candidate, times[candidate])
    return choice


@pytest.mark.parametrize(("times", "decided"), [
    ({0: 1.00, 1: 1.20, 8: 1.03}, 8),  # chunk 8 within 5%: preemptible at chunk 8
    ({0: 1.00, 1: 1.01, 8: 0.90}, 8),  # faster than the original (a better-fitting grid)
    ({0: 1.00, 1: 1.02, 8: 1.02}, 1),  # a tie goes to the smaller chunk (an earlier retreat)
    ({0: 1.00, 1: 1.20, 8: 1.10}, pc.ORIGINAL),  # every variant costs more than 5%
])
def test_the_fastest_variant_or_the_original(times: dict[int, float], decided: int) -> None:
    choice = measured(times)
    assert choice.decided == decided
    assert choice.tries == pc.SAMPLES * len(pc.CANDIDATES)


def test_candidates_alternate_and_late_samples_change_nothing() -> None:
    choice = pc.Choice()
    assert [choice.next() for _ in range(3)] == [0, 0, 0]  # nothing added yet: the fewest
    choice = pc.Choice()
    order = []
    for _ in range(6):
        c = choice.next()
        order.append(c)
        choice.add(c, 1.0)
    assert order == [0, 1, 8, 0, 1, 8]
    done = measured({0: 1.0, 1: 2.0, 8: 2.0})
    done.add(1, 0.001)  # a launch measured before the decision, seen after it
    assert done.decided == pc.ORIGINAL


def test_tries_run_out_into_a_preemptible_decision() -> None:
    choice = pc.Choice()
    for _ in range(pc.MAX_TRIES):  # launches measured, none of them usable (words went up)
        choice.next()
    choice.expire()
    assert choice.decided == pc.FALLBACK_CHUNK
    partial = pc.Choice()
    partial.add(8, 1.0)
    partial.add(0, 0.5)
    partial.tries = pc.MAX_TRIES
    partial.expire()
    assert partial.decided == pc.ORIGINAL  # what it has says so
    early = pc.Choice()
    early.add(1, 1.0)
    early.expire()  # tries left: still measuring
    assert early.decided is None and early.describe() == "measuring"


def test_keys_class_grids_by_powers_of_two() -> None:
    assert pc.key("k", 256, 0, 1000) == pc.key("k", 256, 0, 1024) != pc.key("k", 256, 0, 1025)
    assert pc.key("k", 256, 0, 1) != pc.key("k", 128, 0, 1) != pc.key("k", 128, 64, 1)
    assert pc.key("k", 256, 0, 0)[3] == pc.key("k", 256, 0, 1)[3] == 0
