"""What a fatbin image says about its kernels' resources, for the sim's cudaFuncGetAttributes
and occupancy model (the cuda backend asks the driver instead).

From each kernel's device ELF (nvcc 13.0 output, checked against cuFuncGetAttribute on an H100):
- registers: the global `.nv.info` section's EIATTR_REGCOUNT (0x2f) records, u32 symbol index
  and u32 count; local memory per thread: EIATTR_FRAME_SIZE (0x11), same shape;
- static shared memory: the size of the NOBITS section `.nv.shared.<kernel>`. In images with a
  `.nv.shared.reserved.*` section (sm_90 builds) every kernel's section starts with the 1 KiB
  the system reserves per block, which cudaFuncGetAttributes does not count (1024 + 1024 bytes
  for a kernel with `__shared__ float t[256]`, reported as 1024 on the H100);
- binaryVersion: the ELF entry's arch (90 for sm_90); ptxVersion: the PTX entry's arch if the
  image has one, else the ELF's.
Anything unreadable is left out: callers fall back to defaults. Never raises on bad input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pilot.daemon.backends.fatbin import EIFMT_SVAL, elf_arch, is_elf, nv_info_records, parse_entries

EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
RESERVED_SHARED = 1024  # cudaDevAttrReservedSharedMemoryPerBlock on sm_80/sm_90

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB = 2
_SHT_NOBITS = 8


@dataclass(frozen=True)
class ImageFuncAttrs:
    num_regs: int | None = None
    local_bytes: int = 0
    static_shared_bytes: int = 0
    binary_version: int = 0
    ptx_version: int = 0


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    link: int
    size: int
    data: bytes


def _sections(elf: bytes) -> list[_Section]:
    fields = _ELF_HEADER.unpack_from(elf, 0)
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    raw = []
    for i in range(shnum):
        name, typ, _f, _a, offset, size, link, _i, _al, _e = _SECTION.unpack_from(
            elf, shoff + i * shentsize)
        data = b"" if typ == _SHT_NOBITS else elf[offset:offset + size]
        raw.append((name, typ, link, size, data))
    names = raw[shstrndx][4]

    def cstr(off: int) -> str:
        return names[off:names.index(b"\0", off)].decode("utf-8", "replace")

    return [_Section(cstr(n), t, link, size, d) for n, t, link, size, d in raw]


def _symbol_names(sections: list[_Section]) -> dict[int, str]:
    names: dict[int, str] = {}
    for sec in sections:
        if sec.type != _SHT_SYMTAB:
            continue
        strtab = sections[sec.link].data
        for index, pos in enumerate(range(0, len(sec.data) - _SYMBOL.size + 1, _SYMBOL.size)):
            off = _SYMBOL.unpack_from(sec.data, pos)[0]
            names[index] = strtab[off:strtab.index(b"\0", off)].decode("utf-8", "replace")
    return names


def _elf_attrs(elf: bytes, arch: int, ptx: int) -> dict[str, ImageFuncAttrs]:
    sections = _sections(elf)
    symbols = _symbol_names(sections)
    regs: dict[str, int] = {}
    frame: dict[str, int] = {}
    for sec in sections:
        if sec.name != ".nv.info":
            continue
        for fmt, attr, value in nv_info_records(sec.data):
            if fmt == EIFMT_SVAL and attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(value) >= 8:
                index, count = struct.unpack_from("<II", value)
                name = symbols.get(index)
                if name:
                    (regs if attr == EIATTR_REGCOUNT else frame)[name] = count
    reserved = RESERVED_SHARED if any(s.name.startswith(".nv.shared.reserved")
                                      for s in sections) else 0
    shared = {s.name[len(".nv.shared."):]: max(0, s.size - reserved) for s in sections
              if s.name.startswith(".nv.shared.") and not s.name.startswith(".nv.shared.reserved")}
    kernels = {s.name[len(".nv.info."):] for s in sections if s.name.startswith(".nv.info.")}
    return {name: ImageFuncAttrs(num_regs=regs.get(name), local_bytes=frame.get(name, 0),
                                 static_shared_bytes=shared.get(name, 0), binary_version=arch,
                                 ptx_version=ptx or arch)
            for name in kernels}


def image_function_attrs(image: bytes | memoryview) -> dict[str, ImageFuncAttrs]:
    """Kernel name -> what the image says of it (first uncompressed ELF entry naming it; a
    cubin's own ELF)."""
    try:
        if is_elf(image):
            elves, ptx = [(elf_arch(image), bytes(image))], 0
        else:
            entries = parse_entries(image)
            elves = [(e.arch, e.payload) for e in entries if e.is_elf and not e.compressed]
            ptx = next((e.arch for e in entries if e.is_ptx), 0)
    except ValueError:
        return {}
    found: dict[str, ImageFuncAttrs] = {}
    for arch, elf in elves:
        try:
            attrs = _elf_attrs(elf, arch, ptx)
        except (struct.error, ValueError, IndexError):
            continue
        for name, value in attrs.items():
            found.setdefault(name, value)
    return found
