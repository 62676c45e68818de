"""The shim as built: warning-free C, a plain library with libcudart's SONAME, exactly the
exports of the table (checked by hack/check_api_table.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pilot.shim import shim_path

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="gcc not installed")


@needs_gcc
def test_every_shim_source_compiles_without_warnings(tmp_path):
    spec = importlib.util.spec_from_file_location("pilot_shim_build", SHIM / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    gen = tmp_path / "gen"
    build.generate_tables(gen)
    sources = sorted(SHIM.glob("*.c")) + sorted(gen.glob("*.c"))
    assert len(sources) > 10
    for src in sources:
        out = subprocess.run(
            ["gcc", "-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{SHIM}",
             f"-I{gen}", f"-I{build.cuda_include_dir()}", "-c", str(src), "-o", str(tmp_path / "x.o")],
            capture_output=True, text=True)
        assert out.returncode == 0, f"{src.name}:\n{out.stderr}"


def test_installed_shim_is_a_plain_library_named_like_libcudart():
    lib = shim_path()
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcudart.so.13]" in dyn
    needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
    assert needed and not any("python" in n or "zmq" in n or "cudart" in n for n in needed), needed


def test_installed_shim_exports_exactly_the_table():
    out = subprocess.run([sys.executable, str(REPO / "hack" / "check_api_table.py"), "--lib",
                          str(shim_path())], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[PASS]" in out.stdout
