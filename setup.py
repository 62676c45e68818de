"""Build glue: cffi builds the daemon's protocol module, then shim/build.py builds libpilot.so
(and libpilot12.so, for CUDA 12 programs).

Everything else is declared in pyproject.toml. All three artefacts come from shim/transport/pilot_proto.h, the
one definition of the wire protocol.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_ext import build_ext


def _load_shim_build():
    """shim/build.py, loaded by path under its own name (no clash with PyPA's `build`)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim", "build.py")
    spec = importlib.util.spec_from_file_location("pilot_shim_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shim_build = _load_shim_build()


class BuildExtWithShim(build_ext):
    """Build the cffi extension, then the shims next to it (works for regular and editable installs)."""

    def run(self) -> None:
        super().run()
        out_dir = os.path.dirname(self.get_ext_fullpath("pilot.shim._proto"))
        shim_build.build_shims(self.compiler, out_dir, build_temp=self.build_temp)


setup(
    cffi_modules=["shim/build.py:ffi"],
    cmdclass={"build_ext": BuildExtWithShim},
)
