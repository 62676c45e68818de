#!/usr/bin/env python3
"""PILOT Fig. 4/5: programs sharing a GPU with pageDoS under pilot's memory policies.

    python3 bench/policy_runner.py --realprogs .realprogs --out /tmp/policies     # GPU, default
    python3 bench/policy_runner.py --quick --out /tmp/policies-quick              # GPU, smaller
    python3 bench/policy_runner.py --backend sim --out /tmp/policies-sim          # no GPU

pilot emulates a GPU of capacity C (--capacity, 8GiB): `pilotd --enforce-capacity --capacity C`
keeps at most C of managed memory resident on the card, evicting idle ranges to host memory. For
each program P of --programs (the table PROGRAMS below: our bench/uvm workloads, sized by
--bytes, and real programs from --realprogs DIR, which pilot serves with managed memory when
their entry says so, through `--managed-device-memory`):

  alone    P by itself under policy none: its time T_alone and footprint (pilot's peak
           resident when the table gives none)
  shared   for each fraction f of --fractions and each policy of --policies: bench/uvm/pagedos
           sized so that footprint(P) + pageDoS = f x C, started first (P starts once pageDoS
           has its buffer on the GPU), stopped (SIGTERM) when P exits

--pairs A+B,...: two sized programs (each f x C / 2) at once under --pair-policies (none,madvise)
at each fraction, each normalised by its own time alone at that size (pageDoS is no filler there).

Each run gets a fresh pilotd (a private socket and state dir, the policy's knobs in its config
file) started with CUDA_INJECTION64_PATH=bench/um_counters' libumcounters.so, which counts the
Unified Memory traffic of the pilotd process: all tenants' page faults and migrations happen
there. Per run: P's wall time (started to exited, seen from here) and its time / T_alone, pageDoS
passes/s, the CUPTI counters (GPU page fault groups, bytes HtoD and DtoH; both tenants together),
pilot's residency (`status` on the control socket every 50 ms: peak_resident, evicted and
prefetched bytes) and, independently, (a) every 250 ms pilotd's page table (`status --measure`:
managed bytes not in host RAM, an upper bound of what is on the GPU, from /proc/<pilotd>/pagemap)
and (b) NVML's used memory polled every 20 ms: peak less the reading before pilotd started (this
includes pilotd's CUDA context and non-managed allocations).

Targets, a PASS/FAIL line each: at f = 0.75 every policy within 10% of none's time; at f >= 1
each policy has fewer GPU page faults than none for every program and is faster for most;
MAdvise keeps P within 1.1x of its time alone while pageDoS runs.

Output: a markdown table per program and the verdicts; --out DIR writes policies.json (every
run), policies.md, policies_time.png (normalised time: a panel per program, groups per fraction,
bars per policy) and policies_faults.png (with matplotlib), and pilotd's logs.

Bounds: each run ends after --timeout s (P killed; its time is then reported as "> timeout"), no
run starts after --budget s. Before each run on a GPU the script refuses to ask for more managed
memory than the GPU has free (nvidia-smi, else pynvml). Programs are built with nvcc into
--build-dir (default: a temporary dir).

--backend sim: pilotd --backend sim with bench/policy_sim_kernels.py, tiny sizes (C = 64MiB),
our uvm programs only, no counters or NVML: for checking this script without a GPU. Options the
daemon does not have (--enforce-capacity, --managed-device-memory) are left out with a warning,
and a policy it does not implement is reported as a failed run.

Exit status: 0 when every run succeeded (missed targets are reported; --fail-on-miss exits 3);
1 when a run failed or was skipped; 2 when nothing could be measured.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from fig1 import Gpu, clean_env, find_shim, parse_result, query_gpu  # bench/fig1.py, beside this script
from pilotd_process import PilotdProcess, find_nvcc

BENCH_DIR = Path(__file__).resolve().parent
UVM_DIR = BENCH_DIR / "uvm"
UM_COUNTERS_BUILD = BENCH_DIR / "um_counters" / "build.sh"
SIM_KERNELS = BENCH_DIR / "policy_sim_kernels.py"
POLICIES = ("none", "mfit", "amfit", "madvise")
UVM_PROGRAMS = ("pagedos", "stream", "jacobi", "hist", "gather")
NVCC_FLAGS = ("-cudart", "shared", "-O2")
READY_TIMEOUT_S = 90.0
PAGEDOS_READY_S = 60.0  # pageDoS's allocation and first pass
PAGEDOS_STOP_S = 10.0  # after SIGTERM, the pass under way and the check
CONTEXT_BYTES = 1 << 30  # GPU memory allowed for pilotd's context in the memory guard
RESULT_LINE = re.compile(r"^uvm ((?:[a-z_]+=\S+ ?)+)$")
GiB = 1 << 30
SIM_CAPACITY = 64 << 20


def log(msg: str) -> None:
    print(f"[policies] {msg}", file=sys.stderr, flush=True)


# ---- the programs ----

@dataclass(frozen=True)
class Program:
    """argv may name {bin} (our built programs), {real} (--realprogs) and {bytes}/{passes} (sized
    programs: footprint = bytes; passes scale so that the time alone stays about the same)."""

    name: str
    argv: tuple[str, ...]
    footprint: int | None  # bytes of managed/device memory; None: measured alone
    estimate: int = 256 << 20  # used when neither the table nor the measurement gives one
    managed_device: bool = False  # needs --managed-device-memory (cudaMalloc programs)
    bytes: int = 0  # sized programs: default size
    passes: int = 0  # sized programs: passes at the default size
    note: str = ""

    @property
    def sized(self) -> bool:
        return self.bytes > 0

    def command(self, build: Path, real: Path | None, size: int | None = None) -> list[str]:
        size = size or self.bytes
        passes = max(10, round(self.passes * self.bytes / size)) if self.sized else 0
        if "{real}" in " ".join(self.argv) and real is None:
            raise RuntimeError(f"{self.name} is a real program: give --realprogs DIR")
        return [a.format(bin=build, real=real, bytes=size, passes=passes) for a in self.argv]


def _uvm(name: str, passes: int, note: str) -> Program:
    return Program(name, ("{bin}/" + name, "--bytes", "{bytes}", "--passes", "{passes}"), None,
                   bytes=3 * GiB // 2, passes=passes, note=note)


# Real programs: .realprogs (hack/build_real_programs.sh), arguments chosen for 0.5-5 s natively
# and footprints of a few hundred MiB (estimates; the alone run measures them).
PROGRAMS: dict[str, Program] = {p.name: p for p in (
    _uvm("stream", 1500, "a += b * c over 3 managed arrays, 1.5 GiB"),
    _uvm("jacobi", 2000, "periodic 2D Jacobi, 2 grids, 1.5 GiB"),
    _uvm("hist", 2000, "256-bin histogram of 1.5 GiB (read only)"),
    _uvm("gather", 600, "acc[i] += val[idx[i]], random permutation, 1.5 GiB"),
    Program("lud", ("{real}/bin/lud", "-s", "8192"), None, 256 << 20, managed_device=True,
            note="Rodinia LU decomposition, 8192^2 floats"),
    Program("nw", ("{real}/bin/nw", "8192", "10"), None, 512 << 20, managed_device=True,
            note="Rodinia Needleman-Wunsch, 8192^2 x 2 ints"),
    Program("srad_v2", ("{real}/bin/srad_v2", "4096", "4096", "0", "127", "0", "127", "0.5", "100"),
            None, 384 << 20, managed_device=True, note="Rodinia SRAD v2, 4096^2, 100 iterations"),
    Program("pathfinder", ("{real}/bin/pathfinder", "100000", "1000", "20"), None, 400 << 20,
            managed_device=True, note="Rodinia pathfinder, 100000 x 1000"),
    Program("UnifiedMemoryPerf", ("{real}/bin/UnifiedMemoryPerf",), None, 256 << 20,
            note="cuda-samples, cudaMallocManaged among other kinds"),
    # Not yet run on the H100 (sizes are guesses; the alone run measures them):
    Program("backprop", ("{real}/bin/backprop", "2097152"), None, 512 << 20, managed_device=True,
            note="Rodinia back-propagation, 2^21 input units"),
    Program("streamcluster", ("{real}/bin/streamcluster", "10", "20", "256", "262144", "262144",
                              "1000", "none", "/dev/null", "1"), None, 256 << 20,
            managed_device=True, note="Rodinia streamcluster, 262144 points of 256 dimensions"),
    Program("particlefilter", ("{real}/bin/particlefilter_float", "-x", "128", "-y", "128", "-z",
                               "10", "-np", "100000"), None, 64 << 20, managed_device=True,
            note="Rodinia particle filter, 100000 particles"),
)}
DEFAULT_PROGRAMS = "stream,gather,lud"
QUICK = {"programs": "stream,lud", "fractions": "0.75,1.5"}
DEFAULT_PAIRS = "stream+jacobi"


def sim_program(p: Program) -> Program:
    """The sim's version of a sized program: tiny (C / 4), few passes."""
    return replace(p, bytes=SIM_CAPACITY // 4, passes=5)


# ---- results ----

@dataclass
class Proc:
    name: str
    argv: list[str]
    rc: int | None = None
    wall_s: float | None = None  # started to exited, from here; None: stopped by us
    stopped: bool = False  # still running at the end (pageDoS: always): signalled by us
    values: dict[str, float] = field(default_factory=dict)  # its `uvm ...` line
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.values.get("ok", 1) == 1 and not self.stopped


@dataclass
class Run:
    kind: str  # alone, shared, pair
    program: str  # pair: "A+B"
    policy: str
    fraction: float | None
    capacity: int
    pagedos_bytes: int = 0
    footprint: int = 0
    error: str | None = None
    elapsed_s: float = 0.0
    procs: list[Proc] = field(default_factory=list)
    counters: dict[str, Any] | None = None
    residency: dict[str, Any] | None = None  # pilot's: final object, peak over the polls
    nvml: dict[str, Any] | None = None  # baseline, peak, peak - baseline
    norm: dict[str, float] = field(default_factory=dict)  # program -> wall / wall alone

    @property
    def ok(self) -> bool:
        return self.error is None and all(
            p.ok if p.name != "pagedos" else p.rc == 0 and p.values.get("ok") == 1
            for p in self.procs)  # pageDoS is always stopped by us; it must not have failed


def parse_values(text: str) -> dict[str, float]:
    return parse_result(text, RESULT_LINE)


# ---- building ----

def build(args: argparse.Namespace, out_dir: Path) -> tuple[Path, Path | None]:
    """The uvm programs into out_dir; libumcounters.so too on a GPU (None when CUPTI is missing)."""
    nvcc = find_nvcc()
    for name in UVM_PROGRAMS:
        cmd = [nvcc, *NVCC_FLAGS, f"-arch={args.arch}", "-I", str(UVM_DIR), "-o",
               str(out_dir / name), str(UVM_DIR / f"{name}.cu")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if args.backend == "sim" or args.no_counters:
        return out_dir, None
    proc = subprocess.run(["bash", str(UM_COUNTERS_BUILD), str(out_dir)], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        log(f"warning: no CUPTI counters: {UM_COUNTERS_BUILD} failed (rc {proc.returncode}): "
            f"{(proc.stdout + proc.stderr).strip()}")
        return out_dir, None
    return out_dir, out_dir / "libumcounters.so"


# ---- pilotd, its status, NVML ----

def daemon_options(python: str) -> str:
    """pilotd --help, to see which options this daemon has."""
    proc = subprocess.run([python, "-m", "pilot.daemon", "--help"], capture_output=True,
                          text=True, timeout=60, env=clean_env())
    return proc.stdout


def policy_config(args: argparse.Namespace, policy: str) -> str:
    """The pilotd config file of a run: the chosen policy's knobs (none for `none`)."""
    knobs = {
        "mfit": f'preempt_after = "{args.mfit_preempt_after}"',
        "amfit": f'resume_after = "{args.amfit_resume_after}"',
        "madvise": f'budget = "{args.madvise_budget}"\nper = "process"',
    }
    if args.preempt_kernels:  # MFit and AMFit stop held owners' kernels ([priority] preempt)
        for name in ("mfit", "amfit"):
            knobs[name] += "\npreempt_kernels = true"
    text = "# written by bench/policy_runner.py\n"
    if policy in knobs:
        text += f"[policy.{policy}]\n{knobs[policy]}\n"
    if args.preempt_kernels:
        text += "[priority]\npreempt = true\n"
    return text + (Path(args.pilotd_config).read_text() if args.pilotd_config else "")


class Pilotd(PilotdProcess):
    def __init__(self, args: argparse.Namespace, policy: str, managed_device: bool, workdir: Path,
                 log_path: Path, counters: Path | None, counters_out: Path) -> None:
        self.socket = str(workdir / "pilot.sock")
        self.control = str(workdir / "control.sock")
        config = workdir / "pilotd.toml"
        config.write_text(policy_config(args, policy))
        cmd = [args.python, "-m", "pilot.daemon", "--config", str(config), "--backend",
               args.backend, "--socket", self.socket, "--control-socket", self.control,
               "--state-dir", str(workdir / "state"), "--metrics-address", "",
               "--capacity", str(args.capacity), "--policy", policy]
        if "--enforce-capacity" in args.daemon_help:
            cmd.append("--enforce-capacity")
        if managed_device and "--managed-device-memory" in args.daemon_help:
            cmd.append("--managed-device-memory")
        if args.backend == "sim":
            cmd += ["--sim-kernels", str(SIM_KERNELS)]
        env = clean_env()
        if counters is not None:
            env.update(CUDA_INJECTION64_PATH=str(counters), UM_COUNTERS_OUT=str(counters_out))
        super().__init__([*cmd, *args.pilotd_arg], log_path, env, log)

    def status(self, measure: bool = False) -> dict[str, Any]:
        return control_call(self.control, "status", measure)


def control_call(path: str, cmd: str, measure: bool = False) -> Any:
    """One command on pilotd's control socket (pilot.cli.client, else pilotctl); `measure`:
    status also reads pilotd's page table (pagemap) for where managed memory is."""
    try:
        from pilot.cli.client import ControlClient  # type: ignore[import-not-found]
    except ImportError:
        proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "--control-socket",
                               path, cmd, "--json", *(["--measure"] if measure else [])],
                              capture_output=True, text=True, timeout=10)
        if proc.returncode != 0:
            raise RuntimeError(f"pilotctl {cmd}: {proc.stderr.strip()}") from None
        return json.loads(proc.stdout)
    return ControlClient(path, timeout_ms=3000).call(cmd, **({"measure": True} if measure else {}))


class Poller:
    """Calls read() every period s on a thread until stopped; keeps every reading's peak."""

    def __init__(self, read: Any, period: float) -> None:
        self.read, self.period = read, period
        self.peak: dict[str, int] = {}
        self.last: dict[str, Any] | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.period)

    def poll(self) -> None:
        try:
            reading = self.read()
        except Exception:  # a daemon going away, NVML hiccups: counted, not fatal
            self.errors += 1
            return
        if reading is None:
            return
        self.last = reading
        for k, v in reading.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.peak[k] = max(self.peak.get(k, v), v)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()


def residency_reader(daemon: Pilotd, measure_every: int = 5) -> Any:
    """pilot's residency; every `measure_every`-th reading also pilotd's page table (the
    `gpu_at_most` it gives is flattened into the reading, so the Poller keeps its peak)."""
    count = 0

    def read() -> dict[str, Any] | None:
        nonlocal count
        count += 1
        gpus = daemon.status(measure=count % measure_every == 1).get("gpus") or [{}]
        res = gpus[0].get("residency")
        if res is not None and res.get("pagemap"):
            res = {**res, "pagemap_gpu_at_most": res["pagemap"]["gpu_at_most"]}
        return res
    return read


def nvml_reader() -> Any:
    """GPU 0's used memory, through pynvml (None without it)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:
        log(f"warning: no NVML residency measure ({type(exc).__name__}: {exc})")
        return None

    def read() -> dict[str, int]:
        return {"used": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)}
    return read


def memory_guard(need: int) -> str | None:
    gpu = query_gpu()
    if need + CONTEXT_BYTES > gpu.free_mib << 20:
        return (f"the run asks for {need / GiB:.2f} GiB of managed memory (+ {CONTEXT_BYTES / GiB:.0f}"
                f" GiB context) but the GPU has {gpu.free_mib} MiB free: not running")
    return None


# ---- the processes of a run ----

class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name, self.argv = name, argv
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ended: float | None = None
        self.stopped = False
        self.out: list[str] = []
        self.err: list[str] = []
        self.ready = threading.Event()
        self.threads = [threading.Thread(target=self._pump, args=(s, into), daemon=True)
                        for s, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.threads:
            t.start()

    def _pump(self, stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)
            if line.strip() == "uvm ready":
                self.ready.set()

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        self.ended = time.monotonic()
        return True

    def stop(self, grace: float) -> None:
        """SIGTERM, grace seconds, SIGKILL."""
        if self.proc.poll() is None:
            self.stopped = True
            self.proc.send_signal(signal.SIGTERM)
            if not self.wait(grace):
                self.proc.kill()
                self.proc.wait(30)

    def result(self) -> Proc:
        for t in self.threads:
            t.join(5)
        wall = None if self.stopped or self.ended is None else self.ended - self.started
        return Proc(self.name, self.argv, self.proc.returncode, wall, self.stopped,
                    parse_values("".join(self.out)), "".join(self.err)[-3000:])


def run_once(args: argparse.Namespace, run: Run, tenants: list[tuple[str, list[str]]],
             pagedos: list[str] | None, managed_device: bool, t_start: float) -> Run:
    """One pilotd, pageDoS first (if any) until it is ready, then the tenants together; ends when
    the tenants exit (pageDoS then gets SIGTERM) or at the timeout."""
    started = time.monotonic()
    limit = min(args.timeout, args.budget - (started - t_start))
    tag = f"{run.kind}-{run.program}-{run.policy}-{run.fraction or 0:g}".replace("+", "_")
    workdir = Path(tempfile.mkdtemp(prefix="pr-", dir=args.workdir))
    counters_out = workdir / "um.json"
    log_path = (args.out_dir or workdir) / f"pilotd-{tag}.log"
    nvml = Poller(args.nvml_read, 0.02) if args.nvml_read else None
    if nvml:
        time.sleep(0.1)  # a few readings before pilotd starts: the baseline
    baseline = dict(nvml.last or {}) if nvml else {}
    daemon = Pilotd(args, run.policy, managed_device, workdir, log_path, args.counters_lib,
                    counters_out)
    residency: Poller | None = None
    children: list[Child] = []
    try:
        daemon.wait_ready(READY_TIMEOUT_S)
        sched = daemon.status().get("scheduling", {})
        avail = sched.get("available", {}).get(run.policy, {})
        if sched.get("name") != run.policy or avail.get("implemented") is False:
            raise RuntimeError(f"pilotd runs policy {sched.get('name')!r} (asked {run.policy!r}; "
                               f"implemented: {avail.get('implemented')})")
        residency = Poller(residency_reader(daemon), 0.05)
        env = {**clean_env(), "LD_PRELOAD": args.shim, "PILOT_SOCKET": daemon.socket}
        deadline = started + limit
        if pagedos is not None:
            dos = Child("pagedos", pagedos, env, workdir)
            children.append(dos)
            while not dos.ready.wait(0.05):
                if dos.proc.poll() is not None or time.monotonic() > min(
                        deadline, started + PAGEDOS_READY_S):
                    raise RuntimeError(f"pageDoS not ready (rc {dos.proc.poll()}): "
                                       f"{''.join(dos.err)[-500:]}")
        tenants_ch = [Child(name, argv, env, workdir) for name, argv in tenants]
        children += tenants_ch
        for c in tenants_ch:
            if not c.wait(deadline - time.monotonic()):
                run.error = f"killed after {limit:.0f} s"
                break
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        said = [ln for ln in daemon.tail().splitlines() if ln.startswith("Error")]
        run.error = (str(exc).splitlines() or [type(exc).__name__])[0] + (
            f": {said[-1]}" if said and not daemon.alive() else "")
        log(f"{tag}: {exc}")
    finally:
        for c in children:
            c.stop(PAGEDOS_STOP_S if c.name == "pagedos" else 0.5)
        if residency:
            residency.stop()
        daemon.stop()
        if nvml:
            nvml.stop()
    run.elapsed_s = time.monotonic() - started
    run.procs = [c.result() for c in children]
    if residency and (residency.last or residency.peak):
        run.residency = {**(residency.last or {}), "polled_peak_resident":
                         residency.peak.get("resident"), "poll_errors": residency.errors,
                         "pagemap_peak_gpu_at_most": residency.peak.get("pagemap_gpu_at_most")}
    if nvml and "used" in baseline:
        peak = nvml.peak.get("used", baseline["used"])
        run.nvml = {"baseline": baseline["used"], "peak": peak, "delta": peak - baseline["used"]}
    try:
        run.counters = json.loads(counters_out.read_text())
    except (OSError, ValueError):
        if args.counters_lib is not None:
            log(f"{tag}: no counters in {counters_out}")
    if run.error is None and not run.ok:
        bad = [p for p in run.procs if p.rc != 0 or p.values.get("ok", 1) != 1
               or (p.stopped and p.name != "pagedos")]
        run.error = "; ".join(f"{p.name} rc {p.rc}{' (stopped)' if p.stopped else ''}: "
                              f"{p.stderr.strip()[-300:]}" for p in bad)
    shutil.rmtree(workdir, ignore_errors=True)
    return run


# ---- the experiments ----

def footprint_of(p: Program, alone: Run | None, size: int | None = None) -> int:
    if p.sized:
        return size or p.bytes
    if p.footprint:
        return p.footprint
    if alone and alone.residency and alone.residency.get("peak_resident"):
        return int(alone.residency["peak_resident"])
    return p.estimate


def report(run: Run) -> None:
    status = "ok" if run.ok else f"FAILED: {run.error}"
    walls = ", ".join(f"{p.name} {p.wall_s:.2f} s" if p.wall_s is not None else f"{p.name} -"
                      for p in run.procs)
    norm = ", ".join(f"{k} {v:.2f}x" for k, v in run.norm.items())
    faults = (run.counters or {}).get("gpu_page_faults")
    log(f"{run.kind:6} {run.program:12} {run.policy:7} f={run.fraction or 0:<4g} {status} "
        f"({run.elapsed_s:.1f} s): {walls}{'; ' + norm if norm else ''}"
        f"{f'; faults {faults}' if faults is not None else ''}")


def guard(args: argparse.Namespace, need: int) -> str | None:
    if time.monotonic() - args.t_start > args.budget - 5:
        return f"skipped: the {args.budget:.0f} s budget is spent"
    return memory_guard(need) if args.backend == "cuda" else None


def experiment(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    alone: dict[tuple[str, int], Run] = {}
    C = args.capacity_bytes

    def skipped(run: Run, why: str) -> Run:
        run.error = why
        log(f"{run.kind} {run.program} {run.policy} f={run.fraction}: {why}")
        return run

    def run_alone(p: Program, size: int | None = None) -> Run:
        key = (p.name, size or 0)
        if key not in alone:
            run = Run("alone", p.name, "none", None, C, footprint=footprint_of(p, None, size))
            why = guard(args, run.footprint)
            cmd = p.command(args.build, args.real, size)
            alone[key] = skipped(run, why) if why else run_once(
                args, run, [(p.name, cmd)], None, p.managed_device, args.t_start)
            if alone[key].ok:
                alone[key].footprint = footprint_of(p, alone[key], size)
                alone[key].norm = {p.name: 1.0}
            report(alone[key])
            runs.append(alone[key])
        return alone[key]

    for name in args.programs:
        p = args.table[name]
        base = run_alone(p)
        t_alone = base.procs[0].wall_s if base.ok and base.procs else None
        for f in args.fractions:
            dos_bytes = max(64 << 20, int(f * C) - base.footprint)
            for policy in args.policies:
                run = Run("shared", name, policy, f, C, pagedos_bytes=dos_bytes,
                          footprint=base.footprint)
                why = guard(args, base.footprint + dos_bytes)
                # pieces of C/4: pilot enforces C at launch granularity, so no one kernel of
                # pageDoS may need more than C (bench/uvm/pagedos.cu)
                dos = [str(args.build / "pagedos"), "--bytes", str(dos_bytes), "--chunk",
                       str(max(C // 4, 2 << 20)), "--seconds", str(int(args.timeout) + 60)]
                if why:
                    runs.append(skipped(run, why))
                    continue
                run = run_once(args, run, [(name, p.command(args.build, args.real))], dos,
                               p.managed_device, args.t_start)
                mine = run.procs[1] if len(run.procs) > 1 else None
                if t_alone and mine is not None:
                    run.norm[name] = (mine.wall_s or args.timeout) / t_alone
                runs.append(run)
                report(run)
    for pair in args.pairs:
        a, b = (args.table[n] for n in pair)
        for f in args.fractions:
            size = int(f * C / 2)
            refs = {p.name: run_alone(p, size) for p in (a, b)}
            for policy in args.pair_policies:
                run = Run("pair", f"{a.name}+{b.name}", policy, f, C, footprint=2 * size)
                why = guard(args, 2 * size)
                if why:
                    runs.append(skipped(run, why))
                    continue
                run = run_once(args, run, [(p.name, p.command(args.build, args.real, size))
                                           for p in (a, b)], None, False, args.t_start)
                for proc in run.procs:
                    ref = refs[proc.name]
                    if ref.ok:
                        run.norm[proc.name] = ((proc.wall_s or args.timeout)
                                               / (ref.procs[0].wall_s or 1))
                runs.append(run)
                report(run)
    return runs


# ---- reporting ----

def shared(runs: list[Run], program: str, f: float, policy: str) -> Run | None:
    for r in runs:
        if r.kind == "shared" and r.program == program and r.fraction == f and r.policy == policy:
            return r
    return None


def faults(r: Run | None) -> int | None:
    return None if r is None or r.counters is None else r.counters.get("gpu_page_faults")


def time_cell(r: Run | None, program: str) -> str:
    if r is None or program not in r.norm:
        return "-" if r is None or r.error is None else "failed"
    censored = any(p.name == program and p.stopped for p in r.procs)
    return (">" if censored else "") + f"{r.norm[program]:.2f}x"


def gib(n: Any) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def tables(runs: list[Run], args: argparse.Namespace) -> str:
    out = []
    C = args.capacity_bytes
    for name in args.programs:
        base = next((r for r in runs if r.kind == "alone" and r.program == name), None)
        t = base.procs[0].wall_s if base and base.ok and base.procs else None
        out.append(f"### {name}: alone {t:.2f} s, footprint {gib(base.footprint)} GiB"
                   if t and base else f"### {name}: alone run failed ({base.error if base else '-'})")
        out.append("\n| f | policy | time / alone | pageDoS passes/s | GPU fault groups | HtoD GiB | "
                   "DtoH GiB | pilot peak resident GiB (C) | page table: peak on GPU at most GiB | "
                   "NVML peak - base GiB | pageDoS GiB |")
        out.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for f in args.fractions:
            for pol in args.policies:
                r = shared(runs, name, f, pol)
                if r is None:
                    continue
                dos = next((p for p in r.procs if p.name == "pagedos"), None)
                rate = dos.values.get("passes_per_s") if dos else None
                c, res, nv = r.counters or {}, r.residency or {}, r.nvml or {}
                out.append(f"| {f:g} | {pol} | {time_cell(r, name)} | "
                           f"{'-' if rate is None else f'{rate:.2f}'} | {c.get('gpu_page_faults', '-')} | "
                           f"{gib(c.get('htod_bytes'))} | {gib(c.get('dtoh_bytes'))} | "
                           f"{gib(res.get('peak_resident'))} ({gib(C)}) | "
                           f"{gib(res.get('pagemap_peak_gpu_at_most'))} | {gib(nv.get('delta'))} | "
                           f"{gib(r.pagedos_bytes)} |")
        out.append("")
    pairs = [r for r in runs if r.kind == "pair"]
    if pairs:
        out.append("### pairs (each program f x C / 2), time / alone at the same size\n")
        out.append("| pair | f | policy | times / alone | GPU fault groups | pilot peak resident GiB |")
        out.append("| --- | ---: | --- | --- | ---: | ---: |")
        for r in pairs:
            times = ", ".join(f"{k} {time_cell(r, k)}" for k in r.program.split("+"))
            out.append(f"| {r.program} | {r.fraction:g} | {r.policy} | {times or r.error} | "
                       f"{faults(r) if faults(r) is not None else '-'} | "
                       f"{gib((r.residency or {}).get('peak_resident'))} |")
        out.append("")
    return "\n".join(out)


def verdicts(runs: list[Run], args: argparse.Namespace) -> list[str]:
    lines = []
    others = [p for p in args.policies if p != "none"]

    def norm(name: str, f: float, pol: str) -> float | None:
        r = shared(runs, name, f, pol)
        return r.norm.get(name) if r else None

    def line(label: str, checks: list[tuple[str, bool | None]]) -> None:
        known = [(what, ok) for what, ok in checks if ok is not None]
        if not known:
            lines.append(f"{label}: n/a (no measurements)")
            return
        bad = [what for what, ok in known if not ok]
        gaps = len(checks) - len(known)
        lines.append(f"{label}: {'PASS' if not bad else 'FAIL'}"
                     + (f" (missed: {'; '.join(bad)})" if bad else "")
                     + (f" [{gaps} comparison(s) without data]" if gaps else ""))

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    def cmp(a: float | None, b: float | None, ok: Any) -> bool | None:
        return None if a is None or b is None else bool(ok(a, b))

    for f in [f for f in args.fractions if f < 1.0]:
        line(f"f={f:g}: every policy within 10% of none's time",
             [(f"{n} {p} {x(norm(n, f, p))} vs {x(norm(n, f, 'none'))}",
               cmp(norm(n, f, p), norm(n, f, "none"), lambda a, b: a <= 1.10 * b))
              for n in args.programs for p in others])
    for f in [f for f in args.fractions if f >= 1.0]:
        for p in others:
            line(f"f={f:g}: {p} has fewer GPU page faults than none for every program",
                 [(f"{n}: {faults(shared(runs, n, f, p))} vs {faults(shared(runs, n, f, 'none'))}",
                   cmp(faults(shared(runs, n, f, p)), faults(shared(runs, n, f, "none")),
                       lambda a, b: a < b)) for n in args.programs])
            faster = [cmp(norm(n, f, p), norm(n, f, "none"), lambda a, b: a < b)
                      for n in args.programs]
            known = [x for x in faster if x is not None]
            lines.append(f"f={f:g}: {p} faster than none for most programs: "
                         + (f"{'PASS' if sum(known) * 2 > len(known) else 'FAIL'} ({sum(known)} of "
                            f"{len(known)})" if known else "n/a (no measurements)"))
    if "madvise" in args.policies:
        line("MAdvise keeps the program within 1.1x of its time alone while pageDoS runs",
             [(f"{n} f={f:g}: {x(norm(n, f, 'madvise'))}",
               cmp(norm(n, f, "madvise"), 1.1, lambda a, b: a <= b))
              for n in args.programs for f in args.fractions])
    pairs = [r for r in runs if r.kind == "pair" and r.policy == "madvise"]
    if pairs:
        line("pairs under MAdvise: each program within 1.1x of its time alone (informational)",
             [(f"{r.program} f={r.fraction:g} {k}: {x(v)}", v <= 1.1)
              for r in pairs for k, v in r.norm.items()])
    return lines


def plot(runs: list[Run], args: argparse.Namespace, out_dir: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        log(f"warning: no plots ({exc})")
        return
    n, pols, fr = len(args.programs), args.policies, args.fractions
    width = 0.8 / max(1, len(pols))
    for what, fname, ylabel in (("time", "policies_time.png", "time / time alone"),
                                ("faults", "policies_faults.png", "GPU page fault groups (CUPTI)")):
        fig, axes = plt.subplots(1, n, figsize=(4.2 * n + 1, 3.8), squeeze=False)
        for ax, name in zip(axes[0], args.programs, strict=True):
            for i, pol in enumerate(pols):
                ys = []
                for f in fr:
                    r = shared(runs, name, f, pol)
                    v = (r.norm.get(name) if what == "time" else faults(r)) if r else None
                    ys.append(float("nan") if v is None else v)
                ax.bar([j + (i - (len(pols) - 1) / 2) * width for j in range(len(fr))], ys,
                       width, label=pol)
            if what == "time":
                ax.axhline(1.0, color="grey", linewidth=0.8)
            else:
                ax.set_yscale("symlog")
            ax.set_xticks(range(len(fr)))
            ax.set_xticklabels([f"{f:.0%} of C" for f in fr])
            ax.set_title(name, fontsize=10)
            ax.set_ylabel(ylabel)
            ax.grid(True, axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(textwrap.fill(title, int(14 * (4.2 * n + 1))), fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=120)
        plt.close(fig)
        log(f"wrote {out_dir / fname}")


# ---- main ----

def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 8GiB")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(doc.split("\n\n")[1:]) + "\n\nprograms:\n"
                                 + "\n".join(f"  {p.name:18} {p.note}" for p in PROGRAMS.values()))
    ap.add_argument("--capacity", default=None, help="C, pilot's capacity (8GiB; sim: 64MiB)")
    ap.add_argument("--fractions", default=None, help="f x C in all (0.75,1.0,1.5)")
    ap.add_argument("--policies", default="none,mfit,amfit,madvise", help="(none,mfit,amfit,madvise)")
    ap.add_argument("--programs", default=None, help=f"from the table below ({DEFAULT_PROGRAMS})")
    ap.add_argument("--pairs", default="", help=f"pairs of sized programs, e.g. {DEFAULT_PAIRS} "
                    "(default: none)")
    ap.add_argument("--pair-policies", default="none,madvise", help="(none,madvise)")
    ap.add_argument("--quick", action="store_true",
                    help=f"programs {QUICK['programs']}, fractions {QUICK['fractions']} "
                         "(explicit options win)")
    ap.add_argument("--realprogs", metavar="DIR", help="the real programs (.realprogs: bin/, "
                    "manifest.tsv); programs that need them are skipped without it")
    ap.add_argument("--mfit-preempt-after", default="1s", help="[policy.mfit] preempt_after (1s)")
    ap.add_argument("--amfit-resume-after", default="2s", help="[policy.amfit] resume_after (2s)")
    ap.add_argument("--preempt-kernels", action="store_true",
                    help="MFit and AMFit preempt held owners' running kernels ([policy.mfit] and "
                         "[policy.amfit] preempt_kernels, [priority] preempt)")
    ap.add_argument("--madvise-budget", default=None,
                    help="[policy.madvise] budget per process (default: C / 2)")
    ap.add_argument("--pilotd-config", metavar="FILE", help="TOML appended to every run's config")
    ap.add_argument("--pilotd-arg", metavar="ARG", action="append", default=[],
                    help="extra pilotd argument (repeatable)")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--no-counters", action="store_true", help="no CUPTI injection")
    ap.add_argument("--out", metavar="DIR", help="policies.json, policies.md, plots, pilotd logs")
    ap.add_argument("--python", default=sys.executable, help="runs pilotd and the pilot CLI")
    ap.add_argument("--shim", metavar="PATH", help="libpilot.so (default: `pilot shim-path`)")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (sm_90)")
    ap.add_argument("--build-dir", metavar="DIR", help="build here (default: a temporary dir)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (15; sim: 60)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything (540)")
    ap.add_argument("--fail-on-miss", action="store_true", help="exit 3 when a target is missed")
    args = ap.parse_args(argv)
    sim = args.backend == "sim"
    quick = QUICK if args.quick else {}
    try:
        args.capacity_bytes = parse_size(args.capacity or ("64MiB" if sim else "8GiB"))
        args.fractions = sorted({float(x) for x in words(
            args.fractions or quick.get("fractions", "0.75,1.0,1.5"))})
        args.policies = [p for p in POLICIES if p in words(args.policies)]
        args.pair_policies = words(args.pair_policies)
        args.programs = words(args.programs or quick.get("programs", DEFAULT_PROGRAMS))
        args.pairs = [tuple(words(p.replace("+", ","))) for p in args.pairs.split(",") if p]
    except (ValueError, argparse.ArgumentTypeError) as exc:
        ap.error(str(exc))
    args.capacity = f"{args.capacity_bytes >> 20}MiB"
    args.madvise_budget = args.madvise_budget or f"{args.capacity_bytes // 2 >> 20}MiB"
    args.timeout = args.timeout or (60.0 if sim else 15.0)
    args.table = {k: sim_program(p) if sim and p.sized else p for k, p in PROGRAMS.items()}
    unknown = [n for n in args.programs + [n for p in args.pairs for n in p] if n not in args.table]
    if unknown or not args.policies or any(len(p) != 2 for p in args.pairs):
        ap.error(f"unknown program(s) {unknown} (have {', '.join(PROGRAMS)}), no policy, or a pair "
                 "that is not A+B")
    if any(not args.table[n].sized for p in args.pairs for n in p):
        ap.error("--pairs takes sized programs only (ours: " +
                 ", ".join(n for n, p in PROGRAMS.items() if p.sized) + ")")
    args.real = Path(args.realprogs).resolve() if args.realprogs else None
    need_real = [n for n in args.programs if "{real}" in " ".join(args.table[n].argv)]
    if need_real and (sim or args.real is None):
        log(f"skipping {', '.join(need_real)}: " + ("the sim has no emulations of real programs"
                                                   if sim else "no --realprogs DIR"))
        args.programs = [n for n in args.programs if n not in need_real]
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.workdir = tempfile.mkdtemp(prefix="pilot-pol-")  # short: socket paths max 107 bytes
    try:
        return policies(args)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)


def policies(args: argparse.Namespace) -> int:
    args.t_start = time.monotonic()
    args.out_dir = Path(args.out) if args.out else None
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    gpu: Gpu | None = None
    try:
        if args.backend == "cuda":
            gpu = query_gpu()
            log(f"GPU {gpu.name}, driver {gpu.driver}, {gpu.free_mib} of {gpu.total_mib} MiB free")
        build_dir = Path(args.build_dir) if args.build_dir else Path(args.workdir) / "bin"
        build_dir.mkdir(parents=True, exist_ok=True)
        args.build, args.counters_lib = build(args, build_dir)
        log(f"built into {build_dir}" + (f", counters {args.counters_lib}"
                                         if args.counters_lib else ", no counters"))
        args.shim = find_shim(args.python, args.shim)
        args.daemon_help = daemon_options(args.python)
        for opt in ("--enforce-capacity", "--managed-device-memory"):
            if opt not in args.daemon_help:
                log(f"warning: this pilotd has no {opt}: runs go without it")
        args.nvml_read = nvml_reader() if args.backend == "cuda" else None
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        log(str(exc))
        return 2

    runs = experiment(args)
    header = (f"PILOT Fig. 4/5: capacity C = {args.capacity}, pageDoS fills f x C; policies "
              f"{', '.join(args.policies)}; mfit preempt_after {args.mfit_preempt_after}, amfit "
              f"resume_after {args.amfit_resume_after}, madvise budget {args.madvise_budget}/process"
              + (f"; {gpu.name}, driver {gpu.driver}" if gpu else f"; backend {args.backend}")
              + ("" if args.counters_lib else "; no CUPTI counters"))
    note = ("Times: wall time of the program started to exited, over its time alone under pilot "
            "(policy none, same C); '>' marks a program killed at the timeout. Faults and bytes: "
            "CUPTI Unified Memory counters of the pilotd process (all tenants; GPU faults are "
            "fault groups per page as CUPTI reports them). NVML: GPU 0's used memory, peak less "
            "the reading before pilotd started (includes pilotd's context).")
    text, lines = tables(runs, args), verdicts(runs, args)
    failed = [f"{r.kind} {r.program} {r.policy} f={r.fraction}: {r.error}" for r in runs if not r.ok]
    print(f"\n{header}\n\n{note}\n\n{text}\n" + "\n".join(lines))
    if failed:
        print("failed runs:\n" + "\n".join(f"  {f}" for f in failed))
    log(f"done in {time.monotonic() - args.t_start:.0f} s")
    if args.out_dir:
        (args.out_dir / "policies.md").write_text(
            f"{header}\n\n{note}\n\n{text}\n" + "\n".join(f"- {x}" for x in lines) + "\n"
            + ("\nfailed runs:\n\n" + "\n".join(f"- {f}" for f in failed) + "\n" if failed else ""))
        config = {k: v for k, v in vars(args).items() if k in (
            "capacity", "fractions", "policies", "programs", "pairs", "pair_policies", "backend",
            "timeout", "budget", "mfit_preempt_after", "amfit_resume_after", "preempt_kernels",
            "madvise_budget",
            "pilotd_arg", "arch")}
        (args.out_dir / "policies.json").write_text(json.dumps({
            "config": config, "gpu": asdict(gpu) if gpu else None, "verdicts": lines,
            "programs": {n: {**asdict(args.table[n]), "command": args.table[n].command(
                args.build, args.real)} for n in args.programs},
            "runs": [{**asdict(r), "ok": r.ok} for r in runs]}, indent=1, default=str))
        plot(runs, args, args.out_dir, header)
        log(f"wrote {args.out_dir / 'policies.md'}, {args.out_dir / 'policies.json'}")
    if failed:
        return 1
    return 3 if args.fail_on_miss and any("FAIL" in x for x in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
