"""Per-tenant GPU allow-lists: the GPUs a tenant's programs may use, whatever their environment says.

A Slurm job's programs can change or unset CUDA_VISIBLE_DEVICES, so the GPUs a job was given are
enforced here, by pilotd: the prolog registers the job's GPUs (`pilotctl job start`, or
`pilotctl gpus set` for any tenant) and every session of the tenant sees those GPUs and no others.

- `GpuAccess` keeps each tenant's list of pilotd GPU numbers in `<state_dir>/gpu_access.json`
  (atomic replace, survives restarts, like quotas.json). A tenant without an entry may use every
  GPU pilotd serves, except a Slurm job's tenant (`slurm:job_<id>` under `[slurm] job_tenants`),
  which gets no GPU until its prolog registered it: a prolog that could not reach pilotd must not
  give its job every GPU of the node (fail closed).
- What a session of an allowed tenant sees is a host with only its allowed GPUs, as CUDA sees a
  host through a device cgroup (Slurm's `ConstrainDevices=yes`): they are renumbered from 0 in
  pilotd's order, CUDA_VISIBLE_DEVICES indices count among them (Slurm sets `0` for a one-GPU
  job under ConstrainDevices), CUDA_DEVICE_ORDER=PCI_BUS_ID ranks them among themselves, and a
  UUID of another GPU selects nothing (`within`).
Reads take no lock (writers swap in a new table), as the router reads it at every HELLO.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pilot.daemon.resources.tenants import _check_tenant, read_state_file, write_json_atomic
from pilot.daemon.sessions.visible import GpuIdentity

log = logging.getLogger("pilot.gpu_access")

ACCESS_FILE = "gpu_access.json"
ACCESS_VERSION = 1


class AccessFileError(ValueError):
    """gpu_access.json cannot be read or is invalid; pilotd does not start without it (starting
    with no allow-lists would give every registered job every GPU)."""


class GpuAccess:
    """Per-tenant allow-lists of pilotd GPU numbers, persisted (see the module docstring)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, ACCESS_FILE)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._allowed: dict[str, tuple[int, ...]] = self._read()

    def allowed(self, tenant: str) -> tuple[int, ...] | None:
        """The GPUs the tenant may use (None: no allow-list of its own)."""
        return self._allowed.get(tenant)

    def set(self, tenant: str, gpus: Sequence[int]) -> None:
        _check_tenant(tenant)
        with self._lock:
            self._commit({**self._allowed, tenant: _check_gpus(gpus)})

    def unset(self, tenant: str) -> bool:
        """Remove the tenant's allow-list; False if it had none."""
        with self._lock:
            if tenant not in self._allowed:
                return False
            self._commit({t: g for t, g in self._allowed.items() if t != tenant})
        return True

    def list(self) -> dict[str, list[int]]:
        return {t: list(g) for t, g in sorted(self._allowed.items())}

    def reload(self) -> None:
        with self._lock:
            self._allowed = self._read()

    def _commit(self, table: dict[str, tuple[int, ...]]) -> None:
        write_json_atomic(self.path, {"version": ACCESS_VERSION,
                                      "tenants": {t: list(g) for t, g in table.items()}})
        self._allowed = table

    def _read(self) -> dict[str, tuple[int, ...]]:
        return read_state_file(self.path, _parse, AccessFileError) or {}


def _check_gpus(gpus: Any) -> tuple[int, ...]:
    """A list of distinct GPU numbers (>= 0), kept sorted; empty means no GPU at all."""
    if not isinstance(gpus, (list, tuple)) or any(
            isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
        raise ValueError(f"an allow-list is a list of GPU numbers, not {gpus!r}")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPU named twice in {list(gpus)}")
    return tuple(sorted(gpus))


def _parse(doc: Any) -> dict[str, tuple[int, ...]]:
    if (not isinstance(doc, dict) or set(doc) != {"version", "tenants"}
            or doc["version"] != ACCESS_VERSION or not isinstance(doc["tenants"], dict)):
        raise ValueError(f'expected {{"version": {ACCESS_VERSION}, "tenants": {{...}}}}')
    return {_check_tenant(t): _check_gpus(g) for t, g in doc["tenants"].items()}


def within(ids: Sequence[GpuIdentity], positions: Sequence[int]) -> list[GpuIdentity]:
    """The identities of the GPUs at `positions` (in pilotd's order) as a host with only them
    would number them: `gpu` their rank (0, 1, ...), `pci_index` their rank in PCI bus order."""
    chosen = [ids[p] for p in positions]
    by_bus = sorted(range(len(chosen)), key=lambda i: (chosen[i].pci_index, i))
    return [replace(g, gpu=i, pci_index=by_bus.index(i)) for i, g in enumerate(chosen)]
