"""GPU allow-lists (resources/gpu_access.py): persisted per tenant, a bad file refused, and the
numbering a tenant's programs see (its GPUs as a host of only them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pilot.daemon.resources.gpu_access import AccessFileError, GpuAccess, within
from pilot.daemon.sessions.visible import GpuIdentity, select


def test_allow_lists_persist_and_unset(tmp_path: Path) -> None:
    store = GpuAccess(str(tmp_path))
    assert store.allowed("slurm:job_5") is None
    store.set("slurm:job_5", [2, 0])
    store.set("user:alice", [])
    again = GpuAccess(str(tmp_path))  # a restarted pilotd keeps them
    assert again.allowed("slurm:job_5") == (0, 2) and again.allowed("user:alice") == ()
    assert again.list() == {"slurm:job_5": [0, 2], "user:alice": []}
    assert again.unset("slurm:job_5") and not again.unset("slurm:job_5")
    assert GpuAccess(str(tmp_path)).list() == {"user:alice": []}


@pytest.mark.parametrize("gpus", [[1, 1], [-1], ["0"], [True], "0"])
def test_a_bad_list_is_refused_and_changes_nothing(tmp_path: Path, gpus: object) -> None:
    store = GpuAccess(str(tmp_path))
    store.set("user:bob", [1])
    with pytest.raises(ValueError):
        store.set("user:bob", gpus)  # type: ignore[arg-type]
    assert GpuAccess(str(tmp_path)).allowed("user:bob") == (1,)


def test_an_unreadable_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "gpu_access.json").write_text(json.dumps({"version": 1, "tenants": {"x": [0, 0]}}))
    with pytest.raises(AccessFileError, match="named twice"):
        GpuAccess(str(tmp_path))


IDS = [GpuIdentity(gpu=0, pci_index=2, uuid="GPU-aa", pci_bus_id="0000:30:00.0"),
       GpuIdentity(gpu=1, pci_index=0, uuid="GPU-bb", pci_bus_id="0000:10:00.0"),
       GpuIdentity(gpu=2, pci_index=1, uuid="GPU-cc", pci_bus_id="0000:20:00.0")]


def test_allowed_gpus_are_numbered_as_a_host_of_only_them() -> None:
    view = within(IDS, [0, 2])
    assert [(g.gpu, g.pci_index, g.uuid) for g in view] == [(0, 1, "GPU-aa"), (1, 0, "GPU-cc")]
    assert select("1", view, False) == [1]  # the second allowed GPU: the host's GPU 2
    assert select("0", view, True) == [1]  # first in PCI order among them: GPU 2 (bus 0x20)
    assert select("2", view, False) == []  # past the last allowed
    assert select("GPU-bb", view, False) == []  # a GPU not allowed, by UUID
