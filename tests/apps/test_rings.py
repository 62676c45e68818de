"""Issue 25 item 4: a program's calls travel through the shared-memory rings of its vGPU
connection (shim/transport/pilot_ring.h) by default, and the same program computes the same on
the socket with PILOT_RING=0. rings.cu posts 20,000 launches (the 256 KiB request ring fills and
empties many times), makes 200 small round trips and two 3 MiB copies."""

from __future__ import annotations

import pytest


def _expected() -> str:
    return f"sum {sum(range(20000))}\ncopies ok\n"


@pytest.mark.parametrize("ring, mapped", [("1", "1"), ("0", "0")])
def test_calls_through_the_rings_and_the_socket_agree(run_under_pilot, ring: str,
                                                       mapped: str) -> None:
    proc = run_under_pilot("rings", timeout=120, env={"PILOT_RING": ring})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == _expected()
    assert f"rings {mapped}\n" in proc.stderr
