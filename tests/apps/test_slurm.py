"""pilot under a real single-node Slurm (Debian's slurm-wlm): munged, slurmctld and slurmd started
here on localhost, deploy/slurm/pilot-prolog.sh and pilot-epilog.sh as the cluster's Prolog and
Epilog, and a sim pilotd with `[slurm] job_tenants = true`. An `srun --gres=pilotmem:N` job's
program runs under pilot as tenant slurm:job_<id>, with an N MiB quota in force; cancelling a job
ends its sessions and removes its quota.

Needs root (slurmd runs jobs as their users, and the step daemons must be root's) and the Slurm
and munge binaries (.ci/run installs them when it is root); skipped, saying why, otherwise."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PILOTCTL, OwnDaemon, StartPilotd

REPO = Path(__file__).resolve().parents[2]
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "scancel", "sinfo", "scontrol")
NODE = "pilotci"
READY_S = 60.0

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or any(shutil.which(b) is None for b in BINARIES),
    reason="the Slurm test needs root and slurm-wlm + munge (apt-get install slurmctld slurmd "
           "slurm-client munge; .ci/run does so when it runs as root)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """munged, slurmctld and slurmd of one test, in a directory of their own."""

    def __init__(self, daemon: OwnDaemon, pilotctl: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pilot-slurm-"))
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "munge.sock"
        # the prolog and epilog get slurmd's bare environment: a wrapper says where pilot is
        ctl = d / "pilotctl"
        ctl.write_text("#!/bin/bash\nexec " + " ".join(shlex.quote(a) for a in pilotctl) + ' "$@"\n')
        ctl.chmod(0o755)
        env_lines = (f"export PILOTCTL={ctl}\n"
                     f"export PILOT_CONTROL_SOCKET={daemon.control_socket}\n")
        for name in ("prolog", "epilog"):
            wrapper = d / f"{name}.sh"
            wrapper.write_text(f"#!/bin/bash\n{env_lines}"
                               f"exec bash {REPO / 'deploy' / 'slurm' / f'pilot-{name}.sh'} "
                               f"2>>{d / 'log' / (name + '.log')}\n")
            wrapper.chmod(0o755)
        (d / "gres.conf").write_text(f"NodeName={NODE} Name=pilotmem Count=65536\n")
        self.conf = d / "slurm.conf"
        self.conf.write_text("\n".join((
            "ClusterName=pilotci", "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "KillWait=2", "GresTypes=pilotmem",
            f"Prolog={d / 'prolog.sh'}", f"Epilog={d / 'epilog.sh'}", "PrologFlags=Alloc",
            f"NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 "
            "Gres=pilotmem:65536 State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP", "")))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._start(["munged", "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={key}",
                     f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                     f"--seed-file={d / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged")
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start(["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_idle, "slurmd to register")

    def _start(self, argv: list[str]) -> None:
        log = (self.dir / "log" / f"{argv[0]}.out").open("wb")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _wait(self, ready: object, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                pytest.fail(f"Slurm set-up: no {what} within {READY_S:.0f} s\n{self.logs()}")
            time.sleep(0.2)

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.strip()
        return out in ("idle", "mix", "alloc")

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"$ {' '.join(argv)}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}\n"
                        f"{self.logs()}")
        return proc

    def logs(self) -> str:
        parts = []
        for path in sorted((self.dir / "log").iterdir()):
            text = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster(start_pilotd: StartPilotd) -> Iterator[tuple[Cluster, OwnDaemon]]:
    daemon = start_pilotd(config="[slurm]\njob_tenants = true\n")
    c = Cluster(daemon, PILOTCTL)
    try:
        yield c, daemon
    finally:
        c.stop()


def _sessions(daemon: OwnDaemon) -> list[dict[str, object]]:
    return daemon.sessions()


def test_a_job_runs_under_pilot_as_its_own_tenant_with_its_quota(cluster, app_binaries, shim_path) -> None:
    c, daemon = cluster
    env = ["env", f"LD_PRELOAD={shim_path}", f"PILOT_SOCKET={daemon.socket}"]
    # 64 MiB: the 256 MiB of module globals do not fit, the rest does
    small = c.run("srun", "--gres=pilotmem:64", "-N1", *env, str(app_binaries["quota_paths"]))
    assert "cudaMemcpyToSymbol g_big: cudaErrorMemoryAllocation" in small.stdout, small.stdout
    assert "cudaMalloc 8MiB: cudaSuccess" in small.stdout and "done" in small.stdout
    assert "tenant=slurm:job_" in daemon.log()
    big = c.run("srun", "--gres=pilotmem:1024", "-N1", *env, str(app_binaries["quota_paths"]))
    assert "cudaErrorMemoryAllocation" not in big.stdout, big.stdout
    prolog = (c.dir / "log" / "prolog.log").read_text()
    assert "quota 64MiB" in prolog and "quota 1024MiB" in prolog, prolog


def test_cancelling_a_job_ends_its_sessions_and_its_quota(cluster, app_binaries, shim_path) -> None:
    c, daemon = cluster
    env = ["env", f"LD_PRELOAD={shim_path}", f"PILOT_SOCKET={daemon.socket}"]
    holder = subprocess.Popen(
        ["srun", "--gres=pilotmem:512", "-N1", "bash", "-c",
         f"sleep 600 | {' '.join(env)} {app_binaries['quota_paths']} hold"],
        env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + READY_S
        rows: list[dict[str, object]] = []
        while not rows:
            rows = [r for r in _sessions(daemon) if str(r["tenant"]).startswith("slurm:job_")]
            if time.monotonic() > deadline or holder.poll() is not None:
                pytest.fail(f"the job's session never showed\n{c.logs()}\n{daemon.log_tail()}")
            time.sleep(0.2)
        tenant = str(rows[0]["tenant"])
        job = tenant.removeprefix("slurm:job_")
        assert "512.0 MiB" in daemon.ctl("quota", "get", tenant).stdout or \
            "512MiB" in daemon.ctl("quota", "get", tenant).stdout
        c.run("scancel", job)
        deadline = time.monotonic() + READY_S
        while any(r["tenant"] == tenant for r in _sessions(daemon)) or \
                "epilog" not in "".join(p.name for p in (c.dir / "log").iterdir()):
            if time.monotonic() > deadline:
                pytest.fail(f"job {job} cancelled, its session stayed\n{c.logs()}\n{daemon.log_tail()}")
            time.sleep(0.2)
        deadline = time.monotonic() + READY_S
        while tenant in daemon.ctl("quota", "list").stdout:
            if time.monotonic() > deadline:
                pytest.fail(f"the epilog left {tenant}'s quota\n{c.logs()}")
            time.sleep(0.2)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
