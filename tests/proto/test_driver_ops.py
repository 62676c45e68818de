"""The driver API's opcodes in raw protocol (330-349): MODULE_UNLOAD frees a module of the
session that loaded it and of no other, and MEMSET_WIDE sets 2- and 4-byte elements inside the
session's own memory. Also the images cuModuleLoadData may hand over: a bare cubin and PTX."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from client import ProtoClient, body

from pilot.daemon.protocol import lib

INVALID_VALUE, INVALID_HANDLE, INVALID_IMAGE, NO_BINARY_FOR_GPU = 1, 400, 200, 209
SOURCE = r"""
__device__ int counter = 5;
extern "C" __global__ void k(int *p, short s) { p[0] = counter + s; }
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    work = tmp_path_factory.mktemp("driver-images")
    (work / "k.cu").write_text(SOURCE)
    out = {}
    for kind in ("cubin", "ptx", "fatbin"):
        subprocess.run([nvcc, f"-{kind}", "-arch=sm_90", "-o", str(work / f"k.{kind}"),
                        str(work / "k.cu")], check=True, capture_output=True, timeout=300)
        out[kind] = (work / f"k.{kind}").read_bytes()
    out["ptx"] += b"\0"
    return out


def _client(socket_path: str) -> ProtoClient:
    c = ProtoClient(socket_path)
    c.open()
    return c


def _load(c: ProtoClient, image: bytes):
    return c.call(lib.PILOT_OP_MODULE_LOAD, body("pilot_req_module_load", image_size=len(image)),
                  image, rep_type="pilot_rep_u64")


def _function(c: ProtoClient, module: int, name: bytes):
    return c.call(lib.PILOT_OP_FUNCTION_GET, body("pilot_req_function_get", module=module), name,
                  rep_type="pilot_rep_function")


def _unload(c: ProtoClient, module: int) -> int:
    return c.call(lib.PILOT_OP_MODULE_UNLOAD, body("pilot_req_handle", handle=module)).err


@pytest.mark.parametrize("kind", ["cubin", "ptx", "fatbin"])
def test_images_of_every_kind_load(daemon, images: dict[str, bytes], kind: str) -> None:
    c = _client(str(daemon.socket_path))
    rep = _load(c, images[kind])
    assert rep.hdr.err == 0
    fn = _function(c, int(rep.value), b"k")
    assert fn.hdr.err == 0 and fn.nparams == 2 and fn.arg_bytes == 10
    assert _function(c, int(rep.value), b"nope").hdr.err != 0
    c.close()


def test_broken_images_are_refused(daemon, images: dict[str, bytes]) -> None:
    c = _client(str(daemon.socket_path))
    assert _load(c, b"\x7fELF" + bytes(252)).hdr.err == INVALID_IMAGE
    assert _load(c, images["cubin"][:200]).hdr.err == INVALID_IMAGE
    # a cubin for another SM generation (e_flags bits 8..15: sm_80)
    other = bytearray(images["cubin"])
    flags = int.from_bytes(other[48:52], "little")
    other[48:52] = ((flags & ~0xFF00) | (80 << 8)).to_bytes(4, "little")
    assert _load(c, bytes(other)).hdr.err == NO_BINARY_FOR_GPU
    c.close()


def test_module_unload(daemon, images: dict[str, bytes]) -> None:
    c = _client(str(daemon.socket_path))
    module = int(_load(c, images["cubin"]).value)
    var = c.call(lib.PILOT_OP_SYMBOL_GET, body("pilot_req_symbol_get", module=module), b"counter",
                 rep_type="pilot_rep_u64")
    assert var.hdr.err == 0
    assert _unload(c, module) == 0
    # gone: the module, its variables as memory of the session, and a second unload
    assert _function(c, module, b"k").hdr.err == INVALID_HANDLE
    d2h = body("pilot_req_memcpy", src=int(var.value), count=4, sync=1)
    assert c.call(lib.PILOT_OP_MEMCPY_D2H, d2h).err == INVALID_VALUE
    assert _unload(c, module) == INVALID_HANDLE
    c.close()


OTHER_TENANT = r"""
import sys
sys.path.insert(0, sys.argv[3])
from test_driver_ops import _client, _unload
c = _client(sys.argv[1])
print(_unload(c, int(sys.argv[2])))
c.close()
"""


def test_another_session_cannot_unload_a_module(daemon, images: dict[str, bytes]) -> None:
    owner = _client(str(daemon.socket_path))
    module = int(_load(owner, images["cubin"]).value)
    here = Path(__file__).parent
    other = subprocess.run([sys.executable, "-c", OTHER_TENANT, str(daemon.socket_path),
                            str(module), str(here)], capture_output=True, text=True, timeout=60,
                           cwd=here)
    assert other.returncode == 0, other.stderr
    assert int(other.stdout) == INVALID_HANDLE
    assert _function(owner, module, b"k").hdr.err == 0
    owner.close()


def test_memset_wide(daemon) -> None:
    c = _client(str(daemon.socket_path))
    ptr = c.malloc(16)

    def wide(value: int, elem: int, count: int, at: int = 0) -> int:
        req = body("pilot_req_memset_wide", ptr=ptr + at, count=count, value=value, elem_size=elem,
                   sync=1)
        return c.call(lib.PILOT_OP_MEMSET_WIDE, req).err

    assert wide(0xABCD, 2, 8) == 0
    assert wide(0xDEADBEEF, 4, 2, at=8) == 0
    err = c.call(lib.PILOT_OP_MEMCPY_D2H, body("pilot_req_memcpy", src=ptr, count=16, sync=1)).err
    assert err == 0
    assert struct.unpack("<4H2I", c.last_payload) == (0xABCD,) * 4 + (0xDEADBEEF,) * 2
    assert wide(1, 4, 5) == INVALID_VALUE   # past the allocation
    assert wide(1, 3, 1) == INVALID_VALUE   # no such element size
    assert wide(1, 2, 1, at=-2) == INVALID_VALUE
    c.close()
