"""The cuBLAS functions of the generic path (shim/tables/cublas_calls.tsv): per family, the argument
checks cuBLAS makes, the device ranges a call reads and writes, and the sim's numpy emulation.
The table says each function's family, type (S or D) and argument kinds; ops/libraries.py
checks and backends run the calls from there.

A call's `args` are its arguments after the handle, as the table orders them; scalars are
Python numbers (read from the request or, in device pointer mode, from device memory by the sim),
results are returned by the emulation.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilot.daemon.backends.libraries import (
    OP_C,
    OP_N,
    OP_T,
    STATUS_INVALID_VALUE,
    STATUS_NOT_SUPPORTED,
    LibraryError,
    matrix_span,
)

TABLE = Path(__file__).resolve().parents[2] / "shim" / "tables" / "cublas_calls.tsv"
TYPE_SIZES = {"S": 4, "D": 8}


@dataclass(frozen=True)
class Function:
    name: str
    family: str
    type: str  # S or D
    kinds: tuple[str, ...]
    params: tuple[str, ...]  # the family's argument names (shim/tables/cublas_families.tsv)
    checks: tuple[tuple[int, str], ...]  # (argument number, Python expression)

    @property
    def elem(self) -> int:
        return TYPE_SIZES[self.type]


def _tsv(name: str) -> list[dict[str, str]]:
    from pilot.shim import __file__ as shim_init  # the tables are installed beside the shim

    path = Path(shim_init).parent / "tables" / name
    if not path.exists():
        path = TABLE.parent / name
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def python_check(expr: str) -> str:
    """A check of shim/tables/cublas_families.tsv (C) as Python: `!`, `&&`, `||`, `c ? a : b`."""
    expr = re.sub(r"(\w+)==0\?(\w+):(\w+)", r"(\2 if \1==0 else \3)", expr)
    expr = re.sub(r"!(?!=)", " not ", expr).replace("&&", " and ").replace("||", " or ")
    if "?" in expr:
        raise ValueError(f"a check pilotd cannot read: {expr}")
    return expr


def load_table() -> dict[str, Function]:
    """The generic path's functions by name, with their family's names and checks."""
    families = {}
    for f in _tsv("cublas_families.tsv"):
        checks = () if f["checks"] == "-" else tuple(
            (int(number), python_check(expr))
            for number, expr in (rule.split(":", 1) for rule in f["checks"].split(";")))
        families[f["family"]] = (tuple(f["params"].split()), checks)
    table = {}
    for r in _tsv("cublas_calls.tsv"):
        params, checks = families[r["family"]]
        table[r["name"]] = Function(r["name"], r["family"], r["type"], tuple(r["args"].split(",")),
                                    params, checks)
    return table


def vec(n: int, inc: int, elem: int) -> int:
    """Bytes a vector of n elements `inc` apart spans (the lowest address is the pointer's)."""
    return (1 + (n - 1) * abs(inc)) * elem if n > 0 else 0


# A family: the ranges a call touches (argument name, bytes, written) and the sim's emulation
# (numpy views in, the result out); its argument names and checks are the families table's.
@dataclass(frozen=True)
class Family:
    ranges: Callable[[dict[str, int], int], list[tuple[str, int, bool]]]
    sim: Callable[..., Any]
    # pointer-array arguments (kind `a`): name -> bytes of each matrix it lists (`batch` of them)
    arrays: dict[str, Callable[[dict[str, int], int], int]] | None = None


def _rows(trans: int, m: int, n: int) -> tuple[int, int]:
    return (m, n) if trans == OP_N else (n, m)


FAMILIES: dict[str, Family] = {}


def family(name: str, ranges: Callable[[dict[str, int], int], list[tuple[str, int, bool]]],
           arrays: dict[str, Callable[[dict[str, int], int], int]] | None = None
           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(sim: Callable[..., Any]) -> Callable[..., Any]:
        FAMILIES[name] = Family(ranges, sim, arrays)
        return sim
    return register


# ---- level 1 ----

@family("axpy",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False), ("y", vec(a["n"], a["incy"], e), True)])
def _axpy(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    v["y"][...] = a["alpha"] * v["x"] + v["y"]


@family("scal",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), True)])
def _scal(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    v["x"][...] = a["alpha"] * v["x"]


@family("copy",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False), ("y", vec(a["n"], a["incy"], e), True)])
def _copy(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    v["y"][...] = v["x"]


@family("swap",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), True), ("y", vec(a["n"], a["incy"], e), True)])
def _swap(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    x = v["x"].copy()
    v["x"][...] = v["y"]
    v["y"][...] = x


@family("dot",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False), ("y", vec(a["n"], a["incy"], e), False)])
def _dot(np: Any, a: dict[str, Any], v: dict[str, Any]) -> float:
    return float(np.dot(v["x"].astype(np.float64), v["y"].astype(np.float64)))


@family("nrm2",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False)])
def _nrm2(np: Any, a: dict[str, Any], v: dict[str, Any]) -> float:
    return float(np.sqrt(np.sum(v["x"].astype(np.float64) ** 2))) if a["incx"] > 0 else 0.0


@family("asum",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False)])
def _asum(np: Any, a: dict[str, Any], v: dict[str, Any]) -> float:
    return float(np.sum(np.abs(v["x"].astype(np.float64)))) if a["incx"] > 0 else 0.0


@family("iamax",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False)])
def _iamax(np: Any, a: dict[str, Any], v: dict[str, Any]) -> int:
    """1-based, the first of equal ones; 0 for n <= 0 or incx <= 0, as BLAS."""
    return int(np.argmax(np.abs(v["x"]))) + 1 if a["n"] > 0 and a["incx"] > 0 else 0


@family("iamin",
        lambda a, e: [("x", vec(a["n"], a["incx"], e), False)])
def _iamin(np: Any, a: dict[str, Any], v: dict[str, Any]) -> int:
    return int(np.argmin(np.abs(v["x"]))) + 1 if a["n"] > 0 and a["incx"] > 0 else 0


# ---- level 2 ----

def _gemv_ranges(a: dict[str, int], e: int) -> list[tuple[str, int, bool]]:
    lx, ly = (a["n"], a["m"]) if a["trans"] == OP_N else (a["m"], a["n"])
    return [("A", matrix_span(a["m"], a["n"], a["lda"], e), False),
            ("x", vec(lx, a["incx"], e), False), ("y", vec(ly, a["incy"], e), True)]


@family("gemv", _gemv_ranges)
def _gemv(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    mat = v["A"] if a["trans"] == OP_N else v["A"].T
    y = a["alpha"] * (mat.astype(np.float64) @ v["x"].astype(np.float64))
    v["y"][...] = y + (a["beta"] * v["y"] if a["beta"] != 0 else 0)


@family("ger",
        lambda a, e: [("x", vec(a["m"], a["incx"], e), False),
                      ("y", vec(a["n"], a["incy"], e), False),
                      ("A", matrix_span(a["m"], a["n"], a["lda"], e), True)])
def _ger(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    v["A"][...] = v["A"] + a["alpha"] * np.outer(v["x"], v["y"])


# ---- level 3 and extensions ----

def _geam_ranges(a: dict[str, int], e: int) -> list[tuple[str, int, bool]]:
    ra, ca = _rows(a["transa"], a["m"], a["n"])
    rb, cb = _rows(a["transb"], a["m"], a["n"])
    return [("A", matrix_span(ra, ca, a["lda"], e), False), ("B", matrix_span(rb, cb, a["ldb"], e), False),
            ("C", matrix_span(a["m"], a["n"], a["ldc"], e), True)]


@family("geam", _geam_ranges)
def _geam(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    op_a = v["A"] if a["transa"] == OP_N else v["A"].T
    op_b = v["B"] if a["transb"] == OP_N else v["B"].T
    v["C"][...] = a["alpha"] * op_a + a["beta"] * op_b


def _trsm_ranges(a: dict[str, int], e: int) -> list[tuple[str, int, bool]]:
    k = a["m"] if a["side"] == 0 else a["n"]
    return [("A", matrix_span(k, k, a["lda"], e), False),
            ("B", matrix_span(a["m"], a["n"], a["ldb"], e), True)]


@family("trsm", _trsm_ranges)
def _trsm(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    """op(A) X = alpha B (side left) or X op(A) = alpha B (right), A triangular."""
    tri = np.triu(v["A"]) if a["uplo"] == 1 else np.tril(v["A"])
    if a["diag"] == 1:
        np.fill_diagonal(tri, 1.0)
    op_a = tri if a["trans"] == OP_N else tri.T
    rhs = a["alpha"] * v["B"].astype(np.float64)
    x = np.linalg.solve(op_a, rhs) if a["side"] == 0 else np.linalg.solve(op_a.T, rhs.T).T
    v["B"][...] = x


def _syrk_ranges(a: dict[str, int], e: int) -> list[tuple[str, int, bool]]:
    ra, ca = _rows(a["trans"], a["n"], a["k"])
    return [("A", matrix_span(ra, ca, a["lda"], e), False),
            ("C", matrix_span(a["n"], a["n"], a["ldc"], e), True)]


@family("syrk", _syrk_ranges)
def _syrk(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    """Only the uplo triangle of C is computed and written, as cuBLAS."""
    op_a = v["A"] if a["trans"] == OP_N else v["A"].T
    full = a["alpha"] * (op_a.astype(np.float64) @ op_a.T.astype(np.float64))
    if a["beta"] != 0:
        full = full + a["beta"] * v["C"]
    mask = np.triu(np.ones(full.shape, bool)) if a["uplo"] == 1 else np.tril(np.ones(full.shape, bool))
    v["C"][mask] = full[mask]


def _side_k(a: dict[str, int]) -> int:
    return a["m"] if a["side"] == 0 else a["n"]


def _symmetric(np: Any, m: Any, uplo: int) -> Any:
    """The full matrix of a symmetric one stored in its uplo triangle (1 upper, 0 lower)."""
    tri = np.triu(m) if uplo == 1 else np.tril(m)
    return tri + tri.T - np.diag(np.diag(m))


def _triangular(np: Any, m: Any, uplo: int, diag: int) -> Any:
    tri = (np.triu(m) if uplo == 1 else np.tril(m)).astype(np.float64)
    if diag == 1:
        np.fill_diagonal(tri, 1.0)
    return tri


@family("symm", lambda a, e: [
    ("A", matrix_span(_side_k(a), _side_k(a), a["lda"], e), False),
    ("B", matrix_span(a["m"], a["n"], a["ldb"], e), False),
    ("C", matrix_span(a["m"], a["n"], a["ldc"], e), True)])
def _symm(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    full = _symmetric(np, v["A"].astype(np.float64), a["uplo"])
    prod = full @ v["B"] if a["side"] == 0 else v["B"] @ full
    v["C"][...] = a["alpha"] * prod + (a["beta"] * v["C"] if a["beta"] != 0 else 0)


@family("trmm", lambda a, e: [
    ("A", matrix_span(_side_k(a), _side_k(a), a["lda"], e), False),
    ("B", matrix_span(a["m"], a["n"], a["ldb"], e), False),
    ("C", matrix_span(a["m"], a["n"], a["ldc"], e), True)])
def _trmm(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    tri = _triangular(np, v["A"], a["uplo"], a["diag"])
    op_a = tri if a["trans"] == OP_N else tri.T
    v["C"][...] = a["alpha"] * (op_a @ v["B"] if a["side"] == 0 else v["B"] @ op_a)


@family("dgmm", lambda a, e: [
    ("A", matrix_span(a["m"], a["n"], a["lda"], e), False),
    ("x", vec(a["m"] if a["mode"] == 0 else a["n"], a["incx"], e), False),
    ("C", matrix_span(a["m"], a["n"], a["ldc"], e), True)])
def _dgmm(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    """C = diag(x) A (mode left) or A diag(x) (right); incx 0 repeats x[0], as cuBLAS."""
    x = v["x"].astype(np.float64)
    v["C"][...] = (x[:, None] * v["A"]) if a["mode"] == 0 else (v["A"] * x[None, :])


@family("symv", lambda a, e: [
    ("A", matrix_span(a["n"], a["n"], a["lda"], e), False),
    ("x", vec(a["n"], a["incx"], e), False), ("y", vec(a["n"], a["incy"], e), True)])
def _symv(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    full = _symmetric(np, v["A"].astype(np.float64), a["uplo"])
    v["y"][...] = a["alpha"] * (full @ v["x"]) + (a["beta"] * v["y"] if a["beta"] != 0 else 0)


@family("trsv", lambda a, e: [
    ("A", matrix_span(a["n"], a["n"], a["lda"], e), False), ("x", vec(a["n"], a["incx"], e), True)])
def _trsv(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    tri = _triangular(np, v["A"], a["uplo"], a["diag"])
    v["x"][...] = np.linalg.solve(tri if a["trans"] == OP_N else tri.T, v["x"].astype(np.float64))


@family("rot", lambda a, e: [("x", vec(a["n"], a["incx"], e), True),
                             ("y", vec(a["n"], a["incy"], e), True)])
def _rot(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    x, y = v["x"].copy(), v["y"].copy()
    v["x"][...] = a["c"] * x + a["s"] * y
    v["y"][...] = a["c"] * y - a["s"] * x


# ---- batches of pointer arrays ----

def _getrf_ranges(a: dict[str, int], e: int) -> list[tuple[str, int, bool]]:
    """The array of pointers itself, the pivots (n per matrix; none: no pivoting) and info."""
    out = [("A", 8 * a["batch"], False), ("info", 4 * a["batch"], True)]
    if a["P"]:
        out.append(("P", 4 * a["n"] * a["batch"], True))
    return out


@family("getrfBatched", _getrf_ranges,
        arrays={"A": lambda a, e: matrix_span(a["n"], a["n"], a["lda"], e)})
def _getrf(np: Any, a: dict[str, Any], v: dict[str, Any]) -> None:
    """LU with partial pivoting (or none when P is null) of each matrix, in place: unit L below
    the diagonal, U on and above it; 1-based pivots; info the first zero pivot (1-based) or 0."""
    n = a["n"]
    for index, m in enumerate(v["matrices"]):
        info = 0
        for k in range(n):
            if a["P"]:
                p = k + int(np.argmax(np.abs(m[k:, k])))
                v["P"][index * n + k] = p + 1
                if p != k:
                    m[[k, p], :] = m[[p, k], :]
            if m[k, k] == 0:
                info = info or k + 1
                continue
            m[k + 1:, k] /= m[k, k]
            m[k + 1:, k + 1:] -= np.outer(m[k + 1:, k], m[k, k + 1:])
        v["info"][index] = info


# Which matrix argument has which leading dimension and shape (for the sim's views).
MATRIX_SHAPES: dict[str, dict[str, Callable[[dict[str, int]], tuple[int, int, str]]]] = {
    "gemv": {"A": lambda a: (a["m"], a["n"], "lda")},
    "ger": {"A": lambda a: (a["m"], a["n"], "lda")},
    "geam": {"A": lambda a: (*_rows(a["transa"], a["m"], a["n"]), "lda"),
             "B": lambda a: (*_rows(a["transb"], a["m"], a["n"]), "ldb"),
             "C": lambda a: (a["m"], a["n"], "ldc")},
    "trsm": {"A": lambda a: ((a["m"], a["m"]) if a["side"] == 0 else (a["n"], a["n"])) + ("lda",),
             "B": lambda a: (a["m"], a["n"], "ldb")},
    "syrk": {"A": lambda a: (*_rows(a["trans"], a["n"], a["k"]), "lda"),
             "C": lambda a: (a["n"], a["n"], "ldc")},
    "getrfBatched": {"matrices": lambda a: (a["n"], a["n"], "lda")},
    "symm": {"A": lambda a: (_side_k(a), _side_k(a), "lda"), "B": lambda a: (a["m"], a["n"], "ldb"),
             "C": lambda a: (a["m"], a["n"], "ldc")},
    "trmm": {"A": lambda a: (_side_k(a), _side_k(a), "lda"), "B": lambda a: (a["m"], a["n"], "ldb"),
             "C": lambda a: (a["m"], a["n"], "ldc")},
    "dgmm": {"A": lambda a: (a["m"], a["n"], "lda"), "C": lambda a: (a["m"], a["n"], "ldc")},
    "symv": {"A": lambda a: (a["n"], a["n"], "lda")},
    "trsv": {"A": lambda a: (a["n"], a["n"], "lda")},
}
VECTOR_LENGTHS: dict[str, dict[str, Callable[[dict[str, int]], tuple[int, str]]]] = {
    "gemv": {"x": lambda a: (a["n"] if a["trans"] == OP_N else a["m"], "incx"),
             "y": lambda a: (a["m"] if a["trans"] == OP_N else a["n"], "incy")},
    "ger": {"x": lambda a: (a["m"], "incx"), "y": lambda a: (a["n"], "incy")},
    "dgmm": {"x": lambda a: (a["m"] if a["mode"] == 0 else a["n"], "incx")},
}


def named_args(fn: Function, args: list[int]) -> dict[str, int]:
    """The call's arguments by the family's names (ints sign-extended from 64 bits)."""
    if fn.family not in FAMILIES or len(fn.params) != len(fn.kinds) or len(args) != len(fn.kinds):
        raise LibraryError(STATUS_NOT_SUPPORTED, f"{fn.name}: no such family {fn.family}")
    out = {}
    for name, kind, raw in zip(fn.params, fn.kinds, args, strict=True):
        out[name] = raw - (1 << 64) if kind == "i" and raw >= 1 << 63 else raw
    return out


def _is_op(x: int) -> bool:
    return x in (OP_N, OP_T, OP_C)


def check(fn: Function, a: dict[str, int]) -> None:
    """cuBLAS's argument checks, in its order: the stand-in made them already; pilotd makes them
    again (the client is not trusted)."""
    scope = {"is_op": _is_op, "max1": lambda x: max(1, x), **a}
    for number, expr in fn.checks:
        if eval(expr, {"__builtins__": {}}, scope):  # pilot's own table, never a client's
            raise LibraryError(STATUS_INVALID_VALUE, f"{fn.name}: argument {number}")


__all__ = ["FAMILIES", "MATRIX_SHAPES", "VECTOR_LENGTHS", "Function", "check", "load_table",
           "named_args", "vec"]
