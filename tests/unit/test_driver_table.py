"""The driver API's hook table (shim/tables/cuda_driver_exports.tsv), its generated C (drv_gen.c) and
the consistency check's driver part. Needs no GPU; compiling tests skip without gcc."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pilot.shim import driver_path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
TABLE = REPO / "shim" / "tables" / "cuda_driver_exports.tsv"
INCLUDE = Path("/usr/local/cuda/include")
needs_headers = pytest.mark.skipif(not (INCLUDE / "cuda.h").exists(), reason="no CUDA headers")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"driver_{name}", HACK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"driver_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load("gen_shim_tables")
check = _load("check_api_table")


def test_table_rows() -> None:
    rows = gen.read_tsv(TABLE)
    names = [r["name"] for r in rows]
    assert names == sorted(set(names))
    impl = {r["name"] for r in rows if r["status"] == "impl"}
    assert {"cuInit", "cuMemAlloc_v2", "cuLaunchKernel", "cuModuleLoadData", "cuCtxCreate_v4",
            "cuGetProcAddress_v2", "cuEventElapsedTime_v2", "cuMemsetD32Async"} <= impl
    assert {r["status"] for r in rows} == {"impl", "stub"}


@needs_headers
def test_header_mapping() -> None:
    api = gen.driver_api(INCLUDE)
    assert api.default["cuMemAlloc"] == "cuMemAlloc_v2"
    assert api.default["cuCtxCreate"] == "cuCtxCreate_v4"
    assert api.per_thread["cuMemcpyHtoD"] == "cuMemcpyHtoD_v2_ptds"
    assert api.per_thread["cuLaunchKernel"] == "cuLaunchKernel_ptsz"
    assert {"cuMemAlloc", "cuMemAlloc_v2", "cuLaunchKernel_ptsz", "cuProfilerStart"} <= api.exports
    assert gen.driver_errors(INCLUDE)[500] == "CUDA_ERROR_NOT_FOUND"


@needs_headers
@needs_gcc
def test_generated_c_compiles(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(HACK / "gen_shim_tables.py"), str(tmp_path), "--driver",
                    str(INCLUDE)], check=True)
    text = (tmp_path / "drv_gen.c").read_text()
    res = subprocess.run(["gcc", "-fsyntax-only", "-Wall", "-Wextra", "-std=gnu11",
                          f"-I{REPO / 'shim' / 'driver'}", f"-I{REPO / 'shim' / 'transport'}",
                          f"-I{REPO / 'shim' / 'bridge'}", str(tmp_path / "drv_gen.c")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    procs = [line.split('"')[1] for line in text.splitlines() if line.startswith('    {"cu')
             and line.count('"') == 2]
    assert procs == sorted(procs) and len(procs) == len(gen.read_tsv(TABLE))
    assert "PILOT_STUB int cuGraphCreate(void)" in text  # a stub row
    assert "PILOT_STUB int cuInit(void)" not in text      # an impl row


@needs_headers
def test_check_flags_a_stub_defined_by_hand(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    for src in (REPO / "shim" / "driver").glob("drv_*.c"):
        shutil.copy(src, shim)
    (shim / "drv_extra.c").write_text("int cuGraphCreate(void *g, unsigned f)\n{\n    return 0;\n}\n"
                                      "int cuNotInTheTable(void)\n{\n    return 0;\n}\n")
    res = subprocess.run([sys.executable, str(HACK / "check_api_table.py"), "--shim-dir",
                          str(shim)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "stub rows defined by hand" in res.stdout and "cuGraphCreate" in res.stdout
    assert "cuNotInTheTable" in res.stdout


def test_stub_logs_once_and_fails_cleanly() -> None:
    """A driver function pilot does not carry: CUDA_ERROR_NOT_SUPPORTED, its name logged once."""
    code = (f"import ctypes; lib = ctypes.CDLL({str(driver_path())!r}); "
            "print(lib.cuGraphCreate(None, 0), lib.cuGraphCreate(None, 0))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["801", "801"], res.stderr
    assert res.stderr.count("cuGraphCreate") == 1, res.stderr
    assert "CUDA_ERROR_NOT_SUPPORTED" in res.stderr
