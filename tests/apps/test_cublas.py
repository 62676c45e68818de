"""cuBLAS and cuBLASLt under pilot (issue 13, route B): tests/apps/cublas_gemm.cu runs with
libpilot.so and the stand-ins (libpilot-cublas.so, libpilot-cublasLt.so) preloaded against the sim
daemon, which computes the GEMMs with numpy, and must print what it prints natively on the H100
(tests/gpu/cublas_compare.sh diffs the two there, with NVIDIA's libraries in pilotd)."""

from __future__ import annotations

import pytest
from pilotd_metrics import run_scraped, total

from pilot.shim import LIBRARY_STANDINS, standin_path

# What the H100 prints natively (every result checked against the CPU; cuBLAS's own argument
# error lines included).
EXPECTED = """\
cublas version >= 13.0: 1
math mode: 0
 ** On entry to SGEMM  parameter number 8 had an illegal value
sgemm lda < m: CUBLAS_STATUS_INVALID_VALUE
 ** On entry to GEMM_EX  parameter number 16 had an illegal value
gemmEx ldc < m: CUBLAS_STATUS_INVALID_VALUE
 ** On entry to SgemmStridedBatched parameter number 14 had an illegal value
sgemm strided batch < 0: CUBLAS_STATUS_INVALID_VALUE
 ** On entry to DGEMM  parameter number 1 had an illegal value
dgemm transa 7: CUBLAS_STATUS_INVALID_VALUE
sgemm on no handle: CUBLAS_STATUS_NOT_INITIALIZED
sgemm m = 0 (nothing to do): CUBLAS_STATUS_SUCCESS
sgemm NN: ok
sgemm NT: ok
sgemm TN: ok
sgemm TT: ok
dgemm device scalars, stream: ok
gemmEx half->float, beta 0 over NaN, workspace: ok
sgemm strided batched: ok
sgemm batched (pointer arrays): ok
zgemm: ok
strided vectors: 0 3 6 9
cublasSetVector incx 0: CUBLAS_STATUS_INVALID_VALUE
cublasSetMatrix lda < rows: CUBLAS_STATUS_MAPPING_ERROR
lt transa read back: 1 (4 bytes)
lt heuristic returned at least one: 1, first usable: 1
lt matmul relu+bias, transposed A, row-major B, batched: ok
lt matmul, no algorithm given: ok
lt heuristic, 0 requested: CUBLAS_STATUS_INVALID_VALUE
done
"""


# cublas_level.cu natively on the H100 (the generic path: level 1, gemv, ger, geam, trsm, syrk,
# results to the host and to device memory, LU of a batch through pointer arrays, conjugate
# gradients).
EXPECTED_LEVEL = """\
saxpy strided: ok
saxpy negative incx: ok
sdot, snrm2, sasum to the host: ok
isamax 18 isamin 6 (1-based, first of equals)
sscal, scopy, sswap: ok
scopy, sswap into x: ok
results in device memory equal the host's: 1 1
sdot n = -1: CUBLAS_STATUS_SUCCESS, result 0
sgemv transposed: ok
sger: ok
sgeam: ok
strsm (L X = 3 B): ok
ssyrk upper: ok
sgemv lda < m: CUBLAS_STATUS_INVALID_VALUE
ssymm (upper, left): ok
strmm (lower, transposed, unit): ok
sdgmm: ok
ssymv (lower): ok
strsv (U x = b): ok
srot: ok
srot (y): ok
sgetrfBatched P A = L U (matrix 0): ok
sgetrfBatched P A = L U (matrix 1): ok
sgetrfBatched info: 0 0 3
conjugate gradients: residual below 1e-9: 1, iterations <= 64: 1
done
"""


@pytest.fixture
def blas_env(shim_path: str) -> dict[str, str]:
    return {"LD_PRELOAD": ":".join([shim_path, *(str(standin_path(s)) for s in LIBRARY_STANDINS)])}


def test_cublas_program_prints_what_the_h100_prints(run_under_pilot, blas_env, daemon_log) -> None:
    proc = run_under_pilot("cublas_gemm", env=blas_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout == EXPECTED, f"{proc.stderr}\n{daemon_log()}"


def test_cublas_beyond_gemm_prints_what_the_h100_prints(run_under_pilot, blas_env,
                                                        daemon_log) -> None:
    proc = run_under_pilot("cublas_level", env=blas_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout == EXPECTED_LEVEL, f"{proc.stderr}\n{daemon_log()}"


def test_a_gemm_outside_the_programs_memory_is_refused(run_under_pilot, blas_env,
                                                       daemon_log) -> None:
    """A reaches past the program's allocation: pilotd refuses the GEMM (it never runs), the next
    synchronize reports cudaErrorInvalidValue, the one after succeeds, and the log says why; a
    pointer array naming memory that is not the program's is refused the same way."""
    proc = run_under_pilot("cublas_gemm", "isolation", env=blas_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.splitlines() == [
        "out-of-range gemm issued: CUBLAS_STATUS_SUCCESS",
        "next synchronize: cudaErrorInvalidValue",
        "then: cudaSuccess",
        "batched gemm with a foreign pointer issued: CUBLAS_STATUS_SUCCESS",
        "next synchronize: cudaErrorInvalidValue"], proc.stdout
    assert "blas_gemm refused" in daemon_log() and "is not memory of this session" in daemon_log()


def test_without_pilotd_cublas_create_fails_cleanly(app_binaries, blas_env, tmp_path) -> None:
    """No daemon: the shim says so, cublasCreate fails with a status (no hang, no crash)."""
    import subprocess

    env = {**blas_env, "PILOT_SOCKET": str(tmp_path / "nobody.sock")}
    proc = subprocess.run([str(app_binaries["cublas_gemm"])], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("FAILED cublasCreate(&h): CUBLAS_STATUS_NOT_INITIALIZED"), proc.stdout


def test_a_handle_of_the_second_gpu_runs_there(start_pilotd, app_binaries, blas_env) -> None:
    """cublasCreate after cudaSetDevice(1): pilotd's handle is on device 1's vGPU, and the GEMM
    runs on that device's memory."""
    import subprocess

    daemon = start_pilotd("--sim-devices", "2")
    env = {**blas_env, "PILOT_SOCKET": daemon.socket}
    proc = subprocess.run([str(app_binaries["cublas_gemm"]), "devices"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr + daemon.log_tail()
    assert proc.stdout == "sgemm on device 1: ok\n", proc.stdout + daemon.log_tail()


def test_cublas_calls_captured_into_a_cuda_graph(run_under_pilot, blas_env, daemon_log) -> None:
    """cuBLAS calls on a capturing stream become graph nodes that post them again at each
    launch, on the launch stream (what PyTorch's CUDA graphs need); the H100 prints the same."""
    proc = run_under_pilot("cublas_gemm", "graph", env=blas_env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log()}"
    assert proc.stdout == ("captured nodes: at least 2\n"
                           "graph of cuBLAS calls, 3 launches: ok\n"), proc.stderr


def test_a_client_killed_between_gemms_loses_its_handles_and_nothing_else(
        app_binaries, blas_env, pilot_client_env, pilot_sessions, kill_and_await_release,
        started_client) -> None:
    """SIGKILL a program looping over GEMMs (with a cuBLAS and a cuBLASLt handle): its session
    and handles go within 2 s, pilotd lives, and the next program's cuBLAS works."""
    import subprocess

    env = {**pilot_client_env, **blas_env}
    with started_client([str(app_binaries["cublas_gemm"]), "loop"], env, "looping\n") as (
            proc, before):
        assert before == []  # "looping" is the first line
        mine = [s for s in pilot_sessions() if s["pid"] == proc.pid]
        assert len(mine) == 1 and mine[0]["library_handles"] == 2, mine
        kill_and_await_release(proc)
        after = subprocess.run([str(app_binaries["cublas_gemm"])], env=env, capture_output=True,
                               text=True, timeout=60)
        assert after.returncode == 0 and after.stdout == EXPECTED, after.stdout + after.stderr


def test_gemms_and_memsets_run_in_c_with_the_same_results(start_pilotd, app_binaries, blas_env) -> None:
    """The fast path (daemon/native/fast_library.c) checks and issues the program's GEMMs, cuBLASLt
    matmuls and memsets without Python; with `fast_launch = false` Python does it all. Both
    print what the H100 prints, and every library call is counted once wherever it ran."""
    preload = blas_env["LD_PRELOAD"]
    argv = [str(app_binaries["cublas_gemm"])]
    fast_out, fast = run_scraped(start_pilotd, argv, preload, None)
    slow_out, slow = run_scraped(start_pilotd, argv, preload, "[daemon]\nfast_launch = false\n")
    assert fast_out == slow_out == EXPECTED
    in_c = total(fast, "pilot_fast_library_calls_total")
    assert in_c > 0, fast
    assert total(slow, "pilot_fast_library_calls_total") == 0
    assert total(fast, "pilot_library_calls_total") == total(slow, "pilot_library_calls_total")
