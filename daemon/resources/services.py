"""What every vGPU thread shares: tenant quotas, the per-tenant ledger, the per-GPU capacity
budget and the metrics. Each is thread-safe on its own; vGPU threads consult them on every
allocation, so each operation is a dict lookup under a lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pilot.daemon.resources.tenants import Ledger, QuotaStore
from pilot.daemon.telemetry.metrics import Metrics


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

    def reserve(self, gpu: int, nbytes: int) -> bool:
        with self._lock:
            if self._used[gpu] + nbytes > self._capacity[gpu]:
                return False
            self._used[gpu] += nbytes
            return True

    def release(self, gpu: int, nbytes: int) -> None:
        with self._lock:
            self._used[gpu] = max(0, self._used[gpu] - nbytes)


@dataclass
class Services:
    quotas: QuotaStore
    ledger: Ledger
    budget: GpuBudget
    metrics: Metrics
