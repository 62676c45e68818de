"""A policy preempting a session (Controls.preemptible / preempt / resume; scheduling/preempt.py
and policy_host.py) on the sim, end to end, with no priority classes at all: the session's
launches run as preemptible variants reading its own retreat word; a preempt cuts the one on the
GPU after its first wave, pilotd sees it leave (the drain), later work on its stream waits for
the rest, and the resume runs only the rest. Plus the capacity enforcer's side (residency.py):
a preempted session's running kernels' memory leaves after the cut, not after the resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_preempt_launch import BLOCKS, PTX, Launches, _counts, bump
from test_priority import Harness, Msg, Slot, _until

from pilot.daemon.protocol import ffi, lib
from pilot.daemon.scheduling.policy_host import PolicyHost
from pilot.daemon.scheduling.preempt import WORD_AT, Preemption, VGpuPreemption
from pilot.daemon.sim_kernels import blockwise
from pilot.policies import Policy


class Rig:
    """One tenant of the normal class alone (no gating), a daemon that cuts kernels for its
    policy, and the policy's Controls as pilotd gives them."""

    def __init__(self, tmp: Path) -> None:
        self.h = h = Harness(tmp, {"train": "normal"}, inflight=2)
        h.be._kernels.register("bump", blockwise(bump))
        h.be._kernels.register("uses_state", lambda k: None)
        self.daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False)
        self.daemon.for_policy = True
        h.vg.preempt = VGpuPreemption(h.vg, self.daemon)
        self.host = PolicyHost(Policy(), h.metrics)
        self.controls = self.host.controls
        self.controls.vgpus, self.controls.preempts = [h.vg], True
        self.s = h.session(2, "train")
        self.host.sessions[self.s.id] = self.s
        self.out = h.be.mem_alloc(4 * BLOCKS)
        h.be.memcpy_htod(self.out, bytes(4 * BLOCKS), 4 * BLOCKS, None)
        self.s.add_allocation(self.out, 4 * BLOCKS)
        self.tenant = Launches(h, self.s)
        self.fn = self.tenant.function(self.tenant.load(PTX.encode()), "bump")
        assert _until(lambda: self.daemon.variants(PTX.encode(), 90) is not None)
        self.slot = Slot()

    def bump(self) -> None:
        self.tenant.launch(self.fn, BLOCKS, self.out.to_bytes(8, "little"))

    def counts(self) -> Any:
        return _counts(self.h, self.out)

    def memset_last(self, value: int) -> None:
        """A memset of the last block's count, on the same stream."""
        req = ffi.new("pilot_req_memset *")
        req.ptr, req.value, req.count, req.stream = self.out + 4 * (BLOCKS - 1), value, 4, 0
        self.h.vg.handle(Msg(self.s.identity, self.s.id, lib.PILOT_OP_MEMSET, req))  # type: ignore[arg-type]

    def word(self) -> int:
        buf = bytearray(4)
        self.h.be.memcpy_dtoh(buf, self.s.preempt.slots + WORD_AT, 4, None)
        return int.from_bytes(buf, "little")

    def close(self) -> None:
        self.slot.open()
        self.h.be.kick()
        self.slot.close()
        self.daemon.lower_all()
        self.daemon.close()
        self.h.close()


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    r = Rig(tmp_path)
    yield r
    r.close()


def test_a_preempted_session_retreats_drains_and_resumes_only_the_rest(rig: Rig) -> None:
    c, s = rig.controls, rig.s
    assert c.can_preempt() and not rig.s.gated
    rig.bump()  # not preemptible yet: the original
    assert (rig.counts() == 1).all() and (s.preempt is None or not s.preempt.slots)
    c.preemptible(s.id)
    rig.bump()  # its variant, nothing raised: all of it
    assert (rig.counts() == 2).all()
    assert rig.h.metrics.snapshot().labeled.get(("preemptible_launches", ("train",))) == 1
    rig.h.be.gate(s.legacy, rig.slot.spec())  # the stream stops here for now
    rig.bump()  # queued behind the gate
    c.preempt(s.id)
    assert c.preemption(s.id) is None  # queued: carried out by the scheduler thread
    c.run_pending()
    view = c.preemption(s.id)
    assert view is not None and view.cut == 1 and view.drained_at is None and rig.word() == 1
    rig.memset_last(5)  # stream order: behind the rest
    rig.slot.open()
    rig.h.be.kick()  # the first wave runs, the claims see the session's word and stop
    assert _until(lambda: (v := c.preemption(s.id)) is not None and v.drained_at is not None)
    view = c.preemption(s.id)
    assert view is not None and view.latency_s is not None and view.latency_s >= 0
    counts = rig.counts()
    wave = int((counts == 3).sum())
    assert 0 < wave < BLOCKS and (counts[:wave] == 3).all() and (counts[wave:] == 2).all()
    c.resume(s.id)
    c.run_pending()
    assert c.preemption(s.id) is None and rig.word() == 0
    assert _until(lambda: rig.counts()[-2] == 3)
    counts = rig.counts()
    assert (counts[:-1] == 3).all()  # every block once more, none twice
    assert counts[-1] == 0x05050505  # the memset came after the rest's +1
    described = rig.daemon.describe()
    assert described["policy_preemptions"] == 1 and described["policy_resumes"] == 1
    assert sum(described["drain"]) == 1
    labeled = rig.h.metrics.snapshot().labeled
    assert labeled.get(("policy_actions", (rig.host.name, "train", "preempt"))) == 1
    assert labeled.get(("policy_actions", (rig.host.name, "train", "resume"))) == 1


def test_a_launch_made_while_preempted_runs_nothing_until_the_resume(rig: Rig) -> None:
    c, s = rig.controls, rig.s
    c.preemptible(s.id)
    c.preempt(s.id)  # before it has a word at all: its first slots start raised
    c.run_pending()
    view = c.preemption(s.id)
    assert view is not None and view.cut == 0 and view.drained_at is not None
    rig.bump()
    assert rig.word() == 1 and (rig.counts() == 0).all()  # not even a first wave
    c.resume(s.id)
    c.run_pending()
    assert _until(lambda: (rig.counts() == 1).all())


def test_a_session_that_ends_preempted_has_its_word_lowered(rig: Rig) -> None:
    c, s = rig.controls, rig.s
    c.preemptible(s.id)
    rig.bump()
    c.preempt(s.id)
    c.run_pending()
    rig.bump()
    assert rig.word() == 1 and (rig.counts() == 1).all()
    rig.h.vg.preempt.session_ends(s)  # its work is synchronized next: nothing may stay waiting
    assert s.preemption is None and rig.word() == 0
    assert _until(lambda: (rig.counts() == 2).all())


def test_without_preempt_controls_only_count(rig: Rig) -> None:
    c, s = rig.controls, rig.s
    c.preempts = False
    c.preemptible(s.id)
    assert not s.preemptible and not c.can_preempt()
    c.preempt(s.id)
    c.run_pending()
    assert c.preemption(s.id) is None
    rig.bump()
    assert (rig.counts() == 1).all()


def test_launches_queued_behind_a_cut_one_do_not_hold_the_drain(rig: Rig) -> None:
    """Three launches queued: the first is cut, its rest waits for the word, and the two behind
    it cannot start before the resume: the session has left the GPU once the first has (the
    H200 run before this: each preemption waited for launches that had not started)."""
    c, s = rig.controls, rig.s
    c.preemptible(s.id)
    rig.h.be.gate(s.legacy, rig.slot.spec())
    for _ in range(3):
        rig.bump()
    c.preempt(s.id)
    c.run_pending()
    view = c.preemption(s.id)
    assert view is not None and view.cut == 1  # the one whose first part comes next
    rig.slot.open()
    rig.h.be.kick()
    assert _until(lambda: (v := c.preemption(s.id)) is not None and v.drained_at is not None)
    counts = rig.counts()
    wave = int((counts == 1).sum())
    assert 0 < wave < BLOCKS and (counts[wave:] == 0).all()  # the first wave, nothing behind it
    c.resume(s.id)
    c.run_pending()
    assert _until(lambda: (rig.counts() == 3).all())


def test_a_gated_session_preempted_by_its_policy_waits_for_both_words(tmp_path: Path) -> None:
    """A low tenant gated by a high one's work and preempted by the policy: its launch reads
    both words; once the high tenant is idle and its class's word comes down, the rest still
    waits for the session's own word, and runs at the resume, every block once."""
    from test_preempt_launch import Scene

    h = Harness(tmp_path, {"infer": "high", "train": "low"}, inflight=2)
    h.be._kernels.register("bump", blockwise(bump))
    h.be._kernels.register("uses_state", lambda k: None)
    daemon = Preemption(chunk=1, cache_dir=None, compile_ptx=False)
    daemon.for_policy = True
    h.vg.preempt = VGpuPreemption(h.vg, daemon)
    host = PolicyHost(Policy(), h.metrics)
    c = host.controls
    c.vgpus, c.preempts = [h.vg], True
    slot = Slot()
    try:
        sc = Scene(h, daemon)
        host.sessions[sc.lo.id] = sc.lo
        sc.start()  # train gated; bump ran once as its variant
        c.preemptible(sc.lo.id)
        h.be.gate(sc.hi.legacy, slot.spec())  # infer busy
        h.memset(sc.hi, 0, 2)  # its class's word goes up
        c.preempt(sc.lo.id)
        c.run_pending()
        sc.bump()  # preempted: not even a first wave
        assert (sc.counts() == 1).all()
        slot.open()
        h.be.kick()  # infer idle: the helper lowers the class's word
        words = daemon.gpu_words(h.vg)
        assert _until(lambda: not lib.pilot_preempt_raised(words.ptr))
        assert not _until(lambda: (sc.counts() == 2).any(), timeout=0.3)  # its own word is up
        c.resume(sc.lo.id)
        c.run_pending()
        assert _until(lambda: (sc.counts() == 2).all())
    finally:
        slot.open()
        h.be.kick()
        slot.close()
        daemon.lower_all()
        daemon.close()
        h.close()
