"""The control socket's commands (pilotctl): status, sessions, quotas, compute shares, priority
classes, GPU allow-lists, Slurm jobs, kill, drain.

Requests and replies are one JSON frame each: `{"cmd": "quota.set", "args": {...}}` ->
`{"ok": true, "result": ...}` or `{"ok": false, "error": "one line"}`. The caller's uid and gid
come from the kernel (SO_PEERCRED, read by the acceptor when it took the connection). Changes
need root or the admin group; reads show another tenant's sessions and quotas to admins only.

Runs on the router thread, which owns the control socket; what it reads of vGPU-owned sessions
is counters (see session.py).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pilot.daemon.config import at_least_floor, parse_bytes
from pilot.daemon.resources.shares import check_share, units_for
from pilot.daemon.resources.tenants import SLURM_TENANT_PREFIX
from pilot.daemon.sessions.session import Credentials

if TYPE_CHECKING:
    from pilot.daemon.router.server import Daemon

log = logging.getLogger("pilot.control")


class ControlError(Exception):
    """A refused or malformed command: its message goes back to pilotctl as one line."""


@dataclass(frozen=True)
class Caller:
    creds: Credentials
    tenant: str
    admin: bool


Command = Callable[["Daemon", Caller, dict[str, Any]], Any]
COMMANDS: dict[str, tuple[Command, bool]] = {}  # name -> (handler, needs admin)


def command(name: str, admin: bool = False) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = (fn, admin)
        return fn

    return register


def handle(daemon: Daemon, creds: Credentials, request: bytes) -> bytes:
    """One control request -> one reply frame. Never raises."""
    try:
        msg = json.loads(request)
        if not isinstance(msg, dict) or not isinstance(msg.get("cmd"), str):
            raise ControlError("malformed request: expected {\"cmd\": ..., \"args\": {...}}")
        args = msg.get("args") or {}
        if not isinstance(args, dict):
            raise ControlError("malformed request: args must be an object")
        entry = COMMANDS.get(msg["cmd"])
        if entry is None:
            raise ControlError(f"unknown command {msg['cmd']!r}")
        fn, needs_admin = entry
        caller = Caller(creds, daemon.resolver.tenant_of(creds.uid, creds.gid),
                        daemon.resolver.is_admin(creds.uid, creds.gid, daemon.config.admin_group))
        if needs_admin and not caller.admin:
            raise ControlError(f"{msg['cmd']} needs root or membership of group "
                               f"{daemon.config.admin_group!r}")
        result = fn(daemon, caller, args)
        if needs_admin:
            log.info("control: %s by uid %d: %s", msg["cmd"], creds.uid, json.dumps(args))
        reply: dict[str, Any] = {"ok": True, "result": result}
    except (ControlError, ValueError, KeyError, TypeError) as exc:
        reply = {"ok": False, "error": str(exc) if not isinstance(exc, KeyError) else f"missing {exc}"}
    except Exception as exc:
        log.exception("control: command failed")
        reply = {"ok": False, "error": f"internal error: {exc}"}
    return json.dumps(reply).encode()


def _gpu_arg(daemon: Daemon, args: dict[str, Any]) -> int | None:
    gpu = args.get("gpu")
    if gpu is None:
        return None
    if not isinstance(gpu, int) or gpu not in daemon.gpus:
        raise ControlError(f"no GPU {gpu} (this daemon serves {sorted(daemon.gpus)})")
    return gpu


def _limit(value: Any, current: int | None, what: str) -> int | None:
    """A quota limit from pilotctl: None (not given) keeps `current`, "none" (or 0 for a
    provisioned quota: nothing guaranteed) lifts it; a size needs a unit and SIZE_FLOOR."""
    if value is None:
        return current
    if isinstance(value, str) and value.strip().lower() in ("none", "unlimited"):
        return None
    n = parse_bytes(value)
    if n == 0 and what == "a provisioned quota":
        return None
    try:
        return at_least_floor(n, what)
    except ValueError as exc:
        hint = '; "none" lifts the limit' if n == 0 else ""
        raise ControlError(f"{value!r}: {exc}{hint}") from None


def _most_grantable(daemon: Daemon, gpu: int | None) -> int:
    """The most a tenant could hold on `gpu` (None: on any GPU): its capacity, or with an
    enforced capacity its managed limit when larger (movable memory may exceed the capacity)."""
    broker = daemon.broker
    gpus = sorted(daemon.gpus) if gpu is None else [gpu]
    return max(max(broker.budget.capacity(g), broker.managed.capacity(g) if broker.managed else 0)
               for g in gpus)


def _check_provisioned_total(daemon: Daemon, tenant: str, gpu: int | None,
                             provisioned: int | None) -> None:
    """Provisioned bytes are guarantees: on each GPU the entry applies to, every tenant's
    together (this one's new value in place of its old) must fit in the GPU's capacity."""
    if not provisioned:
        return
    for g in sorted(daemon.gpus) if gpu is None else [gpu]:
        if gpu is None and daemon.quotas.entry(tenant, g) is not None:
            continue  # the tenant's own entry on g wins over the every-GPU one
        others = {t: p for t, p in daemon.quotas.provisioned_on(g).items() if t != tenant}
        cap = daemon.broker.budget.capacity(g)
        if provisioned + sum(others.values()) > cap:
            raise ControlError(
                f"provisioned {provisioned} bytes on GPU {g} with the {sum(others.values())} bytes "
                f"provisioned to {', '.join(sorted(others))} is more than its capacity ({cap} "
                "bytes): provisioned memory is guaranteed, so it cannot be oversubscribed")


def _tenant_arg(daemon: Daemon, name: Any) -> str:
    """A named tenant, `user:NAME`, `uid:N`, `slurm:job_N`, or a bare user name (meaning
    user:NAME)."""
    if not isinstance(name, str) or not name:
        raise ControlError("tenant name required")
    if name in daemon.config.tenants:
        return name
    if name.startswith("uid:"):
        if not name[4:].isdigit():
            raise ControlError(f"bad tenant {name!r}: uid:N takes a number")
        return name
    if name.startswith(SLURM_TENANT_PREFIX):
        if not name[len(SLURM_TENANT_PREFIX):].isdigit():
            raise ControlError(f"bad tenant {name!r}: {SLURM_TENANT_PREFIX}N takes a job id")
        return name
    if name.startswith("user:"):
        try:
            pwd.getpwnam(name[5:])
        except KeyError:
            raise ControlError(f"unknown tenant {name!r}: no user {name[5:]!r}") from None
        return name
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise ControlError(f"unknown tenant {name!r}: not a named tenant nor a user") from None
    return f"user:{name}"


# ---- reads ----

@command("status")
def status(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """`measure`: also read where movable memory is from the CPU's page table (pagemap)."""
    snap = daemon.snapshot()
    gpus = []
    res = daemon.broker.residency
    for g in snap["gpus"]:
        if args.get("measure") and res is not None and g["residency"] is not None:
            g["residency"]["pagemap"] = res.measure(g["index"])
        r = g["reading"]
        gpus.append({
            "index": g["index"], "uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"], "name": g["name"],
            "capacity": g["capacity"], "draining": g["draining"],
            "used_by_pilot": g["used_by_pilot"], "residency": g["residency"],
            "nvml": None if r is None else {
                "name": r.name, "memory_total": r.memory_total, "memory_used": r.memory_used,
                "memory_free": r.memory_free, "utilization_gpu": r.utilization_gpu,
                "utilization_memory": r.utilization_memory, "processes": len(r.processes)},
        })
    return {"version": daemon.version, "backend": daemon.backend.name, "pid": os.getpid(),
            "uptime_s": round(time.time() - daemon.started, 1), "gpus": gpus,
            "vgpus": snap["vgpus"], "sessions": len({s["session"] for s in snap["sessions"]}),
            "policy": daemon.config.policy, "scheduling": daemon.policy.describe(),
            "faults": snap["faults"], "engine_faults": snap.get("engine_faults", []),
            "backing_off": snap.get("backing_off", {}),
            "isolation": snap["isolation"],
            "priorities": _visible_priorities(snap["priorities"], caller, snap["preemption"]),
            "ipc": snap["ipc"] if caller.admin else None,  # daemon-wide counts: admins only
            "you": {"tenant": caller.tenant, "admin": caller.admin}}


@command("sessions")
def sessions(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
    rows = daemon.session_summaries()
    if not caller.admin:
        rows = [r for r in rows if r["tenant"] == caller.tenant]
    return rows


@command("quota.get")
def quota_get(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args.get("tenant") or caller.tenant)
    if tenant != caller.tenant and not caller.admin:
        raise ControlError("only admins can read other tenants' quotas")
    gpus = [_gpu_arg(daemon, args)] if args.get("gpu") is not None else sorted(daemon.gpus)
    usage = daemon.broker.tenant_usage(tenant, gpus)
    out = {}
    for gpu in gpus:
        q = daemon.quotas.get(tenant, gpu)
        out[str(gpu)] = {"hard": q.hard, "provisioned": q.provisioned, **usage[str(gpu)]}
    return {"tenant": tenant, "gpus": out, "pinned": usage["host"]}


@command("quota.list")
def quota_list(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    listing = {t: {g: {"hard": q.hard, "provisioned": q.provisioned} for g, q in per.items()}
               for t, per in daemon.quotas.list().items()}
    if not caller.admin:
        listing = {t: v for t, v in listing.items() if t == caller.tenant}
    return listing


# ---- changes (admin) ----

@command("quota.set", admin=True)
def quota_set(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    gpu = _gpu_arg(daemon, args)
    if args.get("hard") is None and args.get("provisioned") is None:
        raise ControlError("give a hard limit, a provisioned limit, or both")
    # A limit not given keeps its value in this entry ("none" lifts it): setting the
    # provisioned share alone must not delete the hard limit.
    current = daemon.quotas.entry(tenant, gpu)
    hard = _limit(args.get("hard"), current.hard if current else None, "a hard quota")
    provisioned = _limit(args.get("provisioned"), current.provisioned if current else None,
                         "a provisioned quota")
    most = _most_grantable(daemon, gpu)
    for what, value in (("hard", hard), ("provisioned", provisioned)):
        if value is not None and value > most:
            where = "any GPU" if gpu is None else f"GPU {gpu}"
            raise ControlError(f"{what} limit {value} bytes is more than {where} can grant "
                               f"({most} bytes: its capacity, or its managed limit)")
    _check_provisioned_total(daemon, tenant, gpu, provisioned)
    q = daemon.quotas.set(tenant, gpu, hard=hard, provisioned=provisioned)
    daemon.engines.reread_quotas()
    log.info("quota for %s on %s: hard=%s provisioned=%s", tenant,
             "every GPU" if gpu is None else f"GPU {gpu}", q.hard, q.provisioned,
             extra={"tenant": tenant})
    return {"tenant": tenant, "gpu": gpu, "hard": q.hard, "provisioned": q.provisioned}


@command("quota.unset", admin=True)
def quota_unset(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    gpu = _gpu_arg(daemon, args)
    if not daemon.quotas.unset(tenant, gpu):
        raise ControlError(f"{tenant} has no quota" + ("" if gpu is None else f" on GPU {gpu}"))
    daemon.engines.reread_quotas()
    return {"tenant": tenant, "gpu": gpu}


@command("isolate.list")
def isolate_list(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    return {**daemon.isolation.describe(), "engines": daemon.engines.describe()}


@command("isolate.set", admin=True)
def isolate_set(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """Runs the tenant's new sessions in a pilotd of their own; running ones stay where they are."""
    tenant = _tenant_arg(daemon, args["tenant"])
    daemon.isolation.mark(tenant, f"set by uid {caller.creds.uid}")
    return {"tenant": tenant, "isolated": True}


@command("isolate.clear", admin=True)
def isolate_clear(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    waiting = daemon.fault_backoff(tenant)[0] > 0
    daemon.backoff_cleared[tenant] = time.time()  # its faults so far no longer back it off
    if not daemon.isolation.clear(tenant) and not waiting:
        why = (" (it is isolated by [isolation] tenants in the config)"
               if daemon.isolation.isolated(tenant) else "")
        raise ControlError(f"{tenant} is not marked isolated{why}")
    return {"tenant": tenant, "isolated": daemon.isolation.isolated(tenant), "backoff_cleared": waiting}


# ---- compute shares (resources/shares.py) ----

@command("share.list")
def share_list(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """The shares set (config defaults under "*"), and per GPU the SMs each capped tenant with
    sessions holds now."""
    shares = daemon.shares.store.list()
    gpus = {str(g): r for g, r in daemon.shares.report().items()}
    if not caller.admin:
        shares = {t: v for t, v in shares.items() if t == caller.tenant}
        for r in gpus.values():
            r["held"] = {t: n for t, n in r["held"].items() if t == caller.tenant}
    return {"shares": shares, "gpus": gpus}


@command("share.set", admin=True)
def share_set(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    gpu = _gpu_arg(daemon, args)
    percent = args.get("percent")
    if isinstance(percent, str) and percent.rstrip("%").isdigit():
        percent = int(percent.rstrip("%"))
    if isinstance(percent, int) and not isinstance(percent, bool) and 1 <= percent < 100:
        _check_share_total(daemon, tenant, gpu, percent)
    daemon.shares.store.set(tenant, gpu, percent)
    where = "every GPU" if gpu is None else f"GPU {gpu}"
    log.info("compute share of %s on %s: %d%%", tenant, where, percent, extra={"tenant": tenant})
    return {"tenant": tenant, "gpu": gpu, "percent": percent,
            "sms": _share_sms(daemon, gpu, percent)}


def _check_share_total(daemon: Daemon, tenant: str, gpu: int | None, percent: int) -> None:
    """The capped tenants' shares of a GPU may add up to 100% at most: more would give each less
    than its share (they would share SMs), so it is refused, naming those in the way."""
    for g in sorted(daemon.gpus) if gpu is None else [gpu]:
        store = daemon.shares.store
        if gpu is None and g in store.entries(tenant):
            continue  # the tenant's own entry on g wins over the every-GPU one
        others = store.others_on(g, tenant)
        if percent + sum(others.values()) > 100:
            named = ", ".join(f"{t} {p}%" for t, p in others.items())
            raise ControlError(f"shares on GPU {g} would add up to {percent + sum(others.values())}% "
                               f"({tenant} {percent}%, {named}): at most 100%; lower or unset one")


def _share_sms(daemon: Daemon, gpu: int | None, percent: int) -> dict[str, list[int] | None]:
    """What `percent` gives on each GPU it applies to: [SMs, of SMs], None where the GPU
    cannot be partitioned."""
    out: dict[str, list[int] | None] = {}
    for g, planner in daemon.shares.planners.items():
        if gpu is None or g == gpu:
            lay = planner.layout
            out[str(g)] = None if lay is None else [
                lay.sms if percent >= 100 else units_for(percent, lay) * lay.unit, lay.sms]
    return out


@command("share.unset", admin=True)
def share_unset(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    gpu = _gpu_arg(daemon, args)
    if not daemon.shares.store.unset(tenant, gpu):
        raise ControlError(f"{tenant} has no share set by pilotctl"
                           + ("" if gpu is None else f" on GPU {gpu}"))
    return {"tenant": tenant, "gpu": gpu}


# ---- GPU allow-lists (resources/gpu_access.py) and Slurm jobs (deploy/slurm) ----

def _gpu_list(daemon: Daemon, value: Any, pci_order: bool) -> list[int]:
    """pilotd GPU numbers from a list (or "0,1" text) of them, "all" or "none"; with
    `pci_order`, the entries are indexes in the host's PCI bus order instead (Slurm's GPU
    indexes when gres.conf lists /dev/nvidia0, 1, ... in order)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return sorted(daemon.gpus)
        if text == "none":
            return []
        try:
            value = [int(v) for v in text.split(",")]
        except ValueError:
            raise ControlError(f"GPUs {value!r}: a list of GPU indexes such as 0,1, or all, "
                               "or none") from None
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ControlError(f"GPUs {value!r}: a list of GPU indexes")
    out: list[int] = []
    for n in value:
        if pci_order:
            gpu = next((g.gpu for g in daemon.topology.ids if g.pci_index == n), None)
            if gpu is None:
                raise ControlError(f"no GPU of this daemon is number {n} in PCI bus order (it serves "
                                   f"{sorted(g.pci_index for g in daemon.topology.ids)} in that order)")
        else:
            gpu = n
            if gpu not in daemon.gpus:
                raise ControlError(f"no GPU {gpu} (this daemon serves {sorted(daemon.gpus)})")
        if gpu in out:
            raise ControlError(f"GPU {n} named twice")
        out.append(gpu)
    return sorted(out)


@command("gpus.list")
def gpus_list(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """Every allow-list (a non-admin sees its own), and whether Slurm jobs need one."""
    listing = daemon.gpu_access.list()
    if not caller.admin:
        listing = {t: v for t, v in listing.items() if t == caller.tenant}
    return {"tenants": listing, "gpus": sorted(daemon.gpus),
            "slurm_jobs_need_one": daemon.config.slurm_job_tenants}


@command("gpus.set", admin=True)
def gpus_set(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """The tenant's new sessions see only these GPUs (running sessions keep what they have)."""
    tenant = _tenant_arg(daemon, args["tenant"])
    gpus = _gpu_list(daemon, args["gpus"], bool(args.get("pci_order")))
    daemon.gpu_access.set(tenant, gpus)
    log.info("GPUs of %s: %s", tenant, ",".join(map(str, gpus)) or "none", extra={"tenant": tenant})
    return {"tenant": tenant, "gpus": gpus}


@command("gpus.unset", admin=True)
def gpus_unset(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    if not daemon.gpu_access.unset(tenant):
        raise ControlError(f"{tenant} has no GPU allow-list")
    return {"tenant": tenant}


def _job_tenant(daemon: Daemon, args: dict[str, Any]) -> str:
    job = str(args.get("job", ""))
    if not job.isdigit():
        raise ControlError(f"bad job id {args.get('job')!r}: a Slurm job id is a number")
    if not daemon.config.slurm_job_tenants:
        raise ControlError("[slurm] job_tenants is off in pilotd's config: a job's programs are "
                           "their users' tenants, so a job cannot be registered")
    return SLURM_TENANT_PREFIX + job


@command("job.start", admin=True)
def job_start(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """A Slurm prolog registers its job: the GPUs its programs may use (`gpus`, `pci_order`),
    its hard quota on each (`mem`) and its compute share (`share`, percent). Everything is
    checked before anything is set; the allow-list is set last, as it lets the job in."""
    tenant = _job_tenant(daemon, args)
    gpus = _gpu_list(daemon, args.get("gpus", "none"), bool(args.get("pci_order")))
    share = args.get("share")
    if share is not None:
        if isinstance(share, str) and share.rstrip("%").isdigit():
            share = int(share.rstrip("%"))
        try:
            share = check_share(share)
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        if share < 100:
            _check_share_total(daemon, tenant, None, share)
    out: dict[str, Any] = {"tenant": tenant, "gpus": gpus, "mem": None, "share": share}
    if args.get("mem") is not None:
        out["mem"] = quota_set(daemon, caller, {"tenant": tenant, "hard": args["mem"]})["hard"]
    if share is not None:
        daemon.shares.store.set(tenant, None, share)
    daemon.gpu_access.set(tenant, gpus)
    log.info("Slurm job %s registered: GPUs %s, quota %s, share %s", tenant, ",".join(map(str, gpus))
             or "none", out["mem"], share, extra={"tenant": tenant})
    return out


@command("job.end", admin=True)
def job_end(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """A Slurm epilog (also after scancel or a time limit): the job's allow-list goes first (no
    new session gets in), then its sessions end and its quota and share are removed. Nothing
    registered is no error: an epilog runs whether or not its prolog could register the job."""
    tenant = _job_tenant(daemon, args)
    had_gpus = daemon.gpu_access.unset(tenant)
    ended = kill(daemon, caller, {"tenant": tenant})["sessions"]
    had_quota = daemon.quotas.unset(tenant, None)
    if had_quota:
        daemon.engines.reread_quotas()
    had_share = daemon.shares.store.unset(tenant, None)
    log.info("Slurm job %s ended: %d session(s) ended", tenant, len(ended), extra={"tenant": tenant})
    return {"tenant": tenant, "sessions": ended, "registered": had_gpus, "quota": had_quota,
            "share": had_share}


# ---- priority classes (resources/priorities.py, scheduling/priority.py) ----

def _visible_priorities(report: dict[str, Any], caller: Caller,
                        preemption: dict[str, Any] | None) -> dict[str, Any]:
    """The board's report and preemption's (scheduling/preempt.py; None: `[priority] preempt`
    off); another tenant's class and preemptions, and the names of kernels, are for admins
    only."""
    if preemption is not None and not caller.admin:
        preemption = {k: v for k, v in preemption.items()
                      if k not in ("kernels_not_preemptible", "kernel_choices")}
        if "tenants" in preemption:  # its own tenant's preemptions only
            preemption["tenants"] = {t: v for t, v in preemption["tenants"].items()
                                     if t == caller.tenant}
    report = {**report, "preemption": preemption}
    if caller.admin:
        return report
    return {**report, "tenants": {t: v for t, v in report["tenants"].items() if t == caller.tenant}}


@command("priority.list")
def priority_list(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """Every tenant with a class set (config or pilotctl), the gate's settings, and the
    highest class active on each GPU now."""
    return _visible_priorities(daemon.priorities.describe(), caller,
                               daemon.preemption.describe() if daemon.preemption is not None else None)


@command("priority.set", admin=True)
def priority_set(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    store = daemon.priorities.store
    assert store is not None
    store.set(tenant, args["level"])
    daemon.priorities.refresh()  # live sessions take it at once
    log.info("priority of %s: %s", tenant, store.name(tenant), extra={"tenant": tenant})
    return {"tenant": tenant, "priority": store.name(tenant)}


@command("priority.unset", admin=True)
def priority_unset(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    tenant = _tenant_arg(daemon, args["tenant"])
    store = daemon.priorities.store
    assert store is not None
    if not store.unset(tenant):
        raise ControlError(f"{tenant} has no priority set by pilotctl")
    daemon.priorities.refresh()
    return {"tenant": tenant, "priority": store.name(tenant)}


@command("kill", admin=True)
def kill(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """One session (`session`), or every session of a tenant (`tenant`: a Slurm epilog ends its
    job's sessions so)."""
    if args.get("tenant") is not None:
        tenant = _tenant_arg(daemon, args["tenant"])
        ended = [row["session"] for row in daemon.session_summaries()
                 if row["tenant"] == tenant and not row.get("isolated")]
        why = f"tenant {tenant} killed by uid {caller.creds.uid}"
        here = [sid for sid in ended if daemon.end_session(sid, why)]
        return {"tenant": tenant, "sessions": here + daemon.engines.stop_tenant(tenant)}
    sid = args.get("session")
    if not isinstance(sid, int) or not daemon.end_session(sid, f"killed by uid {caller.creds.uid}"):
        raise ControlError(f"no session {sid}")
    return {"session": sid}


def _set_draining(daemon: Daemon, args: dict[str, Any], draining: bool) -> dict[str, Any]:
    gpu = _gpu_arg(daemon, args)
    if gpu is None:
        raise ControlError("which GPU?")
    (daemon.draining.add if draining else daemon.draining.discard)(gpu)
    return {"gpu": gpu, "draining": draining}


@command("drain", admin=True)
def drain(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    return _set_draining(daemon, args, True)


@command("undrain", admin=True)
def undrain(daemon: Daemon, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    return _set_draining(daemon, args, False)
