#!/usr/bin/env python3
"""A policy preempting sessions on a real GPU (issue 29 item 4: Controls.preemptible / preempt /
resume, scheduling/preempt.py), about a minute:

    PYTHONPATH=/tmp/site python3 tests/gpu/policy_preempt_check.py   (from the repository root)

pilotd runs the test policy tests/gpu/preempt_probe_policy.py (`[priority] preempt = true`,
`preempt_chunk = 1`): every session's kernels launch as preemptible variants, and every 50 ms a
session that launched is preempted (its own retreat word raised), held 10 ms once pilotd saw
its cut launches leave the SMs, and resumed. The program (built here) launches a kernel once
and sleeps 0.3 s (pilotd makes the variants from the module's load meanwhile), then queues a
kernel whose blocks each spin BLOCK_US on the GPU clock and count their runs, LAUNCHES times,
each launch about 20 ms of GPU time, and checks every block ran exactly LAUNCHES times.

For block times of 20 us, 200 us and 2 ms: the program's check (PASS: every block once per
launch, whatever the preemptions), preemptions made and drained with launches in flight (at
least 5 each), the drain latency's p50 / p99 over those, from the policy's request to pilotd
seeing the session off the GPU (polled every 50 us at first), and the GPU's own counts (the
tally: launches preempted, blocks deferred).
Writes $OUT/policy_preempt.md; exits 1 if a check failed.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scheduler_check
from scheduler_check import OUT, Pilotd, check

REPO = Path(__file__).resolve().parents[2]
ARCH = scheduler_check.ARCH
LAUNCHES = 25
LAUNCH_MS = 20.0  # GPU time per launch, about
RESIDENT = 132 * 16  # blocks of 128 threads an H100/H200 holds at once

SPIN = r"""
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__global__ void spin(unsigned *count, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    if (threadIdx.x == 0) atomicAdd(&count[blockIdx.x], 1u);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    double block_us = atof(argv[1]);
    int blocks = atoi(argv[2]), launches = atoi(argv[3]);
    unsigned *d = NULL;
    if (cudaMalloc(&d, (size_t)blocks * 4) != cudaSuccess) return 3;
    spin<<<1, 128>>>(d, 0);  // the module is loaded: pilotd makes its variants meanwhile
    cudaDeviceSynchronize();
    usleep(300000);
    cudaMemset(d, 0, (size_t)blocks * 4);
    for (int i = 0; i < launches; i++) spin<<<blocks, 128>>>(d, (unsigned long long)(block_us * 1000));
    cudaError_t e = cudaDeviceSynchronize();
    unsigned *h = (unsigned *)malloc((size_t)blocks * 4);
    cudaMemcpy(h, d, (size_t)blocks * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < blocks; i++) bad += h[i] != (unsigned)launches;
    printf("%s blocks %d launches %d wrong %d error %s\n", bad || e ? "FAIL" : "OK", blocks, launches,
           bad, cudaGetErrorString(e));
    return bad || e ? 1 : 0;
}
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="pilot-polpre-", dir="/tmp"))
    rows = []
    try:
        src, exe = work / "spin.cu", work / "spin"
        src.write_text(SPIN)
        subprocess.run(["nvcc", "-O2", f"-arch={ARCH}", "-cudart", "shared", "-o", str(exe), str(src)],
                       check=True)
        config = work / "probe.toml"
        config.write_text(
            "[priority]\npreempt = true\npreempt_chunk = 1\n"
            f'[policy]\nname = "preempt_probe"\nplugins = ["{REPO}/tests/gpu/preempt_probe_policy.py"]\n'
            "[policy.preempt_probe]\nperiod = 0.05\nhold = 0.01\n")
        for block_us in (20.0, 200.0, 2000.0):
            blocks = int(RESIDENT * LAUNCH_MS * 1000 / block_us)
            tag = f"probe-{int(block_us)}us"
            d = Pilotd(work, tag, "--config", str(config))
            try:
                start = time.monotonic()
                p = subprocess.run([str(exe), str(block_us), str(blocks), str(LAUNCHES)],
                                   env=d.client_env, capture_output=True, text=True, timeout=120)
                took = time.monotonic() - start
                check(p.returncode == 0 and p.stdout.startswith("OK"),
                      f"{block_us:g} us blocks: every block ran once per launch under preemption "
                      f"({p.stdout.strip()} {p.stderr.strip()[-300:]})")
                pre = d.ctl("priority", "list").get("preemption") or {}
                time.sleep(0.2)
                log = d.log()
            finally:
                d.stop()
            drained = re.findall(r"preempt_probe: session \d+ cut (\d+) latency_us ([\d.]+) inflight (\d+)",
                                 log)
            lat = [float(us) for _cut, us, _n in drained]
            cuts = [int(cut) for cut, _us, _n in drained]
            inflight = [int(n) for _cut, _us, n in drained]
            stuck = len(re.findall(r"preempt_probe: .* not drained", log))
            tally = (pre.get("tenants") or {})
            preempted = sum(t.get("preempted", 0) for t in tally.values())
            deferred = sum(t.get("blocks_deferred", 0) for t in tally.values())
            # with launches on the GPU (in flight at the raise; `cut` counts those still to leave
            # when pilotd looked, which 20 us blocks may all have done already)
            cut_lat = [v for v, n in zip(lat, inflight, strict=True) if n]
            check(len(cut_lat) >= 5 and stuck == 0,
                  f"{block_us:g} us blocks: {len(lat)} preemptions drained ({len(cut_lat)} with "
                  f"launches in flight, {sum(1 for c in cuts if c)} still leaving when pilotd looked), "
                  f"{stuck} not drained")
            check(pre.get("policy_preemptions", 0) >= len(lat) and preempted > 0,
                  f"{block_us:g} us blocks: pilotd counted {pre.get('policy_preemptions')} policy "
                  f"preemptions; the GPU {preempted} launches preempted, {deferred} blocks deferred")
            row = {"block_us": block_us, "blocks": blocks, "seconds": round(took, 2),
                   "preemptions": len(lat), "with_cut": len(cut_lat),
                   "still_leaving": sum(1 for c in cuts if c),
                   "p50_us": round(pct(cut_lat, 0.5), 1), "p99_us": round(pct(cut_lat, 0.99), 1),
                   "max_us": round(max(cut_lat), 1) if cut_lat else None,
                   "mean_us": round(statistics.fmean(cut_lat), 1) if cut_lat else None,
                   "gpu_preempted": preempted, "gpu_deferred": deferred,
                   "inflight_median": statistics.median(inflight) if inflight else None,
                   "jit_s": pre.get("jit_seconds")}
            rows.append(row)
            print("INFO", row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = ["| block | blocks per launch | run (s) | preemptions (with launches in flight) | "
             "drain p50 us | p99 us | max us | GPU: launches preempted | blocks deferred |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['block_us']:g} us | {r['blocks']} | {r['seconds']} | {r['preemptions']} "
                     f"({r['with_cut']}) | {r['p50_us']} | {r['p99_us']} | {r['max_us']} | "
                     f"{r['gpu_preempted']} | {r['gpu_deferred']} |")
    table = "\n".join(lines)
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "policy_preempt.md").write_text(
        "# A policy preempting sessions (tests/gpu/policy_preempt_check.py)\n\n" + table + "\n")
    return 1 if scheduler_check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
