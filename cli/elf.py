"""Which CUDA runtime a program links: a small reader of ELF dynamic sections (no pyelftools).

`pilot run` preloads the shim that stands in for the program's libcudart: libpilot.so for
`libcudart.so.13`, libpilot12.so for `libcudart.so.12`. The program's own DT_NEEDED entries say
which; a program that gets the runtime through a shared library of its own (found through its
RUNPATH/RPATH, LD_LIBRARY_PATH or the usual system directories) is followed there too.
"""

from __future__ import annotations

import os
import re
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
CUDART = re.compile(r"libcudart\.so\.(\d+)(?:\.|$)")
# Libraries that reach the GPU without the CUDA runtime pilot interposes: the driver API itself,
# and the CUDA libraries, which link the runtime statically and call libcuda (issue 13).
BYPASS = re.compile(r"lib(cuda|cublas|cublasLt|cudnn\w*|cufft\w*|cusparse\w*|cusolver\w*|curand"
                    r"|nvjpeg|npp\w*|nvrtc-builtins)\.so(\.|$)")
# The section of the fatbin wrappers a program hands the CUDA runtime to register its kernels
# (__cudaRegisterFatBinary): with no libcudart NEEDED it means the runtime was linked statically
# (nvcc's default, `-cudart static`). `.nv_fatbin` alone is not enough: nvcc puts one, with
# nothing to register, in host code it compiles, such as a driver API program's that loads its
# kernels from a file (the CUDA samples vectorAddDrv, matrixMulDrv; H100, 2026-11-27).
REGISTERED_FATBIN = ".nvFatBinSegment"
SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
               "/lib", "/usr/lib", "/usr/local/lib")
MAX_LIBRARIES = 64  # how many shared libraries a search reads at most


class NotElf(ValueError):
    """The file is not an ELF object this reader understands."""


@dataclass
class ElfDynamic:
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    sections: set[str] = field(default_factory=set)


class _Reader:
    def __init__(self, f, path: Path) -> None:
        self.f, self.path = f, path
        ident = self.read(0, 16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise NotElf(f"{path}: not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise NotElf(f"{path}: unknown ELF class or byte order")
        self.is64 = ident[4] == 2
        self.end = "<" if ident[5] == 1 else ">"

    def read(self, offset: int, size: int) -> bytes:
        self.f.seek(offset)
        return self.f.read(size)

    def unpack(self, fmt: str, offset: int) -> tuple:
        fmt = self.end + fmt
        data = self.read(offset, struct.calcsize(fmt))
        if len(data) < struct.calcsize(fmt):
            raise NotElf(f"{self.path}: truncated ELF file")
        return struct.unpack(fmt, data)

    def cstring(self, offset: int, limit: int = 4096) -> str:
        data = self.read(offset, limit)
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_dynamic(path: str | os.PathLike[str]) -> ElfDynamic:
    """The NEEDED, RPATH and RUNPATH entries and the section names of an ELF file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _read(_Reader(f, path))
    except OSError as exc:
        raise NotElf(f"{path}: {exc.strerror}") from exc


def _read(r: _Reader) -> ElfDynamic:
    if r.is64:
        (_, _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = r.unpack("16sHHIQQQIHHHHHH", 0)
        ph_fmt, dyn_fmt, sh_fmt = "IIQQQQQQ", "qQ", "IIQQQQIIQQ"
    else:
        (_, _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = r.unpack("16sHHIIIIIHHHHHH", 0)
        ph_fmt, dyn_fmt, sh_fmt = "IIIIIIII", "iI", "IIIIIIIIII"
    info = ElfDynamic()

    loads, dynamic = [], None
    for i in range(phnum):
        ph = r.unpack(ph_fmt, phoff + i * phentsize)
        if r.is64:
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = ph
        else:
            p_type, p_offset, p_vaddr, _, p_filesz, _, _, _ = ph
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)

    if dynamic is not None:
        entries, size = [], struct.calcsize(r.end + dyn_fmt)
        for off in range(dynamic[0], dynamic[0] + dynamic[1] - size + 1, size):
            tag, val = r.unpack(dyn_fmt, off)
            if tag == DT_NULL:
                break
            entries.append((tag, val))
        strtab = next((v for t, v in entries if t == DT_STRTAB), None)
        strtab_off = _file_offset(loads, strtab) if strtab is not None else None
        if strtab_off is not None:
            for tag, val in entries:
                if tag == DT_NEEDED:
                    info.needed.append(r.cstring(strtab_off + val))
                elif tag in (DT_RPATH, DT_RUNPATH):
                    dirs = [d for d in r.cstring(strtab_off + val).split(":") if d]
                    (info.rpath if tag == DT_RPATH else info.runpath).extend(dirs)

    if shoff and shnum and shstrndx < shnum:
        sh = [r.unpack(sh_fmt, shoff + i * shentsize) for i in range(shnum)]
        names_off = sh[shstrndx][4]  # sh_offset
        info.sections = {r.cstring(names_off + s[0], 256) for s in sh}
    return info


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int | None:
    for seg_vaddr, seg_offset, seg_filesz in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_filesz:
            return seg_offset + vaddr - seg_vaddr
    return None


def cudart_majors(needed: Iterable[str]) -> set[int]:
    """{12} for ["libcudart.so.12", "libc.so.6"]: the CUDA runtimes a NEEDED list names."""
    return {int(m.group(1)) for n in needed if (m := CUDART.match(os.path.basename(n)))}


@dataclass
class CudartLink:
    """How a program reaches the CUDA runtime."""

    majors: set[int]                 # libcudart.so.N it needs, directly or through its libraries
    via: dict[int, Path]             # N -> the object whose NEEDED names it
    device_code: bool = False        # registers kernels with a runtime (with no libcudart: static)
    bypass: dict[str, Path] = field(default_factory=dict)  # BYPASS library -> the object needing it


def find_cudart(program: str | os.PathLike[str], env: dict[str, str] | None = None) -> CudartLink:
    """The libcudart major versions `program` needs: its own NEEDED entries, then (if they name
    none) those of the shared libraries it loads, searched as the dynamic loader would (RPATH,
    LD_LIBRARY_PATH, RUNPATH, system directories; not ld.so.cache). Raises NotElf."""
    env = os.environ if env is None else env
    program = Path(program)
    top = read_dynamic(program)
    link = CudartLink(set(), {}, device_code=REGISTERED_FATBIN in top.sections)
    _note(link, top.needed, program)
    from_program = set(link.majors)  # the program's own NEEDED win over its libraries'
    ld_path = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    queue = deque([(program, top)])
    seen = {program.resolve()}
    while queue and len(seen) <= MAX_LIBRARIES:
        obj, dyn = queue.popleft()
        origin = str(obj.resolve().parent)
        dirs = [] if dyn.runpath else dyn.rpath
        dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                for d in [*dirs, *ld_path, *dyn.runpath]] + list(SYSTEM_DIRS)
        for name in dyn.needed:
            lib = _locate(name, dirs)
            if lib is None or lib.resolve() in seen:
                continue
            seen.add(lib.resolve())
            try:
                sub = read_dynamic(lib)
            except NotElf:
                continue
            _note(link, sub.needed, lib)
            queue.append((lib, sub))
    if from_program:
        link.majors = from_program
        link.via = {m: p for m, p in link.via.items() if m in from_program}
    return link


def _note(link: CudartLink, needed: list[str], obj: Path) -> None:
    for major in cudart_majors(needed):
        link.majors.add(major)
        link.via.setdefault(major, obj)
    for name in needed:
        if BYPASS.match(os.path.basename(name)):
            link.bypass.setdefault(os.path.basename(name), obj)


def _locate(name: str, dirs: list[str]) -> Path | None:
    if "/" in name:
        return Path(name) if Path(name).is_file() else None
    for d in dirs:
        cand = Path(d) / name
        if cand.is_file():
            return cand
    return None
