"""The shims as built (libpilot.so for CUDA 13, libpilot12.so for CUDA 12): warning-free C, plain
libraries with libcudart's SONAME, exactly the exports of their tables (checked by
hack/check_api_table.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pilot.shim import driver_path, shim_path

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="gcc not installed")


@needs_gcc
@pytest.mark.parametrize("cuda", [13, 12])
def test_every_shim_source_compiles_without_warnings(tmp_path, cuda):
    """Each build's sources, with that build's flags (the 12 build: renames force-included)."""
    spec = importlib.util.spec_from_file_location("pilot_shim_build", SHIM / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    gen = tmp_path / "gen"
    generated = build.generate_tables(gen, cuda)
    hand = build.hand_written_sources(cuda)
    others = [p for p in [*SHIM.rglob("*.c"), *build.NATIVE_DIR.glob("*.c")]
              if p not in hand and not p.name.startswith("cuda12_")]  # vgpu_server.c: cffi's
    assert len(hand) > 10 and all(p.exists() for p in hand)
    base = ["gcc", "-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror",
            *(f"-I{d}" for d in [*build.INCLUDE_DIRS, build.NATIVE_DIR]), f"-I{gen}",
            f"-I{build.cuda_include_dir()}"]
    for src, flags in ([(p, build.shared_source_flags(cuda, gen)) for p in hand]
                       + [(p, []) for p in generated + others]):
        out = subprocess.run([*base, *flags, "-c", str(src), "-o", str(tmp_path / "x.o")],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{src.name} (CUDA {cuda} build):\n{out.stderr}"


@pytest.mark.parametrize("cuda", [13, 12])
def test_installed_shim_is_a_plain_library_named_like_libcudart(cuda):
    lib = shim_path(cuda)
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [libcudart.so.{cuda}]" in dyn
    needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
    assert needed and not any("python" in n or "zmq" in n or "cudart" in n for n in needed), needed


def test_installed_shims_export_exactly_their_tables():
    out = subprocess.run([sys.executable, str(REPO / "hack" / "check_api_table.py"), "--lib",
                          str(shim_path()), "--lib12", str(shim_path(12)), "--libdrv",
                          str(driver_path())],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[PASS]" in out.stdout
    assert "libpilot12.so exports exactly the 435 table symbols @libcudart.so.12" in out.stdout
    assert "libpilot-cuda.so exports exactly the 638 driver table symbols, unversioned" in out.stdout


def test_installed_driver_library_is_named_like_libcuda():
    """SONAME libcuda.so.1, and only libc needed: libpilot.so is found at run time, so its SONAME
    (libcudart.so.13) is never a NEEDED entry that could map the real runtime."""
    dyn = subprocess.run(["readelf", "-d", str(driver_path())], capture_output=True, text=True,
                         check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn
    needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    assert set(needed) <= {"libc.so.6", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}, needed


def test_shim_path_names_the_builds():
    assert shim_path(13).name == "libpilot.so" and shim_path(12).name == "libpilot12.so"
    assert shim_path(12).parent == shim_path().parent
    with pytest.raises(ValueError, match="no shim for CUDA 11"):
        shim_path(11)
