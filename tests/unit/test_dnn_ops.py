"""pilotd's checks of cuDNN executions (daemon/ops/dnn.py): which tensors a finalized plan has,
traced through the descriptors the program set and the ones a heuristic query filled, and what a
variant pack must give them; batch normalization's ranges."""

from __future__ import annotations

import struct

import pytest

from pilot.daemon.backends import dnn
from pilot.daemon.backends.dnn import BatchNormCall, DnnError, TensorDesc
from pilot.daemon.ops.dnn import (
    DnnDescriptor,
    batchnorm_ranges,
    check_execution,
    plan_tensor,
    reachable_tensors,
)


def tensor(uid: int, dims: tuple[int, ...], strides: tuple[int, ...] | None = None,
           dtype: int = dnn.DATA_FLOAT, virtual: bool = False, by_value: bool = False,
           vector: int = 1) -> DnnDescriptor:
    if strides is None:
        strides, step = [], 1
        for d in reversed(dims):
            strides.insert(0, step)
            step *= d
    t = DnnDescriptor(dnn.TENSOR, object(), finalized=True)
    q = struct.pack
    t.attrs = {dnn.ATTR_TENSOR_UNIQUE_ID: (dnn.TYPE_INT64, q("<q", uid)),
               dnn.ATTR_TENSOR_DIMENSIONS: (dnn.TYPE_INT64, q(f"<{len(dims)}q", *dims)),
               dnn.ATTR_TENSOR_STRIDES: (dnn.TYPE_INT64, q(f"<{len(dims)}q", *strides)),
               dnn.ATTR_TENSOR_DATA_TYPE: (dnn.TYPE_DATA_TYPE, q("<i", dtype)),
               dnn.ATTR_TENSOR_IS_VIRTUAL: (dnn.TYPE_BOOLEAN, bytes([virtual])),
               dnn.ATTR_TENSOR_IS_BY_VALUE: (dnn.TYPE_BOOLEAN, bytes([by_value])),
               dnn.ATTR_TENSOR_VECTOR_COUNT: (dnn.TYPE_INT64, q("<q", vector))}
    return t


def desc(dtype: int, **links: list[DnnDescriptor]) -> DnnDescriptor:
    d = DnnDescriptor(dtype, object(), finalized=True)
    for i, (_, value) in enumerate(sorted(links.items())):
        d.attrs[1000 + i] = (dnn.TYPE_BACKEND_DESCRIPTOR, value)
    return d


def plan_from_heuristics(*tensors: DnnDescriptor, workspace: int = 0) -> DnnDescriptor:
    """A plan as frameworks make one: its engine configuration was filled by a heuristic query
    over the operation graph (pilotd saw only the query's attributes)."""
    op = desc(dnn.OPERATION_CONVOLUTION_FORWARD, tensors=list(tensors))
    graph = desc(dnn.OPERATIONGRAPH, ops=[op])
    heur = desc(dnn.ENGINEHEUR, graph=[graph])
    config = DnnDescriptor(dnn.ENGINECFG, object(), origin=heur, finalized=True)
    plan = desc(dnn.EXECUTION_PLAN, config=[config])
    plan.tensors = {}
    for t in reachable_tensors(plan):
        pt = plan_tensor(t)
        plan.tensors[pt.uid] = pt
    plan.workspace_size = workspace
    return plan


def test_a_plan_knows_its_tensors_through_the_heuristic_query() -> None:
    x, w, y = tensor(1, (2, 4, 9, 9)), tensor(2, (6, 4, 3, 3)), tensor(3, (2, 6, 5, 5))
    plan = plan_from_heuristics(x, w, y)
    assert plan.tensors is not None
    assert {uid: t.span for uid, t in plan.tensors.items()} == {
        1: 2 * 4 * 81 * 4, 2: 6 * 4 * 9 * 4, 3: 2 * 6 * 25 * 4}


def test_extents_follow_strides_types_and_vectors() -> None:
    # NHWC strides of a [2, 3, 4, 5] half tensor: the farthest element is the last one
    assert plan_tensor(tensor(1, (2, 3, 4, 5), (60, 1, 15, 3), dnn.DATA_HALF)).span == 120 * 2
    # a padded row pitch counts up to the last element, not past the padding
    assert plan_tensor(tensor(1, (1, 1, 2, 3), (16, 16, 8, 1))).span == (8 + 2 + 1) * 4
    assert plan_tensor(tensor(1, (1, 8, 1, 1), vector=4)).span == 8 * 16
    with pytest.raises(DnnError) as exc:
        plan_tensor(tensor(1, (1, 2), (-1, 1)))
    assert exc.value.status == dnn.STATUS_NOT_SUPPORTED


def test_every_real_tensor_needs_a_pointer_and_nothing_else_may_come() -> None:
    x, w, y = tensor(1, (1, 1, 4, 4)), tensor(2, (1, 1, 3, 3)), tensor(3, (1, 1, 2, 2))
    t = tensor(9, (1, 1, 2, 2), virtual=True)
    plan = plan_from_heuristics(x, w, y, t, workspace=256)
    ranges = check_execution(plan, [(1, 0x1000), (2, 0x2000), (3, 0x3000)], 0x4000)
    assert sorted(ranges) == [(0x1000, 64), (0x2000, 36), (0x3000, 16), (0x4000, 256)]
    for pack, why in (([(1, 0x1000), (2, 0x2000)], "no pointer for tensor 3"),
                      ([(1, 1), (2, 2), (3, 3), (7, 4)], "[7] are not the plan's"),
                      ([(1, 1), (2, 2), (3, 3), (9, 4)], "[9] are not the plan's"),
                      ([(1, 1), (1, 2), (2, 2), (3, 3)], "tensor 1 twice")):
        with pytest.raises(DnnError) as exc:
            check_execution(plan, pack, 0x4000)
        assert exc.value.status == dnn.STATUS_BAD_PARAM and why in str(exc.value), exc.value


def test_by_value_tensors_and_untraced_plans_are_refused() -> None:
    plan = plan_from_heuristics(tensor(1, (1, 1, 1, 1), by_value=True), tensor(2, (1, 1, 2, 2)))
    with pytest.raises(DnnError) as exc:
        check_execution(plan, [(1, 1), (2, 2)], 0)
    assert exc.value.status == dnn.STATUS_NOT_SUPPORTED
    untraced = DnnDescriptor(dnn.EXECUTION_PLAN, object(), finalized=True, why_not="no tensors")
    with pytest.raises(DnnError, match="no tensors"):
        check_execution(untraced, [], 0)
    with pytest.raises(DnnError):  # a tensor descriptor is not a plan
        check_execution(tensor(1, (1,)), [], 0)


def test_batchnorm_ranges_cover_what_cudnn_reads_and_writes() -> None:
    x = TensorDesc(dnn.DATA_FLOAT, (2, 3, 4, 4), (48, 16, 4, 1))
    bn = TensorDesc(dnn.DATA_FLOAT, (1, 3, 1, 1), (3, 1, 1, 1))
    fwd = BatchNormCall(fn=dnn.BN_FORWARD_TRAINING_EX, mode=dnn.BN_SPATIAL, bn_ops=0, x=x, y=x,
                        dx=None, bn=bn, x_ptr=0x100, y_ptr=0x200, scale=0x300, bias=0x400,
                        running_mean=0x500, workspace=0x600, workspace_size=64)
    assert batchnorm_ranges(fwd) == [(0x100, 384, False), (0x200, 384, True), (0x300, 12, False),
                                     (0x400, 12, False), (0x500, 12, True), (0x600, 64, True)]
    bwd = BatchNormCall(fn=dnn.BN_BACKWARD_EX, mode=dnn.BN_SPATIAL, bn_ops=0, x=x, y=x, dx=x,
                        bn=bn, x_ptr=1, y_ptr=2, dx_ptr=3, scale=4, dscale=5, dbias=6,
                        saved_mean=7, saved_inv_var=8)
    assert [(p, w) for p, _, w in batchnorm_ranges(bwd)] == [
        (1, False), (2, False), (3, True), (4, False), (5, True), (6, True), (7, False),
        (8, False)]
    inference = BatchNormCall(fn=dnn.BN_FORWARD_INFERENCE, mode=dnn.BN_SPATIAL, bn_ops=0, x=x,
                              y=x, dx=None, bn=bn)  # NULL mean and variance stay: refused later
    assert (0, 12, False) in batchnorm_ranges(inference)


def test_a_finalized_descriptor_is_read_only_whatever_the_library_says() -> None:
    """The extents executions are checked against are what pilotd recorded: a tensor changed
    after its graph was built would let a kernel write past what was checked. So pilotd refuses
    the change itself, before the library sees it."""
    from types import SimpleNamespace

    from pilot.daemon.ops.dnn import dnn_desc_set
    from pilot.daemon.protocol import ffi

    calls: list[tuple] = []
    backend = SimpleNamespace(dnn_desc_set=lambda *a: calls.append(a))
    t = tensor(1, (1, 1, 4, 4))
    session = SimpleNamespace(id=1, dnn_descriptors={7: t})
    req = ffi.new("pilot_req_dnn_attr *", {"desc": 7, "attr": dnn.ATTR_TENSOR_DIMENSIONS,
                                           "type": dnn.TYPE_INT64, "count": 4})[0]
    rep = dnn_desc_set(SimpleNamespace(backend=backend), session, req,
                       memoryview(struct.pack("<4q", 1, 1, 1, 1)))
    assert rep.status == dnn.STATUS_BAD_PARAM and calls == []
    assert plan_tensor(t).span == 64  # as recorded at finalize
    t.finalized = False  # before finalize, the same call reaches the library
    rep = dnn_desc_set(SimpleNamespace(backend=backend), session, req,
                       memoryview(struct.pack("<4q", 1, 1, 1, 1)))
    assert rep.status == 0 and len(calls) == 1



def test_graphs_that_read_addresses_from_device_memory_are_refused() -> None:
    """Their kernels touch what tensor extents do not bound: resampling's backward indexes by a
    tensor of indices, the paged cache load follows page tables, ragged tensors have offsets."""
    from pilot.daemon.ops.dnn import check_operations, reachable

    def graph_of(op_type: int, *tensors: DnnDescriptor) -> DnnDescriptor:
        op = desc(op_type, tensors=list(tensors))
        return desc(dnn.EXECUTION_PLAN, config=[desc(dnn.ENGINECFG, graph=[
            desc(dnn.OPERATIONGRAPH, ops=[op])])])

    x, y = tensor(1, (1, 1, 4, 4)), tensor(2, (1, 1, 4, 4))
    for fine in (dnn.OPERATION_CONVOLUTION_FORWARD, dnn.OPERATION_POINTWISE, dnn.OPERATION_MATMUL):
        check_operations(reachable(graph_of(fine, x, y)))
    for refused in (25, 26, 35, 41, 42):  # resample fwd/bwd, paged cache load, SDPA, MoE matmul
        with pytest.raises(DnnError) as exc:
            check_operations(reachable(graph_of(refused, x, y)))
        assert exc.value.status == dnn.STATUS_NOT_SUPPORTED
    overridden = desc(dnn.OPERATION_MATMUL, tensors=[x, y])
    overridden.attrs[1525] = (dnn.TYPE_BACKEND_DESCRIPTOR, [tensor(3, (1,))])
    with pytest.raises(DnnError, match="overrides"):
        check_operations(reachable(overridden))
    ragged = tensor(4, (2, 8))
    ragged.attrs[dnn.ATTR_TENSOR_RAGGED_OFFSET_DESC] = (dnn.TYPE_BACKEND_DESCRIPTOR, [tensor(5, (3,))])
    with pytest.raises(DnnError, match="ragged"):
        check_operations(reachable(graph_of(dnn.OPERATION_POINTWISE, ragged, y)))
