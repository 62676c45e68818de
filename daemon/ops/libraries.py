"""The CUDA math libraries (opcodes 600-699): cuBLAS and cuBLASLt calls of the stand-ins
(shim/libs/cublas_api.c, shim/libs/cublaslt_api.c), run by the backend in pilotd's context on the
session's streams (backends/cublas.py on a GPU, backends/sim_blas.py on the sim).

A library call is device work like a launch, so it gets a launch's checks: every pointer it
passes (matrices from their dimensions and leading dimensions, batches from their strides,
workspaces, bias vectors, scalars in device memory) must lie in the session's own memory, and
what pilot cannot size (auxiliary epilogue outputs, block-scaled FP8, pointer arrays) is refused
with CUBLAS_STATUS_NOT_SUPPORTED. Handles are the session's: another session's number is an
unknown handle. Policies do not see library calls yet (docs/POLICIES.md).
"""

from __future__ import annotations

import functools
import logging
import struct
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends import blas_calls
from pilot.daemon.backends.base import CUDA_ERROR_INVALID_RESOURCE_HANDLE, BackendError
from pilot.daemon.backends.dnn import STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, DnnError
from pilot.daemon.backends.libraries import (
    DESC_ATTRS,
    DESC_BIAS_BATCH_STRIDE,
    DESC_BIAS_DATA_TYPE,
    DESC_BIAS_POINTER,
    DESC_EPILOGUE,
    DESC_POINTER_MODE,
    DESC_SCALAR_POINTERS,
    DESC_SCALE_TYPE,
    EPI_BGRADA,
    EPI_BGRADB,
    EPI_BIAS,
    EPI_DEFAULT,
    EPILOGUES_WITHOUT_AUX,
    GEMM_BATCHED,
    GEMM_FUNCTIONS,
    GEMM_STRIDED,
    LAYOUT_ATTRS,
    LAYOUT_BATCH_MODE,
    LAYOUT_PLANE_OFFSET,
    LIB_CUBLAS,
    LIB_CUBLASLT,
    LIB_CUDNN,
    LIBRARY_NAMES,
    LT_A,
    LT_B,
    LT_C,
    LT_D,
    LT_DESC,
    LT_PREF,
    OP_C,
    OP_N,
    OP_T,
    ORDER_COL,
    ORDER_ROW,
    POINTER_MODE_DEVICE,
    POINTER_MODE_HOST,
    PREF_ATTRS,
    STATUS_ALLOC_FAILED,
    STATUS_INVALID_VALUE,
    STATUS_NOT_SUPPORTED,
    STATUS_SUCCESS,
    BlasSettings,
    GemmCall,
    LibraryError,
    LtCall,
    lt_pointer_attr,
    matrix_span,
    type_size,
)
from pilot.daemon.ops.memory import note_write
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.scheduling.streams import stream_for_work
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("libraries")
log = logging.getLogger("pilot.libraries")

MAX_HANDLES = 64  # library handles one session may hold on one device
MAX_HEURISTIC_RESULTS = 256
_ALLOWED = {LT_DESC: DESC_ATTRS, LT_A: LAYOUT_ATTRS, LT_B: LAYOUT_ATTRS, LT_C: LAYOUT_ATTRS,
            LT_D: LAYOUT_ATTRS, LT_PREF: PREF_ATTRS}
_REQUIRED = {LT_DESC: (0, 1), LT_A: (0, 2, 3, 4), LT_B: (0, 2, 3, 4), LT_C: (0, 2, 3, 4),
             LT_D: (0, 2, 3, 4)}


@dataclass
class LibraryHandle:
    library: int
    obj: Any  # the backend's handle
    # cuBLASLt descriptor records already parsed (a training loop sends the same ones each step)
    parsed: dict[bytes, dict[int, dict[int, bytes]]] = field(default_factory=dict)

    def release(self, backend: Any) -> None:
        """The program's handle is gone (cudnnDestroy, cublasDestroy, or its session ended)."""
        if self.library == LIB_CUDNN:
            backend.dnn_release(self.obj)
        else:
            backend.library_release(self.obj)

    def records(self, payload: memoryview) -> tuple[bytes, dict[int, dict[int, bytes]]]:
        """The descriptor set's key (lt_set_key) and the call's attributes, its pointers too."""
        raw = bytes(payload)
        attrs = self.parsed.get(raw)
        if attrs is None:
            attrs = parse_records(payload)
            if len(self.parsed) >= 64:
                self.parsed.pop(next(iter(self.parsed)))
            self.parsed[raw] = attrs
        return lt_set_key(raw), attrs


def lt_set_key(records: bytes) -> bytes:
    """The records with the values of pointer attributes (PILOT_LT_POINTER_ATTRS) blanked: a
    descriptor set is the same set whatever buffers it names (under autocast a step's bias is a
    new copy each time), so its descriptors are built once and each call's pointers applied
    (backends/cublas.py; fast_library.c blanks a call's records the same way). Records that do
    not parse are returned as they are (parse_records refuses them)."""
    blank = bytearray(records)
    at = 0
    while at + 8 <= len(blank):
        obj, attr, size = struct.unpack_from("<HHI", blank, at)
        padded = (size + 7) & ~7
        if lt_pointer_attr(obj, attr):
            blank[at + 8:at + 8 + padded] = bytes(min(padded, max(0, len(blank) - at - 8)))
        at += 8 + padded
    return bytes(blank)


def library_handle(s: Session, number: int, *libraries: int) -> LibraryHandle:
    """The session's handle `number` of one of `libraries` (a cuBLAS handle serves cuBLASLt
    calls too: cuBLAS documents the cast, PyTorch relies on it)."""
    h = s.libraries.get(number)
    if h is None or h.library not in libraries:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE,
                           f"no {LIBRARY_NAMES.get(libraries[0])} handle {number:#x}")
    return h


def _scalar_type_size(compute: int, ctype: int) -> int:
    """Bytes of alpha/beta of a cuBLAS GEMM (the Ex functions' scale type)."""
    if compute in (64, 65):
        return 4 if ctype == 6 else 2
    if compute in (70, 71, 79):
        return 16 if ctype == 5 else 8
    if compute in (72, 73):
        return 4
    return 8 if ctype == 4 else 4


@OPS.handler(lib.PILOT_OP_LIB_CREATE, "pilot_req_lib_create")
def lib_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_lib")
    library = req.library
    if library == LIB_CUDNN:
        return dnn_create(vg, s, req, rep)
    if library not in LIBRARY_NAMES:
        rep.status = STATUS_INVALID_VALUE
        return rep
    try:
        rep.version = vg.backend.library_version(library)
        if not req.version_only:
            if len(s.libraries) >= MAX_HANDLES:
                raise LibraryError(STATUS_ALLOC_FAILED, f"more than {MAX_HANDLES} handles")
            number = s.new_handle()
            s.libraries[number] = LibraryHandle(library, vg.backend.library_create(library))
            rep.value = number
    except LibraryError as exc:
        log.warning("session %d: %s: %s", s.id, LIBRARY_NAMES[library], exc)
        rep.status = exc.status
    return rep


def dnn_create(vg: VGpu, s: Session, req: Any, rep: Any) -> Any:
    """LIB_CREATE of cuDNN: its version (and the CUDA runtime's it was built for), and a handle
    unless only the version was asked."""
    try:
        rep.version, cudart = vg.backend.dnn_version()
        if req.version_only:
            rep.value = cudart
        else:
            if len(s.libraries) >= MAX_HANDLES:
                raise DnnError(STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                               f"more than {MAX_HANDLES} handles")
            number = s.new_handle()
            s.libraries[number] = LibraryHandle(LIB_CUDNN, vg.backend.dnn_create())
            rep.value = number
    except DnnError as exc:
        log.warning("session %d: cuDNN: %s", s.id, exc)
        rep.status = exc.status
    return rep


@OPS.handler(lib.PILOT_OP_LIB_DESTROY, "pilot_req_handle")
def lib_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    h = s.libraries.get(req.handle)
    if h is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no library handle {req.handle:#x}")
    del s.libraries[req.handle]
    if vg.fast is not None:
        vg.fast.library_gone(s, req.handle)
    h.release(vg.backend)


# ---- cuBLAS ----

def gemm_call(req: Any) -> GemmCall:
    """The request as a GemmCall, after cuBLAS's argument checks."""
    if req.fn not in GEMM_FUNCTIONS:
        raise LibraryError(STATUS_INVALID_VALUE, f"GEMM function {req.fn}")
    strided = req.fn in GEMM_STRIDED
    batch = req.batch if strided or req.fn in GEMM_BATCHED else 1
    if req.transa not in (OP_N, OP_T, OP_C) or req.transb not in (OP_N, OP_T, OP_C) or \
            min(req.m, req.n, req.k) < 0 or batch < 0 or \
            (strided and min(req.stride_a, req.stride_b, req.stride_c) < 0):
        raise LibraryError(STATUS_INVALID_VALUE, GEMM_FUNCTIONS[req.fn])
    rows_a = req.m if req.transa == OP_N else req.k
    rows_b = req.k if req.transb == OP_N else req.n
    if req.lda < max(1, rows_a) or req.ldb < max(1, rows_b) or req.ldc < max(1, req.m):
        raise LibraryError(STATUS_INVALID_VALUE, f"{GEMM_FUNCTIONS[req.fn]}: leading dimension")
    device = req.pointer_mode == POINTER_MODE_DEVICE
    if req.pointer_mode not in (POINTER_MODE_HOST, POINTER_MODE_DEVICE):
        raise LibraryError(STATUS_INVALID_VALUE, f"pointer mode {req.pointer_mode}")
    return GemmCall(
        fn=req.fn, transa=req.transa, transb=req.transb, m=req.m, n=req.n, k=req.k,
        a=req.a, lda=req.lda, atype=req.atype, b=req.b, ldb=req.ldb, btype=req.btype,
        c=req.c, ldc=req.ldc, ctype=req.ctype, compute_type=req.compute_type, algo=req.algo,
        alpha=req.alpha_ptr if device else bytes(req.alpha),
        beta=req.beta_ptr if device else bytes(req.beta),
        batch=batch, stride_a=req.stride_a if strided else 0,
        stride_b=req.stride_b if strided else 0, stride_c=req.stride_c if strided else 0)


def read_pointers(vg: VGpu, s: Session, ptr: int, count: int, stream: Any) -> tuple[int, ...]:
    """A program's array of `count` device pointers, read in stream order (what earlier work
    wrote into it). The caller checks what they point to, and the backend passes its own copy of
    them, so a later change of the program's array cannot redirect the call."""
    s.check_range(ptr, 8 * count)
    raw = bytearray(8 * count)
    vg.backend.memcpy_dtoh(raw, ptr, len(raw), stream)
    return struct.unpack(f"<{count}Q", raw)


def read_pointer_arrays(vg: VGpu, s: Session, call: GemmCall, stream: Any) -> GemmCall:
    """The pointer-array GEMMs: the three arrays read, each matrix they name checked."""
    arrays = [read_pointers(vg, s, ptr, call.batch, stream) for ptr in (call.a, call.b, call.c)]
    rows_a, cols_a = (call.m, call.k) if call.transa == OP_N else (call.k, call.m)
    rows_b, cols_b = (call.k, call.n) if call.transb == OP_N else (call.n, call.k)
    for i in range(call.batch):
        if call.k > 0:
            s.check_range(arrays[0][i], matrix_span(rows_a, cols_a, call.lda,
                                                    type_size(call.atype, "A")))
            s.check_range(arrays[1][i], matrix_span(rows_b, cols_b, call.ldb,
                                                    type_size(call.btype, "B")))
        s.check_range(arrays[2][i], matrix_span(call.m, call.n, call.ldc, type_size(call.ctype, "C")))
    return replace(call, arrays=(arrays[0], arrays[1], arrays[2]))


def check_gemm(s: Session, call: GemmCall, settings: BlasSettings) -> int:
    """Every range the GEMM reads or writes must be the session's; returns C's span (0 for the
    pointer-array functions, whose matrices read_pointer_arrays checks)."""
    c = call
    if c.k > 0 and c.fn not in GEMM_BATCHED:
        rows_a, cols_a = (c.m, c.k) if c.transa == OP_N else (c.k, c.m)
        rows_b, cols_b = (c.k, c.n) if c.transb == OP_N else (c.n, c.k)
        s.check_range(c.a, matrix_span(rows_a, cols_a, c.lda, type_size(c.atype, "A"), c.batch,
                                       c.stride_a))
        s.check_range(c.b, matrix_span(rows_b, cols_b, c.ldb, type_size(c.btype, "B"), c.batch,
                                       c.stride_b))
    if c.fn in GEMM_BATCHED:
        span_c = 0
    else:
        span_c = matrix_span(c.m, c.n, c.ldc, type_size(c.ctype, "C"), c.batch, c.stride_c)
        s.check_range(c.c, span_c)
    if settings.workspace_set and settings.workspace_size:
        s.check_range(settings.workspace, settings.workspace_size)
    if settings.pointer_mode == POINTER_MODE_DEVICE:
        size = _scalar_type_size(c.compute_type, c.ctype)
        s.check_range(c.alpha, size)  # type: ignore[arg-type]
        s.check_range(c.beta, size)  # type: ignore[arg-type]
    return span_c


def reported(fn: Any) -> Any:
    """A posted library call's failure reaches the program only as an error of its next
    synchronizing call: say here what it was."""

    @functools.wraps(fn)
    def handler(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
        try:
            return fn(vg, s, req, payload)
        except BackendError as exc:
            log.warning("session %d: %s refused: %s", s.id, fn.__name__, exc)
            raise

    return handler


@OPS.handler(lib.PILOT_OP_BLAS_GEMM, "pilot_req_blas_gemm")
@reported
def blas_gemm(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    h = library_handle(s, req.handle, LIB_CUBLAS)
    call = gemm_call(req)
    if not (call.m and call.n and call.batch):
        return
    settings = BlasSettings(req.workspace, req.workspace_size, bool(req.workspace_set),
                            req.math_mode, req.pointer_mode, req.atomics_mode, req.sm_count_target)
    span_c = check_gemm(s, call, settings)
    stream = stream_for_work(vg, s, req.stream)
    if call.fn in GEMM_BATCHED:
        call = read_pointer_arrays(vg, s, call, stream)
        for ptr in set(call.arrays[2]):  # type: ignore[index]
            note_write(vg, s, ptr, matrix_span(call.m, call.n, call.ldc,
                                               type_size(call.ctype, "C")), stream)
    else:
        note_write(vg, s, call.c, span_c, stream)
    fast = vg.fast
    if fast is not None:  # C may have used the handle since Python did
        vg.backend.library_state_reset(h.obj)
    vg.backend.blas_gemm(h.obj, call, settings, stream)
    vg.metrics.count("library_calls", (s.tenant, call.name))
    if fast is not None:
        if log.isEnabledFor(logging.DEBUG):  # which calls still cost the interpreter lock
            log.debug("%s through Python: pointer mode %d, m %d n %d k %d batch %d, stream %#x",
                      call.name, req.pointer_mode, call.m, call.n, call.k, call.batch, req.stream,
                      extra={"session": s.id, "tenant": s.tenant})
        fast.handle_used(s, req.handle, h)
        fast.stream_used(s, req.stream)


# ---- the generic path (shim/tables/cublas_calls.tsv) ----

_GENERIC: dict[str, blas_calls.Function] = {}


def _generic_function(payload: memoryview) -> blas_calls.Function:
    if not _GENERIC:
        _GENERIC.update(blas_calls.load_table())
    name = bytes(payload).split(b"\0", 1)[0].decode(errors="replace")
    fn = _GENERIC.get(name)
    if fn is None:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"{name!r} is not a function pilotd runs")
    return fn


@OPS.handler(lib.PILOT_OP_BLAS_CALL, "pilot_req_blas_call")
def blas_call(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """A cuBLAS function of the generic path: the family's argument checks, every range it
    touches, then the same function on the session's stream. A call whose result the host waits
    for is answered with the library's status and the result; a posted one that fails is logged
    and fails the next synchronizing call."""
    h = library_handle(s, req.handle, LIB_CUBLAS)
    fn = _generic_function(payload)
    host_result = req.pointer_mode == POINTER_MODE_HOST and any(k in "rx" for k in fn.kinds)
    try:
        if req.nargs != len(fn.kinds):
            raise LibraryError(STATUS_INVALID_VALUE, f"{fn.name}: {req.nargs} arguments")
        args = [int(req.args[i]) for i in range(req.nargs)]
        named = blas_calls.named_args(fn, args)
        blas_calls.check(fn, named)
        device_scalars = req.pointer_mode == POINTER_MODE_DEVICE
        params = fn.params
        for name, kind in zip(params, fn.kinds, strict=True):
            if kind == "s" and device_scalars:
                s.check_range(named[name], fn.elem)
            elif kind in "rx" and not host_result:
                s.check_range(named[name], 4 if kind == "x" else fn.elem)
        stream = stream_for_work(vg, s, req.stream)
        family = blas_calls.FAMILIES[fn.family]
        for name, nbytes, written in family.ranges(named, fn.elem):
            if nbytes:
                s.check_range(named[name], nbytes)
                if written:
                    note_write(vg, s, named[name], nbytes, stream)
        arrays = {}
        for name, span in (family.arrays or {}).items():
            # the matrices a pointer array lists: read in stream order, each checked; the
            # backend passes this list, never the program's array again
            arrays[name] = read_pointers(vg, s, named[name], named["batch"], stream)
            size = span(named, fn.elem)
            for ptr in set(arrays[name]):
                s.check_range(ptr, size)
                note_write(vg, s, ptr, size, stream)
        settings = BlasSettings(req.workspace, req.workspace_size, bool(req.workspace_set),
                                req.math_mode, req.pointer_mode, req.atomics_mode,
                                req.sm_count_target)
        if settings.workspace_set and settings.workspace_size:
            s.check_range(settings.workspace, settings.workspace_size)
        scalars = [bytes(req.scalars[0]), bytes(req.scalars[1])]
        if vg.fast is not None:  # C may have used the handle since Python did
            vg.backend.library_state_reset(h.obj)
            vg.fast.handle_used(s, req.handle, h)  # and applies every setting again after this
        result = vg.backend.blas_call(h.obj, fn, args, named, scalars, settings, stream,
                                      host_result, arrays)
        vg.metrics.count("library_calls", (s.tenant, fn.name))
    except BackendError as exc:
        if not host_result:
            log.warning("session %d: %s refused: %s", s.id, fn.name, exc)
            raise
        if not isinstance(exc, LibraryError):
            raise
        log.info("session %d: %s: %s", s.id, fn.name, exc)
        rep = new("pilot_rep_lib")
        rep.status = exc.status
        return rep
    if not host_result:
        return None
    rep = new("pilot_rep_lib")
    rep.status = STATUS_SUCCESS
    return rep, result


# ---- cuBLASLt ----

def parse_records(payload: memoryview) -> dict[int, dict[int, bytes]]:
    """The descriptors' attribute records (pilot_lt_attr), checked against what pilot passes on
    and refuses."""
    attrs: dict[int, dict[int, bytes]] = {}
    data, at = bytes(payload), 0
    while at < len(data):
        if at + 8 > len(data):
            raise LibraryError(STATUS_INVALID_VALUE, "a truncated descriptor record")
        obj, attr, size = struct.unpack_from("<HHI", data, at)
        padded = (size + 7) & ~7
        if obj not in _ALLOWED or not 0 < size <= lib.PILOT_LT_ATTR_MAX or \
                at + 8 + padded > len(data):
            raise LibraryError(STATUS_INVALID_VALUE, f"a bad descriptor record at byte {at}")
        if attr not in _ALLOWED[obj]:
            raise LibraryError(STATUS_NOT_SUPPORTED, f"descriptor {obj} attribute {attr}")
        attrs.setdefault(obj, {})[attr] = data[at + 8:at + 8 + size]
        at += 8 + padded
    for obj, required in _REQUIRED.items():
        missing = [a for a in required if a not in attrs.get(obj, {})]
        if missing:
            raise LibraryError(STATUS_INVALID_VALUE, f"descriptor {obj} lacks attributes {missing}")
    return attrs


@dataclass
class LtRanges:
    """What a cuBLASLt matmul touches: the span of A, B, C and D (from their layouts), and the
    (pointer, span) pairs its descriptors themselves name (bias, scale pointers)."""

    spans: dict[int, int]
    fixed: list[tuple[int, int]]
    device_scalars: bool
    scale_size: int
    # (attribute, span) of each pointer attribute the records hold, for the fast path: it checks
    # and applies each call's value of these (fast_library.c)
    pointer_spans: list[tuple[int, int]] = field(default_factory=list)


def lt_ranges(call: LtCall) -> LtRanges:
    """Refuse what pilot cannot size; the ranges the matmul's descriptors give."""
    v = call.value
    epilogue = v(LT_DESC, DESC_EPILOGUE, EPI_DEFAULT)
    if epilogue not in EPILOGUES_WITHOUT_AUX:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"epilogue {epilogue} (auxiliary output)")
    mode = v(LT_DESC, DESC_POINTER_MODE, POINTER_MODE_HOST)
    if mode not in (POINTER_MODE_HOST, POINTER_MODE_DEVICE):
        raise LibraryError(STATUS_NOT_SUPPORTED, f"pointer mode {mode}")
    fixed: list[tuple[int, int]] = []
    pointer_spans: list[tuple[int, int]] = []
    for ptr_attr, mode_attr in DESC_SCALAR_POINTERS.items():
        ptr = v(LT_DESC, ptr_attr, signed=False)
        if ptr and mode_attr is not None and v(LT_DESC, mode_attr):
            raise LibraryError(STATUS_NOT_SUPPORTED, f"scale mode {v(LT_DESC, mode_attr)}")
        if ptr:
            fixed.append((ptr, 4))
            pointer_spans.append((ptr_attr, 4))
    layouts = {}
    for obj in (LT_A, LT_B, LT_C, LT_D):
        if v(obj, LAYOUT_BATCH_MODE) or v(obj, LAYOUT_PLANE_OFFSET):
            raise LibraryError(STATUS_NOT_SUPPORTED, "pointer-array batches or planar layouts")
        lay = call.layout(obj)
        if lay.order not in (ORDER_COL, ORDER_ROW) or lay.stride < 0 or lay.ld < 0:
            raise LibraryError(STATUS_NOT_SUPPORTED, f"layout order {lay.order}")
        layouts[obj] = lay
    d = layouts[LT_D]
    bias = v(LT_DESC, DESC_BIAS_POINTER, signed=False)
    if bias and epilogue & (EPI_BIAS | EPI_BGRADA | EPI_BGRADB):
        length = d.cols if epilogue == EPI_BGRADB else d.rows
        dtype = v(LT_DESC, DESC_BIAS_DATA_TYPE, -1)
        elem = type_size(d.dtype if dtype == -1 else dtype, "bias")
        stride = v(LT_DESC, DESC_BIAS_BATCH_STRIDE)
        span = matrix_span(length, 1, length, elem, d.batch, max(stride, 0))
        fixed.append((bias, span))
        pointer_spans.append((DESC_BIAS_POINTER, span))
    device = mode == POINTER_MODE_DEVICE
    return LtRanges({obj: lay.span() for obj, lay in layouts.items()}, fixed, device,
                    type_size(v(LT_DESC, DESC_SCALE_TYPE), "scale") if device else 0,
                    pointer_spans)


def check_lt(s: Session, call: LtCall, r: LtRanges | None = None) -> int:
    """Refuse what pilot cannot size, check every range the matmul touches (`r`: its ranges,
    when the caller has them); returns D's span."""
    r = lt_ranges(call) if r is None else r
    for obj, ptr in ((LT_A, call.a), (LT_B, call.b), (LT_C, call.c), (LT_D, call.d)):
        if ptr or obj == LT_D:
            s.check_range(ptr, r.spans[obj])
    for ptr, span in r.fixed:
        s.check_range(ptr, span)
    if call.workspace_size:
        s.check_range(call.workspace, call.workspace_size)
    if r.device_scalars:
        s.check_range(call.alpha, r.scale_size)  # type: ignore[arg-type]
        s.check_range(call.beta, r.scale_size)  # type: ignore[arg-type]
    return r.spans[LT_D]


def lt_call(req: Any, attrs: dict[int, dict[int, bytes]]) -> LtCall:
    device = int.from_bytes(attrs[LT_DESC].get(DESC_POINTER_MODE, b"\0"), "little") == \
        POINTER_MODE_DEVICE
    return LtCall(attrs=attrs, a=req.a, b=req.b, c=req.c, d=req.d, workspace=req.workspace,
                  workspace_size=req.workspace_size,
                  alpha=req.alpha_ptr if device else bytes(req.alpha),
                  beta=req.beta_ptr if device else bytes(req.beta),
                  algo=bytes(ffi.buffer(req.algo)) if req.has_algo else None)


@OPS.handler(lib.PILOT_OP_BLASLT_MATMUL, "pilot_req_blaslt_matmul")
@reported
def blaslt_matmul(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    h = library_handle(s, req.handle, LIB_CUBLASLT, LIB_CUBLAS)
    key, attrs = h.records(payload)
    call = lt_call(req, attrs)
    ranges = lt_ranges(call)
    span_d = check_lt(s, call, ranges)
    stream = stream_for_work(vg, s, req.stream)
    note_write(vg, s, call.d, span_d, stream)
    vg.backend.blaslt_matmul(h.obj, call, key, stream)
    vg.metrics.count("library_calls", (s.tenant, "cublasLtMatmul"))
    if vg.fast is not None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("cublasLtMatmul through Python: %s (records %08x, %d bytes; descriptors %s)",
                      vg.fast.why_python_lt(s, req, ranges), hash(key) & 0xFFFFFFFF, len(key),
                      "kept" if vg.backend.fast_lt_descriptors(h.obj, key) else "not kept",
                      extra={"session": s.id, "tenant": s.tenant})
        vg.fast.lt_plan(s, req.handle, h, key, ranges)
        vg.fast.stream_used(s, req.stream)


@OPS.handler(lib.PILOT_OP_BLASLT_HEURISTIC, "pilot_req_blaslt_matmul")
def blaslt_heuristic(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """The real library's answer for the same descriptors (its algorithms are opaque bytes the
    program passes back to cublasLtMatmul); no memory is touched."""
    h = library_handle(s, req.handle, LIB_CUBLASLT, LIB_CUBLAS)
    rep = new("pilot_rep_lib")
    if not 0 < req.requested <= MAX_HEURISTIC_RESULTS:
        rep.status = STATUS_INVALID_VALUE
        return rep
    try:
        key, attrs = h.records(payload)
        results = vg.backend.blaslt_heuristic(h.obj, lt_call(req, attrs), key, req.requested)
        if vg.fast is not None:  # descriptors it evicted to make room
            vg.fast.lt_forget_evicted(s, req.handle, h)
    except LibraryError as exc:
        log.info("session %d: cublasLtMatmulAlgoGetHeuristic: %s", s.id, exc)
        rep.status = exc.status
        return rep
    rep.status = STATUS_SUCCESS
    rep.value = len(results)
    return rep, b"".join(results)
