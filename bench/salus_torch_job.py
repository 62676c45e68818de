#!/usr/bin/env python3
"""A PyTorch training job for the salus policy: an MLP of a few sizes trained on random data,
`--iterations` steps (forward, backward, SGD step, zero_grad(set_to_none=True), loss.item(),
which synchronizes). Prints `iterations N ok`, `jct_s SECONDS` and `step_ms MEDIAN` (the median
step of the second half, when the allocator is warm).

    pilot run -- python3 bench/salus_torch_job.py --size small --iterations 200

Sizes (parameters, fp32): small 4 x 1024^2 (16 MiB), medium 8 x 2048^2 (128 MiB), large
8 x 4096^2 (512 MiB); the batch's activations and the gradients are the ephemeral part.
PyTorch's caching allocator keeps freed blocks, so pilot would see no iteration boundary:
run it with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (bench/salus_bench.py does), whose
frees reach pilot as they are made (docs/POLICIES.md, "salus" says what each choice costs)."""

from __future__ import annotations

import argparse
import statistics
import time

SIZES = {"small": (1024, 4), "medium": (2048, 8), "large": (4096, 8)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args()
    t0 = time.monotonic()
    import torch

    width, depth = SIZES[args.size]
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, bias=False), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loss_value = 0.0
    steps: list[float] = []
    for _ in range(args.iterations):
        started = time.monotonic()
        x = torch.randn(args.batch, width, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        del x, loss
        steps.append(time.monotonic() - started)
    ok = loss_value == loss_value  # not NaN
    print(f"iterations {args.iterations} {'ok' if ok else 'nan'}")
    print(f"jct_s {time.monotonic() - t0:.3f}")
    if steps:
        print(f"step_ms {1000 * statistics.median(steps[len(steps) // 2:]):.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
