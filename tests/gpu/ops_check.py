"""Issue 5 on a real GPU: pilotd --backend cuda reports NVML readings and its capacity through
pilotctl, enforces a tenant quota on a real CUDA program (cudaMemGetInfo shows the quota), and
serves the Prometheus metrics. Prints PASS/FAIL lines; exit status 1 if anything failed.

    PYTHONPATH=/tmp/site python3 tests/gpu/ops_check.py   (from the repository root)
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpu_checks import check, exit_status, stop_pilotd

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/pilot-gpu-out"))
GiB, MiB = 1 << 30, 1 << 20


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="pilot-ops-"))
    sock, port = work / "pilot.sock", 9465
    env = {**os.environ, "PILOT_SOCKET": str(sock)}
    log = (OUT / "pilotd-ops.log").open("w")
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "cuda", "--socket",
                               str(sock), "--state-dir", str(work / "state"), "--capacity", "20GiB",
                               "--metrics-address", f"127.0.0.1:{port}", "--log-level", "info"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while "pilotd ready" not in (OUT / "pilotd-ops.log").read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                check(False, "pilotd started")
                return 1
            time.sleep(0.1)
        ctl = [sys.executable, "-m", "pilot.cli.pilotctl"]
        time.sleep(1.5)  # one NVML poll
        status = json.loads(subprocess.run([*ctl, "status", "--json"], env=env, capture_output=True,
                                           text=True, check=True).stdout)
        print("pilotctl status --json:", json.dumps(status))
        gpu = status["gpus"][0]
        nv = gpu["nvml"] or {}
        check(gpu["capacity"] == 20 * GiB, f"capacity 20 GiB reported ({gpu['capacity']})")
        check("NVIDIA" in nv.get("name", "") and nv.get("memory_total", 0) > 70 * GiB,
              f"NVML reading: {nv.get('name')} {nv.get('memory_used', 0) // MiB} MiB used of "
              f"{nv.get('memory_total', 0) // MiB} MiB, utilization {nv.get('utilization_gpu')}%")

        binary = work / "alloc"
        subprocess.run(["nvcc", "-cudart", "shared", "-arch=sm_90", "-o", str(binary),
                        str(REPO / "tests/apps/alloc.cu")], check=True)
        me = "user:" + pwd.getpwuid(os.getuid()).pw_name
        subprocess.run([*ctl, "quota", "set", me, "1GiB", "--gpu", "0"], env=env, check=True)
        shim = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
        run = subprocess.run([str(binary), "512M", "1G", "256M"], env={**env, "LD_PRELOAD": shim},
                             capture_output=True, text=True, timeout=120)
        lines = run.stdout.splitlines()
        print(run.stdout, end="")
        check(lines[:3] == ["malloc 512M: cudaSuccess", "malloc 1G: cudaErrorMemoryAllocation",
                            "malloc 256M: cudaSuccess"], "quota of 1 GiB enforced on a real program")
        check(any(line.startswith("meminfo: cudaSuccess") and line.endswith(f"total {GiB}")
                  for line in lines), "cudaMemGetInfo reports the quota as the device size")
        check("copy after: ok" in lines, "the program works on after the refusal")

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        print("".join(line + "\n" for line in text.splitlines()
                      if line.startswith(("pilot_gpu", "pilot_tenant", "pilot_quota", "pilot_calls_total"))),
              end="")
        for name in ("pilot_gpu_memory_used_bytes", "pilot_gpu_capacity_bytes", "pilot_calls_total",
                     "pilot_tenant_quota_bytes", "pilot_quota_rejections_total"):
            check(name in text, f"metric {name} exported")
    finally:
        stop_pilotd(daemon)
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
