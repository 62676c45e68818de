"""The policy interface: plain data views in, decisions out. No daemon imports, here or in a policy.

The daemon builds the views from its own state and calls a Policy's events under one lock
(docs/POLICIES.md says when each is called and what the daemon does with each Decision).
Views are frozen and hold only ints, strs, floats and tuples, so a policy may keep them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from . import settings as _settings

ALLOCATION_KINDS = ("device", "pitch", "managed", "module", "limit", "pinned", "array")
"""AllocationView.kind and RangeView.kind: cudaMalloc, cudaMallocPitch/3D, cudaMallocManaged,
a module's globals, what a cudaDeviceSetLimit reserves (stack, printf, heap), pinned host memory,
CUDA arrays (cudaMallocArray/3DArray; `ptr` is the session's handle of the array)."""

DROP_REASONS = ("timeout", "session_end", "refused")
"""Policy.launch_dropped's `why`: `[policy] max_wait` passed, the session ended while the launch
waited, or a later ask answered REFUSE."""


# ---- views ----

@dataclass(frozen=True, slots=True)
class SessionView:
    """One client session (a process's connection); `vgpu` is the vGPU it was placed on."""
    id: int
    tenant: str
    pid: int
    gpu: int
    vgpu: int


class AllocationView(NamedTuple):
    """One allocation made (allocated) or released (freed) by a session; size in bytes. A named
    tuple, not a frozen dataclass like the other views: the daemon builds up to three per
    allocation on its hot path, and a tuple is built in a fifth of the time."""
    session: int
    tenant: str
    gpu: int
    kind: str  # one of ALLOCATION_KINDS
    ptr: int
    size: int
    movable: bool = False  # the daemon can move it between the GPU and host memory (Controls)
    # The kernels (and CUDA graphs) the session had launched when this happened, counted by
    # the daemon whether or not the policy saw them (pilotd's fast path launches in C): a
    # policy that only needs to know whether a session launched between two of its memory
    # events reads this instead of watching launches (Policy.watches_launches).
    launches: int = 0
    # The session's memory of GPU kinds (every kind but pinned) on this GPU as pilotd counts it,
    # every allocation and free included, whether the policy heard of it or not (a policy that
    # asks for quiet (Controls.quiet_memory) learns of the events it did not hear from these):
    # its bytes after this event, its allocations and frees so far (this one included), the
    # most bytes it held since the last event the policy heard and the least it held after a
    # free since then (`live` if none; both with this event). All 0 in views not made by pilotd.
    live: int = 0
    allocations: int = 0
    frees: int = 0
    high: int = 0
    low: int = 0


@dataclass(frozen=True, slots=True)
class RangeView:
    """One allocation a launch's arguments point into (the whole allocation, not the bytes used).
    `movable`: managed memory (or cudaMalloc served as managed, `[gpu] managed_device_memory`)
    that the capacity enforcer tracks and Controls can evict, advise and prefetch."""
    ptr: int
    size: int
    kind: str  # one of ALLOCATION_KINDS
    movable: bool = False


@dataclass(frozen=True, slots=True)
class LaunchView:
    """A kernel launch the daemon asks about. `id` is unique in the daemon's life (KernelView.launch
    refers to it); `footprint` is empty unless the policy sets needs_footprint; `attempts` counts
    the asks, this one included (1 on the first); `requested_at`/`now` are time.monotonic()."""
    id: int
    session: int
    tenant: str
    pid: int
    gpu: int
    vgpu: int
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: int
    footprint: tuple[RangeView, ...]
    requested_at: float
    now: float
    attempts: int

    @property
    def footprint_bytes(self) -> int:
        """Bytes of every allocation the launch points into."""
        return sum(r.size for r in self.footprint)

    @property
    def managed_bytes(self) -> int:
        """Bytes of the managed allocations the launch points into."""
        return sum(r.size for r in self.footprint if r.kind == "managed")

    @property
    def movable_bytes(self) -> int:
        """Bytes of the movable allocations (RangeView.movable) the launch points into."""
        return sum(r.size for r in self.footprint if r.movable)

    @property
    def waited_s(self) -> float:
        """Seconds since the launch was requested."""
        return self.now - self.requested_at


@dataclass(frozen=True, slots=True)
class KernelView:
    """A launched kernel that finished (only for a policy with needs_kernel_end); monotonic times."""
    launch: int
    session: int
    tenant: str
    gpu: int
    kernel: str
    started_at: float
    finished_at: float


@dataclass(frozen=True, slots=True)
class PreemptionView:
    """A session's preemption in progress (Controls.preempt .. resume). `cut`: its preemptible
    launches on the GPU when its retreat word went up; `drained_at`: when pilotd saw the last of
    them leave the SMs (None: not yet); monotonic times."""
    session: int
    requested_at: float
    cut: int
    drained_at: float | None
    inflight: int = 0  # its preemptible launches in flight (running or queued) then

    @property
    def latency_s(self) -> float | None:
        """From the request to the last cut launch's blocks leaving, as pilotd observed it."""
        return None if self.drained_at is None else self.drained_at - self.requested_at


@dataclass(frozen=True, slots=True)
class NvmlView:
    """One NVML reading of a GPU (the whole card, every process); bytes and percent."""
    gpu: int
    memory_total: int
    memory_used: int
    utilization_gpu: int | None


@dataclass(frozen=True, slots=True)
class GpuView:
    """A GPU as pilot manages it: its capacity C (`[gpu] capacity`), the bytes of fixed
    allocations granted (device, pitch, module globals, limits: always on the GPU), and, of the
    movable memory, what is allocated and what pilot keeps resident. With `[gpu]
    enforce_capacity` the enforcer keeps used + resident <= capacity at each launch; `room` is
    what movable memory may occupy."""
    gpu: int
    capacity: int
    used: int
    movable: int = 0
    resident: int = 0
    enforced: bool = False

    @property
    def room(self) -> int:
        """Bytes movable memory may keep resident: the capacity less the fixed allocations."""
        return max(0, self.capacity - self.used)


class Controls:
    """What a policy may see and ask beyond its events; the daemon sets `policy.controls` before the
    first event. Requests that move memory are queued and carried out by the daemon's scheduler
    thread, in order, right after the event that made them returns; they never fail the policy (a
    range freed meanwhile is skipped). This base class sees nothing and ignores every request: it is
    what a policy has outside a daemon (and tests record the calls with a subclass)."""

    def gpu(self, gpu: int) -> GpuView:
        """The GPU's capacity, fixed allocations and movable memory, as of now."""
        return GpuView(gpu, 0, 0)

    def capacity(self, gpu: int) -> int:
        """The GPU's capacity C alone (gpu(gpu).capacity without building the whole view: for
        a policy that looks at it at every iteration boundary)."""
        return self.gpu(gpu).capacity

    def resident(self, session: int) -> int:
        """Bytes of the session's movable memory pilot counts on the GPU, as of now."""
        return 0

    def provisioned(self, tenant: str, gpu: int) -> int:
        """Bytes the tenant is guaranteed on the GPU (`pilotctl quota set --provisioned`); 0:
        none. A memory policy keeps that much of the tenant's movable memory on the GPU."""
        return 0

    def set_eviction_order(self, gpu: int, sessions: tuple[int, ...]) -> None:
        """When the capacity enforcer must make room on `gpu`, it evicts idle memory of
        `sessions` in this order (the first loses its memory first), then of sessions not named;
        memory another session's running kernel uses goes last. Takes effect at once (not
        queued); () restores plain least-recently-used order."""

    def evict(self, session: int, keep: tuple[int, ...] = ()) -> None:
        """Move the session's movable memory to host memory, except the allocations whose
        pointers are in `keep` (those a running kernel uses)."""

    def advise_host(self, session: int, ptr: int, size: int) -> None:
        """Keep [ptr, ptr+size) of a movable allocation of the session in host memory: preferred
        location the CPU, accessed by the GPU (kernels read it remotely instead of migrating
        it), and moved there now."""

    def unadvise(self, session: int, ptr: int, size: int, prefetch: bool = True) -> None:
        """Lift advise_host on [ptr, ptr+size), and with `prefetch` move it to the GPU (on the
        H100, unsetting alone leaves the pages on the host)."""

    def quiet_memory(self, session: int, gpu: int, ceiling: int = 0, floor: int = 0,
                     limit: int = 0) -> None:
        """Fewer memory events for a session's part on `gpu`, until called again: an allocation
        of a GPU kind that leaves its bytes (AllocationView.live) at or below `ceiling` is made
        without allocation_requested and without `allocated`, and a free that leaves them above
        `floor` without `freed`, at most `limit` events in a row (the next is heard). The next
        event heard carries what was not (AllocationView.allocations, frees, high, low). Only
        for what the policy would answer RUN to and ignore: the daemon does not ask. `limit` 0
        (the default): every event is heard again. Takes effect at once (not queued)."""

    def hold_session(self, session: int, reason: str) -> None:
        """Hold the session's next call, whatever it is (an allocation, a copy, a launch), and
        every call after it, until release_session: the caller waits for its reply (a deferred
        reply; nothing is killed). Takes effect at once (not queued): called from an event of
        that session (e.g. the `freed` that ends an iteration), the very next call is held."""

    def release_session(self, session: int) -> None:
        """Lift hold_session: the held calls run, in order, at the vGPU's next look (a tick)."""

    def can_preempt(self) -> bool:
        """Whether pilotd can stop a running kernel (`[priority] preempt` on, and the policy
        declares Policy.preempts_kernels). Without it preempt only counts."""
        return False

    def preemptible(self, session: int, on: bool = True) -> None:
        """From the session's next launch on, run its kernels that have a preemptible variant (PTX the
        daemon could rewrite; not library kernels, graphs, cooperative or cluster launches) as that
        variant, so that preempt can cut them; `on` False: as they are again. (Launches pilotd's
        fast path makes in C, for a session the policy does not watch, Policy.watches_launches,
        follow from its next call handled in Python.) A variant costs a few microseconds per launch
        (docs/architecture/priorities.md): make sessions preemptible while a preemption is likely,
        not for good. Takes effect at once (not queued)."""

    def preempt(self, session: int) -> None:
        """Stop the session's preemptible launches running on the GPU: their blocks finish the
        logical blocks they claimed and claim no more; what is left of each (its *rest*) waits
        on its stream, and so does everything the program queued behind it (stream order is
        kept). Launches it makes while preempted wait likewise. Does not hold its calls (answer
        WAIT, or hold_session, for that). The extents its cut kernels use count as idle for the
        capacity enforcer once they have left. Queued; preemption() shows its progress."""

    def resume(self, session: int) -> None:
        """Lift preempt: the rests run (after the memory the enforcer evicted from under them is
        brought back), then what waited behind them. Queued, after any preempt before it."""

    def preemption(self, session: int) -> PreemptionView | None:
        """The session's preemption in progress (None: not preempted, or the request still
        queued)."""
        return None

    def report(self, action: str, tenant: str) -> None:
        """Count a policy action of its own (`hold`, `release`, `throttle`, `unthrottle`) in
        pilot_policy_actions_total{policy,tenant,action}."""


# ---- decisions ----

class Watch(enum.Enum):
    """How much of a session's launches a policy that decides launches must see now
    (Policy.watches_launches)."""
    ALL = "all"    # every launch comes to launch_requested: pilotd's fast path (C) is off for it
    NEXT = "next"  # its next launch does; the calls around it (and after it) may run in C
    NONE = "none"  # C may run its launches, library calls, copies and synchronizations


class Verdict(enum.Enum):
    RUN = "run"        # issue the launch now
    WAIT = "wait"      # defer it; the daemon asks again on later events and ticks
    REFUSE = "refuse"  # fail it with Decision.error


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer to launch_requested. `reason` is logged and shown; `error` is the
    cudaError_t the launch fails with on REFUSE, or when a WAIT outlasts `[policy] max_wait`
    (default 2, cudaErrorMemoryAllocation)."""
    verdict: Verdict
    reason: str = ""
    error: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, Verdict):
            raise TypeError(f"verdict must be a Verdict, not {self.verdict!r}")
        if not isinstance(self.reason, str):
            raise TypeError(f"reason must be a str, not {self.reason!r}")
        if isinstance(self.error, bool) or not isinstance(self.error, int) or self.error <= 0:
            raise ValueError(f"error must be a cudaError_t other than cudaSuccess, not {self.error!r}")

    @classmethod
    def run(cls, reason: str = "") -> Decision:
        return RUN if not reason else cls(Verdict.RUN, reason)

    @classmethod
    def wait(cls, reason: str, error: int = 2) -> Decision:
        return cls(Verdict.WAIT, reason, error)

    @classmethod
    def refuse(cls, reason: str, error: int = 2) -> Decision:
        return cls(Verdict.REFUSE, reason, error)


RUN = Decision(Verdict.RUN)
"""The shared RUN answer: return it on the hot path (no allocation per launch)."""


# ---- the base class ----

class Policy:
    """Base of every policy. Subclass it, set `name` (and `summary`), override the events you need,
    and decorate the class with pilot.policies.register. Every event here is a no-op and
    launch_requested answers RUN, so `Policy` itself behaves as `none`.

    The daemon calls the events one at a time (under one lock) from its vGPU threads and a tick
    thread; keep them cheap and never block. The view arguments are immutable and may be kept.
    """

    name: ClassVar[str] = ""            # registry key: lower case, [a-z0-9][a-z0-9_-]*
    summary: ClassVar[str] = ""         # one line for pilotctl status and the docs
    implemented: ClassVar[bool] = True  # False: a known design name whose code is not there yet
    needs_footprint: ClassVar[bool] = False   # LaunchView.footprint is filled only if True
    needs_kernel_end: ClassVar[bool] = False  # kernel_finished is called only if True
    decides_launches: ClassVar[bool] = False  # launch_requested/started/dropped only if True
    moves_memory: ClassVar[bool] = False      # uses Controls: the daemon tracks movable memory
    # The enforcer moves a launch's movable memory that is not on the GPU onto it before the
    # kernel (bulk copies), instead of the kernel faulting it in while it holds its SMs.
    prefetches_footprint: ClassVar[bool] = False
    # It calls Controls.preemptible / preempt / resume: pilotd keeps the module images of every
    # session for their preemptible variants, whatever its priority class.
    preempts_kernels: ClassVar[bool] = False
    Settings: ClassVar[type | None] = None    # frozen dataclass of knobs ([policy.<name>])

    def __init__(self, settings: Any = None) -> None:
        """`settings`: an instance of Settings, or None for its defaults (PolicyConfigError when
        Settings has required fields)."""
        if settings is None and self.Settings is not None:
            settings = self.parse_settings({})
        self.settings = settings
        self.controls: Controls = Controls()  # the daemon's, set before the first event

    def __repr__(self) -> str:
        return f"<policy {self.name!r} {self.settings!r}>"

    @classmethod
    def parse_settings(cls, table: Mapping[str, Any] | None) -> Any:
        """An instance of Settings from the TOML table `[policy.<name>]`; PolicyConfigError when
        the table is wrong (see pilot.policies.settings)."""
        return _settings.parse_settings(cls, table)

    # -- sessions and memory --

    def session_started(self, s: SessionView) -> None:
        """A session connected and was placed on a vGPU."""

    def session_ended(self, s: SessionView) -> None:
        """A session ended (its allocations were freed first, each with `freed`)."""

    def allocation_requested(self, a: AllocationView) -> Decision:
        """May this allocation be made? Asked before it is charged and made (a.ptr is 0):
        RUN lets it be made; REFUSE fails it as the GPU out of memory would (the allocating call
        returns cudaErrorMemoryAllocation; the reason is logged); WAIT holds the session (as
        Controls.hold_session, no deadline) until the policy calls Controls.release_session,
        and the call is then asked about again. Cheap, and no side effect but bookkeeping."""
        return RUN

    def allocated(self, a: AllocationView) -> None:
        """An allocation succeeded."""

    def freed(self, a: AllocationView) -> None:
        """An allocation was released (by the client, or at session end)."""

    # -- launches (only when decides_launches) --

    def launch_requested(self, l: LaunchView) -> Decision:  # noqa: E741
        """May this launch run now? Called for a new launch and again for a waiting one each time
        the daemon re-evaluates (l.attempts counts). Cheap, and no side effect but bookkeeping."""
        return RUN

    def launch_started(self, l: LaunchView) -> None:  # noqa: E741
        """The launch was issued to the GPU (after RUN)."""

    def launch_dropped(self, l: LaunchView, why: str) -> None:  # noqa: E741
        """A launch that had been answered WAIT ended without running; `why` in DROP_REASONS."""

    def watches_launches(self, session: int) -> Watch:
        """Only for a policy that decides launches: how much of this session's launches must
        come to launch_requested now (Watch). The default, ALL for every session, turns
        pilotd's fast path (C) off for the whole vGPU: every launch, library call, copy and
        synchronization goes through Python. A policy that overrides it lets C serve what it
        does not watch: with NEXT its next launch comes to the policy and the calls before and
        after it run in C; with NONE its launches skip launch_requested/launch_started
        (launches that reach Python anyway, the first of a kernel, still come). pilotd asks
        after each batch of the session's calls that Python handled, so a session must be
        watched more only from one of its own events (its allocation, free or launch): its
        very next call then follows the new answer. A session the policy holds
        (Controls.hold_session) is off the fast path whatever this says. CUDA graphs stay off
        in pilotd under such a policy (a graph is many launches). Cheap, and no side effect."""
        return Watch.ALL

    # -- completion, readings, time --

    def kernel_finished(self, k: KernelView) -> None:
        """A launched kernel finished on the GPU (only when needs_kernel_end)."""

    def nvml_reading(self, r: NvmlView) -> None:
        """A new NVML reading of a GPU (every `[nvml] poll_interval`)."""

    def tick(self, now: float) -> None:
        """Called every 10 ms with time.monotonic(); after it, waiting launches are asked again."""

    def state(self) -> dict[str, Any]:
        """A JSON-able snapshot for pilotctl status."""
        return {}

    def session_status(self, session: int) -> tuple[str, str] | None:
        """What this policy is doing to a session, for pilotctl sessions: (state, why), e.g.
        ("held", "preempted for launch 12") or ("throttled", "1 GiB beyond its budget kept in
        host memory"); None: nothing."""
        return None
