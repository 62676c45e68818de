"""The sim's emulation of a preemptible variant (ptx_preempt.py) launched as pilotd launches it:
the first wave without a claim, claims from the counter, a retreat word that stops the claims,
and a resume that runs only the rest, every logical block exactly once."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.base import CUDA_ERROR_NOT_SUPPORTED, BackendError
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimLaunch, blockwise

PTX = pp.rewrite_module(
    ".version 9.0\n.target sm_90\n.address_size 64\n"
    + "".join(f".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\tret;\n}}\n"
              for name in ("bump", "whole"))).ptx
GRID, BLOCK = (5, 3, 2), (4, 1, 1)
THREADS = 4
BLOCKS = 30
ONE, ZERO = struct.pack("<I", 1), struct.pack("<I", 0)


def bump(k: SimLaunch) -> None:
    """out[block * threads + t] += 1 for each thread of each logical block run (a block run
    twice would show as 2)."""
    out = np.frombuffer(k.view(k.ptr(0), 4 * BLOCKS * THREADS), dtype=np.int32)
    gx, gy, _ = k.grid
    for index in k.logical_blocks():
        x, y, z = k.ctaid(index)
        linear = (z * gy + y) * gx + x
        assert linear == index  # the logical index is the hardware's block order
        out[linear * THREADS:(linear + 1) * THREADS] += 1


def whole(k: SimLaunch) -> None:
    out = np.frombuffer(k.view(k.ptr(0), 4), dtype=np.int32)
    out[0] += 1


class Rig:
    def __init__(self) -> None:
        registry = KernelRegistry()
        registry.register("bump", blockwise(bump))
        registry.register("whole", whole)
        self.be = be = SimBackend(registry)
        be.bind_thread(0)
        module = be.module_load(PTX.encode())
        self.bump = be.function_get(module, "bump" + pp.SUFFIX)
        self.whole = be.function_get(module, "whole" + pp.SUFFIX)
        self.out = be.mem_alloc(4 * BLOCKS * THREADS)
        self.ctl = be.mem_alloc(pp.SLOT_BYTES)
        self.tally = be.mem_alloc(pp.TALLY_BYTES)
        be.memcpy_htod(self.ctl, bytes(pp.SLOT_BYTES), pp.SLOT_BYTES, None)
        be.memcpy_htod(self.tally, bytes(pp.TALLY_BYTES), pp.TALLY_BYTES, None)
        self.flag = be.mem_alloc(4)
        be.memcpy_htod(self.out, bytes(4 * BLOCKS * THREADS), 4 * BLOCKS * THREADS, None)
        self.stream = be.stream_create(1, 0)

    def start(self, first: int) -> None:
        """What pilotd queues before a variant's first launch: the counter at `first`."""
        self.be.memcpy_htod(self.ctl, struct.pack("<I", first), 4, self.stream)

    def retreat(self, word: bytes) -> None:
        self.be.memcpy_htod(self.flag, word, 4, self.stream)

    def launch(self, fn: Any, launched: int, first: int, chunk: int = 1, flag: bool = True,
               tally: bool = False, part: int = 0) -> None:
        args = pp.variant_args(struct.pack("<Q", self.out),
                               pp.variant_params(GRID, self.ctl, self.flag if flag else 0, chunk, first,
                                                 self.tally if tally else 0, part=part))
        self.be.launch(fn.handle, (launched, 1, 1), BLOCK, 0, self.stream, args)

    def read(self, ptr: int, n: int) -> bytes:
        buf = bytearray(n)
        self.be.memcpy_dtoh(buf, ptr, n, None)
        return bytes(buf)

    def counts(self) -> list[int]:
        data = self.read(self.out, 4 * BLOCKS * THREADS)
        return [struct.unpack_from("<i", data, 4 * THREADS * b)[0] for b in range(BLOCKS)]

    def claimed(self) -> int:
        return struct.unpack("<I", self.read(self.ctl, 4))[0]


@pytest.fixture
def rig() -> Rig:
    return Rig()


def test_the_first_wave_then_claims_then_only_the_rest(rig: Rig) -> None:
    rig.start(first=4)
    rig.retreat(ONE)
    rig.be.claims_before_retreat = 3  # a retreat that came after three claims of chunk 2
    rig.launch(rig.bump, launched=4, first=4, chunk=2)
    assert rig.claimed() == 10 and rig.counts() == [1] * 10 + [0] * 20
    rig.be.claims_before_retreat = 0
    rig.launch(rig.bump, launched=4, first=0, chunk=2)  # still raised: claims nothing
    assert rig.claimed() == 10 and rig.counts() == [1] * 10 + [0] * 20
    rig.retreat(ZERO)
    rig.launch(rig.bump, launched=4, first=0, chunk=2)  # resumed to the end
    assert rig.claimed() == BLOCKS and rig.counts() == [1] * BLOCKS
    rig.launch(rig.bump, launched=4, first=0)  # nothing left
    assert rig.counts() == [1] * BLOCKS


def test_a_launch_that_never_retreats_runs_everything(rig: Rig) -> None:
    rig.start(first=8)
    rig.retreat(ONE)  # not read: the launch's flag is 0
    rig.launch(rig.bump, launched=8, first=8, flag=False)
    assert rig.claimed() == BLOCKS and rig.counts() == [1] * BLOCKS


def test_a_retreat_before_the_launch_runs_only_the_first_wave(rig: Rig) -> None:
    rig.start(first=6)
    rig.retreat(ONE)
    rig.launch(rig.bump, launched=6, first=6)
    assert rig.claimed() == 6 and rig.counts() == [1] * 6 + [0] * 24


def test_an_emulation_of_whole_grids_runs_whole_or_not_at_all(rig: Rig) -> None:
    rig.start(first=2)
    rig.retreat(ONE)  # seen too late by an emulation that cannot run part of a grid
    rig.launch(rig.whole, launched=2, first=2)
    assert rig.claimed() == BLOCKS and struct.unpack("<i", rig.read(rig.out, 4))[0] == 1
    rig.launch(rig.whole, launched=2, first=0)  # the rest: nothing
    assert struct.unpack("<i", rig.read(rig.out, 4))[0] == 1
    rig.start(first=0)
    rig.be.memcpy_htod(rig.ctl, struct.pack("<I", 3), 4, rig.stream)  # part of it done: refused
    with pytest.raises(BackendError) as err:
        rig.launch(rig.whole, launched=2, first=0)
    assert err.value.code == CUDA_ERROR_NOT_SUPPORTED


def test_the_tally_counts_each_preemption_and_the_blocks_later_parts_ran(rig: Rig) -> None:
    def tally() -> pp.Tally:
        return pp.Tally.parse(rig.read(rig.tally, pp.TALLY_BYTES))

    # not preempted: the later part finds nothing to run and nothing to tally
    rig.start(first=8)
    rig.launch(rig.bump, launched=8, first=8, tally=True)
    rig.launch(rig.bump, launched=8, first=0, flag=False, tally=True, part=1)
    assert tally() == pp.Tally() and rig.counts() == [1] * BLOCKS
    rig.be.memcpy_htod(rig.out, bytes(4 * BLOCKS * THREADS), 4 * BLOCKS * THREADS, None)
    # preempted after two claims (8 + 2 ran), resumed and preempted again after five (15
    # ran), the last part runs the 15 left
    rig.start(first=8)
    rig.retreat(ONE)
    rig.be.claims_before_retreat = 2
    rig.launch(rig.bump, launched=8, first=8, tally=True)
    slot = rig.read(rig.ctl, pp.SLOT_BYTES)
    first_ns, last_ns = struct.unpack_from("<QQ", slot, pp.PAIR_AT)
    assert 0 < first_ns <= last_ns and tally() == pp.Tally()  # stamped, not yet accounted
    rig.be.claims_before_retreat = 5
    rig.launch(rig.bump, launched=8, first=0, tally=True, part=1)
    got = tally()
    assert (got.preempted, got.deferred, got.retreats) == (1, 5, 1) and rig.claimed() == 15
    assert struct.unpack_from("<QQ", rig.read(rig.ctl, pp.SLOT_BYTES), pp.PAIR_AT) == (0, 0)
    assert struct.unpack_from("<Q", rig.read(rig.ctl, pp.SLOT_BYTES), pp.PAIR_AT + 24)[0] > 0
    rig.retreat(ZERO)
    rig.launch(rig.bump, launched=8, first=0, flag=False, tally=True, part=2)
    got = tally()
    assert (got.preempted, got.deferred, got.retreats) == (2, BLOCKS - 10, 2) and sum(got.spread) == 2
    assert rig.counts() == [1] * BLOCKS
    assert struct.unpack_from("<QQQQ", rig.read(rig.ctl, pp.SLOT_BYTES), pp.PAIR_AT) == (0,) * 4
    # a retreat with nothing left to claim is counted as a retreat, not as a preemption
    rig.start(first=8)
    rig.be.claims_before_retreat = 0
    rig.launch(rig.bump, launched=8, first=8, tally=True)  # the word down: ran it all
    rig.retreat(ONE)
    rig.launch(rig.bump, launched=8, first=0, tally=True, part=1)  # saw the word: stamps
    rig.retreat(ZERO)
    rig.launch(rig.bump, launched=8, first=0, flag=False, tally=True, part=2)
    got = tally()
    assert (got.preempted, got.deferred, got.retreats) == (2, BLOCKS - 10, 3) and sum(got.spread) == 3
    # a first part with no first wave (a launch preempted before it starts) zeroes the count its
    # part 1 uses too: the slot's last launch left it at 20
    rig.start(first=0)
    rig.retreat(ONE)
    rig.launch(rig.bump, launched=8, first=0, tally=True)
    rig.retreat(ZERO)
    rig.launch(rig.bump, launched=8, first=0, flag=False, tally=True, part=1)
    got = tally()
    assert (got.preempted, got.deferred, got.retreats) == (3, 2 * BLOCKS - 10, 4)
    assert rig.counts() == [3] * BLOCKS  # (the launch before ran every block too)


# ---- loop-level variants (LOOP_SUFFIX): blocks abandoned inside, run again by the rest ----

LOOP_BODY = """\t.reg .b32 \t%r<3>;
\t.reg .pred \t%p<2>;
\tmov.u32 \t%r1, 0;
$L__loop:
\tadd.u32 \t%r1, %r1, 1;
\tsetp.lt.u32 \t%p1, %r1, 4;
\t@%p1 bra \t$L__loop;
\tret;
"""
LOOP_PTX = pp.rewrite_module(
    ".version 9.0\n.target sm_90\n.address_size 64\n"
    + "".join(f".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n{LOOP_BODY}}}\n"
              for name in ("bump", "mark")), loops=True).ptx


def mark(k: SimLaunch) -> None:
    """out[block * threads + t] = 1 for each logical block run: idempotent."""
    out = np.frombuffer(k.view(k.ptr(0), 4 * BLOCKS * THREADS), dtype=np.int32)
    for index in k.logical_blocks():
        out[index * THREADS:(index + 1) * THREADS] = 1


class LoopRig(Rig):
    def __init__(self) -> None:
        super().__init__()
        self.be._kernels.register("mark", blockwise(mark))
        module = self.be.module_load(LOOP_PTX.encode())
        self.bump = self.be.function_get(module, "bump" + pp.LOOP_SUFFIX)
        self.mark = self.be.function_get(module, "mark" + pp.LOOP_SUFFIX)
        self.redo = self.be.mem_alloc(pp.redo_bytes(8))
        self.be.memcpy_htod(self.redo, bytes(pp.redo_bytes(8)), pp.redo_bytes(8), None)

    def launch(self, fn: Any, launched: int, first: int, chunk: int = 1, flag: bool = True,
               tally: bool = False, part: int = 0) -> None:
        args = pp.variant_args(struct.pack("<Q", self.out),
                               pp.variant_params(GRID, self.ctl, self.flag if flag else 0, chunk, first,
                                                 self.tally if tally else 0, 0, self.redo, part))
        self.be.launch(fn.handle, (launched, 1, 1), BLOCK, 0, self.stream, args)


@pytest.mark.parametrize(("kernel", "expect"), [
    ("mark", [1] * BLOCKS),  # idempotent: the same as a run never preempted
    ("bump", [1] * 7 + [2] * 3 + [1] * 20),  # not idempotent: the abandoned blocks ran twice
])
def test_blocks_abandoned_inside_run_again_from_their_start_in_the_rest(kernel: str,
                                                                         expect: list[int]) -> None:
    rig = LoopRig()
    fn = getattr(rig, kernel)
    rig.start(first=8)
    rig.retreat(ONE)
    rig.be.claims_before_retreat = 2  # the first wave (0..7) and two claims (8, 9) ran ...
    rig.be.abandons_on_retreat = 3  # ... and the blocks running 7, 8 and 9 left them inside
    rig.launch(fn, launched=8, first=8, tally=True)
    made, taken = struct.unpack("<II", rig.read(rig.redo, 8))
    entries = [struct.unpack_from("<II", rig.read(rig.redo, pp.redo_bytes(8)), pp.REDO_HEADER + 8 * i)
               for i in range(made)]
    assert (made, taken) == (3, 0) and entries == [(7, 1), (8, 1), (9, 1)]
    tally = pp.Tally.parse(rig.read(rig.tally, pp.TALLY_BYTES))
    assert tally.abandoned == 3 and tally.preempted == 0  # the rest accounts the preemption
    rig.retreat(ZERO)
    rig.be.claims_before_retreat = rig.be.abandons_on_retreat = 0
    rig.launch(fn, launched=8, first=0, flag=False, tally=True, part=1)  # the redo list, then the counter
    assert rig.counts() == expect and rig.claimed() == BLOCKS
    assert struct.unpack("<II", rig.read(rig.redo, 8)) == (3, 3)  # every entry taken
    tally = pp.Tally.parse(rig.read(rig.tally, pp.TALLY_BYTES))
    assert (tally.preempted, tally.deferred, tally.retreats, tally.abandoned) == (1, 3 + 20, 1, 3)


def test_a_loop_level_variant_without_a_redo_list_abandons_nothing() -> None:
    rig = LoopRig()
    rig.redo = 0  # pilotd passes none: the variant then retreats only between claims
    rig.start(first=8)
    rig.retreat(ONE)
    rig.be.abandons_on_retreat = 3
    rig.launch(rig.bump, launched=8, first=8)
    rig.retreat(ZERO)
    rig.launch(rig.bump, launched=8, first=0, flag=False, part=1)
    assert rig.counts() == [1] * BLOCKS
