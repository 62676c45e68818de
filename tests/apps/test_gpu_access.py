"""GPU allow-lists (resources/gpu_access.py), end to end: devices.cu under pilot against a sim pilotd
of three GPUs. A tenant allowed some GPUs sees only those, renumbered from 0, whatever its
CUDA_VISIBLE_DEVICES says (indices count among the allowed GPUs, as in a device cgroup; another
GPU's UUID selects nothing); with `[slurm] job_tenants`, a job's programs get no GPU until
`pilotctl job start` registers the job, then only its GPUs, and none again after `job end`.

The Slurm job is faked as tests/unit/test_slurm_identity.py does (a root-owned process named
`slurmstepd: [JOB.0]` above the program), so that part needs root; tests/apps/test_slurm.py runs
the same through a real slurmd. Sim facts (test_visible_devices.py): PCI bus order is 1, 0, 2.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from collections.abc import Iterator

import pytest
from apps_daemons import OwnDaemon, StartPilotd
from test_visible_devices import check, device_env, expected, last_session_gpus, uuid

if os.environ.get("PILOT_APPS_NATIVE") == "1":
    pytest.skip("needs pilot's sim daemons (three GPUs of known UUIDs)", allow_module_level=True)

JOB = "7731"


@pytest.fixture(scope="module")
def shared() -> Iterator[OwnDaemon]:
    daemon = OwnDaemon("--sim-devices", "3", config="[slurm]\njob_tenants = true\n")
    try:
        yield daemon
    finally:
        daemon.stop()
        daemon.remove()


@pytest.fixture
def daemon(shared: OwnDaemon) -> Iterator[OwnDaemon]:
    """The module's daemon, with no allow-list of this test's user before and after."""
    shared.ctl("gpus", "unset", getpass.getuser(), ok=False)
    yield shared
    shared.ctl("gpus", "unset", getpass.getuser(), ok=False)


def run(app_binaries: dict, shim_path: str, daemon: OwnDaemon, visible: str | None,
        order: str | None = None, job: str | None = None) -> subprocess.CompletedProcess[str]:
    """devices.cu with that CUDA_VISIBLE_DEVICES (None: unset), inside Slurm job `job` if given."""
    env = device_env(shim_path, daemon.socket, visible, order)
    argv = [str(app_binaries["devices"])]
    if job is not None:  # the step daemon stays the program's parent (`; true`: no exec)
        argv = ["bash", "-c", f"exec -a 'slurmstepd: [{job}.0]' bash -c '\"$1\"; true' stepd \"$0\"",
                *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


ALLOWED_0_1 = [
    # (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, host GPUs seen) for a tenant allowed GPUs 0 and 1
    (None, None, [0, 1]),
    ("1", None, [1]),
    ("1,0", None, [1, 0]),
    ("2", None, []),  # the host's GPU 2 is not there: index 2 is past the last
    ("0,2", None, [0]),
    (uuid(2), None, []),  # nor is its UUID
    (uuid(1), None, [1]),
    ("GPU-4", None, []),  # a prefix of GPUs 0 and 1: ambiguous among the allowed too
    ("0", "PCI_BUS_ID", [1]),  # PCI order among the allowed: bus 0x1B (GPU 1) first
]


@pytest.mark.parametrize(("visible", "order", "gpus"), ALLOWED_0_1,
                         ids=[f"{v!r}-{o}" for v, o, _ in ALLOWED_0_1])
def test_a_tenant_sees_only_its_allowed_gpus(app_binaries: dict, shim_path: str, daemon: OwnDaemon,
                                             visible: str | None, order: str | None,
                                             gpus: list[int]) -> None:
    daemon.ctl("gpus", "set", getpass.getuser(), "0,1")
    proc = run(app_binaries, shim_path, daemon, visible, order)
    check(proc, expected(gpus), daemon)
    if gpus:
        assert last_session_gpus(daemon) == gpus, daemon.log()


def test_one_allowed_gpu_is_device_0_and_none_is_no_device(app_binaries: dict, shim_path: str,
                                                           daemon: OwnDaemon) -> None:
    me = getpass.getuser()
    daemon.ctl("gpus", "set", me, "2")
    for visible in (None, "0"):
        check(run(app_binaries, shim_path, daemon, visible), expected([2]), daemon)
        assert last_session_gpus(daemon) == [2]
    check(run(app_binaries, shim_path, daemon, "1"), expected([]), daemon)
    daemon.ctl("gpus", "set", me, "none")
    check(run(app_binaries, shim_path, daemon, None), expected([]), daemon)
    assert "its GPU allow-list is empty" in daemon.log()
    assert f"user:{me}: GPUs none" in daemon.ctl("gpus", "list").stdout
    daemon.ctl("gpus", "unset", me)
    check(run(app_binaries, shim_path, daemon, None), expected([0, 1, 2]), daemon)


def test_gpus_set_refuses_what_is_not_there(daemon: OwnDaemon) -> None:
    me = getpass.getuser()
    bad = daemon.ctl("gpus", "set", me, "3", ok=False)
    assert bad.returncode == 1 and "no GPU 3 (this daemon serves [0, 1, 2])" in bad.stderr
    twice = daemon.ctl("gpus", "set", me, "1,1", ok=False)
    assert twice.returncode == 1 and "named twice" in twice.stderr
    pci = daemon.ctl("gpus", "set", me, "0", "--pci-order")  # PCI index 0 is the sim's GPU 1
    assert f"user:{me}: GPUs 1" in pci.stdout
    assert "no GPU allow-list" in daemon.ctl("gpus", "unset", "uid:4242", ok=False).stderr


@pytest.mark.skipif(os.getuid() != 0, reason="a (fake) slurmstepd is a job's only when root's")
def test_a_slurm_job_gets_no_gpu_until_registered_then_only_its_own(
        app_binaries: dict, shim_path: str, daemon: OwnDaemon) -> None:
    check(run(app_binaries, shim_path, daemon, None, job=JOB), expected([]), daemon)
    assert "its Slurm job was not registered by the prolog" in daemon.log()
    started = daemon.ctl("job", "start", JOB, "--gpus", "2", "--mem", "64MiB", "--share", "50")
    assert f"slurm:job_{JOB}: GPUs 2, quota 64 MiB, share 50%" in started.stdout
    for visible in (None, "0"):  # unset, or as Slurm sets it under ConstrainDevices
        check(run(app_binaries, shim_path, daemon, visible, job=JOB), expected([2]), daemon)
        assert last_session_gpus(daemon) == [2]
    check(run(app_binaries, shim_path, daemon, "2", job=JOB), expected([]), daemon)
    assert daemon.quota(f"slurm:job_{JOB}")["gpus"]["2"]["hard"] == 64 << 20
    assert f"slurm:job_{JOB}" in daemon.ctl("share", "list").stdout
    # another job, not registered, still gets nothing; the registered one's user tenant is free
    check(run(app_binaries, shim_path, daemon, None, job="7732"), expected([]), daemon)
    ended = daemon.ctl("job", "end", JOB)
    assert f"slurm:job_{JOB}: 0 session(s) ended" in ended.stdout
    assert f"slurm:job_{JOB}" not in daemon.ctl("quota", "list").stdout
    assert f"slurm:job_{JOB}" not in daemon.ctl("share", "list").stdout
    check(run(app_binaries, shim_path, daemon, None, job=JOB), expected([]), daemon)
    again = daemon.ctl("job", "end", JOB)  # an epilog after a failed prolog: no error
    assert "(it was not registered)" in again.stdout


def test_job_commands_need_job_tenants_and_a_job_id(start_pilotd: StartPilotd) -> None:
    plain = start_pilotd()
    off = plain.ctl("job", "start", "5", "--gpus", "all", ok=False)
    assert off.returncode == 1 and "[slurm] job_tenants is off" in off.stderr
    bad = plain.ctl("job", "end", "x5", ok=False)
    assert bad.returncode == 1 and "bad job id 'x5'" in bad.stderr
