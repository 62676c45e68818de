#!/usr/bin/env python3
"""What the first managed kernel of a fresh process pays under pilot (issue 28, item 2).

    python3 bench/um_first_probe.py [--runs 5] [--backend cuda|sim]

Builds bench/um_first.cu, starts a pilotd of its own (metrics on a free local port), runs
um_first RUNS times natively and RUNS times under pilot (each run a fresh process), and prints
the medians of um_first_kernel_ms / um_second_kernel_ms / um_first_alloc_ms side by side, then
the daemon's own time per call of each function the pilot runs made (pilot_call_latency_seconds:
sum / count and per run), the largest first: the handlers on the first kernel's path
(staging_open, shadow_flush, the launch, module loading) against those of the allocation
(malloc_managed, shadow_attach, the fault channel's staging_open). About 30 s on the H100.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from pilotd_process import PilotdProcess

from bench import PROGRAMS as BENCH_PROGRAMS  # bench/bench.py, beside this script
from bench import SIM_KERNELS, build, find_shim, parse_metrics

SAMPLE = re.compile(r'^pilot_call_latency_seconds_(sum|count)\{function="([^"]+)"[^}]*\} (\S+)$')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def medians(outputs: list[str]) -> dict[str, float]:
    runs = [parse_metrics(o) for o in outputs]
    return {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]} if runs else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pilot-first-"))
    [program] = [p for p in BENCH_PROGRAMS if p.name == "um_first"]
    exe = build((program,), work, args.arch)["um_first"]
    port, sock = free_port(), str(work / "pilot.sock")
    cmd = [sys.executable, "-m", "pilot.daemon", "--backend", args.backend, "--socket", sock,
           "--metrics-address", f"127.0.0.1:{port}"]
    if args.backend == "sim":
        cmd += ["--sim-kernels", str(SIM_KERNELS)]
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PILOT_SOCKET")}
    daemon = PilotdProcess(cmd, work / "pilotd.log", base, print)
    try:
        daemon.wait_ready(60)
        pilot_env = {**base, "LD_PRELOAD": find_shim(None), "PILOT_SOCKET": sock}
        native_env = pilot_env if args.backend == "sim" else base
        outs: dict[str, list[str]] = {"native": [], "pilot": []}
        for _ in range(args.runs):
            for mode, env in (("native", native_env), ("pilot", pilot_env)):
                proc = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120)
                if proc.returncode != 0:
                    print(f"{mode} run failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}")
                    return 1
                outs[mode].append(proc.stdout)
        native, pilot = medians(outs["native"]), medians(outs["pilot"])
        print(f"medians of {args.runs} fresh processes ({args.backend} backend)\n")
        print(f"{'metric':24} {'native':>10} {'pilot':>10} {'ratio':>7}")
        for key in native:
            ratio = pilot[key] / native[key] if native[key] else float("nan")
            print(f"{key:24} {native[key]:10.3f} {pilot[key]:10.3f} {ratio:6.2f}x")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        daemon.stop()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            (sums if m.group(1) == "sum" else counts)[m.group(2)] = float(m.group(3))
    print(f"\npilotd's time per function over the {args.runs} pilot runs (largest first)\n")
    print(f"{'function':28} {'calls/run':>9} {'ms/call':>9} {'ms/run':>9}")
    for fn, total in sorted(sums.items(), key=lambda kv: -kv[1]):
        n = counts.get(fn, 0)
        if n:
            print(f"{fn:28} {n / args.runs:9.1f} {1e3 * total / n:9.3f} {1e3 * total / args.runs:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
