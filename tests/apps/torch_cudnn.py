"""PyTorch's cuDNN calls under pilot without a GPU (run by tests/apps/test_torch_cudnn.py, where
a CUDA build of PyTorch is installed): conv2d forward and both backward passes, batch
normalization in training (forward, backward) and inference, on tensors copied to the device
and back, so that no PyTorch kernel runs (the sim has no emulations of them) and every result
comes from pilot's cuDNN stand-in and the sim's emulation. Each line is checked against
PyTorch's CPU result."""

import torch
import torch.nn.functional as F

torch.backends.cudnn.allow_tf32 = False
g = torch.Generator().manual_seed(0)


def close(got: torch.Tensor, want: torch.Tensor) -> str:
    err = float((got.detach().cpu() - want.detach()).abs().max())
    return "ok" if err < 1e-4 else f"MISMATCH {err:g}"


x = torch.randn(2, 4, 9, 9, generator=g)
w = torch.randn(6, 4, 3, 3, generator=g)
gy = torch.randn(2, 6, 5, 5, generator=g)
xd, wd = x.cuda().requires_grad_(), w.cuda().requires_grad_()
y = F.conv2d(xd, wd, stride=2, padding=1)
gx, gw = torch.autograd.grad(y, (xd, wd), gy.cuda())
xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
yr = F.conv2d(xr, wr, stride=2, padding=1)
rx, rw = torch.autograd.grad(yr, (xr, wr), gy)
print("conv2d forward:", close(y, yr))
print("conv2d backward data:", close(gx, rx))
print("conv2d backward filter:", close(gw, rw))

scale, bias = torch.rand(4, generator=g) + 0.5, torch.randn(4, generator=g)
xb = x.cuda().requires_grad_()
sd, bd = scale.cuda().requires_grad_(), bias.cuda().requires_grad_()
out = F.batch_norm(xb, None, None, sd, bd, training=True, eps=1e-5)
xr2, sr, br = x.clone().requires_grad_(), scale.clone().requires_grad_(), bias.clone().requires_grad_()
outr = F.batch_norm(xr2, None, None, sr, br, training=True, eps=1e-5)
print("batch_norm training:", close(out, outr))
gout = torch.randn(out.shape, generator=g)
got = torch.autograd.grad(out, (xb, sd, bd), gout.cuda())
want = torch.autograd.grad(outr, (xr2, sr, br), gout)
print("batch_norm backward:", ", ".join(close(a, b) for a, b in zip(got, want, strict=True)))
mean, var = torch.randn(4, generator=g), torch.rand(4, generator=g) + 0.5
out = F.batch_norm(x.cuda(), mean.cuda(), var.cuda(), scale.cuda(), bias.cuda(), training=False)
print("batch_norm inference:", close(out, F.batch_norm(x, mean, var, scale, bias, training=False)))
