"""pilotd's side of the CUDA math libraries (daemon/ops/libraries.py, backends/sim_blas.py): the
descriptor records, the checks every library call gets, and the sim's GEMMs."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from pilot.daemon.backends.base import BackendError
from pilot.daemon.backends.libraries import (
    STATUS_INVALID_VALUE,
    STATUS_NOT_SUPPORTED,
    GemmCall,
    LibraryError,
    LtCall,
    matrix_span,
)
from pilot.daemon.backends.sim_blas import gemm as sim_gemm
from pilot.daemon.backends.sim_blas import lt_matmul as sim_lt_matmul
from pilot.daemon.ops.libraries import check_gemm, check_lt, gemm_call, parse_records

F32, F64, BF16 = 0, 1, 14


class Memory:
    """A session's allocations (check_range as Session's) over real bytes (the sim's regions)."""

    def __init__(self, *sizes: int) -> None:
        self.blocks: dict[int, bytearray] = {}
        self.checked: list[tuple[int, int]] = []
        base = 0x10000
        for size in sizes:
            self.blocks[base] = bytearray(size)
            base += (size + 0xFFFF) & ~0xFFFF

    @property
    def bases(self) -> list[int]:
        return list(self.blocks)

    def check_range(self, ptr: int, count: int) -> None:
        self.checked.append((ptr, count))
        for base, block in self.blocks.items():
            if base <= ptr and ptr + count <= base + len(block):
                return
        raise BackendError(1, f"[{ptr:#x}, +{count}) is not memory of this session")

    def region(self, ptr: int, count: int) -> memoryview:
        for base, block in self.blocks.items():
            if base <= ptr and ptr + count <= base + len(block):
                return memoryview(block)[ptr - base:ptr - base + count]
        raise BackendError(1, "outside")


def record(obj: int, attr: int, value: bytes) -> bytes:
    return struct.pack("<HHI", obj, attr, len(value)) + value + bytes(-len(value) % 8)


def i32(v: int) -> bytes:
    return struct.pack("<i", v)


def i64(v: int) -> bytes:
    return struct.pack("<q", v)


def layout(obj: int, dtype: int, rows: int, cols: int, ld: int) -> bytes:
    return (record(obj, 0, i32(dtype)) + record(obj, 2, i64(rows)) + record(obj, 3, i64(cols))
            + record(obj, 4, i64(ld)))


def matmul_records(m: int, n: int, k: int, *extra: bytes) -> bytes:
    return (record(0, 0, i32(68)) + record(0, 1, i32(F32)) + layout(1, F32, m, k, m)
            + layout(2, F32, k, n, k) + layout(3, F32, m, n, m) + layout(4, F32, m, n, m)
            + b"".join(extra))


# ---- records ----

def test_records_parse_into_attribute_maps() -> None:
    attrs = parse_records(memoryview(matmul_records(4, 5, 6, record(0, 3, i32(1)))))
    assert attrs[0][3] == i32(1) and attrs[2][2] == i64(6) and attrs[4][3] == i64(5)


@pytest.mark.parametrize(("data", "status"), [
    (matmul_records(4, 5, 6)[:-3], STATUS_INVALID_VALUE),                # truncated
    (matmul_records(4, 5, 6, record(0, 38, i64(0))), STATUS_NOT_SUPPORTED),  # emulation desc
    (matmul_records(4, 5, 6, record(9, 0, i32(0))), STATUS_INVALID_VALUE),  # no such object
    (matmul_records(4, 5, 6)[16:], STATUS_INVALID_VALUE),               # compute type missing
    (matmul_records(4, 5, 6, struct.pack("<HHI", 0, 3, 99) + bytes(104)), STATUS_INVALID_VALUE),
])
def test_bad_records_are_refused(data: bytes, status: int) -> None:
    with pytest.raises(LibraryError) as err:
        parse_records(memoryview(data))
    assert err.value.status == status


# ---- the checks ----

def gemm_request(**over: int) -> SimpleNamespace:
    req = dict(fn=1, transa=0, transb=0, m=8, n=6, k=4, a=0, b=0, c=0, lda=8, ldb=4, ldc=8,
               atype=F32, btype=F32, ctype=F32, compute_type=68, algo=-1, pointer_mode=0,
               alpha_ptr=0, beta_ptr=0, alpha=struct.pack("<f", 1.0) + bytes(12),
               beta=bytes(16), batch=1, stride_a=0, stride_b=0, stride_c=0)
    req.update(over)
    return SimpleNamespace(**req)


def test_gemm_checks_each_matrix_from_its_dimensions() -> None:
    mem = Memory(4096, 4096, 4096)
    a, b, c = mem.bases
    call = gemm_call(gemm_request(a=a, b=b, c=c, transa=1, lda=5, m=8, k=4, fn=5, batch=3,
                                  stride_a=64, stride_b=32, stride_c=100))
    check_gemm(mem, call, SimpleNamespace(workspace_set=False, workspace_size=0, pointer_mode=0))
    # op(A) is 8x4 from a stored 4x8 (lda 5); three matrices each, strides in elements
    assert mem.checked == [(a, matrix_span(4, 8, 5, 4, 3, 64)), (b, matrix_span(4, 6, 4, 4, 3, 32)),
                           (c, matrix_span(8, 6, 8, 4, 3, 100))]
    assert matrix_span(4, 8, 5, 4, 3, 64) == (7 * 5 + 4 + 2 * 64) * 4


def test_gemm_past_an_allocation_or_on_a_workspace_of_nobody_is_refused() -> None:
    mem = Memory(8 * 6 * 4, 4096)
    c, ab = mem.bases
    with pytest.raises(BackendError):
        check_gemm(mem, gemm_call(gemm_request(a=ab, b=ab, c=c, ldc=9)),
                   SimpleNamespace(workspace_set=False, workspace_size=0, pointer_mode=0))
    with pytest.raises(BackendError):
        check_gemm(mem, gemm_call(gemm_request(a=ab, b=ab, c=c)),
                   SimpleNamespace(workspace_set=True, workspace=0x999000, workspace_size=4096,
                                   pointer_mode=0))


@pytest.mark.parametrize("over", [dict(fn=99), dict(lda=2), dict(fn=5, batch=2, stride_a=-1),
                                  dict(transa=5), dict(pointer_mode=3)])
def test_gemm_arguments_cublas_refuses(over: dict[str, int]) -> None:
    with pytest.raises(LibraryError) as err:
        gemm_call(gemm_request(**over))
    assert err.value.status == STATUS_INVALID_VALUE


def lt(records: bytes, **pointers: int) -> LtCall:
    return LtCall(attrs=parse_records(memoryview(records)), alpha=struct.pack("<f", 1.0),
                  beta=struct.pack("<f", 0.0), **pointers)


def test_lt_checks_bias_and_refuses_what_it_cannot_size() -> None:
    mem = Memory(4096, 4096, 4096, 16)
    a, b, d, bias = mem.bases
    epi_bias = record(0, 7, i32(4)) + record(0, 8, i64(bias))
    check_lt(mem, lt(matmul_records(4, 5, 6, epi_bias), a=a, b=b, c=d, d=d))
    assert (bias, 16) in mem.checked  # 4 rows of D, float
    too_long = record(0, 7, i32(4)) + record(0, 8, i64(bias + 4))
    with pytest.raises(BackendError):
        check_lt(mem, lt(matmul_records(4, 5, 6, too_long), a=a, b=b, c=d, d=d))
    for refused in (record(0, 7, i32(2 | 128)),                     # RELU_AUX: an aux output
                    record(0, 17, i64(a)) + record(0, 31, i32(2)),  # block-scaled A
                    record(0, 2, i32(2)),                           # alpha as a device vector
                    record(1, 8, i32(1))):                          # pointer-array batches
        with pytest.raises(LibraryError) as err:
            check_lt(mem, lt(matmul_records(4, 5, 6, refused), a=a, b=b, c=d, d=d))
        assert err.value.status == STATUS_NOT_SUPPORTED


# ---- the sim's GEMMs ----

def col_major(x: np.ndarray) -> bytes:
    return b"".join(np.asarray(m).flatten(order="F").tobytes() for m in x)


def test_sim_gemm_matches_numpy_with_transposes_and_batches() -> None:
    rng = np.random.default_rng(1)
    m, n, k, batch = 5, 3, 4, 2
    a = rng.standard_normal((batch, k, m)).astype(np.float32)  # stored k x m; op(A) = A^T
    b = rng.standard_normal((batch, n, k)).astype(np.float32)  # stored n x k; op(B) = B^T
    c = rng.standard_normal((batch, m, n)).astype(np.float32)
    mem = Memory(a.nbytes, b.nbytes, c.nbytes)
    pa, pb, pc = mem.bases
    for ptr, x in ((pa, a), (pb, b), (pc, c)):
        mem.region(ptr, x.nbytes)[:] = col_major(x)
    call = GemmCall(fn=5, transa=1, transb=1, m=m, n=n, k=k, a=pa, lda=k, atype=F32, b=pb, ldb=n,
                    btype=F32, c=pc, ldc=m, ctype=F32, compute_type=68, algo=-1,
                    alpha=struct.pack("<f", 2.0), beta=struct.pack("<f", 0.5), batch=batch,
                    stride_a=m * k, stride_b=k * n, stride_c=m * n)
    sim_gemm(mem.region, call, 0)
    got = np.frombuffer(bytes(mem.region(pc, c.nbytes)), np.float32).reshape(batch, n, m)
    for i in range(batch):
        ref = 2.0 * a[i].T @ b[i].T + 0.5 * c[i]
        np.testing.assert_allclose(got[i].T, ref, rtol=1e-5, atol=1e-5)


def bf16(x: np.ndarray) -> bytes:
    """Exact for the small integers used here."""
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def test_sim_lt_matmul_bias_relu_in_bf16() -> None:
    m, n, k = 4, 3, 2
    a = np.arange(m * k, dtype=np.float32) - 3  # col-major m x k
    b = np.ones(k * n, dtype=np.float32)
    bias = np.array([0.5, -10, 1, 2], dtype=np.float32)
    mem = Memory(a.nbytes, b.nbytes, m * n * 2, bias.nbytes)
    pa, pb, pd, pbias = mem.bases
    mem.region(pa, a.size * 2)[:] = bf16(a)
    mem.region(pb, b.size * 2)[:] = bf16(b)
    mem.region(pbias, bias.nbytes)[:] = bias.tobytes()
    records = (record(0, 0, i32(68)) + record(0, 1, i32(F32)) + layout(1, BF16, m, k, m)
               + layout(2, BF16, k, n, k) + layout(3, BF16, m, n, m) + layout(4, BF16, m, n, m)
               + record(0, 7, i32(6)) + record(0, 8, i64(pbias)) + record(0, 26, i32(F32)))
    sim_lt_matmul(mem.region, lt(records, a=pa, b=pb, c=pd, d=pd))
    raw = np.frombuffer(bytes(mem.region(pd, m * n * 2)), np.uint16).astype(np.uint32) << 16
    got = raw.view(np.float32).reshape(n, m).T
    ref = np.maximum(a.reshape(k, m).T @ b.reshape(n, k).T + bias[:, None], 0)
    np.testing.assert_allclose(got, ref, rtol=1e-2)


# ---- the generic path (shim/tables/cublas_calls.tsv, cublas_families.tsv, backends/blas_calls.py) ----

def test_every_family_of_the_tables_has_ranges_and_an_emulation() -> None:
    from pilot.daemon.backends import blas_calls

    table = blas_calls.load_table()
    assert {fn.family for fn in table.values()} == set(blas_calls.FAMILIES)
    for fn in table.values():
        assert len(fn.params) == len(fn.kinds), fn.name
        assert {"S": 4, "D": 8}[fn.type] == fn.elem


@pytest.mark.parametrize(("over", "bad"), [
    ({}, 0), ({"trans": 7}, 1), ({"m": -1}, 2), ({"lda": 3}, 6), ({"incx": 0}, 8),
    ({"incy": 0}, 11), ({"trans": 1, "lda": 9, "m": 9}, 0)])
def test_the_c_checks_read_the_same_in_pilotd(over: dict[str, int], bad: int) -> None:
    """pilotd evaluates the families table's C expressions itself (the client is not trusted)."""
    from pilot.daemon.backends import blas_calls

    fn = blas_calls.load_table()["cublasSgemv_v2"]
    args = dict(trans=0, m=4, n=5, alpha=0, A=0, lda=4, x=0, incx=1, beta=0, y=0, incy=1)
    args.update(over)
    if not bad:
        blas_calls.check(fn, args)
        return
    with pytest.raises(LibraryError, match=f"argument {bad}$"):
        blas_calls.check(fn, args)


def test_ranges_of_a_strided_level_1_call_and_a_transposed_geam() -> None:
    from pilot.daemon.backends import blas_calls

    axpy = blas_calls.FAMILIES["axpy"].ranges(dict(n=10, incx=-3, incy=2), 4)
    assert axpy == [("x", (1 + 9 * 3) * 4, False), ("y", (1 + 9 * 2) * 4, True)]
    geam = blas_calls.FAMILIES["geam"].ranges(dict(transa=1, transb=0, m=3, n=5, lda=6, ldb=3,
                                                   ldc=4), 8)
    assert geam == [("A", matrix_span(5, 3, 6, 8), False), ("B", matrix_span(3, 5, 3, 8), False),
                    ("C", matrix_span(3, 5, 4, 8), True)]


def test_a_handle_number_is_only_good_in_its_session_and_for_its_library() -> None:
    """Handle numbers are the session's: another session's number, or a cuBLASLt handle given
    to cuBLAS, is an unknown handle; a cuBLAS handle serves cuBLASLt (the documented cast)."""
    from pilot.daemon.backends.libraries import LIB_CUBLAS, LIB_CUBLASLT
    from pilot.daemon.ops.libraries import LibraryHandle, library_handle

    mine = SimpleNamespace(libraries={7: LibraryHandle(LIB_CUBLAS, "blas"),
                                      8: LibraryHandle(LIB_CUBLASLT, "lt")})
    other = SimpleNamespace(libraries={})
    assert library_handle(mine, 7, LIB_CUBLAS).obj == "blas"
    assert library_handle(mine, 7, LIB_CUBLASLT, LIB_CUBLAS).obj == "blas"
    for session, number, libraries in ((other, 7, (LIB_CUBLAS,)), (mine, 8, (LIB_CUBLAS,)),
                                       (mine, 9, (LIB_CUBLASLT, LIB_CUBLAS))):
        with pytest.raises(BackendError, match="handle"):
            library_handle(session, number, *libraries)
