"""Shared fixtures: compile CUDA sources with the real nvcc and hand back their fatbin images;
keep the policy registry as it was around a test that loads plugins."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pilot.daemon.backends.fatbin import elf_sections, iter_images
from pilot.policies import registry as reg

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


@pytest.fixture
def own_registry() -> Iterator[None]:
    """What the test registers (plugins it loads) is gone after it (as tests/unit/
    test_policies.py's tests expect)."""
    saved, saved_plugins = dict(reg._registry), dict(reg._plugin_modules)
    yield
    reg._registry.clear()
    reg._registry.update(saved)
    reg._plugin_modules.clear()
    reg._plugin_modules.update(saved_plugins)
