"""pilot under a real single-node Slurm (Debian's slurm-wlm): munged, slurmctld and slurmd started
here on localhost with `ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup`
(`ConstrainDevices=yes`), `GresTypes=gpu,pilotmem,pilotshare` (two `gpu`s on fake device files,
so Slurm's bookkeeping and device cgroup are real), deploy/slurm/pilot-prolog.sh and
pilot-epilog.sh as the cluster's Prolog and Epilog, and a sim pilotd of two GPUs with
`[slurm] job_tenants = true`.

Jobs of two ordinary users (made here with useradd, removed after) each get one GPU: their
programs under the shim see only that GPU, as device 0, whether they keep the
CUDA_VISIBLE_DEVICES Slurm set, unset it or name the other GPU (by index or UUID); the job's
`pilotmem` is its quota (`pilotshare` its compute share); scancel ends the job's sessions and its
registration in pilotd. Root's jobs run the same way (a quota test).

Needs root (slurmd runs jobs as their users, and the step daemons must be root's), useradd, and the
Slurm and munge binaries (.ci/run installs them when it is root); skipped, saying why, otherwise.
Where the kernel's cgroups cannot host Slurm's cgroup plugins (slurmd does not come up with
them), the cluster falls back to proctrack/linuxproc and task/none, the device-cgroup test is
skipped naming slurmd's error, and the rest runs: what pilot enforces does not depend on them.

Slurm's GPU i is the i-th file of gres.conf; the prolog passes it in PCI bus order
(`--pci-order`), and the sim's PCI order is GPU 1, then GPU 0 (test_visible_devices.py).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps_daemons import PILOTCTL, OwnDaemon
from test_visible_devices import expected, uuid

REPO = Path(__file__).resolve().parents[2]
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "scancel", "sinfo", "scontrol", "useradd", "userdel")
NODE = "pilotci"
READY_S = 60.0
USERS = ("pilotci-a", "pilotci-b")
PILOT_GPU_OF_SLURM_GPU = {0: 1, 1: 0}  # Slurm's (PCI order) -> the sim pilotd's

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or any(shutil.which(b) is None for b in BINARIES)
    or os.environ.get("PILOT_APPS_NATIVE") == "1",
    reason="the Slurm test needs root, useradd and slurm-wlm + munge (apt-get install slurmctld "
           "slurmd slurm-client munge; .ci/run does so when it runs as root), and pilot's sim")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _world_readable(path: Path) -> bool:
    """Whether any user can read `path` (every directory above it searchable)."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & (stat.S_IXOTH if p != path else stat.S_IROTH):
            return False
    return True


class Cluster:
    """munged, slurmctld and slurmd of one module, in a directory of their own."""

    def __init__(self, daemon: OwnDaemon, pilotctl: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pilot-slurm-"))
        self.dir.chmod(0o755)  # jobs of ordinary users run here, and reach munged's socket
        d = self.dir
        for sub in ("state", "spool", "log", "dev", "bin"):
            (d / sub).mkdir()
            (d / sub).chmod(0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "munge.sock"
        # Slurm's GPUs: character devices of a major no driver of this host has (195 is
        # NVIDIA's), so a job's device cgroup can be checked by opening them (ENXIO: allowed)
        for i in range(2):
            os.mknod(d / "dev" / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
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
        shutil.copy(REPO / "deploy" / "slurm" / "pilot-taskprolog.sh", d / "taskprolog.sh")
        (d / "taskprolog.sh").chmod(0o755)  # run as the job's user: the repository may be root's
        (d / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={d / 'dev'}/gpu[0-1]\n"
                                     f"NodeName={NODE} Name=pilotmem Count=65536\n"
                                     f"NodeName={NODE} Name=pilotshare Count=100\n")
        self.conf = d / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._start(["munged", "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={key}",
                     f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                     f"--seed-file={d / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged")
        self.cgroup_failure: str | None = None
        if not self._start_slurm(cgroup=True):
            self.cgroup_failure = self._slurmd_error()
        else:  # slurmd may come up and fail each step (a cgroup it cannot create or join)
            probe = self.run("srun", "-N1", "true", check=False, timeout=READY_S)
            if probe.returncode != 0:
                self.cgroup_failure = f"a step failed: {probe.stderr.strip()}; {self._slurmd_error()}"
        if self.cgroup_failure is not None:
            self._stop_slurm()
            if not self._start_slurm(cgroup=False):
                pytest.fail(f"Slurm set-up: slurmd did not register within {READY_S:.0f} s, "
                            f"with cgroup plugins or without\n{self.logs()}")

    def _write_conf(self, cgroup: bool) -> None:
        d = self.dir
        (d / "cgroup.conf").write_text("\n".join((
            "CgroupPlugin=autodetect", "IgnoreSystemd=yes", "ConstrainDevices=yes",
            "ConstrainCores=no", "ConstrainRAMSpace=no", "")))
        self.conf.write_text("\n".join((
            "ClusterName=pilotci", "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            *(("ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup") if cgroup else
              ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",  # and Slurm's CUDA_
               f"TaskProlog={d / 'taskprolog.sh'}")),  # VISIBLE_DEVICES off
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "KillWait=2", "GresTypes=gpu,pilotmem,pilotshare",
            f"Prolog={d / 'prolog.sh'}", f"Epilog={d / 'epilog.sh'}", "PrologFlags=Alloc",
            f"NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 "
            "Gres=gpu:2,pilotmem:65536,pilotshare:100 State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP", "")))

    def _start_slurm(self, cgroup: bool) -> bool:
        """slurmctld and slurmd; whether the node registered (idle) in time."""
        self._write_conf(cgroup)
        for path in (self.dir / "log").glob("slurm*"):
            path.unlink()
        self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start(["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])
        deadline = time.monotonic() + READY_S
        while not self._node_idle():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                return False
            time.sleep(0.2)
        return True

    def _slurmd_error(self) -> str:
        log = self.dir / "log" / "slurmd.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        errors = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()]
        return "; ".join((errors or lines or ["slurmd wrote no log"])[-3:])

    def _stop_slurm(self) -> None:
        for p in self.procs[1:]:
            _stop(p)
        del self.procs[1:]

    def _start(self, argv: list[str]) -> None:
        log = (self.dir / "log" / f"{argv[0]}.out").open("ab")
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

    def run(self, *argv: str, check: bool = True, timeout: float = 90,
            user: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              **self.as_user(user))
        if check and proc.returncode != 0:
            pytest.fail(f"$ {' '.join(argv)}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}\n"
                        f"{self.logs()}")
        return proc

    def as_user(self, user: str | None) -> dict[str, object]:
        """subprocess arguments that run a command as `user` (None: root) in the cluster's dir."""
        if user is None:
            return {"env": self.env, "cwd": self.dir}
        pw = pwd.getpwnam(user)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(self.conf),
               "HOME": str(self.dir), "USER": user, "LOGNAME": user}
        return {"env": env, "cwd": self.dir, "user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def logs(self) -> str:
        parts = []
        for path in sorted((self.dir / "log").iterdir()):
            text = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):
            _stop(p)
        shutil.rmtree(self.dir, ignore_errors=True)


def _stop(p: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, ...]]:
    """Two ordinary users (made here unless they exist; those made here are removed after)."""
    made = []
    try:
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                proc = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", name],
                                      capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    pytest.skip(f"useradd {name} failed: {proc.stderr.strip()}")
                made.append(name)
        yield USERS
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cluster(users: tuple[str, ...]) -> Iterator[tuple[Cluster, OwnDaemon]]:
    daemon = OwnDaemon("--sim-devices", "2", config="[slurm]\njob_tenants = true\n")
    os.chmod(daemon.dir, 0o755)  # its sockets are for every user (pilotd checks who calls)
    c = Cluster(daemon, PILOTCTL)
    try:
        yield c, daemon
    finally:
        c.stop()
        daemon.stop()
        daemon.remove()


@pytest.fixture(scope="module")
def programs(cluster: tuple[Cluster, OwnDaemon], app_binaries: dict, shim_path: str) -> dict[str, str]:
    """The test programs where the jobs' users can run them, and the shim."""
    c, _ = cluster
    shim = Path(shim_path)
    if not _world_readable(shim):  # a Python under /root (CI's): the jobs load a copy of the shim
        copy = c.dir / "bin" / shim.name
        shutil.copy(shim, copy)
        copy.chmod(0o755)
        shim = copy
    if not _world_readable(shim):
        pytest.skip(f"the shim {shim} is not readable by other users: jobs could not load it")
    out = {"shim": str(shim)}
    for name in ("devices", "quota_paths"):
        shutil.copy(app_binaries[name], c.dir / "bin" / name)
        (c.dir / "bin" / name).chmod(0o755)
        out[name] = str(c.dir / "bin" / name)
    return out


def _pilot_env(daemon: OwnDaemon, programs: dict[str, str], *env_options: str) -> list[str]:
    """`env [OPTIONS] LD_PRELOAD=<shim> PILOT_SOCKET=<daemon's>`: a command under pilot follows."""
    return ["env", *env_options, f"LD_PRELOAD={programs['shim']}", f"PILOT_SOCKET={daemon.socket}"]


def _job_script(daemon: OwnDaemon, programs: dict[str, str], then: str = "") -> str:
    """A job's shell script: devices.cu under pilot with the CUDA_VISIBLE_DEVICES Slurm set,
    unset, "1" and each GPU's UUID, each run after a `== NAME` line; then `then`."""
    run = " ".join(_pilot_env(daemon, programs))
    unset = " ".join(_pilot_env(daemon, programs, "-u", "CUDA_VISIBLE_DEVICES"))
    dev = programs["devices"]
    return "; ".join((
        'echo "== job $SLURM_JOB_ID gpus $SLURM_STEP_GPUS cvd ${CUDA_VISIBLE_DEVICES-unset}"',
        f"echo '== slurm'; {run} {dev}",
        f"echo '== unset'; {unset} {dev}",
        f"echo '== index 1'; {run} CUDA_VISIBLE_DEVICES=1 {dev}",
        *(f"echo '== uuid {g}'; {run} CUDA_VISIBLE_DEVICES={uuid(g)} {dev}" for g in (0, 1)),
        *([then] if then else [])))


def _sections(text: str) -> dict[str, list[str]]:
    """A job's output by `== NAME` section ("head": the first line's job, gpus and cvd)."""
    out: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("== job "):
            out["head"] = line.split()[2:]
        elif line.startswith("== "):
            name = line[3:]
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def _check_job_sees_only(sections: dict[str, list[str]], job_output: str, context: str,
                         cgroup: bool) -> int:
    """Asserts what a one-GPU job's programs saw; returns the pilot GPU it had."""
    head = sections.get("head")
    assert head and head[1] == "gpus" and head[2].isdigit(), job_output + context
    gpu = PILOT_GPU_OF_SLURM_GPU[int(head[2])]
    other = 1 - gpu
    # Slurm's CUDA_VISIBLE_DEVICES under ConstrainDevices; without it, pilot-taskprolog.sh unsets it
    assert head[4] == "0" if cgroup else head[4] == "unset", job_output
    for name, want in (("slurm", [gpu]), ("unset", [gpu]), ("index 1", []),
                       (f"uuid {gpu}", [gpu]), (f"uuid {other}", [])):
        assert sections.get(name) == expected(want), f"{name}:\n{job_output}{context}"
    return gpu


def _wait_for(what: str, ready: object, context: object, seconds: float = 3 * READY_S) -> None:
    deadline = time.monotonic() + seconds
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds:.0f} s\n{context()}")  # type: ignore[operator]
        time.sleep(0.2)


def test_users_jobs_see_only_their_gpus_and_scancel_cleans_up(cluster, programs) -> None:
    c, daemon = cluster
    a, b = USERS
    context = lambda: f"\n{c.logs()}\n--- pilotd\n{daemon.log_tail(60)}"  # noqa: E731
    hold = (f"echo '== hold'; sleep 600 | "
            f"{' '.join(_pilot_env(daemon, programs, '-u', 'CUDA_VISIBLE_DEVICES'))} "
            f"{programs['quota_paths']} hold")
    holder = subprocess.Popen(
        ["srun", "-u", "--gres=gpu:1,pilotmem:64", "-N1", "bash", "-c",
         _job_script(daemon, programs, hold)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **c.as_user(a))  # type: ignore[call-overload]
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(ln.rstrip("\n") for ln in holder.stdout),
                                  daemon=True)  # type: ignore[union-attr]
        reader.start()
        # A's checks ran, and it holds a session on its GPU
        _wait_for(f"user {a}'s job did not get to hold its GPU",
                  lambda: "holding" in lines or holder.poll() is not None,
                  lambda: "\n".join(lines) + context())
        if "holding" not in lines:
            reader.join(5)
            pytest.fail(f"user {a}'s job ended early:\n" + "\n".join(lines) + context())
        a_out = "\n".join(list(lines))
        a_sections = _sections(a_out)
        a_gpu = _check_job_sees_only(a_sections, a_out, context(), c.cgroup_failure is None)
        # its pilotmem is its quota: 64 MiB, and quota_paths' 256 MiB of globals do not fit
        assert "cudaMemcpyToSymbol g_big: cudaErrorMemoryAllocation" in a_sections["hold"], a_out
        assert "cudaMalloc 8MiB: cudaSuccess" in a_sections["hold"], a_out
        a_job = a_sections["head"][0]
        a_tenant = f"slurm:job_{a_job}"
        assert f"{a_tenant}: GPUs {a_gpu}" in daemon.ctl("gpus", "list").stdout

        # B's job meanwhile: the other GPU, and nothing of A's
        b_proc = c.run("srun", "-u", "--gres=gpu:1", "-N1", "bash", "-c", _job_script(daemon, programs),
                       user=b, timeout=3 * READY_S)
        b_sections = _sections(b_proc.stdout)
        b_gpu = _check_job_sees_only(b_sections, b_proc.stdout, context(), c.cgroup_failure is None)
        assert b_gpu != a_gpu, b_proc.stdout + a_out
        b_tenant = f"slurm:job_{b_sections['head'][0]}"
        log = daemon.log()
        assert f"tenant={a_tenant}" in log and f"tenant={b_tenant}" in log
        # B's job ended: its epilog unregistered it; A's is still there
        _wait_for(f"{b_tenant} still registered after its job ended",
                  lambda: b_tenant not in daemon.ctl("gpus", "list").stdout, context)
        assert a_tenant in daemon.ctl("gpus", "list").stdout

        # scancel A: its session ends, its registration and quota go
        assert any(r["tenant"] == a_tenant for r in daemon.sessions())
        c.run("scancel", a_job)
        _wait_for(f"job {a_job} cancelled, its session stayed",
                  lambda: not any(r["tenant"] == a_tenant for r in daemon.sessions()), context)
        _wait_for(f"the epilog left {a_tenant} registered",
                  lambda: a_tenant not in daemon.ctl("gpus", "list").stdout
                  and a_tenant not in daemon.ctl("quota", "list").stdout, context)
        epilog = (c.dir / "log" / "epilog.log").read_text()
        assert re.search(rf"job {a_job}: {a_tenant}: \d+ session\(s\) ended", epilog), epilog
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def test_a_job_cannot_open_another_jobs_gpu_device(cluster, programs) -> None:
    """task/cgroup's device cgroup (ConstrainDevices): the job's own GPU file opens (ENXIO: no
    driver behind it), the other one is denied (EPERM)."""
    c, _ = cluster
    if c.cgroup_failure is not None:
        pytest.skip(f"slurmd did not come up with proctrack/cgroup + task/cgroup here, so this ran "
                    f"with proctrack/linuxproc + task/none: {c.cgroup_failure}")
    try:
        (c.dir / "dev" / "gpu0").open("rb").close()
    except PermissionError:
        pytest.skip("this host's own device cgroup (a container's) denies the fake GPU device "
                    "c 195:0 to root already, so Slurm's ConstrainDevices cannot be seen here")
    except OSError:
        pass  # ENXIO: no driver behind it, as expected
    script = "echo gpus=$SLURM_STEP_GPUS; " + "; ".join(
        f"cat {c.dir / 'dev' / f'gpu{i}'} 2>&1 | sed 's/^/gpu{i}: /'" for i in (0, 1))
    out = c.run("srun", "--gres=gpu:1", "-N1", "bash", "-c", script, user=USERS[0]).stdout
    mine = int(out.split("gpus=")[1].split()[0])
    said = {ln.split(":", 1)[0]: ln for ln in out.splitlines() if ln.startswith("gpu")}
    assert said[f"gpu{mine}"].endswith("No such device or address"), out
    assert said[f"gpu{1 - mine}"].endswith("Operation not permitted"), out


def test_root_jobs_quota_and_share_follow_its_gres(cluster, programs) -> None:
    c, daemon = cluster
    env = _pilot_env(daemon, programs)
    small = c.run("srun", "--gres=gpu:1,pilotmem:64,pilotshare:25", "-N1", *env, programs["quota_paths"])
    assert "cudaMemcpyToSymbol g_big: cudaErrorMemoryAllocation" in small.stdout, small.stdout
    assert "cudaMalloc 8MiB: cudaSuccess" in small.stdout and "done" in small.stdout
    big = c.run("srun", "--gres=gpu:1,pilotmem:1024", "-N1", *env, programs["quota_paths"])
    assert "cudaErrorMemoryAllocation" not in big.stdout, big.stdout
    prolog = (c.dir / "log" / "prolog.log").read_text()
    assert "quota 64 MiB, share 25%" in prolog and "quota 1 GiB, share -" in prolog, prolog
    # a job without a gpu GRES gets no GPU from pilot (PILOT_SLURM_NO_GPU=none)
    none = c.run("srun", "-N1", *env, programs["devices"])
    assert none.stdout.splitlines() == expected([]), none.stdout
