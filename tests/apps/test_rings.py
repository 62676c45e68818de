"""Issue 25 item 4: a program's calls travel through the shared-memory rings of its vGPU
connection (shim/transport/pilot_ring.h) by default, and the same program computes the same on
the socket with PILOT_RING=0. rings.cu posts 20,000 launches (the 256 KiB request ring fills and
empties many times), makes 200 small round trips and two 3 MiB copies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def _expected(launches: int = 20000) -> str:
    return f"sum {sum(range(launches))}\ncopies ok\n"


@pytest.mark.parametrize("ring, mapped", [("1", "1"), ("0", "0")])
def test_calls_through_the_rings_and_the_socket_agree(run_under_pilot, ring: str,
                                                       mapped: str) -> None:
    proc = run_under_pilot("rings", timeout=120, env={"PILOT_RING": ring})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == _expected()
    assert f"rings {mapped}\n" in proc.stderr


def test_sixteen_programs_at_once_each_in_its_own_rings(
        app_binaries: dict[str, Path], pilot_client_env: dict[str, str]) -> None:
    """Sixteen processes at once (vGPU threads serve several rings each): every one computes its
    own result through its own rings."""
    procs = [subprocess.Popen([str(app_binaries["rings"]), str(1000 + 97 * i)],
                              env=pilot_client_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(16)]
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err
        assert out == _expected(1000 + 97 * i)
        assert "rings 1\n" in err
