#!/usr/bin/env python3
"""The salus policy's Python cost per event, on a replayed PyTorch-like job (no daemon, no GPU):
the microseconds pilotd's scheduler lock is held per allocation (allocation_requested +
allocated), per free (freed), per free that ends an iteration, and per watched launch
(watches_launches + launch_requested + launch_started), as pilotd calls them. Launches the policy
does not watch are counted, as pilotd counts them, and reach it in AllocationView.launches.

    python3 bench/salus_policy_cost.py [--steps 3000] [--jobs 3] [--profile]

`--profile` prints cProfile's top functions instead of the timings."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from salus_step_shapes import MIB, job, torch_like_step

from pilot.policies import AllocationView, LaunchView, SessionView, Watch
from pilot.policies.salus.policy import Salus, SalusSettings


def replay(steps: int, jobs: int) -> dict[str, list[int]]:
    """Every job's calls, round robin one call each, through the policy; nanoseconds per event."""
    policy = Salus(SalusSettings(scheduler="pack", capacity=64 << 30))
    cost: dict[str, list[int]] = {"alloc": [], "free": [], "boundary": [], "launch": []}
    streams = []
    for sid in range(1, jobs + 1):
        s = SessionView(sid, f"t{sid}", 1000 + sid, 0, 0)
        policy.session_started(s)
        streams.append((s, job([64 * MIB, 16 * MIB], torch_like_step(), steps)))
    clock = time.perf_counter_ns
    lid = 0
    launches = {s.id: 0 for s, _ in streams}  # pilotd's count per session
    live = list(streams)
    while live:
        for s, calls in list(live):
            call = next(calls, None)
            if call is None:
                live.remove((s, calls))
                continue
            what, size = call
            a = AllocationView(s.id, s.tenant, 0, "device", 0, size, launches=launches[s.id])
            if what == "alloc":
                t0 = clock()
                policy.allocation_requested(a)
                policy.allocated(a)
                cost["alloc"].append(clock() - t0)
            elif what == "free":
                before = policy.jobs[s.id].detector.boundaries
                t0 = clock()
                policy.freed(a)
                took = clock() - t0
                cost["boundary" if policy.jobs[s.id].detector.boundaries != before else "free"].append(took)
            else:
                launches[s.id] += 1
                t0 = clock()
                if policy.watches_launches(s.id) is not Watch.NONE:
                    lid += 1
                    v = LaunchView(lid, s.id, s.tenant, s.pid, 0, 0, "k", (1, 1, 1), (1, 1, 1), 0, (),
                                   0.0, 0.0, 1)
                    policy.launch_requested(v)
                    policy.launch_started(v)
                    cost["launch"].append(clock() - t0)
    return cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(replay, args.steps, args.jobs)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return 0
    cost = replay(args.steps, args.jobs)
    for what, ns in cost.items():
        if ns:
            ns.sort()
            print(f"{what:9s} n {len(ns):7d}  median {ns[len(ns) // 2] / 1e3:6.2f} us  "
                  f"mean {sum(ns) / len(ns) / 1e3:6.2f} us  p99 {ns[int(len(ns) * 0.99)] / 1e3:6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
