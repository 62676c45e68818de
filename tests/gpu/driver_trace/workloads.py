#!/usr/bin/env python3
"""One PyTorch / Triton workload per process, run under the tracing libcuda by driver_trace.sh.

    python3 workloads.py NAME      NAME: init ops matmul conv triton mlp all

Each checks its results against the CPU (or exact values) and prints `ok NAME ...`; a wrong result
exits 1. It also says whether the libcuda.so.1 mapped in the process is the tracer (directory in
DRIVER_TRACE_DIR), so a run that bypassed the tracer cannot pass for a trace. After warm-up, each
brackets a loop of its main operation with the tracer's snapshots (`<phase>:begin`,
`<phase>:end:<iterations>`), which give the driver calls per iteration. Memory: < 1 GiB.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)


_snapshot: Callable[[bytes], int] | None = None


def snapshot(label: str) -> None:
    """The tracer's driver_trace_snapshot(label), when the libcuda.so.1 loaded is the tracer."""
    global _snapshot
    if _snapshot is None:
        try:
            fn = ctypes.CDLL("libcuda.so.1").driver_trace_snapshot
            fn.argtypes, fn.restype = [ctypes.c_char_p], ctypes.c_int
            _snapshot = fn
        except (OSError, AttributeError):
            _snapshot = lambda label: -1  # noqa: E731 (not traced: nothing to record)
    _snapshot(label.encode())


def steady(torch, phase: str, iterations: int, body: Callable[[int], object]) -> None:
    """Runs body(i) `iterations` times between two snapshots, synchronized on both sides."""
    torch.cuda.synchronize()
    snapshot(f"{phase}:begin")
    for i in range(iterations):
        body(i)
    torch.cuda.synchronize()
    snapshot(f"{phase}:end:{iterations}")


def libcuda_maps() -> list[str]:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if line.count(" ") >= 5 and "/" in line}
    return sorted(p for p in paths if os.path.basename(p).startswith("libcuda.so"))


def w_init(torch) -> str:
    torch.cuda.init()
    x = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    check(float(x.sum()) == 4.0, "ones(4).sum()")
    return f"device={torch.cuda.get_device_name(0)}"


def w_ops(torch) -> str:
    dev = "cuda"
    g = torch.Generator().manual_seed(1)
    host = torch.randn(1 << 20, generator=g)
    pinned = host.pin_memory()
    a = host.to(dev)                              # pageable H2D
    b = pinned.to(dev, non_blocking=True)         # pinned H2D
    c = (a * 2 + b).exp_().clamp_(max=50.0)       # elementwise
    check(torch.allclose(c.cpu(), (host * 3).exp().clamp(max=50.0), rtol=1e-5), "elementwise")
    check(abs(float(a.sum()) - float(host.double().sum())) < 1.0, "sum")
    check(float(a.max()) == float(host.max()), "max")
    check(torch.equal(a.argsort()[:10].cpu(), host.argsort()[:10]), "argsort")
    sizes = [512, 4096, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # bytes: small pool, large pool, > 32 MiB
    bufs = [torch.empty(n // 4, device=dev) for n in sizes]
    for t in bufs:
        t.fill_(1.5)
    check(all(float(t[-1]) == 1.5 for t in bufs), "fill")
    del bufs
    torch.cuda.empty_cache()
    big = [torch.zeros(64 << 20, dtype=torch.uint8, device=dev) for _ in range(4)]   # 4 x 64 MiB
    torch.cuda.synchronize()
    del big
    d = torch.empty_like(a)
    d.copy_(a)                                     # D2D
    out = torch.empty(1 << 20, pin_memory=True)
    out.copy_(d, non_blocking=True)                # D2H async
    s = torch.cuda.Stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        e0.record()
        f = d.mul(0.5)
        e1.record()
    e1.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    check(torch.equal(out, host), "D2D + D2H")
    check(torch.allclose(f.cpu(), host * 0.5), "side stream")
    idx = torch.randint(0, 1 << 20, (4096,), device=dev)
    check(torch.equal(a[idx].cpu(), host[idx.cpu()]), "gather")

    def step(_: int) -> None:
        e = (a * 2 + b).exp_().clamp_(max=50.0)
        d.copy_(e)
        float(d.sum())                             # reduction, then a D2H copy that synchronizes

    steady(torch, "ops_step", 20, step)
    stats = torch.cuda.memory_stats()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return f"alloc_conf={conf!r} segments={stats.get('segment.all.allocated', 0)}"


def set_tf32(torch, on: bool) -> None:
    """TF32 for fp32 matmuls, through whichever switch this PyTorch has."""
    try:
        torch.backends.cuda.matmul.allow_tf32 = on
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"


def w_matmul(torch) -> str:
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(512, 256, generator=g), torch.randn(256, 384, generator=g)
    ref = a @ b
    set_tf32(torch, False)
    ga, gb = a.cuda(), b.cuda()
    check(torch.allclose((ga @ gb).cpu(), ref, rtol=1e-4, atol=1e-3), "fp32 matmul")
    steady(torch, "matmul_fp32", 50, lambda _: ga @ gb)
    set_tf32(torch, True)
    check(torch.allclose((ga @ gb).cpu(), ref, rtol=2e-2, atol=5e-1), "tf32 matmul")
    set_tf32(torch, False)
    for dt, tol in ((torch.bfloat16, 1.0), (torch.float16, 0.2)):
        r = (ga.to(dt) @ gb.to(dt)).float().cpu()
        check(torch.allclose(r, ref, rtol=5e-2, atol=tol), f"{dt} matmul")
    ha, hb = ga.bfloat16(), gb.bfloat16()
    steady(torch, "matmul_bf16", 50, lambda _: ha @ hb)
    bat = torch.randn(8, 64, 32, generator=g)
    check(torch.allclose(torch.bmm(bat.cuda(), bat.cuda().transpose(1, 2)).cpu(),
                         torch.bmm(bat, bat.transpose(1, 2)), rtol=1e-3, atol=1e-2), "bmm")
    lin = torch.nn.Linear(256, 128).cuda()
    check(torch.allclose(lin(ga).cpu(), torch.nn.functional.linear(a, lin.weight.cpu(), lin.bias.cpu()),
                         rtol=1e-2, atol=1e-1), "linear (bias epilogue)")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(ga).relu()
    torch.cuda.synchronize()
    check(y.dtype == torch.bfloat16 and y.shape == (512, 128), "autocast linear")
    return "fp32 tf32 bf16 fp16 bmm linear"


def w_conv(torch) -> str:
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 3, 32, 32, generator=g)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    ref = conv(x)
    ref.sum().backward()
    ref_grad = conv.weight.grad.clone()
    conv.weight.grad = None
    gconv = conv.cuda()
    gx = x.cuda().requires_grad_()
    y = gconv(gx)
    y.sum().backward()
    torch.cuda.synchronize()
    check(torch.allclose(y.detach().cpu(), ref.detach(), rtol=1e-3, atol=1e-3), "conv2d forward")
    check(torch.allclose(gconv.weight.grad.cpu(), ref_grad, rtol=1e-3, atol=1e-2), "conv2d backward")
    check(gx.grad is not None and gx.grad.shape == x.shape, "conv2d input grad")
    steady(torch, "conv_step", 20, lambda _: gconv(gx).sum().backward())
    bn = torch.nn.BatchNorm2d(16).cuda()
    z = bn(y.detach())
    torch.cuda.synchronize()
    check(abs(float(z.mean())) < 1e-3, "batchnorm (cuDNN)")
    return f"cudnn={torch.backends.cudnn.version()}"


def w_triton(torch) -> str:
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(axis=0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        total = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, total, mask=mask)

    n = 98432
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    grid = (triton.cdiv(n, 1024),)
    for _ in range(3):
        add_kernel[grid](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    check(torch.equal(out, x + y), "triton vector add")
    steady(torch, "triton_launch", 100, lambda _: add_kernel[grid](x, y, out, n, BLOCK=1024))
    return f"triton={triton.__version__}"


def w_mlp(torch) -> str:
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(5, 128, 64, device="cuda")
    target = torch.randint(0, 10, (5, 128), device="cuda")
    losses = []

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data[i]), target[i])
        loss.backward()
        opt.step()
        losses.append(float(loss))

    step(0)
    steady(torch, "mlp_step", 4, lambda i: step(i + 1))
    check(all(v == v and 0 < v < 10 for v in losses), f"losses {losses}")
    return "losses " + " ".join(f"{v:.4f}" for v in losses)


WORKLOADS = {"init": w_init, "ops": w_ops, "matmul": w_matmul, "conv": w_conv, "triton": w_triton,
             "mlp": w_mlp}


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in (*WORKLOADS, "all"):
        print(f"usage: workloads.py {{{'|'.join(WORKLOADS)}|all}}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    import torch

    check(torch.cuda.is_available(), "torch.cuda.is_available()")
    notes = [fn(torch) for key, fn in WORKLOADS.items() if name in (key, "all")]
    torch.cuda.synchronize()
    maps = libcuda_maps()
    tracer_dir = os.environ.get("DRIVER_TRACE_DIR")
    traced = bool(tracer_dir) and any(os.path.dirname(m) == os.path.realpath(tracer_dir) for m in maps)
    print(f"ok {name} traced={traced} libcuda={','.join(maps)} {time.monotonic() - t0:.1f}s | "
          + " | ".join(notes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
