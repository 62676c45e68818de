"""`pilotctl`: the operator's view and controls of a running pilotd.

Reads (`status`, `sessions`, `quota get|list`, `share list`, `priority list`, `gpus list`) take
--json and print one JSON document on stdout; everything else is for people. Changes need root
or the admin group (checked by the daemon from the kernel's peer credentials). Errors are one
line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import click

from pilot import __version__
from pilot.cli.client import CommandFailed, ControlClient, DaemonUnreachable, control_socket_path
from pilot.daemon.config import size_text

pass_client = click.make_pass_decorator(ControlClient)


def _call(client: ControlClient, cmd: str, **args: Any) -> Any:
    try:
        return client.call(cmd, **{k: v for k, v in args.items() if v is not None})
    except (CommandFailed, DaemonUnreachable) as exc:
        raise click.ClickException(str(exc)) from exc


def _emit_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=None)
    sys.stdout.write("\n")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("GiB", "MiB", "KiB"):
        scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10}[unit]
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_NEGATIVE = re.compile(r"-\.?\d")


class _Command(click.Command):
    """A command whose arguments are never negative: `-5GiB` would otherwise read as an unknown
    option -5, so it is named for what it is."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if arg == "--":
                break
            if _NEGATIVE.match(arg):
                raise click.UsageError(f"{arg!r} is negative: sizes, percentages, GPU indexes and "
                                       "session ids are 0 or more", ctx)
        return super().parse_args(ctx, args)


class _Group(click.Group):
    command_class = _Command
    group_class = type  # subgroups are _Groups too


@click.group(cls=_Group,
             context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "PILOTCTL"})
@click.version_option(__version__, "--version", prog_name="pilotctl", message="%(prog)s %(version)s")
@click.option("--control-socket", metavar="PATH",
              help="pilotd's control socket [default: control.sock beside $PILOT_SOCKET's path].")
@click.pass_context
def main(ctx: click.Context, control_socket: str | None) -> None:
    """Look at and control a running pilotd."""
    ctx.obj = ControlClient(control_socket or control_socket_path())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@click.option("--measure", is_flag=True,
              help="Also measure where managed memory is from pilotd's page table (costs 8 bytes "
                   "read per 4 KiB page).")
@pass_client
def status(client: ControlClient, as_json: bool, measure: bool) -> None:
    """GPUs (NVML memory and utilization, capacity), vGPUs and sessions."""
    doc = _call(client, "status", measure=measure) if measure else _call(client, "status")
    if as_json:
        _emit_json(doc)
        return
    click.echo(f"pilotd {doc['version']} (pid {doc['pid']}, backend {doc['backend']}, "
               f"up {doc['uptime_s']:.0f} s, policy {doc['policy']}): {doc['sessions']} session(s)")
    for g in doc["gpus"]:
        nv = g["nvml"]
        line = f"GPU {g['index']}: capacity {_size(g['capacity'])}, pilot holds {_size(g['used_by_pilot'])}"
        if nv:
            line += (f"; {nv['name']}: {_size(nv['memory_used'])} used of {_size(nv['memory_total'])}, "
                     f"utilization {nv['utilization_gpu']:.0f}%")
        if g["draining"]:
            line += "  [draining]"
        click.echo(line)
        if g.get("uuid"):
            click.echo(f"  {g['uuid']}, PCI bus id {g['pci_bus_id']}")
        res = g.get("residency")
        if res:
            click.echo(f"  movable memory: {_size(res['movable'])}, resident {_size(res['resident'])} "
                       f"(peak {_size(res['peak_resident'])}) of room {_size(res['room'])}"
                       + (" [capacity enforced]" if res["enforced"] else "")
                       + f"; advised to host {_size(res['advised_to_host'])}, evicted "
                         f"{_size(res['evicted_bytes'])}, prefetched {_size(res['prefetched_bytes'])}")
            pm = res.get("pagemap")
            if pm:
                click.echo(f"  page table: {_size(pm['host_resident'])} in host RAM, so at most "
                           f"{_size(pm['gpu_at_most'])} on the GPU")
    for v in doc["vgpus"]:
        click.echo(f"  vGPU {v['index']} on GPU {v['gpu']}: {v['sessions']} session(s)")
    _show_faults(doc.get("faults") or [])
    _show_engine_faults(doc.get("engine_faults") or [])
    for tenant, b in sorted((doc.get("backing_off") or {}).items()):
        click.echo(f"  {tenant}: {b['faults']} fault(s) of its engine in the last hour; its programs "
                   f"are refused for {b['wait_s']:.0f} s more ([isolation] fault_backoff; "
                   f"pilotctl isolate clear {tenant})")
    prio = doc.get("priorities") or {}
    if prio.get("tenants"):
        click.echo("priority classes:")
        _show_priorities(prio)
    _show_isolation(doc.get("isolation") or {})
    ipc = doc.get("ipc")
    if ipc and (ipc["memory_exports"] or ipc["event_exports"]):
        click.echo(f"CUDA IPC: {ipc['memory_exports']} exported allocation(s) opened {ipc['grants']} "
                   f"time(s), {_size(ipc['kept_bytes'])} kept for importers after their exporter's "
                   f"free; {ipc['event_exports']} exported event(s)")
    sched = doc.get("scheduling")
    if sched:
        known = sched.get("available", {})
        ready = [n for n, p in known.items() if p.get("implemented")]
        planned = [n for n, p in known.items() if not p.get("implemented")]
        wait = sched.get("max_wait_s") or 0
        click.echo(f"policy {sched['name']} ({sched.get('summary') or 'no summary'}); launches wait at most "
                   f"{f'{wait:g} s' if wait else 'without limit'}")
        for key, value in (sched.get("settings") or {}).items():
            click.echo(f"  {key} = {value}")
        for key, value in (sched.get("state") or {}).items():
            click.echo(f"  {key}: {json.dumps(value)}")
        click.echo(f"  policies available: {', '.join(ready)}"
                   + (f"; planned: {', '.join(planned)}" if planned else ""))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def lanes(client: ControlClient, as_json: bool) -> None:
    """The salus policy's lanes, jobs (P, E, iterations) and admission queue per GPU."""
    sched = _call(client, "status").get("scheduling") or {}
    if sched.get("name") != "salus":
        raise click.ClickException(f"the policy is {sched.get('name', 'unknown')!r}, not 'salus': no lanes")
    state = sched.get("state") or {}
    if as_json:
        _emit_json(state)
        return
    click.echo(f"salus, scheduler {state.get('scheduler')}")
    gpus = state.get("gpus") or {}
    if not gpus:
        click.echo("no job yet")
    for gpu, g in gpus.items():
        outside = f" + outside lanes {_size(g['outside'])}" if g.get("outside") else ""
        click.echo(f"GPU {gpu}: sum(P) {_size(g['persistent'])} + sum(L) {_size(g['lane_bytes'])}"
                   f"{outside} = {_size(g['used'])} of C {_size(g['capacity'])}")
        for lane in g["lanes"]:
            click.echo(f"  lane {lane['lane']}: size {_size(lane['size'])}, jobs "
                       + ", ".join(str(j["job"]) for j in lane["jobs"]))
        for j in g["jobs"]:
            where = ("refused" if j.get("refused") else f"lane {j['lane']}" if j["lane"] is not None
                     else "queued")
            it = j["iteration_s"]
            click.echo(f"  session {j['session']} ({j['tenant']}, pid {j['pid']}): {where}, "
                       f"P {_size(j['persistent'])}, E {_size(j['ephemeral'])}"
                       + ("" if j["recognized"] else " (not recognized: all persistent)")
                       + f", {j['iterations']} iterations"
                       + (f" of {it * 1e3:.1f} ms" if it else "")
                       + (f", about {j['remaining_s']:.1f} s left (SRTF's estimate)"
                          if state.get("scheduler") == "srtf" and j.get("remaining_s") is not None else "")
                       + (", running" if j["running"] else f", held: {j['held']}" if j["held"] else "")
                       + (f" ({j['refused']})" if j.get("refused") else ""))
        if g["queue"]:
            click.echo(f"  queue: {', '.join(f'session {q}' for q in g['queue'])}")


def _show_isolation(iso: dict[str, Any]) -> None:
    """Where tenants' work runs: the confined mode, engines with or without MPS (router/mps.py)."""
    if iso.get("serves"):
        click.echo(f"isolated pilotd: serves tenant {iso['serves']} alone"
                   + (", confined (an MPS client: its own GPU address space)" if iso.get("mps") else ""))
    elif iso.get("confined"):
        click.echo("confined mode: every tenant's work runs in a pilotd of its own, an MPS client "
                   "with its own GPU address space")
    elif iso.get("mps"):
        click.echo("isolated tenants are confined (their pilotds are MPS clients); the others share "
                   "this pilotd's context")
    mps = iso.get("mps_control")
    if mps:
        click.echo(f"MPS control daemon pid {mps['control_pid']}"
                   f"{'' if mps['running'] else ' NOT RUNNING'}: pipes {mps['pipe_dir']}, "
                   f"logs {mps['log_dir']}")
    for e in iso.get("engines") or []:
        click.echo(f"isolated tenant {e['tenant']}: pilotd pid {e['pid']} ({_size(e['capacity'])} "
                   f"per GPU), {e.get('confinement', 'engine')}")


def _show_faults(faults: list[dict[str, Any]]) -> None:
    """GPU faults since the service started, the last one in full."""
    if not faults:
        return
    f = faults[-1]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["detected"]))
    who = ", ".join(f"session {s['session']} of {s['tenant']} (pid {s['pid']})" for s in f["suspects"])
    if f.get("bystander"):  # another MPS client's fault; this pilotd's own work did not fault
        what = ("the MPS server tore every client down for another client's fault"
                + (f" (tenant {f['culprit']})" if f.get("culprit") else ""))
    else:
        what = (f"work of {who}" if f["known"] else f"work in flight: {who}" if who else
                "no session had work in flight")
    line = (f"GPU faults: {len(faults)}; last on GPU {f['gpu']} at {when}: error {f['error']}, "
            + what
            + (f"; tenant {f['tenant']}" if f.get("tenant", "unknown") != "unknown" else ""))
    if f.get("restarted"):
        line += f"; serving again after {f['restarted'] - f['detected']:.2f} s"
    click.echo(line)


def _show_engine_faults(faults: list[dict[str, Any]]) -> None:
    """Faults of isolated tenants' pilotds (each restarted alone), the last one named."""
    if not faults:
        return
    f = faults[-1]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["detected"]))
    click.echo(f"isolated tenants' GPU faults: {len(faults)}; last of {f['tenant']} on GPU "
               f"{f['gpu']} at {when}: {f.get('name') or 'error'} ({f['error']})")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def sessions(client: ControlClient, as_json: bool) -> None:
    """Sessions: tenant, pid, command line, memory, calls, state, and where each runs (RUNS IN:
    confined, engine or shared; docs/SECURITY.md)."""
    rows = _call(client, "sessions")
    if as_json:
        _emit_json(rows)
        return
    # RUNS IN: confined (a pilotd of its own over MPS), engine (of its own, no MPS) or shared
    click.echo(f"{'SESSION':>7} {'TENANT':<16} {'PID':>7} {'GPU':>3} {'DEVICE':>10} {'MANAGED':>10} "
               f"{'CALLS':>9} {'STATE':<9} {'RUNS IN':<8} COMMAND")
    if not rows:
        click.echo("no session")
    for r in rows:
        click.echo(f"{r['session']:>7} {r['tenant'][:16]:<16} {r['pid']:>7} {r['device']:>3} "
                   f"{_size(r['device_bytes']):>10} {_size(r.get('managed_bytes', 0)):>10} "
                   f"{r['calls']:>9} {r['state']:<9} {r.get('confinement', 'shared'):<8} "
                   f"{r['cmdline'][:50]}")
        p = r.get("policy")
        if p and r["state"] != p["state"]:
            click.echo(f"{'':>7} {p['state']}: {p['why']}")
        elif p:
            click.echo(f"{'':>7} {p['why']}")
        if r.get("priority", "normal") != "normal" or r.get("gated"):
            click.echo(f"{'':>7} priority {r.get('priority', 'normal')}"
                       + (": gated (a higher class is active on its GPU)" if r.get("gated") else ""))
        w = r.get("waiting")
        if w:  # a launch the policy holds, and why
            click.echo(f"{'':>7} waiting: kernel {w['kernel'] or '?'}: {w['reason'] or 'no reason given'}"
                       f" ({w['held_calls']} call(s) held behind it)")


@main.command()
@click.argument("session", type=int, required=False)
@click.option("--tenant", help="end every session of this tenant (e.g. slurm:job_42) instead")
@pass_client
def kill(client: ControlClient, session: int | None, tenant: str | None) -> None:
    """End SESSION: its memory is freed and its program's CUDA calls fail from now on."""
    if (session is None) == (tenant is None):
        raise click.UsageError("give a SESSION or --tenant, not both")
    if tenant is not None:
        ended = _call(client, "kill", tenant=tenant)
        sessions = ended["sessions"]
        click.echo(f"tenant {ended['tenant']}: {len(sessions)} session(s) ended"
                   + (f" ({', '.join(map(str, sessions))})" if sessions else ""))
        return
    _call(client, "kill", session=session)
    click.echo(f"session {session} ended")


@main.command()
@click.argument("gpu", type=int)
@pass_client
def drain(client: ControlClient, gpu: int) -> None:
    """Place no new sessions on GPU (running ones go on)."""
    _call(client, "drain", gpu=gpu)
    click.echo(f"GPU {gpu} is draining: no new sessions")


@main.command()
@click.argument("gpu", type=int)
@pass_client
def undrain(client: ControlClient, gpu: int) -> None:
    """Let GPU take new sessions again."""
    _call(client, "undrain", gpu=gpu)
    click.echo(f"GPU {gpu} takes new sessions")


@main.group()
def quota() -> None:
    """Device-memory quotas per tenant (a user, `user:NAME`, or a named tenant)."""


@quota.command("set")
@click.argument("tenant")
@click.argument("hard", required=False)
@click.option("--gpu", type=int, help="Only this GPU [default: every GPU].")
@click.option("--provisioned", metavar="SIZE",
              help="Guaranteed bytes: withheld from other tenants; MAdvise and MFit keep them on the GPU.")
@pass_client
def quota_set(client: ControlClient, tenant: str, hard: str | None, gpu: int | None,
              provisioned: str | None) -> None:
    """Set TENANT's hard limit, e.g. `pilotctl quota set alice 8GiB --gpu 0`."""
    r = _call(client, "quota.set", tenant=tenant, hard=hard, gpu=gpu, provisioned=provisioned)
    where = "every GPU" if r["gpu"] is None else f"GPU {r['gpu']}"
    exact = [size_text(n) if n is not None else "-" for n in (r["hard"], r["provisioned"])]
    click.echo(f"{r['tenant']} on {where}: hard {exact[0]}, provisioned {exact[1]}")


@quota.command("get")
@click.argument("tenant", required=False)
@click.option("--gpu", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def quota_get(client: ControlClient, tenant: str | None, gpu: int | None, as_json: bool) -> None:
    """TENANT's quota and usage per GPU [default: your own]."""
    r = _call(client, "quota.get", tenant=tenant, gpu=gpu)
    if as_json:
        _emit_json(r)
        return
    for g, q in r["gpus"].items():
        click.echo(f"{r['tenant']} GPU {g}: used {_size(q['used'])}, hard {_size(q['hard'])}, "
                   f"provisioned {_size(q['provisioned'])}")
        _echo_by_kind(q.get("by_kind") or {})
        if q.get("packed_managed"):
            click.echo(f"    of managed: {_size(q['packed_managed'])} in ranges small managed "
                       "allocations are packed into (charged in full: the allocations and the "
                       "slack around them)")
    pinned = r.get("pinned")
    if pinned:
        click.echo(f"{r['tenant']} pinned host memory: used {_size(pinned['used'])}, "
                   f"limit {_size(pinned['limit'])}")


def _echo_by_kind(by_kind: dict[str, int]) -> None:
    """What each allocation path charged (resource broker kinds)."""
    for kind, n in sorted(by_kind.items()):
        click.echo(f"  {kind:<8} {_size(n)}")


@quota.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def quota_list(client: ControlClient, as_json: bool) -> None:
    """Every quota set (yours only, unless you are an admin)."""
    r = _call(client, "quota.list")
    if as_json:
        _emit_json(r)
        return
    if not r:
        click.echo("no quota is set")
    for tenant, per in sorted(r.items()):
        for g, q in sorted(per.items()):
            where = "every GPU" if g == "*" else f"GPU {g}"
            click.echo(f"{tenant} on {where}: hard {_size(q['hard'])}, provisioned {_size(q['provisioned'])}")


@quota.command("unset")
@click.argument("tenant")
@click.option("--gpu", type=int)
@pass_client
def quota_unset(client: ControlClient, tenant: str, gpu: int | None) -> None:
    """Remove TENANT's quota (on one GPU, or all of them)."""
    r = _call(client, "quota.unset", tenant=tenant, gpu=gpu)
    click.echo(f"{r['tenant']}: quota removed")


@main.group()
def isolate() -> None:
    """Tenants whose work runs in a pilotd process of their own, so that their kernel faults
    reach only their own sessions (docs/ARCHITECTURE.md, GPU faults)."""


@isolate.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def isolate_list(client: ControlClient, as_json: bool) -> None:
    """Isolated tenants (from the config, or marked) and their running pilotd processes."""
    r = _call(client, "isolate.list")
    if as_json:
        _emit_json(r)
        return
    if r["configured"]:
        click.echo(f"isolated by the config: {', '.join(r['configured'])}")
    for tenant, mark in sorted(r["marked"].items()):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mark["since"]))
        how = " without MPS (its engine is no MPS client)" if mark.get("mps") is False else ""
        click.echo(f"{tenant}: isolated{how} since {since}: {mark['why']}")
    for e in r["engines"]:
        click.echo(f"{e['tenant']}: pilotd pid {e['pid']} on {e['socket']}, {_size(e['capacity'])} "
                   f"per GPU, {e.get('confinement', 'engine')}")
    if not (r["configured"] or r["marked"] or r["engines"]):
        click.echo("no tenant is isolated")


@isolate.command("set")
@click.argument("tenant")
@pass_client
def isolate_set(client: ControlClient, tenant: str) -> None:
    """Run TENANT's new sessions in a pilotd of their own, until cleared."""
    r = _call(client, "isolate.set", tenant=tenant)
    click.echo(f"{r['tenant']}: isolated (new sessions)")


@isolate.command("clear")
@click.argument("tenant")
@pass_client
def isolate_clear(client: ControlClient, tenant: str) -> None:
    """End TENANT's isolation mark (after a fault of theirs, or `isolate set`)."""
    r = _call(client, "isolate.clear", tenant=tenant)
    click.echo(f"{r['tenant']}: " + ("no longer marked isolated" if not r["isolated"]
                                     else "mark cleared, still isolated by the config"))


@main.group()
def share() -> None:
    """Compute shares: the percent of a GPU's SMs a tenant's kernels may use.

    \b
    A capped tenant's kernels run in an SM partition of its own (a green context): its share
    rounded down to the GPU's 8-SM units, at least one (25% is 32 of an H100's 132 SMs).
    While it has sessions on a GPU, uncapped sessions started then run on the SMs no capped
    tenant holds: they keep the rest. On an H100 a compute-bound kernel in a 25% partition ran
    at 0.243 of its whole-GPU throughput, beside a tenant in the rest at 0.758 (the driver
    directly; bench/RESULTS.md). Costs: SMs held stay unused while their tenant is idle; a
    session keeps the partition it started in, so a change applies to sessions started after
    the tenant's running ones end; an uncapped session that started before a capped tenant
    arrived keeps the whole GPU. pilotd run with PILOT_SM_SHARES=0 (or a GPU without green
    contexts) records shares without enforcing them; `set` then says "not enforced".
    """


@share.command("set")
@click.argument("tenant")
@click.argument("percent")
@click.option("--gpu", type=int, help="Only this GPU [default: every GPU].")
@pass_client
def share_set(client: ControlClient, tenant: str, percent: str, gpu: int | None) -> None:
    """Cap TENANT at PERCENT (1-100) of the SMs, e.g. `pilotctl share set alice 25 --gpu 0`."""
    r = _call(client, "share.set", tenant=tenant, percent=percent, gpu=gpu)
    where = "every GPU" if r["gpu"] is None else f"GPU {r['gpu']}"
    sms = ", ".join(f"GPU {g}: {v[0]} of {v[1]} SMs" if v else f"GPU {g}: not enforced"
                    for g, v in r["sms"].items())
    click.echo(f"{r['tenant']} on {where}: {r['percent']}% ({sms})")


@share.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def share_list(client: ControlClient, as_json: bool) -> None:
    """Every share set ("*": every GPU; the config's sm_share too), and the SMs each capped
    tenant with sessions holds now."""
    r = _call(client, "share.list")
    if as_json:
        _emit_json(r)
        return
    if not r["shares"]:
        click.echo("no compute share is set")
    for tenant, per in r["shares"].items():
        for g, percent in per.items():
            click.echo(f"{tenant} on {'every GPU' if g == '*' else f'GPU {g}'}: {percent}%")
    for g, rep in r["gpus"].items():
        for tenant, sms in rep["held"].items():
            click.echo(f"GPU {g}: {tenant} holds {sms} of {rep['sms']} SMs")


@share.command("unset")
@click.argument("tenant")
@click.option("--gpu", type=int)
@pass_client
def share_unset(client: ControlClient, tenant: str, gpu: int | None) -> None:
    """Remove TENANT's share set by pilotctl (on one GPU, or all of them)."""
    r = _call(client, "share.unset", tenant=tenant, gpu=gpu)
    click.echo(f"{r['tenant']}: share removed")


@main.group()
def gpus() -> None:
    """GPU allow-lists: the GPUs a tenant's programs may use, whatever their CUDA_VISIBLE_DEVICES.

    \b
    A tenant with an allow-list sees only those GPUs, renumbered from 0 in pilotd's order as
    CUDA numbers the GPUs of a device cgroup; CUDA_VISIBLE_DEVICES indexes count among them.
    A Slurm job's tenant ([slurm] job_tenants) gets no GPU until its prolog registers it
    (`pilotctl job start`). A change applies to sessions started after it.
    """


@gpus.command("set")
@click.argument("tenant")
@click.argument("gpu_list", metavar="GPUS")
@click.option("--pci-order", is_flag=True,
              help="GPUS are indexes in the host's PCI bus order (as nvidia-smi numbers them).")
@pass_client
def gpus_set(client: ControlClient, tenant: str, gpu_list: str, pci_order: bool) -> None:
    """Let TENANT use only GPUS (pilotd's GPU numbers, e.g. 0,2; or all, or none)."""
    r = _call(client, "gpus.set", tenant=tenant, gpus=gpu_list, pci_order=pci_order or None)
    click.echo(f"{r['tenant']}: GPUs {_gpu_names(r['gpus'])}")


def _gpu_names(gpu_list: list[int]) -> str:
    return ",".join(map(str, gpu_list)) or "none"


@gpus.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def gpus_list(client: ControlClient, as_json: bool) -> None:
    """Every allow-list (yours only unless you are an admin)."""
    r = _call(client, "gpus.list")
    if as_json:
        _emit_json(r)
        return
    if not r["tenants"]:
        click.echo("no GPU allow-list is set")
    for tenant, gpu_list in r["tenants"].items():
        click.echo(f"{tenant}: GPUs {_gpu_names(gpu_list)}")
    if r["slurm_jobs_need_one"]:
        click.echo("a Slurm job without one gets no GPU ([slurm] job_tenants)")


@gpus.command("unset")
@click.argument("tenant")
@pass_client
def gpus_unset(client: ControlClient, tenant: str) -> None:
    """Remove TENANT's allow-list (it may use every GPU again; a Slurm job, none)."""
    r = _call(client, "gpus.unset", tenant=tenant)
    click.echo(f"{r['tenant']}: GPU allow-list removed")


@main.group()
def job() -> None:
    """Slurm jobs (deploy/slurm: the prolog starts them, the epilog ends them)."""


@job.command("start")
@click.argument("job_id", metavar="JOB")
@click.option("--gpus", "gpu_list", required=True, metavar="GPUS",
              help="The GPUs the job's programs may use: 0,1 (pilotd's numbers), all, or none.")
@click.option("--pci-order", is_flag=True,
              help="GPUS are indexes in the host's PCI bus order (Slurm's, when gres.conf lists "
                   "/dev/nvidia0, 1, ... in order).")
@click.option("--mem", metavar="SIZE", help="The job's hard quota on each GPU, e.g. 8GiB.")
@click.option("--share", metavar="PERCENT", help="The job's compute share of each GPU (1-100).")
@pass_client
def job_start(client: ControlClient, job_id: str, gpu_list: str, pci_order: bool, mem: str | None,
              share: str | None) -> None:
    """Register Slurm job JOB (tenant slurm:job_JOB): its GPUs, quota and share."""
    r = _call(client, "job.start", job=job_id, gpus=gpu_list, pci_order=pci_order or None,
              mem=mem, share=share)
    click.echo(f"{r['tenant']}: GPUs {_gpu_names(r['gpus'])}, quota "
               f"{'-' if r['mem'] is None else size_text(r['mem'])}, share "
               f"{'-' if r['share'] is None else str(r['share']) + '%'}")


@job.command("end")
@click.argument("job_id", metavar="JOB")
@pass_client
def job_end(client: ControlClient, job_id: str) -> None:
    """Unregister Slurm job JOB: no new session, its sessions ended, its quota and share gone."""
    r = _call(client, "job.end", job=job_id)
    click.echo(f"{r['tenant']}: {len(r['sessions'])} session(s) ended"
               + ("" if r["registered"] else " (it was not registered)"))


@main.group()
def priority() -> None:
    """Priority classes: high, normal (the default) and low.

    While a tenant of a higher class is active on a GPU (it made a call within [priority]
    active_window), the sessions of lower classes there are gated: each keeps at most [priority]
    gated_inflight kernels, library calls or memsets in flight, and its further work waits.
    A tenant of the highest active class is never held by the gate.
    """


@priority.command("set")
@click.argument("tenant")
@click.argument("level", type=click.Choice(["high", "normal", "low"], case_sensitive=False))
@pass_client
def priority_set(client: ControlClient, tenant: str, level: str) -> None:
    """Put TENANT in class LEVEL, e.g. `pilotctl priority set alice high` (live sessions too)."""
    r = _call(client, "priority.set", tenant=tenant, level=level.lower())
    click.echo(f"{r['tenant']}: priority {r['priority']}")


@priority.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@pass_client
def priority_list(client: ControlClient, as_json: bool) -> None:
    """Every tenant's class set by the config or pilotctl, and the class active on each GPU."""
    r = _call(client, "priority.list")
    if as_json:
        _emit_json(r)
        return
    _show_priorities(r)


@priority.command("unset")
@click.argument("tenant")
@pass_client
def priority_unset(client: ControlClient, tenant: str) -> None:
    """Remove TENANT's class set by pilotctl (the config's, or normal, applies again)."""
    r = _call(client, "priority.unset", tenant=tenant)
    click.echo(f"{r['tenant']}: priority {r['priority']}")


def _show_priorities(r: dict[str, Any]) -> None:
    if not r["tenants"]:
        click.echo("every tenant is normal: no priority gating")
    for tenant, p in r["tenants"].items():
        click.echo(f"{tenant}: {p['priority']} ({p['from']})")
    if r["enabled"]:
        click.echo(f"gate: at most {r['gated_inflight']} pieces of GPU work in flight per gated "
                   f"session; active for {r['active_window_s'] * 1e3:g} ms after a call")
        for g, level in r["active"].items():
            click.echo(f"GPU {g}: highest class active: {level or 'none'}")
    pre = r.get("preemption")
    if r["enabled"] and pre:
        click.echo(f"preemption: gated sessions' kernels run as preemptible variants (chunk "
                   f"{pre['chunk']}, up to {pre.get('parts', 1)} preemptible part(s) a launch): "
                   f"{pre['preemptible_kernels']} kernel(s) of {pre['modules']} "
                   f"module(s) preemptible, {len(pre.get('kernels_not_preemptible', {}))} not; "
                   f"JIT {pre['jit_seconds']:g} s")
        for reason in pre["modules_without_variants"]:
            click.echo(f"  a module without variants: {reason}")
        for kernel, reason in sorted(pre.get("kernels_not_preemptible", {}).items())[:20]:
            click.echo(f"  {kernel}: {reason}")
        if pre.get("choices"):
            click.echo("  how gated kernels run (per kernel and grid, measured): " + ", ".join(
                f"{how} {n}" for how, n in sorted(pre["choices"].items())))
        for kernel, how in sorted(pre.get("kernel_choices", {}).items())[:20]:
            click.echo(f"  {kernel}: {how}")
        for g, w in pre["gpus"].items():
            if w.get("usable"):
                click.echo(f"  GPU {g}: retreat words raised {w['raises']} time(s), lowered "
                           f"{w['clears']}")
        for tenant, t in pre.get("tenants", {}).items():
            click.echo(f"  {tenant}: {t['preempted']} preemption(s), "
                       f"{t['blocks_deferred']} block(s) run after their retreat"
                       + (f", {t['blocks_abandoned']} abandoned inside and run again"
                          if t.get("blocks_abandoned") else ""))
        if pre.get("loop_tenants") or pre.get("loop_programs"):
            click.echo("  loop-level preemption (idempotent kernels only) for: " + ", ".join(
                [*(f"tenant {t}" for t in pre.get("loop_tenants", [])),
                 *(f"program {p}" for p in pre.get("loop_programs", []))]))
            for kernel, how in sorted(pre.get("loop_level", {}).items())[:20]:
                click.echo(f"    {kernel}: {how}")
        if pre.get("chaos_s"):
            click.echo(f"  [priority] preempt_chaos = {pre['chaos_s']:g} s: words raised at random "
                       "(a test setting)")
    elif r["enabled"] and "preemption" in r:
        click.echo("preemption: off ([priority] preempt = false): the gate alone")
    if pre and pre.get("policy_preemptions"):
        drains = [int(n) for n in pre.get("drain") or ()]
        shown = ", ".join(f"<{_bucket_us(k)} us: {n}" for k, n in enumerate(drains) if n)
        click.echo(f"policy preemptions: {pre['policy_preemptions']} made, "
                   f"{pre.get('policy_resumes', 0)} resumed; drains {shown or 'none yet'}")


def _bucket_us(bucket: int) -> str:
    """The upper bound of a log2 bucket of microseconds (ptx_preempt.spread_bucket), shown."""
    return "inf" if bucket >= 15 else f"{(1 << bucket) * 1.024:.0f}"


if __name__ == "__main__":
    main()
