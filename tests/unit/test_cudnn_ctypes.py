"""How the cuda backend calls cuDNN through ctypes (daemon/backends/cudnn.py), against a fake
libcudnn.so.9 that records its calls (tests/unit/fakes/fake_cudnn.c): the argument order of the
long batch normalization signatures, scalars passed as the tensor type's host values, handles
pooled, variant packs built once per content, the plan's workspace read back. The real library
is exercised on a GPU by tests/gpu/cudnn_compare.sh."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from pilot.daemon.backends import dnn
from pilot.daemon.backends.cudnn import CudaDnn
from pilot.daemon.backends.dnn import BatchNormCall, TensorDesc

FAKE = Path(__file__).parent / "fakes" / "fake_cudnn.c"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "libcudnn.so.9"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(FAKE)], check=True,
                   timeout=60)
    monkeypatch.setenv("PILOT_LIBRARY_PATH", str(tmp_path))
    handle = ctypes.CDLL(str(lib))
    handle.fake_log.restype = ctypes.c_char_p
    return handle


def log(fake: ctypes.CDLL) -> list[str]:
    lines = fake.fake_log().decode().splitlines()
    fake.fake_clear()
    return lines


X = TensorDesc(dnn.DATA_FLOAT, (2, 3, 4, 4), (48, 16, 4, 1))
BN = TensorDesc(dnn.DATA_FLOAT, (1, 3, 1, 1), (3, 1, 1, 1))


def test_versions_handles_and_their_pool(fake: ctypes.CDLL) -> None:
    d = CudaDnn()
    assert d.version() == (91900, 13000)
    h = d.create(0)
    d.execute(h, 0x77, [1], [0x5000], 0, 0xabc)
    d.release(h)
    again = d.create(0)  # the pooled one, its stream reset
    assert again.ptr == int(log(fake)[0].split()[1], 16)
    d.close()


def test_variant_packs_are_built_once_per_content(fake: ctypes.CDLL) -> None:
    d = CudaDnn()
    h = d.create(0)
    log(fake)
    for _ in range(3):
        d.execute(h, 0x77, [1, 2], [0x5000, 0x6000], 0x9000, 0xabc)
    lines = log(fake)
    assert [line.split()[0] for line in lines] == [
        "desc", "set", "set", "set", "finalize", "stream", "execute", "execute", "execute"]
    pack = lines[0].split()[2]
    assert lines[0].split()[1] == str(dnn.VARIANT_PACK)
    assert lines[1] == f"set {pack} 1000 3 2 1 2"
    assert lines[2] == f"set {pack} 1001 6 2 5000 6000"
    assert lines[3] == f"set {pack} 1003 6 1 9000"
    assert lines[-1].endswith(f"0x77 {pack}")
    d.execute(h, 0x77, [1, 2], [0x5000, 0x7000], 0x9000, 0xabc)  # another buffer: a new pack
    assert log(fake)[0].startswith("desc 16 ")
    d.close()


def test_descriptor_attributes_and_results(fake: ctypes.CDLL) -> None:
    d = CudaDnn()
    desc = d.desc_create(dnn.OPERATIONGRAPH)
    h = d.create(0)
    d.desc_set(desc, dnn.ATTR_OPERATIONGRAPH_HANDLE, dnn.TYPE_HANDLE, 1, [h])
    d.desc_set(desc, dnn.ATTR_OPERATIONGRAPH_OPS, dnn.TYPE_BACKEND_DESCRIPTOR, 2, [0x10, 0x20])
    count, raw = d.desc_get(desc, dnn.ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, dnn.TYPE_INT64, 1, None)
    assert (count, raw) == (2, (4096).to_bytes(8, "little"))
    count, raw = d.desc_get(desc, dnn.ATTR_ENGINEHEUR_RESULTS, dnn.TYPE_BACKEND_DESCRIPTOR, 2,
                            [0x30, 0x40])
    assert (count, raw) == (2, b"")
    lines = log(fake)
    assert f"set {desc:#x} 800 0 1 {h.ptr:x}" in lines
    assert f"set {desc:#x} 801 15 2 10 20" in lines
    assert lines[-2:] == ["fill 0x30", "fill 0x40"]
    d.close()


def test_batch_normalization_arguments_in_cudnns_order(fake: ctypes.CDLL) -> None:
    d = CudaDnn()
    h = d.create(0)
    fwd = BatchNormCall(fn=dnn.BN_FORWARD_TRAINING_EX, mode=dnn.BN_SPATIAL, bn_ops=0, x=X, y=X,
                        dx=None, bn=BN, x_ptr=0x100, y_ptr=0x200, scale=0x300, bias=0x400,
                        running_mean=0x500, running_var=0x600, saved_mean=0x700,
                        saved_inv_var=0x800, workspace=0x900, workspace_size=64, reserve=0xa00,
                        reserve_size=32, factor=0.1, epsilon=1e-5, alpha=1.0, beta=0.5)
    d.batchnorm(h, fwd, 0xabc)
    bwd = BatchNormCall(fn=dnn.BN_BACKWARD_EX, mode=dnn.BN_SPATIAL, bn_ops=0, x=X, y=X, dx=X,
                        bn=BN, x_ptr=0x100, y_ptr=0x200, dx_ptr=0x300, scale=0x400, dscale=0x500,
                        dbias=0x600, saved_mean=0x700, saved_inv_var=0x800, epsilon=1e-5,
                        alpha=1.0, beta=0.0, alpha_param=2.0, beta_param=1.0)
    d.batchnorm(h, bwd, 0xabc)
    inference = BatchNormCall(fn=dnn.BN_FORWARD_INFERENCE, mode=dnn.BN_SPATIAL, bn_ops=0,
                              x=TensorDesc(dnn.DATA_DOUBLE, X.dims, X.strides), y=X, dx=None,
                              bn=BN, x_ptr=1, y_ptr=2, scale=3, bias=4, running_mean=5,
                              running_var=6, epsilon=1e-3, alpha=1.0, beta=0.25)
    d.batchnorm(h, inference, 0xabc)
    size = d.batchnorm(h, BatchNormCall(fn=dnn.BN_SIZE_FORWARD_WORKSPACE, mode=1, bn_ops=0, x=X,
                                        y=X, dx=None, bn=BN), None)
    lines = [line for line in log(fake) if line.split()[0] in ("bnfwd", "bnbwd", "bninf", "wsfwd")]
    assert lines == [
        "bnfwd 1 0 1 0.5 0x100 (nil) (nil) 0x200 0x300 0x400 0.1 0x500 0x600 1e-05 0x700 0x800 "
        "(nil) 0x900 64 0xa00 32",
        "bnbwd 1 0 1 0 2 1 0x100 (nil) (nil) 0x200 (nil) (nil) 0x300 0x400 (nil) 0x500 0x600 "
        "1e-05 0x700 0x800 (nil) (nil) 0 (nil) 0",
        "bninf 1 1 0.25 0x1 0x2 0x3 0x4 0x5 0x6 0.001",  # double data: double scalars
        "wsfwd 1 0 (nil) 0x1 (nil)"]
    assert size == 123
    d.close()
