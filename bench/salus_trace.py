#!/usr/bin/env python3
"""Salus Table 2 on pilot: a seeded trace of training jobs under the salus policy's FIFO, SRTF,
PACK and FAIR schedulers; average JCT, JCT p95, average queueing and makespan per scheduler,
beside the paper's Table 2.

    python3 bench/salus_trace.py --out /tmp/salus-trace                 # H100, about 3 min
    python3 bench/salus_trace.py --backend sim --scale 0.2 --torch 0    # no GPU: checks the script
    python3 bench/salus_trace.py --timeline ...                         # where each JCT went
    python3 bench/salus_trace.py --backend sim --scale 0.3 --torch-like # PyTorch-shaped steps

--timeline: per scheduler, each job's timeline and the average JCT split by what the GPU did
(bench/salus_timeline.py; pilotd logs at debug level for it), and after the table the best
possible SRTF on what the SRTF run's jobs really cost (their service, each from its first ask:
start-up included) and the most SRTF/FIFO any scheduler could reach against this run's FIFO.

The trace (--seed, --jobs, default 30): arrivals uniform over the first 4 s; 75% short jobs
(0.2-0.6 s of iterations alone), 15% medium (1-2 s), 10% long (8-12 s), all times x --scale
(default 0.7): about 25 s of GPU work for seed 30 (two long jobs). A heavy tail and arrivals
close together, as in the paper's trace; its best possible SRTF/FIFO ratio (one job at a time
switched at 50 ms boundaries, no memory limit, no start-up costs; printed first as "ideal") is
2.8 to 3.0 for seeds 30-33, so start-up and switching may cost SRTF little before the 2.5
target is missed. The paper's trace ran for hours: durations are scaled
down about 1000-fold, so what compares is the shape (ratios), not minutes. Each CUDA C job
(bench/salus_job.cu) has P in {128 MiB, 256 MiB, 512 MiB, 1 GiB} and E in {512 MiB, 1 GiB,
2 GiB, 4 GiB} (persistent memory small beside ephemeral, as in the paper's Fig. 3), iterations
of 50 ms of a kernel spinning on 528, 1056 or 2112 blocks of 128 threads (a quarter, half or
all of an H100's 132 SMs x 2048 threads: lanes side by side contend for the SMs as real jobs
do), and declares its sizes, iteration count and iteration time (PILOT_SALUS_*). --torch N
(default 4) of the jobs are PyTorch jobs (bench/salus_torch_job.py, small or medium,
backend:cudaMallocAsync, declared sizes, 100 steps per second of the medium or long job replaced:
their start-up of about 9 s does not shrink with the time scale, see trace(),
declared and counted in the ideal at 10 ms a step) instead of short ones (chosen apart: the
rest of the trace is the same with any --torch); with --torch-like they are
bench/salus_torch_like.cu instead (the same steps, each returning to its level 6 times as a
PyTorch step does; on the sim 10 ms of the host's a step). Time: FIFO and SRTF run one job at a time
(about 35-45 s each with the jobs' start-up), PACK and FAIR between half that and as long:
about 2.5-3 min in all.
Capacity C = --capacity (default 12GiB, well under an H100's 80 GB; the script refuses to start
when the GPU has less free memory than C + 4 GiB).

Per scheduler a fresh pilotd; JCT = end - arrival, queueing = first seen running - arrival
(pilotd's state polled every 50 ms), makespan = last end - first arrival. Targets (PASS/FAIL
lines): SRTF's average JCT <= FIFO's / 2.5; PACK's makespan < FIFO's; every job ok; pilot
never granted more than C (and the lanes never counted more than C).
Output: a table on stdout; --out DIR: salus_trace.json, salus_trace.md, salus_trace.png.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from salus_bench import (
    GIB,
    TORCH_ITERATION_S,
    Daemon,
    JobSpec,
    Result,
    build_job,
    describe_peak,
    percentile,
    run_jobs,
)
from salus_timeline import best_with_start_up, one_at_a_time, read_events, report, timelines

PAPER = {  # Salus, Table 2 (minutes): average JCT, JCT p95 where given, queuing, makespan
    "fifo": {"avg_jct": 170.6, "makespan": 303.4},
    "srtf": {"avg_jct": 53.4, "makespan": 304.7},
    "pack": {"avg_jct": 145.5, "makespan": 287.4},
    "fair": {"avg_jct": 96.6, "makespan": 302.5},
}
SCHEDULERS = ("fifo", "srtf", "pack", "fair")


def trace(seed: int, jobs: int, scale: float, torch_jobs: int) -> list[JobSpec]:
    """The jobs, by arrival. The mix (arrivals, lengths, sizes) depends on the seed only: the
    PyTorch jobs replace medium and long ones (short ones where there are too few), chosen by a
    generator of their own. (They used to be drawn from the trace's generator, so --torch 4 (the
    GPU's runs) and --torch 0 (the sim's) were different traces: seed 30 with 4 PyTorch jobs had
    no long job at all, and no scheduler could make its SRTF/FIFO ratio more than 1.6; issue 30.)

    Why not short ones: the trace shrinks the paper's hours about 1000-fold, but a PyTorch job's
    start-up (3.5-4.4 s of Python and torch import, 4.6-5.8 s more of CUDA and library start on
    the H100) does not shrink. A short job (0.15-0.4 s of work) that is mostly start-up is a job
    the paper's trace does not have, and start-up sits in its JCT under every scheduler: with
    PyTorch jobs as short ones, the best possible SRTF/FIFO on the H100's service was 2.47-2.55
    against the trace's ideal 2.76 (bench/RESULTS.md, tenth and eleventh sessions)."""
    rng = random.Random(seed)
    specs = []
    for i in range(jobs):
        r = rng.random()
        seconds = rng.uniform(0.2, 0.6) if r < 0.75 else rng.uniform(1, 2) if r < 0.9 else rng.uniform(8, 12)
        seconds *= scale
        arrival = round(rng.uniform(0, 4) * scale, 2)
        iter_ms = 50.0
        specs.append(JobSpec(f"job{i:02d}", arrival, rng.choice((128, 256, 512, 1024)),
                             rng.choice((512, 1024, 2048, 4096)), iter_ms,
                             max(1, round(seconds * 1e3 / iter_ms)), blocks=rng.choice((528, 1056, 2112))))
    pick = random.Random(f"torch {seed}")
    short = [i for i, s in enumerate(specs) if s.iterations * s.iter_ms <= 600 * scale]
    longer = [i for i in range(len(specs)) if i not in short]
    chosen = pick.sample(longer, min(torch_jobs, len(longer)))
    chosen += pick.sample(short, min(torch_jobs - len(chosen), len(short)))
    for i in chosen:
        s = specs[i]
        seconds = s.iterations * s.iter_ms / 1e3
        specs[i] = JobSpec(f"{s.name}-torch", s.arrival, iterations=max(20, int(seconds * 100)),
                           torch=pick.choice(("small", "medium")))
    return sorted(specs, key=lambda s: s.arrival)


def torch_like(s: JobSpec, exe: Path, sim: bool) -> JobSpec:
    """PyTorch job `s` as bench/salus_torch_like.cu: as many steps of 10 ms (on the sim: 10 ms
    of the host's), each returning to its level 6 times (P 64 MiB, E 22 MiB; on the sim 8 MiB
    and 2.75 MiB), declaring its sizes, steps and step time as the PyTorch job does."""
    p_mib, unit_kib = (8, 256) if sim else (64, 2048)
    return JobSpec(f"{s.name}-like", s.arrival, p_mib, -(-11 * unit_kib // 1024), TORCH_ITERATION_S * 1e3,
                   s.iterations, argv=(str(exe), str(p_mib), str(s.iterations), "4", str(unit_kib),
                                       f"{TORCH_ITERATION_S * 1e3 if sim else 0:g}", "0"))


def ideal(specs: list[JobSpec], boundary_s: float = 0.05) -> dict[str, float]:
    """Average JCT of FIFO and SRTF on one GPU running one job at a time, switched only at
    `boundary_s` iteration boundaries, with no memory limit and no start-up cost (a PyTorch
    job's steps counted TORCH_ITERATION_S each): what the trace allows at best."""
    work = [s.iterations * s.iteration_s for s in specs]
    arrivals = [s.arrival for s in specs]
    return {policy: statistics.mean(e - a for e, a in zip(one_at_a_time(arrivals, work, policy, boundary_s),
                                                          arrivals, strict=True))
            for policy in ("fifo", "srtf")}


def free_gpu_bytes() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30)
        return int(out.stdout.split()[0]) << 20
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def summarize(results: list[Result]) -> dict[str, Any]:
    jcts = [r.jct for r in results]
    first = min(r.spec.arrival for r in results)
    return {"avg_jct": statistics.mean(jcts), "p95_jct": percentile(jcts, 0.95),
            "avg_queue": statistics.mean(r.queued for r in results),
            "makespan": max(r.ended for r in results) - first,
            "failed": [r.spec.name for r in results if r.rc != 0 or " ok" not in r.output]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--torch", type=int, default=4, help="how many of the jobs are PyTorch jobs")
    ap.add_argument("--torch-like", action="store_true",
                    help="the PyTorch jobs are bench/salus_torch_like.cu instead (PyTorch-shaped "
                         "steps of 6 pieces; for the sim)")
    ap.add_argument("--scale", type=float, default=0.7, help="job durations and arrivals x this")
    ap.add_argument("--capacity", default="12GiB")
    ap.add_argument("--timeline", action="store_true",
                    help="per job and scheduler: where its JCT went (bench/salus_timeline.py)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sim = args.backend == "sim"
    specs = trace(args.seed, args.jobs, args.scale, args.torch)
    if sim:  # the sim holds memory in the daemon's RAM: every size / 128
        for s in specs:
            s.persistent_mib, s.ephemeral_mib = s.persistent_mib // 128, s.ephemeral_mib // 128
        args.capacity = "96MiB"
    cap = int(args.capacity.removesuffix("GiB")) * GIB if args.capacity.endswith("GiB") else None
    free = None if sim else free_gpu_bytes()
    if cap is not None and free is not None and free < cap + 4 * GIB:
        print(f"the GPU has {free / GIB:.1f} GiB free: less than C + 4 GiB; not starting")
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="salus-trace-"))
    work.mkdir(parents=True, exist_ok=True)
    exe = build_job(work)
    if args.torch_like:
        specs = [torch_like(s, build_job(work, "salus_torch_like"), sim) if s.torch else s for s in specs]
    best = ideal(specs)
    ideal_ratio = best["fifo"] / best["srtf"]
    print(f"ideal (one job at a time, 50 ms boundaries, no start-up): FIFO avg JCT {best['fifo']:.2f} s, "
          f"SRTF {best['srtf']:.2f} s: ratio {best['fifo'] / best['srtf']:.2f}; GPU work "
          f"{sum(s.iterations * s.iteration_s for s in specs):.1f} s", flush=True)
    table: dict[str, Any] = {}
    ok = True
    for sched in args.schedulers.split(","):
        t = time.monotonic()
        daemon = Daemon(work / sched, args.backend, "salus", sched, args.capacity,
                        log_level="debug" if args.timeline else "info")
        try:
            results, poller = run_jobs(daemon, specs, exe, sim)
        finally:
            daemon.stop()
        row = summarize(results)
        row.update(max_granted=poller.max_granted, max_lanes_used=poller.max_used,
                   capacity=poller.capacity, wall_s=time.monotonic() - t, peaks=poller.peaks,
                   jobs=[{"name": r.spec.name, "arrival": r.spec.arrival, "jct": r.jct,
                          "queued": r.queued, "rc": r.rc} for r in results])
        table[sched] = row
        print(f"{sched}: avg JCT {row['avg_jct']:.2f} s, p95 {row['p95_jct']:.2f} s, queueing "
              f"{row['avg_queue']:.2f} s, makespan {row['makespan']:.2f} s ({row['wall_s']:.0f} s wall); "
              f"failed: {row['failed'] or 'none'}", flush=True)
        for name, key in (("lanes sum", "used"), ("grant", "granted")):
            print(f"  {sched}: {describe_peak(name, poller.peaks.get(key))}", flush=True)
        ok &= not row["failed"]
        if args.timeline:
            rows = timelines(results, read_events(daemon.log_path), poller.t0)
            lines = report(rows, {s.name: s.iteration_s for s in specs}, sched)
            row["timeline"] = lines
            row["best"] = best_with_start_up(rows)
            print("\n".join(f"  {sched}: {line}" for line in lines), flush=True)
    lines = ["| scheduler | avg JCT (s) | JCT p95 (s) | avg queueing (s) | makespan (s) "
             "| paper avg JCT (min) | paper makespan (min) |", "|---|---|---|---|---|---|---|"]
    for sched, row in table.items():
        paper = PAPER[sched]
        lines.append(f"| {sched} | {row['avg_jct']:.2f} | {row['p95_jct']:.2f} | {row['avg_queue']:.2f} | "
                     f"{row['makespan']:.2f} | {paper['avg_jct']} | {paper['makespan']} |")
    print("\n".join(lines))
    if "best" in table.get("srtf", {}):  # what the jobs really cost bounds the ratio (issue 30)
        best = table["srtf"]["best"]
        fifo = table.get("fifo", {}).get("avg_jct")
        reach = f"this run's FIFO {fifo:.2f} s / that = {fifo / best['srtf']:.2f} at most; " if fifo else ""
        print(f"best possible SRTF on the SRTF run's service and start-up: {best['srtf']:.2f} s ({reach}"
              f"best FIFO on the same {best['fifo']:.2f} s, ratio of the bests "
              f"{best['fifo'] / best['srtf']:.2f}; "
              f"the trace's ideal on declared work {ideal_ratio:.2f})")
    verdicts = []
    if "fifo" in table and "srtf" in table:
        ratio = table["fifo"]["avg_jct"] / table["srtf"]["avg_jct"]
        verdicts.append((ratio >= 2.5, f"SRTF's average JCT is FIFO's / {ratio:.2f} "
                                       "(target >= 2.5; paper 3.19)"))
    if "fifo" in table and "pack" in table:
        verdicts.append((table["pack"]["makespan"] < table["fifo"]["makespan"],
                         f"PACK's makespan {table['pack']['makespan']:.2f} s < FIFO's "
                         f"{table['fifo']['makespan']:.2f} s"))
    for sched, row in table.items():
        within = row["max_granted"] <= row["capacity"] and row["max_lanes_used"] <= row["capacity"]
        verdicts.append((within, f"{sched}: pilot granted at most {row['max_granted'] / GIB:.2f} GiB, "
                                 f"lanes counted {row['max_lanes_used'] / GIB:.2f} GiB, C "
                                 f"{row['capacity'] / GIB:.2f} GiB"))
    verdicts.append((ok, "every job finished with its iterations checked"))
    for good, text in verdicts:
        print(f"{'PASS' if good else 'FAIL'}: {text}")
    if args.out:
        (work / "salus_trace.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                           "results": table}, indent=1))
        (work / "salus_trace.md").write_text("\n".join(lines) + "\n\n" + "\n".join(
            f"- {'PASS' if g else 'FAIL'}: {t}" for g, t in verdicts) + "\n")
        plot(table, work / "salus_trace.png")
    return 0 if ok else 1


def plot(table: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, title in zip(axes, ("avg_jct", "avg_queue", "makespan"),
                              ("average JCT (s)", "average queueing (s)", "makespan (s)"), strict=True):
        ax.bar(list(table), [row[key] for row in table.values()], color="#4c72b0")
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
