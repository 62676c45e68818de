"""NVIDIA's cuBLAS and cuBLASLt, called through ctypes in pilotd's own CUDA context (the cuda
backend's half of backends/libraries.py).

The libraries link their own static CUDA runtime, which works here because pilotd runs on the
real libcuda; it uses the context current on the calling vGPU thread (its device's primary
context). ctypes releases the GIL for each call. Handles are kept in a pool per device and
library: cublasDestroy synchronizes the whole device (every tenant's work), and creating one
allocates, so a program's destroyed handle goes back to the pool for the next program; its
settings are all applied again by the next owner (HandleState).
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from pilot.daemon.backends.libraries import (
    DESC_COMPUTE_TYPE,
    DESC_SCALE_TYPE,
    GEMM_BATCHED,
    GEMM_EX,
    GEMM_STRIDED,
    LAYOUT_COLS,
    LAYOUT_LD,
    LAYOUT_ROWS,
    LAYOUT_TYPE,
    LIB_CUBLAS,
    LIB_CUBLASLT,
    LIBRARY_NAMES,
    LT_A,
    LT_B,
    LT_C,
    LT_D,
    LT_DESC,
    LT_PREF,
    POINTER_MODE_DEVICE,
    STATUS_NOT_INITIALIZED,
    STATUS_SUCCESS,
    BlasSettings,
    GemmCall,
    LibraryError,
    LtCall,
    lt_pointer_attr,
)

SONAMES = {LIB_CUBLAS: "libcublas.so.13", LIB_CUBLASLT: "libcublasLt.so.13"}
POOL_MAX = 16  # idle handles kept per device and library
# cuBLASLt descriptor sets kept per handle. Their records hold pointers (bias, epilogue aux), so a
# transformer's training step used ~300 distinct sets; 64 evicted each before its next use and
# sent every cublasLtMatmul back through Python to build its descriptors again (issue 25, H100).
LT_CACHE_MAX = 1024

_vp, _i, _sz, _ll, _u64, _i64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                 ctypes.c_longlong, ctypes.c_uint64, ctypes.c_int64)
_pvp = ctypes.POINTER(ctypes.c_void_p)
# argtypes of the functions pilotd calls (cublas_api.h, cublasLt.h)
_GEMM = [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _vp, _i, _vp, _vp, _i]
_GEMM_STRIDED = [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _ll, _vp, _i, _ll, _vp, _vp, _i, _ll, _i]
_SIGNATURES: dict[str, list[Any]] = {
    "cublasCreate_v2": [_pvp], "cublasDestroy_v2": [_vp], "cublasGetProperty": [_i, ctypes.POINTER(_i)],
    "cublasSetStream_v2": [_vp, _vp], "cublasSetWorkspace_v2": [_vp, _vp, _sz],
    "cublasSetMathMode": [_vp, _i], "cublasSetPointerMode_v2": [_vp, _i],
    "cublasSetAtomicsMode": [_vp, _i], "cublasSetSmCountTarget": [_vp, _i],
    "cublasSgemm_v2": _GEMM, "cublasDgemm_v2": _GEMM, "cublasHgemm": _GEMM,
    "cublasGemmEx": [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _i, _vp, _i, _i, _vp, _vp, _i, _i, _i, _i],
    "cublasSgemmStridedBatched": _GEMM_STRIDED, "cublasDgemmStridedBatched": _GEMM_STRIDED,
    "cublasHgemmStridedBatched": _GEMM_STRIDED,
    "cublasGemmStridedBatchedEx": [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _i, _ll, _vp, _i, _i,
                                   _ll, _vp, _vp, _i, _i, _ll, _i, _i, _i],
    "cublasCgemm_v2": _GEMM, "cublasZgemm_v2": _GEMM,
    "cublasCgemmStridedBatched": _GEMM_STRIDED, "cublasZgemmStridedBatched": _GEMM_STRIDED,
    "cublasSgemmBatched": [*_GEMM, _i], "cublasDgemmBatched": [*_GEMM, _i],
    "cublasCgemmBatched": [*_GEMM, _i], "cublasZgemmBatched": [*_GEMM, _i],
    "cublasGemmBatchedEx": [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _i, _vp, _i, _i, _vp, _vp, _i,
                            _i, _i, _i, _i],
    "cublasLtCreate": [_pvp], "cublasLtDestroy": [_vp], "cublasLtGetVersion": [],
    "cublasLtMatmulDescCreate": [_pvp, _i, _i], "cublasLtMatmulDescDestroy": [_vp],
    "cublasLtMatmulDescSetAttribute": [_vp, _i, _vp, _sz],
    "cublasLtMatrixLayoutCreate": [_pvp, _i, _u64, _u64, _i64],
    "cublasLtMatrixLayoutDestroy": [_vp], "cublasLtMatrixLayoutSetAttribute": [_vp, _i, _vp, _sz],
    "cublasLtMatmulPreferenceCreate": [_pvp], "cublasLtMatmulPreferenceDestroy": [_vp],
    "cublasLtMatmulPreferenceSetAttribute": [_vp, _i, _vp, _sz],
    "cublasLtMatmulAlgoGetHeuristic": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _i, _vp, ctypes.POINTER(_i)],
    "cublasLtMatmul": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp],
}


def search_dirs() -> list[str]:
    """Where pilotd looks for the libraries, in order: $PILOT_LIBRARY_PATH, the loader's own
    search (tried first, by SONAME), the CUDA toolkit, and Python packages (nvidia-cublas,
    nvidia-cudnn)."""
    dirs = [d for d in os.environ.get("PILOT_LIBRARY_PATH", "").split(":") if d]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            dirs += [os.path.join(root, "lib64"), os.path.join(root, "targets", "x86_64-linux", "lib")]
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for root in roots:
        for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cudnn/lib"):
            dirs += glob.glob(os.path.join(root, sub))
    return list(dict.fromkeys(dirs))


def load_library(soname: str) -> ctypes.CDLL:
    explicit = [d for d in os.environ.get("PILOT_LIBRARY_PATH", "").split(":") if d]
    tried = []
    for candidate in [os.path.join(d, soname) for d in explicit] + [soname] + [
            os.path.join(d, soname) for d in search_dirs() if d not in explicit]:
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            tried.append(f"{candidate}: {exc}")
    raise LibraryError(STATUS_NOT_INITIALIZED,
                       f"pilotd cannot load {soname} (set PILOT_LIBRARY_PATH to its directory); "
                       f"tried {len(tried)} places")


@dataclass
class HandleState:
    """A real handle lent to one program handle, and the settings last applied to it (None: none
    yet, so the first call applies them all)."""

    library: int
    device: int
    ptr: int
    stream: int | None = None
    workspace: tuple[int, int] | None = None
    modes: tuple[int, int, int, int] | None = None
    lt_cache: dict[bytes, Any] = field(default_factory=dict)
    # device memory of pilotd's for the pointer arrays it passes (address, bytes), and the
    # stream of the last call that used it (CudaBackend._own_pointer_arrays)
    scratch: tuple[int, int] | None = None
    scratch_stream: Any = None
    lt_evicted: list[bytes] = field(default_factory=list)  # keys destroyed (the fast path forgets)


class CudaLibraries:
    """Loaded libraries, their functions and the handle pools of one CudaBackend."""

    def __init__(self) -> None:
        self._libs: dict[int, ctypes.CDLL] = {}
        self._fns: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._pool: dict[tuple[int, int], list[int]] = {}

    def _fn(self, library: int, name: str, argtypes: list[Any] | None = None) -> Any:
        """The library's function `name`, typed with `argtypes` (default: _SIGNATURES')."""
        fn = self._fns.get(name)
        if fn is None:
            with self._lock:
                lib = self._libs.get(library)
                if lib is None:
                    lib = self._libs[library] = load_library(SONAMES[library])
                fn = getattr(lib, name)
                fn.argtypes = _SIGNATURES[name] if argtypes is None else argtypes
                fn.restype = ctypes.c_size_t if name == "cublasLtGetVersion" else ctypes.c_int
                self._fns[name] = fn
        return fn

    def _call(self, library: int, name: str, *args: Any) -> None:
        status = self._fn(library, name)(*args)
        if status != STATUS_SUCCESS:
            raise LibraryError(status, name)

    def version(self, library: int) -> int:
        if library == LIB_CUBLASLT:
            return int(self._fn(library, "cublasLtGetVersion")())
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            self._call(library, "cublasGetProperty", prop, ctypes.byref(value))
            parts.append(value.value)
        return parts[0] * 10000 + parts[1] * 100 + parts[2]

    def create(self, library: int, device: int) -> HandleState:
        with self._lock:
            idle = self._pool.get((device, library))
            ptr = idle.pop() if idle else None
        if ptr is None:
            out = ctypes.c_void_p()
            name = "cublasCreate_v2" if library == LIB_CUBLAS else "cublasLtCreate"
            self._call(library, name, ctypes.byref(out))
            ptr = out.value or 0
        return HandleState(library, device, ptr)

    def release(self, state: HandleState) -> None:
        """The program is done with the handle: back to the pool, or destroyed when it is full.
        A pooled cuBLAS handle goes back to the legacy stream (the program's may be destroyed)."""
        if state.library == LIB_CUBLAS and state.ptr:  # (the fast path may have set one)
            self._call(LIB_CUBLAS, "cublasSetStream_v2", state.ptr, 0)
        with self._lock:
            idle = self._pool.setdefault((state.device, state.library), [])
            if len(idle) < POOL_MAX:
                idle.append(state.ptr)
                state.ptr = 0
        if state.ptr:
            self._destroy(state.library, state.ptr)
        for objects in state.lt_cache.values():
            self._lt_destroy(objects)
        state.lt_cache.clear()

    def _destroy(self, library: int, ptr: int) -> None:
        self._call(library, "cublasDestroy_v2" if library == LIB_CUBLAS else "cublasLtDestroy", ptr)

    def close(self) -> None:
        with self._lock:
            pools, self._pool = self._pool, {}
        for (_, library), ptrs in pools.items():
            for ptr in ptrs:
                try:
                    self._destroy(library, ptr)
                except LibraryError:
                    pass

    def fast_functions(self) -> dict[int, int]:
        """The loaded libraries' functions fast_library.c calls (enum pilot_fast_libfn)."""
        out: dict[int, int] = {}
        names = {LIB_CUBLAS: _FAST_BLAS,
                 LIB_CUBLASLT: {7: "cublasLtMatmul", 33: "cublasLtMatmulDescSetAttribute"}}
        for library, table in names.items():
            lib = self._libs.get(library)
            if lib is None:
                continue
            for index, name in table.items():
                try:
                    out[index] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
                except AttributeError:
                    pass
        return out

    # ---- cuBLAS ----

    def _apply(self, state: HandleState, settings: BlasSettings, stream: int) -> None:
        """The handle's settings that changed since its last call, onto the real handle."""
        h, lib = state.ptr, LIB_CUBLAS
        if state.stream != stream:
            self._call(lib, "cublasSetStream_v2", h, stream)  # resets the workspace to default
            state.stream, state.workspace = stream, None
        workspace = (settings.workspace, settings.workspace_size) if settings.workspace_set else (0, -1)
        if state.workspace != workspace:
            if settings.workspace_set:
                self._call(lib, "cublasSetWorkspace_v2", h, settings.workspace, settings.workspace_size)
            elif state.workspace is not None:  # back to the default workspace
                self._call(lib, "cublasSetStream_v2", h, stream)
            state.workspace = workspace
        modes = (settings.math_mode, settings.atomics_mode, settings.sm_count_target,
                 settings.pointer_mode)
        if state.modes != modes:
            self._call(lib, "cublasSetMathMode", h, settings.math_mode)
            self._call(lib, "cublasSetAtomicsMode", h, settings.atomics_mode)
            self._call(lib, "cublasSetSmCountTarget", h, settings.sm_count_target)
            self._call(lib, "cublasSetPointerMode_v2", h, settings.pointer_mode)
            state.modes = modes

    def gemm(self, state: HandleState, call: GemmCall, settings: BlasSettings, stream: int) -> None:
        self._apply(state, settings, stream)
        h, lib = state.ptr, LIB_CUBLAS
        alpha, beta, keep = _scalars(call.alpha, call.beta, settings.pointer_mode)
        c = call
        if c.fn in GEMM_EX and c.fn in GEMM_BATCHED:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.atype, c.lda, c.b,
                    c.btype, c.ldb, beta, c.c, c.ctype, c.ldc, c.batch, c.compute_type, c.algo)
        elif c.fn in GEMM_BATCHED:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.lda, c.b, c.ldb, beta,
                    c.c, c.ldc, c.batch)
        elif c.fn in GEMM_EX and c.fn in GEMM_STRIDED:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.atype, c.lda, c.stride_a,
                    c.b, c.btype, c.ldb, c.stride_b, beta, c.c, c.ctype, c.ldc, c.stride_c,
                    c.batch, c.compute_type, c.algo)
        elif c.fn in GEMM_EX:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.atype, c.lda, c.b,
                    c.btype, c.ldb, beta, c.c, c.ctype, c.ldc, c.compute_type, c.algo)
        elif c.fn in GEMM_STRIDED:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.lda, c.stride_a, c.b,
                    c.ldb, c.stride_b, beta, c.c, c.ldc, c.stride_c, c.batch)
        else:
            args = (h, c.transa, c.transb, c.m, c.n, c.k, alpha, c.a, c.lda, c.b, c.ldb, beta,
                    c.c, c.ldc)
        self._call(lib, c.name, *args)
        del keep

    def call(self, state: HandleState, fn: Any, args: list[int], scalars: list[bytes],
             settings: BlasSettings, stream: int, host_result: bool) -> bytes | None:
        """A function of the generic path (blas_calls.py) with its raw arguments: host scalars
        and a host result through buffers of pilotd's (the library fills a host result before
        it returns, as natively)."""
        self._apply(state, settings, stream)
        name = fn.name
        c_fn = self._fns.get(name) or self._fn(
            LIB_CUBLAS, name, [_vp] + [_i if k == "i" else _vp for k in fn.kinds])
        values: list[Any] = [state.ptr]
        keep: list[Any] = []
        result = None
        host = settings.pointer_mode != POINTER_MODE_DEVICE
        scalar = iter(scalars)
        for kind, raw in zip(fn.kinds, args, strict=True):
            if kind == "i":
                values.append(raw - (1 << 64) if raw >= 1 << 63 else raw)
            elif kind == "s" and host:
                buf = ctypes.create_string_buffer(next(scalar), 16)
                keep.append(buf)
                values.append(ctypes.cast(buf, ctypes.c_void_p))
            elif kind in ("r", "x") and host_result:
                result = ctypes.create_string_buffer(4 if kind == "x" else fn.elem)
                values.append(ctypes.cast(result, ctypes.c_void_p))
            else:
                values.append(raw or None)
        status = c_fn(*values)
        if status != STATUS_SUCCESS:
            raise LibraryError(status, name)
        del keep
        return result.raw if result is not None else None

    # ---- cuBLASLt ----

    def _lt_build(self, call: LtCall, with_pref: bool) -> list[tuple[str, int]]:
        """Real descriptors for the call's attributes: [(destroy function, pointer), ...] in
        the order desc, A, B, C, D[, preference]."""
        lib, made = LIB_CUBLASLT, []
        try:
            v = call.value
            out = ctypes.c_void_p()
            self._call(lib, "cublasLtMatmulDescCreate", ctypes.byref(out),
                       v(LT_DESC, DESC_COMPUTE_TYPE), v(LT_DESC, DESC_SCALE_TYPE))
            made.append(("cublasLtMatmulDescDestroy", out.value or 0))
            self._set_all(made[-1][1], "cublasLtMatmulDescSetAttribute", call.attrs.get(LT_DESC, {}),
                          (DESC_COMPUTE_TYPE, DESC_SCALE_TYPE))
            for obj in (LT_A, LT_B, LT_C, LT_D):
                out = ctypes.c_void_p()
                self._call(lib, "cublasLtMatrixLayoutCreate", ctypes.byref(out),
                           v(obj, LAYOUT_TYPE), v(obj, LAYOUT_ROWS, signed=False),
                           v(obj, LAYOUT_COLS, signed=False), v(obj, LAYOUT_LD))
                made.append(("cublasLtMatrixLayoutDestroy", out.value or 0))
                self._set_all(made[-1][1], "cublasLtMatrixLayoutSetAttribute",
                              call.attrs.get(obj, {}),
                              (LAYOUT_TYPE, LAYOUT_ROWS, LAYOUT_COLS, LAYOUT_LD))
            if with_pref:
                out = ctypes.c_void_p()
                self._call(lib, "cublasLtMatmulPreferenceCreate", ctypes.byref(out))
                made.append(("cublasLtMatmulPreferenceDestroy", out.value or 0))
                self._set_all(made[-1][1], "cublasLtMatmulPreferenceSetAttribute",
                              call.attrs.get(LT_PREF, {}), ())
        except BaseException:
            self._lt_destroy(made)
            raise
        return made

    def _set_all(self, obj: int, setter: str, attrs: dict[int, bytes], skip: tuple[int, ...]) -> None:
        for attr, value in attrs.items():
            if attr in skip:
                continue
            buf = ctypes.create_string_buffer(bytes(value), len(value))
            self._call(LIB_CUBLASLT, setter, obj, attr, buf, len(value))

    def _lt_destroy(self, made: list[tuple[str, int]]) -> None:
        for name, ptr in made:
            try:
                self._call(LIB_CUBLASLT, name, ptr)
            except LibraryError:
                pass

    def _lt_objects(self, state: HandleState, call: LtCall, key: bytes,
                    with_pref: bool) -> list[tuple[str, int]]:
        """The descriptors for `key` (the call's attribute records), built once per handle."""
        key = (b"H" if with_pref else b"M") + key
        made = state.lt_cache.get(key)
        if made is not None:
            state.lt_cache[key] = state.lt_cache.pop(key)  # the most recently used last
        else:
            made = self._lt_build(call, with_pref)
            if len(state.lt_cache) >= LT_CACHE_MAX:  # the least recently used goes
                old_key = next(iter(state.lt_cache))
                self._lt_destroy(state.lt_cache.pop(old_key))
                if old_key[:1] == b"M":
                    state.lt_evicted.append(old_key[1:])
            state.lt_cache[key] = made
        self._lt_pointers(made[0][1], call)
        return made

    def _lt_pointers(self, desc: int, call: LtCall) -> None:
        """This call's buffers onto the matmul descriptor: the set's key leaves them out
        (ops/libraries.py lt_set_key), so a cached descriptor holds another call's."""
        for attr, value in call.attrs.get(LT_DESC, {}).items():
            if lt_pointer_attr(LT_DESC, attr):
                buf = ctypes.create_string_buffer(bytes(value), len(value))
                self._call(LIB_CUBLASLT, "cublasLtMatmulDescSetAttribute", desc, attr, buf, len(value))

    def lt_matmul(self, state: HandleState, call: LtCall, key: bytes, stream: int) -> None:
        made = self._lt_objects(state, call, key, False)
        mode = call.value(LT_DESC, 2)
        alpha, beta, keep = _scalars(call.alpha, call.beta, mode)
        algo = ctypes.create_string_buffer(call.algo, 64) if call.algo is not None else None
        ptrs = [p for _, p in made]
        self._call(LIB_CUBLASLT, "cublasLtMatmul", state.ptr, ptrs[0], alpha, call.a, ptrs[1],
                   call.b, ptrs[2], beta, call.c, ptrs[3], call.d, ptrs[4],
                   ctypes.cast(algo, ctypes.c_void_p) if algo is not None else None,
                   call.workspace or None, call.workspace_size, stream)
        del keep

    def lt_heuristic(self, state: HandleState, call: LtCall, key: bytes, requested: int) -> list[bytes]:
        made = self._lt_objects(state, call, key, True)
        ptrs = [p for _, p in made]
        out = ctypes.create_string_buffer(96 * requested)
        count = ctypes.c_int()
        self._call(LIB_CUBLASLT, "cublasLtMatmulAlgoGetHeuristic", state.ptr, *ptrs[:6], requested,
                   out, ctypes.byref(count))
        return [out.raw[i * 96:(i + 1) * 96] for i in range(count.value)]


# enum pilot_fast_libfn (daemon/native/fast_launch.h): cuBLAS's setters and GEMMs (8 + pilot_gemm_fn)
_FAST_BLAS = {1: "cublasSetStream_v2", 2: "cublasSetWorkspace_v2", 3: "cublasSetMathMode",
              4: "cublasSetAtomicsMode", 5: "cublasSetSmCountTarget", 6: "cublasSetPointerMode_v2",
              9: "cublasSgemm_v2", 10: "cublasDgemm_v2", 11: "cublasHgemm", 12: "cublasGemmEx",
              13: "cublasSgemmStridedBatched", 14: "cublasDgemmStridedBatched",
              15: "cublasHgemmStridedBatched", 16: "cublasGemmStridedBatchedEx",
              17: "cublasCgemm_v2", 18: "cublasZgemm_v2", 19: "cublasCgemmStridedBatched",
              20: "cublasZgemmStridedBatched"}


def _scalars(alpha: bytes | int, beta: bytes | int, mode: int) -> tuple[Any, Any, Any]:
    """alpha and beta as the library takes them: device addresses, or pointers to host copies
    (returned third, to be kept alive across the call)."""
    if mode == POINTER_MODE_DEVICE:
        return alpha, beta, None
    a = ctypes.create_string_buffer(bytes(alpha), 16)
    b = ctypes.create_string_buffer(bytes(beta), 16)
    return ctypes.cast(a, ctypes.c_void_p), ctypes.cast(b, ctypes.c_void_p), (a, b)


__all__ = ["LIBRARY_NAMES", "CudaLibraries", "HandleState", "load_library", "search_dirs"]
