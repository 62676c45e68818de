"""Issue 28 (2), the cold first kernel: a small program's images are loaded and its kernels
resolved in pilotd when its session starts (shim/registry.c preload_small_program), so its
first launch pays neither MODULE_LOAD nor FUNCTION_GET; a program with many kernels has its
images loaded and its kernels left lazy; PILOT_PRELOAD=0 keeps everything lazy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotd_metrics import run_scraped


def _calls(values: dict[str, float], name: str) -> float:
    return values.get(f'pilot_calls_total{{function="{name}"}}', 0.0)


def test_a_small_programs_kernels_are_resolved_when_its_session_starts(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    exe = str(app_binaries["preload"])
    out, values = run_scraped(start_pilotd, [exe, "idle"], shim_path, None)
    assert out == "idle ok\n"
    # no kernel launched, yet its one image is loaded and its three kernels resolved
    assert (_calls(values, "module_load"), _calls(values, "function_get")) == (1, 3)
    out, values = run_scraped(start_pilotd, [exe, "idle"], shim_path, None,
                              env={"PILOT_PRELOAD": "0"})
    assert out == "idle ok\n"
    assert (_calls(values, "module_load"), _calls(values, "function_get")) == (0, 0)


def test_a_first_call_that_is_a_launch_preloads_without_deadlock(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    out, values = run_scraped(start_pilotd, [str(app_binaries["preload"]), "launch"], shim_path, None)
    assert out == "launch ok\n"
    # each kernel fetched once: the launches found them resolved
    assert (_calls(values, "module_load"), _calls(values, "function_get")) == (1, 3)


def test_a_program_with_many_kernels_keeps_them_lazy(
        start_pilotd: Any, app_binaries: dict[str, Path], shim_path: str) -> None:
    out, values = run_scraped(start_pilotd, [str(app_binaries["preload_many"]), "launch"],
                              shim_path, None)
    assert out == "launch ok\n"
    # its image is loaded ahead; of its 43 kernels only the two launched are fetched
    assert (_calls(values, "module_load"), _calls(values, "function_get")) == (1, 2)
