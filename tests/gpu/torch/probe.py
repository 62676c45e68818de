"""How far PyTorch gets under pilot (issue 13), one step per process so that a failure in one
does not hide the next: python3 probe.py STEP. Each step checks its result against the CPU and
prints one line, `STEP ok ...` or raises. Steps: init, alloc, ops, copy, matmul, conv, triton,
train (3 SGD steps of a small CNN + MLP in fp32, then 3 under bf16 autocast)."""

from __future__ import annotations

import math
import sys
import time


def main(step: str) -> None:
    import torch

    t0 = time.perf_counter()
    if step == "init":
        ok = torch.cuda.is_available()
        n = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        print(f"init ok available={ok} devices={n} name={name!r}")
        return
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g)
    if step == "alloc":
        x = torch.empty(1 << 20, device=dev)
        x.fill_(2.0)
        s = float(x.sum().item())
        assert s == 2.0 * (1 << 20), s
        print(f"alloc ok sum={s}")
    elif step == "ops":
        x = a.to(dev)
        y = (x * 3 + 1).relu().exp().log1p()
        ref = (a * 3 + 1).relu().exp().log1p()
        assert torch.allclose(y.cpu(), ref, rtol=1e-5, atol=1e-6)
        m = x.max().item()
        assert m == a.max().item()
        print(f"ops ok max={m:.4f}")
    elif step == "copy":
        b = a.pin_memory().to(dev, non_blocking=True)
        c = b.clone()
        d = torch.empty_like(c)
        d.copy_(c)
        torch.cuda.synchronize()
        assert torch.equal(d.cpu(), a)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            e = d * 2
        s.synchronize()
        assert torch.equal(e.cpu(), a * 2)
        print("copy ok")
    elif step == "matmul":
        p = torch.randn(256, 128, generator=g)
        q = torch.randn(128, 64, generator=g)
        torch.backends.cuda.matmul.allow_tf32 = False
        r = (p.to(dev) @ q.to(dev)).cpu()
        assert torch.allclose(r, p @ q, rtol=1e-4, atol=1e-4)
        print(f"matmul ok norm={float(r.norm()):.3f}")
    elif step == "conv":
        torch.backends.cudnn.allow_tf32 = False
        conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        x = torch.randn(2, 3, 16, 16, generator=g, requires_grad=True)
        ref = conv(x)
        ref.sum().backward()
        gref = x.grad.clone()
        x.grad = None
        cconv = conv.to(dev)
        xd = x.detach().to(dev).requires_grad_()
        out = cconv(xd)
        out.sum().backward()
        assert torch.allclose(out.cpu(), ref, rtol=1e-4, atol=1e-4)
        assert torch.allclose(xd.grad.cpu(), gref, rtol=1e-4, atol=1e-4)
        print("conv ok")
    elif step == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

        x = a.to(dev)
        out = torch.empty_like(x)
        add[(triton.cdiv(1000, 256),)](x, x, out, 1000, BLOCK=256)
        assert torch.equal(out.cpu(), a + a)
        print("triton ok")
    elif step == "train":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10))
        xs = torch.randn(16, 3, 16, 16, generator=g)
        ys = torch.randint(0, 10, (16,), generator=g)
        ref = torch.nn.functional.cross_entropy(model(xs), ys).item()
        model = model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for k in range(6):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=k >= 3):
                loss = torch.nn.functional.cross_entropy(model(xs.to(dev)), ys.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - ref) < 1e-3 * max(1.0, abs(ref)), (losses[0], ref)
        assert all(math.isfinite(v) for v in losses) and losses[2] < losses[0], losses
        print("train ok losses=" + ",".join(f"{v:.4f}" for v in losses))
    else:
        raise SystemExit(f"unknown step {step}")
    print(f"{step} took {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1])
