"""The preemptible variant of a kernel, made from its PTX: persistent thread blocks that claim
logical block indices from a counter in device memory (Tally's preemptive PTB, issue 29).

For each kernel `K` of a module the rewrite adds an entry `K__pilot_ptb` taking K's parameters
and one more, a pointer to a control block (`Control`, 32 bytes of device memory):

    u32 next      logical blocks claimed so far (the atomic counter; the progress kept)
    u32 retreat   non-zero: claim no more (the preemption request, written by the host)
    u32 total     logical blocks of the original grid (gx * gy * gz)
    u32 gx, gy, gz  the original grid
    u32 chunk     logical blocks per claim (0 counts as 1)

Launched with any number of blocks (the GPU's resident maximum at most), each block loops:
thread 0 reads `retreat` (volatile) and, when it is 0, claims `chunk` indices from `next` with
atom.add; the block reads the claim through shared memory between two barriers and runs the
chunk's logical blocks one after another (a barrier between two: the next one's threads must
not overwrite shared memory the previous one still reads); an index >= total (or a retreat)
ends the block. A larger chunk costs fewer atomics on one address, which matters for grids of
many short blocks, and delays the retreat by up to chunk - 1 blocks: the daemon chooses it per
kernel and grid. The block runs K's body with every `%ctaid` read mapped to the
logical index (x fastest, as the hardware numbers blocks: `logical_ctaid`) and every `%nctaid`
read to the original grid, and every `ret` / `exit` of the body goes back to the claim. A
block that claimed an index finishes it, so every logical block runs exactly once whatever
the moment of the retreat: after a preempted launch ends, `next` (at most `total`) blocks are
done and a launch with the same control block (retreat cleared) runs only the rest.

Kernels that are not rewritten, and why (`Rewrite.reason`):
- grid-wide synchronization (cooperative groups' grid.sync reads the grid workspace through
  `%envreg1`/`%envreg2`): its blocks must all be resident at once, which a persistent grid that
  runs logical blocks one after another breaks (it would deadlock);
- clusters (`%cluster_*`, `.reqnctapercluster`, `.explicitcluster`, `barrier.cluster`,
  `mapa`, `::cluster` memory): a cluster's blocks share distributed shared memory and are
  scheduled together; logical blocks claimed one by one are not;
- `%gridid` or a whole `%ctaid` / `%nctaid` vector read (not mapped);
- programmatic dependent launch (`griddepcontrol`): when dependents may start is a property
  of the real grid's blocks;
- a call in a module where a device function executes `exit`: a thread that exits there would
  never reach the next claim's barrier;
- a CTA barrier that some threads could skip by a `ret` or a forward branch before it: in the
  original, threads that returned early have exited and barriers stop counting them; in the
  persistent loop they wait at the next claim's barrier instead, so the rewrite requires that
  every `ret`/`exit` before the last barrier, and every branch from before it to a point after
  it, is taken by all threads of a block or none: unconditional, or on a predicate computed
  from block-uniform values only (parameters, constants, %ctaid, %nctaid, %ntid, module
  addresses; never %tid, %laneid, clocks or what a load, atomic or shuffle returns). The test
  is flow-insensitive and conservative: a kernel it refuses keeps running unchanged.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

SUFFIX = "__pilot_ptb"
CONTROL_BYTES = 32
CONTROL_WORDS = ("next", "retreat", "total", "gx", "gy", "gz", "chunk")
VERSION = 1  # of the rewrite: part of the compiled-image cache key (ptx_cache.py)

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ENTRY = re.compile(r"^(\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+)([\w$]+)(\s*\()", re.M)
_LABEL = re.compile(r"^\s*([$\w]+):")
_BARRIER = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:bar|barrier)(?:\.cta)?\.(?:sync|arrive|red)\b")
_RETURN = re.compile(r"^(\s*)(@!?%[\w$]+\s+)?(?:ret|exit)(?:\.uni)?\s*;")
_BRANCH = re.compile(r"^\s*(?:@!?%[\w$]+\s+)?bra(?:\.uni)?\s+([$\w]+)\s*;")
_CTAID = re.compile(r"%(n?)ctaid\.([xyz])\b")
_GRID_SYNC = re.compile(r"%envreg[12]\b")
_CLUSTER = re.compile(r"%cluster|%is_explicit_cluster|\.reqnctapercluster|\.explicitcluster|"
                      r"barrier\.cluster|\bmapa\b|::cluster")
_WHOLE_VECTOR = re.compile(r"%n?ctaid(?![.\w])|%gridid\b")
_GRID_DEPENDENCY = re.compile(r"\bgriddepcontrol\b")
_FUNC = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.func\b")
_CALL = re.compile(r"^\s*(?:@!?%[\w$]+\s+)?call\b", re.M)
_EXIT = re.compile(r"^\s*(?:@!?%[\w$]+\s+)?exit\s*;", re.M)

# Registers and labels of the rewrite (PTX identifiers the compiler never emits).
_R = "%__pilot_r"
_MAP = {("", "x"): f"{_R}5", ("", "y"): f"{_R}6", ("", "z"): f"{_R}7",
        ("n", "x"): f"{_R}8", ("n", "y"): f"{_R}9", ("n", "z"): f"{_R}10"}

DECLARATIONS = f"""\t.reg .b32 \t{_R}<15>;
\t.reg .b64 \t%__pilot_rd<1>;
\t.reg .pred \t%__pilot_p<2>;
\t.shared .align 4 .u32 __pilot_blk;
"""

# The claim: thread 0 claims (or reads the retreat), the block reads the claim, then maps it.
CLAIM = f"""$__pilot_claim:
\tld.param.u64 \t%__pilot_rd0, [__pilot_ctl];
\tcvta.to.global.u64 \t%__pilot_rd0, %__pilot_rd0;
\tmov.u32 \t{_R}0, %tid.x;
\tmov.u32 \t{_R}1, %tid.y;
\tor.b32 \t{_R}0, {_R}0, {_R}1;
\tmov.u32 \t{_R}1, %tid.z;
\tor.b32 \t{_R}0, {_R}0, {_R}1;
\tsetp.ne.u32 \t%__pilot_p0, {_R}0, 0;
\t@%__pilot_p0 bra \t$__pilot_read;
\tld.volatile.global.u32 \t{_R}2, [%__pilot_rd0+4];
\tld.global.u32 \t{_R}4, [%__pilot_rd0+8];
\tld.global.u32 \t{_R}12, [%__pilot_rd0+24];
\tmax.u32 \t{_R}12, {_R}12, 1;
\tsetp.ne.u32 \t%__pilot_p1, {_R}2, 0;
\t@!%__pilot_p1 atom.global.add.u32 \t{_R}4, [%__pilot_rd0], {_R}12;
\tst.shared.u32 \t[__pilot_blk], {_R}4;
$__pilot_read:
\tbar.sync \t0;
\tld.shared.u32 \t{_R}4, [__pilot_blk];
\tbar.sync \t0;
\tld.global.u32 \t{_R}12, [%__pilot_rd0+24];
\tmax.u32 \t{_R}12, {_R}12, 1;
\tmov.u32 \t{_R}13, 0;
\tld.global.u32 \t{_R}11, [%__pilot_rd0+8];
\tld.global.u32 \t{_R}8, [%__pilot_rd0+12];
\tld.global.u32 \t{_R}9, [%__pilot_rd0+16];
\tld.global.u32 \t{_R}10, [%__pilot_rd0+20];
\tbra.uni \t$__pilot_map;
$__pilot_more:
\tbar.sync \t0;
$__pilot_map:
\tadd.u32 \t{_R}14, {_R}4, {_R}13;
\tsetp.ge.u32 \t%__pilot_p1, {_R}14, {_R}11;
\t@%__pilot_p1 bra \t$__pilot_exit;
\trem.u32 \t{_R}5, {_R}14, {_R}8;
\tdiv.u32 \t{_R}3, {_R}14, {_R}8;
\trem.u32 \t{_R}6, {_R}3, {_R}9;
\tdiv.u32 \t{_R}7, {_R}3, {_R}9;
"""

EPILOGUE = """$__pilot_next:
\tadd.u32 \t%__pilot_r13, %__pilot_r13, 1;
\tsetp.lt.u32 \t%__pilot_p1, %__pilot_r13, %__pilot_r12;
\t@%__pilot_p1 bra \t$__pilot_more;
\tbra.uni \t$__pilot_claim;
$__pilot_exit:
\tret;
"""


@dataclass(frozen=True)
class Rewrite:
    """What became of one kernel: its preemptible entry's name, or why it has none."""

    kernel: str
    variant: str | None
    reason: str = ""


@dataclass(frozen=True)
class Rewritten:
    """A module's PTX with the preemptible variants added (the original entries unchanged)."""

    ptx: str
    kernels: dict[str, Rewrite]

    @property
    def variants(self) -> dict[str, str]:
        return {k: r.variant for k, r in self.kernels.items() if r.variant is not None}


def logical_ctaid(index: int, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """The block a logical index stands for: x fastest, then y, then z (the claim's mapping)."""
    gx, gy, _gz = grid
    return index % gx, index // gx % gy, index // gx // gy


def control_words(grid: tuple[int, int, int], done: int = 0, chunk: int = 1) -> list[int]:
    """The control block's words for a launch of `grid` of which `done` blocks already ran,
    claiming `chunk` logical blocks at a time."""
    gx, gy, gz = grid
    return [done, 0, gx * gy * gz, gx, gy, gz, chunk, 0]


def claim_range(control: memoryview | bytearray, run_blocks: int | None = None) -> range:
    """What one launch of a variant runs, from its control block, as the claim loop does (the
    sim's emulation of it): the logical blocks from `next` on, all of them or `run_blocks`
    claims (the retreat seen after that many), none while `retreat` is set; `next` is advanced
    past what runs."""
    claimed, retreat, total = struct.unpack_from("<3I", control)
    end = claimed if retreat else total if run_blocks is None else min(total, claimed + run_blocks)
    end = max(end, claimed)
    struct.pack_into("<I", control, 0, end)
    return range(claimed, end)


def rewrite_module(ptx: str) -> Rewritten:
    """Every entry of the module gets its preemptible variant where it can (module docstring)."""
    lines = ptx.splitlines()
    out: list[str] = []
    kernels: dict[str, Rewrite] = {}
    exits_in_functions = _functions_exit(lines)
    i = 0
    while i < len(lines):
        match = _ENTRY.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        end = _entry_end(lines, i)
        entry = lines[i:end + 1]
        out.extend(entry)
        name = match.group(2)
        reason = _refusal(entry, exits_in_functions)
        if reason:
            kernels[name] = Rewrite(name, None, reason)
        else:
            out.append("")
            out.extend(_variant(entry, name))
            kernels[name] = Rewrite(name, name + SUFFIX)
        i = end + 1
    return Rewritten("\n".join(out) + "\n", kernels)


def _code(line: str) -> str:
    return _COMMENTS.sub(" ", line)


def _entry_end(lines: list[str], start: int) -> int:
    """The line of the `}` closing the entry that starts at `start`."""
    depth, opened = 0, False
    for j in range(start, len(lines)):
        code = _code(lines[j])
        for ch in code:
            if ch == "{":
                depth, opened = depth + 1, True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return j
    raise ValueError(f"PTX entry at line {start + 1} does not end")


def _body_start(entry: list[str]) -> int:
    """The line after the entry's opening `{`."""
    for j, line in enumerate(entry):
        if "{" in _code(line):
            return j + 1
    raise ValueError("PTX entry without a body")


def _functions_exit(lines: list[str]) -> bool:
    """Whether a device function (.func with a body) of the module executes `exit`."""
    i = 0
    while i < len(lines):
        if _FUNC.match(_code(lines[i])) and not _code(lines[i]).rstrip().endswith(";"):
            end = _entry_end(lines, i)
            if _EXIT.search(_code("\n".join(lines[i:end + 1]))):
                return True
            i = end + 1
        else:
            i += 1
    return False


def _refusal(entry: list[str], exits_in_functions: bool = False) -> str:
    """Why the entry cannot be rewritten, or the empty string."""
    text = _code("\n".join(entry))
    if _GRID_DEPENDENCY.search(text):
        return "programmatic dependent launch (griddepcontrol) follows the real grid's blocks"
    if exits_in_functions and _CALL.search(text):
        return "calls device functions of a module where one executes exit"
    if _GRID_SYNC.search(text):
        return "grid-wide synchronization (cooperative groups): its blocks must all be resident"
    if _CLUSTER.search(text):
        return "thread block clusters: a cluster's blocks run together and share memory"
    if _WHOLE_VECTOR.search(text):
        return "reads %gridid or a whole %ctaid/%nctaid vector, which the rewrite does not map"
    body = [_code(line) for line in entry[_body_start(entry):]]
    barriers = [j for j, line in enumerate(body) if _BARRIER.match(line)]
    if not barriers:
        return ""
    last = barriers[-1]
    labels = {m.group(1): j for j, line in enumerate(body) if (m := _LABEL.match(line))}
    varying: set[str] | None = None
    for j in range(last):
        branch = _BRANCH.match(body[j])
        skips = branch is not None and labels.get(branch.group(1), -1) > last
        if not (skips or _RETURN.match(body[j])):
            continue
        guard = _guard(body[j])
        if guard is None:
            continue  # every thread of the block goes
        if varying is None:
            varying = _varying_registers(body)
        if guard in varying:
            what = "a branch jumps past" if skips else "some threads return before"
            return f"{what} a barrier on a per-thread condition: they would wait at the claim's barrier"
    return ""


# Special registers that differ between the threads of a block.
_THREAD_SPECIAL = re.compile(r"%(?:tid|laneid|warpid|nwarpid|smid|nsmid|clock|clock64|globaltimer|"
                             r"lanemask_\w+|dynamic_smem_size|total_smem_size|pm\d|envreg\d+)\b")
_REGISTER = re.compile(r"%[A-Za-z_$][\w$]*")
# Instructions whose result may differ between threads even from uniform operands (memory,
# atomics, warp operations, calls); ld.param and ld.const read the same for every thread.
_VARYING_OPS = ("ld", "ldu", "atom", "red", "shfl", "vote", "match", "tex", "tld4", "suld", "call",
                "activemask", "redux", "mma", "wmma", "wgmma", "ldmatrix", "cp", "elect", "getctarank",
                "mapa")
_NO_DEST = ("st", "bar", "barrier", "bra", "ret", "exit", "trap", "membar", "fence", "prefetch",
            "prefetchu", "red", "sust", "pmevent", "brkpt", "nanosleep", "griddepcontrol")


def _varying_registers(body: list[str]) -> set[str]:
    """Registers that may hold different values in the threads of one block (a fixed point
    over every definition, whatever its place: flow-insensitive)."""
    defs: list[tuple[list[str], list[str], bool]] = []  # (destinations, sources, varying by itself)
    for line in body:
        code = line.strip().rstrip(";").strip()
        if not code or code.startswith((".", "$", "{", "}")) or code.endswith(":"):
            continue
        guard = ""
        if code.startswith("@"):
            guard, _, code = code.partition(" ")
            code = code.strip()
        op, _, operands = code.partition(" ")
        base = op.split(".")[0]
        if base in _NO_DEST:
            continue
        parts = [p.strip() for p in re.split(r",(?![^{]*})", operands)]
        if not parts or not parts[0]:
            continue
        dests = _REGISTER.findall(parts[0].replace("|", " "))
        sources = _REGISTER.findall(" ".join(parts[1:]) + " " + guard)
        varying = bool(_THREAD_SPECIAL.search(operands)) or (
            base in _VARYING_OPS and not (op.startswith(("ld.param", "ld.const"))
                                          and "retval" not in operands))  # a call's result varies
        defs.append((dests, [r for r in sources if not _THREAD_SPECIAL.fullmatch(r)], varying))
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for dests, sources, varying in defs:
            if (varying or any(r in out for r in sources)) and not out.issuperset(dests):
                out.update(dests)
                changed = True
    return out


def _guard(line: str) -> str | None:
    """The predicate register guarding an instruction, or None."""
    m = re.match(r"\s*@!?(%[\w$]+)", line)
    return m.group(1) if m else None


def _variant(entry: list[str], name: str) -> list[str]:
    """The preemptible copy of an entry (module docstring)."""
    text = "\n".join(entry)
    header_end = _body_start(entry)
    header = "\n".join(entry[:header_end])
    header = _ENTRY.sub(lambda m: m.group(1) + name + SUFFIX + m.group(3), header, count=1)
    close = header.rfind(")")
    params = header[header.find("(") + 1:close]
    extra = ",\n\t.param .u64 __pilot_ctl\n" if params.strip() else "\n\t.param .u64 __pilot_ctl\n"
    header = header[:close].rstrip() + extra + header[close:]
    body = entry[header_end:-1]
    decls = 0
    while decls < len(body) and (not _code(body[decls]).strip()
                                 or _code(body[decls]).strip().startswith((".reg", ".shared", ".local"))):
        decls += 1
    mapped = [_map_line(line) for line in body]
    assert text  # the entry is not empty
    return [header, *mapped[:decls], DECLARATIONS + CLAIM.rstrip("\n"), *mapped[decls:],
            EPILOGUE.rstrip("\n"), entry[-1]]


def _map_line(line: str) -> str:
    """%ctaid / %nctaid reads to the logical registers; ret and exit back to the claim."""
    if "ctaid" in line:
        line = _CTAID.sub(lambda m: _MAP[(m.group(1), m.group(2))], line)
    ret = _RETURN.match(line)
    if ret:
        line = f"{ret.group(1)}{ret.group(2) or ''}bra \t$__pilot_next;" + line[ret.end():]
    return line
