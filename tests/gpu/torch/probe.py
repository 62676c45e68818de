"""How far PyTorch gets under pilot (issue 13), one step per process so that a failure in one
does not hide the next: python3 probe.py STEP. Each step checks its result against the CPU and
prints one line, `STEP ok ...` or raises. Steps: init, alloc, ops, copy, matmul, linear (addmm
with bias: cuBLASLt; fp32, bf16, fp16), bmm (strided batched GEMMs), conv, triton, train (3 SGD
steps of a small CNN + MLP in fp32, then 3 under bf16 autocast), mlp (200 Adam steps of an MLP
with fixed seeds: prints every loss, for comparing native and pilot runs), transformer (200 Adam
steps of a 2-layer transformer encoder, likewise), resnet18 (200 SGD steps of ResNet-18 on
synthetic 64x64 images, batch 64, deterministic algorithms). TRAIN_STEPS changes the count of
the three (issue 13 (b) asks for 200). Libraries PyTorch loads itself: fft (cuFFT), linalg
(cuSOLVER), sparse (cuSPARSE); sdpa (the fused attention backends against the math one); ipc (a
CUDA tensor shared with a child process: cudaIpc* handles).
mlp, transformer and resnet18 then print the median time of a training step
(`STEP step_ms=...`)."""

from __future__ import annotations

import math
import os
import sys
import time

TRAIN_STEPS = int(os.environ.get("TRAIN_STEPS", "200"))  # of mlp, transformer and resnet18


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
    elif step == "linear":
        torch.backends.cuda.matmul.allow_tf32 = False
        x = torch.randn(64, 96, generator=g)
        lin = torch.nn.Linear(96, 48)
        ref = lin(x)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2), (torch.float16, 1e-2)):
            out = lin.to(dev, dtype)(x.to(dev, dtype)).float().cpu()
            assert torch.allclose(out, ref, rtol=tol, atol=tol), (dtype, (out - ref).abs().max())
        print("linear ok")
    elif step == "blas2":
        # matrix-vector and dot products: cuBLAS's gemv and dot (the generic path)
        torch.backends.cuda.matmul.allow_tf32 = False
        m = torch.randn(64, 48, generator=g, dtype=torch.float64)
        v = torch.randn(48, generator=g, dtype=torch.float64)
        w = torch.randn(64, generator=g, dtype=torch.float64)
        assert torch.allclose((m.to(dev) @ v.to(dev)).cpu(), m @ v)
        assert torch.allclose((m.T.to(dev) @ w.to(dev)).cpu(), m.T @ w)
        assert torch.allclose(torch.dot(v.to(dev), v.to(dev)).cpu(), torch.dot(v, v))
        mf = m.float()
        assert torch.allclose(torch.addmv(w.float().to(dev), mf.to(dev), v.float().to(dev)).cpu(),
                              torch.addmv(w.float(), mf, v.float()), rtol=1e-4, atol=1e-4)
        print("blas2 ok")
    elif step == "bmm":
        torch.backends.cuda.matmul.allow_tf32 = False
        p = torch.randn(8, 64, 32, generator=g)
        q = torch.randn(8, 32, 16, generator=g)
        r = torch.bmm(p.to(dev), q.to(dev)).cpu()
        assert torch.allclose(r, torch.bmm(p, q), rtol=1e-4, atol=1e-4)
        t_ = torch.matmul(p.to(dev).transpose(1, 2), p.to(dev)).cpu()
        assert torch.allclose(t_, p.transpose(1, 2) @ p, rtol=1e-4, atol=1e-3)
        print("bmm ok")
    elif step == "mlp":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        xs = torch.randn(64, 784, generator=g).to(dev)
        ys = torch.randint(0, 10, (64,), generator=g).to(dev)
        losses = [_train_step(model, opt, xs, ys) for _ in range(TRAIN_STEPS)]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
        print("mlp ok losses=" + ",".join(f"{v:.6f}" for v in losses))
        print(f"mlp step_ms={_step_ms(lambda: _train_step(model, opt, xs, ys)):.3f}")
    elif step == "transformer":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        model = torch.nn.Sequential(torch.nn.Embedding(1000, 128),
                                    torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                    torch.nn.Flatten(), torch.nn.Linear(128 * 32, 10)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        xs = torch.randint(0, 1000, (16, 32), generator=g).to(dev)
        ys = torch.randint(0, 10, (16,), generator=g).to(dev)
        losses = [_train_step(model, opt, xs, ys) for _ in range(TRAIN_STEPS)]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
        print("transformer ok losses=" + ",".join(f"{v:.6f}" for v in losses))
        print(f"transformer step_ms={_step_ms(lambda: _train_step(model, opt, xs, ys)):.3f}")
    elif step == "resnet18":
        # issue 13 (b)/(e): torchvision's ResNet-18 (or the same network written out, where
        # torchvision is not installed) on synthetic 64x64 images, batch 64, SGD with momentum,
        # deterministic algorithms (cuDNN's convolutions and batch normalization)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # warn_only: adaptive average pooling's backward has no deterministic CUDA kernel
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(0)
        model, origin = _resnet18()
        model = model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        xs = torch.randn(64, 3, 64, 64, generator=g).to(dev)
        ys = torch.randint(0, 10, (64,), generator=g).to(dev)
        losses = [_train_step(model, opt, xs, ys) for _ in range(TRAIN_STEPS)]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
        model.eval()
        with torch.no_grad():
            acc = float((model(xs).argmax(1) == ys).float().mean())
        model.train()
        print(f"resnet18 ok model={origin} eval_accuracy={acc:.4f} losses=" +
              ",".join(f"{v:.6f}" for v in losses))
        print(f"resnet18 step_ms={_step_ms(lambda: _train_step(model, opt, xs, ys), 30):.3f}")
    elif step == "cudagraph":
        # an MLP's forward captured into a CUDA graph (its matmuls included) and replayed
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).to(dev)
        static_in = torch.randn(32, 64, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_in)
        for k in range(3):
            x = torch.randn(32, 64, generator=g).to(dev)
            static_in.copy_(x)
            graph.replay()
            assert torch.allclose(static_out, model(x), rtol=1e-5, atol=1e-5), k
        print("cudagraph ok")
    elif step == "compile":
        # torch.compile (Inductor: Triton kernels, matmuls through cuBLAS), forward and backward
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 10)).to(dev)
        compiled = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        xs = torch.randn(64, 256, generator=g).to(dev)
        ys = torch.randint(0, 10, (64,), generator=g).to(dev)
        losses = [_train_step(compiled, opt, xs, ys) for _ in range(10)]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
        print("compile ok losses=" + ",".join(f"{v:.4f}" for v in losses))
    elif step == "oom":
        # allocate 256 MiB blocks until the device (or pilot's quota) says no: PyTorch must raise
        # its own OutOfMemoryError, and the process goes on (frees, allocates again)
        blocks = []
        try:
            while len(blocks) < 4096:
                blocks.append(torch.empty(64 << 20, device=dev))
        except torch.OutOfMemoryError:
            got = len(blocks) * 256
        else:
            raise AssertionError("no OutOfMemoryError after 1 TiB")
        blocks.clear()
        torch.cuda.empty_cache()
        x = torch.ones(1 << 20, device=dev)
        assert float(x.sum().item()) == float(1 << 20)
        print("oom ok OutOfMemoryError, then allocated again")
        print(f"oom OutOfMemoryError after {got} MiB")
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
    elif step == "fft":
        # cuFFT, which torch loads itself (its kernels reach the GPU through the driver library)
        x = torch.randn(4096, generator=g, dtype=torch.float64)
        got = torch.fft.rfft(x.to(dev)).cpu()
        assert torch.allclose(got, torch.fft.rfft(x), rtol=1e-9, atol=1e-9)
        print("fft ok")
    elif step == "linalg":
        # cuSOLVER (and the cuBLAS it calls): a solve, a Cholesky factor and an SVD's values
        m = torch.randn(64, 64, generator=g, dtype=torch.float64)
        spd = m @ m.T + 64 * torch.eye(64, dtype=torch.float64)
        b = torch.randn(64, 3, generator=g, dtype=torch.float64)
        assert torch.allclose(torch.linalg.solve(spd.to(dev), b.to(dev)).cpu(),
                              torch.linalg.solve(spd, b), rtol=1e-8, atol=1e-10)
        assert torch.allclose(torch.linalg.cholesky(spd.to(dev)).cpu(), torch.linalg.cholesky(spd),
                              rtol=1e-8, atol=1e-10)
        assert torch.allclose(torch.linalg.svdvals(m.to(dev)).cpu(), torch.linalg.svdvals(m),
                              rtol=1e-8, atol=1e-10)
        print("linalg ok")
    elif step == "sparse":
        # cuSPARSE: a CSR matrix times a dense one
        dense = torch.randn(128, 128, generator=g, dtype=torch.float64)
        dense[dense.abs() < 1.0] = 0
        rhs = torch.randn(128, 16, generator=g, dtype=torch.float64)
        got = torch.sparse.mm(dense.to_sparse_csr().to(dev), rhs.to(dev)).cpu()
        assert torch.allclose(got, dense @ rhs, rtol=1e-9, atol=1e-9)
        print("sparse ok")
    elif step == "sdpa":
        # scaled_dot_product_attention's fused backends (flash, memory-efficient), bf16, forward
        # and backward, against the math backend
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q, k, v = (torch.randn(2, 4, 128, 64, generator=g).to(dev, torch.bfloat16).requires_grad_()
                   for _ in range(3))
        outs = {}
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.float().sum().backward()
            outs[backend] = (out.float(), q.grad.float().clone())
            q.grad = k.grad = v.grad = None
        ref_out, ref_grad = outs[SDPBackend.MATH]
        for out, grad in list(outs.values())[1:]:
            assert torch.allclose(out, ref_out, rtol=3e-2, atol=3e-2)
            assert torch.allclose(grad, ref_grad, rtol=5e-2, atol=5e-2)
        print("sdpa ok")
    elif step == "ipc":
        # a CUDA tensor shared with a child process (torch.multiprocessing: cudaIpc* handles)
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        t = torch.arange(1024, dtype=torch.float32, device=dev)
        child = ctx.Process(target=_ipc_child, args=(queue, t))
        child.start()
        result = queue.get()
        child.join(60)
        assert result == float(t.sum().item()) * 2, result
        print("ipc ok")
    else:
        raise SystemExit(f"unknown step {step}")
    print(f"{step} took {time.perf_counter() - t0:.2f} s")


def _resnet18() -> tuple[object, str]:
    """torchvision's resnet18(num_classes=10), else the same network (He et al.'s 18-layer
    ResNet: 7x7 stem, max pool, four stages of two basic blocks, average pool, linear)."""
    try:
        import torchvision  # type: ignore[import-not-found]

        return torchvision.models.resnet18(num_classes=10), "torchvision"
    except ImportError:
        pass
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers), "written out"


def _ipc_child(queue: object, t: object) -> None:
    """The ipc step's child: reads the parent's CUDA tensor and sends back twice its sum."""
    queue.put(float((t * 2).sum().item()))  # type: ignore[attr-defined]


def _train_step(model: object, opt: object, xs: object, ys: object) -> float:
    import torch

    loss = torch.nn.functional.cross_entropy(model(xs), ys)  # type: ignore[operator]
    opt.zero_grad()  # type: ignore[attr-defined]
    loss.backward()
    opt.step()  # type: ignore[attr-defined]
    return float(loss.item())


def _step_ms(step: object, repeats: int = 50) -> float:
    """Median wall time of one training step (each ends in .item(): a synchronization)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main(sys.argv[1])
