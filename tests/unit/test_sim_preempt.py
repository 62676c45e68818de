"""The sim's emulation of a preemptible launch (SimBackend.launch_preemptible, ptx_preempt.py):
the first k logical blocks, then the rest resumed from the control block's counter, every block
exactly once."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.backends.base import CUDA_ERROR_NOT_SUPPORTED, BackendError
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimLaunch, blockwise

PTX = (".version 9.0\n.target sm_90\n.address_size 64\n"
       + "".join(f".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\tret;\n}}\n"
                 for name in ("bump", "whole")))
GRID, BLOCK = (5, 3, 2), (4, 1, 1)
THREADS = 4
BLOCKS = 30


def bump(k: SimLaunch) -> None:
    """out[block * threads + t] += 1 for each thread of each logical block run (a block run
    twice would show as 2)."""
    out = np.frombuffer(k.view(k.ptr(0), 4 * BLOCKS * THREADS), dtype=np.int32)
    gx, gy, _ = k.grid
    for index in k.logical_blocks():
        x, y, z = k.ctaid(index)
        linear = (z * gy + y) * gx + x
        assert linear == index  # the logical index is the hardware's block order
        out[linear * THREADS:(linear + 1) * THREADS] += 1


def whole(k: SimLaunch) -> None:
    pass


@pytest.fixture
def sim() -> Any:
    registry = KernelRegistry()
    registry.register("bump", blockwise(bump))
    registry.register("whole", whole)
    be = SimBackend(registry)
    be.bind_thread(0)
    module = be.module_load(PTX.encode())
    out = be.mem_alloc(4 * BLOCKS * THREADS)
    ctl = be.mem_alloc(pp.CONTROL_BYTES)
    be.memcpy_htod(out, bytes(4 * BLOCKS * THREADS), 4 * BLOCKS * THREADS, None)
    be.memcpy_htod(ctl, struct.pack("<8I", *pp.control_words(GRID)), pp.CONTROL_BYTES, None)
    return be, be.function_get(module, "bump"), out, ctl, be.stream_create(1, 0)


def _read(be: SimBackend, ptr: int, n: int) -> bytes:
    buf = bytearray(n)
    be.memcpy_dtoh(buf, ptr, n, None)
    return bytes(buf)


def _counts(be: SimBackend, out: int) -> list[int]:
    data = _read(be, out, 4 * BLOCKS * THREADS)
    return [struct.unpack_from("<i", data, 4 * THREADS * b)[0] for b in range(BLOCKS)]


def _claimed(be: SimBackend, ctl: int) -> int:
    return struct.unpack("<I", _read(be, ctl, 4))[0]


def test_the_first_blocks_then_only_the_rest(sim: Any) -> None:
    be, fn, out, ctl, stream = sim
    args = struct.pack("<Q", out)
    be.launch_preemptible(fn.handle, GRID, BLOCK, 0, stream, args, ctl, run_blocks=7)
    assert _claimed(be, ctl) == 7 and _counts(be, out) == [1] * 7 + [0] * 23
    be.launch_preemptible(fn.handle, GRID, BLOCK, 0, stream, args, ctl, run_blocks=10)
    assert _claimed(be, ctl) == 17 and _counts(be, out) == [1] * 17 + [0] * 13
    be.launch_preemptible(fn.handle, GRID, BLOCK, 0, stream, args, ctl)  # resumed to the end
    assert _claimed(be, ctl) == BLOCKS and _counts(be, out) == [1] * BLOCKS
    be.launch_preemptible(fn.handle, GRID, BLOCK, 0, stream, args, ctl)  # nothing left
    assert _counts(be, out) == [1] * BLOCKS


def test_a_retreat_before_any_claim_runs_nothing(sim: Any) -> None:
    be, fn, out, ctl, stream = sim
    be.memcpy_htod(ctl + 4, struct.pack("<I", 1), 4, None)
    be.launch_preemptible(fn.handle, GRID, BLOCK, 0, stream, struct.pack("<Q", out), ctl)
    assert _claimed(be, ctl) == 0 and _counts(be, out) == [0] * BLOCKS


def test_an_emulation_of_whole_grids_cannot_be_preempted(sim: Any) -> None:
    be, _fn, out, ctl, stream = sim
    whole_fn = be.function_get(be.module_load(PTX.encode()), "whole")
    with pytest.raises(BackendError) as err:
        be.launch_preemptible(whole_fn.handle, GRID, BLOCK, 0, stream, struct.pack("<Q", out), ctl)
    assert err.value.code == CUDA_ERROR_NOT_SUPPORTED
