"""The preemptible variant of a kernel, made from its PTX: persistent thread blocks that claim
logical block indices from a counter in device memory (Tally's preemptive PTB, issue 29).

For each kernel `K` of a module the rewrite adds an entry `K__pilot_ptb` taking K's parameters
and these after them (`variant_params` packs them):

    u64 ctl     device address of a u32 counter: logical blocks claimed so far (the progress kept)
    u64 flag    device address of a u32 retreat word (non-zero: claim no more); 0: never retreats
    u32 total   logical blocks of the original grid (gx * gy * gz)
    u32 gx, gy, gz  the original grid
    u32 chunk   logical blocks per claim (0 counts as 1)
    u32 first   blocks of this launch that run logical block blockIdx.x without claiming it
    u64 tally   device address of the session's tally (TALLY_BYTES, zeroed); 0: no accounting
    u64 sflag   device address of a second retreat word, read with `flag` (VERSION 4: a word of
                the session's own, which a policy raises to preempt the session); 0: none
    u64 redo    (loop-level variants, below)
    u32 part    which part of one launch this is (VERSION 6): 0 the first; k > 0 a part that
                resumes what the parts before it left, itself preemptible when it has a `flag`
                (a chain of preemptible parts), the last one without

A launch (of the original grid) runs as parts on one slot, one after another on its stream: the
first with `first` blocks that run their own index, the later ones (`first` 0) claiming only.
`ctl` points at the slot (SLOT_BYTES): the u32 counter, a u32 count per part parity of the
blocks its claims resumed (RAN_AT), then per part parity two u64 GPU clock readings
(%globaltimer, ns) of the part's retreat (PAIR_AT): when the first of its blocks saw the word
raised and when the last did (0 before any retreat). The counter must hold `first` when the
first part starts (the host writes it on the launch's stream).

**The tally** (VERSION 3) is what the GPU says about preemption, read by pilotd at leisure
(TALLY_BYTES: u64 preemptions, u64 blocks deferred, u64 retreats, u32 per spread bucket):
- block 0 of each part zeroes the count of the next part's parity;
- a block that retreats (its thread 0 saw the word raised before a claim) stamps its part's
  parity's readings;
- a part after the first (`tally` set) adds each claim's blocks to its parity's count and to
  the tally's blocks deferred; the claim that finds the count 0 (the part's first that ran a
  block) counts a preemption: the part before it retreated with blocks left;
- its block 0 first moves the readings of the part before into the tally (a retreat, and its
  spread in a log2 bucket of microseconds) and zeroes them. (The parities keep a part's own
  retreat apart from the one it accounts: a raise can come while block 0 accounts.)
A retreat may find nothing left to claim: then it is counted as a retreat, not as a
preemption. A part no retreat touched costs a store and a load.
Launched with any number of blocks (the GPU's resident maximum at most), blocks below `first`
run their own index first (a launch's first wave starts at once, so it needs no atomic and no
retreat check: it is running when any request could come), then each block loops: thread 0
reads the retreat word (volatile; and `sflag`'s, when set) and, when both are 0, claims `chunk`
indices with atom.add; the block reads the claim through one of two shared slots (alternating,
so one barrier per claim suffices) and runs the chunk's logical blocks one after another (with
a barrier between two when the kernel uses shared memory: the next one's threads must not
overwrite what the previous one still reads); an index >= total (or a retreat) ends the block.
Everything else a claim needs comes from parameters (the constant bank), read once per block. A
larger chunk costs fewer atomics on one address, which matters for grids of many short blocks,
and delays the retreat by up to chunk - 1 blocks. The block runs K's body with every `%ctaid`
read mapped to the logical index (x fastest, as the hardware numbers blocks: `logical_ctaid`)
and every `%nctaid` read to the original grid, and every `ret` / `exit` of the body goes back
to the claim. A block that claimed an index finishes it, so every logical block runs exactly
once whatever the moment of the retreat: after a preempted launch ends, the counter's blocks
(at most `total`) are done and a part with the same counter and `first` 0 runs only the rest
(with `flag` 0, all of it).

**Loop-level variants** (`rewrite_module(loops=True)`, an entry `K__pilot_loop`; `u64 redo`, the
launch slot's redo list: u32 entries made, u32 taken, a (u32 logical block, u32 1) per entry).
The same claim loop, and before the back edge of each outer loop of the body (`loop_plan`) a
look at the words every LOOP_CHECK_EVERY passes, testing what the look before read. UNIFORM
loops (reached as often by every thread of a block) decide by a barrier reduction, PER_THREAD
ones (bodies without barriers, warp collectives or calls) in each thread, the block deciding at
its end. A block that leaves puts its logical block on the redo list (`$__pilot_abandon`, counted
in the tally's u64 at ABANDONED_AT) and exits; the launch's rest takes the list's entries before
it claims, and runs each whole: correct for idempotent kernels only. Launches of these variants
claim one block at a time, in two parts (the list holds one entry per block of a part). A
launch without a redo list never leaves inside a block.

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
- identifiers reserved for the rewrite (`__pilot...`): a body naming them would reach the
  claim's parameters (pilotd's counter and retreat word) or jump into the claim;
- module variables (`__device__`, `__constant__`, `__managed__`, texture references) read or
  written by the kernel or by a device function it may call: the variants are loaded as a module
  of their own, whose copies of the variables the program never set or reads (nvcc's printf
  format strings, read-only, are the exception);
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

import math
import re
import struct
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

SUFFIX = "__pilot_ptb"
COUNTER_BYTES = 4  # the u32 counter at the start of a launch's slot (`ctl`)
# A launch's slot: the u32 counter, a u32 count of blocks resumed per part parity (RAN_AT), then
# per part parity (PAIR_AT) the u64 readings of its retreat: when its first block saw the word
# raised and when its last did. A part stamps its parity's readings and counts its blocks in its
# parity's count, so the part after it can account them while stamping and counting its own.
SLOT_BYTES = 48
RAN_AT = 4  # + 4 x parity
PAIR_AT = 16  # + 16 x parity
SPREAD_BUCKETS = 16  # bucket 0: < 1.024 us; bucket k: [2^(k-1), 2^k) x 1.024 us; the last: above
# the tally: u64 preemptions, u64 blocks deferred, u64 retreats, u32 per spread bucket,
# u64 blocks abandoned (loop-level retreats: run again from their start)
ABANDONED_AT = 24 + 4 * SPREAD_BUCKETS
TALLY_BYTES = ABANDONED_AT + 8
LOOP_SUFFIX = "__pilot_loop"  # the loop-level variant (loops=True): also retreats inside a block
REDO_HEADER = 8  # a slot's redo list: u32 entries made, u32 entries taken, then the entries
REDO_ENTRY = 8  # u32 logical block, u32 blocks (1: loop-level launches claim one block at a time)
# The parameters the variant takes after K's own (name, PTX type, bytes), in this order.
PARAMS = (("ctl", "u64", 8), ("flag", "u64", 8), ("total", "u32", 4), ("gx", "u32", 4),
          ("gy", "u32", 4), ("gz", "u32", 4), ("chunk", "u32", 4), ("first", "u32", 4),
          ("tally", "u64", 8), ("sflag", "u64", 8), ("redo", "u64", 8), ("part", "u32", 4))
PACKING = "<QQ6IQQQI"  # PARAMS as struct packs them
VERSION = 6  # of the rewrite: part of the compiled-image cache key (ptx_cache.py)

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

DECLARATIONS = f"""\t.reg .b32 \t{_R}<21>;
\t.reg .b64 \t%__pilot_rd<2>;
\t.reg .b64 \t%__pilot_rt<4>;
\t.reg .pred \t%__pilot_p<4>;
\t.reg .pred \t%__pilot_q<1>;
\t.shared .align 8 .b32 __pilot_blk[2];
"""

# Once per block: blocks below `first` run their own index, the others claim. Parameters are
# read where they are used (the constant bank): nothing of the claim's stays live in registers
# across the kernel's body but the claim itself, which keeps the variant's register count (and
# so its occupancy) near the original's.
PROLOGUE = f"""\tmov.u32 \t{_R}16, __pilot_blk;
\tmov.u32 \t{_R}13, 0;
\tmov.u32 \t{_R}12, 1;
\tmov.u32 \t{_R}4, %ctaid.x;
\tld.param.u32 \t{_R}3, [__pilot_first];
\tsetp.lt.u32 \t%__pilot_p1, {_R}4, {_R}3;
\t@!%__pilot_p1 bra.uni \t$__pilot_account;
\tsetp.ne.u32 \t%__pilot_p2, {_R}4, 0;
\t@%__pilot_p2 bra.uni \t$__pilot_map;
\tld.param.u64 \t%__pilot_rt0, [__pilot_tally];
\tsetp.eq.u64 \t%__pilot_p2, %__pilot_rt0, 0;
\t@%__pilot_p2 bra.uni \t$__pilot_map;
\tld.param.u64 \t%__pilot_rt1, [__pilot_ctl];
\tcvta.to.global.u64 \t%__pilot_rt1, %__pilot_rt1;
\tst.global.u32 \t[%__pilot_rt1+{RAN_AT + 4}], 0;
\tbra.uni \t$__pilot_map;
"""

# r0 := tid.x | tid.y | tid.z (0 in thread 0 only)
NOT_THREAD0 = f"""\tmov.u32 \t{_R}0, %tid.x;
\tmov.u32 \t{_R}1, %tid.y;
\tor.b32 \t{_R}0, {_R}0, {_R}1;
\tmov.u32 \t{_R}1, %tid.z;
\tor.b32 \t{_R}0, {_R}0, {_R}1;
"""

# Once, by thread 0 of block 0 of a launch that claims from its start (`first` 0; a tally):
# the count of the next part's parity zeroed (the part before this one used it; the next
# counts in it); in a part after the first (`part` > 0), the retreat of the part before (the
# same parity), if any, into the tally and its readings zeroed.
ACCOUNT = f"""$__pilot_account:
\tsetp.ne.u32 \t%__pilot_p1, {_R}4, 0;
\t@%__pilot_p1 bra.uni \t$__pilot_claim;
\tld.param.u64 \t%__pilot_rt0, [__pilot_tally];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rt0, 0;
\t@%__pilot_p1 bra.uni \t$__pilot_claim;
{NOT_THREAD0}\tsetp.ne.u32 \t%__pilot_p1, {_R}0, 0;
\t@%__pilot_p1 bra \t$__pilot_claim;
\tld.param.u64 \t%__pilot_rt1, [__pilot_ctl];
\tcvta.to.global.u64 \t%__pilot_rt1, %__pilot_rt1;
\tld.param.u32 \t{_R}1, [__pilot_part];
\tadd.u32 \t{_R}2, {_R}1, 1;
\tand.b32 \t{_R}2, {_R}2, 1;
\tmul.wide.u32 \t%__pilot_rt3, {_R}2, 4;
\tadd.u64 \t%__pilot_rt3, %__pilot_rt1, %__pilot_rt3;
\tst.global.u32 \t[%__pilot_rt3+{RAN_AT}], 0;
\tsetp.eq.u32 \t%__pilot_p1, {_R}1, 0;
\t@%__pilot_p1 bra \t$__pilot_claim;
\tmul.wide.u32 \t%__pilot_rt3, {_R}2, 16;
\tadd.u64 \t%__pilot_rt1, %__pilot_rt1, %__pilot_rt3;
\tld.volatile.global.u64 \t%__pilot_rt2, [%__pilot_rt1+{PAIR_AT + 8}];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rt2, 0;
\t@%__pilot_p1 bra \t$__pilot_claim;
\tld.volatile.global.u64 \t%__pilot_rt3, [%__pilot_rt1+{PAIR_AT}];
\tsub.u64 \t%__pilot_rt2, %__pilot_rt2, %__pilot_rt3;
\tshr.u64 \t%__pilot_rt2, %__pilot_rt2, 10;
\tmin.u64 \t%__pilot_rt2, %__pilot_rt2, 1073741824;
\tcvt.u32.u64 \t{_R}2, %__pilot_rt2;
\tbfind.u32 \t{_R}2, {_R}2;
\tadd.u32 \t{_R}2, {_R}2, 1;
\tmin.u32 \t{_R}2, {_R}2, {SPREAD_BUCKETS - 1};
\tcvta.to.global.u64 \t%__pilot_rt0, %__pilot_rt0;
\tred.global.add.u64 \t[%__pilot_rt0+16], 1;
\tmul.wide.u32 \t%__pilot_rt3, {_R}2, 4;
\tadd.u64 \t%__pilot_rt3, %__pilot_rt0, %__pilot_rt3;
\tred.global.add.u32 \t[%__pilot_rt3+24], 1;
\tst.volatile.global.u64 \t[%__pilot_rt1+{PAIR_AT}], 0;
\tst.volatile.global.u64 \t[%__pilot_rt1+{PAIR_AT + 8}], 0;
"""

# A block saw the word raised (a claim's retreat, or a loop-level abandon): the first reading of
# the GPU clock of its part's parity if it has none, and its last (stamp_retreat is the sim's).
STAMP = f"""\tld.param.u32 \t{_R}1, [__pilot_part];
\tand.b32 \t{_R}1, {_R}1, 1;
\tmul.wide.u32 \t%__pilot_rt3, {_R}1, 16;
\tld.param.u64 \t%__pilot_rt1, [__pilot_ctl];
\tcvta.to.global.u64 \t%__pilot_rt1, %__pilot_rt1;
\tadd.u64 \t%__pilot_rt1, %__pilot_rt1, %__pilot_rt3;
\tmov.u64 \t%__pilot_rt2, %globaltimer;
\tatom.global.cas.b64 \t%__pilot_rt3, [%__pilot_rt1+{PAIR_AT}], 0, %__pilot_rt2;
\tatom.global.max.u64 \t%__pilot_rt3, [%__pilot_rt1+{PAIR_AT + 8}], %__pilot_rt2;
"""

# The claim: thread 0 claims (or sees the retreat), the block reads the claim through shared
# memory, then maps it. A launch whose first wave is the whole grid has nothing to claim. A part
# after the first of a loop-level variant first takes the entries of its slot's redo list (the
# blocks the first part abandoned, one each: loop-level launches claim one block at a time),
# then claims. (Only the claim's first block goes through shared memory: a version that passed the
# claim's count there too gave wrong results on the H200 for a kernel whose long blocks
# synchronize, with a grid of persistent blocks the GPU held at once; the cause was not found,
# bench/RESULTS.md, twentieth session.)
CLAIM = f"""$__pilot_claim:
\tld.param.u32 \t{_R}3, [__pilot_first];
\tld.param.u32 \t{_R}11, [__pilot_total];
\tsetp.ge.u32 \t%__pilot_p1, {_R}3, {_R}11;
\t@%__pilot_p1 bra.uni \t$__pilot_exit;
\txor.b32 \t{_R}16, {_R}16, 4;
\tld.param.u32 \t{_R}12, [__pilot_chunk];
\tmax.u32 \t{_R}12, {_R}12, 1;
{NOT_THREAD0}\tsetp.ne.u32 \t%__pilot_p0, {_R}0, 0;
\t@%__pilot_p0 bra \t$__pilot_read;
\tld.param.u32 \t{_R}4, [__pilot_total];
\tld.param.u64 \t%__pilot_rd1, [__pilot_flag];
\tsetp.eq.u64 \t%__pilot_p2, %__pilot_rd1, 0;
\t@%__pilot_p2 bra \t$__pilot_take;
\tcvta.to.global.u64 \t%__pilot_rd1, %__pilot_rd1;
\tld.volatile.global.u32 \t{_R}2, [%__pilot_rd1];
\tld.param.u64 \t%__pilot_rd1, [__pilot_sflag];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rd1, 0;
\t@%__pilot_p1 bra \t$__pilot_check;
\tcvta.to.global.u64 \t%__pilot_rd1, %__pilot_rd1;
\tld.volatile.global.u32 \t{_R}1, [%__pilot_rd1];
\tor.b32 \t{_R}2, {_R}2, {_R}1;
$__pilot_check:
\tsetp.ne.u32 \t%__pilot_p1, {_R}2, 0;
\t@%__pilot_p1 bra \t$__pilot_retreat;
$__pilot_take:
\tld.param.u64 \t%__pilot_rd0, [__pilot_ctl];
\tcvta.to.global.u64 \t%__pilot_rd0, %__pilot_rd0;
\tld.param.u32 \t{_R}1, [__pilot_part];
\tsetp.eq.u32 \t%__pilot_p3, {_R}1, 0;
\t@%__pilot_p3 bra \t$__pilot_main;
\tld.param.u64 \t%__pilot_rt0, [__pilot_redo];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rt0, 0;
\t@%__pilot_p1 bra \t$__pilot_main;
\tcvta.to.global.u64 \t%__pilot_rt0, %__pilot_rt0;
\tld.volatile.global.u32 \t{_R}1, [%__pilot_rt0];
\tld.volatile.global.u32 \t{_R}2, [%__pilot_rt0+4];
\tsetp.ge.u32 \t%__pilot_p1, {_R}2, {_R}1;
\t@%__pilot_p1 bra \t$__pilot_main;
\tatom.global.add.u32 \t{_R}2, [%__pilot_rt0+4], 1;
\tsetp.ge.u32 \t%__pilot_p1, {_R}2, {_R}1;
\t@%__pilot_p1 bra \t$__pilot_main;
\tmul.wide.u32 \t%__pilot_rt1, {_R}2, {REDO_ENTRY};
\tadd.u64 \t%__pilot_rt1, %__pilot_rt0, %__pilot_rt1;
\tld.global.u32 \t{_R}4, [%__pilot_rt1+{REDO_HEADER}];
\tbra.uni \t$__pilot_count;
$__pilot_main:
\tatom.global.add.u32 \t{_R}4, [%__pilot_rd0], {_R}12;
$__pilot_count:
\t@%__pilot_p3 bra \t$__pilot_post;
\tld.param.u64 \t%__pilot_rt0, [__pilot_tally];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rt0, 0;
\t@%__pilot_p1 bra \t$__pilot_post;
\tld.param.u32 \t{_R}11, [__pilot_total];
\tsetp.ge.u32 \t%__pilot_p1, {_R}4, {_R}11;
\t@%__pilot_p1 bra \t$__pilot_post;
\tsub.u32 \t{_R}2, {_R}11, {_R}4;
\tmin.u32 \t{_R}2, {_R}2, {_R}12;
\tcvt.u64.u32 \t%__pilot_rt1, {_R}2;
\tcvta.to.global.u64 \t%__pilot_rt0, %__pilot_rt0;
\tred.global.add.u64 \t[%__pilot_rt0+8], %__pilot_rt1;
\tld.param.u32 \t{_R}1, [__pilot_part];
\tand.b32 \t{_R}1, {_R}1, 1;
\tmul.wide.u32 \t%__pilot_rt1, {_R}1, 4;
\tadd.u64 \t%__pilot_rt1, %__pilot_rd0, %__pilot_rt1;
\tatom.global.add.u32 \t{_R}2, [%__pilot_rt1+{RAN_AT}], {_R}2;
\tsetp.ne.u32 \t%__pilot_p1, {_R}2, 0;
\t@%__pilot_p1 bra \t$__pilot_post;
\tred.global.add.u64 \t[%__pilot_rt0], 1;
\tbra.uni \t$__pilot_post;
$__pilot_retreat:
\tld.param.u64 \t%__pilot_rt0, [__pilot_tally];
\tsetp.eq.u64 \t%__pilot_p2, %__pilot_rt0, 0;
\t@%__pilot_p2 bra \t$__pilot_post;
{STAMP}$__pilot_post:
\tst.shared.u32 \t[{_R}16], {_R}4;
$__pilot_read:
\tbar.sync \t0;
\tld.shared.u32 \t{_R}4, [{_R}16];
\tmov.u32 \t{_R}13, 0;
\tbra.uni \t$__pilot_map;
$__pilot_more:
"""
CHUNK_BARRIER = "\tbar.sync \t0;\n"  # between two blocks of a chunk, for kernels using shared memory
MAP = f"""$__pilot_map:
\tadd.u32 \t{_R}14, {_R}4, {_R}13;
\tld.param.u32 \t{_R}11, [__pilot_total];
\tsetp.ge.u32 \t%__pilot_p1, {_R}14, {_R}11;
\t@%__pilot_p1 bra.uni \t$__pilot_exit;
\tld.param.u32 \t{_R}8, [__pilot_gx];
\tld.param.u32 \t{_R}9, [__pilot_gy];
\tld.param.u32 \t{_R}10, [__pilot_gz];
\tmov.u32 \t{_R}5, {_R}14;
\tmov.u32 \t{_R}6, 0;
\tmov.u32 \t{_R}7, 0;
\tsetp.eq.u32 \t%__pilot_p1, {_R}8, {_R}11;
\t@%__pilot_p1 bra.uni \t$__pilot_body;
\trem.u32 \t{_R}5, {_R}14, {_R}8;
\tdiv.u32 \t{_R}17, {_R}14, {_R}8;
\trem.u32 \t{_R}6, {_R}17, {_R}9;
\tdiv.u32 \t{_R}7, {_R}17, {_R}9;
$__pilot_body:
"""

EPILOGUE = """$__pilot_next:
\tadd.u32 \t%__pilot_r13, %__pilot_r13, 1;
\tsetp.lt.u32 \t%__pilot_p1, %__pilot_r13, %__pilot_r12;
\t@%__pilot_p1 bra.uni \t$__pilot_more;
\tbra.uni \t$__pilot_claim;
$__pilot_exit:
\tret;
"""

# ---- loop-level retreats (the loop-level variant, LOOP_SUFFIX) ----


# A loop-level variant looks at the words every LOOP_CHECK_EVERY passes of a checked back edge
# (r18 counts them), and reads them without waiting: the value a check tests is the one read
# at the check before (r19: flag's, r20: sflag's), so the load's latency hides behind the
# loop's work; a raise is seen within 2 x LOOP_CHECK_EVERY passes.
LOOP_CHECK_EVERY = 16
# The named barrier of the UNIFORM checks' reduction: not 0, which the body's __syncthreads use
# (a kernel with other named barriers gets no loop-level variant).
LOOP_BARRIER = 1
LOOP_START = f"""\tmov.u32 \t{_R}18, 0;
\tmov.u32 \t{_R}19, 0;
\tmov.u32 \t{_R}20, 0;
\tmov.pred \t%__pilot_q0, 0;
"""


def _issue_read(skip: str) -> str:
    """r19, r20 := the retreat words (flag's, sflag's; volatile), 0 when the launch has no
    word (a rest), no second word, or no redo list (it then never abandons a block). The
    branches test parameters: the same in every thread."""
    return f"""\tmov.u32 \t{_R}19, 0;
\tmov.u32 \t{_R}20, 0;
\tld.param.u64 \t%__pilot_rd1, [__pilot_redo];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rd1, 0;
\t@%__pilot_p1 bra.uni \t{skip};
\tld.param.u64 \t%__pilot_rd1, [__pilot_flag];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rd1, 0;
\t@%__pilot_p1 bra.uni \t{skip};
\tcvta.to.global.u64 \t%__pilot_rd1, %__pilot_rd1;
\tld.volatile.global.u32 \t{_R}19, [%__pilot_rd1];
\tld.param.u64 \t%__pilot_rd1, [__pilot_sflag];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rd1, 0;
\t@%__pilot_p1 bra.uni \t{skip};
\tcvta.to.global.u64 \t%__pilot_rd1, %__pilot_rd1;
\tld.volatile.global.u32 \t{_R}20, [%__pilot_rd1];
"""


def _every(go: str, uniform: bool) -> str:
    """Count a pass; on to `go` but every LOOP_CHECK_EVERY-th."""
    return f"""\tadd.u32 \t{_R}18, {_R}18, 1;
\tand.b32 \t{_R}1, {_R}18, {LOOP_CHECK_EVERY - 1};
\tsetp.ne.u32 \t%__pilot_p1, {_R}1, 0;
\t@%__pilot_p1 bra{'.uni' if uniform else ''} \t{go};
\tor.b32 \t{_R}1, {_R}19, {_R}20;
"""


def uniform_check(n: int) -> str:
    """Before the back edge of a loop every thread of a block reaches together (UNIFORM): a
    barrier reduction of what the threads read (each reads the words, so no thread's path
    differs from another's: the warps stay converged, as the body's own barriers want) has all
    of them abandon the block together, so no barrier of the body can wait for a thread that
    left; then each reads the words again."""
    go = f"$__pilot_go{n}"
    return _every(go, True) + f"""\tsetp.ne.u32 \t%__pilot_p1, {_R}1, 0;
\tbar.red.or.pred \t%__pilot_p2, {LOOP_BARRIER}, %__pilot_p1;
\t@%__pilot_p2 bra.uni \t$__pilot_abandon;
""" + _issue_read(go) + f"{go}:\n"


def thread_check(n: int) -> str:
    """Before the back edge of an outer loop of a kernel whose body has no barrier, no warp
    collective and no call (PER_THREAD): a thread that read a raised word leaves its logical
    block at once, as a return would, and reads again otherwise; the barrier at the block's end
    (THREAD_NEXT) has every thread of the block abandon it if any did."""
    go = f"$__pilot_go{n}"
    return _every(go, False) + f"""\tsetp.ne.u32 \t%__pilot_q0, {_R}1, 0;
\t@%__pilot_q0 bra \t$__pilot_next;
""" + _issue_read(go) + f"{go}:\n"


THREAD_NEXT = """$__pilot_next:
\tbarrier.red.or.pred \t%__pilot_p1, 0, %__pilot_q0;
\t@%__pilot_p1 bra.uni \t$__pilot_abandon;
"""

# Every thread of a block that abandons its logical block comes here together. Thread 0 puts the
# block on the slot's redo list for the launch's rest (an entry of its claim's blocks from this
# one on: one, as loop-level launches claim one block at a time, and the rest runs an entry's
# first block only), counts it in the tally and stamps the retreat's readings as a claim's
# retreat does; then the block leaves. The list holds one entry per block of the launch at
# most: a block abandons once, and leaves.
ABANDON = f"""$__pilot_abandon:
{NOT_THREAD0}\tsetp.ne.u32 \t%__pilot_p0, {_R}0, 0;
\t@%__pilot_p0 bra \t$__pilot_exit;
\tld.param.u64 \t%__pilot_rt0, [__pilot_redo];
\tcvta.to.global.u64 \t%__pilot_rt0, %__pilot_rt0;
\tatom.global.add.u32 \t{_R}1, [%__pilot_rt0], 1;
\tmul.wide.u32 \t%__pilot_rt1, {_R}1, {REDO_ENTRY};
\tadd.u64 \t%__pilot_rt1, %__pilot_rt0, %__pilot_rt1;
\tadd.u32 \t{_R}14, {_R}4, {_R}13;
\tadd.u32 \t{_R}2, {_R}4, {_R}12;
\tld.param.u32 \t{_R}11, [__pilot_total];
\tmin.u32 \t{_R}2, {_R}2, {_R}11;
\tsub.u32 \t{_R}2, {_R}2, {_R}14;
\tst.global.u32 \t[%__pilot_rt1+{REDO_HEADER}], {_R}14;
\tst.global.u32 \t[%__pilot_rt1+{REDO_HEADER + 4}], {_R}2;
\tld.param.u64 \t%__pilot_rt0, [__pilot_tally];
\tsetp.eq.u64 \t%__pilot_p1, %__pilot_rt0, 0;
\t@%__pilot_p1 bra \t$__pilot_exit;
\tcvta.to.global.u64 \t%__pilot_rt0, %__pilot_rt0;
\tcvt.u64.u32 \t%__pilot_rt2, {_R}2;
\tred.global.add.u64 \t[%__pilot_rt0+{ABANDONED_AT}], %__pilot_rt2;
{STAMP}\tbra.uni \t$__pilot_exit;
"""

UNIFORM, PER_THREAD = "uniform", "per-thread"
_SIMPLE_BARRIER = re.compile(r"^\s*(?:bar|barrier)(?:\.cta)?\.sync(?:\.aligned)?\s+0\s*;")
_WARP_COLLECTIVE = re.compile(r"\b(?:shfl|vote|match|redux|wmma|mma|ldmatrix|stmatrix|elect|wgmma|"
                              r"tcgen05|activemask)\b|\bbar\.warp\b|\bbarrier\.warp\b")


@dataclass(frozen=True)
class LoopPlan:
    """Where a kernel's loop-level variant checks the words: before the back edges at these
    lines of its body, in one of two modes (UNIFORM, PER_THREAD); or why it has none."""

    mode: str = ""
    back_edges: tuple[int, ...] = ()
    reason: str = ""


def loop_plan(body: list[str]) -> LoopPlan:
    """The outer loops of a kernel's body (its lines after the opening brace, comments removed)
    whose back edge may abandon the logical block:
    - UNIFORM: the back edge's branch is block-uniform and no per-thread branch or return
      crosses the loop's bounds (one either stays inside the loop's body or outside the loop):
      every thread of the block reaches the back edge as often as the others, so a barrier
      there cannot wait for a thread that is elsewhere;
    - PER_THREAD, for kernels whose body has no barrier, no warp collective and no call: each
      thread may leave on its own (any loop, per-thread trip counts included).
    A kernel with named or counted barriers, or barriers under a guard, gets neither."""
    labels = {m.group(1): j for j, line in enumerate(body) if (m := _LABEL.match(line))}
    end = len(body)
    jumps: list[tuple[int, int, str | None]] = []  # (line, target line, guard)
    for j, line in enumerate(body):
        if (m := _BRANCH.match(line)) is not None and m.group(1) in labels:
            jumps.append((j, labels[m.group(1)], _guard(line)))
        elif _RETURN.match(line):
            jumps.append((j, end, _guard(line)))
    loops = [(t, j, g) for j, t, g in jumps if t <= j]
    if not loops:
        return LoopPlan(reason="no loop")
    barriers = [line for line in body if _BARRIER.match(line)]
    if any(not _SIMPLE_BARRIER.match(line) for line in barriers):
        return LoopPlan(reason="named, counted or guarded barriers")
    varying = _varying_registers(body)
    crossing = [(min(j, t), max(j, t)) for j, t, g in jumps if g is not None and g in varying]

    def uniform(h: int, b: int, guard: str | None) -> bool:
        return (guard is None or guard not in varying) and all(
            (h < lo and hi < b) or hi < h or lo > b for lo, hi in crossing)

    chosen = [(h, b) for h, b, g in loops if uniform(h, b, g)]
    if chosen:
        return LoopPlan(UNIFORM, _outermost(chosen))
    code = "\n".join(body)
    if barriers or _WARP_COLLECTIVE.search(code) or _CALL.search(code):
        return LoopPlan(reason="no loop whose back edge every thread of a block reaches together, "
                               "and the kernel synchronizes its threads")
    return LoopPlan(PER_THREAD, _outermost([(h, b) for h, b, _g in loops]))


def _outermost(loops: list[tuple[int, int]]) -> tuple[int, ...]:
    """The back edges of the loops no other of `loops` contains."""
    return tuple(sorted({b for h, b in loops
                         if not any(h2 <= h and b <= b2 and (h2, b2) != (h, b) for h2, b2 in loops)}))


# Whether an entry (or a device function it may call) touches shared memory.
_SHARED = re.compile(r"\.shared\b|\bshared::|\b(?:ldmatrix|stmatrix|mbarrier|wgmma|tcgen05)\b")


@dataclass(frozen=True)
class Rewrite:
    """What became of one kernel: its preemptible entry's name, or why it has none."""

    kernel: str
    variant: str | None
    reason: str = ""
    loop: str | None = None  # the loop-level variant's name (rewrite_module(loops=True))
    loop_mode: str = ""  # UNIFORM or PER_THREAD
    loop_reason: str = ""  # why it has none


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


def variant_params(grid: tuple[int, int, int], ctl: int, flag: int = 0, chunk: int = 1,
                   first: int = 0, tally: int = 0, sflag: int = 0, redo: int = 0,
                   part: int = 0) -> bytes:
    """The parameters a variant takes after its kernel's own (PARAMS), packed as a launch passes
    them: `ctl` the slot's device address, `flag` the retreat word's (0: never retreats: the
    last part of a launch), `tally` the tally's (0: none), `sflag` a second word's (0: none;
    read only with `flag`), `redo` the slot's redo list's (a loop-level variant's; 0: none, and
    a loop-level variant then never retreats inside a block), `part` which part of the launch
    this is (0 the first; a later one claims only, so its `first` is 0)."""
    if sflag and not flag:
        raise ValueError("sflag is read only with flag (a launch without flag is a rest)")
    if part and first:
        raise ValueError("a part after the first claims only (first 0)")
    gx, gy, gz = grid
    return struct.pack(PACKING, ctl, flag, gx * gy * gz, gx, gy, gz, chunk, first, tally, sflag, redo,
                       part)


def variant_args(args: bytes, params: bytes) -> bytes:
    """A launch's argument buffer for the variant: K's arguments, padding to 8 bytes, `params`."""
    return bytes(args) + bytes(-len(args) % 8) + params


def claimed(counter: int, total: int, retreat: bool, first: int = 0, chunk: int = 1,
            claims: int | None = None) -> tuple[range, range, int]:
    """What one launch of a variant runs, as the claim loop does (the sim's emulation of it):
    the implicit first wave `range(first)`, then claims of `chunk` blocks from `counter` on: all
    of them, or with the retreat word set `claims` of them (0: the retreat was there first).
    Returns (first wave, claimed blocks, the counter after)."""
    wave = range(min(first, total))
    step = max(chunk, 1)
    if retreat:
        claims = claims or 0
    end = total if claims is None else min(total, counter + step * claims)
    end = max(end, counter)
    return wave, range(counter, end), end


def spread_bucket(ns: int) -> int:
    """The tally's bucket of a retreat that took `ns` from its first block's sighting to its
    last (bfind + 1 of the microseconds, as the variant computes it)."""
    return min(SPREAD_BUCKETS - 1, min(ns >> 10, 1 << 30).bit_length())


def bucket_bound_s(bucket: int) -> float:
    """The upper bound of a spread bucket, in seconds (the last one's is infinite)."""
    return math.inf if bucket >= SPREAD_BUCKETS - 1 else (1 << bucket) * 1.024e-6


@dataclass(frozen=True)
class Tally:
    """A session's tally as the GPU left it (TALLY_BYTES, little-endian)."""

    preempted: int = 0  # preemptions: parts that retreated with blocks left, which a later part ran
    deferred: int = 0  # logical blocks run by the later parts that resumed them
    retreats: int = 0  # parts whose blocks saw the word raised (deferring blocks or not)
    spread: tuple[int, ...] = (0,) * SPREAD_BUCKETS  # retreats per spread bucket
    abandoned: int = 0  # logical blocks loop-level retreats left to run again from their start

    @classmethod
    def parse(cls, raw: bytes) -> Tally:
        preempted, deferred, retreats = struct.unpack_from("<QQQ", raw)
        return cls(preempted, deferred, retreats, struct.unpack_from(f"<{SPREAD_BUCKETS}I", raw, 24),
                   struct.unpack_from("<Q", raw, ABANDONED_AT)[0])


def stamp_retreat(slot: bytearray | memoryview, now_ns: int, part: int = 0) -> None:
    """A block of part `part` saw the word raised (the variant's `$__pilot_retreat`): its
    parity's first reading if it has none, and its last."""
    at = PAIR_AT + 16 * (part & 1)
    first, last = struct.unpack_from("<QQ", slot, at)
    struct.pack_into("<QQ", slot, at, first or now_ns, max(last, now_ns))


def start_part(slot: bytearray | memoryview, tally: bytearray | memoryview, part: int) -> None:
    """Block 0 of part `part` starts (ACCOUNT, or the first wave's block 0): the count of the
    next part's parity to 0; after the first part, the retreat of the part before (if any) into
    the tally, its readings zeroed."""
    struct.pack_into("<I", slot, RAN_AT + 4 * ((part + 1) & 1), 0)
    if not part:
        return
    at = PAIR_AT + 16 * ((part + 1) & 1)
    first, last = struct.unpack_from("<QQ", slot, at)
    if not last:
        return
    retreats = struct.unpack_from("<Q", tally, 16)[0]
    struct.pack_into("<Q", tally, 16, retreats + 1)
    bucket = 24 + 4 * spread_bucket(last - first)
    struct.pack_into("<I", tally, bucket, (struct.unpack_from("<I", tally, bucket)[0] + 1) & 0xFFFFFFFF)
    struct.pack_into("<QQ", slot, at, 0, 0)


def count_resumed(slot: bytearray | memoryview, tally: bytearray | memoryview, part: int,
                  blocks: int) -> None:
    """Part `part` (> 0) ran `blocks` blocks by claims: each claim's blocks into its parity's
    count and the tally's blocks deferred; the first that found the count 0 a preemption."""
    if not blocks:
        return
    at = RAN_AT + 4 * (part & 1)
    ran = struct.unpack_from("<I", slot, at)[0]
    struct.pack_into("<I", slot, at, (ran + blocks) & 0xFFFFFFFF)
    preempted, deferred = struct.unpack_from("<QQ", tally)
    struct.pack_into("<QQ", tally, 0, preempted + (ran == 0), deferred + blocks)


def abandon(redo: bytearray | memoryview, tally: bytearray | memoryview | None, first: int,
            count: int) -> None:
    """A block abandoned logical blocks first .. first + count - 1 (the variant's
    `$__pilot_abandon`): an entry on the slot's redo list, counted in the tally (if any)."""
    made = struct.unpack_from("<I", redo)[0]
    struct.pack_into("<II", redo, REDO_HEADER + REDO_ENTRY * made, first, count)
    struct.pack_into("<I", redo, 0, made + 1)
    if tally is not None:
        at = ABANDONED_AT
        struct.pack_into("<Q", tally, at, struct.unpack_from("<Q", tally, at)[0] + count)


def take_redo(redo: bytearray | memoryview) -> list[range]:
    """What a rest runs first: the entries of the slot's redo list not taken yet (all taken now)."""
    made, taken = struct.unpack_from("<II", redo)
    out = [range(f, f + n) for f, n in (struct.unpack_from("<II", redo, REDO_HEADER + REDO_ENTRY * i)
                                        for i in range(taken, made))]
    struct.pack_into("<I", redo, 4, max(made, taken))
    return out


def redo_bytes(blocks: int) -> int:
    """A slot's redo list for a launch of `blocks` persistent blocks (each abandons once)."""
    return REDO_HEADER + REDO_ENTRY * blocks


# Module-scope declarations: `.global` / `.const` variables (`__device__`, `__constant__`,
# `__managed__`, texture references) and `.shared` ones. nvcc's printf strings (`$str`) are
# read-only. Parsed without backtracking (the PTX is a tenant's).
_DECLARATION = re.compile(r"\s*(?:\.(?:visible|weak|extern)\s+)*\.(global|const|shared)\b")
_IDENTIFIER = re.compile(r"[A-Za-z_$%][\w$]*")
# `.attribute(.managed)` (a `__managed__` variable; also `.unified(...)`): not a parameter list
_ATTRIBUTE = re.compile(r"\.attribute\s*\([^()]*\)")


def _declared(line: str, spaces: tuple[str, ...]) -> str | None:
    """The variable a module-scope declaration line of one of `spaces` declares, or None."""
    m = _DECLARATION.match(line)
    if m is None or m.group(1) not in spaces:
        return None
    if "(" in line:
        line = _ATTRIBUTE.sub(" ", line)
        if "(" in line:
            return None  # not a variable (a function's .param lists have parentheses)
    head = line.split("=", 1)[0].split(";", 1)[0].split("[", 1)[0]
    names = _IDENTIFIER.findall(head)
    return names[-1] if names else None


def _module_variables(lines: list[str]) -> set[str]:
    names = {_declared(_code(line), ("global", "const")) for line in lines}
    return {n for n in names if n is not None and not n.startswith("$str")}


def _touches(code: str, names: AbstractSet[str]) -> bool:
    """Whether `code` names any of `names` (one pass over its identifiers)."""
    return bool(names) and not names.isdisjoint(_IDENTIFIER.findall(code))


MAX_PTX_BYTES = 32 << 20  # a module's PTX past this is not rewritten
MAX_LINE_BYTES = 1 << 16  # nor one with a line past this


def rewrite_module(ptx: str, loops: bool = False) -> Rewritten:
    """Every entry of the module gets its preemptible variant where it can (module docstring);
    with `loops`, also its loop-level variant where it has a loop that can take the check
    (loop_plan)."""
    lines = ptx.splitlines()
    out: list[str] = []
    kernels: dict[str, Rewrite] = {}
    if len(ptx) > MAX_PTX_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
        reason = "the module's PTX is too large for the rewrite"
        names = [m.group(2) for line in lines if len(line) <= MAX_LINE_BYTES and (m := _ENTRY.match(line))]
        return Rewritten(ptx, {n: Rewrite(n, None, reason) for n in names})
    exits_in_functions = _functions_exit(lines)
    shared = _SharedUse.of(lines)
    variables = _module_variables(lines)
    functions_touch = bool(variables) and _touches(_code("\n".join(
        line for line in lines if _declared(_code(line), ("global", "const")) is None)), variables)
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
        reason = _refusal(entry, exits_in_functions) or _state_refusal(entry, variables, functions_touch)
        if reason:
            kernels[name] = Rewrite(name, None, reason)
        else:
            out.append("")
            out.extend(_variant(entry, name, shared))
            kernels[name] = Rewrite(name, name + SUFFIX)
            if loops:
                plan = loop_plan([_code(line) for line in entry[_body_start(entry):-1]])
                if plan.mode:
                    out.append("")
                    out.extend(_variant(entry, name, shared, plan))
                    kernels[name] = Rewrite(name, name + SUFFIX, "", name + LOOP_SUFFIX, plan.mode)
                else:
                    kernels[name] = Rewrite(name, name + SUFFIX, "", None, "", plan.reason)
        i = end + 1
    return Rewritten("\n".join(out) + "\n", kernels)


def _state_refusal(entry: list[str], variables: set[str], module_touches: bool) -> str:
    """Why an entry that uses module variables has no variant: the variants are loaded as a
    module of their own, with its own copy of every variable, which the program never set."""
    code = _code("\n".join(entry))
    if _touches(code, variables) or (module_touches and _CALL.search(code)):
        return ("uses module variables (__device__, __constant__, __managed__): the variants' module "
                "has its own copy")
    return ""


def _code(line: str) -> str:
    """`line` without its comments (`//` to the end, `/* */`; an unclosed `/*` runs to the end),
    in one pass: the PTX is a tenant's, and a regex could be made to backtrack."""
    if "/" not in line:
        return line
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        j = line.find("/", i)
        if j < 0 or j + 1 >= n:
            out.append(line[i:])
            break
        out.append(line[i:j])
        if line[j + 1] == "/":
            k = line.find("\n", j)
            i = n if k < 0 else k
            out.append(" ")
        elif line[j + 1] == "*":
            k = line.find("*/", j + 2)
            out.append(" " + "\n" * line.count("\n", j, n if k < 0 else k))
            i = n if k < 0 else k + 2
        else:
            out.append("/")
            i = j + 1
    return "".join(out)


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
    if "__pilot" in text:  # a body naming the rewrite's parameters, registers or labels
        return "uses identifiers reserved for the rewrite (__pilot...)"
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
    # A worklist, linear in the body's size (the PTX is a tenant's): a definition is varying by
    # itself or once one of its sources is; its destinations then are, and so on.
    users: dict[str, list[int]] = {}
    work = []
    for i, (_dests, sources, varying) in enumerate(defs):
        for r in sources:
            users.setdefault(r, []).append(i)
        if varying:
            work.append(i)
    out: set[str] = set()
    done: set[int] = set()
    while work:
        i = work.pop()
        if i in done:
            continue
        done.add(i)
        for d in defs[i][0]:
            if d not in out:
                out.add(d)
                work.extend(users.get(d, ()))
    return out


def _guard(line: str) -> str | None:
    """The predicate register guarding an instruction, or None."""
    m = re.match(r"\s*@!?(%[\w$]+)", line)
    return m.group(1) if m else None


@dataclass(frozen=True)
class _SharedUse:
    """A module's shared memory, found once: its shared variables' names, and whether any of
    its code touches shared memory (for entries that call its functions)."""

    names: frozenset[str]
    anywhere: bool

    @classmethod
    def of(cls, lines: list[str]) -> _SharedUse:
        code = [_code(line) for line in lines]
        names = frozenset(n for line in code if (n := _declared(line, ("shared",))) is not None)
        return cls(names, any(_SHARED.search(line) for line in code))

    def by(self, text: str) -> bool:
        """Whether an entry touches shared memory: in its body, through a shared variable it
        names, or in a device function it may call (any of the module's, when it calls). Its
        logical blocks then need a barrier between two."""
        code = _code(text)
        return bool(_SHARED.search(code)) or _touches(code, self.names) or \
            (self.anywhere and bool(_CALL.search(code)))


def _variant(entry: list[str], name: str, shared: _SharedUse, plan: LoopPlan | None = None) -> list[str]:
    """The preemptible copy of an entry (module docstring); with `plan`, its loop-level one."""
    text = "\n".join(entry)
    header_end = _body_start(entry)
    header = "\n".join(entry[:header_end])
    suffix = SUFFIX if plan is None else LOOP_SUFFIX
    header = _ENTRY.sub(lambda m: m.group(1) + name + suffix + m.group(3), header, count=1)
    close = header.rfind(")")
    params = header[header.find("(") + 1:close]
    ours = ",\n".join(f"\t.param .{kind} __pilot_{param}" for param, kind, _ in PARAMS)
    extra = (",\n" if params.strip() else "\n") + ours + "\n"
    header = header[:close].rstrip() + extra + header[close:]
    body = entry[header_end:-1]
    decls = 0
    while decls < len(body) and (not _code(body[decls]).strip()
                                 or _code(body[decls]).strip().startswith((".reg", ".shared", ".local"))):
        decls += 1
    mapped = [_map_line(line) for line in body]
    barrier = CHUNK_BARRIER if shared.by(text) else ""
    start, epilogue = "", EPILOGUE
    if plan is not None:
        check = uniform_check if plan.mode == UNIFORM else thread_check
        for n, b in enumerate(plan.back_edges):
            mapped[b] = check(n) + mapped[b]
        start = LOOP_START
        if plan.mode == PER_THREAD:
            epilogue = THREAD_NEXT + EPILOGUE.removeprefix("$__pilot_next:\n")
        epilogue = epilogue.replace("$__pilot_exit:", ABANDON + "$__pilot_exit:")
    return [header, *mapped[:decls], DECLARATIONS + start + PROLOGUE + ACCOUNT + CLAIM + barrier
            + MAP.rstrip("\n"), *mapped[decls:], epilogue.rstrip("\n"), entry[-1]]


def _map_line(line: str) -> str:
    """%ctaid / %nctaid reads to the logical registers; ret and exit back to the claim."""
    if "ctaid" in line:
        line = _CTAID.sub(lambda m: _MAP[(m.group(1), m.group(2))], line)
    ret = _RETURN.match(line)
    if ret:
        line = f"{ret.group(1)}{ret.group(2) or ''}bra \t$__pilot_next;" + line[ret.end():]
    return line
