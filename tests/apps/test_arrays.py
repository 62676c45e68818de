"""CUDA arrays, 3D pitched memory, texture and surface objects: tests/apps/arrays.cu under the
sim daemon (shim/runtime/texture/api_array.c, api_memory3d.c, api_texture.c, api_helpers.c;
daemon/ops/arrays.py).

Each scenario checks the device's contents against a host model and prints "<scenario> ok"
after the lines below, which are what an H100 prints natively too (tests/gpu/run_compare.sh and
tests/gpu/arrays_compare.sh diff them): the pitch cudaMalloc3D gives (the width rounded up to
cudaDevAttrTexturePitchAlignment's 512), array info as created, point-sampled texels (texel
floor(coordinate), clamped, wrapped or the border's 0; worked out in arrays.cu), error names,
and FNV-1a checksums of the host models (host computations: the same on every machine; the
device matching its model is what "ok" says).

The pilot-only tests: a process cannot use another's array, texture or surface handles; arrays
count against the tenant's quota (kind "array") and are given back at exit; a freed array's
memory is zeroed before the next allocation gets it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from scenario_output import check_output
from test_scheduler_core import (
    ME,
    MiB,
    Program,
    StartPilotd,
    gpu_usage,
    mine,
    nothing_held,
    pilot_only,
    wait_for,
)

RunUnderPilot = Callable[..., "subprocess.CompletedProcess[str]"]

LINES = {
    "helpers": ["helpers float4=32,32,32,32,2 uchar2=8,8,0,0,1 half=16,0,0,0,2 raw=16,16,0,0,0",
                "helpers choose_9_0=0",
                "helpers choose_null=cudaErrorInvalidValue"],
    "pitched3d": ["pitched3d pitch=512 xsize=100 ysize=7",
                  "pitched3d p=097c6e98 q=6c9e808a"],
    "arrays": ["arrays info desc=32,0,0,0,2 extent=37,19,0 flags=0",
               "arrays channel desc=32,0,0,0,2",
               "arrays a=ac81e631 b=cd22f879",
               "arrays 1d extent=50,0,0"],
    "arrays3d": ["arrays3d extent=9,5,4 flags=0",
                 "arrays3d c=636a76f1 e=31f276e9"],
    "texture": ["texture clamp 0 37 23 10 27 2 34 0",
                "texture wrap 0 12 26 37",
                "texture border 0 0 11 0",
                "texture desc type=0 same_array=1 address=0,0 filter=0 normalized=1",
                "texture pitch2d 0 304 104 2",
                "texture linear -7 -6 -3 2 9 18 29 42 57 74"],
    "surface": ["surface desc type=0 same_array=1",
                "surface row0 7 1001 1002 7 sum=e8ba095b"],
    "errors": ["errors to_array_wide=cudaErrorInvalidValue",
               "errors to_array_tall=cudaErrorInvalidValue",
               "errors from_array_wide=cudaErrorInvalidValue",
               "errors to_array_pitch=cudaErrorInvalidPitchValue",
               "errors copy3d_outside=cudaErrorInvalidValue",
               "errors copy3d_two_sources=cudaErrorInvalidValue",
               "errors three_channels=cudaErrorInvalidChannelDescriptor"],
    "peer3d": ["peer3d devices=1"],  # the shared daemon serves one device
}


def expected(scenario: str) -> list[str]:
    return [*LINES[scenario], f"{scenario} ok"]


@pytest.mark.parametrize("scenario", list(LINES))
def test_scenario(scenario: str, run_under_pilot: RunUnderPilot,
                  daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("arrays", scenario), expected(scenario), daemon_log)


def test_all_scenarios_in_one_process(run_under_pilot: RunUnderPilot,
                                      daemon_log: Callable[[], str]) -> None:
    check_output(run_under_pilot("arrays"), [line for s in LINES for line in expected(s)],
                 daemon_log)


@pilot_only
def test_memcpy_3d_peer_between_two_devices(start_pilotd: StartPilotd,
                                            app_binaries: dict[str, Path], shim_path: str) -> None:
    """cudaMemcpy3DPeer from device 0's pitched memory to device 1's, row by row."""
    daemon = start_pilotd("--sim-devices", "2")
    prog = Program(daemon, app_binaries["arrays"], "peer3d", shim=shim_path)
    check_output(prog.finish(), ["peer3d devices>=2", "peer3d ok"], daemon.log_tail)


@pilot_only
def test_handles_of_another_session_are_refused(start_pilotd: StartPilotd,
                                                app_binaries: dict[str, Path],
                                                shim_path: str) -> None:
    """A second process given the first one's array, texture and surface handles can neither
    read nor write the array, make a texture over it, destroy the objects nor free the array;
    the holder's objects are intact afterwards and it destroys them itself."""
    daemon = start_pilotd()
    holder = Program(daemon, app_binaries["arrays"], "hold", shim=shim_path, stdin=True)
    try:
        lines = list(holder.read_until("holding"))
        words = lines[-2].split()
        assert words[0] == "hold" and len(words) == 4, lines
        [session] = mine(daemon, holder.proc.pid)
        assert session["arrays"] == 1 and session["textures"] == 2, session
        forger = Program(daemon, app_binaries["arrays"], "forge", *words[1:], shim=shim_path)
        check_output(forger.finish(), [
            "errors read=cudaErrorInvalidResourceHandle",
            "errors write=cudaErrorInvalidResourceHandle",
            "errors texture_over=cudaErrorInvalidResourceHandle",
            "errors destroy_texture=cudaErrorInvalidValue",
            "errors destroy_surface=cudaErrorInvalidValue",
            "errors free_array=cudaErrorInvalidResourceHandle"], daemon.log_tail)
        holder.send("go\n")
        check_output(holder.finish(), [*lines, "hold ok"], daemon.log_tail)
    finally:
        holder.kill()


@pilot_only
def test_arrays_count_against_the_quota_and_go_at_exit(start_pilotd: StartPilotd,
                                                       app_binaries: dict[str, Path],
                                                       shim_path: str) -> None:
    """Under a 4 MiB quota four 1 MiB arrays fit and the fifth is refused with
    cudaErrorMemoryAllocation (what a full GPU answers); the tenant is charged them as kind
    "array", and nothing once the program is killed."""
    daemon = start_pilotd()
    daemon.ctl("quota", "set", ME, "4MiB")
    prog = Program(daemon, app_binaries["arrays"], "hog", "10", shim=shim_path, stdin=True)
    try:
        assert prog.read_until("holding") == ["hog made=4 err=cudaErrorMemoryAllocation",
                                              "holding"]
        used, by_kind, _, _ = gpu_usage(daemon)
        assert by_kind == {"array": 4 * MiB} and used == 4 * MiB, by_kind
        [session] = mine(daemon, prog.proc.pid)
        assert session["arrays"] == 4 and session["charged"] == {"array": 4 * MiB}, session
        assert "quota: " + ME in daemon.log()
    finally:
        prog.kill()
    wait_for("the arrays given back after the kill", lambda: nothing_held(daemon), daemon)


@pilot_only
def test_a_freed_array_is_zeroed(run_under_pilot: RunUnderPilot,
                                 daemon_log: Callable[[], str]) -> None:
    """The sim hands a freed block to the next allocation of its size, contents and all (as the
    driver's allocator does), so the new array reads what the freed one held unless pilot
    zeroed it."""
    check_output(run_under_pilot("arrays", "scrub"), ["scrub nonzero=0"], daemon_log)
