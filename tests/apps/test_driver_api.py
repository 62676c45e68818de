"""Programs of the CUDA driver API under pilot (issue 13): tests/apps/driver_api.cu, linked with
-lcuda, runs with libpilot.so and libpilot-cuda.so preloaded against the sim daemon and must print
what it prints natively on the H100 (tests/gpu/driver_compare.sh diffs the two there)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pilot.shim import driver_path

# What the H100 prints (the program prints exact results and error names only). The two
# cuModuleLoadDataEx lines and cuLibraryLoadData(binary preserved) are new since the last H100
# run (2026-11-27), as is the available dynamic smem line: tests/gpu/driver_compare.sh checks
# them there next.
EXPECTED = """\
before cuInit: cuDeviceGetCount: CUDA_ERROR_NOT_INITIALIZED
cuInit(1): CUDA_ERROR_INVALID_VALUE
driver version >= 13000: 1
devices >= 1: 1
cuDeviceGet(9999): CUDA_ERROR_INVALID_DEVICE
compute capability 9.0, warp 32, SMs > 0: 1
name non-empty: 1, memory > 1 GiB: 1
current after cuInit: none
cuMemAlloc without a context: CUDA_ERROR_INVALID_CONTEXT
primary: flags 0 active 1
current is primary: 1
popped primary: 1
context device 0
created context current: 1
after cuCtxDestroy, current is primary: 1
cuModuleLoadData(broken ELF): CUDA_ERROR_INVALID_IMAGE
cuModuleLoad(missing file): CUDA_ERROR_FILE_NOT_FOUND
cuModuleLoadDataEx(fatbin, log buffers): CUDA_SUCCESS, sizes within 1
cuModuleLoadDataEx(broken ELF, log buffers): CUDA_ERROR_INVALID_IMAGE, sizes within 1
cuModuleGetFunction(missing): CUDA_ERROR_NOT_FOUND
cuModuleGetFunction(null module): CUDA_ERROR_INVALID_HANDLE
drv_scale max threads 1024
occupancy: 256-thread blocks per SM > 0: 1, best block a warp multiple: 1, grid a multiple of the SMs: 1
available dynamic smem: 8 blocks of 128 fit with it: 1
cuMemAlloc(0 bytes): CUDA_ERROR_INVALID_VALUE
cuLaunchKernel(2048 threads): CUDA_ERROR_INVALID_VALUE
cuLaunchKernel(null function): CUDA_ERROR_INVALID_HANDLE
scale: h[1]=1.50 h[999]=1498.50 sum=749250.0
address range: base ok 1 size 4000
pointer: device memory 1 ordinal 0 range 4000 start ok 1
small managed: base ok 1 size ok 1 start ok 1
cuLaunchKernel(extra of 32 bytes): CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
axpb: y[0]=-3503 y[500]=-3 y[989]=3420 y[990]=0xdeadbeef elapsed >= 0: 1
cuStreamQuery(idle): CUDA_SUCCESS
cuEventQuery(done): CUDA_SUCCESS
pair: 4025
counter: 42 (4 bytes)
cuModuleGetGlobal(missing): CUDA_ERROR_NOT_FOUND
memset: 0xabcd 0xabcd / 0x5a 0x5a 0xab 0xab
dtod: -500 499
cuMemcpy: 0 -500 -499 0
library kernel: 1001 491 0
cuLibraryLoadData(binary preserved): CUDA_SUCCESS
mixed: cudaSuccess -500 499
cuMemFree(runtime pointer): CUDA_SUCCESS
runtime last error untouched: cudaSuccess
cuMemFree(bad pointer): CUDA_ERROR_INVALID_VALUE
runtime last error after a failed driver call: cudaSuccess
cuGetErrorName(bogus): CUDA_ERROR_INVALID_VALUE
bogus name is null: 1
cuGetProcAddress(cuMemAlloc): status 0 allocates 1
cuGetProcAddress(cuNoSuch): CUDA_SUCCESS
status 1
done
"""


@pytest.fixture
def driver_env(shim_path: str) -> dict[str, str]:
    return {"LD_PRELOAD": f"{shim_path}:{driver_path()}"}


@pytest.mark.parametrize("program", ["driver_api", "driver_api_ptds"])
def test_driver_api_program(run_under_pilot, app_binaries: dict[str, Path], driver_env,
                            daemon_log, program: str) -> None:
    """driver_api_ptds: the same source built with `-default-stream per-thread`, which calls the
    driver's _ptsz/_ptds forms (drv_ptds.c) instead."""
    cubin = app_binaries[program].parent / "driver_kernels.cubin"
    proc = run_under_pilot(program, str(cubin), env=driver_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout == EXPECTED
    # every driver call it makes is carried: no "not supported" line for it
    assert "not supported" not in proc.stderr
    # JIT log buffers: never left as the program's garbage; a failed load says why
    assert "jit logs (fatbin): info terminated 1, error terminated 1, error empty 1" in proc.stderr
    assert "jit logs (broken ELF): info terminated 1, error terminated 1, error empty 0" in proc.stderr


def test_ptx_module_in_the_sim() -> None:
    """The sim reads PTX kernels' parameter layouts as ptxas lays them out."""
    from pilot.daemon.backends.fatbin import kernel_infos_in_image

    ptx = b""".version 9.0
.target sm_90
.address_size 64
.visible .entry k(
\t.param .u64 k_param_0,
\t.param .u8 k_param_1,
\t.param .align 8 .b8 k_param_2[16],
\t.param .f32 k_param_3
)
.maxntid 128, 1, 1
{
\tret;
}
\0"""
    [info] = kernel_infos_in_image(ptx).values()
    assert info.params == [(0, 8), (8, 1), (16, 16), (32, 4)]
    assert info.max_threads == 128
    with pytest.raises(ValueError):
        kernel_infos_in_image(b"\x00\x01 not an image")


HOST_ONLY = """\
#include <cuda.h>
#include <stdio.h>
int main(void)
{
    int n = -1;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&n);
    printf("cuInit, cuDeviceGetCount: %d, %d device(s)\\n", (int)r, n);
    return r != CUDA_SUCCESS;
}
"""


def test_a_driver_api_program_nvcc_compiled_is_not_taken_for_a_static_runtime(
        tmp_path: Path, pilot_client_env: dict[str, str], driver_env: dict[str, str]) -> None:
    """Host code nvcc compiles with -O2 keeps an empty `.nv_fatbin` and no registration (no
    `.nvFatBinSegment`) and, with -cudart shared, drops libcudart: a driver API program (the CUDA
    samples vectorAddDrv, matrixMulDrv on the H100). The shim's static-runtime check must not
    refuse it."""
    import subprocess

    from apps_daemons import NVCC
    if NVCC is None:
        pytest.skip("nvcc not found")
    (tmp_path / "host_only.cpp").write_text(HOST_ONLY)
    link = tmp_path / "libcuda.so"
    link.symlink_to(driver_path())
    exe = tmp_path / "host_only"
    built = subprocess.run([NVCC, "-cudart", "shared", "-O2", "-o", str(exe),
                            str(tmp_path / "host_only.cpp"), "-L", str(tmp_path), "-lcuda"],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    sections = subprocess.run(["readelf", "-SW", str(exe)], capture_output=True, text=True).stdout
    if ".nvFatBinSegment" in sections or ".nv_fatbin" not in sections:
        pytest.skip("this nvcc lays out host-only programs differently")
    proc = subprocess.run([str(exe)], env={**pilot_client_env, **driver_env}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "statically" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout == "cuInit, cuDeviceGetCount: 0, 1 device(s)\n"


def test_the_per_thread_build_calls_the_per_thread_forms(app_binaries: dict[str, Path]) -> None:
    """So that driver_api_ptds's run above goes through them (and the plain build does not)."""
    def imported(program: str) -> set[str]:
        out = subprocess.run(["nm", "-D", "--undefined-only", str(app_binaries[program])],
                             capture_output=True, text=True, check=True).stdout
        return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}

    per_thread, plain = imported("driver_api_ptds"), imported("driver_api")
    forms = {n for n in per_thread if n.endswith(("_ptsz", "_ptds"))}
    assert {"cuLaunchKernel_ptsz", "cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2_ptds",
            "cuStreamSynchronize_ptsz"} <= forms, sorted(forms)
    assert not {n for n in plain if n.endswith(("_ptsz", "_ptds"))}
