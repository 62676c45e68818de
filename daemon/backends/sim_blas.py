"""cuBLAS and cuBLASLt on the sim backend: GEMMs computed with numpy over the sim's device
memory, with the checks the real libraries make (data types, dimensions, descriptors), so tests
without a GPU exercise the whole path. Results agree with the GPU's within floating-point
tolerance, not bit for bit (the sim accumulates in double precision).

numpy is imported on first use: the daemon itself does not need it, the sim's library calls do
(it is in pilot's test dependencies)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pilot.daemon.backends.libraries import (
    C_32F,
    C_64F,
    DESC_BIAS_BATCH_STRIDE,
    DESC_BIAS_DATA_TYPE,
    DESC_BIAS_POINTER,
    DESC_COMPUTE_TYPE,
    DESC_EPILOGUE,
    DESC_POINTER_MODE,
    DESC_SCALE_TYPE,
    DESC_TRANSA,
    DESC_TRANSB,
    EPI_BIAS,
    EPI_DEFAULT,
    EPI_GELU,
    EPI_RELU,
    GEMM_EX,
    LT_A,
    LT_B,
    LT_C,
    LT_D,
    OP_N,
    OP_T,
    ORDER_COL,
    ORDER_ROW,
    POINTER_MODE_DEVICE,
    R_8I,
    R_16BF,
    R_16F,
    R_32F,
    R_32I,
    R_64F,
    STATUS_INVALID_VALUE,
    STATUS_NOT_SUPPORTED,
    GemmCall,
    LibraryError,
    LtCall,
    matrix_span,
    type_size,
)

Region = Callable[[int, int], memoryview]  # (address, bytes) -> the sim's device memory

# cuBLAS GEMM type combinations the sim computes: (A/B type, C type, compute types)
_COMBOS = {
    (R_32F, R_32F): (68, 69, 74, 75, 77, 78),
    (R_64F, R_64F): (70, 71, 79),
    (R_16F, R_16F): (64, 65, 68, 69),
    (R_16F, R_32F): (68, 69),
    (R_16BF, R_16BF): (68, 69),
    (R_16BF, R_32F): (68, 69),
    (C_32F, C_32F): (68, 69),
    (C_64F, C_64F): (70, 71),
    (R_8I, R_32I): (72, 73),
}
_SCALE_TYPES = {64: R_16F, 65: R_16F, 70: R_64F, 71: R_64F, 79: R_64F, 72: R_32I, 73: R_32I}


def _np() -> Any:
    import numpy

    return numpy


def _numpy_type(dtype: int) -> Any:
    np = _np()
    return {R_32F: np.float32, R_64F: np.float64, R_16F: np.float16, C_32F: np.complex64,
            C_64F: np.complex128, R_8I: np.int8, R_32I: np.int32, R_16BF: np.uint16}[dtype]


def _view(region: Region, ptr: int, dtype: int, rows: int, cols: int, ld: int, batch: int,
          stride: int, row_major: bool) -> Any:
    """The (batch, rows, cols) matrices at ptr, a writable view of the sim's memory."""
    np = _np()
    elem = type_size(dtype, "matrix")
    span = (matrix_span(cols, rows, ld, 1, batch, stride) if row_major
            else matrix_span(rows, cols, ld, 1, batch, stride))
    raw = np.frombuffer(region(ptr, span * elem), dtype=_numpy_type(dtype), count=span)
    strides = (stride * elem, ld * elem, elem) if row_major else (stride * elem, elem, ld * elem)
    return np.lib.stride_tricks.as_strided(raw, shape=(batch, rows, cols), strides=strides,
                                           writeable=True)


def _read(region: Region, ptr: int, dtype: int, rows: int, cols: int, ld: int, batch: int,
          stride: int, row_major: bool = False) -> Any:
    """The (batch, rows, cols) matrices at ptr, as float64/complex128."""
    np = _np()
    view = _view(region, ptr, dtype, rows, cols, ld, batch, stride, row_major)
    if dtype == R_16BF:
        view = (view.astype(np.uint32) << 16).view(np.float32)
    return view.astype(np.complex128 if dtype in (C_32F, C_64F) else np.float64)


def _write(region: Region, ptr: int, dtype: int, values: Any, ld: int, stride: int,
           row_major: bool = False) -> None:
    np = _np()
    batch, rows, cols = values.shape
    view = _view(region, ptr, dtype, rows, cols, ld, batch, stride, row_major)
    if dtype == R_16BF:  # round to nearest even, as the GPU's conversion does
        bits = values.real.astype(np.float32).view(np.uint32)
        view[...] = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    elif dtype in (R_8I, R_32I):
        info = np.iinfo(_numpy_type(dtype))
        view[...] = np.clip(np.rint(values.real), info.min, info.max)
    elif dtype in (C_32F, C_64F):
        view[...] = values
    else:
        view[...] = values.real


def _scalar(region: Region, value: bytes | int, dtype: int, device: bool) -> complex:
    size = type_size(dtype, "scalar")
    raw = bytes(region(value, size)) if device else bytes(value)[:size]  # type: ignore[arg-type]
    if dtype == R_32F:
        return struct.unpack("<f", raw)[0]
    if dtype == R_64F:
        return struct.unpack("<d", raw)[0]
    if dtype == R_16F:
        return struct.unpack("<e", raw)[0]
    if dtype == R_32I:
        return struct.unpack("<i", raw)[0]
    if dtype == C_32F:
        re, im = struct.unpack("<ff", raw)
        return complex(re, im)
    if dtype == C_64F:
        re, im = struct.unpack("<dd", raw)
        return complex(re, im)
    raise LibraryError(STATUS_NOT_SUPPORTED, f"scale type {dtype}")


def _op(m: Any, trans: int) -> Any:
    if trans == OP_N:
        return m
    t = m.transpose(0, 2, 1)
    return t if trans == OP_T else t.conj()


def gemm(region: Region, call: GemmCall, pointer_mode: int) -> None:
    """One cuBLAS GEMM over the sim's memory (a pointer-array batch: one GEMM per matrix)."""
    if call.arrays is not None:
        for a, b, c in zip(*call.arrays, strict=True):
            gemm(region, replace(call, a=a, b=b, c=c, batch=1, arrays=None), pointer_mode)
        return
    np = _np()
    c = call
    combo = _COMBOS.get((c.atype, c.ctype))
    if c.atype != c.btype or combo is None or c.compute_type not in combo:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"{c.name}: types A {c.atype}, B {c.btype}, "
                           f"C {c.ctype}, compute {c.compute_type} (sim)")
    if c.fn not in GEMM_EX and c.algo != -1:
        raise LibraryError(STATUS_INVALID_VALUE, f"{c.name}: algo {c.algo}")
    scale = _SCALE_TYPES.get(c.compute_type, C_32F if c.ctype == C_32F else R_32F)
    if c.ctype == C_64F:
        scale = C_64F
    device = pointer_mode == POINTER_MODE_DEVICE
    alpha, beta = (_scalar(region, v, scale, device) for v in (c.alpha, c.beta))
    ra, ca = (c.m, c.k) if c.transa == OP_N else (c.k, c.m)
    rb, cb = (c.k, c.n) if c.transb == OP_N else (c.n, c.k)
    if c.k > 0:
        a = _op(_read(region, c.a, c.atype, ra, ca, c.lda, c.batch, c.stride_a), c.transa)
        b = _op(_read(region, c.b, c.btype, rb, cb, c.ldb, c.batch, c.stride_b), c.transb)
        product = alpha * np.matmul(a, b)
    else:
        product = np.zeros((c.batch, c.m, c.n))
    if beta != 0:
        product = product + beta * _read(region, c.c, c.ctype, c.m, c.n, c.ldc, c.batch, c.stride_c)
    _write(region, c.c, c.ctype, product, c.ldc, c.stride_c)


def _gelu(x: Any) -> Any:
    np = _np()
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_EPILOGUES = {EPI_DEFAULT, EPI_RELU, EPI_BIAS, EPI_RELU | EPI_BIAS, EPI_GELU, EPI_GELU | EPI_BIAS}


def _lt_shapes(call: LtCall) -> tuple[Any, ...]:
    """The layouts and the checks cuBLASLt makes before it runs anything."""
    v = call.value
    layouts = [call.layout(obj) for obj in (LT_A, LT_B, LT_C, LT_D)]
    for lay in layouts:
        type_size(lay.dtype, "matrix layout")
        if lay.order not in (ORDER_COL, ORDER_ROW):
            raise LibraryError(STATUS_NOT_SUPPORTED, f"layout order {lay.order} (sim)")
        if lay.rows and lay.ld < (lay.rows if lay.order == ORDER_COL else lay.cols):
            raise LibraryError(STATUS_INVALID_VALUE, "leading dimension below the matrix's")
    a, b, cl, d = layouts
    ta, tb = v(0, DESC_TRANSA), v(0, DESC_TRANSB)
    m, k = (a.rows, a.cols) if ta == OP_N else (a.cols, a.rows)
    kb, n = (b.rows, b.cols) if tb == OP_N else (b.cols, b.rows)
    if k != kb or (d.rows, d.cols) != (m, n) or (cl.rows, cl.cols) != (m, n):
        raise LibraryError(STATUS_INVALID_VALUE, f"shapes: op(A) {m}x{k}, op(B) {kb}x{n}, "
                           f"C {cl.rows}x{cl.cols}, D {d.rows}x{d.cols}")
    batch = d.batch
    if any(lay.batch not in (batch, 1) for lay in layouts) or a.batch != b.batch:
        raise LibraryError(STATUS_INVALID_VALUE, "batch counts differ")
    epilogue = v(0, DESC_EPILOGUE, EPI_DEFAULT)
    if epilogue not in _EPILOGUES:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"epilogue {epilogue} (sim)")
    combo = _COMBOS.get((a.dtype, d.dtype))
    if a.dtype != b.dtype or cl.dtype != d.dtype or combo is None or \
            v(0, DESC_COMPUTE_TYPE) not in combo:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"types A {a.dtype}, C {cl.dtype}, "
                           f"D {d.dtype}, compute {v(0, DESC_COMPUTE_TYPE)} (sim)")
    return a, b, cl, d, ta, tb, m, n, k, epilogue


SIM_ALGO = struct.pack("<Q", 0x5349) + bytes(56)  # "IS": the sim's only algorithm


def lt_matmul(region: Region, call: LtCall) -> None:
    np = _np()
    a, b, cl, d, ta, tb, m, n, k, epilogue = _lt_shapes(call)
    if call.algo is not None and bytes(call.algo) != SIM_ALGO:
        raise LibraryError(STATUS_INVALID_VALUE, "an algorithm the heuristic did not give (sim)")
    v = call.value
    scale = v(0, DESC_SCALE_TYPE)
    device = v(0, DESC_POINTER_MODE) == POINTER_MODE_DEVICE
    alpha, beta = (_scalar(region, x, scale, device) for x in (call.alpha, call.beta))
    batch = d.batch
    result = np.zeros((batch, m, n))
    if k > 0 and alpha != 0:
        am = _op(_read(region, call.a, a.dtype, a.rows, a.cols, a.ld, a.batch, a.stride,
                       a.order == ORDER_ROW), ta)
        bm = _op(_read(region, call.b, b.dtype, b.rows, b.cols, b.ld, b.batch, b.stride,
                       b.order == ORDER_ROW), tb)
        result = alpha * np.matmul(am, bm)
    if beta != 0:
        result = result + beta * _read(region, call.c, cl.dtype, m, n, cl.ld, cl.batch, cl.stride,
                                       cl.order == ORDER_ROW)
    if epilogue & EPI_BIAS:
        bias_type = v(0, DESC_BIAS_DATA_TYPE, -1)
        bias_type = d.dtype if bias_type == -1 else bias_type
        bias = _read(region, v(0, DESC_BIAS_POINTER, signed=False), bias_type, m, 1, m, batch,
                     v(0, DESC_BIAS_BATCH_STRIDE))
        result = result + bias
    if epilogue & EPI_RELU:
        result = np.maximum(result.real, 0.0)
    if epilogue & EPI_GELU:
        result = _gelu(result.real)
    _write(region, call.d, d.dtype, result, d.ld, d.stride, d.order == ORDER_ROW)


def lt_heuristic(call: LtCall, requested: int) -> list[bytes]:
    """One algorithm (the sim has one), after the checks a matmul would make."""
    _lt_shapes(call)
    result = SIM_ALGO + struct.pack("<QifIIII", 0, 0, 1.0, 0, 0, 0, 0)
    return [result][:requested]


# ---- the generic path (blas_calls.py) ----

def generic(region: Region, fn: Any, a: dict[str, int], scalars: list[bytes],
            device_scalars: bool, arrays: dict[str, tuple[int, ...]]) -> bytes | None:
    """One function of the generic path over the sim's memory; returns the result's bytes for
    functions with a host result (dot, nrm2, asum, iamax, iamin), else None (a device result is
    written to its pointer)."""
    from pilot.daemon.backends import blas_calls

    np = _np()
    fam = blas_calls.FAMILIES[fn.family]
    dtype = np.float32 if fn.type == "S" else np.float64
    fmt = "<f" if fn.type == "S" else "<d"
    values: dict[str, Any] = dict(a)
    scalar_names = [name for name, kind in zip(fn.params, fn.kinds, strict=True) if kind == "s"]
    for i, name in enumerate(scalar_names):
        raw = bytes(region(a[name], fn.elem)) if device_scalars else scalars[i][:fn.elem]
        values[name] = struct.unpack(fmt, raw)[0]
    views: dict[str, Any] = {}
    shapes = blas_calls.MATRIX_SHAPES.get(fn.family, {})
    lengths = blas_calls.VECTOR_LENGTHS.get(fn.family, {})
    for name, span in (fam.arrays or {}).items():  # the matrices pilotd read and checked
        pointers = arrays[name]
        rows, cols, ld = shapes["matrices"](a)
        views["matrices"] = [np.lib.stride_tricks.as_strided(
            np.frombuffer(region(ptr, span(a, fn.elem)), dtype=dtype), shape=(rows, cols),
            strides=(fn.elem, a[ld] * fn.elem), writeable=True) for ptr in pointers]
    for name, nbytes, _ in fam.ranges(a, fn.elem):
        if fam.arrays and name in fam.arrays:
            continue
        if nbytes == 0:
            views[name] = np.zeros(0, dtype)
            continue
        if name in ("P", "info"):  # int arrays
            views[name] = np.frombuffer(region(a[name], nbytes), dtype=np.int32)
            continue
        raw = np.frombuffer(region(a[name], nbytes), dtype=dtype)
        if name in shapes:
            rows, cols, ld = shapes[name](a)
            views[name] = np.lib.stride_tricks.as_strided(
                raw, shape=(rows, cols), strides=(fn.elem, a[ld] * fn.elem), writeable=True)
        else:
            n, inc = lengths[name](a) if name in lengths else (a["n"], "inc" + name)
            step = abs(a[inc]) * fn.elem
            view = np.lib.stride_tricks.as_strided(raw, shape=(n,), strides=(step,), writeable=True)
            views[name] = view[::-1] if a[inc] < 0 else view
    result = fam.sim(np, values, views)
    kinds = dict(zip(fn.params, fn.kinds, strict=True))
    if kinds.get("result") not in ("r", "x"):
        return None
    packed = struct.pack("<i" if kinds["result"] == "x" else fmt, result)
    if device_scalars:  # device pointer mode: the result goes to device memory
        region(a["result"], len(packed))[:] = packed
        return None
    return packed
