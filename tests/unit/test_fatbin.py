"""fatbin.py against real nvcc output, with layouts checked against the C ABI (ctypes)."""

from __future__ import annotations

import ctypes
import itertools
import random
import struct

import pytest

from pilot.daemon.backends import fatbin
from pilot.daemon.backends.fatbin import (
    FATBIN_MAGIC,
    KIND_ELF,
    KIND_PTX,
    elf_kernels,
    image_size,
    kernel_infos_in_image,
    kernels_in_image,
    nv_info_records,
    parse_entries,
)

SOURCE = r"""
struct S { int a; double b; char c[3]; };
struct S2 { short x; char y; };
struct Big { char c[5000]; };
__global__ void k(S s, char c, double *p) { p[0] = s.b + c; }
__global__ void mix(char c, short h, int i, double d, float *p, S2 s2, unsigned char u)
{ p[0] = c + h + i + d + s2.x + u; }
__global__ void big(char c, Big b, int *p) { p[0] = b.c[3] + c; }
__global__ void __launch_bounds__(256) bounded(short s) { }
__global__ void empty() { }
extern "C" __global__ void plain(int *p) { *p = 1; }
int main() { return 0; }
"""
TWO_ARCHS = ("-gencode", "arch=compute_75,code=sm_75",
             "-gencode", "arch=compute_90,code=[sm_90,compute_90]")

RDC_SOURCE = r"""
__device__ __noinline__ float twice(float x) { return x * 2.0f; }
__global__ void g(float *p, short s) { p[0] = twice(p[1]) + s; }
int main() { return 0; }
"""


class _S(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_double), ("c", ctypes.c_char * 3)]


class _S2(ctypes.Structure):
    _fields_ = [("x", ctypes.c_short), ("y", ctypes.c_char)]


def _c_layout(*types: type) -> list[tuple[int, int]]:
    """Parameter (offset, size) as the C ABI lays out a struct of these members; CUDA packs
    kernel parameters the same way."""
    fields = [(f"p{i}", t) for i, t in enumerate(types)]
    args = type("Args", (ctypes.Structure,), {"_fields_": fields})
    return [(getattr(args, name).offset, ctypes.sizeof(t)) for name, t in fields]


EXPECTED = {
    "_Z1k1ScPd": _c_layout(_S, ctypes.c_char, ctypes.c_void_p),
    "_Z3mixcsidPf2S2h": _c_layout(ctypes.c_char, ctypes.c_short, ctypes.c_int, ctypes.c_double,
                                  ctypes.c_void_p, _S2, ctypes.c_ubyte),
    "_Z3bigc3BigPi": _c_layout(ctypes.c_char, ctypes.c_char * 5000, ctypes.c_void_p),
    "_Z7boundeds": _c_layout(ctypes.c_short),
    "_Z5emptyv": [],
    "plain": _c_layout(ctypes.c_void_p),
}


@pytest.fixture(scope="module")
def images(compile_cuda) -> list[bytes]:
    return compile_cuda(SOURCE, *TWO_ARCHS)


@pytest.fixture(scope="module")
def image(images: list[bytes]) -> bytes:
    """The image holding the kernels (the executable also carries a kernel-less one)."""
    [found] = [img for img in images if kernels_in_image(img)]
    return found


def test_section_holds_several_images(images: list[bytes]) -> None:
    assert len(images) >= 2
    for img in images:
        assert image_size(img) == len(img)
        assert struct.unpack_from("<I", img)[0] == FATBIN_MAGIC


def test_entries(image: bytes) -> None:
    entries = parse_entries(image)
    elves = sorted(e.arch for e in entries if e.kind == KIND_ELF)
    assert elves == [75, 90]
    assert all(not e.compressed and e.payload[:4] == b"\x7fELF" for e in entries if e.is_elf)
    [ptx] = [e for e in entries if e.kind == KIND_PTX]
    assert ptx.arch == 90 and ptx.compressed  # CUDA 13 compresses PTX by default
    assert ptx.payload[:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
    assert ptx.decompressed_size > len(ptx.payload)


def test_layouts_match_c_abi(image: bytes) -> None:
    assert kernels_in_image(image) == EXPECTED


def test_layout_seen_on_h100(image: bytes) -> None:
    # cuFuncGetParamInfo on the H100 gave exactly this (notes/cuda-remoting.md)
    assert kernels_in_image(image)["_Z1k1ScPd"] == [(0, 24), (24, 1), (32, 8)]


def test_every_arch_agrees(image: bytes) -> None:
    per_arch = [elf_kernels(e.payload) for e in parse_entries(image) if e.is_elf]
    assert len(per_arch) == 2 and per_arch[0] == per_arch[1]


def test_launch_bounds(image: bytes) -> None:
    infos = kernel_infos_in_image(image)
    assert infos["_Z7boundeds"].max_threads == 256
    assert infos["_Z1k1ScPd"].max_threads is None


def test_rdc_skips_device_functions(compile_cuda) -> None:
    [img] = [i for i in compile_cuda(RDC_SOURCE, "-rdc=true") if kernels_in_image(i)]
    assert kernels_in_image(img) == {"_Z1gPfs": _c_layout(ctypes.c_void_p, ctypes.c_short)}


def test_image_size_ignores_trailing_bytes(image: bytes) -> None:
    assert image_size(image + b"junk") == len(image)
    assert kernels_in_image(image + b"\0" * 64) == EXPECTED


# ---- malformed input --------------------------------------------------------------------

def test_bad_magic(image: bytes) -> None:
    with pytest.raises(ValueError, match="magic"):
        image_size(b"\0\0\0\0" + image[4:])


def test_short_header() -> None:
    for n in range(16):
        with pytest.raises(ValueError):
            image_size(struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, 0)[:n])


def test_header_size_too_small() -> None:
    with pytest.raises(ValueError):
        image_size(struct.pack("<IHHQ", FATBIN_MAGIC, 1, 8, 0))


def test_truncated_image(image: bytes) -> None:
    for cut in range(0, len(image), 97):
        with pytest.raises(ValueError):
            parse_entries(image[:cut])


def test_entry_overrunning_image(image: bytes) -> None:
    shrunk = bytearray(image)
    struct.pack_into("<Q", shrunk, 8, len(image) - 16 - 100)  # fat_size now ends mid-entry
    with pytest.raises(ValueError):
        parse_entries(bytes(shrunk))


def test_overlong_payload_size(image: bytes) -> None:
    bad = bytearray(image)
    struct.pack_into("<Q", bad, 16 + 8, 2**63)  # first entry's payload_size
    with pytest.raises(ValueError, match="overruns"):
        parse_entries(bytes(bad))


def test_truncated_elf(image: bytes) -> None:
    elf = next(e for e in parse_entries(image) if e.is_elf).payload
    shoff, shnum = struct.unpack_from("<Q", elf, 0x28)[0], struct.unpack_from("<H", elf, 0x3C)[0]
    for cut in (0, 3, 16, 63, shoff + 10, shoff + 64 * shnum - 1):
        with pytest.raises(ValueError):
            elf_kernels(elf[:cut])


def test_nv_info_records_reject_garbage() -> None:
    # A value-less record (format 1) still takes 4 bytes, as in cooperative kernels' .nv.info.
    assert list(nv_info_records(bytes([1, 0x04, 0, 0, 3, 0x19, 5, 0]))) == [
        (1, 0x04, b""), (3, 0x19, b"\x05\x00")]
    for bad in (bytes([4]), bytes([4, 0x17, 12, 0, 1]), bytes([7, 0x17]), bytes([3, 0x19, 1]),
                bytes([1, 0x1B])):
        with pytest.raises(ValueError):
            list(nv_info_records(bad))


def test_kparam_record_too_short() -> None:
    record = bytes([4, 0x17, 4, 0]) + b"\0" * 4
    with pytest.raises(ValueError):
        fatbin._kernel_info("k", record)


def _outcome(fn, data: bytes) -> bool:
    """True if `fn` accepted `data`, False if it raised ValueError; anything else escapes."""
    try:
        fn(data)
    except ValueError:
        return False
    return True


def _hot_ranges(elf: bytes) -> list[tuple[int, int]]:
    """Byte ranges the parser interprets: ELF header, section headers, `.nv.info*` and symbols."""
    shoff, shnum = struct.unpack_from("<Q", elf, 0x28)[0], struct.unpack_from("<H", elf, 0x3C)[0]
    ranges = [(0, 64), (shoff, shoff + 64 * shnum)]
    for i in range(shnum):
        _name, typ, _fl, _addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + 64 * i)
        if typ in (2, 3, 0x70000000):  # symtab, strtab, .nv.info
            ranges.append((off, off + size))
    return ranges


def test_fuzz_mutated_image_raises_only_value_error(image: bytes) -> None:
    rng = random.Random(20240611)
    first = next(e for e in parse_entries(image) if e.is_elf)
    elf_at = first.offset + struct.unpack_from("<I", image, first.offset + 4)[0]
    hot = [(0, elf_at)] + [(elf_at + a, elf_at + b) for a, b in _hot_ranges(first.payload)]
    accepted = 0
    for _ in range(2000):
        data = bytearray(image)
        for _ in range(rng.randint(1, 4)):
            start, end = rng.choice(hot)
            data[rng.randrange(start, end)] = rng.randrange(256)
        accepted += _outcome(kernel_infos_in_image, bytes(data))
    assert 0 < accepted < 2000  # the fuzz reached both outcomes


def test_fuzz_truncated_elf_raises_only_value_error(image: bytes) -> None:
    elf = next(e for e in parse_entries(image) if e.is_elf).payload
    rng = random.Random(7)
    for _ in range(500):
        data = bytearray(elf)
        data[rng.randrange(len(data))] = rng.randrange(256)
        _outcome(elf_kernels, bytes(data[:rng.randrange(len(data))]))


def test_fuzz_random_bytes_raise_only_value_error() -> None:
    rng = random.Random(99)
    for _ in range(1500):
        body = rng.randbytes(rng.randrange(0, 300))
        framed = struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
        assert not _outcome(kernel_infos_in_image, body)
        _outcome(kernel_infos_in_image, framed)
        _outcome(elf_kernels, b"\x7fELF\x02\x01\x01" + body)
        _outcome(lambda d: list(nv_info_records(d)), body)


# ---- module variables (__device__, __constant__) --------------------------------------------

VARS_SOURCE = r"""
__constant__ float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__constant__ int zeros[3];
__device__ int counter;
__device__ long long init = 0x1122334455667788LL;
namespace ns { __device__ double v; }
static __device__ int hidden = 9;
__global__ void k(int *p)
{ atomicAdd(&counter, 1); p[0] = (int)(table[p[1]] + zeros[p[2]] + init + ns::v) + hidden; }
int main() { return 0; }
"""


def _vars_image(compile_cuda, *flags: str) -> bytes:
    [img] = [i for i in compile_cuda(VARS_SOURCE, *flags) if kernels_in_image(i)]
    return img


def _check_variables(g: fatbin.ModuleGlobals, static_name: str) -> None:
    sizes = {name: size for name, (_off, size) in g.variables.items()}
    assert sizes == {"table": 16, "zeros": 12, "counter": 4, "init": 8, "_ZN2ns1vE": 8,
                     static_name: 4}
    block = bytearray(g.size)
    for off, data in g.init:
        block[off:off + len(data)] = data

    def value(name: str, fmt: str) -> tuple:
        off, size = g.variables[name]
        return struct.unpack(fmt, block[off:off + size])

    assert value("table", "<4f") == (1.0, 2.0, 3.0, 4.0)
    assert value("init", "<q") == (0x1122334455667788,)
    assert value(static_name, "<i") == (9,)
    assert value("zeros", "<3i") == (0, 0, 0)
    assert value("counter", "<i") == (0,) and value("_ZN2ns1vE", "<d") == (0.0,)
    spans = sorted((off, off + size) for off, size in g.variables.values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    assert spans[-1][1] <= g.size


def test_globals_whole_program(compile_cuda) -> None:
    img = _vars_image(compile_cuda, *TWO_ARCHS)
    g = fatbin.globals_in_image(img)
    _check_variables(g, "hidden")
    elves = [e for e in parse_entries(img) if e.is_elf]
    assert len(elves) == 2
    assert all(fatbin.elf_globals(e.payload).variables.keys() == g.variables.keys() for e in elves)


def test_globals_rdc_static_names(compile_cuda) -> None:
    g = fatbin.globals_in_image(_vars_image(compile_cuda, "-rdc=true"))
    [static] = [name for name in g.variables if name.startswith("__nv_static_")]
    assert static.endswith("_hidden")
    _check_variables(g, static)


def test_image_without_variables(image: bytes) -> None:
    assert fatbin.globals_in_image(image) == fatbin.ModuleGlobals(0, {}, [])


def test_fuzz_mutated_variables_raise_only_value_error(compile_cuda) -> None:
    img = _vars_image(compile_cuda)
    first = next(e for e in parse_entries(img) if e.is_elf)
    elf_at = first.offset + struct.unpack_from("<I", img, first.offset + 4)[0]
    hot = [(elf_at + a, elf_at + b) for a, b in _hot_ranges(first.payload)]
    rng = random.Random(31337)
    accepted = 0
    for _ in range(1500):
        data = bytearray(img)
        for _ in range(rng.randint(1, 3)):
            start, end = rng.choice(hot)
            data[rng.randrange(start, end)] = rng.randrange(256)
        accepted += _outcome(fatbin.globals_in_image, bytes(data))
    assert 0 < accepted < 1500
