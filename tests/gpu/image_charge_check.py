"""Issue 27 (4) on a GPU: a module load is charged what the driver loaded. Under pilotd
--backend cuda with an 256 MiB quota, four images each declaring 1 GiB of `__device__` memory
must be refused (cudaErrorMemoryAllocation) and unloaded: PTX text (JIT), a fatbin whose first
entry is a small sm_80 one before the GPU's own, a fatbin with every entry compressed, and PTX
only in a compressed fatbin. A small module still loads afterwards, and the GPU's used memory
returns to where it was. Prints PASS/FAIL lines; exit status 1 if anything failed.

    python3 tests/gpu/image_charge_check.py     (from the repository root, pilot installed)

Needs nvcc (CUDA 12.8+ for -Xfatbin -compress-mode) and the GPU's sm (read from nvidia-smi).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "proto"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

from client import ProtoClient, body  # noqa: E402
from gpu_checks import check, exit_status, info, stop_pilotd  # noqa: E402

from pilot.daemon.protocol import lib  # noqa: E402

MEMORY_ALLOCATION = 2
SOURCE = r"""
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define BIG (1ull << 30)
#else
#define BIG 16
#endif
__device__ char big[BIG];
extern "C" __global__ void touch(unsigned long long i) { big[i % BIG] = 1; }
"""
SMALL = 'extern "C" __global__ void k(int *p) { p[0] = 1; }\n'


def gpu_sm() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out.replace(".", "")


def build(work: Path, sm: str) -> dict[str, bytes]:
    (work / "big.cu").write_text(SOURCE)
    (work / "small.cu").write_text(SMALL)
    mine = f"arch=compute_{sm},code=sm_{sm}"
    builds = {
        "ptx": ["-ptx", f"-arch=sm_{sm}", "big.cu"],
        "fatbin-sm80-first": ["-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode", mine,
                              "big.cu"],
        "fatbin-compressed": ["-fatbin", "-Xfatbin", "-compress-all", "-gencode", mine, "big.cu"],
        "fatbin-ptx-compressed": ["-fatbin", "-Xfatbin", "-compress-all", "-gencode",
                                  f"arch=compute_{sm},code=compute_{sm}", "big.cu"],
        "small": ["-fatbin", f"-arch=sm_{sm}", "small.cu"],
    }
    out = {}
    for name, args in builds.items():
        target = work / f"{name}.bin"
        subprocess.run(["nvcc", "-o", str(target), *args], check=True, capture_output=True, cwd=work)
        out[name] = target.read_bytes() + (b"\0" if name == "ptx" else b"")
    return out


def used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else -1


def load(c: ProtoClient, image: bytes) -> int:
    return int(c.call(lib.PILOT_OP_MODULE_LOAD, body("pilot_req_module_load", image_size=len(image)),
                      image, rep_type="pilot_rep_u64").hdr.err)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="pilot-charge-"))
    images = build(work, gpu_sm())
    sock = work / "pilot.sock"
    env = {**os.environ, "PILOT_SOCKET": str(sock)}
    log_path = work / "pilotd.log"
    with log_path.open("w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "pilot.daemon", "--backend", "cuda", "--socket",
                                   str(sock), "--state-dir", str(work / "state"), "--metrics-address", ""],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while "pilotd ready" not in log_path.read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text())
                check(False, "pilotd started")
                return exit_status()
            time.sleep(0.2)
        tenant = "user:" + pwd.getpwuid(os.getuid()).pw_name
        subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "quota", "set", tenant, "256MiB"],
                       env=env, check=True, capture_output=True)
        c = ProtoClient(str(sock))
        c.open()
        before = used_mib()
        for name in ("ptx", "fatbin-sm80-first", "fatbin-compressed", "fatbin-ptx-compressed"):
            err = load(c, images[name])
            check(err == MEMORY_ALLOCATION, f"{name}: 1 GiB of globals under a 256 MiB quota refused "
                                            f"(got {err})")
        check(load(c, images["small"]) == 0, "a small module still loads")
        after = used_mib()
        info(f"GPU memory used: {before} MiB before the loads, {after} MiB after")
        check(after - before < 512, "the refused modules were unloaded")
        c.close()
    finally:
        stop_pilotd(daemon)
        print("pilotd log:", log_path)
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
