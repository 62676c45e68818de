#!/usr/bin/env python3
"""Tally's experiment, our way (issue 29's benchmark): a latency-critical inference tenant beside
a best-effort training job, under every way of sharing the GPU. Run as root from the repository
root, pilot installed (PYTHONPATH=/tmp/site after run_all.sh's install), about 3 minutes:

    python3 bench/priority_tally.py --out DIR [--modes ...] [--measure 6] [--load 0.5] [--calibrate 3]

Tenants (bench/tenant_worker.py, our own models): `hp` serves requests of transformer inference
(`infer`: batch 4, sequence 128, bf16) arriving at random (exponential gaps) at --load of what it
can serve alone; `be` trains the transformer (`transformer`). The service time is measured first,
hp alone and natively: a window of back-to-back requests, then --calibrate s of serving requests
(tenant_worker.py's `serve`, as in the rows) at a low load, a gap of 4x that window's median; the
median of the served requests' service times (a step's start to its end) is the service time, and
the rows' mean gap is service / load. Both medians are reported.

Rows, each with fresh processes:
- alone: hp by itself, then be by itself (native, no MPS): the baselines;
- alone_pilot: hp by itself under pilotd's defaults (pilot serves an eager model faster than
  native does): the pilot rows' p99 over it is a second column;
- timeslice: both, natively (the driver's time-slicing);
- mps: both under a private MPS control daemon;
- mps_priority: the same, be with CUDA_MPS_CLIENT_PRIORITY=1 (below normal);
- pilot: both under pilotd's default configuration;
- pilot_gate: hp's tenant high (`[tenants.infer]`), `[priority] preempt = false`: the gate;
- pilot_preempt: the same with `preempt = true`: be's kernels preemptible.
Under pilot, hp runs as root (tenant infer) and be as `nobody` (a tenant is a Unix user); the
others run both as root. Per row: hp's requests served and their median service time (ms), their
latency (arrival to end) p50 and p99 (ms) and the p99 over alone's (target <= 1.10), be's steps/s
over alone's (target >= 0.5). If alone's p50 latency is more than 3x its median service time, the
queue was not stable at --load (the ratios to alone mean nothing) and the table says so. Writes
DIR/priority_tally.md and .json, the workers' and daemons' logs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fig1 import Mps, Pilotd, as_user, clean_env, user_env  # bench/fig1.py: MPS, pilotd, uids
from tenants import Worker  # bench/tenants.py: a worker process and its protocol

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "tenant_worker.py"
MODES = ("timeslice", "mps", "mps_priority", "pilot", "pilot_gate", "pilot_preempt")
NOBODY = 65534
READY_S = 300.0
CALIBRATE_GAP = 4.0  # the calibration's gap, in back-to-back medians (a load of 1/4)
SERVICE_LINE_S = 5.0  # how long a `service` line is awaited after `served` (older workers: none)
UNSTABLE = 3.0  # alone's p50 latency over its median service time above which the queue was unstable
GATE_CONFIG = ('[tenants.infer]\nusers = ["root"]\npriority = "high"\n'
               "[priority]\npreempt = {preempt}\n")


def log(msg: str) -> None:
    print(f"[priority_tally] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Row:
    """The two tenants of one row: their commands, environments and users."""

    def __init__(self, args: argparse.Namespace, work: Path, out: Path, mode: str) -> None:
        self.args, self.work, self.out, self.mode = args, work, out, mode
        self.env = {**clean_env(), "PYTHONUNBUFFERED": "1"}
        self.prefix: list[str] = []
        self.daemon: Pilotd | None = None
        self.mps: Mps | None = None
        self.be_env: dict[str, str] = {}
        self.be_user: Callable[[], None] | None = None

    def __enter__(self) -> Row:
        mode, args = self.mode, self.args
        if mode.startswith("pilot"):
            config = "# pilotd's defaults\n" if mode == "pilot" else \
                GATE_CONFIG.format(preempt="true" if mode == "pilot_preempt" else "false")
            workdir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=self.work))
            self.daemon = Pilotd(args.python, args.backend, workdir, self.out / f"pilotd-{mode}.log",
                                 [], config_text=config)
            self.daemon.wait_ready(120)
            os.chmod(workdir, 0o755)
            self.env["PILOT_SOCKET"] = self.daemon.socket
            self.prefix = [args.python, "-m", "pilot.cli.pilot", "run", "--"]
            home = self.work / "home-nobody"
            home.mkdir(exist_ok=True)
            os.chown(home, NOBODY, NOBODY)
            self.be_env, self.be_user = user_env(NOBODY, home), as_user(NOBODY)
        elif mode.startswith("mps"):
            workdir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=self.work))
            self.mps = Mps(shutil.which(args.mps_control) or args.mps_control, workdir)
            self.mps.start()
            self.env.update(self.mps.env)
            if mode == "mps_priority":
                self.be_env = {"CUDA_MPS_CLIENT_PRIORITY": "1"}
        return self

    def __exit__(self, *exc: object) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        if self.mps is not None:
            self.mps.stop()
            self.mps.copy_logs(self.out)

    def worker(self, name: str, workload: str) -> Worker:
        env = {**self.env, **(self.be_env if name == "be" else {})}
        cmd = [*self.prefix, self.args.python, str(WORKER), "--workloads", workload]
        return Worker(cmd, env, self.out / f"worker-{self.mode}-{name}.log",
                      preexec_fn=self.be_user if name == "be" else None)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def read_serve(worker: Worker, timeout: float) -> tuple[list[float], list[float] | None]:
    """A `serve` command's reply: the requests' latencies (ms, the `served` line) and service times
    (ms, the `service` line right after it; None from a worker that does not send it)."""
    latencies = [float(t) for t in worker.expect("served", timeout).split()[3:]]
    try:
        services: list[float] | None = [float(t) for t in
                                        worker.expect("service", SERVICE_LINE_S).split()[3:]]
    except RuntimeError:
        services = None
    return latencies, services


def calibrate(args: argparse.Namespace, work: Path, out: Path) -> dict[str, Any]:
    """hp alone, natively, one process: the median of a window of back-to-back requests
    (`b2b_ms`), then args.calibrate s of `serve` at a gap of CALIBRATE_GAP x that: its requests'
    median service time (`serve_ms`, None from a worker without `service` lines) and latency."""
    with Row(args, work, out, "native") as row:
        hp = row.worker("hp", "infer")
        try:
            hp.expect("ready", READY_S)
            hp.send(f"run infer {time.time() + 1:.3f} 1 2")
            b2b = statistics.median(float(t) for t in hp.expect("result", 60).split()[3:])
            gap = CALIBRATE_GAP * b2b
            hp.send(f"serve infer {time.time() + 1:.3f} {args.calibrate:g} {gap:.3f} {args.seed + 1}")
            lat, svc = read_serve(hp, args.calibrate + 60)
        finally:
            hp.stop()
    return {"b2b_ms": b2b, "gap_ms": gap, "requests": len(lat), "p50_ms": pct(lat, 0.5),
            "serve_ms": statistics.median(svc) if svc else None}


def run_row(args: argparse.Namespace, work: Path, out: Path, mode: str, gap_ms: float,
            hp_on: bool = True, be_on: bool = True) -> dict[str, Any]:
    measure = args.measure
    result: dict[str, Any] = {"mode": mode}
    with Row(args, work, out, "native" if mode == "alone" else mode) as row:
        workers = {}
        try:
            if be_on:
                workers["be"] = row.worker("be", "transformer")
            if hp_on:
                workers["hp"] = row.worker("hp", "infer")
            for w in workers.values():
                w.expect("ready", READY_S)
            if row.mps is not None and not row.mps.servers():
                raise RuntimeError("MPS: no server running: the workers did not use MPS")
            start = time.time() + 2.0
            warm = 1.0
            if "be" in workers:  # be trains through the whole window, hp's included
                workers["be"].send(f"run transformer {start:.3f} {warm} {measure}")
            if "hp" in workers:
                workers["hp"].send(f"serve infer {start + warm:.3f} {measure} {gap_ms:.3f} {args.seed}")
            if "hp" in workers:
                lat, svc = read_serve(workers["hp"], measure + 120)
                result.update(hp_requests=len(lat), hp_p50_ms=pct(lat, 0.5), hp_p99_ms=pct(lat, 0.99),
                              hp_service_ms=statistics.median(svc) if svc else None,
                              hp_service_p99_ms=pct(svc, 0.99) if svc else None)
            if "be" in workers:
                steps = workers["be"].expect("result", measure + 120).split()[3:]
                result["be_steps_s"] = len(steps) / measure
        finally:
            for w in workers.values():
                w.stop()
    log(f"{mode}: {result}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(MODES)}")
    ap.add_argument("--measure", type=float, default=6.0, help="seconds measured per row (6)")
    ap.add_argument("--load", type=float, default=0.5, help="hp's offered load, of what it serves alone")
    ap.add_argument("--calibrate", type=float, default=3.0,
                    help="seconds hp serves alone at a low load to measure its service time (3)")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda",
                    help="pilotd's backend (sim: for checking this script without a GPU)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: of {', '.join(MODES)}")
    if os.geteuid() != 0:
        log("needs root (be runs as nobody under pilot; MPS is started privately)")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pilot-tally-", dir="/tmp"))
    work.chmod(0o755)
    rows: list[dict[str, Any]] = []
    try:
        cal = calibrate(args, work, args.out)
        service = cal["serve_ms"] if cal["serve_ms"] is not None else cal["b2b_ms"]
        gap = service / args.load
        log(f"hp alone: {cal['b2b_ms']:.3f} ms a request back to back, {fmt(cal['serve_ms'], '.3f')} ms "
            f"served at a gap of {cal['gap_ms']:.3f} ms ({cal['requests']} requests, p50 latency "
            f"{fmt(cal['p50_ms'], '.3f')} ms); requests every {gap:.3f} ms on average")
        if cal["serve_ms"] is None:
            log("the worker sent no service times: the gap is from the back-to-back median")
        alone = {**run_row(args, work, args.out, "alone", gap, be_on=False),
                 **{k: v for k, v in run_row(args, work, args.out, "alone", gap, hp_on=False).items()
                    if k.startswith("be")}}
        rows.append(alone)
        if "pilot" in modes:  # hp alone under pilotd's defaults: the pilot rows' own baseline
            rows.append({**run_row(args, work, args.out, "pilot", gap, be_on=False), "mode": "alone_pilot"})
        for mode in modes:
            try:
                rows.append(run_row(args, work, args.out, mode, gap))
            except (RuntimeError, OSError) as exc:
                log(f"{mode}: failed: {exc}")
                rows.append({"mode": mode, "error": str(exc)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_p99, base_be = alone.get("hp_p99_ms"), alone.get("be_steps_s")
    serve_how = (f"the median service time of {cal['requests']} requests served alone at a gap of "
                 f"{cal['gap_ms']:.2f} ms" if cal["serve_ms"] is not None else
                 "the back-to-back median: the worker sent no service times")
    lines = [f"hp: transformer inference, {service:.2f} ms a request alone ({serve_how}; "
             f"{cal['b2b_ms']:.2f} ms back to back), offered {args.load:g} of that: a request every "
             f"{gap:.2f} ms on average; be: transformer training; {args.measure:g} s measured per row",
             ""]
    alone_p50, alone_svc = alone.get("hp_p50_ms"), alone.get("hp_service_ms") or service
    stable = not (alone_p50 is not None and alone_p50 > UNSTABLE * alone_svc)
    if not stable:
        warning = (f"**Warning: hp's queue was not stable at --load {args.load:g}**: alone, its p50 "
                   f"latency ({alone_p50:.2f} ms) is more than {UNSTABLE:g}x its median service time "
                   f"({alone_svc:.2f} ms), so the offered load was probably near or above 1 and the "
                   "ratios to alone mean nothing; run again with a lower --load.")
        log(warning)
        lines += [warning, ""]
    pilot_p99 = next((r.get("hp_p99_ms") for r in rows if r["mode"] == "alone_pilot"), None)
    lines += ["| row | hp requests | hp service ms | hp p50 ms | hp p99 ms | p99 / alone | p99 / alone "
              "under pilot | be steps/s | be / alone |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | failed: {r['error'][:80]} | | | | | | | |")
            continue
        p99, be = r.get("hp_p99_ms"), r.get("be_steps_s")
        own = ratio(p99, pilot_p99) if r["mode"].startswith("pilot") else None
        lines.append(f"| {r['mode']} | {r.get('hp_requests', '-')} | {fmt(r.get('hp_service_ms'))} | "
                     f"{fmt(r.get('hp_p50_ms'))} | {fmt(p99)} | {fmt(ratio(p99, base_p99))} | {fmt(own)} | "
                     f"{fmt(be, '.1f')} | {fmt(ratio(be, base_be))} |")
    table = "\n".join(lines)
    print(table)
    (args.out / "priority_tally.md").write_text("# Tally's experiment (bench/priority_tally.py)\n\n"
                                                + table + "\n\nTargets: p99 / alone <= 1.10, "
                                                "be / alone >= 0.5.\n")
    (args.out / "priority_tally.json").write_text(json.dumps(
        {"service_ms": service, "gap_ms": gap, "load": args.load, "calibration": cal, "stable": stable,
         "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
