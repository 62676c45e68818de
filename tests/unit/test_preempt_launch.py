"""pilotd launching preemptible variants (scheduling/preempt.py) on the sim, end to end: a low
tenant's kernel, launched while a high tenant is active, runs its first wave, retreats while the
high tenant's work holds the GPU, and runs only the rest once the retreat word comes down;
every logical block runs once and the stream's later work waits for the rest. Plus the C side of
the retreat words (daemon/native/preempt_words.c): raise once, clear only what no later launch
relies on."""

from __future__ import annotations

import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_priority import Harness, Msg, Slot, _until

from pilot.daemon.backends import fatbin
from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.ops import execution
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.scheduling import preempt
from pilot.daemon.scheduling import preempt_choice as pc
from pilot.daemon.scheduling.preempt import CHAOS_PARTS, Preemption, VGpuPreemption, module_ptx
from pilot.daemon.sim_kernels import SimLaunch, blockwise

# The program's module as the shim would send it: plain PTX, no variants.
PTX = (".version 9.0\n.target sm_90\n.address_size 64\n"
       ".visible .entry bump(\n\t.param .u64 bump_param_0\n)\n{\n\tret;\n}\n"
       ".visible .global .align 4 .u32 counter;\n"
       ".visible .entry uses_state(\n\t.param .u64 p_0\n)\n{\n\t.reg .b32 %r<2>;\n"
       "\tld.global.u32 %r1, [counter];\n\tret;\n}\n")
BLOCKS = 9000  # more than the sim GPU's resident blocks of 32 threads: a first wave, then claims


def bump(k: SimLaunch) -> None:
    out = np.frombuffer(k.view(k.ptr(0), 4 * BLOCKS), dtype=np.int32)
    for index in k.logical_blocks():
        out[index] += 1


class Launches:
    """Raw calls of one session through the vGPU's dispatch, as the endpoint hands them over."""

    def __init__(self, h: Harness, s: Any) -> None:
        self.h, self.s = h, s

    def load(self, image: bytes) -> int:
        req = ffi.new("pilot_req_module_load *")
        req.image_size = len(image)
        return execution.module_load(self.h.vg, self.s, req, memoryview(image)).value

    def function(self, module: int, name: str) -> int:
        req = ffi.new("pilot_req_function_get *")
        req.module = module
        rep, _params = execution.function_get(self.h.vg, self.s, req, memoryview(name.encode()))
        return rep.function

    def launch(self, function: int, grid: int, args: bytes) -> None:
        req = ffi.new("pilot_req_launch *")
        req.function, req.stream, req.arg_bytes = function, 0, len(args)
        req.grid[0], req.grid[1], req.grid[2] = grid, 1, 1
        req.block[0], req.block[1], req.block[2] = 32, 1, 1
        buf = ffi.new("uint8_t[]", args)
        msg = Msg(self.s.identity, self.s.id, lib.PILOT_OP_LAUNCH, req)
        msg.nframes = 3
        msg.frame.append(ffi.cast("void *", buf))
        msg.len.append(len(args))
        msg._keep += (buf,)  # type: ignore[attr-defined]
        self.h.vg.handle(msg)  # type: ignore[arg-type]
        self.h.vg.gate.poll()


@pytest.fixture(params=["low", "normal"])
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """train is low, or normal: then it raises the low class's word itself, and its own stream,
    waiting for the normal word, must not keep that word up (the GPU run's first deadlock)."""
    h = Harness(tmp_path, {"infer": "high", "train": request.param}, inflight=2)
    h.be._kernels.register("bump", blockwise(bump))
    h.be._kernels.register("uses_state", lambda k: None)
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False)
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    slot = Slot()
    yield h, daemon, slot
    slot.close()
    daemon.lower_all()
    daemon.close()
    h.close()


def _counts(h: Harness, out: int) -> np.ndarray:
    buf = bytearray(4 * BLOCKS)
    h.be.memcpy_dtoh(buf, out, len(buf), None)
    return np.frombuffer(bytes(buf), dtype=np.int32)


class Scene:
    """infer (high) and train (low or normal) on one vGPU; train has loaded PTX and has `out`
    (a count per logical block of bump). `start` makes infer active (train gated), waits for
    bump's variants (made since the module's load) and launches bump once."""

    def __init__(self, h: Harness, daemon: Preemption, ptx: str = PTX, loops: bool = False) -> None:
        self.h, self.daemon, self.ptx, self.loops = h, daemon, ptx, loops
        self.hi, self.lo = h.session(1, "infer"), h.session(2, "train")
        self.out = h.be.mem_alloc(4 * BLOCKS)
        h.be.memcpy_htod(self.out, bytes(4 * BLOCKS), 4 * BLOCKS, None)
        self.lo.add_allocation(self.out, 4 * BLOCKS)
        self.tenant = Launches(h, self.lo)
        self.module = self.tenant.load(ptx.encode())
        self.fn = self.tenant.function(self.module, "bump")
        self.args = struct.pack("<Q", self.out)

    def start(self) -> None:
        self.h.memset(self.hi, 0, 1)  # infer is active: train is gated
        # the variants are made in the background from the module's load on
        assert _until(lambda: self.daemon.variants(self.ptx.encode(), 90, loops=self.loops) is not None)
        self.bump()

    def bump(self) -> None:
        self.tenant.launch(self.fn, BLOCKS, self.args)

    def counts(self) -> np.ndarray:
        return _counts(self.h, self.out)


def test_a_gated_kernel_retreats_while_the_high_tenant_runs_and_resumes_only_the_rest(rig: Any) -> None:
    h, daemon, slot = rig
    sc = Scene(h, daemon)
    hi, lo, tenant, fn, args, out = sc.hi, sc.lo, sc.tenant, sc.fn, sc.args, sc.out
    sc.start()
    assert lo.gated and hi.preempt_raises == 0b11
    assert lo.preempt_raises == (0 if lo.priority == 0 else 0b01)
    assert (_counts(h, out) == 1).all()
    tenant.launch(fn, BLOCKS, args)  # as its variant, nothing raised: all of it
    assert (_counts(h, out) == 2).all()
    assert h.metrics.snapshot().labeled.get(("preemptible_launches", ("train",))) == 2
    words = daemon.gpu_words(h.vg)
    word = 1 << lo.priority  # the word train's class reads
    assert lib.pilot_preempt_armed(words.ptr) == word  # it may be raised now
    h.be.gate(hi.legacy, slot.spec())  # infer's long kernel
    h.memset(hi, 0, 2)  # an infer launch raises the word before its work
    assert lib.pilot_preempt_raised(words.ptr) == word
    tenant.launch(fn, BLOCKS, args)  # the first wave runs; the claims see the word and stop
    counts = _counts(h, out)
    wave = int((counts == 3).sum())
    assert 0 < wave < BLOCKS and (counts[:wave] == 3).all() and (counts[wave:] == 2).all()
    memset = ffi.new("pilot_req_memset *")  # stream order: this waits for the rest
    memset.ptr, memset.value, memset.count, memset.stream = out + 4 * (BLOCKS - 1), 5, 4, 0
    h.vg.handle(Msg(lo.identity, lo.id, lib.PILOT_OP_MEMSET, memset))  # type: ignore[arg-type]
    assert _counts(h, out)[-1] == 2  # held behind the retreat, with the rest
    slot.open()
    h.be.kick()  # infer's kernel ends: the GPU's helper lowers the word, the rest runs
    assert _until(lambda: _counts(h, out)[-2] == 3)
    counts = _counts(h, out)
    assert (counts[:-1] == 3).all()  # every block once more, none twice
    assert counts[-1] == 0x05050505  # the memset came after the rest's +1 (else 0x05050506)
    assert lib.pilot_preempt_raised(words.ptr) == 0
    described = daemon.describe()
    assert described["preemptible_kernels"] == 1
    assert described["kernels_not_preemptible"]["uses_state"].startswith("uses module variables")
    assert described["gpus"]["0"]["raises"] == 1 and described["gpus"]["0"]["clears"] == 1
    words.fold()  # the GPU's tally: one launch preempted, its rest ran what the first wave left
    described = daemon.describe()
    assert described["tenants"] == {"train": {"preempted": 1, "blocks_deferred": BLOCKS - wave,
                                              "blocks_abandoned": 0}}
    assert sum(described["retreat_spread"]) == 1
    words.fold()  # read again: nothing new is counted twice
    assert daemon.describe()["tenants"]["train"]["preempted"] == 1


def test_a_launch_runs_as_parts_each_preemptible_but_the_last(tmp_path: Path) -> None:
    """[priority] preempt_parts = 3: the first part, then after a wait on the word two more
    that claim only; the first two read the word, the last does not. Preempted while the
    high tenant runs, the launch's next part runs the rest once the word comes down."""
    h = Harness(tmp_path, {"infer": "high", "train": "low"}, inflight=2)
    h.be._kernels.register("bump", blockwise(bump))
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False, parts=3)
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    slot = Slot()
    try:
        sc = Scene(h, daemon)
        sc.start()
        queued: list[tuple[str, tuple[int, ...]]] = []
        launch, wait = h.be.launch, h.be.stream_wait_word

        def recording_launch(fn: Any, grid: Any, block: Any, shared: int, stream: Any, args: bytes) -> None:
            ours = struct.unpack(pp.PACKING, bytes(args[-struct.calcsize(pp.PACKING):]))
            queued.append(("launch", (ours[1], ours[7], ours[11])))  # flag, first, part
            launch(fn, grid, block, shared, stream, args)

        def recording_wait(stream: Any, address: int, value: int) -> None:
            queued.append(("wait", (address,)))
            wait(stream, address, value)

        h.be.launch, h.be.stream_wait_word = recording_launch, recording_wait  # type: ignore[method-assign]
        words = daemon.gpu_words(h.vg)
        h.be.gate(sc.hi.legacy, slot.spec())  # infer's long kernel keeps the word up
        h.memset(sc.hi, 0, 2)
        h.be.claims_before_retreat = 2
        sc.bump()
        word, wave = words.word(0), queued[0][1][1]  # the first wave: the resident grid
        assert 0 < wave < BLOCKS
        assert queued == [("launch", (word, wave, 0)), ("wait", (word,)), ("launch", (word, 0, 1)),
                          ("wait", (word,)), ("launch", (word, 0, 2)), ("wait", (word,)),
                          ("launch", (0, 0, 3))]
        slot.open()
        h.be.kick()  # the word comes down: part 1 runs the rest, part 2 finds nothing
        assert _until(lambda: (sc.counts() == 2).all())
        words.fold()
        got = daemon.describe()["tenants"]["train"]
        assert got["preempted"] == 1 and got["blocks_deferred"] == BLOCKS - wave - 2
    finally:
        slot.close()
        daemon.lower_all()
        daemon.close()
        h.close()


def test_reading_tallies_never_holds_the_helper_guard(rig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tally read is a copy that returns once the data is there, and on a GPU it can queue
    behind a stream that waits for a retreat word (streams share hardware queues): neither the
    fold thread's read nor a session end's may hold the guard the helper needs to lower that
    word (a deadlock otherwise)."""
    h, daemon, _slot = rig
    sc = Scene(h, daemon)
    sc.start()  # a variant launched: the session's tally is read from now on
    words = daemon.gpu_words(h.vg)
    reading, release = threading.Event(), threading.Event()
    real = preempt.read_tally

    def waiting_read(*args: Any) -> None:
        reading.set()
        release.wait(10)
        real(*args)

    monkeypatch.setattr(preempt, "read_tally", waiting_read)
    folding = threading.Thread(target=words.fold)
    folding.start()
    try:
        assert reading.wait(5)
        assert words.guard.acquire(timeout=2)  # the helper could look at streams and lower
        words.guard.release()
    finally:
        release.set()
        folding.join(10)
    monkeypatch.setattr(preempt, "read_tally", real)
    with words.guard:  # the helper busy: a session's end still reads its tally and goes on
        ending = threading.Thread(target=h.vg.preempt.forget, args=(sc.lo,))
        ending.start()
        ending.join(5)
        assert not ending.is_alive()
    assert sc.lo.preempt is None


# bump with a loop every thread of a block runs as often: its loop-level variant checks there
LOOP_PTX = PTX.replace("{\n\tret;\n}\n", "{\n\t.reg .b32 %r<3>;\n\t.reg .pred %p<2>;\n\tmov.u32 %r1, 0;\n"
                       "$L__loop:\n\tadd.u32 %r1, %r1, 1;\n\tsetp.lt.u32 %p1, %r1, 4;\n"
                       "\t@%p1 bra $L__loop;\n\tret;\n}\n", 1)


def test_a_loop_preempt_tenants_blocks_abandoned_inside_run_again_in_the_rest(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"infer": "high", "train": "low"}, inflight=2)
    h.be._kernels.register("bump", blockwise(bump))
    h.be._kernels.register("uses_state", lambda k: None)
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False, loop_tenants=frozenset({"train"}))
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    slot = Slot()
    try:
        sc = Scene(h, daemon, LOOP_PTX, loops=True)
        sc.start()  # nothing raised: every block once
        assert (sc.counts() == 1).all() and sc.lo.preempt.loops and sc.lo.preempt.redo
        h.be.gate(sc.hi.legacy, slot.spec())  # infer's long kernel
        h.memset(sc.hi, 0, 2)  # the word goes up
        h.be.abandons_on_retreat = 2  # two blocks of the first wave leave their loop
        sc.bump()
        counts = sc.counts()
        wave = int((counts == 2).sum())
        assert 2 < wave < BLOCKS
        slot.open()
        h.be.kick()  # the word comes down: the rest runs the two again, then the unclaimed
        assert _until(lambda: (sc.counts() >= 2).all())
        counts = sc.counts()
        # bump is not idempotent (+1): the two abandoned blocks show their second run
        assert list(counts[wave - 2:wave]) == [3, 3] and (np.delete(counts, [wave - 2, wave - 1]) == 2).all()
        daemon.gpu_words(h.vg).fold()
        described = daemon.describe()
        assert described["tenants"]["train"]["blocks_abandoned"] == 2
        assert described["loop_level"]["bump"] == "uniform" and described["loop_tenants"] == ["train"]
    finally:
        slot.close()
        daemon.lower_all()
        daemon.close()
        h.close()


def test_a_word_up_too_long_comes_down_while_the_high_tenant_is_still_busy(
        rig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    h, daemon, slot = rig
    monkeypatch.setattr(preempt, "MAX_RAISE_S", 0.05)
    sc = Scene(h, daemon)
    sc.start()
    sc.bump()  # arms the word
    h.be.gate(sc.hi.legacy, slot.spec())  # infer busy for good
    h.memset(sc.hi, 0, 2)
    sc.bump()
    assert _until(lambda: (sc.counts() == 3).all())  # lowered after MAX_RAISE_S: the rest ran
    words = daemon.gpu_words(h.vg)
    assert words.describe()["forced_clears"] >= 1 and not lib.pilot_preempt_raised(words.ptr)
    slot.open()
    h.be.kick()


def test_a_counter_is_reused_only_once_the_launch_that_had_it_is_done(rig: Any) -> None:
    """A launch replayed outside the gate's count (a policy made it wait) must not take a counter
    a running variant still uses: with every counter busy, the original runs."""
    h, daemon, slot = rig
    sc = Scene(h, daemon)
    sc.start()
    lo, out, args = sc.lo, sc.out, sc.args
    info = lo.functions[sc.fn]
    h.be.gate(lo.legacy, slot.spec())  # nothing on train's stream finishes for now
    took = [h.vg.preempt.launch(lo, info, (BLOCKS, 1, 1), (32, 1, 1), 0, lo.legacy, args)
            for _ in range(preempt.SLOTS + 2)]
    nslots = lo.preempt.nslots
    assert nslots == preempt.SLOTS and took == [True] * nslots + [False] * 2  # then the originals
    slot.open()
    h.be.kick()
    assert (_counts(h, out) == 1 + nslots).all()  # each variant ran every block once (the caller
    # launches the original for the others)
    assert h.vg.preempt.launch(lo, info, (BLOCKS, 1, 1), (32, 1, 1), 0, lo.legacy, args)  # free again


def test_a_kernel_without_a_variant_runs_gated_as_before(rig: Any) -> None:
    h, daemon, _slot = rig
    sc = Scene(h, daemon)
    fn = sc.tenant.function(sc.module, "uses_state")
    h.memset(sc.hi, 0, 1)
    for _ in range(2):
        sc.tenant.launch(fn, 4, sc.args)
        _until(lambda: daemon.variants(PTX.encode(), 90) is not None)
    assert ("preemptible_launches", ("train",)) not in h.metrics.snapshot().labeled
    h.vg.preempt.forget(sc.lo)  # the session ends: its counters and modules go
    assert sc.lo.preempt is None


def test_the_ptx_pilot_reads_from_an_image(tmp_path: Path) -> None:
    assert module_ptx(PTX.encode() + b"\0", 90) == PTX
    assert module_ptx(b"\x7fELF" + bytes(60), 90) is None
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = tmp_path / "k.cu"
    src.write_text("__global__ void work(float *x) { x[threadIdx.x] += 1; }\n")
    subprocess.run([nvcc, "-fatbin", "-arch=sm_90", "-o", str(tmp_path / "k.fatbin"), str(src)],
                   check=True, timeout=300)
    image = (tmp_path / "k.fatbin").read_bytes()
    ptx_entries = [e for e in fatbin.parse_entries(image) if e.is_ptx]
    assert ptx_entries  # nvcc 13 compresses it (zstd): read through libzstd
    text = module_ptx(image, 90)
    assert text is not None and ".entry _Z4workPf(" in text
    assert module_ptx(image, 80) is None  # the driver would not JIT sm_90 PTX for an sm_80 GPU


def test_retreat_words_raise_once_and_clear_only_what_no_later_launch_relies_on() -> None:
    writes: list[tuple[int, int]] = []

    def write(stream: int, address: int, value: int, flags: int) -> int:
        writes.append((address - 0x1000, value))
        return 0

    callback = ffi.callback("pilot_write_word_fn", write)
    p = lib.pilot_preempt_new(callback, 1, 0x1000, 2)
    try:
        lib.pilot_preempt_enter(p, 0b11)  # nothing armed: nothing written
        lib.pilot_preempt_leave(p)
        assert writes == []
        lib.pilot_preempt_arm(p, 0b01)
        lib.pilot_preempt_enter(p, 0b11)
        assert writes == [(0, 1)] and lib.pilot_preempt_seen(p) == 0xFFFFFFFFFFFFFFFF  # on its way
        lib.pilot_preempt_leave(p)
        lib.pilot_preempt_enter(p, 0b11)  # raised already: no second write
        lib.pilot_preempt_leave(p)
        assert writes == [(0, 1)]
        seen = lib.pilot_preempt_seen(p)
        lib.pilot_preempt_enter(p, 0b10)  # a launch after the look: the clear must not land
        lib.pilot_preempt_leave(p)
        assert lib.pilot_preempt_clear(p, seen, 0b11) == 0 and lib.pilot_preempt_raised(p) == 0b01
        assert lib.pilot_preempt_clear(p, lib.pilot_preempt_seen(p), 0b11) == 1
        assert writes == [(0, 1), (0, 0)] and lib.pilot_preempt_raised(p) == 0
        lib.pilot_preempt_arm(p, 0b11)
        lib.pilot_preempt_enter(p, 0b10)  # only the words it preempts
        lib.pilot_preempt_leave(p)
        assert writes[-1] == (4, 1) and lib.pilot_preempt_raised(p) == 0b10
        counts = ffi.new("uint64_t[3]")
        lib.pilot_preempt_counts(p, counts, counts + 1, counts + 2)
        assert list(counts) == [2, 1, 0]
        del writes[:]
        assert lib.pilot_preempt_reassert(p) == 0  # the words not raised are written 0 again
        assert writes == [(0, 0)] and lib.pilot_preempt_raised(p) == 0b10
    finally:
        lib.pilot_preempt_free(p)


def test_chaos_preempts_at_random_and_every_block_still_runs_once(tmp_path: Path) -> None:
    """[priority] preempt_chaos: no high tenant at all, every session below high runs gated
    with its variants, and the GPU's helper raises the words at random moments; each launch
    still runs every logical block exactly once, and the tallies count the preemptions."""
    h = Harness(tmp_path, {"train": "normal"}, inflight=2)
    h.board.force = True
    h.board.enabled = True
    h.be._kernels.register("bump", blockwise(bump))
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False, chaos=0.002, parts=4)
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    try:
        lo = h.session(2, "train")
        out = h.be.mem_alloc(4 * BLOCKS)
        h.be.memcpy_htod(out, bytes(4 * BLOCKS), 4 * BLOCKS, None)
        lo.add_allocation(out, 4 * BLOCKS)
        tenant = Launches(h, lo)
        fn = tenant.function(tenant.load(PTX.encode()), "bump")
        args = struct.pack("<Q", out)
        h.vg.gate.poll()
        assert lo.gated  # forced: no higher tenant is active
        tenant.launch(fn, BLOCKS, args)  # the variants are made meanwhile
        assert _until(lambda: daemon.variants(PTX.encode(), 90) is not None)
        h.be.claims_before_retreat = 3
        words = daemon.gpu_words(h.vg)

        def preempted() -> int:
            words.fold()
            return int(daemon.describe()["tenants"].get("train", {}).get("preempted", 0))

        n, deadline = 1, time.monotonic() + 20
        while preempted() < 5 and time.monotonic() < deadline:  # launches until 5 were cut
            n += 1
            tenant.launch(fn, BLOCKS, args)
            assert _until(lambda n=n: (h.vg.gate.poll(), (_counts(h, out) == n).all())[1], 5.0), n
        assert _until(lambda: not lib.pilot_preempt_raised(words.ptr))
        got = daemon.describe()
        assert got["gpus"]["0"]["chaos_raises"] > 0
        assert lo.preempt is not None and lo.preempt.launches >= n - 2
        # a launch of several parts may be preempted more than once
        assert 5 <= got["tenants"]["train"]["preempted"] <= n * CHAOS_PARTS
        assert got["tenants"]["train"]["blocks_deferred"] >= 5
    finally:
        daemon.lower_all()
        daemon.close()
        h.close()


@pytest.mark.parametrize(("times", "kept"), [({0: 1.0, 1: 1.3, 8: 1.02}, 8),
                                             ({0: 1.0, 1: 1.3, 8: 1.2}, pc.ORIGINAL)])
def test_auto_chunk_measures_each_way_then_keeps_the_fastest_or_the_original(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, times: dict[int, float], kept: int) -> None:
    """`preempt_chunk = "auto"`: the first gated launches of a kernel alternate the original,
    chunk 1 and chunk 8 between timing events (here the times are scripted per candidate); then
    the fastest variant runs, or the original when every variant costs more than 5%. Every
    launch, measured or not, runs every block once."""
    h = Harness(tmp_path, {"infer": "high", "train": "low"}, inflight=2)
    h.board.active_window = 60.0  # infer's one call keeps train gated however slow the host
    h.be._kernels.register("bump", blockwise(bump))
    daemon = Preemption(chunk=0, cache_dir=None, compile_ptx=False)
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    try:
        sc = Scene(h, daemon)
        sc.start()
        state = sc.lo.preempt
        assert state is not None

        def elapsed(start: Any, end: Any) -> float:  # ms, by the candidate the launch measured
            return next(times[t.candidate] for t in state.timings if t.start is start) * 1e3

        monkeypatch.setattr(h.be, "event_elapsed_ms", elapsed)
        runs = 1

        def decided() -> int | None:
            made = state.made.get(sc.module)
            return None if made is None or not made.choices else next(iter(made.choices.values())).decided

        while decided() is None and runs < pc.MAX_TRIES:
            assert _until(lambda: not lib.pilot_preempt_raised(daemon.gpu_words(h.vg).ptr))
            sc.bump()
            runs += 1
            assert sc.lo.gated and _until(lambda runs=runs: (sc.counts() == runs).all())
        (choice,) = state.made[sc.module].choices.values()
        assert choice.decided == kept, choice.samples
        assert all(len(v) == pc.SAMPLES for v in choice.samples.values())
        before = h.metrics.snapshot().labeled.get(("preemptible_launches", ("train",)), 0)
        sc.bump()
        assert _until(lambda: (sc.counts() == runs + 1).all())
        after = h.metrics.snapshot().labeled.get(("preemptible_launches", ("train",)), 0)
        assert after == before + (0 if kept == pc.ORIGINAL else 1)
        shown = daemon.describe()
        assert shown["chunk"] == "auto"
        assert list(shown["kernel_choices"].values()) == [choice.describe()]
    finally:
        daemon.lower_all()
        daemon.close()
        h.close()


def test_no_variant_goes_into_a_graph_pilotd_captures(rig: Any) -> None:
    """A variant's slot and events belong to one launch: a launch captured into a graph (every
    replay would share them) runs the original (the capture was seen on the H200 under
    preempt_chaos)."""
    h, daemon, _slot = rig
    sc = Scene(h, daemon)
    sc.start()
    info = sc.lo.functions[sc.fn]
    h.vg.capturing = True
    assert not h.vg.preempt.launch(sc.lo, info, (BLOCKS, 1, 1), (32, 1, 1), 0, sc.lo.legacy, sc.args)
    h.vg.capturing = False
    assert h.vg.preempt.launch(sc.lo, info, (BLOCKS, 1, 1), (32, 1, 1), 0, sc.lo.legacy, sc.args)


@pytest.mark.parametrize(("tenant", "cmdline", "loops"), [
    ("sim", "/usr/bin/python3 train.py", True),  # the tenant's
    ("web", "/home/a/bin/jacobi -n 4", True),  # the program's base name
    ("web", "/opt/bin/lbm", True),  # its path
    ("web", "/tmp/opt/bin/lbm", False),  # another path: the base name is not listed
    ("web", "./jacobi2", False),
    ("web", "", False),
])
def test_loop_level_sessions_by_tenant_or_program(tenant: str, cmdline: str, loops: bool) -> None:
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False, loop_tenants=frozenset({"sim"}),
                        loop_programs=frozenset({"jacobi", "/opt/bin/lbm"}))
    try:
        assert daemon.loops(SimpleNamespace(tenant=tenant, cmdline=cmdline)) is loops  # type: ignore[arg-type]
    finally:
        daemon.close()
