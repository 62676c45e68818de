#!/usr/bin/env python3
"""Consistency guard for the shim's hook table (shim/cudart_exports.tsv).

libpilot.so stands in for libcudart.so.13, so it must export every symbol the real
library exports (a missing one makes the dynamic loader fail the whole program) and
nothing else.  The table is the single list of those symbols: hand-written code in
shim/*.c implements the rows marked ``impl``; hack/gen_shim_tables.py generates a
logging stub for every ``stub`` row.  This script checks that the table, the real
library, the CUDA headers, the hand-written sources and (optionally) the built
library agree.  It needs neither a GPU nor a compiler; checks whose inputs are
absent print [SKIP].

Usage: python3 hack/check_api_table.py [--table TSV] [--shim-dir DIR]
                                       [--cudart LIB] [--include DIR] [--lib libpilot.so]
Prints [ERROR]/[SKIP]/[OK] lines and finally [PASS] (exit 0) or [FAIL] (exit 1).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = REPO / "shim" / "cudart_exports.tsv"
DEFAULT_SHIM_DIR = REPO / "shim"
VERSION = "libcudart.so.13"


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


def read_table(path: Path, rep: Report) -> list[Row]:
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
        if status not in STATUSES:
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


def check_against_cudart(rows: list[Row], cudart: Path | None, rep: Report) -> None:
    if cudart is None or not cudart.exists():
        rep.skip(f"table == {VERSION} exports: library not found (set CUDA_HOME or --cudart)")
        return
    if shutil.which("nm") is None:
        rep.skip(f"table == {VERSION} exports: nm not installed")
        return
    real = {n for n, v in dynamic_exports(cudart) if v == VERSION}
    table = {r.name for r in rows}
    missing = sorted(real - table)
    extra = sorted(table - real)
    if missing:
        rep.error(f"exported by {cudart} but not in the table", missing)
    if extra:
        rep.error(f"in the table but not exported by {cudart}", extra)
    if not missing and not extra:
        rep.ok(f"table matches the {len(real)} exports of {cudart}")


def check_built_lib(rows: list[Row], lib: Path, rep: Report) -> None:
    """The shim must export exactly the table's names, each as name@@libcudart.so.13."""
    if not lib.exists():
        rep.error(f"--lib {lib}: no such file")
        return
    if shutil.which("nm") is None:
        rep.error("--lib given but nm is not installed")
        return
    exported = dynamic_exports(lib)
    # libc functions the shim overrides (shim/build.py LIBC_OVERRIDES), under glibc's version
    overrides = {n: v for n, v in exported if n in LIBC_OVERRIDES}
    names = {n for n, _ in exported} - set(overrides)
    table = {r.name for r in rows}
    missing = sorted(table - names)
    extra = sorted(names - table)
    badver = sorted(f"{n}@{v}" for n, v in exported if n in table and v != VERSION)
    badver += sorted(f"{n}@{v}" for n, v in overrides.items() if not v.startswith("GLIBC_"))
    if set(overrides) != set(LIBC_OVERRIDES):
        rep.error(f"{lib.name} lacks libc overrides", sorted(set(LIBC_OVERRIDES) - set(overrides)))
    if missing:
        rep.error(f"{lib.name} lacks table symbols", missing)
    if extra:
        rep.error(f"{lib.name} exports symbols outside the table", extra)
    if badver:
        rep.error(f"{lib.name} symbols without version {VERSION}", badver)
    if not (missing or extra or badver):
        rep.ok(f"{lib.name} exports exactly the {len(table)} table symbols @{VERSION}, and "
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


def header_decls(include: Path) -> dict[str, set[str | None]]:
    """ret classes of every ``extern ... CUDARTAPI name(`` in the runtime headers."""
    decls: dict[str, set[str | None]] = {}
    for rel in HEADERS:
        path = include / rel
        if not path.exists():
            continue
        text = re.sub(r"/\*.*?\*/", " ", path.read_text(errors="replace"), flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        for m in DECL_RE.finditer(text):
            decls.setdefault(m.group("name"), set()).add(classify_ret(m.group("ret")))
    return decls


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


def check_sources(rows: list[Row], shim_dir: Path, rep: Report) -> None:
    sources = sorted(shim_dir.glob("*.c"))
    if not sources:
        rep.error(f"no hand-written sources {shim_dir}/*.c")
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
        if re.match(r"_*cuda", name) and name not in by_name and not all(d.static for d in ds):
            unknown.append(f"{name} ({where(ds)})")
    if missing:
        rep.error(f"impl rows with no definition in {shim_dir}/*.c", missing)
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
        rep.error("cuda* functions defined in the shim but absent from the table", unknown)
    if wrong_ret:
        rep.error("definitions whose return type disagrees with the table", wrong_ret)
    if sources and not (missing or multiple or statics or stub_defined or unknown or wrong_ret):
        rep.ok(f"{len(sources)} shim sources agree with the table")


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
    args = ap.parse_args(argv)

    rep = Report()
    if not args.table.exists():
        rep.error(f"table {args.table} not found")
        print("[FAIL]")
        return 1
    rows = read_table(args.table, rep)
    check_duplicates(rows, rep)
    check_against_cudart(rows, args.cudart or find_cudart(), rep)
    check_headers(rows, args.include or find_include(), rep)
    check_sources(rows, args.shim_dir, rep)
    if args.lib is not None:
        check_built_lib(rows, args.lib, rep)
    n_impl = sum(r.status == "impl" for r in rows)
    summary = f"{len(rows)} symbols, {n_impl} impl, {len(rows) - n_impl} stub"
    print(f"[FAIL] {summary}" if rep.failed else f"[PASS] {summary}")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
