#!/usr/bin/env python3
"""Where a process's threads wait: samples /proc/PID/task/*/{stat,syscall,wchan} every INTERVAL
for DURATION seconds and prints, per thread (the busiest first), its CPU share and how often it
was running, or blocked in which system call (futex: with its address, so one lock shared by
several threads shows as one address; the interpreter lock is the futex most Python threads
share). No ptrace, no symbols: it works where py-spy and perf cannot attach (containers).

    python3 bench/thread_waits.py PID [--duration 5] [--interval 0.0005] [--top 12]
    python3 bench/thread_waits.py --match "pilot.daemon" ...   # the first process whose
                                                                 # command line contains it
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

SYSCALLS = {0: "read", 1: "write", 7: "poll", 23: "select", 202: "futex", 232: "epoll_wait",
            281: "epoll_pwait", 16: "ioctl", 35: "nanosleep", 230: "clock_nanosleep", 45: "recvfrom",
            44: "sendto", 46: "sendmsg", 47: "recvmsg", 271: "ppoll", 270: "pselect6", 24: "sched_yield",
            441: "epoll_pwait2"}


def find(match: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if match in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    return int(entry.name)
            except OSError:
                continue
    raise SystemExit(f"no process matches {match!r}")


def sample(pid: int) -> dict[int, tuple[str, str, int]]:
    """tid -> (state, what it waits in, utime+stime ticks)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            state, ticks = fields[0], int(fields[11]) + int(fields[12])
            what = "running"
            if state != "R":
                sc = (task / "syscall").read_text().split()
                if sc and sc[0].lstrip("-").isdigit():
                    nr = int(sc[0])
                    what = SYSCALLS.get(nr, f"syscall {nr}")
                    if nr == 202 and len(sc) > 1:
                        what += f" {sc[1]}"
                else:
                    what = (task / "wchan").read_text() or sc[0] if sc else "?"
            out[int(task.name)] = (state, what, ticks)
        except (OSError, ValueError):
            continue
    return out


def names(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("pid", nargs="?", type=int)
    ap.add_argument("--match", default="")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=0.0005)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--wait-busy", type=float, default=0.0,
                    help="first wait (up to 120 s) until the process has used this many cores for 2 s")
    args = ap.parse_args()
    deadline = time.monotonic() + 120
    while True:
        try:
            pid = args.pid or find(args.match)
            break
        except SystemExit:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    tick = os.sysconf("SC_CLK_TCK")
    busy = 0  # consecutive half-seconds at --wait-busy cores (a start-up burst is shorter)
    while args.wait_busy and busy < 4 and time.monotonic() < deadline:
        before = sum(t for _, _, t in sample(pid).values())
        time.sleep(0.5)
        used = (sum(t for _, _, t in sample(pid).values()) - before) / tick / 0.5
        busy = busy + 1 if used >= args.wait_busy else 0
    counts: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    first = sample(pid)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < args.duration:
        for tid, (_state, what, _t) in sample(pid).items():
            counts[tid][what] += 1
        n += 1
        time.sleep(args.interval)
    elapsed = time.monotonic() - start
    last = sample(pid)
    comm = names(pid)
    cpu = {tid: (last[tid][2] - first.get(tid, last[tid])[2]) / tick / elapsed for tid in last}
    futex_users: collections.Counter[str] = collections.Counter()
    for c in counts.values():
        for what in c:
            if what.startswith("futex "):
                futex_users[what] += 1
    print(f"pid {pid}: {n} samples over {elapsed:.1f} s, {len(counts)} threads")
    for tid in sorted(counts, key=lambda t: -cpu.get(t, 0))[:args.top]:
        total = sum(counts[tid].values())
        parts = ", ".join(f"{what} {100 * k / total:.0f}%" for what, k in counts[tid].most_common(4))
        print(f"  tid {tid} {comm.get(tid, '?'):16} cpu {cpu.get(tid, 0):.2f}  {parts}")
    shared = [(w, k) for w, k in futex_users.items() if k > 1]
    if shared:
        print("futex addresses several threads waited on: " +
              ", ".join(f"{w.split()[1]} ({k} threads)" for w, k in sorted(shared, key=lambda x: -x[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
