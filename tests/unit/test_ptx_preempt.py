"""The preemptible persistent-block rewrite (daemon/backends/ptx_preempt.py) on real nvcc-made
PTX of the repository's CUDA programs (tests/apps, tests/gpu): every kernel is rewritten or
refused for a stated reason, the rewritten modules assemble with `ptxas -arch=sm_90`, and the
block index mapping the rewrite emits gives each logical block its (x, y, z). Plus the disk
cache of compiled images (ptx_cache.py)."""

from __future__ import annotations

import re
import shutil
import struct
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
    modes: dict[str, int] = {}
    for name, ptx in modules.items():
        result = pp.rewrite_module(ptx, loops=True)  # the loop-level variants too
        entries = re.findall(r"\.entry\s+([\w$]+)\s*\(", ptx)
        assert sorted(result.kernels) == sorted(entries), name
        for kernel, r in result.kernels.items():
            assert (r.variant is None) == bool(r.reason), (name, kernel)
            if r.variant is None:
                refused[kernel] = r.reason
                assert r.loop is None
            else:
                rewritten += 1
                assert f".entry {r.variant}(" in result.ptx
                assert (r.loop is None) == bool(r.loop_reason) and bool(r.loop) == bool(r.loop_mode)
                modes[r.loop_mode or r.loop_reason] = modes.get(r.loop_mode or r.loop_reason, 0) + 1
                if r.loop is not None:
                    assert f".entry {r.loop}(" in result.ptx
        try:
            ptxas(result.ptx, "sm_90")
        except RuntimeError as exc:
            pytest.fail(f"{name}: the rewritten module does not assemble: {exc}")
    assert rewritten >= 60
    # loops of both kinds are found in the test programs (modes: kernels per mode or reason)
    assert modes.get(pp.UNIFORM, 0) >= 3 and modes.get(pp.PER_THREAD, 0) >= 10, modes
    # the one cooperative kernel with grid.sync is refused for it; tiled GEMMs with their
    # uniform early exits past barriers, and printf with uniform loops, are rewritten
    assert refused.pop("_Z10coop_shiftPiS_i").startswith("grid-wide synchronization")
    # the rest use __device__ / __constant__ / __managed__ variables (symbols.cu, multidev.cu,
    # managed.cu, ...): the variants' module would have its own copies
    assert {"_Z4polyPKfPfi", "_Z10big_updatev", "drv_bump", "_Z10um_counterv"} <= set(refused)
    assert all(r.startswith("uses module variables") for r in refused.values()), refused
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
            # the only real block index read is the prologue's (which block of the first wave)
            assert re.findall(r"%n?ctaid\.\w", body) == ["%ctaid.x"], (name, kernel)
            # the parameter and its loads: the claim's, the prologue's and the account's (the
            # slot's tally fields), the retreat's stamp
            assert body.count("__pilot_ctl") == 5
            # read once more than the kernel does: by a block that retreats
            assert body.count("%globaltimer") == original.count("%globaltimer") + 1
            assert re.search(r"^\s*(@!?%\w+\s+)?(ret|exit)\b", body.split("$__pilot_exit:")[0],
                             re.M) is None, (name, kernel)
            # each read of the original became a read of the register holding its logical value
            for which, reg in (("ctaid.x", 5), ("ctaid.y", 6), ("ctaid.z", 7), ("nctaid.x", 8)):
                reads = len(re.findall(rf"(?<![\w.])%{re.escape(which)}\b", original))
                assert len(re.findall(rf"%__pilot_r{reg}\b", body)) >= reads


_MASK = {"u32": 0xFFFFFFFF, "b32": 0xFFFFFFFF, "s32": 0xFFFFFFFF, "u64": (1 << 64) - 1,
         "b64": (1 << 64) - 1}
_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "and": lambda a, b: a & b,
           "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "shl": lambda a, b: a << b,
           "shr": lambda a, b: a >> b, "min": min, "max": max, "rem": lambda a, b: a % b,
           "div": lambda a, b: a // b, "mul": lambda a, b: a * b}


def _address(regs: dict[str, int], operand: str) -> int:
    base, _, off = operand.strip("[]").partition("+")
    return regs[base] + int(off or 0)


def _run(code: str, regs: dict[str, int], params: dict[str, int]) -> dict[str, int]:
    """Run straight-line PTX of the rewrite (pp.MAP, pp.PROLOGUE, pp.ACCOUNT, the claim) on
    one thread: the integer instructions it emits, predicates, forward branches, and global
    memory as regs["memory"] ({address: value}, one value per address whatever its width); it
    stops at a branch out of the code (returns the label in regs["branch"]) or at its end.
    Stores to global memory are also listed in regs["stores"] as (address, value)."""
    lines = [x.strip().rstrip(";") for x in code.splitlines() if x.strip()]
    labels = {line[:-1]: i for i, line in enumerate(lines) if line.endswith(":")}
    preds: dict[str, bool] = {}
    memory: dict[int, int] = regs.setdefault("memory", {})  # type: ignore[assignment, arg-type]
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        if line.endswith(":"):
            continue
        guard = None
        if line.startswith("@"):
            guard, line = line.split(None, 1)
        if guard is not None and preds[guard.lstrip("@!")] == guard.startswith("@!"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        parts = op.split(".")
        width = _MASK.get(parts[-1], (1 << 64) - 1)
        if parts[0] == "bra":
            if args[0] not in labels:
                regs["branch"] = args[0]  # type: ignore[assignment]
                return regs
            i = labels[args[0]]
            continue
        if op.startswith("ld.param."):
            regs[args[0]] = params[args[1].strip("[]").removeprefix("__pilot_")]
            continue
        if parts[0] == "ld":
            regs[args[0]] = memory.get(_address(regs, args[1]), 0)
            continue
        if parts[0] == "st":
            address = _address(regs, args[0])
            value = regs[args[1]] if args[1].startswith("%") else int(args[1])
            memory[address] = value
            regs.setdefault("stores", []).append((address, value))  # type: ignore[attr-defined]
            continue
        if parts[0] in ("red", "atom"):
            address = _address(regs, args[1] if parts[0] == "atom" else args[0])
            value = regs[args[-1]] if args[-1].startswith("%") else int(args[-1])
            old = memory.get(address, 0)
            if parts[2] == "cas":  # atom.cas d, [a], compare, new
                compare = regs[args[2]] if args[2].startswith("%") else int(args[2])
                memory[address] = value if old == compare else old
            else:
                assert parts[2] in ("add", "max"), line
                memory[address] = (old + value) & width if parts[2] == "add" else max(old, value)
            if parts[0] == "atom":
                regs[args[0]] = old
            continue
        val = [regs[a] if a.startswith("%") else int(a) for a in args[1:]]
        if parts[0] == "setp":
            a, b = val
            preds[args[0]] = {"eq": a == b, "ne": a != b, "lt": a < b, "ge": a >= b}[parts[1]]
        elif op == "mul.wide.u32":
            regs[args[0]] = val[0] * val[1]
        elif parts[0] in _BINARY:
            regs[args[0]] = _BINARY[parts[0]](val[0], val[1]) & width
        elif parts[0] in ("mov", "cvta"):
            regs[args[0]] = val[0]
        elif parts[0] == "cvt":
            regs[args[0]] = val[0] & _MASK[parts[1]]
        elif op == "bfind.u32":
            regs[args[0]] = val[0].bit_length() - 1 if val[0] else 0xFFFFFFFF
        else:
            raise AssertionError(f"unexpected instruction {line!r}")
    return regs


def _params(grid: tuple[int, int, int], chunk: int = 1, first: int = 0) -> dict[str, int]:
    packed = pp.variant_params(grid, 0x1000, 0x2000, chunk, first, 0x3000)
    values = struct.unpack(pp.PACKING, packed)
    return {name: value for (name, _kind, _size), value in zip(pp.PARAMS, values, strict=True)}


def _run_mapping(base: int, j: int, grid: tuple[int, int, int]) -> dict[str, int]:
    """The map as emitted, for the j-th block of the chunk claimed at `base`."""
    return _run(pp.MAP, {"%__pilot_r4": base, "%__pilot_r13": j}, _params(grid))


@pytest.mark.parametrize("grid", [(1, 1, 1), (7, 1, 1), (3, 5, 1), (4, 3, 6), (1, 9, 2), (65535, 2, 1)])
@pytest.mark.parametrize("chunk", [1, 4])
def test_logical_index_mapping(grid: tuple[int, int, int], chunk: int) -> None:
    total = grid[0] * grid[1] * grid[2]
    seen = []
    for index in sorted({*range(min(total, 200)), *range(max(0, total - 50), total)}):
        base, j = index - index % chunk, index % chunk  # the claim it is in, its place there
        regs = _run_mapping(base, j, grid)
        assert "branch" not in regs and regs["%__pilot_r14"] == index
        mapped = (regs["%__pilot_r5"], regs["%__pilot_r6"], regs["%__pilot_r7"])
        assert mapped == pp.logical_ctaid(index, grid)
        assert (regs["%__pilot_r8"], regs["%__pilot_r9"], regs["%__pilot_r10"]) == grid
        seen.append(mapped)
    # hardware order (x fastest), every block once
    if total <= 200:
        assert seen == [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    assert _run_mapping(total, 0, grid)["branch"] == "$__pilot_exit"  # past the grid: leave


@pytest.mark.parametrize(("ctaid", "first", "claims"), [(0, 4, False), (3, 4, False), (4, 4, True),
                                                        (0, 0, True)])
def test_blocks_of_the_first_wave_run_their_own_index_without_a_claim(ctaid: int, first: int,
                                                                       claims: bool) -> None:
    prologue = pp.PROLOGUE.replace("%ctaid.x", str(ctaid)).replace("__pilot_blk", "0")
    regs = _run(prologue, {}, _params((9, 1, 1), first=first))
    # a block that claims goes by the tally's account (which only a resuming launch's block 0 does)
    assert regs.get("branch") == ("$__pilot_account" if claims else "$__pilot_map")
    if not claims:  # the map then runs logical block blockIdx.x, one block
        assert (regs["%__pilot_r4"], regs["%__pilot_r13"], regs["%__pilot_r12"]) == (ctaid, 0, 1)
    # block 0 of a first part zeroes the count of the blocks part 1 resumes (parity 1's)
    assert regs.get("stores", []) == ([(0x1000 + pp.RAN_AT + 4, 0)] if ctaid == 0 and first > 0 else [])


def test_variant_params_follow_the_kernels_own_arguments() -> None:
    params = pp.variant_params((4, 3, 2), ctl=0xAB00, flag=0, chunk=0, first=7, tally=0xCD00)
    assert len(params) == sum(size for _n, _k, size in pp.PARAMS) == 68
    args = pp.variant_args(b"\1\2\3\4\5", params)
    assert args[:5] == b"\1\2\3\4\5" and args[5:8] == bytes(3) and args[8:] == params
    assert struct.unpack_from(pp.PACKING, args, 8) == (0xAB00, 0, 24, 4, 3, 2, 0, 7, 0xCD00, 0, 0, 0)
    resumed = pp.variant_params((1, 1, 1), ctl=1, flag=2, part=3)
    assert struct.unpack_from("<I", resumed, 64) == (3,)
    with pytest.raises(ValueError, match="claims only"):  # a later part has no first wave
        pp.variant_params((1, 1, 1), ctl=1, first=1, part=1)
    with_session = pp.variant_params((1, 1, 1), ctl=1, flag=2, tally=3, sflag=0xEF00)
    assert struct.unpack_from("<Q", with_session, 48) == (0xEF00,)
    with pytest.raises(ValueError, match="sflag"):  # a rest (no flag) never reads a second word
        pp.variant_params((1, 1, 1), ctl=1, flag=0, sflag=2)


def _word_check() -> str:
    """The claim's thread-0 look at the retreat words, up to where it takes a claim."""
    start = pp.CLAIM.index("\tld.param.u64 \t%__pilot_rd1, [__pilot_flag]")
    return pp.CLAIM[start:pp.CLAIM.index("$__pilot_take:")]


@pytest.mark.parametrize(("flag", "sflag", "memory", "branch"), [
    (0, 0, {}, "$__pilot_take"),  # a rest: no word is read
    (0x2000, 0, {0x2000: 0}, None),  # the class word down: it claims
    (0x2000, 0, {0x2000: 1}, "$__pilot_retreat"),
    (0x2000, 0x4000, {0x2000: 0, 0x4000: 0}, None),  # both down
    (0x2000, 0x4000, {0x2000: 0, 0x4000: 1}, "$__pilot_retreat"),  # the session's word up
    (0x2000, 0x4000, {0x2000: 3, 0x4000: 0}, "$__pilot_retreat"),
])
def test_a_claim_retreats_when_either_word_is_raised(flag: int, sflag: int, memory: dict[int, int],
                                                     branch: str | None) -> None:
    params = {**_params((9, 1, 1)), "flag": flag, "sflag": sflag}
    regs = _run(_word_check(), {"memory": memory}, params)  # type: ignore[dict-item]
    assert regs.get("branch") == branch


@pytest.mark.parametrize(("counter", "retreat", "first", "chunk", "claims", "expect"), [
    (4, False, 4, 1, None, (range(4), range(4, 30), 30)),
    (4, True, 4, 2, 3, (range(4), range(4, 10), 10)),
    (4, True, 4, 2, None, (range(4), range(4, 4), 4)),
    (10, False, 0, 8, None, (range(0), range(10, 30), 30)),
    (30, False, 0, 1, None, (range(0), range(30, 30), 30)),
])
def test_what_a_launch_runs(counter: int, retreat: bool, first: int, chunk: int, claims: int | None,
                            expect: tuple[range, range, int]) -> None:
    assert pp.claimed(counter, 30, retreat, first, chunk, claims) == expect


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
    ("\tld.param.u64 %rd1, [__pilot_flag];\n\tret;", "", "uses identifiers reserved"),
    ("\tbra.uni $__pilot_next;\n\tret;", "", "uses identifiers reserved"),
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


def test_comments_are_stripped_in_one_pass_and_hostile_modules_are_bounded() -> None:
    assert pp._code("add.u32 %r1, %r2, 1; // x /* y") == "add.u32 %r1, %r2, 1;  "
    assert pp._code("a /* b */ c / d /* open") == "a   c / d  "
    hostile = "/* " * 200_000  # an unclosed comment opened over and over: one pass, not quadratic
    assert pp._code(hostile) == " "
    assert "/" not in pp._code("/*" * 200_000)
    big = _kernel("\tret;") + "// " + "x" * (pp.MAX_LINE_BYTES + 1) + "\n"
    assert pp.rewrite_module(big).kernels["k"].reason.startswith("the module's PTX is too large")
    many = HEADER + "".join(f".global .u32 v{i};\n" for i in range(20_000))
    assert pp.rewrite_module(many + _kernel("\tret;")[len(HEADER):]).kernels["k"].variant is not None


def test_kernels_using_module_variables_are_refused_but_printf_strings_are_not() -> None:
    device_var = HEADER + ".visible .global .align 4 .u32 counter;\n"
    uses = _kernel("\tld.global.u32 %r1, [counter];\n\tret;").replace(HEADER, device_var)
    assert pp.rewrite_module(uses).kernels["k"].reason.startswith("uses module variables")
    other = _kernel("\tret;").replace(HEADER, device_var)  # never names it
    assert pp.rewrite_module(other).kernels["k"].variant is not None
    constant = HEADER + ".const .align 4 .b8 table[16];\n"
    assert pp.rewrite_module(_kernel("\tmov.u64 %rd1, table;\n\tret;").replace(
        HEADER, constant)).kernels["k"].variant is None
    string = HEADER + ".global .align 1 .b8 $str[3] = {104, 105, 0};\n"
    assert pp.rewrite_module(_kernel("\tmov.u64 %rd1, $str;\n\tret;").replace(
        HEADER, string)).kernels["k"].variant is not None
    func = ".func f()\n{\n\t.reg .b32 %q<2>;\n\tld.global.u32 %q0, [counter];\n\tret;\n}\n"
    calls = _kernel("\tcall.uni f, ();\n\tret;").replace(HEADER, device_var + func)
    assert pp.rewrite_module(calls).kernels["k"].reason.startswith("uses module variables")
    # __managed__ variables (nvcc: `.attribute(.managed)`, parentheses that are no parameter
    # list): a variant would update its own module's copy (managed.cu's um_counter on the GPU)
    managed = HEADER + ".global .attribute(.managed) .align 4 .u32 counter = 5;\n"
    assert pp.rewrite_module(uses.replace(device_var, managed)).kernels["k"].reason.startswith(
        "uses module variables")


def test_a_call_into_a_function_that_exits_is_refused() -> None:
    func = ".func stop()\n{\n\texit;\n}\n"
    calls = _kernel("\tcall.uni stop, ();\n\tret;")
    module = calls.replace(HEADER, HEADER + func)
    assert pp.rewrite_module(module).kernels["k"].reason.startswith("calls device functions")
    assert pp.rewrite_module(module.replace("exit;", "ret;")).kernels["k"].variant is not None


def _chunk_barrier(module: str) -> bool:
    variant = _entry(pp.rewrite_module(module).ptx, "k" + pp.SUFFIX)
    return "$__pilot_more:\n\tbar.sync" in variant


def test_blocks_of_a_chunk_are_separated_by_a_barrier_only_when_shared_memory_is_used() -> None:
    assert not _chunk_barrier(_kernel("\tret;"))
    assert _chunk_barrier(_kernel("\tst.shared.u32 [%r1], %r2;\n\tret;"))
    module_scope = HEADER + ".shared .align 4 .b8 tile[64];\n"
    assert _chunk_barrier(_kernel("\tmov.u64 %rd1, tile;\n\tst.u32 [%rd1], %r2;\n\tret;").replace(
        HEADER, module_scope))
    func = ".func f()\n{\n\t.reg .b32 %q<2>;\n\tst.shared.u32 [%q0], %q1;\n\tret;\n}\n"
    assert _chunk_barrier(_kernel("\tcall.uni f, ();\n\tret;").replace(HEADER, HEADER + func))
    assert not _chunk_barrier(_kernel("\tret;").replace(HEADER, HEADER + func))  # never calls it


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


@pytest.mark.parametrize(("ns", "bucket"), [(0, 0), (1023, 0), (1024, 1), (2047, 1), (2048, 2),
                                            (40_000, 6), (10**9, 15), (2**62, 15)])
def test_spread_buckets_are_log2_microseconds_as_the_variant_computes_them(ns: int, bucket: int) -> None:
    assert pp.spread_bucket(ns) == bucket
    assert ns < pp.bucket_bound_s(bucket) * 1e9 or bucket == pp.SPREAD_BUCKETS - 1


def test_each_part_accounts_the_retreat_of_the_part_before_it() -> None:
    slot, tally = bytearray(pp.SLOT_BYTES), bytearray(pp.TALLY_BYTES)
    pp.start_part(slot, tally, 0)
    pp.stamp_retreat(slot, 5_000, part=0)
    pp.stamp_retreat(slot, 45_000, part=0)
    pp.stamp_retreat(slot, 9_000, part=0)  # a later block seeing it earlier does not move the ends
    assert struct.unpack_from("<QQ", slot, pp.PAIR_AT) == (5_000, 45_000)
    pp.start_part(slot, tally, 1)  # part 1 accounts part 0's retreat...
    pp.stamp_retreat(slot, 50_000, part=1)  # ...while its own blocks retreat into parity 1
    pp.count_resumed(slot, tally, 1, 4)  # its claims: 4 blocks, then 3
    pp.count_resumed(slot, tally, 1, 3)
    pp.stamp_retreat(slot, 102_000, part=1)
    got = pp.Tally.parse(bytes(tally))
    assert (got.preempted, got.deferred, got.retreats) == (1, 7, 1)
    assert got.spread[pp.spread_bucket(40_000)] == 1
    pp.start_part(slot, tally, 2)  # the last part: part 1's retreat (a 52 us spread)
    pp.count_resumed(slot, tally, 2, 2)  # its claims: a second preemption
    got = pp.Tally.parse(bytes(tally))
    assert (got.preempted, got.deferred, got.retreats) == (2, 9, 2)
    assert got.spread[pp.spread_bucket(52_000)] == 1 + (pp.spread_bucket(52_000) == pp.spread_bucket(40_000))
    assert struct.unpack_from("<QQQQ", slot, pp.PAIR_AT) == (0, 0, 0, 0)
    pp.start_part(slot, tally, 0)  # the slot's next launch: parity 1's count zeroed for its part 1
    pp.count_resumed(slot, tally, 1, 1)
    assert pp.Tally.parse(bytes(tally)).preempted == 3


SLOT, TALLY = 0x1000, 0x3000


@pytest.mark.parametrize("part", [0, 1, 2, 5])
def test_a_retreat_stamps_its_parts_readings(part: int) -> None:
    """STAMP as emitted writes the readings stamp_retreat (the sim's) does: its part's parity."""
    slot = bytearray(pp.SLOT_BYTES)
    struct.pack_into("<QQ", slot, pp.PAIR_AT + 16 * ((part + 1) & 1), 11, 22)  # the other's
    regs = {"%globaltimer": 5_000, "memory": _memory(slot, bytes(pp.TALLY_BYTES))}
    got = _run(pp.STAMP, regs, {"ctl": SLOT, "part": part})  # type: ignore[arg-type]
    regs2 = {**got, "%globaltimer": 9_000}
    got = _run(pp.STAMP, regs2, {"ctl": SLOT, "part": part})  # type: ignore[arg-type]
    pp.stamp_retreat(slot, 5_000, part)
    pp.stamp_retreat(slot, 9_000, part)
    assert got["memory"] == _memory(slot, bytes(pp.TALLY_BYTES))  # type: ignore[comparison-overlap]


def _memory(slot: bytes, tally: bytes) -> dict[int, int]:
    """The slot and the tally as _run's memory: the u32 and u64 fields the rewrite reads."""
    memory = {SLOT + at: struct.unpack_from("<I", slot, at)[0] for at in range(0, pp.PAIR_AT, 4)}
    memory |= {SLOT + at: struct.unpack_from("<Q", slot, at)[0] for at in range(pp.PAIR_AT, pp.SLOT_BYTES, 8)}
    memory |= {TALLY + at: struct.unpack_from("<Q", tally, at)[0] for at in (0, 8, 16)}
    memory |= {TALLY + 24 + 4 * b: struct.unpack_from("<I", tally, 24 + 4 * b)[0]
               for b in range(pp.SPREAD_BUCKETS)}
    return memory


@pytest.mark.parametrize("part", [1, 2, 3, 6])
@pytest.mark.parametrize("spread_ns", [0, 700, 40_000, 3_000_000_000])
def test_the_variants_account_is_the_sims(part: int, spread_ns: int) -> None:
    """ACCOUNT as emitted (thread 0 of block 0 of a part that claims from its start) does what
    start_part, the sim's, does: the next parity's count zeroed, the part before's retreat
    moved into the tally."""
    slot, tally = bytearray(pp.SLOT_BYTES), bytearray(pp.TALLY_BYTES)
    struct.pack_into("<II", slot, pp.RAN_AT, 5, 6)
    before = pp.PAIR_AT + 16 * ((part - 1) & 1)
    struct.pack_into("<QQ", slot, before, 1_000, 1_000 + spread_ns)
    struct.pack_into("<QQ", slot, pp.PAIR_AT + 16 * (part & 1), 77, 88)  # this part's own, kept
    struct.pack_into("<QQQ", tally, 0, 1, 2, 3)
    params = {**_params((9, 1, 1)), "ctl": SLOT, "tally": TALLY, "part": part}
    regs = {"%__pilot_r4": 0, "%tid.x": 0, "%tid.y": 0, "%tid.z": 0, "memory": _memory(slot, tally)}
    got = _run(pp.ACCOUNT, regs, params)  # type: ignore[arg-type]
    assert "branch" not in got  # it falls through to the claim
    pp.start_part(slot, tally, part)
    assert got["memory"] == _memory(slot, tally)  # type: ignore[comparison-overlap]


def _count() -> str:
    """The claim from where thread 0 takes it to where it posts it (no redo list)."""
    start = pp.CLAIM.index("$__pilot_take:")
    return pp.CLAIM[start:pp.CLAIM.index("$__pilot_retreat:")]


@pytest.mark.parametrize(("part", "ran", "counter", "chunk"), [
    (0, 0, 4, 3), (1, 0, 4, 3), (1, 2, 4, 3), (2, 0, 28, 3), (3, 9, 4, 8), (1, 0, 30, 1)])
def test_the_variants_claim_counts_as_the_sim(part: int, ran: int, counter: int, chunk: int) -> None:
    """A later part's claim adds its blocks to its parity's count and the tally's deferred, and
    counts a preemption at the first; the first part's claims count nothing."""
    slot, tally = bytearray(pp.SLOT_BYTES), bytearray(pp.TALLY_BYTES)
    struct.pack_into("<I", slot, 0, counter)
    struct.pack_into("<I", slot, pp.RAN_AT + 4 * (part & 1), ran)
    params = {**_params((30, 1, 1), chunk=chunk), "ctl": SLOT, "tally": TALLY, "part": part,
              "flag": 0, "redo": 0}
    regs = {"%__pilot_r12": chunk, "memory": _memory(slot, tally)}
    got = _run(_count(), regs, params)  # type: ignore[arg-type]
    assert got["branch"] == "$__pilot_post" and got["%__pilot_r4"] == counter
    struct.pack_into("<I", slot, 0, counter + chunk)
    if part:
        pp.count_resumed(slot, tally, part, max(0, min(chunk, 30 - counter)))
    assert got["memory"] == _memory(slot, tally)  # type: ignore[comparison-overlap]


# ---- loop-level variants: where the words are checked inside a block (loop_plan) ----

UNIFORM_LOOP = """\tld.param.u32 %r2, [k_param_1];
\tmov.u32 %r1, 0;
$L_top:
\tbar.sync 0;
\tadd.u32 %r1, %r1, 1;
\tsetp.lt.u32 %p1, %r1, %r2;
\t@%p1 bra $L_top;
\tret;"""
THREAD_LOOP = """\tmov.u32 %r1, %tid.x;
$L_top:
\tadd.u32 %r1, %r1, 32;
\tsetp.lt.u32 %p1, %r1, 1000;
\t@%p1 bra $L_top;
\tret;"""
NESTED = """\tld.param.u32 %r2, [k_param_1];
\tmov.u32 %r1, 0;
$L_outer:
\tmov.u32 %r3, 0;
$L_inner:
\tbar.sync 0;
\tadd.u32 %r3, %r3, 1;
\tsetp.lt.u32 %p2, %r3, 8;
\t@%p2 bra $L_inner;
\tadd.u32 %r1, %r1, 1;
\tsetp.lt.u32 %p1, %r1, %r2;
\t@%p1 bra $L_outer;
\tret;"""
# a uniform loop that only some threads reach (a per-thread branch skips it), in a kernel that
# synchronizes its threads before
SKIPPED = """\tbar.sync 0;
\tmov.u32 %r4, %tid.x;
\tsetp.ge.u32 %p2, %r4, 16;
\t@%p2 bra $L_end;
""" + UNIFORM_LOOP.replace("\tbar.sync 0;\n", "").replace("\tret;", "$L_end:\n\tret;")
# a uniform loop that some threads leave early
LEFT = UNIFORM_LOOP.replace("\tbar.sync 0;", "\tbar.sync 0;\n\tmov.u32 %r4, %tid.x;\n"
                            "\tsetp.eq.u32 %p2, %r4, 3;\n\t@%p2 bra $L_out;").replace(
    "\tret;", "$L_out:\n\tret;")


@pytest.mark.parametrize(("body", "mode", "reason"), [
    (UNIFORM_LOOP, pp.UNIFORM, ""),
    (THREAD_LOOP, pp.PER_THREAD, ""),  # no barrier: each thread may leave by itself
    (NESTED, pp.UNIFORM, ""),  # the outer loop's back edge only
    (SKIPPED, "", "no loop whose back edge every thread"),
    (LEFT, "", "no loop whose back edge every thread"),
    (THREAD_LOOP.replace("$L_top:", "$L_top:\n\tbar.sync 0;"), "", "no loop whose back edge every thread"),
    (THREAD_LOOP.replace("$L_top:", "$L_top:\n\tshfl.sync.bfly.b32 %r5, %r1, 1, 31, -1;"), "",
     "no loop whose back edge every thread"),  # a warp collective: lanes must not leave alone
    (UNIFORM_LOOP.replace("bar.sync 0;", "bar.sync 1, 64;"), "", "named, counted or guarded barriers"),
    (UNIFORM_RETURN, "", "no loop"),
])
def test_loop_plans(body: str, mode: str, reason: str) -> None:
    r = pp.rewrite_module(_kernel(body), loops=True).kernels["k"]
    assert (r.loop_mode, r.loop is not None) == (mode, bool(mode))
    assert r.loop_reason.startswith(reason) if reason else not r.loop_reason


def test_the_checks_go_before_the_outer_back_edges_only() -> None:
    body = [pp._code(line) for line in _kernel(NESTED).splitlines()]
    body = body[next(j for j, line in enumerate(body) if line.strip() == "{") + 1:-1]
    plan = pp.loop_plan(body)
    assert plan.mode == pp.UNIFORM and [body[b].strip() for b in plan.back_edges] == ["@%p1 bra $L_outer;"]
    variant = _entry(pp.rewrite_module(_kernel(NESTED), loops=True).ptx, "k" + pp.LOOP_SUFFIX)
    check = variant.index(f"bar.red.or.pred \t%__pilot_p2, {pp.LOOP_BARRIER}, %__pilot_p1;")
    assert variant.index("@%p2 bra $L_inner;") < check < variant.index("@%p1 bra $L_outer;")
    assert variant.count("bar.red.or.pred") == 1 and "$__pilot_abandon:" in variant
    # without loops=True (pilotd's default) no loop-level variant is made
    assert pp.rewrite_module(_kernel(NESTED)).kernels["k"].loop is None


@needs_nvcc
@pytest.mark.parametrize("body", [UNIFORM_LOOP, THREAD_LOOP, NESTED])
def test_loop_level_variants_assemble(body: str) -> None:
    ptxas(pp.rewrite_module(_kernel(body), loops=True).ptx, "sm_90")


def test_redo_lists_as_the_variant_keeps_them() -> None:
    redo, tally = bytearray(pp.redo_bytes(4)), bytearray(pp.TALLY_BYTES)
    pp.abandon(redo, tally, 7, 1)
    pp.abandon(redo, tally, 12, 3)  # a block of chunk 4 left inside its second logical block
    assert pp.Tally.parse(bytes(tally)).abandoned == 4
    assert pp.take_redo(redo) == [range(7, 8), range(12, 15)]
    assert pp.take_redo(redo) == []  # taken once


def test_only_the_claims_first_block_goes_through_shared_memory() -> None:
    """The H200 (2026-11-29): a claim that also passed its count through the shared slot gave
    wrong results for a kernel whose long blocks synchronize (tests/gpu/loop_preempt_check.py
    --diagnose smooth), where the count read from the parameters by every thread did not; the
    count stays in the parameters (loop-level launches claim one block at a time)."""
    assert pp.CLAIM.count("st.shared") == 1 and pp.CLAIM.count("ld.shared") == 1
    assert "[__pilot_chunk]" in pp.CLAIM[:pp.CLAIM.index("bra \t$__pilot_read;")]  # every thread's
    assert "[%__pilot_r16+4]" not in pp.CLAIM and "__pilot_blk[2]" in pp.DECLARATIONS
