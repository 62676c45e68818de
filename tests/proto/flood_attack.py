#!/usr/bin/env python3
"""A hostile local user's flood (issue 27, items 2 and 3), until stdin closes: rounds of 50 idle
connections to each socket given, plus one per socket that sends a 1 GiB frame header or random
bytes; all closed at the end of the round. Prints the number of rounds when it stops.

    python3 tests/proto/flood_attack.py [--uid UID] [--frames N] SOCKET...

--uid: drop to that uid (and its own gid, no groups) after the imports, so root can run it as
another user (tests/proto/test_hostile_users.py's soak, tests/gpu/flood_latency.py): the
sockets then see that user's peer credentials."""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rawzmtp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uid", type=int)
    ap.add_argument("--frames", type=int, default=1, help="hostile frames per socket per round")
    ap.add_argument("sockets", nargs="+")
    args = ap.parse_args()
    if args.uid is not None:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    rng = random.Random(27)
    rounds = frames = 0
    stdin = os.fdopen(0, "rb", 0)
    os.set_blocking(0, False)
    while True:
        try:
            if stdin.read(1) == b"":
                break
        except (BlockingIOError, TypeError):
            pass
        held = []
        for path in args.sockets:
            for _ in range(50):
                try:
                    held.append(rawzmtp.connect(path, timeout=1))
                except OSError:
                    pass
            for _ in range(args.frames):
                try:
                    s = rawzmtp.connect(path, timeout=1)
                    held.append(s)
                    if rng.random() < 0.5:
                        s.sendall(bytes([0x02]) + (1 << 30).to_bytes(8, "big") + b"\0" * 65536)
                    else:
                        s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.choice((3, 40, 300, 5000)))))
                    frames += 1
                except OSError:
                    pass
        for s in held:
            s.close()
        rounds += 1
    print(rounds, frames, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
