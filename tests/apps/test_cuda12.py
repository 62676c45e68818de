"""A CUDA 12 program (tests/apps/cuda12.cu) under libpilot12.so against the sim daemon.

nvcc 12 itself is not on PyPI (nvidia-cuda-nvcc-cu12 ships ptxas and libnvvm, no nvcc), so the
program is built the way that keeps everything the runtime sees CUDA 12's: the installed nvcc 13
compiles the device code and the host stubs, against CUDA 12.9's runtime headers (PyPI's
nvidia-cuda-runtime-cu12, a test dependency) and links that package's libcudart.so.12. The
binary then NEEDs libcudart.so.12, imports `cudaGetDeviceProperties_v2@libcudart.so.12` with the
12.x struct, the cudaThread* aliases and the int-device hints. It is built twice: with
-D__NV_LEGACY_LAUNCH its <<<>>> stubs call `cudaLaunchKernel(hostFun, ...)` as CUDA 12.0-12.3's
did; without, `__cudaGetKernel`/`__cudaLaunchKernel` as 12.4+ (and 13) do.

The programs run through `pilot run`, which must pick libpilot12.so from the NEEDED entries.
Expected lines follow the sim device (daemon/sim_device.py). Not run natively (the values are
the sim's).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pilot.daemon.backends.sim_device import H100_ATTRS, SIM_DEVICE_NAME
from pilot.shim import shim_path

APPS_DIR = Path(__file__).resolve().parent
REPO = APPS_DIR.parents[1]
NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)
LAUNCH_STYLES = {"legacy": ("-D__NV_LEGACY_LAUNCH", "-Xcompiler", "-D__NV_LEGACY_LAUNCH"),
                 "modern": ()}
PILOT = [sys.executable, "-m", "pilot.cli.pilot"]

if os.environ.get("PILOT_APPS_NATIVE") == "1":
    pytest.skip("CUDA 12 programs are checked under pilot only", allow_module_level=True)


def _cuda12_runtime() -> tuple[Path, Path] | None:
    """(include dir, libcudart.so.12) of an installed CUDA 12 runtime, as the table check finds
    them (nvidia-cuda-runtime-cu12 first)."""
    spec = importlib.util.spec_from_file_location("check_api_table", REPO / "hack" /
                                                  "check_api_table.py")
    check = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_api_table", check)
    spec.loader.exec_module(check)
    include, lib = check.find_include12(), check.find_cudart12()
    return (include, lib) if include and lib else None


@pytest.fixture(scope="session")
def cuda12_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA test programs cannot be built")
    runtime = _cuda12_runtime()
    if runtime is None:
        why = "nvidia-cuda-runtime-cu12 is not installed (pip install .[test] installs it)"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    include, lib = runtime
    out = tmp_path_factory.mktemp("cuda12-bin")

    def build(style: str) -> tuple[str, Path, subprocess.CompletedProcess[str]]:
        exe = out / f"cuda12_{style}"
        cmd = [NVCC, "-cudart", "none", "-O2", "-Wno-deprecated-gpu-targets",
               "-Xcompiler", "-Wno-deprecated-declarations", f"-I{include}",
               *LAUNCH_STYLES[style], "-o", str(exe), str(APPS_DIR / "cuda12.cu"),
               f"-L{lib.parent}", "-l:libcudart.so.12"]
        return style, exe, subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, LAUNCH_STYLES))
    failed = [f"$ {' '.join(map(str, p.args))}\n{p.stdout}{p.stderr}"
              for _, _, p in results if p.returncode]
    if failed:
        pytest.fail("nvcc failed:\n" + "\n".join(failed), pytrace=False)
    return {style: exe for style, exe, _ in results}


def expected_cuda12() -> list[str]:
    a = H100_ATTRS
    y = [3 * i - 7 for i in range(1000)]
    y = [2 * i + v for i, v in enumerate(y)]                  # axpy12<<<8, 128>>>(y, x, 2, 1000)
    after_kernel = sum(y)
    y = [v + 5 * i if i < 600 else v for i, v in enumerate(y)]  # cudaLaunchKernel, a=5, n=600
    return [
        "runtime 12090",
        f"name {SIM_DEVICE_NAME}",
        f"sm {a[75]}.{a[76]} multiProcessorCount {a[16]} warpSize {a[10]} maxThreadsPerBlock {a[1]}",
        f"clockRate {a[13]} memoryClockRate {a[36]} memoryBusWidth {a[37]} l2CacheSize {a[38]}",
        f"deviceOverlap {a[15]} kernelExecTimeoutEnabled {a[17]} computeMode {a[20]} "
        f"maxTexture1DLinear {a[69]}",
        f"singleToDoublePrecisionPerfRatio {a[87]} cooperativeMultiDeviceLaunch {a.get(96, 0)}",
        f"sharedMemPerBlockOptin {a[97]} clusterLaunch {a[120]} unifiedFunctionPointers {a[129]}",
        "properties canary intact",
        f"attribute clockRate {a[13]}",
        f"<<<>>> sum {after_kernel}",
        f"cudaLaunchKernel sum {sum(y)}",
        "cudaThreadGetLimit heap 32 MiB",
        "cudaThreadGetCacheConfig 1",  # cudaFuncCachePreferShared
        f"graph capture status 1 deps 1 nodes 2 edges 1 deps 1 sum {sum(y) + 4 * sum(range(1000))}",
        "cudaMemAdvise int == _v2: yes",
        "cudaMemPrefetchAsync int == _v2: yes",
        "pointer attributes canary intact",
        "texture descs canary intact type 3 25x7 pitch 512 view 16 25x7",  # cudaResViewFormatSignedInt1
        "cudaChooseDevice sm 9.0: 0",
        "PASS",
    ]


def _env(pilotd, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_DEBUG")}
    return {**env, "PILOT_SOCKET": pilotd.socket, **extra}


def _pilot_run(exe: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PILOT, "run", "--", str(exe)], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("style", list(LAUNCH_STYLES))
def test_cuda12_program_runs_under_pilot_run(cuda12_programs: dict[str, Path], pilotd,
                                             daemon_log, style: str) -> None:
    proc = _pilot_run(cuda12_programs[style], _env(pilotd))
    got, want = proc.stdout.splitlines(), expected_cuda12()
    assert proc.returncode == 0 and got == want, (
        f"rc {proc.returncode}\n"
        + "\n".join(f"  got {g!r}\n want {w!r}" for g, w in zip(got, want, strict=False) if g != w)
        + f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\npilotd log:\n{daemon_log()}")


def test_the_two_builds_take_the_two_launch_paths(cuda12_programs: dict[str, Path]) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm not installed")

    def imports(exe: Path) -> set[str]:
        out = subprocess.run(["nm", "-D", "--undefined-only", str(exe)], capture_output=True,
                             text=True, check=True).stdout
        return {line.split()[-1] for line in out.splitlines() if "@libcudart.so.12" in line}

    legacy, modern = imports(cuda12_programs["legacy"]), imports(cuda12_programs["modern"])
    assert "cudaLaunchKernel@libcudart.so.12" in legacy
    assert not any(s.startswith(("__cudaLaunchKernel", "__cudaGetKernel")) for s in legacy)
    assert {"__cudaGetKernel@libcudart.so.12", "__cudaLaunchKernel@libcudart.so.12"} <= modern
    for syms in (legacy, modern):
        assert {"cudaGetDeviceProperties_v2@libcudart.so.12", "cudaThreadSynchronize@libcudart.so.12",
                "cudaMemAdvise@libcudart.so.12"} <= syms


def test_real_libcudart12_never_loaded(cuda12_programs: dict[str, Path], pilotd) -> None:
    """Even with the real libcudart.so.12 on LD_LIBRARY_PATH, the preloaded libpilot12.so
    satisfies the program's NEEDED entry and the real one is never mapped."""
    runtime = _cuda12_runtime()
    assert runtime is not None
    lib12 = runtime[1]
    proc = _pilot_run(cuda12_programs["modern"],
                      _env(pilotd, LD_LIBRARY_PATH=str(lib12.parent), LD_DEBUG="files"))
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["PASS"], proc.stderr[-3000:]
    shim = str(shim_path(12))
    assert shim in proc.stderr
    others = [line.replace(shim, "<shim>") for line in proc.stderr.splitlines()]
    loaded = [line for line in others if re.search(r"/\S*libcudart\.so", line)
              or re.search(r"file=libcudart\.so\S*\s.*generating link map", line)]
    assert not loaded, "the real libcudart was loaded:\n" + "\n".join(loaded)
