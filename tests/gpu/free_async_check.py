"""cudaFreeAsync without a wait, on the GPU: what the stream-ordered free costs the host natively
and under pilot, and what it does to a PyTorch training step with PyTorch's stream-ordered
allocator (what the salus policy needs to see a job's scratch memory). About 1.5 minutes.

    PYTHONPATH=/tmp/site python3 tests/gpu/free_async_check.py        (from the repository root)
    python3 tests/gpu/free_async_check.py --backend sim               (the pilot half, no GPU)

1. tests/gpu/free_async_time.cu: a 100 ms kernel writes a 64 MiB block, then cudaFreeAsync of
   it and a cudaMallocAsync on the same stream, timed on the host, 5 rounds; natively, then under
   pilotd. PASS when under pilot every such call returned within 10 ms (a free that waited for
   its stream took the kernel's 100 ms) and every kernel wrote its block before it was freed.
2. bench/salus_torch_job.py (--size small, --iterations 200): natively and under `pilot run`,
   with PyTorch's caching allocator and with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.
   INFO lines give each run's JCT and median step; PASS when under pilot the cudaMallocAsync
   job's JCT is below 1.48x the caching allocator's (before: 1.48x, bench/RESULTS.md, ninth
   session, under salus). Skipped without PyTorch.
Prints PASS/FAIL/INFO lines; exit status 1 if a check failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_checks import check, exit_status, info, stop_pilotd

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/pilot-gpu-out"))
CALL_LIMIT_MS = 10.0  # the kernel runs 100 ms
BEFORE_RATIO = 1.48  # cudaMallocAsync / caching JCT under pilot before the stream-ordered free
ASYNC_ALLOC = "backend:cudaMallocAsync"
ROUND = re.compile(r"round \d+ free_ms ([\d.]+) malloc_ms ([\d.]+) total_ms ([\d.]+)")


def build(work: Path, sim: bool) -> Path:
    exe = work / "free_async_time"
    arch = [] if sim else ["-arch=sm_90"]
    subprocess.run(["nvcc", "-cudart", "shared", "-O2", "-Wno-deprecated-gpu-targets", *arch,
                    "-o", str(exe), str(REPO / "tests/gpu/free_async_time.cu")], check=True)
    return exe


def start_pilotd(work: Path, backend: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A pilotd of this script's own; the environment of its clients (without the shim)."""
    sock = work / "pilot.sock"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PILOT_SOCKET")}
    log = (OUT / "pilotd-free-async.log").open("w")
    sim = ["--sim-kernels", str(REPO / "tests/gpu/sim_kernels.py")] if backend == "sim" else []
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", backend, "--socket",
                               str(sock), "--state-dir", str(work / "state"), "--metrics-address", "",
                               *sim], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while "pilotd ready" not in (OUT / "pilotd-free-async.log").read_text(errors="replace"):
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"pilotd did not start; see {OUT / 'pilotd-free-async.log'}")
        time.sleep(0.05)
    return daemon, {**env, "PILOT_SOCKET": str(sock)}


def free_timing(exe: Path, env: dict[str, str], label: str) -> tuple[float, float, bool]:
    """Runs free_async_time: (slowest free, slowest malloc after it, values right) in ms."""
    run = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    rounds = [tuple(map(float, m.groups())) for m in ROUND.finditer(run.stdout)]
    right = run.returncode == 0 and "values ok" in run.stdout and len(rounds) == 5
    if not right:
        print(run.stdout + run.stderr, flush=True)
    frees, mallocs = [r[0] for r in rounds] or [-1.0], [r[1] for r in rounds] or [-1.0]
    totals = ", ".join(f"{r[2]:.1f}" for r in rounds)
    info(f"{label}: cudaFreeAsync {', '.join(f'{f:.3f}' for f in frees)} ms; cudaMallocAsync after "
         f"it {', '.join(f'{m:.3f}' for m in mallocs)} ms; round {totals} ms")
    return max(frees), max(mallocs), right


def torch_job(env: dict[str, str], alloc: str, under_pilot: bool) -> tuple[float, float, bool]:
    """bench/salus_torch_job.py once: (JCT s, median step ms, finished right)."""
    job = [sys.executable, str(REPO / "bench/salus_torch_job.py"), "--size", "small", "--iterations", "200"]
    cmd = [sys.executable, "-m", "pilot.cli.pilot", "run", "--", *job] if under_pilot else job
    run_env = {k: v for k, v in env.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if alloc:
        run_env["PYTORCH_CUDA_ALLOC_CONF"] = alloc
    run = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=240)
    jct = re.search(r"jct_s ([\d.]+)", run.stdout)
    step = re.search(r"step_ms ([\d.]+)", run.stdout)
    ok = run.returncode == 0 and "iterations 200 ok" in run.stdout and bool(jct and step)
    where = "pilot" if under_pilot else "native"
    if not ok:
        print(run.stdout[-2000:] + run.stderr[-3000:], flush=True)
    jct_s, step_ms = (float(jct.group(1)) if jct else -1.0), (float(step.group(1)) if step else -1.0)
    info(f"torch {where}, {alloc or 'caching'}: JCT {jct_s:.2f} s, median step {step_ms:.2f} ms")
    return jct_s, step_ms, ok


def torch_steps(env: dict[str, str], pilot_env: dict[str, str], sim: bool) -> None:
    # not `import torch` here: this script's directory holds a torch/ of its own
    if subprocess.run([sys.executable, "-c", "import torch"], env=env, cwd=REPO,
                      capture_output=True).returncode != 0:
        info("torch: no PyTorch here, skipped")
        return
    runs = {}
    for where, run_env in (("native", env), ("pilot", pilot_env)):
        if where == "native" and sim:
            continue
        for alloc in ("", ASYNC_ALLOC):
            runs[where, alloc] = torch_job(run_env, alloc, where == "pilot")
    check(all(ok for _, _, ok in runs.values()), "every PyTorch run finished its 200 steps")
    for where in ("native", "pilot"):
        if (where, "") in runs:
            (jc, sc, _), (ja, sa, _) = runs[where, ""], runs[where, ASYNC_ALLOC]
            info(f"torch {where}: cudaMallocAsync / caching JCT {ja / max(jc, 1e-9):.2f}x, "
                 f"median step {sa / max(sc, 1e-9):.2f}x")
    if ("native", ASYNC_ALLOC) in runs:
        (jn, sn, _), (jp, sp, _) = runs["native", ASYNC_ALLOC], runs["pilot", ASYNC_ALLOC]
        info(f"torch cudaMallocAsync: pilot / native JCT {jp / max(jn, 1e-9):.2f}x, "
             f"median step {sp / max(sn, 1e-9):.2f}x")
    (jc, _, _), (ja, _, _) = runs["pilot", ""], runs["pilot", ASYNC_ALLOC]
    check(0 < ja / max(jc, 1e-9) < BEFORE_RATIO,
          f"under pilot cudaMallocAsync / caching JCT {ja / max(jc, 1e-9):.2f}x < {BEFORE_RATIO}x before")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    args = ap.parse_args()
    sim = args.backend == "sim"
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pilot-free-async-"))
    exe = build(work, sim)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PILOT_SOCKET")}
    if not sim:
        _, _, right = free_timing(exe, env, "native")
        check(right, "natively every kernel wrote its block before cudaFreeAsync freed it")
    daemon, pilot_env = start_pilotd(work, args.backend)
    try:
        shim = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], env=pilot_env,
                              capture_output=True, text=True, check=True).stdout.strip()
        slowest_free, slowest_malloc, right = free_timing(exe, {**pilot_env, "LD_PRELOAD": shim}, "pilot")
        check(right, "under pilot every kernel wrote its block before cudaFreeAsync freed it")
        if not sim:  # the sim runs the zeroing's memset at the call, and no kernel for 100 ms
            check(0 <= slowest_free < CALL_LIMIT_MS and 0 <= slowest_malloc < CALL_LIMIT_MS,
                  f"under pilot cudaFreeAsync and cudaMallocAsync return while the 100 ms kernel "
                  f"runs (slowest {slowest_free:.3f} / {slowest_malloc:.3f} ms, limit "
                  f"{CALL_LIMIT_MS:g} ms)")
        torch_steps(env, pilot_env, sim)
    finally:
        stop_pilotd(daemon)
    return exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
