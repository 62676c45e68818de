"""The CUDA library stand-ins' tables (shim/tables/cublas_exports.tsv, cublasLt_exports.tsv,
cudnn_exports.tsv), their
generated stubs and the consistency check's library part. Needs no GPU and no cuBLAS."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pilot.daemon.backends.libraries import GEMM_BATCHED, GEMM_FUNCTIONS, GEMM_STRIDED
from pilot.shim import LIBRARY_STANDINS, standin_path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"blas_{name}", HACK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"blas_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load("gen_shim_tables")
check = _load("check_api_table")


def test_tables_cover_what_pytorch_calls() -> None:
    """The functions PyTorch's matmul, Linear and training steps called on the H100
    (docs/design/frameworks.md, R8) are implemented, not stubs."""
    rows = {r["name"]: r for t in gen.LIBRARY_TABLES.values() for r in gen.read_tsv(t)}
    called = ["cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSetMathMode",
              "cublasGetMathMode", "cublasSgemm_v2", "cublasGemmEx", "cublasLtMatmulDescCreate",
              "cublasLtMatmulDescSetAttribute", "cublasLtMatmulDescDestroy",
              "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutSetAttribute",
              "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate",
              "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceDestroy",
              "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
              # cuDNN: the backend API, handles, tensor descriptors, batch normalization (R8)
              "cudnnBackendCreateDescriptor", "cudnnBackendSetAttribute",
              "cudnnBackendGetAttribute", "cudnnBackendFinalize", "cudnnBackendExecute",
              "cudnnBackendDestroyDescriptor", "cudnnCreate", "cudnnSetStream", "cudnnGetVersion",
              "cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptor",
              "cudnnDestroyTensorDescriptor", "cudnnBatchNormalizationForwardTrainingEx",
              "cudnnBatchNormalizationBackwardEx", "cudnnBatchNormalizationForwardInference",
              "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
              "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
              "cudnnGetBatchNormalizationBackwardExWorkspaceSize"]
    assert [n for n in called if rows[n]["status"] not in ("impl", "gen")] == []
    assert len(rows) == 756 + 184 + 243


def test_check_passes_on_the_built_stand_ins() -> None:
    where = standin_path(next(iter(LIBRARY_STANDINS))).parent
    proc = subprocess.run([sys.executable, str(HACK / "check_api_table.py"), "--libblas",
                           str(where)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "libpilot-cublas.so exports exactly the 756 table symbols @libcublas.so.13" in proc.stdout
    assert "libpilot-cublasLt.so exports exactly the 184 table symbols @libcublasLt.so.13" in \
        proc.stdout
    assert "libpilot-cudnn.so exports exactly the 243 table symbols @libcudnn.so.9" in proc.stdout


def test_check_flags_sources_that_disagree_with_the_table(tmp_path: Path) -> None:
    for name in ("cublas_exports.tsv", "cublasLt_exports.tsv", "cublaslt_api.c", "cublas_calls.tsv",
                 "cublas_gemms.tsv", "cudnn_exports.tsv", "cudnn_api.c"):
        shutil.copy(check.shim_file(REPO / "shim", name), tmp_path / name)
    # a stub row defined by hand, and an export missing from the table
    (tmp_path / "cublas_api.c").write_text((REPO / "shim" / "libs" / "cublas_api.c").read_text() + (
        "\nPILOT_BLAS_EXPORT int cublasSrot_v2(void) { return 0; }\n"
        "PILOT_BLAS_EXPORT int cublasNotAFunction(void) { return 0; }\n"))
    rep = check.Report()
    check.run_checks_libraries(argparse.Namespace(shim_dir=tmp_path, libblas=[]), rep)
    assert rep.failed


def test_a_stub_logs_once_and_returns_not_supported() -> None:
    lib = ctypes.CDLL(str(standin_path("libcublas.so.13")))
    proc = subprocess.run(
        [sys.executable, "-c",
         "import ctypes,sys; lib = ctypes.CDLL(sys.argv[1]); "
         "print(lib.cublasSrotm_v2(), lib.cublasSrotm_v2(), lib.cublasGetStatusName is not None)",
         str(standin_path("libcublas.so.13"))], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["15", "15", "True"], proc.stdout + proc.stderr
    assert proc.stderr.count("cublasSrotm_v2 is not supported by pilot yet") == 1, proc.stderr
    assert lib.cublasGetStatusName  # the library loads on its own (no libpilot.so needed to load)


def test_a_cudnn_stub_returns_cudnns_not_supported() -> None:
    proc = subprocess.run(
        [sys.executable, "-c",
         "import ctypes,sys; lib = ctypes.CDLL(sys.argv[1]); "
         "print(lib.cudnnCreateFilterDescriptor(None), lib.cudnnCreateFilterDescriptor(None))",
         str(standin_path("libcudnn.so.9"))], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["3000", "3000"], proc.stdout + proc.stderr
    assert proc.stderr.count("cudnnCreateFilterDescriptor is not supported by pilot yet") == 1, \
        proc.stderr


@pytest.mark.parametrize("table", sorted(gen.LIBRARY_TABLES))
def test_generated_stubs_compile_warning_free(table: str, tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    out = tmp_path / f"{table}_stubs.c"
    out.write_text(gen.gen_library_stubs(gen.read_tsv(gen.LIBRARY_TABLES[table]),
                                         gen.LIBRARY_TABLES[table], table))
    proc = subprocess.run(["gcc", "-c", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "x.o"),
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("generated", ["cublas_calls.c", "cublas_gemms.c"])
def test_generated_cublas_functions_compile_warning_free(generated: str, tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    out = tmp_path / generated
    if generated == "cublas_calls.c":
        out.write_text(gen.gen_cublas_calls(gen.read_tsv(gen.CUBLAS_CALLS),
                                            gen.read_tsv(gen.CUBLAS_FAMILIES), gen.CUBLAS_CALLS))
    else:
        out.write_text(gen.gen_cublas_gemms(gen.read_tsv(gen.CUBLAS_GEMMS), gen.CUBLAS_GEMMS))
    include = "/usr/local/cuda/include"
    proc = subprocess.run(["gcc", "-c", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                           f"-I{REPO / 'shim' / 'libs'}", f"-I{REPO / 'shim' / 'bridge'}",
                           f"-I{REPO / 'shim' / 'transport'}", f"-I{include}", "-o", str(tmp_path / "x.o"),
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_typed_gemms_are_the_requests_pilotd_knows() -> None:
    """Each row of shim/tables/cublas_gemms.tsv is sent as the PILOT_GEMM_* number that
    pilot_proto.h and pilotd's GEMM_FUNCTIONS give the same function, of the same shape."""
    proto = (REPO / "shim" / "transport" / "pilot_proto.h").read_text()
    numbers = {m[1]: (int(m[2]), m[3]) for m in
               re.finditer(r"(PILOT_GEMM_\w+) = (\d+),?\s*/\* (\w+) \*/", proto)}
    rows = gen.read_tsv(gen.CUBLAS_GEMMS)
    assert rows
    for r in rows:
        number, name = numbers[gen.gemm_function(r)]
        assert name == r["name"] == GEMM_FUNCTIONS[number], r
        assert (number in GEMM_STRIDED) == (r["shape"] == "strided"), r
        assert (number in GEMM_BATCHED) == (r["shape"] == "batched"), r
