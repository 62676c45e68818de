"""Issue 27 (4): a module load is charged what the loader takes, not what the first entry of
the image says: PTX (JIT-compiled, no ELF to read) and a fatbin whose first entry is a small
sm_80 one before the sm_90 entry the GPU loads were charged 0 B and 16 B. Past the quota the
module is unloaded and the load refused (sim backend; tests/gpu/image_charge_check.py checks
the driver on a GPU, compressed images included)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from client import ProtoClient, body

from pilot.daemon.protocol import lib

MEMORY_ALLOCATION = 2
SOURCE = r"""
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define BIG (64 << 20)
#else
#define BIG 16
#endif
__device__ char big[BIG];
extern "C" __global__ void touch(int i) { big[i % BIG] = 1; }
"""
SMALL = 'extern "C" __global__ void k(int *p) { p[0] = 1; }\n'


def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    return nvcc


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    nvcc, work = _nvcc(), tmp_path_factory.mktemp("charge-images")
    (work / "big.cu").write_text(SOURCE)
    (work / "small.cu").write_text(SMALL)
    builds = {
        "ptx": ["-ptx", "-arch=sm_90", "big.cu"],
        # the small sm_80 entry first, the large sm_90 one the GPU loads second
        "fatbin": ["-fatbin", "-Xfatbin", "-compress=false", "-gencode", "arch=compute_80,code=sm_80",
                   "-gencode", "arch=compute_90,code=sm_90", "big.cu"],
        "small": ["-fatbin", "-arch=sm_90", "small.cu"],
    }
    out = {}
    for name, args in builds.items():
        target = work / f"{name}.bin"
        subprocess.run([nvcc, "-o", str(target), *args], check=True, capture_output=True,
                       timeout=300, cwd=work)
        out[name] = target.read_bytes() + (b"\0" if name == "ptx" else b"")
    return out


def _load(c: ProtoClient, image: bytes) -> int:
    return int(c.call(lib.PILOT_OP_MODULE_LOAD, body("pilot_req_module_load", image_size=len(image)),
                      image, rep_type="pilot_rep_u64").hdr.err)


@pytest.mark.parametrize("kind", ["ptx", "fatbin"])
def test_module_variables_the_loader_takes_are_charged(daemon, images, kind: str) -> None:
    import pwd

    tenant = "user:" + pwd.getpwuid(os.getuid()).pw_name
    env = {**os.environ, "PILOT_SOCKET": str(daemon.socket_path)}
    subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "quota", "set", tenant, "8MiB"],
                   env=env, check=True, capture_output=True, timeout=30)
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    assert _load(c, images[kind]) == MEMORY_ALLOCATION  # 64 MiB of variables, 8 MiB quota
    assert "module refused (quota" in daemon.log() or "-byte module refused" in daemon.log()
    assert _load(c, images["small"]) == 0  # the refused one was unloaded and given back
    c.close()
