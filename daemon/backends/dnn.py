"""cuDNN 9 as pilotd runs it for its clients: the facts of its public API that the ops layer,
both backends and the checks share, and what a backend is asked to do.

The stand-in (shim/libs/cudnn_api.c) forwards the backend API (cudnnBackend*: descriptors, their
typed attributes, finalize, execute) and the legacy calls PyTorch makes (handles, tensor
descriptors, batch normalization). Numbers are cuDNN's (cudnn_graph.h, cudnn_ops.h of 9.x); the
attribute and descriptor numbers are stable across cuDNN 9 releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_UNKNOWN,
    BackendError,
)

# cudnnStatus_t
STATUS_SUCCESS = 0
STATUS_NOT_INITIALIZED = 1001
STATUS_BAD_PARAM = 2000
STATUS_BAD_PARAM_NULL_POINTER = 2002
STATUS_BAD_PARAM_NOT_FINALIZED = 2004
STATUS_BAD_PARAM_OUT_OF_BOUND = 2005
STATUS_BAD_PARAM_SIZE_INSUFFICIENT = 2006
STATUS_BAD_PARAM_ATTRIBUTE_TYPE = 2010
STATUS_BAD_PARAM_DESCRIPTOR_TYPE = 2012
STATUS_NOT_SUPPORTED = 3000
STATUS_NOT_SUPPORTED_GRAPH_PATTERN = 3001
STATUS_NOT_SUPPORTED_DATA_TYPE = 3003
STATUS_INTERNAL_ERROR = 4000
STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
STATUS_EXECUTION_FAILED = 5000

# cudnnBackendAttributeType_t -> bytes of one element (bool is one byte; every enum four).
# HANDLE and BACKEND_DESCRIPTOR elements travel as 8-byte numbers pilotd gave out.
TYPE_HANDLE, TYPE_DATA_TYPE, TYPE_BOOLEAN, TYPE_INT64, TYPE_FLOAT, TYPE_DOUBLE = 0, 1, 2, 3, 4, 5
TYPE_VOID_PTR, TYPE_BACKEND_DESCRIPTOR, TYPE_INT32, TYPE_CHAR, TYPE_FRACTION = 6, 15, 23, 24, 26
ATTRIBUTE_TYPE_SIZES = {TYPE_HANDLE: 8, TYPE_BOOLEAN: 1, TYPE_INT64: 8, TYPE_DOUBLE: 8,
                        TYPE_VOID_PTR: 8, TYPE_BACKEND_DESCRIPTOR: 8, TYPE_CHAR: 1,
                        TYPE_FRACTION: 16, TYPE_FLOAT: 4, TYPE_INT32: 4}
ATTRIBUTE_TYPE_SIZES.update({t: 4 for t in range(34) if t not in ATTRIBUTE_TYPE_SIZES})

# cudnnBackendDescriptorType_t (those pilotd looks into; any other 0..50 is passed on)
POINTWISE, CONVOLUTION, ENGINE, ENGINECFG, ENGINEHEUR, EXECUTION_PLAN = 0, 1, 2, 3, 4, 5
OPERATION_CONVOLUTION_FORWARD = 10
OPERATION_CONVOLUTION_BACKWARD_FILTER = 11
OPERATION_CONVOLUTION_BACKWARD_DATA = 12
OPERATION_POINTWISE = 13
OPERATIONGRAPH, VARIANT_PACK, TENSOR = 15, 16, 17
OPERATION_MATMUL = 19
DESCRIPTOR_TYPES = range(51)
# The descriptor types that are operations of a graph, and those of them whose memory accesses
# their tensors' descriptors bound (dimensions, strides): convolutions, pointwise, statistics,
# matmul (without the M/N/K overrides read from device memory), batch norm finalize and
# backward weights, reduction, concatenation, normalization, reshape, RNG, block scaling.
# Resampling (backward indexes by a tensor of indices), the paged cache load (page tables),
# attention (paged and ragged variants), mixture-of-experts matmuls and the band matrix
# operations read addresses or indices from device memory, which pilot does not check.
OPERATIONS = frozenset({10, 11, 12, 13, 14, 19, 20, 22, 23, *range(25, 32), 33,
                        *range(35, 38), *range(39, 51)})
OPERATIONS_BOUNDED = frozenset({10, 11, 12, 13, 14, 19, 20, 22, 23, 27, 29, 30, 31, 33, 36, 37})
ATTR_MATMUL_OVERRIDES = frozenset({1525, 1526, 1527})  # GEMM_M/N/K_OVERRIDE_DESC
ATTR_TENSOR_RAGGED_OFFSET_DESC = 913

# cudnnBackendAttributeName_t
ATTR_CONVOLUTION_COMP_TYPE, ATTR_CONVOLUTION_CONV_MODE, ATTR_CONVOLUTION_DILATIONS = 100, 101, 102
ATTR_CONVOLUTION_FILTER_STRIDES, ATTR_CONVOLUTION_POST_PADDINGS = 103, 104
ATTR_CONVOLUTION_PRE_PADDINGS, ATTR_CONVOLUTION_SPATIAL_DIMS = 105, 106
ATTR_ENGINEHEUR_MODE, ATTR_ENGINEHEUR_OPERATION_GRAPH, ATTR_ENGINEHEUR_RESULTS = 200, 201, 202
ATTR_ENGINECFG_ENGINE, ATTR_ENGINECFG_KNOB_CHOICES, ATTR_ENGINECFG_WORKSPACE_SIZE = 300, 302, 303
ATTR_EXECUTION_PLAN_HANDLE, ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 400, 401
ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, ATTR_EXECUTION_PLAN_JSON_REPRESENTATION = 402, 405
ATTR_CONV_FWD_ALPHA, ATTR_CONV_FWD_BETA, ATTR_CONV_FWD_CONV_DESC = 700, 701, 702
ATTR_CONV_FWD_W, ATTR_CONV_FWD_X, ATTR_CONV_FWD_Y = 703, 704, 705
ATTR_CONV_BWD_DATA_ALPHA, ATTR_CONV_BWD_DATA_BETA, ATTR_CONV_BWD_DATA_CONV_DESC = 706, 707, 708
ATTR_CONV_BWD_DATA_W, ATTR_CONV_BWD_DATA_DX, ATTR_CONV_BWD_DATA_DY = 709, 710, 711
ATTR_CONV_BWD_FILTER_ALPHA, ATTR_CONV_BWD_FILTER_BETA = 712, 713
ATTR_CONV_BWD_FILTER_CONV_DESC, ATTR_CONV_BWD_FILTER_DW = 714, 715
ATTR_CONV_BWD_FILTER_X, ATTR_CONV_BWD_FILTER_DY = 716, 717
ATTR_OPERATIONGRAPH_HANDLE, ATTR_OPERATIONGRAPH_OPS = 800, 801
ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802
ATTR_TENSOR_BYTE_ALIGNMENT, ATTR_TENSOR_DATA_TYPE, ATTR_TENSOR_DIMENSIONS = 900, 901, 902
ATTR_TENSOR_STRIDES, ATTR_TENSOR_VECTOR_COUNT, ATTR_TENSOR_VECTORIZED_DIMENSION = 903, 904, 905
ATTR_TENSOR_UNIQUE_ID, ATTR_TENSOR_IS_VIRTUAL, ATTR_TENSOR_IS_BY_VALUE = 906, 907, 908
ATTR_VARIANT_PACK_UNIQUE_IDS, ATTR_VARIANT_PACK_DATA_POINTERS = 1000, 1001
ATTR_VARIANT_PACK_INTERMEDIATES, ATTR_VARIANT_PACK_WORKSPACE = 1002, 1003
ATTR_ENGINE_OPERATION_GRAPH, ATTR_ENGINE_GLOBAL_INDEX = 1300, 1301
ATTR_ENGINE_NUMERICAL_NOTE, ATTR_ENGINE_BEHAVIOR_NOTE = 1303, 1305

# cudnnDataType_t -> bytes per element (sub-byte and bit-packed types are not sized: refused)
DATA_FLOAT, DATA_DOUBLE, DATA_HALF, DATA_INT8, DATA_INT32 = 0, 1, 2, 3, 4
DATA_UINT8, DATA_BFLOAT16, DATA_INT64, DATA_BOOLEAN = 6, 9, 10, 11
DATA_TYPE_SIZES = {DATA_FLOAT: 4, DATA_DOUBLE: 8, DATA_HALF: 2, DATA_INT8: 1, DATA_INT32: 4,
                   5: 4, DATA_UINT8: 1, 7: 4, 8: 32, DATA_BFLOAT16: 2, DATA_INT64: 8, 12: 1,
                   13: 1, 14: 1, 15: 1, 19: 4, 20: 8, 21: 16, 22: 1, 23: 1}

# cudnnConvolutionMode_t
MODE_CONVOLUTION, MODE_CROSS_CORRELATION = 0, 1
# cudnnTensorFormat_t
TENSOR_NCHW, TENSOR_NHWC = 0, 1
# cudnnBatchNormMode_t, cudnnBatchNormOps_t
BN_PER_ACTIVATION, BN_SPATIAL, BN_SPATIAL_PERSISTENT = 0, 1, 2
BN_OPS_BN = 0
DIM_MAX = 8

# pilot_dnn_bn_fn (shim/transport/pilot_proto.h): the batch normalization function a request names
BN_FORWARD_TRAINING_EX, BN_FORWARD_TRAINING, BN_FORWARD_INFERENCE = 1, 2, 3
BN_BACKWARD_EX, BN_BACKWARD = 4, 5
BN_SIZE_FORWARD_WORKSPACE, BN_SIZE_RESERVE, BN_SIZE_BACKWARD_WORKSPACE = 6, 7, 8
BN_FUNCTIONS = {1: "cudnnBatchNormalizationForwardTrainingEx",
                2: "cudnnBatchNormalizationForwardTraining",
                3: "cudnnBatchNormalizationForwardInference",
                4: "cudnnBatchNormalizationBackwardEx", 5: "cudnnBatchNormalizationBackward",
                6: "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                7: "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                8: "cudnnGetBatchNormalizationBackwardExWorkspaceSize"}
BN_SIZE_QUERIES = frozenset({6, 7, 8})


class DnnError(BackendError):
    """A cuDNN call failed with cudnnStatus_t `status`; `code` is the CUDA error a posted call
    leaves for the session's next synchronizing call."""

    def __init__(self, status: int, message: str) -> None:
        code = CUDA_ERROR_UNKNOWN
        if 2000 <= status < 3000:
            code = CUDA_ERROR_INVALID_VALUE
        elif 3000 <= status < 4000:
            code = CUDA_ERROR_NOT_SUPPORTED
        super().__init__(code, f"cuDNN status {status}: {message}")
        self.status = status


def attribute_size(atype: int) -> int:
    try:
        return ATTRIBUTE_TYPE_SIZES[atype]
    except KeyError:
        raise DnnError(STATUS_BAD_PARAM_ATTRIBUTE_TYPE, f"attribute type {atype}") from None


def data_type_size(dtype: int) -> int:
    try:
        return DATA_TYPE_SIZES[dtype]
    except KeyError:
        raise DnnError(STATUS_NOT_SUPPORTED_DATA_TYPE, f"data type {dtype} is not sized") from None


def tensor_span(dims: tuple[int, ...], strides: tuple[int, ...], elem: int) -> int:
    """Bytes from a strided tensor's first element to just past its farthest one; 0 if empty.
    Negative strides are refused by the callers (cuDNN refuses them too)."""
    if not dims or any(d <= 0 for d in dims):
        return 0
    return (sum((d - 1) * s for d, s in zip(dims, strides, strict=True)) + 1) * elem


@dataclass(frozen=True)
class TensorDesc:
    """A legacy cudnnTensorDescriptor_t as the program set it (dims and strides in elements)."""

    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]

    def span(self) -> int:
        return tensor_span(self.dims, self.strides, data_type_size(self.dtype))


@dataclass(frozen=True)
class BatchNormCall:
    """One legacy batch normalization call (or one of its size queries). Pointers are device
    addresses (0: NULL, as the program passed it). Scalars: alpha/beta for the data and, in
    backward, for the parameters, as the values the program's host pointers held."""

    fn: int
    mode: int
    bn_ops: int
    x: TensorDesc
    y: TensorDesc | None       # forward: yDesc; backward: dyDesc
    dx: TensorDesc | None      # backward: dxDesc
    bn: TensorDesc             # bnScaleBiasMeanVarDesc / dBnScaleBiasDesc
    x_ptr: int = 0
    y_ptr: int = 0             # forward: y; backward: dy
    dx_ptr: int = 0
    scale: int = 0
    bias: int = 0
    dscale: int = 0
    dbias: int = 0
    running_mean: int = 0      # inference: the estimated mean
    running_var: int = 0       # inference: the estimated variance
    saved_mean: int = 0
    saved_inv_var: int = 0
    workspace: int = 0
    workspace_size: int = 0
    reserve: int = 0
    reserve_size: int = 0
    factor: float = 0.0
    epsilon: float = 0.0
    alpha: float = 1.0
    beta: float = 0.0
    alpha_param: float = 1.0
    beta_param: float = 0.0

    @property
    def name(self) -> str:
        return BN_FUNCTIONS[self.fn]
