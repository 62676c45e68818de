"""Fault backoff: a tenant whose kernels fault again and again waits longer and longer before
its next program gets the GPU (`[isolation] fault_backoff`, `fault_backoff_max`).

Why: after its first fault a tenant runs in an engine of its own (router/isolation.py), so its
later faults poison only its own work, but not without cost to the others. On the H200
(2026-11-28, tests/gpu/confine_check.py) a fault in such an engine, outside MPS, stalled the
kernel another tenant's MPS client had running for 35.7 s (the GPU's recovery of the faulted
context: that one kernel, the rest ran at their pace). A program that faults on purpose could
repeat that for ever. So after each fault of a tenant's engine (router/recovery.py
`record_engine_fault`: under MPS its first fault is one; in the shared pilotd the first fault
only isolates the tenant), from its second in an hour, its next session waits `fault_backoff` x
2^(k-2) seconds from that fault, k its engine's faults in the last hour, at most
`fault_backoff_max` (as Kubernetes backs off a crashing container): a buggy program's one fault
costs it nothing, a stream of them costs an attacker more and more. An operator's `pilotctl
isolate clear` forgets the faults before it (until pilotd restarts).
"""

from __future__ import annotations

from collections.abc import Iterable

WINDOW_S = 3600.0  # faults older than this do not count


def backoff_wait(fault_times: Iterable[float], now: float, base: float, most: float,
                 cleared: float = 0.0) -> tuple[float, int]:
    """Seconds a tenant with faults at `fault_times` (time.time()) must still wait at `now`, and
    how many of its faults counted (in the last WINDOW_S, after `cleared`): from the second,
    `base` x 2^(k-2) from the last, at most `most`. 0 when `base` is 0."""
    recent = sorted(t for t in fault_times if t > max(now - WINDOW_S, cleared) and t <= now)
    if base <= 0 or len(recent) < 2:
        return 0.0, len(recent)
    wait = min(most, base * 2.0 ** min(len(recent) - 2, 60))
    return max(0.0, recent[-1] + wait - now), len(recent)
