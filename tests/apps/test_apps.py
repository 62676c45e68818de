"""The CUDA test programs of tests/apps, run under pilot against a sim daemon.

Every expected line is computed here, independently of the programs (CI has no GPU to run
them natively): float32 math with numpy float32, sums in float64 in the programs' order,
formatted with C's printf formats. The error names are what the programs print natively on an
H100 (CUDA 13.0 runtime, driver 580.159): pilot has to report the same ones.
`PILOT_APPS_NATIVE=1 pytest tests/apps` on a GPU machine checks all of this against real CUDA.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest

from pilot.shim import driver_path

F32 = np.float32
MiB = 1 << 20
COPY_SIZES = (1, 3, 4096, 65535, 65536, 65537, MiB + 7, 16 * MiB, 64 * MiB + 1, 256 * MiB)

Sessions = Callable[[], list[dict[str, Any]]]
RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]
DaemonLog = Callable[[], str]


class Daemon(Protocol):
    """What the tests use of conftest's `pilotd` fixture."""

    proc: subprocess.Popen[str]

    def log_tail(self, lines: int = 40) -> str: ...


def check_output(proc: subprocess.CompletedProcess[str], expected: list[str],
                 daemon_log: DaemonLog) -> None:
    """The program exited 0 and printed exactly `expected` on stdout."""
    got = proc.stdout.splitlines()
    if proc.returncode == 0 and got == expected:
        return
    diff = [f"  line {i}: got {g!r}, want {w!r}"
            for i, (g, w) in enumerate(zip(got, expected, strict=False)) if g != w]
    if len(got) != len(expected):
        diff.append(f"  {len(got)} lines, want {len(expected)}")
    pytest.fail(f"{' '.join(map(str, proc.args))}: rc {proc.returncode}\n" + "\n".join(diff[:20])
                + f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
                + f"\npilotd log:\n{daemon_log()}", pytrace=False)


def cfmt(fmt: str, value: float) -> str:
    """printf formatting of one value (Python's % follows C for these conversions)."""
    return fmt % value


def seq_sum(values: np.ndarray) -> float:
    """`double sum = 0; for (...) sum += (double)v[i];` in the same order."""
    return float(np.cumsum(values.astype(np.float64))[-1])


# ---- expected outputs ----

def expected_vector_add() -> list[str]:
    n = 1 << 20
    i = np.arange(n)
    a = i.astype(F32) * F32(0.1)
    b = (i % 1024).astype(F32) * F32(1.5)
    c = a + b
    partial = np.zeros(n, dtype=F32)
    partial[:384] = c[:384]  # vadd<<<3, 128>>>(..., n)
    partial[1000:1300] = c[1000:1300]  # vadd<<<2, 256>>>(a+1000, ..., 300)
    return [
        f"n {n}",
        f"c[1] {cfmt('%.9g', c[1])}",
        f"c[777777] {cfmt('%.9g', c[777777])}",
        f"c[n-1] {cfmt('%.9g', c[n - 1])}",
        "mismatches 0",
        f"checksum {cfmt('%.17g', seq_sum(c))}",
        f"partial_nonzero {np.count_nonzero(partial)}",
        "partial_wrong 0",
        f"partial_checksum {cfmt('%.17g', seq_sum(partial))}",
        "PASS",
    ]


def expected_kernel_args() -> list[str]:
    s_a, s_b, s_c = -123456789, 3.141592653589793, (ord("x"), ord("y"), ord("z"))
    ch, sh, d, f = ord("Z"), -12345, -2.5e-300, F32(1.1)
    u = 0xFEDCBA9876543210
    ins = (2000000000, 2000000000, -7)
    big_f = [F32(k + 1) / F32(7.0) for k in range(5)]
    i0, last, before, after = 0x12345678, (1, -2, 2147483647), -99, ord("q")
    return [
        f"s.a {s_a}",
        f"s.b {cfmt('%.17g', s_b)}",
        "s.c {} {} {}".format(*s_c),
        f"ch {ch}",
        f"sh {sh}",
        f"d {cfmt('%.17g', d)}",
        f"f {cfmt('%.9g', f)}",
        f"f*1.5f {cfmt('%.9g', f * F32(1.5))}",
        f"u {u}",
        f"u^mask {u ^ 0xFFFFFFFF00000000}",
        f"u>>7 {u >> 7}",
        f"s.b+d {cfmt('%.17g', s_b + d)}",
        f"d*f {cfmt('%.17g', d * float(f))}",
        f"in_sum {sum(ins)}",
        f"sum_small {s_a + ch + sh}",
        "sizeof(Big) 104",
        f"big.tag {ord('T')}",
        f"big.d0 {cfmt('%.17g', 1.0 / 3.0)}",
        "big.s -1 32767 -32768",
        f"big.i0 {i0}",
        "big.name pilot-kernel",
        f"big.u {2**64 - 59}",
        "big.f " + " ".join(cfmt("%.9g", v) for v in big_f),
        f"big.tail {ord('!')}",
        f"big.d1 {cfmt('%.17g', -6.02214076e23)}",
        "big.last {} {} {}".format(*last),
        f"before {before} after {after} sum {sum(last) + i0 + before + after}",
        "noargs ok",
        "PASS",
    ]


def copy_pattern_sum(size: int, rnd: int) -> int:
    """Sum of the bytes (size + 7*rnd + 131*i) & 0xff, i < size: any 256 in a row sum to
    0 + 1 + ... + 255, since 131 is odd."""
    start = (size + 7 * rnd) & 0xFF
    tail = sum((start + 131 * i) & 0xFF for i in range(size % 256))
    return size // 256 * (255 * 256 // 2) + tail


def expected_copies(sizes: tuple[int, ...]) -> list[str]:
    return [f"size {s}: ok sum {copy_pattern_sum(s, 3)}" for s in sizes] + ["PASS"]


def expected_memset() -> list[str]:
    sizes = (0, 1, 7, 4096, 65537, MiB + 3)
    offsets = (0, 1, 13)
    values = (0, 0x7F, 0xFF, 0x1AB, -1, 256, 0x5A5A5A01)
    lines, case = [], 0
    for mode in ("sync", "async"):
        for size in sizes:
            for off in offsets:
                value = values[case % len(values)]
                case += 1
                lines.append(f"{mode} size {size} off {off} value {value} -> "
                             f"0x{value & 0xFF:02x}: ok")
    return [*lines, "PASS"]


def expected_streams_events() -> list[str]:
    n = 300000
    x = np.arange(n, dtype=F32) * F32(0.1) + F32(1.0)  # one float32 rounding per operation
    y = x * F32(3.3) - F32(0.7)
    return [
        "event query after sync: cudaSuccess",
        "stream query s1: cudaSuccess",
        "stream query s2: cudaSuccess",
        "event query untimed: cudaSuccess",
        "elapsed start->stop >= 0: yes",
        "elapsed start->produced >= 0: yes",
        "elapsed with disable-timing event: cudaErrorInvalidResourceHandle",
        "last error after that: cudaErrorInvalidResourceHandle",
        f"y[0] {cfmt('%.9g', y[0])} y[n-1] {cfmt('%.9g', y[n - 1])}",
        "wrong 0",
        f"checksum {cfmt('%.17g', seq_sum(y))}",
        "destroyed",
        "PASS",
    ]


VALID_COPY = "valid copy afterwards: ok"
ERROR_SCENARIOS: dict[str, list[str]] = {
    # CUDA 13.0 + driver 580 say cudaErrorInvalidValue for every bad launch shape.
    "launch_config": [
        "block of 2048 threads: cudaErrorInvalidValue",
        "last error again: cudaSuccess",
        "block of 32x32x2 threads: cudaErrorInvalidValue",
        "block z of 128: cudaErrorInvalidValue",
        "grid of 0 blocks: cudaErrorInvalidValue",
        "grid y of 65536: cudaErrorInvalidValue",
        "last error again: cudaSuccess",
        "valid launch: cudaSuccess",
        "synchronize: cudaSuccess",
        f"valid launch sum {3 * sum(range(64)) + 64}",
        "PASS",
    ],
    # Past the kernel's __launch_bounds__: CUDA 13 on the H100 says cudaErrorInvalidValue too.
    "launch_bounds": [
        "256 threads, bounds 128: cudaErrorInvalidValue",
        "128 threads, bounds 128: cudaSuccess",
        "synchronize: cudaSuccess",
        f"bounded sum {2 * sum(range(128))}",
        "PASS",
    ],
    "use_after_free": [
        "memcpy D2H from freed: cudaErrorInvalidValue",
        "memcpy H2D to freed: cudaErrorInvalidValue",
        "memset freed: cudaErrorInvalidValue",
        "second free: cudaErrorInvalidValue",
        "last error: cudaErrorInvalidValue",
        "last error again: cudaSuccess",
        VALID_COPY,
        "PASS",
    ],
    "copy_oob": [
        "H2D 8192 into 4096: cudaErrorInvalidValue",
        "D2H 8192 from 4096: cudaErrorInvalidValue",
        "H2D 200 at offset 4000: cudaErrorInvalidValue",
        "memset 8192 on 4096: cudaErrorInvalidValue",
        "last error: cudaErrorInvalidValue",
        "last error again: cudaSuccess",
        VALID_COPY,
        "PASS",
    ],
    "bad_free": [
        "free interior pointer: cudaErrorInvalidValue",
        "free host pointer: cudaErrorInvalidValue",
        "free NULL: cudaSuccess",
        "free real pointer: cudaSuccess",
        VALID_COPY,
        "PASS",
    ],
    "device_props": [
        f"{check}: yes" for check in (
            "device count >= 1",
            "current device is 0",
            "name non-empty",
            "major >= 1",
            "totalGlobalMem > 0",
            "warpSize == 32",
            "maxThreadsPerBlock == 1024",
            "attribute MaxThreadsPerBlock == 1024",
            "runtime version >= 13000",
            "driver version >= runtime version",
            "0 < free <= total",
            "memory info total <= totalGlobalMem",
        )
    ] + ["PASS"],
}


# ---- the expected outputs themselves (no GPU, no daemon needed) ----

def test_expected_outputs_match_native_h100_run() -> None:
    """Spot values printed by the programs on an H100 natively (CUDA 13.0, driver 580.159):
    guards the Python recomputation of the expected lines."""
    assert expected_vector_add()[5] == "checksum 55780049863.537811"
    assert expected_vector_add()[8] == "partial_checksum 245481.60022008419"
    assert "d*f -2.7500000596046449e-300" in expected_kernel_args()
    assert "big.d1 -6.0221407599999999e+23" in expected_kernel_args()
    assert "before -99 after 113 sum 2452903556" in expected_kernel_args()
    assert expected_streams_events()[8:11] == [
        "y[0] 2.5999999 y[n-1] 99002.2656", "wrong 0", "checksum 14850730325.579453"]
    assert expected_copies((65537, 256 * MiB))[:2] == [
        "size 65537: ok sum 8355862", "size 268435456: ok sum 34225520640"]


def test_programs_compile_warning_free(app_builds: dict[str, Any]) -> None:
    noisy = {name: b for name, b in app_builds.items() if "warning" in b.output.lower()}
    assert not noisy, "nvcc warned:\n" + "\n".join(
        f"$ {' '.join(b.command)}\n{b.output}" for b in noisy.values())


# ---- the programs under pilot ----

def test_vector_add(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("vector_add"), expected_vector_add(), daemon_log)


def test_kernel_args(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("kernel_args"), expected_kernel_args(), daemon_log)


def test_copies_sizes_from_argv(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    sizes = (5, 131072, 2 * MiB + 1)
    check_output(run_under_pilot("copies", *map(str, sizes)), expected_copies(sizes), daemon_log)


def test_copies_all_sizes(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """The full list, up to 256 MiB (3.4 s natively on an H100)."""
    check_output(run_under_pilot("copies", timeout=300), expected_copies(COPY_SIZES), daemon_log)


def test_freed_memory_reaches_the_next_program_zeroed(run_under_pilot: RunUnderPilot,
                                                      daemon_log: DaemonLog) -> None:
    # The sim backend, like CUDA's allocator, hands a freed block to the next allocation of its
    # size as it was: only pilotd's zeroing on free, and of a module's variables before it is
    # unloaded, keeps the pattern from the second program.
    check_output(run_under_pilot("scrub", "fill"),
                 ["fill: 4 allocations written and freed, a module variable written"], daemon_log)
    check_output(run_under_pilot("scrub", "read"), ["read: 4 allocations, nonzero bytes 0"],
                 daemon_log)


def test_memset(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("memset"), expected_memset(), daemon_log)


def test_streams_events(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("streams_events"), expected_streams_events(), daemon_log)


@pytest.mark.parametrize("scenario", sorted(ERROR_SCENARIOS))
def test_errors(scenario: str, run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    check_output(run_under_pilot("errors", scenario), ERROR_SCENARIOS[scenario], daemon_log)


@pytest.mark.parametrize("case", ["stopped", "control_socket"])
def test_a_daemon_that_does_not_answer_fails_fast(run_under_pilot: RunUnderPilot, start_pilotd: Any,
                                                   case: str) -> None:
    """A pilotd stopped with SIGSTOP (a socket that accepts the connection and never answers):
    the program's first call fails with cudaErrorNoDevice after PILOT_CONNECT_TIMEOUT, says why,
    every later call fails at once (vector_add makes a dozen), and the program exits normally.
    PILOT_SOCKET naming pilotd's control socket: refused at once, in the shim's protocol, with
    the default 10 s timeout."""
    daemon = start_pilotd()
    socket = daemon.socket if case == "stopped" else daemon.control_socket
    env = {"PILOT_SOCKET": socket, **({"PILOT_CONNECT_TIMEOUT": "1"} if case == "stopped" else {})}
    if case == "stopped":
        daemon.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        proc = run_under_pilot("errors", "daemon_absent", timeout=30, env=env)
        elapsed = time.monotonic() - started
        started = time.monotonic()
        many = run_under_pilot("vector_add", timeout=60, env=env)
        many_elapsed = time.monotonic() - started
    finally:
        if case == "stopped":
            daemon.proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["PASS"], proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "cudaMalloc: cudaErrorNoDevice", proc.stdout
    if case == "stopped":
        assert "did not answer within 1 s" in proc.stderr, proc.stderr
        assert elapsed < 4.0, f"took {elapsed:.1f} s to give up on a daemon that does not answer"
    else:
        assert "is PILOT_SOCKET pilotd's main socket, not its control socket?" in proc.stderr, proc.stderr
        assert elapsed < 4.0, f"took {elapsed:.1f} s to refuse the control socket"
    assert many.returncode != 0 and "cudaErrorNoDevice" in many.stdout + many.stderr, many.stdout
    assert many_elapsed < 4.0, f"vector_add took {many_elapsed:.1f} s: each call waited again"


def test_two_programs_at_once(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """Two tenants on one daemon at the same time both get their own, right results."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        vadd = pool.submit(run_under_pilot, "vector_add")
        args = pool.submit(run_under_pilot, "kernel_args")
        check_output(vadd.result(), expected_vector_add(), daemon_log)
        check_output(args.result(), expected_kernel_args(), daemon_log)


def test_daemon_absent(run_under_pilot: RunUnderPilot, shim_path: str, tmp_path: Path) -> None:
    """No daemon at PILOT_SOCKET: every call fails with a defined error, a message says why,
    and the program still exits normally, quickly. (shim_path: skips natively.)"""
    started = time.monotonic()
    proc = run_under_pilot("errors", "daemon_absent", timeout=20,
                           env={"PILOT_SOCKET": str(tmp_path / "nobody.sock")})
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1:] == ["PASS"], proc.stdout
    assert proc.stdout.splitlines()[0] in (
        "cudaMalloc: cudaErrorInitializationError", "cudaMalloc: cudaErrorNoDevice"), proc.stdout
    assert "pilot: cannot reach pilotd" in proc.stderr, proc.stderr
    assert elapsed < 5.0, f"took {elapsed:.1f} s to give up on a missing daemon"


def test_real_libcudart_never_loaded(run_under_pilot: RunUnderPilot, shim_path: str,
                                     daemon_log: DaemonLog) -> None:
    """The preloaded shim satisfies the program's libcudart.so.13: the loader maps no real
    libcudart (LD_DEBUG=files would show 'file=libcudart.so.13 ... generating link map' and
    'calling init: /usr/local/cuda/.../libcudart.so.13')."""
    proc = run_under_pilot("vector_add", env={"LD_DEBUG": "files"})
    check_output(proc, expected_vector_add(), daemon_log)
    assert shim_path in proc.stderr, "LD_DEBUG=files printed nothing about the preloaded shim"
    others = [line.replace(shim_path, "<shim>") for line in proc.stderr.splitlines()]
    loaded = [line for line in others
              if re.search(r"/\S*libcudart\.so", line)
              or re.search(r"file=libcudart\.so\S*\s.*generating link map", line)]
    assert not loaded, "the real libcudart was loaded:\n" + "\n".join(loaded)


def test_killed_mid_copy(app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
                         pilot_sessions: Sessions, pilotd: Daemon, tmp_path: Path) -> None:
    """SIGKILL a client in the middle of 256 MiB copies: within 1 s its session is gone and
    the device memory it held is released."""
    before = pilot_sessions()
    bytes_before = sum(s["device_bytes"] for s in before)
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([str(app_binaries["errors"]), "killed_mid_copy"],
                                env=pilot_client_env, stdout=subprocess.PIPE, stderr=stderr,
                                text=True)
    try:
        first = _first_line(proc, timeout=60)
        assert first == "copying", (
            f"got {first!r}\nstderr:\n{stderr_path.read_text()}\npilotd:\n{pilotd.log_tail()}")
        mine = [s for s in pilot_sessions() if s["pid"] == proc.pid]
        assert len(mine) == 1, f"no single session for pid {proc.pid}: {pilot_sessions()}"
        assert mine[0]["device_bytes"] >= 256 * MiB, mine[0]

        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed_at = time.monotonic()
        sessions: list[dict[str, Any]] = []
        # Poll for 1.0 s: the last query may start just before the deadline.
        while True:
            asked_at = time.monotonic()
            if asked_at - killed_at > 1.0:
                pytest.fail(f"session of pid {proc.pid} still listed 1 s after SIGKILL: "
                            f"{sessions}\npilotd log:\n{pilotd.log_tail()}", pytrace=False)
            sessions = pilot_sessions()
            if not any(s["pid"] == proc.pid for s in sessions):
                break
            time.sleep(0.02)
        assert sum(s["device_bytes"] for s in sessions) == bytes_before, sessions
        assert pilotd.proc.poll() is None, "pilotd died:\n" + pilotd.log_tail()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The first stdout line of `proc`, or None if none comes within `timeout` s."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        lines.put(proc.stdout.readline())

    threading.Thread(target=read, daemon=True).start()
    try:
        return lines.get(timeout=timeout).rstrip("\n")
    except queue.Empty:
        return None


def test_every_kernel_has_an_emulation(app_binaries: dict[str, Path]) -> None:
    """Every kernel of the programs has an emulation in sim_kernels.py. Kernels are found
    through their host stubs, `_Z<len>__device_stub_<kernel name>...` (nm)."""
    sim_kernels = pytest.importorskip("pilot.daemon.sim_kernels")
    here = Path(__file__).parent
    registry = sim_kernels.load_kernel_files([here / "sim_kernels.py",
                                              here / "sim_kernels_streams.py",
                                              here / "sim_kernels_arrays.py",
                                              here.parent / "gpu" / "sim_kernels.py",
                                              here.parent.parent / "bench" / "policy_sim_kernels.py"])
    kernels: set[str] = set()
    for exe in app_binaries.values():
        nm = subprocess.run(["nm", "--defined-only", str(exe)], capture_output=True, text=True,
                            check=True)
        symbols = {parts[-1] for parts in map(str.split, nm.stdout.splitlines()) if parts}
        for sym in symbols:
            m = re.match(r"_Z(\d+)__device_stub__", sym)
            if m is None:
                continue
            start = len("_Z") + len(m.group(1))
            rest = sym[start:start + int(m.group(1))][len("__device_stub__"):]
            found = {"_" + rest, rest} & symbols  # C++ kernels: "_Z..."
            plain = re.match(r"Z(\d+)", rest)  # extern "C": the stub mangles the plain name
            if not found and plain:
                found = {rest[plain.end():plain.end() + int(plain.group(1))]} & symbols
            assert len(found) == 1, f"{exe.name}: cannot tell the kernel of stub {sym}"
            kernels |= found
    # 22 in tests/apps (4 runtime_misc, 5 managed), 8 in the callback/stream/device programs,
    # 2 in pinned, 3 in footprint, 3 in fault, 1 in mempool, 5 in tests/gpu, 3 in bench/uvm/pagedos.cu,
    # 3 in stream.cu, 3 in launch_order, 2 in func_info, 4 in arrays, 3 in graphs, 2 in small_managed,
    # 1 in rings, 1 in words
    assert len(kernels) == 70, sorted(kernels)
    assert sorted(kernels - set(registry.names())) == []


@pytest.mark.parametrize("program", ["matmul_tiled", "multistream"])
def test_gpu_programs_check_themselves_under_sim(run_under_pilot: Callable[..., Any], program: str) -> None:
    """tests/gpu's SGEMM (exact CPU reference) and 4-stream pipeline with legacy-stream ordering."""
    proc = run_under_pilot(program, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == "PASS"


def test_threads_share_one_connection(run_under_pilot: Callable[..., Any]) -> None:
    """Six host threads, each with a stream, interleave inline and staged copies, kernels and
    synchronizations on the process's one connection."""
    expected = []
    for t in range(6):
        n = 100000 if t % 2 else 1000
        total = sum((t + 2) * (n * (n - 1) // 2 + n * (7 * t + r)) + n * r for r in range(20))
        expected.append(f"thread {t}: ok checksum {total}")
    proc = run_under_pilot("threads", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [*expected, "PASS"]


APPS_DIR = Path(__file__).resolve().parent
NATIVE = os.environ.get("PILOT_APPS_NATIVE") == "1"


def test_pilot_run_preloads_the_shim(app_binaries: dict[str, Path], pilot_client_env: dict[str, str],
                                     shim_path: str) -> None:
    """`pilot run -- PROG` is the same as LD_PRELOAD=$(pilot shim-path) PROG."""
    if NATIVE:
        pytest.skip("pilot only")
    env = {k: v for k, v in pilot_client_env.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == shim_path and Path(shim_path).is_absolute()
    proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "run", "--",
                           str(app_binaries["vector_add"])], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "PASS", proc.stdout + proc.stderr


def test_daemon_that_dies_mid_session_fails_calls_not_the_program(
        app_binaries: dict[str, Path], pilot_client_env: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL pilotd while a client copies: the client's next call returns an error (its own
    CHECK then exits 1) within seconds, with a message; no hang, no crash."""
    if NATIVE:
        pytest.skip("pilot only")
    sock = tmp_path / "doomed.sock"
    log = (tmp_path / "doomed.log").open("w")
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
                               str(sock), "--state-dir", str(tmp_path / "state"),
                               "--metrics-address", "", "--sim-kernels", str(APPS_DIR / "sim_kernels.py")],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "pilotd ready" not in (tmp_path / "doomed.log").read_text():
            assert daemon.poll() is None and time.monotonic() < deadline, "pilotd did not start"
            time.sleep(0.05)
        env = {**pilot_client_env, "PILOT_SOCKET": str(sock)}
        proc = subprocess.Popen([str(app_binaries["errors"]), "killed_mid_copy"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert _first_line(proc, timeout=60) == "copying"
        daemon.kill()
        daemon.wait()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("client hung after pilotd died", pytrace=False)
        assert proc.returncode == 1, (proc.returncode, err)  # CHECK's exit, not a signal
        assert "lost connection to pilotd" in err
        assert "CUDA error cudaErrorDevicesUnavailable" in out, out
    finally:
        if daemon.poll() is None:
            daemon.kill()
        log.close()


# ---- symbols.cu: __device__ and __constant__ variables ----

def expected_symbols() -> list[str]:
    """What symbols.cu prints, recomputed: float32 Horner with one rounding per operation,
    uint32 wrap-around, and the error names CUDA 13 gives natively on the H100."""
    c = np.array([(-1 if j % 2 else 1) * (j + 1) / 16 for j in range(16)], dtype=F32)  # exact
    back = np.concatenate([c[10:], c[:10]])
    x = ((np.arange(1000) % 200 - 100) / 128).astype(F32)  # exact in float32
    y = np.zeros(1000, dtype=F32)
    for j in range(15, -1, -1):
        y = y * x + c[j]  # float32 * float32, then + float32: two roundings
    g = "%g"
    lines = [
        "coeffs size 64",
        f"coeffs back [10] {g % back[0]} [15] {g % back[5]} [16] {g % back[6]} [25] {g % back[15]}",
        f"poly y[0] {y[0]:.9g} y[150] {y[150]:.9g} y[999] {y[999]:.9g} sum {seq_sum(y):.17g}",
        "poly after rewrite: wrong 0",
    ]
    counter = len(range(0, 1000, 3)) + len(range(0, 3 * 100, 7))
    lines += ["counter at start 0", f"counter {counter}", f"counter reset to 1000, +64: {1000 + 64}"]
    initialized, hidden, value = 42, 5, 2.5
    lines += ["initialized 42 hidden 0 ns::value 0", "ns::value size 8", "hidden size 4"]
    seen = []
    for add in (7, 1):
        seen.append((initialized, hidden))
        initialized, hidden, value = initialized + add, hidden * 2 + add, value * 1.5 + add
    lines += [f"kernel saw initialized {seen[1][0]} hidden {seen[1][1]}",
              f"after two updates: initialized {initialized} hidden {hidden} ns::value {value:g}",
              f"device-to-device: out 77 {hidden} initialized 77 hidden 77"]
    i = np.arange(50000, dtype=np.uint64)
    big = (i * 2654435761 % 2**32 * 3 + i) % 2**32
    zeroed = big.copy()
    zeroed[100:200] = 0
    lines += ["big size 200000", f"big sum {int(big.sum())}", "big wrong 0",
              "through the address: match 1",
              "memset through the address: [99] 1 [100] 0 [199] 0 [200] 1",
              f"big sum after memset {int(zeroed.sum())}", "tail: match 1",
              "copied within big: match 1"]
    invalid_value, invalid_symbol = "cudaErrorInvalidValue", "cudaErrorInvalidSymbol"
    direction, success = "cudaErrorInvalidMemcpyDirection", "cudaSuccess"
    errors = [
        ("to coeffs offset 64", invalid_value),
        ("to coeffs 68 bytes", invalid_value),
        ("to coeffs 4 bytes at 61", invalid_value),
        ("from counter 8 bytes", invalid_value),
        ("from big past end", invalid_value),
        ("async to counter past end", invalid_value),
        ("to a host variable", invalid_symbol),
        ("from a host variable", invalid_symbol),
        ("async from a host variable", invalid_symbol),
        ("address of a host variable", invalid_symbol),
        ("size of a host variable", invalid_symbol),
        ("to coeffs as device-to-host", direction),
        ("from coeffs as host-to-device", direction),
        ("to the middle of coeffs", invalid_symbol),
        ("to a NULL symbol", invalid_symbol),
        ("nothing to a host variable", success),
        ("nothing past the end of counter", success),
        ("to coeffs as host-to-host", direction),
        ("to coeffs past the end as device-to-host", invalid_value),
        ("to a host variable as device-to-host", invalid_symbol),
        ("to coeffs device-to-device from a host buffer", invalid_value),
        ("free a symbol's address", invalid_value),
    ]
    lines += [f"{label}: {name} (last {name})" for label, name in errors]
    lines += ["counter unchanged 1064", "after the errors: cudaSuccess (last cudaSuccess)", "PASS"]
    return lines


def test_expected_symbols_match_native_h100_run() -> None:
    """Lines symbols.cu printed natively on the H100 (CUDA 13.0, driver 580)."""
    lines = expected_symbols()
    assert lines[1] == "coeffs back [10] 0.6875 [15] -1 [16] 0.0625 [25] -0.625"
    assert lines[2] == ("poly y[0] 1.19292498 y[150] 0.0323189311 y[999] 0.0102997087 "
                        "sum 160.30130518600345")
    assert "counter 377" in lines
    assert "kernel saw initialized 49 hidden 17" in lines
    assert "after two updates: initialized 50 hidden 35 ns::value 17.125" in lines
    assert "big sum 107379057496288" in lines
    assert "big sum after memset 107165063713512" in lines


def test_symbols(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """__constant__ and __device__ variables: copies to and from them (sync, async, staged,
    device-to-device, at offsets), kernels reading what the host wrote and the host reading what
    kernels wrote, cudaGetSymbolAddress/Size, and CUDA's errors for bad symbols and ranges."""
    check_output(run_under_pilot("symbols"), expected_symbols(), daemon_log)


def test_symbols_relocatable_device_code(app_builds: dict[str, Any], pilot_client_env: dict[str, str],
                                         daemon_log: DaemonLog, tmp_path: Path) -> None:
    """symbols.cu built with -rdc=true: the variables live in the device-linked image, and the
    static one is named `__nv_static_..._hidden` there."""
    cmd = list(app_builds["symbols"].command)
    exe = tmp_path / "symbols_rdc"
    cmd[cmd.index("-o") + 1] = str(exe)
    cmd.insert(1, "-rdc=true")
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    proc = subprocess.run([str(exe)], env=pilot_client_env, capture_output=True, text=True,
                          timeout=120)
    check_output(proc, expected_symbols(), daemon_log)


# ---- runtime_misc.cu ----

INVALID_VALUE, INVALID_PITCH = "cudaErrorInvalidValue", "cudaErrorInvalidPitchValue"
INVALID_FUNCTION, INVALID_HANDLE = "cudaErrorInvalidDeviceFunction", "cudaErrorInvalidResourceHandle"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def expected_runtime_misc() -> list[str]:
    """What runtime_misc.cu prints; every value and error name as CUDA 13.0 gives them natively
    on the H100 (driver 580): priorities clamped into [0, -5], cudaGetDeviceFlags always with
    cudaDeviceMapHost (0x8), 48 KiB of dynamic shared memory less the static part by default,
    occupancy bound by threads (2048 per SM) and block slots (32 per SM), pitches of 512."""
    lines = ["priority range [0, -5]",
             "stream priority -10 flags 1 -> priority -5 flags 1",
             "stream priority -3 flags 0 -> priority -3 flags 0",
             "stream priority 3 flags 1 -> priority 0 flags 1"]
    lines += [f"special stream {i}: priority 0 flags 0" for i in range(3)]
    lines += [f"create with flags 2: {INVALID_VALUE}",
              f"get flags into NULL: {INVALID_VALUE}",
              "record with flags 0: cudaSuccess",
              "record external outside a capture: cudaErrorIllegalState",
              f"record with flags 2: {INVALID_VALUE}",
              f"record NULL event: {INVALID_HANDLE}",
              "priority streams: 0 wrong",
              "device flags 0x8",
              f"set device flags 0x5: {INVALID_VALUE} -> 0x8",
              "set device flags 0x94: cudaSuccess -> 0x9c",
              "set device flags 0x20: cudaSuccess -> 0x8",
              f"set device flags 0x100: {INVALID_VALUE} -> 0x8",
              "set device flags 0: cudaSuccess -> 0x8",
              f"get device flags into NULL: {INVALID_VALUE}",
              "stack size 1024",
              "stack size after setting 4096: 4096",
              "stack size after setting 8000: 8000",
              f"malloc heap {8 * MiB}",
              f"malloc heap after setting 16 MiB: {16 * MiB}",
              "pending launch count 2048",
              "sync depth: cudaErrorUnsupportedLimit",
              f"get limit into NULL: {INVALID_VALUE}",
              "cache config 0",
              "cache config after PreferShared: 1",
              f"cache config 4: {INVALID_VALUE}",
              "can access peer 0 -> 0: cudaSuccess 0",
              "can access peer 0 -> 1: cudaErrorInvalidDevice",
              f"can access peer into NULL: {INVALID_VALUE}",
              "profiler start cudaSuccess stop cudaSuccess"]

    def attrs(label: str, threads: int, shared: int, dynamic: int, carveout: int = -1) -> str:
        return (f"{label}: maxThreadsPerBlock {threads} sharedSizeBytes {shared} localSizeBytes 0 "
                f"maxDynamicSharedSizeBytes {dynamic} preferredShmemCarveout {carveout} "
                "numRegs>0 yes binaryVersion>0 yes")

    big, optin = 100000, 232448
    lines += [attrs("tiled", 128, 1024, 48 * 1024 - 1024),
              attrs("plain", 1024, 0, 48 * 1024),
              f"attributes into NULL: {INVALID_VALUE}",
              f"attributes of NULL: {INVALID_FUNCTION}",
              f"attributes of a host function: {INVALID_HANDLE}",
              f"launch with {big} bytes before opting in: {INVALID_VALUE}",
              f"set max dynamic shared {big}: cudaSuccess",
              attrs("dyn_reverse", 1024, 0, big),
              f"launch with {big} bytes: cudaSuccess",
              f"launch with {big + 1} bytes: {INVALID_VALUE}",
              "reversed through dynamic shared memory: 0 wrong",
              "plain with 49152 bytes: cudaSuccess",
              f"plain with 49153 bytes: {INVALID_VALUE}",
              f"tiled with 48129 bytes: {INVALID_VALUE}",
              f"max dynamic {optin}: cudaSuccess",
              f"max dynamic {optin + 1}: {INVALID_VALUE}",
              f"tiled max dynamic {optin}: {INVALID_VALUE}",  # plus its 1 KiB of static memory
              f"max dynamic -1: {INVALID_VALUE}",
              "carveout 50: cudaSuccess",
              f"carveout 101: {INVALID_VALUE}",
              f"cluster dim must be set: {INVALID_VALUE}",  # read-only
              f"attribute of NULL: {INVALID_FUNCTION}",
              attrs("plain after setting", 1024, 0, optin, 50),
              "function cache PreferL1: cudaSuccess",
              f"function cache 4: {INVALID_VALUE}",
              f"function cache of NULL: {INVALID_FUNCTION}",
              "bank size eight bytes: cudaSuccess",
              f"bank size 3: {INVALID_VALUE}"]
    for block, dynamic, flags in ((128, 0, 0), (64, 0, 0), (256, 0, 0), (128, 0, 1), (1025, 0, 0),
                                  (128, 300000, 0)):
        blocks = 0 if block > 1024 or dynamic > 48 * 1024 - 1024 else min(32, 2048 // block)
        lines.append(f"occupancy tiled block {block} dynamic {dynamic} flags {flags}: {blocks}")
    lines += ["occupancy plain block 1024: 2",
              f"occupancy dyn_reverse with {big} bytes > 0: yes",
              f"occupancy block 0: {INVALID_VALUE}",
              f"occupancy flags 2: {INVALID_VALUE}",
              f"occupancy of NULL: {INVALID_FUNCTION}",
              f"occupancy into NULL: {INVALID_VALUE}",
              "available dynamic smem: 8 blocks fit with it: yes, 16 get less but some: yes"]
    lines += [f"pitch of width {w}: {_round_up(w, 512)}" for w in (1, 100, 512, 513, 4097, 100000)]
    lines += ["width 0: pointer NULL pitch 0", f"pitch into NULL: {INVALID_VALUE}"]
    for width, height, spitch, dpitch, mode in ((100, 37, 128, 120, "sync"),
                                                (1000, 300, 1024, 1000, "sync"),
                                                (1000, 300, 1000, 1003, "async"),
                                                (70000, 3, 70001, 70000, "sync"),
                                                (70000, 3, 70000, 70005, "async")):
        pitches = f"{_round_up(width, 512)} {_round_up(width + 3, 512)}"
        lines.append(f"2D {mode} {width}x{height} spitch {spitch} dpitch {dpitch}: pitches {pitches}, "
                     "0 wrong")
    lines += [f"width > dpitch: {INVALID_PITCH}",
              f"width > spitch: {INVALID_PITCH}",
              f"width > dpitch, one row: {INVALID_VALUE}",
              f"async width > spitch: {INVALID_PITCH}",
              "height 0: cudaSuccess",
              "width 0, pitches 0: cudaSuccess",
              f"past the allocation: {INVALID_VALUE}",
              "bad kind: cudaErrorInvalidMemcpyDirection",
              f"NULL destination: {INVALID_VALUE}",
              f"memset width > pitch: {INVALID_VALUE}",
              "memset one row, width > pitch: cudaSuccess",
              f"memset past the allocation: {INVALID_VALUE}",
              f"memset of host memory: {INVALID_VALUE}",
              "host to host: cudaSuccess",
              "PASS"]
    return lines


def test_runtime_misc(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """Stream priorities and flags, device flags, limits, cache configurations, function
    attributes and occupancy, pitched memory and 2D copies/memsets. Run twice: the second run
    reading the default stack size and heap again shows that the daemon dropped the first run's
    cudaDeviceSetLimit requests when its session ended."""
    for _ in range(2):
        check_output(run_under_pilot("runtime_misc"), expected_runtime_misc(), daemon_log)


def test_a_call_waits_as_long_as_pilotd_lives(run_under_pilot: RunUnderPilot) -> None:
    """A synchronize behind a 3 s host callback, with a liveness check every second: pilotd
    answers each (its router is not the busy vGPU), so the call is not cut short."""
    proc = run_under_pilot("liveness", timeout=60, env={"PILOT_LIVENESS": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "slow_callback ok", proc.stdout + proc.stderr
    assert "liveness" not in proc.stderr, proc.stderr


def test_a_call_fails_soon_once_pilotd_stops_answering(start_pilotd: Any, app_binaries: dict[str, Path],
                                                      shim_path: str) -> None:
    """Issue 12, attack 10: a pilotd stopped (SIGSTOP) while a program waits for a reply hung it
    for ever. The shim asks pilotd's main socket after PILOT_LIVENESS s and gives up after
    PILOT_CONNECT_TIMEOUT more: the call fails with cudaErrorDevicesUnavailable."""
    daemon = start_pilotd()
    env = {**daemon.env(), "LD_PRELOAD": shim_path, "PILOT_LIVENESS": "1", "PILOT_CONNECT_TIMEOUT": "1"}
    proc = subprocess.Popen([str(app_binaries["liveness"]), "loop"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "looping"
        time.sleep(0.5)
        daemon.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        line = proc.stdout.readline().strip()
        noticed = time.monotonic() - stopped
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    assert line == "cudaErrorDevicesUnavailable", (line, out, err)
    assert noticed < 6.0, f"took {noticed:.1f} s to notice a stopped pilotd"
    assert "did not answer a liveness check" in err and proc.returncode == 0, err


FUNC_INFO = """\
getKernel: cudaSuccess 1
name: cudaSuccess _Z13params_kernel5MixedcPds
name C: cudaSuccess plain_c_kernel
name by kernel handle: cudaSuccess _Z13params_kernel5MixedcPds
params_kernel param 0: offset 0 size 24
params_kernel param 1: offset 24 size 1
params_kernel param 2: offset 32 size 8
params_kernel param 3: offset 40 size 2
params_kernel param 4: cudaErrorInvalidValue
plain_c_kernel param 0: offset 0 size 8
plain_c_kernel param 1: offset 8 size 4
plain_c_kernel param 2: cudaErrorInvalidValue
name of main: cudaErrorInvalidResourceHandle
name of NULL: cudaErrorInvalidDeviceFunction
params of main: cudaErrorInvalidResourceHandle
done
"""


def test_func_info(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """cudaGetKernel, cudaFuncGetName (the mangled name; an extern "C" kernel's plain one) and
    cudaFuncGetParamInfo (the layout the daemon reported; an index past the last parameter is
    cudaErrorInvalidValue), answered in the shim; the errors for a host function and NULL are
    cudaFuncGetAttributes's (seen on the H100)."""
    proc = run_under_pilot("func_info")
    assert proc.stdout == FUNC_INFO, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"


STATIC_MESSAGE = "links the CUDA runtime statically"


@pytest.fixture
def static_vector_add(app_builds: dict[str, Any], tmp_path: Path) -> Path:
    """vector_add.cu built with nvcc's default, the static runtime."""
    if NATIVE:
        pytest.skip("the shim is not loaded natively")
    cmd = [c for c in app_builds["vector_add"].command if c not in ("-cudart", "shared")]
    exe = tmp_path / "vector_add_static"
    cmd[cmd.index("-o") + 1] = str(exe)
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    return exe


def test_the_shim_refuses_a_program_with_the_static_runtime(
        static_vector_add: Path, app_builds: dict[str, Any], pilot_client_env: dict[str, str]) -> None:
    """vector_add.cu built with nvcc's default (-cudart static) would never call the shim: the
    shim refuses it when it starts (one line, exit status 3) rather than let it run outside
    pilot; PILOT_STATIC_RUNTIME=warn lets it run with the line as a warning; built -cudart
    shared, nothing is said."""
    exe = static_vector_add
    env = {**pilot_client_env, "CUDA_VISIBLE_DEVICES": ""}  # no GPU needed to be refused
    refused = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert refused.stderr.count(STATIC_MESSAGE) == 1 and "Refused" in refused.stderr, refused.stderr
    assert refused.stdout == ""  # main never ran
    warned = subprocess.run([str(exe)], env={**env, "PILOT_STATIC_RUNTIME": "warn"},
                            capture_output=True, text=True, timeout=60)
    assert warned.stderr.count(STATIC_MESSAGE) == 1 and "runs outside pilot" in warned.stderr
    assert warned.returncode != 3 and "CUDA error" in warned.stdout + warned.stderr  # no GPU here
    shared = subprocess.run([str(app_builds["vector_add"].exe)], env=pilot_client_env,
                            capture_output=True, text=True, timeout=60)
    assert STATIC_MESSAGE not in shared.stderr and shared.returncode == 0, shared.stderr


def test_a_static_runtime_beside_pilots_driver_is_not_refused(
        static_vector_add: Path, app_builds: dict[str, Any], pilot_client_env: dict[str, str],
        tmp_path: Path) -> None:
    """A program that links the driver API (libcuda.so.1) and a static runtime, with pilot's
    driver as its libcuda (as `pilot run` preloads it): nothing of it can run outside pilot, so
    the shim lets it start (a driver API program whose static runtime is unused then works); its
    runtime calls fail at the integrity check, cleanly. (Loaded beside NVIDIA's libcuda it would
    run outside pilot, and the shim refuses it as above.)"""
    link = tmp_path / "libcuda-link"
    link.mkdir()
    (link / "libcuda.so").symlink_to(driver_path())
    cmd = [c for c in app_builds["vector_add"].command if c not in ("-cudart", "shared")]
    exe = tmp_path / "vector_add_static_driver"
    cmd[cmd.index("-o") + 1] = str(exe)
    cmd += ["-Xlinker", "--no-as-needed", "-L", str(link), "-lcuda"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    env = {**pilot_client_env, "PILOT_LOG": "info",
           "LD_PRELOAD": f"{pilot_client_env['LD_PRELOAD']} {driver_path()}"}
    proc = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert "Refused" not in proc.stderr and "its libcuda is pilot's" in proc.stderr, proc.stderr
    assert proc.returncode == 1 and "CUDA error cudaErrorNotSupported" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr
    assert "asked for the NVIDIA driver's integrity check" in proc.stderr


def test_a_static_runtime_on_pilots_driver_fails_cleanly(
        static_vector_add: Path, pilot_client_env: dict[str, str]) -> None:
    """A static runtime that reaches pilot's driver (libpilot-cuda.so; as cuBLAS's and cuDNN's do
    inside PyTorch) gets pilot's private tables and stops at the integrity check pilot cannot
    compute: its CUDA calls fail with an error and a line naming the check, never a crash, a
    hang or work outside pilot."""
    exe = static_vector_add
    env = {**pilot_client_env, "PILOT_STATIC_RUNTIME": "warn", "PILOT_EXPORT_TRACE": "1",
           "LD_PRELOAD": f"{pilot_client_env['LD_PRELOAD']} {driver_path()}"}
    proc = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "CUDA error cudaErrorNotSupported" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr
    # it got the tables it asked for, with working entries, up to the integrity check
    for line in ("export table CUDART_INTERFACE", "export CUDART_INTERFACE[2]",
                 "export table CONTEXT_LOCAL_STORAGE_INTERFACE_V0301", "export CONTEXT_CHECKS[3]",
                 "export table INTEGRITY_CHECK",
                 "asked for the NVIDIA driver's integrity check"):
        assert line in proc.stderr, (line, proc.stderr)


ENTRY_POINT = """\
cuMemAlloc: cudaSuccess found 1 status 0
driver cuMemAlloc: 0
driver cuMemsetD32: 0
runtime reads it: cudaSuccess c0ffee c0ffee
driver cuMemFree: 0
unknown: cudaSuccess null 1 status 1
done
"""


def test_driver_entry_points(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog) -> None:
    """cudaGetDriverEntryPointByVersion gives pilot's driver functions (libpilot-cuda.so, loaded
    on first use beside the shim), which work on the runtime's memory; an unknown name is
    cudaSuccess with a NULL pointer and cudaDriverEntryPointSymbolNotFound, as documented."""
    proc = run_under_pilot("entry_point")
    assert proc.stdout == ENTRY_POINT, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"


DEVICE_PRINTF = """\
host: start
hello from the GPU: n=42 f=1.500 hex=beef s=text c=z %
host: after the device synchronize
thread 0 of 4, round 1
thread 1 of 4, round 1
thread 2 of 4, round 1
thread 3 of 4, round 1
host: after the stream synchronize
fill 100
host: copied 100 163
thread 0 of 2, round 2
thread 1 of 2, round 2
host: after the event synchronize
done
"""


def test_kernel_printf_reaches_the_program(run_under_pilot: RunUnderPilot, daemon_log: DaemonLog,
                                           pilot_sessions: Any) -> None:
    """Kernels' printf output, which the driver writes to pilotd's stdout, comes back to the
    program with the reply of the call that flushed it (synchronize, stream synchronize,
    blocking copy, event synchronize) and is written to its stdout in program order (what the
    H100 prints natively, tests/gpu/run_compare.sh). The program is the only session here."""
    if NATIVE:
        pytest.skip("what pilot adds")
    deadline = time.monotonic() + 10  # earlier tests' sessions end as their processes do
    while pilot_sessions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pilot_sessions() == []
    proc = run_under_pilot("device_printf")
    assert proc.stdout == DEVICE_PRINTF, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"


def test_kernel_printf_reaches_its_program_beside_a_tenant_that_cannot_print(
        run_under_pilot: RunUnderPilot, app_binaries: dict[str, Path],
        pilot_client_env: dict[str, str], daemon_log: DaemonLog) -> None:
    """Tenants share the GPU's context and its printf FIFO, but a session whose modules name
    neither vprintf nor __assertfail cannot have written into it (fatbin.may_print): beside one
    (pinned.cu, holding), the printing program still gets all of its output, in program order.
    (Beside another session that may print, the output goes to pilotd's log:
    tests/unit/test_device_output.py.)"""
    if NATIVE:
        pytest.skip("what pilot adds")
    other = subprocess.Popen([str(app_binaries["pinned"]), "hold"], env=pilot_client_env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().startswith("hold")
        proc = run_under_pilot("device_printf")
    finally:
        other.communicate("\n", timeout=60)
    assert proc.returncode == 0 and proc.stdout == DEVICE_PRINTF, proc.stdout + proc.stderr
    assert "not delivered" not in daemon_log()
