"""Device selection as CUDA does it (devices.cu): CUDA_VISIBLE_DEVICES by index, reordered, by
UUID and UUID prefix, empty, cut at an invalid entry, CUDA_DEVICE_ORDER=PCI_BUS_ID, and that a
selection can only narrow what pilotd serves, under pilot against sim daemons of three GPUs.

The sim's devices (sim_device.py) are on PCI buses 0x23, 0x1B, 0x33 (devices 0, 1, 2), so PCI
bus order is 1, 0, 2; their UUIDs start 4a1b..., 4014..., ea0c... ("GPU-4" matches two).
Expected lines are built here from those facts; which GPU served each device is checked in
pilotd's log (the session's device list and the GPU of each part it joined).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from test_streams_devices import CLEAN_ENV, SimDaemon  # pytest puts tests/apps on sys.path

from pilot.daemon.backends.base import format_uuid
from pilot.daemon.backends.sim_device import sim_pci_bus, sim_uuid

if os.environ.get("PILOT_APPS_NATIVE") == "1":
    pytest.skip("needs pilot's sim daemons (three GPUs of known UUIDs)", allow_module_level=True)


@pytest.fixture(scope="module")
def three_gpus() -> object:
    daemon = SimDaemon("--sim-devices", "3")
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def gpus_1_and_2() -> object:
    """A daemon that serves only the host's GPUs 1 and 2 (`--device 1 --device 2`)."""
    daemon = SimDaemon("--sim-devices", "2", "--device", "1", "--device", "2")
    try:
        yield daemon
    finally:
        daemon.stop()


def uuid(gpu: int) -> str:
    return format_uuid(sim_uuid(gpu))


def expected(gpus: list[int], sim_index: dict[int, int] | None = None) -> list[str]:
    """What devices.cu prints when it sees host GPUs `gpus` in that order (`sim_index`: the sim
    device each host GPU is, where pilotd serves GPUs under other numbers)."""
    sim = [(sim_index or {}).get(g, g) for g in gpus]
    if not gpus:
        return ["count: cudaErrorNoDevice 0", "malloc: cudaErrorNoDevice"]
    n = len(gpus)
    return ([f"count: cudaSuccess {n}"]
            + [f"device {d}: {uuid(s)} pci 0000:{sim_pci_bus(s):02x}:00" for d, s in enumerate(sim)]
            + [f"device {d}: bus id cudaSuccess 0000:{sim_pci_bus(s):02X}:00.0, by bus id cudaSuccess {d}"
               for d, s in enumerate(sim)]
            + [f"device {d}: set cudaSuccess, malloc cudaSuccess, copy cudaSuccess yes"
               for d in range(n)]
            + [f"set device {n}: cudaErrorInvalidDevice", f"properties of device {n}: cudaErrorInvalidDevice",
               f"attribute of device {n}: cudaErrorInvalidDevice", f"current device: {n - 1}"])


def device_env(shim_path: str, socket_path: str, visible: str | None,
               order: str | None = None) -> dict[str, str]:
    """A program's environment under pilot with that CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
    (None: unset)."""
    env = {k: v for k, v in CLEAN_ENV.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env |= {"LD_PRELOAD": shim_path, "PILOT_SOCKET": socket_path}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if order is not None:
        env["CUDA_DEVICE_ORDER"] = order
    return env


def run(app_binaries: dict, shim_path: str, daemon: SimDaemon, visible: str | None,
        order: str | None = None) -> subprocess.CompletedProcess[str]:
    env = device_env(shim_path, daemon.socket, visible, order)
    return subprocess.run([str(app_binaries["devices"])], capture_output=True, text=True, env=env,
                          timeout=60)


def check(proc: subprocess.CompletedProcess[str], want: list[str], daemon: SimDaemon) -> None:
    assert proc.returncode == 0 and proc.stdout.splitlines() == want, (
        f"stdout:\n{proc.stdout}\nwant:\n" + "\n".join(want)
        + f"\nstderr:\n{proc.stderr}\nlog:\n{daemon.log()}")


def last_session_gpus(daemon: SimDaemon) -> list[int]:
    """The GPUs pilotd served the last session's devices on, by ordinal: part 0's GPU and the
    GPU of each device it joined (from pilotd's log; this module runs one program at a time)."""
    log = daemon.log()
    starts = list(re.finditer(r"session (\d+): pid \d+ .* on vGPU \d+ \(GPU (\d+)\); devices", log))
    assert starts, log
    sid, first = starts[-1].group(1), int(starts[-1].group(2))
    joins = re.findall(rf"session {sid}: device (\d+) on vGPU \d+ \(GPU (\d+)\)", log)
    joined = {int(d): int(g) for d, g in joins}
    return [first] + [joined[d] for d in sorted(joined)]


CASES = [
    # (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, host GPUs the program sees in order)
    ("1", None, [1]),
    ("2", None, [2]),
    ("2,0", None, [2, 0]),  # reordered, renumbered from 0
    ("1,0,2", None, [1, 0, 2]),
    (" 2, +0", None, [2, 0]),  # read like strtoul: blanks and a sign
    ("1gpu,2", None, [1, 2]),  # what follows the digits is ignored
    ("0,7,1", None, [0]),  # an index past the last GPU ends the list
    ("2,-1,0", None, [2]),  # so does a negative one
    ("1,x,0", None, [1]),  # and one without digits
    ("x,1", None, []),  # an invalid first entry: no device
    ("", None, []),  # empty: no device
    ("0,1,0", None, []),  # a device named twice: no device
    (uuid(2), None, [2]),  # a full UUID
    ("GPU-ea0c", None, [2]),  # a unique prefix
    ("GPU-4014f9,GPU-ea", None, [1, 2]),
    ("GPU-ea,GPU-4", None, [2]),  # an ambiguous prefix (GPUs 0 and 1) ends the list
    ("GPU-4", None, []),
    ("GPU-ea,1", None, [2]),  # a UUID list ends at an entry that is not one
    ("GPU-ea,GPU-ea0c", None, []),  # the same GPU twice
    ("GPU-ffff", None, []),  # no such GPU
    ("MIG-4a1b1cef", None, []),  # MIG instances: pilot serves none
    ("0", "PCI_BUS_ID", [1]),  # PCI order: bus 0x1B (GPU 1) first
    ("0,1", "PCI_BUS_ID", [1, 0]),
    ("2,0", "PCI_BUS_ID", [2, 1]),
    ("0", "FASTEST_FIRST", [0]),
]


@pytest.mark.parametrize(("visible", "order", "gpus"), CASES,
                         ids=[f"{v!r}-{o}" for v, o, _ in CASES])
def test_selection(app_binaries: dict, shim_path: str, three_gpus: SimDaemon, visible: str | None,
                   order: str | None, gpus: list[int]) -> None:
    proc = run(app_binaries, shim_path, three_gpus, visible, order)
    check(proc, expected(gpus), three_gpus)
    if gpus:  # and pilotd served each device on the GPU it is
        assert last_session_gpus(three_gpus) == gpus, three_gpus.log()


@pytest.mark.parametrize("order", [None, "PCI_BUS_ID"])
def test_unset(app_binaries: dict, shim_path: str, three_gpus: SimDaemon, order: str | None) -> None:
    """Unset: every GPU, numbered from the one the session was placed on (CUDA_DEVICE_ORDER
    renumbers only a selection's indices)."""
    proc = run(app_binaries, shim_path, three_gpus, None, order)
    gpus = last_session_gpus(three_gpus)
    assert gpus in ([0, 1, 2], [1, 2, 0], [2, 0, 1]), three_gpus.log()
    check(proc, expected(gpus), three_gpus)


def test_selection_cannot_widen(app_binaries: dict, shim_path: str, gpus_1_and_2: SimDaemon) -> None:
    """pilotd serves host GPUs 1 and 2 (sim devices 0 and 1): a program that names GPU 0, or
    more GPUs than pilotd serves, sees only what pilotd serves."""
    sim = {1: 0, 2: 1}
    check(run(app_binaries, shim_path, gpus_1_and_2, "0"), expected([]), gpus_1_and_2)
    check(run(app_binaries, shim_path, gpus_1_and_2, "2,0,1"), expected([2], sim), gpus_1_and_2)
    check(run(app_binaries, shim_path, gpus_1_and_2, "1,2,3,4"), expected([1, 2], sim), gpus_1_and_2)
    check(run(app_binaries, shim_path, gpus_1_and_2, None), expected([1, 2], sim), gpus_1_and_2)
    assert last_session_gpus(gpus_1_and_2) == [1, 2]


def test_uuids_in_status_and_metrics(start_pilotd: Callable[..., Any]) -> None:
    """`pilotctl status` and pilot_gpu_info name each GPU by the UUID programs see and select
    it by (and its PCI bus id), so pilot's series join DCGM's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start_pilotd("--sim-devices", "2", "--metrics-address", f"127.0.0.1:{port}")
    doc = json.loads(daemon.ctl("status", "--json").stdout)
    assert [(g["index"], g["uuid"], g["pci_bus_id"]) for g in doc["gpus"]] == [
        (0, uuid(0), "00000000:23:00.0"), (1, uuid(1), "00000000:1B:00.0")]
    text = daemon.ctl("status").stdout
    assert f"  {uuid(0)}, PCI bus id 00000000:23:00.0\n" in text and f"  {uuid(1)}, PCI" in text, text
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    info = sorted(line for line in metrics.splitlines() if line.startswith("pilot_gpu_info{"))
    assert len(info) == 2, metrics
    for gpu, line in enumerate(info):
        assert f'gpu="{gpu}"' in line and f'uuid="{uuid(gpu)}"' in line, info
        assert f'pci_bus_id="00000000:{sim_pci_bus(gpu):02X}:00.0"' in line, info
