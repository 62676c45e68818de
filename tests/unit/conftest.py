"""Shared fixture: compile CUDA sources with the real nvcc and hand back their fatbin images."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pilot.daemon.backends.fatbin import elf_sections, iter_images

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists()
                                else None)


@pytest.fixture(scope="session")
def compile_cuda(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[bytes]]:
    """compile_cuda(source, *nvcc_flags) -> every fatbin image in the executable's `.nv_fatbin`
    section, the way `__cudaRegisterFatBinary` would see them. Cached per (source, flags);
    skips the test when nvcc is missing."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    workdir = tmp_path_factory.mktemp("nvcc")
    cache: dict[str, list[bytes]] = {}

    def compile_(source: str, *flags: str) -> list[bytes]:
        key = hashlib.sha256("\0".join((source, *flags)).encode()).hexdigest()[:16]
        if key not in cache:
            src, exe = workdir / f"{key}.cu", workdir / key
            src.write_text(source)
            subprocess.run([NVCC, "-cudart", "shared", *flags, "-o", str(exe), str(src)],
                           check=True, capture_output=True, timeout=300)
            sections = {s.name: s for s in elf_sections(exe.read_bytes())}
            cache[key] = list(iter_images(sections[".nv_fatbin"].data))
        return cache[key]

    return compile_
