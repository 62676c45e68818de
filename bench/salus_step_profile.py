#!/usr/bin/env python3
"""Why a PyTorch step is slower under salus than under `none` (issue 30): the same PyTorch job
(bench/salus_torch_job.py, backend:cudaMallocAsync) natively, under pilotd with `none` and
under pilotd with `salus`, each at the same log level (info; with --debug salus once more at
debug, as the trace's timelines run it), in one run, round after round. Per run: the median
step, the calls pilotd handled in Python by function and what its fast path (C) did, from the
metrics; with --py-spy, a py-spy profile of pilotd during the `none` and `salus` runs of the
first size in the first round, summarised by bench/profile_summary.py.

    python3 bench/salus_step_profile.py --out DIR [--sizes small,medium] [--iterations 300]
        [--rounds 2] [--debug] [--py-spy PATH] [--spin-us N]

Needs PyTorch and a GPU (the sim has no PyTorch). Writes DIR/steps.md (the table and each run's
counts and profile summaries) and DIR/runs.tgz (each run's pilotd log, metrics and raw
profile): few files, as the GPU machine returns only so many."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from salus_bench import Daemon, clean_env  # noqa: E402
from salus_experiments import step_ms  # noqa: E402

COUNTED = ("pilot_calls_total", "pilot_fast_launches_total", "pilot_fast_copies_total",
           "pilot_fast_syncs_total", "pilot_fast_library_calls_total", "pilot_tenant_launches_total",
           "pilot_policy_decisions_total", "pilot_policy_actions_total",
           "pilot_policy_memory_events_total")


def counts(text: str) -> dict[str, float]:
    """The samples of COUNTED metrics in a scrape, by their full sample name."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(COUNTED) and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            if float(value):
                found[name] = float(value)
    return found


def job(size: str, iterations: int, env: dict[str, str], under_pilot: bool) -> tuple[int, str]:
    cmd = [sys.executable, str(BENCH / "salus_torch_job.py"), "--size", size,
           "--iterations", str(iterations)]
    if under_pilot:
        cmd = [sys.executable, "-m", "pilot.cli.pilot", "run", "--", *cmd]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of the process's threads so far, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def ratio_summary(steps: dict[tuple[str, str], dict[int, float]], sizes: list[str]) -> str:
    """Per size: salus/none of each round (the two ran back to back) and their median: the
    machine's pace drifts from round to round, so rounds are compared within, not across."""
    lines = []
    for size in sizes:
        none, salus = steps.get((size, "none"), {}), steps.get((size, "salus"), {})
        ratios = [salus[r] / none[r] for r in sorted(none) if r in salus]
        if ratios:
            lines.append(f"- {size}: salus/none per round {', '.join(f'{x:.2f}' for x in ratios)}; "
                         f"median {statistics.median(ratios):.3f} over {len(ratios)} rounds")
    return "\n".join(lines)


def write(out: Path, rows: list[str], steps: dict[tuple[str, str], dict[int, float]],
          sizes: list[str], notes: list[str]) -> None:
    (out / "steps.md").write_text(
        "| round | size | run | log level | median step (ms) | / native |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows) + "\n\n" + ratio_summary(steps, sizes) + "\n\n" + "\n\n".join(notes) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--debug", action="store_true", help="salus at log level debug too")
    ap.add_argument("--py-spy", default="", help="py-spy to profile pilotd with (none: no profile)")
    ap.add_argument("--spin-us", type=int, default=-1,
                    help="how long the shim and pilotd's vGPU threads poll before they sleep "
                         "(PILOT_SPIN_US and [daemon] spin_us; default: pilot's, 50): whether "
                         "a round trip that outlasts the poll, and sleeps, is what a step waits for")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="salus-steps-"))
    base = {**clean_env(), "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    spin_env = {"PILOT_SPIN_US": str(args.spin_us)} if args.spin_us >= 0 else {}
    spin_config = f"[daemon]\nspin_us = {args.spin_us}\n" if args.spin_us >= 0 else ""
    rows: list[str] = []
    notes: list[str] = []
    steps: dict[tuple[str, str], dict[int, float]] = {}  # (size, policy) -> round -> median step
    sizes = args.sizes.split(",")
    for rnd, size in [(r, z) for r in range(1, args.rounds + 1) for z in sizes]:
        rc, out = job(size, args.iterations, base, False)
        native = step_ms(out)
        rows.append(f"| {rnd} | {size} | native | - | {native} | 1.00 |")
        if rc:
            notes.append(f"native {size} failed (rc {rc}):\n```\n{out[-1500:]}\n```")
        runs = [("none", "info"), ("salus", "info")]
        if rnd % 2 == 0:  # every other round salus first: neither gets the warmer machine
            runs.reverse()
        runs += [("salus", "debug")] if args.debug else []
        for policy, level in runs:
            name = f"r{rnd}-{size}-{policy}-{level}"
            daemon = Daemon(work / name, "cuda", policy, "srtf", "12GiB", log_level=level,
                            metrics=True, config=spin_config)
            spy = None
            if args.py_spy and size == sizes[0] and level == "info" and rnd == 1:
                spy = subprocess.Popen(
                    [args.py_spy, "record", "-p", str(daemon.proc.pid), "--threads", "-f", "raw",
                     "-r", "2000", "-d", "30", "-o", str(work / f"profile-{name}.txt"),
                     "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                time.sleep(0.5)
            try:
                rc, out = job(size, args.iterations, {**base, **spin_env, "PILOT_SOCKET": daemon.socket},
                              True)
                scrape = daemon.scrape_text()
                cpu = thread_cpu(daemon.proc.pid)
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                    spy.wait()
                daemon.stop()
            (work / name / "metrics.txt").write_text(scrape)
            ms = step_ms(out)
            if ms and level == "info":
                steps.setdefault((size, policy), {})[rnd] = ms
            ratio = f"{ms / native:.2f}" if ms and native else "-"
            rows.append(f"| {rnd} | {size} | {policy} | {level} | {ms} | {ratio} |")
            seen = counts(scrape)
            busy = ", ".join(f"{k} {v * 1e3 / args.iterations:.2f}" for k, v in
                             sorted(cpu.items(), key=lambda kv: -kv[1])[:6] if v)
            notes.append(f"### {name}: rc {rc}, step {ms} ms\n\n" + "\n".join(
                f"- {k}: {v:.0f} ({v / args.iterations:.1f} a step)" for k, v in sorted(seen.items()))
                + f"\n- pilotd's CPU ms a step (whole run / steps), by thread: {busy}")
            print(f"  {name}: pilotd CPU ms a step by thread: {busy}; policy: " + ", ".join(
                f"{k.split('{', 1)[1]} {v:.0f}" for k, v in sorted(seen.items())
                if k.startswith(("pilot_policy", "pilot_fast_launches"))), flush=True)
            if rc:
                notes.append(f"```\n{out[-1500:]}\n```")
            profile = work / f"profile-{name}.txt"
            if spy is not None and profile.exists():
                summary = subprocess.run([sys.executable, str(BENCH / "profile_summary.py"), str(profile)],
                                         capture_output=True, text=True).stdout
                notes.append(f"```\n{summary[:6000]}\n```")
            print(rows[-1], flush=True)
            write(args.out, rows, steps, sizes, notes)  # so far: a call cut short keeps it
    with tarfile.open(args.out / "runs.tgz", "w:gz") as tar:
        tar.add(work, arcname="runs",
                filter=lambda t: None if t.name.endswith(("/state", ".sock")) else t)
    write(args.out, rows, steps, sizes, notes)
    print(ratio_summary(steps, sizes))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
