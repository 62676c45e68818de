"""The shims (libpilot.so, libpilot12.so) and the protocol module built from shim/transport/pilot_proto.h.

Which library, which layer (lowest first; shim/build.py lists each artefact's sources):
- libpilot.so / libpilot12.so: core/ (hooks for fork and device reset), transport/ (log, ZMTP,
  socket path, error state, the session with pilotd), runtime/<chapter>/ (device, memory,
  managed, launch, stream, graph, texture, misc; cuda12/ for the 12 build only), bridge/driver_ops.c
  (the runtime's table for the driver library);
- libpilot-cuda.so: driver/ (plus bridge/ops_lookup.c, which finds libpilot.so's table);
- the cuBLAS, cuBLASLt and cuDNN stand-ins: libs/ (plus bridge/ops_lookup.c);
- tables/: the export tables the stubs and checks are generated from (hack/gen_shim_tables.py);
- pilot.shim._proto, loaded by pilotd: transport/socket_path.c and daemon/native/.
tests/unit/test_shim_layers.py checks that no module calls up or in a circle.
"""

from __future__ import annotations

from pathlib import Path

# The shim for programs linked with libcudart.so.<major>.
LIBRARIES = {13: "libpilot.so", 12: "libpilot12.so"}
CUDA_MAJORS = tuple(sorted(LIBRARIES))
# The driver API library (SONAME libcuda.so.1), preloaded beside a shim for programs that call
# the driver API; it serves them through the shim's session (shim/bridge/driver_ops.h).
DRIVER_LIBRARY = "libpilot-cuda.so"
# Stand-ins for CUDA libraries that link a static runtime pilot cannot carry (cuBLAS, cuBLASLt,
# cuDNN):
# same SONAME and symbol version as NVIDIA's, their calls forwarded to pilotd (shim/libs/blas.h). By
# the SONAME they stand in for; each lists the sources and export table it is built from.
LIBRARY_STANDINS = {
    "libcublas.so.13": "libpilot-cublas.so",
    "libcublasLt.so.13": "libpilot-cublasLt.so",
    "libcudnn.so.9": "libpilot-cudnn.so",
}


def shim_path(cuda: int = 13) -> Path:
    """Absolute path of the installed shim for CUDA `cuda` programs (13: libpilot.so)."""
    if cuda not in LIBRARIES:
        raise ValueError(f"no shim for CUDA {cuda} (there are shims for CUDA "
                         f"{' and '.join(map(str, CUDA_MAJORS))})")
    path = Path(__file__).resolve().parent / LIBRARIES[cuda]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall pilot (pip install .)")
    return path


def driver_path() -> Path:
    """Absolute path of the installed driver API library (libpilot-cuda.so)."""
    path = Path(__file__).resolve().parent / DRIVER_LIBRARY
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall pilot (pip install .)")
    return path


def standin_path(soname: str) -> Path:
    """Absolute path of the installed stand-in for the CUDA library `soname`."""
    path = Path(__file__).resolve().parent / LIBRARY_STANDINS[soname]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall pilot (pip install .)")
    return path
