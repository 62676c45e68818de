#!/usr/bin/env python3
"""Loop-level preemption (issue 29 item 3; ptx_preempt.py's loop-level variants) on a real GPU,
by hand or as run_all.sh's `loop_preempt` stage (about 2 minutes on an H100/H200):

    PYTHONPATH=<dir holding the pilot package> python3 tests/gpu/loop_preempt_check.py [--out DIR]

Part 1, the variants driven directly (as tests/gpu/preempt_check.py drives the block-level
ones), on kernels whose grid the GPU holds at once, so that a block-level retreat has nothing
to defer: `smooth` (a shared-memory stencil iterated between barriers: UNIFORM checks),
`hashloop` (a per-thread loop after an early return, no barrier: PER_THREAD checks) and
sgemm16 of tests/gpu/matmul_tiled.cu (its k loop between barriers: UNIFORM). Each is
idempotent (what it writes depends on its inputs only), as loop-level preemption requires.
1. Results: the loop-level variant with its word raised at a random moment, then its rest
   (which runs the abandoned blocks again from their start, then what was never claimed), run
   after run until at least 100 runs had blocks abandoned (the GPU's tally) or the kernel's
   budget is spent; every run's output must equal the original's byte for byte.
2. Overhead without a raise: the original, the block-level variant and the loop-level one, each
   as pilotd runs it (counter, first part, rest), medians of 15.
3. Latency: `hashloop` with blocks of 1 ms and 10 ms: from the word landing on the GPU (an event
   behind its write on a stream of the greatest priority) to the first part's end, p50 / p99
   of 20, for the loop-level variant and for the block-level one (whose running blocks finish
   their logical block first).
Part 2, pilotd end to end: a program of these kernels (built here), natively, then three times
under pilotd with `[priority] preempt_chaos = "1ms"` and `loop_preempt_programs` naming it:
its output must be the native one each time, and pilotd's log must count blocks abandoned.
Writes loop_preempt.md and loop_preempt.json under --out; exits 1 if a check failed.

`--diagnose KERNEL` (smooth, hashloop or _Z7sgemm16PKfS0_Pfiii; DIAGNOSE_RUNS, DIAGNOSE_ONLY a
regular expression of the cases' labels, SMOOTH_REPS) runs the variants in a dozen ways (no
raise, raised, a rest alone from main claims or from a full redo list, a first part from 0 at
full occupancy) and prints, per way, the runs whose output differs and where: how the twentieth
session found that passing a claim's count through shared memory broke kernels like `smooth`.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import preempt_check as pc
from preempt_check import ONE, ZERO, Case, busy_wait, report

from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.ptx_cache import ptxas

REPO = Path(__file__).resolve().parents[2]
MIN_ABANDONING_RUNS = 100
BUDGET_S = 12.0  # per kernel for the random preemptions

KERNELS = pc.SMOOTH + r"""
extern "C" __global__ void hashloop(const unsigned *in, unsigned *out, int n, int reps) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned v = in[i];
    for (int r = 0; r < reps; r++) v = v * 2654435761u + (v >> 13) + (unsigned)r;
    out[i] = v;
}
"""

PROGRAM = r"""
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
""" + KERNELS + r"""
int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 1056, launches = argc > 2 ? atoi(argv[2]) : 40;
    int n = blocks * 256;
    float *fin, *fout; unsigned *uin, *uout;
    cudaMalloc(&fin, n * 4); cudaMalloc(&fout, n * 4); cudaMalloc(&uin, n * 4); cudaMalloc(&uout, n * 4);
    float *hf = (float *)malloc(n * 4); unsigned *hu = (unsigned *)malloc(n * 4);
    for (int i = 0; i < n; i++) { hf[i] = (float)((i * 7919) % 1000) / 1000.f; hu[i] = i * 2654435761u; }
    cudaMemcpy(fin, hf, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(uin, hu, n * 4, cudaMemcpyHostToDevice);
    unsigned long long sum = 0;
    for (int l = 0; l < launches; l++) {
        smooth<<<blocks, 256>>>(fin, fout, 400 + l);
        hashloop<<<blocks, 256>>>(uin, uout, n - l, 20000 + 100 * l);
        cudaMemcpy(hf, fout, n * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(hu, uout, n * 4, cudaMemcpyDeviceToHost);
        for (int i = 0; i < n; i++) { unsigned b; memcpy(&b, &hf[i], 4); sum = sum * 31 + b + hu[i]; }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("checksum %016llx error %s\n", sum, cudaGetErrorString(e));
    return e != cudaSuccess;
}
""".replace("#include <stdlib.h>", "#include <stdlib.h>\n#include <string.h>")


class LoopRunner(pc.Runner):
    """preempt_check's runner with the loop-level variants loaded and a redo list."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(out_dir)
        self.redo_blocks = 32 * self.sms
        self.redo = self.be.mem_alloc(pp.redo_bytes(self.redo_blocks))
        self.modes: dict[str, str] = {}

    def load(self, module: str, ptx: str) -> pp.Rewritten:
        rewritten = pp.rewrite_module(ptx, loops=True)
        compiled = self.cache.compile(rewritten.ptx, "sm_90", ptxas)
        self.jit[module] = {"first_s": compiled.seconds, "cached_s": 0.0, "first_hit": compiled.hit,
                            "second_hit": False}
        self.load_image(module, compiled.image, rewritten)
        for kernel, r in rewritten.kernels.items():
            self.modes[kernel] = r.loop_mode or f"none ({r.loop_reason or r.reason})"
            print(f"INFO {module} {kernel}: loop-level {self.modes[kernel]}")
        return rewritten

    def grid_of(self, c: Case, suffix: str) -> int:
        fn = self.functions[(c.module, c.kernel + suffix)]
        per_sm = self.be.occupancy(fn.handle, math.prod(c.block), c.shared, 0)
        return max(1, min(math.prod(c.grid), per_sm * self.sms, self.redo_blocks))

    def part(self, c: Case, suffix: str, blocks: int, first: int, flag: bool = True) -> None:
        """A first part (flag: reads the word) or a rest (flag False), with the redo list for a
        loop-level variant; a first part empties the list first, as pilotd does."""
        loop = suffix == pp.LOOP_SUFFIX
        if loop and flag:
            self.be.stream_write_word(self.stream, self.redo, 0)
            self.be.stream_write_word(self.stream, self.redo + 4, 0)
        args = pp.variant_args(c.scalars(c.ptrs), pp.variant_params(
            c.grid, self.ctl, self.flag if flag else 0, 1, first, self.tally, 0,
            self.redo if loop else 0, 0 if flag else 1))
        self.be.launch(self.functions[(c.module, c.kernel + suffix)], (blocks, 1, 1), c.block, c.shared,
                       self.stream, args)

    def steps(self, c: Case, suffix: str) -> None:
        """pilotd's steps without a raise: counter, first part, rest."""
        blocks = self.grid_of(c, suffix)
        self.start(blocks)
        self.part(c, suffix, blocks, blocks)
        self.part(c, suffix, blocks, 0, flag=False)


def cases(sms: int) -> list[Case]:
    rnd = random.Random(3)
    blocks = sms * 8  # 8 blocks of 256 threads per SM: the grid fits at once
    n = blocks * 256
    floats = pc._pattern(pc._f32([rnd.random() for _ in range(4093)]), 4 * n)
    words = rnd.randbytes(4 * n)
    dim = 1024
    mat = pc._pattern(pc._f32([rnd.randrange(-16, 17) / 8 for _ in range(4099)]), 4 * dim * dim)
    return [
        Case("own", "smooth", (blocks, 1, 1), (256, 1, 1), 0, [floats, bytes(4 * n)], [1],
             lambda p: struct.pack("<QQi", p[0], p[1], int(os.environ.get("SMOOTH_REPS", "3000")))),
        Case("own", "hashloop", (blocks, 1, 1), (256, 1, 1), 0, [words, bytes(4 * n)], [1],
             lambda p: struct.pack("<QQii", p[0], p[1], n - 77, 400000)),
        Case("matmul_tiled", "_Z7sgemm16PKfS0_Pfiii", (dim // 16, dim // 16, 1), (16, 16, 1), 0,
             [mat, mat, bytes(4 * dim * dim)], [2],
             lambda p: struct.pack("<QQQiii", p[0], p[1], p[2], dim, dim, dim)),
    ]


def check_results(r: LoopRunner, c: Case, rnd: random.Random) -> dict[str, Any]:
    """Part 1.1 (module docstring)."""
    r.prepare(c)
    r.original(c)
    reference = r.outputs(c)
    blocks = r.grid_of(c, pp.LOOP_SUFFIX)
    duration = r.timed(lambda: r.steps(c, pp.LOOP_SUFFIX), 3)
    runs = abandoning = abandoned = bad = 0
    deadline = time.monotonic() + BUDGET_S
    while abandoning < MIN_ABANDONING_RUNS and time.monotonic() < deadline:
        r.prepare(c)
        r.reset_tally()
        r.retreat(ZERO)
        r.be.stream_synchronize(r.side)
        r.start(blocks)
        r.part(c, pp.LOOP_SUFFIX, blocks, blocks)
        busy_wait(rnd.random() * duration)
        r.retreat(ONE)
        r.be.stream_synchronize(r.stream)
        r.retreat(ZERO)
        r.be.stream_synchronize(r.side)
        r.part(c, pp.LOOP_SUFFIX, blocks, 0, flag=False)
        r.be.stream_synchronize(r.stream)
        runs += 1
        t = r.read_tally()
        abandoning += t.abandoned > 0
        abandoned += t.abandoned
        if r.outputs(c) != reference or r.counter() < math.prod(c.grid):
            bad += 1
    name = f"{c.module} {c.kernel} grid {c.grid} ({r.modes.get(c.kernel)})"
    report(bad == 0, f"{name}: identical after loop-level preemption",
           f"{runs} runs, {abandoning} with blocks abandoned ({abandoned} blocks run again), "
           f"{blocks} persistent blocks, {duration * 1e6:.0f} us per run")
    report(abandoning >= MIN_ABANDONING_RUNS, f"{name}: at least {MIN_ABANDONING_RUNS} runs preempted "
           "inside their blocks", str(abandoning))
    r.free(c)
    return {"kernel": c.kernel, "mode": r.modes.get(c.kernel), "runs": runs, "abandoning_runs": abandoning,
            "blocks_abandoned": abandoned, "run_us": duration * 1e6, "ok": bad == 0}


def overhead(r: LoopRunner, c: Case) -> dict[str, float]:
    """Part 1.2: median seconds of the original and of each variant's steps."""
    r.prepare(c)
    out = {"original": r.timed(lambda: r.original(c))}
    for label, suffix in (("block-level", pp.SUFFIX), ("loop-level", pp.LOOP_SUFFIX)):
        out[label] = r.timed(lambda s=suffix: r.steps(c, s))
    r.free(c)
    return out


def latency(r: LoopRunner, block_ms: float) -> dict[str, list[float]]:
    """Part 1.3: seconds from the word landing to the first part's end, per variant."""
    probe = cases(r.sms)[1]
    r.prepare(probe)
    reps0 = 400000
    t0 = r.timed(lambda: r.original(probe), 3)  # blocks of reps0 iterations, one wave
    reps = max(1000, int(reps0 * block_ms / 1e3 / t0))
    n = math.prod(probe.grid) * 256
    probe.scalars = lambda p: struct.pack("<QQii", p[0], p[1], n - 77, reps)
    landed, end = r.be.event_create(0), r.be.event_create(0)
    out: dict[str, list[float]] = {}
    for label, suffix in (("block-level", pp.SUFFIX), ("loop-level", pp.LOOP_SUFFIX)):
        blocks = r.grid_of(probe, suffix)
        gpu = []
        for _ in range(20):
            r.retreat(ZERO)
            r.be.stream_synchronize(r.side)
            r.start(blocks)
            r.part(probe, suffix, blocks, blocks)
            r.be.event_record(end, r.stream)
            busy_wait(0.3 * block_ms / 1e3)
            r.retreat(ONE)
            r.be.event_record(landed, r.side)
            r.be.event_synchronize(end)
            r.be.stream_synchronize(r.side)
            gpu.append(max(0.0, r.be.event_elapsed_ms(landed, end) / 1e3))
            r.retreat(ZERO)
            r.be.stream_synchronize(r.side)
            r.part(probe, suffix, blocks, 0, flag=False)
            r.be.stream_synchronize(r.stream)
        out[label] = gpu
    r.free(probe)
    return out


def end_to_end(tmp: Path, out_dir: Path) -> dict[str, Any]:
    """Part 2 (module docstring)."""
    src, exe = tmp / "loop_kernels.cu", tmp / "loop_kernels"
    src.write_text(PROGRAM)
    subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-cudart", "shared", "-o", str(exe), str(src)], check=True)
    native = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    report(native.returncode == 0, "loop_kernels natively", native.stdout.strip())
    config = tmp / "loop.toml"
    config.write_text('[daemon]\nlog_level = "info"\n[priority]\npreempt_chaos = "1ms"\n'
                      'loop_preempt_programs = ["loop_kernels"]\n')
    sock, log_path = tmp / "pilotd.sock", out_dir / "pilotd-loop.log"
    env = {**os.environ, "PILOT_SOCKET": str(sock)}
    env.pop("LD_PRELOAD", None)
    daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "cuda",
                               "--socket", str(sock), "--state-dir", str(tmp / "state"),
                               "--metrics-address", "", "--config", str(config)],
                              stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env)
    outputs = []
    try:
        deadline = time.monotonic() + 60
        while "pilotd ready" not in log_path.read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pilotd did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        shim = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "shim-path"], capture_output=True,
                              text=True, check=True).stdout.strip()
        for _ in range(3):
            p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                               env={**env, "LD_PRELOAD": shim})
            outputs.append(p.stdout.strip())
            report(p.returncode == 0 and p.stdout == native.stdout, "loop_kernels under pilotd, chaos and "
                   "loop-level preemption: the native output",
                   f"{p.stdout.strip()} {p.stderr.strip()[-300:]}")
        time.sleep(0.3)
    finally:
        daemon.terminate()
        try:
            daemon.wait(15)
        except subprocess.TimeoutExpired:
            daemon.kill()
    log = log_path.read_text()
    ends = re.findall(r"(\d+) preemptible launches, (\d+) preemptions, (\d+) blocks deferred, "
                      r"(\d+) retreats, (\d+) blocks abandoned", log)
    totals = [sum(int(e[i]) for e in ends) for i in range(5)]
    report(totals[4] > 0, "pilotd counted blocks abandoned inside and run again",
           f"{totals[0]} preemptible launches, {totals[1]} preemptions, {totals[2]} blocks deferred, "
           f"{totals[3]} retreats, {totals[4]} blocks abandoned over {len(ends)} sessions")
    return {"native": native.stdout.strip(), "pilot": outputs, "launches": totals[0], "preempted": totals[1],
            "deferred": totals[2], "retreats": totals[3], "abandoned": totals[4]}


def diagnose(r: LoopRunner, c: Case, runs: int, rnd: random.Random) -> None:
    """--diagnose KERNEL: which elements differ, in which logical blocks, against which redo
    entries; without a raise, with one for the loop-level variant, and for the block-level one."""
    r.prepare(c)
    r.original(c)
    reference = r.outputs(c)
    blocks = r.grid_of(c, pp.LOOP_SUFFIX)
    duration = r.timed(lambda: r.steps(c, pp.LOOP_SUFFIX), 3)
    per_block = len(reference) // math.prod(c.grid)
    for label, suffix, raise_it, grid in (("loop, no raise", pp.LOOP_SUFFIX, False, blocks),
                                          ("block-level, 100 blocks, no raise", pp.SUFFIX, False, 100),
                                          ("loop, 100 blocks, no raise", pp.LOOP_SUFFIX, False, 100),
                                          ("block-level, 100 blocks, first 0", pp.SUFFIX, False, -100),
                                          ("block-level, raised", pp.SUFFIX, True, blocks),
                                          ("loop, raised", pp.LOOP_SUFFIX, True, blocks)):
        if os.environ.get("DIAGNOSE_ONLY") and not re.search(os.environ["DIAGNOSE_ONLY"], label):
            continue
        bad = []
        first = max(grid, 0)
        for _ in range(runs):
            r.prepare(c)
            r.retreat(ZERO)
            r.be.stream_synchronize(r.side)
            r.start(first)
            r.part(c, suffix, abs(grid), first)
            if raise_it:
                busy_wait(rnd.random() * duration)
                r.retreat(ONE)
            r.be.stream_synchronize(r.stream)
            redo = bytearray(pp.redo_bytes(blocks))
            r.be.memcpy_dtoh(redo, r.redo, len(redo), r.stream)
            made = struct.unpack_from("<I", redo)[0]
            pairs = [struct.unpack_from("<II", redo, 8 + 8 * i) for i in range(made)]
            entries = {f for f, n in pairs for f in range(f, f + n)}
            odd = [p for p in pairs if p[1] != 1 or p[0] >= math.prod(c.grid)]
            r.retreat(ZERO)
            r.be.stream_synchronize(r.side)
            r.part(c, suffix, abs(grid), 0, flag=False)
            r.be.stream_synchronize(r.stream)
            got = r.outputs(c)
            wrong = sorted({i // per_block for i in range(0, len(got), 4)
                            if got[i:i + 4] != reference[i:i + 4]})
            if wrong:
                bad.append((len(wrong), len(entries), sum(1 for b in wrong if b in entries), wrong[:6]))
                if len(bad) <= 3:
                    b = wrong[0] * per_block
                    words = sum(1 for i in range(b, b + per_block, 4) if got[i:i + 4] != reference[i:i + 4])
                    print(f"INFO diagnose detail: block {wrong[0]}: reference "
                          f"{struct.unpack_from('<4f', reference, b)} got "
                          f"{struct.unpack_from('<4f', got, b)}; "
                          f"{made} entries, {len(pairs) - len(set(pairs))} repeated, odd {odd[:4]}; "
                          f"wrong words in the block {words}", flush=True)
        print(f"INFO diagnose {c.kernel} {label}: {len(bad)} of {runs} runs wrong; (blocks wrong, "
              f"redo entries, wrong blocks among them, first wrong) {bad[:8]}", flush=True)
    total = math.prod(c.grid)
    for label, suffix, redo, flag, tally in (
            ("rest only, main claims, block-level", pp.SUFFIX, False, False, True),
            ("rest only, main claims, block-level, no tally", pp.SUFFIX, False, False, False),
            ("first part from 0, word down, block-level, tally", pp.SUFFIX, False, True, True),
            ("first part from 0, word down, block-level, no tally", pp.SUFFIX, False, True, False),
            ("rest only, redo entries, loop", pp.LOOP_SUFFIX, True, False, True)):
        if os.environ.get("DIAGNOSE_ONLY") and not re.search(os.environ["DIAGNOSE_ONLY"], label):
            continue
        wrong_runs = []
        for _ in range(runs):
            r.prepare(c)
            r.reset_tally()
            r.be.stream_write_word(r.stream, r.ctl, total if redo else 0)
            listed = struct.pack("<II", total if redo else 0, 0) + b"".join(
                struct.pack("<II", x, 1) for x in (range(total) if redo else ()))
            r.be.memcpy_htod(r.redo, listed, len(listed), r.stream)
            args = pp.variant_args(c.scalars(c.ptrs), pp.variant_params(
                c.grid, r.ctl, r.flag if flag else 0, 1, 0, r.tally if tally else 0, 0,
                r.redo if suffix == pp.LOOP_SUFFIX else 0, 0 if flag else 1))
            r.be.launch(r.functions[(c.module, c.kernel + suffix)], (blocks, 1, 1), c.block, c.shared,
                        r.stream, args)
            r.be.stream_synchronize(r.stream)
            got = r.outputs(c)
            wrong = [i // per_block for i in range(0, len(got), per_block) if got[i:i + per_block]
                     != reference[i:i + per_block]]
            if wrong:
                wrong_runs.append((len(wrong), wrong[:4]))
        print(f"INFO diagnose {c.kernel} {label}: {len(wrong_runs)} of {runs} runs wrong {wrong_runs[:6]}",
              flush=True)
    r.free(c)


def main() -> int:
    if "--diagnose" in sys.argv:
        at = sys.argv.index("--diagnose")
        kernel = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        out_dir = pc.out_dir_arg()
        r = LoopRunner(out_dir)
        with tempfile.TemporaryDirectory() as tmp:
            own = Path(tmp) / "own.cu"
            own.write_text(KERNELS)
            r.load("own", pc.ptx_of(own, Path(tmp)))
            r.load("matmul_tiled", pc.ptx_of(REPO / "tests/gpu/matmul_tiled.cu", Path(tmp)))
            for c in cases(r.sms):
                if c.kernel == kernel:
                    diagnose(r, c, int(os.environ.get("DIAGNOSE_RUNS", "30")), random.Random(5))
        return 0
    out_dir = pc.out_dir_arg()
    r = LoopRunner(out_dir)
    rnd = random.Random(293)
    with tempfile.TemporaryDirectory() as tmp:
        own = Path(tmp) / "own.cu"
        own.write_text(KERNELS)
        r.load("own", pc.ptx_of(own, Path(tmp)))
        r.load("matmul_tiled", pc.ptx_of(REPO / "tests/gpu/matmul_tiled.cu", Path(tmp)))
        results = [check_results(r, c, rnd) for c in cases(r.sms)]
        costs = {c.kernel: overhead(r, c) for c in cases(r.sms)}
        lat = {ms: latency(r, ms) for ms in (1.0, 10.0)}
        e2e = end_to_end(Path(tmp), out_dir)
    lines = ["| kernel | checks | runs | runs with blocks abandoned | blocks run again | identical |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {x['kernel']} | {x['mode']} | {x['runs']} | {x['abandoning_runs']} | "
              f"{x['blocks_abandoned']} | {'yes' if x['ok'] else 'NO'} |" for x in results]
    lines += ["", "| kernel | original us | block-level steps us (ratio) | loop-level steps us (ratio) |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {v['original'] * 1e6:.1f} | {v['block-level'] * 1e6:.1f} "
              f"({v['block-level'] / v['original']:.3f}) | {v['loop-level'] * 1e6:.1f} "
              f"({v['loop-level'] / v['original']:.3f}) |" for k, v in costs.items()]
    lines += ["", "| block | block-level p50 us | p99 us | loop-level p50 us | p99 us |",
              "|---|---|---|---|---|"]
    for ms, by in lat.items():
        q = {k: statistics.quantiles(v, n=100) for k, v in by.items()}
        lines.append(f"| {ms:g} ms | {statistics.median(by['block-level']) * 1e6:.0f} | "
                     f"{q['block-level'][98] * 1e6:.0f} | {statistics.median(by['loop-level']) * 1e6:.0f} | "
                     f"{q['loop-level'][98] * 1e6:.0f} |")
    lines += ["", f"pilotd end to end (loop_kernels, 3 runs, preempt_chaos 1ms): {e2e}"]
    table = "\n".join(lines)
    print("INFO\n" + table)
    (out_dir / "loop_preempt.md").write_text("# Loop-level preemption (tests/gpu/loop_preempt_check.py)\n\n"
                                             + table + "\n")
    (out_dir / "loop_preempt.json").write_text(json.dumps(
        {"results": results, "overhead_s": costs, "latency_s": lat, "end_to_end": e2e}, indent=1))
    print(f"{'FAIL' if pc.failures else 'PASS'} loop_preempt_check: {len(pc.failures)} failed")
    return 1 if pc.failures else 0


if __name__ == "__main__":
    sys.exit(main())
