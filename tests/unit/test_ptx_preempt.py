"""The preemptible persistent-block rewrite (daemon/backends/ptx_preempt.py) on real nvcc-made
PTX of the repository's CUDA programs (tests/apps, tests/gpu): every kernel is rewritten or
refused for a stated reason, the rewritten modules assemble with `ptxas -arch=sm_90`, and the
block index mapping the rewrite emits gives each logical block its (x, y, z). Plus the disk
cache of compiled images (ptx_cache.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.ptx_cache import ImageCache, cache_key, ptxas

ROOT = Path(__file__).resolve().parents[2]
# Every test program with kernels (cuda12.cu is built against CUDA 12's headers only).
SOURCES = sorted(p for d in ("tests/apps", "tests/gpu") for p in (ROOT / d).glob("*.cu")
                 if "__global__" in p.read_text() and p.name != "cuda12.cu")
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None or shutil.which("ptxas") is None,
                                reason="nvcc/ptxas not found")


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """name -> PTX for sm_90 of each test program, as nvcc makes it."""
    out = tmp_path_factory.mktemp("ptx")

    def build(src: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
        cmd = [str(NVCC), "-ptx", "-arch=sm_90", f"-I{ROOT / 'tests/apps'}", "-o",
               str(out / f"{src.stem}.ptx"), str(src)]
        return src.stem, subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(build, SOURCES))
    failed = [f"{name}: {proc.stderr}" for name, proc in results if proc.returncode]
    assert not failed, failed
    return {name: (out / f"{name}.ptx").read_text() for name, _ in results}


@needs_nvcc
def test_every_kernel_is_rewritten_or_refused_and_assembles(modules: dict[str, str],
                                                            tmp_path: Path) -> None:
    refused: dict[str, str] = {}
    rewritten = 0
    for name, ptx in modules.items():
        result = pp.rewrite_module(ptx)
        entries = re.findall(r"\.entry\s+([\w$]+)\s*\(", ptx)
        assert sorted(result.kernels) == sorted(entries), name
        for kernel, r in result.kernels.items():
            assert (r.variant is None) == bool(r.reason), (name, kernel)
            if r.variant is None:
                refused[kernel] = r.reason
            else:
                rewritten += 1
                assert f".entry {r.variant}(" in result.ptx
        try:
            ptxas(result.ptx, "sm_90")
        except RuntimeError as exc:
            pytest.fail(f"{name}: the rewritten module does not assemble: {exc}")
    assert rewritten >= 60
    # the one cooperative kernel with grid.sync is refused for it; tiled GEMMs with their
    # uniform early exits past barriers, and printf with uniform loops, are rewritten
    assert set(refused) == {"_Z10coop_shiftPiS_i"}
    assert refused["_Z10coop_shiftPiS_i"].startswith("grid-wide synchronization")
    gemm = pp.rewrite_module(modules["matmul_tiled"]).variants
    assert set(gemm) == {"_Z7sgemm16PKfS0_Pfiii", "_Z7sgemm32PKfS0_Pfiii"}


def _entry(ptx: str, name: str) -> str:
    start = ptx.index(f".entry {name}(")
    return ptx[start:ptx.index("\n}", start)]


@needs_nvcc
def test_block_reads_are_mapped_and_returns_go_back_to_the_claim(modules: dict[str, str]) -> None:
    for name, ptx in modules.items():
        result = pp.rewrite_module(ptx)
        for kernel, variant in result.variants.items():
            original, body = _entry(ptx, kernel), _entry(result.ptx, variant)
            assert not re.search(r"%n?ctaid\.", body), (name, kernel)
            assert body.count("__pilot_ctl") == 2  # the parameter and its load
            assert re.search(r"^\s*(@!?%\w+\s+)?(ret|exit)\b", body.split("$__pilot_exit:")[0],
                             re.M) is None, (name, kernel)
            # each read of the original became a read of the register holding its logical value
            for which, reg in (("ctaid.x", 5), ("ctaid.y", 6), ("ctaid.z", 7), ("nctaid.x", 8)):
                reads = len(re.findall(rf"(?<![\w.])%{re.escape(which)}\b", original))
                assert len(re.findall(rf"%__pilot_r{reg}\b", body)) >= reads


def _run_mapping(base: int, j: int, control: list[int]) -> dict[str, int]:
    """The claim's code as emitted (pp.CLAIM from the read of the claim on), run straight
    through for the j-th block of the chunk claimed at `base` (branches are not taken: this
    is the path of a block that runs)."""
    regs: dict[str, int] = {}
    code = pp.CLAIM.split("$__pilot_read:", 1)[1]
    for line in filter(None, (x.strip().rstrip(";") for x in code.splitlines())):
        if line == "$__pilot_map:":
            regs["%__pilot_r13"] = j
        if line.endswith(":") or line.startswith(("bar.sync", "bra", "@", "setp")):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        val = [regs[a] if a.startswith("%") else int(a) for a in args[1:]] if op.startswith(
            ("rem", "div", "add", "max", "mov")) else []
        if op == "ld.shared.u32":
            regs[args[0]] = base
        elif op == "ld.global.u32":
            offset = int(re.fullmatch(r"\[%__pilot_rd0\+(\d+)\]", args[1]).group(1))  # type: ignore[union-attr]
            regs[args[0]] = control[offset // 4]
        elif op in ("rem.u32", "div.u32", "add.u32", "max.u32"):
            a, b = val
            regs[args[0]] = {"rem.u32": a % b if b else 0, "div.u32": a // b if b else 0,
                             "add.u32": a + b, "max.u32": max(a, b)}[op]
        elif op == "mov.u32":
            regs[args[0]] = val[0]
        else:
            raise AssertionError(f"unexpected instruction {line!r}")
    return regs


@pytest.mark.parametrize("grid", [(1, 1, 1), (7, 1, 1), (3, 5, 1), (4, 3, 6), (1, 9, 2), (65535, 2, 1)])
@pytest.mark.parametrize("chunk", [1, 4])
def test_logical_index_mapping(grid: tuple[int, int, int], chunk: int) -> None:
    control = pp.control_words(grid, chunk=chunk)
    total = control[2]
    assert total == grid[0] * grid[1] * grid[2] and control[6] == chunk
    seen = []
    for index in sorted({*range(min(total, 200)), *range(max(0, total - 50), total)}):
        base, j = index - index % chunk, index % chunk  # the claim it is in, its place there
        regs = _run_mapping(base, j, control)
        assert regs["%__pilot_r12"] == chunk and regs["%__pilot_r14"] == index
        mapped = (regs["%__pilot_r5"], regs["%__pilot_r6"], regs["%__pilot_r7"])
        assert mapped == pp.logical_ctaid(index, grid)
        assert (regs["%__pilot_r8"], regs["%__pilot_r9"], regs["%__pilot_r10"]) == grid
        seen.append(mapped)
    # hardware order (x fastest), every block once
    if total <= 200:
        assert seen == [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]


def test_a_chunk_of_zero_counts_as_one() -> None:
    control = pp.control_words((5, 1, 1), chunk=0)
    assert _run_mapping(3, 0, control)["%__pilot_r12"] == 1


# ---- refusals on small hand-written kernels ----

HEADER = ".version 9.0\n.target sm_90\n.address_size 64\n"


def _kernel(body: str, directives: str = "") -> str:
    return (HEADER + ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u32 k_param_1\n)"
            + directives + "\n{\n\t.reg .pred %p<3>;\n\t.reg .b32 %r<9>;\n\t.reg .b64 %rd<3>;\n"
            + body + "\n}\n")


PER_THREAD_RETURN = """\tmov.u32 %r1, %tid.x;
\tsetp.ge.u32 %p1, %r1, 10;
\t@%p1 bra $L_end;
\tbar.sync 0;
$L_end:
\tret;"""
UNIFORM_RETURN = """\tld.param.u32 %r2, [k_param_1];
\tmov.u32 %r3, %ctaid.x;
\tsetp.ge.u32 %p1, %r3, %r2;
\t@%p1 ret;
\tbar.sync 0;
\tret;"""
LOADED_CONDITION = """\tld.param.u64 %rd1, [k_param_0];
\tld.global.u32 %r2, [%rd1];
\tadd.s32 %r3, %r2, 1;
\tsetp.eq.u32 %p2, %r3, 0;
\t@%p2 bra $L_end;
\tbar.sync 0;
$L_end:
\tret;"""


@pytest.mark.parametrize(("body", "directives", "reason"), [
    (PER_THREAD_RETURN, "", "a branch jumps past a barrier on a per-thread condition"),
    (LOADED_CONDITION, "", "a branch jumps past a barrier on a per-thread condition"),
    ("\tmov.u32 %r1, %cluster_ctarank;\n\tret;", "", "thread block clusters"),
    ("\tret;", "\n.reqnctapercluster 2, 1, 1", "thread block clusters"),
    ("\tmov.u32 %r1, %envreg1;\n\tret;", "", "grid-wide synchronization"),
    ("\tmov.u32 %r1, %gridid;\n\tret;", "", "reads %gridid"),
    ("\tgriddepcontrol.wait;\n\tret;", "", "programmatic dependent launch"),
    (UNIFORM_RETURN, "", ""),
])
def test_refusals(body: str, directives: str, reason: str) -> None:
    r = pp.rewrite_module(_kernel(body, directives)).kernels["k"]
    assert r.reason.startswith(reason) if reason else r.variant == "k" + pp.SUFFIX


def test_a_call_into_a_function_that_exits_is_refused() -> None:
    func = ".func stop()\n{\n\texit;\n}\n"
    calls = _kernel("\tcall.uni stop, ();\n\tret;")
    module = calls.replace(HEADER, HEADER + func)
    assert pp.rewrite_module(module).kernels["k"].reason.startswith("calls device functions")
    assert pp.rewrite_module(module.replace("exit;", "ret;")).kernels["k"].variant is not None


@needs_nvcc
def test_a_rewritten_hand_kernel_assembles() -> None:
    ptxas(pp.rewrite_module(_kernel(UNIFORM_RETURN)).ptx, "sm_90")


# ---- the cache of compiled images ----

@needs_nvcc
def test_cache_compiles_once_per_content(tmp_path: Path) -> None:
    cache = ImageCache(str(tmp_path / "cache"))
    ptx = pp.rewrite_module(_kernel(UNIFORM_RETURN)).ptx
    calls: list[str] = []

    def compiler(text: str, arch: str) -> bytes:
        calls.append(arch)
        return ptxas(text, arch)

    first = cache.compile(ptx, "sm_90", compiler)
    second = ImageCache(str(tmp_path / "cache")).compile(ptx, "sm_90", compiler)  # a new start
    assert (first.hit, second.hit, calls) == (False, True, ["sm_90"])
    assert first.image == second.image and first.image[:4] == b"\x7fELF"
    assert cache_key(ptx, "sm_90") != cache_key(ptx, "sm_80") != cache_key(ptx + "\n", "sm_80")
    (tmp_path / "cache" / f"{cache_key(ptx, 'sm_90')}.cubin").write_bytes(b"")  # damaged: a miss
    assert not cache.compile(ptx, "sm_90", compiler).hit and len(calls) == 2
