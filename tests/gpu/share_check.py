"""Issue 15 item 3 on a real GPU: a tenant capped at 25% of the SMs (`pilotctl share set`) runs a
compute-bound kernel (tests/gpu/burn.cu) at 25% +- 5% of what it gets alone, and an uncapped
tenant beside it keeps the rest. Prints the numbers and PASS/FAIL lines; exit status 1 if
anything failed.

    PYTHONPATH=/tmp/site python3 tests/gpu/share_check.py   (from the repository root, as root:
                                                            the capped tenant runs as `nobody`)

Runs, each for SECONDS with the same kernel: natively (reference); under pilotd uncapped alone
(root, user:root); capped alone (nobody, user:nobody at 25% on GPU 0); then both together, the
capped one started first (an uncapped session that started before a capped tenant arrived keeps
the whole GPU, so the order is part of what is measured; shares.py says why).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/pilot-gpu-out"))
SECONDS, ITERS, NOBODY = 4.0, 30000, 65534
failures = 0


def check(ok: bool, what: str) -> None:
    global failures
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def burn(binary: Path, env: dict[str, str], start: float, as_nobody: bool) -> subprocess.Popen[str]:
    extra: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if as_nobody else {}
    return subprocess.Popen([str(binary), f"{start:.3f}", str(SECONDS), str(ITERS)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **extra)


def result(proc: subprocess.Popen[str], what: str) -> tuple[float, int]:
    """(kernels per second, SMs seen) from a burn run."""
    out, _ = proc.communicate(timeout=120)
    print(f"{what}: {out.strip()}", flush=True)
    m = re.search(r"sms (\d+) kernels \d+ seconds [\d.]+ rate ([\d.]+) err cudaSuccess", out)
    if not m:
        check(False, f"{what} ran")
        return 0.0, 0
    return float(m.group(2)), int(m.group(1))


def wait_ready(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return line


def run_one(binary: Path, env: dict[str, str], what: str, as_nobody: bool = False) -> tuple[float, int]:
    p = burn(binary, env, time.time() + 1.5, as_nobody)
    return result(p, what)


def start_daemon(work: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    sock = work / "pilot.sock"
    env = {**os.environ, "PILOT_SOCKET": str(sock)}
    env.pop("LD_PRELOAD", None)
    log = (OUT / "pilotd-share.log").open("w")
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "cuda", "--socket",
                               str(sock), "--state-dir", str(work / "state"), "--log-level", "info",
                               "--metrics-address", ""],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while "pilotd ready" not in (OUT / "pilotd-share.log").read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("pilotd did not start:\n" + (OUT / "pilotd-share.log").read_text())
        time.sleep(0.1)
    return daemon, env


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pilot-share-"))
    os.chmod(work, 0o755)  # nobody reaches the sockets and the program
    binary = work / "burn"
    subprocess.run(["nvcc", "-cudart", "shared", "-arch=sm_90", "-o", str(binary),
                    str(REPO / "tests/gpu/burn.cu")], check=True)
    native, native_sms = run_one(binary, dict(os.environ), "native alone")
    daemon, env = start_daemon(work)
    try:
        ctl = [sys.executable, "-m", "pilot.cli.pilotctl"]
        shim = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
        cenv = {**env, "LD_PRELOAD": shim}
        full, full_sms = run_one(binary, cenv, "pilot uncapped alone")
        r = subprocess.run([*ctl, "share", "set", "user:nobody", "25", "--gpu", "0"], env=env,
                           capture_output=True, text=True)
        print("pilotctl share set:", r.stdout.strip(), r.stderr.strip(), flush=True)
        capped, capped_sms = run_one(binary, cenv, "pilot capped alone (25%)", as_nobody=True)
        start = time.time() + 4.0
        pc = burn(binary, cenv, start, True)
        print("capped:", wait_ready(pc).strip(), flush=True)  # its partition exists now
        pu = burn(binary, cenv, start, False)
        listing = subprocess.run([*ctl, "share", "list"], env=env, capture_output=True, text=True)
        print("pilotctl share list:\n" + listing.stdout, flush=True)
        together_c, _ = result(pc, "pilot capped beside uncapped")
        together_u, rest_sms = result(pu, "pilot uncapped beside capped")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    print(f"RESULT sms native={native_sms} uncapped={full_sms} capped={capped_sms} "
          f"uncapped_beside={rest_sms}", flush=True)
    if full:
        print(f"RESULT pilot/native alone {full / native:.3f}; capped alone {capped / full:.3f}; "
              f"together capped {together_c / full:.3f} uncapped {together_u / full:.3f} "
              f"(of pilot uncapped alone, {full:.2f} kernels/s)", flush=True)
        check(0.20 <= capped / full <= 0.30, f"capped alone at {capped / full:.3f} of uncapped alone")
        check(0.20 <= together_c / full <= 0.30,
              f"capped beside an uncapped tenant at {together_c / full:.3f}")
        keep = 1 - capped_sms / full_sms if full_sms else 0.75
        check(together_u / full >= keep - 0.05,
              f"uncapped beside it keeps the rest: {together_u / full:.3f} (its SMs: "
              f"{rest_sms} of {full_sms}, {keep:.3f})")
    check(capped_sms == 32, f"the capped program sees {capped_sms} SMs")
    log = (OUT / "pilotd-share.log").read_text()
    print("".join(line + "\n" for line in log.splitlines()
                  if "capped" in line or "partition" in line or "SM" in line or "ERROR" in line),
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
