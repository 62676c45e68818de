"""cuDNN on the sim backend (backends/sim_dnn.py through SimBackend): backend API descriptors built
the way a framework builds them, the convolutions they run against a direct nested-sum
reference, the checks and refusals, and legacy batch normalization against numpy."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest

from pilot.daemon.backends import dnn
from pilot.daemon.backends.dnn import BatchNormCall, DnnError, TensorDesc
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry

FWD, BWD_DATA, BWD_FILTER = (dnn.OPERATION_CONVOLUTION_FORWARD,
                             dnn.OPERATION_CONVOLUTION_BACKWARD_DATA,
                             dnn.OPERATION_CONVOLUTION_BACKWARD_FILTER)
ROLES = {FWD: (704, 703, 705, 702, 700, 701), BWD_DATA: (710, 709, 711, 708, 706, 707),
         BWD_FILTER: (716, 715, 717, 714, 712, 713)}  # x, w, y, conv desc, alpha, beta
NP_TYPES = {dnn.DATA_FLOAT: np.float32, dnn.DATA_DOUBLE: np.float64, dnn.DATA_HALF: np.float16}
DESC, I64 = dnn.TYPE_BACKEND_DESCRIPTOR, dnn.TYPE_INT64


@pytest.fixture()
def sim() -> SimBackend:
    return SimBackend(KernelRegistry(), total_mem=64 << 20)


def refused(code: int, fn, *args) -> None:
    with pytest.raises(DnnError) as exc:
        fn(*args)
    assert exc.value.status == code, exc.value


def put(sim: SimBackend, d: object, attr: int, atype: int, fmt: str, *values: object) -> None:
    sim.dnn_desc_set(d, attr, atype, len(values), struct.pack(f"<{len(values)}{fmt}", *values))


def refs(sim: SimBackend, d: object, attr: int, *objs: object) -> None:
    sim.dnn_desc_set(d, attr, DESC, len(objs), list(objs))


def packed(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(np.prod(dims[i + 1:])) for i in range(len(dims)))


def tensor(sim: SimBackend, uid: int, dims: tuple[int, ...], strides: tuple[int, ...] | None = None,
           dtype: int = dnn.DATA_FLOAT, finalize: bool = True, virtual: bool = False) -> object:
    t = sim.dnn_desc_create(dnn.TENSOR)
    put(sim, t, dnn.ATTR_TENSOR_DATA_TYPE, dnn.TYPE_DATA_TYPE, "i", dtype)
    put(sim, t, dnn.ATTR_TENSOR_DIMENSIONS, I64, "q", *dims)
    put(sim, t, dnn.ATTR_TENSOR_STRIDES, I64, "q", *(strides or packed(dims)))
    put(sim, t, dnn.ATTR_TENSOR_UNIQUE_ID, I64, "q", uid)
    put(sim, t, dnn.ATTR_TENSOR_BYTE_ALIGNMENT, I64, "q", 16)
    if virtual:
        put(sim, t, dnn.ATTR_TENSOR_IS_VIRTUAL, dnn.TYPE_BOOLEAN, "?", True)
    if finalize:
        sim.dnn_desc_finalize(t)
    return t


def conv_desc(sim: SimBackend, pad=(0, 0), stride=(1, 1), dil=(1, 1), post=None,
              mode: int = dnn.MODE_CROSS_CORRELATION, comp: int = dnn.DATA_FLOAT) -> object:
    c = sim.dnn_desc_create(dnn.CONVOLUTION)
    put(sim, c, dnn.ATTR_CONVOLUTION_COMP_TYPE, dnn.TYPE_DATA_TYPE, "i", comp)
    put(sim, c, dnn.ATTR_CONVOLUTION_CONV_MODE, 7, "i", mode)
    put(sim, c, dnn.ATTR_CONVOLUTION_SPATIAL_DIMS, I64, "q", 2)
    for attr, vals in ((dnn.ATTR_CONVOLUTION_DILATIONS, dil),
                       (dnn.ATTR_CONVOLUTION_FILTER_STRIDES, stride),
                       (dnn.ATTR_CONVOLUTION_PRE_PADDINGS, pad),
                       (dnn.ATTR_CONVOLUTION_POST_PADDINGS, post or pad)):
        put(sim, c, attr, I64, "q", *vals)
    sim.dnn_desc_finalize(c)
    return c


def conv_op(sim: SimBackend, kind: int, x: object, w: object, y: object, conv: object,
            alpha: float = 1.0, beta: float = 0.0) -> object:
    op = sim.dnn_desc_create(kind)
    rx, rw, ry, rc, ra, rb = ROLES[kind]
    for attr, d in ((rx, x), (rw, w), (ry, y), (rc, conv)):
        refs(sim, op, attr, d)
    put(sim, op, ra, dnn.TYPE_FLOAT, "f", alpha)
    put(sim, op, rb, dnn.TYPE_DOUBLE, "d", beta)
    sim.dnn_desc_finalize(op)
    return op


def graph(sim: SimBackend, handle: object, *ops: object) -> object:
    g = sim.dnn_desc_create(dnn.OPERATIONGRAPH)
    refs(sim, g, dnn.ATTR_OPERATIONGRAPH_OPS, *ops)
    sim.dnn_desc_set(g, dnn.ATTR_OPERATIONGRAPH_HANDLE, dnn.TYPE_HANDLE, 1, [handle])
    sim.dnn_desc_finalize(g)
    return g


def plan_for(sim: SimBackend, handle: object, g: object) -> object:
    """Heuristics -> engine config -> plan, as cudnn-frontend does it."""
    heur = sim.dnn_desc_create(dnn.ENGINEHEUR)
    refs(sim, heur, dnn.ATTR_ENGINEHEUR_OPERATION_GRAPH, g)
    put(sim, heur, dnn.ATTR_ENGINEHEUR_MODE, 8, "i", 0)
    sim.dnn_desc_finalize(heur)
    assert sim.dnn_desc_get(heur, dnn.ATTR_ENGINEHEUR_RESULTS, DESC, 0, None) == (1, b"")
    cfg = sim.dnn_desc_create(dnn.ENGINECFG)
    assert sim.dnn_desc_get(heur, dnn.ATTR_ENGINEHEUR_RESULTS, DESC, 1, [cfg]) == (1, b"")
    assert sim.dnn_desc_get(cfg, dnn.ATTR_ENGINECFG_KNOB_CHOICES, DESC, 4, []) == (0, b"")
    engine = sim.dnn_desc_create(dnn.ENGINE)
    sim.dnn_desc_get(cfg, dnn.ATTR_ENGINECFG_ENGINE, DESC, 1, [engine])
    assert sim.dnn_desc_get(engine, dnn.ATTR_ENGINE_GLOBAL_INDEX, I64, 1, None) == (1, bytes(8))
    assert sim.dnn_desc_get(engine, dnn.ATTR_ENGINE_NUMERICAL_NOTE, 11, 8, None) == (0, b"")
    plan = sim.dnn_desc_create(dnn.EXECUTION_PLAN)
    sim.dnn_desc_set(plan, dnn.ATTR_EXECUTION_PLAN_HANDLE, dnn.TYPE_HANDLE, 1, [handle])
    refs(sim, plan, dnn.ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg)
    sim.dnn_desc_finalize(plan)
    ws = struct.pack("<q", 0)
    assert sim.dnn_desc_get(plan, dnn.ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, I64, 1, None) == (1, ws)
    return plan


def upload(sim: SimBackend, a: np.ndarray) -> int:
    ptr = sim.mem_alloc(max(a.nbytes, 1))
    sim.memcpy_htod(ptr, a.tobytes(), a.nbytes, None)
    return ptr


def download(sim: SimBackend, ptr: int, shape, dtype=np.float32, strides=None) -> np.ndarray:
    """A tensor from device memory (strides in elements, packed if None)."""
    strides = strides or packed(shape)
    count = sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1
    buf = bytearray(count * np.dtype(dtype).itemsize)
    sim.memcpy_dtoh(buf, ptr, len(buf), None)
    flat = np.frombuffer(bytes(buf), dtype=dtype)
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape, [s * item for s in strides]).copy()


def reference(x, w, dy, stride, pad, dil, groups, flip):
    """y, dx and dw of a grouped convolution, straight from the definition (one tap at a time)."""
    n_, _, h_, w_ = x.shape
    k_, cg, r_, s_ = w.shape
    p_, q_ = dy.shape[2:]
    y, dx, dw = np.zeros(dy.shape), np.zeros(x.shape), np.zeros(w.shape)
    for n, k, p, q, c, r, s in itertools.product(range(n_), range(k_), range(p_), range(q_),
                                                 range(cg), range(r_), range(s_)):
        ci = k // (k_ // groups) * cg + c
        h, v = p * stride[0] - pad[0] + r * dil[0], q * stride[1] - pad[1] + s * dil[1]
        if 0 <= h < h_ and 0 <= v < w_:
            rr, ss = (r_ - 1 - r, s_ - 1 - s) if flip else (r, s)
            y[n, k, p, q] += x[n, ci, h, v] * w[k, c, rr, ss]
            dx[n, ci, h, v] += dy[n, k, p, q] * w[k, c, rr, ss]
            dw[k, c, rr, ss] += dy[n, k, p, q] * x[n, ci, h, v]
    return y, dx, dw


def run_conv(sim, kind, xs, ws, ys, *, pad=(0, 0), stride=(1, 1), dil=(1, 1),
             mode=dnn.MODE_CROSS_CORRELATION, dtype=dnn.DATA_FLOAT, alpha=1.0, beta=0.0,
             data=None, x_strides=None, stream=None, seed=0):
    """Run one convolution operation; returns (inputs as float64, the written tensor)."""
    rng = np.random.default_rng(seed)
    t = NP_TYPES[dtype]
    arrays = data or {k: rng.standard_normal(s).astype(t) for k, s in
                      (("x", xs), ("w", ws), ("y", ys))}
    handle = sim.dnn_create()
    host_x = arrays["x"]
    if x_strides is not None:  # lay x out with these strides in device memory
        span = sum((d - 1) * s for d, s in zip(xs, x_strides, strict=True)) + 1
        flat = np.zeros(span, t)
        np.lib.stride_tricks.as_strided(flat, xs, [s * flat.itemsize for s in x_strides])[...] = host_x
        host_x = flat
    ptrs = {"x": upload(sim, host_x), "w": upload(sim, arrays["w"]), "y": upload(sim, arrays["y"])}
    descs = {"x": tensor(sim, 1, xs, x_strides, dtype), "w": tensor(sim, 2, ws, dtype=dtype),
             "y": tensor(sim, 3, ys, dtype=dtype)}
    comp = dnn.DATA_DOUBLE if dtype == dnn.DATA_DOUBLE else dnn.DATA_FLOAT
    conv = conv_desc(sim, pad, stride, dil, mode=mode, comp=comp)
    op = conv_op(sim, kind, descs["x"], descs["w"], descs["y"], conv, alpha, beta)
    g = graph(sim, handle, op)
    assert sim.dnn_desc_get(g, dnn.ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, I64, 1, None) == (
        1, struct.pack("<q", 1))
    plan = plan_for(sim, handle, g)
    sim.dnn_execute(handle, plan, [3, 1, 2], [ptrs["y"], ptrs["x"], ptrs["w"]], 0, stream)
    out = {FWD: "y", BWD_DATA: "x", BWD_FILTER: "w"}[kind]
    shape = {"x": xs, "w": ws, "y": ys}[out]
    got = download(sim, ptrs[out], shape, t, x_strides if out == "x" else None)
    return {k: v.astype(np.float64) for k, v in arrays.items()}, got.astype(np.float64)


CASES = [  # x, w, y shapes, pad, stride, dilation, groups
    ((2, 4, 5, 5), (3, 4, 3, 3), (2, 3, 5, 5), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 6, 5), (4, 2, 2, 3), (2, 4, 3, 3), (0, 1), (2, 2), (1, 1), 2),
    ((1, 2, 7, 7), (2, 2, 3, 3), (1, 2, 3, 3), (0, 0), (1, 1), (2, 2), 1),
    ((1, 4, 6, 6), (4, 1, 3, 3), (1, 4, 3, 3), (1, 1), (2, 2), (1, 1), 4),  # depthwise
]


@pytest.mark.parametrize("kind", [FWD, BWD_DATA, BWD_FILTER])
@pytest.mark.parametrize("case", CASES)
def test_convolutions_match_the_definition(sim: SimBackend, kind: int, case) -> None:
    xs, ws, ys, pad, stride, dil, groups = case
    arrays, got = run_conv(sim, kind, xs, ws, ys, pad=pad, stride=stride, dil=dil)
    y, dx, dw = reference(arrays["x"], arrays["w"], arrays["y"], stride, pad, dil, groups, False)
    want = {FWD: y, BWD_DATA: dx, BWD_FILTER: dw}[kind]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [FWD, BWD_DATA, BWD_FILTER])
def test_convolution_mode_flips_the_filter_and_alpha_beta_blend(sim: SimBackend, kind: int) -> None:
    xs, ws, ys = (1, 2, 5, 4), (3, 2, 2, 3), (1, 3, 6, 4)
    arrays, got = run_conv(sim, kind, xs, ws, ys, pad=(1, 1), mode=dnn.MODE_CONVOLUTION,
                           alpha=0.5, beta=2.0, seed=3)
    y, dx, dw = reference(arrays["x"], arrays["w"], arrays["y"], (1, 1), (1, 1), (1, 1), 1, True)
    old = arrays[{FWD: "y", BWD_DATA: "x", BWD_FILTER: "w"}[kind]]
    want = 0.5 * {FWD: y, BWD_DATA: dx, BWD_FILTER: dw}[kind] + 2.0 * old
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_beta_zero_does_not_read_the_output(sim: SimBackend) -> None:
    xs, ws, ys = (1, 1, 3, 3), (1, 1, 1, 1), (1, 1, 3, 3)
    data = {"x": np.ones(xs, np.float32), "w": np.full(ws, 2, np.float32),
            "y": np.full(ys, np.nan, np.float32)}
    _, got = run_conv(sim, FWD, xs, ws, ys, data=data)
    assert (got == 2).all()


def test_nhwc_image_half_precision_on_a_stream(sim: SimBackend) -> None:
    xs, ws, ys = (2, 3, 4, 4), (4, 3, 3, 3), (2, 4, 4, 4)
    nhwc = (48, 1, 12, 3)
    stream = sim.stream_create(0, 0)
    arrays, got = run_conv(sim, FWD, xs, ws, ys, pad=(1, 1), dtype=dnn.DATA_HALF,
                           x_strides=nhwc, stream=stream)
    y, _, _ = reference(arrays["x"], arrays["w"], arrays["y"], (1, 1), (1, 1), (1, 1), 1, False)
    np.testing.assert_allclose(got, y, rtol=1e-2, atol=2e-2)
    arrays, got = run_conv(sim, BWD_DATA, xs, ws, ys, pad=(1, 1), dtype=dnn.DATA_DOUBLE,
                           x_strides=nhwc)
    _, dx, _ = reference(arrays["x"], arrays["w"], arrays["y"], (1, 1), (1, 1), (1, 1), 1, False)
    np.testing.assert_allclose(got, dx, rtol=1e-12)


def test_descriptor_rules(sim: SimBackend) -> None:
    t = tensor(sim, 1, (1, 2, 3, 3), finalize=False)
    # the statuses are cuDNN 9.24's (tests/unit/test_cudnn_real.py probes the real library)
    refused(dnn.STATUS_NOT_INITIALIZED, sim.dnn_desc_get, t, dnn.ATTR_TENSOR_DIMENSIONS,
            I64, 4, None)
    refused(dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE, put, sim, t, dnn.ATTR_TENSOR_DIMENSIONS,
            dnn.TYPE_INT32, "i", 1)
    sim.dnn_desc_finalize(t)
    count, raw = sim.dnn_desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, I64, 2, None)
    assert (count, struct.unpack("<2q", raw)) == (2, (1, 2))  # the count of those returned
    assert sim.dnn_desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, I64, 0, None) == (4, b"")  # a query
    assert sim.dnn_desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, I64, 8, None)[0] == 4
    assert sim.dnn_desc_get(t, dnn.ATTR_TENSOR_IS_VIRTUAL, dnn.TYPE_BOOLEAN, 1, None) == (1, b"\0")
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_desc_get, t, dnn.ATTR_TENSOR_UNIQUE_ID, I64, 2, None)
    refused(dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE, sim.dnn_desc_get, t, dnn.ATTR_TENSOR_UNIQUE_ID,
            dnn.TYPE_INT32, 1, None)
    refused(dnn.STATUS_NOT_SUPPORTED, sim.dnn_desc_get, t, dnn.ATTR_TENSOR_BYTE_ALIGNMENT, I64, 1,
            None)
    refused(dnn.STATUS_BAD_PARAM, put, sim, t, dnn.ATTR_TENSOR_UNIQUE_ID, I64, "q", 9)  # finalized
    missing = sim.dnn_desc_create(dnn.TENSOR)
    put(sim, missing, dnn.ATTR_TENSOR_DATA_TYPE, dnn.TYPE_DATA_TYPE, "i", dnn.DATA_FLOAT)
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_desc_finalize, missing)
    for attr, vals in ((dnn.ATTR_TENSOR_DIMENSIONS, (1, 8)), (dnn.ATTR_TENSOR_STRIDES, (8, 1)),
                       (dnn.ATTR_TENSOR_UNIQUE_ID, (5,)), (dnn.ATTR_TENSOR_BYTE_ALIGNMENT, (16,)),
                       (dnn.ATTR_TENSOR_VECTOR_COUNT, (4,))):
        put(sim, missing, attr, I64, "q", *vals)
    refused(dnn.STATUS_NOT_SUPPORTED, sim.dnn_desc_finalize, missing)  # vectorized
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_desc_create, 51)
    refused(dnn.STATUS_NOT_SUPPORTED, sim.dnn_desc_finalize,
            sim.dnn_desc_create(dnn.OPERATION_POINTWISE))
    vp = sim.dnn_desc_create(dnn.VARIANT_PACK)
    put(sim, vp, dnn.ATTR_VARIANT_PACK_UNIQUE_IDS, I64, "q", 1, 2)
    put(sim, vp, dnn.ATTR_VARIANT_PACK_DATA_POINTERS, dnn.TYPE_VOID_PTR, "Q", 0x1000, 0x2000)
    put(sim, vp, dnn.ATTR_VARIANT_PACK_WORKSPACE, dnn.TYPE_VOID_PTR, "Q", 0)
    sim.dnn_desc_finalize(vp)
    assert sim.dnn_version() == (91900, 13000)


def test_shape_checks_and_refusals_at_finalize(sim: SimBackend) -> None:
    x, w, y = tensor(sim, 1, (1, 2, 5, 5)), tensor(sim, 2, (3, 2, 3, 3)), tensor(sim, 3, (1, 3, 3, 3))
    refused(dnn.STATUS_BAD_PARAM, conv_op, sim, FWD, x, w, tensor(sim, 3, (1, 3, 5, 5)),
            conv_desc(sim))
    refused(dnn.STATUS_BAD_PARAM, conv_op, sim, FWD, tensor(sim, 1, (1, 3, 5, 5)), w, y,
            conv_desc(sim))  # one channel short of a whole group
    refused(dnn.STATUS_NOT_SUPPORTED, conv_op, sim, FWD, x, w, tensor(sim, 3, (1, 3, 4, 4)),
            conv_desc(sim, (1, 1), post=(0, 0)))  # asymmetric padding
    bf16 = [tensor(sim, i + 1, s, dtype=dnn.DATA_BFLOAT16)
            for i, s in enumerate(((1, 2, 5, 5), (3, 2, 3, 3), (1, 3, 3, 3)))]
    refused(dnn.STATUS_NOT_SUPPORTED_DATA_TYPE, conv_op, sim, FWD, *bf16, conv_desc(sim))
    op = sim.dnn_desc_create(FWD)
    for attr, d in ((dnn.ATTR_CONV_FWD_X, x), (dnn.ATTR_CONV_FWD_W, w), (dnn.ATTR_CONV_FWD_Y, y),
                    (dnn.ATTR_CONV_FWD_CONV_DESC, conv_desc(sim))):
        refs(sim, op, attr, d)
    put(sim, op, dnn.ATTR_CONV_FWD_ALPHA, dnn.TYPE_FLOAT, "f", 1.0)
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_desc_finalize, op)  # beta is required


def test_engines_of_graphs(sim: SimBackend) -> None:
    handle = sim.dnn_create()
    x, w, y = tensor(sim, 1, (1, 2, 5, 5)), tensor(sim, 2, (3, 2, 3, 3)), tensor(sim, 3, (1, 3, 3, 3))
    g = graph(sim, handle, conv_op(sim, FWD, x, w, y, conv_desc(sim)))
    engine = sim.dnn_desc_create(dnn.ENGINE)
    refs(sim, engine, dnn.ATTR_ENGINE_OPERATION_GRAPH, g)
    put(sim, engine, dnn.ATTR_ENGINE_GLOBAL_INDEX, I64, "q", 1)
    refused(dnn.STATUS_NOT_SUPPORTED, sim.dnn_desc_finalize, engine)
    virtual_y = tensor(sim, 3, (1, 3, 3, 3), virtual=True)  # a fused graph's intermediate
    fused = graph(sim, handle, conv_op(sim, FWD, x, w, virtual_y, conv_desc(sim)))
    count = sim.dnn_desc_get(fused, dnn.ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, I64, 1, None)
    assert count == (1, bytes(8))
    heur = sim.dnn_desc_create(dnn.ENGINEHEUR)
    refs(sim, heur, dnn.ATTR_ENGINEHEUR_OPERATION_GRAPH, fused)
    put(sim, heur, dnn.ATTR_ENGINEHEUR_MODE, 8, "i", 0)
    refused(dnn.STATUS_NOT_SUPPORTED_GRAPH_PATTERN, sim.dnn_desc_finalize, heur)
    json = dnn.ATTR_EXECUTION_PLAN_JSON_REPRESENTATION
    refused(dnn.STATUS_NOT_INITIALIZED, sim.dnn_desc_get,
            sim.dnn_desc_create(dnn.EXECUTION_PLAN), json, 24, 100, None)
    plan = plan_for(sim, handle, g)
    refused(dnn.STATUS_NOT_SUPPORTED, sim.dnn_desc_get, plan, json, 24, 100, None)
    ptr = sim.mem_alloc(4096)
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_execute, handle, plan, [1, 3], [ptr, ptr + 1024], 0,
            None)  # no pointer for w
    pointers = [ptr, ptr + 1024, ptr + 2048]
    sim.dnn_execute(handle, plan, [1, 2, 3], pointers, 0, None)
    sim.dnn_release(handle)
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_execute, handle, plan, [1, 2, 3], pointers, 0, None)


def test_plans_and_graphs_without_the_deprecated_handles(sim: SimBackend) -> None:
    """cuDNN 9 deprecates the handle attributes of graphs and plans: PyTorch 2.14's frontend
    sets none on its plans, so both finalize without one; a handle that is set must be live."""
    handle = sim.dnn_create()
    x, w, y = tensor(sim, 1, (1, 2, 5, 5)), tensor(sim, 2, (3, 2, 3, 3)), tensor(sim, 3, (1, 3, 3, 3))
    g = sim.dnn_desc_create(dnn.OPERATIONGRAPH)
    refs(sim, g, dnn.ATTR_OPERATIONGRAPH_OPS, conv_op(sim, FWD, x, w, y, conv_desc(sim)))
    sim.dnn_desc_finalize(g)
    engines = sim.dnn_desc_get(g, dnn.ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, I64, 1, None)
    assert engines == (1, struct.pack("<q", 1))
    plan = plan_for(sim, handle, g)  # this one sets its handle
    assert plan is not None
    heur = sim.dnn_desc_create(dnn.ENGINEHEUR)
    refs(sim, heur, dnn.ATTR_ENGINEHEUR_OPERATION_GRAPH, g)
    put(sim, heur, dnn.ATTR_ENGINEHEUR_MODE, 8, "i", 0)
    sim.dnn_desc_finalize(heur)
    config = sim.dnn_desc_create(dnn.ENGINECFG)
    sim.dnn_desc_get(heur, dnn.ATTR_ENGINEHEUR_RESULTS, DESC, 1, [config])
    bare = sim.dnn_desc_create(dnn.EXECUTION_PLAN)
    refs(sim, bare, dnn.ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config)
    sim.dnn_desc_finalize(bare)
    ptr = sim.mem_alloc(4096)
    sim.dnn_execute(handle, bare, [1, 2, 3], [ptr, ptr + 1024, ptr + 2048], 0, None)
    gone = sim.dnn_create()
    sim.dnn_release(gone)
    refused(dnn.STATUS_BAD_PARAM, sim.dnn_desc_set, sim.dnn_desc_create(dnn.EXECUTION_PLAN),
            dnn.ATTR_EXECUTION_PLAN_HANDLE, dnn.TYPE_HANDLE, 1, [gone])


# ---- batch normalization ----

def bn_setup(sim, mode, shape=(3, 2, 4, 5), seed=1):
    """Float data and parameters in device memory: (host arrays, pointers, x desc, param desc)."""
    rng = np.random.default_rng(seed)
    pshape = (1, shape[1], 1, 1) if mode != dnn.BN_PER_ACTIVATION else (1, *shape[1:])
    host = {"x": rng.standard_normal(shape) * 2 + 1, "y": rng.standard_normal(shape),
            "dx": rng.standard_normal(shape),
            **{k: rng.uniform(0.5, 1.5, pshape) for k in
               ("scale", "bias", "rmean", "rvar", "smean", "sinv", "dscale", "dbias")}}
    host = {k: v.astype(np.float32) for k, v in host.items()}
    ptrs = {k: upload(sim, v) for k, v in host.items()}
    return (host, ptrs, TensorDesc(dnn.DATA_FLOAT, shape, packed(shape)),
            TensorDesc(dnn.DATA_FLOAT, pshape, packed(pshape)))


@pytest.mark.parametrize("mode", [dnn.BN_SPATIAL, dnn.BN_PER_ACTIVATION, dnn.BN_SPATIAL_PERSISTENT])
def test_batchnorm_training_inference_backward(sim: SimBackend, mode: int) -> None:
    h = sim.dnn_create()
    host, ptrs, xd, bd = bn_setup(sim, mode)
    pshape = bd.dims
    assert sim.dnn_batchnorm(h, BatchNormCall(dnn.BN_SIZE_RESERVE, mode, 0, xd, xd, None, bd), None) == 0
    x = host["x"].astype(np.float64)
    ax = (0,) if mode == dnn.BN_PER_ACTIVATION else (0, 2, 3)
    m = x.size // int(np.prod(pshape))
    mean, var = x.mean(ax, keepdims=True), x.var(ax, keepdims=True)
    inv = 1 / np.sqrt(var + 1e-5)
    sc, bi = host["scale"].astype(np.float64), host["bias"].astype(np.float64)
    call = BatchNormCall(dnn.BN_FORWARD_TRAINING, mode, 0, xd, xd, None, bd, x_ptr=ptrs["x"],
                         y_ptr=ptrs["y"], scale=ptrs["scale"], bias=ptrs["bias"],
                         running_mean=ptrs["rmean"], running_var=ptrs["rvar"],
                         saved_mean=ptrs["smean"], saved_inv_var=ptrs["sinv"], factor=0.1,
                         epsilon=1e-5, alpha=1.0, beta=0.5)
    assert sim.dnn_batchnorm(h, call, None) == 0
    y = sc * (x - mean) * inv + bi + 0.5 * host["y"]
    np.testing.assert_allclose(download(sim, ptrs["y"], x.shape), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(download(sim, ptrs["rmean"], pshape), 0.9 * host["rmean"] + 0.1 * mean,
                               rtol=1e-5)
    np.testing.assert_allclose(download(sim, ptrs["rvar"], pshape),
                               0.9 * host["rvar"] + 0.1 * var * m / (m - 1), rtol=1e-5)
    np.testing.assert_allclose(download(sim, ptrs["smean"], pshape), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(download(sim, ptrs["sinv"], pshape), inv, rtol=1e-5)

    rmean, rvar = download(sim, ptrs["rmean"], pshape), download(sim, ptrs["rvar"], pshape)
    inference = BatchNormCall(dnn.BN_FORWARD_INFERENCE, mode, 0, xd, xd, None, bd, x_ptr=ptrs["x"],
                              y_ptr=ptrs["y"], scale=ptrs["scale"], bias=ptrs["bias"],
                              running_mean=ptrs["rmean"], running_var=ptrs["rvar"], epsilon=1e-3)
    sim.dnn_batchnorm(h, inference, None)
    want = sc * (x - rmean) / np.sqrt(rvar.astype(np.float64) + 1e-3) + bi
    np.testing.assert_allclose(download(sim, ptrs["y"], x.shape), want, rtol=1e-5, atol=1e-5)

    dy = download(sim, ptrs["y"], x.shape).astype(np.float64)  # any gradient will do
    dx_old = host["dx"].astype(np.float64)
    xhat = (x - mean) * inv
    dbias, dscale = dy.sum(ax, keepdims=True), (dy * xhat).sum(ax, keepdims=True)
    dx = sc * inv / m * (m * dy - dbias - xhat * dscale)
    for saved in (True, False):
        for k in ("dscale", "dbias", "dx"):  # the blends' prior values again
            sim.memcpy_htod(ptrs[k], host[k].tobytes(), host[k].nbytes, None)
        back = BatchNormCall(dnn.BN_BACKWARD, mode, 0, xd, xd, xd, bd, x_ptr=ptrs["x"],
                             y_ptr=ptrs["y"], dx_ptr=ptrs["dx"], scale=ptrs["scale"],
                             dscale=ptrs["dscale"], dbias=ptrs["dbias"],
                             saved_mean=ptrs["smean"] if saved else 0,
                             saved_inv_var=ptrs["sinv"] if saved else 0, epsilon=1e-5,
                             alpha=2.0, beta=1.0, alpha_param=1.0, beta_param=1.0)
        sim.dnn_batchnorm(h, back, None)
        np.testing.assert_allclose(download(sim, ptrs["dx"], x.shape), 2 * dx + dx_old,
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(download(sim, ptrs["dscale"], pshape), dscale + host["dscale"],
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(download(sim, ptrs["dbias"], pshape), dbias + host["dbias"],
                                   rtol=1e-4, atol=1e-4)


def test_batchnorm_refusals(sim: SimBackend) -> None:
    h = sim.dnn_create()
    _, ptrs, xd, bd = bn_setup(sim, dnn.BN_SPATIAL)
    base = BatchNormCall(dnn.BN_FORWARD_TRAINING_EX, dnn.BN_SPATIAL, 0, xd, xd, None, bd,
                         x_ptr=ptrs["x"], y_ptr=ptrs["y"], scale=ptrs["scale"], bias=ptrs["bias"],
                         epsilon=1e-5)
    sim.dnn_batchnorm(h, base, None)  # no running or saved statistics: skipped
    bad = [(dict(bn_ops=1), dnn.STATUS_NOT_SUPPORTED),  # BN + activation
           (dict(mode=7), dnn.STATUS_BAD_PARAM),
           (dict(bias=0), dnn.STATUS_BAD_PARAM),
           (dict(running_mean=ptrs["rmean"]), dnn.STATUS_BAD_PARAM),  # without running_var
           (dict(bn=TensorDesc(dnn.DATA_DOUBLE, bd.dims, bd.strides)), dnn.STATUS_BAD_PARAM),
           (dict(bn=TensorDesc(dnn.DATA_FLOAT, (1, 2, 4, 5), packed((1, 2, 4, 5)))),
            dnn.STATUS_BAD_PARAM),
           (dict(x=TensorDesc(dnn.DATA_INT8, xd.dims, xd.strides)), dnn.STATUS_NOT_SUPPORTED_DATA_TYPE)]
    for change, code in bad:
        refused(code, sim.dnn_batchnorm, h, BatchNormCall(**{**base.__dict__, **change}), None)
