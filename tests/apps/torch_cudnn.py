"""PyTorch's cuDNN calls under pilot without a GPU (run by tests/apps/test_torch_cudnn.py, where
a CUDA build of PyTorch is installed): conv2d forward and both backward passes, batch
normalization in training (forward, backward) and inference; grouped and dilated convolutions
in both memory formats, half precision, PyTorch's benchmark mode (it times every plan with
events) and deterministic mode (engines filtered by their notes), conv1d, a convolution
captured into a CUDA graph and replayed; on tensors copied to
the device
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

# layouts, groups, dilation, types and PyTorch's other ways of choosing an engine
x = torch.randn(2, 8, 11, 11, generator=g)
w = torch.randn(8, 2, 3, 3, generator=g)
ref = F.conv2d(x, w, padding=2, dilation=2, groups=4)
for name, fmt in (("NCHW", torch.contiguous_format), ("NHWC", torch.channels_last)):
    got = F.conv2d(x.contiguous(memory_format=fmt).cuda(), w.contiguous(memory_format=fmt).cuda(),
                   padding=2, dilation=2, groups=4)
    print(f"conv2d grouped, dilated, {name}:", close(got, ref))
xh, wh = x.half(), torch.randn(6, 8, 3, 3, generator=g).half()
err = float((F.conv2d(xh.cuda(), wh.cuda(), padding=1).cpu().float()
             - F.conv2d(xh.float(), wh.float(), padding=1)).abs().max())
print("conv2d half:", "ok" if err < 5e-2 else f"MISMATCH {err:g}")
torch.backends.cudnn.benchmark = True  # PyTorch times every plan (events) and keeps the fastest
w1 = torch.randn(5, 8, 1, 1, generator=g)
print("conv2d benchmark mode:", close(F.conv2d(x.cuda(), w1.cuda()), F.conv2d(x, w1)))
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True  # engines filtered by their numerical notes
w5 = torch.randn(4, 8, 5, 5, generator=g)
print("conv2d deterministic:", close(F.conv2d(x.cuda(), w5.cuda(), stride=2), F.conv2d(x, w5, stride=2)))
x1, k1 = torch.randn(3, 4, 20, generator=g), torch.randn(6, 4, 5, generator=g)
print("conv1d:", close(F.conv1d(x1.cuda(), k1.cuda(), padding=2), F.conv1d(x1, k1, padding=2)))

# captured into a CUDA graph (posted library calls become graph nodes) and replayed on new input
torch.backends.cudnn.deterministic = False
xg, wg = x.cuda(), w5.cuda()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(2):  # warm up outside the capture, as PyTorch asks
        yg = F.conv2d(xg, wg, padding=1)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    yg = F.conv2d(xg, wg, padding=1)
x_new = torch.randn(x.shape, generator=g)
xg.copy_(x_new.cuda())
graph.replay()
print("conv2d in a CUDA graph:", close(yg, F.conv2d(x_new, w5, padding=1)))
