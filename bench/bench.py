#!/usr/bin/env python3
"""Native CUDA against pilot, side by side, from one run on one machine.

    PILOT_SOCKET=/path/pilot.sock python3 bench/bench.py --out bench.md     # daemon already up
    python3 bench/bench.py --start-daemon --out bench.md                    # starts its own
    python3 bench/bench.py --dry-run                                        # no GPU: sim daemon

Builds the measurement programs bench/*.cu (`nvcc -cudart shared -O2 -arch=sm_90`), then runs
each of them natively and under pilot (the same binary; pilot preloads libpilot.so), several
times interleaved (native, pilot, pilot, native, native, pilot: the order alternates so that
neither side always runs second), and reports the median of the runs. Every program warms up
before it measures and prints `metric value` lines, parsed here:

    launch.cu     launch_us, launches_per_s, launch_sync_us
    roundtrip.cu  d2h_4b_us, d2h_4b_p99_us, h2d_4b_us
    alloc.cu      malloc_free_1mib_us, malloc_1mib_us
    bandwidth.cu  h2d_pageable_gbps, d2h_pageable_gbps   (256 MiB pageable buffers),
                  h2d_pinned_gbps, d2h_pinned_gbps       (256 MiB cudaMallocHost buffers)
    um.cu         um_iter_s, um_sweep_s, um_nohost_s, um_init_s, um_readback_s (1 GiB managed)
    um_touch.cu   um_touch_seq_ms, um_touch_rand_ms  (GPU first touch of 512 host-written pages)
    um_stream.cu  um_stream_gbps                     (STREAM on managed memory, a sync per kernel)
    launch_many.cu tenants8_launches_per_s           (8 processes launching at once)
    um_small.cu   small_N_SIZE_{alloc,kernel,free}_ms, small_N_SIZE_mem_mib   (N small managed
                  allocations of SIZE bytes, N = 1,000 / 10,000 / 100,000, SIZE = 16 / 64 / 1024)
    um_first.cu   um_first_kernel_ms, um_second_kernel_ms, um_first_alloc_ms  (the first managed
                  kernel of a fresh process)

Just the small-allocation and first-touch rows (issue 28; about a minute on the H100):

    python3 bench/bench.py --start-daemon --only um_small --only um_first --out um_small.md

The table has one row per metric: native | pilot | ratio | target | met?. The ratio is
pilot/native for times and native/pilot for rates, so above 1 always means pilot is slower.
Targets (issue 14): launch, launch + synchronize at most 2.0x native; 8 processes under pilot
launch together at least as fast as one native process; 4-byte D2H median under 20 us and p99
under 35 us; cudaMalloc + cudaFree 1 MiB at most 1.5x; first touch of host-written managed
pages at most 2x; managed STREAM at least 95%; bandwidth at least 80% of native; Unified
Memory workloads (a) and (c) at most 1.2x native ((b) is reported). Issue 28: 10,000 x 64 B
managed allocations + host fill at most 3x native, their kernel at most 1.5x, device memory
used at most native + 4 MiB; 100,000 x 16 B allocations at most 3x; the first managed kernel of
a fresh process at most 2x.
--dry-run starts a sim daemon (bench/sim_kernels.py), uses small counts and runs the
"native" side under pilot too, since this path is for machines without a GPU: it checks the
building, running, parsing and reporting, not the numbers.

Exit status: 0 when every run succeeded (targets missed are reported, and fail the run only with
--fail-on-miss: 3); 1 when a run failed or printed no value for a metric; 2 when nothing could be
measured (build, daemon or shim problem).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilotd_process import PilotdProcess, find_nvcc  # bench/pilotd_process.py, beside this script

BENCH_DIR = Path(__file__).resolve().parent
SIM_KERNELS = BENCH_DIR / "sim_kernels.py"
NVCC_FLAGS = ("-cudart", "shared", "-O2")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
METRIC_LINE = re.compile(r"^([a-z][a-z0-9_]*) ([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))$")


SMALL_COUNTS, SMALL_SIZES = (1000, 10000, 100000), (16, 64, 1024)  # um_small.cu's rounds


@dataclass(frozen=True)
class Program:
    """One measurement program, bench/<name>.cu, and its arguments (full and --quick/--dry-run)."""

    name: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    metrics: tuple[str, ...]  # what it must print


PROGRAMS = (
    Program("launch", ("100000", "10000"), ("2000", "200"),
            ("launch_us", "launches_per_s", "launch_sync_us")),
    Program("roundtrip", ("10000",), ("500",), ("d2h_4b_us", "d2h_4b_p99_us", "h2d_4b_us")),
    Program("alloc", ("2000",), ("200",), ("malloc_free_1mib_us", "malloc_1mib_us")),
    Program("bandwidth", ("256", "10"), ("16", "3"),
            ("h2d_pageable_gbps", "d2h_pageable_gbps", "h2d_pinned_gbps", "d2h_pinned_gbps")),
    Program("um", ("1024", "50", "10"), ("16", "3", "2"),
            ("um_iter_s", "um_sweep_s", "um_nohost_s", "um_init_s", "um_readback_s",
             "um_nohost_init_s", "um_nohost_first_s", "um_nohost_rest_s", "um_nohost_free_s")),
    Program("um_touch", ("512", "20"), ("64", "3"), ("um_touch_seq_ms", "um_touch_rand_ms")),
    Program("um_stream", ("67108864", "10"), ("65536", "2"), ("um_stream_gbps",)),
    Program("launch_many", ("8", "10000"), ("8", "200"), ("tenants8_launches_per_s",)),
    Program("um_small", (), ("100",),
            tuple(f"small_{n}_{size}_{m}" for size in SMALL_SIZES for n in SMALL_COUNTS
                  for m in ("alloc_ms", "kernel_ms", "free_ms", "mem_mib"))),
    Program("um_first", (), (), ("um_first_kernel_ms", "um_second_kernel_ms", "um_first_alloc_ms")),
)

# A target: (native, pilot) -> met, or None when the value it needs is missing.
Check = Callable[[float | None, float | None], bool | None]


def ratio_at_most(limit: float, kind: str) -> Check:
    def check(native: float | None, pilot: float | None) -> bool | None:
        r = slowdown(kind, native, pilot)
        return None if r is None else r <= limit
    return check


def pilot_below(limit: float) -> Check:
    def check(native: float | None, pilot: float | None) -> bool | None:
        return None if pilot is None else pilot < limit
    return check


def pilot_within(extra: float) -> Check:
    def check(native: float | None, pilot: float | None) -> bool | None:
        return None if native is None or pilot is None else pilot <= native + extra
    return check


@dataclass(frozen=True)
class Metric:
    key: str  # as the program prints it
    label: str
    unit: str
    kind: str  # "time": lower is better; "rate": higher is better
    target: str = "-"
    check: Check | None = None
    native_key: str | None = None  # compare with this metric's native value instead of its own


METRICS = (
    # Targets of issue 14 (launch, round trip, allocation, the Unified Memory latency paths).
    Metric("launch_us", "empty kernel launch, async (100k)", "us", "time", "<= 2.0x native",
           ratio_at_most(2.0, "time")),
    Metric("launches_per_s", "empty kernel launches per second", "1/s", "rate", "<= 2.0x native",
           ratio_at_most(2.0, "rate")),
    Metric("launch_sync_us", "launch + cudaDeviceSynchronize (median)", "us", "time",
           "<= 2.0x native", ratio_at_most(2.0, "time")),
    Metric("tenants8_launches_per_s", "8 processes x 10k launches at once, all together", "1/s",
           "rate", ">= 1.0x one native process", ratio_at_most(1.0, "rate"),
           native_key="launches_per_s"),
    Metric("d2h_4b_us", "4-byte D2H cudaMemcpy (median of 10k)", "us", "time", "< 20 us absolute",
           pilot_below(20.0)),
    Metric("d2h_4b_p99_us", "4-byte D2H cudaMemcpy (p99)", "us", "time", "< 35 us absolute",
           pilot_below(35.0)),
    Metric("h2d_4b_us", "4-byte H2D cudaMemcpy (median)", "us", "time"),
    Metric("malloc_free_1mib_us", "cudaMalloc + cudaFree 1 MiB (median)", "us", "time",
           "<= 1.5x native", ratio_at_most(1.5, "time")),
    Metric("malloc_1mib_us", "cudaMalloc 1 MiB alone (median)", "us", "time"),
    Metric("h2d_pageable_gbps", "H2D 256 MiB pageable (median of 10)", "GB/s", "rate",
           ">= 80% of native", ratio_at_most(1.25, "rate")),
    Metric("d2h_pageable_gbps", "D2H 256 MiB pageable (median of 10)", "GB/s", "rate",
           ">= 80% of native", ratio_at_most(1.25, "rate")),
    Metric("h2d_pinned_gbps", "H2D 256 MiB pinned, cudaMallocHost (median of 10)", "GB/s",
           "rate", ">= 80% of native", ratio_at_most(1.25, "rate")),
    Metric("d2h_pinned_gbps", "D2H 256 MiB pinned, cudaMallocHost (median of 10)", "GB/s",
           "rate", ">= 80% of native", ratio_at_most(1.25, "rate")),
    Metric("um_iter_s", "UM (a) 1 GiB: host init, 50 kernels+sync, host checksum", "s", "time",
           "<= 1.2x native", ratio_at_most(1.2, "time")),
    Metric("um_init_s", "  of which host init of 1 GiB", "s", "time"),
    Metric("um_readback_s", "  of which host checksum of 1 GiB", "s", "time"),
    Metric("um_sweep_s", "UM (b) 1 GiB: 10 rounds kernel + host touches every page", "s", "time",
           "reported"),
    Metric("um_nohost_s", "UM (c) 1 GiB: host init, 50 kernels+sync, no host access", "s", "time",
           "<= 1.2x native", ratio_at_most(1.2, "time")),
    Metric("um_nohost_init_s", "  of which allocation and host init", "s", "time"),
    Metric("um_nohost_first_s", "  of which the first kernel (data to the GPU)", "s", "time"),
    Metric("um_nohost_rest_s", "  of which 49 more kernels, a reduction, a 8-byte copy", "s", "time"),
    Metric("um_nohost_free_s", "  of which cudaFree", "s", "time"),
    Metric("um_touch_seq_ms", "GPU first touch of 512 host-written managed pages, in order",
           "ms", "time", "<= 2x native", ratio_at_most(2.0, "time")),
    Metric("um_touch_rand_ms", "GPU first touch of 512 host-written managed pages, random order",
           "ms", "time", "<= 2x native", ratio_at_most(2.0, "time")),
    Metric("um_stream_gbps", "managed-memory STREAM, a sync per kernel (268 MB arrays)", "GB/s",
           "rate", ">= 95% of native", ratio_at_most(1 / 0.95, "rate")),
)


def _small_metrics() -> tuple[Metric, ...]:
    """um_small.cu's rows (issue 28): per count and size, allocation + host fill, the kernel
    touching every byte through a managed pointer table, cudaFree of all, device memory used."""
    # (count, size, what) -> (target, check)
    targets: dict[tuple[int, int, str], tuple[str, Check]] = {
        (10000, 64, "alloc_ms"): ("<= 3x native", ratio_at_most(3.0, "time")),
        (10000, 64, "kernel_ms"): ("<= 1.5x native", ratio_at_most(1.5, "time")),
        (10000, 64, "mem_mib"): ("<= native + 4 MiB", pilot_within(4.0)),
        (100000, 16, "alloc_ms"): ("<= 3x native", ratio_at_most(3.0, "time")),
    }
    labels = {"alloc_ms": ("cudaMallocManaged + host fill", "ms"),
              "kernel_ms": ("the kernel touching every byte, + sync", "ms"),
              "free_ms": ("cudaFree of all", "ms"), "mem_mib": ("device memory used", "MiB")}
    rows = []
    for size in SMALL_SIZES:
        for n in SMALL_COUNTS:
            for what, (label, unit) in labels.items():
                target, check = targets.get((n, size, what), ("-", None))
                rows.append(Metric(f"small_{n}_{size}_{what}", f"{n:,} x {size} B managed: {label}",
                                   unit, "time", target, check))
    return tuple(rows)


METRICS += (
    *_small_metrics(),
    Metric("um_first_kernel_ms", "first managed kernel of a fresh process (1 MiB host-written)",
           "ms", "time", "<= 2x native", ratio_at_most(2.0, "time")),
    Metric("um_second_kernel_ms", "  the same on a second allocation", "ms", "time"),
    Metric("um_first_alloc_ms", "  the first cudaMallocManaged 1 MiB + host fill", "ms", "time"),
)


def slowdown(kind: str, native: float | None, pilot: float | None) -> float | None:
    """pilot/native for times, native/pilot for rates: above 1 means pilot is slower."""
    if native is None or pilot is None:
        return None
    num, den = (pilot, native) if kind == "time" else (native, pilot)
    if den == 0:
        return None
    return num / den


@dataclass
class Run:
    """One execution of one program in one mode."""

    program: str
    mode: str  # "native" or "pilot"
    rep: int
    rc: int
    wall_s: float
    stdout: str
    stderr: str
    values: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.rc == 0


def parse_metrics(text: str) -> dict[str, float]:
    """`metric value` lines of a program's stdout; anything else is ignored."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line.strip())
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- building ----

def build(programs: tuple[Program, ...], out_dir: Path, arch: str) -> dict[str, Path]:
    """Compile every program into out_dir, in parallel. Raises with nvcc's output on failure."""
    nvcc = find_nvcc()

    def one(p: Program) -> tuple[str, Path, list[str], subprocess.CompletedProcess[str]]:
        exe = out_dir / p.name
        cmd = [nvcc, *NVCC_FLAGS, f"-arch={arch}", "-o", str(exe), str(BENCH_DIR / f"{p.name}.cu")]
        return p.name, exe, cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, programs))
    errors = [f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
              for _, _, cmd, proc in results if proc.returncode != 0]
    if errors:
        raise RuntimeError("nvcc failed:\n" + "\n".join(errors))
    for _, _, _, proc in results:
        if proc.stdout.strip() or proc.stderr.strip():
            log(f"nvcc said:\n{proc.stdout}{proc.stderr}")
    return {name: exe for name, exe, _, _ in results}


# ---- the daemon ----

class Daemon(PilotdProcess):
    """A pilotd started by this script: `python -m pilot.daemon`, output pumped to a file."""

    def __init__(self, backend: str, socket: str, log_path: Path, sim_kernels: list[Path]) -> None:
        self.socket = socket
        cmd = [sys.executable, "-m", "pilot.daemon", "--backend", backend, "--socket", socket]
        for f in sim_kernels:
            cmd += ["--sim-kernels", str(f)]
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PILOT_SOCKET")}
        super().__init__(cmd, log_path, env, log)


@contextmanager
def daemon_for(args: argparse.Namespace, workdir: Path) -> Iterator[str]:
    """The socket to use: a daemon started here (--start-daemon/--dry-run), or $PILOT_SOCKET."""
    if not args.start_daemon:
        socket = os.environ.get("PILOT_SOCKET")
        if not socket:
            raise RuntimeError("PILOT_SOCKET is not set: start pilotd and set it, or pass "
                               "--start-daemon")
        yield socket
        return
    log_path = Path(args.daemon_log) if args.daemon_log else workdir / "pilotd.log"
    sim = [SIM_KERNELS] if args.backend == "sim" else []
    daemon = Daemon(args.backend, str(workdir / "pilot.sock"), log_path, sim)
    try:
        daemon.wait_ready(READY_TIMEOUT_S)
        log(f"pilotd ({args.backend}) ready on {daemon.socket}")
        yield daemon.socket
        if not daemon.alive():
            raise RuntimeError(f"pilotd died during the benchmark:\n{daemon.tail()}")
    finally:
        daemon.stop()


def find_shim(explicit: str | None) -> str:
    if explicit:
        path = explicit
    else:
        proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"`pilot shim-path` failed (rc {proc.returncode}): {proc.stderr}")
        path = proc.stdout.strip()
    if not os.path.isabs(path) or not os.path.isfile(path):
        raise RuntimeError(f"shim {path!r} is not an absolute path to a file")
    return path


# ---- running ----

def run_one(program: Program, exe: Path, mode: str, rep: int, env: dict[str, str], quick: bool,
            timeout: float) -> Run:
    cmd = [str(exe), *(program.quick_args if quick else program.args)]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes)
               else exc.stderr or "") + f"\n(killed after {timeout:.0f} s)"
    run = Run(program.name, mode, rep, rc, time.monotonic() - started, out, err, parse_metrics(out))
    status = "ok" if run.ok else f"FAILED rc {rc}"
    shown = " ".join(f"{k}={v:g}" for k, v in run.values.items())
    log(f"rep {rep} {mode:6} {program.name:9} {status} ({run.wall_s:.1f} s) {shown}")
    if not run.ok:
        log(f"  stdout:\n{out}\n  stderr:\n{err}")
    return run


def run_all(programs: tuple[Program, ...], exes: dict[str, Path], envs: dict[str, dict[str, str]],
            repeats: int, quick: bool, timeout: float) -> list[Run]:
    """Each program `repeats` times per mode, interleaved; the order of the two modes alternates
    between repetitions."""
    runs: list[Run] = []
    modes = ("native", "pilot")
    for rep in range(repeats):
        order = modes if rep % 2 == 0 else modes[::-1]
        for program in programs:
            for mode in order:
                runs.append(run_one(program, exes[program.name], mode, rep, envs[mode], quick,
                                    timeout))
    return runs


def medians(runs: list[Run], mode: str) -> dict[str, float]:
    """Per metric, the median over the successful runs of `mode`."""
    collected: dict[str, list[float]] = {}
    for r in runs:
        if r.mode == mode and r.ok:
            for k, v in r.values.items():
                collected.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in collected.items()}


# ---- reporting ----

def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    a = abs(v)
    if a >= 10000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(native: dict[str, float], pilot: dict[str, float], native_label: str,
          keys: set[str]) -> tuple[str, list[str]]:
    """The markdown table of the metrics in `keys`, and those whose target was missed (or could
    not be judged)."""
    lines = [f"| metric | {native_label} | pilot | ratio | target | met? |",
             "| --- | ---: | ---: | ---: | --- | --- |"]
    missed: list[str] = []
    for m in METRICS:
        if m.key not in keys:
            continue
        n, p = native.get(m.native_key or m.key), pilot.get(m.key)
        r = slowdown(m.kind, n, p)
        if m.check is None:
            met = "-"
        else:
            ok = m.check(n, p)
            met = "n/a" if ok is None else ("yes" if ok else "**NO**")
            if ok is not True:
                missed.append(m.key)
        ratio = "n/a" if r is None else f"{r:.2f}x"
        lines.append(f"| {m.label} [{m.unit}] (`{m.key}`) | {fmt(n)} | {fmt(p)} | {ratio} | "
                     f"{m.target} | {met} |")
    return "\n".join(lines) + "\n", missed


def raw_table(programs: tuple[Program, ...], runs: list[Run]) -> str:
    """Every run's values, for the log: per metric, each mode's values in run order."""
    lines = ["| metric | native runs | pilot runs |", "| --- | --- | --- |"]
    for p in programs:
        for k in p.metrics:
            cells = []
            for mode in ("native", "pilot"):
                vals = [fmt(r.values.get(k)) if r.ok else "failed"
                        for r in runs if r.program == p.name and r.mode == mode]
                cells.append(", ".join(vals) or "-")
            lines.append(f"| `{k}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start-daemon", action="store_true",
                    help="start a pilotd for the benchmark (else use $PILOT_SOCKET)")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda",
                    help="backend of the daemon started with --start-daemon (default cuda)")
    ap.add_argument("--daemon-log", metavar="PATH", help="where the started daemon's output goes")
    ap.add_argument("--out", metavar="PATH", help="also write the table here (markdown)")
    ap.add_argument("--json", metavar="PATH", help="write every run's values here")
    ap.add_argument("--repeats", type=int, default=3, help="runs per program and mode (default 3)")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: sim daemon, --quick, and the native side runs under pilot too")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90)")
    ap.add_argument("--build-dir", metavar="DIR", help="build here (default: a temporary dir)")
    ap.add_argument("--shim", metavar="PATH", help="libpilot.so (default: `pilot shim-path`)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per program run")
    ap.add_argument("--only", metavar="NAME", action="append",
                    help="run only this program (repeatable): " + ", ".join(p.name for p in PROGRAMS))
    ap.add_argument("--fail-on-miss", action="store_true", help="exit 3 when a target is missed")
    ap.add_argument("--pilot-env", metavar="KEY=VALUE", action="append", default=[],
                    help="extra environment of the pilot side only (repeatable), e.g. PILOT_UM_CHUNK=64K")
    args = ap.parse_args(argv)
    if any("=" not in kv for kv in args.pilot_env):
        ap.error("--pilot-env takes KEY=VALUE")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so a daemon started here is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.dry_run:
        args.start_daemon, args.backend, args.quick = True, "sim", True
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    programs = PROGRAMS
    if args.only:
        unknown = set(args.only) - {p.name for p in PROGRAMS}
        if unknown:
            ap.error(f"unknown program(s): {', '.join(sorted(unknown))}")
        programs = tuple(p for p in PROGRAMS if p.name in args.only)

    workdir = Path(tempfile.mkdtemp(prefix="pilot-bench-"))  # short: socket paths max 107 bytes
    try:
        return bench(args, programs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bench(args: argparse.Namespace, programs: tuple[Program, ...], workdir: Path) -> int:
    build_dir = Path(args.build_dir) if args.build_dir else workdir / "bin"
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        exes = build(programs, build_dir, args.arch)
        log(f"built {', '.join(exes)} in {time.monotonic() - started:.1f} s")
        shim = find_shim(args.shim)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        log(str(exc))
        return 2

    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_DEBUG")}
    try:
        with daemon_for(args, workdir) as socket:
            pilot_env = {**base, "LD_PRELOAD": shim, "PILOT_SOCKET": socket,
                         **dict(kv.split("=", 1) for kv in args.pilot_env)}
            native_env = {k: v for k, v in base.items() if k != "PILOT_SOCKET"}
            envs = {"native": pilot_env if args.dry_run else native_env, "pilot": pilot_env}
            runs = run_all(programs, exes, envs, args.repeats, args.quick, args.timeout)
    except (RuntimeError, OSError) as exc:
        log(str(exc))
        return 2

    native, pilot = medians(runs, "native"), medians(runs, "pilot")
    native_label = "native (dry run: pilot+sim)" if args.dry_run else "native"
    text, missed = table(native, pilot, native_label, {k for p in programs for k in p.metrics})
    failed = [f"{r.mode} {r.program} (rep {r.rep}, rc {r.rc})" for r in runs if not r.ok]
    absent = [f"{mode} {k}" for p in programs for k in p.metrics
              for mode, vals in (("native", native), ("pilot", pilot)) if k not in vals]

    header = (f"pilot benchmark: {len(programs)} programs x {args.repeats} runs per mode, "
              f"medians{' (quick counts)' if args.quick else ''}; "
              f"ratio > 1 means pilot is slower")
    print("\nPer-run values:\n")
    print(raw_table(programs, runs))
    print(header + "\n")
    print(text)
    if failed:
        print("failed runs: " + "; ".join(failed))
    if absent:
        print("no value for: " + ", ".join(absent))
    if missed:
        print("targets missed or not judged: " + ", ".join(missed))
    if args.out:
        Path(args.out).write_text(f"{header}\n\n{text}"
                                  + (f"\nfailed runs: {'; '.join(failed)}\n" if failed else "")
                                  + (f"\nno value for: {', '.join(absent)}\n" if absent else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"native": native, "pilot": pilot, "missed": missed,
             "runs": [_run_json(r) for r in runs]}, indent=1))
    if failed or absent:
        return 1
    return 3 if missed and args.fail_on_miss else 0


def _run_json(r: Run) -> dict[str, Any]:
    return {"program": r.program, "mode": r.mode, "rep": r.rep, "rc": r.rc,
            "wall_s": round(r.wall_s, 3), "values": r.values,
            "stderr": r.stderr[-2000:] if not r.ok else ""}


if __name__ == "__main__":
    sys.exit(main())
