"""The scheduler core end to end, with real nvcc builds run under the shim against sim daemons of
each test's own (conftest's `start_pilotd`):

- quotas through every allocation path (quota_paths.cu): what each path charges, a module whose
  globals do not fit, a refused cudaDeviceSetLimit, everything given back at exit, and what a
  policy hears of each path (allocated/freed, through the record-launches plugin);
- launches that wait (the hold-file policy on one vGPU): other sessions of the vGPU are served
  meanwhile, a launch past `--policy-max-wait` fails with the policy's error at the program's
  next synchronizing call, and a program killed while its launch waits is cleaned up;
- launch footprints as a policy sees them, for each launch entry point (footprint.cu and the
  record-launches plugin);
- a policy that cannot be used stops the daemon's start.
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_apps import check_output, expected_vector_add  # pytest puts tests/apps on sys.path

if TYPE_CHECKING:
    from apps_daemons import OwnDaemon

APPS_DIR = Path(__file__).resolve().parent
PROTO_DIR = APPS_DIR.parent / "proto"
EXAMPLES_DIR = APPS_DIR.parent / "policies_examples"
HOLD_FILE_PLUGIN = EXAMPLES_DIR / "hold_file.py"
RECORD_PLUGIN = EXAMPLES_DIR / "record_launches.py"
MiB = 1 << 20


def _my_tenant() -> str:
    """The tenant of the programs the tests run (no [tenants] are configured)."""
    try:
        return "user:" + pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid:{os.getuid()}"


ME = _my_tenant()
VADD = "_Z4vaddPKfS0_Pfi"

StartPilotd = Callable[..., "OwnDaemon"]
NATIVE = os.environ.get("PILOT_APPS_NATIVE") == "1"
pilot_only = pytest.mark.skipif(NATIVE, reason="pilot only")


# ---- helpers ----

class Program:
    """A program run under one of the test's daemons, its stdout read line by line."""

    def __init__(self, daemon: OwnDaemon, exe: Path, *args: str, shim: str,
                 stdin: bool = False) -> None:
        self.daemon = daemon
        self.proc = subprocess.Popen([str(exe), *args], env={**daemon.env(), "LD_PRELOAD": shim},
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.extend(self.proc.stderr)

    def read_until(self, marker: str, timeout: float = 30) -> list[str]:
        """Lines up to and including `marker` (fails the test if it does not come)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.fail(f"no line {marker!r} within {timeout} s")
            self.lines.append(line)
            if line == marker:
                return self.lines

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Waits for the exit; the whole run as a CompletedProcess (for check_output)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"no exit within {timeout} s")
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return subprocess.CompletedProcess(self.proc.args, rc, "".join(f"{x}\n" for x in self.lines),
                                           "".join(self._stderr))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def fail(self, why: str) -> None:
        self.kill()
        pytest.fail(f"{' '.join(map(str, self.proc.args))}: {why}\nstdout so far:\n"
                    + "\n".join(self.lines) + "\nstderr:\n" + "".join(self._stderr)
                    + f"\npilotd log:\n{self.daemon.log_tail()}", pytrace=False)


def mine(daemon: OwnDaemon, pid: int) -> list[dict[str, Any]]:
    return [s for s in daemon.sessions() if s["pid"] == pid]


def wait_for(what: str, check: Callable[[], Any], daemon: OwnDaemon, timeout: float = 10) -> Any:
    """Polls check() until it returns something true; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s\npilotd log:\n{daemon.log_tail()}",
                        pytrace=False)
        time.sleep(0.02)


def gpu_usage(daemon: OwnDaemon) -> tuple[int, dict[str, int], int, dict[str, int]]:
    """The tenant's (used, by_kind) on GPU 0 and (used, by_kind) of pinned host memory."""
    q = daemon.quota(ME)
    g, host = q["gpus"]["0"], q["pinned"]
    return g["used"], g["by_kind"], host["used"], host["by_kind"]


def nothing_held(daemon: OwnDaemon) -> bool:
    return gpu_usage(daemon) == (0, {}, 0, {})


# ---- 1. quotas through every allocation path ----

def expected_quota_paths(module: str, hold: bool = False) -> list[str]:
    """quota_paths.cu's output; `module` is the error name of the first use of g_big (the
    module's load). With cudaSuccess this is what it prints natively (tests/gpu/run_compare.sh)."""
    lines = ["cudaMalloc 8MiB: cudaSuccess",
             "cudaMallocPitch 1000x1000: cudaSuccess",
             "pitch >= 1000: yes",
             "cudaMallocManaged 4MiB: cudaSuccess",
             "cudaHostAlloc 1MiB: cudaSuccess",
             "cudaDeviceGetLimit heap: cudaSuccess",
             "cudaDeviceSetLimit heap +32MiB: cudaSuccess",
             "heap raised: yes",
             f"cudaMemcpyToSymbol g_big: {module}"]
    if module == "cudaSuccess":
        lines += ["cudaMemcpyFromSymbol g_big: cudaSuccess", "g_big readback: ok"]
    return lines + ["holding"] * hold + ["free: cudaSuccess", "done"]


def test_quota_paths_without_quota(run_under_pilot: Callable[..., Any],
                                   daemon_log: Callable[[], str]) -> None:
    """Every path succeeds: the output a real GPU gives natively."""
    check_output(run_under_pilot("quota_paths"), expected_quota_paths("cudaSuccess"), daemon_log)


@pilot_only
@pytest.mark.parametrize("limit", ["quota 64MiB", "quota 1GiB", "capacity 128MiB"])
def test_quota_through_every_allocation_path(limit: str, start_pilotd: StartPilotd,
                                             app_binaries: dict[str, Path], shim_path: str) -> None:
    """Each path charges the tenant what it allocates (pinned memory apart, as host memory); the
    256 MiB of module globals are refused under 64 MiB (by the quota) or 128 MiB (by the GPU's
    capacity) with cudaErrorMemoryAllocation, as a GPU out of memory refuses a module load, and
    fit in 1 GiB; at exit every kind goes back to 0."""
    kind, size = limit.split()
    if kind == "quota":
        daemon = start_pilotd()
        daemon.ctl("quota", "set", ME, size)
    else:
        daemon = start_pilotd(config=f'[gpu]\ncapacity = "{size}"\n')
    fits = size == "1GiB"
    prog = Program(daemon, app_binaries["quota_paths"], "hold", shim=shim_path, stdin=True)
    try:
        got = prog.read_until("holding")
        want = expected_quota_paths("cudaSuccess" if fits else "cudaErrorMemoryAllocation", hold=True)
        assert got == want[:len(got)], prog.lines

        used, by_kind, pinned_used, pinned_by_kind = gpu_usage(daemon)
        assert by_kind.get("device") == 8 * MiB, by_kind
        assert by_kind.get("pitch", 0) >= 1000 * 1000, by_kind
        assert by_kind.get("managed") == 4 * MiB, by_kind
        assert by_kind.get("limit") == 32 * MiB, by_kind
        if fits:
            assert by_kind.get("module", 0) >= 256 * MiB, by_kind
        else:
            assert by_kind.get("module", 0) == 0, by_kind
        assert set(by_kind) <= {"device", "pitch", "managed", "limit", "module"}, by_kind
        assert used == sum(by_kind.values())
        # staging areas (large copies, the managed fault channel) are pinned too (issue 27)
        assert pinned_by_kind.get("pinned") == 1 * MiB and set(pinned_by_kind) <= {"pinned", "staging"}
        assert pinned_used == sum(pinned_by_kind.values())
        [session] = mine(daemon, prog.proc.pid)
        assert session["charged"] == {**by_kind, **pinned_by_kind}, session
        if not fits:
            why = "quota" if kind == "quota" else "capacity"
            assert re.search(rf"{why}: {ME} on GPU 0: 268435456-byte module refused", daemon.log())

        prog.send("go\n")
        check_output(prog.finish(), want, daemon.log_tail)
    finally:
        prog.kill()
    wait_for("every kind back to 0 after the exit", lambda: nothing_held(daemon), daemon)
    assert not daemon.sessions()


@pilot_only
def test_quota_refuses_a_larger_heap(start_pilotd: StartPilotd, app_binaries: dict[str, Path],
                                     shim_path: str) -> None:
    """cudaDeviceSetLimit(cudaLimitMallocHeapSize, current + 1 GiB) under a 64 MiB quota: the
    limit's memory is refused, the heap stays as it was, nothing stays charged."""
    daemon = start_pilotd()
    daemon.ctl("quota", "set", ME, "64MiB")
    prog = Program(daemon, app_binaries["quota_paths"], "biglimit", shim=shim_path)
    check_output(prog.finish(), ["cudaDeviceGetLimit heap: cudaSuccess",
                                 "cudaDeviceSetLimit heap +1GiB: cudaErrorMemoryAllocation",
                                 "cudaDeviceGetLimit heap again: cudaSuccess",
                                 "heap raised: no",
                                 "done"], daemon.log_tail)
    assert f"quota: {ME} on GPU 0: 1073741824-byte limit refused" in daemon.log()
    wait_for("nothing charged after the exit", lambda: nothing_held(daemon), daemon)


def allocation_events(start_pilotd: StartPilotd, tmp_path: Path, exe: Path, shim: str
                      ) -> tuple[dict[str, int], dict[str, int]]:
    """Runs quota_paths (no quota) under the record-launches policy recording allocation events;
    bytes by kind the policy heard allocated, and freed."""
    record = tmp_path / "events.jsonl"
    daemon = start_pilotd("--policy", "record-launches", "--policy-plugin", str(RECORD_PLUGIN),
                          config=f'[policy.record-launches]\npath = "{record}"\nallocations = true\n')
    check_output(Program(daemon, exe, shim=shim).finish(), expected_quota_paths("cudaSuccess"),
                 daemon.log_tail)
    wait_for("the session ended", lambda: not daemon.sessions() and nothing_held(daemon), daemon)
    heard: dict[str, dict[str, int]] = {"allocated": {}, "freed": {}}
    for line in record.read_text().splitlines():
        event = json.loads(line)
        totals = heard[event["event"]]
        totals[event["kind"]] = totals.get(event["kind"], 0) + event["size"]
    return heard["allocated"], heard["freed"]


QUOTA_PATHS_BYTES = {"device": 8 * MiB, "pitch": 1024 * 1000, "managed": 4 * MiB, "pinned": 1 * MiB,
                     "module": 256 * MiB}  # the sim's pitch for 1000 bytes is 1024


@pilot_only
def test_policy_hears_of_every_allocation(start_pilotd: StartPilotd, tmp_path: Path,
                                          app_binaries: dict[str, Path], shim_path: str) -> None:
    """A policy hears `allocated` for what each path allocates, and `freed` for the same bytes
    (at cudaFree, or when the session ends)."""
    allocated, freed = allocation_events(start_pilotd, tmp_path, app_binaries["quota_paths"], shim_path)
    assert {k: allocated.get(k) for k in QUOTA_PATHS_BYTES} == QUOTA_PATHS_BYTES, allocated
    assert {k: freed.get(k) for k in QUOTA_PATHS_BYTES} == QUOTA_PATHS_BYTES, freed


@pilot_only
def test_policy_hears_of_limit_charges(start_pilotd: StartPilotd, tmp_path: Path,
                                       app_binaries: dict[str, Path], shim_path: str) -> None:
    """The 32 MiB a larger malloc heap reserves are heard allocated, then freed at exit."""
    allocated, freed = allocation_events(start_pilotd, tmp_path, app_binaries["quota_paths"], shim_path)
    assert freed.get("limit") == 32 * MiB, freed
    assert allocated.get("limit") == 32 * MiB, allocated


# ---- 2. launches that wait ----

def hold_daemon(start_pilotd: StartPilotd, hold: Path, *args: str, error: int = 2) -> OwnDaemon:
    """A daemon with one vGPU (every session shares vGPU 0) and the hold-file policy on `hold`."""
    return start_pilotd("--vgpus-per-gpu", "1", "--max-vgpus-per-gpu", "1", "--policy", "hold-file",
                        "--policy-plugin", str(HOLD_FILE_PLUGIN), *args,
                        config=f'[policy.hold-file]\npath = "{hold}"\nerror = {error}\n')


def waiting_session(daemon: OwnDaemon, prog: Program) -> dict[str, Any]:
    """The program's session, once it shows as waiting."""
    def check() -> dict[str, Any] | None:
        if prog.proc.poll() is not None:
            prog.fail("exited while its launch should wait")
        rows = mine(daemon, prog.proc.pid)
        return rows[0] if rows and rows[0]["state"] == "waiting" else None
    return wait_for(f"pid {prog.proc.pid} waiting", check, daemon)


def proto_client(socket: str) -> Any:
    """tests/proto/client.py's raw protocol client, opened on `socket` (a session of this
    process)."""
    if str(PROTO_DIR) not in sys.path:
        sys.path.insert(0, str(PROTO_DIR))
    from client import ProtoClient

    client = ProtoClient(socket)
    client.open()
    return client


@pilot_only
def test_waiting_launch_does_not_hold_up_its_vgpu(start_pilotd: StartPilotd, tmp_path: Path,
                                                  app_binaries: dict[str, Path], shim_path: str) -> None:
    """vector_add's first launch waits while the hold file exists; meanwhile another session of
    the same vGPU gets 1,000 calls answered; once the file goes, vector_add finishes right."""
    from pilot.daemon.protocol import lib, new, to_bytes

    hold = tmp_path / "hold"
    hold.touch()
    daemon = hold_daemon(start_pilotd, hold)
    prog = Program(daemon, app_binaries["vector_add"], shim=shim_path)
    client = None
    try:
        a = waiting_session(daemon, prog)
        assert a["waiting"]["kernel"] == VADD and str(hold) in a["waiting"]["reason"], a
        assert a["vgpu"] == 0, a

        client = proto_client(daemon.socket)
        [b] = mine(daemon, os.getpid())
        assert b["vgpu"] == a["vgpu"] and b["state"] == "active", (a, b)
        started = time.monotonic()
        ptr = 0
        for i in range(1000):  # 250 cudaMalloc/cudaFree pairs, 500 cudaMemGetInfo
            if i % 4 == 0:
                ptr = client.malloc(4096)
            elif i % 4 == 1:
                req = new("pilot_req_free")
                req.ptr = ptr
                assert client.call(lib.PILOT_OP_FREE, to_bytes(req)).err == 0
            else:
                rep = client.call(lib.PILOT_OP_MEM_GET_INFO, b"", rep_type="pilot_rep_u64")
                assert rep.hdr.err == 0 and 0 < rep.value <= rep.value2
        took = time.monotonic() - started
        assert took < 5.0, f"1,000 calls took {took:.2f} s beside a waiting launch"

        [a] = mine(daemon, prog.proc.pid)
        assert a["state"] == "waiting" and prog.proc.poll() is None, a
        assert a["waiting"]["held_calls"] >= 1, a  # the program's synchronize, behind the launch
        hold.unlink()
        check_output(prog.finish(), expected_vector_add(), daemon.log_tail)
    finally:
        prog.kill()
        if client is not None:
            client.close()


@pilot_only
def test_launch_past_max_wait_fails_at_next_synchronize(start_pilotd: StartPilotd, tmp_path: Path,
                                                        app_binaries: dict[str, Path],
                                                        shim_path: str) -> None:
    """With `--policy-max-wait 0.3s`, the held launch fails with the policy's error (2,
    cudaErrorMemoryAllocation), which vector_add sees at its next synchronizing call, the
    cudaDeviceSynchronize after the launch (cudaGetLastError right after the launch is clean, as
    for any asynchronous launch error)."""
    hold = tmp_path / "hold"
    hold.touch()
    daemon = hold_daemon(start_pilotd, hold, "--policy-max-wait", "0.3s")
    started = time.monotonic()
    proc = Program(daemon, app_binaries["vector_add"], shim=shim_path).finish()
    took = time.monotonic() - started
    source = (APPS_DIR / "vector_add.cu").read_text().splitlines()
    sync_line = 1 + next(i for i, line in enumerate(source) if "CHECK(cudaDeviceSynchronize());" in line)
    got = proc.stdout.splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert len(got) == 2 and got[1] == "FAIL", got
    m = re.fullmatch(r"CUDA error (\w+) at (\S+):(\d+): (.*)", got[0])
    assert m is not None, got
    assert (m[1], Path(m[2]).name, int(m[3]), m[4]) == (
        "cudaErrorMemoryAllocation", "vector_add.cu", sync_line, "cudaDeviceSynchronize()"), got
    assert took >= 0.3
    assert re.search(rf"kernel {VADD} dropped after 0\.\d+ s: timeout", daemon.log()), daemon.log_tail()
    wait_for("nothing charged after the exit", lambda: nothing_held(daemon), daemon)


@pilot_only
def test_program_killed_while_its_launch_waits(start_pilotd: StartPilotd, tmp_path: Path,
                                               app_binaries: dict[str, Path], shim_path: str) -> None:
    """SIGKILL vector_add while its launch waits: its session is gone within 1 s, the launch is
    dropped (session_end), its memory is given back, and the daemon serves the next program."""
    hold = tmp_path / "hold"
    hold.touch()
    daemon = hold_daemon(start_pilotd, hold)
    prog = Program(daemon, app_binaries["vector_add"], shim=shim_path)
    try:
        waiting_session(daemon, prog)
        assert gpu_usage(daemon)[:2] == (12 * MiB, {"device": 12 * MiB})  # a, b, c
        prog.proc.send_signal(signal.SIGKILL)
        prog.proc.wait(10)
        killed_at = time.monotonic()
        while True:  # the last query may start just before the deadline
            if time.monotonic() - killed_at > 1.0:
                pytest.fail(f"session of pid {prog.proc.pid} still listed 1 s after SIGKILL\n"
                            f"{daemon.log_tail()}", pytrace=False)
            if not mine(daemon, prog.proc.pid):
                break
            time.sleep(0.02)
    finally:
        prog.kill()
    wait_for("the launch dropped with session_end",
             lambda: re.search(rf"kernel {VADD} dropped after [\d.]+ s: session_end", daemon.log()),
             daemon, timeout=5)
    wait_for("nothing charged after the kill", lambda: nothing_held(daemon), daemon, timeout=5)
    assert daemon.alive(), daemon.log_tail()
    assert not daemon.sessions()

    hold.unlink()
    check_output(Program(daemon, app_binaries["vector_add"], shim=shim_path).finish(),
                 expected_vector_add(), daemon.log_tail)


# ---- 3. launch footprints ----

FOOTPRINT_OUTPUT = ["mixed <<<>>> ok", "mixed cudaLaunchKernelExC ok", "struct cudaLaunchKernel ok",
                    "no pointers ok", "PASS"]


def test_footprint_program(run_under_pilot: Callable[..., Any], daemon_log: Callable[[], str]) -> None:
    """footprint.cu computes right under pilot with no policy (and natively)."""
    check_output(run_under_pilot("footprint"), FOOTPRINT_OUTPUT, daemon_log)


@pilot_only
def test_launch_footprints_as_a_policy_sees_them(start_pilotd: StartPilotd, tmp_path: Path,
                                                 app_binaries: dict[str, Path], shim_path: str) -> None:
    """The record-launches policy writes what the daemon told it about each launch: the whole
    allocations its arguments point into (for a small managed allocation, its packed range), by
    kind, in argument order, from plain pointer arguments (<<<>>>), interior pointers
    (cudaLaunchKernelExC with a priority attribute), a struct passed by value (cudaLaunchKernel);
    nothing for a kernel without pointers (module globals are not part of a footprint)."""
    record = tmp_path / "launches.jsonl"
    daemon = start_pilotd("--policy", "record-launches", "--policy-plugin", str(RECORD_PLUGIN),
                          config=f'[policy.record-launches]\npath = "{record}"\n')
    check_output(Program(daemon, app_binaries["footprint"], shim=shim_path).finish(),
                 FOOTPRINT_OUTPUT, daemon.log_tail)
    launches = [json.loads(line) for line in record.read_text().splitlines()]
    assert {x["event"] for x in launches} == {"launch"}  # allocations are not recorded
    n = 1000
    # int, float, char arrays; the 4,000-byte managed one is a piece of a 2 MiB range the
    # session packs its small managed allocations into, which the footprint holds whole
    mixed = [["device", 4 * n], ["managed", 2 * MiB], ["pinned", n]]
    pitch = -(-8 * n // 512) * 512  # the sim's cudaMallocPitch: the width rounded up to 512
    assert [(x["kernel"], x["grid"], x["block"], x["footprint"]) for x in launches] == [
        ("_Z8fp_mixedPiPfPci", [4, 1, 1], [256, 1, 1], mixed),
        ("_Z8fp_mixedPiPfPci", [4, 1, 1], [256, 1, 1], mixed),
        ("_Z9fp_struct4Pair", [4, 1, 1], [256, 1, 1], [["device", 4 * n], ["pitch", 2 * pitch]]),
        ("_Z7fp_noneii", [1, 1, 1], [32, 1, 1], []),
    ], launches
    assert all(x["attempts"] == 1 for x in launches)
    assert len({x["session"] for x in launches}) == 1


# ---- 4. a policy that cannot be used stops the start ----

@pytest.mark.parametrize("case", ["unknown", "not implemented", "bad knob", "unknown table"])
def test_unusable_policy_stops_the_start(case: str, tmp_path: Path) -> None:
    """pilotd exits non-zero at once, with a message naming what is wrong; it never gets ready."""
    args: list[str] = []
    if case == "unknown":
        args, names = ["--policy", "nosuch"], ["'nosuch'", "unknown policy"]
    elif case == "not implemented":
        args, names = (["--policy", "later-design", "--policy-plugin",
                        str(EXAMPLES_DIR / "later_design.py")], ["'later-design'", "not implemented"])
    else:
        table = "hold-file" if case == "bad knob" else "nosuch-either"
        config = tmp_path / "pilotd.toml"
        config.write_text(f'[policy]\nname = "hold-file"\nplugins = ["{HOLD_FILE_PLUGIN}"]\n'
                          f'[policy.{table}]\npath = "/tmp/x"\nbogus_knob = 3\n')
        args = ["--config", str(config)]
        names = (["policy.hold-file", "'bogus_knob'"] if case == "bad knob"
                 else ["policy.nosuch-either", "'nosuch-either'"])
    workdir = tempfile.mkdtemp(prefix="pilot-bad-")  # short: unix socket paths max 107 bytes
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
             os.path.join(workdir, "pilot.sock"), "--state-dir", os.path.join(workdir, "state"),
             "--metrics-address", "", *args],
            capture_output=True, text=True, timeout=30,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "pilotd ready" not in out, out
    for name in names:
        assert name in out, out


def _metrics_after_vector_add(start_pilotd: StartPilotd, app_binaries: dict[str, Path], shim_path: str,
                              config: str | None = None) -> dict[str, float]:
    """The daemon's /metrics sample values after one vector_add under it."""
    import socket as socket_module
    import urllib.request

    with socket_module.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start_pilotd("--metrics-address", f"127.0.0.1:{port}", config=config)
    proc = subprocess.run([str(app_binaries["vector_add"])], env={**daemon.env(), "LD_PRELOAD": shim_path},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("pilot_")}


TENANT_LABELS = "[metrics]\ntenant_labels = true\n"


def test_per_tenant_kernel_time_when_asked(start_pilotd: StartPilotd, app_binaries: dict[str, Path],
                                           shim_path: str) -> None:
    """Issue 15: `[metrics] kernel_time` charges each tenant its kernels' GPU time (events
    around each launch); off by default, when no launch pays for it."""
    key = f'pilot_tenant_kernel_seconds_total{{tenant="{ME}"}}'
    off = _metrics_after_vector_add(start_pilotd, app_binaries, shim_path, config=TENANT_LABELS)
    assert off.get(key, 0.0) == 0.0, off
    on = _metrics_after_vector_add(start_pilotd, app_binaries, shim_path,
                                   config=TENANT_LABELS + "kernel_time = true\n")
    assert 0.0 < on[key] < 60.0, on


def test_per_tenant_usage_metrics(start_pilotd: StartPilotd, app_binaries: dict[str, Path],
                                  shim_path: str) -> None:
    """Issue 15: launches and bytes copied per tenant, on the daemon's /metrics (tenant names
    when the operator opts in, issue 27)."""
    values = _metrics_after_vector_add(start_pilotd, app_binaries, shim_path, config=TENANT_LABELS)
    assert values[f'pilot_tenant_launches_total{{tenant="{ME}"}}'] >= 1, values
    assert values[f'pilot_tenant_copied_bytes_total{{direction="h2d",tenant="{ME}"}}'] > 0, values
    assert values[f'pilot_tenant_copied_bytes_total{{direction="d2h",tenant="{ME}"}}'] > 0, values
    assert any(k.startswith("pilot_build_info{") for k in values), values
