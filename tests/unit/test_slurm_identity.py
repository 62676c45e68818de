"""A process's Slurm job, from the kernel's process tree (resources/tenants.slurm_job_of): the
nearest root-owned `slurmstepd: [JOB.STEP]` ancestor; and the tenant names pilotctl takes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from pilot.daemon.resources.tenants import slurm_job_of


def _child_of(pid: int) -> int:
    for _ in range(100):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise AssertionError(f"process {pid} started no child")


@pytest.mark.parametrize("argv0, job", [("slurmstepd: [42.0]", "42"), ("slurmstepd: [7.batch]", "7"),
                                        ("slurmstepd: [x.0]", None), ("slurmstepdx", None)])
def test_the_job_comes_from_a_root_owned_slurmstepd_ancestor(argv0: str, job: str | None) -> None:
    fake = subprocess.Popen(["bash", "-c", f"exec -a '{argv0}' bash -c 'sleep 30 & wait'"])
    program = _child_of(fake.pid)
    try:
        want = job if os.getuid() == 0 else None  # only root can run a real slurmstepd
        assert slurm_job_of(program) == want
        assert slurm_job_of(fake.pid) == want  # the step daemon itself is in its job too
    finally:
        os.kill(program, 9)
        fake.kill()
        fake.wait()


def test_a_process_outside_any_job_has_none() -> None:
    assert slurm_job_of(os.getpid()) is None
    assert slurm_job_of(1 << 30) is None  # no such process
