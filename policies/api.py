"""The policy interface: plain data views in, decisions out. No daemon imports, here or in a policy.

The daemon builds the views from its own state and calls a Policy's events under one lock
(docs/POLICIES.md says when each is called and what the daemon does with each Decision).
Views are frozen and hold only ints, strs, floats and tuples, so a policy may keep them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from . import settings as _settings

ALLOCATION_KINDS = ("device", "pitch", "managed", "module", "limit", "pinned")
"""AllocationView.kind and RangeView.kind: cudaMalloc, cudaMallocPitch/3D, cudaMallocManaged,
a module's globals, what a cudaDeviceSetLimit reserves (stack, printf, heap), pinned host memory."""

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


@dataclass(frozen=True, slots=True)
class AllocationView:
    """One allocation made (allocated) or released (freed) by a session; size in bytes."""
    session: int
    tenant: str
    gpu: int
    kind: str  # one of ALLOCATION_KINDS
    ptr: int
    size: int


@dataclass(frozen=True, slots=True)
class RangeView:
    """One allocation a launch's arguments point into (the whole allocation, not the bytes used)."""
    ptr: int
    size: int
    kind: str  # one of ALLOCATION_KINDS


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
class NvmlView:
    """One NVML reading of a GPU (the whole card, every process); bytes and percent."""
    gpu: int
    memory_total: int
    memory_used: int
    utilization_gpu: int | None


@dataclass(frozen=True, slots=True)
class GpuView:
    """What pilot granted on a GPU: its capacity (`[gpu] capacity`) and the bytes allocated."""
    gpu: int
    capacity: int
    used: int


# ---- decisions ----

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
    Settings: ClassVar[type | None] = None    # frozen dataclass of knobs ([policy.<name>])

    def __init__(self, settings: Any = None) -> None:
        """`settings`: an instance of Settings, or None for its defaults (PolicyConfigError when
        Settings has required fields)."""
        if settings is None and self.Settings is not None:
            settings = self.parse_settings({})
        self.settings = settings

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
