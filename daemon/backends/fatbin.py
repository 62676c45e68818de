"""Read CUDA fatbin images and the kernel parameter layouts inside their device ELFs.

The shim ships each image `__cudaRegisterFatBinary` registers; the daemon needs to know how big it
is, which entries it holds, and how each kernel's parameters are laid out (to cut the packed
argument buffer into parameters when no driver is there to ask, as in the sim backend).

Formats (little endian; checked against nvcc 13.0 output, see tests/unit/test_fatbin.py):
- image header: u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 fat_size.
- entry header (64 bytes, PTX entries carry 16 more): u16 kind (1 PTX, 2 ELF), u16 ?, u32
  header_size, u64 payload_size, u32 compressed_size, u32 ?, u16 minor, u16 major, u32 arch,
  u32 name_offset, u32 name_len, u64 flags (0x8000: zstd-compressed), u64 0,
  u64 decompressed_size. payload_size may include padding after compressed_size bytes.
- `.nv.info.<fn>` sections hold attribute records `u8 format, u8 attr` + value; format 1 has no
  value (2 bytes of padding: every record header is 4 bytes), 2 and 3 a 2-byte value, 4 a u16
  size and that many bytes.
  - 0x17 KPARAM_INFO: u32 index, u16 ordinal, u16 offset, u32 word; size = (word >> 18) & 0x3fff.
  - 0x45 (used instead of 0x17 once a kernel's parameters exceed 4096 bytes): u32 index,
    u16 ordinal, u16 offset, u32 size.
  - 0x05 MAX_THREADS: u32 x, y, z from `__launch_bounds__` / `__maxntid__`.
  Records come in any order (reverse ordinal in whole-program builds, forward under -rdc).
- Kernels are the ELF's FUNC symbols with st_other bit 0x10 (STO_CUDA_ENTRY): under -rdc,
  non-inlined `__device__` functions get `.nv.info.<fn>` sections too.
- Variables (`__device__`, `__constant__`) are the ELF's OBJECT symbols: st_value is the offset
  in their section, st_size the size. nvcc 13 puts `__constant__` ones in `.nv.constant3`
  (PROGBITS: initializers included), zero-initialized `__device__` ones in `.nv.global`
  (NOBITS) and initialized ones in `.nv.global.init` (PROGBITS). Names are the exact symbol
  names `__cudaRegisterVar` reports (mangled inside namespaces; static ones keep their name in
  whole-program builds).

Images given to the driver API (cuModuleLoadData) may also be a bare device ELF (a cubin: the
arch is e_flags bits 8..15) or PTX text (read up to its NUL): `image_elves` and
`kernel_infos_in_image` accept all three; PTX kernels' layouts come from their `.entry` parameter
lists (natural alignment, `.align` where given), as ptxas would lay them out.

Compressed entries are reported, not decompressed (no zstd in the standard library of 3.11),
except by `entry_bytes`, which asks the system's libzstd (through ctypes) where there is one:
the preemptible variants need a fatbin's PTX, which nvcc 13 compresses by default.
Every malformed input raises ValueError; no IndexError or struct.error escapes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
FLAG_COMPRESSED = 0x8000

EIFMT_NVAL = 0x01
EIFMT_BVAL = 0x02
EIFMT_HVAL = 0x03
EIFMT_SVAL = 0x04
EIATTR_MAX_THREADS = 0x05
EIATTR_KPARAM_INFO = 0x17
EIATTR_KPARAM_INFO_V2 = 0x45  # our name; layout checked on nvcc 13 output

STO_CUDA_ENTRY = 0x10
_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_STT_FUNC = 2
_STT_OBJECT = 1
_SHN_LORESERVE = 0xFF00
GLOBALS_ALIGN = 256  # each variable section starts at this alignment in a module's block

_IMAGE_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_KPARAM = struct.Struct("<IHHI")
_MAX_THREADS = struct.Struct("<III")


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of an image. `payload` holds the stored bytes (compressed if `compressed`)."""

    kind: int
    arch: int  # SM or compute version, e.g. 75, 90
    version: tuple[int, int]  # (major, minor) of the entry format, e.g. ELF 1.8, PTX ISA 9.0
    flags: int
    offset: int  # of the entry header, from the start of the image
    payload: bytes
    decompressed_size: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def is_elf(self) -> bool:
        return self.kind == KIND_ELF

    @property
    def is_ptx(self) -> bool:
        return self.kind == KIND_PTX


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: list[tuple[int, int]]  # (offset, size), by ordinal
    max_threads: int | None = None  # x*y*z of __launch_bounds__/__maxntid__, if given


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    link: int
    data: bytes


def _unpack(fmt: struct.Struct, buf: bytes | memoryview, offset: int, what: str) -> tuple:
    if offset < 0 or offset + fmt.size > len(buf):
        raise ValueError(f"truncated {what} at offset {offset} ({len(buf)} bytes available)")
    return fmt.unpack_from(buf, offset)


# ---- fatbin images -------------------------------------------------------------------------

def image_size(buf: bytes | memoryview) -> int:
    """Total size of the image starting at `buf[0]`; only its 16-byte header must be present."""
    magic, _version, header_size, fat_size = _unpack(_IMAGE_HEADER, buf, 0, "fatbin header")
    if magic != FATBIN_MAGIC:
        raise ValueError(f"bad fatbin magic {magic:#010x} (expected {FATBIN_MAGIC:#010x})")
    if header_size < _IMAGE_HEADER.size:
        raise ValueError(f"fatbin header size {header_size} is below {_IMAGE_HEADER.size}")
    return header_size + fat_size


def parse_entries(image: bytes | memoryview) -> list[FatbinEntry]:
    """Split an image into entries. Bytes after the image's own size are ignored."""
    size = image_size(image)
    if size > len(image):
        raise ValueError(f"fatbin image truncated: header says {size} bytes, got {len(image)}")
    data = bytes(image[:size])
    offset = _IMAGE_HEADER.unpack_from(data, 0)[2]
    entries: list[FatbinEntry] = []
    while offset < size:
        if not any(data[offset:]):
            break  # zero padding after the last entry
        (kind, _u1, header_size, payload_size, compressed_size, _u2, minor, major, arch,
         _name_off, _name_len, flags, _zero, decompressed_size) = _unpack(
            _ENTRY_HEADER, data, offset, "fatbin entry header")
        if header_size < _ENTRY_HEADER.size:
            raise ValueError(f"fatbin entry at {offset}: header size {header_size} too small")
        start = offset + header_size
        end = start + payload_size
        if end > size:
            raise ValueError(f"fatbin entry at {offset}: payload of {payload_size} bytes "
                             f"overruns the image ({size} bytes)")
        stored = payload_size
        if flags & FLAG_COMPRESSED and compressed_size:
            if compressed_size > payload_size:
                raise ValueError(f"fatbin entry at {offset}: compressed size {compressed_size} "
                                 f"exceeds payload size {payload_size}")
            stored = compressed_size
        entries.append(FatbinEntry(kind=kind, arch=arch, version=(major, minor), flags=flags,
                                   offset=offset, payload=data[start:start + stored],
                                   decompressed_size=decompressed_size))
        offset = end
    return entries


def iter_images(section: bytes | memoryview, align: int = 8) -> Iterator[bytes]:
    """Walk the images laid one after another in an executable's `.nv_fatbin` section."""
    offset = 0
    while offset < len(section):
        if not any(section[offset:offset + _IMAGE_HEADER.size]):
            offset += align  # alignment padding between images
            continue
        size = image_size(section[offset:])
        if offset + size > len(section):
            raise ValueError(f"fatbin image at {offset} overruns the section")
        yield bytes(section[offset:offset + size])
        offset += -(-size // align) * align


# ---- device ELF ----------------------------------------------------------------------------

def elf_sections(elf: bytes | memoryview) -> list[ElfSection]:
    """Sections of a little-endian ELF64 file (device code or the host executable)."""
    if len(elf) < 16 or bytes(elf[:4]) != b"\x7fELF":
        raise ValueError("not an ELF file")
    if elf[4] != 2 or elf[5] != 1:
        raise ValueError("only little-endian ELF64 is supported")
    fields = _unpack(_ELF_HEADER, elf, 0, "ELF header")
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    if shnum == 0:
        return []
    if shentsize < _SECTION_HEADER.size:
        raise ValueError(f"ELF section header size {shentsize} too small")
    raw = []
    for i in range(shnum):
        (name, typ, _flags, _addr, offset, size, link, _info, _align,
         _entsize) = _unpack(_SECTION_HEADER, elf, shoff + i * shentsize, "ELF section header")
        if typ == _SHT_NOBITS:
            size = 0
        if offset + size > len(elf):
            raise ValueError(f"ELF section {i} overruns the file")
        raw.append((name, typ, link, bytes(elf[offset:offset + size])))
    if shstrndx >= shnum:
        raise ValueError(f"ELF section name table index {shstrndx} out of range")
    names = raw[shstrndx][3]
    return [ElfSection(_cstring(names, n, "section name"), t, link, d) for n, t, link, d in raw]


def _cstring(table: bytes, offset: int, what: str) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ValueError(f"ELF {what} offset {offset} outside its string table")
    return table[offset:end].decode("utf-8", "replace")


def _symbols(sections: list[ElfSection]) -> Iterator[tuple[bytes, tuple[int, ...]]]:
    """(string table, (name, info, other, shndx, value, size)) of every symbol of the ELF."""
    for sec in sections:
        if sec.type != _SHT_SYMTAB:
            continue
        if sec.link >= len(sections):
            raise ValueError("ELF symbol table links to a missing string table")
        strtab = sections[sec.link].data
        for pos in range(0, len(sec.data) - _SYMBOL.size + 1, _SYMBOL.size):
            yield strtab, _SYMBOL.unpack_from(sec.data, pos)


def _entry_functions(sections: list[ElfSection]) -> list[str]:
    return [_cstring(strtab, name, "symbol name")
            for strtab, (name, info, other, _shndx, _value, _size) in _symbols(sections)
            if info & 0xF == _STT_FUNC and other & STO_CUDA_ENTRY]


def nv_info_records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Yield (format, attribute, value bytes) for each record of an `.nv.info*` section."""
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise ValueError(f"truncated .nv.info record at {pos}")
        fmt, attr = data[pos], data[pos + 1]
        if fmt == EIFMT_NVAL:  # no value, but the record still takes its 4 bytes
            value, pos = b"", pos + 4
        elif fmt in (EIFMT_BVAL, EIFMT_HVAL):
            value, pos = data[pos + 2:pos + 4], pos + 4
        elif fmt == EIFMT_SVAL:
            (size,) = _unpack(struct.Struct("<H"), data, pos + 2, ".nv.info record size")
            value, pos = data[pos + 4:pos + 4 + size], pos + 4 + size
        else:
            raise ValueError(f"unknown .nv.info record format {fmt:#x} at {pos}")
        if pos > len(data):
            raise ValueError(f"truncated .nv.info record (attribute {attr:#x})")
        yield fmt, attr, value


def _kernel_info(name: str, nv_info: bytes) -> KernelInfo:
    by_ordinal: dict[int, tuple[int, int]] = {}
    max_threads = None
    for fmt, attr, value in nv_info_records(nv_info):
        if fmt != EIFMT_SVAL:
            continue
        if attr in (EIATTR_KPARAM_INFO, EIATTR_KPARAM_INFO_V2):
            _index, ordinal, offset, word = _unpack(_KPARAM, value, 0, "KPARAM_INFO record")
            size = (word >> 18) & 0x3FFF if attr == EIATTR_KPARAM_INFO else word
            if ordinal in by_ordinal:
                raise ValueError(f"{name}: parameter {ordinal} described twice")
            by_ordinal[ordinal] = (offset, size)
        elif attr == EIATTR_MAX_THREADS:
            x, y, z = _unpack(_MAX_THREADS, value, 0, "MAX_THREADS record")
            max_threads = x * y * z
    if sorted(by_ordinal) != list(range(len(by_ordinal))):
        raise ValueError(f"{name}: parameter ordinals {sorted(by_ordinal)} are not 0..n-1")
    return KernelInfo(name, [by_ordinal[i] for i in range(len(by_ordinal))], max_threads)


def elf_kernels(elf: bytes | memoryview) -> dict[str, KernelInfo]:
    """Kernels (entry functions) of a device ELF with their parameter layouts."""
    sections = elf_sections(elf)
    info = {s.name[len(".nv.info."):]: s.data for s in sections
            if s.name.startswith(".nv.info.")}
    return {name: _kernel_info(name, info.get(name, b"")) for name in _entry_functions(sections)}


# st_other bit nvcc sets on __managed__ variables (seen in nvcc 13 cubins: `[<other>: 4]`).
STO_CUDA_MANAGED = 0x4


@dataclass(frozen=True)
class ModuleGlobals:
    """The variables of a device ELF laid out in one block, as a loader would place them: each
    section holding variables at a GLOBALS_ALIGN-aligned offset, variables at their st_value."""

    size: int  # bytes of the block
    variables: dict[str, tuple[int, int]]  # name -> (offset in the block, size)
    init: list[tuple[int, bytes]]  # (offset, bytes): section contents to copy in; rest is zero
    managed: frozenset[str] = frozenset()  # the __managed__ ones (st_other STO_CUDA_MANAGED)


def elf_globals(elf: bytes | memoryview) -> ModuleGlobals:
    """The OBJECT symbols of a device ELF (its `__device__` and `__constant__` variables)."""
    sections = elf_sections(elf)
    by_section: dict[int, list[tuple[str, int, int]]] = {}
    managed: set[str] = set()
    for strtab, (name, info, other, shndx, value, size) in _symbols(sections):
        if info & 0xF != _STT_OBJECT or not 0 < shndx < _SHN_LORESERVE:
            continue
        if shndx >= len(sections):
            raise ValueError(f"ELF symbol in missing section {shndx}")
        symbol = _cstring(strtab, name, "symbol name")
        by_section.setdefault(shndx, []).append((symbol, value, size))
        if other & STO_CUDA_MANAGED:
            managed.add(symbol)
    offset = 0
    variables: dict[str, tuple[int, int]] = {}
    init: list[tuple[int, bytes]] = []
    for shndx in sorted(by_section):
        symbols = by_section[shndx]
        data = sections[shndx].data  # empty for NOBITS
        extent = max(len(data), *(value + size for _name, value, size in symbols))
        base = -(-offset // GLOBALS_ALIGN) * GLOBALS_ALIGN
        if any(data):
            init.append((base, data))
        for name, value, size in symbols:
            variables.setdefault(name, (base + value, size))
        offset = base + extent
    return ModuleGlobals(offset, variables, init, frozenset(managed))


# ---- whole images --------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"


def is_elf(image: bytes | memoryview) -> bool:
    return bytes(image[:4]) == ELF_MAGIC


def is_fatbin(image: bytes | memoryview) -> bool:
    return len(image) >= 4 and struct.unpack_from("<I", image, 0)[0] == FATBIN_MAGIC


def elf_arch(elf: bytes | memoryview) -> int:
    """The SM version of a cubin (e_flags bits 8..15, e.g. 90)."""
    return (_unpack(_ELF_HEADER, elf, 0, "ELF header")[7] >> 8) & 0xFF


def image_elves(image: bytes | memoryview) -> list[tuple[int, bytes]]:
    """(arch, device ELF) of every uncompressed ELF of an image: a fatbin's ELF entries, or the
    image itself if it is a cubin. Raises ValueError for a fatbin whose ELF entries are all
    compressed."""
    if is_elf(image):
        return [(elf_arch(image), bytes(image))]
    entries = parse_entries(image)
    elves = [e for e in entries if e.is_elf]
    readable = [(e.arch, e.payload) for e in elves if not e.compressed]
    if elves and not readable:
        raise ValueError("every ELF entry is compressed (built with -Xfatbin -compress-all?)")
    return readable


_PTX_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)([^{]*)\{")
_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.([usbf])(8|16|32|64)"
                        r"(?:\s+\.ptr(?:\s+\.\w+)*)?\s+[\w$]+\s*(?:\[(\d+)\])?$")
_PTX_MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def ptx_text(image: bytes | memoryview) -> str | None:
    """The image as PTX source (up to its NUL), or None if it does not look like PTX."""
    raw = bytes(image)
    end = raw.find(b"\0")
    raw = raw if end < 0 else raw[:end]
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if ".version" in text and ".target" in text else None


def ptx_kernels(text: str) -> dict[str, KernelInfo]:
    """Kernels of PTX source with their parameter layouts; ValueError for a parameter list
    this reader does not understand (the driver's JIT decides on the GPU)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    kernels: dict[str, KernelInfo] = {}
    for match in _PTX_ENTRY.finditer(text):
        name, params_text, directives = match.groups()
        params: list[tuple[int, int]] = []
        offset = 0
        for param in filter(None, (p.strip() for p in params_text.split(","))):
            found = _PTX_PARAM.match(" ".join(param.split()))
            if not found:
                raise ValueError(f"PTX kernel {name}: cannot read parameter {param!r}")
            align_text, _kind, bits, count = found.groups()
            elem = int(bits) // 8
            align = int(align_text) if align_text else elem
            size = elem * (int(count) if count else 1)
            offset = -(-offset // align) * align
            params.append((offset, size))
            offset += size
        ntid = _PTX_MAXNTID.search(directives)
        max_threads = None
        if ntid:
            max_threads = 1
            for dim in ntid.groups():
                max_threads *= int(dim) if dim else 1
        kernels[name] = KernelInfo(name, params, max_threads)
    return kernels


def kernel_infos_in_image(image: bytes | memoryview) -> dict[str, KernelInfo]:
    """Kernels of every uncompressed ELF of the image (a fatbin, a cubin) or of its PTX;
    layouts are the same for every arch, so the first ELF naming a kernel wins."""
    if not is_elf(image) and not is_fatbin(image):
        text = ptx_text(image)
        if text is None:
            raise ValueError("not a fatbin, a cubin or PTX text")
        return ptx_kernels(text)
    entries = [] if is_elf(image) else parse_entries(image)
    elves = image_elves(image)
    if not elves and any(e.is_ptx for e in entries):
        raise ValueError("PTX-only image: no ELF entry to read kernel parameters from")
    kernels: dict[str, KernelInfo] = {}
    for _arch, elf in elves:
        for name, info in elf_kernels(elf).items():
            kernels.setdefault(name, info)
    return kernels


def kernels_in_image(image: bytes | memoryview) -> dict[str, list[tuple[int, int]]]:
    """Kernel name -> [(offset, size)] per parameter, for every kernel in the image."""
    return {name: info.params for name, info in kernel_infos_in_image(image).items()}


def readable_globals(image: bytes | memoryview) -> ModuleGlobals:
    """The image's variables as far as its ELF says; none for an image pilot cannot read
    (compressed or PTX only: the loader then decides)."""
    try:
        return globals_in_image(image)
    except ValueError:
        return ModuleGlobals(0, {}, [])


def globals_in_image(image: bytes | memoryview) -> ModuleGlobals:
    """Variables of the image's first uncompressed ELF (every entry of one image is compiled
    from the same sources, so each declares the same variables); none for PTX text."""
    if not is_elf(image) and not is_fatbin(image):
        return ModuleGlobals(0, {}, [])
    if is_elf(image):
        return elf_globals(image)
    for entry in parse_entries(image):
        if entry.is_elf and not entry.compressed:
            return elf_globals(entry.payload)
    return ModuleGlobals(0, {}, [])


# A PTX variable of global or constant space defined at module scope (not .extern):
# [.visible|.weak] .global|.const [.align N] .type name[dim]...
_PTX_VAR = re.compile(r"^[ \t]*(?:\.(?:visible|weak)\s+)*\.(?:global|const)\s+(?:\.align\s+(\d+)\s+)?"
                      r"(?:\.v(\d)\s+)?\.[usbf](8|16|32|64)\s+([A-Za-z_$%][\w$]*)((?:\s*\[\d*\])*)",
                      re.M)


def ptx_globals(text: str) -> ModuleGlobals:
    """The variables PTX source defines (what the driver allocates when it JIT-compiles it),
    laid out one after another, zero-filled (initializers are not read)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    variables: dict[str, tuple[int, int]] = {}
    offset = 0
    for match in _PTX_VAR.finditer(text):
        align_text, vector, bits, name, dims = match.groups()
        size = int(bits) // 8 * (int(vector) if vector else 1)
        for dim in re.findall(r"\[(\d*)\]", dims):
            size *= int(dim) if dim else 1
        align = max(int(align_text) if align_text else 1, 1)
        offset = -(-offset // align) * align
        variables[name] = (offset, size)
        offset += size
    return ModuleGlobals(offset, variables, [])


def driver_entry(image: bytes | memoryview, sm: int) -> FatbinEntry | None:
    """The entry of a fatbin the driver loads on an sm_`sm` GPU: the ELF of the same major with
    the highest minor not above the GPU's, else the newest PTX not above it (JIT-compiled);
    None when neither exists (the driver then refuses the image)."""
    entries = parse_entries(image)
    elves = [e for e in entries if e.is_elf and e.arch // 10 == sm // 10 and e.arch <= sm]
    if elves:
        return max(elves, key=lambda e: e.arch)
    return newest_ptx(entries, sm)


def newest_ptx(entries: list[FatbinEntry], sm: int) -> FatbinEntry | None:
    """The PTX entry the driver JIT-compiles on an sm_`sm` GPU: the newest not above it."""
    ptx = [e for e in entries if e.is_ptx and e.arch <= sm]
    return max(ptx, key=lambda e: e.arch) if ptx else None


def loaded_globals(image: bytes | memoryview, sm: int) -> ModuleGlobals:
    """The variables the driver allocates for `image` on an sm_`sm` GPU: those of the entry it
    chooses (driver_entry), of a cubin, or of PTX text, not merely the first entry's (a small
    sm_80 entry before a large sm_90 one, or PTX, charged nothing: issue 27). When that entry
    is compressed (pilot does not decompress), any readable ELF's; ValueError for what is no
    image."""
    if is_elf(image):
        return elf_globals(image)
    if not is_fatbin(image):
        text = ptx_text(image)
        if text is None:
            raise ValueError("neither a fatbin, a cubin nor PTX")
        return ptx_globals(text)
    entry = driver_entry(image, sm)
    if entry is None or entry.compressed:
        # nothing for this GPU (nvcc's fatbins for another arch) or compressed (nvcc compresses
        # PTX): every entry comes from the same sources, so any readable ELF's variables
        return globals_in_image(image)
    if entry.is_elf:
        return elf_globals(entry.payload)
    text = ptx_text(entry.payload)
    return ptx_globals(text) if text is not None else ModuleGlobals(0, {}, [])


def variable_names(image: bytes | memoryview) -> set[str]:
    """Names of the variables any readable entry of `image` defines (ELF symbols, PTX
    declarations), for asking the driver their sizes once it has loaded the image."""
    if is_elf(image):
        return set(elf_globals(image).variables)
    if not is_fatbin(image):
        text = ptx_text(image)
        return set(ptx_globals(text).variables) if text is not None else set()
    names: set[str] = set()
    for entry in parse_entries(image):
        if entry.compressed:
            continue
        if entry.is_elf:
            names |= set(elf_globals(entry.payload).variables)
        elif entry.is_ptx and (text := ptx_text(entry.payload)) is not None:
            names |= set(ptx_globals(text).variables)
    return names


@functools.cache
def _zstd() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("zstd")
    try:
        lib = ctypes.CDLL(name or "libzstd.so.1")
    except OSError:
        return None
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = (ctypes.c_size_t,)
    return lib


MAX_DECOMPRESSED = 1 << 30  # an entry that claims more is not believed


def entry_bytes(entry: FatbinEntry) -> bytes | None:
    """An entry's bytes, decompressed when it is compressed (zstd, with the system's libzstd);
    None when it cannot be: no libzstd, a size past MAX_DECOMPRESSED, or a bad frame."""
    if not entry.compressed:
        return entry.payload
    lib = _zstd()
    size = entry.decompressed_size
    if lib is None or not 0 < size <= MAX_DECOMPRESSED:
        return None
    out = ctypes.create_string_buffer(size)
    n = lib.ZSTD_decompress(out, size, entry.payload, len(entry.payload))
    if lib.ZSTD_isError(n) or n > size:
        return None
    return out.raw[:n]


_PRINTS = (b"vprintf", b"__assertfail")


def may_print(image: bytes) -> bool:
    """Whether a module image's code may write into the printf FIFO: it names vprintf or
    __assertfail (in its PTX, or its cubins' symbols), or pilot cannot read all of it (a
    compressed entry without libzstd, an image it cannot parse): then it may."""
    if any(name in image for name in _PRINTS):
        return True
    if not is_fatbin(image):
        return False
    try:
        entries = parse_entries(image)
    except ValueError:
        return True
    for entry in entries:
        if entry.compressed:
            data = entry_bytes(entry)
            if data is None or any(name in data for name in _PRINTS):
                return True
    return False
