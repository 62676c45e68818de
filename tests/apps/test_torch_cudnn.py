"""PyTorch's own cuDNN calls (its cudnn-frontend's descriptor traffic, variant packs, batch
normalization's legacy calls) through pilot's stand-in against the sim, where a CUDA build of
PyTorch is installed (it is not among pilot's test dependencies: CI skips this; a developer runs
it with PyTorch on PYTHONPATH). tests/apps/torch_cudnn.py copies tensors to the device and back
around the cuDNN calls, so no PyTorch kernel has to run on the sim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).with_name("torch_cudnn.py")


def test_pytorch_conv2d_and_batch_norm_through_pilot(start_pilotd, monkeypatch) -> None:
    if not (torch.version.cuda or "").startswith("13") or not torch.backends.cudnn.is_available():
        pytest.skip(f"PyTorch {torch.__version__} is not a CUDA 13 build with cuDNN")
    major, minor, patch = torch._C._cudnn.getCompileVersion()
    monkeypatch.setenv("PILOT_SIM_CUDNN_VERSION", str(major * 10000 + minor * 100 + patch))
    daemon = start_pilotd()
    env = {**daemon.env(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-m", "pilot.cli.pilot", "run", "--", sys.executable,
                           str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr + daemon.log_tail()
    assert proc.stdout.splitlines() == [
        "conv2d forward: ok", "conv2d backward data: ok", "conv2d backward filter: ok",
        "batch_norm training: ok", "batch_norm backward: ok, ok, ok",
        "batch_norm inference: ok", "conv2d grouped, dilated, NCHW: ok",
        "conv2d grouped, dilated, NHWC: ok", "conv2d half: ok", "conv2d benchmark mode: ok",
        "conv2d deterministic: ok", "conv1d: ok", "conv2d in a CUDA graph: ok"], \
        proc.stdout + proc.stderr
