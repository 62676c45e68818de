"""cuDNN (opcodes 606-612): the backend API's descriptors and executions, and the legacy batch
normalization calls of the stand-in (shim/libs/cudnn_api.c), run by the backend in pilotd's context
on the session's streams (backends/cudnn.py on a GPU, backends/sim_dnn.py on the sim).

Descriptors are the session's: pilotd numbers them, and a number of another session is an
unknown descriptor. pilotd keeps what each descriptor was set to (and which descriptor filled
it, for the engine configurations a heuristic query returns), so that when an execution plan is
finalized it knows the plan's tensors: unique id, extent (dimensions, strides, type), virtual or
not. An execution's variant pack must give every non-virtual tensor of the plan a pointer that
lies, with the tensor's whole extent, in the session's memory; the workspace must hold the
plan's workspace size. Pointer-valued attributes outside variant packs are refused (the
stand-in refuses them already), so no device address reaches cuDNN unchecked.
"""

from __future__ import annotations

import functools
import logging
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.backends.dnn import (
    ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
    ATTR_MATMUL_OVERRIDES,
    ATTR_TENSOR_DATA_TYPE,
    ATTR_TENSOR_DIMENSIONS,
    ATTR_TENSOR_IS_BY_VALUE,
    ATTR_TENSOR_IS_VIRTUAL,
    ATTR_TENSOR_RAGGED_OFFSET_DESC,
    ATTR_TENSOR_STRIDES,
    ATTR_TENSOR_UNIQUE_ID,
    ATTR_TENSOR_VECTOR_COUNT,
    BN_BACKWARD,
    BN_BACKWARD_EX,
    BN_FORWARD_INFERENCE,
    BN_FUNCTIONS,
    BN_OPS_BN,
    BN_SIZE_QUERIES,
    DESCRIPTOR_TYPES,
    EXECUTION_PLAN,
    OPERATION_MATMUL,
    OPERATIONS,
    OPERATIONS_BOUNDED,
    STATUS_BAD_PARAM,
    STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
    STATUS_NOT_SUPPORTED,
    STATUS_SUCCESS,
    TENSOR,
    TYPE_BACKEND_DESCRIPTOR,
    TYPE_HANDLE,
    TYPE_INT64,
    TYPE_VOID_PTR,
    VARIANT_PACK,
    BatchNormCall,
    DnnError,
    TensorDesc,
    attribute_size,
    data_type_size,
    tensor_span,
)
from pilot.daemon.backends.libraries import LIB_CUDNN
from pilot.daemon.ops.libraries import library_handle, reported
from pilot.daemon.ops.memory import note_write
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.protocol import lib, new
from pilot.daemon.scheduling.streams import stream_for_work
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("dnn")
log = logging.getLogger("pilot.dnn")

MAX_DESCRIPTORS = 1 << 16  # live cuDNN descriptors one session may hold
MAX_ELEMENTS_BYTES = 1 << 20  # one attribute's values


@dataclass
class DnnDescriptor:
    """A backend descriptor of the session's, and what pilotd knows of it: the attributes the
    program set (descriptor-valued ones as the DnnDescriptors they name) and the descriptor a
    query filled it from. Kept after cudnnBackendDestroyDescriptor while others refer to it
    (its backend object is gone then)."""

    type: int
    obj: Any
    attrs: dict[int, tuple[int, bytes | list[DnnDescriptor]]] = field(default_factory=dict)
    origin: DnnDescriptor | None = None
    finalized: bool = False
    # an execution plan's tensors by unique id (PlanTensor), and its workspace size
    tensors: dict[int, PlanTensor] | None = None
    workspace_size: int = 0
    why_not: str = ""  # why its tensors are not known (executions refused)

    def destroy(self, backend: Any) -> None:
        if self.obj is not None:
            obj, self.obj = self.obj, None
            backend.dnn_desc_destroy(obj)

    def ints(self, attr: int) -> tuple[int, ...] | None:
        got = self.attrs.get(attr)
        if got is None or got[0] != TYPE_INT64 or not isinstance(got[1], bytes):
            return None
        return struct.unpack(f"<{len(got[1]) // 8}q", got[1])

    def scalar(self, attr: int, default: int) -> int:
        got = self.attrs.get(attr)
        if got is None or not isinstance(got[1], bytes) or not got[1]:
            return default
        return int.from_bytes(got[1][:attribute_size(got[0])], "little", signed=True)


@dataclass(frozen=True)
class PlanTensor:
    uid: int
    span: int        # bytes from its address to just past its farthest element
    virtual: bool
    by_value: bool


def _descriptor(s: Session, number: int) -> DnnDescriptor:
    """The session's live descriptor `number` (destroying one takes it out of the session, so
    what is found here is never destroyed)."""
    d = s.dnn_descriptors.get(number)
    if d is None:
        raise DnnError(STATUS_BAD_PARAM, f"no cuDNN descriptor {number:#x}")
    return d


def _status_reply(status: int, value: int = 0) -> Any:
    rep = new("pilot_rep_lib")
    rep.status = status
    rep.value = value
    return rep


def _answered(fn: Any) -> Any:
    """A descriptor call: the library's status is the reply (the program gets it as is)."""

    @functools.wraps(fn)
    def handler(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
        try:
            return fn(vg, s, req, payload)
        except DnnError as exc:
            log.info("session %d: %s: %s", s.id, fn.__name__, exc)
            return _status_reply(exc.status)

    return handler


@OPS.handler(lib.PILOT_OP_DNN_DESC_CREATE, "pilot_req_dnn_attr")
@_answered
def dnn_desc_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    dtype = req.attr
    if dtype not in DESCRIPTOR_TYPES:
        raise DnnError(STATUS_BAD_PARAM, f"descriptor type {dtype}")
    if dtype == VARIANT_PACK:  # the stand-in keeps them; a raw client asking is refused
        raise DnnError(STATUS_NOT_SUPPORTED, "variant packs travel with cudnnBackendExecute")
    if len(s.dnn_descriptors) >= MAX_DESCRIPTORS:
        raise DnnError(STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                       f"more than {MAX_DESCRIPTORS} descriptors")
    obj = vg.backend.dnn_desc_create(dtype)
    number = s.new_handle()
    s.dnn_descriptors[number] = DnnDescriptor(dtype, obj)
    return _status_reply(STATUS_SUCCESS, number)


def _elements(s: Session, req: Any, payload: memoryview) -> tuple[int, bytes | list[Any], Any]:
    """The attribute's elements as the backend takes them, and as pilotd records them."""
    atype, count = req.type, req.count
    size = attribute_size(atype)
    if count < 0 or count * size > MAX_ELEMENTS_BYTES or len(payload) != count * size:
        raise DnnError(STATUS_BAD_PARAM, f"{count} elements of type {atype} in {len(payload)} "
                                         "bytes")
    raw = bytes(payload)
    if atype == TYPE_VOID_PTR:
        raise DnnError(STATUS_NOT_SUPPORTED, "pointer attributes outside a variant pack")
    numbers = struct.unpack(f"<{count}Q", raw) if atype in (TYPE_BACKEND_DESCRIPTOR,
                                                           TYPE_HANDLE) else ()
    if atype == TYPE_BACKEND_DESCRIPTOR:
        descs = [_descriptor(s, n) for n in numbers]
        return count, [d.obj for d in descs], descs
    if atype == TYPE_HANDLE:
        handles = [library_handle(s, n, LIB_CUDNN) for n in numbers]
        return count, [h.obj for h in handles], raw
    return count, raw, raw


@OPS.handler(lib.PILOT_OP_DNN_DESC_SET, "pilot_req_dnn_attr")
@_answered
def dnn_desc_set(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    d = _descriptor(s, req.desc)
    if d.finalized:
        # read-only once finalized, as cuDNN documents; enforced here whatever the library does,
        # since the extents pilotd checks executions against are what it recorded
        raise DnnError(STATUS_BAD_PARAM, "the attributes of a finalized descriptor are read-only")
    try:
        count, value, recorded = _elements(s, req, payload)
    except BackendError as exc:  # a handle of another library or session
        if isinstance(exc, DnnError):
            raise
        raise DnnError(STATUS_BAD_PARAM, str(exc)) from None
    vg.backend.dnn_desc_set(d.obj, req.attr, req.type, count, value)
    d.attrs[req.attr] = (req.type, recorded)
    return _status_reply(STATUS_SUCCESS)


@OPS.handler(lib.PILOT_OP_DNN_DESC_GET, "pilot_req_dnn_attr")
@_answered
def dnn_desc_get(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    d = _descriptor(s, req.desc)
    atype, requested = req.type, req.count
    size = attribute_size(atype)
    if atype in (TYPE_VOID_PTR, TYPE_HANDLE):
        raise DnnError(STATUS_NOT_SUPPORTED, "pointer and handle attributes are not read back")
    if requested < 0 or requested * size > MAX_ELEMENTS_BYTES:
        raise DnnError(STATUS_BAD_PARAM, f"{requested} elements requested")
    targets: list[DnnDescriptor] | None = None
    if atype == TYPE_BACKEND_DESCRIPTOR:
        if len(payload) != requested * 8:
            raise DnnError(STATUS_BAD_PARAM, "descriptor results without their descriptors")
        targets = [_descriptor(s, n) for n in struct.unpack(f"<{requested}Q", bytes(payload))]
        if len({id(t) for t in targets}) != len(targets):
            raise DnnError(STATUS_BAD_PARAM, "repeated result descriptors")
    count, raw = vg.backend.dnn_desc_get(d.obj, req.attr, atype, requested,
                                         [t.obj for t in targets] if targets is not None else None)
    rep = _status_reply(STATUS_SUCCESS, count)
    if targets is not None:
        for t in targets[:count]:  # filled by the library: what it describes comes from `d`
            t.origin, t.finalized = d, True
            t.attrs.clear()
        return rep
    return rep, raw[:requested * size]


@OPS.handler(lib.PILOT_OP_DNN_DESC_FINALIZE, "pilot_req_handle")
@_answered
def dnn_desc_finalize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    d = _descriptor(s, req.handle)
    vg.backend.dnn_desc_finalize(d.obj)
    d.finalized = True
    if d.type == EXECUTION_PLAN:
        _learn_plan(vg, s, d)
    return _status_reply(STATUS_SUCCESS)


@OPS.handler(lib.PILOT_OP_DNN_DESC_DESTROY, "pilot_req_handle")
@_answered
def dnn_desc_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    d = s.dnn_descriptors.pop(req.handle, None)
    if d is None:
        raise DnnError(STATUS_BAD_PARAM, f"no cuDNN descriptor {req.handle:#x}")
    if vg.fast is not None:  # C forgets a plan before its backend object goes
        vg.fast.dnn_plan_gone(s, req.handle)
    d.destroy(vg.backend)
    return _status_reply(STATUS_SUCCESS)


# ---- execution plans: their tensors ----

def reachable(root: DnnDescriptor) -> list[DnnDescriptor]:
    """The descriptors a descriptor refers to, itself included, through the descriptors its
    attributes name and the ones it (or they) were filled from: a plan -> its engine
    configuration -> (the heuristic query it came from, or its engine) -> the operation graph
    -> its operations -> their tensors."""
    seen: set[int] = set()
    found: list[DnnDescriptor] = []
    todo = [root]
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        found.append(d)
        if d.origin is not None:
            todo.append(d.origin)
        for _, value in d.attrs.values():
            if isinstance(value, list):
                todo.extend(value)
    return found


def reachable_tensors(root: DnnDescriptor) -> list[DnnDescriptor]:
    return [d for d in reachable(root) if d.type == TENSOR]


def check_operations(descs: list[DnnDescriptor]) -> None:
    """Refuse a plan whose graph reads addresses or indices from device memory (OPERATIONS
    less OPERATIONS_BOUNDED, matmul overrides, ragged tensors): the tensors' extents pilot
    checks would not bound what its kernels touch."""
    for d in descs:
        if d.type in OPERATIONS and d.type not in OPERATIONS_BOUNDED:
            raise DnnError(STATUS_NOT_SUPPORTED, f"operation type {d.type} reads addresses or "
                                                 "indices from device memory")
        if d.type == OPERATION_MATMUL and ATTR_MATMUL_OVERRIDES & d.attrs.keys():
            raise DnnError(STATUS_NOT_SUPPORTED, "matmul with M/N/K overrides")
        if d.type == TENSOR and ATTR_TENSOR_RAGGED_OFFSET_DESC in d.attrs:
            raise DnnError(STATUS_NOT_SUPPORTED, "ragged tensors")


def plan_tensor(t: DnnDescriptor) -> PlanTensor:
    uid = t.scalar(ATTR_TENSOR_UNIQUE_ID, -1)
    dims, strides = t.ints(ATTR_TENSOR_DIMENSIONS), t.ints(ATTR_TENSOR_STRIDES)
    if dims is None or strides is None or len(dims) != len(strides):
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid}: dimensions or strides not known")
    if any(st < 0 for st in strides):
        raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid}: negative strides")
    elem = data_type_size(t.scalar(ATTR_TENSOR_DATA_TYPE, -1))
    vector = max(1, t.scalar(ATTR_TENSOR_VECTOR_COUNT, 1))
    return PlanTensor(uid, tensor_span(dims, strides, elem * vector),
                      bool(t.scalar(ATTR_TENSOR_IS_VIRTUAL, 0)),
                      bool(t.scalar(ATTR_TENSOR_IS_BY_VALUE, 0)))


def _learn_plan(vg: VGpu, s: Session, plan: DnnDescriptor) -> None:
    """After a plan is finalized: its tensors and workspace size (executions need both)."""
    try:
        tensors: dict[int, PlanTensor] = {}
        descs = reachable(plan)
        check_operations(descs)
        for t in (d for d in descs if d.type == TENSOR):
            pt = plan_tensor(t)
            old = tensors.get(pt.uid)
            if old is None or old.span < pt.span:
                tensors[pt.uid] = pt
        if not tensors:
            raise DnnError(STATUS_NOT_SUPPORTED, "no tensors known (a plan pilotd cannot trace "
                                                 "to its operation graph)")
        _, raw = vg.backend.dnn_desc_get(plan.obj, ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, TYPE_INT64,
                                         1, None)
        plan.workspace_size = struct.unpack("<q", raw[:8])[0]
        plan.tensors = tensors
    except DnnError as exc:
        plan.tensors, plan.why_not = None, str(exc)
        log.warning("session %d: an execution plan pilotd will not run: %s", s.id, exc)


def check_execution(plan: DnnDescriptor, pack: list[tuple[int, int]],
                    workspace: int) -> list[tuple[int, int]]:
    """The (pointer, bytes) ranges an execution of `plan` with this variant pack touches, after
    the checks that need no memory (each range must also be the session's: the caller checks)."""
    if plan.type != EXECUTION_PLAN or not plan.finalized:
        raise DnnError(STATUS_BAD_PARAM, "not a finalized execution plan")
    if plan.tensors is None:
        raise DnnError(STATUS_NOT_SUPPORTED, plan.why_not or "the plan's tensors are not known")
    given: dict[int, int] = {}
    for uid, ptr in pack:
        if uid in given:
            raise DnnError(STATUS_BAD_PARAM, f"tensor {uid} twice in the variant pack")
        given[uid] = ptr
    ranges = []
    for uid, t in plan.tensors.items():
        if t.virtual:
            continue
        if t.by_value:
            raise DnnError(STATUS_NOT_SUPPORTED, f"tensor {uid} is passed by value")
        if uid not in given:
            raise DnnError(STATUS_BAD_PARAM, f"no pointer for tensor {uid} in the variant pack")
        ranges.append((given.pop(uid), t.span))
    if given:
        raise DnnError(STATUS_BAD_PARAM, f"tensors {sorted(given)} are not the plan's (or are "
                                         "virtual)")
    if plan.workspace_size > 0:
        ranges.append((workspace, plan.workspace_size))
    return ranges


@OPS.handler(lib.PILOT_OP_DNN_EXECUTE, "pilot_req_dnn_execute")
@reported
def dnn_execute(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    h = library_handle(s, req.handle, LIB_CUDNN)
    plan = _descriptor(s, req.plan)
    if len(payload) != 16 * req.count:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "a variant pack of the wrong length")
    pack: list[tuple[int, int]] = list(struct.iter_unpack("<qQ", payload))  # (uid, pointer)
    ranges = check_execution(plan, pack, req.workspace)
    for ptr, span in ranges:
        s.check_range(ptr, span)
    stream = stream_for_work(vg, s, req.stream)
    for ptr, span in ranges:  # any of them may be written (outputs, the workspace)
        note_write(vg, s, ptr, span, stream)
    fast = vg.fast
    if fast is not None:  # C may have set the handle's stream since Python did
        vg.backend.library_state_reset(h.obj)
    vg.backend.dnn_execute(h.obj, plan.obj, [u for u, _ in pack], [p for _, p in pack],
                           req.workspace, stream)
    vg.metrics.count("library_calls", (s.tenant, "cudnnBackendExecute"))
    if fast is not None:  # the plan's next executions may run in C
        fast.handle_used(s, req.handle, h)
        fast.dnn_plan(s, req.plan, plan)
        fast.stream_used(s, req.stream)


# ---- batch normalization ----

def _tensor(t: Any) -> TensorDesc | None:
    if t.nbdims == 0:
        return None
    if not 0 < t.nbdims <= lib.PILOT_DNN_DIM_MAX:
        raise DnnError(STATUS_BAD_PARAM, f"a tensor of {t.nbdims} dimensions")
    dims = tuple(t.dims[i] for i in range(t.nbdims))
    strides = tuple(t.strides[i] for i in range(t.nbdims))
    if min(dims) <= 0 or min(strides) <= 0:
        raise DnnError(STATUS_BAD_PARAM, "dimensions and strides must be positive")
    return TensorDesc(t.dtype, dims, strides)


def batchnorm_call(req: Any) -> BatchNormCall:
    if req.fn not in BN_FUNCTIONS:
        raise DnnError(STATUS_BAD_PARAM, f"batch normalization function {req.fn}")
    if req.bn_ops != BN_OPS_BN:
        raise DnnError(STATUS_NOT_SUPPORTED, f"bnOps {req.bn_ops}")
    x, bn = _tensor(req.x), _tensor(req.bn)
    if x is None or (bn is None and req.fn != 7):
        raise DnnError(STATUS_BAD_PARAM, "x and the scale/bias descriptor are required")
    return BatchNormCall(
        fn=req.fn, mode=req.mode, bn_ops=req.bn_ops, x=x, y=_tensor(req.y), dx=_tensor(req.dx),
        bn=bn or x, x_ptr=req.x_ptr, y_ptr=req.y_ptr, dx_ptr=req.dx_ptr, scale=req.scale,
        bias=req.bias, dscale=req.dscale, dbias=req.dbias, running_mean=req.running_mean,
        running_var=req.running_var, saved_mean=req.saved_mean, saved_inv_var=req.saved_inv_var,
        workspace=req.workspace, workspace_size=req.workspace_size, reserve=req.reserve,
        reserve_size=req.reserve_size, factor=req.factor, epsilon=req.epsilon, alpha=req.alpha,
        beta=req.beta, alpha_param=req.alpha_param, beta_param=req.beta_param)


def batchnorm_ranges(call: BatchNormCall) -> list[tuple[int, int, bool]]:
    """(pointer, bytes, written) of every range the call touches; NULL optional ones left out,
    required ones kept (a NULL one then fails the range check)."""
    backward = call.fn in (BN_BACKWARD, BN_BACKWARD_EX)
    inference = call.fn == BN_FORWARD_INFERENCE
    if call.y is None or (backward and call.dx is None):
        raise DnnError(STATUS_BAD_PARAM, "a data descriptor is missing")
    params = call.bn.span()
    out: list[tuple[int, int, bool]] = [(call.x_ptr, call.x.span(), False),
                                        (call.y_ptr, call.y.span(), not backward)]
    if backward:
        assert call.dx is not None
        out += [(call.dx_ptr, call.dx.span(), True), (call.scale, params, False),
                (call.dscale, params, True), (call.dbias, params, True)]
        optional = [(call.bias, False), (call.saved_mean, False), (call.saved_inv_var, False)]
    else:
        out += [(call.scale, params, False), (call.bias, params, False)]
        if inference:
            out += [(call.running_mean, params, False), (call.running_var, params, False)]
            optional = []
        else:
            optional = [(call.running_mean, True), (call.running_var, True),
                        (call.saved_mean, True), (call.saved_inv_var, True)]
    out += [(ptr, params, written) for ptr, written in optional if ptr]
    if call.workspace_size:
        out.append((call.workspace, call.workspace_size, True))
    if call.reserve_size:
        out.append((call.reserve, call.reserve_size, True))
    return out


@OPS.handler(lib.PILOT_OP_DNN_BATCHNORM, "pilot_req_dnn_bn")
def dnn_batchnorm(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """A size query is answered (its status is the program's); a batch normalization is posted
    like a launch, and one that fails fails the session's next synchronizing call."""
    h = library_handle(s, req.handle, LIB_CUDNN)
    if req.fn in BN_SIZE_QUERIES:
        try:
            return _status_reply(STATUS_SUCCESS,
                                 vg.backend.dnn_batchnorm(h.obj, batchnorm_call(req), None))
        except DnnError as exc:
            log.info("session %d: %s: %s", s.id, BN_FUNCTIONS.get(req.fn, req.fn), exc)
            return _status_reply(exc.status)
    try:
        call = batchnorm_call(req)
        ranges = batchnorm_ranges(call)
        for ptr, size, _ in ranges:
            s.check_range(ptr, size)
        stream = stream_for_work(vg, s, req.stream)
        for ptr, size, written in ranges:
            if written:
                note_write(vg, s, ptr, size, stream)
        if vg.fast is not None:  # C may have set the handle's stream: set it again, both
            vg.backend.library_state_reset(h.obj)
            vg.fast.handle_used(s, req.handle, h)
        vg.backend.dnn_batchnorm(h.obj, call, stream)
        if vg.fast is not None:  # the shape's next calls may run in C
            vg.fast.dnn_bn(s, req, call)
    except BackendError as exc:
        log.warning("session %d: %s refused: %s", s.id, BN_FUNCTIONS.get(req.fn, req.fn), exc)
        raise
    vg.metrics.count("library_calls", (s.tenant, call.name))
    return None


