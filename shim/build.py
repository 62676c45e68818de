"""The shim's build script, run at install time by setup.py (through cffi's setuptools hook).

It produces three artefacts from one protocol header, shim/transport/pilot_proto.h:
- `pilot.shim._proto`: a cffi module (API mode, so the C compiler checks every struct layout the
  daemon reads) exposing the protocol structs, the socket-path rule and the vGPU endpoint server
  (daemon/native/vgpu_server.c) to the daemon;
- `libpilot.so`: the shim, a plain C shared library (no libpython) with SONAME libcudart.so.13 and
  a version script, so that a preloaded libpilot.so satisfies programs linked with
  `-cudart shared` and the real libcudart is never mapped;
- `libpilot12.so`: the same sources built for programs linked with CUDA 12's libcudart.so.12
  (that SONAME and symbol version), plus shim/runtime/cuda12/cuda12_*.c for the exports whose
  12.x ABI differs; the shared sources are compiled with -DPILOT_CUDART_MAJOR=12 and the generated
  cudart12_renames.h force-included (see hack/gen_shim_tables.py). Both build against the CUDA 13
  headers: the 12.x layouts the 12 build needs are in shim/runtime/cuda12/cuda12_abi.h.

The stubs for every libcudart export the shim does not implement, and the error-name table, are
generated from shim/tables/cudart_exports.tsv (cudart12_exports.tsv for the 12 build) and
shim/tables/cuda_errors.tsv by hack/gen_shim_tables.py into the build directory (rebuilt each build,
never committed).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from cffi import FFI

SHIM_DIR = Path(__file__).resolve().parent
REPO_DIR = SHIM_DIR.parent
TRANSPORT_DIR = SHIM_DIR / "transport"
TABLES_DIR = SHIM_DIR / "tables"
# The daemon's own C (the vGPU endpoint, its fast path, the host-callback gates): it runs inside
# pilotd, built into pilot.shim._proto.
NATIVE_DIR = REPO_DIR / "daemon" / "native"
PROTO_HEADER = TRANSPORT_DIR / "pilot_proto.h"
# Every folder of the shim's headers: the sources include each other's headers by name.
INCLUDE_DIRS = sorted({p.parent for p in SHIM_DIR.rglob("*.h")})

# Hand-written shim sources, in link order. Generated ones are added by build_shim().
SHIM_SOURCES = [
    "core/hooks.c",
    "transport/log.c",
    "transport/socket_path.c",
    "transport/zmtp.c",
    "transport/transport.c",
    "transport/error_state.c",
    "runtime/memory/alloc_table.c",
    "runtime/memory/parallel_copy.c",
    "runtime/launch/registry.c",
    "runtime/managed/coherence.c",
    "runtime/managed/um_range.c",
    "runtime/managed/api_managed.c",
    "runtime/managed/um_pack.c",
    "runtime/memory/page_move.c",
    "runtime/memory/api_host.c",
    "runtime/device/api_device.c",
    "runtime/memory/api_mempool.c",
    "runtime/memory/api_ipc.c",
    "runtime/memory/staging.c",
    "runtime/memory/api_memory.c",
    "runtime/launch/api_launch.c",
    "runtime/stream/stream_handles.c",
    "runtime/stream/api_stream.c",
    "runtime/misc/api_misc.c",
    "runtime/stream/api_stream_info.c",
    "runtime/launch/api_symbols.c",
    "runtime/launch/api_launch_ex.c",
    "runtime/device/api_peer.c",
    "runtime/stream/api_ptds.c",
    "runtime/texture/api_array.c",
    "runtime/memory/api_memory3d.c",
    "runtime/texture/api_texture.c",
    "runtime/misc/api_helpers.c",
    "runtime/stream/callbacks.c",
    "runtime/device/device_props.c",
    "bridge/driver_ops.c",
    "runtime/graph/graph_model.c",
    "runtime/graph/api_graph.c",
    "runtime/graph/graph_capture.c",
    "runtime/graph/graph_remote.c",
    "runtime/graph/graph_mem.c",
    "runtime/misc/static_check.c",
    "runtime/misc/api_entry_point.c",
    "runtime/stream/api_stream_attr.c",
]
# The driver API library's sources (libpilot-cuda.so, SONAME libcuda.so.1); drv_gen.c and
# drv_errors.c are generated from shim/tables/cuda_driver_exports.tsv and the driver headers.
DRIVER_SOURCES = [
    "driver/drv_core.c", "driver/drv_api.c", "driver/drv_link.c", "driver/drv_host.c",
    "driver/drv_ptds.c", "driver/drv_export.c",
    "bridge/ops_lookup.c"]
# libpilot.so's one export beyond libcudart's: the driver library's way in (driver_ops.h).
PRIVATE_NODE = "PILOT_PRIVATE_1"
PRIVATE_EXPORTS = ("pilot_driver_ops",)
# The CUDA 12 build's own sources (shim/runtime/cuda12/cuda12_*.c; hack/check_api_table.py reads them as
# such).
CUDA12_SOURCES = ["runtime/cuda12/cuda12_compat.c"]
C_FLAGS = ["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]


def _shim_package():
    spec = importlib.util.spec_from_file_location("pilot_shim_init", SHIM_DIR / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _library_names() -> dict[int, str]:
    """The library each build produces, by the CUDA major version of the libcudart it stands in
    for: pilot.shim.LIBRARIES, read from shim/__init__.py (the package is not installed yet)."""
    spec = importlib.util.spec_from_file_location("pilot_shim_init", SHIM_DIR / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.LIBRARIES)


LIBRARIES = _library_names()
DRIVER_LIBRARY = _shim_package().DRIVER_LIBRARY
LIBRARY_STANDINS = _shim_package().LIBRARY_STANDINS
# The stand-ins' sources beside their generated stubs, by the table name (gen_shim_tables.py
# --library) of each SONAME.
STANDIN_SOURCES = {
    "libcublas.so.13": ("cublas", ["libs/cublas_api.c", "libs/blas_common.c", "bridge/ops_lookup.c"]),
    "libcublasLt.so.13": ("cublasLt", ["libs/cublaslt_api.c", "libs/blas_common.c",
                                       "bridge/ops_lookup.c"]),
    "libcudnn.so.9": ("cudnn", ["libs/cudnn_api.c", "bridge/ops_lookup.c"]),
}


def _cdef_text(header: Path, marker: str) -> str:
    """The plain-C part of a header between its /* <marker>_BEGIN */ and _END comments."""
    text = header.read_text()
    match = re.search(rf"/\* {marker}_BEGIN \*/(.*)/\* {marker}_END \*/", text, re.S)
    if not match:
        raise RuntimeError(f"{header}: {marker} markers missing")
    return re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)


# pilot.shim._proto's C: the socket-path rule it shares with the shim, and the daemon's own C.
PROTO_SOURCES = [str(TRANSPORT_DIR / "socket_path.c")] + [
    str(NATIVE_DIR / s) for s in ("vgpu_server.c", "fast_state.c", "fast_launch.c",
                                  "fast_library.c", "fast_words.c", "gates.c", "spin_budget.c",
                                  "preempt_words.c")]


def _make_ffi() -> FFI:
    ffi = FFI()
    ffi.cdef(_cdef_text(PROTO_HEADER, "PILOT_CDEF"))
    ffi.cdef(_cdef_text(NATIVE_DIR / "vgpu_server.h", "PILOT_SRV_CDEF"))
    ffi.cdef(_cdef_text(NATIVE_DIR / "preempt_words.h", "PILOT_PREEMPT_CDEF"))
    ffi.cdef(_cdef_text(NATIVE_DIR / "fast_launch.h", "PILOT_FAST_CDEF"))
    ffi.cdef(_cdef_text(NATIVE_DIR / "gates.h", "PILOT_GATE_CDEF"))
    ffi.cdef(_cdef_text(NATIVE_DIR / "spin_budget.h", "PILOT_SPIN_CDEF"))
    ffi.cdef("int pilot_socket_path(int for_daemon, char *buf, size_t len);")
    ffi.set_source(
        "pilot.shim._proto",
        '#include "pilot_proto.h"\n#include "socket_path.h"\n#include "vgpu_server.h"\n'
        '#include "preempt_words.h"\n#include "fast_launch.h"\n#include "gates.h"\n'
        '#include "spin_budget.h"\n',
        sources=PROTO_SOURCES,
        include_dirs=[str(NATIVE_DIR), str(TRANSPORT_DIR)],
        extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
    )
    return ffi


ffi = _make_ffi()


def cuda_include_dir() -> Path:
    """Where cuda_runtime_api.h lives: $CUDA_HOME, $CUDA_PATH, nvcc's toolkit, /usr/local/cuda."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and (Path(root) / "include" / "cuda_runtime_api.h").exists():
            return Path(root) / "include"
    raise RuntimeError(
        "pilot: CUDA 13 headers not found (looked in $CUDA_HOME, $CUDA_PATH, nvcc's toolkit and "
        "/usr/local/cuda); install the CUDA toolkit or set CUDA_HOME"
    )


def generate_tables(out_dir: Path, cuda: int = 13) -> list[Path]:
    """The generated C of one build (stubs.c, errors.c; for 12 also cudart12_renames.h)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(REPO_DIR / "hack" / "gen_shim_tables.py"), str(out_dir),
         "--cuda", str(cuda)],
        check=True,
    )
    return [out_dir / "stubs.c", out_dir / "errors.c"]


# The glibc base symbol version of this architecture: coherence.c overrides sigaction() and
# signal() (so a program's own SIGSEGV handler chains behind the unified-memory fault handler),
# and a program's references to them are versioned with it. glibc's lookup matches versions by
# name, so exporting them under a node of that name binds the program's calls to the shim.
GLIBC_BASE_VERSION = {"x86_64": "GLIBC_2.2.5", "aarch64": "GLIBC_2.17"}
LIBC_OVERRIDES = ("sigaction", "signal", "sigset", "bsd_signal")


def version_script(gen_dir: Path, cuda: int = 13) -> Path:
    """shim/tables/libcudart.map (for libcudart.so.<cuda>) plus the libc overrides' node, for this
    machine."""
    base = GLIBC_BASE_VERSION.get(platform.machine())
    if base is None:
        raise RuntimeError(f"no glibc base version known for {platform.machine()}")
    text = (TABLES_DIR / "libcudart.map").read_text().replace("libcudart.so.13",
                                                             f"libcudart.so.{cuda}")
    text += f"\n{base} {{\n  global: {'; '.join(LIBC_OVERRIDES)};\n}};\n"
    text += f"\n{PRIVATE_NODE} {{\n  global: {'; '.join(PRIVATE_EXPORTS)};\n}};\n"
    out = gen_dir / "libpilot.map"
    out.write_text(text)
    return out


def shared_source_flags(cuda: int, gen_dir: Path) -> list[str]:
    """Extra compiler flags for the hand-written sources of one build."""
    flags = [f"-DPILOT_CUDART_MAJOR={cuda}"]
    if cuda == 12:
        flags += ["-include", str((gen_dir / "cudart12_renames.h").resolve())]
    return flags


def hand_written_sources(cuda: int) -> list[Path]:
    return [SHIM_DIR / s for s in SHIM_SOURCES + (CUDA12_SOURCES if cuda == 12 else [])]


def build_shim(compiler, out_dir: str, build_temp: str = "build/shim", cuda: int = 13) -> Path:
    """Compile libpilot.so (cuda=13) or libpilot12.so (cuda=12) into out_dir with a
    setuptools/distutils CCompiler."""
    gen_dir = Path(build_temp) / f"shim_gen{cuda}"
    generated = generate_tables(gen_dir, cuda)
    include_dirs = [*map(str, INCLUDE_DIRS), str(gen_dir), str(cuda_include_dir())]
    obj_dir = str(Path(build_temp) / f"shim_obj{cuda}")
    objects = compiler.compile(
        [str(p) for p in hand_written_sources(cuda)],
        output_dir=obj_dir,
        include_dirs=include_dirs,
        extra_postargs=C_FLAGS + shared_source_flags(cuda, gen_dir),
    )
    objects += compiler.compile(  # never renamed: they define the exported stubs themselves
        [str(p) for p in generated],
        output_dir=obj_dir,
        include_dirs=include_dirs,
        extra_postargs=C_FLAGS,
    )
    target = Path(out_dir) / LIBRARIES[cuda]
    compiler.link_shared_object(
        objects,
        str(target),
        libraries=["pthread", "dl", "rt"],
        extra_postargs=[
            f"-Wl,-soname,libcudart.so.{cuda}",
            f"-Wl,--version-script={version_script(gen_dir, cuda)}",
            "-Wl,--no-undefined",
            "-Wl,-z,now",
        ],
    )
    return target


def build_driver(compiler, out_dir: str, build_temp: str = "build/shim") -> Path:
    """libpilot-cuda.so: SONAME libcuda.so.1, exporting exactly shim/tables/cuda_driver_exports.tsv,
    unversioned like the real libcuda. It links only libc: libpilot.so's table is found at run
    time (shim/driver/drv_core.c), so linking never records libpilot.so's SONAME, libcudart.so.13, as
    needed (which could map the real runtime beside the shim)."""
    gen_dir = Path(build_temp) / "shim_gen_driver"
    gen_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(REPO_DIR / "hack" / "gen_shim_tables.py"), str(gen_dir),
                    "--driver", str(cuda_include_dir())], check=True)
    include_dirs = [*map(str, INCLUDE_DIRS), str(gen_dir), str(cuda_include_dir())]
    sources = [str(SHIM_DIR / s) for s in DRIVER_SOURCES] + [
        str(gen_dir / "drv_errors.c"), str(gen_dir / "drv_gen.c")]
    objects = compiler.compile(sources, output_dir=str(Path(build_temp) / "shim_obj_driver"),
                               include_dirs=include_dirs, extra_postargs=C_FLAGS)
    script = gen_dir / "libpilot-cuda.map"
    script.write_text("/* Unversioned, like libcuda.so.1's exports. */\n"
                      "{\n  global: cu*;\n  local: *;\n};\n")
    target = Path(out_dir) / DRIVER_LIBRARY
    compiler.link_shared_object(
        objects,
        str(target),
        libraries=["pthread", "dl"],
        extra_postargs=["-Wl,-soname,libcuda.so.1", f"-Wl,--version-script={script}",
                        "-Wl,--no-undefined", "-Wl,-z,now"],
    )
    return target


def build_standin(compiler, soname: str, out_dir: str, build_temp: str = "build/shim") -> Path:
    """A CUDA library's stand-in (libpilot-cublas.so for libcublas.so.13, ...): that SONAME, every
    export of its table under the version node named like the SONAME (as NVIDIA's), linking
    only libc: libpilot.so's session table is found at run time (shim/bridge/ops_lookup.c)."""
    table, sources = STANDIN_SOURCES[soname]
    gen_dir = Path(build_temp) / f"shim_gen_{table}"
    gen_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(REPO_DIR / "hack" / "gen_shim_tables.py"), str(gen_dir),
                    "--library", table], check=True)
    include_dirs = [*map(str, INCLUDE_DIRS), str(gen_dir), str(cuda_include_dir())]
    paths = [str(SHIM_DIR / s) for s in sources] + [str(gen_dir / f"{table}_stubs.c")]
    for generated in ("calls", "gemms"):  # cuBLAS: the generic path's functions, the typed GEMMs
        if (gen_dir / f"{table}_{generated}.c").exists():
            paths.append(str(gen_dir / f"{table}_{generated}.c"))
    objects = compiler.compile(paths, output_dir=str(Path(build_temp) / f"shim_obj_{table}"),
                               include_dirs=include_dirs, extra_postargs=C_FLAGS)
    script = gen_dir / f"{table}.map"
    prefix = "cudnn" if table == "cudnn" else "cublas"
    script.write_text(f"{soname} {{\n  global: {prefix}*;\n  local: *;\n}};\n")
    target = Path(out_dir) / LIBRARY_STANDINS[soname]
    compiler.link_shared_object(
        objects,
        str(target),
        libraries=["pthread", "dl"],
        extra_postargs=[f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}",
                        "-Wl,--no-undefined", "-Wl,-z,now"],
    )
    return target


def build_shims(compiler, out_dir: str, build_temp: str = "build/shim") -> list[Path]:
    """The libraries: libpilot.so for CUDA 13 programs, libpilot12.so for CUDA 12 ones,
    libpilot-cuda.so for the driver API, and the CUDA library stand-ins."""
    return [build_shim(compiler, out_dir, build_temp, cuda) for cuda in LIBRARIES] + [
        build_driver(compiler, out_dir, build_temp)] + [
        build_standin(compiler, soname, out_dir, build_temp) for soname in LIBRARY_STANDINS]


def main() -> None:
    """Build libpilot.so and libpilot12.so by hand, for development: python3 shim/build.py OUT_DIR."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
    out.mkdir(parents=True, exist_ok=True)
    for lib in build_shims(compiler, str(out), build_temp=str(out / "tmp")):
        print(lib)


if __name__ == "__main__":
    main()
