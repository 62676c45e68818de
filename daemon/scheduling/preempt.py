"""Preempting a gated session's kernels (issue 29 item 2; docs/design/preemption.md).

While a session is gated (a higher class is active on its GPU: scheduling/priority.py), a launch
of a kernel that has a preemptible variant (backends/ptx_preempt.py) is four operations on the
launch's own stream:

1. its counter (a u32 of the session's slots) := `first`, the blocks launched;
2. the variant over the resident grid, reading its class's retreat word;
3. a wait until that word is 0 (cuStreamWaitValue32);
4. the variant again with `first` 0 and no word: the blocks step 2 did not run, or none.

With `[priority] preempt_parts` P > 1, steps 3 and 2 repeat P - 1 times before step 4 (the
variant with `first` 0 and the word: a resumed launch can be preempted again), P parts in all
that may leave blocks to the next. Every logical block runs once whatever the moment of a
retreat, and stream order is the program's: later work on the stream waits for step 4. Nothing
is held in pilotd.

**The words** (one u32 per victim class and GPU: low, normal) are raised by the launches of the
sessions above a gated class, in C (daemon/native/preempt_words.c: `pilot_fast_raises` for the
fast path) and in Python (`VGpuPreemption.raising` around a call that puts kernels on the GPU),
with a stream write on the GPU's stream of the greatest priority. A class's word is *armed*
(may be raised) while a session of that class is gated and has launched a variant. The GPU's
helper thread `preempt-N` (GpuWords) lowers a word once the sessions of the classes above the
word's have idle streams (looking every CLEAR_MS while any is raised), or once it has been up for
MAX_RAISE_S (a lower class is never parked for good behind a busy tenant; the next raising
launch raises it again). It is a thread of its own because a vGPU thread may be waiting for the
GPU in C, behind a stream that waits for a word.

**The variants** of a module image are made once per image in the background (thread
`pilot-jit`), from the module's load on: the image's PTX (a PTX image, or the newest PTX entry
of a fatbin not above the GPU's architecture, decompressed with the system's libzstd when nvcc
compressed it) is rewritten, compiled with ptxas through the disk cache (ptx_cache.py,
`state_dir/ptx-cache`) where ptxas is found, else handed to the driver's JIT. A session's module
gets its variants' module (a module of its own, charged to the tenant like the program's) at its
first gated launch after they are ready; until then, and for kernels without a variant, the
original runs behind the gate. The chunk is `[priority] preempt_chunk`, or with "auto" (the
default) chosen per kernel and grid from measured times, the original included
(preempt_choice.py).

Not preempted (the gate alone applies): launches with attributes (cooperative, clusters, a
priority), sessions in an SM partition (green contexts), graph launches, library calls and
memsets (SASS only), and kernels the rewrite refuses (their reasons: `pilotctl`'s priorities).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import random
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends import fatbin
from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.base import EVENT_DISABLE_TIMING, BackendError
from pilot.daemon.backends.ptx_cache import ImageCache, ptxas
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.resources.priorities import LEVELS
from pilot.daemon.scheduling import preempt_choice as pc
from pilot.daemon.telemetry.thread_names import NamedThread

if TYPE_CHECKING:
    from pilot.daemon.backends.base import FunctionInfo
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.scheduling")

LOW, NORMAL, HIGH = LEVELS["low"], LEVELS["normal"], LEVELS["high"]
WORD = {LOW: 0, NORMAL: 1}  # the retreat word a class's variants read
RAISES = {LOW: 0, NORMAL: 1 << WORD[LOW], HIGH: (1 << WORD[LOW]) | (1 << WORD[NORMAL])}
ALL_WORDS = (1 << len(WORD)) - 1
SEEN_BUSY = 0xFFFFFFFFFFFFFFFF  # pilot_preempt_seen: a raising launch is on its way
CLEAR_MS = 0.5  # how often a GPU's helper looks at raised words
# how often it looks whether a preempted session has left the GPU: every DRAIN_MS at first,
# then every tenth of the time since the request (at most CLEAR_MS): the observed latency is
# that fine, and a session that takes long is not polled 20,000 times a second
DRAIN_MS = 0.05
ARMED_MS = 2.0  # how often it looks whether an armed word was raised (C raises without a word)
# A word raised this long comes down even while a higher class still has work: a lower class's
# stream is never parked for good behind a busy tenant (the next raising launch raises it again).
MAX_RAISE_S = 0.25
REASSERT_S = 0.1  # how often, while armed, the words not raised are written 0 again
IDLE_S = 0.05  # how long it sleeps while nothing is armed (an arm wakes it)
FOLD_S = 0.05  # how often, at most, it reads the sessions' tallies after lowering words
MAX_TIMINGS = 16  # measured launches of a session not yet seen done (preempt_choice.py)
ATTR_MAJOR, ATTR_MINOR, ATTR_SMS = 75, 76, 16  # cudaDevAttr: compute capability, SM count
KEEP_IMAGE_BYTES = 16 << 20  # larger module images get no variants (their kernels are gated only)
# A session's device memory for preemption: its tally, then its own retreat word (u32, raised by
# a policy's Controls.preempt; 4 bytes of padding keep the slots 8-aligned), then its slots.
WORD_AT = pp.TALLY_BYTES
HEADER_BYTES = pp.TALLY_BYTES + 8
# Resident blocks a multiprocessor holds at most (32 on sm_80 and sm_90): the redo lists of a
# session's loop-level launches have room for a persistent grid of this many per SM.
REDO_BLOCKS_PER_SM = 32
# A session's launches in flight that can run preemptible at once (a slot each; more run as
# their originals). The gate keeps a gated session's pieces in flight below this; a session a
# policy made preemptible may queue many launches (a framework queues hundreds).
SLOTS = 64
# [priority] preempt_chaos: a session's first gated launch of a module waits this long at most
# for its variants (a test wants every launch preemptible; a short program is otherwise done
# before ptxas is)
JIT_WAIT_S = 30.0
# [priority] preempt_chaos: a launch that may have several preemptible parts gets 1 up to this
# many (each resumed part raised or not at random like the first)
CHAOS_PARTS = 6


@dataclass
class ModuleVariants:
    """What became of one module image: its variants' image to load, or why none."""

    ready: bool = False
    image: bytes = b""  # a cubin, or PTX text for the driver's JIT (NUL-terminated)
    kernels: dict[str, pp.Rewrite] = field(default_factory=dict)
    reason: str = ""  # why the image has no variants
    seconds: float = 0.0  # rewrite and compile (or the cache's read)
    # how each kernel runs while gated, per block size and grid (preempt_choice.py)
    choices: dict[tuple[str, int, int, int], pc.Choice] = field(default_factory=dict)

    def choice(self, key: tuple[str, int, int, int]) -> pc.Choice | None:
        """The key's choice (made on first use; None past MAX_CHOICES: not measured)."""
        found = self.choices.get(key)
        if found is None and len(self.choices) < pc.MAX_CHOICES:
            found = self.choices.setdefault(key, pc.Choice())
        return found


@dataclass
class SessionVariants:
    """One session's part: its tally and slots, the variants' modules loaded for its modules,
    and the variant of each of its functions (None: none)."""

    slots: int = 0  # device address of its tally, its own word, then its slots (HEADER_BYTES)
    nslots: int = 0
    next_slot: int = 0
    # module handle -> its image and the image's digest (image_digest: hashed once, at its load)
    images: dict[int, tuple[bytes, str]] = field(default_factory=dict)
    modules: dict[int, tuple[Any, int]] = field(default_factory=dict)  # handle -> (module, charge)
    # (module handle, kernel, threads per block, dynamic shared bytes) -> (variant, resident
    # blocks) or None: none
    functions: dict[tuple[int, str, int, int], tuple[Any, int, bool] | None] = field(default_factory=dict)
    # per counter: recorded behind its last launch (one never recorded counts as done, on a GPU
    # as on the sim)
    events: list[Any] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)  # counters whose event could not be recorded
    used: bool = False  # has launched a variant while gated (its class's word is armed)
    launches: int = 0  # preemptible launches made
    made: dict[int, ModuleVariants] = field(default_factory=dict)  # module handle -> its variants
    waited: set[int] = field(default_factory=set)  # modules whose variants a launch waited for
    timings: list[pc.Timing] = field(default_factory=list)  # measured launches not yet seen done
    spare: list[Any] = field(default_factory=list)  # timing events to reuse
    tallied: pp.Tally = field(default_factory=pp.Tally)  # its tally when last read
    loops: bool = False  # its launches use loop-level variants where a kernel has one
    redo: int = 0  # device address of its slots' redo lists (loop-level variants; 0: none yet)
    redo_blocks: int = 0  # persistent blocks a launch may have: each slot's list holds as many
    # Sessions a policy made preemptible, per slot: events recorded behind its launch's first
    # part (`cuts`: done, none of its blocks is on the GPU until its rest) and behind the waits
    # on the words (`passes`: done, its rest runs), the launch's stream and its place in the
    # session's order; `cut_recorded`: the slots whose launch in flight recorded them.
    cuts: list[Any] = field(default_factory=list)
    passes: list[Any] = field(default_factory=list)
    streams: list[Any] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    cut_recorded: set[int] = field(default_factory=set)

    def slot(self, index: int) -> int:
        """The device address of slot `index` (its counter first)."""
        return self.slots + HEADER_BYTES + pp.SLOT_BYTES * index

    def redo_list(self, index: int) -> int:
        """The device address of slot `index`'s redo list (loop-level variants)."""
        return self.redo + pp.redo_bytes(self.redo_blocks) * index

    @property
    def word(self) -> int:
        """The device address of the session's own retreat word (0: no slots yet)."""
        return self.slots + WORD_AT if self.slots else 0


@dataclass
class SessionPreemption:
    """A policy's preemption of one session (Controls.preempt), from its request on."""

    requested_at: float  # time.monotonic() of the policy's call
    raised: bool = False  # the session's word was written 1 (it had slots)
    cut: int = 0  # its watched launches that were to leave the GPU when the word went up
    inflight: int = 0  # its watched launches in flight then (running, or queued)
    # what says they have (frontier): for the enforcer, whose moves of their memory wait for it
    waiting: list[Any] = field(default_factory=list)
    drained_at: float | None = None  # when pilotd saw the last of them leave the SMs


def module_ptx(image: bytes, sm: int) -> str | None:
    """The PTX the driver would JIT for `image` on an sm_`sm` GPU, if pilot can read it: a PTX
    image, or the newest PTX entry of a fatbin not above `sm` (decompressed if need be)."""
    text = fatbin.ptx_text(image)
    if text is not None:
        return text
    if not fatbin.is_fatbin(image):
        return None
    try:
        entries = fatbin.parse_entries(image)
    except ValueError:
        return None
    entry = fatbin.newest_ptx(entries, sm)
    if entry is None:
        return None
    data = fatbin.entry_bytes(entry)  # nvcc 13 compresses it (zstd)
    return fatbin.ptx_text(data) if data is not None else None


class Preemption:
    """One per daemon: the variants of every module image, and each GPU's words."""

    def __init__(self, chunk: int = 1, cache_dir: str | None = None, compile_ptx: bool = True,
                 chaos: float = 0.0, loop_tenants: frozenset[str] = frozenset(),
                 loop_programs: frozenset[str] = frozenset(), parts: int = 1) -> None:
        """chunk: 0 chooses per kernel and grid from measured times (preempt_choice.py; not
        with chaos, whose point is to run every kernel preemptible). compile_ptx: compile with
        ptxas where it is found (a GPU); the sim loads PTX text. chaos: [priority]
        preempt_chaos, the mean gap in seconds between raises the helpers make themselves (0:
        none). loop_tenants, loop_programs: whose sessions get loop-level variants (loops()).
        parts: [priority] preempt_parts, the preemptible parts of a launch (the module
        docstring).
        """
        self.parts = parts
        self.measures = chunk == 0 and not chaos
        self.loop_tenants, self.loop_programs = loop_tenants, loop_programs
        self.chunk = chunk or pc.FALLBACK_CHUNK
        self.chaos = chaos
        # what the GPUs' tallies said: tenant -> [preemptions, blocks deferred, abandoned], and
        # retreats per spread bucket
        self.tenants: dict[str, list[int]] = {}
        self.spread = [0] * pp.SPREAD_BUCKETS
        self._random = random.Random()
        self._cache: ImageCache | None = None
        if cache_dir:
            try:
                self._cache = ImageCache(cache_dir)
            except OSError as exc:  # variants are then JIT-compiled by the driver at each start
                log.warning("no disk cache for preemptible variants (%s): %s", cache_dir, exc)
        self._ptxas = compile_ptx and shutil.which("ptxas") is not None
        self._lock = threading.Lock()
        self._images: dict[str, ModuleVariants] = {}
        self._making: dict[str, Future[None]] = {}  # images whose variants are being made
        self._pool: ThreadPoolExecutor | None = None
        self._gpus: dict[int, GpuWords] = {}
        self.jit_seconds = 0.0
        self.jit_modules = 0
        # the policy preempts sessions (Policy.preempts_kernels): every session's module images
        # get variants, whatever its class (set by the Daemon)
        self.for_policy = False
        # policy preemptions: made, resumed, and their drain times per log2 bucket (as spreads)
        self.policy_counts = [0, 0]
        self.drains = [0] * pp.SPREAD_BUCKETS

    def loops(self, s: Session) -> bool:
        """Whether s's launches use loop-level variants ([tenants.X] loop_preempt, [priority]
        loop_preempt_programs: the base name of its argv[0], or argv[0] itself). They are
        correct for idempotent kernels only: a block abandoned inside runs again from its
        start."""
        if s.tenant in self.loop_tenants:
            return True
        argv0 = s.cmdline.split(" ", 1)[0] if s.cmdline else ""
        return bool(argv0) and (argv0 in self.loop_programs or argv0.rsplit("/", 1)[-1] in self.loop_programs)

    def variants(self, image: bytes, sm: int, digest: str | None = None,
                 loops: bool = False, wait: bool = False) -> ModuleVariants | None:
        """The image's variants (with loops, its loop-level ones too), or None while they are
        being made (started here). digest: the image's SHA-256 (hex) when the caller has it
        already. wait: until they are made (up to JIT_WAIT_S)."""
        key = (digest or image_digest(image)) + f":{sm}" + (":loops" if loops else "")
        with self._lock:
            found = self._images.get(key)
            if found is not None and (found.ready or found.reason):
                return found
            making = self._making.get(key)
            if making is None:
                self._images[key] = ModuleVariants()
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="pilot-jit")
                making = self._making[key] = self._pool.submit(self._make, key, image, sm, loops)
        if wait:
            with contextlib.suppress(Exception):  # _make logs its own failures
                making.result(JIT_WAIT_S)
            with self._lock:
                found = self._images.get(key)
            if found is not None and (found.ready or found.reason):
                return found
        return None

    def _make(self, key: str, image: bytes, sm: int, loops: bool) -> None:
        start = time.perf_counter()
        out = ModuleVariants()
        try:
            ptx = module_ptx(image, sm)
            if ptx is None:
                out.reason = "no readable PTX in the image (SASS only, or compressed without libzstd)"
            else:
                rewritten = pp.rewrite_module(ptx, loops)
                out.kernels = rewritten.kernels
                if not rewritten.variants:
                    out.reason = "no kernel of the module can be rewritten"
                elif self._ptxas and self._cache is not None:
                    compiled = self._cache.compile(rewritten.ptx, f"sm_{sm}", ptxas)
                    out.image = compiled.image
                else:
                    out.image = rewritten.ptx.encode() + b"\0"
        except Exception as exc:  # a module pilot cannot rewrite runs as it is
            out.reason = f"rewrite failed: {exc}"
            log.warning("preemptible variants: %s", out.reason)
        out.seconds = time.perf_counter() - start
        out.ready = not out.reason
        with self._lock:
            self._images[key] = out
            self._making.pop(key, None)
            self.jit_seconds += out.seconds
            self.jit_modules += 1

    def gpu_words(self, vg: VGpu) -> GpuWords | None:
        """The words of vg's GPU, made on first use (on vg's thread, its context current)."""
        words = self._gpus.get(vg.gpu)
        if words is not None:
            return words if words.ptr != ffi.NULL else None
        with self._lock:
            words = self._gpus.get(vg.gpu)
            if words is None:
                try:
                    words = GpuWords(vg, self)
                except (BackendError, MemoryError, OSError) as exc:
                    log.warning("vgpu-%d: no preemption on GPU %d: %s", vg.index, vg.gpu, exc)
                    words = GpuWords.unusable(vg.gpu)
                self._gpus[vg.gpu] = words
        return words if words.ptr != ffi.NULL else None

    def describe(self) -> dict[str, Any]:
        """For `pilotctl status --json`: modules seen, which kernels are preemptible and why
        others are not, the JIT time, and each GPU's words."""
        with self._lock:
            images = list(self._images.values())
            gpus = dict(self._gpus)
            tenants = {t: list(v) for t, v in self.tenants.items()}
            spread = list(self.spread)
        refused: dict[str, str] = {}
        loop_level: dict[str, str] = {}  # kernel -> its loop-level mode, or why it has none
        preemptible = 0
        for m in images:
            for name, r in m.kernels.items():
                if r.variant is not None:
                    preemptible += 1
                else:
                    refused[name] = r.reason
                if r.loop_mode or r.loop_reason:
                    loop_level[name] = r.loop_mode or f"none: {r.loop_reason}"
        chosen: dict[str, str] = {}
        for m in images:
            for (kernel, threads, shared, size), c in list(m.choices.items()):
                chosen[f"{kernel} ({threads} threads, {shared} B shared, <= {1 << size} blocks)"] = \
                    c.describe()
        outcomes: dict[str, int] = {}
        for how in chosen.values():
            outcomes[how] = outcomes.get(how, 0) + 1
        return {"chunk": "auto" if self.measures else self.chunk, "parts": self.parts,
                "modules": len(images),
                "choices": outcomes, "kernel_choices": chosen,
                "modules_without_variants": sorted({m.reason for m in images if m.reason}),
                "preemptible_kernels": preemptible, "kernels_not_preemptible": refused,
                "loop_level": loop_level, "loop_tenants": sorted(self.loop_tenants),
                "loop_programs": sorted(self.loop_programs),
                "jit_modules": self.jit_modules, "jit_seconds": round(self.jit_seconds, 3),
                "chaos_s": self.chaos,
                "tenants": {t: {"preempted": v[0], "blocks_deferred": v[1], "blocks_abandoned": v[2]}
                            for t, v in sorted(tenants.items())},
                "retreat_spread": spread,
                "policy_preemptions": self.policy_counts[0], "policy_resumes": self.policy_counts[1],
                "drain": list(self.drains),
                "gpus": {str(g): w.describe() for g, w in gpus.items()}}

    def draw(self) -> bool:
        """[priority] preempt_chaos: whether this launch is preempted from its start (half of
        them; the helpers' random raises cut the others anywhere)."""
        return self._random.random() < 0.5

    def shape(self, blocks: int, chunk: int, chained: bool) -> tuple[int, int, int, bool]:
        """The persistent grid, chunk and preemptible parts of a launch (chained: it may have
        more than one), and whether its first part runs no first wave. Under [priority]
        preempt_chaos: a random grid (1 up to the resident one), chunk (1, 3 or 8) and parts (1
        up to CHAOS_PARTS), and a quarter of the launches with no first wave, so that even a
        grid the GPU holds at once has blocks claiming, which a retreat can cut (a test of the
        claim and the resume; not for speed)."""
        if not self.chaos:
            return blocks, chunk, self.parts if chained else 1, False
        rnd = self._random
        return (rnd.randint(1, max(1, blocks)), rnd.choice((1, 3, 8)),
                rnd.randint(1, CHAOS_PARTS) if chained else 1, rnd.random() < 0.25)

    def record(self, s: Session, state: SessionVariants, now: pp.Tally) -> None:
        """Fold what s's tally gained since it was last read into the daemon's counts."""
        before = state.tallied
        if now == before:
            return
        state.tallied = now
        preempted, deferred = now.preempted - before.preempted, now.deferred - before.deferred
        with self._lock:
            counts = self.tenants.setdefault(s.tenant, [0, 0, 0])
            counts[0] += max(0, preempted)
            counts[1] += max(0, deferred)
            counts[2] += max(0, now.abandoned - before.abandoned)
            for i, (a, b) in enumerate(zip(now.spread, before.spread, strict=True)):
                self.spread[i] += max(0, a - b)

    def drained(self, p: SessionPreemption) -> None:
        """The preempted session has left the GPU now: its drain time, counted per bucket."""
        p.drained_at = time.monotonic()
        with self._lock:
            self.drains[pp.spread_bucket(int((p.drained_at - p.requested_at) * 1e9))] += 1

    def lower_all(self) -> None:
        """Every word down and nothing armed (the daemon stops: no stream may stay waiting)."""
        for words in list(self._gpus.values()):
            words.lower()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for words in self._gpus.values():
            words.close()


class GpuWords:
    """One GPU's retreat words: their device memory, the stream they are written on, the C
    state (preempt_words.h) and the helper thread that lowers them."""

    def __init__(self, vg: VGpu, owner: Preemption) -> None:
        backend = vg.backend
        self.owner = owner
        self.gpu = vg.gpu
        self.backend = backend
        self.vgpus = vg.gate.board.vgpus
        info = backend.device_info(vg.gpu)
        self.sm = info.attrs.get(ATTR_MAJOR, 9) * 10 + info.attrs.get(ATTR_MINOR, 0)
        self.sms = info.attrs.get(ATTR_SMS, 1)
        self.address = backend.mem_alloc(4 * len(WORD))
        backend.memcpy_htod(self.address, bytes(4 * len(WORD)), 4 * len(WORD), None)
        self.stream = backend.stream_create(1, backend.stream_priority_range()[1])
        self.reads = backend.stream_create(1, 0)  # tallies are read here, not behind raises
        self.chaos_raises = 0
        self.session_raises = 0  # sessions' own words raised (Controls.preempt)
        # sessions preempted not yet seen to have left the GPU: id -> (the session, its
        # preemption, an event behind the raise of its word)
        self.draining: dict[int, tuple[Session, SessionPreemption, Any]] = {}
        self._random = random.Random()
        native = getattr(backend, "native_word_functions", lambda: None)()
        self._callback: Any = None
        if native:
            write = ffi.cast("pilot_write_word_fn", native[3])
            raw = _native_stream(self.stream)
        else:  # the sim: the write comes back to the backend
            self._callback = ffi.callback("pilot_write_word_fn", self._sim_write)
            write, raw = self._callback, 1
        self.ptr = lib.pilot_preempt_new(write, raw, self.address, len(WORD))
        if self.ptr == ffi.NULL:
            raise MemoryError("pilot_preempt_new")
        self._armed: dict[int, int] = {}  # vGPU index -> the words its sessions need armed
        # held while the helper queries raising sessions' streams, and by a vGPU thread while
        # it destroys one of their streams or stops a session raising (streams_going). Never
        # across a call that waits for the GPU: the helper must stay free to lower the words
        # that GPU work may be waiting for
        self.guard = threading.Lock()
        # held while a tally is read (a copy that returns once the data is there, which may
        # queue behind a stream that waits for a word) and while a session's slots are freed
        self.tally_lock = threading.Lock()
        self._cond = threading.Condition()
        self._stop = False
        self.forced = 0  # words lowered after MAX_RAISE_S with the higher class still busy
        self._warned = 0.0  # when a failed lowering was last logged
        self._reasserted = 0.0  # when the words not raised were last written 0 again
        self._folded = 0.0  # when the tallies were last read
        self._raised_since = 0.0
        self._thread = NamedThread(target=self._run, name=f"preempt-{vg.gpu}", daemon=True)
        self._thread.start()
        # the tallies are read on a thread of their own: a read may wait behind a stream that
        # waits for a word (a shared hardware queue), which the helper must stay free to lower
        self._fold_wanted = threading.Event()
        self._folder = NamedThread(target=self._run_folds, name=f"preempt-fold-{vg.gpu}", daemon=True)
        self._folder.start()

    @classmethod
    def unusable(cls, gpu: int) -> GpuWords:
        words = cls.__new__(cls)
        words.gpu, words.ptr = gpu, ffi.NULL
        return words

    def _sim_write(self, stream: int, address: int, value: int, flags: int) -> int:
        try:
            self.backend.stream_write_word(self.stream, address, value)
        except BackendError as exc:
            return exc.code or 999
        return 0

    def word(self, level: int) -> int:
        return self.address + 4 * WORD[level]

    def arm(self, vgpu: int, words: int) -> None:
        """vGPU `vgpu`'s sessions need these words armed (0: none); the GPU's is the union."""
        if self._armed.get(vgpu, 0) == words:
            return
        with self._cond:
            self._armed[vgpu] = words
            union = 0
            for w in self._armed.values():
                union |= w
            lib.pilot_preempt_arm(self.ptr, union)
            self._cond.notify()

    def _run(self) -> None:
        try:
            self.backend.bind_thread(self.gpu)
        except BackendError:
            log.exception("preempt-%d: cannot bind to the GPU", self.gpu)
        if self.owner.chaos > 0:
            self._run_chaos(self.owner.chaos)
            return
        while True:
            with self._cond:
                if self._stop:
                    return
                raised = lib.pilot_preempt_raised(self.ptr)
                armed = lib.pilot_preempt_armed(self.ptr)
                self._cond.wait(self._drain_poll() if self.draining else CLEAR_MS / 1000 if raised
                                else ARMED_MS / 1000 if armed else IDLE_S)
                if self._stop:
                    return
            if self.draining:
                self.poll_drains()
            if not lib.pilot_preempt_raised(self.ptr):
                self._raised_since = 0.0
                now = time.monotonic()
                if lib.pilot_preempt_armed(self.ptr) and now - self._reasserted > REASSERT_S:
                    # a kernel of the shared context can write any device memory, these words
                    # too: one raised behind pilotd's back would park a class for good
                    self._reasserted = now
                    lib.pilot_preempt_reassert(self.ptr)
                continue
            now = time.monotonic()
            self._raised_since = self._raised_since or now
            try:
                if self.clear_if_idle(force=now - self._raised_since > MAX_RAISE_S):
                    self._raised_since = 0.0
                    self._fold_wanted.set()
            except Exception:  # the words must keep coming down: log, look again
                log.exception("preempt-%d: lowering the retreat words failed", self.gpu)

    def counts(self) -> tuple[int, int, int]:
        """Raises (a word already up is not raised again), clears, and writes the driver
        refused, on this GPU so far."""
        counts = ffi.new("uint64_t[3]")
        lib.pilot_preempt_counts(self.ptr, counts, counts + 1, counts + 2)
        return int(counts[0]), int(counts[1]), int(counts[2])

    def raises(self) -> int:
        """Words raised so far, the sessions' own included (a timing that saw one is void)."""
        return self.counts()[0] + self.session_raises

    def watch_drain(self, s: Session, p: SessionPreemption, raised: Any) -> None:
        """Look at s's launches until it has left the GPU (the helper, every CLEAR_MS);
        `raised`: an event recorded behind the word's raise."""
        with self._cond:
            self.draining[s.id] = (s, p, raised)
            self._cond.notify()

    def _drain_poll(self) -> float:
        """Seconds until the next look at the sessions draining (DRAIN_MS)."""
        oldest = min((p.requested_at for _s, p, _e in list(self.draining.values())), default=0.0)
        since = time.monotonic() - oldest
        return min(CLEAR_MS / 1000, max(DRAIN_MS / 1000, since / 10))

    def poll_drains(self) -> None:
        """The preempted sessions that have left the GPU now (frontier): drained."""
        backend = self.backend
        with self.guard:  # no session's events are destroyed meanwhile (VGpuPreemption.forget)
            for sid, entry in list(self.draining.items()):
                s, p, raised = entry
                if s.preemption is p:
                    if not event_done(backend, raised):  # the word is up on the GPU first
                        continue
                    state = s.preempt
                    if state is not None and state.slots and not frontier(backend, state)[0]:
                        continue
                    self.owner.drained(p)
                with self._cond:  # drained, or resumed (or ended) first; a new preemption of
                    if self.draining.get(sid) is entry:  # the session since stays watched
                        del self.draining[sid]
                with contextlib.suppress(BackendError):
                    backend.event_destroy(raised)

    def raise_now(self) -> None:
        """Raise every armed word now, as a higher class's launch would ([priority]
        preempt_chaos); the helper lowers them."""
        lib.pilot_preempt_enter(self.ptr, ALL_WORDS)
        lib.pilot_preempt_leave(self.ptr)
        self.chaos_raises += 1

    def _pause(self, seconds: float) -> bool:
        """Sleep, or less when the daemon stops (True then)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._stop, seconds)

    def _run_chaos(self, mean: float) -> None:
        """[priority] preempt_chaos: raise every armed word after a random gap (exponential, of
        mean `mean`), hold it up to `mean`, lower it; a higher class's own raises come down here
        too, once its sessions are idle."""
        log.warning("preempt-%d: raising the retreat words at random (mean gap %g s)", self.gpu, mean)
        while not self._pause(self._random.expovariate(1 / mean)):
            try:
                if lib.pilot_preempt_armed(self.ptr):
                    self.raise_now()
                    if self._pause(self._random.uniform(0, mean)):
                        return
                start = time.monotonic()
                while lib.pilot_preempt_raised(self.ptr):
                    if self.clear_if_idle(force=time.monotonic() - start > MAX_RAISE_S):
                        break
                    if self._pause(CLEAR_MS / 1000):
                        return
                self._fold_wanted.set()
            except Exception:
                log.exception("preempt-%d: a random raise failed", self.gpu)

    def _run_folds(self) -> None:
        """The fold thread: the tallies read after words came down (at most every FOLD_S)."""
        try:
            self.backend.bind_thread(self.gpu)
        except BackendError:
            log.exception("preempt-fold-%d: cannot bind to the GPU", self.gpu)
        while not self._stop:
            if not self._fold_wanted.wait(IDLE_S):
                continue
            self._fold_wanted.clear()
            try:
                self.fold(every=FOLD_S)
            except Exception:
                log.exception("preempt-fold-%d: reading the tallies failed", self.gpu)

    def fold(self, every: float = 0.0) -> None:
        """Read the tallies of the sessions on this GPU that launched variants (at most once
        per `every` seconds) into the daemon's counts."""
        now = time.monotonic()
        if now - self._folded < every:
            return
        self._folded = now
        with self.tally_lock:  # no session's slots are freed meanwhile (VGpuPreemption.forget)
            for vg in list(self.vgpus):
                if vg.gpu != self.gpu:
                    continue
                for s in list(vg.sessions.values()):
                    state = s.preempt
                    if state is not None and state.used and state.slots:
                        read_tally(self.backend, self.owner, s, state, self.reads)

    def clear_if_idle(self, force: bool = False) -> bool:
        """Lower each raised word whose preempting sessions (those of a class above the word's)
        have no work on the GPU, or every word (`force`: raised past MAX_RAISE_S, so a lower
        class is never parked for good). True: every raised word lowered."""
        seen = lib.pilot_preempt_seen(self.ptr)
        if seen == SEEN_BUSY:
            return False  # a raising launch is on its way
        raised = lib.pilot_preempt_raised(self.ptr)
        if force:
            self.forced += 1
            return lib.pilot_preempt_clear(self.ptr, seen, raised) == 1
        busy = -1  # the highest class with work on the GPU among raising sessions
        query = self.backend.stream_query
        with self.guard:  # no raising session's stream is destroyed meanwhile
            for vg in list(self.vgpus):
                if vg.gpu != self.gpu:
                    continue
                for s in list(vg.sessions.values()):
                    if not s.preempt_raises or s.priority <= busy:
                        continue
                    for stream in [s.legacy] + [st.obj for st in list(s.streams.values())]:
                        if stream is None:
                            continue
                        try:
                            if not query(stream):
                                busy = s.priority
                                break
                        except BackendError:
                            continue  # a failed stream has nothing running
        # a word of victim class c stays up while a session above c is busy
        lowerable = 0
        for level, bit in WORD.items():
            if raised & (1 << bit) and busy <= level:
                lowerable |= 1 << bit
        if not lowerable:
            return False
        rc = lib.pilot_preempt_clear(self.ptr, seen, lowerable)
        now = time.monotonic()
        if rc < 0 and now - self._warned > 5:  # a GPU fault fails every write until the re-exec
            self._warned = now
            log.warning("preempt-%d: a retreat word could not be lowered; trying again", self.gpu)
        return rc == 1 and lowerable == raised

    def lower(self) -> None:
        if self.ptr == ffi.NULL:
            return
        lib.pilot_preempt_arm(self.ptr, 0)
        try:
            self.backend.bind_thread(self.gpu)  # the caller's thread writes the words
        except BackendError:
            pass
        for _ in range(100):
            seen = lib.pilot_preempt_seen(self.ptr)
            if seen != SEEN_BUSY and lib.pilot_preempt_clear(self.ptr, seen, ALL_WORDS) == 1:
                return
            time.sleep(0.001)
        log.error("preempt-%d: the retreat words could not be lowered", self.gpu)

    def describe(self) -> dict[str, Any]:
        if self.ptr == ffi.NULL:
            return {"usable": False}
        counts = self.counts()
        return {"usable": True, "armed": lib.pilot_preempt_armed(self.ptr),
                "raised": lib.pilot_preempt_raised(self.ptr), "raises": counts[0],
                "clears": counts[1], "failed_writes": counts[2], "forced_clears": self.forced,
                "chaos_raises": self.chaos_raises}

    def close(self) -> None:
        if self.ptr == ffi.NULL:
            return
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._fold_wanted.set()
        self._thread.join(1)
        self._folder.join(1)
        lib.pilot_preempt_free(self.ptr)
        self.ptr = ffi.NULL
        with contextlib.suppress(BackendError):
            self.backend.stream_destroy(self.reads)


class VGpuPreemption:
    """A vGPU's side: which of its sessions raise, their variants, and gated launches."""

    def __init__(self, vg: VGpu, daemon: Preemption) -> None:
        self.vg = vg
        self.daemon = daemon

    def raises(self, s: Session) -> int:
        """The words s's launches raise now (0: none)."""
        if not self.vg.gate.board.enabled or s.partition is not None:
            return 0
        return RAISES.get(s.priority, 0)

    def update(self, s: Session, fast: Any) -> None:
        """s's class or placement may have changed: what it raises, in C too."""
        mask = self.raises(s)
        if mask == s.preempt_raises:
            return
        words = self.daemon.gpu_words(self.vg) if mask else None
        if mask and words is None:
            mask = 0
        with self.streams_going(s):  # the helper may be looking at its streams
            s.preempt_raises = mask
        if fast is not None:
            self.tell_fast(s, fast)

    def tell_fast(self, s: Session, fast: Any) -> None:
        """C's fast path raises for s as Python does (a connection C does not know yet is told
        when C meets it: FastLaunches.update)."""
        words = self.daemon.gpu_words(self.vg) if s.preempt_raises else None
        if s.identity is not None:
            lib.pilot_fast_raises(fast.ptr, s.identity, words.ptr if words is not None else ffi.NULL,
                                  s.preempt_raises if words is not None else 0)

    def enter(self, s: Session) -> Any:
        """Around a call of a raising session that puts kernels on the GPU (Python's path)."""
        words = self.daemon.gpu_words(self.vg)
        if words is None:
            return None
        lib.pilot_preempt_enter(words.ptr, s.preempt_raises)
        return words

    def module_loaded(self, s: Session, handle: int, image: bytes) -> None:
        """Keep the image of a module of a session that may be gated (its class is below high)
        or preempted by the policy (Policy.preempts_kernels), up to KEEP_IMAGE_BYTES: a
        framework's fatbins of hundreds of MiB are not kept twice. For one that may be gated,
        have its variants made now, in the background, so that they are ready when it is first
        gated (a short program is otherwise done before they are). For a policy's, at its first
        launch made preemptible: the rewrite holds pilotd's GIL for a while, which a program
        never preempted should not pay."""
        gated = self.vg.gate.board.enabled and s.priority < HIGH
        if (gated or self.daemon.for_policy) and len(image) <= KEEP_IMAGE_BYTES:
            state = self._state(s)
            kept = state.images[handle] = (image, image_digest(image))
            words = self.daemon.gpu_words(self.vg) if gated else None
            if words is not None:
                self.daemon.variants(kept[0], words.sm, kept[1], state.loops)

    def module_unloaded(self, s: Session, handle: int) -> None:
        """The program unloaded a module (its work finished first): its variants go too."""
        state = s.preempt
        if state is None:
            return
        state.images.pop(handle, None)
        state.made.pop(handle, None)
        for key in [k for k in state.functions if k[0] == handle]:
            del state.functions[key]
        loaded = state.modules.pop(handle, None)
        if loaded is not None:
            self.vg.backend.module_unload(loaded[0])
            self.vg.broker.release(s, "module", loaded[1])

    def _state(self, s: Session) -> SessionVariants:
        if s.preempt is None:
            s.preempt = SessionVariants(loops=self.daemon.loops(s))
        return s.preempt

    def variant(self, s: Session, info: FunctionInfo, block: tuple[int, int, int],
                shared: int) -> tuple[Any, int, bool] | None:
        """s's function's variant, its resident grid and whether it is the loop-level one, or
        None (not (yet) preemptible)."""
        state = s.preempt
        if state is None:
            return None
        handle = info.module_handle
        key = _function_key(info, block, shared)
        if key in state.functions:
            return state.functions[key]
        kept = state.images.get(handle)
        words = self.daemon.gpu_words(self.vg)
        if kept is None or words is None:
            state.functions[key] = None
            return None
        # under chaos a session's first launch of a module waits for its variants, once
        wait = self.daemon.chaos > 0 and handle not in state.waited
        state.waited.add(handle)
        made = self.daemon.variants(kept[0], words.sm, kept[1], state.loops, wait=wait)
        if made is None:
            if wait:
                log.warning("session %d: the variants of module %#x were not ready after %g s; "
                            "its originals run meanwhile", s.id, handle, JIT_WAIT_S)
            return None  # being made: the original meanwhile, asked again next time
        found: tuple[Any, int, bool] | None = None
        rewrite = made.kernels.get(info.name)
        # past 48 KiB of dynamic shared memory a kernel needs an attribute the program set on
        # the original function only: such launches keep the original
        if made.ready and rewrite is not None and rewrite.variant is not None and shared <= 48 << 10:
            module = self._module(s, state, handle, made)
            if module is not None:
                loop = state.loops and rewrite.loop is not None
                try:
                    fn = self.vg.backend.function_get(module, rewrite.loop if loop else rewrite.variant)
                    per_sm = self.vg.backend.occupancy(fn.handle, math.prod(block), shared, 0)
                except BackendError as exc:  # e.g. the variant's registers do not fit the block
                    log.info("session %d: %s has no usable variant: %s", s.id, info.name, exc)
                    per_sm = 0
                if per_sm > 0:
                    found = (fn, per_sm * words.sms, loop)
                    state.made[handle] = made
        state.functions[key] = found
        return found

    def _module(self, s: Session, state: SessionVariants, handle: int,
                made: ModuleVariants) -> Any:
        loaded = state.modules.get(handle)
        if loaded is not None:
            return loaded[0]
        backend = self.vg.backend
        try:
            module = backend.module_load(made.image)
        except BackendError as exc:
            log.warning("session %d: variants not loaded: %s", s.id, exc)
            state.images.pop(handle, None)
            return None
        charge = len(made.image)
        try:
            self.vg.broker.allocate(s, "module", charge, lambda: module, ptr_of=lambda _m: 0)
        except BackendError:
            backend.module_unload(module)
            state.images.pop(handle, None)
            return None
        state.modules[handle] = (module, charge)
        return module

    def launch(self, s: Session, info: FunctionInfo, grid: tuple[int, int, int],
               block: tuple[int, int, int], shared: int, stream: Any, args: bytes) -> bool:
        """A gated session's launch as steps 1-4 (module docstring), or the original when it was
        chosen for this kernel (preempt_choice.py) and is being measured; False: the caller
        launches the original (also while pilotd captures a graph: a variant's slot and events
        belong to one launch, not to every replay of a graph)."""
        if s.partition is not None or self.vg.capturing:
            return False
        class_word = s.gated and s.priority in WORD
        if not (class_word or s.preemptible):
            return False
        found = self.variant(s, info, block, shared)
        words = self.daemon.gpu_words(self.vg)
        if found is None or words is None:
            return False
        fn, resident, loop = found
        state = s.preempt
        assert state is not None
        total = grid[0] * grid[1] * grid[2]
        chunk = self.daemon.chunk
        choice = None
        if self.daemon.measures:
            self._collect(state, words)
            made = state.made.get(info.module_handle)
            choice = made.choice(pc.key(info.name, math.prod(block), shared, total)) if made else None
            if choice is not None:
                choice.expire()
                if choice.decided == pc.ORIGINAL:
                    return False
                if choice.decided is not None:
                    chunk = choice.decided
                elif len(state.timings) < MAX_TIMINGS and s.preemption is None and not (
                        class_word and lib.pilot_preempt_raised(words.ptr) & (1 << WORD[s.priority])):
                    chunk = choice.next()  # measured: the words are down as it is queued
                else:
                    choice = None  # not measured now: the fallback chunk, preemptible
        timing = self._start_timing(state, words, choice, chunk, stream) if choice is not None else None
        if chunk == pc.ORIGINAL:
            self.vg.backend.launch(info.handle, grid, block, shared, stream, args)
        elif not self._launch_variant(s, state, words, info, fn, min(total, resident), grid, block,
                                      shared, stream, args, chunk, class_word, loop):
            if timing is not None:  # nothing of it is on the stream
                state.spare += [timing.start, timing.end]
            return False
        if timing is not None:
            self._end_timing(state, timing, stream)
        return True

    def _launch_variant(self, s: Session, state: SessionVariants, words: GpuWords, info: FunctionInfo,
                        fn: Any, blocks: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                        shared: int, stream: Any, args: bytes, chunk: int, class_word: bool,
                        loop: bool = False) -> bool:
        """Steps 1-4 (module docstring). The first part reads its class's word (a gated
        session's) and the session's own (one a policy made preemptible, or preempts), or the
        session's alone; the rest waits for each to be 0. loop: fn is a loop-level variant,
        whose first part may leave blocks on the slot's redo list for the rest."""
        backend = self.vg.backend
        try:
            slot = self._free_slot(s, state)
        except BackendError as exc:  # no device memory for the counters: the original
            log.warning("session %d: no counters for preemptible launches: %s", s.id, exc)
            return False
        if slot < 0:
            return False  # every counter is in use by a launch still running: the original
        redo = 0
        if loop:
            try:
                redo = self._redo_list(state, words, slot)
            except BackendError as exc:  # no memory for the lists: the original
                log.warning("session %d: no redo lists for loop-level variants: %s", s.id, exc)
                return False
            blocks = min(blocks, state.redo_blocks)
        counter = state.slot(slot)
        own = state.word if s.preemptible or s.preemption is not None else 0
        if class_word and not state.used:
            state.used = True
            self.arm()
        elif not state.used and own:
            state.used = True  # its tally is read like a gated session's
        flag, sflag = (words.word(s.priority), own) if class_word else (own, 0)
        # a launch the policy's preemptions watch, or one that may abandon blocks to a redo
        # list (which holds one part's), has one preemptible part (frontier() watches the
        # first part's end; the list holds one entry per block of a part)
        watched = s.preemptible
        blocks, chunk, parts, cold = self.daemon.shape(blocks, chunk, chained=not (watched or redo))
        if redo:  # one block per claim (ptx_preempt.CLAIM); the list empty before the first part
            chunk = 1
            backend.stream_write_word(stream, redo, 0)
            backend.stream_write_word(stream, redo + 4, 0)
        if self.daemon.chaos and self.daemon.draw():
            words.raise_now()  # [priority] preempt_chaos: this launch is cut after its first wave,
            # or before it starts (cold)
        # preempted already (a policy let it launch): not even a first wave runs now
        first = 0 if s.preemption is not None or cold else blocks
        backend.stream_write_word(stream, counter, first)
        try:
            backend.launch(fn.handle, (blocks, 1, 1), block, shared, stream,
                           pp.variant_args(args, pp.variant_params(grid, counter, flag, chunk, first,
                                                                   state.slots, sflag, redo)))
        except BackendError as exc:  # nothing of it is on the stream: the original instead
            log.warning("session %d: %s's variant refused (%s); the original runs", s.id, info.name, exc)
            state.functions[_function_key(info, block, shared)] = None
            return False
        state.cut_recorded.discard(slot)
        if watched:
            try:  # done: none of its blocks is on the GPU any more until the rest
                backend.event_record(state.cuts[slot], stream)
            except BackendError:
                watched = False
        for part in range(1, parts + 1):
            for word in (flag, sflag):
                if not word:
                    continue
                try:
                    backend.stream_wait_word(stream, word, 0)
                except BackendError as exc:  # the next part then runs at once, behind this one
                    log.warning("session %d: no wait on a retreat word: %s", s.id, exc)
            if watched:
                try:  # done: the stream went past the words, the rest runs
                    backend.event_record(state.passes[slot], stream)
                    state.streams[slot], state.order[slot] = stream, state.launches
                    state.cut_recorded.add(slot)
                except BackendError:
                    pass
            last = part == parts  # the last part has no word: it runs all that is left
            backend.launch(fn.handle, (blocks, 1, 1), block, shared, stream, pp.variant_args(
                args, pp.variant_params(grid, counter, 0 if last else flag, chunk, 0, state.slots,
                                        0 if last else sflag, redo, part)))
        try:  # the counter is free again once this has passed
            backend.event_record(state.events[slot], stream)
        except BackendError:
            state.dead.add(slot)  # never reused (a stream in error)
        state.launches += 1
        self.vg.metrics.count("preemptible_launches", (s.tenant,))
        return True

    def _start_timing(self, state: SessionVariants, words: GpuWords, choice: pc.Choice,
                      candidate: int, stream: Any) -> pc.Timing | None:
        backend = self.vg.backend
        try:
            while len(state.spare) < 2:
                state.spare.append(backend.event_create(0))
            start, end = state.spare.pop(), state.spare.pop()
            backend.event_record(start, stream)
        except BackendError:
            return None  # not measured; the launch goes on
        return pc.Timing(choice, candidate, start, end, words.raises())

    def _end_timing(self, state: SessionVariants, timing: pc.Timing, stream: Any) -> None:
        try:
            self.vg.backend.event_record(timing.end, stream)
        except BackendError:
            state.spare += [timing.start, timing.end]
            return
        state.timings.append(timing)

    def _collect(self, state: SessionVariants, words: GpuWords) -> None:
        """The measured launches seen done give their times (if no word went up meanwhile)."""
        if not state.timings:
            return
        backend = self.vg.backend
        raises = words.raises()
        waiting = []
        for t in state.timings:
            try:
                if not backend.event_query(t.end):
                    waiting.append(t)
                    continue
                if raises == t.raises:
                    t.choice.add(t.candidate, backend.event_elapsed_ms(t.start, t.end) / 1e3)
            except BackendError:
                pass  # a failed launch measures nothing
            state.spare += [t.start, t.end]
        state.timings = waiting

    def _free_slot(self, s: Session, state: SessionVariants) -> int:
        """A counter no launch still running uses (an event recorded behind each launch's rest
        says so; the gate bounds the pieces in flight, but a launch a policy made wait and
        replays is not counted there), or -1."""
        backend = self.vg.backend
        if not state.slots:
            nslots = max(SLOTS, self.vg.gate.board.inflight + 2)
            size = HEADER_BYTES + pp.SLOT_BYTES * nslots
            slots = backend.mem_alloc(size)
            events = [backend.event_create(EVENT_DISABLE_TIMING) for _ in range(3 * nslots)]
            header = bytearray(size)  # the tally and the slots' readings start at 0
            with self._helper_guard():  # a policy's preempt or resume of s sees one state
                p = s.preemption
                header[WORD_AT] = 1 if p is not None else 0  # preempted before it had a word
                try:
                    backend.memcpy_htod(slots, bytes(header), size, None)
                except BackendError:
                    backend.mem_free(slots)
                    for ev in events:
                        backend.event_destroy(ev)
                    raise
                state.slots, state.nslots = slots, nslots
                state.events, state.cuts = events[:nslots], events[nslots:2 * nslots]
                state.passes = events[2 * nslots:]
                state.streams, state.order = [None] * nslots, [0] * nslots
                if p is not None:
                    p.raised = True  # resume lowers it
        for step in range(state.nslots):
            slot = (state.next_slot + step) % state.nslots
            if slot in state.dead:
                continue
            if event_done(backend, state.events[slot]):
                state.next_slot = slot + 1
                return slot
        return -1

    def _redo_list(self, state: SessionVariants, words: GpuWords, slot: int) -> int:
        """Slot's redo list, the lists made at the session's first loop-level launch: one per
        slot, for as many persistent blocks as the GPU holds at most (REDO_BLOCKS_PER_SM a
        multiprocessor: a launch's grid is cut to it)."""
        if not state.redo:
            blocks = REDO_BLOCKS_PER_SM * words.sms
            state.redo = self.vg.backend.mem_alloc(pp.redo_bytes(blocks) * state.nslots)
            state.redo_blocks = blocks
        return state.redo_list(slot)

    def arm(self) -> None:
        """The words this vGPU's gated sessions that launched variants need armed."""
        words = self.daemon.gpu_words(self.vg)
        if words is None:
            return
        need = 0
        for s in list(self.vg.sessions.values()):
            if s.gated and s.preempt is not None and s.preempt.used and s.priority in WORD:
                need |= 1 << WORD[s.priority]
        words.arm(self.vg.index, need)

    def streams_going(self, s: Session) -> Any:
        """Held while a stream of s is destroyed, or s stops raising: the GPU's helper does not
        query s's streams meanwhile."""
        return self._helper_guard() if s.preempt_raises else contextlib.nullcontext()

    def _made_words(self) -> GpuWords | None:
        """This GPU's words if they were made and are usable (unlike Preemption.gpu_words,
        which makes them)."""
        words = self.daemon._gpus.get(self.vg.gpu)
        return words if words is not None and words.ptr != ffi.NULL else None

    def _helper_guard(self) -> Any:
        """The lock the GPU's helper holds while it looks at sessions (a no-op without one)."""
        words = self._made_words()
        return words.guard if words is not None else contextlib.nullcontext()

    def session_ends(self, s: Session) -> None:
        """Before its streams go: s raises no more (the helper stops looking at them), and its
        own word comes down (its work is synchronized next: no rest may stay waiting)."""
        with self.streams_going(s):
            s.preempt_raises = 0
        if s.preemption is not None:
            self.resume(s)

    # ---- a policy's preemption (Controls.preemptible / preempt / resume) ----
    def preempt(self, s: Session, requested_at: float) -> SessionPreemption:
        """Raise s's own word: its preemptible launches on the GPU retreat at their next claim
        (the blocks running finish their logical blocks), their rests wait on their streams,
        and so does what the program queued behind them. The cut launches are watched until
        done (SessionPreemption.drained_at). Called on the policy's scheduler thread."""
        found = s.preemption
        if found is not None:
            return found
        p = SessionPreemption(requested_at)
        s.preemption = p  # from here its launches start without a first wave
        words = self._made_words()
        if words is None:
            self.daemon.drained(p)  # nothing of it can be on the GPU preemptible
            return p
        backend = self.vg.backend
        with words.guard:
            state = s.preempt
            if state is None or not state.slots:  # its first slots will start raised
                self.daemon.drained(p)
                return p
            backend.bind_thread(self.vg.gpu)
            backend.stream_write_word(words.stream, state.word, 1)
            p.raised = True
            words.session_raises += 1
            raised = backend.event_create(EVENT_DISABLE_TIMING)
            backend.event_record(raised, words.stream)
            _drained, p.waiting, p.inflight = frontier(backend, state)
        p.cut = len(p.waiting)
        words.watch_drain(s, p, raised)
        return p

    def resume(self, s: Session, stream: Any = None) -> None:
        """Lower s's own word (on `stream`, e.g. behind the moves that bring its memory back,
        else on the words' stream): its rests run, then what waited behind them."""
        words = self._made_words()
        with self._helper_guard():
            p, s.preemption = s.preemption, None
            state = s.preempt
            if p is None or not p.raised or state is None or not state.slots or words is None:
                return
            backend = self.vg.backend
            try:
                backend.bind_thread(self.vg.gpu)
                backend.stream_write_word(stream if stream is not None else words.stream, state.word, 0)
            except BackendError as exc:  # a GPU fault: the session's streams fail anyway
                log.warning("session %d: its retreat word could not be lowered: %s", s.id, exc)

    def forget(self, s: Session) -> None:
        """The session ended, its work synchronized: its tally is read a last time, and its
        variants' modules and slots go."""
        state = s.preempt
        if state is None:
            return
        backend = self.vg.backend
        # the fold thread may be reading the tallies; not the helper's guard: the read may wait
        # for the GPU, and the helper must stay free to lower the words it may wait behind
        words = self._made_words()
        lock: Any = contextlib.nullcontext()
        reads = None
        if words is not None:
            lock, reads = words.tally_lock, words.reads
        with lock:
            if state.used and state.slots:
                read_tally(backend, self.daemon, s, state, reads)
                t = state.tallied
                log.info("session %d (%s): %d preemptible launches, %d preemptions, %d blocks deferred, "
                         "%d retreats, %d blocks abandoned", s.id, s.tenant, state.launches, t.preempted,
                         t.deferred, t.retreats, t.abandoned)
            slots, state.slots = state.slots, 0
        for module, charge in state.modules.values():
            try:
                backend.module_unload(module)
            except BackendError:
                pass
            self.vg.broker.release(s, "module", charge)
        for block in (slots, state.redo):
            if block:
                try:
                    backend.mem_free(block)
                except BackendError:
                    pass
        state.redo = 0
        for ev in [*state.events, *state.cuts, *state.passes, *state.spare,
                   *(e for t in state.timings for e in (t.start, t.end))]:
            try:
                backend.event_destroy(ev)
            except BackendError:
                pass
        s.preempt = None


def event_done(backend: Any, event: Any) -> bool:
    """Whether the GPU is past `event` (one whose stream failed counts as past: its work runs
    no more)."""
    try:
        return bool(backend.event_query(event))
    except BackendError:
        return True


def frontier(backend: Any, state: SessionVariants) -> tuple[bool, list[Any], int]:
    """Whether a preempted session has left the GPU, the events that say it will have, and its
    watched launches in flight:
    per stream, its watched launches in flight in their order: one whose first part is not done
    (it runs, or runs its first wave next, then retreats; the rest waits for the word), stop;
    one whose stream went past the words before they were raised (its rest runs to the end:
    its end), go on; one whose rest waits: stop (nothing after it starts). Drained: every
    stream stopped at a rest that waits (or has nothing in flight). Launches not watched (made
    before the session was preemptible, originals, library calls) are not counted."""

    by_stream: dict[int, list[int]] = {}
    for slot in state.cut_recorded.copy():  # the vGPU thread may add one
        if not event_done(backend, state.events[slot]):
            by_stream.setdefault(id(state.streams[slot]), []).append(slot)
    drained, wait = True, []
    for slots in by_stream.values():
        for slot in sorted(slots, key=lambda i: state.order[i]):
            if not event_done(backend, state.cuts[slot]):
                drained = False
                wait.append(state.cuts[slot])
                break
            if not event_done(backend, state.passes[slot]):
                break  # its rest waits for the word
            drained = False
            wait.append(state.events[slot])
    return drained, wait, sum(len(slots) for slots in by_stream.values())


def image_digest(image: bytes) -> str:
    """What identifies a module image among the variants made (SHA-256, hex)."""
    return hashlib.sha256(image).hexdigest()


def read_tally(backend: Any, owner: Preemption, s: Session, state: SessionVariants,
               stream: Any) -> None:
    """Read s's tally from the GPU (on `stream`) into the daemon's counts."""
    buf = bytearray(pp.TALLY_BYTES)
    try:
        backend.memcpy_dtoh(buf, state.slots, pp.TALLY_BYTES, stream)
    except BackendError as exc:  # a GPU fault: the counts stay as they were
        log.info("session %d: its preemption tally could not be read: %s", s.id, exc)
        return
    owner.record(s, state, pp.Tally.parse(bytes(buf)))


def _function_key(info: FunctionInfo, block: tuple[int, int, int],
                  shared: int) -> tuple[int, str, int, int]:
    """What a variant and its resident grid depend on: the kernel, its block size, its dynamic
    shared memory."""
    return info.module_handle, info.name, math.prod(block), shared


def _native_stream(stream: Any) -> int:
    """A cuda-python CUstream's value, the driver's pointer (as vgpu/fast.py reads it)."""
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:
        return int(stream)
    return int(get_cuda_native_handle(stream))
