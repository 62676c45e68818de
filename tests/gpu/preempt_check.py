#!/usr/bin/env python3
"""Preemptible persistent-block kernels (daemon/backends/ptx_preempt.py) on a real GPU, by hand
or as run_all.sh's `preempt` stage (under 3 minutes on an H100):

    PYTHONPATH=<dir holding the pilot package> python3 tests/gpu/preempt_check.py [--out DIR]

For each kernel (vadd of tests/apps/vector_add.cu, sgemm16 and sgemm32 of
tests/gpu/matmul_tiled.cu, and five of its own: a 3D-grid stamp of every block's index and the
grid, a read-modify-write and a spinning kernel that a block run twice would change, a
shared-memory histogram with atomics and a grid-stride loop over %nctaid, and a shared-memory
stencil whose long blocks synchronize, four waves of them, added after the twentieth session
and not yet run here):
1. JIT: the module's PTX rewritten and compiled with ptxas through the image cache, twice (the
   second is the cache's hit: what a second start costs).
2. Results: the original kernel once (the reference), then the preemptible variant with the
   retreat flag set at random moments (a busy wait of a random part of the kernel's time, then
   the flag written from another stream) and resumed from its counter until every logical
   block ran, run after run until at least 100 preemptions (a launch that ended with blocks left
   to run) happened or the kernel's time budget is spent. Every run's output must equal the
   reference byte for byte (PASS/FAIL per kernel, with the count of preemptions).
3. Overhead: the variant without preemption against the original (CUDA events, median of 15),
   at three input sizes, claiming 1 and 8 logical blocks at a time (the control block's
   chunk), alone and as pilotd's four steps (counter, variant, wait on the word, rest), and
   pilotd's steps with 4 preemptible parts (three more waits and launches); the
   geomean per size for chunk 1, for the better chunk of each kernel, and for what
   `preempt_chunk = "auto"` keeps with `preempt_parts = 1`, the default (the better chunk's four
   steps, or the original when that costs more than 5%) (issue 29's target: <= 1.05x at every
   size). The random preemptions of 2 use chunks of 1, 3 and 8.
4. Preemption latency: a kernel whose blocks each spin 10 us .. 10 ms; the time from the flag's
   write (cuStreamWriteValue32 on a stream of the greatest priority, as pilotd raises it) to the
   kernel's end event, p50 and p99 over 30 requests, on the host's clock and on the GPU's
   (target: p99 <= 50 us for blocks of <= 20 us), beside the tally's spread histogram of the
   same retreats (what pilot_preempt_retreat_seconds exports).
5. The tally (VERSION 3; VERSION 6's parts): pilotd's steps on four kernels, 60 launches each
   of 1 to 4 preemptible parts and a last one, each part raised before it starts (as
   preempt_chaos does) or at a random moment; the GPU's counts of preemptions and deferred
   blocks must equal what the counters say.
Prints PASS/FAIL lines and INFO tables; writes preempt.md and preempt.json under --out; exits 1
if any check failed. Asks for a few hundred MiB of device memory at most.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.cuda import CudaBackend, check
from pilot.daemon.backends.ptx_cache import ImageCache, ptxas
from pilot.daemon.scheduling.preempt_choice import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
MIN_PREEMPTIONS = 100
BUDGET_S = 10.0  # per kernel for the random preemptions
ONE, ZERO = struct.pack("<I", 1), struct.pack("<I", 0)

# a shared-memory stencil whose long blocks synchronize (also loop_preempt_check.py's)
SMOOTH = r"""
extern "C" __global__ void smooth(const float *in, float *out, int reps) {
    __shared__ float tile[258];
    int i = blockIdx.x * 256 + threadIdx.x;
    tile[threadIdx.x + 1] = in[i];
    if (threadIdx.x == 0) { tile[0] = 0.f; tile[257] = 0.f; }
    __syncthreads();
    for (int r = 0; r < reps; r++) {
        float v = 0.25f * tile[threadIdx.x] + 0.5f * tile[threadIdx.x + 1] + 0.25f * tile[threadIdx.x + 2];
        __syncthreads();
        tile[threadIdx.x + 1] = v + 1e-3f * (float)(r & 7);
        __syncthreads();
    }
    out[i] = tile[threadIdx.x + 1];
}
"""

OWN = SMOOTH + r"""
extern "C" __global__ void stamp(unsigned *out) {
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned t = threadIdx.x + blockDim.x * threadIdx.y;
    out[b * blockDim.x * blockDim.y + t] = blockIdx.x ^ (blockIdx.y << 11) ^ (blockIdx.z << 22)
        ^ ((gridDim.x * gridDim.y * gridDim.z) << 3) ^ (threadIdx.y << 29);
}
extern "C" __global__ void accumulate(float *x, int n, int reps) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int r = 0; r < reps; r++) v = v * 1.0001f + 1.0f;
    x[i] = v;
}
extern "C" __global__ void histogram(const unsigned *in, unsigned *bins, int n) {
    __shared__ unsigned local[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local[(in[i] * 2654435761u) >> 24], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&bins[i], local[i]);
}
extern "C" __global__ void spin(long long cycles, unsigned *out) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    if (threadIdx.x == 0) out[blockIdx.x] += 1;
}
"""

failures: list[str] = []


def report(ok: bool, name: str, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


@dataclass
class Case:
    """One kernel at one size: its launch, its buffers (initial bytes), and which it writes."""

    module: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    buffers: list[bytes]
    outputs: list[int]  # indexes into buffers
    scalars: Callable[[list[int]], bytes]  # device pointers -> packed arguments
    ptrs: list[int] = field(default_factory=list)


def _f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _u32(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def _pattern(data: bytes, size: int) -> bytes:
    """`data` repeated to `size` bytes (large inputs without a Python loop per element)."""
    return (data * (size // len(data) + 1))[:size]


def cases(size: int) -> list[Case]:
    """Every kernel at size 0 (small), 1 (medium) or 2 (large)."""
    rnd = random.Random(size)
    n = (1 << 16, 1 << 20, 1 << 22)[size]
    dim = (128, 512, 1024)[size]
    mat = _pattern(_f32([rnd.randrange(-16, 17) / 8 for _ in range(4099)]), 4 * dim * dim)
    out: list[Case] = []
    out.append(Case("vector_add", "_Z4vaddPKfS0_Pfi", (-(-n // 256), 1, 1), (256, 1, 1), 0,
                    [_pattern(_f32([float(i) for i in range(1000)]), 4 * n), _pattern(_f32([0.5]), 4 * n),
                     bytes(4 * n)],
                    [2], lambda p: struct.pack("<QQQi", p[0], p[1], p[2], n)))
    for kernel, block, shared, tile in (("_Z7sgemm16PKfS0_Pfiii", (16, 16, 1), 0, 16),
                                        ("_Z7sgemm32PKfS0_Pfiii", (32, 8, 1), 2 * 32 * 33 * 4, 32)):
        out.append(Case("matmul_tiled", kernel, (-(-dim // tile), -(-dim // tile), 1), block, shared,
                        [mat, mat, bytes(4 * dim * dim)], [2],
                        lambda p, d=dim: struct.pack("<QQQiii", p[0], p[1], p[2], d, d, d)))
    g = ((8, 4, 2), (32, 16, 4), (64, 32, 16))[size]
    out.append(Case("own", "stamp", g, (16, 4, 1), 0, [bytes(4 * 64 * math.prod(g))], [0],
                    lambda p: struct.pack("<Q", p[0])))
    out.append(Case("own", "accumulate", (-(-n // 256), 1, 1), (256, 1, 1), 0,
                    [_pattern(_f32([rnd.random() for _ in range(4093)]), 4 * n)], [0],
                    lambda p: struct.pack("<Qii", p[0], n, 256)))
    out.append(Case("own", "histogram", (max(1, n // 4096), 1, 1), (256, 1, 1), 0,
                    [rnd.randbytes(4 * n), bytes(4 * 256)], [1],
                    lambda p: struct.pack("<QQi", p[0], p[1], n)))
    # long blocks that synchronize, four waves of an H100/H200: blocks claim at full occupancy
    # (what broke the first VERSION 5 claim: bench/RESULTS.md, twentieth session)
    sblocks = 132 * 8 * 4
    out.append(Case("own", "smooth", (sblocks, 1, 1), (256, 1, 1), 0,
                    [_pattern(_f32([rnd.random() for _ in range(4093)]), 4 * 256 * sblocks),
                     bytes(4 * 256 * sblocks)], [1],
                    lambda p: struct.pack("<QQi", p[0], p[1], (30, 300, 3000)[size])))
    return out


class Runner:
    def __init__(self, out_dir: Path) -> None:
        self.be = CudaBackend()
        self.be.bind_thread(0)
        cu = self.be._cu
        attr = cu.CUdevice_attribute
        dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
        self.sms = int(check(cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute"))
        self.khz = int(check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev),
                             "cuDeviceGetAttribute"))
        self.stream = self.be.stream_create(1, 0)
        greatest = self.be.stream_priority_range()[1]
        self.side = self.be.stream_create(1, greatest)  # the preemptor's
        self.ctl = self.be.mem_alloc(pp.SLOT_BYTES)  # the variant's slot: its counter first
        self.flag = self.be.mem_alloc(4)  # its retreat word, written as pilotd writes it
        self.tally = self.be.mem_alloc(pp.TALLY_BYTES)  # what the GPU counts of preemptions
        self.be.memcpy_htod(self.flag, ZERO, 4, self.stream)
        self.be.memcpy_htod(self.ctl, bytes(pp.SLOT_BYTES), pp.SLOT_BYTES, self.stream)
        self.reset_tally()
        self.cache = ImageCache(str(out_dir / "ptx-cache"))
        self.functions: dict[tuple[str, str], Any] = {}
        self.jit: dict[str, dict[str, float]] = {}

    # ---- modules ----
    def load(self, module: str, ptx: str) -> pp.Rewritten:
        rewritten = pp.rewrite_module(ptx)
        first = self.cache.compile(rewritten.ptx, "sm_90", ptxas)
        second = self.cache.compile(rewritten.ptx, "sm_90", ptxas)
        self.jit[module] = {"first_s": first.seconds, "cached_s": second.seconds,
                            "first_hit": first.hit, "second_hit": second.hit}
        report(second.hit and first.image == second.image, f"{module}: image cache",
               f"ptxas {first.seconds * 1e3:.0f} ms{' (already cached)' if first.hit else ''}, "
               f"second start {second.seconds * 1e3:.2f} ms")
        self.load_image(module, first.image, rewritten)
        for kernel, r in rewritten.kernels.items():
            if r.variant is None:
                print(f"INFO {module} {kernel}: not rewritten: {r.reason}")
        return rewritten

    def load_image(self, module: str, image: bytes, rewritten: pp.Rewritten) -> None:
        """The compiled module: each kernel's original and its variants (block-level, and
        loop-level where the rewrite made one) by name."""
        handle = self.be.module_load(image)
        for kernel, r in rewritten.kernels.items():
            for name in (kernel, r.variant, r.loop):
                if name is not None:
                    self.functions[(module, name)] = self.be.function_get(handle, name)

    # ---- buffers ----
    def prepare(self, c: Case) -> None:
        if not c.ptrs:
            c.ptrs = [self.be.mem_alloc(max(len(b), 4)) for b in c.buffers]
        for ptr, data in zip(c.ptrs, c.buffers, strict=True):
            self.be.memcpy_htod(ptr, data, len(data), self.stream)
        self.be.stream_synchronize(self.stream)

    def outputs(self, c: Case) -> bytes:
        out = b""
        for i in c.outputs:
            buf = bytearray(len(c.buffers[i]))
            self.be.memcpy_dtoh(buf, c.ptrs[i], len(buf), self.stream)
            out += bytes(buf)
        return out

    def free(self, c: Case) -> None:
        for ptr in c.ptrs:
            self.be.mem_free(ptr)
        c.ptrs = []

    # ---- launches ----
    def original(self, c: Case) -> None:
        self.be.launch(self.functions[(c.module, c.kernel)], c.grid, c.block, c.shared,
                       self.stream, c.scalars(c.ptrs))

    def persistent_grid(self, c: Case) -> int:
        fn = self.functions[(c.module, c.kernel + pp.SUFFIX)]
        per_sm = self.be.occupancy(fn.handle, math.prod(c.block), c.shared, 0)
        return max(1, min(math.prod(c.grid), per_sm * self.sms))

    def variant(self, c: Case, blocks: int, chunk: int = 1, first: int = 0, tally: bool = False,
                flag: bool = True, part: int | None = None) -> None:
        """The variant over `blocks` persistent blocks; the first `first` of them run their own
        index without a claim (the counter must hold `first`: start()). tally: counted in the
        tally as pilotd's launches are; flag False: a last part that never retreats; part: which
        part of the launch (default: 0 with a flag, 1 without)."""
        part = (0 if flag else 1) if part is None else part
        args = pp.variant_args(c.scalars(c.ptrs), pp.variant_params(
            c.grid, self.ctl, self.flag if flag else 0, chunk, first, self.tally if tally else 0,
            part=part))
        self.be.launch(self.functions[(c.module, c.kernel + pp.SUFFIX)], (blocks, 1, 1), c.block,
                       c.shared, self.stream, args)

    def start(self, first: int) -> None:
        """The counter at `first`, on the launch's stream (what pilotd queues before a variant)."""
        self.be.stream_write_word(self.stream, self.ctl, first)

    def reset_tally(self) -> None:
        self.be.memcpy_htod(self.tally, bytes(pp.TALLY_BYTES), pp.TALLY_BYTES, self.stream)
        self.be.stream_synchronize(self.stream)

    def read_tally(self) -> pp.Tally:
        buf = bytearray(pp.TALLY_BYTES)
        self.be.memcpy_dtoh(buf, self.tally, len(buf), self.stream)
        return pp.Tally.parse(bytes(buf))

    def counter(self) -> int:
        buf = bytearray(pp.COUNTER_BYTES)
        self.be.memcpy_dtoh(buf, self.ctl, len(buf), self.stream)
        return struct.unpack("<I", buf)[0]

    def retreat(self, value: bytes) -> None:
        """The retreat word, as pilotd raises it: cuStreamWriteValue32 on a stream of the
        greatest priority."""
        self.be.stream_write_word(self.side, self.flag, struct.unpack("<I", value)[0])

    def timed(self, launch: Callable[[], None], reps: int = 15) -> float:
        """Median seconds of `launch` between two events (after one warm-up)."""
        start, end = self.be.event_create(0), self.be.event_create(0)
        times = []
        for i in range(reps + 1):
            self.be.event_record(start, self.stream)
            launch()
            self.be.event_record(end, self.stream)
            self.be.event_synchronize(end)
            if i:
                times.append(self.be.event_elapsed_ms(start, end) / 1e3)
        return statistics.median(times)


def busy_wait(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def check_results(r: Runner, c: Case, rnd: random.Random) -> dict[str, Any]:
    """The variant, preempted at random moments, against the original (module docstring, 2)."""
    total = math.prod(c.grid)
    r.prepare(c)
    r.original(c)
    reference = r.outputs(c)
    blocks = r.persistent_grid(c)
    r.prepare(c)
    first = min(blocks, total)
    duration = r.timed(lambda: (r.start(first), r.variant(c, blocks, 1, first)), 3)
    preemptions = runs = bad = 0
    deadline = time.monotonic() + BUDGET_S
    while preemptions < MIN_PREEMPTIONS and time.monotonic() < deadline:
        r.prepare(c)
        chunk = rnd.choice((1, 3, 8))
        r.start(first)
        runs += 1
        for launch in range(256):
            done = r.counter() if launch else 0
            if done >= total:
                break
            r.retreat(ZERO)
            r.be.stream_synchronize(r.side)
            r.variant(c, blocks if launch == 0 else min(blocks, total - done), chunk,
                      first if launch == 0 else 0)
            busy_wait(rnd.random() * duration)
            r.retreat(ONE)
            r.be.stream_synchronize(r.stream)
            if r.counter() < total:
                preemptions += 1
        else:
            bad += 1  # never finished
        if r.outputs(c) != reference:
            bad += 1
    r.retreat(ZERO)
    r.be.stream_synchronize(r.side)
    name = f"{c.module} {c.kernel} grid {c.grid}"
    report(bad == 0, f"{name}: identical after preemption",
           f"{runs} runs, {preemptions} preemptions, {blocks} persistent blocks, "
           f"{duration * 1e6:.0f} us per run")
    if preemptions < MIN_PREEMPTIONS:
        print(f"INFO {name}: only {preemptions} preemptions within {BUDGET_S:.0f} s "
              "(the kernel is too short to be caught often)")
    r.free(c)
    return {"kernel": c.kernel, "grid": c.grid, "runs": runs, "preemptions": preemptions, "ok": bad == 0}


TALLY_RUNS = 60
TALLY_PARTS = 4  # a launch of check_tally has 1 up to this many preemptible parts


def check_tally(r: Runner, c: Case, rnd: random.Random) -> dict[str, Any]:
    """pilotd's steps (scheduling/preempt.py) with the tally, as a chain of 1 up to TALLY_PARTS
    preemptible parts (`[priority] preempt_parts`) and a last one without a word: each
    preemptible part raised before it starts or at a random moment. What the GPU counted must
    be what the counters say: a preemption per later part that ran blocks (a retreat before it
    left them), the blocks the later parts ran deferred; a retreat per part some block saw the
    word in (at least one per preemption), one spread each."""
    total = math.prod(c.grid)
    r.prepare(c)
    r.original(c)
    reference = r.outputs(c)
    blocks = r.persistent_grid(c)
    first = min(blocks, total)
    duration = r.timed(lambda: (r.start(first), r.variant(c, blocks, 1, first, tally=True)), 3)
    r.reset_tally()
    preempted = deferred = bad = chained = 0
    for _ in range(TALLY_RUNS):
        r.prepare(c)
        chunk = rnd.choice((1, 3, 8))
        parts = rnd.randint(1, TALLY_PARTS)
        chained += parts > 1
        r.start(first)
        done = first
        for part in range(parts + 1):
            last = part == parts
            early = not last and rnd.random() < 0.5  # raised before the part: a first wave
            r.retreat(ONE if early else ZERO)  # only, or nothing; else at a random moment
            r.be.stream_synchronize(r.side)
            r.variant(c, blocks, chunk, first if part == 0 else 0, tally=True, flag=not last, part=part)
            if not early and not last:
                busy_wait(rnd.random() * duration)
                r.retreat(ONE)
            r.be.stream_synchronize(r.stream)
            now = r.counter()
            if part == 0:
                deferred += total - min(now, total)
            elif done < total and now > done:
                preempted += 1  # a later part ran blocks a retreat left
            done = now
        r.retreat(ZERO)
        r.be.stream_synchronize(r.side)
        bad += r.outputs(c) != reference
    got = r.read_tally()
    ok = (bad == 0 and (got.preempted, got.deferred) == (preempted, deferred)
          and got.retreats >= got.preempted and sum(got.spread) == got.retreats)
    name = f"{c.module} {c.kernel} grid {c.grid}"
    report(ok, f"{name}: the GPU's tally matches the counters",
           f"{TALLY_RUNS} launches ({chained} of several preemptible parts): preemptions "
           f"{got.preempted} (counters: {preempted}), blocks deferred {got.deferred} ({deferred}), "
           f"retreats {got.retreats}, spread buckets {list(got.spread)}; outputs wrong: {bad}")
    r.free(c)
    return {"kernel": c.kernel, "grid": c.grid, "preempted": got.preempted, "expected": preempted,
            "deferred": got.deferred, "expected_deferred": deferred, "retreats": got.retreats,
            "spread": list(got.spread), "chained": chained, "ok": ok}


CHUNKS = (1, 8)  # logical blocks per claim whose overhead is measured


PARTS = 4  # [priority] preempt_parts: the chained steps' cost is measured at 4 parts


def overhead(r: Runner, c: Case) -> tuple[float, list[float], list[float], float]:
    """The original's time and, at each of CHUNKS without preemption: the variant's alone (the
    retreat word read at every claim, and clear), and pilotd's four steps (the counter written,
    the variant, the wait on the word, the rest: what a gated launch costs); and pilotd's steps
    with PARTS preemptible parts (each later one a wait and a launch that finds nothing left)
    at the better chunk."""
    r.prepare(c)
    r.retreat(ZERO)
    r.be.stream_synchronize(r.side)
    native = r.timed(lambda: r.original(c))
    blocks = r.persistent_grid(c)
    start, end = r.be.event_create(0), r.be.event_create(0)
    variants, steps = [], []
    first = min(blocks, math.prod(c.grid))

    def four(chunk: int, parts: int = 1) -> None:
        r.start(first)
        r.variant(c, blocks, chunk, first, tally=True)
        for part in range(1, parts + 1):
            r.be.stream_wait_word(r.stream, r.flag, 0)
            r.variant(c, blocks, chunk, 0, tally=True, flag=part < parts, part=part)

    for chunk in CHUNKS:
        times = []
        for i in range(16):
            r.start(first)  # outside the timed span
            r.be.event_record(start, r.stream)
            r.variant(c, blocks, chunk, first, tally=True)
            r.be.event_record(end, r.stream)
            r.be.event_synchronize(end)
            if i:
                times.append(r.be.event_elapsed_ms(start, end) / 1e3)
        variants.append(statistics.median(times))
        steps.append(r.timed(lambda chunk=chunk: four(chunk)))
    better = CHUNKS[steps.index(min(steps))]
    chained = r.timed(lambda: four(better, PARTS))
    r.free(c)
    return native, variants, steps, chained


def auto_ratio(native: float, steps: list[float]) -> tuple[float, bool]:
    """What `preempt_chunk = "auto"` would cost (preempt_choice.decide on these medians): the
    best chunk's four steps over the original, or 1 with the original kept."""
    best = min(steps)
    return (1.0, True) if best > TOLERANCE * native else (best / native, False)


def latency(r: Runner, block_us: float) -> tuple[list[float], list[float]]:
    """Seconds from the retreat's write to the kernel's end, 30 requests (module docstring, 4):
    as the host sees it (from the call that enqueues the write to the end event's query), and
    on the GPU's clock (an event recorded on the retreat's stream behind the write, so once it
    landed, to the kernel's end event): the second is what a higher-priority kernel queued
    behind the write waits for the SMs."""
    cycles = int(block_us * r.khz / 1e3)
    blocks = r.persistent_grid(Case("own", "spin", (r.sms * 64, 1, 1), (128, 1, 1), 0, [], [],
                                    lambda p: b""))
    total = max(blocks * 4, int(0.02e6 / block_us) * blocks)  # runs well past the request
    counts = r.be.mem_alloc(4 * total)
    spin = Case("own", "spin", (total, 1, 1), (128, 1, 1), 0, [], [],
                lambda p: struct.pack("<qQ", cycles, counts), [counts])
    landed, end = r.be.event_create(0), r.be.event_create(0)
    host, gpu = [], []
    for _ in range(30):
        r.retreat(ZERO)
        r.be.stream_synchronize(r.side)
        r.start(blocks)
        r.variant(spin, blocks, 1, blocks, tally=True)
        r.be.event_record(end, r.stream)
        busy_wait(max(0.002, 3 * block_us / 1e6))
        t0 = time.perf_counter()
        r.retreat(ONE)
        r.be.event_record(landed, r.side)  # behind the write: it has landed by then
        while not r.be.event_query(end):
            pass
        host.append(time.perf_counter() - t0)
        r.be.stream_synchronize(r.side)
        gpu.append(r.be.event_elapsed_ms(landed, end) / 1e3)
        r.retreat(ZERO)  # the rest, as pilotd runs it: the GPU's tally takes the retreat's spread
        r.be.stream_synchronize(r.side)
        r.variant(spin, blocks, 1, 0, tally=True, flag=False)
        r.be.stream_synchronize(r.stream)
    r.be.mem_free(counts)
    return host, gpu


def ptx_of(source: Path, tmp: Path) -> str:
    out = tmp / f"{source.stem}.ptx"
    subprocess.run([shutil.which("nvcc") or "nvcc", "-ptx", "-arch=sm_90", "-o", str(out), str(source)],
                   check=True)
    return out.read_text()


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def out_dir_arg() -> Path:
    """--out (default $OUT or /tmp/pilot-gpu-out), made."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/pilot-gpu-out"))
    out_dir = Path(parser.parse_args().out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def main() -> int:
    out_dir = out_dir_arg()
    r = Runner(out_dir)
    rnd = random.Random(29)
    with tempfile.TemporaryDirectory() as tmp:
        own = Path(tmp) / "own.cu"
        own.write_text(OWN)
        for module, src in (("vector_add", REPO / "tests/apps/vector_add.cu"),
                            ("matmul_tiled", REPO / "tests/gpu/matmul_tiled.cu"), ("own", own)):
            r.load(module, ptx_of(src, Path(tmp)))
    results = [check_results(r, c, rnd) for c in cases(2)]
    spin_case = Case("own", "spin", (r.sms * 64, 1, 1), (128, 1, 1), 0, [bytes(4 * r.sms * 64)], [0],
                     lambda p: struct.pack("<qQ", int(20 * r.khz / 1e3), p[0]))
    results.append(check_results(r, spin_case, rnd))
    rows, per_size, best = [], {0: [], 1: [], 2: []}, {0: [], 1: [], 2: []}
    best_steps: dict[int, list[float]] = {0: [], 1: [], 2: []}
    chained_steps: dict[int, list[float]] = {0: [], 1: [], 2: []}
    auto: dict[int, list[tuple[float, bool]]] = {0: [], 1: [], 2: []}
    for size in (0, 1, 2):
        for c in cases(size):
            native, variants, steps, chained = overhead(r, c)
            chained_steps[size].append(chained / native)
            per_size[size].append(variants[0] / native)
            best[size].append(min(variants) / native)
            best_steps[size].append(min(steps) / native)
            auto[size].append(auto_ratio(native, steps))  # preempt_parts = 1, the default
            rows.append((size, c.kernel, c.grid, native, variants, steps, chained))
    tallies = [check_tally(r, c, rnd) for c in cases(1)[:4]]
    lat, spreads = {}, {}
    for us in (10, 20, 100, 1000, 10000):
        r.reset_tally()
        lat[us] = latency(r, us)
        spreads[us] = list(r.read_tally().spread)  # the metric's histogram, 30 retreats
    names = ("small", "medium", "large")
    lines = ["| size | kernel | grid | native us | "
             + " | ".join(f"chunk {k} us (ratio)" for k in CHUNKS) + " | "
             + " | ".join(f"four steps, chunk {k} (ratio)" for k in CHUNKS)
             + f" | {PARTS} parts, better chunk (ratio) |",
             "|---|---|---|---|" + "---|" * (2 * len(CHUNKS) + 1)]
    lines += [f"| {names[s]} | {k} | {g} | {n * 1e6:.1f} | "
              + " | ".join(f"{v * 1e6:.1f} ({v / n:.3f})" for v in vs) + " | "
              + " | ".join(f"{v * 1e6:.1f} ({v / n:.3f})" for v in st)
              + f" | {ch * 1e6:.1f} ({ch / n:.3f}) |"
              for s, k, g, n, vs, st, ch in rows]
    lines += ["", "| size | geomean ratio, chunk 1 | best chunk | four steps, best chunk | "
              f"steps with {PARTS} parts, better chunk | four steps, auto (originals kept) |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {names[s]} | {geomean(v):.3f} | {geomean(best[s]):.3f} | {geomean(best_steps[s]):.3f} | "
              f"{geomean(chained_steps[s]):.3f} | "
              f"{geomean([a for a, _ in auto[s]]):.3f} ({sum(k for _, k in auto[s])} of {len(auto[s])}) |"
              for s, v in per_size.items()]
    lines += ["", "| block duration | host p50 us | host p99 us | GPU p50 us | GPU p99 us | "
              "tally's spread buckets (us: retreats) |", "|---|---|---|---|---|---|"]
    for us, (host, gpu) in lat.items():
        qh, qg = statistics.quantiles(host, n=100), statistics.quantiles(gpu, n=100)
        hist = ", ".join(f"<{pp.bucket_bound_s(k) * 1e6:.0f}: {n}" for k, n in enumerate(spreads[us]) if n)
        lines.append(f"| {us} us | {statistics.median(host) * 1e6:.1f} | {qh[98] * 1e6:.1f} | "
                     f"{statistics.median(gpu) * 1e6:.1f} | {qg[98] * 1e6:.1f} | {hist} |")
    lines += ["", "| module | ptxas ms | second start ms |", "|---|---|---|"]
    lines += [f"| {m} | {j['first_s'] * 1e3:.0f} | {j['cached_s'] * 1e3:.2f} |" for m, j in r.jit.items()]
    table = "\n".join(lines)
    print("INFO\n" + table)
    (out_dir / "preempt.md").write_text(table + "\n")
    (out_dir / "preempt.json").write_text(json.dumps(
        {"results": results, "tallies": tallies, "overhead": rows, "latency_s": lat,
         "spread_buckets": spreads, "jit": r.jit}, indent=1, default=str))
    for s, v in per_size.items():
        print(f"INFO overhead geomean ({names[s]}): chunk 1 {geomean(v):.3f}x, best chunk "
              f"{geomean(best[s]):.3f}x; pilotd's four steps at the best chunk "
              f"{geomean(best_steps[s]):.3f}x, auto {geomean([a for a, _ in auto[s]]):.3f}x "
              f"({sum(k for _, k in auto[s])} kernels keep the original) (target <= 1.05)")
    for i, clock in enumerate(("host", "GPU")):
        small = [x for us in (10, 20) for x in lat[us][i]]
        print(f"INFO preemption p99 for blocks <= 20 us ({clock}): "
              f"{statistics.quantiles(small, n=100)[98] * 1e6:.1f} us (target <= 50)")
    print(f"{'FAIL' if failures else 'PASS'} preempt_check: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
