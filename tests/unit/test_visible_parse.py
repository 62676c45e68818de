"""CUDA_VISIBLE_DEVICES parsing and resolution (daemon/sessions/visible.py), and the GPU
identities (UUID, PCI bus id, PCI order) selections are resolved against."""

from __future__ import annotations

import pytest

from pilot.daemon.backends.base import DeviceInfo, format_pci_bus_id, format_uuid
from pilot.daemon.backends.sim_device import h100_like_info
from pilot.daemon.sessions.visible import GpuIdentity, identities, parse, pci_sort_key, resolve, select


@pytest.mark.parametrize(("value", "entries"), [
    ("0", [0]),
    ("2,1", [2, 1]),
    ("1gpu2,2ampere", [1, 2]),  # strtoul: what follows the digits is ignored
    ("0, 1, 2, -1, 3", [0, 1, 2]),  # a negative index ends the list
    ("0, 1, 2, 1", []),  # a device named twice: nothing
    ("2, +3, -0, 5", [2, 3, 0, 5]),  # signs
    ("one,two,3,4", []),
    ("4,3,two,one", [4, 3]),
    ("", []),
    (",1", []),
    ("+", []),
    ("GPU-9e8d35e3", ["GPU-9e8d35e3"]),
    ("GPU-123, 2", ["GPU-123"]),  # a UUID list ends at an entry that is not one
    ("GPU-123,GPU-45", ["GPU-123", "GPU-45"]),
    ("GPU-123,GPU-123", []),
    ("GPU-123, GPU-45", ["GPU-123"]),  # no blanks in UUID lists
    ("MIG-89c850dc", []),  # MIG instances: pilot serves none
    ("1,GPU-123", [1]),  # an index list ends at a UUID
])
def test_parse(value: str, entries: list[int | str]) -> None:
    assert parse(value) == entries


UUIDS = ["GPU-9942190a-aa31-4ff1-4aa9-c388d80f85f1", "GPU-9e8d35e3-a134-0fdd-0e01-23811fdbd293",
         "GPU-e429a63e-c61c-4795-b757-5132caeb8e70", "GPU-eee1dfbc-0a0f-6ad8-5ff6-dc942a8b9d98"]
# pilotd serves host GPUs 0..3; PCI order differs: GPU 2 is first on the bus, then 0, 3, 1
GPUS = [GpuIdentity(gpu=g, pci_index=p, uuid=u, pci_bus_id="")
        for g, p, u in zip(range(4), [1, 3, 0, 2], UUIDS, strict=True)]


@pytest.mark.parametrize(("entries", "pci", "positions"), [
    ([1, 0], False, [1, 0]),
    ([3, 9, 0], False, [3]),  # an index past the last ends the list
    ([0], True, [2]),  # PCI order: the first GPU on the bus
    ([0, 1, 2, 3], True, [2, 0, 3, 1]),
    (["GPU-9e8d35e3"], False, [1]),
    (["GPU-e4", "GPU-9e8d35e3"], False, [2, 1]),
    (["GPU-123", "GPU-9e8d35e3"], False, []),  # no such GPU: the list ends
    (["GPU-9e8d35e3", "GPU-e", "GPU-99"], False, [1]),  # ambiguous: the list ends
    (["GPU-9e8d35e3", "GPU-eee", "GPU-9e8"], False, []),  # the same GPU twice: nothing
    ([UUIDS[3]], True, [3]),  # UUIDs do not depend on the order
])
def test_resolve(entries: list[int] | list[str], pci: bool, positions: list[int]) -> None:
    assert resolve(entries, GPUS, pci) == positions


def test_select_unset_and_narrowing() -> None:
    assert select(None, GPUS, False) is None  # unset: every GPU, as pilot places the session
    assert select("", GPUS, False) == []
    # only GPUs pilotd serves can be named: serving host GPUs 2 and 3, "0" names none of them
    served = GPUS[2:]
    assert select("0,2", served, False) == []
    assert select("2,3,0", served, False) == [0, 1]


def test_identities_of_sim_devices() -> None:
    """The sim's PCI buses put device 1 first on the bus; identities rank by bus, and the host's
    other GPUs count in PCI order where the backend lists them."""
    infos = [h100_like_info(1 << 30, i) for i in range(3)]
    ids = identities([0, 1, 2], infos)
    assert [i.pci_index for i in ids] == [1, 0, 2]
    assert [i.pci_bus_id for i in ids] == ["00000000:23:00.0", "00000000:1B:00.0", "00000000:33:00.0"]
    assert ids[0].uuid == format_uuid(infos[0].uuid) and len({i.uuid for i in ids}) == 3
    # pilotd serves host GPUs 5 and 7; the host also has GPUs on buses 0x01 and 0x30
    host = {0: "00000000:01:00.0", 6: "00000000:30:00.0"}
    ids = identities([5, 7], infos[:2], host)
    assert [(i.gpu, i.pci_index) for i in ids] == [(5, 2), (7, 1)]  # 0x01 < 0x1B < 0x23 < 0x30
    ids = identities([5, 7], infos[1:], host)
    assert [(i.gpu, i.pci_index) for i in ids] == [(5, 1), (7, 3)]  # 0x01 < 0x1B < 0x30 < 0x33


def test_formats() -> None:
    assert format_uuid(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert format_pci_bus_id(0, 0x1B, 0) == "00000000:1B:00.0"
    assert pci_sort_key("0000:1b:00.0") < pci_sort_key("00000000:23:00.0") < pci_sort_key("0001:01:00.0")
    info = DeviceInfo(name="x", uuid=b"", total_mem=0, driver_version=0, attrs={50: 1, 33: 2, 34: 3})
    assert identities([0], [info])[0].pci_bus_id == "00000001:02:03.0"
