#!/usr/bin/env python3
"""Two short salus experiments on the GPU (each a fresh pilotd):

    python3 bench/salus_experiments.py fair --out /tmp/salus-fair          # about 60 s
    python3 bench/salus_experiments.py overhead --out /tmp/salus-overhead  # about 45 s
    python3 bench/salus_experiments.py torch --out /tmp/salus-torch        # about 60 s, PyTorch
    python3 bench/salus_experiments.py steps --out /tmp/salus-steps        # about 90 s, PyTorch
    python3 bench/salus_experiments.py fair --backend sim --scale 0.1      # no GPU: the script

fair (Salus Fig. 11): three jobs of P = 1 GiB, E = 7 GiB in C = 12 GiB (so they share one lane)
arrive 15 s apart (x --scale) under FAIR, with 27, 12.5 and 4 s of 50 ms iterations (x
--scale): as short as the shape allows, each is still there when the next comes and the three
share for about 11 s (the first end: the third job, about 42 s in; the whole run about 45 s of
GPU work; the paper's jobs were equal and longer, what compares is the shares). In each window
where k jobs are present (from 1 s after the k-th arrival to the next arrival or the first
end), each job's share of GPU time (its iteration seconds, pilotd's state every 50 ms) should
be 1/k within +-10% (PASS/FAIL), and each newcomer should run its first iteration within 1 s
of its arrival.

overhead: one job (P = E = 1 GiB, 150 iterations of 20 ms) alone under `none` and under
salus (PACK), three times each, alternating; PASS when salus's median JCT <= 1.05 x none's.
torch: bench/salus_torch_job.py (--size, --iterations) alone under salus, declaring nothing,
first with PyTorch's caching allocator (pilot should not recognize it: E = 0, P = all it holds),
then with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (pilot should recognize its
iterations: E > 0); prints what pilot measured, the JCT ratio (what the async backend costs
under pilot) and how many boundaries pilot saw for the steps (more than the steps: it cuts a step
into pieces, which SRTF's iteration count must survive); then the cudaMallocAsync run again with
`[daemon] fast_launch = false` (every call through Python, as salus had it before it watched
sessions one by one): how many launches and library calls ran in C and the JCT against that
(about 60 s in all). Needs PyTorch on the GPU machine.
steps (issue 30, about 2.5 min): what the detector makes of a step that returns to its level
several times. bench/salus_torch_job.py small and medium (--iterations steps,
backend:cudaMallocAsync, declaring only its step count) alone under salus (SRTF) and under
`none`: boundaries per step (PASS: 0.8 to 1.25 under salus), the pieces pilot saw and the period
it folded them by, P and E, and the median step time (salus against none: INFO); then
bench/salus_torch_like.cu (the sim's reproduction: 4 layers, 6 pieces a step) under salus, the
same PASS. Without PyTorch (or --backend sim) only salus_torch_like runs.
--out DIR writes the numbers as JSON (and fair.png with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from salus_bench import MIB, Daemon, JobSpec, Poller, build_job, run_jobs

# Seconds of iterations of the three FAIR jobs (x --scale). Alone for 15 s, then halves: the
# first has had 22.5 s and the second 7.5 s when the third comes at 30 s; at thirds the third
# ends first, 12 s later, and the others end within about 2 s of it.
FAIR_WORK_S = (27.0, 12.5, 4.0)


def shares(poller: Poller, pids: list[int], start: float, end: float) -> dict[int, float]:
    """Each pid's iteration seconds between start and end, over end - start."""
    def at(t: float) -> dict[int, float]:
        before = [s for when, s in poller.service if when <= t]
        return before[-1] if before else {}
    a, b = at(start), at(end)
    return {pid: (b.get(pid, 0.0) - a.get(pid, 0.0)) / (end - start) for pid in pids}


def fair(args: argparse.Namespace, work: Path, sim: bool) -> tuple[bool, dict[str, Any]]:
    exe = build_job(work)
    gap = 15.0 * args.scale
    mib = (1024, 7168) if not sim else (4, 28)
    capacity = "12GiB" if not sim else "48MiB"
    specs = [JobSpec(f"fair{i}", i * gap, mib[0], mib[1], 50.0, round(seconds * args.scale / 0.05))
             for i, seconds in enumerate(FAIR_WORK_S)]
    daemon = Daemon(work / "fair", args.backend, "salus", "fair", capacity)
    try:
        results, poller = run_jobs(daemon, specs, exe, sim)
    finally:
        daemon.stop()
    pids = sorted(poller.first_running, key=lambda p: poller.first_running[p])
    ok = all(r.rc == 0 for r in results) and len(pids) == 3
    first_end = min(r.ended for r in results)
    windows = []
    for k in (1, 2, 3):
        start = (k - 1) * gap + 1.0
        end = min(k * gap if k < 3 else first_end, first_end)
        if end - start < 1.0:
            continue
        got = shares(poller, pids[:k], start, end)
        total = sum(got.values())
        fine = all(abs(v / total - 1 / k) <= 0.1 / k for v in got.values()) if total else False
        windows.append({"k": k, "start": start, "end": end, "shares": list(got.values()),
                        "busy": total, "pass": fine})
        ok &= fine
    reactions = [poller.first_running.get(pid, float("inf")) - spec.arrival
                 for pid, spec in zip(pids, specs, strict=False)]
    ok &= all(r <= 1.0 for r in reactions)
    for w in windows:
        print(f"{'PASS' if w['pass'] else 'FAIL'}: {w['k']} job(s), {w['start']:.1f}-{w['end']:.1f} s: "
              f"shares {', '.join(f'{v:.2f}' for v in w['shares'])} of GPU time "
              f"(target {1 / w['k']:.2f} each, +-10%)")
    print(f"{'PASS' if all(r <= 1.0 for r in reactions) else 'FAIL'}: first iterations "
          f"{', '.join(f'{r:.2f}' for r in reactions)} s after arrival (target <= 1 s)")
    if args.out:
        plot_fair(poller, pids, work / "fair.png")
    return ok, {"windows": windows, "reactions": reactions, "service": poller.service}


def plot_fair(poller: Poller, pids: list[int], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3))
    times = [t for t, _ in poller.service]
    for n, pid in enumerate(pids):
        series = [s.get(pid, 0.0) for _, s in poller.service]
        rate = [0.0] + [(b - a) / (t1 - t0) if t1 > t0 else 0.0 for a, b, t0, t1 in
                        zip(series, series[1:], times, times[1:], strict=False)]
        ax.plot(times, rate, label=f"job {n + 1}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of GPU time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def overhead(args: argparse.Namespace, work: Path, sim: bool) -> tuple[bool, dict[str, Any]]:
    exe = build_job(work)
    mib = 1024 if not sim else 4
    spec = JobSpec("alone", 0.0, mib, mib, 20.0, 150)
    jct: dict[str, list[float]] = {"none": [], "salus": []}
    for n in range(3):
        for policy in ("none", "salus"):
            daemon = Daemon(work / f"{policy}{n}", args.backend, policy, "pack",
                            "12GiB" if not sim else "48MiB")
            try:
                [r], _ = run_jobs(daemon, [spec], exe, sim)
            finally:
                daemon.stop()
            if r.rc != 0:
                print(f"FAIL: the job failed under {policy}:\n{r.output}")
                return False, {}
            jct[policy].append(r.jct)
    ratio = statistics.median(jct["salus"]) / statistics.median(jct["none"])
    ok = ratio <= 1.05
    runs = {p: ", ".join(f"{v:.3f}" for v in jct[p]) for p in jct}
    print(f"{'PASS' if ok else 'FAIL'}: salus/none median JCT {ratio:.3f} (target <= 1.05); none "
          f"{runs['none']} s, salus {runs['salus']} s")
    return ok, {"jct": jct, "ratio": ratio}


def torch_jobs(args: argparse.Namespace, work: Path, sim: bool) -> tuple[bool, dict[str, Any]]:
    """A PyTorch job (salus_torch_job.py, --size) alone under salus, declaring nothing, with
    PyTorch's caching allocator and with backend:cudaMallocAsync: what pilot learns of it."""
    exe = build_job(work)
    doc: dict[str, Any] = {}
    slow = "[daemon]\nfast_launch = false\n"  # every call through Python: salus before issue 30's fix
    asynchronous_alloc = "backend:cudaMallocAsync"
    for name, alloc, config in (("caching", "", ""), (asynchronous_alloc, asynchronous_alloc, ""),
                                ("cudaMallocAsync, no fast path", asynchronous_alloc, slow)):
        spec = JobSpec(f"torch-{name}", 0.0, iterations=args.iterations, torch=args.size,
                       torch_alloc=alloc)
        daemon = Daemon(work / name.replace(":", "-").replace(", ", "-").replace(" ", "-"), args.backend,
                        "salus", "pack", "12GiB", config=config, metrics=True)
        try:
            [r], poller = run_jobs(daemon, [spec], exe, sim, declare=False)
            counts = {k: daemon.scrape(f"pilot_{k}_total") for k in
                      ("tenant_launches", "fast_launches", "fast_library_calls")}
        finally:
            daemon.stop()
        last = next(iter(poller.jobs.values()), {})
        doc[name] = {"rc": r.rc, "jct": r.jct, "state": last, "output": r.output[-2000:], "counts": counts}
        print(f"{name}: rc {r.rc}, JCT {r.jct:.2f} s; pilot saw: recognized {last.get('recognized')}, "
              f"P {last.get('persistent', 0) / MIB:.0f} MiB, E {last.get('ephemeral', 0) / MIB:.0f} MiB, "
              f"{last.get('iterations')} iterations of {last.get('iteration_s')} s")
    cached, asynchronous = doc["caching"], doc["backend:cudaMallocAsync"]
    slow_run = doc["cudaMallocAsync, no fast path"]
    seen = asynchronous["state"]
    fast = asynchronous["counts"]
    finished = cached["rc"] == 0 and asynchronous["rc"] == 0 and slow_run["rc"] == 0
    checks = [(finished, "all three runs finished"),
              (bool(cached["state"]) and not cached["state"].get("recognized"),
               "caching allocator: seen by pilot, not recognized (E = 0)"),
              (bool(seen.get("recognized")) and seen.get("ephemeral", 0) > 0,
               "cudaMallocAsync: recognized, E > 0"),
              (True, f"cudaMallocAsync / caching JCT: {asynchronous['jct'] / max(cached['jct'], 1e-9):.2f}x"),
              # more boundaries than steps: pilot cuts a step into pieces (its SRTF count runs ahead)
              (True, f"cudaMallocAsync: {seen.get('iterations')} boundaries for {args.iterations} steps"),
              # issue 30: salus no longer turns the fast path off for every call of every job
              (fast["fast_launches"] > 0,
               f"cudaMallocAsync under salus: {fast['fast_launches']:.0f} of {fast['tenant_launches']:.0f} "
               f"launches and {fast['fast_library_calls']:.0f} library calls ran in C; JCT "
               f"{asynchronous['jct']:.2f} s against {slow_run['jct']:.2f} s with every call through "
               f"Python (fast_launch = false, salus before): "
               f"{asynchronous['jct'] / max(slow_run['jct'], 1e-9):.2f}x")]
    for good, text in checks:
        print(f"{'PASS' if good else 'FAIL'}: {text}")
    return all(g for g, _ in checks), doc


def step_ms(output: str) -> float | None:
    """The median step salus_torch_job.py printed (`step_ms X`), if it did."""
    for line in output.splitlines():
        if line.startswith("step_ms "):
            return float(line.split()[1])
    return None


def steps(args: argparse.Namespace, work: Path, sim: bool) -> tuple[bool, dict[str, Any]]:
    """Boundaries per step and step time of PyTorch-shaped jobs under salus (and PyTorch jobs
    under `none`), module docstring."""
    exe = build_job(work)
    like = build_job(work, "salus_torch_like")
    doc: dict[str, Any] = {}
    checks: list[tuple[bool | None, str]] = []
    n = args.iterations
    try:
        import torch  # noqa: F401
        sizes = [] if sim else ["small", "medium"]
    except ImportError:
        sizes = []
    if not sizes:
        checks.append((None, "PyTorch jobs: no PyTorch here (or the sim): salus_torch_like only"))
    runs = [(policy, JobSpec(f"torch-{size}", 0.0, iterations=n, torch=size))
            for size in sizes for policy in ("salus", "none")]
    runs.append(("salus", JobSpec("torch_like", 0.0, iterations=n, argv=(
        str(like), "64", str(n), "4", "2048", "5" if sim else "0", "500"))))
    for policy, spec in runs:
        name = spec.name
        daemon = Daemon(work / f"{name}-{policy}", args.backend, policy, "srtf", "12GiB",
                        log_level="debug" if policy == "salus" else "info")
        try:
            [r], poller = run_jobs(daemon, [spec], exe, sim, declare=False)
        finally:
            daemon.stop()
        if policy == "salus":  # the pieces of its first steps, as the detector saw them
            lines = [x.split("salus piece ", 1)[1] for x in daemon.log_path.read_text().splitlines()
                     if "salus piece " in x]
            print(f"{name}: its first pieces (of {len(lines)}):\n  " + "\n  ".join(lines[:40]), flush=True)
        last = next(iter(poller.jobs.values()), {})
        row = {"rc": r.rc, "jct": r.jct, "step_ms": step_ms(r.output), "state": last,
               "output": r.output[-2000:]}
        doc[f"{name} {policy}"] = row
        seen = last.get("iterations") or 0
        text = (f"{name} under {policy}: rc {r.rc}, JCT {r.jct:.2f} s, step {row['step_ms']} ms")
        if policy == "salus":
            text += (f"; pilot saw {seen} boundaries for {n} steps ({seen / n:.2f} a step) from "
                     f"{last.get('pieces')} pieces (period {last.get('period')}), "
                     f"P {last.get('persistent', 0) / MIB:.1f} MiB, "
                     f"E {last.get('ephemeral', 0) / MIB:.1f} MiB, "
                     f"iteration {last.get('iteration_s')} s")
            checks.append((r.rc == 0 and 0.8 <= seen / n <= 1.25,
                           f"{name}: {seen} boundaries for {n} steps under salus (target 0.8-1.25 a step)"))
        print(text, flush=True)
    for size in sizes:
        a, b = doc[f"torch-{size} salus"]["step_ms"], doc[f"torch-{size} none"]["step_ms"]
        if a is not None and b:
            checks.append((None, f"torch-{size}: median step {a:.2f} ms under salus, {b:.2f} ms under "
                                 f"none ({a / b:.2f}x)"))
    for good, text in checks:
        print(f"{'INFO' if good is None else 'PASS' if good else 'FAIL'}: {text}")
    return all(g is not False for g, _ in checks), doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", choices=("fair", "overhead", "torch", "steps"))
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--scale", type=float, default=1.0, help="fair: arrival gaps and job lengths x this")
    ap.add_argument("--size", choices=("small", "medium", "large"), default="small",
                    help="torch: the model")
    ap.add_argument("--iterations", type=int, default=0,
                    help="torch: training steps (300), steps: (150)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix=f"salus-{args.experiment}-"))
    work.mkdir(parents=True, exist_ok=True)
    sim = args.backend == "sim"
    args.iterations = args.iterations or (150 if args.experiment == "steps" else 300)
    run = {"fair": fair, "overhead": overhead, "torch": torch_jobs, "steps": steps}[args.experiment]
    ok, doc = run(args, work, sim)
    if args.out:
        (work / f"{args.experiment}.json").write_text(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
