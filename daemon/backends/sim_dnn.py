"""cuDNN 9 on the sim backend: the backend API's descriptors (typed attributes, finalize, the
checks cuDNN makes there), one engine for single-operation 2-D convolution graphs (forward,
backward data, backward filter) computed with numpy over the sim's device memory, and the legacy
batch normalization calls. Results agree with cuDNN's within floating-point tolerance (the sim
computes in double precision), not bit for bit.

What the sim does not emulate it refuses with cuDNN's status rather than guessing: descriptor
types other than those below (they are created, but never finalize), attributes it does not
model, fused or multi-operation graphs (no engine), 1-D/3-D or explicitly grouped convolutions,
asymmetric padding, vectorized or reordered tensors, data types other than float, double and
half, and batch normalization with fused operations.

A descriptor is its type, the attributes set on it and, once finalized, what finalize built from
them (`built`): a frozen snapshot, so that later changes elsewhere (a tensor descriptor destroyed
after its operation was finalized) change nothing, as in cuDNN.

numpy is imported on first use, as in sim_blas.py."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pilot.daemon.backends.dnn import (
    ATTR_CONV_BWD_DATA_ALPHA,
    ATTR_CONV_BWD_DATA_BETA,
    ATTR_CONV_BWD_DATA_CONV_DESC,
    ATTR_CONV_BWD_DATA_DX,
    ATTR_CONV_BWD_DATA_DY,
    ATTR_CONV_BWD_DATA_W,
    ATTR_CONV_BWD_FILTER_ALPHA,
    ATTR_CONV_BWD_FILTER_BETA,
    ATTR_CONV_BWD_FILTER_CONV_DESC,
    ATTR_CONV_BWD_FILTER_DW,
    ATTR_CONV_BWD_FILTER_DY,
    ATTR_CONV_BWD_FILTER_X,
    ATTR_CONV_FWD_ALPHA,
    ATTR_CONV_FWD_BETA,
    ATTR_CONV_FWD_CONV_DESC,
    ATTR_CONV_FWD_W,
    ATTR_CONV_FWD_X,
    ATTR_CONV_FWD_Y,
    ATTR_CONVOLUTION_COMP_TYPE,
    ATTR_CONVOLUTION_CONV_MODE,
    ATTR_CONVOLUTION_DILATIONS,
    ATTR_CONVOLUTION_FILTER_STRIDES,
    ATTR_CONVOLUTION_POST_PADDINGS,
    ATTR_CONVOLUTION_PRE_PADDINGS,
    ATTR_CONVOLUTION_SPATIAL_DIMS,
    ATTR_ENGINE_BEHAVIOR_NOTE,
    ATTR_ENGINE_GLOBAL_INDEX,
    ATTR_ENGINE_NUMERICAL_NOTE,
    ATTR_ENGINE_OPERATION_GRAPH,
    ATTR_ENGINECFG_ENGINE,
    ATTR_ENGINECFG_KNOB_CHOICES,
    ATTR_ENGINECFG_WORKSPACE_SIZE,
    ATTR_ENGINEHEUR_MODE,
    ATTR_ENGINEHEUR_OPERATION_GRAPH,
    ATTR_ENGINEHEUR_RESULTS,
    ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
    ATTR_EXECUTION_PLAN_HANDLE,
    ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
    ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
    ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
    ATTR_OPERATIONGRAPH_HANDLE,
    ATTR_OPERATIONGRAPH_OPS,
    ATTR_TENSOR_BYTE_ALIGNMENT,
    ATTR_TENSOR_DATA_TYPE,
    ATTR_TENSOR_DIMENSIONS,
    ATTR_TENSOR_IS_BY_VALUE,
    ATTR_TENSOR_IS_VIRTUAL,
    ATTR_TENSOR_STRIDES,
    ATTR_TENSOR_UNIQUE_ID,
    ATTR_TENSOR_VECTOR_COUNT,
    ATTR_TENSOR_VECTORIZED_DIMENSION,
    ATTR_VARIANT_PACK_DATA_POINTERS,
    ATTR_VARIANT_PACK_INTERMEDIATES,
    ATTR_VARIANT_PACK_UNIQUE_IDS,
    ATTR_VARIANT_PACK_WORKSPACE,
    BN_BACKWARD,
    BN_BACKWARD_EX,
    BN_FORWARD_INFERENCE,
    BN_FORWARD_TRAINING,
    BN_FORWARD_TRAINING_EX,
    BN_FUNCTIONS,
    BN_OPS_BN,
    BN_PER_ACTIVATION,
    BN_SPATIAL,
    BN_SPATIAL_PERSISTENT,
    CONVOLUTION,
    DATA_DOUBLE,
    DATA_FLOAT,
    DATA_HALF,
    DATA_TYPE_SIZES,
    DESCRIPTOR_TYPES,
    DIM_MAX,
    ENGINE,
    ENGINECFG,
    ENGINEHEUR,
    EXECUTION_PLAN,
    MODE_CONVOLUTION,
    MODE_CROSS_CORRELATION,
    OPERATION_CONVOLUTION_BACKWARD_DATA,
    OPERATION_CONVOLUTION_BACKWARD_FILTER,
    OPERATION_CONVOLUTION_FORWARD,
    OPERATIONGRAPH,
    STATUS_BAD_PARAM,
    STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
    STATUS_BAD_PARAM_NOT_FINALIZED,
    STATUS_NOT_INITIALIZED,
    STATUS_NOT_SUPPORTED,
    STATUS_NOT_SUPPORTED_DATA_TYPE,
    STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
    TENSOR,
    TYPE_BACKEND_DESCRIPTOR,
    TYPE_BOOLEAN,
    TYPE_DATA_TYPE,
    TYPE_DOUBLE,
    TYPE_FLOAT,
    TYPE_HANDLE,
    TYPE_INT32,
    TYPE_INT64,
    TYPE_VOID_PTR,
    VARIANT_PACK,
    BatchNormCall,
    DnnError,
    TensorDesc,
    attribute_size,
    tensor_span,
)

Region = Callable[[int, int], memoryview]  # (address, bytes) -> the sim's device memory

CONVOLUTION_DESCRIPTOR = CONVOLUTION  # the descriptor type (not the mode)
# cudnnBackendAttributeType_t values dnn.py does not name
TYPE_CONVOLUTION_MODE, TYPE_HEUR_MODE, TYPE_KNOB_TYPE, TYPE_NUMERICAL_NOTE = 7, 8, 9, 11
TYPE_BEHAVIOR_NOTE, TYPE_TENSOR_REORDERING_MODE = 19, 20
# attributes the sim accepts that dnn.py does not name
ATTR_ENGINEHEUR_SM_COUNT_TARGET, ATTR_ENGINE_KNOB_INFO, ATTR_ENGINE_SM_COUNT_TARGET = 203, 1302, 1306
ATTR_TENSOR_REORDERING_MODE = 909
STATUS_BAD_PARAM_MISALIGNED_POINTER = 2003
HEUR_MODES = range(4)  # INSTANT, B, FALLBACK, A: every mode offers the sim's one engine
VECTOR_DATA_TYPES = frozenset({5, 7, 8})  # INT8x4, UINT8x4, INT8x32: cuDNN 9 refuses them
COMPUTED = frozenset({DATA_FLOAT, DATA_DOUBLE, DATA_HALF})
CONV_KINDS = (OPERATION_CONVOLUTION_FORWARD, OPERATION_CONVOLUTION_BACKWARD_DATA,
              OPERATION_CONVOLUTION_BACKWARD_FILTER)

_FORMATS = {TYPE_BOOLEAN: "?", TYPE_INT64: "q", TYPE_FLOAT: "f", TYPE_DOUBLE: "d",
            TYPE_VOID_PTR: "Q"}
_OBJECT_TYPES = (TYPE_HANDLE, TYPE_BACKEND_DESCRIPTOR)


def _np() -> Any:
    import numpy

    return numpy


def _numpy_type(dtype: int) -> Any:
    np = _np()
    try:
        return {DATA_FLOAT: np.float32, DATA_DOUBLE: np.float64, DATA_HALF: np.float16}[dtype]
    except KeyError:
        raise DnnError(STATUS_NOT_SUPPORTED_DATA_TYPE, f"data type {dtype} (sim)") from None


def _bad(message: str) -> DnnError:
    return DnnError(STATUS_BAD_PARAM, message)


# ---- handles and descriptors --------------------------------------------------------------

class Handle:
    """A cudnnHandle_t of the sim."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.alive = True


def check_handle(handle: Any) -> Handle:
    if not (isinstance(handle, Handle) and handle.alive):
        raise _bad(f"bad cuDNN handle {handle!r}")
    return handle


class Descriptor:
    """A cudnnBackendDescriptor_t: attrs maps attribute -> (attribute type, count, the
    elements' bytes, or for handles and descriptors a list of the objects)."""

    def __init__(self, dtype: int) -> None:
        if dtype not in DESCRIPTOR_TYPES:
            raise _bad(f"descriptor type {dtype}")
        self.dtype = dtype
        self.attrs: dict[int, tuple[int, int, Any]] = {}
        self.finalized = False
        self.built: Any = None
        self.alive = True

    def __repr__(self) -> str:
        return f"<sim cuDNN descriptor type {self.dtype}{' finalized' if self.finalized else ''}>"

    def copy_from(self, other: Descriptor) -> None:
        if self.dtype != other.dtype:
            raise _bad(f"descriptor of type {self.dtype} given for one of type {other.dtype}")
        self.attrs, self.finalized, self.built = dict(other.attrs), other.finalized, other.built


def _live(desc: Any) -> Descriptor:
    if not (isinstance(desc, Descriptor) and desc.alive):
        raise _bad(f"bad descriptor {desc!r}")
    return desc


@dataclass(frozen=True)
class Spec:
    """An attribute the sim models on a descriptor type: the attribute types it takes and how
    many elements; read-only ones cuDNN computes."""

    types: tuple[int, ...]
    lo: int = 1
    hi: int = 1
    readonly: bool = False


def _one(*types: int) -> Spec:
    return Spec(types)


_DESC = _one(TYPE_BACKEND_DESCRIPTOR)
_I64 = _one(TYPE_INT64)
_SCALAR = Spec((TYPE_FLOAT, TYPE_DOUBLE), 1, DIM_MAX)
_ARRAY = Spec((TYPE_INT64,), 1, DIM_MAX)


@dataclass(frozen=True)
class ConvRoles:
    """A convolution operation's attributes: the image x, filter w and response y (dx, dw, dy
    in the backward operations) and which of them the operation writes."""

    alpha: int
    beta: int
    conv: int
    x: int
    w: int
    y: int
    out: str


CONV_ROLES = {
    OPERATION_CONVOLUTION_FORWARD: ConvRoles(ATTR_CONV_FWD_ALPHA, ATTR_CONV_FWD_BETA,
                                             ATTR_CONV_FWD_CONV_DESC, ATTR_CONV_FWD_X,
                                             ATTR_CONV_FWD_W, ATTR_CONV_FWD_Y, "y"),
    OPERATION_CONVOLUTION_BACKWARD_DATA: ConvRoles(ATTR_CONV_BWD_DATA_ALPHA,
                                                   ATTR_CONV_BWD_DATA_BETA,
                                                   ATTR_CONV_BWD_DATA_CONV_DESC,
                                                   ATTR_CONV_BWD_DATA_DX, ATTR_CONV_BWD_DATA_W,
                                                   ATTR_CONV_BWD_DATA_DY, "x"),
    OPERATION_CONVOLUTION_BACKWARD_FILTER: ConvRoles(ATTR_CONV_BWD_FILTER_ALPHA,
                                                     ATTR_CONV_BWD_FILTER_BETA,
                                                     ATTR_CONV_BWD_FILTER_CONV_DESC,
                                                     ATTR_CONV_BWD_FILTER_X,
                                                     ATTR_CONV_BWD_FILTER_DW,
                                                     ATTR_CONV_BWD_FILTER_DY, "w"),
}

SPECS: dict[int, dict[int, Spec]] = {
    TENSOR: {
        ATTR_TENSOR_BYTE_ALIGNMENT: _I64, ATTR_TENSOR_DATA_TYPE: _one(TYPE_DATA_TYPE),
        ATTR_TENSOR_DIMENSIONS: Spec((TYPE_INT64,), 0, DIM_MAX),
        ATTR_TENSOR_STRIDES: Spec((TYPE_INT64,), 0, DIM_MAX),
        ATTR_TENSOR_VECTOR_COUNT: _I64, ATTR_TENSOR_VECTORIZED_DIMENSION: _I64,
        ATTR_TENSOR_UNIQUE_ID: _I64, ATTR_TENSOR_IS_VIRTUAL: _one(TYPE_BOOLEAN),
        ATTR_TENSOR_IS_BY_VALUE: _one(TYPE_BOOLEAN),
        ATTR_TENSOR_REORDERING_MODE: _one(TYPE_TENSOR_REORDERING_MODE),
    },
    CONVOLUTION_DESCRIPTOR: {
        ATTR_CONVOLUTION_COMP_TYPE: _one(TYPE_DATA_TYPE),
        ATTR_CONVOLUTION_CONV_MODE: _one(TYPE_CONVOLUTION_MODE),
        ATTR_CONVOLUTION_SPATIAL_DIMS: _I64, ATTR_CONVOLUTION_DILATIONS: _ARRAY,
        ATTR_CONVOLUTION_FILTER_STRIDES: _ARRAY, ATTR_CONVOLUTION_PRE_PADDINGS: _ARRAY,
        ATTR_CONVOLUTION_POST_PADDINGS: _ARRAY,
    },
    **{kind: {r.alpha: _SCALAR, r.beta: _SCALAR, r.conv: _DESC, r.x: _DESC, r.w: _DESC,
              r.y: _DESC} for kind, r in CONV_ROLES.items()},
    OPERATIONGRAPH: {
        ATTR_OPERATIONGRAPH_HANDLE: _one(TYPE_HANDLE),
        ATTR_OPERATIONGRAPH_OPS: Spec((TYPE_BACKEND_DESCRIPTOR,), 1, 1 << 20),
        ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: Spec((TYPE_INT64,), readonly=True),
    },
    ENGINEHEUR: {
        ATTR_ENGINEHEUR_MODE: _one(TYPE_HEUR_MODE), ATTR_ENGINEHEUR_OPERATION_GRAPH: _DESC,
        ATTR_ENGINEHEUR_RESULTS: Spec((TYPE_BACKEND_DESCRIPTOR,), 0, 0, readonly=True),
        ATTR_ENGINEHEUR_SM_COUNT_TARGET: _one(TYPE_INT32),
    },
    ENGINE: {
        ATTR_ENGINE_OPERATION_GRAPH: _DESC, ATTR_ENGINE_GLOBAL_INDEX: _I64,
        ATTR_ENGINE_SM_COUNT_TARGET: _one(TYPE_INT32),
        ATTR_ENGINE_NUMERICAL_NOTE: Spec((TYPE_NUMERICAL_NOTE,), readonly=True),
        ATTR_ENGINE_BEHAVIOR_NOTE: Spec((TYPE_BEHAVIOR_NOTE,), readonly=True),
        ATTR_ENGINE_KNOB_INFO: Spec((TYPE_BACKEND_DESCRIPTOR,), readonly=True),
    },
    ENGINECFG: {
        ATTR_ENGINECFG_ENGINE: _DESC,
        ATTR_ENGINECFG_KNOB_CHOICES: Spec((TYPE_BACKEND_DESCRIPTOR,), 0, 1 << 10),
        ATTR_ENGINECFG_WORKSPACE_SIZE: Spec((TYPE_INT64,), readonly=True),
    },
    EXECUTION_PLAN: {
        ATTR_EXECUTION_PLAN_HANDLE: _one(TYPE_HANDLE), ATTR_EXECUTION_PLAN_ENGINE_CONFIG: _DESC,
        ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: Spec((TYPE_INT64,), readonly=True),
    },
    VARIANT_PACK: {
        ATTR_VARIANT_PACK_UNIQUE_IDS: Spec((TYPE_INT64,), 0, 1 << 20),
        ATTR_VARIANT_PACK_DATA_POINTERS: Spec((TYPE_VOID_PTR,), 0, 1 << 20),
        ATTR_VARIANT_PACK_INTERMEDIATES: Spec((TYPE_VOID_PTR,), 0, 1 << 20),
        ATTR_VARIANT_PACK_WORKSPACE: _one(TYPE_VOID_PTR),
    },
}


def set_attribute(desc: Any, attr: int, atype: int, count: int, value: bytes | list[Any]) -> None:
    """cudnnBackendSetAttribute."""
    d = _live(desc)
    if d.finalized:
        raise _bad(f"attribute {attr} set on a finalized descriptor (type {d.dtype})")
    if attr == ATTR_EXECUTION_PLAN_JSON_REPRESENTATION and d.dtype == EXECUTION_PLAN:
        raise DnnError(STATUS_NOT_SUPPORTED, "execution plans from JSON (sim)")
    size = attribute_size(atype)
    if count < 0:
        raise _bad(f"attribute {attr}: element count {count}")
    specs = SPECS.get(d.dtype)
    if specs is not None:
        spec = specs.get(attr)
        if spec is None:
            raise DnnError(STATUS_NOT_SUPPORTED,
                           f"attribute {attr} of descriptor type {d.dtype} (sim)")
        if spec.readonly:
            raise _bad(f"attribute {attr} is read-only")
        if atype not in spec.types:
            raise DnnError(STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
                           f"attribute {attr} takes attribute types {spec.types}, not {atype}")
        if not spec.lo <= count <= spec.hi:
            raise _bad(f"attribute {attr}: {count} elements, {spec.lo}..{spec.hi} allowed")
    if atype in _OBJECT_TYPES:
        objects = list(value)
        wanted = Descriptor if atype == TYPE_BACKEND_DESCRIPTOR else Handle
        if len(objects) != count or not all(isinstance(o, wanted) and o.alive for o in objects):
            raise _bad(f"attribute {attr}: {count} live {wanted.__name__.lower()}s expected")
        d.attrs[attr] = (atype, count, objects)
        return
    raw = bytes(value)
    if len(raw) != count * size:
        raise _bad(f"attribute {attr}: {len(raw)} bytes for {count} elements of {size}")
    d.attrs[attr] = (atype, count, raw)


def _decode(atype: int, count: int, raw: bytes) -> list[Any]:
    return list(struct.unpack(f"<{count}{_FORMATS.get(atype, 'i')}", raw))


def _values(d: Descriptor, attr: int, *, required: bool = True) -> list[Any] | None:
    """The elements of an attribute set on `d` (numbers, or objects)."""
    entry = d.attrs.get(attr)
    if entry is None:
        if required:
            raise _bad(f"descriptor type {d.dtype}: required attribute {attr} is not set")
        return None
    atype, count, payload = entry
    return list(payload) if atype in _OBJECT_TYPES else _decode(atype, count, payload)


def _scalar(d: Descriptor, attr: int) -> int:
    values = _values(d, attr)
    assert values is not None
    if len(values) != 1:
        raise _bad(f"descriptor type {d.dtype}: attribute {attr} needs one element")
    return values[0]


def _built(d: Descriptor, attr: int, dtype: int) -> Any:
    """What finalize built of the descriptor attribute `attr` refers to (of type dtype)."""
    ref = _values(d, attr)
    assert ref is not None
    if len(ref) != 1:
        raise _bad(f"attribute {attr} needs one descriptor")
    target = ref[0]
    if not target.alive or target.dtype != dtype or not target.finalized:
        raise _bad(f"attribute {attr} needs a live, finalized descriptor of type {dtype}, "
                   f"not {target!r}")
    return target.built


def _computed(d: Descriptor, attr: int) -> tuple[int, int, Any] | None:
    """Read-only attributes and defaults of a finalized descriptor."""
    graph = d.built
    defaults: dict[tuple[int, int], tuple[int, int, Any]] = {
        (OPERATIONGRAPH, ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT):
            (TYPE_INT64, 1, struct.pack("<q", 1 if isinstance(graph, Graph) and graph.op else 0)),
        (ENGINE, ATTR_ENGINE_NUMERICAL_NOTE): (TYPE_NUMERICAL_NOTE, 0, b""),
        (ENGINE, ATTR_ENGINE_BEHAVIOR_NOTE): (TYPE_BEHAVIOR_NOTE, 0, b""),
        (ENGINE, ATTR_ENGINE_KNOB_INFO): (TYPE_BACKEND_DESCRIPTOR, 0, []),
        (ENGINECFG, ATTR_ENGINECFG_KNOB_CHOICES): (TYPE_BACKEND_DESCRIPTOR, 0, []),
        (ENGINECFG, ATTR_ENGINECFG_WORKSPACE_SIZE): (TYPE_INT64, 1, struct.pack("<q", 0)),
        (EXECUTION_PLAN, ATTR_EXECUTION_PLAN_WORKSPACE_SIZE): (TYPE_INT64, 1, struct.pack("<q", 0)),
        (TENSOR, ATTR_TENSOR_IS_VIRTUAL): (TYPE_BOOLEAN, 1, b"\0"),
        (TENSOR, ATTR_TENSOR_IS_BY_VALUE): (TYPE_BOOLEAN, 1, b"\0"),
        (TENSOR, ATTR_TENSOR_VECTOR_COUNT): (TYPE_INT64, 1, struct.pack("<q", 1)),
    }
    return defaults.get((d.dtype, attr))


def get_attribute(desc: Any, attr: int, atype: int, requested: int,
                  descs: list[Any] | None) -> tuple[int, bytes]:
    """cudnnBackendGetAttribute: (the element count, the bytes of the first min(requested,
    count) elements); descriptor elements are copied into `descs`. Requested 0 is a count query
    (the program passed no array) and answers the attribute's count; otherwise the count is of
    the elements returned. As cuDNN 9.24 answers (tests/unit/test_cudnn_real.py): a descriptor
    not finalized is NOT_INITIALIZED, the wrong attribute type BAD_PARAM_ATTRIBUTE_TYPE, more
    than one element of a one-element attribute BAD_PARAM, and a tensor's byte alignment is not
    read back (NOT_SUPPORTED)."""
    d = _live(desc)
    if not d.finalized:
        raise DnnError(STATUS_NOT_INITIALIZED,
                       f"attribute {attr} read from a descriptor (type {d.dtype}) not finalized")
    if requested < 0:
        raise _bad(f"attribute {attr}: {requested} elements requested")
    spec = SPECS.get(d.dtype, {}).get(attr)
    if d.dtype == TENSOR and attr == ATTR_TENSOR_BYTE_ALIGNMENT:
        raise DnnError(STATUS_NOT_SUPPORTED, "a tensor's byte alignment is not read back")
    if d.dtype == EXECUTION_PLAN and attr == ATTR_EXECUTION_PLAN_JSON_REPRESENTATION:
        raise DnnError(STATUS_NOT_SUPPORTED, "execution plans as JSON (sim)")
    if d.dtype == ENGINEHEUR and attr == ATTR_ENGINEHEUR_RESULTS:
        entry: tuple[int, int, Any] | None = (TYPE_BACKEND_DESCRIPTOR, 1, None)
    else:
        entry = d.attrs.get(attr) or _computed(d, attr)
    if entry is None:
        raise _bad(f"attribute {attr} of descriptor type {d.dtype} is not set")
    stored, count, payload = entry
    if atype != stored:
        raise DnnError(STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
                       f"attribute {attr} has attribute type {stored}, not {atype}")
    if atype == TYPE_HANDLE:
        raise DnnError(STATUS_NOT_SUPPORTED, f"attribute {attr}: handles are not read back (sim)")
    if requested > 1 and spec is not None and spec.hi == 1 and not spec.readonly:
        raise _bad(f"attribute {attr} has one element, {requested} requested")
    n = min(requested, count)
    answered = n if requested else count
    if atype != TYPE_BACKEND_DESCRIPTOR:
        return answered, payload[:n * attribute_size(atype)]
    targets = list(descs or [])
    if len(targets) < n:
        raise _bad(f"attribute {attr}: {n} descriptors to fill, {len(targets)} given")
    for i, target in enumerate(targets[:n]):
        if payload is None:
            _heuristic_result(d, _live(target))
        else:
            _live(target).copy_from(payload[i])
    return answered, b""


def _heuristic_result(heur: Descriptor, cfg: Descriptor) -> None:
    """The engine configuration of the heuristics' one result: the sim's engine 0."""
    if cfg.dtype != ENGINECFG:
        raise _bad(f"heuristic results fill engine configurations, not type {cfg.dtype}")
    graph_desc = _values(heur, ATTR_ENGINEHEUR_OPERATION_GRAPH)[0]  # type: ignore[index]
    engine = Descriptor(ENGINE)
    engine.attrs = {ATTR_ENGINE_OPERATION_GRAPH: (TYPE_BACKEND_DESCRIPTOR, 1, [graph_desc]),
                    ATTR_ENGINE_GLOBAL_INDEX: (TYPE_INT64, 1, struct.pack("<q", 0))}
    engine.built = Engine(heur.built, 0)
    engine.finalized = True
    cfg.attrs = {ATTR_ENGINECFG_ENGINE: (TYPE_BACKEND_DESCRIPTOR, 1, [engine])}
    cfg.built = EngineCfg(engine.built)
    cfg.finalized = True


def destroy(desc: Any) -> None:
    _live(desc).alive = False


# ---- what finalize builds ------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    uid: int
    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    alignment: int
    virtual: bool = False
    by_value: bool = False

    def span(self) -> int:
        return tensor_span(self.dims, self.strides, DATA_TYPE_SIZES[self.dtype])


@dataclass(frozen=True)
class Conv:
    comp: int
    mode: int
    dilations: tuple[int, ...]
    strides: tuple[int, ...]
    pre: tuple[int, ...]
    post: tuple[int, ...]


@dataclass(frozen=True)
class ConvOp:
    """One convolution operation: x, w, y are the image, filter and response tensors whatever
    the direction (dx, dw, dy in the backward operations); `out` names the one it writes."""

    kind: int
    x: Tensor
    w: Tensor
    y: Tensor
    conv: Conv
    alpha: float
    beta: float

    @property
    def out(self) -> str:
        return CONV_ROLES[self.kind].out

    @property
    def groups(self) -> int:
        return self.x.dims[1] // self.w.dims[1]

    def tensors(self) -> dict[str, Tensor]:
        return {"x": self.x, "w": self.w, "y": self.y}


@dataclass(frozen=True)
class Graph:
    ops: tuple[ConvOp, ...]

    @property
    def op(self) -> ConvOp | None:
        """The operation the sim's engine runs: a graph of one convolution over tensors in
        memory; None where the sim has no engine."""
        if len(self.ops) != 1:
            return None
        op = self.ops[0]
        return None if any(t.virtual for t in op.tensors().values()) else op


@dataclass(frozen=True)
class Engine:
    graph: Graph
    index: int


@dataclass(frozen=True)
class EngineCfg:
    engine: Engine


@dataclass(frozen=True)
class Plan:
    op: ConvOp


def finalize(desc: Any) -> None:
    """cudnnBackendFinalize: the checks cuDNN makes, then the snapshot later uses read."""
    d = _live(desc)
    if d.finalized:
        raise _bad(f"descriptor (type {d.dtype}) is already finalized")
    builder = _BUILDERS.get(d.dtype)
    if builder is None:
        raise DnnError(STATUS_NOT_SUPPORTED, f"descriptor type {d.dtype} (sim)")
    d.built = builder(d)
    d.finalized = True


def _positive(name: str, values: list[int], least: int = 1) -> tuple[int, ...]:
    if any(v < least for v in values):
        raise _bad(f"{name} {values}: every element must be at least {least}")
    return tuple(values)


def _tensor(d: Descriptor) -> Tensor:
    dtype = _scalar(d, ATTR_TENSOR_DATA_TYPE)
    dims, strides = _values(d, ATTR_TENSOR_DIMENSIONS), _values(d, ATTR_TENSOR_STRIDES)
    assert dims is not None and strides is not None
    uid, alignment = _scalar(d, ATTR_TENSOR_UNIQUE_ID), _scalar(d, ATTR_TENSOR_BYTE_ALIGNMENT)
    if not 1 <= len(dims) <= DIM_MAX or len(strides) != len(dims):
        raise _bad(f"tensor {uid}: {len(dims)} dimensions and {len(strides)} strides")
    _positive(f"tensor {uid}: dimensions", dims)
    _positive(f"tensor {uid}: strides", strides)
    if dtype in VECTOR_DATA_TYPES:
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid}: vector data type {dtype}")
    if dtype not in DATA_TYPE_SIZES:
        raise DnnError(STATUS_NOT_SUPPORTED_DATA_TYPE, f"tensor {uid}: data type {dtype} (sim)")
    if alignment <= 0 or alignment % DATA_TYPE_SIZES[dtype]:
        raise _bad(f"tensor {uid}: byte alignment {alignment} for data type {dtype}")
    vector = _values(d, ATTR_TENSOR_VECTOR_COUNT, required=False) or [1]
    if vector != [1]:
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid}: vector count {vector[0]} (sim)")
    if (_values(d, ATTR_TENSOR_REORDERING_MODE, required=False) or [0]) != [0]:
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid}: reordered tensors (sim)")
    virtual = _values(d, ATTR_TENSOR_IS_VIRTUAL, required=False) or [False]
    by_value = _values(d, ATTR_TENSOR_IS_BY_VALUE, required=False) or [False]
    return Tensor(uid, dtype, tuple(dims), tuple(strides), alignment, bool(virtual[0]),
                  bool(by_value[0]))


def _conv(d: Descriptor) -> Conv:
    comp, mode = _scalar(d, ATTR_CONVOLUTION_COMP_TYPE), _scalar(d, ATTR_CONVOLUTION_CONV_MODE)
    spatial = _scalar(d, ATTR_CONVOLUTION_SPATIAL_DIMS)
    if mode not in (MODE_CONVOLUTION, MODE_CROSS_CORRELATION):
        raise _bad(f"convolution mode {mode}")
    if comp not in DATA_TYPE_SIZES:
        raise _bad(f"convolution compute type {comp}")
    if not 1 <= spatial <= DIM_MAX - 2:
        raise _bad(f"{spatial} spatial dimensions")
    arrays = []
    for attr, name, least in ((ATTR_CONVOLUTION_DILATIONS, "dilations", 1),
                              (ATTR_CONVOLUTION_FILTER_STRIDES, "filter strides", 1),
                              (ATTR_CONVOLUTION_PRE_PADDINGS, "pre-paddings", 0),
                              (ATTR_CONVOLUTION_POST_PADDINGS, "post-paddings", 0)):
        values = _values(d, attr)
        assert values is not None
        if len(values) != spatial:
            raise _bad(f"{len(values)} {name} for {spatial} spatial dimensions")
        arrays.append(_positive(name, values, least))
    return Conv(comp, mode, *arrays)


def _overlapping(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two elements may share memory (a layout the sim cannot write)."""
    extent = 1
    for stride, dim in sorted((s, n) for n, s in zip(dims, strides, strict=True) if n > 1):
        if stride < extent:
            return True
        extent = stride * dim
    return False


def _conv_op(d: Descriptor) -> ConvOp:
    roles = CONV_ROLES[d.dtype]
    x, w, y = (_built(d, a, TENSOR) for a in (roles.x, roles.w, roles.y))
    conv: Conv = _built(d, roles.conv, CONVOLUTION_DESCRIPTOR)
    alpha, beta = _values(d, roles.alpha)[0], _values(d, roles.beta)[0]  # type: ignore[index]
    tensors = {"x": x, "w": w, "y": y}
    if len({t.uid for t in tensors.values()}) != 3:
        raise _bad("a convolution's three tensors need distinct unique ids")
    spatial = len(conv.pre)
    if any(len(t.dims) == spatial + 3 for t in tensors.values()):
        raise DnnError(STATUS_NOT_SUPPORTED, "convolution tensors with a group dimension (sim)")
    if any(len(t.dims) != spatial + 2 for t in tensors.values()):
        raise _bad(f"convolution of {spatial} spatial dimensions over tensors of "
                   f"{len(x.dims)}, {len(w.dims)}, {len(y.dims)} dimensions")
    n, c, k, cg = x.dims[0], x.dims[1], w.dims[0], w.dims[1]
    if c % cg or k % (c // cg):
        raise _bad(f"{c} image channels, filter of {k} x {cg}: not a grouped convolution")
    out = []
    for i in range(spatial):
        span = conv.dilations[i] * (w.dims[2 + i] - 1) + 1
        out.append((x.dims[2 + i] + conv.pre[i] + conv.post[i] - span) // conv.strides[i] + 1)
    if min(out) < 1 or y.dims != (n, k, *out):
        raise _bad(f"response {y.dims}: the convolution of {x.dims} with {w.dims} is "
                   f"{(n, k, *out)}")
    if any(t.by_value for t in tensors.values()):
        raise DnnError(STATUS_NOT_SUPPORTED, "by-value convolution tensors (sim)")
    if spatial != 2:
        raise DnnError(STATUS_NOT_SUPPORTED, f"{spatial}-D convolution (sim: 2-D only)")
    if conv.pre != conv.post:
        raise DnnError(STATUS_NOT_SUPPORTED, f"asymmetric padding {conv.pre} / {conv.post} (sim)")
    dtypes = {t.dtype for t in tensors.values()}
    dtype = dtypes.pop()
    allowed = {DATA_FLOAT: {DATA_FLOAT}, DATA_DOUBLE: {DATA_DOUBLE},
               DATA_HALF: {DATA_HALF, DATA_FLOAT}}.get(dtype, set())
    if dtypes or conv.comp not in allowed:
        raise DnnError(STATUS_NOT_SUPPORTED_DATA_TYPE,
                       f"convolution of data types {sorted({t.dtype for t in tensors.values()})}"
                       f" computed in {conv.comp} (sim)")
    written = tensors[roles.out]
    if _overlapping(written.dims, written.strides):
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {written.uid}: overlapping strides (sim)")
    return ConvOp(d.dtype, x, w, y, conv, float(alpha), float(beta))


def _graph(d: Descriptor) -> Graph:
    # The handle attributes are deprecated in cuDNN 9 and may be left out (PyTorch 2.14's
    # cudnn-frontend sets none on its plans); one that is set must be live.
    handles = _values(d, ATTR_OPERATIONGRAPH_HANDLE, required=False)
    ops = _values(d, ATTR_OPERATIONGRAPH_OPS)
    assert ops is not None
    if handles:
        check_handle(handles[0])
    built = []
    for op in ops:
        if not op.alive or op.dtype not in CONV_KINDS or not op.finalized:
            raise _bad(f"operation graph: {op!r} is no finalized operation")
        built.append(op.built)
    seen: dict[int, Tensor] = {}
    for op in built:
        for t in op.tensors().values():
            if seen.setdefault(t.uid, t) != t:
                raise _bad(f"operation graph: two different tensors with unique id {t.uid}")
    return Graph(tuple(built))


def _heur(d: Descriptor) -> Graph:
    mode = _scalar(d, ATTR_ENGINEHEUR_MODE)
    graph: Graph = _built(d, ATTR_ENGINEHEUR_OPERATION_GRAPH, OPERATIONGRAPH)
    if mode not in HEUR_MODES:
        raise _bad(f"heuristic mode {mode}")
    if graph.op is None:
        raise DnnError(STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
                       "the sim runs graphs of one convolution over tensors in memory")
    return graph


def _engine(d: Descriptor) -> Engine:
    graph: Graph = _built(d, ATTR_ENGINE_OPERATION_GRAPH, OPERATIONGRAPH)
    index = _scalar(d, ATTR_ENGINE_GLOBAL_INDEX)
    if index != 0 or graph.op is None:
        raise DnnError(STATUS_NOT_SUPPORTED, f"engine {index}: the sim's graph has "
                                             f"{1 if graph.op else 0} engines")
    return Engine(graph, index)


def _engine_cfg(d: Descriptor) -> EngineCfg:
    engine: Engine = _built(d, ATTR_ENGINECFG_ENGINE, ENGINE)
    if _values(d, ATTR_ENGINECFG_KNOB_CHOICES, required=False):
        raise DnnError(STATUS_NOT_SUPPORTED, "knob choices: the sim's engine has no knobs")
    return EngineCfg(engine)


def _plan(d: Descriptor) -> Plan:
    handles = _values(d, ATTR_EXECUTION_PLAN_HANDLE, required=False)
    if handles:
        check_handle(handles[0])
    cfg: EngineCfg = _built(d, ATTR_EXECUTION_PLAN_ENGINE_CONFIG, ENGINECFG)
    op = cfg.engine.graph.op
    assert op is not None  # the engine would not have finalized
    return Plan(op)


def _variant_pack(d: Descriptor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    uids, ptrs = _values(d, ATTR_VARIANT_PACK_UNIQUE_IDS), _values(d, ATTR_VARIANT_PACK_DATA_POINTERS)
    assert uids is not None and ptrs is not None
    if len(uids) != len(ptrs):
        raise _bad(f"variant pack: {len(uids)} unique ids, {len(ptrs)} pointers")
    return tuple(uids), tuple(ptrs), _scalar(d, ATTR_VARIANT_PACK_WORKSPACE)


_BUILDERS: dict[int, Callable[[Descriptor], Any]] = {
    TENSOR: _tensor, CONVOLUTION_DESCRIPTOR: _conv, **dict.fromkeys(CONV_KINDS, _conv_op),
    OPERATIONGRAPH: _graph, ENGINEHEUR: _heur, ENGINE: _engine, ENGINECFG: _engine_cfg, EXECUTION_PLAN: _plan,
    VARIANT_PACK: _variant_pack,
}


# ---- execution ----------------------------------------------------------------------------

def plan_op(plan: Any) -> ConvOp:
    d = _live(plan)
    if d.dtype != EXECUTION_PLAN:
        raise _bad(f"{d!r} is no execution plan")
    if not d.finalized:
        raise DnnError(STATUS_BAD_PARAM_NOT_FINALIZED, "execution plan not finalized")
    return d.built.op


def bind(op: ConvOp, uids: list[int], pointers: list[int]) -> dict[str, tuple[Tensor, int]]:
    """Each tensor of the operation with its pointer from the variant pack."""
    if len(uids) != len(pointers) or len(set(uids)) != len(uids):
        raise _bad(f"variant pack: unique ids {uids} for {len(pointers)} pointers")
    given = dict(zip(uids, pointers, strict=True))
    bound = {}
    for role, t in op.tensors().items():
        ptr = given.get(t.uid, 0)
        if not ptr:
            raise _bad(f"variant pack: no pointer for tensor {t.uid}")
        if ptr % t.alignment:
            raise DnnError(STATUS_BAD_PARAM_MISALIGNED_POINTER,
                           f"tensor {t.uid}: {ptr:#x} is not {t.alignment}-byte aligned")
        bound[role] = (t, ptr)
    return bound


def _view(region: Region, ptr: int, dtype: int, dims: tuple[int, ...],
          strides: tuple[int, ...]) -> Any:
    """The strided tensor at ptr, a writable view of the sim's memory."""
    np = _np()
    kind = _numpy_type(dtype)
    elem = DATA_TYPE_SIZES[dtype]
    span = tensor_span(dims, strides, elem)
    raw = np.frombuffer(region(ptr, span), dtype=kind, count=span // elem)
    return np.lib.stride_tricks.as_strided(raw, shape=dims, strides=[s * elem for s in strides],
                                           writeable=True)


def _read(region: Region, ptr: int, dtype: int, dims: tuple[int, ...],
          strides: tuple[int, ...]) -> Any:
    return _view(region, ptr, dtype, dims, strides).astype(_np().float64)


def _blend(region: Region, ptr: int, dtype: int, dims: tuple[int, ...], strides: tuple[int, ...],
           result: Any, alpha: float, beta: float) -> None:
    """dest = alpha * result + beta * dest; dest is not read when beta is 0, as in cuDNN."""
    view = _view(region, ptr, dtype, dims, strides)
    out = alpha * result
    if beta != 0:
        out = out + beta * view.astype(_np().float64)
    view[...] = out


def _windows(xp: Any, out: tuple[int, int], taps: tuple[int, int], conv: Conv) -> Any:
    """im2col: the (N, C, P, Q, R, S) view of the padded image xp each output reads."""
    np = _np()
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    (uh, uw), (dh, dw) = conv.strides, conv.dilations
    return np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, *out, *taps), strides=(sn, sc, sh * uh, sw * uw, sh * dh, sw * dw),
        writeable=False)


def convolve(op: ConvOp, x: Any, w: Any, y: Any) -> Any:
    """The operation's result in float64 from the two tensors it reads (the third is None):
    per group, one matrix product of the image's windows (im2col) with the filter."""
    np = _np()
    g = op.groups
    n, c, h, wd = op.x.dims
    k, cg, r, s = op.w.dims
    p, q = op.y.dims[2:]
    kg = k // g
    ph, pw = op.conv.pre
    flip = op.conv.mode == MODE_CONVOLUTION  # true convolution: the filter turned around
    if w is not None:
        wm = (w[:, :, ::-1, ::-1] if flip else w).reshape(g, kg, cg * r * s)
    if y is not None:  # (g, n*p*q, kg)
        ym = y.reshape(n, g, kg, p * q).transpose(1, 0, 3, 2).reshape(g, n * p * q, kg)
    if op.out != "x":
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        cols = (_windows(xp, (p, q), (r, s), op.conv).reshape(n, g, cg, p, q, r, s)
                .transpose(1, 0, 3, 4, 2, 5, 6).reshape(g, n * p * q, cg * r * s))
        if op.out == "y":
            out = np.matmul(cols, wm.transpose(0, 2, 1))
            return out.reshape(g, n, p, q, kg).transpose(1, 0, 4, 2, 3).reshape(n, k, p, q)
        dw = np.matmul(ym.transpose(0, 2, 1), cols).reshape(k, cg, r, s)
        return dw[:, :, ::-1, ::-1] if flip else dw
    # backward data: each filter tap scatters its share of dy back onto the padded image
    dcols = (np.matmul(ym, wm).reshape(g, n, p, q, cg, r, s).transpose(1, 0, 4, 5, 6, 2, 3)
             .reshape(n, c, r, s, p, q))
    dxp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    (uh, uw), (dh, dw_) = op.conv.strides, op.conv.dilations
    for i in range(r):
        for j in range(s):
            dxp[:, :, i * dh:i * dh + uh * (p - 1) + 1:uh,
                j * dw_:j * dw_ + uw * (q - 1) + 1:uw] += dcols[:, :, i, j]
    return dxp[:, :, ph:ph + h, pw:pw + wd]


def execute(region: Region, op: ConvOp, bound: dict[str, tuple[Tensor, int]]) -> None:
    """Run the convolution over the sim's memory (the pointers checked by bind())."""
    inputs = {role: _read(region, ptr, t.dtype, t.dims, t.strides)
              for role, (t, ptr) in bound.items() if role != op.out}
    result = convolve(op, inputs.get("x"), inputs.get("w"), inputs.get("y"))
    t, ptr = bound[op.out]
    _blend(region, ptr, t.dtype, t.dims, t.strides, result, op.alpha, op.beta)


# ---- legacy batch normalization ------------------------------------------------------------

BN_MODES = (BN_PER_ACTIVATION, BN_SPATIAL, BN_SPATIAL_PERSISTENT)


def check_batchnorm(call: BatchNormCall) -> list[tuple[int, TensorDesc]]:
    """The checks cuDNN makes before it runs a batch normalization; the (pointer, tensor) of
    each buffer the call reads or writes."""
    name = BN_FUNCTIONS.get(call.fn)
    if name is None:
        raise _bad(f"batch normalization function {call.fn}")
    if call.mode not in BN_MODES:
        raise _bad(f"{name}: batch normalization mode {call.mode}")
    if call.bn_ops != BN_OPS_BN:
        raise DnnError(STATUS_NOT_SUPPORTED, f"{name}: batch normalization ops {call.bn_ops} (sim)")
    x, bn = call.x, call.bn
    if x.dtype not in COMPUTED:
        raise DnnError(STATUS_NOT_SUPPORTED_DATA_TYPE, f"{name}: data type {x.dtype} (sim)")
    if len(x.dims) not in (4, 5):
        raise _bad(f"{name}: {len(x.dims)} dimensions (4 or 5)")
    backward = call.fn in (BN_BACKWARD, BN_BACKWARD_EX)
    data = [("x", x), ("dy" if backward else "y", call.y)] + ([("dx", call.dx)] if backward else [])
    for role, t in data:
        if t is None or t.dtype != x.dtype or t.dims != x.dims:
            raise _bad(f"{name}: {role} {t} does not match x {x}")
    want = (1, x.dims[1], *((1,) * (len(x.dims) - 2) if call.mode != BN_PER_ACTIVATION
                            else x.dims[2:]))
    param_type = DATA_DOUBLE if x.dtype == DATA_DOUBLE else DATA_FLOAT
    if bn.dims != want or bn.dtype != param_type:
        raise _bad(f"{name}: parameter tensor {bn}, expected dims {want} of type {param_type}")
    for t in (x, bn, *(t for _, t in data)):
        if len(t.strides) != len(t.dims) or min(t.strides) < 1:
            raise _bad(f"{name}: strides of {t}")
    if call.epsilon < 0:
        raise _bad(f"{name}: epsilon {call.epsilon}")
    c = call
    if c.fn == BN_FORWARD_INFERENCE:
        needed = {"x": c.x_ptr, "y": c.y_ptr, "scale": c.scale, "bias": c.bias,
                  "estimated mean": c.running_mean, "estimated variance": c.running_var}
        pairs = []
        written = [(c.y_ptr, c.y)]
    elif backward:
        needed = {"x": c.x_ptr, "dy": c.y_ptr, "dx": c.dx_ptr, "scale": c.scale,
                  "dscale": c.dscale, "dbias": c.dbias}
        pairs = [(c.saved_mean, c.saved_inv_var)]
        written = [(c.dx_ptr, c.dx), (c.dscale, bn), (c.dbias, bn)]
    else:
        needed = {"x": c.x_ptr, "y": c.y_ptr, "scale": c.scale, "bias": c.bias}
        pairs = [(c.running_mean, c.running_var), (c.saved_mean, c.saved_inv_var)]
        written = [(c.y_ptr, c.y), (c.running_mean, bn), (c.running_var, bn),
                   (c.saved_mean, bn), (c.saved_inv_var, bn)]
    missing = [role for role, ptr in needed.items() if not ptr]
    if missing:
        raise _bad(f"{name}: NULL {', '.join(missing)}")
    if any(bool(a) != bool(b) for a, b in pairs):
        raise _bad(f"{name}: one of a mean/variance pair is NULL, the other not")
    for ptr, t in written:
        if ptr and _overlapping(t.dims, t.strides):  # type: ignore[union-attr]
            raise DnnError(STATUS_NOT_SUPPORTED, f"{name}: overlapping strides {t} (sim)")
    count = _bn_count(c)
    if c.fn in (BN_FORWARD_TRAINING, BN_FORWARD_TRAINING_EX) and c.running_mean and count < 2:
        raise DnnError(STATUS_NOT_SUPPORTED, f"{name}: the unbiased variance of one value (sim)")
    pointers = [c.x_ptr, c.y_ptr, c.dx_ptr]
    tensors: list[tuple[int, TensorDesc]] = [(p, t) for p, (_, t) in zip(pointers, data,
                                                                        strict=False)]
    params = (c.scale, c.bias, c.dscale, c.dbias, c.running_mean, c.running_var, c.saved_mean,
              c.saved_inv_var)
    tensors += [(p, bn) for p in params if p]
    return tensors


def _bn_count(call: BatchNormCall) -> int:
    """How many values each mean and variance is taken over."""
    dims = call.x.dims
    if call.mode == BN_PER_ACTIVATION:
        return dims[0]
    total = 1
    for d in dims:
        total *= d
    return total // dims[1]


def batchnorm(region: Region, call: BatchNormCall) -> None:
    """Run a batch normalization (checked by check_batchnorm) over the sim's memory."""
    np = _np()
    c, bn = call, call.bn
    axes = (0,) if c.mode == BN_PER_ACTIVATION else (0, *range(2, len(c.x.dims)))

    def load(ptr: int, t: TensorDesc | None = None) -> Any:
        t = t or bn
        return _read(region, ptr, t.dtype, t.dims, t.strides)

    def store(ptr: int, values: Any, alpha: float = 1.0, beta: float = 0.0,
              t: TensorDesc | None = None) -> None:
        t = t or bn
        _blend(region, ptr, t.dtype, t.dims, t.strides, values, alpha, beta)

    x = load(c.x_ptr, c.x)
    scale = load(c.scale)
    if c.fn == BN_FORWARD_INFERENCE:
        inv_std = 1.0 / np.sqrt(load(c.running_var) + c.epsilon)
        y = scale * (x - load(c.running_mean)) * inv_std + load(c.bias)
        store(c.y_ptr, y, c.alpha, c.beta, c.y)
        return
    if c.fn in (BN_FORWARD_TRAINING, BN_FORWARD_TRAINING_EX):
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(var + c.epsilon)
        y = scale * (x - mean) * inv_std + load(c.bias)  # every input read before any write
        if c.running_mean:
            m = _bn_count(c)
            f = c.factor
            new_mean = (1 - f) * load(c.running_mean) + f * mean
            new_var = (1 - f) * load(c.running_var) + f * var * m / (m - 1)
            store(c.running_mean, new_mean)
            store(c.running_var, new_var)
        if c.saved_mean:
            store(c.saved_mean, mean)
            store(c.saved_inv_var, inv_std)
        store(c.y_ptr, y, c.alpha, c.beta, c.y)
        return
    dy = load(c.y_ptr, c.y)
    if c.saved_mean:
        mean, inv_std = load(c.saved_mean), load(c.saved_inv_var)
    else:
        mean = x.mean(axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + c.epsilon)
    xhat = (x - mean) * inv_std
    dbias = dy.sum(axis=axes, keepdims=True)
    dscale = (dy * xhat).sum(axis=axes, keepdims=True)
    m = _bn_count(c)
    dx = scale * inv_std / m * (m * dy - dbias - xhat * dscale)
    store(c.dx_ptr, dx, c.alpha, c.beta, c.dx)
    store(c.dscale, dscale, c.alpha_param, c.beta_param)
    store(c.dbias, dbias, c.alpha_param, c.beta_param)
