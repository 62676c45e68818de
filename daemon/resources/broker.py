"""The resource broker: the one path by which a tenant takes GPU or pinned host memory, and the
one path by which it gives it back.

Every allocation path (cudaMalloc, cudaMallocPitch, cudaMallocManaged, CUDA arrays, a module's
globals at each load, a raised cudaDeviceSetLimit heap or stack, pinned and registered host memory) calls
`allocate` (or `charge`) before the backend allocates: the bytes are charged to the tenant's
ledger against its hard quota on that GPU and to the GPU's budget (its configured capacity), or,
for pinned memory, against the per-tenant and daemon-wide pinned limits. A refusal is the CUDA
error a GPU out of memory gives (cudaErrorMemoryAllocation), a log line naming the path, and a
metric (`pilot_allocation_refusals_total{tenant,kind,reason}`).

Provisioned quotas are guarantees: what another tenant is provisioned on a GPU and does not hold
is withheld from a tenant's allocations there (`withheld`), so it stays free for its owner
(refusal reason `provisioned`). pilotctl refuses provisioned quotas that add up to more than a GPU
grants (router/control.py).

What a session holds is kept per kind on the session itself (`Session.charged`), so the end of a
session, however it ends, gives back exactly what is left (`release_all`), except memory other
processes of the tenant still hold through CUDA IPC (resources/ipc.py): its charge is kept
(`keep_for_importers`) until the last of them lets go (`settle`). The policy host hears of every
allocation and free (AllocationView events).

Thread-safe: the ledger and the budgets each take their own lock; vGPU threads call in.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pilot.daemon.backends.base import CUDA_ERROR_MEMORY_ALLOCATION, BackendError
from pilot.daemon.resources.ipc import Charge, IpcRegistry
from pilot.daemon.resources.tenants import GPU_KINDS, HOST, KINDS, Ledger, QuotaStore
from pilot.policies.api import Verdict

if TYPE_CHECKING:
    from pilot.daemon.resources.residency import Residency
    from pilot.daemon.scheduling.policy_host import PolicyHost
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.telemetry.metrics import Metrics

log = logging.getLogger("pilot.broker")


class HoldForPolicy(Exception):
    """The policy answered WAIT to an allocation: nothing was charged or made; the vGPU holds
    the call (and the session's later ones) until the policy releases the session, then serves
    it again (vgpu/dispatch.py)."""
T = TypeVar("T")

# The call each path answers, for log lines.
CALLS = {"device": "cudaMalloc", "pitch": "cudaMallocPitch", "managed": "cudaMallocManaged",
         "module": "module load", "limit": "cudaDeviceSetLimit", "pinned": "cudaHostAlloc/Register",
         "staging": "large pageable copy (staging area)",
         "array": "cudaMallocArray/cudaMalloc3DArray"}


class GpuBudget:
    """Device memory pilot grants per GPU: the configured capacity (a smaller GPU can be
    emulated, or headroom kept) against what all sessions hold."""

    def __init__(self, capacities: dict[int, int]) -> None:
        self._capacity = dict(capacities)
        self._used = dict.fromkeys(capacities, 0)
        self._lock = threading.Lock()

    def capacity(self, gpu: int) -> int:
        return self._capacity[gpu]

    def used(self, gpu: int) -> int:
        return self._used[gpu]

    def reserve(self, gpu: int, nbytes: int, withheld: int = 0) -> bool:
        """Grant nbytes unless that would take the GPU past its capacity less `withheld` (what
        other tenants are guaranteed and have not used)."""
        with self._lock:
            if self._used[gpu] + nbytes + withheld > self._capacity[gpu]:
                return False
            self._used[gpu] += nbytes
            return True

    def release(self, gpu: int, nbytes: int) -> None:
        with self._lock:
            self._used[gpu] = max(0, self._used[gpu] - nbytes)


def default_pinned_limit() -> int:
    """Half the host's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (OSError, ValueError):
        return 1 << 62


# Where a refusal by the managed memory limit says how to raise it (docs/POLICIES.md).
MANAGED_LIMIT_HINT = ("; the limit is [gpu] managed_limit in pilotd's configuration (default: the "
                      "card's memory): raise it to allocate more managed memory than that")


class ResourceBroker:
    """`movable`: the kinds the residency tracker follows (resources/residency.py): "managed",
    and "device" when cudaMalloc is served with managed memory. With `managed_limits` (an
    enforced capacity) they are charged to the tenant's quota as always, but to the GPU's
    managed limit instead of its capacity, since they may exceed it: the capacity then bounds
    what is resident, not what exists."""

    def __init__(self, quotas: QuotaStore, ledger: Ledger, budget: GpuBudget, metrics: Metrics,
                 pinned_limit: int | None = None, pinned_limit_per_tenant: int | None = None,
                 movable: frozenset[str] = frozenset(), managed_limits: dict[int, int] | None = None,
                 pinned_tenant_fraction: float = 0.25) -> None:
        """A tenant's pinned limit is `pinned_limit_per_tenant`, or by default
        `pinned_tenant_fraction` of the daemon-wide pinned limit, so that one tenant cannot take
        the pinned memory every other tenant's cudaMallocHost needs."""
        self.quotas = quotas
        self.ledger = ledger
        self.budget = budget
        self.metrics = metrics
        self.pinned = GpuBudget({HOST: pinned_limit if pinned_limit is not None else default_pinned_limit()})
        if pinned_limit_per_tenant is None and pinned_tenant_fraction < 1:  # 1: no limit of its own
            pinned_limit_per_tenant = int(self.pinned.capacity(HOST) * pinned_tenant_fraction)
        self.pinned_limit_per_tenant = pinned_limit_per_tenant
        self.movable = movable
        self.managed = GpuBudget(managed_limits) if managed_limits is not None else None
        self.policy: PolicyHost | None = None  # set by the Daemon
        self.residency: Residency | None = None  # set by the Daemon: tracks movable memory
        # (tenant, GPU) -> bytes of packed managed ranges (ops/unified.py): part of "managed"
        self._packed: dict[tuple[str, int], int] = {}
        self.ipc = IpcRegistry()  # CUDA IPC exports and grants, across vGPU threads

    def _pool(self, kind: str) -> tuple[GpuBudget, str]:
        if self.managed is not None and kind in self.movable:
            return self.managed, "managed memory limit"
        if kind in GPU_KINDS:
            return self.budget, "GPU capacity"
        return self.pinned, "pinned host memory limit"

    # ---- charging ----
    def charge(self, s: Session, kind: str, nbytes: int, call: str | None = None) -> None:
        """Charge nbytes of `kind` to s's tenant, or raise cudaErrorMemoryAllocation."""
        if kind not in KINDS:
            raise ValueError(f"unknown allocation kind {kind!r}")
        if nbytes <= 0:
            return
        tenant = s.tenant
        if kind in GPU_KINDS:
            gpu, hard = s.device, self.quotas.get(s.tenant, s.device).hard
        else:
            gpu, hard = HOST, self.pinned_limit_per_tenant
        pool, what = self._pool(kind)
        if not self.ledger.reserve(tenant, gpu, nbytes, hard, kind):
            self._refused(s, kind, nbytes, call, "quota",
                          f"{self.ledger.usage(tenant, gpu)} in use, limit {hard}")
        withheld = self.withheld(tenant, gpu) if kind in GPU_KINDS else 0
        if not pool.reserve(gpu, nbytes, withheld):
            self.ledger.release(tenant, gpu, nbytes, kind)
            fits_without = pool.used(gpu) + nbytes <= pool.capacity(gpu)
            self._refused(s, kind, nbytes, call, "provisioned" if fits_without else "capacity",
                          f"{what} {pool.capacity(gpu)}, {pool.used(gpu)} granted"
                          + (f", {withheld} provisioned to other tenants and unused" if withheld else "")
                          + (MANAGED_LIMIT_HINT if pool is self.managed and not fits_without else ""))
        s.charged[kind] = s.charged.get(kind, 0) + nbytes

    def withheld(self, tenant: str, gpu: int) -> int:
        """Bytes other tenants are provisioned on `gpu` and do not hold: not grantable to `tenant`."""
        return sum(max(0, p - self.ledger.usage(t, gpu))
                   for t, p in self.quotas.provisioned_on(gpu).items() if t != tenant)

    def refund(self, s: Session, kind: str, nbytes: int) -> None:
        """Give back nbytes of `kind` that s was charged."""
        charge = self.held_charge(s, kind, nbytes)
        self._uncount(s, charge)
        self.settle(charge)

    def held_charge(self, s: Session, kind: str, nbytes: int) -> Charge:
        """Up to nbytes of what s was charged for `kind`, as a charge of its tenant."""
        nbytes = max(0, min(nbytes, s.charged.get(kind, 0)))
        return Charge(s.tenant, s.device if kind in GPU_KINDS else HOST, kind, nbytes)

    @staticmethod
    def _uncount(s: Session, charge: Charge) -> None:
        """The charge is no longer s's (the tenant's ledger is another matter: `settle`)."""
        left = s.charged.get(charge.kind, 0) - charge.nbytes
        if left > 0:
            s.charged[charge.kind] = left
        else:
            s.charged.pop(charge.kind, None)

    def settle(self, charge: Charge) -> None:
        """The charge ends: the tenant's ledger and the pool give the bytes back."""
        if charge.nbytes <= 0:
            return
        self.ledger.release(charge.tenant, charge.gpu, charge.nbytes, charge.kind)
        self._pool(charge.kind)[0].release(charge.gpu, charge.nbytes)

    def adjust(self, s: Session, kind: str, old: int, new: int, call: str | None = None,
               ptr: int = 0) -> None:
        """A charge of `old` bytes becomes `new` (pitch corrections, a limit raised or lowered);
        the policy hears the difference as allocated or freed."""
        if new > old:
            self._ask_policy(s, kind, new - old, call)
            self.charge(s, kind, new - old, call)
            if self.policy is not None:
                self.policy.allocated(s, kind, ptr, new - old)
        elif old > new:
            self.release(s, kind, old - new, ptr)

    def allocate(self, s: Session, kind: str, nbytes: int, make: Callable[[], T],
                 call: str | None = None, ptr_of: Callable[[T], int] | None = None,
                 span: int = 0) -> T:
        """Charge, then run `make` (the backend's allocation); refund if it fails. The policy
        hears of the allocation, and may refuse it first (Policy.allocation_requested). `span`:
        the address range `make` asks for when larger than `nbytes` (what residency counts on
        the GPU once it is touched)."""
        self._ask_policy(s, kind, nbytes, call)
        self.charge(s, kind, nbytes, call)
        try:
            result = make()
        except BaseException:
            self.refund(s, kind, nbytes)
            raise
        ptr = ptr_of(result) if ptr_of is not None else (result if isinstance(result, int) else 0)
        movable = kind in self.movable and self.residency is not None
        if movable:
            self.residency.track(s, ptr, nbytes, span)  # type: ignore[union-attr]
        if self.policy is not None:
            self.policy.allocated(s, kind, ptr, nbytes, movable)
        return result

    def _ask_policy(self, s: Session, kind: str, nbytes: int, call: str | None) -> None:
        """Refuse (cudaErrorMemoryAllocation, reason "policy") what the policy refuses; raise
        HoldForPolicy when it answers WAIT (the vGPU holds the call and asks again later)."""
        if self.policy is None or nbytes <= 0:
            return
        decision = self.policy.allocation_requested(s, kind, nbytes,
                                                    kind in self.movable and self.residency is not None)
        if decision.verdict is Verdict.WAIT:
            raise HoldForPolicy(decision.reason)
        if decision.verdict is Verdict.REFUSE:
            self._refused(s, kind, nbytes, call, "policy", decision.reason or "refused by the policy")

    def packed_range(self, s: Session, ptr: int, nbytes: int) -> None:
        """The managed allocation at ptr (charged in full) is a range s packs its small managed
        allocations into: reported apart in tenant_usage until it is released."""
        s.packed_ranges.add(ptr)
        key = (s.tenant, s.device)
        self._packed[key] = self._packed.get(key, 0) + nbytes

    def release(self, s: Session, kind: str, nbytes: int, ptr: int = 0) -> None:
        """The allocation is gone: refund it and tell the policy."""
        self.refund(s, kind, nbytes)
        if ptr and ptr in s.packed_ranges:
            s.packed_ranges.discard(ptr)
            key = (s.tenant, s.device)
            left = self._packed.get(key, 0) - nbytes
            if left > 0:
                self._packed[key] = left
            else:
                self._packed.pop(key, None)
        self._gone(s, kind, nbytes, ptr)

    def keep_for_importers(self, s: Session, charge: Charge, ptr: int) -> None:
        """The allocation at ptr leaves s, but other processes that opened it through CUDA IPC
        (resources/ipc.py) still hold its memory: as `release`, except that the tenant stays
        charged (its quota and the GPU's budget) until `settle(charge)` (`charge` from
        `held_charge`)."""
        self._uncount(s, charge)
        self._gone(s, charge.kind, charge.nbytes, ptr)

    def _gone(self, s: Session, kind: str, nbytes: int, ptr: int) -> None:
        """The allocation at ptr is no longer s's: residency stops following it, the policy
        hears of it."""
        movable = kind in self.movable and self.residency is not None and bool(ptr)
        if movable:
            self.residency.untrack(s, ptr)  # type: ignore[union-attr]
        if self.policy is not None and nbytes:
            self.policy.freed(s, kind, ptr, nbytes, movable)

    def release_session(self, s: Session, held: list[tuple[str, int, int]]) -> dict[str, int]:
        """The session ended and its memory is freed: each allocation it held (`held`: kind, ptr,
        size) is released, then what else it was charged (module globals, limits); returns what
        was released, by kind."""
        left = dict(s.charged)
        for kind, ptr, size in held:
            self.release(s, kind, size, ptr)
        for kind, nbytes in list(s.charged.items()):
            self.release(s, kind, nbytes)
        return left

    def _refused(self, s: Session, kind: str, nbytes: int, call: str | None, reason: str,
                 detail: str) -> None:
        self.metrics.count("allocation_refusals", (s.tenant, kind, reason))
        if reason == "quota":
            self.metrics.quota_rejection(s.tenant)
        where = f"GPU {s.device}" if kind in GPU_KINDS else "host"
        log.warning("%s: %s on %s: %d-byte %s refused (%s)", reason, s.tenant, where, nbytes,
                    kind, detail,
                    extra={"session": s.id, "tenant": s.tenant, "call": call or CALLS[kind]})
        raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION, f"{kind} allocation refused: {reason} ({detail})")

    # ---- what a session sees ----
    def memory_limits(self, s: Session, backend_free: int) -> tuple[int, int]:
        """(free, total) as s's cudaMemGetInfo sees them: the GPU's capacity, or the tenant's
        hard quota when smaller, less what is granted and what other tenants are provisioned and
        do not hold; never more than the device has free."""
        gpu = s.device
        cap = self.budget.capacity(gpu)
        free, total = cap - self.budget.used(gpu) - self.withheld(s.tenant, gpu), cap
        if self.residency is not None and self.managed is not None:  # resident pages take room
            free -= self.residency.gpu_numbers(gpu)[1]
        hard = self.quotas.get(s.tenant, gpu).hard
        if hard is not None and hard < cap:
            total = hard
            free = min(free, hard - self.ledger.usage(s.tenant, gpu))
        return max(0, min(free, backend_free)), total

    def tenant_usage(self, tenant: str, gpus: list[int]) -> dict[str, Any]:
        """Per GPU: bytes held and what each path charged (of "managed": `packed_managed`, the
        ranges small managed allocations are packed into, charged in full: the allocations and
        their sessions' slack); and the tenant's pinned bytes."""
        out: dict[str, Any] = {str(g): {"used": self.ledger.usage(tenant, g),
                                        "by_kind": self.ledger.breakdown(tenant, g),
                                        "packed_managed": self._packed.get((tenant, g), 0)}
                               for g in gpus}
        out["host"] = {"used": self.ledger.usage(tenant, HOST),
                       "by_kind": self.ledger.breakdown(tenant, HOST), "limit": self.pinned_limit_per_tenant}
        return out
