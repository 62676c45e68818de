"""SYMBOL_GET in raw protocol: a module's variables become memory of the session that loaded the
module, one variable at a time, and of no other session."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from client import ProtoClient, body

from pilot.daemon.backends.fatbin import elf_sections, globals_in_image, iter_images
from pilot.daemon.protocol import lib

INVALID_VALUE, INVALID_SYMBOL, INVALID_HANDLE = 1, 13, 400
SOURCE = r"""
__device__ int counter;
__constant__ float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__global__ void k(int *p) { p[0] = counter + (int)table[p[1]]; }
int main() { return 0; }
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    work = tmp_path_factory.mktemp("symbols")
    (work / "v.cu").write_text(SOURCE)
    subprocess.run([nvcc, "-cudart", "shared", "-o", str(work / "v"), str(work / "v.cu")],
                   check=True, capture_output=True, timeout=300)
    sections = {s.name: s for s in elf_sections((work / "v").read_bytes())}
    [img] = [i for i in iter_images(sections[".nv_fatbin"].data) if globals_in_image(i).variables]
    return img


def _client(daemon) -> ProtoClient:
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    return c


def _load(c: ProtoClient, image: bytes) -> int:
    rep = c.call(lib.PILOT_OP_MODULE_LOAD, body("pilot_req_module_load", image_size=len(image)),
                 image, rep_type="pilot_rep_u64")
    assert rep.hdr.err == 0
    return int(rep.value)


def _symbol(c: ProtoClient, module: int, name: bytes):
    return c.call(lib.PILOT_OP_SYMBOL_GET, body("pilot_req_symbol_get", module=module), name,
                  rep_type="pilot_rep_u64")


def _d2h(c: ProtoClient, src: int, count: int) -> tuple[int, bytes]:
    err = c.call(lib.PILOT_OP_MEMCPY_D2H, body("pilot_req_memcpy", src=src, count=count, sync=1)).err
    return err, c.last_payload


def test_variables_by_name(daemon, image: bytes) -> None:
    c = _client(daemon)
    module = _load(c, image)
    table = _symbol(c, module, b"table")
    counter = _symbol(c, module, b"counter")
    assert (table.hdr.err, table.value2, counter.hdr.err, counter.value2) == (0, 16, 0, 4)
    assert _symbol(c, module, b"table").value == table.value  # the same variable every time
    err, data = _d2h(c, table.value, 16)
    assert err == 0 and struct.unpack("<4f", data) == (1.0, 2.0, 3.0, 4.0)
    req = body("pilot_req_memcpy", dst=counter.value, count=4, sync=1)
    assert c.call(lib.PILOT_OP_MEMCPY_H2D, req, struct.pack("<i", -17)).err == 0
    assert _d2h(c, counter.value, 4) == (0, struct.pack("<i", -17))
    req = body("pilot_req_memset", ptr=table.value + 4, count=4, value=0, sync=1)
    assert c.call(lib.PILOT_OP_MEMSET, req).err == 0
    assert struct.unpack("<4f", _d2h(c, table.value, 16)[1]) == (1.0, 0.0, 3.0, 4.0)
    c.close()


def test_bad_lookups_and_ranges(daemon, image: bytes) -> None:
    c = _client(daemon)
    module = _load(c, image)
    for name in (b"nope", b"", b"tab\0le", b"\xff\xfe", b"x" * 5000):
        assert _symbol(c, module, name).hdr.err == INVALID_SYMBOL, name
    assert _symbol(c, module + 100, b"table").hdr.err == INVALID_HANDLE
    table = _symbol(c, module, b"table")
    assert _d2h(c, table.value + 12, 8)[0] == INVALID_VALUE  # past the variable's end
    assert _d2h(c, table.value - 4, 8)[0] == INVALID_VALUE
    # Variables are no allocations: never freed by the program.
    assert c.call(lib.PILOT_OP_FREE, body("pilot_req_free", ptr=table.value)).err == INVALID_VALUE
    assert _d2h(c, table.value, 16)[0] == 0
    c.close()


OTHER_TENANT = r"""
import struct, sys
sys.path.insert(0, sys.argv[3])
from test_symbols import _client_at, _d2h, _load, _symbol, body, lib
c = _client_at(sys.argv[1])
theirs = int(sys.argv[2])
image = open(sys.argv[4], "rb").read()
errs = [_d2h(c, theirs, 16)[0],
        c.call(lib.PILOT_OP_MEMCPY_H2D, body("pilot_req_memcpy", dst=theirs, count=4, sync=1),
               b"abcd").err]
mine = _symbol(c, _load(c, image), b"table")
print(*errs, mine.hdr.err, int(mine.value), _d2h(c, int(mine.value), 16)[0])
c.close()
"""


def _client_at(socket_path: str) -> ProtoClient:
    c = ProtoClient(socket_path)
    c.open()
    return c


def test_other_sessions_cannot_reach_a_variable(daemon, image: bytes, tmp_path: Path) -> None:
    owner = _client(daemon)
    table = _symbol(owner, _load(owner, image), b"table")
    assert table.hdr.err == 0
    (tmp_path / "image").write_bytes(image)
    here = Path(__file__).parent
    other = subprocess.run([sys.executable, "-c", OTHER_TENANT, str(daemon.socket_path),
                            str(table.value), str(here), str(tmp_path / "image")],
                           capture_output=True, text=True, timeout=60, cwd=here)
    assert other.returncode == 0, other.stderr
    d2h, h2d, lookup, address, own_d2h = map(int, other.stdout.split())
    assert (d2h, h2d) == (INVALID_VALUE, INVALID_VALUE)
    # Its own load of the same image has its own copy of the variable.
    assert (lookup, own_d2h) == (0, 0) and address != table.value
    assert struct.unpack("<4f", _d2h(owner, table.value, 16)[1]) == (1.0, 2.0, 3.0, 4.0)
    owner.close()
