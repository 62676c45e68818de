"""launch_order.cu under pilot: long runs of order-dependent launches on every kind of stream,
with pilotd's fast launch path on (the default: most of them run in C, daemon/vgpu/fast.py) and
off; the outputs are computed here independently and must be identical either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotd_metrics import run_scraped as _run_scraped
from pilotd_metrics import total as _total

N = 256
MASK = 0xFFFFFFFF


def _step(x: list[int], k: int, count: int = N) -> None:
    for i in range(count):
        x[i] = (x[i] * 3 + k + i) & MASK


def _step_pair(x: list[int], a: int, b: int, shift: int) -> None:
    for i in range(N):
        x[i] = (((x[i] ^ a) * 5) + b + (shift & MASK)) & MASK


def _show(what: str, x: list[int]) -> str:
    h = 2166136261
    for v in x:
        h = ((h ^ v) * 16777619) & MASK
    return f"{what} {h:08x} {x[0]} {x[N - 1]}"


def expected(rounds: int) -> list[str]:
    a, b, c = [0] * N, [0] * N, [0] * N
    out = []
    for k in range(rounds):
        _step(a, k)
    out.append(_show("legacy", a))
    for k in range(rounds):
        _step(b, k + 7)
    out.append(_show("nonblocking", b))
    for k in range(rounds // 4):
        _step(c, k)
        _step(c, k * 2 + 1)
        _step(c, k * 3 + 2)
    out.append(_show("interleaved", c))
    for k in range(rounds // 2):
        _step(a, k ^ 0x55)
    out.append(_show("recreated", a))
    pa, pb = 0x9E3779B9, 12345
    for k in range(rounds // 2):
        pb = (pb + k) & MASK
        _step_pair(b, pa, pb, k << 33 | k)
        _step(b, k)
    out.append(_show("mixed", b))
    _step(a, 1, 128)
    out.append("refused cudaErrorInvalidValue")  # CUDA 13 with driver 580 (errors.cu)
    _step(a, 3)
    out.append(_show("after_refused", a))
    total = 0
    for k in range(rounds // 4):
        c[k % N] = (k * 2654435761) & MASK
        _step(c, k)
        i = (k * 7) % (N - 1)
        total = (total * 31 + c[i] + c[i + 1]) & 0xFFFFFFFFFFFFFFFF
    out.append(f"copies {total:016x}")
    out.append(_show("after_copies", c))
    seen = 0
    for k in range(rounds // 4):
        _step(a, k)
        _step(b, k + 1)
        _step(c, k + 2)
        seen = (seen * 31 + a[k % N] + b[k % N] + c[k % N]) & 0xFFFFFFFFFFFFFFFF
    out.append(f"synced {seen:016x}")
    out.append("done")
    return out


def test_expected_values_are_pinned() -> None:
    """The generator itself, against values checked by hand for one round."""
    x = [0] * N
    _step(x, 0)
    assert x[:3] == [0, 1, 2] and x[N - 1] == N - 1
    _step(x, 5)
    assert x[:3] == [5, 9, 13]


def _run(start_pilotd: Any, exe: Path, shim_path: str, config: str | None) -> tuple[str, dict[str, float]]:
    return _run_scraped(start_pilotd, [str(exe), "400"], shim_path, config)


def test_launch_order_with_and_without_the_fast_path(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    want = "\n".join(expected(400)) + "\n"
    fast_out, fast = _run(start_pilotd, app_binaries["launch_order"], shim_path, None)
    assert fast_out == want
    launched = _total(fast, "pilot_tenant_launches_total")
    in_c = _total(fast, "pilot_fast_launches_total")
    # every launch counted once; most of them ran in C (the first of each kernel on each
    # stream, those on blocking streams and those behind them on the legacy stream did not)
    assert launched == 400 + 400 + 3 * 100 + 200 + 3 * 200 + 2 + 100 + 3 * 100
    assert launched / 2 < in_c < launched, (in_c, launched)
    # the small copies of phase 7 and the readbacks of show() were answered in C
    assert _total(fast, "pilot_fast_copies_total") >= 150, fast
    # and most synchronizations of phase 8 (100 rounds: 34 of the device, 66 x 3 of streams)
    assert _total(fast, "pilot_fast_syncs_total") >= 150, fast
    slow_out, slow = _run(start_pilotd, app_binaries["launch_order"], shim_path,
                          "[daemon]\nfast_launch = false\n")
    assert slow_out == want
    assert _total(slow, "pilot_fast_launches_total") == 0
    assert _total(slow, "pilot_tenant_launches_total") == launched
    assert _total(slow, "pilot_fast_copies_total") == 0
    assert _total(slow, "pilot_fast_syncs_total") == 0
    # every copy and synchronization counted once, wherever it was done
    for name, least in (("memcpy_d2h", 100), ("memcpy_h2d", 100), ("device_synchronize", 34),
                        ("stream_synchronize", 3 * 66)):
        key = f'pilot_calls_total{{function="{name}"}}'
        assert fast[key] == slow[key] >= least, (name, fast[key], slow[key])
