"""daemon/native/fast_library.c through cffi: which cuBLAS GEMMs, cuBLASLt matmuls and memsets it checks
and issues in C (the generic callback standing for the library), and which it leaves to Python
(FAST_PYTHON) or to Python first, to learn from (FAST_LEARN)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pilot.daemon.backends.libraries import TYPE_SIZES
from pilot.daemon.ops.libraries import lt_set_key
from pilot.daemon.protocol import ffi, lib

FAST_PYTHON, FAST_DONE, FAST_LEARN = 0, 1, 2
CONN, SESSION, LEGACY, HANDLE = 7, 42, 0x5000, 0x77
BASE, SIZE = 0x7F0000000000, 1 << 20  # the session's one device allocation
R_32F, R_16BF = 0, 14


class Harness:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bytes, bytes]] = []
        self.fail_with = 0
        noop = ffi.callback("pilot_fast_launch_fn", lambda *a: 0)
        copy = ffi.callback("pilot_fast_copy_fn", lambda *a: 0)
        sync = ffi.callback("pilot_fast_sync_fn", lambda *a: 0)
        self.call_cb = ffi.callback("pilot_fast_call_fn", self._call)
        self.bounds = ffi.new("double[]", [1e-3])
        self.keep: list[Any] = [noop, copy, sync]
        self.f = lib.pilot_fast_new(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, noop, copy, sync,
                                    self.bounds, 1, lib.PILOT_PROTO_VERSION)
        sizes = bytearray(128)
        for dtype, size in TYPE_SIZES.items():
            sizes[dtype] = size
        assert lib.pilot_fast_libraries(self.f, ffi.NULL, 0, bytes(sizes), 128, self.call_cb) == 0
        assert lib.pilot_fast_session(self.f, CONN, SESSION, lib.PILOT_FAST_ALL, LEGACY, 0, 0, 0) == 0
        assert lib.pilot_fast_range(self.f, CONN, BASE, SIZE) == 0

    def _call(self, conn: int, opcode: int, stream: int, req: Any, req_len: int, payload: Any,
              payload_len: int) -> int:
        self.calls.append((opcode, stream, bytes(ffi.buffer(req, req_len)),
                           bytes(ffi.buffer(payload, payload_len)) if payload_len else b""))
        return self.fail_with

    def msg(self, opcode: int, req: Any, payload: bytes | None = None, posted: bool = True) -> Any:
        env = ffi.new("pilot_envelope *")
        env.version, env.opcode, env.session = lib.PILOT_PROTO_VERSION, opcode, SESSION
        env.flags = lib.PILOT_F_NO_REPLY if posted else 0
        m = ffi.new("pilot_srv_msg *")
        m.conn, m.nframes = CONN, 2 if payload is None else 3
        m.frame[0], m.len[0] = ffi.cast("uint8_t *", env), ffi.sizeof("pilot_envelope")
        m.frame[1], m.len[1] = ffi.cast("uint8_t *", req), ffi.sizeof(req[0])
        if payload is not None:
            buf = ffi.new("uint8_t[]", payload)
            m.frame[2], m.len[2] = buf, len(payload)
            self.keep.append(buf)
        self.keep += [env, req, m]
        return m

    def try_(self, m: Any) -> int:
        return lib.pilot_fast_try(self.f, ffi.NULL, m)

    def counts(self) -> Any:
        out = ffi.new("pilot_fast_count[]", 4)
        n = lib.pilot_fast_take(self.f, out, 4)
        return out[0] if n else None


@pytest.fixture
def h() -> Any:
    harness = Harness()
    yield harness
    lib.pilot_fast_free(harness.f)


def gemm(**fields: int) -> Any:
    """A 64x32x16 SGEMM inside the allocation (A at BASE, B after it, C after B)."""
    req = ffi.new("pilot_req_blas_gemm *")
    req.handle, req.fn, req.m, req.n, req.k = HANDLE, 1, 64, 32, 16
    req.lda, req.ldb, req.ldc = 64, 16, 64
    req.a, req.b, req.c = BASE, BASE + 64 * 16 * 4, BASE + 64 * 16 * 4 + 16 * 32 * 4
    req.atype = req.btype = req.ctype = R_32F
    req.batch = 1
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def test_a_gemm_of_an_unknown_handle_goes_to_python_to_learn_it(h: Harness) -> None:
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_LEARN
    assert lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1) == 0
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_DONE
    assert [c[:2] for c in h.calls] == [(lib.PILOT_OP_BLAS_GEMM, LEGACY)]
    n = h.counts()
    assert n.gemms[1] == 1 and n.legacy == 1 and n.synced == 0


@pytest.mark.parametrize("fields", [
    {"c": BASE + SIZE - 100},                 # C runs past the allocation
    {"a": BASE - 4096},                       # A before it
    {"ldc": 32},                              # ldc < m: cuBLAS's own error, Python reports it
    {"m": 0},                                 # empty: Python's no-op
    {"pointer_mode": 1},                      # scalars in device memory
    {"fn": 13},                               # pointer arrays
    {"atype": 99},                            # a type C does not size
    {"workspace_set": 1, "workspace": BASE - 8, "workspace_size": 64},
    {"fn": 5, "batch": 1000, "stride_c": 64 * 32},  # a strided batch past the end
])
def test_what_a_gemm_sends_to_python(h: Harness, fields: dict[str, int]) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1)
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm(**fields))) == FAST_PYTHON
    assert h.calls == []


def test_a_strided_batch_inside_the_allocation_runs_here(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1)
    req = gemm(fn=8, batch=4, stride_a=64 * 16, stride_b=16 * 32, stride_c=64 * 32,
               atype=R_16BF, btype=R_16BF, ctype=R_16BF, c=BASE + SIZE // 2)
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, req)) == FAST_DONE


def test_a_failed_library_call_goes_to_python_and_a_forgotten_handle_is_learnt_again(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1)
    h.fail_with = 7
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_PYTHON
    h.fail_with = 0
    assert lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0, 0) == 0
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_LEARN


def test_a_cublaslt_handle_never_runs_a_gemm(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_PYTHON


def lt(**fields: int) -> Any:
    req = ffi.new("pilot_req_blaslt_matmul *")
    req.handle, req.a, req.b, req.c, req.d = HANDLE, BASE, BASE + 4096, 0, BASE + 8192
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def rec(obj: int, attr: int, value: int) -> bytes:
    """One pilot_lt_attr record of an 8-byte value, as the stand-in writes them."""
    return struct.pack("<HHIQ", obj, attr, 8, value)


LT_DESC, BIAS = 0, 8  # pilot_lt_object; CUBLASLT_MATMUL_DESC_BIAS_POINTER
RECORDS = rec(LT_DESC, 0, 68) + rec(LT_DESC, 1, 0) + rec(1, 2, 64)  # compute, scale type, A rows


def plan(h: Harness, records: bytes = RECORDS, spans: tuple[int, ...] = (4096, 4096, 0, 4096),
         fixed: tuple[int, ...] = (), descs: list[int] | None = None) -> None:
    assert lib.pilot_fast_lt_plan(h.f, CONN, HANDLE, records, len(records),
                                  [1, 2, 3, 4, 5] if descs is None else descs, list(spans),
                                  list(fixed) or ffi.NULL, len(fixed) // 2) == 0


def test_a_matmul_runs_here_once_its_records_are_known(h: Harness) -> None:
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS)) == FAST_LEARN
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS)) == FAST_LEARN
    plan(h)
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS)) == FAST_DONE
    assert h.calls[-1][3] == RECORDS
    # other records (another bias, another shape) are other descriptors: learnt first
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS + rec(1, 3, 64))) == FAST_LEARN
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS + b"!")) == FAST_PYTHON  # malformed
    assert h.counts().lt_matmuls == 1


def test_a_matmul_whose_ranges_are_not_the_sessions_goes_to_python(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    biased = RECORDS + rec(LT_DESC, BIAS, BASE - 64)  # a bias the records name, outside the session
    plan(h, records=blank(biased), fixed=(BIAS, 32))
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), biased)) == FAST_PYTHON
    plan(h)
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(d=BASE + SIZE - 16), RECORDS)) == FAST_PYTHON
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(workspace=BASE + SIZE, workspace_size=256),
                        RECORDS)) == FAST_PYTHON
    plan(h, descs=[0] * 5)  # a set Python keeps (scalars in device memory): no learning loop
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS)) == FAST_PYTHON
    assert h.calls == []


def blank(records: bytes) -> bytes:
    """The set's key as Python gives it to C (ops/libraries.py lt_set_key)."""
    return lt_set_key(records)


def test_a_set_is_the_same_whatever_buffers_its_pointers_name(h: Harness) -> None:
    """Issue 25: under autocast each step's bias is a new copy; the descriptor set is learnt once
    and every call's bias is checked against the session and passed on as the call gives it."""
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    first = RECORDS + rec(LT_DESC, BIAS, BASE + 12288)
    assert lt_set_key(first) == lt_set_key(RECORDS + rec(LT_DESC, BIAS, BASE + 16384)) != first
    plan(h, records=blank(first), fixed=(BIAS, 256))
    for bias in (BASE + 12288, BASE + 16384, BASE + 20480):
        records = RECORDS + rec(LT_DESC, BIAS, bias)
        assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), records)) == FAST_DONE
        assert h.calls[-1][3] == records  # this call's pointer, not the first one's
    # a bias outside the session, or one whose range would end outside it: Python
    outside = RECORDS + rec(LT_DESC, BIAS, BASE - 4096)
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), outside)) == FAST_PYTHON
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(),
                        RECORDS + rec(LT_DESC, BIAS, BASE + SIZE - 128))) == FAST_PYTHON
    # a pointer attribute Python did not size for the set (a scale pointer): Python
    scaled = first + rec(LT_DESC, 17, BASE)
    plan(h, records=blank(scaled), fixed=(BIAS, 256))
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), scaled)) == FAST_PYTHON
    assert h.counts().lt_matmuls == 3


def test_forgetting_a_handle_forgets_its_descriptor_sets(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    plan(h)
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0, 0)
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 0)
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS)) == FAST_LEARN


def memset(ptr: int, count: int, stream: int = 0) -> Any:
    req = ffi.new("pilot_req_memset *")
    req.ptr, req.count, req.stream, req.value = ptr, count, stream, 0x1AB
    return req


def test_memsets_of_the_sessions_memory_run_here(h: Harness) -> None:
    assert h.try_(h.msg(lib.PILOT_OP_MEMSET, memset(BASE + 16, 4096))) == FAST_DONE
    assert h.try_(h.msg(lib.PILOT_OP_MEMSET, memset(BASE + SIZE - 8, 16))) == FAST_PYTHON
    assert h.try_(h.msg(lib.PILOT_OP_MEMSET, memset(BASE, 0))) == FAST_PYTHON
    assert h.try_(h.msg(lib.PILOT_OP_MEMSET, memset(BASE, 64, stream=0x99))) == FAST_PYTHON  # unknown stream
    assert len(h.calls) == 1 and h.counts().memsets == 1


def test_a_session_that_does_not_qualify_sends_everything_to_python(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1)
    lib.pilot_fast_session(h.f, CONN, SESSION, lib.PILOT_FAST_OFF, LEGACY, 0, 0, 0)
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_PYTHON
    assert h.try_(h.msg(lib.PILOT_OP_MEMSET, memset(BASE, 64))) == FAST_PYTHON


def test_a_new_session_on_the_connection_starts_with_no_handles(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, 1)
    lib.pilot_fast_session(h.f, CONN, SESSION + 1, lib.PILOT_FAST_ALL, LEGACY, 0, 0, 0)
    m = h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())
    ffi.cast("pilot_envelope *", m.frame[0]).session = SESSION + 1
    lib.pilot_fast_range(h.f, CONN, BASE, SIZE)
    assert h.try_(m) == FAST_LEARN


PLAN = 0x900
UIDS = (101, 102, 103)


def dnn_exec(pack: list[tuple[int, int]], workspace: int = 0) -> tuple[Any, bytes]:
    req = ffi.new("pilot_req_dnn_execute *")
    req.handle, req.plan, req.workspace, req.count = HANDLE, PLAN, workspace, len(pack)
    return req, b"".join(int(u).to_bytes(8, "little", signed=True) + int(p).to_bytes(8, "little")
                         for u, p in pack)


def dnn_plan(h: Harness, spans: tuple[int, ...] = (4096, 4096, 4096), workspace: int = 0,
             python_only: int = 0) -> None:
    assert lib.pilot_fast_dnn_plan(h.f, CONN, PLAN, 0 if python_only else 0xABC, workspace,
                                   list(UIDS[:len(spans)]) or ffi.NULL, list(spans) or ffi.NULL,
                                   len(spans), python_only) == 0


GOOD = [(101, BASE), (102, BASE + 4096), (103, BASE + 8192)]


def test_an_execution_runs_here_once_handle_and_plan_are_known(h: Harness) -> None:
    req, pack = dnn_exec(GOOD)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, pack)) == FAST_LEARN  # the handle
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, pack)) == FAST_LEARN  # the plan
    dnn_plan(h)
    # the pack in any order, as cuDNN takes it
    req, pack = dnn_exec(list(reversed(GOOD)))
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, pack)) == FAST_DONE
    assert h.calls[-1][0] == lib.PILOT_OP_DNN_EXECUTE and h.calls[-1][3] == pack
    assert h.counts().dnn_executes == 1


@pytest.mark.parametrize("pack", [
    [(101, BASE), (102, BASE + 4096)],                              # a tensor missing
    [(101, BASE), (102, BASE + 4096), (103, BASE + 8192), (104, BASE)],  # one too many
    [(101, BASE), (101, BASE + 4096), (103, BASE + 8192)],          # a tensor named twice
    [(101, BASE), (102, BASE + 4096), (999, BASE + 8192)],          # not the plan's
    [(101, BASE), (102, BASE + 4096), (103, BASE + SIZE - 1024)],   # past the allocation
    [(101, BASE - 4096), (102, BASE + 4096), (103, BASE + 8192)],   # before it
])
def test_what_an_execution_sends_to_python(h: Harness, pack: list[tuple[int, int]]) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    dnn_plan(h)
    req, raw = dnn_exec(pack)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_PYTHON
    assert h.calls == []


def test_the_workspace_and_the_handle_kind_are_checked(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    dnn_plan(h, workspace=1 << 16)
    req, raw = dnn_exec(GOOD, workspace=BASE + SIZE - 1024)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_PYTHON
    req, raw = dnn_exec(GOOD, workspace=BASE + 65536)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_DONE
    # a cuBLAS handle's number never runs an execution, nor a cuDNN one a GEMM
    assert h.try_(h.msg(lib.PILOT_OP_BLAS_GEMM, gemm())) == FAST_PYTHON
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUBLAS)
    req, raw = dnn_exec(GOOD, workspace=BASE + 65536)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_PYTHON


def test_a_plan_python_keeps_or_forgot_is_not_run_here(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    dnn_plan(h, spans=(), python_only=1)
    req, raw = dnn_exec(GOOD)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_PYTHON  # no learning loop
    dnn_plan(h)
    assert lib.pilot_fast_dnn_plan(h.f, CONN, PLAN, 0, 0, ffi.NULL, ffi.NULL, 0, 0) == 0  # destroyed
    assert h.try_(h.msg(lib.PILOT_OP_DNN_EXECUTE, req, raw)) == FAST_LEARN


def bn(fn: int = 1, **fields: int) -> Any:
    """A batch normalization of a 2x4x8x8 float tensor, every range inside the allocation."""
    req = ffi.new("pilot_req_dnn_bn *")
    req.handle, req.fn, req.mode, req.bn_ops = HANDLE, fn, 1, 0
    for t, dims in ((req.x, (2, 4, 8, 8)), (req.y, (2, 4, 8, 8)), (req.dx, (2, 4, 8, 8)),
                    (req.bn, (1, 4, 1, 1))):
        t.dtype, t.nbdims = 0, 4
        t.dims = list(dims)
        t.strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
    req.x_ptr, req.y_ptr, req.dx_ptr = BASE, BASE + 4096, BASE + 8192
    req.scale, req.bias, req.dscale, req.dbias = (BASE + 16384 + 64 * i for i in range(4))
    for k, v in fields.items():
        setattr(req, k, v)
    return req


BN_SPANS = [2048, 2048, 2048, 16]


def test_a_batch_normalization_of_a_known_shape_runs_here(h: Harness) -> None:
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn())) == FAST_LEARN  # the handle
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn())) == FAST_LEARN  # the shape
    assert lib.pilot_fast_dnn_bn(h.f, CONN, bn(), BN_SPANS) == 0
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn(x_ptr=BASE + 100))) == FAST_DONE
    assert lib.pilot_fast_dnn_bn(h.f, CONN, bn(4), BN_SPANS) == 0
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn(4))) == FAST_DONE
    n = h.counts()
    assert list(n.dnn_bn) == [1, 1]
    # another shape (another batch size) is learnt first
    other = bn()
    other.x.dims[0] = 3
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, other)) == FAST_LEARN


@pytest.mark.parametrize("fn, fields", [
    (1, {"y_ptr": BASE + SIZE - 100}),              # y past the allocation
    (1, {"bias": 0}),                               # a required parameter missing
    (1, {"running_mean": BASE - 64}),               # an optional one, given, outside
    (1, {"workspace": BASE + SIZE, "workspace_size": 64}),
    (4, {"dx_ptr": BASE - 4096}),
    (4, {"dbias": 0}),
    (4, {"saved_mean": BASE + SIZE}),
    (2, {}),                                        # the non-Ex functions stay with Python
])
def test_what_a_batch_normalization_sends_to_python(h: Harness, fn: int, fields: dict[str, int]) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    lib.pilot_fast_dnn_bn(h.f, CONN, bn(1), BN_SPANS)
    lib.pilot_fast_dnn_bn(h.f, CONN, bn(4), BN_SPANS)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn(fn, **fields))) == FAST_PYTHON
    assert h.calls == []


def test_a_size_query_is_never_answered_here(h: Harness) -> None:
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    lib.pilot_fast_dnn_bn(h.f, CONN, bn(1), BN_SPANS)
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, bn(1), posted=False)) == FAST_PYTHON


def test_ever_new_descriptor_sets_and_shapes_do_not_grow_what_c_keeps(h: Harness) -> None:
    """A client sending new cuBLASLt records or batch normalization shapes without end: C keeps
    at most 2048 descriptor sets and 256 shapes per session and starts afresh (Python teaches
    again what is used)."""
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUBLAS)
    for i in range(2100):
        plan(h, records=RECORDS + rec(1, 3, i))
    # the last ones are kept, the first were dropped with the table
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS + rec(1, 3, 2099))) == FAST_DONE
    assert h.try_(h.msg(lib.PILOT_OP_BLASLT_MATMUL, lt(), RECORDS + rec(1, 3, 0))) == FAST_LEARN
    lib.pilot_fast_library_handle(h.f, CONN, HANDLE, 0x1234, lib.PILOT_FAST_CUDNN)
    for n in range(1, 301):
        shape = bn()
        shape.x.dims[0] = n
        assert lib.pilot_fast_dnn_bn(h.f, CONN, shape, BN_SPANS) == 0
    first = bn()
    first.x.dims[0] = 1
    assert h.try_(h.msg(lib.PILOT_OP_DNN_BATCHNORM, first)) == FAST_LEARN
