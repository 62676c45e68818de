"""What the salus benchmark scripts share (salus_trace.py, salus_experiments.py): a pilotd they
start with a policy, the job programs (bench/salus_job.cu built with nvcc, the PyTorch job
bench/salus_torch_job.py under `pilot run`), and a poller of pilotd's salus state that records
when each job first ran and how much GPU time (iteration seconds) each has had."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from pilotd_process import PilotdProcess, find_nvcc  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
REFUSED = "pilotd refused the session"


def build_job(out_dir: Path, program: str = "salus_job") -> Path:
    """bench/<program>.cu built into out_dir (salus_torch_like: the PyTorch-shaped step)."""
    exe = out_dir / program
    # Machine code for the GPU (NVCC_ARCH, sm_90 by default, as tests/gpu builds): without it
    # nvcc 13 emits sm_75 code and PTX, which the driver must compile when a job loads it.
    cmd = [find_nvcc(), "-cudart", "shared", "-O2", f"-arch={os.environ.get('NVCC_ARCH', 'sm_90')}",
           "-Wno-deprecated-gpu-targets", "-o", str(exe), str(BENCH / f"{program}.cu")]
    subprocess.run(cmd, check=True, timeout=600)
    return exe


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PILOT", "LD_PRELOAD"))}


class Daemon(PilotdProcess):
    """A pilotd of its own (socket, state and log under `workdir`) with `policy`; `config`:
    more TOML (e.g. "[daemon]\nfast_launch = false\n"); `metrics`: serve Prometheus metrics
    on a free local port (`scrape`)."""

    def __init__(self, workdir: Path, backend: str, policy: str, scheduler: str = "pack",
                 capacity: str = "12GiB", log_level: str = "info", config: str = "",
                 metrics: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.socket = str(workdir / "pilot.sock")
        self.control = str(workdir / "control.sock")
        toml = workdir / "pilotd.toml"
        text = config + "[policy]\nmax_wait = 0\n"
        if policy == "salus":
            text += f'[policy.salus]\nscheduler = "{scheduler}"\ncapacity = "{capacity}"\n'
        toml.write_text(text)
        self.metrics_address = ""
        if metrics:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.metrics_address = f"127.0.0.1:{probe.getsockname()[1]}"
        cmd = [sys.executable, "-m", "pilot.daemon", "--config", str(toml), "--backend", backend,
               "--socket", self.socket, "--control-socket", self.control, "--state-dir",
               str(workdir / "state"), "--metrics-address", self.metrics_address, "--policy", policy,
               "--log-level", log_level]
        if backend == "sim":
            cmd += ["--sim-kernels", str(BENCH / "salus_sim_kernels.py")]
        super().__init__(cmd, workdir / "pilotd.log", clean_env(), say=lambda s: None)
        self.wait_ready(60)

    def status(self) -> dict[str, Any]:
        from pilot.cli.client import ControlClient
        return ControlClient(self.control, timeout_ms=3000).call("status")

    def scrape_text(self) -> str:
        """The metrics page ("" without metrics)."""
        if not self.metrics_address:
            return ""
        return urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10).read().decode()

    def scrape(self, name: str) -> float:
        """The sum of metric `name`'s samples (0 without metrics or samples)."""
        text = self.scrape_text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def sessions(self) -> list[dict[str, Any]]:
        from pilot.cli.client import ControlClient
        return ControlClient(self.control, timeout_ms=3000).call("sessions")


# What a PyTorch job of each size (salus_torch_job.py) declares, MiB: P (parameters, cuBLAS's
# workspace, the context's first allocations) and E (activations and gradients of a batch of
# 512), rounded up; once pilot recognizes its iterations its measured P and E take over.
TORCH_DECLARED = {"small": (64, 64), "medium": (384, 256), "large": (1280, 1024)}
# The step time a PyTorch job of the trace declares (PILOT_SALUS_ITERATION_TIME) and the trace's
# ideal counts: its work is its steps x this (the timelines show what the steps really took).
TORCH_ITERATION_S = 0.01


@dataclass
class JobSpec:
    """One job of a trace: a CUDA C job (P, E in MiB, iteration ms, iterations) or a PyTorch
    job (`torch` = its model size)."""
    name: str
    arrival: float
    persistent_mib: int = 0
    ephemeral_mib: int = 0
    iter_ms: float = 0.0
    iterations: int = 1
    torch: str = ""
    blocks: int = 8  # of the CUDA C job's kernel (128 threads each)
    torch_alloc: str = "backend:cudaMallocAsync"  # PYTORCH_CUDA_ALLOC_CONF; "": the caching one
    argv: tuple[str, ...] = ()  # a program of its own instead (under the shim), e.g. salus_torch_like

    @property
    def iteration_s(self) -> float:
        """One iteration's time as the trace counts it (and the job declares)."""
        return TORCH_ITERATION_S if self.torch else self.iter_ms / 1e3

    def command(self, exe: Path, sim: bool) -> list[str]:
        if self.argv:
            return list(self.argv)
        if self.torch:
            return [sys.executable, "-m", "pilot.cli.pilot", "run", "--",
                    sys.executable, str(BENCH / "salus_torch_job.py"), "--size", self.torch,
                    "--iterations", str(self.iterations)]
        host_ms = self.iter_ms if sim else 0
        return [str(exe), str(self.persistent_mib), str(self.ephemeral_mib), f"{self.iter_ms:g}",
                str(self.iterations), str(self.blocks), f"{host_ms:g}"]

    def env(self, daemon: Daemon, shim: str, declare: bool) -> dict[str, str]:
        env = {**clean_env(), "PILOT_SOCKET": daemon.socket}
        if self.torch and self.torch_alloc:
            env["PYTORCH_CUDA_ALLOC_CONF"] = self.torch_alloc  # cudaMallocAsync: E visible to pilot
        else:
            env["LD_PRELOAD"] = shim
        if declare:
            p, e = TORCH_DECLARED[self.torch] if self.torch else (self.persistent_mib, self.ephemeral_mib)
            env.update(PILOT_SALUS_PERSISTENT=f"{p}MiB", PILOT_SALUS_EPHEMERAL=f"{e}MiB",
                       PILOT_SALUS_ITERATION_TIME=f"{self.iteration_s * 1e3:g}ms")
        env["PILOT_SALUS_ITERATIONS"] = str(self.iterations)
        return env


@dataclass
class Result:
    spec: JobSpec
    started: float = 0.0  # seconds from the trace's start
    ended: float = 0.0
    first_ran: float | None = None  # when pilotd first showed it running
    rc: int | None = None
    output: str = ""
    retried: bool = False
    pid: int = 0  # of its (last) process

    @property
    def jct(self) -> float:
        return self.ended - self.spec.arrival

    @property
    def queued(self) -> float:
        return (self.first_ran if self.first_ran is not None else self.ended) - self.spec.arrival


class Poller(threading.Thread):
    """Every `period` s: for each pid, when it was first seen running and its service seconds
    (the salus policy's state), with the time of each reading; the most the lanes counted and
    the most pilot granted on GPU 0, each with when (seconds from the start) and what made it
    up (`peaks`: the lanes' terms and each job's P and E, what each session was charged)."""

    def __init__(self, pilotd: Daemon, t0: float, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pilotd, self.t0, self.period = pilotd, t0, period
        self.first_running: dict[int, float] = {}
        self.service: list[tuple[float, dict[int, float]]] = []
        self.max_used = self.max_granted = self.capacity = 0
        self.peaks: dict[str, dict[str, Any]] = {}  # "used" / "granted" -> when and what
        self.jobs: dict[int, dict[str, Any]] = {}  # pid -> its last row in the salus state
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            try:
                doc = self.pilotd.status()
            except Exception:
                continue
            now = time.monotonic() - self.t0
            granted = doc["gpus"][0]["used_by_pilot"]
            gpu = ((doc.get("scheduling") or {}).get("state") or {}).get("gpus", {}).get("0")
            if granted > self.max_granted:
                self.max_granted = granted
                self.peaks["granted"] = peak(now, granted, gpu, self._sessions())
            if not gpu:
                continue
            self.capacity = gpu["capacity"]
            if gpu["used"] > self.max_used:
                self.max_used = gpu["used"]
                self.peaks["used"] = peak(now, gpu["used"], gpu, self._sessions())
            for j in gpu["jobs"]:
                if j["running"] and j["pid"] not in self.first_running:
                    self.first_running[j["pid"]] = now
            self.service.append((now, {j["pid"]: j["service_s"] for j in gpu["jobs"]}))
            self.jobs.update({j["pid"]: j for j in gpu["jobs"]})

    def _sessions(self) -> list[dict[str, Any]]:
        try:
            return self.pilotd.sessions()
        except Exception:
            return []


def peak(now: float, value: int, gpu: dict[str, Any] | None,
         sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """A reading worth keeping: when, the value, the lanes' terms and jobs then (salus state),
    and what each session on GPU 0 was charged, by kind (pilotd's sessions, read just after)."""
    row: dict[str, Any] = {"at_s": round(now, 3), "bytes": value}
    if gpu:
        row.update({k: gpu.get(k, 0) for k in ("persistent", "lane_bytes", "outside", "used")},
                   lanes=[{"lane": lane["lane"], "size": lane["size"],
                           "jobs": [j["job"] for j in lane["jobs"]]} for lane in gpu["lanes"]],
                   jobs=[{k: j.get(k) for k in ("session", "pid", "lane", "persistent", "ephemeral",
                                                 "recognized", "running")} for j in gpu["jobs"]])
    row["charged"] = {str(x.get("pid")): x.get("charged") or {} for x in sessions if x.get("gpu", 0) == 0}
    return row


def describe_peak(name: str, row: dict[str, Any] | None) -> str:
    """One line: the largest reading of `name`, when, and the lanes' terms then."""
    if not row:
        return f"largest {name}: none seen"
    text = f"largest {name} {row['bytes'] / GIB:.2f} GiB at {row['at_s']:.2f} s"
    if "used" in row:
        text += (f" (lanes then: sum(P) {row['persistent'] / GIB:.2f} + sum(L) {row['lane_bytes'] / GIB:.2f}"
                 f" + outside {row['outside'] / GIB:.2f} = {row['used'] / GIB:.2f} GiB, "
                 f"{len(row['lanes'])} lanes, {sum(j['running'] for j in row['jobs'])} running)")
    kinds: dict[str, int] = {}
    for charged in row.get("charged", {}).values():
        for kind, n in charged.items():
            kinds[kind] = kinds.get(kind, 0) + n
    if kinds:  # e.g. a module load charged someone else's allocation (issue 30)
        text += "; charged: " + ", ".join(f"{k} {n / GIB:.2f} GiB" for k, n in sorted(kinds.items()))
    return text


def shim_path() -> str:
    out = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def run_jobs(daemon: Daemon, specs: list[JobSpec], exe: Path, sim: bool, declare: bool = True,
             timeout: float = 600.0) -> tuple[list[Result], Poller]:
    """Start each job at its arrival, wait for all; results and the poller's readings. Each
    job's output is kept in the daemon's work directory (jobs/NAME.out)."""
    shim = shim_path()
    t0 = time.monotonic()
    poller = Poller(daemon, t0)
    poller.start()
    results = [Result(s) for s in specs]
    procs: dict[int, tuple[Result, subprocess.Popen[str]]] = {}
    pending = sorted(results, key=lambda r: r.spec.arrival)
    out_dir = daemon.workdir / "jobs"
    out_dir.mkdir(exist_ok=True)
    while pending or procs:
        now = time.monotonic() - t0
        while pending and pending[0].spec.arrival <= now:
            r = pending.pop(0)
            out = (out_dir / f"{r.spec.name}.out").open("w+")
            p = subprocess.Popen(r.spec.command(exe, sim), env=r.spec.env(daemon, shim, declare),
                                 stdout=out, stderr=subprocess.STDOUT, text=True)
            r.started, r.pid = now, p.pid
            procs[p.pid] = (r, p)
        for pid, (r, p) in list(procs.items()):
            if p.poll() is not None:
                r.ended, r.rc = time.monotonic() - t0, p.returncode
                r.output = (out_dir / f"{r.spec.name}.out").read_text()
                r.first_ran = poller.first_running.get(pid)
                del procs[pid]
                if r.rc and REFUSED in r.output and not r.retried:
                    # pilotd's router sometimes refuses a HELLO racing another connection's
                    # close as a reused pid: start the job again, once, and say so.
                    print(f"{r.spec.name}: {REFUSED}; started again", flush=True)
                    r.retried = True
                    again = subprocess.Popen(r.spec.command(exe, sim), env=r.spec.env(daemon, shim, declare),
                                             stdout=(out_dir / f"{r.spec.name}.out").open("w+"),
                                             stderr=subprocess.STDOUT, text=True)
                    procs[again.pid] = (r, again)
                    r.pid = again.pid
        if now > timeout:
            for _r, p in procs.values():
                p.kill()
        time.sleep(0.01)
    poller.stop.set()
    poller.join(5)
    return results, poller


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = min(len(v) - 1, max(0, round(q * (len(v) - 1))))
    return v[k]
