#!/usr/bin/env python3
"""Builds a tracing stand-in for libcuda.so.1 that needs no knowledge of signatures.

    python3 gen_trace.py --out DIR [--real /path/to/libcuda.so.1] [--pool N] [--cc gcc]

reads the real library's exported functions from its ELF .dynsym (no binutils needed), writes
DIR/dt_tramp.S (one trampoline per export, `lock incq` of a counter then `jmp *` through the real
address, so arguments pass untouched, plus a pool of spare trampolines that cuGetProcAddress and
the export tables hand out), DIR/dt_table.c (names, sizes) and DIR/exports.txt, then links them
with tracer.c into DIR/libcuda.so.1 (SONAME libcuda.so.1). Put DIR first on LD_LIBRARY_PATH; the
stand-in dlopens the real library by the absolute path given here. Standalone on purpose (Python
3.8+, stdlib only): it runs on GPU machines where pilot is not installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Written in C by tracer.c (the trampoline slot keeps its index and counter).
WRAPPED = ("cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable")
SHT_DYNAMIC, SHT_DYNSYM, SHT_GNU_VERDEF = 6, 11, 0x6FFFFFFD
DT_NEEDED = 1
STT_FUNC, STT_GNU_IFUNC = 2, 10
STB_GLOBAL, STB_WEAK = 1, 2
CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
              "/usr/lib/wsl/lib/libcuda.so.1")


def find_real_libcuda(skip_dir: str | None = None) -> str | None:
    """The machine's libcuda.so.1: from `ldconfig -p`, else the usual places (never one in skip_dir)."""
    found: list[str] = []
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            if line.strip().startswith("libcuda.so.1 ") and "x86-64" in line and "=>" in line:
                found.append(line.split("=>", 1)[1].strip())
        break
    found += list(CANDIDATES)
    for path in found:
        if os.path.exists(path) and (skip_dir is None or
                                     os.path.dirname(os.path.realpath(path)) != os.path.realpath(skip_dir)):
            return os.path.realpath(path)
    return None


def elf_dynamic(path: str, data: bytes | None = None) -> dict:
    """The dynamic linking facts of a 64-bit little-endian ELF shared library, from its section
    headers: `functions`, the defined default-visibility global/weak functions of .dynsym in table
    order without repeats; `undefined`, the names it imports; `needed`, its DT_NEEDED entries;
    `versions`, whether it defines symbol versions (.gnu.version_d). `data`: the file, if read."""
    if data is None:
        data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff == 0 or shnum == 0:
        raise ValueError(f"{path}: no section headers")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, offset: int) -> str:
        return data[table + offset:data.index(b"\0", table + offset)].decode(errors="replace")

    out: dict = {"functions": [], "undefined": [], "needed": [],
                 "versions": any(sh[1] == SHT_GNU_VERDEF for sh in sections)}
    seen: set[str] = set()
    for _name, sh_type, _f, _a, off, size, link, _i, _al, _entsize in sections:
        stroff = sections[link][4]
        if sh_type == SHT_DYNAMIC:
            for k in range(size // 16):
                tag, val = struct.unpack_from("<qQ", data, off + 16 * k)
                if tag == DT_NEEDED:
                    out["needed"].append(string(stroff, val))
        if sh_type != SHT_DYNSYM:
            continue
        for k in range(1, size // 24):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, off + k * 24)
            bind, kind = st_info >> 4, st_info & 15
            if st_shndx == 0:
                if st_name:
                    out["undefined"].append(string(stroff, st_name))
                continue
            exported = (st_other & 3) == 0 and bind in (STB_GLOBAL, STB_WEAK)
            if not exported or kind not in (STT_FUNC, STT_GNU_IFUNC):
                continue
            name = string(stroff, st_name)
            if name and name not in seen:
                seen.add(name)
                out["functions"].append(name)
    return out


def dynamic_functions(path: str) -> tuple[list[str], bool]:
    """The exported functions of a shared library (elf_dynamic's `functions`) and `versions`."""
    info = elf_dynamic(path)
    return info["functions"], info["versions"]


def trampoline(label: str, index: int) -> str:
    """Counts the call, then jumps through the real address. The first 64 calls and every 1024th
    after take the slow path (dt_slow notes the calling library, all argument registers kept)."""
    c, r = f"dt_counts+{8 * index}(%rip)", f"dt_real+{8 * index}(%rip)"
    return (f"{label}:\n\tlock incq {c}\n\tcmpq $64, {c}\n\tjbe 1f\n\ttestq $1023, {c}\n\tjz 1f\n"
            f"\tjmp *{r}\n1:\tmovl ${index}, %r11d\n\tjmp dt_slow\n")


SLOW = """
\t.p2align 4
\t.type dt_slow,@function
dt_slow:\t/* r11 = slot; (%rsp) = the caller's return address */
\tpushq %rbp
\tmovq %rsp, %rbp
\tpushq %rdi; pushq %rsi; pushq %rdx; pushq %rcx; pushq %r8; pushq %r9; pushq %rax; pushq %r11
\tsubq $128, %rsp
\tmovdqu %xmm0, 0(%rsp); movdqu %xmm1, 16(%rsp); movdqu %xmm2, 32(%rsp); movdqu %xmm3, 48(%rsp)
\tmovdqu %xmm4, 64(%rsp); movdqu %xmm5, 80(%rsp); movdqu %xmm6, 96(%rsp); movdqu %xmm7, 112(%rsp)
\tmovq %r11, %rdi
\tmovq 8(%rbp), %rsi
\tcall dt_note_caller
\tmovdqu 0(%rsp), %xmm0; movdqu 16(%rsp), %xmm1; movdqu 32(%rsp), %xmm2; movdqu 48(%rsp), %xmm3
\tmovdqu 64(%rsp), %xmm4; movdqu 80(%rsp), %xmm5; movdqu 96(%rsp), %xmm6; movdqu 112(%rsp), %xmm7
\taddq $128, %rsp
\tpopq %r11; popq %rax; popq %r9; popq %r8; popq %rcx; popq %rdx; popq %rsi; popq %rdi
\tpopq %rbp
\tleaq dt_real(%rip), %r10
\tjmp *(%r10,%r11,8)
\t.size dt_slow, .-dt_slow
"""


def emit(names: list[str], pool: int, real: str, outdir: Path) -> None:
    total = len(names) + pool
    asm = ["/* generated by gen_trace.py: do not edit */", "\t.text"]
    for i, name in enumerate(names):
        if name in WRAPPED:
            continue
        asm += [f"\t.globl {name}", f"\t.type {name},@function", "\t.p2align 4", f".Ldt_e{i}:",
                trampoline(name, i),
                f"\t.size {name}, .-{name}"]
    for j in range(pool):
        asm += ["\t.p2align 4", trampoline(f".Ldt_pool{j}", len(names) + j)]
    asm.append(SLOW)
    asm += ["\t.section .data.rel.ro,\"aw\"", "\t.p2align 3", "\t.globl dt_tramp", "\t.hidden dt_tramp",
            "dt_tramp:"]
    asm += [f"\t.quad .Ldt_e{i}" if n not in WRAPPED else "\t.quad 0" for i, n in enumerate(names)]
    asm += [f"\t.quad .Ldt_pool{j}" for j in range(pool)]
    asm += ["\t.bss", "\t.p2align 6"]
    for sym in ("dt_counts", "dt_real"):
        asm += [f"\t.globl {sym}", f"\t.hidden {sym}", f"{sym}:", f"\t.zero {8 * total}"]
    asm.append('\t.section .note.GNU-stack,"",@progbits')
    (outdir / "dt_tramp.S").write_text("\n".join(asm) + "\n")
    table = ["/* generated by gen_trace.py: do not edit */", "#include <stddef.h>",
             f"const size_t dt_nexports = {len(names)};", f"const size_t dt_pool = {pool};",
             f"const char dt_real_path[] = {c_string(real)};", "const char *const dt_names[] = {"]
    table += [f"    {c_string(n)}," for n in names] + ["};"]
    (outdir / "dt_table.c").write_text("\n".join(table) + "\n")
    (outdir / "exports.txt").write_text("".join(n + "\n" for n in names))


def c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build(outdir: Path, cc: str) -> Path:
    lib = outdir / "libcuda.so.1"
    sources = [str(HERE / "tracer.c"), str(outdir / "dt_table.c"), str(outdir / "dt_tramp.S")]
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden",
           "-Wl,-soname,libcuda.so.1", "-o", str(lib), *sources, "-ldl", "-lpthread"]
    subprocess.run(cmd, check=True)
    return lib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="build directory (gets libcuda.so.1)")
    ap.add_argument("--real", help="the real libcuda.so.1 (default: found via ldconfig -p)")
    ap.add_argument("--pool", type=int, default=32768, help="spare trampolines (default 32768)")
    ap.add_argument("--cc", default=os.environ.get("CC") or shutil.which("gcc") or "cc")
    ap.add_argument("--no-build", action="store_true", help="only write the generated sources")
    args = ap.parse_args(argv)
    outdir = Path(args.out).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    real = args.real or find_real_libcuda(skip_dir=str(outdir))
    if not real:
        print(f"gen_trace: no libcuda.so.1 found (ldconfig -p, {', '.join(CANDIDATES)})", file=sys.stderr)
        return 2
    real = os.path.realpath(real)
    names, has_versions = dynamic_functions(real)
    missing = [w for w in WRAPPED if w not in names]
    if missing:
        print(f"gen_trace: note: {real} does not export {', '.join(missing)}", file=sys.stderr)
    if has_versions:
        print(f"gen_trace: warning: {real} defines symbol versions; the stand-in exports unversioned "
              "names (versioned references still bind to them, ld.so may warn)", file=sys.stderr)
    emit(names, args.pool, real, outdir)
    if not args.no_build:
        lib = build(outdir, args.cc)
        print(f"gen_trace: {lib}: {len(names)} exports of {real}, {args.pool} pool trampolines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
