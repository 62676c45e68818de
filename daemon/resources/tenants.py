"""Tenants, their quotas, and the memory they hold.

- `TenantResolver` maps a client's kernel-given uid/gid to a tenant: the named tenant (config
  `[tenants.<name>]`) listing its user, else one listing its primary group, else one listing a
  supplementary group (the first such tenant by name, so the answer never depends on NSS
  order), else `user:<name>`, or `uid:<n>` for a uid without a passwd entry. Results are cached
  because NSS lookups can be slow (LDAP); `clear_cache()` forgets them after a membership change.
  With `[slurm] job_tenants`, a process inside a Slurm job is the job's tenant instead,
  `slurm:job_<id>` (`slurm_job_of`: from the process tree, not from the client).
- `QuotaStore` keeps each tenant's limits per GPU (`None` = every GPU, `"*"` on disk and in
  listings) in `<state_dir>/quotas.json`, which survives restarts. vGPU threads read it on every
  allocation, so reads take no lock: writers build a new dict, persist it, then swap it in, and a
  reader sees either the old or the new table, never a half-updated one. A failed write changes
  nothing, in memory or on disk.
- `Ledger` counts the bytes each tenant holds per GPU; `reserve` checks and adds under one lock,
  so threads racing for the last bytes of a quota can never exceed it together. Amounts are kept
  per kind (KINDS: what each allocation path charged; resources/broker.py).
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pilot.daemon.config import TenantDef
from pilot.daemon.sessions.session import stat_fields

log = logging.getLogger("pilot.tenants")

QUOTAS_FILE = "quotas.json"
QUOTAS_VERSION = 1
WILDCARD = "*"
# What the resource broker charges, by path. GPU_KINDS count against a tenant's hard quota on a
# GPU and the GPU's capacity; "pinned" is host memory, held per tenant under HOST (its own limits).
GPU_KINDS = ("device", "pitch", "managed", "module", "limit", "array")
KINDS = (*GPU_KINDS, "pinned", "staging")  # staging: the session's copy buffers, pinned too
HOST = -1  # the ledger's "GPU" for host memory


# ---- identity ----

def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _group_name(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def _group_ids(user: str, gid: int) -> list[int]:
    """The user's groups per NSS (primary included); [gid] if they cannot be listed."""
    try:
        return list(os.getgrouplist(user, gid))
    except OSError:
        return [gid]


def unknown_members(tenants: Mapping[str, TenantDef]) -> list[str]:
    """One line per user or group a named tenant lists that NSS does not know (a typo, or an
    account not made yet): nobody can be that member, so its tenant may be missing someone."""
    out = []
    for t in tenants.values():
        for kind, names, lookup in (("user", t.users, pwd.getpwnam), ("group", t.groups, grp.getgrnam)):
            for name in names:
                try:
                    lookup(name)
                except KeyError:
                    out.append(f"tenant {t.name}: no {kind} {name!r} on this host")
    return out


def is_admin(uid: int, gid: int, admin_group: str) -> bool:
    """Root, or a member of `admin_group` (as primary group or supplementary one). Not cached:
    a revoked membership takes effect at the next command."""
    if uid == 0:
        return True
    try:
        admin_gid = grp.getgrnam(admin_group).gr_gid
    except KeyError:
        return False
    if gid == admin_gid:
        return True
    user = _user_name(uid)
    return user is not None and admin_gid in _group_ids(user, gid)


SLURM_TENANT_PREFIX = "slurm:job_"
_MAX_ANCESTORS = 64


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def slurm_job_of(pid: int) -> str | None:
    """The Slurm job a process runs in, from the kernel's process tree: the nearest ancestor that
    is a root-owned `slurmstepd: [JOB.STEP]` (slurmd's step daemon names itself so), else None.
    A program cannot make itself another job's descendant, and only root can run a slurmstepd,
    so this is no claim of the client's; a process that left its job's tree (daemonized) is in
    no job and gets its user's tenant."""
    at = pid
    for _ in range(_MAX_ANCESTORS):
        fields = stat_fields(at)
        if fields is None or len(fields) < 2:
            return None
        try:
            with open(f"/proc/{at}/cmdline", "rb") as f:
                cmdline = f.read(256)
        except OSError:
            return None
        if cmdline.startswith(b"slurmstepd: [") and _real_uid(at) == 0:
            job = cmdline[len(b"slurmstepd: ["):].split(b".", 1)[0].split(b"]", 1)[0]
            return job.decode() if job.isdigit() else None
        ppid = int(fields[1])
        if ppid <= 1:
            return None
        at = ppid
    return None


class TenantResolver:
    """uid/gid -> tenant name, from the configured tenants (see the module docstring)."""

    def __init__(self, tenants: Mapping[str, TenantDef]) -> None:
        self._by_user: dict[str, str] = {}
        self._by_group: dict[str, str] = {}
        for name in sorted(tenants):
            t = tenants[name]
            for table, members, kind in ((self._by_user, t.users, "user"),
                                         (self._by_group, t.groups, "group")):
                for member in members:
                    if table.setdefault(member, name) != name:
                        raise ValueError(f"{kind} {member!r} is in tenants {table[member]!r} "
                                         f"and {name!r}")
        self._cache: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()

    def tenant_of(self, uid: int, gid: int) -> str:
        key = (uid, gid)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        tenant = self._resolve(uid, gid)
        with self._lock:
            self._cache[key] = tenant
        return tenant

    def clear_cache(self) -> None:
        with self._lock:
            self._cache = {}

    def is_admin(self, uid: int, gid: int, admin_group: str) -> bool:
        return is_admin(uid, gid, admin_group)

    def _resolve(self, uid: int, gid: int) -> str:
        user = _user_name(uid)
        if user is not None and user in self._by_user:
            return self._by_user[user]
        if self._by_group:
            primary = _group_name(gid)
            if primary is not None and primary in self._by_group:
                return self._by_group[primary]
            if user is not None:
                names = (_group_name(g) for g in _group_ids(user, gid))
                found = sorted(self._by_group[n] for n in names if n is not None and n in self._by_group)
                if found:
                    return found[0]
        return f"user:{user}" if user is not None else f"uid:{uid}"


# ---- quotas ----

def without_entry(table: dict[str, dict[Any, Any]], tenant: str, key: int | None,
                  whole: bool) -> dict[str, dict[Any, Any]] | None:
    """A copy of a per-tenant, per-GPU table (quotas, shares) less the tenant's entry for `key`
    (every entry of the tenant when `whole`); None if there is none. A copy, since the stores
    swap tables in whole for their lock-free readers."""
    per = table.get(tenant)
    if per is None or (not whole and key not in per):
        return None
    new = dict(table)
    rest = {} if whole else {g: v for g, v in per.items() if g != key}
    if rest:
        new[tenant] = rest
    else:
        del new[tenant]
    return new


T = TypeVar("T")


def read_state_file(path: str, parse: Callable[[Any], T], error: type[ValueError]) -> T | None:
    """The JSON document of a state file (shares.json, priorities.json) through `parse`; None
    when there is no file. A file that cannot be read or parsed raises `error`, naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    try:
        return parse(doc)
    except ValueError as exc:
        raise error(f"{path}: {exc}") from None


def write_json_atomic(path: str, doc: Any) -> None:
    """Replace `path` with `doc` as JSON, atomically and durably (a temporary file of mode 0600
    beside it, fsync, rename, fsync of the directory): a crash leaves the old file or the new."""
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: mode 0600
            json.dump(doc, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)


def _check_bytes(what: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a number of bytes >= 0 or None, not {value!r}")


@dataclass(frozen=True)
class Quota:
    """`hard`: allocations beyond it fail. `provisioned`: bytes guaranteed to the tenant on the
    GPU, at most `hard`: other tenants' allocations may not take what it has not used of them
    (resources/broker.py), and the memory policies keep that much of its movable memory on the GPU
    (MAdvise's budget, MFit's fit). None: no limit, no guarantee."""

    hard: int | None = None
    provisioned: int | None = None

    def __post_init__(self) -> None:
        _check_bytes("hard", self.hard)
        _check_bytes("provisioned", self.provisioned)
        if self.hard is not None and self.provisioned is not None and self.provisioned > self.hard:
            raise ValueError(f"provisioned ({self.provisioned}) is above hard ({self.hard})")


UNLIMITED = Quota()


class QuotaFileError(ValueError):
    """quotas.json cannot be read or does not hold valid quotas; pilotd must not start
    without the quotas an operator set, so this is never silently ignored."""


def _check_tenant(tenant: Any) -> str:
    if (not isinstance(tenant, str) or not tenant or len(tenant) > 256
            or any(c.isspace() or not c.isprintable() for c in tenant)):
        raise ValueError(f"{tenant!r} is not a tenant name")
    return tenant


def _check_gpu(gpu: Any) -> int | None:
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
        raise ValueError(f"{gpu!r} is not a GPU index")
    return gpu


def _gpu_key(gpu: int | None) -> str:
    return WILDCARD if gpu is None else str(gpu)


Table = dict[str, dict[int | None, Quota]]


class QuotaStore:
    """Per-tenant, per-GPU quotas persisted in `<state_dir>/quotas.json` (see module doc)."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, QUOTAS_FILE)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()  # serializes writers; readers use the current table
        self._quotas: Table = self._read()

    def get(self, tenant: str, gpu: int | None) -> Quota:
        """The tenant's quota on `gpu`: its own entry, else the every-GPU one, else none."""
        per = self._quotas.get(tenant)
        if per is None:
            return UNLIMITED
        q = per.get(gpu)
        if q is None:
            q = per.get(None, UNLIMITED)
        return q

    def entry(self, tenant: str, gpu: int | None) -> Quota | None:
        """The tenant's own entry for `gpu` (None: its every-GPU entry), without fallbacks."""
        per = self._quotas.get(tenant)
        return per.get(gpu) if per is not None else None

    def provisioned_on(self, gpu: int) -> dict[str, int]:
        """Tenant -> its provisioned bytes on `gpu` (own entry, else every-GPU one), for the
        tenants that have some."""
        out: dict[str, int] = {}
        for tenant in self._quotas:
            p = self.get(tenant, gpu).provisioned
            if p:
                out[tenant] = p
        return out

    def set(self, tenant: str, gpu: int | None, hard: int | None, provisioned: int | None) -> Quota:
        """Replace the tenant's entry for `gpu` (None: every GPU). An entry with both limits
        None is kept: on one GPU it lifts an every-GPU limit there."""
        _check_tenant(tenant)
        _check_gpu(gpu)
        q = Quota(hard, provisioned)
        with self._lock:
            new = dict(self._quotas)
            new[tenant] = {**new.get(tenant, {}), gpu: q}
            self._commit(new)
        return q

    def unset(self, tenant: str, gpu: int | str | None = None) -> bool:
        """Remove the tenant's entry for `gpu`; None removes all of its entries, "*" only the
        every-GPU one. False if there was nothing to remove."""
        key: int | None = None if gpu == WILDCARD else _check_gpu(gpu)
        with self._lock:
            new = without_entry(self._quotas, tenant, key, whole=gpu is None)
            if new is None:
                return False
            self._commit(new)
        return True

    def list(self) -> dict[str, dict[str, Quota]]:
        table = self._quotas
        return {t: {_gpu_key(g): table[t][g] for g in sorted(table[t], key=lambda g: -1 if g is None else g)}
                for t in sorted(table)}

    def reload(self) -> None:
        """Re-read quotas.json (after an operator edited it); on error the current quotas stay."""
        with self._lock:
            self._quotas = self._read()

    # -- disk --

    def _commit(self, table: Table) -> None:
        """Persist `table`, then make it current (caller holds the lock)."""
        doc = {"version": QUOTAS_VERSION,
               "quotas": {t: {g: {"hard": q.hard, "provisioned": q.provisioned}
                              for g, q in per.items()}
                          for t, per in self._listing(table).items()}}
        write_json_atomic(self.path, doc)
        self._quotas = table

    @staticmethod
    def _listing(table: Table) -> dict[str, dict[str, Quota]]:
        return {t: {_gpu_key(g): q for g, q in per.items()} for t, per in table.items()}

    def _read(self) -> Table:
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise QuotaFileError(f"{self.path}: cannot read: {exc}") from None
        except json.JSONDecodeError as exc:
            raise QuotaFileError(f"{self.path}: not valid JSON ({exc}); fix or move it away "
                                 "(quotas are not dropped silently)") from None
        try:
            return _parse(doc)
        except ValueError as exc:
            raise QuotaFileError(f"{self.path}: {exc}") from None


def _parse(doc: Any) -> Table:
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        raise ValueError('expected {"version": 1, "quotas": {...}}')
    if doc["version"] != QUOTAS_VERSION:
        raise ValueError(f"version {doc['version']} is not supported (this pilot reads "
                         f"version {QUOTAS_VERSION})")
    quotas = doc.get("quotas")
    if not isinstance(quotas, dict) or set(doc) != {"version", "quotas"}:
        raise ValueError('expected {"version": 1, "quotas": {...}}')
    table: Table = {}
    for tenant, per in quotas.items():
        _check_tenant(tenant)
        if not isinstance(per, dict):
            raise ValueError(f"quotas of {tenant!r}: expected an object of GPU -> quota")
        entries: dict[int | None, Quota] = {}
        for key, entry in per.items():
            if key == WILDCARD:
                gpu = None
            elif isinstance(key, str) and key.isdigit() and str(int(key)) == key:
                gpu = int(key)
            else:
                raise ValueError(f"quotas of {tenant!r}: {key!r} is not \"*\" nor a GPU index")
            if not isinstance(entry, dict) or not set(entry) <= {"hard", "provisioned"}:
                raise ValueError(f"quota of {tenant!r} on {key}: expected "
                                 '{"hard": bytes|null, "provisioned": bytes|null}')
            try:
                entries[gpu] = Quota(entry.get("hard"), entry.get("provisioned"))
            except ValueError as exc:
                raise ValueError(f"quota of {tenant!r} on {key}: {exc}") from None
        if entries:
            table[tenant] = entries
    return table


# ---- accounting ----

class Ledger:
    """Bytes held per (tenant, GPU, kind), shared by all vGPU threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[tuple[str, int, str], int] = {}

    def reserve(self, tenant: str, gpu: int, nbytes: int, hard_limit: int | None,
                kind: str = "device") -> bool:
        """Count `nbytes` more of `kind` for the tenant unless that would take what it holds on
        that GPU, over every kind (GPU kinds on a GPU, pinned on HOST), past `hard_limit` (None:
        no limit); check and add are one atomic step. True if counted."""
        if nbytes < 0 or kind not in KINDS:
            raise ValueError(f"bad reservation: {nbytes} bytes of {kind!r}")
        key = (tenant, gpu, kind)
        with self._lock:
            used = self._used.get(key, 0)
            if hard_limit is not None and self._total(tenant, gpu) + nbytes > hard_limit:
                return False
            self._used[key] = used + nbytes
        return True

    def _total(self, tenant: str, gpu: int) -> int:
        return sum(self._used.get((tenant, gpu, k), 0) for k in KINDS)

    def release(self, tenant: str, gpu: int, nbytes: int, kind: str = "device") -> None:
        """Stop counting `nbytes`. Releasing more than is held is a bookkeeping bug: it is
        logged and the count stops at 0 (a free must not fail because of accounting)."""
        key = (tenant, gpu, kind)
        with self._lock:
            used = self._used.get(key, 0)
            left = used - nbytes
            if left < 0:
                log.warning("ledger: %s releases %d %s bytes on GPU %d but holds %d",
                            tenant, nbytes, kind, gpu, used)
                left = 0
            if left:
                self._used[key] = left
            else:
                self._used.pop(key, None)

    def usage(self, tenant: str, gpu: int, kind: str | None = None) -> int:
        """Bytes of `kind` the tenant holds on the GPU; every kind together when None."""
        if kind is None:
            return self._total(tenant, gpu)
        return self._used.get((tenant, gpu, kind), 0)

    def breakdown(self, tenant: str, gpu: int) -> dict[str, int]:
        """Bytes per kind the tenant holds on the GPU (kinds it holds none of are left out)."""
        with self._lock:
            return {k: n for k in KINDS if (n := self._used.get((tenant, gpu, k), 0))}

    def snapshot(self, kind: str | None = None) -> dict[tuple[str, int], int]:
        """(tenant, GPU) -> bytes of `kind`, or of every GPU kind when None."""
        kinds = GPU_KINDS if kind is None else (kind,)
        out: dict[tuple[str, int], int] = {}
        with self._lock:
            for (t, g, k), n in self._used.items():
                if k in kinds:
                    out[(t, g)] = out.get((t, g), 0) + n
        return out
