#!/usr/bin/env python3
"""One tenant of bench/tenants.py: a PyTorch process that builds three workloads once and runs
whichever the coordinator names, in time windows shared with the other tenants.

    python3 bench/tenant_worker.py [--workloads transformer,cnn,graph]

Workloads (own models, small enough that one step takes a few milliseconds on an H100):
  transformer  a GPT-style decoder (4 layers, d=384, 6 heads, sequence 256, batch 16), bf16
               autocast, scaled_dot_product_attention (causal), fused AdamW: one training step
  cnn          a small residual CNN (4 stages, 32x32 inputs, batch 64), SGD with momentum
  graph        inference of an MLP (4 layers of 1024, batch 64) compiled with
               torch.compile(mode="reduce-overhead"): every call is one CUDA graph launch
  infer        inference of the transformer above (batch 4, sequence 128, bf16, no grad): one
               request of bench/priority_tally.py's latency-critical tenant

Protocol on stdin/stdout (one line each):
  -> "ready"                                   once every workload is built and warmed
  <- "run WORKLOAD START WARM MEASURE"         START: a time.time() to begin at; WARM and MEASURE
                                               in seconds
  -> "result WORKLOAD STEPS T1 T2 ..."         the steps completed inside the measured window and
                                               each one's time in ms (synchronized per step)
  <- "serve WORKLOAD START DURATION GAP SEED"  requests arriving from START (a time.time()) for
                                               DURATION s at exponential gaps of mean GAP ms
                                               (seeded), each one step served in arrival order;
                                               a few unmeasured steps first if there is time
                                               before START, and each arrival awaited by a sleep
                                               to ~1 ms before it, then a spin
  -> "served WORKLOAD N L1 L2 ..."             each request's latency in ms: from its arrival to
                                               its step's end (its wait behind earlier ones too)
  -> "service WORKLOAD N S1 S2 ..."            right after: each request's service time in ms,
                                               from its step's start to its end (synchronized)
  <- "quit"
Errors go to stderr and end the process with a non-zero status.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Step = Callable[[], None]
SPIN_S = 0.001  # serve: an arrival is awaited by a sleep to this much before it, then a spin
WARM_S, WARM_STEPS, WARM_MARGIN_S = 0.5, 20, 0.1  # serve: warm-up steps in the last WARM_S before START


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab: int = 4096, d: int = 384, layers: int = 4, heads: int = 6,
                 seq: int = 256) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def transformer_step(dev: torch.device) -> Step:
    model = Gpt().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, 4096, (16, 257), device=dev, generator=gen)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


def cnn_step(dev: torch.device) -> Step:
    chans = [32, 64, 128, 256]
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()]
    cin = 32
    for i, c in enumerate(chans):
        layers.append(ResBlock(cin, c, 1 if i == 0 else 2))
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(64, 3, 32, 32, device=dev, generator=gen)
    y = torch.randint(0, 10, (64,), device=dev, generator=gen)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def graph_step(dev: torch.device) -> Step:
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 1024, device=dev)

    def step() -> None:
        with torch.no_grad():
            compiled(x)
    return step


def infer_step(dev: torch.device) -> Step:
    model = Gpt().to(dev).eval()
    gen = torch.Generator(device=dev).manual_seed(1)
    tokens = torch.randint(0, 4096, (4, 128), device=dev, generator=gen)

    def step() -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(tokens)
    return step


BUILDERS: dict[str, Callable[[torch.device], Step]] = {
    "transformer": transformer_step, "cnn": cnn_step, "graph": graph_step, "infer": infer_step}


def serve(step: Step, start: float, duration: float, gap_ms: float,
          seed: int) -> tuple[list[float], list[float]]:
    """Requests at exponential gaps (mean gap_ms) from `start` (a time.time()) for `duration`,
    served one at a time in arrival order: each one's latency (from its arrival to its step's end)
    and service time (from its step's start to its end), in ms.

    Before `start`, if there is time, a few unmeasured steps (caches and clocks warm after the
    idle wait for this command). Each arrival is awaited by sleeping until ~1 ms before it, then
    spinning, so that a sleeping thread's wake-up is neither in the latency nor, by a cold CPU,
    in the service time. Intervals are on time.perf_counter(), `start` mapped onto it once."""
    rnd = random.Random(seed)
    offsets, t = [], 0.0
    while True:
        t += rnd.expovariate(1e3 / gap_ms)
        if t > duration:
            break
        offsets.append(t)
    p0 = time.perf_counter()
    wall = time.time()
    origin = (p0 + time.perf_counter()) / 2 + (start - wall)  # `start` on the perf_counter clock
    # warm-up: up to WARM_STEPS steps, each begun only if twice the slowest so far fits before
    # WARM_MARGIN_S before start
    warm_from = origin - WARM_S
    sleep_until(warm_from)
    step_s = 0.0
    for _ in range(WARM_STEPS):
        t0 = time.perf_counter()
        if t0 + 2 * step_s + WARM_MARGIN_S > origin:
            break
        step()
        torch.cuda.synchronize()
        step_s = max(step_s, time.perf_counter() - t0)
    latencies, services = [], []
    for offset in offsets:
        arrival = origin + offset
        sleep_until(arrival)
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        latencies.append((t1 - arrival) * 1e3)
        services.append((t1 - t0) * 1e3)
    return latencies, services


def sleep_until(when: float) -> None:
    """Until time.perf_counter() reaches `when`: a sleep to SPIN_S before it, then a spin."""
    left = when - time.perf_counter() - SPIN_S
    if left > 0:
        time.sleep(left)
    while time.perf_counter() < when:
        pass


def window(step: Step, start: float, warm: float, measure: float) -> list[float]:
    """Steps from START: those that end inside [START+WARM, START+WARM+MEASURE] are measured."""
    while time.time() < start:
        time.sleep(min(0.01, max(0.0, start - time.time())))
    t_on, t_off = start + warm, start + warm + measure
    times: list[float] = []
    while True:
        t0 = time.time()
        step()
        torch.cuda.synchronize()
        t1 = time.time()
        if t1 > t_off:
            return times
        if t0 >= t_on:
            times.append((t1 - t0) * 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(BUILDERS))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    steps = {}
    for name in args.workloads.split(","):
        steps[name] = BUILDERS[name](dev)
        for _ in range(5):  # build caches, compile, capture
            steps[name]()
        torch.cuda.synchronize()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "serve" and len(words) == 6 and words[1] in steps:
            lat, svc = serve(steps[words[1]], float(words[2]), float(words[3]), float(words[4]),
                             int(words[5]))
            print("served", words[1], len(lat), " ".join(f"{t:.3f}" for t in lat), flush=True)
            print("service", words[1], len(svc), " ".join(f"{t:.3f}" for t in svc), flush=True)
            continue
        if words[0] != "run" or len(words) != 5 or words[1] not in steps:
            print(f"tenant_worker: bad command {line.strip()!r}", file=sys.stderr, flush=True)
            return 2
        times = window(steps[words[1]], float(words[2]), float(words[3]), float(words[4]))
        print("result", words[1], len(times), " ".join(f"{t:.3f}" for t in times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
