"""Per-tenant compute shares: the part of a GPU's SMs a tenant's kernels may run on.

- `ShareStore` keeps each tenant's share per GPU, in percent of the GPU's SMs (`None` = every
  GPU, `"*"` on disk), in `<state_dir>/shares.json`, written like quotas.json (atomic replace,
  survives restarts). A named tenant's `sm_share` in the config file is its default on every
  GPU; what pilotctl sets wins. Reads take no lock (writers swap in a new table).
- `SmPlanner` (one per GPU) turns shares into SM partitions (backend.partition_create: green
  contexts on CUDA). A capped tenant's sessions share one partition of the tenant's own units,
  held while it has a session on the GPU; while any capped tenant holds units, every uncapped
  session started meanwhile runs in a partition of the units no capped tenant holds (plus the
  SMs in no unit), so it "keeps the rest" and never takes the capped tenants' SMs; with no capped
  tenant on the GPU, sessions run on the whole GPU as before. A share becomes
  floor(share x SMs / unit) units, at least one (on an H100: 8-SM units, so 25% is 32 of 132
  SMs, 24.2%). If the live capped tenants' shares add up to more units than there are, a tenant
  is given the least-used units, sharing them.

Why partitions and not MPS's execution affinity: MPS caps need an MPS server and a client per
process, and pilotd is one process; green contexts partition SMs inside it. A kernel only
runs confined when its module, its stream and the current context are the partition's, so a
partitioned session loads its modules and creates its streams with its partition current (the
vGPU thread switches context per session: backend.use_partition).

What it does not do: a session keeps the partition it started in for its life (CUDA streams
cannot change context), so a share changed while the tenant has sessions applies once they have
all ended, and an uncapped session started before a capped tenant arrived keeps the whole GPU
(and competes with it on its SMs). SMs a capped tenant holds stay its own while it is idle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pilot.daemon.backends.base import Backend, SmLayout
from pilot.daemon.resources.tenants import (
    WILDCARD,
    _check_gpu,
    _check_tenant,
    read_state_file,
    without_entry,
    write_json_atomic,
)

log = logging.getLogger("pilot.shares")

SHARES_FILE = "shares.json"
SHARES_VERSION = 1


class ShareFileError(ValueError):
    """shares.json cannot be read or holds invalid shares; pilotd does not start without them."""


def check_share(value: Any) -> int:
    """A share is a whole percentage of the GPU's SMs, 1 to 100 (100: no cap)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise ValueError(f"a compute share is a percentage from 1 to 100, not {value!r}")
    return value


Table = dict[str, dict[int | None, int]]


class ShareStore:
    """Per-tenant, per-GPU compute shares persisted in `<state_dir>/shares.json`."""

    def __init__(self, state_dir: str, defaults: Mapping[str, int] | None = None) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, SHARES_FILE)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.defaults = dict(defaults or {})  # tenant -> share from the config file
        self._lock = threading.Lock()
        self._shares: Table = self._read()

    def get(self, tenant: str, gpu: int) -> int | None:
        """The tenant's share on `gpu` in percent (None: uncapped): its own entry for the GPU,
        else its every-GPU entry, else the config's default; 100 counts as no cap."""
        per = self._shares.get(tenant, {})
        share = per.get(gpu, per.get(None, self.defaults.get(tenant)))
        return None if share is None or share >= 100 else share

    def entries(self, tenant: str) -> set[int | None]:
        """The GPUs the tenant has an entry of its own for (None: its every-GPU entry)."""
        return set(self._shares.get(tenant, {}))

    def others_on(self, gpu: int, tenant: str) -> dict[str, int]:
        """The capped tenants other than `tenant` with a share on `gpu`, and their shares."""
        tenants = set(self.defaults) | set(self._shares)
        return {t: share for t in sorted(tenants - {tenant}) if (share := self.get(t, gpu)) is not None}

    def set(self, tenant: str, gpu: int | None, share: int) -> None:
        _check_tenant(tenant)
        _check_gpu(gpu)
        check_share(share)
        with self._lock:
            new = dict(self._shares)
            new[tenant] = {**new.get(tenant, {}), gpu: share}
            self._commit(new)

    def unset(self, tenant: str, gpu: int | None = None) -> bool:
        """Remove the tenant's entry for `gpu` (None: all of its entries); False if none."""
        with self._lock:
            new = without_entry(self._shares, tenant, gpu, whole=gpu is None)
            if new is None:
                return False
            self._commit(new)
        return True

    def list(self) -> dict[str, dict[str, int]]:
        """Every share set by pilotctl or the config, by tenant and GPU ("*": every GPU)."""
        out: dict[str, dict[str, int]] = {t: {WILDCARD: v} for t, v in self.defaults.items()}
        for t, per in self._shares.items():
            out[t] = {**out.get(t, {}), **{_key(g): v for g, v in per.items()}}
        return {t: dict(sorted(out[t].items())) for t in sorted(out)}

    def reload(self) -> None:
        with self._lock:
            self._shares = self._read()

    def _commit(self, table: Table) -> None:
        write_json_atomic(self.path, {"version": SHARES_VERSION, "shares": {
            t: {_key(g): v for g, v in per.items()} for t, per in table.items()}})
        self._shares = table

    def _read(self) -> Table:
        return read_state_file(self.path, _parse, ShareFileError) or {}


def _key(gpu: int | None) -> str:
    return WILDCARD if gpu is None else str(gpu)


def _parse(doc: Any) -> Table:
    if (not isinstance(doc, dict) or set(doc) != {"version", "shares"}
            or doc["version"] != SHARES_VERSION or not isinstance(doc["shares"], dict)):
        raise ValueError(f'expected {{"version": {SHARES_VERSION}, "shares": {{...}}}}')
    table: Table = {}
    for tenant, per in doc["shares"].items():
        _check_tenant(tenant)
        if not isinstance(per, dict):
            raise ValueError(f"shares of {tenant!r}: expected an object of GPU -> percent")
        entries: dict[int | None, int] = {}
        for key, value in per.items():
            if key != WILDCARD and not (isinstance(key, str) and key.isdigit()):
                raise ValueError(f"shares of {tenant!r}: {key!r} is not \"*\" nor a GPU index")
            entries[None if key == WILDCARD else int(key)] = check_share(value)
        if entries:
            table[tenant] = entries
    return table


# ---- partitions ----

def units_for(share: int, layout: SmLayout) -> int:
    """The units a share of `share` percent gets: rounded down (a cap is not exceeded), at
    least one, at most every unit."""
    return max(1, min(layout.units, share * layout.sms // (100 * layout.unit)))


@dataclass
class _Held:
    partition: Any
    units: tuple[int, ...]
    sessions: int = 0


@dataclass
class SmPlanner:
    """The partitions of one GPU (see the module docstring). Thread-safe: the router asks for a
    session's partition, the session's vGPU thread gives it back."""

    backend: Backend
    device: int  # the backend's device index
    layout: SmLayout | None
    _capped: dict[str, _Held] = field(default_factory=dict)  # tenant -> its units
    _rest: dict[tuple[int, ...], _Held] = field(default_factory=dict)  # free units -> partition
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, tenant: str, share: int | None) -> Any:
        """The partition for a new session of `tenant` (None: the whole GPU)."""
        if self.layout is None:
            return None
        with self._lock:
            if share is not None:
                held = self._capped.get(tenant)
                if held is None:
                    held = self._capped[tenant] = self._carve(units_for(share, self.layout))
                    log.info("GPU %d: tenant %s capped at %d%%: %d of %d SMs", self.device,
                             tenant, share, held.partition.sm_count, self.layout.sms)
            elif not self._capped:
                return None
            else:
                free = self._free_units()
                held = self._rest.get(free)
                if held is None:
                    part = self.backend.partition_create(self.device, free, True)
                    held = self._rest[free] = _Held(part, free)
            held.sessions += 1
            return held.partition

    def release(self, partition: Any) -> None:
        """A session in `partition` ended; the last one out destroys it."""
        if partition is None:
            return
        with self._lock:
            for table in (self._capped, self._rest):
                for key, held in list(table.items()):
                    if held.partition is partition:
                        held.sessions -= 1
                        if held.sessions <= 0:
                            del table[key]  # type: ignore[arg-type]
                            self.backend.partition_destroy(partition)
                        return

    def held(self) -> dict[str, int]:
        """SMs per capped tenant with a partition now (the metrics' share gauge)."""
        with self._lock:
            return {t: h.partition.sm_count for t, h in self._capped.items()}

    def _free_units(self) -> tuple[int, ...]:
        assert self.layout is not None
        taken = {u for h in self._capped.values() for u in h.units}
        return tuple(u for u in range(self.layout.units) if u not in taken)

    def _carve(self, count: int) -> _Held:
        """`count` units for a tenant: unheld ones first, then the least shared."""
        assert self.layout is not None
        use = dict.fromkeys(range(self.layout.units), 0)
        for h in self._capped.values():
            for u in h.units:
                use[u] += 1
        units = tuple(sorted(sorted(use, key=lambda u: (use[u], u))[:count]))
        return _Held(self.backend.partition_create(self.device, units, False), units)


class ComputeShares:
    """The daemon's shares: the store and one planner per GPU (host GPU index -> backend
    device). The router places each session part; its vGPU thread releases it."""

    def __init__(self, store: ShareStore, backend: Backend, gpus: Mapping[int, int]) -> None:
        self.store = store
        self.planners = {g: SmPlanner(backend, d, backend.sm_layout(d)) for g, d in gpus.items()}

    def place(self, session: Any) -> None:
        """Give a new session part (`tenant`, `device`: the host GPU) its partition."""
        planner = self.planners.get(session.device)
        if planner is not None:
            share = self.store.get(session.tenant, session.device)
            session.partition = planner.acquire(session.tenant, share)

    def release(self, session: Any) -> None:
        planner = self.planners.get(session.device)
        if planner is not None:
            planner.release(session.partition)
        session.partition = None

    def report(self) -> dict[int, dict[str, Any]]:
        """Per GPU: its SMs and partition unit, and the SMs each capped tenant holds now."""
        return {g: {"sms": p.layout.sms if p.layout else None,
                    "unit": p.layout.unit if p.layout else None,
                    "held": p.held()} for g, p in self.planners.items()}
