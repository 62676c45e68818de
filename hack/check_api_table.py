#!/usr/bin/env python3
"""Consistency guard for the shim's hook tables (shim/tables/cudart_exports.tsv, cudart12_exports.tsv).

libpilot.so stands in for libcudart.so.13, so it must export every symbol the real
library exports (a missing one makes the dynamic loader fail the whole program) and
nothing else.  The table is the single list of those symbols: hand-written code in
shim/*.c implements the rows marked ``impl``; hack/gen_shim_tables.py generates a
logging stub for every ``stub`` row.  This script checks that the table, the real
library, the CUDA headers, the hand-written sources and (optionally) the built
library agree.  It needs neither a GPU nor a compiler; checks whose inputs are
absent print [SKIP].

The CUDA 12 build (libpilot12.so) has its own table, shim/tables/cudart12_exports.tsv, one row per
libcudart.so.12 export with status ``as13`` (the same ABI as the CUDA 13 export of that name:
the 13 table decides how it is served), ``impl`` (defined in shim/runtime/cuda12/cuda12_*.c) or ``stub``.
It is checked the same way against libcudart.so.12, its headers, shim/runtime/cuda12/cuda12_*.c and the
built library, and every ``as13`` row is checked to really have CUDA 13's ABI: the same
prototype in the 12 and 13 headers, and no structure whose layout differs between them.
The 12.x library and headers come from PyPI's nvidia-cuda-runtime-cu12 (a test dependency).

The driver API library (libpilot-cuda.so, SONAME libcuda.so.1) has the table
shim/tables/cuda_driver_exports.tsv (name, status: ``impl`` in shim/driver/drv_*.c or ``stub``,
generated). It is
checked against the exports the driver headers declare (cuda.h, cudaProfiler.h: the declared
names, the versions cuda.h maps them to and their per-thread-stream forms), a real libcuda.so.1
when one is found (every export of it but the GL/EGL/VDPAU interop ones must be a row), the
hand-written sources and the built library (exactly the table, unversioned, like libcuda). The
built libpilot.so may export one symbol beyond libcudart's: pilot_driver_ops@PILOT_PRIVATE_1,
the driver library's way into the shim's session (shim/bridge/driver_ops.h).

Usage: python3 hack/check_api_table.py [--cuda {12,13}] [--table TSV] [--shim-dir DIR]
                                       [--cudart LIB] [--include DIR] [--lib libpilot.so]
                                       [--table12 TSV] [--cudart12 LIB] [--include12 DIR]
                                       [--lib12 libpilot12.so]
Checks both tables unless --cuda names one. Prints [ERROR]/[SKIP]/[OK] lines and finally
[PASS] (exit 0) or [FAIL] (exit 1).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = REPO / "shim" / "tables" / "cudart_exports.tsv"
DEFAULT_SHIM_DIR = REPO / "shim"
VERSION = "libcudart.so.13"
DEFAULT_TABLE12 = REPO / "shim" / "tables" / "cudart12_exports.tsv"
VERSION12 = "libcudart.so.12"
CUDA12_SOURCES = "cuda12_*.c"  # the CUDA 12 build's own sources; the 13 build leaves them out
DEFAULT_DRIVER_TABLE = REPO / "shim" / "tables" / "cuda_driver_exports.tsv"
DRIVER_SOURCES = "drv_*.c"
DRIVER_STATUSES = frozenset(("impl", "stub"))
# Exports of the real libcuda for OpenGL, EGL and VDPAU interop: declared in headers that need
# those libraries' own headers, so the table leaves them out (programs using them are refused
# by the loader's symbol lookup, as they would be with no GL).
DRIVER_INTEROP = re.compile(r"cu(Graphics)?(GL|WGL|EGL|VDPAU|Vdpau)")
# libpilot.so's own exports beyond libcudart's (shim/build.py PRIVATE_NODE, PRIVATE_EXPORTS).
PRIVATE_NODE = "PILOT_PRIVATE_1"
PRIVATE_EXPORTS = ("pilot_driver_ops",)


def _libc_overrides() -> tuple[str, ...]:
    """shim/build.py's LIBC_OVERRIDES (read, not imported: build.py needs cffi)."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "shim" / "build.py").read_text())
    for node in tree.body:
        names = [getattr(t, "id", "") for t in getattr(node, "targets", [])]
        if isinstance(node, ast.Assign) and "LIBC_OVERRIDES" in names:
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("shim/build.py defines no LIBC_OVERRIDES")


LIBC_OVERRIDES = _libc_overrides()
COLUMNS = ("name", "section", "ret", "status")
SECTIONS = frozenset(
    "registration device error stream event execution occupancy memory unified peer "
    "interop texture graph driver-entry version profiler other".split()
)
# struct: returns a structure by value (only cudaCreateChannelDesc).
RETS = frozenset(("err", "void", "ptr", "char", "uint", "struct"))
STATUSES = frozenset(("impl", "stub"))
STATUSES12 = frozenset(("as13", "impl", "stub"))
# Headers that declare the exported entry points (relative to the include dir).
HEADERS = (
    "cuda_runtime_api.h",
    "cuda_profiler_api.h",
    "cuda_gl_interop.h",
    "cuda_egl_interop.h",
    "cuda_vdpau_interop.h",
    "crt/host_runtime.h",
    "crt/device_functions.h",
)
# Headers whose structures and typedefs the ABI comparison of the two tables reads.
TYPE_HEADERS = (
    "driver_types.h",
    "texture_types.h",
    "surface_types.h",
    "vector_types.h",
    "library_types.h",
    "cuda_runtime_api.h",
)
# Structures whose text differs between CUDA 12.9 and 13 with the same layout.
SAME_LAYOUT = {
    "cudaLaunchAttributeValue": "13 adds a member inside the union's 64-byte pad",
}
MAX_LIST = 10


@dataclass(frozen=True)
class Row:
    name: str
    section: str
    ret: str
    status: str
    line: int


class Report:
    """Collects [ERROR] lines; long lists are cut to the first MAX_LIST items."""

    def __init__(self) -> None:
        self.failed = False

    def error(self, msg: str, items: list[str] | None = None) -> None:
        self.failed = True
        if items is None:
            print(f"[ERROR] {msg}")
            return
        shown = ", ".join(items[:MAX_LIST])
        more = f" +{len(items) - MAX_LIST} more" if len(items) > MAX_LIST else ""
        print(f"[ERROR] {msg} ({len(items)}): {shown}{more}")

    @staticmethod
    def skip(msg: str) -> None:
        print(f"[SKIP] {msg}")

    @staticmethod
    def ok(msg: str) -> None:
        print(f"[OK] {msg}")


# ---------------------------------------------------------------- table


def read_table(path: Path, rep: Report, statuses: frozenset[str] = STATUSES) -> list[Row]:
    """Parse the TSV (header line first, ``#`` lines ignored), reporting bad rows."""
    rows: list[Row] = []
    header_seen = False
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = raw.split("\t")
        if not header_seen:
            header_seen = True
            if tuple(fields) != COLUMNS:
                rep.error(
                    f"{path.name}:{lineno}: header must be {'<TAB>'.join(COLUMNS)}, got {raw!r}"
                )
            continue
        if len(fields) != len(COLUMNS):
            rep.error(
                f"{path.name}:{lineno}: expected {len(COLUMNS)} tab-separated columns, "
                f"got {len(fields)}"
            )
            continue
        name, section, ret, status = (f.strip() for f in fields)
        bad = []
        if not re.fullmatch(r"_*cuda\w+", name):
            bad.append(f"name {name!r}")
        if section not in SECTIONS:
            bad.append(f"section {section!r}")
        if ret not in RETS:
            bad.append(f"ret {ret!r}")
        if status not in statuses:
            bad.append(f"status {status!r}")
        if bad:
            rep.error(f"{path.name}:{lineno}: invalid " + ", ".join(bad))
            continue
        rows.append(Row(name, section, ret, status, lineno))
    if not header_seen:
        rep.error(f"{path.name}: empty table")
    return rows


def check_duplicates(rows: list[Row], rep: Report) -> None:
    seen: dict[str, int] = {}
    dups = []
    for r in rows:
        if r.name in seen:
            dups.append(f"{r.name} (lines {seen[r.name]}, {r.line})")
        else:
            seen[r.name] = r.line
    if dups:
        rep.error("duplicate rows", dups)


# ---------------------------------------------------------------- exports (nm)


def cuda_roots() -> list[Path]:
    roots = []
    if os.environ.get("CUDA_HOME"):
        roots.append(Path(os.environ["CUDA_HOME"]))
    roots.append(Path("/usr/local/cuda"))
    return roots


def find_cudart() -> Path | None:
    for root in cuda_roots():
        cand = root / "lib64" / VERSION
        if cand.exists():
            return cand
    return None


def find_include() -> Path | None:
    for root in cuda_roots():
        if (root / "include" / "cuda_runtime_api.h").exists():
            return root / "include"
    return None


def cuda12_roots() -> list[Path]:
    """Where a CUDA 12 runtime may be: PyPI's nvidia-cuda-runtime-cu12, then /usr/local/cuda-12*."""
    roots = []
    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    roots += sorted(Path("/usr/local").glob("cuda-12*"), reverse=True)
    return roots


def find_cudart12() -> Path | None:
    for root in cuda12_roots():
        for sub in ("lib", "lib64"):
            if (root / sub / VERSION12).exists():
                return root / sub / VERSION12
    return None


def find_include12() -> Path | None:
    for root in cuda12_roots():
        if (root / "include" / "cuda_runtime_api.h").exists():
            return root / "include"
    return None


def dynamic_exports(lib: Path) -> list[tuple[str, str | None]]:
    """Defined dynamic symbols of ``lib`` as (name, version or None), via ``nm -D``.

    The version-definition symbol itself (an ``A`` symbol named like the version)
    is left out.
    """
    out = subprocess.run(
        ["nm", "-D", "--defined-only", "--with-symbol-versions", str(lib)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    syms: list[tuple[str, str | None]] = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, sym = parts[-2], parts[-1]
        name, _, version = sym.replace("@@", "@").partition("@")
        if kind == "A" and (name == version or not version):
            continue
        syms.append((name, version or None))
    return syms


def check_against_cudart(
    rows: list[Row], cudart: Path | None, rep: Report, version: str = VERSION
) -> None:
    if cudart is None or not cudart.exists():
        how = "set CUDA_HOME or --cudart" if version == VERSION else (
            "pip install nvidia-cuda-runtime-cu12, or --cudart12")
        rep.skip(f"table == {version} exports: library not found ({how})")
        return
    if shutil.which("nm") is None:
        rep.skip(f"table == {version} exports: nm not installed")
        return
    real = {n for n, v in dynamic_exports(cudart) if v == version}
    table = {r.name for r in rows}
    missing = sorted(real - table)
    extra = sorted(table - real)
    if missing:
        rep.error(f"exported by {cudart} but not in the table", missing)
    if extra:
        rep.error(f"in the table but not exported by {cudart}", extra)
    if not missing and not extra:
        rep.ok(f"table matches the {len(real)} exports of {cudart}")


def check_built_lib(rows: list[Row], lib: Path, rep: Report, version: str = VERSION) -> None:
    """The shim must export exactly the table's names, each as name@@<version>."""
    if not lib.exists():
        rep.error(f"--lib {lib}: no such file")
        return
    if shutil.which("nm") is None:
        rep.error("--lib given but nm is not installed")
        return
    exported = dynamic_exports(lib)
    private = {n: v for n, v in exported if n in PRIVATE_EXPORTS}
    if private != dict.fromkeys(PRIVATE_EXPORTS, PRIVATE_NODE):
        rep.error(f"{lib.name} must export {', '.join(PRIVATE_EXPORTS)} @{PRIVATE_NODE} only",
                  sorted(f"{n}@{v}" for n, v in private.items()) or ["none exported"])
    exported = [(n, v) for n, v in exported if n not in private]
    # libc functions the shim overrides (shim/build.py LIBC_OVERRIDES), under glibc's version
    overrides = {n: v for n, v in exported if n in LIBC_OVERRIDES}
    names = {n for n, _ in exported} - set(overrides)
    table = {r.name for r in rows}
    missing = sorted(table - names)
    extra = sorted(names - table)
    badver = sorted(f"{n}@{v}" for n, v in exported if n in table and v != version)
    badver += sorted(f"{n}@{v}" for n, v in overrides.items() if not v.startswith("GLIBC_"))
    if set(overrides) != set(LIBC_OVERRIDES):
        rep.error(f"{lib.name} lacks libc overrides", sorted(set(LIBC_OVERRIDES) - set(overrides)))
    if missing:
        rep.error(f"{lib.name} lacks table symbols", missing)
    if extra:
        rep.error(f"{lib.name} exports symbols outside the table", extra)
    if badver:
        rep.error(f"{lib.name} symbols without version {version}", badver)
    if not (missing or extra or badver):
        rep.ok(f"{lib.name} exports exactly the {len(table)} table symbols @{version}, and "
               f"{', '.join(LIBC_OVERRIDES)} @GLIBC")


# ---------------------------------------------------------------- C parsing


def strip_c(text: str) -> str:
    """Blank out comments, string/char literals and preprocessor lines.

    Newlines are kept so positions stay meaningful; literals become empty so
    braces inside them do not confuse the brace counting below.
    """
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # preprocessor directive, including backslash continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        out.append(c)
        i += 1
    return "".join(out)


def classify_ret(decl_prefix: str) -> str | None:
    """Map the text before a function's name to a ret class (None if unknown)."""
    text = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", " ", decl_prefix)
    if "*" in text:
        return "ptr"
    words = set(re.findall(r"\w+", text))
    if "unsigned" in words:
        return "uint"
    if words & {"cudaError_t", "cudaError", "int"}:  # int: same ABI as the enum
        return "err"
    if "struct" in words:
        return "struct"
    if "void" in words:
        return "void"
    if "char" in words:
        return "char"
    return None


DECL_RE = re.compile(r'\bextern\s+(?:"C"\s+)?(?P<ret>[^;{}()]*?)\bCUDARTAPI\s+(?P<name>\w+)\s*\(')


def _header_text(path: Path) -> str:
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(errors="replace"), flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_decls(include: Path) -> dict[str, set[str | None]]:
    """ret classes of every ``extern ... CUDARTAPI name(`` in the runtime headers."""
    decls: dict[str, set[str | None]] = {}
    for rel in HEADERS:
        path = include / rel
        if not path.exists():
            continue
        for m in DECL_RE.finditer(_header_text(path)):
            decls.setdefault(m.group("name"), set()).add(classify_ret(m.group("ret")))
    return decls


# Words of a declaration that say nothing about the ABI.
_NOISE = re.compile(r"\b(?:__\w+__|__CUDA_DEPRECATED|CUDART_DEVICE|CUDARTAPI|CUDART_CB|extern)\b"
                    r"|__dv\s*\((?:[^()]|\([^()]*\))*\)|\"C\"")
_TYPE_WORDS = frozenset("void char short int long float double signed unsigned const volatile "
                        "struct enum union size_t".split())


def _param_type(param: str) -> str:
    """``const void *devPtr`` -> ``const void *``: a parameter without its name."""
    p = " ".join(_NOISE.sub(" ", param).replace("*", " * ").split())
    p = re.sub(r"\s*\[[^\]]*\]$", " *", p)  # arrays decay to pointers
    words = p.split()
    if len(words) > 1 and re.fullmatch(r"[A-Za-z_]\w*", words[-1]) and words[-1] not in _TYPE_WORDS:
        words = words[:-1]
    return " ".join(words)


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def header_prototypes(include: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (return type, parameter types) of every runtime function the headers declare."""
    protos: dict[str, tuple[str, tuple[str, ...]]] = {}
    for rel in HEADERS:
        path = include / rel
        if not path.exists():
            continue
        text = _header_text(path)
        for m in DECL_RE.finditer(text):
            end = _match_paren(text, m.end() - 1)
            if end < 0:
                continue
            ret = " ".join(_NOISE.sub(" ", m.group("ret")).replace("*", " * ").split())
            params = tuple(_param_type(p) for p in _split_params(text[m.end() : end - 1]))
            protos[m.group("name")] = (ret, params)
    return protos


def header_types(include: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(struct/union name -> normalized body, typedef name -> the type names it stands for)."""
    bodies: dict[str, str] = {}
    typedefs: dict[str, set[str]] = {}
    for rel in TYPE_HEADERS:
        path = include / rel
        if not path.exists():
            continue
        text = re.sub(r"^\s*#.*$", "", _header_text(path), flags=re.M)
        for m in re.finditer(r"\b(?:struct|union)\s+(?:__\w+__\s+)*(\w+)\s*\{", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            bodies[m.group(1)] = " ".join(text[m.end() : i - 1].split())
        flat = text
        n = 1
        while n:  # bodies out, innermost first: `typedef struct X {...} Y;` -> `... X @ Y;`
            flat, n = re.subn(r"\{[^{}]*\}", " @ ", flat)
        for m in re.finditer(r"\btypedef\s+([^;]*?)\b(\w+)\s*;", flat):
            typedefs.setdefault(m.group(2), set()).update(re.findall(r"\w+", m.group(1)))
    return bodies, typedefs


def changed_types(include12: Path, include13: Path) -> set[str]:
    """Names of structures (and typedefs of them, and structures holding them) whose layout
    text differs between the two header sets."""
    bodies12, typedefs12 = header_types(include12)
    bodies13, _ = header_types(include13)
    changed = {n for n, body in bodies12.items()
               if bodies13.get(n) != body and n not in SAME_LAYOUT}
    grew = True
    while grew:  # what contains or names a changed type has changed too
        grew = False
        for name, body in bodies12.items():
            if name not in changed and changed & set(re.findall(r"\w+", body)):
                changed.add(name)
                grew = True
        for name, words in typedefs12.items():
            if name not in changed and changed & words:
                changed.add(name)
                grew = True
    return changed


def twin(name: str) -> str:
    """cudaMemcpy_ptds -> cudaMemcpy: per-thread variants share their twin's signature."""
    return re.sub(r"_pt[sd][sz]$", "", name)


@dataclass(frozen=True)
class Definition:
    name: str
    file: str
    line: int
    static: bool
    ret: str | None


def _match_paren(text: str, i: int) -> int:
    """Index just past the ')' matching the '(' at text[i], or -1."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


ATTR_RE = re.compile(r"\s*(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)*")


def top_level_definitions(text: str, filename: str) -> list[Definition]:
    """Function definitions at file scope: ``name ( ... ) [attributes] {``.

    Definitions produced by macros are not seen; spell shim entry points out.
    """
    code = strip_c(text)
    defs: list[Definition] = []
    depth = 0
    stmt_start = 0
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                stmt_start = i + 1
        elif c == ";" and depth == 0:
            stmt_start = i + 1
        elif (
            depth == 0
            and (c.isalpha() or c == "_")
            and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_"))
        ):
            m = re.match(r"\w+", code[i:])
            assert m is not None
            name = m.group(0)
            j = i + len(name)
            k = j
            while k < n and code[k].isspace():
                k += 1
            if k < n and code[k] == "(":
                end = _match_paren(code, k)
                if end > 0:
                    after = ATTR_RE.match(code, end)
                    pos = after.end() if after else end
                    if pos < n and code[pos] == "{":
                        prefix = code[stmt_start:i]
                        defs.append(
                            Definition(
                                name,
                                filename,
                                code.count("\n", 0, i) + 1,
                                bool(re.search(r"\bstatic\b", prefix)),
                                classify_ret(prefix),
                            )
                        )
                        # skip the body
                        depth = 1
                        i = pos + 1
                        continue
                    i = end
                    continue
            i = j
            continue
        i += 1
    return defs


def shared_sources(shim_dir: Path) -> list[Path]:
    """The sources both builds compile (every shim/**/*.c but the CUDA 12 build's own)."""
    return sorted(p for p in shim_dir.rglob("*.c") if not fnmatch.fnmatch(p.name, CUDA12_SOURCES))


def shim_file(shim_dir: Path, name: str) -> Path:
    """The file `name` in shim_dir's folders (shim/tables/, shim/libs/, ...), else shim_dir/name."""
    return next(iter(sorted(shim_dir.rglob(name))), shim_dir / name)


def check_sources(
    rows: list[Row], shim_dir: Path, rep: Report, sources: list[Path] | None = None,
    pattern: str = "*.c", prefix: str = r"_*cuda",
) -> None:
    """impl rows are defined once in ``sources`` (default: the shared ones), stub rows never,
    and every cuda* function defined there is a row."""
    if sources is None:
        sources = shared_sources(shim_dir)
    if not sources:
        rep.error(f"no hand-written sources {shim_dir}/{pattern}")
    defs: dict[str, list[Definition]] = {}
    for src in sources:
        for d in top_level_definitions(src.read_text(errors="replace"), src.name):
            defs.setdefault(d.name, []).append(d)
    by_name = {r.name: r for r in rows}

    def where(ds: list[Definition]) -> str:
        return " and ".join(f"{d.file}:{d.line}" for d in ds)

    missing, multiple, statics, stub_defined, unknown, wrong_ret = [], [], [], [], [], []
    for r in rows:
        ds = defs.get(r.name, [])
        if r.status == "impl":
            if not ds:
                missing.append(r.name)
            elif len(ds) > 1:
                multiple.append(f"{r.name} ({where(ds)})")
            elif ds[0].static:
                statics.append(f"{r.name} ({where(ds)})")
        elif ds:
            stub_defined.append(f"{r.name} ({where(ds)})")
        for d in ds:
            if d.ret is not None and d.ret != r.ret:
                wrong_ret.append(
                    f"{r.name} ({d.file}:{d.line} returns {d.ret}, table says {r.ret})"
                )
    for name, ds in sorted(defs.items()):
        if re.match(prefix, name) and name not in by_name and not all(d.static for d in ds):
            unknown.append(f"{name} ({where(ds)})")
    if missing:
        rep.error(f"impl rows with no definition in {shim_dir}/{pattern}", missing)
    if multiple:
        rep.error("impl rows defined more than once", multiple)
    if statics:
        rep.error("impl rows defined static (would not be exported)", statics)
    if stub_defined:
        rep.error(
            "stub rows defined by hand (mark them impl, or the generated stub clashes)",
            stub_defined,
        )
    if unknown:
        rep.error(f"{prefix.lstrip('_*')}* functions defined in the shim but absent from the table",
                  unknown)
    if wrong_ret:
        rep.error("definitions whose return type disagrees with the table", wrong_ret)
    if sources and not (missing or multiple or statics or stub_defined or unknown or wrong_ret):
        rep.ok(f"{len(sources)} shim sources ({pattern}) agree with the table")


def check_headers(rows: list[Row], include: Path | None, rep: Report) -> None:
    if include is None or not (include / "cuda_runtime_api.h").exists():
        rep.skip("ret column vs CUDA headers: headers not found (set CUDA_HOME or --include)")
        return
    decls = header_decls(include)
    wrong = []
    for r in rows:
        key = r.name if r.name in decls else twin(r.name)
        if key not in decls:
            continue  # undeclared internal entry point: table is the only source
        if r.ret not in decls[key]:
            got = "/".join(sorted(str(c) for c in decls[key]))
            via = "" if key == r.name else f" via {key}"
            wrong.append(f"{r.name} (table {r.ret}, header{via} {got})")
    if wrong:
        rep.error("ret disagrees with the CUDA headers", wrong)
    else:
        rep.ok(f"ret column agrees with the declarations in {include}")


class AbiComparison:
    """How a function's ABI differs between two header sets (CUDA 12's and CUDA 13's)."""

    def __init__(self, include12: Path, include13: Path) -> None:
        self.protos12 = header_prototypes(include12)
        self.protos13 = header_prototypes(include13)
        self.changed = changed_types(include12, include13)

    def difference(self, name: str) -> str | None:
        """None if ``name`` has the same ABI in both (or is declared in neither), else why not."""
        p12, p13 = self.protos12, self.protos13
        key = name if name in p12 and name in p13 else twin(name)
        if key not in p12 or key not in p13:
            return None  # undeclared entry point (registration): nothing to compare
        if p12[key] != p13[key]:
            return "prototype"
        words = set(re.findall(r"\w+", " ".join((p12[key][0], *p12[key][1]))))
        hit = sorted(words & self.changed)
        return f"struct {hit[0]}" if hit else None


def check_table12(rows12: list[Row], rows13: list[Row], rep: Report) -> None:
    """as13 rows name a CUDA 13 export with the same return class."""
    by13 = {r.name: r for r in rows13}
    absent, wrong_ret = [], []
    for r in rows12:
        if r.status != "as13":
            continue
        if r.name not in by13:
            absent.append(r.name)
        elif by13[r.name].ret != r.ret:
            wrong_ret.append(f"{r.name} (12 table {r.ret}, 13 table {by13[r.name].ret})")
    if absent:
        rep.error("as13 rows that are no libcudart.so.13 export (mark them impl or stub)", absent)
    if wrong_ret:
        rep.error("as13 rows whose ret differs from the 13 table", wrong_ret)
    if not (absent or wrong_ret):
        n = sum(r.status == "as13" for r in rows12)
        rep.ok(f"{n} as13 rows are libcudart.so.13 exports")


def check_abi12(
    rows12: list[Row], rows13: list[Row], include12: Path | None, include13: Path | None,
    rep: Report,
) -> None:
    """as13 means the same ABI: the same prototype in both header sets and no parameter whose
    structure changed layout. Conversely a 13 export marked stub must really differ."""
    if include12 is None or not (include12 / "cuda_runtime_api.h").exists():
        rep.skip("as13 rows vs CUDA 12 headers: not found (pip install nvidia-cuda-runtime-cu12)")
        return
    if include13 is None or not (include13 / "cuda_runtime_api.h").exists():
        rep.skip("as13 rows vs CUDA 13 headers: not found (set CUDA_HOME or --include)")
        return
    differs = AbiComparison(include12, include13).difference
    names13 = {r.name for r in rows13}
    not_same, needless = [], []
    for r in rows12:
        why = differs(r.name) if r.name in names13 else None
        if r.status == "as13" and why:
            not_same.append(f"{r.name} ({why})")
        elif r.status == "stub" and r.name in names13 and why is None:
            needless.append(r.name)
    if not_same:
        rep.error("as13 rows whose CUDA 12 ABI differs from CUDA 13's (mark them impl or stub)",
                  not_same)
    if needless:
        rep.error("stub rows with CUDA 13's ABI (mark them as13)", needless)
    if not (not_same or needless):
        rep.ok(f"as13 rows have the same ABI in {include12} and {include13}")


# ---------------------------------------------------------------- the driver API table


def _gen_tables_module():
    """hack/gen_shim_tables.py (its driver_api reads the headers the same way the build does)."""
    spec = importlib.util.spec_from_file_location("pilot_gen_shim_tables",
                                                  Path(__file__).resolve().parent / "gen_shim_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pilot_gen_shim_tables", module)
    spec.loader.exec_module(module)
    return module


def read_driver_table(path: Path, rep: Report) -> list[Row]:
    """Rows of the driver table (name, status); section and ret are fixed (every driver entry
    point returns CUresult)."""
    rows: list[Row] = []
    header_seen = False
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = [f.strip() for f in raw.split("\t")]
        if not header_seen:
            header_seen = True
            if fields != ["name", "status"]:
                rep.error(f"{path.name}:{lineno}: header must be name<TAB>status, got {raw!r}")
            continue
        if len(fields) != 2 or not re.fullmatch(r"cu\w+", fields[0]) or \
                fields[1] not in DRIVER_STATUSES:
            rep.error(f"{path.name}:{lineno}: invalid row {raw!r}")
            continue
        rows.append(Row(fields[0], "driver", "err", fields[1], lineno))
    if not header_seen:
        rep.error(f"{path.name}: empty table")
    return rows


def find_libcuda() -> Path | None:
    """A real libcuda: the toolkit's stub, else the driver's."""
    cands = [root / "lib64" / "stubs" / "libcuda.so" for root in cuda_roots()]
    cands += [Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), Path("/usr/lib64/libcuda.so.1"),
              Path("/usr/lib/aarch64-linux-gnu/libcuda.so.1")]
    return next((c for c in cands if c.exists()), None)


def check_driver_headers(rows: list[Row], include: Path | None, rep: Report) -> None:
    if include is None or not (include / "cuda.h").exists():
        rep.skip("driver table == cuda.h exports: headers not found (set CUDA_HOME or --include)")
        return
    declared = _gen_tables_module().driver_api(include).exports
    table = {r.name for r in rows}
    if declared - table:
        rep.error("declared by the driver headers but not in the driver table",
                  sorted(declared - table))
    if table - declared:
        rep.error("in the driver table but not declared by the driver headers",
                  sorted(table - declared))
    if declared == table:
        rep.ok(f"driver table matches the {len(declared)} exports the headers in {include} declare")


def check_against_libcuda(rows: list[Row], libcuda: Path | None, rep: Report) -> None:
    if libcuda is None or not libcuda.exists():
        rep.skip("driver table vs a real libcuda.so.1: none found (--libcuda)")
        return
    if shutil.which("nm") is None:
        rep.skip("driver table vs a real libcuda.so.1: nm not installed")
        return
    real = {n for n, _ in dynamic_exports(libcuda) if n.startswith("cu")}
    table = {r.name for r in rows}
    missing = sorted(n for n in real - table if not DRIVER_INTEROP.match(n))
    extra = sorted(table - real)
    if missing:
        rep.error(f"exported by {libcuda} but not in the driver table", missing)
    if extra:
        rep.error(f"in the driver table but not exported by {libcuda}", extra)
    if not missing and not extra:
        rep.ok(f"driver table matches the exports of {libcuda} (interop ones aside)")


def check_driver_lib(rows: list[Row], lib: Path, rep: Report) -> None:
    """libpilot-cuda.so exports exactly the table, unversioned."""
    if not lib.exists():
        rep.error(f"--libdrv {lib}: no such file")
        return
    if shutil.which("nm") is None:
        rep.error("--libdrv given but nm is not installed")
        return
    exported = dynamic_exports(lib)
    names = {n for n, _ in exported}
    table = {r.name for r in rows}
    versioned = sorted(f"{n}@{v}" for n, v in exported if v)
    if table - names:
        rep.error(f"{lib.name} lacks driver table symbols", sorted(table - names))
    if names - table:
        rep.error(f"{lib.name} exports symbols outside the driver table", sorted(names - table))
    if versioned:
        rep.error(f"{lib.name} exports versioned symbols (libcuda's are not)", versioned)
    if names == table and not versioned:
        rep.ok(f"{lib.name} exports exactly the {len(table)} driver table symbols, unversioned")


def run_checks_driver(args: argparse.Namespace, rep: Report) -> list[Row]:
    rows = read_driver_table(args.driver_table, rep)
    check_duplicates(rows, rep)
    check_driver_headers(rows, args.include or find_include(), rep)
    check_against_libcuda(rows, args.libcuda or find_libcuda(), rep)
    sources = sorted(args.shim_dir.rglob(DRIVER_SOURCES))
    check_sources(rows, args.shim_dir, rep, sources, DRIVER_SOURCES, prefix=r"cu[A-Z]")
    if args.libdrv is not None:
        check_driver_lib(rows, args.libdrv, rep)
    return rows


# ---------------------------------------------------------------- the CUDA library stand-ins

# table file -> (SONAME and version node, hand-written source, exported-name pattern)
LIBRARY_TABLES = {
    "cublas_exports.tsv": ("libcublas.so.13", "cublas_api.c", r"cublas(?!Lt)"),
    "cublasLt_exports.tsv": ("libcublasLt.so.13", "cublaslt_api.c", r"cublasLt"),
    "cudnn_exports.tsv": ("libcudnn.so.9", "cudnn_api.c", r"cudnn"),
}
# The tables cuBLAS's `gen` rows are generated from: the generic path, the typed GEMMs.
GENERATED_TABLES = ("cublas_calls.tsv", "cublas_gemms.tsv")
LIBRARY_RETS = frozenset({"status", "void", "int", "size", "ptr", "float", "double", "complex",
                          "dcomplex"})


def read_library_table(path: Path, rep: Report) -> list[Row]:
    """Rows of a stand-in's table (name, status, ret)."""
    rows: list[Row] = []
    header = None
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if header is None:
            header = fields
            if fields != ["name", "status", "ret"]:
                rep.error(f"{path.name}: header must be name, status, ret")
                return rows
            continue
        if len(fields) != 3 or fields[1] not in STATUSES | {"gen"} or fields[2] not in LIBRARY_RETS:
            rep.error(f"{path.name}:{lineno}: bad row", [line])
            continue
        # the C checks compare pointer and void returns only
        ret = fields[2] if fields[2] in ("ptr", "void") else ""
        rows.append(Row(fields[0], "library", ret, fields[1], lineno))
    return rows


def check_library_lib(rows: list[Row], lib: Path, version: str, rep: Report) -> None:
    """A stand-in (or NVIDIA's library, for the table) exports exactly the table @version."""
    if not lib.exists():
        rep.error(f"{lib}: no such file")
        return
    if shutil.which("nm") is None:
        rep.skip(f"{lib.name} exports: nm not installed")
        return
    exported = dynamic_exports(lib)
    names = {n for n, _ in exported}
    table = {r.name for r in rows}
    badver = sorted(f"{n}@{v}" for n, v in exported if v != version)
    if table - names:
        rep.error(f"{lib} lacks table symbols", sorted(table - names))
    if names - table:
        rep.error(f"{lib} exports symbols outside the table", sorted(names - table))
    if badver:
        rep.error(f"{lib} symbols without version {version}", badver)
    if names == table and not badver:
        rep.ok(f"{lib} exports exactly the {len(table)} table symbols @{version}")


def run_checks_libraries(args: argparse.Namespace, rep: Report) -> list[str]:
    summary = []
    for table_name, (soname, source, prefix) in LIBRARY_TABLES.items():
        table = shim_file(args.shim_dir, table_name)
        print(f"-- {table_name} ({soname})")
        rows = read_library_table(table, rep)
        check_duplicates(rows, rep)
        check_sources(rows, args.shim_dir, rep, [shim_file(args.shim_dir, source)], source, prefix=prefix)
        generated = [shim_file(args.shim_dir, name) for name in GENERATED_TABLES]
        gen = {r.name for r in rows if r.status == "gen"}
        listed = set()
        if table_name == "cublas_exports.tsv":
            for source in generated:
                if source.exists():
                    listed |= {line.split("\t")[0] for line in source.read_text().splitlines()
                               if line and not line.startswith(("#", "name\t"))}
        sources = " and ".join(source.name for source in generated)
        if gen != listed:
            rep.error(f"{table_name}: `gen` rows and {sources} differ", sorted(gen ^ listed))
        elif gen:
            rep.ok(f"{table_name}: the {len(gen)} `gen` rows are {sources}'s functions")
        for where in args.libblas:  # the built stand-ins, or NVIDIA's libraries
            if (where / soname).exists() or where.is_dir():
                name = soname if (where / soname).exists() else _standin_name(soname)
                check_library_lib(rows, where / name, soname, rep)
        n_impl = sum(r.status == "impl" for r in rows)
        summary.append(f"{soname}: {len(rows)} symbols, {n_impl} impl"
                       + (f", {len(gen)} gen" if gen else ""))
    return summary


def _standin_name(soname: str) -> str:
    spec = importlib.util.spec_from_file_location("pilot_shim_init", REPO / "shim" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LIBRARY_STANDINS[soname]


def run_checks13(args: argparse.Namespace, rep: Report) -> list[Row]:
    rows = read_table(args.table, rep)
    check_duplicates(rows, rep)
    check_against_cudart(rows, args.cudart or find_cudart(), rep)
    check_headers(rows, args.include or find_include(), rep)
    check_sources(rows, args.shim_dir, rep)
    if args.lib is not None:
        check_built_lib(rows, args.lib, rep)
    return rows


def run_checks12(args: argparse.Namespace, rows13: list[Row], rep: Report) -> list[Row]:
    rows = read_table(args.table12, rep, STATUSES12)
    check_duplicates(rows, rep)
    check_table12(rows, rows13, rep)
    check_against_cudart(rows, args.cudart12 or find_cudart12(), rep, VERSION12)
    include12 = args.include12 or find_include12()
    if include12 is not None and (include12 / "cuda_runtime_api.h").exists():
        check_headers(rows, include12, rep)
    check_abi12(rows, rows13, include12, args.include or find_include(), rep)
    own = [r for r in rows if r.status != "as13"]  # as13 rows are the shared sources' (13 check)
    check_sources(own, args.shim_dir, rep, sorted(args.shim_dir.rglob(CUDA12_SOURCES)),
                  CUDA12_SOURCES)
    if args.lib12 is not None:
        check_built_lib(rows, args.lib12, rep, VERSION12)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Check the shim hook table against cudart, headers and sources."
    )
    ap.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    ap.add_argument(
        "--shim-dir", type=Path, default=DEFAULT_SHIM_DIR, help="hand-written shim sources (*.c)"
    )
    ap.add_argument(
        "--cudart",
        type=Path,
        help=f"real {VERSION} (default: $CUDA_HOME/lib64, /usr/local/cuda/lib64)",
    )
    ap.add_argument(
        "--include",
        type=Path,
        help="CUDA include dir (default: $CUDA_HOME/include, /usr/local/cuda/include)",
    )
    ap.add_argument("--lib", type=Path, help="built libpilot.so to check the exports of")
    ap.add_argument("--cuda", type=int, choices=(12, 13),
                    help="check only this table (default: both)")
    ap.add_argument("--table12", type=Path, default=DEFAULT_TABLE12)
    ap.add_argument("--cudart12", type=Path,
                    help=f"real {VERSION12} (default: nvidia-cuda-runtime-cu12's, /usr/local/cuda-12*)")
    ap.add_argument("--include12", type=Path, help="CUDA 12 include dir (default: likewise)")
    ap.add_argument("--lib12", type=Path, help="built libpilot12.so to check the exports of")
    ap.add_argument("--driver-table", type=Path, default=DEFAULT_DRIVER_TABLE)
    ap.add_argument("--libcuda", type=Path,
                    help="a real libcuda.so.1 (default: the toolkit's stub, else the driver's)")
    ap.add_argument("--libdrv", type=Path, help="built libpilot-cuda.so to check the exports of")
    ap.add_argument("--libblas", type=Path, action="append", default=[],
                    help="a directory with the built stand-ins (libpilot-cublas.so, ...) or with "
                         "NVIDIA's libcublas.so.13 and libcublasLt.so.13, to check the exports of "
                         "(repeatable)")
    args = ap.parse_args(argv)

    rep = Report()
    tables = [args.table] + ([args.table12] if args.cuda != 13 else [])
    for table in tables:
        if not table.exists():
            rep.error(f"table {table} not found")
            print("[FAIL]")
            return 1
    summary = []
    if args.cuda == 12:
        print(f"-- {args.table12.name} ({VERSION12})")
        rows13 = read_table(args.table, Report())  # for as13 rows; checked by --cuda 13
    else:
        print(f"-- {args.table.name} ({VERSION})")
        rows13 = run_checks13(args, rep)
        n_impl = sum(r.status == "impl" for r in rows13)
        summary.append(f"{len(rows13)} symbols, {n_impl} impl, {len(rows13) - n_impl} stub")
    if args.cuda != 13:
        if args.cuda is None:
            print(f"-- {args.table12.name} ({VERSION12})")
        rows12 = run_checks12(args, rows13, rep)
        count = {s: sum(r.status == s for r in rows12) for s in sorted(STATUSES12)}
        summary.append(f"CUDA 12: {len(rows12)} symbols, "
                       + ", ".join(f"{n} {s}" for s, n in count.items()))
    if args.cuda is None:
        print(f"-- {args.driver_table.name} (libcuda.so.1)")
        rowsd = run_checks_driver(args, rep)
        n_impl = sum(r.status == "impl" for r in rowsd)
        summary.append(f"driver: {len(rowsd)} symbols, {n_impl} impl, {len(rowsd) - n_impl} stub")
        summary += run_checks_libraries(args, rep)
    line = "; ".join(summary)
    print(f"[FAIL] {line}" if rep.failed else f"[PASS] {line}")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
