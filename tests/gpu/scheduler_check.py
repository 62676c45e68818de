"""Issue 10 on a real GPU: the scheduler core with the CUDA backend.

1. Resource broker: a tenant under a 64 MiB quota runs tests/apps/quota_paths.cu; the module
   holding a 256 MiB `__device__` array is refused (cudaErrorMemoryAllocation), `pilotctl quota
   get` shows what each path charged, and everything goes back when the program exits.
2. Calls that wait: with the hold-file policy (tests/policies_examples/hold_file.py) a program's
   launch waits while another program on the same vGPU runs to completion; when the file goes the
   first finishes with the right output; with a short max_wait the launch fails with the
   configured error.
Prints PASS/FAIL lines; exit status 1 if anything failed.

    PYTHONPATH=/tmp/site python3 tests/gpu/scheduler_check.py   (from the repository root)
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/pilot-gpu-out"))
ARCH = os.environ.get("NVCC_ARCH", "sm_90")
MiB = 1 << 20
failures = 0


def check(ok: bool, what: str) -> None:
    global failures
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def build(work: Path, name: str) -> Path:
    exe = work / name
    subprocess.run(["nvcc", "-O2", f"-arch={ARCH}", "-cudart", "shared", "-o", str(exe),
                    str(REPO / "tests" / "apps" / f"{name}.cu")], check=True)
    return exe


class Pilotd:
    def __init__(self, work: Path, tag: str, *args: str) -> None:
        self.sock = work / f"{tag}.sock"
        self.log_path = OUT / f"pilotd-sched-{tag}.log"
        self.env = {**os.environ, "PILOT_SOCKET": str(self.sock)}
        self.env.pop("LD_PRELOAD", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pilot.daemon", "--backend", "cuda", "--socket", str(self.sock),
             "--state-dir", str(work / f"{tag}-state"), "--metrics-address", "", *args],
            stdout=self.log_path.open("w"), stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 60
        while "pilotd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pilotd {tag} did not start:\n{self.log()}")
            time.sleep(0.1)
        shim = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], capture_output=True,
                              text=True, check=True).stdout.strip()
        self.client_env = {**self.env, "LD_PRELOAD": shim}

    def log(self) -> str:
        return self.log_path.read_text()

    def ctl(self, *args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", *args, "--json"], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def sessions(self) -> list[dict]:
        out = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "sessions", "--json"], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def broker_check(work: Path, quota_paths: Path) -> None:
    d = Pilotd(work, "broker")
    try:
        user = f"user:{pwd.getpwuid(os.getuid()).pw_name}"
        subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "quota", "set", user, "64MiB"],
                       env=d.env, check=True, capture_output=True)
        prog = subprocess.Popen([str(quota_paths), "hold"], env=d.client_env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert prog.stdout is not None and prog.stdin is not None
        lines = []
        for line in prog.stdout:
            lines.append(line.rstrip())
            if line.startswith("holding"):
                break
        print("quota_paths under a 64 MiB quota:", " | ".join(lines))
        check(any("cudaErrorMemoryAllocation" in ln for ln in lines),
              "a 256 MiB __device__ array under a 64 MiB quota: module load refused")
        usage = d.ctl("quota", "get")
        print("pilotctl quota get:", json.dumps(usage))
        by_kind = next(iter(usage["gpus"].values()))["by_kind"]
        check(by_kind.get("device", 0) >= 8 * MiB and by_kind.get("managed", 0) >= 4 * MiB
              and by_kind.get("limit", 0) >= 32 * MiB and by_kind.get("module", 0) < 256 * MiB,
              f"quota get shows each path's charge: {by_kind}")
        prog.stdin.write("\n")
        prog.stdin.close()
        prog.wait(60)
        time.sleep(0.5)
        after = d.ctl("quota", "get")
        check(all(not g["by_kind"] for g in after["gpus"].values()),
              f"everything given back at exit: {after['gpus']}")
    finally:
        d.stop()


def waiting_check(work: Path, vector_add: Path) -> None:
    hold = work / "hold"
    config = work / "hold.toml"
    config.write_text(f'[policy.hold-file]\npath = "{hold}"\nerror = 2\n')
    plugin = str(REPO / "tests" / "policies_examples" / "hold_file.py")
    expected = subprocess.run([str(vector_add)], capture_output=True, text=True, timeout=60).stdout
    d = Pilotd(work, "hold", "--config", str(config), "--policy", "hold-file", "--policy-plugin", plugin,
               "--max-vgpus-per-gpu", "1", "--vgpus-per-gpu", "1", "--policy-max-wait", "60s")
    try:
        hold.touch()
        a = subprocess.Popen([str(vector_add)], env=d.client_env, stdout=subprocess.PIPE, text=True)
        deadline, waiting = time.monotonic() + 30, []
        while time.monotonic() < deadline and not waiting:
            waiting = [s for s in d.sessions() if s["pid"] == a.pid and s["state"] == "waiting"]
            time.sleep(0.1)
        check(bool(waiting), f"the held program's session shows 'waiting': {waiting}")
        t0 = time.monotonic()
        # B: another session on the same vGPU (one vGPU per GPU here) makes 1,000 calls meanwhile.
        sys.path.insert(0, str(REPO / "tests" / "proto"))
        from client import ProtoClient

        from pilot.daemon.protocol import lib

        b = ProtoClient(str(d.sock))
        try:
            b.open()
            errors = sum(b.call(lib.PILOT_OP_MEM_GET_INFO, b"", rep_type="pilot_rep_u64").hdr.err != 0
                         for _ in range(1000))
        finally:
            b.close()
        check(errors == 0, f"another session on the vGPU made 1,000 calls meanwhile "
                           f"({time.monotonic() - t0:.2f} s, {errors} errors)")
        check(a.poll() is None, "the held program is still waiting")
        hold.unlink()
        out, _ = a.communicate(timeout=60)
        check(a.returncode == 0 and out == expected,
              f"released after {time.monotonic() - t0:.2f} s: output identical to native (rc {a.returncode})")
        # A short max_wait: the launch fails with the configured error.
    finally:
        d.stop()
    d = Pilotd(work, "timeout", "--config", str(config), "--policy", "hold-file", "--policy-plugin", plugin,
               "--policy-max-wait", "0.5s")
    try:
        hold.touch()
        r = subprocess.run([str(vector_add)], env=d.client_env, capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and "cudaErrorMemoryAllocation" in r.stdout,
              f"max_wait passed: the launch failed with the configured error ({r.stdout.strip()[-120:]!r})")
        hold.unlink()
        r = subprocess.run([str(vector_add)], env=d.client_env, capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and r.stdout == expected, "the next program runs normally")
    finally:
        d.stop()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pilot-sched-"))
    quota_paths, vector_add = build(work, "quota_paths"), build(work, "vector_add")
    broker_check(work, quota_paths)
    waiting_check(work, vector_add)
    print(f"scheduler_check: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
