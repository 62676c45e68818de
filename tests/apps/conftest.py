"""Fixtures for the CUDA test programs: build them once, run a sim daemon, run them under pilot.

- `app_binaries`: every tests/apps/*.cu built with `nvcc -cudart shared -O2` (two at a time);
  skips everything that needs it when nvcc is missing.
- `pilotd`: one `pilotd --backend sim` for the session, serving tests/apps/sim_kernels.py.
- `pilot_client_env`: the environment of a program under pilot (LD_PRELOAD, PILOT_SOCKET).
- `run_under_pilot(prog, *args, timeout=60, env=None)`: runs a built program in that
  environment, returns the CompletedProcess (text mode).
- `daemon_log()`: the tail of the daemon's output, for failure messages.
- `pilot_sessions()`: `pilot sessions --json` against the session's daemon, parsed.
- `start_pilotd(*args, config=None)`: a sim daemon of the test's own (its own socket and
  --state-dir), started with extra pilotd arguments and an optional TOML config text; returns an
  `OwnDaemon` (log, sessions, pilotctl, quota); stopped when the test ends.

The daemons themselves, and what a test module imports (OwnDaemon, PILOTCTL, the type aliases),
are in apps_daemons.py: a test module that imported them `from conftest` got whichever folder's
conftest pytest had collected last.

PILOT_APPS_NATIVE=1 runs the programs without pilot, on the machine's own GPU and libcudart,
to check the expected outputs against real CUDA; tests that need the shim or the daemon skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from apps_daemons import (  # pytest puts tests/apps on sys.path
    APPS_DIR,
    BENCH_DIR,
    GPU_DIR,
    NATIVE,
    NVCC,
    PILOT,
    PILOTD,
    READY_TIMEOUT_S,
    SIM_KERNEL_FILES,
    STOP_TIMEOUT_S,
    OwnDaemon,
    RunUnderPilot,
    StartPilotd,
    clean_env,
    list_sessions,
    stop_process,
)

# name -> source; the two tests/gpu programs are self-checking and also run on the H100.
SOURCES = {name: APPS_DIR / f"{name}.cu" for name in
           ("vector_add", "kernel_args", "copies", "memset", "streams_events", "errors", "threads",
            "alloc", "symbols", "runtime_misc", "managed", "callbacks", "ptds", "multidev",
            "launch_ex", "scrub", "pinned", "quota_paths", "footprint", "liveness", "devices",
            "fault", "mempool", "launch_order", "func_info", "arrays", "driver_api", "graphs",
            "graph_mem", "graph_params", "graph_launch", "device_printf", "cublas_gemm",
            "cublas_level", "cudnn_conv", "entry_point", "small_managed", "preload", "device_reset",
            "rings", "free_async", "words", "ipc", "linker", "driver_host")}
SOURCES |= {name: GPU_DIR / f"{name}.cu" for name in ("matmul_tiled", "multistream")}
SOURCES["ptds_per_thread"] = APPS_DIR / "ptds.cu"  # the same source, per-thread default streams
SOURCES["driver_api_ptds"] = APPS_DIR / "driver_api.cu"  # the driver's _ptsz/_ptds forms
SOURCES["preload_many"] = APPS_DIR / "preload.cu"  # the same source with 40 kernels more
# PILOT's pageDoS and a streaming Unified Memory workload (bench/uvm), for the memory policies
SOURCES |= {"pagedos": BENCH_DIR / "uvm" / "pagedos.cu", "uvm_stream": BENCH_DIR / "uvm" / "stream.cu"}
PROGRAMS = tuple(SOURCES)
NVCC_FLAGS = ("-cudart", "shared", "-O2", "-Wno-deprecated-gpu-targets")
EXTRA_FLAGS = {"ptds_per_thread": ("-default-stream", "per-thread"),
               "driver_api_ptds": ("-default-stream", "per-thread"), "preload_many": ("-DMANY_KERNELS",)}
# driver_api.cu calls the driver API: it embeds the fatbin of driver_kernels.cu, loads the cubin
# built next to it (driver_kernels.cubin, its argument) and links with -lcuda (the toolkit's stub
# if it has one, else pilot's own libpilot-cuda.so, whose SONAME is libcuda.so.1).
DRIVER_KERNELS = APPS_DIR / "driver_kernels.cu"


def _driver_flags(nvcc: str, out_dir: Path) -> tuple[list[str], str]:
    """Builds driver_kernels.cubin and .fatbin into out_dir; returns driver_api's extra nvcc
    flags and the output of the builds."""
    out = ""
    for kind in ("cubin", "fatbin"):
        proc = subprocess.run([nvcc, f"-{kind}", "-arch=sm_90", "-o",
                               str(out_dir / f"driver_kernels.{kind}"), str(DRIVER_KERNELS)],
                              capture_output=True, text=True, timeout=600)
        out += proc.stdout + proc.stderr
    return [f"-DDRV_FATBIN={out_dir / 'driver_kernels.fatbin'}", "-arch=sm_90",
            *_libcuda_flags(out_dir)], out


def _libcuda_flags(out_dir: Path) -> list[str]:
    """-lcuda: the toolkit's stub if it has one, else pilot's own libpilot-cuda.so (SONAME
    libcuda.so.1)."""
    stub = Path(NVCC).resolve().parent.parent / "lib64" / "stubs"
    if not (stub / "libcuda.so").exists():
        from pilot.shim import driver_path
        stub = out_dir / "libcuda-link"
        stub.mkdir(exist_ok=True)
        link = stub / "libcuda.so"
        if not link.exists():
            link.symlink_to(driver_path())
    return ["-L", str(stub), "-lcuda"]
def _blas_flags(out_dir: Path) -> list[str]:
    """cublas_gemm and cublas_level link -lcublas -lcublasLt: the toolkit's where it has them (the H100), else
    pilot's stand-ins, whose SONAMEs are NVIDIA's (the program then needs them preloaded)."""
    lib = Path(NVCC).resolve().parent.parent / "lib64"
    if (lib / "libcublas.so").exists() and (lib / "libcublasLt.so").exists():
        return ["-L", str(lib), "-lcublasLt", "-lcublas"]
    from pilot.shim import standin_path
    link = out_dir / "cublas-link"
    link.mkdir(exist_ok=True)
    for soname, name in (("libcublas.so.13", "libcublas.so"), ("libcublasLt.so.13", "libcublasLt.so")):
        if not (link / name).exists():
            (link / name).symlink_to(standin_path(soname))
    return ["-L", str(link), "-lcublasLt", "-lcublas"]


def _dnn_flags(out_dir: Path) -> list[str]:
    """cudnn_conv links -lcudnn: pilot's stand-in, whose SONAME is NVIDIA's libcudnn.so.9 (cuDNN
    is not in the toolkit). Natively (the H100) LD_LIBRARY_PATH finds NVIDIA's library; under
    pilot the stand-in is preloaded."""
    from pilot.shim import standin_path
    link = out_dir / "cudnn-link"
    link.mkdir(exist_ok=True)
    if not (link / "libcudnn.so").exists():
        (link / "libcudnn.so").symlink_to(standin_path("libcudnn.so.9"))
    return ["-L", str(link), "-lcudnn"]


@dataclass
class Build:
    """What nvcc made of one program."""

    exe: Path
    command: list[str]
    output: str  # nvcc's stdout and stderr


@pytest.fixture(scope="session")
def app_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    """Build every program once. Fails (with nvcc's output) if any does not compile."""
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA test programs cannot be built")
    nvcc = NVCC
    out_dir = tmp_path_factory.mktemp("apps-bin")

    # driver_api and driver_api_ptds embed and load the same driver kernels: built once, first
    driver_flags, driver_pre = _driver_flags(nvcc, out_dir)

    def build(name: str) -> tuple[str, Build, int]:
        exe = out_dir / name
        extra, pre = list(EXTRA_FLAGS.get(name, ())), ""
        if name in ("driver_api", "driver_api_ptds"):
            extra += driver_flags
            pre = driver_pre
        if name in ("linker", "driver_host"):
            extra += _libcuda_flags(out_dir)
        if name.startswith("cublas_"):
            extra += _blas_flags(out_dir)
        if name.startswith("cudnn_"):
            extra += _dnn_flags(out_dir)
        cmd = [nvcc, *NVCC_FLAGS, *extra, "-o", str(exe), str(SOURCES[name])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        return name, Build(exe, cmd, pre + proc.stdout + proc.stderr), proc.returncode

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, PROGRAMS))
    failed = [f"$ {' '.join(b.command)}\n{b.output}" for _, b, rc in results if rc != 0]
    if failed:
        pytest.fail("nvcc failed:\n" + "\n".join(failed), pytrace=False)
    return {name: b for name, b, _ in results}


@pytest.fixture(scope="session")
def app_binaries(app_builds: dict[str, Build]) -> dict[str, Path]:
    return {name: b.exe for name, b in app_builds.items()}


@pytest.fixture(scope="session")
def shim_path() -> str:
    """Absolute path of libpilot.so, from `pilot shim-path`."""
    if NATIVE:
        pytest.skip("PILOT_APPS_NATIVE=1: no shim")
    proc = subprocess.run([*PILOT, "shim-path"], capture_output=True, text=True, timeout=60)
    path = proc.stdout.strip()
    if proc.returncode != 0 or not path:
        pytest.fail(f"`pilot shim-path` failed (rc {proc.returncode}):\n{proc.stderr}",
                    pytrace=False)
    if not os.path.isabs(path) or not os.path.isfile(path):
        pytest.fail(f"`pilot shim-path` printed {path!r}: not an absolute path to a file",
                    pytrace=False)
    return path


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    socket: str
    log: list[str] = field(default_factory=list)  # stdout and stderr lines, as they came

    def log_tail(self, lines: int = 40) -> str:
        return "".join(self.log[-lines:])


@pytest.fixture(scope="session")
def pilotd() -> Iterator[Daemon]:
    """A sim daemon for the whole session; waits for its `pilotd ready` line."""
    if NATIVE:
        pytest.skip("PILOT_APPS_NATIVE=1: no daemon")
    workdir = tempfile.mkdtemp(prefix="pilot-apps-")  # short: unix socket paths max 107 bytes
    socket = os.path.join(workdir, "pilot.sock")
    cmd = [*PILOTD, "--backend", "sim", "--socket", socket,
           "--state-dir", os.path.join(workdir, "state"), "--metrics-address", "",
           *(arg for path in SIM_KERNEL_FILES for arg in ("--sim-kernels", str(path)))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env())
    daemon = Daemon(proc, socket)
    ready = threading.Event()

    def pump() -> None:  # keeps the pipe drained for the daemon's whole life
        assert proc.stdout is not None
        for line in proc.stdout:
            daemon.log.append(line)
            if "pilotd ready" in line:
                ready.set()

    reader = threading.Thread(target=pump, name="pilotd-log", daemon=True)
    reader.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (f"exited with {proc.returncode}" if proc.poll() is not None
                   else f"printed no 'pilotd ready' within {READY_TIMEOUT_S:.0f} s")
            stop_process(proc)
            reader.join(5)
            shutil.rmtree(workdir, ignore_errors=True)
            pytest.fail(f"pilotd {why}\n$ {' '.join(cmd)}\n{daemon.log_tail(200)}",
                        pytrace=False)
    try:
        yield daemon
    finally:
        early_exit = proc.poll()
        killed = stop_process(proc)
        reader.join(5)
        shutil.rmtree(workdir, ignore_errors=True)
        if early_exit is not None:
            pytest.fail(f"pilotd exited with {early_exit} while tests were running\n"
                        f"{daemon.log_tail(200)}", pytrace=False)
        if killed:
            pytest.fail(f"pilotd ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s and was killed\n"
                        f"{daemon.log_tail()}", pytrace=False)


@pytest.fixture
def pilot_client_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment of a program run under pilot: LD_PRELOAD and PILOT_SOCKET set (nothing
    added with PILOT_APPS_NATIVE=1)."""
    env = clean_env()
    if not NATIVE:
        daemon: Daemon = request.getfixturevalue("pilotd")
        env.update(LD_PRELOAD=request.getfixturevalue("shim_path"), PILOT_SOCKET=daemon.socket)
    return env


@pytest.fixture
def daemon_log(request: pytest.FixtureRequest) -> Callable[[], str]:
    """daemon_log() -> the last lines the session's daemon printed."""
    if NATIVE:
        return lambda: "(PILOT_APPS_NATIVE=1: no daemon)"
    daemon: Daemon = request.getfixturevalue("pilotd")
    return daemon.log_tail


@pytest.fixture
def kill_and_await_release(pilot_sessions: Callable[[], list[dict[str, Any]]],
                           pilotd: Daemon) -> Callable[[subprocess.Popen[str]], None]:
    """kill_and_await_release(proc): SIGKILL a client of the session's daemon; its session must
    be gone from `pilot sessions` within 2 s, and the daemon still running."""

    def kill(proc: subprocess.Popen[str], within: float = 2.0) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + within
        while any(s["pid"] == proc.pid for s in pilot_sessions()):
            assert time.monotonic() < deadline, pilotd.log_tail()
            time.sleep(0.02)
        assert pilotd.proc.poll() is None, pilotd.log_tail()

    return kill


StartedClient = Callable[[list[str], dict[str, str], str],
                         "contextlib.AbstractContextManager[tuple[subprocess.Popen[str], list[str]]]"]


@pytest.fixture
def started_client() -> StartedClient:
    """with started_client(argv, env, marker) as (proc, before): the program runs, its stdout read
    up to the line `marker` (`before`: the lines ahead of it); killed and reaped at the end if it
    still runs, its pipes closed."""

    @contextlib.contextmanager
    def start(argv: list[str], env: dict[str, str],
              marker: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None
            before: list[str] = []
            line = proc.stdout.readline()
            while line and line != marker:
                before.append(line)
                line = proc.stdout.readline()
            assert line == marker, (before, proc.stderr.read() if proc.stderr else "")
            yield proc, before
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    return start


@pytest.fixture
def run_under_pilot(app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
                    daemon_log: Callable[[], str]) -> RunUnderPilot:
    """run_under_pilot(prog, *args, timeout=60, env=None) -> CompletedProcess with text
    stdout/stderr. `env` adds or overrides variables. A run past `timeout` fails the test with
    what the program had printed and the daemon's log."""

    def run(prog: str, *args: str, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(app_binaries[prog]), *args]
        try:
            return subprocess.run(cmd, env={**pilot_client_env, **(env or {})},
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{prog} {' '.join(args)}: no exit within {timeout} s\n"
                        f"stdout:\n{_text(exc.stdout)}\nstderr:\n{_text(exc.stderr)}\n"
                        f"pilotd log:\n{daemon_log()}", pytrace=False)

    return run


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


@pytest.fixture
def pilot_sessions(pilotd: Daemon) -> Callable[[], list[dict[str, Any]]]:
    """pilot_sessions() -> the daemon's live sessions (`pilot sessions --json`)."""

    return lambda: list_sessions(pilotd.socket)


@pytest.fixture
def start_pilotd() -> Iterator[StartPilotd]:
    """start_pilotd(*args, config=None) -> a ready OwnDaemon of this test, stopped after it."""
    if NATIVE:
        pytest.skip("PILOT_APPS_NATIVE=1: no daemon")
    started: list[OwnDaemon] = []

    def start(*args: str, config: str | None = None) -> OwnDaemon:
        daemon = OwnDaemon(*args, config=config)
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.stop()
            daemon.remove()
