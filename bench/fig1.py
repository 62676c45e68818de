#!/usr/bin/env python3
"""PILOT Fig. 1: N processes of a VectorAdd on managed memory, bare CUDA vs MPS vs pilot.

    python3 bench/fig1.py --out /tmp/fig1                     # GPU: every mode, N = 1,2,4,8,16
    python3 bench/fig1.py --backend sim --mbytes 8 --launches 5 --n 1,2 --out /tmp/fig1-sim
                                                              # no GPU: pilot on the sim backend

Each process runs bench/fig1_vector_add.cu (built with `nvcc -cudart shared -O2 -arch=sm_90`):
three managed float arrays totalling --mbytes MiB (default 512), a and b initialised on the host,
--launches (400) launches of a grid-stride c = a + b with --blocks (16) blocks of --threads
(1024), timed with cudaEvents, then every element of c checked on the host. For each mode and
each N, N copies start at once; each allocates and initialises, then waits at a barrier (it
prints "fig1 ready" and reads "go" from stdin) until all N are ready, so that their kernel phases
overlap. One run per mode and N. Per process: kernel time (the events around the launches) and
wall time (the whole program less the wait at the barrier).

Modes, run in this order whatever the order of --modes:
  bare   the processes as they are
  pilot  a pilotd started here with its default configuration (an empty --config file; only
         plumbing: a private --socket and --state-dir, --metrics-address ''), the processes
         under LD_PRELOAD=libpilot.so; the daemon must list every process as a session before
         they are let go. --pilotd-arg adds daemon arguments (then the run is not the default).
  mps    nvidia-cuda-mps-control -d with private CUDA_MPS_PIPE_DIRECTORY/LOG_DIRECTORY, stopped
         after the mode (`quit`), also on failure; the GPU's settings are never changed. The
         control daemon must have started a server, or the processes did not use MPS.

Output: a markdown table (kernel and wall time per process, mean and max, per mode and N) and
the ratio of pilot's to MPS's mean kernel time at N = 8, PASS when at most --target (0.9).
--out DIR writes fig1.json (every process's values), fig1.md (the tables), fig1.png (kernel and
wall time per process against N, one line per mode; skipped with a warning without matplotlib)
and the daemons' logs.

Bounds: each run (N processes) is killed after --timeout seconds (90), and none goes on past
--budget seconds (360) from the start: the runs left are skipped. Before each run on a GPU the
script refuses to ask for more managed memory than the GPU has free (nvidia-smi, else pynvml):
N x (--mbytes + a context's allowance) must fit.

--backend sim runs the pilot mode only, against `pilotd --backend sim` with the kernel
emulation bench/fig1_sim_kernels.py: no GPU needed, for checking the script (keep it tiny).

Exit status: 0 when every run succeeded (a missed target is reported; with --fail-on-miss it
exits 3); 1 when a run failed or was skipped; 2 when nothing could be measured (build, shim, no
GPU, not enough GPU memory, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from pilotd_process import PilotdProcess, find_nvcc  # bench/pilotd_process.py, beside this script

BENCH_DIR = Path(__file__).resolve().parent
SOURCE = BENCH_DIR / "fig1_vector_add.cu"
SIM_KERNELS = BENCH_DIR / "fig1_sim_kernels.py"
MODES = ("bare", "pilot", "mps")  # the order they run in: MPS last, so nothing runs after it
NVCC_FLAGS = ("-cudart", "shared", "-O2")
READY_TIMEOUT_S = 90.0  # pilotd: imports, CUDA initialisation
STOP_TIMEOUT_S = 15.0
MPS_TIMEOUT_S = 30.0
CONTEXT_MIB = 640  # GPU memory allowed per process for its CUDA context, in the memory guard
RESULT_LINE = re.compile(r"^fig1 ((?:[a-z_]+=\S+ ?)+)$")
TARGET_N = 8


def log(msg: str) -> None:
    print(f"[fig1] {msg}", file=sys.stderr, flush=True)


# ---- results ----

@dataclass
class ProcResult:
    """One process of a run."""

    pid: int
    rc: int | None  # None: still running when killed
    values: dict[str, float]
    stderr: str
    vgpu: int | None = None  # pilot: the vGPU the daemon put the process on

    @property
    def ok(self) -> bool:
        return (self.rc == 0 and self.values.get("ok") == 1
                and "kernel_s" in self.values and "wall_s" in self.values)


@dataclass
class RunResult:
    """N processes of one mode, started together."""

    mode: str
    n: int
    error: str | None = None
    elapsed_s: float = 0.0
    procs: list[ProcResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.procs) == self.n and all(p.ok for p in self.procs)

    def values(self, key: str) -> list[float]:
        return [p.values[key] for p in self.procs if p.ok]


def parse_result(text: str, pattern: re.Pattern[str] = RESULT_LINE) -> dict[str, float]:
    """The `fig1 key=value ...` line of a process's stdout (the last one, if several); pattern's
    group 1 holds the pairs (policy_runner.py parses its `uvm ...` lines with it)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = pattern.match(line.strip())
        if m:
            values = {}
            for pair in m.group(1).split():
                key, _, val = pair.partition("=")
                try:
                    values[key] = float(val)
                except ValueError:
                    pass
    return values


# ---- building, the shim, the GPU ----

def build(out_dir: Path, arch: str) -> Path:
    exe = out_dir / "fig1_vector_add"
    cmd = [find_nvcc(), *NVCC_FLAGS, f"-arch={arch}", "-o", str(exe), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.stdout.strip() or proc.stderr.strip():
        log(f"nvcc said:\n{proc.stdout}{proc.stderr}")
    return exe


def find_shim(python: str, explicit: str | None) -> str:
    if explicit:
        path = explicit
    else:
        proc = subprocess.run([python, "-m", "pilot.cli.pilot", "shim-path"],
                              capture_output=True, text=True, timeout=60, env=clean_env())
        if proc.returncode != 0:
            raise RuntimeError(f"`{python} -m pilot.cli.pilot shim-path` failed "
                               f"(rc {proc.returncode}): {proc.stderr.strip()}")
        path = proc.stdout.strip()
    if not os.path.isabs(path) or not os.path.isfile(path):
        raise RuntimeError(f"shim {path!r} is not an absolute path to a file")
    return path


@dataclass
class Gpu:
    name: str
    driver: str
    free_mib: int  # the least free memory of the GPUs listed
    total_mib: int


def query_gpu() -> Gpu:
    """The GPUs' free memory, from nvidia-smi, else pynvml. Raises RuntimeError when neither
    finds a GPU."""
    why = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.free,memory.total",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
            rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines()
                    if line.strip()]
            if proc.returncode == 0 and rows and all(len(r) == 4 for r in rows):
                return Gpu(rows[0][0], rows[0][1], min(int(float(r[2])) for r in rows),
                           min(int(float(r[3])) for r in rows))
            why.append(f"nvidia-smi: rc {proc.returncode}: {(proc.stdout + proc.stderr).strip()}")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            why.append(f"nvidia-smi: {exc}")
    else:
        why.append("nvidia-smi not found")
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise RuntimeError("no GPU")
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            mems = [pynvml.nvmlDeviceGetMemoryInfo(h) for h in handles]
            name = pynvml.nvmlDeviceGetName(handles[0])
            driver = pynvml.nvmlSystemGetDriverVersion()
            return Gpu(name.decode() if isinstance(name, bytes) else str(name),
                       driver.decode() if isinstance(driver, bytes) else str(driver),
                       min(m.free for m in mems) >> 20, min(m.total for m in mems) >> 20)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # ImportError, NVMLError: no GPU to be had through it either
        why.append(f"pynvml: {type(exc).__name__}: {exc}")
    raise RuntimeError("no GPU found (" + "; ".join(why) + ")")


def memory_guard(n: int, mbytes: int) -> str | None:
    """Why N processes must not run now (not enough free GPU memory), or None."""
    gpu = query_gpu()
    need = n * (mbytes + CONTEXT_MIB)
    if need > gpu.free_mib:
        return (f"{n} processes x ({mbytes} MiB managed + {CONTEXT_MIB} MiB context) = {need} "
                f"MiB, but the GPU has {gpu.free_mib} MiB free: not running")
    return None


def clean_env() -> dict[str, str]:
    """This process's environment without preloads, pilot's socket or MPS settings."""
    drop = ("LD_PRELOAD", "LD_DEBUG", "PILOT_SOCKET", "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_LOG_DIRECTORY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def system_mps_running() -> bool:
    """A control daemon at the default pipe directory, which bare processes would use."""
    try:
        pid = int(Path("/tmp/nvidia-mps/nvidia-cuda-mps-control.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Running and not a zombie (a daemon's parent, in a container, may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


# ---- the daemons ----

def as_user(uid: int) -> Callable[[], None]:
    """A preexec_fn that makes the child another user (uid and gid `uid`, no groups)."""
    def switch() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return switch


def user_env(uid: int, home: Path) -> dict[str, str]:
    """A home and a name for a uid without a passwd entry (getpass reads USER before pwd)."""
    return {"HOME": str(home), "USER": f"u{uid}", "LOGNAME": f"u{uid}"}


class Pilotd(PilotdProcess):
    """`python -m pilot.daemon` with the default configuration (or `config`, a TOML text),
    output pumped to a file."""

    def __init__(self, python: str, backend: str, workdir: Path, log_path: Path,
                 extra_args: list[str], config_text: str = "# empty: pilotd's defaults\n") -> None:
        self.socket = str(workdir / "pilot.sock")
        config = workdir / "pilotd.toml"
        config.write_text(config_text)
        cmd = [python, "-m", "pilot.daemon", "--config", str(config), "--backend", backend,
               "--socket", self.socket, "--state-dir", str(workdir / "state"),
               "--metrics-address", ""]
        if backend == "sim":
            cmd += ["--sim-kernels", str(SIM_KERNELS)]
        super().__init__([*cmd, *extra_args], log_path, clean_env(), log)

    def sessions(self, python: str) -> list[dict[str, Any]]:
        """`pilot sessions --json`."""
        env = {**clean_env(), "PILOT_SOCKET": self.socket}
        proc = subprocess.run([python, "-m", "pilot.cli.pilot", "sessions", "--json"], env=env,
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"`pilot sessions --json` failed (rc {proc.returncode}): "
                               f"{proc.stderr.strip()}")
        listed = json.loads(proc.stdout)
        if not isinstance(listed, list):
            raise RuntimeError(f"`pilot sessions --json` printed {proc.stdout!r}")
        return listed


class Mps:
    """A private MPS control daemon: its own pipe and log directories under workdir."""

    def __init__(self, control: str, workdir: Path) -> None:
        self.control = control
        self.pipe_dir = workdir / "mps-pipe"
        self.log_dir = workdir / "mps-log"
        self.pipe_dir.mkdir()
        self.log_dir.mkdir()
        self.env = {**clean_env(), "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                    "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        self.pid: int | None = None
        self.servers_seen: set[int] = set()

    def command(self, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.control], input=text + "\n", env=self.env,
                              capture_output=True, text=True, timeout=MPS_TIMEOUT_S)

    def start(self) -> None:
        proc = subprocess.run([self.control, "-d"], env=self.env, capture_output=True, text=True,
                              timeout=MPS_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"`{self.control} -d` failed (rc {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr).strip()}\n{self.log_tail()}")
        pid_file = self.pipe_dir / "nvidia-cuda-mps-control.pid"
        deadline = time.monotonic() + MPS_TIMEOUT_S
        while True:
            try:
                self.pid = int(pid_file.read_text().strip())
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the MPS control daemon wrote no {pid_file} within "
                                       f"{MPS_TIMEOUT_S:.0f} s\n{self.log_tail()}") from None
                time.sleep(0.1)
        self.servers()  # it answers
        log(f"MPS control daemon {self.pid} up (pipes {self.pipe_dir}, logs {self.log_dir})")

    def servers(self) -> list[int]:
        proc = self.command("get_server_list")
        if proc.returncode != 0:
            raise RuntimeError(f"MPS get_server_list failed (rc {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr).strip()}")
        pids = [int(w) for w in proc.stdout.split() if w.isdigit()]
        self.servers_seen.update(pids)
        return pids

    def stop(self) -> None:
        """`quit`, then wait for the control daemon and its servers to exit (SIGTERM, SIGKILL
        to those pids if they do not)."""
        if self.pid is None:
            return
        try:
            self.servers()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log(f"MPS: {exc}")
        try:
            proc = self.command("quit")
            if proc.returncode != 0:
                log(f"MPS quit: rc {proc.returncode}: {(proc.stdout + proc.stderr).strip()}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"MPS quit: {exc}")
        pids = [self.pid, *sorted(self.servers_seen)]
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                for pid in pids:
                    if pid_alive(pid):
                        log(f"MPS process {pid} still running: {sig.name}")
                        try:
                            os.kill(pid, sig)
                        except OSError:
                            pass
            deadline = time.monotonic() + (MPS_TIMEOUT_S if sig is None else 5.0)
            while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not any(pid_alive(p) for p in pids):
                log(f"MPS stopped (control {self.pid}, servers {sorted(self.servers_seen)})")
                self.pid = None
                return
        log(f"MPS processes {[p for p in pids if pid_alive(p)]} would not stop")
        self.pid = None

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for name in ("control.log", "server.log"):
            path = self.log_dir / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(out)

    def copy_logs(self, out_dir: Path) -> None:
        for name in ("control.log", "server.log"):
            path = self.log_dir / name
            if path.exists():
                shutil.copyfile(path, out_dir / f"mps-{name}")


# ---- one run: N processes at once ----

class Child:
    """One process of a run, its stdout and stderr pumped into lists."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.ready = threading.Event()
        self.threads = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.out, True),
                                         daemon=True),
                        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err, False),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _pump(self, stream: IO[str] | None, into: list[str], watch: bool) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)
            if watch and line.strip() == "fig1 ready":
                self.ready.set()

    def go(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died; its exit status tells

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def result(self) -> ProcResult:
        for t in self.threads:
            t.join(5)
        stdout = "".join(self.out)
        return ProcResult(self.proc.pid, self.proc.returncode, parse_result(stdout),
                          "".join(self.err)[-3000:])


BeforeGo = Callable[[list[Child]], dict[int, int]]


def run_group(mode: str, n: int, cmd: list[str], env: dict[str, str], timeout: float,
              before_go: BeforeGo | None = None) -> RunResult:
    """N copies of cmd (with --barrier), let go together once all are ready; killed at timeout.
    before_go(children) may check them while they wait and return pid -> vGPU."""
    run = RunResult(mode, n)
    started = time.monotonic()
    deadline = started + timeout
    children: list[Child] = []
    placement: dict[int, int] = {}
    try:
        for _ in range(n):
            children.append(Child(cmd, env))
        while not all(c.ready.is_set() for c in children):
            dead = [c for c in children if c.proc.poll() is not None and not c.ready.is_set()]
            if dead:
                run.error = f"{len(dead)} process(es) exited before the barrier"
                break
            if time.monotonic() > deadline:
                ready = sum(c.ready.is_set() for c in children)
                run.error = f"only {ready} of {n} processes ready within {timeout:.0f} s"
                break
            time.sleep(0.01)
        if run.error is None and before_go is not None:
            try:
                placement = before_go(children)
            except (RuntimeError, OSError, ValueError, KeyError, TypeError,
                    subprocess.TimeoutExpired) as exc:
                run.error = f"{type(exc).__name__}: {exc}" if isinstance(exc, (KeyError, TypeError)) \
                    else str(exc)
        if run.error is None:
            for c in children:
                c.go()
        for c in children:
            c.close_stdin()  # without "go": the process exits with 3
        for c in children:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if run.error is None:
                    run.error = f"killed after {timeout:.0f} s"
                break
    finally:
        for c in children:
            c.kill()
        for c in children:
            try:
                c.proc.wait(30)
            except subprocess.TimeoutExpired:
                log(f"process {c.proc.pid} survives SIGKILL (stuck in the driver?)")
        run.elapsed_s = time.monotonic() - started
    run.procs = [c.result() for c in children]
    for p in run.procs:
        p.vgpu = placement.get(p.pid)
    failed = [p for p in run.procs if not p.ok]
    if run.error is None and failed:
        run.error = f"{len(failed)} of {n} processes failed"
    return run


def pilot_check(daemon: Pilotd, python: str) -> BeforeGo:
    """Before the go: every process must be a session of the daemon (the shim is in)."""

    def check(children: list[Child]) -> dict[int, int]:
        listed = {int(s["pid"]): int(s.get("vgpu", -1)) for s in daemon.sessions(python)}
        missing = [c.proc.pid for c in children if c.proc.pid not in listed]
        if missing:
            raise RuntimeError(f"processes {missing} are not sessions of pilotd: the shim is "
                               "not in them")
        return {c.proc.pid: listed[c.proc.pid] for c in children}

    return check


def mps_check(mps: Mps) -> BeforeGo:
    """Before the go: the control daemon has started a server for the processes."""

    def check(children: list[Child]) -> dict[int, int]:
        if not mps.servers():
            raise RuntimeError("the MPS control daemon runs no server: the processes do not "
                               f"use MPS\n{mps.log_tail()}")
        return {}

    return check


# ---- the modes ----

@contextmanager
def mode_env(mode: str, args: argparse.Namespace, workdir: Path, out_dir: Path | None,
             shim: str | None) -> Iterator[tuple[dict[str, str], BeforeGo | None, Callable[[], str | None]]]:
    """(environment of the processes, check before the go, check between runs) of a mode; starts
    and stops its daemon."""
    if mode == "bare":
        yield clean_env(), None, lambda: None
        return
    if mode == "pilot":
        assert shim is not None
        log_dir = out_dir or workdir
        daemon = Pilotd(args.python, args.backend, workdir, log_dir / "pilotd-fig1.log",
                        args.pilotd_arg)
        try:
            daemon.wait_ready(READY_TIMEOUT_S)
            log(f"pilotd ({args.backend}) ready on {daemon.socket}: $ {shlex.join(daemon.cmd)}")
            env = {**clean_env(), "LD_PRELOAD": shim, "PILOT_SOCKET": daemon.socket}

            def between() -> str | None:
                return None if daemon.alive() else f"pilotd died:\n{daemon.tail()}"

            yield env, pilot_check(daemon, args.python), between
        finally:
            daemon.stop()
        return
    control = shutil.which(args.mps_control) or (args.mps_control if os.path.isabs(args.mps_control)
                                                 and os.path.exists(args.mps_control) else None)
    if control is None:
        raise RuntimeError(f"{args.mps_control} not found: cannot run the mps mode")
    mps = Mps(control, workdir)
    try:
        mps.start()
        env = {**clean_env(), "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir),
               "CUDA_MPS_LOG_DIRECTORY": str(mps.log_dir)}

        def between() -> str | None:
            return None if mps.pid is not None and pid_alive(mps.pid) else "MPS control daemon died"

        yield env, mps_check(mps), between
    finally:
        mps.stop()
        if out_dir is not None:
            mps.copy_logs(out_dir)


def run_mode(mode: str, args: argparse.Namespace, exe: Path, shim: str | None, workdir: Path,
             out_dir: Path | None, t_start: float) -> list[RunResult]:
    cmd = [str(exe), str(args.mbytes), str(args.launches), str(args.blocks), str(args.threads),
           "--barrier"]
    runs: list[RunResult] = []
    mode_dir = workdir / mode
    mode_dir.mkdir()
    try:
        with mode_env(mode, args, mode_dir, out_dir, shim) as (env, before_go, between):
            for n in args.n:
                left = args.budget - (time.monotonic() - t_start)
                if left < 10:
                    runs.append(RunResult(mode, n, error=f"skipped: the {args.budget:.0f} s budget "
                                                         "is spent"))
                    log(f"{mode} N={n}: {runs[-1].error}")
                    continue
                why = between()
                if why is None and args.backend == "cuda":
                    why = memory_guard(n, args.mbytes)
                if why is not None:
                    runs.append(RunResult(mode, n, error=why))
                    log(f"{mode} N={n}: {why}")
                    continue
                run = run_group(mode, n, cmd, env, min(args.timeout, left), before_go)
                runs.append(run)
                report_run(run)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        log(f"{mode}: {exc}")
        done = {r.n for r in runs}
        runs += [RunResult(mode, n, error=f"{mode} could not run: {str(exc).splitlines()[0]}")
                 for n in args.n if n not in done]
    return runs


def report_run(run: RunResult) -> None:
    k, w = run.values("kernel_s"), run.values("wall_s")
    status = "ok" if run.ok else f"FAILED: {run.error}"
    shown = (f"kernel_s mean {statistics.fmean(k):.3f} max {max(k):.3f}, wall_s mean "
             f"{statistics.fmean(w):.3f} max {max(w):.3f}" if k else "no values")
    log(f"{run.mode:5} N={run.n:<2} {status} ({run.elapsed_s:.1f} s): {shown}")
    if not run.ok:
        for p in run.procs:
            if not p.ok:
                log(f"  pid {p.pid} rc {p.rc} values {p.values}\n{p.stderr.rstrip()}")


# ---- reporting ----

def stats(runs: list[RunResult], mode: str, n: int, key: str) -> tuple[float, float] | None:
    """(mean, max) of key over the processes of mode's run at N, if that run succeeded."""
    for r in runs:
        if r.mode == mode and r.n == n and r.ok:
            vals = r.values(key)
            return statistics.fmean(vals), max(vals)
    return None


def ratio_at(runs: list[RunResult], n: int) -> float | None:
    pilot, mps = stats(runs, "pilot", n, "kernel_s"), stats(runs, "mps", n, "kernel_s")
    if pilot is None or mps is None or mps[0] <= 0:
        return None
    return pilot[0] / mps[0]


def cell(v: tuple[float, float] | None) -> str:
    return "-" if v is None else f"{v[0]:.3f} ({v[1]:.3f})"


def table(runs: list[RunResult], modes: list[str], ns: list[int]) -> str:
    head = (["N"] + [f"{m} kernel" for m in modes] + [f"{m} wall" for m in modes]
            + (["pilot/MPS kernel"] if {"pilot", "mps"} <= set(modes) else []))
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
    for n in ns:
        row = [str(n)]
        row += [cell(stats(runs, m, n, "kernel_s")) for m in modes]
        row += [cell(stats(runs, m, n, "wall_s")) for m in modes]
        if {"pilot", "mps"} <= set(modes):
            r = ratio_at(runs, n)
            row.append("-" if r is None else f"{r:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def per_process_table(runs: list[RunResult]) -> str:
    lines = ["| mode | N | kernel_s per process | wall_s per process | vGPUs |",
             "| --- | ---: | --- | --- | --- |"]
    for r in runs:
        if r.procs:
            k = ", ".join(f"{p.values['kernel_s']:.3f}" if p.ok else "failed" for p in r.procs)
            w = ", ".join(f"{p.values['wall_s']:.3f}" if p.ok else "failed" for p in r.procs)
        else:
            k = w = r.error or "-"
        vg = ",".join(str(p.vgpu) for p in r.procs if p.vgpu is not None) or "-"
        lines.append(f"| {r.mode} | {r.n} | {k} | {w} | {vg} |")
    return "\n".join(lines) + "\n"


def verdict(runs: list[RunResult], target: float) -> tuple[str, float | None]:
    r = ratio_at(runs, TARGET_N)
    if r is None:
        return f"pilot/MPS kernel time at N={TARGET_N}: n/a (no successful pilot and mps runs " \
               f"at N={TARGET_N})", None
    ok = "PASS" if r <= target else "FAIL"
    return (f"pilot/MPS kernel time at N={TARGET_N}: {r:.3f}x (target <= {target}x): {ok}", r)


def plot(runs: list[RunResult], modes: list[str], ns: list[int], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullLocator
    except ImportError as exc:
        log(f"warning: no plot ({exc})")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "kernel_s", "kernel time per process [s]"),
                           (axes[1], "wall_s", "wall time per process [s]")):
        for m in modes:
            pts = [(n, s) for n in ns for s in [stats(runs, m, n, key)] if s is not None]
            if not pts:
                continue
            line, = ax.plot([p[0] for p in pts], [p[1][0] for p in pts], marker="o",
                            label=f"{m} (mean)")
            ax.plot([p[0] for p in pts], [p[1][1] for p in pts], linestyle=":",
                    color=line.get_color(), label=f"{m} (max)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("processes (N)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---- main ----

def int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") \
            from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return vals


def mode_list(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in MODES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; not {', '.join(bad)}")
    return [m for m in MODES if m in vals]


def positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]))
    ap.add_argument("--modes", type=mode_list, default=None,
                    help="comma-separated, of bare, pilot, mps (default: all; with --backend sim: "
                         "pilot); they run in that order")
    ap.add_argument("--n", type=int_list, default=[1, 2, 4, 8, 16],
                    help="process counts (default 1,2,4,8,16)")
    ap.add_argument("--launches", type=positive, default=400, help="kernel launches (400)")
    ap.add_argument("--mbytes", type=positive, default=512,
                    help="MiB of managed memory per process, the three arrays together (512)")
    ap.add_argument("--blocks", type=positive, default=16, help="blocks per launch (16)")
    ap.add_argument("--threads", type=positive, default=1024, help="threads per block (1024)")
    ap.add_argument("--out", metavar="DIR", help="write fig1.json, fig1.md, fig1.png and logs here")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that runs pilotd and the pilot CLI (default: this one)")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda",
                    help="pilotd's backend; sim: pilot mode only, no GPU (default cuda)")
    ap.add_argument("--pilotd-arg", metavar="ARG", action="append", default=[],
                    help="extra pilotd argument (repeatable), e.g. --pilotd-arg=--vgpus-per-gpu=8; "
                         "the default configuration has none")
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control",
                    help="the MPS control program (default: from PATH)")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90)")
    ap.add_argument("--build-dir", metavar="DIR", help="build here (default: a temporary dir)")
    ap.add_argument("--shim", metavar="PATH", help="libpilot.so (default: `pilot shim-path`)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per run of N processes (90)")
    ap.add_argument("--budget", type=float, default=360.0,
                    help="seconds from the start after which no run goes on (360)")
    ap.add_argument("--target", type=float, default=0.9,
                    help="pilot/MPS kernel time at N=8 that passes (0.9)")
    ap.add_argument("--fail-on-miss", action="store_true", help="exit 3 when the target is missed")
    args = ap.parse_args(argv)
    if args.modes is None:
        args.modes = ["pilot"] if args.backend == "sim" else list(MODES)
    if args.backend == "sim" and args.modes != ["pilot"]:
        ap.error("--backend sim runs the pilot mode only (bare and mps need a GPU): "
                 "--modes pilot")
    args.n = sorted(set(args.n))
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: daemons stopped, processes killed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(tempfile.mkdtemp(prefix="pilot-fig1-"))  # short: socket paths max 107 bytes
    try:
        return fig1(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def fig1(args: argparse.Namespace, workdir: Path) -> int:
    t_start = time.monotonic()
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    gpu: Gpu | None = None
    try:
        if args.backend == "cuda":
            try:
                gpu = query_gpu()
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}: the bare, mps and pilot (cuda) modes need one; "
                                   "without a GPU use --backend sim (pilot mode only)") from None
            log(f"GPU {gpu.name}, driver {gpu.driver}, {gpu.free_mib} of {gpu.total_mib} MiB free")
            why = memory_guard(max(args.n), args.mbytes)
            if why:
                raise RuntimeError(why)
            if "bare" in args.modes and system_mps_running():
                log("warning: an MPS control daemon runs at /tmp/nvidia-mps: the bare processes "
                    "will use it")
        build_dir = Path(args.build_dir) if args.build_dir else workdir / "bin"
        build_dir.mkdir(parents=True, exist_ok=True)
        exe = build(build_dir, args.arch)
        log(f"built {exe} in {time.monotonic() - t_start:.1f} s")
        shim = find_shim(args.python, args.shim) if "pilot" in args.modes else None
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        log(str(exc))
        return 2

    runs: list[RunResult] = []
    for mode in args.modes:
        runs += run_mode(mode, args, exe, shim, workdir, out_dir, t_start)

    config = {"launches": args.launches, "mbytes": args.mbytes, "blocks": args.blocks,
              "threads": args.threads, "n": args.n, "modes": args.modes, "backend": args.backend,
              "pilotd_args": args.pilotd_arg, "arch": args.arch}
    pilot_cfg = ("default configuration" if not args.pilotd_arg
                 else "pilotd " + " ".join(args.pilotd_arg))
    header = (f"PILOT Fig. 1: N processes x VectorAdd, {args.mbytes} MiB managed, "
              f"{args.blocks} blocks x {args.threads} threads, {args.launches} launches; "
              f"one run; seconds per process, mean (max); pilot: {pilot_cfg}"
              + (f"; backend {args.backend}" if args.backend != "cuda" else "")
              + (f"; {gpu.name}, driver {gpu.driver}" if gpu else ""))
    text = table(runs, args.modes, args.n)
    line, ratio = verdict(runs, args.target)
    failed = [f"{r.mode} N={r.n}: {r.error}" for r in runs if not r.ok]
    print(f"\n{header}\n\n{text}\n{line}")
    if failed:
        print("failed runs:\n" + "\n".join(f"  {f}" for f in failed))
    log(f"done in {time.monotonic() - t_start:.0f} s")

    if out_dir is not None:
        (out_dir / "fig1.md").write_text(
            f"{header}\n\n{text}\n{line}\n\n"
            + (("failed runs:\n\n" + "\n".join(f"- {f}" for f in failed) + "\n\n") if failed else "")
            + "Per process:\n\n" + per_process_table(runs))
        (out_dir / "fig1.json").write_text(json.dumps({
            "config": config, "gpu": asdict(gpu) if gpu else None, "target": args.target,
            "ratio_pilot_mps_kernel_n8": ratio, "verdict": line,
            "summary": {m: {str(n): {k: stats(runs, m, n, k) for k in ("kernel_s", "wall_s")}
                            for n in args.n} for m in args.modes},
            "runs": [{"mode": r.mode, "n": r.n, "ok": r.ok, "error": r.error,
                      "elapsed_s": round(r.elapsed_s, 3),
                      "procs": [{"pid": p.pid, "rc": p.rc, "vgpu": p.vgpu, "values": p.values,
                                 "stderr": p.stderr if not p.ok else ""} for p in r.procs]}
                     for r in runs]}, indent=1))
        title = (f"PILOT Fig. 1: VectorAdd, {args.mbytes} MiB managed, {args.blocks}x{args.threads}, "
                 f"{args.launches} launches; pilot: {pilot_cfg}"
                 + (f"; {gpu.name}" if gpu else f"; backend {args.backend}"))
        if plot(runs, args.modes, args.n, out_dir / "fig1.png", title):
            log(f"wrote {out_dir / 'fig1.png'}")
        log(f"wrote {out_dir / 'fig1.md'}, {out_dir / 'fig1.json'}")
    if failed:
        return 1
    return 3 if args.fail_on_miss and ratio is not None and ratio > args.target else 0


if __name__ == "__main__":
    sys.exit(main())
