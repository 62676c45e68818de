#!/usr/bin/env python3
"""The GPU's preemption tallies per program, from pilotd logs written at `log_level = "info"`
(run_compare.sh COMPARE_CHAOS, real_programs.sh REAL_CHAOS): pilotd logs each session's command
line when it starts, and its preemptible launches, preempted launches, deferred blocks and
retreats when it ends (scheduling/preempt.py). Prints a markdown table on stdout.

    python3 tests/gpu/chaos_tallies.py --chaos 1ms --runs 2 PILOTD_LOG...
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

START = re.compile(r"session (\d+): pid \d+ uid \d+ \((.*?)\) on vGPU")
END = re.compile(r"session (\d+) \(([^)]*)\): (\d+) preemptible launches, (\d+) preempted, "
                 r"(\d+) blocks deferred, (\d+) retreats")


def tallies(paths: list[str]) -> dict[str, list[int]]:
    """program (its command line, the executable's base name) -> [sessions, preemptible launches,
    preempted launches, blocks deferred, retreats]. Logs are read in order: a session number
    names the command line last logged for it (pilotd numbers sessions again after a restart)."""
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for path in paths:
        names: dict[str, str] = {}
        with open(path, errors="replace") as log:
            for line in log:
                if m := START.search(line):
                    words = m.group(2).split()
                    names[m.group(1)] = " ".join([words[0].rsplit("/", 1)[-1], *words[1:]]) if words else "?"
                elif m := END.search(line):
                    row = rows[names.get(m.group(1), "?")]
                    row[0] += 1
                    for i in range(4):
                        row[i + 1] += int(m.group(i + 3))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chaos", required=True, help="the preempt_chaos setting of the run")
    parser.add_argument("--runs", default="1", help="runs of each program under pilot")
    parser.add_argument("logs", nargs="+")
    args = parser.parse_args()
    rows = tallies(args.logs)
    print(f'preemption forced at random (`[priority] preempt_chaos = "{args.chaos}"`, each program '
          f"{args.runs} time(s) under pilot): the GPU's tallies per program\n")
    print("(retreats: launches whose blocks saw the word raised; preempted: those of them that left "
          "blocks to their rest, which only a grid larger than the GPU holds at once can)\n")
    print("| program | sessions | preemptible launches | retreats | preempted launches | blocks deferred |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (n, launches, pre, deferred, retreats) in sorted(rows.items()):
        print(f"| {name} | {n} | {launches} | {retreats} | {pre} | {deferred} |")
    t = [sum(r[i] for r in rows.values()) for i in range(5)]
    print(f"| **all** | {t[0]} | {t[1]} | {t[4]} | {t[2]} | {t[3]} |")


if __name__ == "__main__":
    main()
