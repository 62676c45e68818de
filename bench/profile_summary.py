#!/usr/bin/env python3
"""Summarize a py-spy raw profile (one `frame;frame;... count` line per stack): the functions of
the thread that took most samples, by own time and by inclusive time (bench/profile_daemon.sh).

    python3 bench/profile_summary.py PROFILE.txt [TOP]
"""

from __future__ import annotations

import re
import sys
from collections import Counter

_LINE = re.compile(r":\d+\)$")


def function(frame: str) -> str:
    """`name (file:line)` -> `name (file)`: lines of one function count together."""
    return _LINE.sub(")", frame)


def main() -> int:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    stacks: list[tuple[list[str], int]] = []
    threads: Counter[str] = Counter()
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [function(f) for f in stack.split(";")]
        stacks.append((frames, int(count)))
        threads[frames[0]] += int(count)
    if not stacks:
        print("no samples")
        return 1
    busiest = threads.most_common(1)[0][0]
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for frames, count in stacks:
        if frames[0] != busiest:
            continue
        total += count
        own[frames[-1]] += count
        for f in set(frames[1:]):
            inclusive[f] += count
    print(f"thread {busiest}: {total} samples ({', '.join(f'{t}: {n}' for t, n in threads.most_common(4))})")
    print("own time:")
    for f, c in own.most_common(top):
        print(f"  {c / total * 100:5.1f}%  {f[:140]}")
    print("inclusive time:")
    for f, c in inclusive.most_common(top):
        print(f"  {c / total * 100:5.1f}%  {f[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
