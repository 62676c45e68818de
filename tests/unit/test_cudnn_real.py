"""daemon/backends/cudnn.py against NVIDIA's real libcudnn.so.9, for what needs no GPU: the
backend API's descriptors (set, finalize, get, count queries, descriptors read into descriptors)
and variant packs, so the ctypes marshaling pilotd relies on is checked against the library
itself and not only against tests/unit/fakes/fake_cudnn.c. The same descriptor rules run against
the sim (backends/sim_dnn.py), so it answers as the library does: found so on cuDNN 9.24
(2026-11-27), where the sim had been kinder (a descriptor not finalized, the wrong attribute
type, two elements of a one-element attribute, the count of elements returned). The real
library is skipped where it is not installed (CI; PyTorch's nvidia-cudnn-cu13 package provides
it, found as pilotd finds it)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pilot.daemon.backends import dnn
from pilot.daemon.backends.cudnn import CudaDnn
from pilot.daemon.backends.dnn import DnnError
from pilot.daemon.backends.libraries import LibraryError
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry

CONVOLUTION, CONV_FORWARD = 1, dnn.OPERATION_CONVOLUTION_FORWARD
TYPE_DATA_TYPE, TYPE_BOOLEAN, TYPE_INT64, TYPE_FLOAT, TYPE_DOUBLE, TYPE_CONV_MODE = 1, 2, 3, 4, 5, 7
TYPE_INT32 = 23
TYPE_DESC = dnn.TYPE_BACKEND_DESCRIPTOR
CROSS_CORRELATION = 1
ATTR_CONV = {"comp": 100, "mode": 101, "dilations": 102, "strides": 103, "post": 104, "pre": 105,
             "dims": 106}
ATTR_FWD = {"alpha": 700, "beta": 701, "conv": 702, "w": 703, "x": 704, "y": 705}


class SimDnn:
    """The sim backend's descriptor calls under CudaDnn's names."""

    def __init__(self) -> None:
        self.sim = SimBackend(KernelRegistry(), total_mem=64 << 20)
        self.desc_create, self.desc_set = self.sim.dnn_desc_create, self.sim.dnn_desc_set
        self.desc_get, self.desc_finalize = self.sim.dnn_desc_get, self.sim.dnn_desc_finalize
        self.desc_destroy = self.sim.dnn_desc_destroy


@pytest.fixture(scope="module")
def cudnn() -> CudaDnn:
    lib = CudaDnn()
    try:
        version, _cudart = lib.version()
    except (DnnError, LibraryError, OSError) as exc:
        pytest.skip(f"no libcudnn.so.9 here: {exc}")
    assert version >= 90000
    return lib


@pytest.fixture(params=["cudnn", "sim"])
def lib(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("cudnn") if request.param == "cudnn" else SimDnn()


def refused(status: int, fn: Any, *args: Any) -> None:
    with pytest.raises(DnnError) as err:
        fn(*args)
    assert err.value.status == status, err.value


def i64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def tensor(c: Any, uid: int, dims: tuple[int, ...], virtual: bool = False,
           finalize: bool = True) -> Any:
    strides, n = [], 1
    for d in reversed(dims):
        strides.insert(0, n)
        n *= d
    t = c.desc_create(dnn.TENSOR)
    c.desc_set(t, dnn.ATTR_TENSOR_DATA_TYPE, TYPE_DATA_TYPE, 1, struct.pack("<i", dnn.DATA_FLOAT))
    c.desc_set(t, dnn.ATTR_TENSOR_DIMENSIONS, TYPE_INT64, len(dims), i64(*dims))
    c.desc_set(t, dnn.ATTR_TENSOR_STRIDES, TYPE_INT64, len(dims), i64(*strides))
    c.desc_set(t, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 1, i64(uid))
    c.desc_set(t, dnn.ATTR_TENSOR_BYTE_ALIGNMENT, TYPE_INT64, 1, i64(16))
    c.desc_set(t, dnn.ATTR_TENSOR_IS_VIRTUAL, TYPE_BOOLEAN, 1, bytes([virtual]))
    if finalize:
        c.desc_finalize(t)
    return t


def test_a_tensor_reads_back_what_was_set(lib: Any) -> None:
    t = tensor(lib, 7, (2, 3, 5, 4))
    try:
        count, _ = lib.desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, TYPE_INT64, 0, None)
        assert count == 4  # no array: the library answers how many elements there are
        count, raw = lib.desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, TYPE_INT64, 8, None)
        assert count == 4 and struct.unpack("<4q", raw) == (2, 3, 5, 4)
        count, raw = lib.desc_get(t, dnn.ATTR_TENSOR_DIMENSIONS, TYPE_INT64, 2, None)
        assert count == 2 and struct.unpack("<2q", raw) == (2, 3)  # the count of those returned
        count, raw = lib.desc_get(t, dnn.ATTR_TENSOR_STRIDES, TYPE_INT64, 4, None)
        assert struct.unpack("<4q", raw) == (60, 20, 4, 1)
        _, raw = lib.desc_get(t, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 1, None)
        assert struct.unpack("<q", raw) == (7,)
        assert lib.desc_get(t, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 0, None) == (1, b"")
        _, raw = lib.desc_get(t, dnn.ATTR_TENSOR_IS_VIRTUAL, TYPE_BOOLEAN, 1, None)
        assert raw == b"\0"
    finally:
        lib.desc_destroy(t)


def test_what_a_read_refuses(lib: Any) -> None:
    t = tensor(lib, 7, (2, 3, 5, 4))
    early = tensor(lib, 8, (1, 1, 1, 1), finalize=False)
    try:
        refused(dnn.STATUS_NOT_INITIALIZED, lib.desc_get, early, dnn.ATTR_TENSOR_UNIQUE_ID,
                TYPE_INT64, 1, None)
        refused(dnn.STATUS_BAD_PARAM, lib.desc_get, t, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 2, None)
        refused(dnn.STATUS_BAD_PARAM, lib.desc_get, t, dnn.ATTR_TENSOR_IS_VIRTUAL, TYPE_BOOLEAN, 2,
                None)
        refused(dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE, lib.desc_get, t, dnn.ATTR_TENSOR_UNIQUE_ID,
                TYPE_INT32, 1, None)
        refused(dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE, lib.desc_get, t, dnn.ATTR_TENSOR_DIMENSIONS,
                TYPE_DOUBLE, 4, None)
        refused(dnn.STATUS_NOT_SUPPORTED, lib.desc_get, t, dnn.ATTR_TENSOR_BYTE_ALIGNMENT,
                TYPE_INT64, 1, None)
    finally:
        lib.desc_destroy(t)
        lib.desc_destroy(early)


def test_what_a_set_refuses(lib: Any) -> None:
    t = tensor(lib, 1, (1, 1, 1, 1))
    fresh = lib.desc_create(dnn.TENSOR)
    try:
        with pytest.raises(DnnError) as err:  # finalized
            lib.desc_set(t, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 1, i64(2))
        assert err.value.status != dnn.STATUS_SUCCESS
        refused(dnn.STATUS_BAD_PARAM, lib.desc_set, fresh, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 2,
                i64(1, 2))
        refused(dnn.STATUS_BAD_PARAM, lib.desc_set, fresh, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 0,
                b"")
        refused(dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE, lib.desc_set, fresh, dnn.ATTR_TENSOR_DATA_TYPE,
                TYPE_INT64, 1, i64(0))
    finally:
        lib.desc_destroy(t)
        lib.desc_destroy(fresh)


def test_a_convolution_operation_and_its_tensors_read_into_new_descriptors(lib: Any) -> None:
    cudnn = lib
    x, w, y = tensor(cudnn, 1, (1, 3, 8, 8)), tensor(cudnn, 2, (4, 3, 3, 3)), tensor(cudnn, 3, (1, 4, 6, 6))
    conv = cudnn.desc_create(CONVOLUTION)
    cudnn.desc_set(conv, ATTR_CONV["comp"], TYPE_DATA_TYPE, 1, struct.pack("<i", dnn.DATA_FLOAT))
    cudnn.desc_set(conv, ATTR_CONV["mode"], TYPE_CONV_MODE, 1, struct.pack("<i", CROSS_CORRELATION))
    cudnn.desc_set(conv, ATTR_CONV["dims"], TYPE_INT64, 1, i64(2))
    for name in ("dilations", "strides"):
        cudnn.desc_set(conv, ATTR_CONV[name], TYPE_INT64, 2, i64(1, 1))
    for name in ("pre", "post"):
        cudnn.desc_set(conv, ATTR_CONV[name], TYPE_INT64, 2, i64(0, 0))
    cudnn.desc_finalize(conv)
    op = cudnn.desc_create(CONV_FORWARD)
    made = [x, w, y, conv, op]
    try:
        for name, desc in (("x", x), ("w", w), ("y", y), ("conv", conv)):
            cudnn.desc_set(op, ATTR_FWD[name], TYPE_DESC, 1, [desc])
        for name, value in (("alpha", 1.0), ("beta", 0.0)):
            cudnn.desc_set(op, ATTR_FWD[name], TYPE_FLOAT, 1, struct.pack("<f", value))
        cudnn.desc_finalize(op)
        # what pilotd does for a GetAttribute of descriptors: the caller's new descriptors filled
        out = cudnn.desc_create(dnn.TENSOR)
        made.append(out)
        count, _ = cudnn.desc_get(op, ATTR_FWD["w"], TYPE_DESC, 1, [out])
        assert count == 1
        n, raw = cudnn.desc_get(out, dnn.ATTR_TENSOR_DIMENSIONS, TYPE_INT64, 8, None)
        # cuDNN 9.24 reads the filter back with a group dimension in front, (1, 4, 3, 3, 3); the
        # sim as it was set
        assert struct.unpack(f"<{n}q", raw)[-4:] == (4, 3, 3, 3) and n in (4, 5)
        _, raw = cudnn.desc_get(out, dnn.ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, 1, None)
        assert struct.unpack("<q", raw) in ((2,), (-1,))  # cuDNN 9.24: -1, the copy has no id
    finally:
        for desc in reversed(made):
            cudnn.desc_destroy(desc)


def test_variant_packs_are_finalized_and_kept_by_content(cudnn: CudaDnn) -> None:
    a = cudnn._variant_pack([1, 2, 3], [0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0020_0000], 0)
    b = cudnn._variant_pack([1, 2, 3], [0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0020_0000], 0)
    c = cudnn._variant_pack([1, 2, 3], [0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0030_0000],
                            0x7F00_0040_0000)
    assert a == b != c  # (the library does not read variant packs back: NOT_SUPPORTED)
