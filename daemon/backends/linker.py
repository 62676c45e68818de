"""The driver's linker (cuLinkCreate/AddData/Complete) for the program's cuLink* calls
(shim/driver/drv_link.c, daemon/ops/linker.py): the CUDA backend's, through libcuda itself,
and the sim's.

The CUDA linker goes through ctypes rather than cuda-python: its options are an array of
CUjit_option and one of void* values (log buffers among them), which ctypes builds exactly as
the C API takes them; and ctypes releases the GIL while the driver compiles and links, which
can take seconds for large PTX. The calling thread's current context is the vGPU's (the driver
links for its device)."""

from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    BackendError,
)
from pilot.daemon.backends.fatbin import ptx_kernels, ptx_text

INPUT_CUBIN, INPUT_PTX, INPUT_FATBINARY, INPUT_OBJECT, INPUT_LIBRARY = range(5)
# CUjit_option values the linker's logs need
_INFO_LOG, _INFO_LOG_SIZE, _ERROR_LOG, _ERROR_LOG_SIZE = 3, 4, 5, 6
LOG_BYTES = 64 << 10
# PTX functions declared from elsewhere and defined here (a return parameter list may come first)
_EXTERN = re.compile(r"\.extern\s+\.func\s*(?:\([^)]*\))?\s*([\w$]+)")
_DEFINED = re.compile(r"\.(?:visible|weak)\s+\.func\s*(?:\([^)]*\))?\s*([\w$]+)")


class LinkFailed(BackendError):
    """The link failed: `code` the driver's CUresult, `log` its error log."""

    def __init__(self, code: int, log: str) -> None:
        super().__init__(code, log)
        self.log = log


@dataclass(frozen=True)
class LinkInput:
    kind: int  # CUjitInputType
    name: str
    data: bytes


def sim_link(inputs: list[LinkInput]) -> tuple[bytes, str]:
    """The sim's linker: PTX inputs become one PTX text (the sim reads kernels from PTX by their
    entries and runs their emulations); libraries (libcudadevrt.a) add nothing it could run.
    Cubins, fatbins and objects it cannot merge: refused, never accepted and ignored."""
    texts = []
    for item in inputs:
        if item.kind == INPUT_LIBRARY:
            continue
        if item.kind != INPUT_PTX:
            raise LinkFailed(CUDA_ERROR_NOT_SUPPORTED,
                               f"{item.name}: the sim backend links PTX inputs only")
        text = ptx_text(item.data)
        if text is None:
            raise LinkFailed(CUDA_ERROR_INVALID_PTX, f"{item.name}: not PTX text")
        try:
            ptx_kernels(text)
        except ValueError as exc:
            raise LinkFailed(CUDA_ERROR_INVALID_PTX, f"{item.name}: {exc}") from None
        texts.append(text)
    if not texts:
        raise LinkFailed(CUDA_ERROR_INVALID_VALUE, "cuLinkComplete: no input to link")
    if not any(item.kind == INPUT_LIBRARY for item in inputs):  # a library may define them
        defined = {n for t in texts for n in _DEFINED.findall(t)}
        missing = sorted({n for t in texts for n in _EXTERN.findall(t)} - defined)
        if missing:
            raise LinkFailed(CUDA_ERROR_INVALID_IMAGE, f"error: undefined reference to '{missing[0]}'")
    return "\n".join(texts).encode() + b"\0", ""


class CudaLinker:
    """libcuda's linker, loaded on first use."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def _libcuda(self) -> ctypes.CDLL:
        with self._lock:
            if self._lib is None:
                lib = ctypes.CDLL("libcuda.so.1")
                vp, sz = ctypes.c_void_p, ctypes.c_size_t
                lib.cuLinkCreate_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                                                ctypes.POINTER(vp), ctypes.POINTER(vp)]
                lib.cuLinkAddData_v2.argtypes = [vp, ctypes.c_int, vp, sz, ctypes.c_char_p,
                                                 ctypes.c_uint, vp, vp]
                lib.cuLinkComplete.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(sz)]
                lib.cuLinkDestroy.argtypes = [vp]
                for fn in (lib.cuLinkCreate_v2, lib.cuLinkAddData_v2, lib.cuLinkComplete,
                           lib.cuLinkDestroy):
                    fn.restype = ctypes.c_int
                self._lib = lib
            return self._lib

    def link(self, inputs: list[LinkInput], options: list[tuple[int, int]]) -> tuple[bytes, str]:
        """(cubin, info log); BackendError(the driver's error, its error log) when it fails."""
        lib = self._libcuda()
        info, error = ctypes.create_string_buffer(LOG_BYTES), ctypes.create_string_buffer(LOG_BYTES)
        keys = [_INFO_LOG, _INFO_LOG_SIZE, _ERROR_LOG, _ERROR_LOG_SIZE, *(o for o, _ in options)]
        values = [ctypes.addressof(info), LOG_BYTES, ctypes.addressof(error), LOG_BYTES,
                  *(v for _, v in options)]
        n = len(keys)
        # Both option arrays and every input's buffer are locals, alive until cuLinkDestroy: the
        # driver keeps the arrays and writes the logs' sizes back into `option_values` at
        # cuLinkComplete (CUDA documents this for output options). As temporaries, freed when
        # cuLinkCreate returned, they were written after reuse: pilotd died on the H200.
        option_keys, option_values = (ctypes.c_int * n)(*keys), (ctypes.c_void_p * n)(*values)
        buffers: list[ctypes.Array[ctypes.c_char]] = []
        state = ctypes.c_void_p()
        r = lib.cuLinkCreate_v2(n, option_keys, option_values, ctypes.byref(state))
        if r:
            raise LinkFailed(r, "cuLinkCreate failed")

        def failed(r: int, what: str) -> LinkFailed:
            return LinkFailed(r, error.value.decode(errors="replace") or what)

        try:
            for item in inputs:
                data = item.data + b"\0" if item.kind == INPUT_PTX else item.data
                buffers.append(ctypes.create_string_buffer(data, len(data)))
                r = lib.cuLinkAddData_v2(state, item.kind, ctypes.addressof(buffers[-1]), len(data),
                                         item.name.encode(), 0, None, None)
                if r:
                    raise failed(r, f"cuLinkAddData of {item.name} failed")
            cubin, size = ctypes.c_void_p(), ctypes.c_size_t()
            r = lib.cuLinkComplete(state, ctypes.byref(cubin), ctypes.byref(size))
            if r:
                raise failed(r, "cuLinkComplete failed")
            return ctypes.string_at(cubin, size.value), info.value.decode(errors="replace")
        finally:
            lib.cuLinkDestroy(state)
