"""Where a CUDA-graph inference call's time goes, natively or under pilot (run it both ways):
torch.compile(mode="reduce-overhead") of bench/tenant_worker.py's MLP; per call with a
synchronize (what tenants.py measures), the GPU time between two events around the call, and
the time per call of 200 calls issued back to back before one synchronize.

    python3 bench/graph_probe.py                       # native
    bash bench/graph_latency.sh                        # natively and under pilot
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn


def main() -> None:
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 1024, device=dev)
    with torch.no_grad():
        for _ in range(10):
            compiled(x)
        torch.cuda.synchronize()
        walls, gpu = [], []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(300):
            t0 = time.perf_counter()
            start.record()
            compiled(x)
            end.record()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
            gpu.append(start.elapsed_time(end))
        waits = {}
        for name, wait in (("stream", lambda: torch.cuda.current_stream().synchronize()),
                           ("event", lambda: end.synchronize()),
                           ("device", torch.cuda.synchronize)):
            ts = []
            for _ in range(200):
                t0 = time.perf_counter()
                compiled(x)
                end.record()
                wait()
                ts.append((time.perf_counter() - t0) * 1e3)
            waits[name] = statistics.median(ts)
        t0 = time.perf_counter()
        for _ in range(200):
            compiled(x)
        issued = (time.perf_counter() - t0) * 1e3 / 200
        torch.cuda.synchronize()
        burst = (time.perf_counter() - t0) * 1e3 / 200
    print(f"per call with sync {statistics.median(walls):.3f} ms; gpu between events "
          f"{statistics.median(gpu):.3f} ms; 200 back to back: issue {issued:.3f} ms/call, "
          f"done {burst:.3f} ms/call; per call waiting by " +
          ", ".join(f"{k} {v:.3f}" for k, v in waits.items()))


if __name__ == "__main__":
    main()
