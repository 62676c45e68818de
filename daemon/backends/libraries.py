"""The CUDA math libraries pilotd runs for its clients (cuBLAS, cuBLASLt): what a backend is
asked to do, and the facts of the libraries' public API both backends and the checks use.

A call reaches a backend as a GemmCall (one cuBLAS GEMM, the handle's settings with it) or an
LtCall (a cuBLASLt matmul or heuristic query, its descriptors as attribute maps). The numbers
below are cuBLAS's (cublas_api.h, cublasLt.h, library_types.h of CUDA 13).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_UNKNOWN,
    BackendError,
)
from pilot.daemon.protocol import lib

LIB_CUBLAS, LIB_CUBLASLT, LIB_CUDNN = 1, 2, 3  # pilot_library (shim/transport/pilot_proto.h)
LIBRARY_NAMES = {LIB_CUBLAS: "cuBLAS", LIB_CUBLASLT: "cuBLASLt", LIB_CUDNN: "cuDNN"}

# cublasStatus_t
STATUS_SUCCESS = 0
STATUS_NOT_INITIALIZED = 1
STATUS_ALLOC_FAILED = 3
STATUS_INVALID_VALUE = 7
STATUS_ARCH_MISMATCH = 8
STATUS_EXECUTION_FAILED = 13
STATUS_INTERNAL_ERROR = 14
STATUS_NOT_SUPPORTED = 15
STATUS_NAMES = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
                3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}

# cudaDataType -> bytes per element
R_16F, C_16F, R_16BF, C_16BF, R_32F, C_32F, R_64F, C_64F = 2, 6, 14, 15, 0, 4, 1, 5
R_8I, C_8I, R_8U, C_8U, R_32I, C_32I, R_32U = 3, 7, 8, 9, 10, 11, 12
R_8F_E4M3, R_8F_E5M2, R_16I, R_16U, R_64I, R_64U = 28, 29, 20, 22, 24, 26
TYPE_SIZES = {R_8I: 1, R_8U: 1, R_8F_E4M3: 1, R_8F_E5M2: 1, R_16F: 2, R_16BF: 2, C_8I: 2, C_8U: 2,
              R_16I: 2, R_16U: 2, R_32F: 4, C_16F: 4, C_16BF: 4, R_32I: 4, R_32U: 4, R_64F: 8,
              C_32F: 8, C_32I: 8, R_64I: 8, R_64U: 8, C_64F: 16}

OP_N, OP_T, OP_C = 0, 1, 2

# pilot_gemm_fn: the cuBLAS function a GEMM request names, and whether it is strided-batched.
GEMM_FUNCTIONS = {1: "cublasSgemm_v2", 2: "cublasDgemm_v2", 3: "cublasHgemm", 4: "cublasGemmEx",
                  5: "cublasSgemmStridedBatched", 6: "cublasDgemmStridedBatched",
                  7: "cublasHgemmStridedBatched", 8: "cublasGemmStridedBatchedEx",
                  9: "cublasCgemm_v2", 10: "cublasZgemm_v2", 11: "cublasCgemmStridedBatched",
                  12: "cublasZgemmStridedBatched", 13: "cublasSgemmBatched",
                  14: "cublasDgemmBatched", 15: "cublasCgemmBatched", 16: "cublasZgemmBatched",
                  17: "cublasGemmBatchedEx"}
GEMM_STRIDED = frozenset({5, 6, 7, 8, 11, 12})
GEMM_BATCHED = frozenset({13, 14, 15, 16, 17})  # arrays of pointers
GEMM_EX = frozenset({4, 8, 17})
POINTER_MODE_HOST, POINTER_MODE_DEVICE = 0, 1

# cuBLASLt attribute numbers pilotd reads (cublasLtMatmulDescAttributes_t, ...LayoutAttribute_t,
# ...PreferenceAttributes_t); pilot_lt_object numbers the descriptors.
LT_DESC, LT_A, LT_B, LT_C, LT_D, LT_PREF = 0, 1, 2, 3, 4, 5
DESC_COMPUTE_TYPE, DESC_SCALE_TYPE, DESC_POINTER_MODE, DESC_TRANSA, DESC_TRANSB = 0, 1, 2, 3, 4
DESC_TRANSC, DESC_EPILOGUE, DESC_BIAS_POINTER, DESC_BIAS_BATCH_STRIDE = 5, 7, 8, 10
DESC_AUX_POINTER, DESC_BIAS_DATA_TYPE, DESC_FAST_ACCUM = 11, 26, 25
# Scalar pointers (FP8 scaling, amax): one float each under scale mode 0, the only mode pilot
# sizes; their scale-mode attributes.
DESC_SCALAR_POINTERS = {17: 31, 18: 32, 19: 33, 20: 34, 21: None, 23: 35, 24: None, 36: 37}
LAYOUT_TYPE, LAYOUT_ORDER, LAYOUT_ROWS, LAYOUT_COLS, LAYOUT_LD = 0, 1, 2, 3, 4
LAYOUT_BATCH_COUNT, LAYOUT_STRIDE, LAYOUT_PLANE_OFFSET, LAYOUT_BATCH_MODE = 5, 6, 7, 8
ORDER_COL, ORDER_ROW = 0, 1
PREF_MAX_WORKSPACE = 1
# Epilogue bits (cublasLtEpilogue_t): RELU 2, BIAS 4, BGRAD(A) 16/256, GELU 32, AUX 128, BGRADB 512.
EPI_DEFAULT, EPI_RELU, EPI_BIAS, EPI_GELU, EPI_AUX = 1, 2, 4, 32, 128
EPI_DRELU_BGRAD, EPI_BGRADA, EPI_BGRADB = 8 | 128 | 16, 256, 512
EPILOGUES_WITHOUT_AUX = frozenset({EPI_DEFAULT, EPI_RELU, EPI_BIAS, EPI_RELU | EPI_BIAS, EPI_GELU,
                                   EPI_GELU | EPI_BIAS, EPI_BGRADA, EPI_BGRADB})
HEURISTIC_RESULT_BYTES = 96

# Attributes pilotd passes on to the real library (the client's table, shim/libs/cublaslt_api.c, may
# hold more: those it refuses are checked by the ops layer).
DESC_ATTRS = frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22,
                        23, 24, 25, 26, 31, 32, 33, 34, 35, 36, 37})
LAYOUT_ATTRS = frozenset(range(9))
PREF_ATTRS = frozenset({0, 1, 3, 5, 6, 7, 8, 9, 12})


class LibraryError(BackendError):
    """A library call failed with cublasStatus_t `status`; `code` is the CUDA error a posted call
    leaves for the session's next synchronizing call."""

    def __init__(self, status: int, message: str) -> None:
        code = {STATUS_INVALID_VALUE: CUDA_ERROR_INVALID_VALUE,
                STATUS_NOT_SUPPORTED: CUDA_ERROR_NOT_SUPPORTED,
                STATUS_ARCH_MISMATCH: CUDA_ERROR_NOT_SUPPORTED}.get(status, CUDA_ERROR_UNKNOWN)
        super().__init__(code, f"{STATUS_NAMES.get(status, status)}: {message}")
        self.status = status
        self.detail = message  # without cuBLAS's status name (load_library serves cuDNN too)


def type_size(dtype: int, what: str) -> int:
    try:
        return TYPE_SIZES[dtype]
    except KeyError:
        raise LibraryError(STATUS_NOT_SUPPORTED, f"{what}: data type {dtype}") from None


def matrix_span(rows: int, cols: int, ld: int, elem: int, batch: int = 1, stride: int = 0) -> int:
    """Bytes from a column-major matrix's first element to just past its last (each of `batch`
    matrices `stride` elements apart); 0 for an empty one."""
    if rows <= 0 or cols <= 0 or batch <= 0:
        return 0
    return ((cols - 1) * ld + rows + (batch - 1) * stride) * elem


@dataclass(frozen=True)
class BlasSettings:
    """A cuBLAS handle's settings at the time of a call."""

    workspace: int = 0
    workspace_size: int = 0
    workspace_set: bool = False
    math_mode: int = 0
    pointer_mode: int = POINTER_MODE_HOST
    atomics_mode: int = 0
    sm_count_target: int = 0


@dataclass(frozen=True)
class GemmCall:
    """One cuBLAS GEMM: C = alpha op(A) op(B) + beta C, `batch` times (strides in elements).
    alpha and beta are the scalar's bytes (host pointer mode) or device addresses."""

    fn: int
    transa: int
    transb: int
    m: int
    n: int
    k: int
    a: int
    lda: int
    atype: int
    b: int
    ldb: int
    btype: int
    c: int
    ldc: int
    ctype: int
    compute_type: int
    algo: int
    alpha: bytes | int
    beta: bytes | int
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    # The pointer-array functions: each matrix's address, as pilotd read and checked them (a, b,
    # c are then the program's arrays, which the backend does not pass on).
    arrays: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def name(self) -> str:
        return GEMM_FUNCTIONS[self.fn]


@dataclass(frozen=True)
class Layout:
    """A cuBLASLt matrix layout as its attributes say."""

    dtype: int
    rows: int
    cols: int
    ld: int
    order: int = ORDER_COL
    batch: int = 1
    stride: int = 0

    def span(self) -> int:
        elem = type_size(self.dtype, "matrix layout")
        if self.order == ORDER_COL:
            return matrix_span(self.rows, self.cols, self.ld, elem, self.batch, self.stride)
        return matrix_span(self.cols, self.rows, self.ld, elem, self.batch, self.stride)


def lt_pointer_attr(obj: int, attr: int) -> bool:
    """Whether the attribute holds a device pointer (PILOT_LT_POINTER_ATTRS, pilot_proto.h)."""
    return obj == LT_DESC and attr < 64 and bool(lib.PILOT_LT_POINTER_ATTRS >> attr & 1)


@dataclass
class LtCall:
    """A cuBLASLt matmul (or heuristic query): each descriptor's attributes (number -> value
    bytes) by pilot_lt_object, and the call's pointers."""

    attrs: dict[int, dict[int, bytes]] = field(default_factory=dict)
    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    workspace: int = 0
    workspace_size: int = 0
    alpha: bytes | int = b""
    beta: bytes | int = b""
    algo: bytes | None = None

    def value(self, obj: int, attr: int, default: int = 0, signed: bool = True) -> int:
        raw = self.attrs.get(obj, {}).get(attr)
        return default if raw is None else int.from_bytes(raw, "little", signed=signed)

    def layout(self, obj: int) -> Layout:
        v = self.value
        return Layout(v(obj, LAYOUT_TYPE), v(obj, LAYOUT_ROWS, signed=False),
                      v(obj, LAYOUT_COLS, signed=False), v(obj, LAYOUT_LD),
                      v(obj, LAYOUT_ORDER, ORDER_COL), v(obj, LAYOUT_BATCH_COUNT, 1),
                      v(obj, LAYOUT_STRIDE))
