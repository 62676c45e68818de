"""Compiled images of rewritten PTX (ptx_preempt.py) on disk, keyed by content hash, so that a
module's preemptible variants are JIT-compiled once per host and not at every start.

The key is the SHA-256 of the rewrite's version, the target architecture and the PTX text: any
change to one of them is another image. Files are written atomically (a temporary file, then
rename), so a crash or two daemons compiling the same module leave a whole image or none; an
unreadable file is a miss. `compile` reports whether it hit and how long the compiler took,
which is the JIT cost the issue asks to report (pilot_ptx_jit_seconds).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from pilot.daemon.backends.ptx_preempt import VERSION

Compiler = Callable[[str, str], bytes]  # (PTX text, arch such as "sm_90") -> image


@dataclass(frozen=True)
class Compiled:
    image: bytes
    hit: bool  # read from the cache
    seconds: float  # compiling (0 on a hit) or reading


def cache_key(ptx: str, arch: str) -> str:
    digest = hashlib.sha256(f"pilot-ptb-{VERSION}\0{arch}\0".encode())
    digest.update(ptx.encode())
    return digest.hexdigest()


class ImageCache:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.cubin")

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read() or None
        except OSError:
            return None

    def put(self, key: str, image: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(image)
            os.replace(tmp, self._path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def compile(self, ptx: str, arch: str, compiler: Compiler) -> Compiled:
        """The image of `ptx` for `arch`: from the cache, or compiled now and kept."""
        start = time.perf_counter()
        key = cache_key(ptx, arch)
        image = self.get(key)
        if image is not None:
            return Compiled(image, True, time.perf_counter() - start)
        image = compiler(ptx, arch)
        seconds = time.perf_counter() - start
        self.put(key, image)
        return Compiled(image, False, seconds)


def ptxas(ptx: str, arch: str) -> bytes:
    """A cubin from ptxas (ships with nvcc); RuntimeError with its message if it refuses."""
    exe = shutil.which("ptxas")
    if exe is None:
        raise RuntimeError("ptxas not found")
    with tempfile.TemporaryDirectory(prefix="pilot-ptxas-") as tmp:
        src, out = os.path.join(tmp, "in.ptx"), os.path.join(tmp, "out.cubin")
        with open(src, "w", encoding="ascii") as fh:
            fh.write(ptx)
        proc = subprocess.run([exe, f"-arch={arch}", src, "-o", out], capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas -arch={arch}: {proc.stderr.strip()}")
        with open(out, "rb") as fh:
            return fh.read()
